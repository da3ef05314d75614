"""The tests the claims registry decides with, on per-seed (or per-draw) numbers, through
scipy.stats where it has the test; Holm's correction and a power calculation beside them.

    sign_flip_p(d, ">", 0.0)          # exact one-sided sign-flip (paired permutation) p-value
    wilcoxon_p(d, ">", 0.0)           # exact one-sided Wilcoxon signed-rank p (Pratt's zeros)
    bootstrap_interval(d)             # percentile bootstrap interval of the mean
    draw_means({0: [a, b], 1: [c]})   # seeds nested in warm-start draws, averaged per draw
    tost_p(d, margin=0.02)            # equivalence: both one-sided sign-flip tests, the larger p
    holm([0.01, 0.04, 0.03])          # Holm-adjusted p-values, in the input's order
    sign_flip_power(n=8, effect=0.5)  # the chance the sign-flip test rejects at that effect
    tost_power(n=8, margin=0.5)       # the chance TOST shows equivalence at a true difference 0

A one-sided p is the share of the null distribution at least as far on the claimed side as the
observed statistic: for ``direction`` ">" large values, for "<" small ones. The sign-flip and
Wilcoxon tests are exact: every one of the 2^n sign assignments is counted (n up to about 20).
Draws as the unit (issue 52): seeds sharing a warm-start draw are not independent, so their
values are averaged within the draw and the tests run over draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

DIRECTIONS = (">", "<")


def _alternative(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: use '>' or '<'")
    return "greater" if direction == ">" else "less"


def on_side(x, direction: str, threshold: float):
    """x > threshold or x < threshold (elementwise for arrays)."""
    return np.greater(x, threshold) if direction == ">" else np.less(x, threshold)


def sign_flip_p(x: Sequence[float], direction: str, threshold: float = 0.0) -> float:
    """The exact one-sided p-value of the sign-flip permutation test of mean(x - threshold):
    the share of the 2^n sign assignments (scipy.stats.permutation_test's exact null
    distribution) whose mean is at least as far on the claimed side as the observed one, ties
    within 1e-12 x max(1, max |d|) counted as at least as far (float rounding must not split
    a tie of equal sums); NaN for no values."""
    d = np.asarray(x, dtype=np.float64) - threshold
    if d.size == 0:
        return math.nan
    if d.size == 1:  # two assignments (scipy needs two values): +d and -d
        return 0.5 if on_side(d[0], direction, 0.0) else 1.0
    result = stats.permutation_test(
        (d,),
        lambda s, axis=-1: np.mean(s, axis=axis),
        permutation_type="samples",  # one sample: the permutations flip the signs
        alternative=_alternative(direction),
        n_resamples=np.inf,  # exact: all 2^n assignments
    )
    null, observed = result.null_distribution, result.statistic  # [2^n], []
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    far = null >= observed - tol if direction == ">" else null <= observed + tol
    return float(far.mean())


def sign_flip_p_many(x: np.ndarray, direction: str, threshold: float = 0.0) -> np.ndarray:
    """sign_flip_p of each row of ``x`` [S, n] at once, [S]: the 2^n sign assignments as one
    matrix [2^n, n], every row's null distribution a product with it, the same tie tolerance
    (a power calculation's thousands of simulated designs, which scipy's loop takes minutes
    for)."""
    d = np.asarray(x, dtype=np.float64) - threshold  # [S, n]
    n = d.shape[1]
    if n < 2:
        return np.asarray([sign_flip_p(row, direction) for row in d])
    signs = 1.0 - 2.0 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # [2^n, n]
    out = np.empty(d.shape[0])
    step = max(1, 2**22 // 2**n)  # rows a chunk: its null [step, 2^n] stays ~32 MB
    for i in range(0, d.shape[0], step):
        rows = d[i : i + step]  # [s, n]
        null = rows @ signs.T / n  # [s, 2^n]
        observed = rows.mean(axis=1, keepdims=True)  # [s, 1]
        tol = 1e-12 * np.maximum(1.0, np.abs(rows).max(axis=1, keepdims=True))
        far = null >= observed - tol if direction == ">" else null <= observed + tol
        out[i : i + step] = far.mean(axis=1)
    return out


def signed_ranks(d: Sequence[float]) -> np.ndarray:
    """2 x the mid-rank of each |d_i| among all |d| (integers; ties share their mean rank), 0
    where d_i == 0 (Pratt: zeros are ranked, so they push the others' ranks up, but count on
    neither side)."""
    d = np.asarray(d, dtype=np.float64)
    ranks = stats.rankdata(np.abs(d))  # mid-ranks, halves at ties
    return np.where(d == 0, 0, np.round(2 * ranks)).astype(np.int64)


def wilcoxon_p(x: Sequence[float], direction: str, threshold: float = 0.0) -> float:
    """The exact one-sided p-value of the Wilcoxon signed-rank test of x - threshold (zeros
    ranked, counted on neither side: Pratt; ties at their mid-ranks), counted over every sign
    assignment (scipy.stats.wilcoxon with an exhaustive permutation method); NaN for none."""
    d = np.asarray(x, dtype=np.float64) - threshold
    if d.size == 0:
        return math.nan
    if not np.any(d):  # all zero: W is 0 under every assignment
        return 1.0
    if d.size == 1:  # W is its rank or 0 (scipy needs two values), as for the sign flip
        return sign_flip_p(d, direction)
    result = stats.wilcoxon(
        d,
        zero_method="pratt",
        alternative=_alternative(direction),
        method=stats.PermutationMethod(n_resamples=np.inf),
    )
    return float(result.pvalue)


def bootstrap_interval(
    x: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``x`` (scipy.stats.bootstrap, resampled
    with replacement from a generator seeded ``seed``); NaNs for no values."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1 or np.all(x == x[0]):  # every resample's mean is the value
        return (float(x[0]), float(x[0]))
    result = stats.bootstrap(
        (x,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def draw_means(per_draw: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """{draw: the mean of its seeds' finite values} over the draws that have one: seeds nested in
    a warm-start draw share its base, so the draw, not the seed, is the independent unit."""
    out = {}
    for draw, values in sorted(per_draw.items()):
        v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
        if v.size:
            out[int(draw)] = float(v.mean())
    return out


def by_draw(per_seed: Mapping[int, float], draw_of: Mapping[int, int]) -> dict[int, list[float]]:
    """{draw: [values of its seeds]} from {seed: value} and {seed: draw} (a seed without a draw
    is a ValueError naming it: it cannot be placed)."""
    missing = sorted(set(per_seed) - set(draw_of))
    if missing:
        raise ValueError(f"seeds {missing} have no warm-start draw; give each seed's draw")
    out: dict[int, list[float]] = {}
    for seed, value in sorted(per_seed.items()):
        out.setdefault(int(draw_of[seed]), []).append(value)
    return out


def draw_sign_flip_p(
    per_draw: Mapping[int, Sequence[float]], direction: str, threshold: float = 0.0
) -> float:
    """The exact sign-flip p over draws: each draw's seeds averaged (draw_means), then
    sign_flip_p of those means (the smallest one-sided p with n draws is 1/2^n)."""
    return sign_flip_p(list(draw_means(per_draw).values()), direction, threshold)


def tost_p(x: Sequence[float], margin: float) -> float:
    """Equivalence (two one-sided tests) of mean(x) to 0 within +-``margin``: the larger of the
    exact sign-flip p of mean > -margin and of mean < +margin; equivalent at alpha when
    p < alpha."""
    if not margin > 0:
        raise ValueError(f"equivalence margin {margin!r} must be > 0")
    return max(sign_flip_p(x, ">", -margin), sign_flip_p(x, "<", margin))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over the m tests), in the input's
    order: sorted ascending, the i-th smallest (from 0) is multiplied by m - i, made
    non-decreasing, capped at 1. A test holds after correction when its adjusted p < alpha."""
    p = np.asarray(p_values, dtype=np.float64)
    if np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adjusted
    return out.tolist()


def _simulated_power(n, effect, sd, alpha, simulations, seed, rejects) -> float:
    """The share of ``simulations`` designs of ``n`` Normal(effect, sd) units (generator
    ``seed``) for which ``rejects(units [S, n]) -> [S] bool`` holds; 0 where 1/2^n >= alpha (no
    exact sign-flip p over n units reaches alpha)."""
    if n < 1 or simulations < 1:
        raise ValueError(f"n={n} units and simulations={simulations} must be >= 1")
    if 0.5**n >= alpha:
        return 0.0
    d = np.random.default_rng(seed).normal(effect, sd, size=(simulations, n))
    return float(np.mean(rejects(d)))


def sign_flip_power(
    n: int,
    effect: float,
    sd: float = 1.0,
    alpha: float = 0.05,
    simulations: int = 2000,
    seed: int = 0,
) -> float:
    """The chance that the one-sided (">" 0) exact sign-flip test over ``n`` units rejects at
    ``alpha``, when each unit's difference is Normal(effect, sd): the share of ``simulations``
    simulated designs it rejects (generator ``seed``). Fixed at registration, it says whether
    the design could show the effect: with n units the smallest p is 1/2^n, so n = 4 never
    rejects at 0.05 whatever the effect."""
    return _simulated_power(
        n,
        effect,
        sd,
        alpha,
        simulations,
        seed,
        lambda d: (sign_flip_p_many(d, ">") < alpha) & (d.mean(axis=1) > 0),
    )


def tost_power(
    n: int,
    margin: float,
    effect: float = 0.0,
    sd: float = 1.0,
    alpha: float = 0.05,
    simulations: int = 2000,
    seed: int = 0,
) -> float:
    """The chance that TOST (tost_p) over ``n`` units shows equivalence within +-``margin`` at
    ``alpha`` when each unit's difference is Normal(effect, sd), by simulation as for
    sign_flip_power; 0 where 1/2^n >= alpha (neither one-sided test can reach it)."""

    def rejects(d):  # tost_p of each row: the larger of its two one-sided p's
        p = np.maximum(sign_flip_p_many(d, ">", -margin), sign_flip_p_many(d, "<", margin))
        return p < alpha

    return _simulated_power(n, effect, sd, alpha, simulations, seed, rejects)
