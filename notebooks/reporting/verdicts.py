"""A claim notebook's verdict, decided by its entry in the claims registry (gspo_jax.claims,
gspo_jax/claims/entries/<key>/v<version>.json), from per-seed numbers; and the per-seed
statistics the entries name. Replaces analysis.outcome, which called a claim "partly
reproduced" as soon as any check held.

    from reporting import analysis as an

    from reporting import verdicts as vd
    arms = an.by_arm(an.load_runs(...))
    vd.claim_verdict(
        "clip_fraction_vs_eps",
        {a: vd.per_seed(arms.get(a, []), vd.auc) for a in ("gspo", "grpo_nokl")},
        preconditions={"GSPO clipping (>= 5 % of tokens)": vd.per_seed(arms["gspo"], clip)},
        secondary={"clip ratio": "805x"},
    )

prints the entry (its "primary criterion", preconditions and secondary checks), the versions it
supersedes with their reasons, the secondary checks' numbers (labelled as such: they never change
the outcome), and exactly one line ``VERDICT: <outcome>: <numbers>``. Outcomes: "reproduced",
"not reproduced", "inconclusive: <precondition> absent". Nothing here trains.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gspo_jax import claims
from reporting import analysis

# "reproduced", "not reproduced" or "inconclusive: <precondition> absent", then ": <numbers>"
VERDICT_LINE = re.compile(r"^VERDICT: (reproduced|not reproduced|inconclusive: .+? absent): .+")


def registry():
    """The claims registry (the gspo_jax.claims package: its entries, evaluate, describe and
    the statistics), checked once for its own consistency."""
    claims.check()
    return claims


def entry(key: str, version: int | None = None):
    """The registry's current (newest) entry for the claim ``key``, or its ``version``."""
    versions = registry().entries(key)
    if version is None:
        return versions[-1]
    found = [e for e in versions if e.version == version]
    if not found:
        raise ValueError(f"{key} has no v{version}; its versions: {[e.version for e in versions]}")
    return found[0]


def outcome_of(line: str) -> str:
    """The outcome of a ``VERDICT:`` line; ValueError when the line is not one of the three."""
    m = VERDICT_LINE.match(line)
    if not m:
        raise ValueError(
            f"{line!r} is not 'VERDICT: <reproduced | not reproduced | inconclusive: <x> "
            "absent>: <numbers>'; print verdicts with verdicts.claim_verdict"
        )
    return m[1]


def claim_verdict(
    key: str,
    values: Mapping[str, Mapping[int, float]],
    preconditions: Mapping[str, Mapping[int, float]] | None = None,
    secondary: Mapping[str, Any] | None = None,
    superseded: Mapping[int, Mapping[str, Mapping[int, float]]] | None = None,
    version: int | None = None,
) -> str:
    """Prints the claim's registry entry, its secondary checks and its one VERDICT line (the
    newest entry's primary criterion on ``values`` {arm: {seed: statistic}}), and returns the line.

    ``preconditions``: {precondition name: {seed: statistic}}; ``secondary``: {name: value},
    printed only; ``superseded``: {old version: values} for the entries the current one replaced,
    whose outcome on these runs is printed (not as a verdict) next to the reason it was replaced.
    ``version``: the entry these runs were made for, where a newer one (round 3's, on other runs
    and with its own notebook) has replaced it: the verdict is that entry's, and the newer entries
    are named with their reason."""
    reg = registry()
    versions = reg.entries(key)
    decided = entry(key, version)
    for line in reg.describe(decided):
        print(line)
    for newer in (e for e in versions if e.version > decided.version):
        print(f"superseded by {newer.name} ({newer.notebook}): {newer.reason}")
    for old in (e for e in versions if e.version < decided.version):
        # the entry that replaced it (registry.check: every later entry names the one it replaces)
        by = next((e for e in versions if e.supersedes == old.version), decided)
        print(
            f"superseded entry {old.name} (replaced by v{by.version} because: {by.reason}): "
            f"primary criterion was {old.primary.statistic}"
        )
        if superseded and old.version in superseded:
            r = reg.evaluate(old, superseded[old.version], preconditions)
            print(f"    superseded entry {old.name} on these runs (not the verdict): {r.outcome}")
    for name, value in (secondary or {}).items():
        print(f"secondary check (does not change the outcome): {name}: {fmt(value)}")
    result = reg.evaluate(decided, values, preconditions)
    line = f"VERDICT: {result.outcome}: {result.numbers}"
    outcome_of(line)  # the line's own format, checked where it is made
    print(line)
    return line


def family_verdicts(
    family: str,
    inputs: Mapping[str, tuple],
    entries: Sequence[Any] | None = None,
    keys: Sequence[str] | None = None,
) -> dict[str, str]:
    """The VERDICT lines of every entry of ``family`` (round 3: Holm's correction over the
    family, claims.evaluate_family): ``inputs`` {key: (values, preconditions, draw_of)}, as for
    claims.evaluate (values {arm: {seed: statistic}}, draw_of {seed: warm-start draw}; default a
    seed is its own draw); ``entries`` the family's (default: the registry's). Prints each
    entry's description, then its line with the raw and the Holm-adjusted p (the verdict is
    decided on the adjusted one); returns {key: line}. An entry given no inputs counts with
    p = 1 and comes out "inconclusive", as does each design still drafted: the family's size is
    fixed by its designs (claims.family_designs). ``keys``: print and return only these entries'
    lines (a notebook deciding one entry of the family; the correction still spans all)."""
    reg = registry()
    results = reg.evaluate_family(family, inputs, entries)
    by_key = {e.key: e for e in (entries if entries is not None else reg.family_entries(family))}
    unknown = sorted(set(keys or ()) - set(results))
    if unknown:
        raise ValueError(f"{unknown} are not registered entries of {family!r}: {sorted(results)}")
    lines = {}
    for key, result in results.items():
        if keys is not None and key not in keys:
            continue
        for line in reg.describe(by_key[key]):
            print(line)
        line = f"VERDICT: {result.outcome}: {result.numbers}"
        outcome_of(line)
        print(line)
        lines[key] = line
    return lines


def draw_bands(
    ax,
    arms: Mapping[str, Sequence[analysis.RunData]],
    key: str,
    draw_of: Mapping[int, int] | None = None,
    **line_kw,
) -> None:
    """One line per arm: the mean over warm-start draws of ``key`` per step, each draw the mean
    of its seeds (``draw_of`` {seed: draw}; default a seed is its own draw), with the band from
    the lowest to the highest draw: the spread a round-3 verdict is decided over."""
    for label, runs in arms.items():
        steps, values = analysis.stacked(runs, key)  # [n_runs, N]
        draws = [(draw_of or {}).get(r.seed, r.seed) for r in runs]
        per_draw = np.stack([values[[d == u for u in draws]].mean(0) for d in sorted(set(draws))])
        n = len(per_draw)
        (line,) = ax.plot(steps, per_draw.mean(0), label=f"{label} ({n} draws)", **line_kw)
        if n > 1:
            ax.fill_between(
                steps, per_draw.min(0), per_draw.max(0), color=line.get_color(), alpha=0.2
            )
    ax.set_xlabel("RL step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)


def fmt(value: Any) -> str:
    """A secondary check's value: per-seed numbers as "s0 0.123, s1 ...", floats to 3 digits."""
    if isinstance(value, Mapping):
        return (
            ", ".join(
                f"s{k} {fmt(v)}" if isinstance(k, int) else f"{k} {fmt(v)}"
                for k, v in value.items()
            )
            or "none"
        )
    if isinstance(value, float | np.floating):
        return f"{value:.3g}"
    return str(bool(value)) if isinstance(value, np.bool_) else str(value)


def diff(a: Mapping[int, float], b: Mapping[int, float]) -> dict[int, float]:
    """{seed: a - b} over the seeds both have (paired by seed)."""
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def seed_mean(per_seed_values: Mapping[int, float]) -> float:
    """The mean over seeds of the finite values (NaN when none)."""
    v = np.asarray([x for x in per_seed_values.values() if np.isfinite(x)], dtype=np.float64)
    return float(v.mean()) if v.size else float("nan")


def tuned(per_arm: Mapping[str, Mapping[int, float]], grid: Sequence[str]) -> str | None:
    """The registry's ``tuned(...)`` arm: of ``grid`` (one arm's learning rates, smallest rate
    first) the arm with the highest mean over seeds (seed_mean; ties: the smaller rate), or None
    when no arm of the grid has a value. Every arm of a claim is tuned the same way."""
    means = [(seed_mean(per_arm.get(a, {})), a) for a in grid]
    means = [(m, a) for m, a in means if np.isfinite(m)]
    return max(means, key=lambda ma: ma[0])[1] if means else None  # max keeps the first of ties


# --- per-seed statistics the registry's entries name ---------------------------------------------


def per_seed(runs: Sequence[analysis.RunData], fn: Callable[[analysis.RunData], float]):
    """{seed: fn(run)} over an arm's runs; a run that never logged what ``fn`` reads gives NaN
    (the registry drops it from the pairs)."""
    out = {}
    for r in runs:
        try:
            out[r.seed] = float(fn(r))
        except (KeyError, ValueError):
            out[r.seed] = float("nan")
    return out


def auc(run: analysis.RunData, key: str = "rollout/correct") -> float:
    """Learning speed: the mean of a per-step training curve over every RL step (the area under
    it per step)."""
    return analysis.run_mean(run, key)


def switch_step(run: analysis.RunData, key: str = "rollout/worked", level: float = 0.5) -> float:
    """The first step at which ``key`` reaches ``level`` (arith: the worked format's share of
    the rollouts), NaN when it never does."""
    steps, v = analysis.series(run, key)
    hit = np.flatnonzero(v >= level)
    return float(steps[hit[0]]) if hit.size else float("nan")


def window_change(run: analysis.RunData, key: str, last: int = 10, first: int = 5) -> float:
    """The mean of ``key`` over the run's last ``last`` steps minus over its first ``first``
    (steps logging NaN skipped: rollout/len_wrong_mean is NaN when no response was wrong)."""
    _, v = analysis.series(run, key)
    with warnings.catch_warnings():  # an all-NaN window is NaN, said once by the verdict
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(v[-last:]) - np.nanmean(v[:first]))


def second_half_mean(run: analysis.RunData, key: str) -> float:
    steps, v = analysis.series(run, key)
    return float(v[steps > steps.max() / 2].mean())


def max_abs_log_ratio(run: analysis.RunData, prefix: str = "train/ratio_") -> float:
    """The mean over steps of max(log ratio_max, -log ratio_min): the per-step largest |log w|
    (``prefix`` "train/token_ratio_" for GMPO's token ratios under its geometric mean)."""
    _, hi = analysis.series(run, prefix + "max")
    _, lo = analysis.series(run, prefix + "min")
    return float(np.mean(np.maximum(np.log(hi), -np.log(lo))))


def relative_drop(run: analysis.RunData, key: str, last: int = 10, first: int = 5) -> float:
    """1 - (mean of ``key`` over the run's last ``last`` steps) / (mean over its first
    ``first``): the share of its starting value the run lost (entropy collapse: 0.5 = half)."""
    _, v = analysis.series(run, key)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(1.0 - np.nanmean(v[-last:]) / np.nanmean(v[:first]))


def median_over_steps(run: analysis.RunData, key: str) -> float:
    """The median of ``key`` over the run's steps: a per-step statistic whose mean a few heavy
    steps would carry (the k3 KL estimate)."""
    return float(np.median(analysis.series(run, key)[1]))


def diverged(run: analysis.RunData) -> bool:
    """Whether the run diverged: a population member frozen at a non-finite loss, gradient or
    parameter (summary's ``frozen_at_step``), or a single run whose loss went non-finite."""
    if run.summary and run.summary.get("frozen_at_step") is not None:
        return True
    try:
        return not bool(np.all(np.isfinite(analysis.series(run, "train/loss")[1])))
    except KeyError:
        return False


def unless_diverged(fn: Callable[[analysis.RunData], float]) -> Callable[[analysis.RunData], float]:
    """``fn`` of the run, NaN for a run that diverged (diverged): a frozen member keeps its last
    finite parameters and so a finite accuracy, which a stability criterion must not count as
    the run's; the registry counts NaN as the criterion's ``diverged`` value."""
    return lambda run: float("nan") if diverged(run) else fn(run)


def trend(doses: Sequence[float], per_dose: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """{seed: the least-squares slope of the seed's values against ``doses``}, over the seeds
    with a finite value at every dose (``per_dose[i]``: {seed: value} at doses[i])."""
    x = np.asarray(doses, dtype=np.float64)
    seeds = sorted(set.intersection(*(set(_finite_items(d)) for d in per_dose)))
    return {s: float(np.polyfit(x, [d[s] for d in per_dose], 1)[0]) for s in seeds}


def _finite_items(per_seed: Mapping[int, float]) -> dict[int, float]:
    return {s: v for s, v in per_seed.items() if v is not None and np.isfinite(v)}
