"""The claims registry (experiments/claims_registry.py) and the verdicts it decides
(notebooks/reporting/verdicts.py), on hand-made per-seed numbers: no training, no runs."""

import dataclasses
import json
import os
import re

import pytest
from reporting import verdicts
from trainer_runs import load_repo_module

claims = load_repo_module("experiments/claims.py")
reg = verdicts.registry()

FIVE = range(5)


def _claim(test="every_seed", direction=">", threshold=0.0, min_seeds=5, preconditions=()):
    """A made-up entry comparing arms a and b."""
    return reg.Claim(
        key="made_up",
        version=1,
        claim="a beats b",
        paper="none",
        notebook="none",
        sweeps=(),
        arms=("a", "b"),
        primary=reg.Criterion(
            statistic="s",
            arms=("a", "b"),
            direction=direction,
            threshold=threshold,
            test=test,
            min_seeds=min_seeds,
        ),
        preconditions=preconditions,
    )


MECHANISM = reg.Precondition(
    name="the mechanism", statistic="m", arm="a", direction=">", threshold=0.05
)


def _notebook_source(name):
    with open(os.path.join(claims.NOTEBOOK_DIR, name + ".ipynb")) as f:
        nb = json.load(f)
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_every_notebook_has_an_entry_and_prints_it():
    keys = {e.key for e in reg.ENTRIES}
    for name in claims.NOTEBOOKS:
        assert name in keys, f"notebooks/{name}.ipynb has no registry entry"
        assert reg.current(name).notebook == name
        assert f'claim_verdict(\n    "{name}"' in _notebook_source(name) or (
            f'claim_verdict("{name}"' in _notebook_source(name)
        ), f"notebooks/{name}.ipynb does not print its registry verdict"
    assert len(keys) >= 11  # the nine notebooks' claims and the new ones (issue 20)


def test_registry_is_consistent_and_its_arms_are_in_its_sweeps():
    reg.check()
    for key in {e.key for e in reg.ENTRIES}:
        e = reg.current(key)
        if len(e.primary.arms) == 2:
            assert e.primary.min_seeds >= 5, e.name
        names = set()
        for s in e.sweeps:
            names |= {r["name"].rsplit("_s", 1)[0] for r in claims.sweep_runs(claims.SWEEPS[s], 1)}
        wanted = [a for a in e.primary.arms if not a.startswith("pair(")]
        wanted += [p.arm for p in e.preconditions if not p.arm.startswith("pair(")]
        # a pair's arms are the sweep's too
        pairs = [a for a in (*e.primary.arms, *(p.arm for p in e.preconditions)) if "pair(" in a]
        wanted += [x.strip() for a in pairs for x in a[5:-1].split(",")]
        assert set(wanted) <= names, (e.name, set(wanted) - names)
    planned = {s for sweeps in claims.PLANNED.values() for s in sweeps}
    assert planned <= set(claims.SWEEPS)


def test_paired_sign_test_reproduced_and_not():
    c = _claim()
    b = {s: 0.5 for s in FIVE}
    r = reg.evaluate(c, {"a": {s: 0.6 + 0.01 * s for s in FIVE}, "b": b})
    assert r.outcome == "reproduced" and r.seeds == tuple(FIVE)
    one_wrong = {s: 0.6 if s else 0.49 for s in FIVE}  # seed 0's difference has the wrong sign
    assert reg.evaluate(c, {"a": one_wrong, "b": b}).outcome == "not reproduced"


def test_pairs_by_seed_and_drops_non_finite_seeds():
    c = _claim(min_seeds=3)
    a = {0: 1.0, 1: 1.0, 2: float("nan"), 3: 1.0, 7: 1.0}
    b = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0, 9: 5.0}  # seeds 7 and 9 have no partner
    r = reg.evaluate(c, {"a": a, "b": b})
    assert r.seeds == (0, 1, 3) and r.values == (1.0, 1.0, 1.0)
    assert r.outcome == "reproduced"


def test_sign_flip_p_value_is_exact():
    # five positive differences: only the all-positive assignment reaches the mean, p = 1/32
    assert reg.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5], ">", 0.0) == 1 / 32
    # one negative of the smallest size: the assignments at least as large are those that flip
    # nothing or flip only that one
    assert reg.sign_flip_p([-0.1, 0.2, 0.3, 0.4, 0.5], ">", 0.0) == 2 / 32
    assert reg.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5], "<", 0.0) == 1.0
    # the threshold shifts the differences
    assert reg.sign_flip_p([0.1, 0.2, 0.3], ">", 0.15) > 1 / 8
    c = _claim(test="sign_flip")
    b = {s: 0.0 for s in FIVE}
    assert reg.evaluate(c, {"a": {s: 0.1 + 0.01 * s for s in FIVE}, "b": b}).outcome == (
        "reproduced"
    )
    mixed = {0: 0.3, 1: -0.2, 2: 0.1, 3: -0.1, 4: 0.05}
    r = reg.evaluate(c, {"a": mixed, "b": b})
    assert r.outcome == "not reproduced" and "sign-flip p" in r.numbers


def test_bootstrap_interval_excludes_the_threshold_or_not():
    c = _claim(test="bootstrap")
    b = {s: 0.0 for s in FIVE}
    r = reg.evaluate(c, {"a": {s: 0.1 + 0.01 * s for s in FIVE}, "b": b})
    assert r.outcome == "reproduced" and r.interval[0] > 0
    mixed = {0: 0.3, 1: -0.2, 2: 0.1, 3: -0.1, 4: 0.05}  # mean 0.03, the interval spans 0
    r = reg.evaluate(c, {"a": mixed, "b": b})
    assert r.outcome == "not reproduced" and r.interval[0] < 0 < r.interval[1]
    # "below": the interval's upper end decides
    below = _claim(test="bootstrap", direction="<", threshold=0.0)
    neg = {s: -0.1 - 0.01 * s for s in FIVE}
    assert reg.evaluate(below, {"a": neg, "b": b}).outcome == "reproduced"


def test_bootstrap_interval_is_deterministic():
    x = [0.1, -0.05, 0.2, 0.0, 0.07]
    assert reg.bootstrap_interval(x) == reg.bootstrap_interval(x)


def test_precondition_absent_is_inconclusive_whatever_the_numbers():
    c = _claim(preconditions=(MECHANISM,))
    good = {"a": {s: 1.0 for s in FIVE}, "b": {s: 0.0 for s in FIVE}}
    r = reg.evaluate(c, good, {"the mechanism": {s: 0.01 for s in FIVE}})
    assert r.outcome == "inconclusive: the mechanism absent"
    assert reg.evaluate(c, good).outcome == "inconclusive: the mechanism absent"  # not measured
    r = reg.evaluate(c, good, {"the mechanism": {s: 0.2 for s in FIVE}})
    assert r.outcome == "reproduced"


def test_too_few_paired_seeds_is_inconclusive():
    c = _claim()
    three = {"a": {s: 1.0 for s in range(3)}, "b": {s: 0.0 for s in range(5)}}
    r = reg.evaluate(c, three)
    assert r.outcome == "inconclusive: 5 paired seeds absent"
    assert "3 paired seed(s)" in r.numbers


def test_secondary_checks_never_change_the_outcome(capsys):
    e = reg.current("eps_objective_sweep")
    values = {"grpo": {s: 0.7 for s in FIVE}, "grpo_eps0.0003": {s: 0.4 for s in FIVE}}
    pre = {e.preconditions[0].name: {s: 0.05 for s in FIVE}}
    lines = [
        verdicts.claim_verdict(e.key, values, pre, secondary=sec)
        for sec in (None, {"every preset learns": False}, {"every preset learns": True, "x": 1})
    ]
    assert len(set(lines)) == 1 and verdicts.outcome_of(lines[0]) == "reproduced"
    out = capsys.readouterr().out
    assert "primary criterion: " in out
    assert "secondary check (does not change the outcome): every preset learns: False" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("VERDICT:")]) == 3


def test_superseding_entry_is_reported_with_its_reason(capsys):
    old, new = reg.entries("gspo_token_equals_gspo")
    assert (new.supersedes, old.version) == (1, 1) and "absolute floor" in new.reason
    pre = {new.preconditions[0].name: {s: 0.2 for s in range(3)}}
    pair = "pair(gspo, gspo_token_tokadv)"
    line = verdicts.claim_verdict(
        "gspo_token_equals_gspo",
        {pair: {s: 0.5 for s in range(3)}},  # within 1e-4 relative + 1e-7 absolute
        pre,
        superseded={1: {pair: {0: 0.5, 1: 3.0, 2: 0.5}}},  # the loss's relative difference alone
    )
    out = capsys.readouterr().out
    assert "registry entry gspo_token_equals_gspo v2 (supersedes v1: " in out
    assert "superseded entry gspo_token_equals_gspo v1 (replaced by v2 because: " in out
    assert "on these runs (not the verdict): not reproduced" in out
    assert verdicts.outcome_of(line) == "reproduced"


def test_each_superseded_entry_names_the_entry_that_replaced_it(capsys):
    v1, v2, v3 = reg.entries("moe_routing_replay")
    verdicts.claim_verdict("moe_routing_replay", {a: {} for a in v3.primary.arms})
    out = capsys.readouterr().out
    assert f"superseded entry {v1.name} (replaced by v2 because: {v2.reason})" in out
    assert f"superseded entry {v2.name} (replaced by v3 because: {v3.reason})" in out


def test_a_changed_criterion_must_be_a_new_entry(monkeypatch):
    e = reg.current("seq_ratio_eps02")
    silent = dataclasses.replace(e, version=2)  # a second version that does not say why
    monkeypatch.setattr(reg, "ENTRIES", reg.ENTRIES + (silent,))
    with pytest.raises(ValueError, match="supersede"):
        reg.check()
    monkeypatch.setattr(reg, "ENTRIES", reg.ENTRIES[:-1] + (e,))
    with pytest.raises(ValueError, match="twice"):
        reg.check()


def test_verdict_lines_have_one_of_three_outcomes():
    assert verdicts.outcome_of("VERDICT: not reproduced: 1") == "not reproduced"
    assert (
        verdicts.outcome_of("VERDICT: inconclusive: routes absent: x")
        == "inconclusive: routes absent"
    )
    for bad in ("VERDICT: partly reproduced: x", "VERDICT: inconclusive: 3 seeds < 5: x"):
        with pytest.raises(ValueError, match="claim_verdict"):
            verdicts.outcome_of(bad)
    assert re.match(verdicts.VERDICT_LINE, "VERDICT: reproduced: 1")


def test_response_length_by_correctness():
    """rollout/len_correct_mean and len_wrong_mean (the drgrpo_length_bias entry's statistic):
    over every generation batch, NaN when no response is wrong."""
    import jax.numpy as jnp
    import numpy as np

    from gspo_jax.rl import step as train_step

    parts = [
        {"correct": jnp.array([1.0, 0.0, 0.0]), "length": jnp.array([4.0, 10.0, 20.0])},
        {"correct": jnp.array([1.0]), "length": jnp.array([6.0])},
    ]
    m = train_step._step_means(parts, None, None)
    assert "length" not in m and np.isclose(float(m["correct"]), (1 / 3 + 1) / 2)  # batch means
    assert float(m["len_correct_mean"]) == 5.0 and float(m["len_wrong_mean"]) == 15.0
    m = train_step._step_means(parts[1:], None, None)
    assert np.isnan(float(m["len_wrong_mean"])) and float(m["len_correct_mean"]) == 6.0


def test_launcher_only_launches_the_runs_its_patterns_name(monkeypatch, tmp_path):
    """claims.py --only: each sweep launches just the runs whose names match a pattern (with
    FULL_FLAGS), and a sweep with none is skipped."""
    launched = {}

    class FakeSweep:
        def launch(self, config, runs, root, parallel, flags):
            launched[os.path.basename(root)] = ([r["name"] for r in runs], list(flags))
            return {r["name"]: 0 for r in runs}

        def collect(self, runs, root):
            return []

        def write_tables(self, rows, root):
            return ""

    monkeypatch.setattr(claims, "_sweep_module", lambda: FakeSweep())
    runs = {"a": ["gspo_s0", "grpo_s0", "gspo_s1"], "b": ["dr_grpo_s0"]}
    monkeypatch.setattr(claims, "sweep_runs", lambda s, seeds: [dict(name=n) for n in runs[s.name]])
    sweeps = [claims.Sweep("a", "configs/arith.py"), claims.Sweep("b", "configs/arith.py")]
    failed = claims.run_sweeps(sweeps, str(tmp_path), only="gspo_s*,grpo_s1")
    assert failed == [] and set(launched) == {"a"}
    assert launched["a"][0] == ["gspo_s0", "gspo_s1"]
    assert launched["a"][1][: len(claims.FULL_FLAGS)] == list(claims.FULL_FLAGS)
    claims.run_sweeps(sweeps, str(tmp_path))  # no pattern: every run
    assert launched["b"][0] == ["dr_grpo_s0"] and len(launched["a"][0]) == 3
