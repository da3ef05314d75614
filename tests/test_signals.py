"""Preemption through the command line: SIGINT (Ctrl-C) and SIGTERM (how TPU VMs are preempted)
stop `python -m gspo_jax.main` cleanly with one line and the shell's exit code; a second Ctrl-C
exits at once; on a 2-process run a signal to one process stops both at the same saved step.

(SIGTERM with a save in flight, in-process, is in test_resilience.py.)
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import trainer_runs as runs
from trainer_runs import ARITH, REPO

from gspo_jax.rl import trainer

pytestmark = pytest.mark.slow

LONG = 400  # steps: the run is always stopped by a signal long before


def _cmd(shared, wd, *extra):
    flags = [f"--config.{k}={v}" for k, v in runs.overrides(shared).items() if k != "rl.num_steps"]
    return [
        sys.executable,
        "-m",
        "gspo_jax.main",
        f"--config={ARITH}:runlocal",
        f"--workdir={wd}",
        f"--config.rl.num_steps={LONG}",
        *flags,
        *extra,
    ]


def _env(shared, devices=1):
    env = dict(os.environ)
    env.update(
        PYTHONPATH=REPO,
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=shared["xla"],
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    return env


def _wait_for_step(wd, step, procs, timeout=240):
    """Waits until metrics.jsonl holds ``step`` (the run is in its loop)."""
    path = os.path.join(wd, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            raise AssertionError("the run ended early:\n" + procs[0].communicate()[0][-3000:])
        if os.path.exists(path) and f'"step": {step},' in open(path).read():
            return
        time.sleep(0.2)
    raise AssertionError(f"no step {step} in {timeout} s")


def _start(shared, wd, devices=1, *extra):
    return subprocess.Popen(
        _cmd(shared, wd, *extra),
        env=_env(shared, devices),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _saved_steps(wd):
    return sorted(int(n) for n in os.listdir(os.path.join(wd, "checkpoints")) if n.isdigit())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_the_step_reached_and_prints_one_line(shared, single, sig):
    wd = os.path.join(shared["root"], f"cli_{sig.name}")
    p = _start(shared, wd)
    _wait_for_step(wd, 2, [p])
    p.send_signal(sig)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 128 + sig, out[-3000:]
    m = re.search(r"stopped at step (\d+), checkpoint saved; rerun the same command to resume", out)
    assert m, out[-3000:]
    assert "Traceback" not in out
    assert _saved_steps(wd)[-1] == int(m.group(1)) < LONG
    assert max(r["step"] for r in runs.records(wd)) == int(m.group(1))


def test_second_ctrl_c_exits_at_once(monkeypatch, capfd):
    """In-process (two signals sent back to back to a child are merged by the OS): the first
    SIGINT only asks to stop, the second exits at once with 130; the handler from before comes
    back (Python's default, or SIG_IGN where the suite runs as a background job)."""
    before = signal.getsignal(signal.SIGINT)
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    with trainer.StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs at the next bytecode
        assert stop.signum == signal.SIGINT and stop.agreed() == signal.SIGINT and exits == []
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert exits == [130]
    assert "second interrupt: exiting now" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.long  # a two-process launch: .ci/run runs it after the README's test command
def test_signal_to_one_host_stops_every_host_at_the_same_saved_step(shared, single):
    wd = os.path.join(shared["root"], "cli_multihost")
    port = runs.free_port()
    procs = [
        _start(
            shared,
            wd,
            4,
            f"--coordinator_address=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={i}",
        )
        for i in range(2)
    ]
    _wait_for_step(wd, 2, procs)
    procs[1].send_signal(signal.SIGTERM)  # only the second host is preempted
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outs[0][-2000:] + outs[1][-2000:]
    steps = [re.search(r"stopped at step (\d+)", o) for o in outs]
    assert all(steps), outs[0][-2000:] + outs[1][-2000:]
    assert steps[0].group(1) == steps[1].group(1) == str(_saved_steps(wd)[-1])
