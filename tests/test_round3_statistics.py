"""Round 3's per-run statistics (notebooks/reporting/round3.py) on hand-made records: one
definition per draft, the final accuracy as the mean of the last 3 evaluations, the length
windows as shares of the steps, GMPO's token ratios, a pair's difference of differences and the
staleness harm taken against the fresh-batch arm."""

import math

import pytest
from reporting import analysis, round3

from gspo_jax import claims


def _run(arm, seed, evals=(), objective="grpo", **per_step):
    """A run with held-out evaluations ``evals`` (steps 0, 25, ...) and per-step series
    ``per_step`` {key: [values at steps 1, 2, ...]}."""
    records = {}
    for i, v in enumerate(evals):
        records.setdefault(25 * i, {"step": 25 * i})["eval/greedy_accuracy"] = v
    for key, values in per_step.items():
        for i, v in enumerate(values):
            records.setdefault(i + 1, {"step": i + 1})[key.replace("__", "/")] = v
    return analysis.RunData(
        name=f"{arm}_s{seed}",
        arm=arm,
        seed=seed,
        workdir="",
        config={"objective": {"name": objective}},
        summary={},
        records=[records[s] for s in sorted(records)],
    )


def test_every_draft_has_its_statistics_and_they_run_on_no_runs():
    for d in claims.drafts():
        values, pre = round3.inputs(d, {})
        assert set(values) == set(d.primary.arms), d.name
        assert set(pre) == {p.name for p in d.preconditions} | ({d.harm.name} if d.harm else set())
        assert all(v == {} for v in (*values.values(), *pre.values())), d.name


def test_final_accuracy_best_minus_final_and_length_windows_by_hand():
    r = _run("a", 0, evals=(0.2, 0.5, 0.9, 0.6, 0.7, 0.8))
    assert round3.final_accuracy(r) == pytest.approx(0.7)  # (0.6 + 0.7 + 0.8) / 3
    assert round3.best_minus_final(r) == pytest.approx(0.2)  # 0.9 - 0.7
    # 20 steps: the last 10 % is 2 steps (mean 30), the first 5 % one step (10)
    lengths = [10.0] + [20.0] * 17 + [25.0, 35.0]
    assert round3.share_change("rollout/response_len_mean")(
        _run("a", 0, rollout__response_len_mean=lengths)
    ) == pytest.approx(20.0)


def test_gmpo_reads_its_token_ratios_grpo_its_own():
    hi, lo = [math.e**0.5, math.e**0.3], [math.e**-0.1, math.e**-0.7]
    kw = dict(train__token_ratio_max=hi, train__token_ratio_min=lo)
    gmpo = _run(
        "gmpo", 0, objective="gmpo", train__ratio_max=[1.0, 1.0], train__ratio_min=[1.0, 1.0], **kw
    )
    assert round3.largest_log_w(gmpo) == pytest.approx((0.5 + 0.7) / 2)
    grpo = _run("grpo", 0, train__ratio_max=hi, train__ratio_min=lo)
    assert round3.largest_log_w(grpo) == pytest.approx(0.6)


def test_staleness_pairs_and_its_harm_against_the_fresh_arm():
    entry = next(d for d in claims.drafts() if d.key == "staleness_dose")
    clip = [0.02, 0.04]
    final = {"gspo": 0.8, "gspo_k4": 0.75, "grpo_nokl": 0.85, "grpo_nokl_k4": 0.6}
    arms = {
        arm: [_run(arm, 3, evals=(0.1, v, v, v), train__clip_frac=clip)] for arm, v in final.items()
    }
    values, pre = round3.inputs(entry, arms)
    # GSPO keeps -0.05, GRPO -0.25: GSPO keeps 0.20 more
    assert values[entry.primary.arms[0]] == {3: pytest.approx(0.20)}
    assert pre[entry.harm.name] == {3: pytest.approx(0.25)}  # k = 0 minus k = 4, GRPO's
    assert pre[entry.preconditions[0].name] == {3: pytest.approx(0.03)}
    # a seed missing from one of the four arms is not paired
    arms["gspo"] = [_run("gspo", 4, evals=(0.1, 0.8, 0.8, 0.8))]
    values, _ = round3.inputs(entry, arms)
    assert values[entry.primary.arms[0]] == {}


def _write_run(folder, name, evals, clip, sampled=()):
    import json
    import os

    os.makedirs(folder / name)
    (folder / name / "config.json").write_text(json.dumps({"objective": {"name": "grpo"}}))
    rows = [{"step": 25 * i, "eval/greedy_accuracy": v} for i, v in enumerate(evals)]
    for row, v in zip(rows, sampled, strict=False):
        row["eval/sample_accuracy"] = v
    rows += [{"step": i + 1, "train/clip_frac": c} for i, c in enumerate(clip)]
    rows.sort(key=lambda r: r["step"])
    (folder / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / name / "summary.json").write_text("{}")


def test_the_precondition_pilot_reports_each_draw_against_the_thresholds(tmp_path, capsys):
    """experiments/round3_pilot.py on a made-up r3_minibatch pilot: GRPO at 16 x 2 clips 2 %
    (the mechanism's >= 0.2 %: ok) and ends 0.2 below its best (the harm's 0.1: ok); GSPO - GRPO per
    draw is the primary; an unfinished run is left out."""
    from trainer_runs import load_repo_module

    pilot = load_repo_module("experiments/round3_pilot.py")
    folder = tmp_path / "r3_minibatch"
    _write_run(folder, "grpo_nokl_mb16_s906", (0.2, 0.9, 0.7, 0.7, 0.7), (0.02, 0.02))
    _write_run(folder, "gspo_mb16_s906", (0.2, 0.8, 0.8, 0.8, 0.8), (0.5, 0.5))
    _write_run(folder, "gspo_mb16_s907", (0.2, 0.3), (0.5,))
    (folder / "gspo_mb16_s907" / "summary.json").unlink()  # still running
    pilot.main(["--runs", str(tmp_path), "--key", "gspo_minibatch_stability"])
    out = capsys.readouterr().out
    assert "[grpo_nokl_mb16 > 0.002]: d906 0.02 ok" in out
    assert "[grpo_nokl_mb16 > 0.1]: d906 0.2 ok" in out  # best 0.9 - final 0.7
    assert "primary [gspo_mb16 vs grpo_nokl_mb16 > 0]: d906 0.1" in out
    assert "d907" not in out


def test_the_precondition_pilot_draws_a_panel_per_draw(tmp_path):
    """--plot: one panel per draw, a greedy (solid) and a sampled (dashed) line per arm the
    draft reads."""
    import os

    from trainer_runs import load_repo_module

    pilot = load_repo_module("experiments/round3_pilot.py")
    folder = tmp_path / "r3_minibatch"
    for d in (906, 907):
        _write_run(folder, f"grpo_nokl_mb16_s{d}", (0.2, 0.9, 0.7), (0.02,), (0.1, 0.5, 0.4))
        _write_run(folder, f"gspo_mb16_s{d}", (0.2, 0.8, 0.8), (0.5,), (0.1, 0.6, 0.7))
    entry = next(d for d in pilot.round3_entries() if d.key == "gspo_minibatch_stability")
    arms = analysis.by_arm(analysis.load_runs(str(folder)))
    fig = pilot.curves(entry, arms)
    assert [ax.get_title() for ax in fig.axes] == ["draw 906", "draw 907"]
    lines = fig.axes[0].get_lines()
    assert [ln.get_linestyle() for ln in lines] == ["-", "--", "-", "--"]
    assert list(lines[0].get_ydata()) == [0.2, 0.8, 0.8]  # gspo_mb16 first: the primary's order
    assert list(lines[1].get_ydata()) == [0.1, 0.6, 0.7]
    assert list(lines[2].get_ydata()) == [0.2, 0.9, 0.7]
    path = pilot.plot(entry, arms, str(tmp_path / "plots" / "x.png"))
    assert os.path.getsize(path) > 0


def test_family_inputs_read_each_registered_entrys_sweeps_under_the_runs(tmp_path):
    """round3.family_inputs: the registered entry gspo_minibatch_stability's numbers from its
    sweep's runs (as round3.inputs gives them), seq_ratio_eps02's from the same sweep (its own
    arm not run yet: no values, so fewer draws than it needs), and an unfinished run refused, not
    skipped."""
    folder = tmp_path / "r3_minibatch"
    for d, (g, s) in enumerate([(0.7, 0.8), (0.6, 0.9)]):
        _write_run(folder, f"grpo_nokl_mb16_s{d}", (0.2, 0.9, g, g, g), (0.02, 0.02))
        _write_run(folder, f"gspo_mb16_s{d}", (0.2, 0.8, s, s, s), (0.5, 0.5))
    (tmp_path / "r3_sequence").mkdir()  # another entry's sweep, no runs yet
    out = round3.family_inputs(str(tmp_path))
    assert set(out) == {"gspo_minibatch_stability", "seq_ratio_eps02"}  # both read r3_minibatch
    eps_values, eps_pre = out["seq_ratio_eps02"]
    assert eps_values == {"gspo_eps0.2_mb16": {}}
    tokens = claims.current("seq_ratio_eps02").preconditions[1]
    assert tokens.arm == "grpo_nokl_mb16" and eps_pre[tokens.name] == pytest.approx(
        {0: 0.02, 1: 0.02}
    )
    values, pre = out["gspo_minibatch_stability"]
    assert values["gspo_mb16"] == pytest.approx({0: 0.8, 1: 0.9})
    assert values["grpo_nokl_mb16"] == pytest.approx({0: 0.7, 1: 0.6})
    e = claims.current("gspo_minibatch_stability")
    assert pre[e.harm.name] == pytest.approx({0: 0.2, 1: 0.3})
    assert pre[e.preconditions[0].name] == pytest.approx({0: 0.02, 1: 0.02})
    (folder / "gspo_mb16_s1" / "summary.json").unlink()
    with pytest.raises(FileNotFoundError, match="has not finished"):
        round3.family_inputs(str(tmp_path))
