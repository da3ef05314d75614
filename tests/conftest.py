"""Test configuration shared by every test module.

Eight simulated CPU devices are created before JAX is imported so that sharding
tests (data, fsdp, tensor, expert axes) run in-process next to single-device tests;
unsharded computations still run on device 0 only.
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# XLA:CPU aborts the process when a collective's 8 device threads have not all met within its
# terminate timeout: "Termination timeout ... Exiting to ensure a consistent program
# state". Two test workers on 2 cores, each with 8 simulated devices, can starve a thread that
# long (the population-axis tests lost a worker to it in CI and here); they wait longer instead.
if "xla_cpu_collective_call_terminate_timeout_seconds" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += (
        " --xla_cpu_collective_call_terminate_timeout_seconds=600"
        " --xla_cpu_collective_call_warn_stuck_timeout_seconds=120"
    )
# The tests' programs are small and most run once: LLVM's optimisation passes cost more than they
# save (a subset of the README's tests, one process: 133 s -> 96 s, 2026-12-07, 2-core CPU). Set
# here, so the runs the tests start as subprocesses (the notebooks' tiny runs, the pod tests)
# compile so too; the library, benchmarks and experiments keep XLA's default.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compare float32 results to 1e-5; keep matmuls in full float32 precision.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


import sys  # noqa: E402

# notebooks/reporting (the claim notebooks' analysis and verdicts) is imported as `reporting`
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
)

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402
import trainer_runs as runs  # noqa: E402  (the shared trainer runs and their helpers)


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    """Dirs shared by every trainer run of the session: warm-start cache, TFDS data, and a
    persistent compilation cache (a second run of the same shapes does not recompile)."""
    root = tmp_path_factory.mktemp("trainer")
    # Under pytest-xdist the workers share the caches (their locks make concurrent builders train
    # or prepare once, and the compilation cache's writes are atomic); runs stay per worker.
    common = (
        tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    )
    dirs = {k: str(common / k) for k in ("cache", "data", "xla")}
    jax.config.update("jax_compilation_cache_dir", dirs["xla"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    dirs["root"] = str(root)
    yield dirs
    jax.config.update("jax_compilation_cache_dir", None)


@pytest.fixture(scope="session")
def single(shared):
    """The 1-device runlocal run (4 steps, checkpoints 2 and 4): (workdir, summary)."""
    from gspo_jax.rl import trainer

    wd = os.path.join(shared["root"], "single")
    summary = trainer.train(runs.make_config(shared, num_devices=1), wd)
    return wd, summary


@pytest.fixture(scope="session")
def sharded(shared):
    """The same run on 8 simulated devices: its workdir."""
    from gspo_jax.rl import trainer

    wd = os.path.join(shared["root"], "sharded")
    trainer.train(runs.make_config(shared, num_devices=8), wd)
    return wd


@pytest.fixture(scope="session")
def two_process(shared, single):  # single: the warm-start cache a pod run only loads
    """The same run as 2 processes x 4 simulated devices (`python -m gspo_jax.main`, gloo):
    (workdir, outputs of both). Shared by test_trainer.py and test_pod_faults.py (whose fault runs
    start from copies of it and reuse its compiled programs)."""
    wd = os.path.join(shared["root"], "multi")
    outs, codes = runs.launch_pod(shared, wd, timeout=600)
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return wd, outs


# Under pytest-xdist (`-n 2`) each group of tests runs in one worker. The session's trainer runs
# (the fixtures below) are built once, in the worker of the modules that use them.
RUN_FIXTURES = {"single", "sharded", "two_process"}
RUN_MODULES = {
    "test_hf_checkpoint",
    "test_pod_faults",
    "test_resilience",
    "test_rollout_options",
    "test_signals",
    "test_trainer",
}
FIRST = ("runs", "test_notebooks")  # the longest groups start first


def _group(module: str) -> str:
    """A test module's group: "runs" for the modules that share the trainer runs, else itself."""
    return "runs" if module in RUN_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """One work unit per group (xdist's own --dist loadgroup reads a marker that pytest 9's node
    ids no longer carry), handed out in collection order (see below)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _group(os.path.basename(nodeid.split("::", 1)[0])[: -len(".py")])

    config.option.loadscopereorder = False
    return ByGroup(config, log)


# .ci/run's long stage survives a worker that dies in native code: with GSPO_PASSED_LOG set, each
# test that passes (or skips) is appended to that file as it is reported, and a second session with
# GSPO_RERUN_UNPASSED=1 deselects those, so it runs the crashed test and every test the first
# session never reached (xdist stops at a crash under --max-worker-restart=0, and a replaced worker
# can sit idle under group scheduling: the hang that cost a CI run its 90 minutes).
def _passed_log() -> str | None:
    return os.environ.get("GSPO_PASSED_LOG") or None


def pytest_configure(config):
    # the session that writes the log: the first (xdist's controller, which sees every worker's
    # reports); workers and pytest sessions a test starts inherit its pid and do not write
    if _passed_log() and "GSPO_PASSED_LOG_WRITER" not in os.environ:
        os.environ["GSPO_PASSED_LOG_WRITER"] = str(os.getpid())


def pytest_runtest_logreport(report):
    path = _passed_log()
    if path is None or os.environ.get("GSPO_PASSED_LOG_WRITER") != str(os.getpid()):
        return
    done = (report.when == "call" and report.passed) or (report.when == "setup" and report.skipped)
    if done:
        with open(path, "a") as f:
            f.write(report.nodeid + "\n")


def _deselect_passed(config, items):
    path = _passed_log()
    if not os.environ.get("GSPO_RERUN_UNPASSED") or path is None:
        return
    if not os.path.exists(path):
        raise pytest.UsageError(f"GSPO_RERUN_UNPASSED: no log of passed tests at {path}")
    with open(path) as f:
        passed = set(f.read().splitlines())
    keep = [it for it in items if it.nodeid not in passed]
    config.hook.pytest_deselected(items=[it for it in items if it.nodeid in passed])
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    """Checks that RUN_MODULES names every module using a trainer run; leaves out the tests a
    first session passed when asked to (above); under xdist, puts the longest groups first (every
    worker collects in this order)."""
    _deselect_passed(config, items)
    for item in items:
        module = item.module.__name__
        if RUN_FIXTURES & set(item.fixturenames) and module not in RUN_MODULES:
            raise pytest.UsageError(f"{module} uses a trainer run: add it to RUN_MODULES")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {g: k for k, g in enumerate(FIRST)}
        order = {
            id(it): (rank.get(_group(it.module.__name__), len(FIRST)), k)
            for k, it in enumerate(items)
        }
        items.sort(key=lambda it: order[id(it)])
