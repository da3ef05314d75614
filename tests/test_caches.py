"""Shared caches under concurrency: runs started together prepare the dataset and train the warm
start once; a corrupt warm-start entry is reported, moved aside and trained again."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from trainer_runs import load_repo_module

from gspo_jax import filelock, models
from gspo_jax import tasks as tasks_lib
from gspo_jax.rl import warmstart

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROCESSES = 3
# Large enough that preparing it (~1 s) overlaps the other processes' calls.
_DATA_KNOBS = dict(num_train=10000, num_test=50)
# The tiny warm start of test_warmstart.py, shortened: compiling the step alone takes seconds, so
# the processes overlap while the first one trains.
_WS_KNOBS = dict(num_numbers=2, max_number=20, num_train=400, num_test=64)
_WARM = dict(steps=3, batch_size=8, learning_rate=1e-2, warmup_steps=1)

# Every child imports first, then signals readiness and waits for the same start signal, so their
# calls race (an import takes seconds and would otherwise stagger them).
_BARRIER = """
import os, sys, time
open(sys.argv[1] + ".ready" + sys.argv[2], "w").close()
while not os.path.exists(sys.argv[1] + ".go"):
    time.sleep(0.01)
"""

_PREPARE_DATA = (
    """
from gspo_jax import data, tasks
from gspo_jax.data import builders  # noqa: F401 (imported before the race)
task = tasks.get_task("arith", **{knobs})
"""
    + _BARRIER
    + """
builder = data.prepare(task, {data_dir!r})
print("RECORDS", len(builder.as_data_source("train")))
"""
)

_WARM_START = (
    """
import jax
from flax import nnx
from gspo_jax import data, models, tasks
from gspo_jax.rl import warmstart
from gspo_jax.data import builders  # noqa: F401 (imported before the race)
task = tasks.get_task("countdown", **{knobs})
cfg = models.get_model_config("tiny", vocab_size=task.tokenizer.vocab_size, max_seq_len=64)
train = warmstart.train
def counted_train(*args, **kwargs):
    print("TRAINING", flush=True)
    return train(*args, **kwargs)
warmstart.train = counted_train
"""
    + _BARRIER
    + """
model = warmstart.get_base_model(task, cfg, {warm}, {cache_dir!r}, data_dir={data_dir!r},
                                 progress=False)
params = jax.tree.leaves(nnx.state(model, nnx.Param))
print("CHECKSUM", repr(sum(float(abs(x).sum()) for x in params)))
"""
)


def _child_env(tmp_path):
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        GSPO_JAX_CACHE=str(tmp_path / "cache"),
        GSPO_JAX_DATA_DIR=str(tmp_path / "tfds"),
    )
    # One device is enough for the children (conftest's 8 simulated devices slow their start).
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "").strip()
    )
    if not env["XLA_FLAGS"]:
        del env["XLA_FLAGS"]
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _race(script: str, tmp_path, timeout: float = 120) -> list[tuple[int, str, str]]:
    """Starts _PROCESSES copies of ``script`` at once, releases them together once all have
    imported, and returns each one's (returncode, stdout, stderr)."""
    barrier = str(tmp_path / "barrier")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, barrier, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(tmp_path),
            cwd=str(tmp_path),
        )
        for i in range(_PROCESSES)
    ]
    try:
        deadline = time.time() + timeout
        while len(glob.glob(barrier + ".ready*")) < _PROCESSES:
            assert time.time() < deadline, "children did not get ready"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        open(barrier + ".go", "w").close()
        outs = [p.communicate(timeout=max(deadline - time.time(), 1)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def _count(results, marker: str, stream: int) -> int:
    return sum(r[stream].count(marker) for r in results)


def _assert_all_succeeded(results):
    for rc, out, err in results:
        assert rc == 0, f"a process failed (rc={rc}):\n{out}\n{err[-3000:]}"


@pytest.mark.slow
def test_processes_started_together_prepare_the_dataset_once(tmp_path):
    data_dir = str(tmp_path / "tfds")
    results = _race(_PREPARE_DATA.format(knobs=_DATA_KNOBS, data_dir=data_dir), tmp_path)
    _assert_all_succeeded(results)
    assert _count(results, "Preparing the arith dataset", 2) == 1, [r[2] for r in results]
    # The others waited for it (and said so) rather than finding it done by chance.
    assert _count(results, "waiting for another process", 2) >= 1, [r[2] for r in results]
    assert all(f"RECORDS {_DATA_KNOBS['num_train']}" in r[1] for r in results)
    assert not glob.glob(os.path.join(data_dir, "*", "*", "incomplete*"))


@pytest.mark.long  # concurrent processes: .ci/run runs it after the README's test command
def test_processes_started_together_train_the_warm_start_once(tmp_path):
    cache_dir = str(tmp_path / "cache")
    script = _WARM_START.format(
        knobs=_WS_KNOBS, warm=_WARM, cache_dir=cache_dir, data_dir=str(tmp_path / "tfds")
    )
    results = _race(script, tmp_path)
    _assert_all_succeeded(results)
    assert _count(results, "TRAINING", 1) == 1, [r[1] for r in results]
    assert _count(results, "waiting for another process", 2) >= 1, [r[2] for r in results]
    assert _count(results, "Preparing the countdown dataset", 2) == 1
    checksums = {line for r in results for line in r[1].splitlines() if "CHECKSUM" in line}
    assert len(checksums) == 1, checksums  # all three hold the one trained base
    # One complete entry and its lock file; no private folder left behind.
    entry = os.path.basename(warmstart.cache_path(_ws_task(), _ws_cfg(), _WARM, cache_dir))
    assert sorted(os.listdir(os.path.join(cache_dir, "warmstart"))) == [entry, entry + ".lock"]


def test_lock_waits_says_for_what_and_is_released_by_a_killed_holder(tmp_path):
    entry = str(tmp_path / "entry")
    take = (
        "import sys, time; from gspo_jax import filelock\n"
        "with filelock.locked(sys.argv[1], 'the test entry'):\n"
        "    print('HELD', flush=True); time.sleep(float(sys.argv[2]))\n"
    )
    env = _child_env(tmp_path)
    with filelock.locked(entry, "the test entry"):
        child = subprocess.Popen(
            [sys.executable, "-c", take, entry, "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = child.stderr.readline()  # printed before it blocks
            assert line.startswith("waiting for another process") and "the test entry" in line
            assert f"pid {os.getpid()}" in line
            time.sleep(0.5)
            assert child.poll() is None  # still waiting while this process holds the lock
        except BaseException:
            child.kill()
            raise
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0 and "HELD" in out

    # A holder that dies (SIGKILL: no cleanup runs) leaves no stale lock behind.
    holder = subprocess.Popen(
        [sys.executable, "-c", take, entry, "600"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "HELD"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    t0 = time.time()
    with filelock.locked(entry, "the test entry"):
        assert time.time() - t0 < 5


def test_try_locked_takes_a_free_entry_and_skips_a_held_one_without_waiting(tmp_path):
    """try_locked yields True on an entry no process holds (and holds it: a second process's
    try gets False at once), False on one another process holds."""
    entry = str(tmp_path / "entry")
    probe = (
        "import sys; from gspo_jax import filelock\n"
        "with filelock.try_locked(sys.argv[1]) as held: print('HELD' if held else 'BUSY')\n"
    )

    def other_process_gets():
        out = subprocess.run(
            [sys.executable, "-c", probe, entry],
            env=_child_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return out.stdout.strip()

    with filelock.try_locked(entry) as held:
        assert held
        t0 = time.time()
        assert other_process_gets() == "BUSY" and time.time() - t0 < 60  # no waiting
    assert other_process_gets() == "HELD"  # released with the body


# ------------------------------------------------------------------------------ corrupt entries


def _ws_task():
    return tasks_lib.get_task("countdown", **_WS_KNOBS)


def _ws_cfg():
    return models.get_model_config(
        "tiny", vocab_size=_ws_task().tokenizer.vocab_size, max_seq_len=64
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A warm-start cache holding one trained entry, and the dataset it was trained on."""
    root = tmp_path_factory.mktemp("pristine")
    cache_dir, data_dir = str(root / "cache"), str(root / "tfds")
    model = warmstart.get_base_model(
        _ws_task(), _ws_cfg(), _WARM, cache_dir, data_dir=data_dir, progress=False
    )
    return model, cache_dir, data_dir


@pytest.fixture
def cached(pristine, tmp_path, monkeypatch):
    """A copy of the pristine cache, a getter of its base model, and a list of trainings since."""
    model, pristine_cache, data_dir = pristine
    cache_dir = str(tmp_path / "cache")
    shutil.copytree(pristine_cache, cache_dir)
    task, cfg = _ws_task(), _ws_cfg()
    trained = []
    train = warmstart.train
    monkeypatch.setattr(warmstart, "train", lambda *a, **k: trained.append(1) or train(*a, **k))

    def get(**kwargs):
        return warmstart.get_base_model(
            task, cfg, _WARM, cache_dir, data_dir=data_dir, progress=False, **kwargs
        )

    path = warmstart.cache_path(task, cfg, _WARM, cache_dir)
    assert _same_params(get(), model) and not trained  # the copy loads as it is
    return model, path, get, trained


def _largest_array_file(path: str) -> str:
    files = [
        f
        for f in glob.glob(os.path.join(path, "params", "**", "d", "*"), recursive=True)
        if os.path.isfile(f)
    ]
    return max(files, key=os.path.getsize)


def _corrupt(path: str, how: str) -> tuple[str, int]:
    """Breaks the entry; returns the file it broke (relative) and that file's size afterwards."""
    victim = _largest_array_file(path) if how != "meta" else os.path.join(path, "meta.json")
    if how == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
        return os.path.relpath(victim, path), os.path.getsize(victim)
    os.remove(victim)
    return os.path.relpath(victim, path), -1


def _same_params(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(
            jax.tree.leaves(nnx.state(a, nnx.Param)),
            jax.tree.leaves(nnx.state(b, nnx.Param)),
            strict=True,
        )
    )


@pytest.mark.parametrize("how", ["truncate", "delete", "meta"])
def test_corrupt_entry_is_reported_moved_aside_and_retrained(cached, how, capfd):
    _, path, get, trained = cached
    broken, size = _corrupt(path, how)
    capfd.readouterr()
    model = get()
    err = capfd.readouterr().err
    reports = [ln for ln in err.splitlines() if "unreadable" in ln]
    assert len(reports) == 1, err
    assert reports[0].startswith(f"warm start cache entry {path} is unreadable (")
    assert "moved it to" in reports[0] and "training it again" in reports[0]
    assert len(trained) == 1
    # Moved aside, not deleted: the broken files are still there as they were.
    (aside,) = glob.glob(path + ".corrupt-*")
    assert f"moved it to {aside} " in reports[0]
    assert os.path.exists(os.path.join(aside, "params"))
    if how == "truncate":
        assert os.path.getsize(os.path.join(aside, broken)) == size
    else:
        assert not os.path.exists(os.path.join(aside, broken))
    # The new entry is complete: it loads (no training) and holds the retrained parameters.
    again = get()
    assert len(trained) == 1 and _same_params(model, again)


def test_multi_host_load_only_run_names_the_broken_entry_and_prepare_only(cached, monkeypatch):
    _, path, get, trained = cached
    _corrupt(path, "truncate")
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(FileNotFoundError, match="--prepare_only") as e:
        get()
    assert path in str(e.value) and "cannot be loaded" in str(e.value)
    assert "\n" not in str(e.value)  # one line (experiment.py makes it a ConfigError)
    # Load-only: nothing trained, nothing moved (the single-process --prepare_only does that).
    assert not trained and not glob.glob(path + ".corrupt-*")
    assert os.path.exists(os.path.join(path, "meta.json"))


# ------------------------------------------------------------------------------ sweep launcher


def test_sweep_prepares_once_per_distinct_dataset_and_warm_start(tmp_path, capsys):
    sweep = load_repo_module("experiments/sweep.py")
    arith = os.path.join(REPO, "configs", "arith.py")
    runs = sweep.load_sweep(arith, "seeds=2")
    assert [len(g) for g in sweep.preparation_groups(runs)] == [len(runs)]
    other = [
        dict(name="other_data", overrides={"task.kwargs.seed": 3}),
        dict(name="other_base", overrides={"init.warmstart.seed": 1, "seed": 5}),
        dict(name="same_base", overrides={"init.warmstart.seed": 1, "seed": 6}),
    ]
    groups = sweep.preparation_groups(runs[:2] + other)
    assert [[r["name"] for r in g] for g in groups] == [
        [r["name"] for r in runs[:2]],
        ["other_data"],
        ["other_base", "same_base"],
    ]

    assert (
        sweep.main(
            [
                "--config",
                f"{arith}:runlocal",
                "--sweep",
                "seeds=1",
                "--workdir",
                str(tmp_path),
                "--parallel",
                "2",
                "--dry_run",
                "--population=false",  # a process per run: the commands this test reads
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith("--prepare_only") and "gspo_jax.main" in lines[0]
    assert len(lines) == 1 + len(sweep.load_sweep(arith, "seeds=1"))
    assert not any("--prepare_only" in ln for ln in lines[1:])


@pytest.mark.slow
def test_sweep_prepare_once_builds_the_warm_start_in_one_subprocess(tmp_path, capsys):
    sweep = load_repo_module("experiments/sweep.py")
    arith = os.path.join(REPO, "configs", "arith.py")
    runs = sweep.load_sweep(arith, "seeds=1")[:3]
    extra = ["--config.init.warmstart.steps=2", "--config.log.progress=False"]
    codes = sweep.prepare_once(
        f"{arith}:runlocal", runs, str(tmp_path), extra, _child_env(tmp_path)
    )
    out = capsys.readouterr().out
    assert codes == {runs[0]["name"]: 0}, open(tmp_path / "prepare.log").read()[-3000:]
    assert out.count("[sweep] preparing the dataset and warm start once for 3 run(s)") == 1
    assert len(glob.glob(str(tmp_path / "cache" / "warmstart" / "arith_*" / "meta.json"))) == 1
    assert len(glob.glob(str(tmp_path / "tfds" / "gspo_arith" / "*" / "1.0.0"))) == 1
