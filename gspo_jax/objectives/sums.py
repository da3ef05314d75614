"""Sums: an objective's numerator, denominator and metric sums over one part of a minibatch,
which add over micro-batches and shards (global normalisation, docs/objectives.md).

Dimension legend: B response rows, T padded response length.
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
