"""Test configuration shared by every test module.

Eight simulated CPU devices are created before JAX is imported so that sharding
tests (data, fsdp, tensor, expert axes) run in-process next to single-device tests;
unsharded computations still run on device 0 only.
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compare float32 results to 1e-5; keep matmuls in full float32 precision.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


import subprocess  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402
import trainer_runs as runs  # noqa: E402  (the shared trainer runs and their helpers)


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    """Dirs shared by every trainer run of the session: warm-start cache, TFDS data, and a
    persistent compilation cache (a second run of the same shapes does not recompile)."""
    root = tmp_path_factory.mktemp("trainer")
    dirs = {k: str(root / k) for k in ("cache", "data", "xla")}
    jax.config.update("jax_compilation_cache_dir", dirs["xla"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    dirs["root"] = str(root)
    yield dirs
    jax.config.update("jax_compilation_cache_dir", None)


@pytest.fixture(scope="session")
def single(shared):
    """The 1-device runlocal run (4 steps, checkpoints 2 and 4): (workdir, summary)."""
    from gspo_jax import trainer

    wd = os.path.join(shared["root"], "single")
    summary = trainer.train(runs.make_config(shared, num_devices=1), wd)
    return wd, summary


@pytest.fixture(scope="session")
def sharded(shared):
    """The same run on 8 simulated devices: its workdir."""
    from gspo_jax import trainer

    wd = os.path.join(shared["root"], "sharded")
    trainer.train(runs.make_config(shared, num_devices=8), wd)
    return wd


@pytest.fixture(scope="session")
def two_process(shared, single):  # single: the warm-start cache a pod run only loads
    """The same run as 2 processes x 4 simulated devices (`python -m gspo_jax.main`, gloo):
    (workdir, outputs of both). Shared by test_trainer.py and test_pod_faults.py (whose fault runs
    start from copies of it and reuse its compiled programs)."""
    wd = os.path.join(shared["root"], "multi")
    port = runs.free_port()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=runs.REPO,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=shared["xla"],
        # every program, however fast to compile: test_pod_faults.py's processes reuse them all
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    flags = [f"--config.{k}={v}" for k, v in runs.overrides(shared).items()]
    procs = []
    for i in range(2):
        cmd = [
            sys.executable,
            "-m",
            "gspo_jax.main",
            f"--config={runs.ARITH}:runlocal",
            f"--workdir={wd}",
            f"--coordinator_address=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={i}",
            *flags,
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                env=env,
                cwd=runs.REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = runs.wait_all(procs, timeout=600)
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return wd, outs
