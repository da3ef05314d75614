"""Shared end-to-end runs for the trainer tests (runlocal size), and helpers to compare them.

One tiny warm start, one TFDS data dir and one persistent compilation cache serve every trainer
run of the session (fixtures in conftest.py), so repeated runs of the same shapes do not recompile:

  single   1 device, 4 RL steps, checkpoints every 2 (steps 2 and 4)
  sharded  8 simulated devices, the same config: equals `single` to float32 tolerance
"""

import os
import socket
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np

from gspo_jax import config as config_lib
from gspo_jax.runtime import checkpoint as checkpoint_lib
from gspo_jax.runtime import metrics as metrics_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARITH = os.path.join(REPO, "configs", "arith.py")
STEPS = 4
# tests/multihost_faults.py's runs (and their reruns): no evaluation, the pod's bounded waits short
POD_FAULTS = {"eval.num_problems": 0, "log.tensorboard": False, "multihost.timeout_s": 8.0}


def overrides(shared) -> dict:
    """Config overrides (dotted keys) every run of this module uses."""
    return {
        "init.cache_dir": shared["cache"],
        "data.data_dir": shared["data"],
        "log.progress": False,
        "rl.num_steps": STEPS,
        "checkpoint.every": 2,
        "eval.every": 0,
        "eval.num_problems": 8,
        "eval.batch_size": 8,
    }


def set_fields(c: ml_collections.ConfigDict, fields: dict) -> ml_collections.ConfigDict:
    """Sets dotted keys ("rl.num_steps": 2) on ``c``; returns ``c``. On a locked config a
    misspelt key is an error, as it should be in a test."""
    for k, v in fields.items():
        config_lib.set_field(c, k, v)
    return c


def make_config(shared, **extra) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(config_lib.load_config_file(ARITH + ":runlocal"))
    return set_fields(c, {**overrides(shared), **extra})


def final_params(workdir, step=STEPS):
    ck = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=1)
    arrays = ck.restore_arrays(step)
    ck.close()
    return arrays


def records(workdir, drop_time=True):
    recs = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    if drop_time:
        recs = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in recs]
    return recs


def assert_trees(a, b, **tol):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb, strict=True):
        if tol:
            np.testing.assert_allclose(x, y, **tol)
        else:
            np.testing.assert_array_equal(x, y)


def assert_records(a, b, **tol):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys(), ra.keys() ^ rb.keys()
        for k in ra:
            if tol:
                np.testing.assert_allclose(ra[k], rb[k], err_msg=f"{k} at step {ra['step']}", **tol)
            else:
                same = ra[k] == rb[k] or (np.isnan(ra[k]) and np.isnan(rb[k]))
                assert same, f"{k} at step {ra['step']}: {ra[k]} != {rb[k]}"


def load_repo_module(relpath: str):
    """A script or config file of the repository (not a package), loaded by path."""
    return config_lib.import_config_module(os.path.join(REPO, relpath))


def edit_step_metrics(monkeypatch, edit) -> None:
    """Makes every RL step's host metrics pass through ``edit(step_done, metrics)`` (to poison a
    loss, fake a collapse, ...); undone by the monkeypatch fixture."""
    from gspo_jax.rl import step as ts

    real_step = ts.rl_step

    def wrapped(run, phases, state, batch, **kw):
        state, m = real_step(run, phases, state, batch, **kw)
        edit(int(jax.device_get(state.step)), m)
        return state, m

    monkeypatch.setattr(ts, "rl_step", wrapped)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_all(procs, timeout):
    """Waits for every process; if one fails, stops the others (they would wait at a barrier)."""
    deadline = time.time() + timeout
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return [p.communicate()[0] for p in procs]


def launch_pod(shared, wd, timeout, **extra):
    """The runlocal run as 2 processes x 4 simulated devices (`python -m gspo_jax.main`, gloo) in
    wd, with the overrides of this module and ``extra``: [output of process 0, of process 1] and
    their return codes, after both end (a failed process stops the other; the timeout kills)."""
    port = free_port()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=REPO,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=shared["xla"],
        # every program, however fast to compile: later pod launches reuse them all
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    flags = [f"--config.{k}={v}" for k, v in {**overrides(shared), **extra}.items()]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gspo_jax.main",
                f"--config={ARITH}:runlocal",
                f"--workdir={wd}",
                f"--coordinator_address=127.0.0.1:{port}",
                "--num_processes=2",
                f"--process_id={i}",
                *flags,
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = wait_all(procs, timeout=timeout)
    return outs, [p.returncode for p in procs]
