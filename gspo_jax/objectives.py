"""Policy objectives of the GRPO family: grpo, dapo, dr_grpo, gspo, gspo_token, luspo, gmpo, cispo,
sapo, clip_cov, kl_cov, dppo_tv, dppo_kl; with optional rollout correction, off-policy sequence
masking, a two-sided clip, high-entropy token selection, an entropy bonus and an unbiased KL.

Dimension legend: B response rows (P prompts x G samples, group-contiguous), T padded response
length. Inputs are [B, T] float32 (bf16 is upcast; float64 stays float64 under jax_enable_x64),
`mask` is 1 on response tokens (EOS included) and 0 on padding (bool, int or float, but 0/1);
`adv` is one advantage per response [B] or per token [B, T] (per-token needs a per-token ratio:
token or sequence_token).

    obj = get_objective("gspo", eps_low=0.2, eps_high=0.2)   # preset + any OVERRIDABLE_FIELDS
    loss, metrics = obj(logp, old_logp, adv, mask, ref_logp=None, rollout_logp=None, entropy=None)
    num, den, metric_sums = obj.sums(logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy)

`entropy` [B, T] is the policy's per-token entropy (differentiable), needed only when a term reads
it (obj.needs_entropy: entropy_coef > 0 or top_entropy_quantile < 1).

Every objective is assembled from orthogonal parts (docs/objectives.md), with
δ_{i,t} = logp − old_logp, |y_i| = Σ_t mask_{i,t} and sg the stop-gradient:

  ratio_level  which ratio ρ, per unit (a token or a response)
     "token"           w_{i,t} = exp(δ_{i,t})                 grpo, dapo, dr_grpo, cispo, sapo
     "sequence"        s_i = exp(Σ_t δ_{i,t} / |y_i|)         gspo, luspo
     "sequence_token"  s_{i,t} = sg[s_i]·π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]   gspo_token
     "geometric"       exp(Σ_t δ*_{i,t} / |y_i|), δ* = δ clipped in log space, sign-aware: gmpo
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
  weight       (only when asked for; needs rollout_logp, or entropy) ℓ ← c·m·ℓ, all detached:
     rollout_correction  c from exp(Δ), Δ = old_logp − rollout_logp, per token (token_tis /
                         token_mis) or exp(Σ_t Δ_{i,t}) per response (seq_tis / seq_mis): *_tis
                         clips it to [rollout_is_min, rollout_is_max], *_mis zeroes it outside
                         geo_rs: c_i = 1 if exp(mean_t Δ_{i,t}) is inside the bounds, else 0
     off_policy_mask δ   m = 0 where A < 0 and mean_t(rollout_logp − sg[logp]) > δ, else 1
     top_entropy_quantile q  m = 0 on tokens whose entropy is below the call's (1 − q)-quantile
  aggregation  per-token losses ℓ_{i,t} (a response-level L_i counts on each of its tokens):
               seq-mean-token-mean      (1/R) Σ_i (1/|y_i|) Σ_t ℓ_{i,t}
               token-mean               Σ_{i,t} ℓ_{i,t} / Σ_i |y_i|
               seq-mean-token-sum       (1/R) Σ_i Σ_t ℓ_{i,t}          (LUSPO's length weight)
               seq-mean-token-sum-norm  Σ_{i,t} ℓ_{i,t} / (R·max_len)  (Dr. GRPO)
  KL           + kl_coef · KL[π_θ ‖ π_ref], per-token k1 | k2 | k3 of x = ref_logp − logp,
               aggregated like the policy loss (not weighted by c·m; only when ref_logp is given:
               grpo's β = 0.04 applies only then; the other presets have kl_coef 0, kl_ref is still
               reported); kl_unbiased: KL_{i,t} weighted by the (undetached) ratio ρ
  entropy      − entropy_coef · the entropy aggregated like the policy loss
Batch-level statistics (the covariances and their top-k, the entropy quantile) are over the rows
of one call: they do not combine over micro-batches or shards (docs/objectives.md).
A preset (PRESETS) is a ratio level, a surrogate, an aggregation and field values; luspo is gspo
with seq-mean-token-sum, gspo with eps 0.2 is `get_objective("gspo", eps_low=0.2, eps_high=0.2)`.
For gmpo, eps_low and eps_high bound δ in log space (clip (e^−0.4, e^0.4)), so eps_low < 1 is not
required there. The cispo value contains logp itself: only its gradient is meaningful.

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

R counts the *non-empty* rows: a row whose mask is all zero contributes nothing to any sum or
count, so padding a minibatch with empty rows (e.g. to fill every shard) changes nothing.
max_len=None means the padded T of the arrays passed (set it to the sampler's max_new_tokens when
micro-batches might differ in T). exp() arguments are clamped to ±20 (before the exp, so that no
branch ever holds an inf whose gradient could turn into NaN); values under mask 0, even NaN or inf,
never reach a value or a gradient.

Global normalisation. Every aggregation is `loss = num / den` with
  num = Σ_{i,t} κ_{i,t}·ℓ_{i,t}   (κ_{i,t} = 1/|y_i| for seq-mean-token-mean, else 1)
  den = R | Σ_i |y_i| | R | R·max_len          (depends on the mask only; a weight of 0 from
                                                 rollout correction or masking leaves it as is)
and num, den and every metric sum simply add up over micro-batches and shards. `obj.sums(...)`
returns them as `Sums(num, den, metrics)`; `obj(...)` is `obj.sums(...).finalize()`. The trainer:

  den = sum(obj.denominator(mask_k) for k in micro_batches)      # mask only: before any forward
  grad = Σ_k ∇θ obj.sums(logp_k(θ), old_k, adv_k, mask_k, rollout_logp=roll_k).num / den
  loss, metrics = functools.reduce(Sums.combine, sums_k).finalize()   # = Σ_k num_k / den
  # in jax.shard_map over the batch axis: loss, metrics = obj.sums(...).psum("data").finalize()
  # under plain jit with batch-sharded arrays obj(...) is already global (XLA sums over shards)
  # a scanned micro-batch loop with stacked Sums: sums.reduce_stacked().finalize()
Gradients flow through `num` only (metric sums are stop-gradient); jax.grad through
`.psum(...).finalize()[0]` inside shard_map gives the global gradient.

Metric sums are additive except those named `*_min` / `*_max` (ratio_min / ratio_max,
rollout_is_min / rollout_is_max: combined by min / max; ±inf or 0 in a part with no unit, the
identity of min / max). Finalised metrics:
  clip_frac, clip_frac_low, clip_frac_high   per response token (a clipped response clips all of
                                             its tokens). clip: low ρ < 1 − eps_low with A < 0,
                                             high ρ > 1 + eps_high with A > 0 (gmpo: tokens whose
                                             δ its log clip moved); cispo: units whose ρ the clip
                                             moved, whatever the sign of A; sapo: 0 (no clip)
  seq_clip_frac        mean over responses of the fraction of their tokens clipped (for the
                       sequence-level objectives: the fraction of clipped responses)
  dual_clip_frac       per token, only when dual_clip is set
  ratio_mean/min/max   over ratio units: tokens for token ratios, responses (s_i, before any
                       clip) for gspo, gspo_token, luspo and gmpo; 1.0 when there is no unit
  token_ratio_mean/min/max  (objectives with one ratio per response only) the token ratios
                       w_{i,t} = exp(δ_{i,t}) under it, over response tokens: the like-for-like
                       comparison with a token-level objective's ratio_*
  approx_kl            Σ k3(δ) / tokens = mean of exp(δ) − 1 − δ: the unbiased estimate of
                       KL[π_old ‖ π_θ] from the rollout tokens (sampled from π_old)
  kl_ref, kl_loss      (ref_logp given) token mean of the estimator, and its aggregated value
  pg_loss              the (weighted) policy term; loss = pg_loss + kl_coef · kl_loss
  rollout_is_mean/min/max  (rollout_correction set) the weight c after its clip or mask, over its
                       units (tokens for token_*, responses for seq_*); 1.0 when there is no unit
  rollout_is_masked_frac   (rollout_correction set) response tokens whose weight is 0 (mis modes)
  opsm_drop_frac       (off_policy_mask set) mean over responses of the fraction of their tokens
                       dropped: the fraction of dropped responses for [B] advantages
  delta_clip_frac      (delta set) response tokens with A < 0 and ρ > δ
  cov_frac             (clip_cov, kl_cov) response tokens the covariance rule selected
  entropy_kept_frac    (top_entropy_quantile < 1) response tokens in the high-entropy mask
  entropy_loss         (entropy_coef > 0) the aggregated entropy; loss = pg_loss + kl_coef ·
                       kl_loss − entropy_coef · entropy_loss
  abs_log_w_p50/p90/p99  (log_w_percentiles) percentiles of the token log-ratios |δ_{i,t}| over
                       response tokens, whatever the ratio level, to a quarter decade: each is
                       the upper edge of its bin in LOG_W_EDGES (an upper bound within a factor
                       10^0.25), from counts that add over micro-batches and shards; 0 with no
                       token, inf past the last finite edge

Performance: experiments/benchmarks/objectives_bench.py times loss + gradient of every preset
against a masked mean of logp with its gradient (the floor). On CPU each metric costs its own
pass over [B, T] (GPU/TPU fuse them); a KL term, per-token advantages or rollout_logp read one
more [B, T] input. GSPO-token with [B] advantages takes GSPO's path (equal in value and gradient
for every surrogate); the per-token path needs no per-token exp (see _sequence_token_ratio).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import NamedTuple

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


# ----------------------------------------------------------------------------- building blocks


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


# ----------------------------------------------------------------------------- sums


def _combine_op(key: str):
    if key.endswith("_min"):
        return jnp.minimum
    if key.endswith("_max"):
        return jnp.maximum
    return jnp.add


class Sums(NamedTuple):
    """Additive pieces of a minibatch loss: loss = num / den; see the module docstring."""

    num: jax.Array  # scalar: Σ κ_{i,t}·ℓ_{i,t}, policy term + kl_coef · KL term
    den: jax.Array  # scalar: the aggregation's normaliser, a function of the mask only
    metrics: (
        dict  # str -> scalar (abs_log_w_below: [edges]): additive sums and counts, *_min / *_max
    )

    def combine(self, other: Sums) -> Sums:
        """The Sums of the union of two disjoint parts of one minibatch."""
        metrics = {k: _combine_op(k)(v, other.metrics[k]) for k, v in self.metrics.items()}
        return Sums(self.num + other.num, self.den + other.den, metrics)

    def psum(self, axis_name) -> Sums:
        """Inside shard_map / pmap: the Sums of the whole batch from each shard's Sums."""
        reduce = {jnp.add: jax.lax.psum, jnp.minimum: jax.lax.pmin, jnp.maximum: jax.lax.pmax}
        metrics = {k: reduce[_combine_op(k)](v, axis_name) for k, v in self.metrics.items()}
        return Sums(jax.lax.psum(self.num, axis_name), jax.lax.psum(self.den, axis_name), metrics)

    def reduce_stacked(self) -> Sums:
        """Sums stacked along a leading axis (e.g. returned by lax.scan over micro-batches)."""
        reduce = {jnp.add: jnp.sum, jnp.minimum: jnp.min, jnp.maximum: jnp.max}
        metrics = {k: reduce[_combine_op(k)](v, axis=0) for k, v in self.metrics.items()}
        return Sums(self.num.sum(0), self.den.sum(0), metrics)

    def finalize(self) -> tuple[jax.Array, dict]:
        """(loss, metrics) from the (combined) sums. Never divides by zero."""
        m = self.metrics
        tokens = jnp.maximum(m["tokens"], 1.0)
        rows = jnp.maximum(m["rows"], 1.0)
        den = jnp.maximum(self.den, 1.0)  # den is 0 (no response token at all) or >= 1
        out = {
            "clip_frac": (m["clip_low_tokens"] + m["clip_high_tokens"]) / tokens,
            "clip_frac_low": m["clip_low_tokens"] / tokens,
            "clip_frac_high": m["clip_high_tokens"] / tokens,
            "seq_clip_frac": m["seq_clip_sum"] / rows,
            **_unit_stats(m, "ratio"),
            "approx_kl": m["approx_kl_sum"] / tokens,
            "pg_loss": m["pg_num"] / den,
        }
        if "token_ratio_count" in m:
            out.update(_unit_stats(m, "token_ratio"))
        if "dual_clip_tokens" in m:
            out["dual_clip_frac"] = m["dual_clip_tokens"] / tokens
        if "kl_ref_sum" in m:
            out["kl_ref"] = m["kl_ref_sum"] / tokens
            out["kl_loss"] = m["kl_num"] / den
        if "rollout_is_count" in m:
            out.update(_unit_stats(m, "rollout_is"))
            out["rollout_is_masked_frac"] = m["rollout_is_masked_tokens"] / tokens
        if "opsm_drop_sum" in m:
            out["opsm_drop_frac"] = m["opsm_drop_sum"] / rows
        if "entropy_num" in m:
            out["entropy_loss"] = m["entropy_num"] / den
        if "entropy_kept_tokens" in m:
            out["entropy_kept_frac"] = m["entropy_kept_tokens"] / tokens
        if "delta_clip_tokens" in m:
            out["delta_clip_frac"] = m["delta_clip_tokens"] / tokens
        if "cov_selected_tokens" in m:
            out["cov_frac"] = m["cov_selected_tokens"] / tokens
        if "abs_log_w_below" in m:
            out.update(log_w_percentiles_from_counts(m["abs_log_w_below"], m["tokens"]))
        return self.num / den, out


def log_w_percentiles_from_counts(below: jax.Array, total: jax.Array) -> dict:
    """{abs_log_w_p50: ...}: for each q in LOG_W_PERCENTILES the first edge of LOG_W_EDGES with
    at least q·total of the tokens at or below it, from below [edges] (the tokens at or below each
    edge, summed over any parts of a batch or of a step) and total (all the tokens); 0 when total
    is 0, NaN when fewer than q·total are below even inf (a NaN δ)."""
    edges = jnp.asarray(LOG_W_EDGES, jnp.float32)
    out = {}
    for q in LOG_W_PERCENTILES:
        first = jnp.argmax(below >= q * total)
        value = jnp.where(below[-1] >= q * total, edges[first], jnp.nan)
        out[f"abs_log_w_p{round(q * 100)}"] = jnp.where(total > 0, value, 0.0)
    return out


def _unit_sums(prefix: str, value: jax.Array, units: jax.Array) -> dict:
    """Sum, count, min and max of a per-unit value >= 0 ([B, T] or [B]) over units (0/1)."""
    return {
        f"{prefix}_sum": (value * units).sum(),
        f"{prefix}_count": units.sum(),
        f"{prefix}_min": jnp.where(units > 0, value, jnp.inf).min(),  # inf: identity of min
        f"{prefix}_max": (value * units).max(),  # values are >= 0, so 0 is the identity of max
    }


def _unit_stats(m: dict, prefix: str) -> dict:
    """Mean, min and max from _unit_sums (combined); 1.0 when there was no unit at all."""
    has_units = m[f"{prefix}_count"] > 0
    mean = m[f"{prefix}_sum"] / jnp.maximum(m[f"{prefix}_count"], 1.0)
    return {
        f"{prefix}_mean": jnp.where(has_units, mean, 1.0),
        f"{prefix}_min": jnp.where(has_units, m[f"{prefix}_min"], 1.0),
        f"{prefix}_max": jnp.where(has_units, m[f"{prefix}_max"], 1.0),
    }


# ----------------------------------------------------------------------------- the objective


@dataclasses.dataclass(frozen=True, kw_only=True)
class Objective:
    """A policy objective; call it, or use `.sums` for micro-batches and shards.

    Build one with `get_objective(name, **overrides)` (or dataclasses.replace on one). Frozen and
    hashable, so it can be a static argument of jit. name, ratio_level and surrogate are the
    preset's structure; every other field is overridable (OVERRIDABLE_FIELDS). Fields: see the
    module docstring; max_len is used by seq-mean-token-sum-norm only, dual_clip None is off,
    eps_low / eps_high are unused by sapo and tau_pos / tau_neg by the other surrogates.
    """

    name: str
    ratio_level: str
    surrogate: str
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: str
    max_len: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    dual_clip: float | None = None
    tau_pos: float = 1.0  # sapo: the gate's temperature where A > 0
    tau_neg: float = 1.05  # sapo: where A <= 0 (sharper: damps the destabilising updates)
    rollout_correction: str | None = None  # None | one of ROLLOUT_CORRECTIONS
    rollout_is_min: float | None = None  # lower bound of the correction weight (None: none)
    rollout_is_max: float = 3.0  # upper bound of the correction weight
    off_policy_mask: float | None = None  # δ of off-policy sequence masking (None: off)
    delta: float | None = None  # clip, clip_cov: two-sided clip, ρ ≤ delta (None: off)
    clip_ratio_c: float | None = None  # dppo_*: cap of the detached ratio (set by the preset)
    clip_cov_ratio: float | None = None  # clip_cov: fraction of tokens to detach
    clip_cov_lb: float | None = None  # clip_cov: covariance window (lb, ub)
    clip_cov_ub: float | None = None
    kl_cov_ratio: float | None = None  # kl_cov: fraction of tokens to penalise
    ppo_kl_coef: float | None = None  # kl_cov: weight of |logp − old_logp| on them
    top_entropy_quantile: float = 1.0  # train only on this top fraction of tokens by entropy
    entropy_coef: float = 0.0  # loss −= entropy_coef · aggregated entropy
    kl_unbiased: bool = False  # KL term weighted by the ratio (DeepSeek-V3.2's unbiased KL)
    log_w_percentiles: bool = False  # log percentiles of |δ| (one count per LOG_W_EDGES edge)

    def __post_init__(self):
        _validate(self)

    def __call__(
        self, logp, old_logp, adv, mask, ref_logp=None, rollout_logp=None, entropy=None
    ) -> tuple[jax.Array, dict]:
        """(loss, metrics) of one minibatch: loss = num / den of `self.sums`."""
        return self.sums(logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy).finalize()

    @property
    def needs_entropy(self) -> bool:
        """Whether a term reads the policy's per-token entropy (entropy= must then be given)."""
        return self.entropy_coef > 0 or self.top_entropy_quantile < 1

    def denominator(self, mask: jax.Array) -> jax.Array:
        """The aggregation's normaliser for this (part of the) minibatch; adds over parts."""
        _check_rank2("mask", mask)
        return self._denominator(_as_float32(mask).sum(-1), mask.shape[1])

    def _denominator(self, n_tok, t_padded):
        rows = (n_tok > 0).sum().astype(jnp.float32)  # R: non-empty rows
        if self.aggregation == "token-mean":
            return n_tok.sum()
        if self.aggregation == "seq-mean-token-sum-norm":
            return rows * float(self.max_len if self.max_len is not None else t_padded)
        return rows

    def _aggregate_token_sums(self, row_sums, n_tok):
        """num from row_sums [B] = Σ_t ℓ_{i,t}: the token mean per response, or the sum."""
        if self.aggregation == "seq-mean-token-mean":
            return (row_sums / jnp.maximum(n_tok, 1.0)).sum()
        return row_sums.sum()

    def _aggregate_response_losses(self, loss, n_tok):
        """num from a response-level L_i [B], counted once on each of the |y_i| tokens."""
        if self.aggregation == "seq-mean-token-mean":
            return loss.sum()  # (1/|y_i|) Σ_t L_i = L_i
        return (loss * n_tok).sum()

    def sums(
        self, logp, old_logp, adv, mask, ref_logp=None, rollout_logp=None, entropy=None
    ) -> Sums:
        """Sums(num, den, metric sums) of this (part of the) minibatch; see the module docstring."""
        logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy = _check_inputs(
            self, logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy
        )
        sg = jax.lax.stop_gradient
        valid = mask > 0  # [B, T]
        n_tok = mask.sum(-1)  # [B] |y_i|
        nonempty = n_tok > 0  # [B]
        delta = jnp.where(valid, logp - old_logp, 0.0)  # [B, T] δ; padding (even NaN) -> 0
        adv = jnp.where(valid if adv.ndim == 2 else nonempty, adv, 0.0)  # [B] or [B, T]

        if entropy is not None:
            entropy = jnp.where(valid, entropy, 0.0)  # [B, T] H_{i,t}; padding (even NaN) -> 0
        ratio = _RATIO_LEVELS[self.ratio_level](self, delta, adv, mask)  # ρ per unit
        unit_adv = _per_token(adv) if ratio.rho.ndim == 2 else adv  # A per unit: broadcasts to ρ
        tok = _Tokens(jnp.where(valid, logp, 0.0), jnp.where(valid, old_logp, 0.0), mask)
        terms = _SURROGATES[self.surrogate](self, ratio, unit_adv, tok)
        loss = terms.loss if terms.loss.ndim == 2 else jnp.where(nonempty, terms.loss, 0.0)
        weight, weight_metrics = self._loss_weight(logp, old_logp, adv, mask, rollout_logp, entropy)
        if weight is not None:
            loss = _unit_product(loss, weight)  # [B, T] or [B]: c·m·ℓ

        # Padding is dropped with where, not * mask (the same value): XLA:CPU then computes ℓ in
        # one fused pass instead of materialising its per-response factors as [B, T] arrays.
        if loss.ndim == 2:
            pg_num = self._aggregate_token_sums(jnp.where(valid, loss, 0.0).sum(-1), n_tok)
        else:
            pg_num = self._aggregate_response_losses(loss, n_tok)
        # Per-token terms beside ℓ: β·KL_{i,t} and −entropy_coef·H_{i,t}, aggregated like ℓ.
        extra, extra_num = 0.0, 0.0
        if ref_logp is not None:
            x = jnp.where(valid, ref_logp - logp, 0.0)  # [B, T] log π_ref/π_θ, 0 on padding
            kl = kl_estimate(x, self.kl_estimator)  # [B, T] KL_{i,t}, 0 on padding
            if self.kl_unbiased:  # DeepSeek-V3.2: weighted by the (undetached) ratio
                kl = kl * _per_token(ratio.rho if ratio.log_clip is None else ratio.reported)
            kl_rows = (kl * mask).sum(-1)  # [B] Σ_t KL_{i,t}
            kl_num = self._aggregate_token_sums(kl_rows, n_tok)
            extra, extra_num = extra + self.kl_coef * kl, extra_num + self.kl_coef * kl_num
        if self.entropy_coef > 0:
            ent_num = self._aggregate_token_sums(jnp.where(valid, entropy, 0.0).sum(-1), n_tok)
            extra = extra - self.entropy_coef * entropy
            extra_num = extra_num - self.entropy_coef * ent_num
        num = pg_num
        if ref_logp is not None or self.entropy_coef > 0:
            if loss.ndim == 2:  # one pass over ℓ + the extra terms (pg_num etc.: metrics only)
                per_token = jnp.where(valid, loss + extra, 0.0)
                num = self._aggregate_token_sums(per_token.sum(-1), n_tok)
            else:
                num = pg_num + extra_num

        row_low, row_high = _clipped_tokens_per_row(terms, adv, mask, n_tok)  # [B], [B]
        reported = sg(ratio.reported)  # [B, T] per token or [B] per response; > 0
        units = mask if reported.ndim == 2 else nonempty.astype(jnp.float32)  # ratio units, 0/1
        metrics = {
            "tokens": n_tok.sum(),
            "rows": nonempty.sum().astype(jnp.float32),
            "clip_low_tokens": row_low.sum(),
            "clip_high_tokens": row_high.sum(),
            "seq_clip_sum": ((row_low + row_high) / jnp.maximum(n_tok, 1.0)).sum(),
            **_unit_sums("ratio", reported, units),
            # k3 of x = log π_θ/π_old at tokens sampled from π_old: estimates KL[π_old ‖ π_θ].
            "approx_kl_sum": jnp.where(valid, kl_estimate(sg(delta), "k3"), 0.0).sum(),
            "pg_num": pg_num,
            **weight_metrics,
        }
        if reported.ndim == 1:  # one ratio per response: also the token ratios' range under it
            metrics.update(_unit_sums("token_ratio", clamped_exp(sg(delta)), mask))
        if self.dual_clip is not None:  # A < 0 and ρ > c: the dual clip bounds the loss
            dual = (unit_adv < 0) & (sg(ratio.rho) > self.dual_clip)
            metrics["dual_clip_tokens"] = _tokens_per_row(dual, mask, n_tok).sum()
        if ref_logp is not None:
            metrics["kl_ref_sum"] = kl_rows.sum()
            metrics["kl_num"] = kl_num
        if self.entropy_coef > 0:
            metrics["entropy_num"] = ent_num
        if self.delta is not None:  # A < 0 and ρ > δ: the two-sided clip bounds the loss
            capped = (unit_adv < 0) & (sg(ratio.rho) > self.delta)
            metrics["delta_clip_tokens"] = _tokens_per_row(capped, mask, n_tok).sum()
        if terms.selected is not None:
            metrics["cov_selected_tokens"] = jnp.where(terms.selected, mask, 0.0).sum()
        if self.log_w_percentiles:  # [edges] tokens with |δ| <= each edge
            abs_delta = jnp.abs(sg(delta))  # [B, T], 0 on padding
            metrics["abs_log_w_below"] = jnp.stack(
                [jnp.where(abs_delta <= e, mask, 0.0).sum() for e in LOG_W_EDGES]
            )
        metrics = {k: sg(v) for k, v in metrics.items()}
        return Sums(num, self._denominator(n_tok, mask.shape[1]), metrics)

    def _loss_weight(self, logp, old_logp, adv, mask, rollout_logp, entropy):
        """(c·m, metric sums): the detached weight on ℓ, [B] or [B, T], or (None, {}) if off.
        m includes the high-entropy mask (top_entropy_quantile < 1)."""
        weight, metrics = None, {}
        if self.top_entropy_quantile < 1:  # the "80/20" paper, TRL's get_high_entropy_mask
            threshold = masked_quantile(entropy, mask, 1.0 - self.top_entropy_quantile)
            high = (jax.lax.stop_gradient(entropy) >= threshold) & (mask > 0)  # [B, T]
            metrics["entropy_kept_tokens"] = jnp.where(high, mask, 0.0).sum()
            weight = high.astype(mask.dtype)
        if self.rollout_correction is None and self.off_policy_mask is None:
            return weight, metrics
        valid = mask > 0  # [B, T]
        n_tok = mask.sum(-1)  # [B]
        if self.rollout_correction is not None:
            log_mismatch = jnp.where(valid, old_logp - rollout_logp, 0.0)  # [B, T] Δ
            c = jax.lax.stop_gradient(
                rollout_correction_weight(
                    self.rollout_correction,
                    log_mismatch,
                    self.rollout_is_min,
                    self.rollout_is_max,
                    mask,
                )
            )  # [B, T] per token or [B] per response
            units = mask if c.ndim == 2 else (n_tok > 0).astype(jnp.float32)
            metrics.update(_unit_sums("rollout_is", c, units))
            metrics["rollout_is_masked_tokens"] = _tokens_per_row(c == 0, mask, n_tok).sum()
            weight = c if weight is None else _unit_product(weight, c)
        if self.off_policy_mask is not None:
            keep = off_policy_keep(adv, logp, rollout_logp, mask, self.off_policy_mask)
            dropped = _tokens_per_row(~keep, mask, n_tok)  # [B] dropped tokens per response
            metrics["opsm_drop_sum"] = (dropped / jnp.maximum(n_tok, 1.0)).sum()
            m = keep.astype(jnp.float32)  # [B] or [B, T]
            weight = m if weight is None else _unit_product(weight, m)
        return weight, metrics


# ----------------------------------------------------------------------------- ratio levels


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


def _sequence_ratio(obj, delta, adv, mask):
    """GSPO / LUSPO: one ratio per response, s_i = exp((1/|y_i|) Σ_t δ_{i,t})."""
    s = clamped_exp(sequence_log_ratio(delta, mask))  # [B] s_i
    return _Ratio(s, s)


def _sequence_token_ratio(obj, delta, adv, mask):
    """GSPO-token: s_{i,t} = sg[s_i]·π_θ(y_{i,t})/sg[π_θ(y_{i,t})]; value s_i, per-token grad."""
    if adv.ndim == 1:
        # With one A_i per response GSPO-token equals GSPO in value and gradient (GSPO eq. 14)
        # for every surrogate (ℓ is a function of the value s_i, and Σ_t ∂s_{i,t} = ∂s_i·|y_i|;
        # tested against this per-token path with a per-token A that is constant per response).
        return _sequence_ratio(obj, delta, adv, mask)
    sg = jax.lax.stop_gradient
    log_s = sequence_log_ratio(delta, mask)  # [B] log s_i
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


# ----------------------------------------------------------------------------- surrogates


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

# ----------------------------------------------------------------------------- presets

_GSPO_EPS = dict(eps_low=3e-4, eps_high=4e-4)  # GSPO §5.1
_SMTM = "seq-mean-token-mean"


def _preset(ratio_level: str, surrogate: str, aggregation: str, **fields) -> dict:
    return dict(ratio_level=ratio_level, surrogate=surrogate, aggregation=aggregation, **fields)


PRESETS: dict[str, dict] = {
    "grpo": _preset("token", "clip", _SMTM, eps_low=0.2, eps_high=0.2, kl_coef=0.04),
    "dapo": _preset("token", "clip", "token-mean", eps_low=0.2, eps_high=0.28),
    "dr_grpo": _preset("token", "clip", "seq-mean-token-sum-norm", eps_low=0.2, eps_high=0.2),
    "gspo": _preset("sequence", "clip", _SMTM, **_GSPO_EPS),
    "gspo_token": _preset("sequence_token", "clip", _SMTM, **_GSPO_EPS),
    "luspo": _preset("sequence", "clip", "seq-mean-token-sum", **_GSPO_EPS),
    "gmpo": _preset("geometric", "clip", _SMTM, eps_low=0.4, eps_high=0.4),  # log-space bounds
    "cispo": _preset("token", "cispo", "token-mean", eps_low=1.0, eps_high=4.0),  # ρ in [0, 5]
    "sapo": _preset("token", "sapo", _SMTM, tau_pos=1.0, tau_neg=1.05),  # eps unused
    # verl's defaults for Clip-Cov / KL-Cov (its policy_loss config), token-mean as in verl
    "clip_cov": _preset(
        "token", "clip_cov", "token-mean", clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0
    ),
    "kl_cov": _preset("token", "kl_cov", "token-mean", kl_cov_ratio=2e-4, ppo_kl_coef=1.0),
    # eps are divergence thresholds (verl's DPPO recipe: TV 0.15, KL 0.05, Dr. GRPO aggregation)
    "dppo_tv": _preset(
        "token", "dppo_tv", "seq-mean-token-sum-norm", eps_low=0.15, eps_high=0.15, clip_ratio_c=3.0
    ),
    "dppo_kl": _preset(
        "token", "dppo_kl", "seq-mean-token-sum-norm", eps_low=0.05, eps_high=0.05, clip_ratio_c=3.0
    ),
}
PRESET_NAMES = tuple(PRESETS)

# name, ratio_level and surrogate are what a preset is; every other field can be overridden.
_PRESET_STRUCTURE = ("name", "ratio_level", "surrogate")
OVERRIDABLE_FIELDS = tuple(
    f.name for f in dataclasses.fields(Objective) if f.name not in _PRESET_STRUCTURE
)


def _value_type(hint) -> type:
    """float | None -> float (the type of a field's values besides None)."""
    args = [a for a in typing.get_args(hint) if a is not types.NoneType]
    return args[0] if args else hint


# The value type of every overridable field (e.g. for typed command-line placeholders).
OVERRIDABLE_FIELD_TYPES: dict[str, type] = {
    name: _value_type(hint)
    for name, hint in typing.get_type_hints(Objective).items()
    if name in OVERRIDABLE_FIELDS
}


def get_objective(name: str, **overrides) -> Objective:
    """The preset `name` with any of OVERRIDABLE_FIELDS replaced, e.g. ("gspo", eps_low=0.2)."""
    if name not in PRESETS:
        raise ValueError(f"unknown objective {name!r}; valid: {PRESET_NAMES}")
    unknown = sorted(set(overrides) - set(OVERRIDABLE_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown override(s) {unknown} for objective {name!r}; valid: {OVERRIDABLE_FIELDS}"
        )
    return Objective(name=name, **{**PRESETS[name], **overrides})


# ----------------------------------------------------------------------------- validation


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _is_finite_number(x) -> bool:
    return _is_number(x) and math.isfinite(x)


def _validate(obj: Objective) -> None:
    """ValueError naming the valid choices (or the fix) for a bad field or combination."""
    if obj.ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {obj.ratio_level!r}; valid: {RATIO_LEVELS}")
    if obj.surrogate not in SURROGATES:
        raise ValueError(f"unknown surrogate {obj.surrogate!r}; valid: {SURROGATES}")
    if obj.ratio_level == "geometric" and obj.surrogate != "clip":
        raise ValueError(
            f"surrogate {obj.surrogate!r} needs an unclipped ratio, but the geometric ratio (gmpo) "
            "clips each token itself and takes surrogate 'clip'; use ratio_level 'token', "
            f"'sequence' or 'sequence_token' with {obj.surrogate!r}"
        )
    for field in ("eps_low", "eps_high"):
        eps = getattr(obj, field)
        if not _is_number(eps) or not eps >= 0:  # also rejects NaN
            raise ValueError(f"{field} must be a number >= 0 (e.g. 0.2 or 3e-4), got {eps!r}")
    if obj.surrogate == "clip" and obj.ratio_level != "geometric" and not obj.eps_low < 1:
        raise ValueError(
            f"eps_low must be < 1 so that the lower clip bound 1 - eps_low stays positive, got "
            f"{obj.eps_low!r}; valid: 0 <= eps_low < 1 (gspo uses 3e-4, grpo 0.2)"
        )
    if obj.surrogate == "cispo" and not obj.eps_low <= 1:
        raise ValueError(
            f"eps_low must be <= 1 for cispo (its weight's lower bound 1 - eps_low must not be "
            f"negative; 1 means no lower clip, the preset), got {obj.eps_low!r}"
        )
    if obj.aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {obj.aggregation!r}; valid: {AGGREGATIONS}")
    if obj.max_len is not None and (
        not isinstance(obj.max_len, int) or isinstance(obj.max_len, bool) or obj.max_len < 1
    ):
        raise ValueError(f"max_len must be None (padded T) or an int >= 1, got {obj.max_len!r}")
    if not _is_number(obj.kl_coef) or not obj.kl_coef >= 0:
        raise ValueError(
            f"kl_coef must be a number >= 0 (0 disables the KL term), got {obj.kl_coef!r}"
        )
    if obj.kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {obj.kl_estimator!r}; valid: {KL_ESTIMATORS}")
    if obj.dual_clip is not None and (not _is_number(obj.dual_clip) or not obj.dual_clip > 1):
        raise ValueError(
            f"dual_clip must be None (off) or a number > 1 (e.g. 3.0), got {obj.dual_clip!r}"
        )
    if obj.dual_clip is not None and obj.surrogate != "clip":
        raise ValueError(
            f"dual_clip bounds the clip surrogate's loss; {obj.name} uses surrogate "
            f"{obj.surrogate!r}, which has none: set dual_clip=None"
        )
    for field in ("tau_pos", "tau_neg"):
        tau = getattr(obj, field)
        if not _is_finite_number(tau) or not tau > 0:
            raise ValueError(
                f"{field} must be a finite number > 0 (sapo's gate temperature, e.g. 1.0 or "
                f"1.05), got {tau!r}"
            )
    if obj.rollout_correction is not None and obj.rollout_correction not in ROLLOUT_CORRECTIONS:
        raise ValueError(
            f"unknown rollout_correction {obj.rollout_correction!r}; valid: None (off) or one "
            f"of {ROLLOUT_CORRECTIONS}"
        )
    if not _is_finite_number(obj.rollout_is_max) or not obj.rollout_is_max > 0:
        raise ValueError(
            f"rollout_is_max must be a finite number > 0 (e.g. 3.0), got {obj.rollout_is_max!r}"
        )
    if obj.rollout_is_min is not None:
        if not _is_finite_number(obj.rollout_is_min) or not obj.rollout_is_min >= 0:
            raise ValueError(
                "rollout_is_min must be None (no lower bound) or a finite number >= 0, got "
                f"{obj.rollout_is_min!r}"
            )
        if obj.rollout_is_min > obj.rollout_is_max:
            raise ValueError(
                f"rollout_is_min ({obj.rollout_is_min!r}) must be <= rollout_is_max "
                f"({obj.rollout_is_max!r}): the weight is kept inside [rollout_is_min, "
                "rollout_is_max]; lower rollout_is_min or raise rollout_is_max"
            )
    _validate_family_fields(obj)
    if obj.off_policy_mask is not None and not _is_finite_number(obj.off_policy_mask):
        raise ValueError(
            "off_policy_mask must be None (off) or a finite number δ (the mean per-token log-ratio "
            f"rollout/current above which a negative-advantage response is dropped, e.g. 0.5), "
            f"got {obj.off_policy_mask!r}"
        )


# The fields only one surrogate reads (None elsewhere; its preset sets them), with their range:
# (field, check, what a valid value is).
_SURROGATE_FIELDS = {
    "clip_cov": (
        ("clip_cov_ratio", lambda v: 0 < v <= 1, "a fraction in (0, 1], e.g. 2e-4"),
        ("clip_cov_lb", lambda v: True, "a finite number (the covariance window's lower end)"),
        ("clip_cov_ub", lambda v: True, "a finite number (the covariance window's upper end)"),
    ),
    "kl_cov": (
        ("kl_cov_ratio", lambda v: 0 < v <= 1, "a fraction in (0, 1], e.g. 2e-4"),
        ("ppo_kl_coef", lambda v: v >= 0, "a number >= 0, e.g. 1.0"),
    ),
    "dppo_tv": (("clip_ratio_c", lambda v: v > 0, "a number > 0, e.g. 3.0"),),
    "dppo_kl": (("clip_ratio_c", lambda v: v > 0, "a number > 0, e.g. 3.0"),),
}
# Surrogates that read each token's own ratio and log-prob (batch-level or per-token rules).
_TOKEN_ONLY_SURROGATES = ("clip_cov", "kl_cov", "dppo_tv", "dppo_kl")


def _validate_family_fields(obj: Objective) -> None:
    """The surrogate-specific fields (set exactly where their surrogate reads them, in range),
    delta, the entropy terms and kl_unbiased."""
    own = {f: (ok, what) for f, ok, what in _SURROGATE_FIELDS.get(obj.surrogate, ())}
    for field in sorted({f for fields in _SURROGATE_FIELDS.values() for f, _, _ in fields}):
        value = getattr(obj, field)
        readers = sorted(s for s, fs in _SURROGATE_FIELDS.items() if field in [f[0] for f in fs])
        if field not in own:
            if value is not None:
                raise ValueError(
                    f"{field} is read only by surrogate(s) {readers}; {obj.name} uses surrogate "
                    f"{obj.surrogate!r}, which ignores it: leave {field}=None"
                )
        elif not _is_finite_number(value) or not own[field][0](value):
            raise ValueError(f"{field} must be {own[field][1]} for {obj.name}, got {value!r}")
    if obj.surrogate == "clip_cov" and not obj.clip_cov_lb < obj.clip_cov_ub:
        raise ValueError(
            f"clip_cov_lb ({obj.clip_cov_lb!r}) must be < clip_cov_ub ({obj.clip_cov_ub!r}): the "
            "tokens clip_cov detaches have a covariance inside (lb, ub)"
        )
    if obj.surrogate in _TOKEN_ONLY_SURROGATES and obj.ratio_level != "token":
        raise ValueError(
            f"surrogate {obj.surrogate!r} acts on each token's own ratio and log-prob: use "
            f"ratio_level 'token', not {obj.ratio_level!r}"
        )
    if obj.delta is not None:
        if obj.surrogate not in ("clip", "clip_cov") or obj.ratio_level == "geometric":
            raise ValueError(
                f"delta caps the unclipped ratio of PPO's clip; {obj.name} (surrogate "
                f"{obj.surrogate!r}, ratio level {obj.ratio_level!r}) has none: set delta=None"
            )
        if not _is_finite_number(obj.delta) or not obj.delta > 1 + obj.eps_high:
            raise ValueError(
                f"delta must be None (off) or a number > 1 + eps_high = {1 + obj.eps_high!r} "
                f"(e.g. 4.0, INTELLECT-2's value), got {obj.delta!r}"
            )
    q = obj.top_entropy_quantile
    if not _is_finite_number(q) or not 0 < q <= 1:
        raise ValueError(
            f"top_entropy_quantile must be a fraction in (0, 1] (1 trains on every token, 0.2 on "
            f"the top 20 % by entropy), got {q!r}"
        )
    if not _is_finite_number(obj.entropy_coef) or not obj.entropy_coef >= 0:
        raise ValueError(
            f"entropy_coef must be a finite number >= 0 (0 disables the entropy bonus, e.g. 1e-3), "
            f"got {obj.entropy_coef!r}"
        )
    if not isinstance(obj.kl_unbiased, bool):
        raise ValueError(f"kl_unbiased must be True or False, got {obj.kl_unbiased!r}")
    if not isinstance(obj.log_w_percentiles, bool):
        raise ValueError(f"log_w_percentiles must be True or False, got {obj.log_w_percentiles!r}")
    if obj.kl_unbiased and not obj.kl_coef > 0:
        raise ValueError(
            f"kl_unbiased weights the KL term, which {obj.name}'s kl_coef=0 switches off: set "
            "kl_coef > 0 (e.g. 0.04) or kl_unbiased=False"
        )


def _check_rank2(name, x):
    if getattr(x, "ndim", None) != 2:
        raise ValueError(
            f"{name} must be a [B, T] array, got shape {getattr(x, 'shape', type(x).__name__)}"
        )


def _as_float32(x):
    """At least float32: bf16 / f16 / integer / bool inputs are upcast, float64 stays float64 (with
    jax_enable_x64 the objectives then compute in float64, as a float64 reference check needs)."""
    x = jnp.asarray(x)
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    return x if x.dtype == dtype else x.astype(dtype)


def _check_inputs(obj, logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy):
    """ValueError (naming the valid shapes, or the fix) for bad inputs; upcasts to float32."""
    _check_rank2("logp", logp)
    B, T = logp.shape
    named = [("old_logp", old_logp), ("mask", mask)]
    optional = (("ref_logp", ref_logp), ("rollout_logp", rollout_logp), ("entropy", entropy))
    named += [(n, x) for n, x in optional if x is not None]
    for name, x in named:
        if getattr(x, "shape", None) != (B, T):
            raise ValueError(
                f"{name} has shape {getattr(x, 'shape', None)}; it must match logp's [B, T] = "
                f"{(B, T)}"
            )
    adv_shape = getattr(adv, "shape", None)
    if adv_shape not in ((B,), (B, T)):
        raise ValueError(
            f"adv has shape {adv_shape}; valid: [B] = {(B,)} (one per response) or [B, T] = "
            f"{(B, T)} (one per token). Did you pass the (adv, metrics) pair of "
            "advantages.group_advantages instead of its adv?"
        )
    if len(adv_shape) == 2 and obj.ratio_level in ("sequence", "geometric"):
        raise ValueError(
            f"{obj.name} has one ratio per response, so adv must be [B] = {(B,)}; per-token "
            "advantages [B, T] need a per-token ratio (ratio_level 'token' or 'sequence_token'): "
            "grpo, dapo, dr_grpo, cispo, sapo or gspo_token"
        )
    if rollout_logp is None:
        for field in ("rollout_correction", "off_policy_mask"):
            if getattr(obj, field) is not None:
                raise ValueError(
                    f"{obj.name} has {field}={getattr(obj, field)!r}, which reads the rollout "
                    "engine's log-probs: pass rollout_logp=[B, T] (the sampler's log-probs of "
                    f"the response tokens), or set {field}=None"
                )
    if entropy is None and obj.needs_entropy:
        fields = (
            f"entropy_coef={obj.entropy_coef!r}, top_entropy_quantile={obj.top_entropy_quantile!r}"
        )
        raise ValueError(
            f"{obj.name} has {fields}, which read the policy's per-token entropy: pass "
            "entropy=[B, T] (response_logprobs' entropy), or set entropy_coef=0 and "
            "top_entropy_quantile=1"
        )
    ref_logp, rollout_logp, entropy = (
        None if x is None else _as_float32(x) for x in (ref_logp, rollout_logp, entropy)
    )
    logp, old_logp, adv, mask = (_as_float32(x) for x in (logp, old_logp, adv, mask))
    # The checks above raise ValueError with the fix; these chex asserts state the boundary's
    # contract (trace-time only, free at run time) for readers and for later edits.
    optional = [x for x in (ref_logp, rollout_logp, entropy) if x is not None]
    chex.assert_equal_shape([logp, old_logp, mask] + optional)
    chex.assert_type([logp, old_logp, adv, mask], float)
    return logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy
