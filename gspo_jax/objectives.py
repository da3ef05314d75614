"""Policy objectives of the GRPO family: grpo, dapo, dr_grpo, gspo, gspo_token, luspo, gmpo.

Dimension legend: B response rows (P prompts x G samples, group-contiguous), T padded response
length. Inputs are [B, T] float32 (bf16 is upcast), `mask` is 1 on response tokens (EOS
included) and 0 on padding (bool, int or float, but 0/1); `adv` is one advantage per response
[B] or per token [B, T] (per-token needs a per-token ratio: grpo, dapo, dr_grpo, gspo_token).

    obj = get_objective("gspo", eps_low=0.2, eps_high=0.2)   # preset + any OVERRIDABLE_FIELDS
    loss, metrics = obj(logp, old_logp, adv, mask, ref_logp=None)
    num, den, metric_sums = obj.sums(logp, old_logp, adv, mask, ref_logp=None)  # loss = num / den

Every objective is one clipped surrogate assembled from orthogonal parts (docs/objectives.md),
with δ_{i,t} = logp − old_logp and |y_i| = Σ_t mask_{i,t}:

  ratio_level  "token"           w_{i,t} = exp(δ_{i,t})                         grpo, dapo, dr_grpo
               "sequence"        s_i = exp(Σ_t δ_{i,t} / |y_i|)                 gspo, luspo
               "sequence_token"  s_{i,t} = sg[s_i]·π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]  gspo_token
               "geometric"       exp(Σ_t δ*_{i,t} / |y_i|), δ* clipped in log space  gmpo
  clip         L_u = −min(ρ_u·A_u, clip(ρ_u, 1 − eps_low, 1 + eps_high)·A_u);
               dual clip c > 1: L_u = min(L_u, −c·A_u) where A_u < 0
  aggregation  per-token losses ℓ_{i,t} (a response-level L_i counts on each of its tokens):
               seq-mean-token-mean      (1/R) Σ_i (1/|y_i|) Σ_t ℓ_{i,t}
               token-mean               Σ_{i,t} ℓ_{i,t} / Σ_i |y_i|
               seq-mean-token-sum       (1/R) Σ_i Σ_t ℓ_{i,t}          (LUSPO's length weight)
               seq-mean-token-sum-norm  Σ_{i,t} ℓ_{i,t} / (R·max_len)  (Dr. GRPO)
  KL           + kl_coef · KL[π_θ ‖ π_ref], per-token k1 | k2 | k3 of x = ref_logp − logp,
               aggregated like the policy loss (only when ref_logp is given: grpo's β = 0.04
               applies only then; the other presets have kl_coef 0, kl_ref is still reported)
Presets (PRESETS) are these parts with the documented values; luspo is gspo with seq-mean-token-sum,
gspo with eps 0.2 is `get_objective("gspo", eps_low=0.2, eps_high=0.2)`. For gmpo, eps_low and
eps_high bound δ in log space (clip (e^−0.4, e^0.4)), so eps_low < 1 is not required there.

R counts the *non-empty* rows: a row whose mask is all zero contributes nothing to any sum or
count, so padding a minibatch with empty rows (e.g. to fill every shard) changes nothing.
max_len=None means the padded T of the arrays passed (set it to the sampler's max_new_tokens when
micro-batches might differ in T). exp() arguments are clamped to ±20 (before the exp, so that no
branch ever holds an inf whose gradient could turn into NaN); values under mask 0, even NaN or inf,
never reach a value or a gradient.

Global normalisation. Every aggregation is `loss = num / den` with
  num = Σ_{i,t} c_{i,t}·ℓ_{i,t}   (c_{i,t} = 1/|y_i| for seq-mean-token-mean, else 1)
  den = R | Σ_i |y_i| | R | R·max_len          (depends on the mask only)
and num, den and every metric sum simply add up over micro-batches and shards. `obj.sums(...)`
returns them as `Sums(num, den, metrics)`; `obj(...)` is `obj.sums(...).finalize()`. The trainer:

  den = sum(obj.denominator(mask_k) for k in micro_batches)      # mask only: before any forward
  grad = Σ_k ∇θ obj.sums(logp_k(θ), old_k, adv_k, mask_k).num / den   # gradient accumulation
  loss, metrics = functools.reduce(Sums.combine, sums_k).finalize()   # = Σ_k num_k / den
  # in jax.shard_map over the batch axis: loss, metrics = obj.sums(...).psum("data").finalize()
  # under plain jit with batch-sharded arrays obj(...) is already global (XLA sums over shards)
  # a scanned micro-batch loop with stacked Sums: sums.reduce_stacked().finalize()
Gradients flow through `num` only (metric sums are stop-gradient); jax.grad through
`.psum(...).finalize()[0]` inside shard_map gives the global gradient.

Metric sums are additive (`*_tokens`, `*_sum`, `tokens`, `rows`, `ratio_count`, `pg_num`,
`kl_num`) except `ratio_min` / `ratio_max` (combined by min / max; ±inf in a part with no ratio
unit, the identity of min / max). Finalised metrics:
  clip_frac, clip_frac_low, clip_frac_high   per response token (a clipped response clips all of
                                             its tokens); low: ρ < 1 − eps_low with A < 0,
                                             high: ρ > 1 + eps_high with A > 0
  seq_clip_frac        mean over responses of the fraction of their tokens clipped (for the
                       sequence-level objectives: the fraction of clipped responses)
  dual_clip_frac       per token, only when dual_clip is set
  ratio_mean/min/max   over ratio units: tokens for token ratios, responses (s_i, before any
                       clip) for gspo, gspo_token, luspo and gmpo; 1.0 when there is no unit
  approx_kl            Σ k3(δ) / tokens = mean of exp(δ) − 1 − δ: the unbiased estimate of
                       KL[π_old ‖ π_θ] from the rollout tokens (sampled from π_old)
  kl_ref, kl_loss      (ref_logp given) token mean of the estimator, and its aggregated value
  pg_loss              the policy term; loss = pg_loss + kl_coef · kl_loss

Performance (experiments/benchmarks/objectives_bench.py, B=256, T=2048, XLA:CPU): loss +
gradient of every preset runs within 3x of a masked mean of logp with its gradient (token-level
≈ 2.3-2.8x, response-level ≈ 1.4-1.5x, CPU time). On CPU each metric costs its own pass over
[B, T] (≈ 3x the floor for all of them; GPU/TPU fuse them); a KL term or per-token advantages
read one more [B, T] input. GSPO-token with [B] advantages takes GSPO's path (equal in value
and gradient); the per-token path needs no per-token exp (see _sequence_token_terms).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

EXP_CLAMP = 20.0  # exp(±20) ≈ 4.9e8 / 2.1e-9: large but finite

RATIO_LEVELS = ("token", "sequence", "sequence_token", "geometric")
AGGREGATIONS = (
    "seq-mean-token-mean",
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
KL_ESTIMATORS = ("k1", "k2", "k3")
OVERRIDABLE_FIELDS = (
    "eps_low",
    "eps_high",
    "aggregation",
    "max_len",
    "kl_coef",
    "kl_estimator",
    "dual_clip",
)


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


def clipped_surrogate(ratio, adv, eps_low: float, eps_high: float, dual_clip=None):
    """L_u = −min(ρ·A, clip(ρ, 1 − eps_low, 1 + eps_high)·A), then min(L_u, −c·A) where A < 0.

    ratio and adv broadcast against each other (e.g. [B, T] with [B, 1]).
    """
    loss = -jnp.minimum(ratio * adv, clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    if dual_clip is not None:
        loss = jnp.where(adv < 0, jnp.minimum(loss, -dual_clip * adv), loss)
    return loss


def _tokens_per_row(indicator: jax.Array, mask: jax.Array, n_tok: jax.Array) -> jax.Array:
    """[B] tokens per response where a unit indicator holds; a response-level [B] indicator
    counts all |y_i| tokens of its response (a clipped response clips all its tokens)."""
    if indicator.ndim == 2:
        # The barrier keeps XLA from turning later sums of these row counts into second passes
        # over [B, T] (it rewrites reduce(reduce(x)) as one reduce of x).
        return jax.lax.optimization_barrier(jnp.where(indicator, mask, 0.0).sum(-1))
    return jnp.where(indicator, n_tok, 0.0)


def _clipped_tokens_per_row(terms, adv, mask, n_tok):
    """[B] clipped tokens per response on the low (A < 0) and the high (A > 0) side."""
    if adv.ndim == 1 and terms.clip_low.ndim == 2:
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

    num: jax.Array  # scalar: Σ c_{i,t}·ℓ_{i,t}, policy term + kl_coef · KL term
    den: jax.Array  # scalar: the aggregation's normaliser, a function of the mask only
    metrics: dict  # str -> scalar: additive sums and counts, ratio_min / ratio_max

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
        den = jnp.maximum(self.den, 1.0)  # den is 0 (no response token at all) or >= 1
        has_units = m["ratio_count"] > 0
        out = {
            "clip_frac": (m["clip_low_tokens"] + m["clip_high_tokens"]) / tokens,
            "clip_frac_low": m["clip_low_tokens"] / tokens,
            "clip_frac_high": m["clip_high_tokens"] / tokens,
            "seq_clip_frac": m["seq_clip_sum"] / jnp.maximum(m["rows"], 1.0),
            "ratio_mean": jnp.where(
                has_units, m["ratio_sum"] / jnp.maximum(m["ratio_count"], 1.0), 1.0
            ),
            "ratio_min": jnp.where(has_units, m["ratio_min"], 1.0),
            "ratio_max": jnp.where(has_units, m["ratio_max"], 1.0),
            "approx_kl": m["approx_kl_sum"] / tokens,
            "pg_loss": m["pg_num"] / den,
        }
        if "dual_clip_tokens" in m:
            out["dual_clip_frac"] = m["dual_clip_tokens"] / tokens
        if "kl_ref_sum" in m:
            out["kl_ref"] = m["kl_ref_sum"] / tokens
            out["kl_loss"] = m["kl_num"] / den
        return self.num / den, out


# ----------------------------------------------------------------------------- the objective


class _PolicyTerms(NamedTuple):
    """What a ratio level hands to the aggregation and the metrics."""

    loss: jax.Array  # ℓ per unit: [B, T] per token (finite, masked when summed) or [B] L_i
    ratio: jax.Array  # ρ per unit, same shape as loss (for the dual-clip count)
    clip_low: jax.Array  # bool per clip unit, [B, T] or [B]: ρ < 1 − eps_low with A < 0
    clip_high: jax.Array  # bool per clip unit, [B, T] or [B]: ρ > 1 + eps_high with A > 0
    reported: jax.Array  # the ratio for ratio_mean/min/max: w [B, T] or s_i [B], unclipped


@dataclasses.dataclass(frozen=True)
class Objective:
    """A clipped policy objective; call it, or use `.sums` for micro-batches and shards.

    Build one with `get_objective(name, **overrides)` (or dataclasses.replace on one). Frozen and
    hashable, so it can be a static argument of jit. Fields: see the module docstring; max_len
    is used by seq-mean-token-sum-norm only, dual_clip None is off.
    """

    name: str
    ratio_level: str
    eps_low: float
    eps_high: float
    aggregation: str
    max_len: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    dual_clip: float | None = None

    def __post_init__(self):
        _validate(self)

    def __call__(self, logp, old_logp, adv, mask, ref_logp=None) -> tuple[jax.Array, dict]:
        """(loss, metrics) of one minibatch: loss = num / den of `self.sums`."""
        return self.sums(logp, old_logp, adv, mask, ref_logp).finalize()

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

    def sums(self, logp, old_logp, adv, mask, ref_logp=None) -> Sums:
        """Sums(num, den, metric sums) of this (part of the) minibatch; see the module docstring."""
        logp, old_logp, adv, mask, ref_logp = _check_inputs(
            self, logp, old_logp, adv, mask, ref_logp
        )
        valid = mask > 0  # [B, T]
        n_tok = mask.sum(-1)  # [B] |y_i|
        nonempty = n_tok > 0  # [B]
        delta = jnp.where(valid, logp - old_logp, 0.0)  # [B, T] δ; padding (even NaN) -> 0
        adv = jnp.where(valid if adv.ndim == 2 else nonempty, adv, 0.0)  # [B] or [B, T]

        terms = _RATIO_TERMS[self.ratio_level](self, delta, adv, mask, n_tok, nonempty)
        if terms.loss.ndim == 2:
            pg_num = self._aggregate_token_sums((terms.loss * mask).sum(-1), n_tok)
        else:
            pg_num = self._aggregate_response_losses(terms.loss, n_tok)
        num = pg_num
        if ref_logp is not None:
            x = jnp.where(valid, ref_logp - logp, 0.0)  # [B, T] log π_ref/π_θ, 0 on padding
            kl = kl_estimate(x, self.kl_estimator)  # [B, T] KL_{i,t}, 0 on padding
            kl_rows = (kl * mask).sum(-1)  # [B] Σ_t KL_{i,t}
            kl_num = self._aggregate_token_sums(kl_rows, n_tok)
            if terms.loss.ndim == 2:  # one pass over ℓ + β·KL (pg_num, kl_num: metrics only)
                per_token = (terms.loss + self.kl_coef * kl) * mask
                num = self._aggregate_token_sums(per_token.sum(-1), n_tok)
            else:
                num = pg_num + self.kl_coef * kl_num

        sg = jax.lax.stop_gradient
        row_low, row_high = _clipped_tokens_per_row(terms, adv, mask, n_tok)  # [B], [B]
        ratio = sg(terms.reported)  # [B, T] per token or [B] per response; > 0
        units = mask if ratio.ndim == 2 else nonempty.astype(jnp.float32)  # ratio units, 0/1
        metrics = {
            "tokens": n_tok.sum(),
            "rows": nonempty.sum().astype(jnp.float32),
            "clip_low_tokens": row_low.sum(),
            "clip_high_tokens": row_high.sum(),
            "seq_clip_sum": ((row_low + row_high) / jnp.maximum(n_tok, 1.0)).sum(),
            "ratio_sum": (ratio * units).sum(),
            "ratio_count": n_tok.sum() if ratio.ndim == 2 else units.sum(),
            "ratio_min": jnp.where(units > 0, ratio, jnp.inf).min(),  # inf: identity of min
            "ratio_max": (ratio * units).max(),  # ratios are > 0, so 0 is the identity of max
            # k3 of x = log π_θ/π_old at tokens sampled from π_old: estimates KL[π_old ‖ π_θ].
            "approx_kl_sum": jnp.where(valid, kl_estimate(sg(delta), "k3"), 0.0).sum(),
            "pg_num": pg_num,
        }
        if self.dual_clip is not None:  # A < 0 and ρ > c: the dual clip bounds the loss
            unit_adv = adv[:, None] if terms.ratio.ndim > adv.ndim else adv
            dual = (unit_adv < 0) & (sg(terms.ratio) > self.dual_clip)
            metrics["dual_clip_tokens"] = _tokens_per_row(dual, mask, n_tok).sum()
        if ref_logp is not None:
            metrics["kl_ref_sum"] = kl_rows.sum()
            metrics["kl_num"] = kl_num
        metrics = {k: sg(v) for k, v in metrics.items()}
        return Sums(num, self._denominator(n_tok, mask.shape[1]), metrics)


# ----------------------------------------------------------------------------- ratio levels


def _clipped(ratio, adv, obj):
    """Where the clip is the active branch: (ρ < 1 − eps_low and A < 0, ρ > 1 + eps_high and A > 0).

    Padding needs no care here: the metrics count these through the mask.
    """
    return (ratio < 1.0 - obj.eps_low) & (adv < 0), (ratio > 1.0 + obj.eps_high) & (adv > 0)


def _token_terms(obj, delta, adv, mask, n_tok, nonempty):
    """GRPO / DAPO / Dr. GRPO: w_{i,t} = exp(δ_{i,t}), clipped token by token."""
    w = clamped_exp(delta)  # [B, T] w_{i,t}
    A = adv if adv.ndim == 2 else adv[:, None]  # A_{i,t} [B, T] or A_i [B, 1]
    loss = clipped_surrogate(w, A, obj.eps_low, obj.eps_high, obj.dual_clip)  # [B, T]
    low, high = _clipped(w, A, obj)
    return _PolicyTerms(loss, w, low, high, w)


def _sequence_terms(obj, delta, adv, mask, n_tok, nonempty):
    """GSPO / LUSPO: one ratio per response, s_i = exp((1/|y_i|) Σ_t δ_{i,t})."""
    log_s = sequence_log_ratio(delta, mask)  # [B] log s_i
    s = clamped_exp(log_s)  # [B] s_i
    loss = clipped_surrogate(s, adv, obj.eps_low, obj.eps_high, obj.dual_clip)  # [B] L_i
    low, high = _clipped(s, adv, obj)
    return _PolicyTerms(jnp.where(nonempty, loss, 0.0), s, low, high, s)


def _sequence_token_terms(obj, delta, adv, mask, n_tok, nonempty):
    """GSPO-token: s_{i,t} = sg[s_i]·π_θ(y_{i,t})/sg[π_θ(y_{i,t})]; value s_i, per-token grad."""
    if adv.ndim == 1:
        # With one A_i per response GSPO-token equals GSPO in value and gradient (GSPO eq. 14;
        # tested against this per-token path with a per-token A that is constant per response).
        return _sequence_terms(obj, delta, adv, mask, n_tok, nonempty)
    sg = jax.lax.stop_gradient
    log_s = sequence_log_ratio(delta, mask)  # [B] log s_i
    s = clamped_exp(log_s)  # [B] s_i
    # π_θ/sg[π_θ] = exp(u) with u = logp − sg(logp) = δ − sg(δ) (old_logp is data): u is 0 in
    # value and ∂u/∂logp = 1, so exp(u) and 1 + u agree in value and gradient, and the linear form
    # needs no per-token exp. ds_i/dlog s_i is 0 past the exp clamp, as for the other ratios.
    slope = jnp.where(jnp.abs(log_s) < EXP_CLAMP, s, 0.0)  # [B]
    s_it = sg(s)[:, None] + sg(slope)[:, None] * (delta - sg(delta))  # [B, T] s_{i,t}
    loss = clipped_surrogate(s_it, adv, obj.eps_low, obj.eps_high, obj.dual_clip)  # [B, T]
    low, high = _clipped(s_it, adv, obj)
    return _PolicyTerms(loss, s_it, low, high, s)


def _geometric_terms(obj, delta, adv, mask, n_tok, nonempty):
    """GMPO: δ*_t = σ·min(σ·δ_t, σ·clip(δ_t, −eps_low, eps_high)), σ = sign(A_i);
    ratio_i = exp((1/|y_i|) Σ_t δ*_t); L_i = −A_i·ratio_i."""
    sigma = jnp.sign(adv)[:, None]  # [B, 1]
    delta_clipped = clip(delta, -obj.eps_low, obj.eps_high)  # [B, T]
    delta_star = sigma * jnp.minimum(sigma * delta, sigma * delta_clipped)  # [B, T]
    ratio = clamped_exp(sequence_log_ratio(delta_star, mask))  # [B]
    loss = -adv * ratio  # [B] L_i
    if obj.dual_clip is not None:
        loss = jnp.where(adv < 0, jnp.minimum(loss, -obj.dual_clip * adv), loss)
    # Reported: the unclipped geometric mean s_i; clipped: tokens whose δ the clip moved.
    s = clamped_exp(sequence_log_ratio(delta, mask))  # [B]
    low = (delta < -obj.eps_low) & (adv < 0)[:, None]  # [B, T]
    high = (delta > obj.eps_high) & (adv > 0)[:, None]  # [B, T]
    return _PolicyTerms(jnp.where(nonempty, loss, 0.0), ratio, low, high, s)


_RATIO_TERMS = {
    "token": _token_terms,
    "sequence": _sequence_terms,
    "sequence_token": _sequence_token_terms,
    "geometric": _geometric_terms,
}

# ----------------------------------------------------------------------------- presets

_GSPO_EPS = dict(eps_low=3e-4, eps_high=4e-4)  # GSPO §5.1
_SMTM = "seq-mean-token-mean"

PRESETS: dict[str, dict] = {
    "grpo": dict(ratio_level="token", eps_low=0.2, eps_high=0.2, aggregation=_SMTM, kl_coef=0.04),
    "dapo": dict(ratio_level="token", eps_low=0.2, eps_high=0.28, aggregation="token-mean"),
    "dr_grpo": dict(
        ratio_level="token", eps_low=0.2, eps_high=0.2, aggregation="seq-mean-token-sum-norm"
    ),
    "gspo": dict(ratio_level="sequence", aggregation=_SMTM, **_GSPO_EPS),
    "gspo_token": dict(ratio_level="sequence_token", aggregation=_SMTM, **_GSPO_EPS),
    "luspo": dict(ratio_level="sequence", aggregation="seq-mean-token-sum", **_GSPO_EPS),
    "gmpo": dict(ratio_level="geometric", eps_low=0.4, eps_high=0.4, aggregation=_SMTM),
}


def get_objective(name: str, **overrides) -> Objective:
    """The preset `name` with any of OVERRIDABLE_FIELDS replaced, e.g. ("gspo", eps_low=0.2)."""
    if name not in PRESETS:
        raise ValueError(f"unknown objective {name!r}; valid: {tuple(PRESETS)}")
    unknown = sorted(set(overrides) - set(OVERRIDABLE_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown override(s) {unknown} for objective {name!r}; valid: {OVERRIDABLE_FIELDS}"
        )
    return Objective(name=name, **{**PRESETS[name], **overrides})


# ----------------------------------------------------------------------------- validation


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _validate(obj: Objective) -> None:
    if obj.ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {obj.ratio_level!r}; valid: {RATIO_LEVELS}")
    for field in ("eps_low", "eps_high"):
        eps = getattr(obj, field)
        if not _is_number(eps) or not eps >= 0:  # also rejects NaN
            raise ValueError(f"{field} must be a number >= 0 (e.g. 0.2 or 3e-4), got {eps!r}")
    if obj.ratio_level != "geometric" and not obj.eps_low < 1:
        raise ValueError(
            f"eps_low must be < 1 so that the lower clip bound 1 - eps_low stays positive, got "
            f"{obj.eps_low!r}; valid: 0 <= eps_low < 1 (gspo uses 3e-4, grpo 0.2)"
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


def _check_rank2(name, x):
    if getattr(x, "ndim", None) != 2:
        raise ValueError(
            f"{name} must be a [B, T] array, got shape {getattr(x, 'shape', type(x).__name__)}"
        )


def _as_float32(x):
    x = jnp.asarray(x)
    return x.astype(jnp.float32) if x.dtype != jnp.float32 else x


def _check_inputs(obj, logp, old_logp, adv, mask, ref_logp):
    """ValueError (naming the valid shapes) for bad inputs; upcasts to float32."""
    _check_rank2("logp", logp)
    B, T = logp.shape
    named = [("old_logp", old_logp), ("mask", mask)]
    if ref_logp is not None:
        named.append(("ref_logp", ref_logp))
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
            "advantages [B, T] need a per-token ratio: grpo, dapo, dr_grpo or gspo_token"
        )
    ref_logp = None if ref_logp is None else _as_float32(ref_logp)
    logp, old_logp, adv, mask = (_as_float32(x) for x in (logp, old_logp, adv, mask))
    # The checks above raise ValueError with the fix; these chex asserts state the boundary's
    # contract (trace-time only, free at run time) for readers and for later edits.
    chex.assert_equal_shape([logp, old_logp, mask] + ([ref_logp] if ref_logp is not None else []))
    chex.assert_type([logp, old_logp, adv, mask], float)
    return logp, old_logp, adv, mask, ref_logp
