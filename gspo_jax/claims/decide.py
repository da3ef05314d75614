"""A claims-registry entry decided on per-seed numbers: the paired values, the preconditions,
the primary criterion's test (stats.py) and the outcome with the numbers behind it; and the entry
as the printed lines a notebook shows above its verdict.

Per-seed numbers come in as ``{arm: {seed: value}}``; the preconditions are checked in the
entry's order, then the seed count; the first that fails gives the outcome. Pure functions over
numbers: nothing here reads runs (notebooks/reporting/ does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from gspo_jax.claims.schema import OUTCOMES, Claim, Criterion, Precondition
from gspo_jax.claims.stats import bootstrap_interval, on_side, sign_flip_p, wilcoxon_p


@dataclasses.dataclass(frozen=True)
class Result:
    """A criterion evaluated: the outcome line's outcome and the numbers behind it."""

    outcome: str  # "reproduced", "not reproduced" or "inconclusive: <precondition> absent"
    numbers: str
    seeds: tuple[int, ...] = ()
    values: tuple[float, ...] = ()  # per paired seed: the value or the difference
    interval: tuple[float, float] | None = None


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
    """The one-sided p-value of an exact test (sign_flip or wilcoxon) of ``x`` against ``c``."""
    if c.test == "sign_flip":
        return sign_flip_p(x, c.direction, c.threshold)
    if c.test == "wilcoxon":
        return wilcoxon_p(x, c.direction, c.threshold)
    raise ValueError(f"{c.test!r} has no p-value: sign_flip or wilcoxon")


def holds(c: Criterion, x: np.ndarray) -> tuple[bool, tuple[float, float] | None]:
    """(the criterion holds on the per-seed values ``x``, the bootstrap interval or None)."""
    if c.test == "every_seed":
        return bool(x.size and np.all(on_side(x, c.direction, c.threshold))), None
    if c.test == "sign_flip":
        p = sign_flip_p(x, c.direction, c.threshold)
        return bool(x.size and on_side(x.mean(), c.direction, c.threshold) and p < c.alpha), None
    if c.test == "wilcoxon":
        return bool(x.size and wilcoxon_p(x, c.direction, c.threshold) < c.alpha), None
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


def _g(x: float) -> str:
    return f"{x:.3g}"


def evaluate(
    claim: Claim,
    values: Mapping[str, Mapping[int, float]],
    preconditions: Mapping[str, Mapping[int, float]] | None = None,
) -> Result:
    """The outcome of ``claim`` on per-seed numbers: ``values`` {arm: {seed: statistic}} for the
    primary criterion, ``preconditions`` {precondition name: {seed: statistic}}."""
    c = claim.primary
    if claim.seeds:  # an entry registered for its own (fresh) seeds counts no other seed
        values = {a: {s: v for s, v in d.items() if s in claim.seeds} for a, d in values.items()}
        preconditions = {
            n: {s: v for s, v in d.items() if s in claim.seeds}
            for n, d in (preconditions or {}).items()
        }
    seeds, x = paired_values(values, c.arms, c.diverged)
    what = " - ".join(c.arms)
    per_seed = ", ".join(f"s{s} {_g(v)}" for s, v in zip(seeds, x, strict=True)) or "none"
    numbers = f"{what} per paired seed: {per_seed}"
    if c.diverged is not None:
        bad = diverged_seeds(values, c.arms)
        numbers += "; diverged (counted as {}): {}".format(
            _g(c.diverged),
            "; ".join(f"{a} s{', s'.join(map(str, v))}" for a, v in bad.items()) or "none",
        )
    for p in claim.preconditions:
        ok, m = precondition_holds(p, (preconditions or {}).get(p.name, {}))
        if not ok:
            how = "worst seed" if p.over == "every_seed" else "mean over seeds"
            return Result(
                f"inconclusive: {p.name} absent",
                f"{p.statistic} ({p.arm}, {how}) {_g(m)}, needs {p.direction} "
                f"{_g(p.threshold)}; {numbers}",
                seeds,
                tuple(x.tolist()),
            )
    if len(seeds) < c.min_seeds:
        return Result(
            f"inconclusive: {c.min_seeds} paired seeds absent",
            f"{len(seeds)} paired seed(s); {numbers}",
            seeds,
            tuple(x.tolist()),
        )
    ok, interval = holds(c, x)
    if interval is not None:
        numbers += (
            f"; mean {_g(float(x.mean()))}, {c.confidence:.0%} bootstrap interval "
            f"[{_g(interval[0])}, {_g(interval[1])}] against {c.direction} {_g(c.threshold)}"
        )
    elif c.test in ("sign_flip", "wilcoxon"):
        p = p_value(c, x)
        name = "sign-flip" if c.test == "sign_flip" else "Wilcoxon signed-rank"
        numbers += (
            f"; mean {_g(float(x.mean()))}, median {_g(float(np.median(x)))}, exact {name} "
            f"p = {_g(p)} (one-sided, {c.direction} {_g(c.threshold)}) against alpha {_g(c.alpha)}"
        )
    else:
        numbers += f"; every seed {c.direction} {_g(c.threshold)}: {ok}"
    return Result(OUTCOMES[0] if ok else OUTCOMES[1], numbers, seeds, tuple(x.tolist()), interval)


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
    lines.append(
        f"primary criterion: {c.statistic}, {subject}: {test}; at least {c.min_seeds} paired seeds"
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
        over = "in every seed" if p.over == "every_seed" else "on the mean over seeds"
        lines.append(
            f"precondition ({p.name}): {p.statistic} of {p.arm} {p.direction} {p.threshold:g} "
            f"{over}"
        )
    if claim.secondary:
        lines.append(
            "secondary checks (printed, never change the outcome): " + "; ".join(claim.secondary)
        )
    if claim.confounds:
        lines.append(f"confounds: {claim.confounds}")
    return lines
