"""Surrogates: what an objective does with its ratio ρ and the advantage A, the per-unit loss ℓ
(clip, cispo, sapo, clip_cov, kl_cov, dppo_tv, dppo_kl).

Dimension legend: B response rows, T padded response length.

With δ_{i,t} = logp − old_logp and sg the stop-gradient:

  surrogate    what is done with ρ: the per-unit loss ℓ (A broadcast to ρ's unit)
     "clip"   ℓ = −min(ρ·A, clip(ρ, 1 − eps_low, 1 + eps_high)·A); dual clip c > 1:
              ℓ = min(ℓ, −c·A) where A < 0 (the geometric ratio is clipped already: ℓ = −ρ·A)
     "cispo"  ℓ_{i,t} = −sg[clip(ρ, 1 − eps_low, 1 + eps_high)]·A·logp_{i,t}   (always per token)
     "sapo"   ℓ = −(4/τ)·σ(τ·(ρ − 1))·A,  τ = tau_pos where A > 0, else tau_neg
     "clip_cov"  clip's ℓ, and ℓ = 0 on the ⌊clip_cov_ratio·N⌋ unclipped tokens of largest
              Cov = (A − mean A)(logp − mean logp) inside (clip_cov_lb, clip_cov_ub)
     "kl_cov"    ℓ = −ρ·A, + ppo_kl_coef·|δ| on the ⌊kl_cov_ratio·N⌋ tokens of largest Cov
     "dppo_tv" / "dppo_kl"  ℓ = −A·sg[min(ρ, clip_ratio_c)]·logp_{i,t} on the tokens inside
              DPPO's binary-TV / binary-KL trust region (eps_low / eps_high), 0 outside
     (the last three per token only; N = the call's response tokens, at least 1 token)
     delta δ  (clip, clip_cov) the unclipped branch takes min(ρ, δ): a two-sided clip

A new objective is one surrogate (or ratio) function plus one preset line. CISPO, for example:

    def _cispo_surrogate(obj, r, A, tok):
        lo, hi = 1.0 - obj.eps_low, 1.0 + obj.eps_high
        weight = jax.lax.stop_gradient(clip(r.rho, lo, hi))  # [B, T] or [B]
        loss = -_per_token(weight * A) * tok.logp  # [B, T]
        return _Surrogate(loss, r.rho < lo, r.rho > hi, by_adv_sign=False)  # clipped: ρ moved

    _SURROGATES = {"clip": ..., "cispo": _cispo_surrogate, ...}
    PRESETS = {..., "cispo": _preset("token", "cispo", "token-mean", eps_low=1.0, eps_high=4.0)}

and it is a preset name, a sweep entry (configs/arith.py) and a configurable objective with no
other edit (tests/test_objectives.py then checks every preset against its transcribed formula).
A new field of Objective is likewise overridable everywhere (OVERRIDABLE_FIELDS, the config's
placeholders) once it has a default and a check in _validate.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from gspo_jax.objectives.terms import (
    _per_token,
    clip,
    clipped_surrogate,
    dppo_keep,
    dual_clipped,
    token_covariance,
    top_k_mask,
)


class _Tokens(NamedTuple):
    """The per-token inputs a surrogate may read besides ρ and A: [B, T] each, 0 on padding."""

    logp: jax.Array  # log π_θ, carrying the gradient
    old_logp: jax.Array  # log π_old
    mask: jax.Array  # 0/1


class _Surrogate(NamedTuple):
    """What a surrogate hands to the aggregation and the metrics."""

    loss: jax.Array  # ℓ per unit: [B, T] per token (finite on padding) or [B] L_i per response
    clip_low: jax.Array | None  # bool per unit, [B, T] or [B]; None: nothing is ever clipped
    clip_high: jax.Array | None
    by_adv_sign: bool  # clip_low holds only where A < 0 and clip_high only where A > 0
    # bool [B, T]: the tokens a batch-level covariance rule acted on (clip_cov, kl_cov), else None
    selected: jax.Array | None = None


def _clip_surrogate(obj, r, A, tok):
    """PPO: ℓ = −min(ρ·A, clip(ρ, 1 − eps_low, 1 + eps_high)·A); clipped where the clip is the
    active branch (ρ < 1 − eps_low with A < 0, ρ > 1 + eps_high with A > 0); dual clip c > 1:
    ℓ = min(ℓ, −c·A) where A < 0; two-sided clip δ: min(ρ, δ) in the unclipped branch. A ratio
    the ratio level has clipped already (gmpo's, the same min taken per token in log space) gives
    ℓ = −ρ·A."""
    if r.log_clip is not None:
        loss, (low, high) = -r.rho * A, r.log_clip
    else:
        loss = clipped_surrogate(r.rho, A, obj.eps_low, obj.eps_high, delta=obj.delta)
        low = (r.rho < 1.0 - obj.eps_low) & (A < 0)
        high = (r.rho > 1.0 + obj.eps_high) & (A > 0)
    return _Surrogate(dual_clipped(loss, A, obj.dual_clip), low, high, by_adv_sign=True)


def _cispo_surrogate(obj, r, A, tok):
    """CISPO: ℓ_{i,t} = −sg[clip(ρ, 1 − eps_low, 1 + eps_high)]·A·logp_{i,t}: every token keeps
    its REINFORCE gradient A·∇logp, weighted by the clipped ratio (PPO's clip would zero it).
    Clipped: the units whose ρ the clip moved, whatever the sign of A."""
    lo, hi = 1.0 - obj.eps_low, 1.0 + obj.eps_high
    weight = jax.lax.stop_gradient(clip(r.rho, lo, hi))  # [B, T] or [B]
    loss = -_per_token(weight * A) * tok.logp  # [B, T]
    return _Surrogate(loss, r.rho < lo, r.rho > hi, by_adv_sign=False)


def _sapo_surrogate(obj, r, A, tok):
    """SAPO: ℓ = −(4/τ)·σ(τ·(ρ − 1))·A, τ = tau_pos where A > 0, else tau_neg: a smooth gate with
    slope 1 at ρ = 1 (the plain policy gradient there) that fades updates as ρ moves away."""
    tau = jnp.where(A > 0, obj.tau_pos, obj.tau_neg)  # A's shape
    loss = -(4.0 / tau) * jax.nn.sigmoid(tau * (r.rho - 1.0)) * A  # ρ's shape
    return _Surrogate(loss, None, None, by_adv_sign=False)


def _clip_cov_surrogate(obj, r, A, tok):
    """Clip-Cov (entropy-mechanism paper): PPO's clip, and ℓ = 0 (no gradient) on the
    ⌊clip_cov_ratio·N⌋ (at least 1) tokens with clip_cov_lb < Cov_{i,t} < clip_cov_ub that PPO
    did not clip, N the response tokens of this call. verl draws them at random among the
    candidates; here they are the candidates of largest covariance (deterministic, no key)."""
    base = _clip_surrogate(obj, r, A, tok)
    cov = token_covariance(A, tok.logp, tok.mask)  # [B, T]
    candidates = (tok.mask > 0) & ~(base.clip_low | base.clip_high)
    candidates &= (cov > obj.clip_cov_lb) & (cov < obj.clip_cov_ub)
    selected = top_k_mask(cov, candidates, obj.clip_cov_ratio, tok.mask)
    return base._replace(loss=jnp.where(selected, 0.0, base.loss), selected=selected)


def _kl_cov_surrogate(obj, r, A, tok):
    """KL-Cov (entropy-mechanism paper): ℓ = −ρ·A (no clip), plus ppo_kl_coef·|logp − old_logp|
    on the ⌊kl_cov_ratio·N⌋ (at least 1) tokens of largest Cov_{i,t} among the N response
    tokens of this call."""
    cov = token_covariance(A, tok.logp, tok.mask)  # [B, T]
    selected = top_k_mask(cov, tok.mask > 0, obj.kl_cov_ratio, tok.mask)
    penalty = obj.ppo_kl_coef * jnp.abs(tok.logp - tok.old_logp)  # [B, T]
    loss = -r.rho * A + jnp.where(selected, penalty, 0.0)
    return _Surrogate(loss, None, None, by_adv_sign=False, selected=selected)


def _dppo_surrogate(obj, r, A, tok, divergence: str):
    """DPPO (binary TV / binary KL trust region): ℓ = −A·sg[min(ρ, clip_ratio_c)]·logp on the
    tokens dppo_keep keeps, 0 elsewhere; eps_low / eps_high are the divergence thresholds.
    Clipped: the tokens outside the trust region (by the sign of A). Like cispo, only its
    gradient is meaningful."""
    delta = tok.logp - tok.old_logp  # [B, T] δ, 0 on padding
    keep = dppo_keep(r.rho, delta, tok.old_logp, A, obj.eps_low, obj.eps_high, divergence)
    weight = jax.lax.stop_gradient(jnp.minimum(r.rho, obj.clip_ratio_c))  # [B, T]
    loss = jnp.where(keep, -A * weight * tok.logp, 0.0)
    return _Surrogate(loss, ~keep & (A < 0), ~keep & (A > 0), by_adv_sign=True)


_SURROGATES = {
    "clip": _clip_surrogate,
    "cispo": _cispo_surrogate,
    "sapo": _sapo_surrogate,
    "clip_cov": _clip_cov_surrogate,
    "kl_cov": _kl_cov_surrogate,
    "dppo_tv": functools.partial(_dppo_surrogate, divergence="tv"),
    "dppo_kl": functools.partial(_dppo_surrogate, divergence="kl"),
}
SURROGATES = tuple(_SURROGATES)
