"""Faults that one process of a pod run sees: 2 processes (jax.distributed over gloo on this CPU)
must fall back, stop or refuse together, within config.multihost.timeout_s, each with one line.

One launch of tests/multihost_faults.py runs every scenario in one pair of processes (each launch
imports JAX and compiles in two processes), starting from copies of the shared 2-process run
(conftest.two_process), whose compiled programs it reuses: the refusals, the one-host corrupt
checkpoint, the one-host failed save, then process 1 killed (and a second launch: both
processes rerun from the killed run's checkpoint). The launch has a subprocess timeout,
and every assertion on time names its bound. SIGTERM to one process of two is
tests/test_signals.py's; the collapse count across a resume is tests/test_resilience.py's
(in-process: the count is in the checkpoint whatever the process count).
"""

import json
import os
import subprocess
import sys
import time

import pytest
import trainer_runs as runs
from trainer_runs import REPO, STEPS, assert_records, assert_trees, final_params, records

# One two-process launch takes ~2.5 min on the shared 2-core CPU (docs/resilience.md): .ci/run
# runs these after the README's test command (marker long).
pytestmark = pytest.mark.long

TIMEOUT_S = runs.POD_FAULTS["multihost.timeout_s"]  # the worker's bounded waits
LAUNCH_S = 400  # the subprocess timeout of the launch (JAX start, every scenario)


@pytest.fixture(scope="module")
def pod_run(shared, two_process):
    """Both processes of the worker: (root, [returncode], [output], {name: [result of process 0,
    result of process 1]}, [when each process exited])."""
    root = os.path.join(shared["root"], "pod")
    os.makedirs(root)
    port = runs.free_port()
    env = dict(
        os.environ,
        PYTHONPATH=REPO,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_COMPILATION_CACHE_DIR=shared["xla"],
    )
    worker = os.path.join(REPO, "tests", "multihost_faults.py")
    args = [str(port), root, two_process[0], json.dumps(shared)]
    logs = [os.path.join(root, f"process_{i}.log") for i in range(2)]
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, worker, str(i), *args],
            env=env,
            cwd=REPO,
            stdout=open(logs[i], "w"),
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    ended = [None, None]
    while None in ended and time.time() - t0 < LAUNCH_S:
        for i, p in enumerate(procs):
            if ended[i] is None and p.poll() is not None:
                ended[i] = time.time()
        time.sleep(0.1)
    for p in procs:  # the subprocess timeout: nothing outlives the launch
        if p.poll() is None:
            p.kill()
        p.wait()
    outs = [open(log).read() for log in logs]
    results = {}
    for i, out in enumerate(outs):
        for line in out.splitlines():
            if line.startswith("RESULT "):
                _, name, fields = line.split(" ", 2)
                got = results.setdefault(name, [None, None])
                got[i] = got[i] or json.loads(fields)  # the first (disk_full: the first write)
    return root, [p.returncode for p in procs], outs, results, ended


def _both(pod_run, name):
    _, _, outs, results, _ = pod_run
    got = results.get(name, [None, None])
    assert all(got), f"no {name} result from both processes:\n{outs[0][-3000:]}\n{outs[1][-3000:]}"
    return got


def _no_eval(recs):
    return [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in recs]


def test_a_config_or_workdir_differing_on_one_process_is_refused_on_both(pod_run):
    for name in ("refuse_config", "refuse_workdir"):
        for r in _both(pod_run, name):
            assert r["error"] == "ConfigError" and "\n" not in r["message"], r
            assert not {"metrics.jsonl", "checkpoints"} & set(r["files"] or ()), r["files"]
            bound = TIMEOUT_S
            assert r["wall_s"] < bound, f"{name}: refused after {r['wall_s']:.1f} s, bound {bound}"
    for r in _both(pod_run, "refuse_config"):
        assert "rl.group_size (process 0: 4, process 1: 2)" in r["message"], r["message"]
        assert "seed (process 0: 0, process 1: 1)" in r["message"], r["message"]
    for r in _both(pod_run, "refuse_workdir"):
        msg = r["message"]
        assert "do not share one workdir" in msg and "refuse_workdir_other cannot see" in msg, msg


def test_a_checkpoint_unreadable_on_one_process_falls_back_on_both_and_resumes_exactly(
    pod_run, two_process
):
    for r in _both(pod_run, "corrupt"):
        assert r["error"] is None, r
        lines = [x for x in r["stdout"].splitlines() if "unreadable" in x]
        assert len(lines) == 1 and lines[0].startswith(
            f"checkpoint step {STEPS} is unreadable ("
        ), r
        assert "process_1-of-2.json" in lines[0] and "falling back to step 2" in lines[0], lines
    wd = os.path.join(pod_run[0], "corrupt")
    aside = [n for n in os.listdir(os.path.join(wd, "checkpoints")) if ".unreadable-" in n]
    assert len(aside) == 1 and aside[0].startswith(f"{STEPS}."), aside  # moved aside once
    assert_trees(final_params(wd), final_params(two_process[0]))
    assert_records(_no_eval(records(wd)), _no_eval(records(two_process[0])))


def test_a_save_failing_on_one_process_stops_both_within_the_timeout(pod_run):
    failed_at = pod_run[3]["disk_full"][1]["t"]  # process 1's first failed array write
    for r in _both(pod_run, "failed_save"):
        msg = r["message"]
        assert r["error"] == "CheckpointSaveError" and "\n" not in msg, r
        assert "step 3" in msg and "the previous checkpoint, step 2, is kept" in msg, msg
        assert "No space left on device" in msg, msg
        waited, bound = r["t_end"] - failed_at, 2 * TIMEOUT_S + 10  # orbax's barrier, one step
        assert waited < bound, f"stopped {waited:.1f} s after the failed write, bound {bound} s"
    assert _both(pod_run, "failed_save_steps")[0]["steps"] == [2]  # step 3 never committed


def test_a_killed_process_stops_the_other_in_one_line_and_both_resume_exactly(
    shared, pod_run, two_process
):
    _, codes, outs, results, ended = pod_run
    assert codes[1] == -9, outs[1][-3000:]  # SIGKILLed in step 4
    assert codes[0] == 1, outs[0][-3000:]
    errors = [x for x in outs[0].splitlines() if x.startswith("error: ")]
    assert len(errors) == 1, outs[0][-3000:]
    assert (
        f"error: process 1 sent no heartbeat for {TIMEOUT_S:g} s while this process was"
        in (errors[0])
    )
    assert "the newest checkpoint is step 2 in" in errors[0], errors[0]
    assert "Traceback" not in outs[0], outs[0][-3000:]
    waited, bound = ended[0] - results["killing"][1]["t"], TIMEOUT_S + 10  # the watchdog, beats
    assert waited < bound, f"process 0 exited {waited:.1f} s after the kill, bound {bound} s"
    # The rerun of both processes resumes the committed step-2 checkpoint exactly.
    wd = os.path.join(pod_run[0], "kill")
    outs, codes = runs.launch_pod(shared, wd, timeout=LAUNCH_S, **runs.POD_FAULTS)
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert f"resumed from step 2 in {wd}" in outs[0], outs[0][-3000:]
    assert_trees(final_params(wd), final_params(two_process[0]))
    assert_records(_no_eval(records(wd)), _no_eval(records(two_process[0])))
