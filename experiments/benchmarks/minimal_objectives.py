"""The fewest operations that compute clip_cov, kl_cov and dppo_kl's losses at their presets'
defaults, for objectives_bench: written as one would by hand for this benchmark's inputs (A [B],
no NaN on padding, no metrics, no validation), they bound from below what the library's general
form can cost. objectives_bench times them against the same floor; where a minimal form costs
what the preset costs, the preset's ratio is the formula's, not the library's overhead.

Dimension legend: B response rows, T padded response length.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from gspo_jax import objectives

sg = jax.lax.stop_gradient


def _top_covariance(cov, candidates, ratio, n):
    """bool [B, T]: the max(⌊ratio·n⌋, 1) candidates of largest covariance (ties: lower index)."""
    score = jnp.where(candidates, sg(cov), -jnp.inf)  # [B, T]
    k_max = max(1, math.floor(ratio * score.size))
    idx = objectives.top_k_indices(score.reshape(-1), k_max)  # [k_max], largest first
    k = jnp.maximum(jnp.floor(ratio * n), 1.0)
    chosen = jnp.zeros(score.size, bool).at[idx].set(jnp.arange(k_max) < k, mode="drop")
    return chosen.reshape(score.shape) & candidates


def _covariance(logp, adv, mask):
    """[B, T] Cov = (A − mean A)(logp − mean logp) over the response tokens; A [B]."""
    n_tok = mask.sum(-1)  # [B]
    n = jnp.maximum(n_tok.sum(), 1.0)
    a_mean = (adv * n_tok).sum() / n
    lp_mean = sg((logp * mask).sum()) / n
    return (adv[:, None] - a_mean) * (sg(logp) - lp_mean), n


def clip_cov(logp, old_logp, adv, mask, eps=0.2, lb=1.0, ub=5.0, ratio=2e-4):
    """Token-mean PPO clip, ℓ = 0 on the selected unclipped tokens with lb < Cov < ub."""
    valid = mask > 0
    delta = logp - old_logp  # [B, T]
    A = adv[:, None]  # [B, 1]
    rho = jnp.exp(jnp.clip(delta, -20.0, 20.0))
    clipped = ((rho < 1 - eps) & (A < 0)) | ((rho > 1 + eps) & (A > 0))
    cov, n = _covariance(logp, adv, mask)
    selected = _top_covariance(cov, valid & ~clipped & (cov > lb) & (cov < ub), ratio, n)
    loss = -jnp.minimum(rho * A, jnp.clip(rho, 1 - eps, 1 + eps) * A)
    return jnp.where(selected | ~valid, 0.0, loss).sum() / n


def kl_cov(logp, old_logp, adv, mask, ratio=2e-4, coef=1.0):
    """Token-mean −ρ·A, + coef·|logp − old_logp| on the tokens of largest Cov."""
    valid = mask > 0
    delta = logp - old_logp  # [B, T]
    cov, n = _covariance(logp, adv, mask)
    selected = _top_covariance(cov, valid, ratio, n)
    loss = -jnp.exp(jnp.clip(delta, -20.0, 20.0)) * adv[:, None]
    loss += jnp.where(selected, coef * jnp.abs(delta), 0.0)
    return jnp.where(valid, loss, 0.0).sum() / n


def dppo_kl(logp, old_logp, adv, mask, eps=0.05, cap=3.0):
    """seq-mean-token-sum-norm −A·sg[min(ρ, cap)]·logp inside the binary-KL trust region."""
    valid = mask > 0
    delta = jnp.where(valid, logp - old_logp, 0.0)  # [B, T]
    rho = jnp.exp(jnp.clip(delta, -20.0, 20.0))
    p_old = jnp.exp(old_logp)
    p = p_old * sg(rho)
    d = -p_old * sg(delta) + (1 - p_old) * jnp.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    A = adv[:, None]
    keep = jnp.where(A > 0, (d <= eps) | (rho <= 1), (d <= eps) | (rho >= 1)) & valid
    loss = jnp.where(keep, -A * sg(jnp.minimum(rho, cap)) * logp, 0.0)
    rows = (mask.sum(-1) > 0).sum()
    return loss.sum() / (rows * mask.shape[1])


MINIMAL = {"clip_cov": clip_cov, "kl_cov": kl_cov, "dppo_kl": dppo_kl}
