"""Group-relative advantages (no critic): each response is scored against its own group.

Dimension legend: P prompts, G = group_size samples per prompt, B = P·G response rows,
group-contiguous (row b belongs to prompt b // G).

  grpo     A_i = (r_i − mean_g r) / (std_g r + eps)   population std by default (std_ddof=0);
                                                      verl/TRL use std_ddof=1, TRL eps=1e-4
  dr_grpo  A_i = r_i − mean_g r                       (Dr. GRPO drops the std: a 0.1 reward gap
                                                      would otherwise get the same signal as the
                                                      only correct answer in the group)
  rloo     A_i = r_i − mean_{j≠i} r_j

A group whose rewards are all equal (max == min, tested exactly) gets A = 0 exactly, never NaN and
never the rounding residue of r − mean: such groups carry no learning signal, and their fraction is
returned as the metric "frac_zero_std_groups".

    adv, adv_metrics = group_advantages(rewards, group_size)   # a GroupAdvantages NamedTuple
    adv_metrics = {"frac_zero_std_groups": ..., "reward_mean": ..., "reward_std": ...}
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

ESTIMATORS = ("grpo", "dr_grpo", "rloo")


class GroupAdvantages(NamedTuple):
    """Unpacks as (adv, metrics)."""

    adv: jax.Array  # [B] float32
    metrics: dict  # str -> float32 scalar: frac_zero_std_groups, reward_mean, reward_std


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    estimator: str = "grpo",
    eps: float = 1e-6,
    std_ddof: int = 0,
) -> GroupAdvantages:
    """Advantages [B] of group-contiguous rewards [B], and the group metrics.

    metrics: frac_zero_std_groups (fraction of groups with all-equal rewards), reward_mean (over
    all rows) and reward_std (mean over groups of the within-group std, with std_ddof).
    Jittable with group_size, estimator, eps and std_ddof static.
    """
    _validate(rewards, group_size, estimator, eps, std_ddof)
    r = jnp.asarray(rewards)
    r = r.astype(jnp.promote_types(r.dtype, jnp.float32)).reshape(-1, group_size)  # [P, G], ≥ f32
    mean = r.mean(-1, keepdims=True)  # [P, 1]
    std = r.std(-1, ddof=std_ddof, keepdims=True)  # [P, 1]
    flat = r.max(-1, keepdims=True) == r.min(-1, keepdims=True)  # [P, 1] all rewards equal

    if estimator == "grpo":
        adv = (r - mean) / (std + eps)
    elif estimator == "dr_grpo":
        adv = r - mean
    else:  # rloo: the baseline is the mean of the other G − 1 samples
        adv = r - (r.sum(-1, keepdims=True) - r) / (group_size - 1)
    adv = jnp.where(flat, 0.0, adv).reshape(-1)  # [B]
    chex.assert_shape(adv, (r.size,))

    metrics = {
        "frac_zero_std_groups": flat.mean(dtype=jnp.float32),
        "reward_mean": r.mean(),
        "reward_std": std.mean(),
    }
    return GroupAdvantages(adv, metrics)


def _validate(rewards, group_size, estimator, eps, std_ddof) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {ESTIMATORS}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 2, got {group_size!r}")
    if group_size == 1:
        raise ValueError(
            f"group_size=1 leaves {estimator!r} without a baseline: a group-relative advantage "
            "compares each response with the other samples of its prompt (the std of one sample "
            "is undefined, and rloo has no other sample to leave in). Sample G >= 2 responses "
            "per prompt (num_samples / group_size >= 2)."
        )
    shape = getattr(rewards, "shape", None)
    if shape is None or len(shape) != 1:
        raise ValueError(
            f"rewards must be a 1-D [B] array (group-contiguous, B = P * G), got shape {shape}; "
            "flatten a [P, G] array with .reshape(-1)"
        )
    if shape[0] % group_size:
        raise ValueError(
            f"rewards has {shape[0]} rows, not a multiple of group_size={group_size}: pass whole "
            "groups (B = P * group_size rows, row b belonging to prompt b // group_size)"
        )
    if not isinstance(eps, int | float) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0 (default 1e-6), got {eps!r}")
    if std_ddof not in (0, 1) or isinstance(std_ddof, bool):
        raise ValueError(
            f"std_ddof must be 0 (population std, the default) or 1 (Bessel, as verl/TRL), "
            f"got {std_ddof!r}"
        )
