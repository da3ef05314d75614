"""Round 3's statistics (issue 52): what each testbed entry's primary criterion, mechanism
preconditions and harm read from a run, as the entries word them
(gspo_jax/claims/entries/<key>/draft.json or v<N>.json), one definition per entry.

Both the entries' notebooks and the precondition pilot (experiments/round3_pilot.py) compute
them here, so a threshold calibrated on the pilot's draws is applied to the very statistic the
verdict reads.

    values, preconditions = round3.inputs(entry, arms)   # arms: {arm: [RunData]}, analysis.by_arm
    verdicts.family_verdicts(FAMILY, family_inputs(runs), keys=[key])   # Holm over the family

A primary arm written ``pair(a - b, c - d)`` is, per seed, (f(a) - f(b)) - (f(c) - f(d)), with
f the entry's per-run statistic (staleness_dose: the accuracy GSPO keeps at staleness 4 minus the
accuracy GRPO keeps).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from . import analysis
from . import verdicts as vd

PerRun = Callable[[analysis.RunData], float]

FAMILY = "testbed_round3"  # the entries decided on the testbed, Holm's correction over them

FINAL_EVALUATIONS = 3  # "final accuracy": the mean of the last 3 held-out evaluations
# length windows, as shares of a run's steps: "the last 10 % of steps minus the first 5 %"
LAST_SHARE, FIRST_SHARE = 0.10, 0.05


def final_accuracy(run: analysis.RunData) -> float:
    """The mean held-out greedy accuracy of the run's last FINAL_EVALUATIONS evaluations: one
    evaluation of 200 problems moves by ~0.03 from noise alone, three by ~0.02."""
    _, v = analysis.series(run, "eval/greedy_accuracy")
    return float(np.mean(v[-FINAL_EVALUATIONS:]))


def best_minus_final(run: analysis.RunData) -> float:
    """How far the run fell from its best held-out evaluation (a degrading run's harm)."""
    _, v = analysis.series(run, "eval/greedy_accuracy")
    return float(np.max(v) - final_accuracy(run))


def mean_over_steps(key: str) -> PerRun:
    return lambda run: analysis.run_mean(run, key)


def share_change(key: str) -> PerRun:
    """The mean of ``key`` over the last LAST_SHARE of the run's steps minus over the first
    FIRST_SHARE (steps logging NaN skipped)."""

    def change(run: analysis.RunData) -> float:
        steps, _ = analysis.series(run, key)
        n = len(steps)
        last, first = max(1, round(LAST_SHARE * n)), max(1, round(FIRST_SHARE * n))
        return vd.window_change(run, key, last=last, first=first)

    return change


def largest_log_w(run: analysis.RunData) -> float:
    """The per-step largest |log w| over the tokens, its mean over steps: GRPO's train/ratio_*
    are its token ratios; GMPO's are train/token_ratio_* (its train/ratio_* are per response)."""
    gmpo = run.config.get("objective", {}).get("name") == "gmpo"
    return vd.max_abs_log_ratio(run, "train/token_ratio_" if gmpo else "train/ratio_")


def entropy_second_half(run: analysis.RunData) -> float:
    return vd.second_half_mean(run, "train/entropy")


def entropy_lost(run: analysis.RunData) -> float:
    """1 - the mean entropy over the last 10 steps / over the first 5."""
    return vd.relative_drop(run, "train/entropy", last=10, first=5)


def wrong_share(run: analysis.RunData) -> float:
    return 1.0 - analysis.run_mean(run, "rollout/correct")


_LENGTH_CHANGE = share_change("rollout/response_len_mean")


@dataclasses.dataclass(frozen=True)
class Statistics:
    """An entry's statistics: ``primary`` on each primary arm's runs (a pair's arms: module
    docstring); ``preconditions`` in the entry's order, each on its precondition's arm;
    ``harm`` on the harm's arm, or with ``harm_from`` the per-seed harm(harm_from's run) minus
    harm(the harm arm's run) (staleness: accuracy at k = 0 minus at k = 4)."""

    primary: PerRun
    preconditions: tuple[PerRun, ...]
    harm: PerRun | None = None
    harm_from: str | None = None


_FINAL = vd.unless_diverged(final_accuracy)  # a diverged run: the criterion's "diverged" value
_CLIP = mean_over_steps("train/clip_frac")  # token-level objectives: the share of tokens clipped
# sequence-level ones (GSPO): the share of responses clipped, each response once whatever its
# length (their train/clip_frac weighs a clipped response by its tokens)
_SEQ_CLIP = mean_over_steps("train/seq_clip_frac")

STATISTICS: dict[str, Statistics] = {
    "gspo_minibatch_stability": Statistics(_FINAL, (_CLIP,), best_minus_final),
    "moe_routing_replay": Statistics(
        _FINAL, (mean_over_steps("train/route_change_frac"),), best_minus_final
    ),
    "gspo_length_normalisation": Statistics(_FINAL, (_SEQ_CLIP,), best_minus_final),
    "luspo_length": Statistics(
        _LENGTH_CHANGE,
        (mean_over_steps("rollout/len_std"),),
        lambda run: -_LENGTH_CHANGE(run),  # the tokens GSPO loses
    ),
    "gmpo_ratio_range": Statistics(largest_log_w, (_CLIP,)),
    "gmpo_entropy": Statistics(entropy_second_half, (_CLIP,), entropy_lost),
    "dapo_clip_higher_entropy": Statistics(
        entropy_second_half, (mean_over_steps("train/clip_frac_high"),), entropy_lost
    ),
    "drgrpo_length_bias": Statistics(share_change("rollout/len_wrong_mean"), (wrong_share,)),
    "seq_ratio_eps02": Statistics(_SEQ_CLIP, (_SEQ_CLIP, _CLIP)),
    "staleness_dose": Statistics(final_accuracy, (_CLIP,), final_accuracy, "grpo_nokl"),
}

_PAIR = re.compile(r"pair\((\S+) - (\S+), (\S+) - (\S+)\)")


def arm_values(
    arm: str, fn: PerRun, arms: Mapping[str, Sequence[analysis.RunData]]
) -> dict[int, float]:
    """{seed: statistic} of one primary arm: ``fn`` on the arm's runs, or a pair's difference of
    differences over the seeds all four arms ran (module docstring)."""
    m = _PAIR.fullmatch(arm)
    if not m:
        return vd.per_seed(arms.get(arm, []), fn)
    a, b, c, d = (vd.per_seed(arms.get(x, []), fn) for x in m.groups())
    seeds = set(a) & set(b) & set(c) & set(d)
    return {s: (a[s] - b[s]) - (c[s] - d[s]) for s in sorted(seeds)}


def inputs(entry, arms: Mapping[str, Sequence[analysis.RunData]]) -> tuple[dict, dict]:
    """(values {arm: {seed: statistic}}, preconditions {name: {seed: statistic}}, the harm
    among them) for claims.evaluate / verdicts.family_verdicts, from ``arms`` {arm: runs}."""
    stats = STATISTICS[entry.key]
    if (stats.harm is None) != (entry.harm is None) or len(stats.preconditions) != len(
        entry.preconditions
    ):
        raise ValueError(
            f"{entry.name} has {len(entry.preconditions)} preconditions and "
            f"{'a' if entry.harm else 'no'} harm; round3.STATISTICS {len(stats.preconditions)} "
            f"and {'a' if stats.harm else 'no'} harm: define one statistic for each"
        )
    values = {a: arm_values(a, stats.primary, arms) for a in entry.primary.arms}
    pre = {
        p.name: vd.per_seed(arms.get(p.arm, []), fn)
        for p, fn in zip(entry.preconditions, stats.preconditions, strict=True)
    }
    if entry.harm is not None:
        harm = vd.per_seed(arms.get(entry.harm.arm, []), stats.harm)
        if stats.harm_from is not None:
            base = vd.per_seed(arms.get(stats.harm_from, []), stats.harm)
            harm = {s: base[s] - harm[s] for s in sorted(set(base) & set(harm))}
        pre[entry.harm.name] = harm
    return values, pre


def entry_arms(entry, runs: str) -> dict[str, list[analysis.RunData]]:
    """{arm: runs} of ``entry``'s sweeps under ``runs`` (<runs>/<sweep>: records or run folders;
    a sweep with none yet adds nothing)."""
    found: dict[str, analysis.RunData] = {}
    for sweep in entry.sweeps:
        folder = os.path.join(runs, sweep)
        if os.path.isdir(folder) and os.listdir(folder):
            try:
                found.update(analysis.load_runs(folder))
            except FileNotFoundError as e:
                if "no runs matching" not in str(e):
                    raise  # an unfinished run: said, not skipped
    return analysis.by_arm(found)


def family_inputs(runs: str, family: str = FAMILY) -> dict[str, tuple]:
    """{key: (values, preconditions)} of every registered entry of ``family`` whose sweeps have
    runs under ``runs``, for verdicts.family_verdicts: each entry's own notebook decides it with
    Holm's correction over all of them (an entry without runs counts with p = 1). A seed is its
    own draw (round 3 runs one seed per draw, seed = draw)."""
    from gspo_jax import claims

    out = {}
    for entry in claims.family_entries(family):
        arms = entry_arms(entry, runs)
        if arms:
            out[entry.key] = inputs(entry, arms)
    return out
