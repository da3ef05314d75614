r"""The figures papers report for a policy on a set of problems, from per-problem results.

    values = eval_figures.per_problem(greedy_correct, sample_correct, ks=(1, 4, 16),
                                      greedy_length=gl, sample_length=sl)   # name -> [P]
    figures = eval_figures.aggregate(values)               # name -> float
    ci = eval_figures.intervals(values)                    # name -> (low, high), 95 %
    rows = eval_figures.by_level(values, levels)           # level -> (figures, intervals, count)
    diff = eval_figures.paired(values_a, values_b)         # name -> (b - a, low, high)

The figures, as the papers of the family define them (P problems, n samples per problem, c_p of
problem p's samples correct):

* greedy_accuracy: the share of problems whose greedy (temperature 0) response is correct.
* avg@n: mean correctness over the n samples of each problem, averaged over problems (DAPO's
  AIME avg@32; NeMo-RL's "pass@1 averaged over 16 samples").
* pass@k (k <= n): the unbiased estimator of Chen et al. (2021), 1 - C(n - c, k) / C(n, k) per
  problem, averaged: the chance that k samples drawn without replacement from the n hold a
  correct one. pass@1 equals avg@n; pass@n is the share of problems with any correct sample (the
  plug-in estimate the in-run evaluation reported before it used this estimator; they agree
  there). Computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i): no binomial coefficient is formed,
  so nothing overflows or loses precision for large n.
* length_mean / length_std: mean and spread (population standard deviation) of the sampled
  responses' lengths in tokens (eos included); greedy_length_mean of the greedy responses.

Intervals: the percentile bootstrap over problems (resample the P problems with replacement,
recompute the figure; 1000 resamples by default): the uncertainty a reader comparing two numbers
on the same benchmark needs, since the problems are the sample. A paired comparison of two
policies resamples the same problems for both, which is what makes a small difference on the
same problems resolvable.

Every figure is a mean over problems of a per-problem value (length_std is derived from the
per-problem means of length and length squared), so one weighted mean computes the figure, its
bootstrap replicates and each difficulty's row alike. rl/evaluation.py (the trainer's in-run
evaluation) and the gspo_jax.evaluate command compute theirs here, so they never disagree.

Dimension legend: P problems, n samples per problem, R bootstrap resamples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Per-problem helper values that are not figures themselves (length_std's second moment).
_LENGTH_SQ = "_length_sq"
DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95


def pass_at_k(n: int, c: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k of each problem from n samples of which c [P] are correct: 1 -
    C(n - c, k) / C(n, k), as 1 - prod_{i = n - c + 1}^{n} (1 - k / i). Returns float64 [P]."""
    c = np.asarray(c, np.int64)
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n = {n} samples; draw more samples or lower k.")
    if c.size and (c.min() < 0 or c.max() > n):
        raise ValueError(f"correct counts must be in [0, n = {n}]; got {c.min()}..{c.max()}.")
    out = np.ones(c.shape, np.float64)
    for p, cp in np.ndenumerate(c):
        if n - cp >= k:  # otherwise every k-subset holds a correct sample: pass@k = 1
            out[p] = 1.0 - np.prod(1.0 - k / np.arange(n - cp + 1, n + 1, dtype=np.float64))
    return out


def per_problem(
    greedy_correct: np.ndarray | None,  # [P] 0/1, or None (no greedy pass)
    sample_correct: np.ndarray | None,  # [P, n] 0/1, or None (no samples)
    ks: Sequence[int] = (),
    *,
    greedy_length: np.ndarray | None = None,  # [P] tokens
    sample_length: np.ndarray | None = None,  # [P, n] tokens
) -> dict[str, np.ndarray]:
    """Each figure's per-problem value (name -> float64 [P]); a figure is their mean."""
    out: dict[str, np.ndarray] = {}
    if greedy_correct is not None:
        out["greedy_accuracy"] = np.asarray(greedy_correct, np.float64).reshape(-1)
    if greedy_length is not None:
        out["greedy_length_mean"] = np.asarray(greedy_length, np.float64).reshape(-1)
    if sample_correct is not None:
        sc = np.asarray(sample_correct, np.float64)
        if sc.ndim != 2:
            raise ValueError(f"sample_correct must be [P, n]; got shape {sc.shape}.")
        n = sc.shape[1]
        out[f"avg@{n}"] = sc.mean(-1)
        c = np.rint(sc.sum(-1)).astype(np.int64)
        for k in ks:
            out[f"pass@{k}"] = pass_at_k(n, c, k)
    if sample_length is not None:
        sl = np.asarray(sample_length, np.float64)
        out["length_mean"] = sl.mean(-1)
        out[_LENGTH_SQ] = (sl**2).mean(-1)
    sizes = {v.shape[0] for v in out.values()}
    if len(sizes) > 1:
        raise ValueError(f"per-problem arrays disagree on the number of problems: {sizes}.")
    return out


def _weighted(values: Mapping[str, np.ndarray], w: np.ndarray) -> dict[str, np.ndarray]:
    """Every figure under problem weights w [..., P] (summing to 1 along P): [...] each."""
    means = {k: w @ v for k, v in values.items()}
    if _LENGTH_SQ in means:
        var = means.pop(_LENGTH_SQ) - means["length_mean"] ** 2
        means["length_std"] = np.sqrt(np.maximum(var, 0.0))
    return means


def aggregate(values: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The figures (name -> float) of per-problem values: their means over problems."""
    P = _num_problems(values)
    return {k: float(v) for k, v in _weighted(values, np.full(P, 1.0 / P)).items()}


def _num_problems(values: Mapping[str, np.ndarray]) -> int:
    P = len(next(iter(values.values())))
    if P < 1:
        raise ValueError("no problems to compute figures over.")
    return P


def resample_weights(P: int, num_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """[R, P] bootstrap weights: row r holds how often each problem was drawn in resample r, / P."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, P, size=(num_resamples, P))
    counts = np.zeros((num_resamples, P))
    np.add.at(counts, (np.arange(num_resamples)[:, None], idx), 1.0)
    return counts / P


def _percentiles(replicates: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(replicates, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def intervals(
    values: Mapping[str, np.ndarray],
    *,
    level: float = DEFAULT_LEVEL,
    num_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """Percentile-bootstrap interval over problems of every figure: name -> (low, high)."""
    w = resample_weights(_num_problems(values), num_resamples, seed)
    return {k: _percentiles(r, level) for k, r in _weighted(values, w).items()}


def by_level(
    values: Mapping[str, np.ndarray],
    levels: Sequence,  # [P] each problem's difficulty (task.difficulty)
    **interval_args,
) -> dict[str, dict]:
    """One row per difficulty level, in the levels' order: level -> {"num_problems", "figures",
    "intervals"}. Empty when every problem has the same level (nothing to break down)."""
    levels = np.asarray(levels)
    names = sorted(set(levels.tolist()), key=lambda x: (len(str(x)), str(x)))
    if len(names) < 2:
        return {}
    rows = {}
    for name in names:
        sel = levels == name
        sub = {k: v[sel] for k, v in values.items()}
        rows[str(name)] = dict(
            num_problems=int(sel.sum()),
            figures=aggregate(sub),
            intervals=intervals(sub, **interval_args),
        )
    return rows


def paired(
    values_a: Mapping[str, np.ndarray],
    values_b: Mapping[str, np.ndarray],
    *,
    level: float = DEFAULT_LEVEL,
    num_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, tuple[float, float, float]]:
    """b minus a on the same problems, per figure both have: name -> (difference, low, high), the
    interval from one bootstrap that resamples the same problems for both."""
    P = _num_problems(values_a)
    if _num_problems(values_b) != P:
        raise ValueError(
            f"a paired comparison needs the same problems: {P} against {_num_problems(values_b)}."
        )
    common = [k for k in values_a if k in values_b]
    a = {k: values_a[k] for k in common}
    b = {k: values_b[k] for k in common}
    w = resample_weights(P, num_resamples, seed)
    ra, rb = _weighted(a, w), _weighted(b, w)
    fa, fb = aggregate(a), aggregate(b)
    return {k: (fb[k] - fa[k], *_percentiles(rb[k] - ra[k], level)) for k in fa}
