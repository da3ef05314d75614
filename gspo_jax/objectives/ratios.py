"""Ratio levels: which ratio ρ an objective clips, per unit (a token or a response), from
δ = logp − old_logp: token w_{i,t}, sequence s_i, sequence_token s_{i,t}, geometric (GMPO).

Dimension legend: B response rows, T padded response length.

The ratio levels, with
δ_{i,t} = logp − old_logp, |y_i| = Σ_t mask_{i,t} and sg the stop-gradient:

  ratio_level  which ratio ρ, per unit (a token or a response)
     "token"           w_{i,t} = exp(δ_{i,t})                 grpo, dapo, dr_grpo, cispo, sapo
     "sequence"        s_i = exp(Σ_t δ_{i,t} / |y_i|)         gspo, luspo
     "sequence_token"  s_{i,t} = sg[s_i]·π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]   gspo_token
     "geometric"       exp(Σ_t δ*_{i,t} / |y_i|), δ* = δ clipped in log space, sign-aware: gmpo

With length_norm=False the sequence levels drop the 1/|y_i|: s_i = exp(Σ_t δ_{i,t}), the
product of the token ratios (GSPO's ablation: its range grows with |y_i|, so one ε cannot fit
every length).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from gspo_jax.objectives.terms import EXP_CLAMP, clamped_exp, clip, sequence_log_ratio


class _Ratio(NamedTuple):
    """What a ratio level hands to the surrogate."""

    rho: jax.Array  # ρ per unit, carrying the gradient: [B, T] per token or [B] per response
    reported: jax.Array  # the ratio for ratio_mean/min/max: w [B, T] or s_i [B], unclipped
    # (low, high) bool [B, T] when the ratio level clipped ρ itself (gmpo's log-space clip: the
    # tokens whose δ it moved); None when ρ is unclipped and the surrogate does the clipping.
    log_clip: tuple | None = None


def _token_ratio(obj, delta, adv, mask):
    """GRPO / DAPO / Dr. GRPO / CISPO / SAPO: w_{i,t} = exp(δ_{i,t})."""
    w = clamped_exp(delta)  # [B, T] w_{i,t}
    return _Ratio(w, w)


def _log_s(obj, delta, mask):
    """log s_i [B]: (1/|y_i|) Σ_t δ_{i,t}, or Σ_t δ_{i,t} with length_norm=False."""
    return sequence_log_ratio(delta, mask) if obj.length_norm else (delta * mask).sum(-1)


def _sequence_ratio(obj, delta, adv, mask):
    """GSPO / LUSPO: one ratio per response, s_i = exp((1/|y_i|) Σ_t δ_{i,t})."""
    s = clamped_exp(_log_s(obj, delta, mask))  # [B] s_i
    return _Ratio(s, s)


def _sequence_token_ratio(obj, delta, adv, mask):
    """GSPO-token: s_{i,t} = sg[s_i]·π_θ(y_{i,t})/sg[π_θ(y_{i,t})]; value s_i, per-token grad."""
    if adv.ndim == 1:
        # With one A_i per response GSPO-token equals GSPO in value and gradient (GSPO eq. 14)
        # for every surrogate (ℓ is a function of the value s_i, and Σ_t ∂s_{i,t} = ∂s_i·|y_i|;
        # tested against this per-token path with a per-token A that is constant per response).
        return _sequence_ratio(obj, delta, adv, mask)
    sg = jax.lax.stop_gradient
    log_s = _log_s(obj, delta, mask)  # [B] log s_i
    s = clamped_exp(log_s)  # [B] s_i
    # π_θ/sg[π_θ] = exp(u) with u = logp − sg(logp) = δ − sg(δ) (old_logp is data): u is 0 in
    # value and ∂u/∂logp = 1, so exp(u) and 1 + u agree in value and gradient, and the linear form
    # needs no per-token exp. ds_i/dlog s_i is 0 past the exp clamp, as for the other ratios.
    slope = jnp.where(jnp.abs(log_s) < EXP_CLAMP, s, 0.0)  # [B]
    s_it = sg(s)[:, None] + sg(slope)[:, None] * (delta - sg(delta))  # [B, T] s_{i,t}
    return _Ratio(s_it, s)


def _geometric_ratio(obj, delta, adv, mask):
    """GMPO: the geometric mean of token-clipped ratios, clipped in log space and sign-aware:
    δ*_t = σ·min(σ·δ_t, σ·clip(δ_t, −eps_low, eps_high)), σ = sign(A_i) (PPO's min, per token in
    log space); ratio_i = exp((1/|y_i|) Σ_t δ*_t). The clip surrogate then gives L_i = −A_i·ratio_i.
    """
    sigma = jnp.sign(adv)[:, None]  # [B, 1]
    delta_clipped = clip(delta, -obj.eps_low, obj.eps_high)  # [B, T]
    delta_star = sigma * jnp.minimum(sigma * delta, sigma * delta_clipped)  # [B, T]
    ratio = clamped_exp(sequence_log_ratio(delta_star, mask))  # [B]
    # Reported: the unclipped geometric mean s_i; clipped: tokens whose δ the clip moved.
    s = clamped_exp(sequence_log_ratio(delta, mask))  # [B]
    low = (delta < -obj.eps_low) & (adv < 0)[:, None]  # [B, T]
    high = (delta > obj.eps_high) & (adv > 0)[:, None]  # [B, T]
    return _Ratio(ratio, s, log_clip=(low, high))


_RATIO_LEVELS = {
    "token": _token_ratio,
    "sequence": _sequence_ratio,
    "sequence_token": _sequence_token_ratio,
    "geometric": _geometric_ratio,
}
RATIO_LEVELS = tuple(_RATIO_LEVELS)
# The levels with one ratio per response ([B]): per-token advantages [B, T] need another level.
PER_RESPONSE_LEVELS = ("sequence", "geometric")
