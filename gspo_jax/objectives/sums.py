"""Sums: an objective's numerator, denominator and metric sums over one part of a minibatch,
which add over micro-batches and shards (global normalisation, docs/objectives.md).

Dimension legend: B response rows, T padded response length.

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
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from gspo_jax.objectives.terms import LOG_W_EDGES, LOG_W_PERCENTILES


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
