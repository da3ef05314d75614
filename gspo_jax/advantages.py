"""Critic-free advantages: each response is scored against its own group, or (REINFORCE++)
against the batch.

Dimension legend: P prompts, G = group_size samples per prompt, B = P·G response rows,
group-contiguous (row b belongs to prompt b // G), T padded response length.

Group estimators, one advantage per response [B], from the rewards r_i (a [B, T] token reward is
summed over the response first, as verl does):

  grpo     A_i = (r_i − mean_g r) / (σ + eps)      σ by scale_rewards: "group" std_g r (default),
                                                   "batch" the std of all B rewards (LitePPO; TRL
                                                   scale_rewards="batch"), "none" 1 (no division;
                                                   = dr_grpo). Population std by default
                                                   (std_ddof=0); verl/TRL use std_ddof=1, TRL
                                                   eps=1e-4
  dr_grpo  A_i = r_i − mean_g r                    (Dr. GRPO drops the std: a 0.1 reward gap
                                                   would otherwise get the same signal as the
                                                   only correct answer in the group)
  rloo     A_i = r_i − mean_{j≠i} r_j

A group whose rewards are all equal (max == min, tested exactly) gets A = 0 exactly from these,
never NaN and never the rounding residue of r − mean: such groups carry no learning signal, and
their fraction is returned as the metric "frac_zero_std_groups".

Token estimators (REINFORCE++, verl's reinforce_plus_plus / reinforce_plus_plus_baseline), one
advantage per token [B, T]; they take mask [B, T] and whiten over the batch's response tokens,
whiten(x) = (x − mean) / sqrt(var + 1e-8) with the masked mean and the Bessel-corrected masked
variance over all tokens of the call (so a flat group is not 0 here; it follows verl):

  reinforce_pp           A_{i,t} = whiten(G_{i,t}),  G_{i,t} = Σ_{s ≥ t} r_{i,s} (γ = 1, verl's
                         default; an outcome reward r_i sits on the response's last token, so
                         G_{i,t} = r_i)
  reinforce_pp_baseline  A_{i,t} = whiten(r_i − mean_g r) on every token of response i

    adv, adv_metrics = group_advantages(rewards, group_size)   # a GroupAdvantages NamedTuple
    adv, _ = group_advantages(rewards, G, "reinforce_pp", mask=mask)   # adv [B, T]
    adv_metrics = {"frac_zero_std_groups": ..., "reward_mean": ..., "reward_std": ...}

The batch std and the REINFORCE++ whitening are statistics of the rows of one call: the trainer
calls this once per rollout batch, before any minibatch split.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")  # one advantage per response [B]
TOKEN_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")  # one per token [B, T]
ESTIMATORS = GROUP_ESTIMATORS + TOKEN_ESTIMATORS
SCALE_REWARDS = ("group", "batch", "none")
WHITEN_EPS = 1e-8  # verl's masked_whiten


class GroupAdvantages(NamedTuple):
    """Unpacks as (adv, metrics)."""

    adv: jax.Array  # [B] float32 (group estimators) or [B, T] (token estimators)
    metrics: dict  # str -> float32 scalar: frac_zero_std_groups, reward_mean, reward_std


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    estimator: str = "grpo",
    eps: float = 1e-6,
    std_ddof: int = 0,
    *,
    scale_rewards: str = "group",
    mask: jax.Array | None = None,
) -> GroupAdvantages:
    """Advantages ([B], or [B, T] for TOKEN_ESTIMATORS) of group-contiguous rewards, and metrics.

    rewards: [B] one per response, or [B, T] per token (needs mask; group estimators sum it over
    the response). mask [B, T] 0/1: the response tokens (needed by the token estimators).
    metrics: frac_zero_std_groups (fraction of groups with all-equal rewards), reward_mean (over
    all rows) and reward_std (mean over groups of the within-group std, with std_ddof).
    Jittable with group_size, estimator, eps, std_ddof and scale_rewards static.
    """
    _validate(rewards, group_size, estimator, eps, std_ddof, scale_rewards, mask)
    r = jnp.asarray(rewards)
    r = r.astype(jnp.promote_types(r.dtype, jnp.float32))  # ≥ f32
    if mask is not None:
        mask = jnp.asarray(mask).astype(r.dtype)
    token_rewards = r if r.ndim == 2 else None  # [B, T] or None
    if token_rewards is not None:
        r = (token_rewards * mask).sum(-1)  # [B] the response's total reward
    B = r.shape[0]
    g = r.reshape(-1, group_size)  # [P, G]
    mean = g.mean(-1, keepdims=True)  # [P, 1]
    std = g.std(-1, ddof=std_ddof, keepdims=True)  # [P, 1]
    flat = g.max(-1, keepdims=True) == g.min(-1, keepdims=True)  # [P, 1] all rewards equal

    if estimator in GROUP_ESTIMATORS:
        if estimator == "grpo":
            scale = {"group": std, "batch": r.std(ddof=std_ddof), "none": None}[scale_rewards]
            adv = g - mean if scale is None else (g - mean) / (scale + eps)
        elif estimator == "dr_grpo":
            adv = g - mean
        else:  # rloo: the baseline is the mean of the other G − 1 samples
            adv = g - (g.sum(-1, keepdims=True) - g) / (group_size - 1)
        adv = jnp.where(flat, 0.0, adv).reshape(-1)  # [B]
        chex.assert_shape(adv, (B,))
    else:
        if estimator == "reinforce_pp":
            if token_rewards is None:
                token_rewards = outcome_token_rewards(r, mask)
            returns = reverse_cumsum(token_rewards * mask)  # [B, T] G_{i,t}, γ = 1
        else:  # reinforce_pp_baseline
            returns = jnp.broadcast_to((g - mean).reshape(-1)[:, None], mask.shape)
        adv = masked_whiten(returns, mask) * mask  # [B, T]
        chex.assert_shape(adv, mask.shape)

    metrics = {
        "frac_zero_std_groups": flat.mean(dtype=jnp.float32),
        "reward_mean": r.mean(),
        "reward_std": std.mean(),
    }
    return GroupAdvantages(adv, metrics)


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """[B] rewards -> [B, T] token rewards: r_i on the last response token of row i, 0 elsewhere
    (verl's token_level_scores of an outcome reward). mask [B, T] 0/1, one contiguous response."""
    mask = jnp.asarray(mask)
    last = (reverse_cumsum(mask) == 1) & (mask > 0)  # [B, T]
    return jnp.where(last, jnp.asarray(rewards)[:, None], 0.0)


def reverse_cumsum(x: jax.Array) -> jax.Array:
    """[B, T] -> [B, T]: Σ_{s ≥ t} x_{i,s} (the undiscounted return from token t on)."""
    return jnp.cumsum(x[:, ::-1], axis=-1)[:, ::-1]


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """(x − mean) / sqrt(var + 1e-8) with the mean and the Bessel-corrected variance of x over
    the entries where mask is 1 (verl's masked_whiten); [B, T] -> [B, T]."""
    n = mask.sum()
    mean = (x * mask).sum() / (n + WHITEN_EPS)
    var = (jnp.square(x - mean) * mask).sum() / (n + WHITEN_EPS)
    var = var * n / jnp.maximum(n - 1.0, 1.0)  # Bessel; verl raises for n <= 1
    return (x - mean) * jax.lax.rsqrt(var + WHITEN_EPS)


def _validate(rewards, group_size, estimator, eps, std_ddof, scale_rewards, mask) -> None:
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
    if shape is None or len(shape) not in (1, 2):
        raise ValueError(
            f"rewards must be a 1-D [B] array (group-contiguous, B = P * G) or [B, T] token "
            f"rewards with mask=, got shape {shape}; flatten a [P, G] array with .reshape(-1)"
        )
    if len(shape) == 2 and mask is None:
        raise ValueError(
            f"rewards of shape {shape} are per token: pass mask=[B, T] (the response tokens), "
            "or [B] rewards (one per response; flatten a [P, G] array with .reshape(-1))"
        )
    if shape[0] % group_size:
        raise ValueError(
            f"rewards has {shape[0]} rows, not a multiple of group_size={group_size}: pass whole "
            "groups (B = P * group_size rows, row b belonging to prompt b // group_size)"
        )
    if estimator in TOKEN_ESTIMATORS and mask is None:
        raise ValueError(
            f"{estimator!r} gives one advantage per token, whitened over the response tokens: "
            "pass mask=[B, T] (1 on response tokens)"
        )
    if mask is not None:
        mshape = getattr(mask, "shape", None)
        if mshape is None or len(mshape) != 2 or mshape[0] != shape[0]:
            raise ValueError(f"mask must be [B, T] with B = {shape[0]} rows, got shape {mshape}")
        if len(shape) == 2 and tuple(mshape) != tuple(shape):
            raise ValueError(f"mask has shape {mshape}; it must match the token rewards' {shape}")
    if not isinstance(eps, int | float) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0 (default 1e-6), got {eps!r}")
    if std_ddof not in (0, 1) or isinstance(std_ddof, bool):
        raise ValueError(
            f"std_ddof must be 0 (population std, the default) or 1 (Bessel, as verl/TRL), "
            f"got {std_ddof!r}"
        )
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; valid: {SCALE_REWARDS}")
    if scale_rewards != "group" and estimator != "grpo":
        raise ValueError(
            f"scale_rewards={scale_rewards!r} chooses grpo's std; {estimator!r} does not divide "
            "by one (dr_grpo is grpo with scale_rewards='none'): use estimator 'grpo' or "
            "scale_rewards='group'"
        )
