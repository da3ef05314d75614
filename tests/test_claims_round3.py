"""Round 3's registry mechanics (issue 52), on hand-made numbers: warm-start draws as the unit
(seeds averaged within their draw), the harm precondition ("inconclusive: harm absent"), the
equivalence test (TOST) as a criterion, Holm's correction over a family of entries (the verdict
on the adjusted p), and the canonical form that keeps older entries' hashes."""

import dataclasses
import hashlib
import json
import math

import pytest

from gspo_jax import claims
from gspo_jax.claims import registry, schema

NAN = float("nan")


def _claim(key="made_up", test="sign_flip", direction=">", min_seeds=3, **fields):
    """A made-up entry comparing arms a and b, over draws 0, 1, 2 unless told otherwise."""
    criterion = dict(statistic="s", arms=("a", "b"), direction=direction, threshold=0.0)
    criterion.update(test=test, min_seeds=min_seeds, **fields.pop("criterion", {}))
    made_up = dict(key=key, version=1, claim="a beats b", paper="none", notebook="none")
    made_up.update(sweeps=(), arms=("a", "b"), primary=claims.Criterion(**criterion))
    return claims.Claim(**made_up, **{"draws": (0, 1, 2), **fields})


# three draws with two seeds each: seed 10 + 2 d and 11 + 2 d in draw d
DRAW_OF = {10: 0, 11: 0, 12: 1, 13: 1, 14: 2, 15: 2}
B = {s: 0.5 for s in DRAW_OF}
# a - b per seed: 0.3, 0.1 | -0.2, 0.0 | 0.5, 0.1  ->  per draw 0.2, -0.1, 0.3
A = {10: 0.8, 11: 0.6, 12: 0.3, 13: 0.5, 14: 1.0, 15: 0.6}


def test_the_draw_is_the_unit_seeds_averaged_within_it():
    """The 8 sign patterns of the draws' means (0.2, -0.1, 0.3), their sums by hand:
    +++ 0.6, ++- 0.0, +-+ 0.4 (observed), +-- -0.2, -++ 0.2, -+- -0.4, --+ 0.0, --- -0.6;
    at least 0.4: +++ and +-+, p = 2/8. Over the six seeds as units it would be 10/64."""
    r = claims.evaluate(_claim(), {"a": A, "b": B}, draw_of=DRAW_OF)
    assert r.seeds == (0, 1, 2)
    assert r.values == pytest.approx((0.2, -0.1, 0.3))
    assert r.p == pytest.approx(2 / 8) and r.outcome == "not reproduced"
    assert "per paired draw: d0 0.2, d1 -0.1, d2 0.3" in r.numbers
    # the six seeds as units (no draws): 0.3, 0.1, -0.2, 0, 0.5, 0.1, observed sum 0.8 of |d|
    # 1.2: as far when the negative set weighs <= 0.2: {}, {0.1}, {0.1'}, {0.2}, {0.1, 0.1'},
    # each with the zero's two signs: 10 of 64
    seeds_as_units = dataclasses.replace(_claim(), draws=())
    assert claims.evaluate(seeds_as_units, {"a": A, "b": B}).p == pytest.approx(10 / 64)
    # a draw outside the entry's draws is not counted; too few draws is inconclusive
    r = claims.evaluate(_claim(draws=(0, 1)), {"a": A, "b": B}, draw_of=DRAW_OF)
    assert r.outcome == "inconclusive: 3 paired draws absent" and r.seeds == (0, 1)


def test_preconditions_see_one_number_per_draw():
    mechanism = claims.Precondition(
        name="the mechanism",
        statistic="m",
        arm="a",
        direction=">",
        threshold=0.1,
        over="every_seed",
    )
    # draw 0's seeds 0.3 and 0.0 average 0.15 > 0.1, though seed 11 alone is below
    pre = {"the mechanism": {10: 0.3, 11: 0.0, 12: 0.2, 13: 0.2, 14: 0.2, 15: 0.2}}
    c = _claim(preconditions=(mechanism,))
    r = claims.evaluate(c, {"a": A, "b": B}, pre, draw_of=DRAW_OF)
    assert r.outcome == "not reproduced"
    pre["the mechanism"][10] = 0.1  # draw 0 now 0.05: absent
    r = claims.evaluate(c, {"a": A, "b": B}, pre, draw_of=DRAW_OF)
    assert r.outcome == "inconclusive: the mechanism absent" and "(a, worst draw) 0.05" in r.numbers


HARM = claims.Harm(
    name="GRPO's loss", statistic="accuracy lost", arm="b", direction=">", threshold=0.05
)


def test_harm_absent_is_inconclusive_never_not_reproduced():
    """The harm must show (or the run diverge) in at least half the draws; otherwise the verdict
    is "inconclusive: harm absent" whatever the comparison says."""
    c = _claim(draws=(0, 1, 2, 3), harm=HARM, min_seeds=3)
    a, b = {d: 0.6 for d in range(4)}, {d: 0.5 for d in range(4)}  # a - b = 0.1 in every draw
    # the harm in one draw of four (0.1 > 0.05): 25 % < 50 %
    r = claims.evaluate(c, {"a": a, "b": b}, {"GRPO's loss": {0: 0.1, 1: 0.0, 2: 0.01, 3: 0.0}})
    assert r.outcome == claims.HARM_ABSENT == "inconclusive: harm absent"
    assert "in 1 of 4 draws, needs 50%" in r.numbers
    # a diverged run (NaN) is the harm: 2 of 4, present; 4 draws give p 1/16: not reproduced
    r = claims.evaluate(c, {"a": a, "b": b}, {"GRPO's loss": {0: 0.1, 1: NAN, 2: 0.01, 3: 0.0}})
    assert r.outcome == "not reproduced" and r.p == 1 / 16
    assert claims.harm_present(HARM, {0: 0.06, 1: 0.0}, draws=4) == (False, 1)
    # two of the four draws run, neither harmed yet: the draws are absent, not the harm
    two = {"a": {0: 0.6, 1: 0.6}, "b": {0: 0.5, 1: 0.5}}
    r = claims.evaluate(c, two, {"GRPO's loss": {0: 0.0, 1: 0.0}})
    assert r.outcome == "inconclusive: 3 paired draws absent", r
    assert r.numbers.startswith("2 paired draw(s); a - b per paired draw: d0 0.1, d1 0.1")
    with pytest.raises(ValueError, match="share"):
        claims.Harm(name="h", statistic="s", arm="b", direction=">", threshold=0, share=0)


def test_an_equivalence_claim_is_decided_by_tost_within_its_margin():
    # differences 0.01, -0.01, 0.005, 0, 0.002 (tests/test_claims_stats.py: TOST p 1/32 at a
    # margin of 0.02, 8/32 at 0.005)
    diffs = {0: 0.01, 1: -0.01, 2: 0.005, 3: 0.0, 4: 0.002}
    b = {d: 0.5 for d in diffs}
    a = {d: 0.5 + v for d, v in diffs.items()}
    for margin, p, outcome in ((0.02, 1 / 32, "reproduced"), (0.005, 8 / 32, "not reproduced")):
        c = _claim(test="tost", direction="=", draws=tuple(diffs), criterion={"margin": margin})
        r = claims.evaluate(c, {"a": a, "b": b})
        assert (r.p, r.outcome) == (pytest.approx(p), outcome)
        assert f"exact TOST p = {p:.3g} (within +-{margin:g} of 0)" in r.numbers
        assert f"mean within +-{margin:g} of 0 by an exact TOST" in "\n".join(claims.describe(c))
    with pytest.raises(ValueError, match="margin"):
        _claim(test="tost", direction="=")  # no margin
    with pytest.raises(ValueError, match="direction"):
        _claim(test="sign_flip", direction="=")


def _family(ps_by_key):
    """Entries of the family "fam" over five draws whose a - b values give the sign-flip p's."""
    entries, inputs = [], {}
    for key, diffs in ps_by_key.items():
        entries.append(_claim(key=key, draws=(0, 1, 2, 3, 4), family="fam", min_seeds=5))
        b = {d: 0.0 for d in range(5)}
        inputs[key] = ({"a": dict(enumerate(diffs)), "b": b},)
    return entries, inputs


def test_holm_over_a_family_decides_on_the_adjusted_p():
    """Three entries with raw p 1/32, 2/32, 1/32 (five draws): Holm (sorted 1/32, 1/32, 2/32
    times 3, 2, 1 -> 0.094, 0.0625 -> monotone 0.094, 0.094, 0.0625 -> 0.094): none holds at
    0.05 though two raw p's are below it; the lines carry raw and adjusted p."""
    all_up = [0.1, 0.2, 0.3, 0.4, 0.5]  # p = 1/32
    one_small_down = [-0.05, 0.2, 0.3, 0.4, 0.5]  # flipping only the 0.05 is as far: 2/32
    entries, inputs = _family({"x": all_up, "y": one_small_down, "z": all_up})
    out = claims.evaluate_family("fam", inputs, entries)
    assert [out[k].p for k in "xyz"] == pytest.approx([1 / 32, 2 / 32, 1 / 32])
    assert [out[k].p_adjusted for k in "xyz"] == pytest.approx([3 / 32, 3 / 32, 3 / 32])
    assert {r.outcome for r in out.values()} == {"not reproduced"}
    assert "p = 0.0312 (one-sided, > 0), Holm-adjusted over the family fam p = 0.0938" in (
        out["x"].numbers
    )
    # alone, x holds at its raw p; as a family member it must go through evaluate_family
    assert claims.evaluate(dataclasses.replace(entries[0], family=""), *inputs["x"]).outcome == (
        "reproduced"
    )
    with pytest.raises(ValueError, match="evaluate_family"):
        claims.evaluate(entries[0], *inputs["x"])
    # an entry with no runs yet counts with p = 1: the family's size is fixed by registration
    two = claims.evaluate_family("fam", {"x": inputs["x"]}, entries[:2])
    assert two["x"].p_adjusted == pytest.approx(2 / 32) and two["y"].p_adjusted == 1.0
    assert two["x"].outcome == "not reproduced" and two["y"].outcome.startswith("inconclusive")
    with pytest.raises(ValueError, match="not in it"):
        claims.evaluate_family("fam", {"w": inputs["x"]}, entries)
    # designs still drafted count too: x alone with two drafts is adjusted as one of three
    alone = claims.evaluate_family("fam", {"x": inputs["x"]}, entries[:1], drafted=2)
    assert alone["x"].p_adjusted == pytest.approx(3 / 32) and list(alone) == ["x"]


def test_the_round_3_familys_size_is_its_designs_registered_or_drafted():
    """testbed_round3's ten designs (issue 52's round 3): the registered entry is decided as one
    of ten, the level its power was computed at, not alone while the others are drafts."""
    designs = claims.family_designs("testbed_round3")
    registered = {e.key for e in claims.family_entries("testbed_round3")}
    assert len(designs) == 10 and registered <= set(designs)
    assert {d.key for d in claims.drafts() if d.family == "testbed_round3"} == (
        set(designs) - registered
    )
    e = claims.current("gspo_minibatch_stability")
    up = {d: 0.3 + 0.01 * d for d in e.draws}  # every draw up: the smallest p, 1/4096
    values = {e.primary.arms[0]: up, e.primary.arms[1]: {d: 0.0 for d in e.draws}}
    pre = {p.name: {d: 1.0 for d in e.draws} for p in (*e.preconditions, e.harm)}
    r = claims.evaluate_family("testbed_round3", {e.key: (values, pre)})[e.key]
    assert r.p == pytest.approx(1 / 4096)
    assert r.p_adjusted == pytest.approx(10 / 4096) and r.outcome == "reproduced"


def test_a_notebooks_family_verdicts_print_raw_and_adjusted_p(capsys):
    """reporting.verdicts.family_verdicts: one VERDICT line per family entry, decided on the
    Holm-adjusted p (the same three entries as above: none holds), each printed after its
    entry's description."""
    from reporting import verdicts

    all_up = [0.1, 0.2, 0.3, 0.4, 0.5]
    entries, inputs = _family({"x": all_up, "y": [-0.05, 0.2, 0.3, 0.4, 0.5], "z": all_up})
    lines = verdicts.family_verdicts("fam", inputs, entries)
    assert list(lines) == ["x", "y", "z"]
    assert all(verdicts.outcome_of(line) == "not reproduced" for line in lines.values())
    assert "Holm-adjusted over the family fam p = 0.0938" in lines["x"]
    out = capsys.readouterr().out
    assert out.count("VERDICT: ") == 3 and out.index("primary criterion") < out.index("VERDICT")
    # one entry's notebook prints its own line, adjusted over the whole family
    assert list(verdicts.family_verdicts("fam", inputs, entries, keys=["y"])) == ["y"]
    out = capsys.readouterr().out
    assert out.count("VERDICT: ") == 1 and "p = 0.0938" in out
    with pytest.raises(ValueError, match="not registered entries"):
        verdicts.family_verdicts("fam", inputs, entries, keys=["w"])


def test_draw_bands_average_seeds_within_a_draw_then_span_the_draws():
    """Seeds 0 and 1 of draw 0 (values 0 and 2: mean 1) and seed 2 of draw 1 (value 5): the line
    is the mean of the draws' means (3), the band spans 1 to 5, not the seeds' 0 to 5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from reporting import analysis, verdicts

    def run(seed, v):
        recs = [{"step": t, "m": v} for t in (1, 2)]
        return analysis.RunData(f"a_s{seed}", "a", seed, "", {}, None, recs)

    fig, ax = plt.subplots()
    verdicts.draw_bands(ax, {"a": [run(0, 0.0), run(1, 2.0), run(2, 5.0)]}, "m", {0: 0, 1: 0, 2: 1})
    (line,) = ax.get_lines()
    assert line.get_ydata().tolist() == [3.0, 3.0] and line.get_label() == "a (2 draws)"
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == 1.0 and band.max() == 5.0
    plt.close(fig)


def test_fields_at_their_defaults_are_left_out_so_older_hashes_stay():
    """The canonical form leaves out every field at its default, so adding round 3's fields left
    each older entry's canonical form, and the hash its runs recorded, as they were."""
    old = claims.entries("gspo_minibatch_stability")[0]  # round 2's
    d = schema.to_dict(old)
    for name in ("draws", "harm", "power", "family", "status"):
        assert name not in d
    assert "margin" not in d["primary"]
    content = {k: v for k, v in d.items() if k not in schema.BOOKKEEPING}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert claims.entry_hash(old) == hashlib.sha256(text.encode()).hexdigest()
    # the file holds exactly the canonical form, and a set field changes the hash
    path = registry.entry_path(old.key, old.version)
    with open(path) as f:
        assert f.read() == schema.canonical_json(d)
    assert claims.entry_hash(dataclasses.replace(old, family="f")) != claims.entry_hash(old)
    # the new fields read back from their canonical form
    new = _claim(harm=HARM, power=claims.Power(effect=1, sd=1, power=0.5, alpha=0.05))
    assert schema.from_dict(schema.to_dict(new)) == new


def test_draft_entries_are_not_registered(tmp_path):
    """A draft lives in <key>/draft.json with status "draft" and decides nothing; among the
    registered versions (v<N>.json) a draft is refused, as is an entry with fewer than 8 draws."""
    draft = dataclasses.replace(_claim(draws=tuple(range(8))), status="draft")
    folder = tmp_path / "entries" / "made_up"
    folder.mkdir(parents=True)
    (folder / "draft.json").write_text(schema.canonical_json(schema.to_dict(draft)))
    assert registry.load(str(tmp_path / "entries")) == ()
    assert registry.drafts(str(tmp_path / "entries")) == (draft,)
    (folder / "v1.json").write_text(schema.canonical_json(schema.to_dict(draft)))
    with pytest.raises(ValueError, match="a draft is <key>/draft.json"):
        registry.load(str(tmp_path / "entries"))
    few = _claim(draws=(0, 1, 2))
    (folder / "v1.json").write_text(schema.canonical_json(schema.to_dict(few)))
    with pytest.raises(ValueError, match="3 draws, at least 8 needed"):
        registry.load(str(tmp_path / "entries"))
    with pytest.raises(ValueError, match="status"):
        dataclasses.replace(few, status="planned")
    assert math.isfinite(claims.stats.tost_power(n=8, margin=1.0, simulations=10))


def test_round3_designs_are_complete():
    """Each round-3 design (a draft, <key>/draft.json, or an entry registered in the family
    testbed_round3): at least MIN_DRAWS draws, a mechanism precondition, a harm where the claim
    is about avoiding one, and the power its registration fixes, as stats.sign_flip_power
    computes it, at Holm's first level over the family's designs."""
    from gspo_jax.claims import stats

    family = "testbed_round3"
    registered = claims.family_entries(family)
    designs = registered + [d for d in claims.drafts() if d.family == family]
    assert len(designs) >= 10 and len({d.key for d in designs}) == len(designs)
    assert "gspo_minibatch_stability" in {e.key for e in registered}
    harms = {"gspo_minibatch_stability", "moe_routing_replay", "gspo_length_normalisation"}
    harms |= {"gmpo_entropy", "dapo_clip_higher_entropy", "staleness_dose", "luspo_length"}
    for d in designs:
        assert len(d.draws) >= claims.MIN_DRAWS and d.primary.min_seeds == len(d.draws), d.name
        assert d.preconditions, d.name
        assert (d.harm is not None) == (d.key in harms), d.name
        assert d.power.alpha == pytest.approx(d.primary.alpha / len(designs)), d.name
    for d in [*registered, designs[-1]]:
        p = d.power
        assert p.power == stats.sign_flip_power(
            len(d.draws), p.effect, p.sd, p.alpha, p.simulations
        )


def test_a_retirement_lapses_when_a_newer_entry_takes_the_key_up(tmp_path):
    """A retirement names the newest version; once a newer entry supersedes the retired one (a
    round-3 design for a retired round-2 key) the key is live again and the file stays as the old
    version's history; a retirement of a version the registry lacks is refused."""
    root, folder = str(tmp_path / "entries"), tmp_path / "entries" / "made_up"
    folder.mkdir(parents=True)
    v1 = _claim(draws=())
    (folder / "v1.json").write_text(schema.canonical_json(schema.to_dict(v1)))
    gone = dict(version=1, reason="never run", in_favour_of="a round-3 design")
    (folder / "retired.json").write_text(json.dumps(gone))
    assert registry.retired("made_up", root).in_favour_of == "a round-3 design"
    v2 = dataclasses.replace(v1, version=2, supersedes=1, reason="round 3")
    (folder / "v2.json").write_text(schema.canonical_json(schema.to_dict(v2)))
    assert registry.retired("made_up", root) is None
    (folder / "retired.json").write_text(json.dumps(dict(gone, version=3)))
    with pytest.raises(ValueError, match="retires v3"):
        registry.retired("made_up", root)


def test_retired_entries_were_never_run():
    """A retirement (<key>/retired.json) is for a newest entry none of whose runs were made."""
    from trainer_runs import load_repo_module

    order = load_repo_module("experiments/checks/registration_order.py")
    gone = [k for k in {e.key for e in claims.load()} if claims.retired(k)]
    assert len(gone) >= 6 and "eps_objective_sweep" in gone
    assert "seq_ratio_eps02" not in gone  # its v2 is retired, its v3 (round 3) took the key up
    for key in gone:
        assert order.entry_runs(claims.current(key)) == [], key


def test_a_round_3_entrys_description_names_its_draws_harm_power_and_family():
    """What a notebook prints above the verdict is the whole registered design: the draws as the
    unit, the harm with its share, the power fixed at registration and the family."""
    text = "\n".join(claims.describe(claims.current("gspo_minibatch_stability")))
    assert (
        "at least 12 paired draws" in text and "draws: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11" in text
    )
    assert "of grpo_nokl_mb16 > 0.1 in at least 50% of the draws" in text
    assert "power (computed at registration): 0.96 at a mean of 0.3" in text
    assert "alpha 0.005" in text and "family: testbed_round3" in text
    assert "on the mean over draws" in text
    round2 = "\n".join(claims.describe(claims.entries("gspo_minibatch_stability")[0]))
    assert "paired seeds" in round2 and "harm (" not in round2 and "family:" not in round2
