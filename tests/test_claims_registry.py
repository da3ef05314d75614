"""The claims registry (gspo_jax/claims/entries/) and the verdicts it decides
(notebooks/reporting/verdicts.py), on hand-made per-seed numbers: no training, no runs."""

import dataclasses
import itertools
import json
import math
import os
import re
import shutil

import numpy as np
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
        key = claims.notebook_key(name)
        assert key in keys, f"notebooks/{name}.ipynb has no registry entry"
        # the newest entry's notebook, or (a round-3 entry replacing it) an earlier entry's
        assert any(e.notebook == name for e in reg.entries(key)), name
        if name != key:  # round 3's testbed_<key>: the key's newest entry, Holm over its family
            assert reg.current(key).notebook == name and reg.current(key).family, name
            assert "keys=[E.key]" in _notebook_source(name) and "family_verdicts(" in (
                _notebook_source(name)
            ), f"notebooks/{name}.ipynb does not print its family verdict"
            continue
        assert f'claim_verdict(\n    "{name}"' in _notebook_source(name) or (
            f'claim_verdict("{name}"' in _notebook_source(name)
        ), f"notebooks/{name}.ipynb does not print its registry verdict"
    assert len(keys) >= 11  # the nine notebooks' claims and the new ones (issue 20)


def _arm_names(arm: str) -> list[str]:
    """The sweep arms an entry's arm string names: "a", or each x of "pair(a, b)" / "trend(a,
    b, c)" (a statistic the notebook derives from those arms per seed)."""
    m = re.fullmatch(r"(\w+)\((.*)\)", arm)  # "pair(a - b, c - d)": each of a, b, c, d
    return [y.strip() for x in m.group(2).split(",") for y in x.split(" - ")] if m else [arm]


def _arms_of(e) -> set[str]:
    arms = (*e.primary.arms, *(p.arm for p in e.preconditions))
    return {x for a in arms for x in _arm_names(a)}


def _sweep_arms(sweep_names, seeds=1) -> set[str]:
    names = set()
    for s in sweep_names:
        names |= {r["name"].rsplit("_s", 1)[0] for r in claims.sweep_runs(claims.SWEEPS[s], seeds)}
    return names


ROUND2 = [e for e in reg.ENTRIES if e.seeds]


def test_registry_is_consistent_and_its_arms_are_in_its_sweeps():
    reg.check()
    for key in {e.key for e in reg.ENTRIES}:
        e = reg.current(key)
        if len(e.primary.arms) == 2:
            assert e.primary.min_seeds >= 5, e.name
        if e.check or e.needs:
            continue  # decided by a check, or its arms wait for code (test_round2_entries_...)
        wanted = _arms_of(e)
        assert wanted <= _sweep_arms(e.sweeps), (e.name, wanted - _sweep_arms(e.sweeps))
    planned = {s for sweeps in claims.PLANNED.values() for s in sweeps}
    assert planned <= set(claims.SWEEPS)


def test_round3_drafts_read_arms_their_sweeps_run():
    """Each round-3 draft names its testbed sweeps (experiments/claims.py r3_*), and every arm
    its primary, preconditions and harm read is an arm those sweeps run."""
    from gspo_jax import claims as registry_lib

    for d in registry_lib.drafts():
        assert d.sweeps and all(s.startswith("r3_") for s in d.sweeps), d.name
        wanted = _arms_of(d) | ({x for x in _arm_names(d.harm.arm)} if d.harm else set())
        assert wanted <= _sweep_arms(d.sweeps), (d.name, wanted - _sweep_arms(d.sweeps))


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
    e = reg.current("clip_fraction_vs_eps")
    seeds = e.seeds
    values = {"gspo": {s: 0.7 for s in seeds}, "grpo_nokl": {s: 0.4 for s in seeds}}
    pre = {e.preconditions[0].name: {s: 0.2 for s in seeds}}
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
    old, new, v3, v4 = reg.entries("gspo_token_equals_gspo")
    assert (new.supersedes, old.version) == (1, 1) and "absolute floor" in new.reason
    assert (v3.supersedes, v4.supersedes) == (2, 3) and "6.8 %" in v4.reason
    pre = {v4.preconditions[0].name: {s: 0.3 for s in v4.seeds}}
    pair = "pair(gspo, gspo_token_tokadv)"
    line = verdicts.claim_verdict(
        "gspo_token_equals_gspo",
        {v4.primary.arms[0]: {s: 1e-7 for s in v4.seeds}},  # below 1e-5 in every batch
        pre,
        superseded={1: {pair: {0: 0.5, 1: 3.0, 2: 0.5}}},  # the loss's relative difference alone
    )
    out = capsys.readouterr().out
    assert "registry entry gspo_token_equals_gspo v4 (supersedes v3: " in out
    assert "superseded entry gspo_token_equals_gspo v1 (replaced by v2 because: " in out
    assert "superseded entry gspo_token_equals_gspo v3 (replaced by v4 because: " in out
    assert "on these runs (not the verdict): not reproduced" in out
    assert verdicts.outcome_of(line) == "reproduced"


def test_each_superseded_entry_names_the_entry_that_replaced_it(capsys):
    v1, v2, v3, v4 = reg.entries("moe_routing_replay")
    verdicts.claim_verdict("moe_routing_replay", {a: {} for a in v4.primary.arms})
    out = capsys.readouterr().out
    assert f"superseded entry {v1.name} (replaced by v2 because: {v2.reason})" in out
    assert f"superseded entry {v2.name} (replaced by v3 because: {v3.reason})" in out
    assert f"superseded entry {v3.name} (replaced by v4 because: {v4.reason})" in out


def test_a_changed_criterion_must_be_a_new_entry(tmp_path):
    """The registry read from files (a copy of the package's entries): a second version that
    does not say what it supersedes is refused, and so is a file whose name is not its entry."""
    from gspo_jax.claims import registry, schema

    folder = tmp_path / "entries"
    shutil.copytree(registry.registry_dir(), folder)
    assert registry.load(str(folder)) == reg.load()  # the copy reads as the package's entries
    e = reg.current("staleness_dose")  # one version
    silent = dataclasses.replace(e, version=2)  # a second version that does not say why
    path = folder / "staleness_dose" / "v2.json"
    path.write_text(schema.canonical_json(schema.to_dict(silent)))
    with pytest.raises(ValueError, match="supersede"):
        registry.load(str(folder))
    path.rename(folder / "staleness_dose" / "v3.json")  # holds v2
    with pytest.raises(ValueError, match="name it staleness_dose/v2.json"):
        registry.load(str(folder))


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


# --- round 2 (issue 33) --------------------------------------------------------------------------


def test_round2_entries_are_well_formed():
    """Every round-2 entry: an exact test over >= 10 seeds (a deterministic check: every batch),
    at least one precondition, a new version of an existing claim where the key exists, and
    runs that ``claims.py <key> --runs_only`` makes (its sweeps in PLANNED, or, once its
    notebook's cells exist, the notebook's in NOTEBOOKS), or a check file, or a statement of the
    code its runs need."""
    assert len(ROUND2) >= 18 and len({e.key for e in reg.ENTRIES}) >= 18
    for e in ROUND2:
        c = e.primary
        assert e.preconditions, e.name
        assert len(e.seeds) >= c.min_seeds, e.name
        earlier = [x for x in reg.entries(e.key) if x.version < e.version]
        assert e.supersedes == (earlier[-1].version if earlier else None), e.name
        if e.check:
            assert c.test == "every_seed" and c.min_seeds >= 20, e.name
            assert os.path.exists(os.path.join(claims.REPO, e.check)), e.name
            assert not e.sweeps and e.key not in claims.PLANNED
            continue
        assert (
            c.test in ("sign_flip", "wilcoxon", "tost") and c.min_seeds >= reg.MIN_SEEDS_ROUND2
        ), e.name
        if e.needs:
            assert e.key not in claims.PLANNED, e.name  # no runs until the code exists
            continue
        # its runs: PLANNED until its notebook's cells exist, then the notebook's own sweeps
        made_by = (e is reg.current(e.key) and claims.PLANNED.get(e.key)) or claims.NOTEBOOKS[
            e.notebook
        ]
        assert not e.notebook.startswith("planned") or e.key in claims.PLANNED, e.name
        assert set(e.sweeps) <= set(made_by), e.name
        # a round-2 entry is current, or replaced by a later round-2 entry (fresh seeds again)
        # or by a round-3 entry (its draws)
        newest = reg.current(e.key)
        assert e is newest or newest.seeds or newest.draws, e.name
        assert _arms_of(e) <= _sweep_arms(e.sweeps), (e.name, _arms_of(e) - _sweep_arms(e.sweeps))


def test_round2_seeds_are_fresh_and_are_what_the_sweeps_run():
    """No round-2 entry reuses a seed of an earlier version of its claim (those before round 2
    ran seeds 0-4), and its sweeps, at their design's seed count, run exactly its seeds."""
    for e in ROUND2:
        for old in reg.entries(e.key):
            if old.version < e.version:
                assert not set(e.seeds) & set(old.seeds or reg.EARLIER_SEEDS), (e.name, old.name)
        # the sweep runs the newest entry's seeds (a superseded entry's were those of its day)
        for name in e.sweeps if e is reg.current(e.key) else ():
            sweep = claims.SWEEPS[name]
            runs = claims.sweep_runs(sweep, claims.seeds_of(sweep))
            assert {r["overrides"]["seed"] for r in runs} == set(e.seeds), (e.name, name)
            assert {int(r["name"].rsplit("_s", 1)[1]) for r in runs} == set(e.seeds)


def test_round2_entries_count_only_their_own_seeds():
    """An earlier sweep's runs (seeds 0-11 of the same arm names) never decide a round-2 entry."""
    e = reg.current("clip_fraction_vs_eps")
    pre = {e.preconditions[0].name: {s: 0.2 for s in range(200)}}
    old = {"gspo": {s: 0.7 for s in range(12)}, "grpo_nokl": {s: 0.4 for s in range(12)}}
    r = reg.evaluate(e, old, pre)
    assert r.outcome == "inconclusive: 10 paired seeds absent" and r.seeds == ()
    both = {a: {**d, **{s: d[0] for s in e.seeds}} for a, d in old.items()}
    assert reg.evaluate(e, both, pre).seeds == e.seeds


def test_round2_sweeps_draw_the_warm_start_per_seed_and_keep_the_old_sweeps():
    """Seed s of a round-2 sweep trains from warm-start draw s mod 3 in every arm (luspo_length's
    from its one calibrated base); the launcher's populations then merge only the seeds of one
    draw, one population per draw, named apart; the earlier sweeps' runs are unchanged."""
    sw = claims._sweep_module()
    for name, sweep in claims.SWEEPS.items():
        runs = claims.sweep_runs(sweep, 3)
        if name == "tools":  # issue 51's design: RL seeds 11-20 from one warm start
            assert claims.seeds_of(sweep) == 10
            assert {r["overrides"]["seed"] for r in runs} == {11, 12, 13}
            assert all("init.warmstart.seed" not in r["overrides"] for r in runs)
            continue
        if name.startswith("r3_"):  # round 3: the seed is the draw (tests/test_testbed.py)
            assert claims.seeds_of(sweep) == 12
            assert all(
                r["overrides"]["init.warmstart.seed"] == r["overrides"]["seed"] for r in runs
            )
            continue
        if not name.startswith("r2_"):
            assert claims.seeds_of(sweep) == claims.SEEDS
            assert {r["overrides"]["seed"] for r in runs} == {0, 1, 2}
            assert all("init.warmstart.seed" not in r["overrides"] for r in runs)
            continue
        draws = 1 if name == "r2_length" else 3
        for r in runs:
            assert r["overrides"]["init.warmstart.seed"] == r["overrides"]["seed"] % draws, r
        full = claims.sweep_runs(sweep, claims.seeds_of(sweep))  # 4 seeds per draw
        pops = [p for p in sw.population_runs(full) if "members" in p]
        assert len({p["name"] for p in pops}) == len(pops), name
        by_name = {r["name"]: r for r in full}
        for p in pops:
            ws = {by_name[m]["overrides"]["init.warmstart.seed"] for m in p["members"].values()}
            assert len(ws) == 1, (name, p["name"])
            assert p["overrides"]["init.warmstart.seed"] == ws.pop()
    # the earlier studies' run names, as the registry's runs on disk have them
    assert [r["name"] for r in claims.sweep_runs(claims.SWEEPS["ratio_doses"], 1)][:2] == [
        "grpo_nokl_k4x1_s0",
        "gmpo_k4x1_s0",
    ]
    assert len(claims.sweep_runs(claims.SWEEPS["arith"], 1)) == 16


def test_round2_runs_are_valid_configs():
    """Every run of every round-2 sweep (one seed) sets fields that exist, to values the config
    checks accept, at full size (no training)."""
    from trainer_runs import set_fields

    from gspo_jax import config as config_lib

    for name, sweep in claims.SWEEPS.items():
        if not name.startswith("r2_"):
            continue
        for run in claims.sweep_runs(sweep, 1):
            c = config_lib.load_config_file(os.path.join(claims.REPO, sweep.config))
            config_lib.validate(set_fields(c, dict(run["overrides"])))


def test_stability_claims_count_diverged_seeds_as_failures():
    stability = (
        "gspo_minibatch_stability",
        "gmpo_token_vs_sequence_clip",
        "gmpo_grpo_wide_clip",
        "gspo_length_normalisation",
    )
    for key in stability:
        assert reg.current(key).primary.diverged == 0.0, key
    round2 = next(e for e in reg.entries(stability[0]) if e.seeds)  # 12 seeds, min_seeds 10
    c = dataclasses.replace(_claim(test="sign_flip", min_seeds=10), primary=round2.primary)
    a, b = c.primary.arms
    seeds = range(100, 112)
    nan = float("nan")
    # GSPO at 0.9 and GRPO at 0.8 in every seed, but GSPO diverged in seeds 100-104: counted as
    # 0 accuracy, the difference is -0.8 there, and the claim fails
    gspo = {s: (nan if s < 105 else 0.9) for s in seeds}
    grpo = {s: 0.8 for s in seeds}
    r = reg.evaluate(c, {a: gspo, b: grpo})
    assert r.outcome == "not reproduced" and len(r.seeds) == 12
    assert r.values[:5] == (-0.8,) * 5 and f"diverged (counted as 0): {a} s100, s101" in r.numbers
    # the same numbers with diverged seeds dropped as missing (the old rule): 7 seeds, "holds"
    dropped = dataclasses.replace(c, primary=dataclasses.replace(c.primary, diverged=None))
    r = reg.evaluate(dropped, {a: gspo, b: grpo})
    assert r.seeds == tuple(range(105, 112)) and r.outcome == "inconclusive: 10 paired seeds absent"
    # GRPO diverging is a failure of GRPO: it supports the claim
    r = reg.evaluate(c, {a: {s: 0.8 for s in seeds}, b: {s: nan for s in seeds}})
    assert r.outcome == "reproduced" and set(r.values) == {0.8}
    # a seed with no value at all (None: never run) is missing, not diverged
    r = reg.evaluate(c, {a: {**gspo, 100: None}, b: {**grpo, 111: float("inf")}})
    assert 100 not in r.seeds and r.values[-1] == 0.9 - 0.0
    with pytest.raises(ValueError, match="diverged"):
        reg.Criterion("s", ("a",), ">", 0.0, "sign_flip", 10, diverged=float("nan"))


def _midranks(a):
    """Mid-ranks of a, by counting (O(n^2)): rank = #smaller + (#equal + 1) / 2."""
    a = list(a)
    return [sum(y < x for y in a) + (sum(y == x for y in a) + 1) / 2 for x in a]


def _brute_force(d, statistic, direction):
    """The share of the 2^n sign assignments s whose statistic(s) is at least (">") or at most
    ("<") the observed one (all signs +1 on d's own signs), enumerated."""
    observed = statistic([1] * len(d))
    stats = [statistic(s) for s in itertools.product((1, -1), repeat=len(d))]
    tol = 1e-9
    far = [t >= observed - tol if direction == ">" else t <= observed + tol for t in stats]
    return sum(far) / len(stats)


@pytest.mark.parametrize("seed", range(12))
def test_exact_tests_match_brute_force_enumeration(seed):
    """wilcoxon_p (a subset-sum count) and sign_flip_p (a vectorised enumeration) against an
    independent enumeration of every sign assignment, with ties and zeros."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 11))
    x = np.round(rng.normal(0.2, 1.0, size=n), 1)  # rounded: ties, and zeros at threshold 0
    threshold = float(rng.choice([0.0, 0.1]))
    d = x - threshold
    r = _midranks(np.abs(d))

    def w_plus(s):  # the sum of positive ranks when d_i's sign is flipped by s_i
        return sum(ri for ri, di, si in zip(r, d, s, strict=True) if di * si > 0)

    def mean(s):
        return sum(abs(di) * si * (1 if di >= 0 else -1) for di, si in zip(d, s, strict=True)) / n

    for direction in (">", "<"):
        want = _brute_force(d, w_plus, direction)
        assert reg.wilcoxon_p(x, direction, threshold) == pytest.approx(want, abs=1e-12)
        want = _brute_force(d, mean, direction)
        assert reg.sign_flip_p(x, direction, threshold) == pytest.approx(want, abs=1e-12)


def test_wilcoxon_hand_values_and_robustness_to_one_heavy_tail():
    assert reg.wilcoxon_p([0.1, 0.2, 0.3, 0.4, 0.5], ">", 0.0) == 1 / 32
    assert reg.wilcoxon_p([0.1, 0.2, 0.3, 0.4, 0.5], "<", 0.0) == 1.0
    # ranks 1..4, one negative of rank 1: W+ = 9 of 10; assignments with W+ >= 9: {1234}, {234}
    assert reg.wilcoxon_p([-0.1, 0.2, 0.3, 0.4], ">", 0.0) == 2 / 16
    assert reg.signed_ranks([0.0, -1.0, 1.0, 2.0, 2.0, -3.0]).tolist() == [0, 5, 5, 9, 9, 12]
    assert math.isnan(reg.wilcoxon_p([], ">", 0.0))
    # eleven seeds a little below 0 and one far above: the mean is carried by the one seed, so
    # the sign-flip test cannot call it; the ranks are not (gmpo_kl_ref v2's reason)
    x = [-0.01] * 11 + [5.0]
    assert reg.wilcoxon_p(x, "<", 0.0) < 0.05 < reg.sign_flip_p(x, "<", 0.0)
    c = _claim(test="wilcoxon", direction="<", min_seeds=10)
    r = reg.evaluate(c, {"a": dict(enumerate(x)), "b": {s: 0.0 for s in range(12)}})
    assert r.outcome == "reproduced" and "Wilcoxon signed-rank p = 0.0166" in r.numbers
    assert "Wilcoxon signed-rank" in "\n".join(reg.describe(c))


def test_gspo_token_identity_check_decides_its_entry():
    """The deterministic check behind gspo_token_equals_gspo v3 / v4 on three of its batches:
    value and gradient agree to float32 rounding, clipped responses included, and the entry's
    evaluation turns the rows into its outcome."""
    check = load_repo_module("experiments/checks/gspo_token_identity.py")
    e = reg.current("gspo_token_equals_gspo")
    assert e.check == "experiments/checks/gspo_token_identity.py" and e.version in check.DRIFT
    rows = check.measure(e.seeds[:3], np.float32, drift_range=check.DRIFT[e.version])
    assert all(r["rel_l2"] < e.primary.threshold for r in rows), rows
    assert any(r["seq_clip_frac"] > 0 for r in rows), rows
    # a made-up difference above the threshold in one batch: not reproduced
    bad = [*rows[:2], {**rows[2], "rel_l2": 1e-3}]
    clipped = max(rows, key=lambda r: r["seq_clip_frac"])
    full = [{**clipped, "seed": s} for s in e.seeds[3:]]
    assert check.verdict(check.registry(), rows + full).outcome in ("reproduced",)
    assert check.verdict(check.registry(), bad + full).outcome == "not reproduced"


def test_runs_only_makes_a_round2_claims_runs_and_all_keeps_the_notebooks_sweeps(monkeypatch):
    """`claims.py <claim> --runs_only` launches the current entry's round-2 sweeps (PLANNED, or
    its notebook's once it reads them) at their own seed count; `all` launches the notebooks'
    sweeps; a planned round-2 claim without --runs_only is refused (its notebook cells come with
    its runs)."""
    launched = []

    def fake_run_sweeps(sweeps, runs_dir, **kw):
        launched.append(([s.name for s in sweeps], kw["seeds"]))
        return []

    monkeypatch.setattr(claims, "run_sweeps", fake_run_sweeps)
    # a claim still planned (its sweep from PLANNED; every round-2 notebook has its cells now, so
    # one is planned here again) and one whose notebook reads round 2's runs
    monkeypatch.setattr(claims, "PLANNED", {"moe_gspo_without_replay": ("r2_moe",)})
    assert claims.main(["moe_gspo_without_replay", "dapo_clip_higher_entropy", "--runs_only"]) == 0
    assert launched[-1] == (["r2_moe", "r2_countdown", "r2_entropy"], None)
    assert [claims.seeds_of(claims.SWEEPS[s]) for s in launched[-1][0]] == [12, 12, 12]
    assert claims.main(["all", "--runs_only"]) == 0
    assert set(launched[-1][0]) == {s for v in claims.NOTEBOOKS.values() for s in v}
    with pytest.raises(SystemExit):
        claims.main(["moe_gspo_without_replay"])
    for e in ROUND2:
        text = "\n".join(reg.describe(e))
        assert f"seeds: {min(e.seeds)}-{max(e.seeds)} (fresh for this claim)" in text, e.name


def test_tuned_takes_the_best_mean_rate_and_the_smaller_of_ties():
    """The tuned(...) arms of the LoRA entries: the grid's rate with the highest mean over seeds,
    the smaller rate on a tie, non-finite seeds left out, None when nothing ran."""
    grid = ("r1_lr3e-4", "r1_lr1e-3", "r1_lr3e-3")
    final = {
        "r1_lr3e-4": {0: 0.5, 1: 0.7},
        "r1_lr1e-3": {0: 0.8, 1: float("nan")},  # mean 0.8 over its finite seed
        "r1_lr3e-3": {0: 0.8, 1: 0.8},
    }
    assert verdicts.tuned(final, grid) == "r1_lr1e-3"  # tie at 0.8: the smaller rate
    final["r1_lr3e-3"] = {0: 0.9, 1: 0.85}
    assert verdicts.tuned(final, grid) == "r1_lr3e-3"
    assert verdicts.tuned({}, grid) is None


def _run(records, summary=None, name="a_s100"):
    from reporting import analysis

    return analysis.RunData(name, "a", 100, "", {}, summary or {}, records)


def test_trend_is_each_seeds_least_squares_slope_over_seeds_with_every_dose():
    """trend(...) (dapo_clip_higher_entropy v2): per seed, the slope of its values on the doses;
    a seed missing a dose or non-finite at one is left out."""
    doses = (0.2, 0.24, 0.28, 0.35)
    per_dose = [{100: 1.0 + 2 * d, 101: 3.0 - d, 102: 1.0} for d in doses]  # slopes 2, -1, 0
    per_dose[2][102] = float("nan")
    per_dose[3][103] = 5.0  # one dose only
    slopes = verdicts.trend(doses, per_dose)
    assert sorted(slopes) == [100, 101]
    assert slopes[100] == pytest.approx(2.0) and slopes[101] == pytest.approx(-1.0)


def test_relative_drop_median_and_diverged_read_the_runs_records():
    """relative_drop: 1 - last-10 mean / first-5 mean (entropy collapse); median_over_steps; a
    population member frozen at a non-finite step counts as diverged, so unless_diverged gives
    NaN, which a criterion with ``diverged`` set counts as its worst value."""
    ent = [1.0] * 5 + [0.7] * 10 + [0.25] * 10  # lost 75 %
    recs = [{"step": i + 1, "train/entropy": e, "train/loss": 0.1} for i, e in enumerate(ent)]
    run = _run(recs)
    assert verdicts.relative_drop(run, "train/entropy") == pytest.approx(0.75)
    kl = [{"step": i + 1, "train/kl_ref": v} for i, v in enumerate([0.01, 0.02, 5.0])]
    assert verdicts.median_over_steps(_run(kl), "train/kl_ref") == pytest.approx(0.02)
    acc = lambda r: 0.9  # noqa: E731
    assert not verdicts.diverged(run)
    assert verdicts.unless_diverged(acc)(run) == 0.9
    frozen = _run(recs, summary={"frozen_at_step": 17})
    assert verdicts.diverged(frozen) and math.isnan(verdicts.unless_diverged(acc)(frozen))
    nan_loss = _run(recs + [{"step": 26, "train/loss": float("nan")}])
    assert verdicts.diverged(nan_loss)


def test_the_data_registry_holds_exactly_the_old_python_registrys_entries():
    """The registry became data (gspo_jax/claims/entries/) in one commit: the last Python
    registry (experiments/claims_registry.py, read from git history) has the same entries,
    field for field, as the files do (the entries registered since come on top of it)."""
    import subprocess

    order = load_repo_module("experiments/checks/registration_order.py")
    try:
        gone = order.git("log", "-1", "--format=%H", "--diff-filter=D", "--", order.OLD_REGISTRY)
        rev = f"{gone.strip()}^" if gone.strip() else "HEAD"  # HEAD: deletion not committed
        source = order.git("show", f"{rev}:{order.OLD_REGISTRY}")
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("no git history of experiments/claims_registry.py in this copy")
    old = order.load_registry(source)
    new = {(e.key, e.version): e for e in reg.load()}
    assert len(old.ENTRIES) == 46
    for e in old.ENTRIES:
        got = new[(e.key, e.version)]
        assert reg.schema.to_dict(e) == reg.schema.to_dict(got), e.name
        # the fields added since (round 3: draws, harm, power, family, status, margin) are at
        # their defaults, left out of the canonical form: the hash a run recorded is unchanged
        assert reg.entry_hash(e) == reg.entry_hash(got), e.name
