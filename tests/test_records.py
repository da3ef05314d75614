"""The claims' runs kept as committed records (notebooks/reporting/records.py): a record reads
back as its run, is written with the same bytes each time, and the launcher does not run a run
again whose record exists, while it records every run that finished."""

import json
import os
import sys
import types

import pytest
from reporting import analysis, records
from trainer_runs import load_repo_module

claims = load_repo_module("experiments/claims.py")


def fake_run(root: str, name: str, *, finished: bool = True, acc: float = 0.5) -> str:
    """A workdir as the trainer leaves it: config.json, metrics.jsonl (a NaN included, stored as
    the string "nan") and, when finished, summary.json."""
    wd = os.path.join(root, name)
    os.makedirs(wd)
    with open(os.path.join(wd, "config.json"), "w") as f:
        json.dump({"seed": 3, "objective": {"name": "gspo"}}, f)
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "train/loss": 0.25, "train/clip_frac": "nan"}) + "\n")
        f.write(json.dumps({"step": 2, "train/loss": -0.5, "eval/greedy_accuracy": acc}) + "\n")
    if finished:
        with open(os.path.join(wd, "summary.json"), "w") as f:
            json.dump({"final": {"greedy_accuracy": acc}, "base": {"greedy_accuracy": 0.4}}, f)
    return wd


def test_a_record_reads_back_as_its_run_with_the_same_bytes_each_time(tmp_path):
    runs, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    wd = fake_run(runs, "gspo_int8_none_s3")
    path = records.write(wd, kept)
    first = open(path, "rb").read()
    assert records.write(wd, kept) == path and open(path, "rb").read() == first
    from_run = analysis.load_runs(runs)["gspo_int8_none_s3"]
    from_record = analysis.load_runs(kept)["gspo_int8_none_s3"]
    assert (from_record.arm, from_record.seed) == ("gspo_int8_none", 3)
    assert from_record.config == from_run.config and from_record.summary == from_run.summary
    assert from_record.records[1] == from_run.records[1]
    assert from_record.records[0]["train/clip_frac"] != from_record.records[0]["train/clip_frac"]
    assert analysis.final(from_record, "eval/greedy_accuracy") == 0.5


def test_an_unfinished_run_is_not_recorded(tmp_path):
    runs, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    wd = fake_run(runs, "grpo_f32_none_s0", finished=False)
    fake_run(runs, "grpo_f32_none_s1")
    with pytest.raises(FileNotFoundError, match="has not finished"):
        records.write(wd, kept)
    assert records.record_all(runs, kept) == [records.path_of(kept, "grpo_f32_none_s1")]
    assert records.record_all(runs, kept) == []  # unchanged: nothing rewritten
    assert sorted(os.listdir(kept)) == ["grpo_f32_none_s1.json.gz"]


def test_a_record_of_an_unknown_format_is_refused(tmp_path):
    import gzip

    path = str(tmp_path / "x_s0.json.gz")
    with gzip.open(path, "wt") as f:
        json.dump({"format": 99, "name": "x_s0"}, f)
    with pytest.raises(ValueError, match="record format 99"):
        records.read(path)


def test_the_launcher_skips_recorded_runs_and_records_those_that_finish(tmp_path, monkeypatch):
    runs_dir, results = str(tmp_path / "runs"), str(tmp_path / "results")
    names = ["a_s0", "a_s1", "b_s0", "b_s1"]
    launched = []

    def launch(config, runs, root, parallel, flags, **kw):
        launched.extend(r["name"] for r in runs)
        for r in runs:  # b_s1 fails before it finishes
            fake_run(root, r["name"], finished=r["name"] != "b_s1")
        return {r["name"]: int(r["name"] == "b_s1") for r in runs}

    sw = types.SimpleNamespace(launch=launch, collect=lambda runs, root: [], write_tables=print)
    monkeypatch.setattr(claims, "_sweep_module", lambda: sw)
    monkeypatch.setattr(claims, "sweep_runs", lambda s, seeds: [{"name": n} for n in names])
    monkeypatch.setattr(claims, "warm_start_entries", lambda s, runs, flags: [])
    sweep = claims.Sweep("toy", "configs/arith.py")
    fake_run(str(tmp_path / "elsewhere"), "a_s1")  # a run recorded by an earlier session
    records.write(str(tmp_path / "elsewhere" / "a_s1"), os.path.join(results, "toy"))

    failed = claims.run_sweeps([sweep], runs_dir, results_dir=results)
    assert launched == ["a_s0", "b_s0", "b_s1"] and failed == ["toy/b_s1"]
    kept = sorted(os.listdir(os.path.join(results, "toy")))
    assert kept == ["a_s0.json.gz", "a_s1.json.gz", "b_s0.json.gz"]
    # the notebooks read the records as they read workdirs
    assert sorted(analysis.load_runs(os.path.join(results, "toy"))) == ["a_s0", "a_s1", "b_s0"]


def test_the_launcher_restores_and_keeps_the_runs_warm_starts(tmp_path, monkeypatch):
    """A warm start kept beside the records is copied into the cache before the sweep's runs (a
    new machine starts from the design's base, not from its own draw); one the cache lacks is
    left to the runs to train, then kept; a cache entry that exists is used as it is."""
    runs_dir, results = str(tmp_path / "runs"), str(tmp_path / "results")
    cache = tmp_path / "cache" / "warmstart"
    kept = os.path.join(results, claims.WARM_STARTS)
    committed, fresh = str(cache / "arith_aaa"), str(cache / "arith_bbb")
    os.makedirs(os.path.join(kept, "arith_aaa"))
    with open(os.path.join(kept, "arith_aaa", "meta.json"), "w") as f:
        f.write('{"draw": "committed"}')
    seen = {}

    def launch(config, runs, root, parallel, flags, **kw):
        seen["restored"] = open(os.path.join(committed, "meta.json")).read()
        seen["fresh_before"] = os.path.exists(fresh)
        os.makedirs(fresh)  # the runs train the missing warm start into the cache
        with open(os.path.join(fresh, "meta.json"), "w") as f:
            f.write('{"draw": "trained here"}')
        for r in runs:
            fake_run(root, r["name"])
        return {r["name"]: 0 for r in runs}

    sw = types.SimpleNamespace(launch=launch, collect=lambda runs, root: [], write_tables=print)
    monkeypatch.setattr(claims, "_sweep_module", lambda: sw)
    monkeypatch.setattr(claims, "sweep_runs", lambda s, seeds: [{"name": "a_s0"}])
    monkeypatch.setattr(claims, "warm_start_entries", lambda s, runs, flags: [committed, fresh])
    assert (
        claims.run_sweeps([claims.Sweep("toy", "configs/arith.py")], runs_dir, results_dir=results)
        == []
    )
    assert seen == {"restored": '{"draw": "committed"}', "fresh_before": False}
    assert sorted(os.listdir(kept)) == ["arith_aaa", "arith_bbb"]
    assert open(os.path.join(kept, "arith_bbb", "meta.json")).read() == '{"draw": "trained here"}'
    # the cache's own entry is not replaced by the committed one
    with open(os.path.join(kept, "arith_bbb", "meta.json"), "w") as f:
        f.write('{"draw": "another"}')
    assert claims.restore_warm_starts([fresh], kept) == []
    assert open(os.path.join(fresh, "meta.json")).read() == '{"draw": "trained here"}'


def test_round_3_warm_starts_are_rounded_and_kept_before_any_run(tmp_path, monkeypatch):
    """A round-3 sweep (Sweep.keep "bfloat16"): the warm start its runs lack is trained, rounded
    to bfloat16 and packed before the first run starts; on a machine without it the kept file is
    unpacked (the same digest), a cache entry that differs from it is refused, and so is one
    trained elsewhere and never rounded; --warm_starts_only launches no run."""
    import numpy as np

    store = load_repo_module("experiments/warmstart_store.py")
    runs_dir, results = str(tmp_path / "runs"), str(tmp_path / "results")
    kept = os.path.join(results, claims.WARM_STARTS)
    entry = str(tmp_path / "cache" / "warmstart" / "chainsum_aaa")
    values = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    trained, seen = [], {}

    def train(config, runs, root, flags, parallel=1, on_done=None):
        for r in runs:
            trained.append(r["name"])
            store.write_params(entry, {"embed": values}, {"draw": 0})
            on_done(r, 0)  # rounded and kept at once, before the next one trains
            seen["kept_at_once"] = os.path.exists(os.path.join(kept, "chainsum_aaa" + store.SUFFIX))
        return {r["name"]: 0 for r in runs}

    def launch(config, runs, root, parallel, flags, **kw):
        seen["params"] = store.read_params(entry)["embed"]
        for r in runs:
            fake_run(root, r["name"])
        return {r["name"]: 0 for r in runs}

    sw = types.SimpleNamespace(launch=launch, collect=lambda runs, root: [], write_tables=print)
    monkeypatch.setattr(claims, "_sweep_module", lambda: sw)
    monkeypatch.setattr(claims, "train_warm_starts", train)
    monkeypatch.setattr(claims, "sweep_runs", lambda s, seeds: [{"name": "a_s0"}, {"name": "b_s0"}])
    monkeypatch.setattr(claims, "warm_start_groups", lambda s, runs, flags: {entry: runs[0]})
    monkeypatch.setattr(claims, "registered_arms", lambda sweep: {"a", "b"})
    sweep = claims.Sweep("r3_toy", "configs/testbed.py", laptop=False, keep="bfloat16")

    assert claims.run_sweeps([sweep], runs_dir, results_dir=results, warm_starts_only=True) == []
    assert trained == ["a_s0"] and "params" not in seen  # trained once, no run launched
    assert seen.pop("kept_at_once")
    rounded = store.read_params(entry)["embed"]
    assert store.is_bfloat16({"embed": rounded}) and not np.array_equal(rounded, values)
    path = os.path.join(kept, "chainsum_aaa" + store.SUFFIX)
    assert os.listdir(kept) == ["chainsum_aaa" + store.SUFFIX] and store.verify(path, entry)

    # another machine: the kept copy is restored, not trained again, and the runs start from it
    import shutil

    shutil.rmtree(entry)
    assert claims.run_sweeps([sweep], runs_dir, results_dir=results) == []
    assert trained == ["a_s0"] and np.array_equal(seen["params"], rounded)
    assert sorted(os.listdir(os.path.join(results, "r3_toy"))) == ["a_s0.json.gz", "b_s0.json.gz"]

    # a cache entry that differs from the kept one, or trained elsewhere unrounded: refused
    store.write_params(entry, {"embed": rounded + 1}, {"draw": 0})
    with pytest.raises(SystemExit, match="differs from its kept copy"):
        claims.pack_warm_starts(sweep, [{"name": "a_s1"}], runs_dir, (), kept)
    os.remove(path)
    store.write_params(entry, {"embed": values}, {"draw": 0})
    with pytest.raises(SystemExit, match="not rounded to bfloat16"):
        claims.pack_warm_starts(sweep, [{"name": "a_s1"}], runs_dir, (), kept)
    assert not os.path.exists(path)


def test_a_round_3_arm_only_a_draft_names_waits_for_its_registration(tmp_path, monkeypatch, capsys):
    """A round-3 run is made for a registered entry only: the launcher leaves out the arms no
    registered entry runs (a draft's; its runs before its registration would break the order),
    saying so: r3_sequence's arms are drafts' only (r3_minibatch's three are registered)."""
    launched = []
    sw = types.SimpleNamespace(
        launch=lambda config, runs, root, parallel, flags, **kw: (
            launched.extend(r["name"] for r in runs) or {r["name"]: 0 for r in runs}
        ),
        collect=lambda runs, root: [],
        write_tables=lambda rows, root: None,
    )
    monkeypatch.setattr(claims, "_sweep_module", lambda: sw)
    monkeypatch.setattr(claims, "pack_warm_starts", lambda *a, **k: [])
    minibatch = {"gspo_mb16", "grpo_nokl_mb16", "gspo_eps0.2_mb16"}
    assert claims.registered_arms("r3_minibatch") == minibatch
    assert claims.registered_arms("r3_sequence") == set()
    names = {"r3_minibatch": [f"{a}_s0" for a in sorted(minibatch)], "r3_sequence": ["gspo_s0"]}
    monkeypatch.setattr(claims, "sweep_runs", lambda s, seeds: [{"name": n} for n in names[s.name]])
    sweeps = [claims.SWEEPS["r3_sequence"], claims.SWEEPS["r3_minibatch"]]
    results = str(tmp_path / "results")
    assert claims.run_sweeps(sweeps, str(tmp_path / "runs"), results_dir=results) == []
    assert launched == names["r3_minibatch"]
    assert "arms ['gspo'] wait for their entry's registration" in capsys.readouterr().out


def test_a_round_3_sweep_without_a_results_dir_is_refused_before_any_run(
    tmp_path, monkeypatch, capsys
):
    """Its warm starts are rounded and kept under the results dir: a workdirs-only launch would
    start runs from numbers no kept file gives back, so it stops with the fix, launching nothing,
    from the library and from the command line; a round-2 sweep still runs workdirs-only."""
    launched = []
    sw = types.SimpleNamespace(
        launch=lambda config, runs, root, parallel, flags, **kw: launched.extend(runs) or {},
        collect=lambda runs, root: [],
        write_tables=lambda rows, root: None,
    )
    monkeypatch.setattr(claims, "_sweep_module", lambda: sw)
    monkeypatch.setattr(claims, "sweep_runs", lambda s, seeds: [{"name": "a_s0"}])
    r3 = claims.Sweep("r3_toy", "configs/testbed.py", laptop=False, keep="bfloat16")
    with pytest.raises(ValueError, match=r"\['r3_toy'\] start from warm starts .* --results_dir"):
        claims.run_sweeps([r3], str(tmp_path))
    assert launched == []
    assert claims.run_sweeps([claims.Sweep("toy", "configs/arith.py")], str(tmp_path)) == []
    assert launched == [{"name": "a_s0"}]
    monkeypatch.setitem(claims.SWEEPS, "r3_toy", r3)
    with pytest.raises(SystemExit):
        claims.main(["--sweeps", "r3_toy", "--runs_dir", str(tmp_path), "--results_dir", ""])
    monkeypatch.setattr(claims, "notebook_sweeps", lambda p, args: [r3])
    with pytest.raises(SystemExit):
        claims.main(["some_notebook", "--runs_dir", str(tmp_path), "--results_dir", ""])
    assert "start from warm starts rounded and kept under --results_dir" in capsys.readouterr().err
    assert launched == [{"name": "a_s0"}]


def test_a_record_keeps_when_its_run_first_started(tmp_path):
    """started_at is the oldest TensorBoard event file's stamp (the writer opens one per start,
    a resume adds a later one); a run without TensorBoard files has None."""
    runs, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    wd = fake_run(runs, "gspo_s100")
    assert records.read(records.write(wd, kept))["started_at"] is None
    os.makedirs(os.path.join(wd, "tb"))
    for stamp in ("1796453490", "1796450000"):  # a resume's file, then the first start's
        open(os.path.join(wd, "tb", f"events.out.tfevents.{stamp}.vm"), "w").close()
    assert records.read(records.write(wd, kept))["started_at"] == 1796450000


def test_registration_order_flags_a_run_that_started_before_its_entry(tmp_path, monkeypatch):
    """experiments/checks/registration_order.py: a recorded start after the registering commit
    is "after", before it a violation; without a start, a record committed sooner after the
    registration than the run lasted proves a violation, else the sweep's first mention bounds
    the start from below."""
    order = load_repo_module("experiments/checks/registration_order.py")
    registered = 1_000_000

    def record(name, started_at=None, wall_s=100.0):
        wd = fake_run(str(tmp_path / "runs"), name)
        with open(os.path.join(wd, "summary.json"), "w") as f:
            json.dump({"wall_s": wall_s}, f)
        path = records.write(wd, str(tmp_path / "kept"))
        if started_at is not None:
            import gzip

            rec = records.read(path)
            rec["started_at"] = started_at
            with gzip.open(path, "wt") as f:
                json.dump(rec, f)
        return path

    committed = {}
    monkeypatch.setattr(order, "first_commit_time", lambda p: committed.get(p))
    monkeypatch.setattr(order, "sweep_defined_at", lambda s: {"new": registered, "old": 5}[s])
    assert order.status(record("a_s100", registered + 1), "old", registered) == "after"
    assert order.status(record("b_s100", registered - 1), "new", registered) == "VIOLATION"
    late = record("c_s100")
    committed[late] = registered + 50  # ended 50 s after the registration, ran 100 s
    assert order.status(late, "new", registered) == "VIOLATION"
    committed[late] = registered + 500
    assert order.status(late, "new", registered) == "sweep no older"
    assert order.status(late, "old", registered) == "not shown"


def test_a_record_keeps_the_entries_it_was_made_for_and_is_refused_once_one_changes(tmp_path):
    """A record keeps {entry: hash} from its first writing on; analysis.load_runs reads it while
    the entry is unchanged and refuses it, naming the entry, once the entry's content differs."""
    from gspo_jax import claims as reg

    entry = reg.current("int8_rollout_mismatch")
    made_for = {entry.name: reg.entry_hash(entry)}
    assert made_for.items() <= claims.entry_hashes("quant").items()  # what the launcher keeps
    wd = fake_run(str(tmp_path / "runs"), "grpo_int8_none_s0")
    kept = str(tmp_path / "kept")
    path = records.write(wd, kept, made_for)
    assert records.write(wd, kept, {entry.name: "0" * 64}) == path  # rewritten: first kept
    assert records.read(path)["entries"] == made_for
    assert "grpo_int8_none_s0" in analysis.load_runs(kept)
    import gzip

    rec = records.read(path)
    rec["entries"] = {entry.name: "f" * 64}  # made for another content of the same entry
    with gzip.open(path, "wt") as f:
        json.dump(rec, f)
    with pytest.raises(ValueError, match="int8_rollout_mismatch v1 .* has been edited since"):
        analysis.load_runs(kept)


def test_registration_order_catches_an_entry_edited_in_place(tmp_path, monkeypatch, capsys):
    """An entry edited in the working tree (a copy of the registry with one criterion's
    threshold changed, read through $GSPO_JAX_REGISTRY) after its committed runs is "EDITED
    after it" and fails the check; the unedited registry passes for the same entry."""
    import dataclasses
    import shutil

    from gspo_jax import claims as reg
    from gspo_jax.claims import registry, schema

    order = load_repo_module("experiments/checks/registration_order.py")
    e = reg.current("int8_rollout_mismatch")
    registered = {(x.key, x.version): reg.entry_hash(x) for x in reg.load()}
    # the registry's history as one commit holding today's entries (git history is read by
    # the check itself; here only the edit is under test)
    monkeypatch.setattr(order, "history", lambda: (("c0ffee0", 1_700_000_000, registered),))
    assert order.main(["quant"]) == 0
    assert "int8_rollout_mismatch v1: registered c0ffee0" in capsys.readouterr().out

    folder = tmp_path / "entries"
    shutil.copytree(registry.registry_dir(), folder)
    edited = dataclasses.replace(e, primary=dataclasses.replace(e.primary, threshold=0.5))
    (folder / e.key / f"v{e.version}.json").write_text(
        schema.canonical_json(schema.to_dict(edited))
    )
    monkeypatch.setenv(registry.ENV, str(folder))
    assert order.main(["quant"]) == 1
    out = capsys.readouterr().out
    assert "int8_rollout_mismatch v1: registered c0ffee0 (2023-11-14 22:13 UTC); edited in " in out
    assert "15 EDITED after it" in out


def test_registration_order_catches_an_in_place_edit_committed_after_the_runs(
    tmp_path, monkeypatch, capsys
):
    """A repository of its own (git init in tmp_path): an entry committed, its runs recorded
    (started after the registration) and committed, then the entry's threshold edited in place
    and committed. The check passes before the edit and fails after it, naming the edit's
    commit; the records, which name the registered hash, are "EDITED after it"."""
    import dataclasses
    import gzip
    import subprocess

    from gspo_jax import claims as reg
    from gspo_jax.claims import registry, schema

    order = load_repo_module("experiments/checks/registration_order.py")
    repo = tmp_path / "repo"
    entries = repo / order.ENTRIES
    (entries / "made_up").mkdir(parents=True)

    def commit(message, when):
        stamp = f"@{when} +0000"
        env = {**os.environ, "GIT_COMMITTER_DATE": stamp, "GIT_AUTHOR_DATE": stamp}
        for args in (["add", "-A"], ["commit", "-q", "-m", message]):
            subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for k, v in (("user.name", "t"), ("user.email", "t@t"), ("commit.gpgsign", "false")):
        subprocess.run(["git", "-C", str(repo), "config", k, v], check=True)
    entry = reg.Claim(
        key="made_up",
        version=1,
        claim="a beats b",
        paper="none",
        notebook="none",
        sweeps=("sw",),
        arms=("a", "b"),
        primary=reg.Criterion(
            statistic="s",
            arms=("a", "b"),
            direction=">",
            threshold=0.0,
            test="every_seed",
            min_seeds=5,
        ),
    )
    path = entries / "made_up" / "v1.json"
    path.write_text(schema.canonical_json(schema.to_dict(entry)))
    commit("register made_up v1", 1_000_000)
    kept = repo / order.RECORDS / "sw"
    kept.mkdir(parents=True)
    for arm in ("a", "b"):
        for seed in range(5):
            record = {
                "format": records.FORMAT,
                "summary": {"wall_s": 10.0},
                "started_at": 1_000_100 + seed,
                "entries": {entry.name: reg.entry_hash(entry)},
            }
            with gzip.open(kept / f"{arm}_s{seed}.json.gz", "wt") as f:
                json.dump(record, f)
    commit("made_up's runs", 1_000_500)

    monkeypatch.setattr(order, "REPO", str(repo))
    monkeypatch.setenv(registry.ENV, str(entries))
    order.history.cache_clear()
    assert order.main([]) == 0
    assert "made_up v1: registered" in capsys.readouterr().out

    edited = dataclasses.replace(entry, primary=dataclasses.replace(entry.primary, threshold=0.1))
    path.write_text(schema.canonical_json(schema.to_dict(edited)))
    commit("tighten made_up's threshold in place", 1_000_900)
    edit = order.git("rev-parse", "--short=7", "HEAD").strip()
    order.history.cache_clear()
    assert order.main([]) == 1
    out = capsys.readouterr().out
    assert "made_up v1: registered" in out and f"edited in {edit}" in out
    assert "10 runs: 10 EDITED after it" in out
    order.history.cache_clear()  # the other tests read the project's own history


# population: the launcher's default (--population true) must record as runs end too
@pytest.mark.parametrize("population", [False, True])
def test_the_launcher_records_each_run_as_it_ends_before_the_sweep_stops(
    tmp_path, monkeypatch, population
):
    runs_dir, results = str(tmp_path / "runs"), str(tmp_path / "results")
    kept = os.path.join(results, "toy")
    seen_when_b_started = []

    def launch(config, runs, root, parallel, flags, on_end=None, **kw):
        fake_run(root, "a_s0")
        on_end("a_s0", 0)  # a_s0 ends while b_s0 still runs
        seen_when_b_started.extend(sorted(os.listdir(kept)))
        fake_run(root, "b_s0", finished=False)
        on_end("b_s0", 1)  # b_s0 dies: nothing to record
        raise KeyboardInterrupt  # the sweep is stopped before it returns

    sw = types.SimpleNamespace(launch=launch, collect=lambda runs, root: [], write_tables=print)
    monkeypatch.setattr(claims, "_sweep_module", lambda: sw)
    monkeypatch.setattr(claims, "sweep_runs", lambda s, seeds: [{"name": "a_s0"}, {"name": "b_s0"}])
    monkeypatch.setattr(claims, "warm_start_entries", lambda s, runs, flags: [])
    monkeypatch.setattr(claims, "entry_hashes", lambda sweep: {"toy_claim v1": "abc"})
    with pytest.raises(KeyboardInterrupt):
        claims.run_sweeps(
            [claims.Sweep("toy", "configs/arith.py")],
            runs_dir,
            results_dir=results,
            population=population,
        )
    assert seen_when_b_started == ["a_s0.json.gz"]
    assert sorted(os.listdir(kept)) == ["a_s0.json.gz"]
    assert records.read(os.path.join(kept, "a_s0.json.gz"))["entries"] == {"toy_claim v1": "abc"}


def test_sweep_launch_calls_on_end_as_each_process_ends(tmp_path, monkeypatch):
    sweep = load_repo_module("experiments/sweep.py")
    codes_by_name = {"ok_s0": 0, "bad_s0": 3}

    def command(config_spec, run, wd, extra=()):
        return [sys.executable, "-c", f"raise SystemExit({codes_by_name[run['name']]})"]

    monkeypatch.setattr(sweep, "run_command", command)
    ended = []
    runs = [{"name": n, "overrides": {}} for n in codes_by_name]
    codes = sweep.launch("unused", runs, str(tmp_path), on_end=lambda n, c: ended.append((n, c)))
    assert codes == codes_by_name and ended == [("ok_s0", 0), ("bad_s0", 3)]


def test_sweep_launch_calls_on_end_for_each_member_as_its_population_ends(tmp_path, monkeypatch):
    """Two runs merged into one population process: as it ends, each member's folder is linked
    at its run's name and on_end sees each member (the claims launcher then records both)."""
    sweep = load_repo_module("experiments/sweep.py")
    pop = {"name": "pop", "members": {"m0": "a_s0", "m1": "b_s0"}, "overrides": {}}
    monkeypatch.setattr(sweep, "population_runs", lambda todo, check, extra, parallel: [pop])

    def command(config_spec, run, wd, extra=()):
        make = "import os; [os.makedirs(os.path.join('members', m)) for m in ('m0', 'm1')]"
        return [sys.executable, "-c", f"import os; os.chdir({wd!r}); {make}"]

    monkeypatch.setattr(sweep, "run_command", command)
    ended = []

    def on_end(name, code):
        ended.append((name, code, os.path.isdir(os.path.join(tmp_path, name))))

    runs = [{"name": n, "overrides": {}} for n in ("a_s0", "b_s0")]
    codes = sweep.launch("unused", runs, str(tmp_path), population=True, on_end=on_end)
    assert codes == {"a_s0": 0, "b_s0": 0}
    assert ended == [("a_s0", 0, True), ("b_s0", 0, True)]
    assert os.path.realpath(tmp_path / "b_s0") == str(tmp_path / "pop" / "members" / "m1")
