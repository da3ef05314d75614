"""The building blocks the objectives are written with: clipping, the clamped exp, KL
estimators, the sequence log-ratio, the rollout-correction weight, off-policy masking, quantiles
and top-k selection, token covariance, DPPO's trust region; and the names of the choices.

Dimension legend: B response rows, T padded response length; inputs [B, T] unless noted.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

EXP_CLAMP = 20.0  # exp(±20) ≈ 4.9e8 / 2.1e-9: large but finite
# Bin edges of the |δ| histogram (log_w_percentiles): quarter decades from 1e-4 to 10^1.75, then
# inf. Counts below each edge add over parts of a batch, where exact percentiles would not.
LOG_W_EDGES = tuple(10.0 ** (-4 + k / 4) for k in range(24)) + (math.inf,)
LOG_W_PERCENTILES = (0.5, 0.9, 0.99)

AGGREGATIONS = (
    "seq-mean-token-mean",
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
KL_ESTIMATORS = ("k1", "k2", "k3")
# Rollout correction modes (TRL's vllm_importance_sampling_mode in brackets): token_tis
# (token_truncate), token_mis (token_mask), seq_tis (sequence_truncate), seq_mis (sequence_mask).
# geo_rs (verl's geometric rejection sampling): a response is dropped (weight 0, else 1) when its
# geometric-mean ratio exp(mean_t Δ) leaves [rollout_is_min, rollout_is_max].
ROLLOUT_CORRECTIONS = ("token_tis", "token_mis", "seq_tis", "seq_mis", "geo_rs")


def clip(x: jax.Array, low, high) -> jax.Array:
    """min(max(x, low), high); its gradient is 1 inside the range and 0 outside."""
    return jnp.minimum(jnp.maximum(x, low), high)


def clamped_exp(x: jax.Array) -> jax.Array:
    """exp(clip(x, −20, 20)): a wild log-ratio gives a large finite ratio and a zero gradient."""
    return jnp.exp(clip(x, -EXP_CLAMP, EXP_CLAMP))


def kl_estimate(x: jax.Array, estimator: str = "k3") -> jax.Array:
    """Single-sample estimate of KL[p ‖ q] at a token sampled from p, with x = log q − log p.

    k1 = −x (unbiased, any sign), k2 = x²/2, k3 = exp(x) − x − 1 (unbiased and ≥ 0; written
    expm1(x) − x, which keeps it ≥ 0 in float32 for tiny x where exp(x) − 1 − x cancels).
    """
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * jnp.square(x)
    if estimator == "k3":
        # max(·, 0) only matters past the clamp (x > e^20), where expm1(20) − x turns negative.
        return jnp.maximum(jnp.expm1(clip(x, -EXP_CLAMP, EXP_CLAMP)) - x, 0.0)
    raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {KL_ESTIMATORS}")


def sequence_log_ratio(delta: jax.Array, mask: jax.Array) -> jax.Array:
    """log s_i = (1/|y_i|) Σ_t δ_{i,t}: the log of the geometric mean of the token ratios.

    delta [B, T] must be finite (e.g. 0) on padding; mask [B, T] 0/1. An empty row gets 0.
    """
    return (delta * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)  # [B]


def dual_clipped(loss: jax.Array, adv: jax.Array, dual_clip: float | None) -> jax.Array:
    """min(L_u, −c·A_u) where A_u < 0 (dual clip c > 1); L_u unchanged when dual_clip is None."""
    if dual_clip is None:
        return loss
    return jnp.where(adv < 0, jnp.minimum(loss, -dual_clip * adv), loss)


def clipped_surrogate(ratio, adv, eps_low: float, eps_high: float, dual_clip=None, delta=None):
    """L_u = −min(min(ρ, δ)·A, clip(ρ, 1 − eps_low, 1 + eps_high)·A), then min(L_u, −c·A) where
    A < 0. δ (INTELLECT-2's two-sided clip, TRL's `delta`) caps the unclipped branch, which PPO
    leaves unbounded where A < 0; None: no cap.

    ratio and adv broadcast against each other (e.g. [B, T] with [B, 1]).
    """
    unclipped = ratio if delta is None else jnp.minimum(ratio, delta)
    loss = -jnp.minimum(unclipped * adv, clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    return dual_clipped(loss, adv, dual_clip)


def rollout_correction_weight(
    mode: str, log_mismatch: jax.Array, is_min: float | None, is_max: float, mask=None
) -> jax.Array:
    """The rollout correction weight c, from Δ = old_logp − rollout_logp [B, T] (0 on padding).

    token_tis  c_{i,t} = clip(exp(Δ_{i,t}), is_min, is_max)                 [B, T]
    token_mis  c_{i,t} = exp(Δ_{i,t}) inside [is_min, is_max], else 0       [B, T]
    seq_tis    c_i = clip(exp(Σ_t Δ_{i,t}), is_min, is_max)                 [B]
    seq_mis    c_i = exp(Σ_t Δ_{i,t}) inside [is_min, is_max], else 0       [B]
    geo_rs     c_i = 1 if exp(mean_t Δ_{i,t}) is inside [is_min, is_max], else 0   [B]
    is_min None is no lower bound. seq_* use the product of the token ratios, geo_rs their
    geometric mean (a rejection only: no importance weight). `mask` [B, T] is needed by geo_rs.
    """
    chex.assert_rank(log_mismatch, 2)
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"unknown rollout_correction {mode!r}; valid: {ROLLOUT_CORRECTIONS}")
    if mode == "geo_rs":
        if mask is None:
            raise ValueError(
                "rollout_correction 'geo_rs' needs mask [B, T] (its mean is per token)"
            )
        geo = clamped_exp(sequence_log_ratio(log_mismatch, mask))  # [B] exp(mean_t Δ)
        low = 0.0 if is_min is None else is_min
        return ((geo >= low) & (geo <= is_max)).astype(log_mismatch.dtype)
    per_sequence = mode.startswith("seq")
    ratio = clamped_exp(log_mismatch.sum(-1) if per_sequence else log_mismatch)  # [B] or [B, T]
    low = 0.0 if is_min is None else is_min  # ratios are > 0: 0 bounds nothing
    if mode.endswith("_tis"):  # truncate
        return clip(ratio, low, is_max)
    return jnp.where((ratio >= low) & (ratio <= is_max), ratio, 0.0)  # mask


def off_policy_keep(
    adv: jax.Array, logp: jax.Array, rollout_logp: jax.Array, mask: jax.Array, threshold: float
) -> jax.Array:
    """Off-policy sequence masking (DeepSeek-V3.2): False where A < 0 and the response drifted.

    drift_i = (1/|y_i|) Σ_t (rollout_logp − sg[logp])_{i,t}; keep = A ≥ 0 or drift_i ≤ threshold.
    adv [B] (one decision per response) or [B, T] (per token, with its response's drift);
    logp, rollout_logp, mask [B, T]. Returns bool of adv's shape.
    """
    chex.assert_equal_shape([logp, rollout_logp, mask])
    diff = jnp.where(mask > 0, rollout_logp - jax.lax.stop_gradient(logp), 0.0)  # [B, T]
    drift = sequence_log_ratio(diff, mask)  # [B] mean over the response's tokens
    if adv.ndim == 2:
        drift = drift[:, None]
    return (adv >= 0) | (drift <= threshold)


def masked_quantile(x: jax.Array, mask: jax.Array, q: float) -> jax.Array:
    """The q-quantile of x [B, T] over the entries where mask > 0, interpolated linearly between
    order statistics (numpy's and torch.quantile's default); 0 when no entry is valid.

    float32: the two order statistics are found by bisection on the floats' bit patterns (32
    counting passes over [B, T], exact) instead of sorting all B·T entries; other dtypes sort.
    """
    valid = (mask > 0).reshape(-1)
    x = jax.lax.stop_gradient(x).reshape(-1)
    n = valid.sum()
    pos = q * jnp.maximum(n - 1, 0).astype(x.dtype)  # fractional rank among the n valid
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    if x.dtype == jnp.float32:
        v_lo, v_hi = _order_statistic(x, valid, lo), _order_statistic(x, valid, hi)
    else:
        xs = jnp.sort(jnp.where(valid, x, jnp.inf))  # valid values first, ascending
        v_lo, v_hi = xs[lo], xs[hi]
    return jnp.where(n > 0, v_lo + (pos - lo) * (v_hi - v_lo), 0.0)


def _order_statistic(x: jax.Array, valid: jax.Array, k: jax.Array) -> jax.Array:
    """The k-th smallest (0-based) of the valid float32 entries of x [N], exactly: bisection on
    an order-preserving uint32 key of the bits (negative floats flipped), one count per bit."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    sign = bits >> 31
    key = jnp.where(sign == 1, ~bits, bits | jnp.uint32(0x80000000))  # monotone in x

    def step(_, bounds):  # invariant: the answer's key lies in [lo, hi]
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = jnp.sum(valid & (key <= mid)) >= k + 1
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    lo, _ = jax.lax.fori_loop(0, 32, step, (jnp.uint32(0), jnp.uint32(0xFFFFFFFF)))
    bits = jnp.where(lo >> 31 == 1, lo & jnp.uint32(0x7FFFFFFF), ~lo)  # the key's inverse
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


TOP_K_BLOCK = 128  # entries per block of top_k_indices' first stage


def top_k_indices(flat: jax.Array, k: int) -> jax.Array:
    """int [k]: the indices lax.top_k(flat, k) returns (largest first, ties by the lower index),
    in two stages when k is small against flat's size N.

    Every one of the k largest entries lies in one of the k blocks (of TOP_K_BLOCK entries) with
    the largest maxima: a block outside them has k blocks, so k entries, at least as large as its
    maximum. So a top-k of the N / TOP_K_BLOCK block maxima picks k blocks, and a top-k over their
    entries, the blocks kept in index order (ties then still go to the lower index), picks what one
    top-k of all N picks. On XLA:CPU a top-k of N entries is a selection over all of them; this is
    one pass (the block maxima) and two small selections.
    """
    n = flat.size
    n_blocks = -(-n // TOP_K_BLOCK)
    if 4 * k > n_blocks:  # the first stage would not be small
        return jax.lax.top_k(flat, k)[1]
    padding = n_blocks * TOP_K_BLOCK - n
    blocks = jnp.pad(flat, (0, padding), constant_values=-jnp.inf).reshape(n_blocks, TOP_K_BLOCK)
    _, chosen = jax.lax.top_k(blocks.max(-1), k)  # [k] blocks
    chosen = jnp.sort(chosen)  # index order
    _, pos = jax.lax.top_k(blocks[chosen].reshape(-1), k)  # [k] in the k·TOP_K_BLOCK entries
    return chosen[pos // TOP_K_BLOCK] * TOP_K_BLOCK + pos % TOP_K_BLOCK


def top_k_mask(score: jax.Array, candidates: jax.Array, fraction: float, mask: jax.Array):
    """bool [B, T]: the k = max(⌊fraction·N⌋, 1) candidates with the largest score, N = Σ mask
    (the response tokens; ties: the lower flat index first); fewer candidates than k: all.

    k is dynamic (N is), so one top-k of its static bound max(⌊fraction·B·T⌋, 1) runs and its
    first k are kept: for verl's 2e-4 a small partial selection, not a sort of all B·T entries.
    """
    flat = jnp.where(candidates, jax.lax.stop_gradient(score), -jnp.inf).reshape(-1)
    k = jnp.maximum(jnp.floor(fraction * mask.sum()), 1.0)  # dynamic
    k_max = max(1, min(math.floor(fraction * flat.size), flat.size))  # static bound
    idx = top_k_indices(flat, k_max)  # [k_max], largest first
    # (an index past the end is a padding entry of top_k_indices, picked only with fewer
    # candidates than k_max, and dropped)
    chosen = jnp.zeros(flat.shape, bool).at[idx].set(jnp.arange(k_max) < k, mode="drop")
    return chosen.reshape(score.shape) & candidates


def token_covariance(adv: jax.Array, logp: jax.Array, mask: jax.Array) -> jax.Array:
    """Cov_{i,t} = (A_{i,t} − mean A)·(logp_{i,t} − mean logp), the means over the response tokens
    of this call (the entropy-mechanism paper's per-token covariance; detached). adv [B] or [B, T],
    logp and mask [B, T]; 0 on padding."""
    valid = mask > 0
    n = jnp.maximum(mask.sum(), 1.0)
    a = jnp.where(valid, _per_token(adv), 0.0)  # [B, T]
    lp = jnp.where(valid, jax.lax.stop_gradient(logp), 0.0)  # [B, T]
    cov = (a - a.sum() / n) * (lp - lp.sum() / n)
    return jnp.where(valid, cov, 0.0)


def dppo_keep(rho, delta, old_logp, adv, eps_low: float, eps_high: float, divergence: str):
    """DPPO's trust region, from the token's probabilities p_old = exp(old_logp) and p = p_old·ρ
    (detached): binary TV keeps p − p_old ≤ eps_high where A > 0 and p − p_old ≥ −eps_low
    elsewhere; binary KL D = p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p +
    1e-8)) keeps D ≤ eps_high or p ≤ p_old where A > 0, D ≤ eps_low or p ≥ p_old elsewhere.
    rho (the token ratio), delta (its log, logp − old_logp), old_logp [B, T]; adv broadcasts.
    Returns bool [B, T]."""
    rho = jax.lax.stop_gradient(rho)
    p_old = jnp.exp(old_logp)
    p = p_old * rho  # exp(logp) from the ratio already computed: one exp fewer
    if divergence == "tv":
        return jnp.where(adv > 0, p - p_old <= eps_high, p - p_old >= -eps_low)
    d = -p_old * jax.lax.stop_gradient(delta) + (1.0 - p_old) * jnp.log(
        (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
    )
    return jnp.where(adv > 0, (d <= eps_high) | (rho <= 1.0), (d <= eps_low) | (rho >= 1.0))


def _per_token(x: jax.Array) -> jax.Array:
    """[B, T] stays, [B] becomes [B, 1] (broadcasts along T)."""
    return x if x.ndim == 2 else x[:, None]


def _unit_product(x: jax.Array, y: jax.Array) -> jax.Array:
    """x·y for per-response [B] and per-token [B, T] factors in any combination."""
    if x.ndim != y.ndim:
        return _per_token(x) * _per_token(y)
    return x * y


def _tokens_per_row(indicator: jax.Array, mask: jax.Array, n_tok: jax.Array) -> jax.Array:
    """[B] tokens per response where a unit indicator holds; a response-level [B] indicator
    counts all |y_i| tokens of its response (a clipped response clips all its tokens)."""
    if indicator.ndim == 2:
        # The barrier keeps XLA from turning later sums of these row counts into second passes
        # over [B, T] (it rewrites reduce(reduce(x)) as one reduce of x).
        return jax.lax.optimization_barrier(jnp.where(indicator, mask, 0.0).sum(-1))
    return jnp.where(indicator, n_tok, 0.0)


def _clipped_tokens_per_row(terms, adv, mask, n_tok):
    """[B] clipped tokens per response on the low and the high side."""
    if terms.clip_low is None:  # a surrogate without a clip (sapo)
        return jnp.zeros_like(n_tok), jnp.zeros_like(n_tok)
    if terms.by_adv_sign and adv.ndim == 1 and terms.clip_low.ndim == 2:
        # sign(A_i) is constant along a row, so one count of either side splits by that sign.
        clipped = _tokens_per_row(terms.clip_low | terms.clip_high, mask, n_tok)
        return jnp.where(adv < 0, clipped, 0.0), jnp.where(adv > 0, clipped, 0.0)
    return _tokens_per_row(terms.clip_low, mask, n_tok), _tokens_per_row(
        terms.clip_high, mask, n_tok
    )
