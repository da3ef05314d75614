"""A claims-registry entry decided on per-seed numbers: the paired values, the preconditions,
the primary criterion's test (stats.py) and the outcome with the numbers behind it; and the entry
as the printed lines a notebook shows above its verdict.

Per-seed numbers come in as ``{arm: {seed: value}}``; the preconditions are checked in the
entry's order, then the harm, then the seed (or draw) count; the first that fails gives the
outcome. Pure functions over numbers: nothing here reads runs (notebooks/reporting/ does).

An entry with ``draws`` (round 3) is decided over draws: ``draw_of`` {seed: draw} places each
seed (default: a seed is its own draw), paired differences are averaged within their draw
(stats.by_draw, stats.draw_means), and the test, the preconditions and the harm see one number
per draw. An entry with a ``family`` is decided by evaluate_family, which applies Holm's
correction over every entry of the family and decides each on its adjusted p.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from gspo_jax.claims.registry import drafts, load
from gspo_jax.claims.schema import OUTCOMES, Claim, Criterion, Harm, Precondition
from gspo_jax.claims.stats import (
    bootstrap_interval,
    by_draw,
    draw_means,
    holm,
    on_side,
    sign_flip_p,
    tost_p,
    wilcoxon_p,
)

HARM_ABSENT = "inconclusive: harm absent"


@dataclasses.dataclass(frozen=True)
class Result:
    """A criterion evaluated: the outcome line's outcome and the numbers behind it."""

    outcome: str  # "reproduced", "not reproduced" or "inconclusive: <precondition> absent"
    numbers: str
    seeds: tuple[int, ...] = ()
    values: tuple[float, ...] = ()  # per paired seed: the value or the difference
    interval: tuple[float, float] | None = None
    p: float | None = None  # the exact test's raw p (sign_flip, wilcoxon, tost)
    p_adjusted: float | None = None  # Holm-adjusted over the entry's family (evaluate_family)


# --- pure functions over per-seed numbers -------------------------------------------------------


def _finite(per_seed: Mapping[int, float]) -> dict[int, float]:
    return {
        int(s): float(v) for s, v in per_seed.items() if v is not None and math.isfinite(float(v))
    }


def _counted(per_seed: Mapping[int, float], diverged: float | None) -> dict[int, float]:
    """The seeds a criterion counts: finite values; with ``diverged`` set, a non-finite value
    (a diverged run) counts as ``diverged`` instead of being dropped (None stays missing)."""
    if diverged is None:
        return _finite(per_seed)
    return {
        int(s): float(v) if math.isfinite(float(v)) else float(diverged)
        for s, v in per_seed.items()
        if v is not None
    }


def diverged_seeds(values: Mapping[str, Mapping[int, float]], arms: Sequence[str]) -> dict:
    """{arm: [seeds whose value is not finite]} over ``arms`` (the runs that diverged)."""
    out = {}
    for a in arms:
        bad = [int(s) for s, v in values.get(a, {}).items() if v is not None]
        bad = [s for s in bad if not math.isfinite(float(values[a][s]))]
        if bad:
            out[a] = sorted(bad)
    return out


def paired_values(
    values: Mapping[str, Mapping[int, float]],
    arms: Sequence[str],
    diverged: float | None = None,
) -> tuple[tuple[int, ...], np.ndarray]:
    """(seeds, per-seed value or difference arms[0] - arms[1]) over the seeds every arm has with
    a finite value (with ``diverged`` set: with any value, a non-finite one counted as
    ``diverged``); an arm missing from ``values`` has no seeds."""
    per_arm = [_counted(values.get(a, {}), diverged) for a in arms]
    seeds = tuple(sorted(set.intersection(*(set(d) for d in per_arm))))
    x = np.asarray([per_arm[0][s] for s in seeds], dtype=np.float64)
    if len(arms) == 2:
        x = x - np.asarray([per_arm[1][s] for s in seeds], dtype=np.float64)
    return seeds, x


def p_value(c: Criterion, x: Sequence[float]) -> float:
    """The p-value of an exact test of ``x`` against ``c``: one-sided (sign_flip, wilcoxon), or
    TOST's larger one-sided p of the equivalence within +-margin of the threshold (tost)."""
    if c.test == "sign_flip":
        return sign_flip_p(x, c.direction, c.threshold)
    if c.test == "wilcoxon":
        return wilcoxon_p(x, c.direction, c.threshold)
    if c.test == "tost":
        return tost_p(np.asarray(x, dtype=np.float64) - c.threshold, c.margin)
    raise ValueError(f"{c.test!r} has no p-value: sign_flip, wilcoxon or tost")


def holds(
    c: Criterion, x: np.ndarray, p: float | None = None
) -> tuple[bool, tuple[float, float] | None]:
    """(the criterion holds on the per-seed (per-draw) values ``x``, the bootstrap interval or
    None); ``p``: the p-value to decide on in place of the raw one (Holm-adjusted)."""
    if c.test == "every_seed":
        return bool(x.size and np.all(on_side(x, c.direction, c.threshold))), None
    if c.test in ("sign_flip", "wilcoxon", "tost"):
        p = p_value(c, x) if p is None else p
        side = c.test != "sign_flip" or on_side(x.mean(), c.direction, c.threshold)
        return bool(x.size and side and p < c.alpha), None
    lo, hi = bootstrap_interval(x, c.confidence, c.resamples)
    return bool(on_side(lo if c.direction == ">" else hi, c.direction, c.threshold)), (lo, hi)


def precondition_holds(p: Precondition, per_seed: Mapping[int, float]) -> tuple[bool, float]:
    """(present, the number compared: the mean over seeds, or the worst seed); no values: absent."""
    v = np.asarray(list(_finite(per_seed).values()), dtype=np.float64)
    if v.size == 0:
        return False, math.nan
    if p.over == "every_seed":
        worst = float(v.min() if p.direction == ">" else v.max())
        return bool(on_side(worst, p.direction, p.threshold)), worst
    m = float(v.mean())
    return bool(on_side(m, p.direction, p.threshold)), m


def harm_present(h: Harm, per_draw: Mapping[int, float], draws: int) -> tuple[bool, int]:
    """(the harm shows in at least ``h.share`` of ``draws`` draws, how many it shows in): a
    draw's value on the harm's side of the threshold, or not finite (diverged), is the harm."""
    shown = sum(
        1
        for v in per_draw.values()
        if v is not None and (not math.isfinite(float(v)) or on_side(v, h.direction, h.threshold))
    )
    return bool(draws and shown >= h.share * draws), shown


def _per_draw(per_seed: Mapping[int, float], draw_of: Mapping[int, int]) -> dict[int, float]:
    """{draw: mean of its seeds' values}, a draw with a non-finite seed non-finite (diverged)."""
    out = {}
    for draw, vs in by_draw({s: v for s, v in per_seed.items() if v is not None}, draw_of).items():
        out[draw] = float(np.mean(vs)) if all(map(math.isfinite, vs)) else math.nan
    return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def evaluate(
    claim: Claim,
    values: Mapping[str, Mapping[int, float]],
    preconditions: Mapping[str, Mapping[int, float]] | None = None,
    draw_of: Mapping[int, int] | None = None,
    p_adjusted: float | None = None,
) -> Result:
    """The outcome of ``claim`` on per-seed numbers: ``values`` {arm: {seed: statistic}} for the
    primary criterion, ``preconditions`` {precondition or harm name: {seed: statistic}};
    ``draw_of`` {seed: warm-start draw} for an entry with draws (default: the seed is the draw);
    ``p_adjusted``: the Holm-adjusted p the outcome is decided on (evaluate_family gives it; an
    entry of a family is refused without it)."""
    if claim.family and p_adjusted is None:
        raise ValueError(
            f"{claim.name} is in the family {claim.family!r}: decide it with "
            "claims.evaluate_family over the family's entries (Holm's correction)"
        )
    return _evaluate(claim, values, preconditions, draw_of, p_adjusted)


def _evaluate(claim, values, preconditions, draw_of, p_adjusted) -> Result:
    c = claim.primary
    preconditions = preconditions or {}
    if claim.seeds:  # an entry registered for its own (fresh) seeds counts no other seed
        values = {a: {s: v for s, v in d.items() if s in claim.seeds} for a, d in values.items()}
        preconditions = {
            n: {s: v for s, v in d.items() if s in claim.seeds} for n, d in preconditions.items()
        }
    unit = "seed"
    if claim.draws:  # the draw is the unit: seeds of other draws are not counted
        draw_of = draw_of or {s: s for d in values.values() for s in d}
        draw_of = {s: d for s, d in draw_of.items() if d in claim.draws}
        values = {a: {s: v for s, v in d.items() if s in draw_of} for a, d in values.items()}
        preconditions = {
            n: _per_draw({s: v for s, v in d.items() if s in draw_of}, draw_of)
            for n, d in preconditions.items()
        }
        unit = "draw"
    seeds, x = paired_values(values, c.arms, c.diverged)
    if claim.draws:
        means = draw_means(by_draw(dict(zip(seeds, x.tolist(), strict=True)), draw_of))
        seeds, x = tuple(means), np.asarray(list(means.values()), dtype=np.float64)
    what = " - ".join(c.arms)
    per_seed = ", ".join(f"{unit[0]}{s} {_g(v)}" for s, v in zip(seeds, x, strict=True)) or "none"
    numbers = f"{what} per paired {unit}: {per_seed}"
    if c.diverged is not None:
        bad = diverged_seeds(values, c.arms)
        numbers += "; diverged (counted as {}): {}".format(
            _g(c.diverged),
            "; ".join(f"{a} s{', s'.join(map(str, v))}" for a, v in bad.items()) or "none",
        )
    too_few = Result(
        f"inconclusive: {c.min_seeds} paired {unit}s absent",
        f"{len(seeds)} paired {unit}(s); {numbers}",
        seeds,
        tuple(x.tolist()),
    )
    if claim.draws and len(seeds) < c.min_seeds:
        # a design with draws still to run is undecided: a precondition or harm read on the
        # draws run so far (the harm's count is over every draw) would call it absent too soon
        return too_few
    for p in claim.preconditions:
        ok, m = precondition_holds(p, preconditions.get(p.name, {}))
        if not ok:
            how = f"worst {unit}" if p.over == "every_seed" else f"mean over {unit}s"
            return Result(
                f"inconclusive: {p.name} absent",
                f"{p.statistic} ({p.arm}, {how}) {_g(m)}, needs {p.direction} "
                f"{_g(p.threshold)}; {numbers}",
                seeds,
                tuple(x.tolist()),
            )
    if claim.harm is not None:
        h = claim.harm
        ok, shown = harm_present(h, preconditions.get(h.name, {}), len(claim.draws or seeds))
        if not ok:
            return Result(
                HARM_ABSENT,
                f"{h.name}: {h.statistic} ({h.arm}) {h.direction} {_g(h.threshold)} or diverged "
                f"in {shown} of {len(claim.draws or seeds)} {unit}s, needs {h.share:.0%}; "
                f"{numbers}",
                seeds,
                tuple(x.tolist()),
            )
    if len(seeds) < c.min_seeds:
        return too_few
    raw_p = p_value(c, x) if c.test in ("sign_flip", "wilcoxon", "tost") else None
    ok, interval = holds(c, x, p_adjusted)
    if interval is not None:
        numbers += (
            f"; mean {_g(float(x.mean()))}, {c.confidence:.0%} bootstrap interval "
            f"[{_g(interval[0])}, {_g(interval[1])}] against {c.direction} {_g(c.threshold)}"
        )
    elif raw_p is not None:
        if c.test == "tost":
            how = f"exact TOST p = {_g(raw_p)} (within +-{_g(c.margin)} of {_g(c.threshold)})"
        else:
            name = "sign-flip" if c.test == "sign_flip" else "Wilcoxon signed-rank"
            how = f"exact {name} p = {_g(raw_p)} (one-sided, {c.direction} {_g(c.threshold)})"
        numbers += f"; mean {_g(float(x.mean()))}, median {_g(float(np.median(x)))}, {how}"
        if p_adjusted is not None:
            numbers += f", Holm-adjusted over the family {claim.family} p = {_g(p_adjusted)}"
        numbers += f" against alpha {_g(c.alpha)}"
    else:
        numbers += f"; every {unit} {c.direction} {_g(c.threshold)}: {ok}"
    return Result(
        OUTCOMES[0] if ok else OUTCOMES[1],
        numbers,
        seeds,
        tuple(x.tolist()),
        interval,
        raw_p,
        p_adjusted,
    )


def family_entries(family: str, folder: str | None = None) -> list[Claim]:
    """The registered entries of ``family`` (each key's newest version that names it)."""
    newest = {e.key: e for e in load(folder)}
    return [e for e in newest.values() if e.family == family]


def family_designs(family: str, folder: str | None = None) -> list[str]:
    """The keys of every design of ``family``, registered or drafted: the family's size for
    Holm's correction. A draft counts from the start, so the first entry registered is decided
    at the level its power was computed for (an undecided design is p = 1), not alone."""
    keys = {e.key for e in family_entries(family, folder)}
    return sorted(keys | {d.key for d in drafts(folder) if d.family == family})


def evaluate_family(
    family: str,
    inputs: Mapping[str, tuple],
    entries: Sequence[Claim] | None = None,
    drafted: int | None = None,
) -> dict[str, Result]:
    """Every entry of ``family`` decided with Holm's correction over the whole family:
    ``inputs`` {key: (values, preconditions, draw_of)} as for evaluate; ``entries`` the
    family's registered entries (default: the registry's, family_entries); ``drafted`` how many
    of its designs are not registered yet (default: the registry's drafts, family_designs). An
    entry without inputs, or without a p (inconclusive, or a test with no p), and each drafted
    design count in the family with p = 1, so the correction's size is fixed by the designs, not
    by which entries came out decided. Returns {key: Result} carrying each entry's raw and
    adjusted p."""
    if entries is None:
        entries = family_entries(family)
        if drafted is None:
            drafted = len(family_designs(family)) - len(entries)
    entries = list(entries)
    unknown = sorted(set(inputs) - {e.key for e in entries})
    if unknown or any(e.family != family for e in entries):
        raise ValueError(
            f"family {family!r} holds {sorted(e.key for e in entries)}; {unknown} are not in it: "
            "give numbers for its own entries only"
        )

    def given(key: str) -> tuple:  # (values, preconditions, draw_of), the missing ones empty
        return (*inputs.get(key, ()), {}, None, None)[:3]

    raw = {e.key: _evaluate(e, *given(e.key), None) for e in entries}
    tested = {k for k, r in raw.items() if r.p is not None and r.outcome in OUTCOMES[:2]}
    adjusted = holm([raw[k].p if k in tested else 1.0 for k in raw] + [1.0] * (drafted or 0))
    return {
        e.key: _evaluate(e, *given(e.key), p_adj)
        if e.key in tested
        else dataclasses.replace(raw[e.key], p_adjusted=p_adj)
        for e, p_adj in zip(entries, adjusted[: len(entries)], strict=True)
    }


def describe(claim: Claim) -> list[str]:
    """The entry as printed lines (the notebook prints these above its verdict)."""
    c = claim.primary
    subject = f"{c.arms[0]} - {c.arms[1]} (paired by seed)" if len(c.arms) == 2 else c.arms[0]
    if c.test == "every_seed":
        test = f"{c.direction} {c.threshold:g} in every seed"
    elif c.test == "sign_flip":
        test = (
            f"mean {c.direction} {c.threshold:g} with an exact one-sided sign-flip permutation "
            f"p < {c.alpha:g}"
        )
    elif c.test == "wilcoxon":
        test = (
            f"{c.direction} {c.threshold:g} by an exact one-sided Wilcoxon signed-rank "
            f"p < {c.alpha:g}"
        )
    elif c.test == "tost":
        test = (
            f"mean within +-{c.margin:g} of {c.threshold:g} by an exact TOST (both one-sided "
            f"sign-flip tests) p < {c.alpha:g}"
        )
    else:
        test = (
            f"the {c.confidence:.0%} bootstrap interval of the mean over seeds "
            f"{'above' if c.direction == '>' else 'below'} {c.threshold:g}"
        )
    lines = [
        f"registry entry {claim.name}"
        + (f" (supersedes v{claim.supersedes}: {claim.reason})" if claim.supersedes else ""),
        f"claim: {claim.claim}",
        f"paper: {claim.paper}",
        f"sweeps: {', '.join(claim.sweeps)}; arms: " + "; ".join(claim.arms),
    ]
    if claim.doses:
        lines.append(f"doses: {claim.doses}")
    if claim.negative_control:
        lines.append(f"negative control: {claim.negative_control}")
    unit = "draws" if claim.draws else "seeds"
    lines.append(
        f"primary criterion: {c.statistic}, {subject}: {test}; at least {c.min_seeds} paired {unit}"
    )
    if claim.draws:
        lines.append(
            f"draws: {', '.join(map(str, claim.draws))} (warm-start draws, the unit: a draw's "
            "seeds are averaged within it)"
        )
    if c.diverged is not None:
        lines.append(f"a diverged (non-finite) seed counts as {c.diverged:g}, not as missing")
    if claim.seeds:
        lines.append(f"seeds: {min(claim.seeds)}-{max(claim.seeds)} (fresh for this claim)")
    if claim.check:
        lines.append(f"decided by the deterministic check {claim.check} (no training runs)")
    if claim.needs:
        lines.append(f"needs before its runs: {claim.needs}")
    for p in claim.preconditions:
        over = "in every seed" if p.over == "every_seed" else f"on the mean over {unit}"
        lines.append(
            f"precondition ({p.name}): {p.statistic} of {p.arm} {p.direction} {p.threshold:g} "
            f"{over}"
        )
    if (h := claim.harm) is not None:
        lines.append(
            f"harm ({h.name}): {h.statistic} of {h.arm} {h.direction} {h.threshold:g} in at "
            f"least {h.share:.0%} of the draws (a diverged run counts as the harm); absent: "
            "inconclusive"
        )
    if (w := claim.power) is not None:
        lines.append(
            f"power (computed at registration): {w.power:.2f} at a mean of {w.effect:g} and a "
            f"draw-to-draw sd of {w.sd:g}, alpha {w.alpha:g}"
        )
    if claim.family:
        lines.append(
            f"family: {claim.family} (Holm's correction over its designs; the outcome uses the "
            "adjusted p)"
        )
    if claim.secondary:
        lines.append(
            "secondary checks (printed, never change the outcome): " + "; ".join(claim.secondary)
        )
    if claim.confounds:
        lines.append(f"confounds: {claim.confounds}")
    return lines
