"""Worker for tests/test_pod_faults.py (not a test): faults that one process of two sees.

    python tests/multihost_faults.py PROCESS_ID PORT ROOT BASE SHARED_JSON

Two processes x 4 simulated CPU devices (jax.distributed on 127.0.0.1, gloo), the shapes of the
shared 2-process run BASE (conftest.two_process: runlocal arith, 4 RL steps, checkpoints every 2),
so nothing here compiles anew; evaluation off, config.multihost.timeout_s = TIMEOUT_S. The
scenarios run in this order in one pair of processes (JAX starts once); each prints one
``RESULT <name> <json>`` line per process:

  refuse_config   process 1 runs another group size and seed: both refuse before step 0
  refuse_workdir  process 1 passes another workdir: both refuse before step 0
  corrupt         a copy of BASE whose step-4 iterator file of process 1 is garbage (only process
                  1 reads it): both fall back to step 2 and finish
  failed_save     a copy of BASE resumed from step 2, saving every step; process 1's array writes
                  fail with ENOSPC (from step 3's save on): both stop with CheckpointSaveError
  kill            a copy of BASE resumed from step 2; process 1 SIGKILLs itself in step 4:
                  process 0 exits (code 1) with the watchdog's one line; ROOT/kill keeps step 2
                  (the test then reruns both processes there)
"""

import contextlib
import errno
import io
import json
import os
import shutil
import signal
import sys
import time

pid, port, root, base, shared_json = sys.argv[1:6]
pid = int(pid)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # trainer_runs

import trainer_runs as runs  # noqa: E402

from gspo_jax.runtime import distributed  # noqa: E402

TIMEOUT_S = runs.POD_FAULTS["multihost.timeout_s"]
distributed.init_distributed(f"127.0.0.1:{port}", 2, pid, timeout_s=TIMEOUT_S)
os.makedirs(root, exist_ok=True)

import jax  # noqa: E402

# Every program the shared 2-process run compiled is in the persistent cache (see conftest.py).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import orbax.checkpoint as ocp  # noqa: E402

from gspo_jax.rl import step as ts  # noqa: E402
from gspo_jax.rl import trainer  # noqa: E402
from gspo_jax.runtime import agreement as pod  # noqa: E402

shared = json.loads(shared_json)


def config(**extra):
    return runs.make_config(shared, **{**runs.POD_FAULTS, **extra})


def result(name, **fields):
    print(f"RESULT {name} {json.dumps(fields)}", file=sys.__stdout__, flush=True)


def attempt(name, cfg, wd):
    """trainer.train; RESULT with the error's type and message, the wall time and stdout."""
    t0, out, error = time.time(), io.StringIO(), None
    try:
        with contextlib.redirect_stdout(out):
            trainer.train(cfg, wd)
    except Exception as e:  # noqa: BLE001 (the result says what was raised)
        error = e
    result(
        name,
        t_end=time.time(),
        error=type(error).__name__ if error else None,
        message=str(error) if error else None,
        wall_s=time.time() - t0,
        stdout=out.getvalue(),
        files=sorted(os.listdir(wd)) if os.path.isdir(wd) else None,
    )


def copy_of_base(name, drop=()):
    """BASE copied to ROOT/name (by process 0) without the given checkpoint steps."""
    wd = os.path.join(root, name)
    if pid == 0:
        shutil.copytree(base, wd)
        os.remove(os.path.join(wd, "summary.json"))
        for step in drop:
            shutil.rmtree(os.path.join(wd, "checkpoints", str(step)))
    pod.barrier(f"copying {name}")
    return wd


def at_step(step, action):
    real = ts.rl_step

    def wrapped(run, phases, state, batch, **kw):
        if int(jax.device_get(state.step)) + 1 == step:
            action()
        return real(run, phases, state, batch, **kw)

    ts.rl_step = wrapped


other = {"rl.group_size": 2, "seed": 1} if pid == 1 else {}
attempt("refuse_config", config(**other), os.path.join(root, "refuse_config"))
attempt("refuse_workdir", config(), os.path.join(root, "refuse_workdir" + "_other" * pid))

wd = copy_of_base("corrupt")
if pid == 1:
    with open(os.path.join(wd, "checkpoints", "4", "data_iter", "process_1-of-2.json"), "w") as f:
        f.write("{ not json")
pod.barrier("corrupting")
attempt("corrupt", config(), wd)

wd = copy_of_base("failed_save", drop=(4,))
real_serialize = ocp.type_handlers.ArrayHandler.serialize
if pid == 1:

    class _DiskFull:
        def result(self, timeout=None):
            result("disk_full", t=time.time())
            raise OSError(errno.ENOSPC, "No space left on device")

    async def failing(self, *args, **kwargs):
        return [*(await real_serialize(self, *args, **kwargs)), _DiskFull()]

    ocp.type_handlers.ArrayHandler.serialize = failing
attempt("failed_save", config(**{"checkpoint.every": 1}), wd)
names = os.listdir(os.path.join(wd, "checkpoints"))
result("failed_save_steps", steps=sorted(int(n) for n in names if n.isdigit()))
ocp.type_handlers.ArrayHandler.serialize = real_serialize

wd = copy_of_base("kill", drop=(4,))
if pid == 1:

    def die():
        result("killing", t=time.time())
        os.kill(os.getpid(), signal.SIGKILL)

    at_step(4, die)
try:
    trainer.train(config(), wd)
except Exception:  # noqa: BLE001 (main.py's path: the watchdog speaks first)
    pod.wait_for_peers()
    raise
result("kill_survived")  # not reached: the watchdog exits this process
sys.stdout.flush()
os._exit(0)
