"""experiments/round3_progress.py: what a round-3 design has recorded, has in progress and has
kept, and what its remaining runs cost at their arms' recorded mean (a pilot's records of the same
arms counted in it when given); a registry entry whose arms the launcher could not run is
refused."""

import json
import os

import pytest
from reporting import records
from trainer_runs import load_repo_module

from gspo_jax import claims as reg

progress = load_repo_module("experiments/round3_progress.py")
launcher = load_repo_module("experiments/claims.py")


def recorded_run(
    results: str, sweep: str, name: str, rl_cpu_s: float, tmp, **summary: dict
) -> None:
    """A finished run that took ``rl_cpu_s`` of RL (and ``summary``'s other fields), recorded as
    the launcher records it."""
    wd = os.path.join(tmp, "runs", sweep, name)
    os.makedirs(wd)
    with open(os.path.join(wd, "config.json"), "w") as f:
        json.dump({"seed": 0}, f)
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 300, "eval/greedy_accuracy": 0.5}) + "\n")
    with open(os.path.join(wd, "summary.json"), "w") as f:
        json.dump({"rl_cpu_s": rl_cpu_s, **summary}, f)
    records.write(wd, os.path.join(results, sweep))


def test_progress_counts_recorded_started_and_kept_and_prices_what_is_left(tmp_path):
    results, runs = str(tmp_path / "results"), str(tmp_path / "runs_dir")
    for name, cpu_s in (("gspo_mb16_s0", 3600), ("gspo_mb16_s1", 7200)):
        recorded_run(results, "r3_minibatch", name, cpu_s, str(tmp_path))
    started = os.path.join(runs, "r3_minibatch", "grpo_nokl_mb16_s0")
    os.makedirs(started)
    with open(os.path.join(started, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 41}) + "\n" + json.dumps({"step": 42}) + "\n")
    sweep = launcher.SWEEPS["r3_minibatch"]
    draw0 = next(r for r in launcher.sweep_runs(sweep, 12) if r["name"] == "gspo_mb16_s0")
    entry = next(iter(launcher.warm_start_groups(sweep, [draw0], sweep.flags)))
    os.makedirs(os.path.join(results, "warmstart"))
    open(os.path.join(results, "warmstart", os.path.basename(entry) + ".npz.xz"), "w").close()

    rows = {r["key"]: r for r in progress.progress(results, runs)}
    mb = rows["gspo_minibatch_stability"]  # gspo_mb16 and grpo_nokl_mb16 on draws 0-11
    assert (mb["status"], mb["runs"], mb["recorded"]) == ("v2", 24, 2)
    assert mb["in_progress"] == {"grpo_nokl_mb16_s0": 42}
    assert (mb["kept"], mb["warm_starts"]) == (1, 12)
    assert mb["cpu_h"] == pytest.approx(3.0)
    assert mb["left_h"] is None and mb["unpriced"] == ["r3_minibatch/grpo_nokl_mb16"]
    assert rows["seq_ratio_eps02"]["recorded"] == 2  # it reads gspo_mb16 too

    # a pilot's record of the arm (another draw) prices it, without counting as recorded
    pilot = str(tmp_path / "pilot")
    recorded_run(pilot, "r3_minibatch", "grpo_nokl_mb16_s900", 900, str(tmp_path / "p"))
    mb = {r["key"]: r for r in progress.progress(results, runs, priced_by=[pilot])}[
        "gspo_minibatch_stability"
    ]
    assert mb["recorded"] == 2 and mb["left_h"] == pytest.approx(10 * 1.5 + 12 * 0.25)

    recorded_run(results, "r3_minibatch", "grpo_nokl_mb16_s2", 1800, str(tmp_path))
    rows = {r["key"]: r for r in progress.progress(results, runs)}
    # 10 GSPO runs left at their mean 1.5 h, 11 GRPO at 0.5 h
    assert rows["gspo_minibatch_stability"]["left_h"] == pytest.approx(10 * 1.5 + 11 * 0.5)
    every = rows["all"]  # each run once, though two designs read gspo_mb16's
    assert every["recorded"] == 3 and every["cpu_h"] == pytest.approx(3.5)
    designs = [*reg.family_entries("testbed_round3"), *reg.drafts()]
    distinct = {(s, r["name"]) for e in designs for s, r in progress.design_runs(e, launcher)}
    assert every["runs"] == len(distinct) < sum(r["runs"] for k, r in rows.items() if k != "all")
    assert "| gspo_minibatch_stability | v2 | 3/24 |" in progress.format_table(list(rows.values()))


def test_finals_give_each_draw_its_base_and_each_recorded_arm_its_final_accuracy(tmp_path):
    results = str(tmp_path / "results")

    def run(name, base, final):
        summary = dict(
            base=dict(greedy_accuracy=base[0], sample_accuracy=base[1]),
            final=dict(greedy_accuracy=final, sample_accuracy=0.0),
        )
        recorded_run(results, "r3_minibatch", name, 1.0, str(tmp_path / name), **summary)

    run("gspo_mb16_s3", (0.405, 0.17), 0.775)
    run("grpo_nokl_mb16_s3", (0.405, 0.17), 0.0)
    run("gspo_mb16_s1", (0.25, 0.2), 0.125)
    designs = {d["key"]: d for d in progress.finals(results)}
    mb = designs["gspo_minibatch_stability"]
    assert mb["arms"] == ("gspo_mb16", "grpo_nokl_mb16")
    assert mb["draws"] == {
        1: {"base": (0.25, 0.2), "gspo_mb16": 0.125},
        3: {"base": (0.405, 0.17), "gspo_mb16": 0.775, "grpo_nokl_mb16": 0.0},
    }
    assert "gspo_length_normalisation" not in designs  # no run of its own recorded
    table = progress.format_finals([mb])
    assert "| 1 | 0.250 / 0.200 | 0.125 | - |" in table
    assert "| 3 | 0.405 / 0.170 | 0.775 | 0.000 |" in table


def test_a_round3_entry_names_one_run_per_arm():
    entry = reg.current("gspo_minibatch_stability")
    assert entry.arm_names == ("gspo_mb16", "grpo_nokl_mb16")
    fields = {k: getattr(entry, k) for k in ("key", "version", "claim", "paper", "notebook")}
    base = dict(fields, sweeps=entry.sweeps, primary=entry.primary, draws=entry.draws)
    with pytest.raises(ValueError, match="one run name"):
        reg.Claim(**base, arms=("grpo_nokl / gspo: GRPO or GSPO",))
    reg.Claim(**dict(base, draws=()), arms=("grpo_nokl / gspo: round 2 wrote arms freely",))


def test_every_arm_a_round3_design_names_is_one_its_sweeps_run():
    """An arm named in a design but in none of its sweeps would never run (the launcher runs the
    arms registered entries name), and the design could never be decided."""
    for d in [*reg.family_entries("testbed_round3"), *reg.drafts()]:
        runs = progress.design_runs(d, launcher)
        assert {launcher.arm_of(r) for _, r in runs} == set(d.arm_names), d.name
        assert len(runs) == len(d.arm_names) * len(d.draws), d.name
