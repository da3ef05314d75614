"""The Objective: a ratio level, a surrogate, an aggregation and field values, called on a
minibatch's log-probs (the module docstring of gspo_jax.objectives has the equations).

Dimension legend: B response rows, T padded response length.

The parts besides the ratio level (ratios.py) and the surrogate (surrogates.py), with
δ_{i,t} = logp − old_logp, |y_i| = Σ_t mask_{i,t} and sg the stop-gradient:

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

R counts the *non-empty* rows: a row whose mask is all zero contributes nothing to any sum or
count, so padding a minibatch with empty rows (e.g. to fill every shard) changes nothing.
max_len=None means the padded T of the arrays passed (set it to the sampler's max_new_tokens when
micro-batches might differ in T). exp() arguments are clamped to ±20 (before the exp, so that no
branch ever holds an inf whose gradient could turn into NaN); values under mask 0, even NaN or inf,
never reach a value or a gradient.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing

import jax
import jax.numpy as jnp

from gspo_jax.objectives.presets import PRESET_NAMES, PRESETS
from gspo_jax.objectives.ratios import _RATIO_LEVELS, PER_RESPONSE_LEVELS
from gspo_jax.objectives.sums import Sums, _unit_sums
from gspo_jax.objectives.surrogates import _SURROGATES, _Tokens
from gspo_jax.objectives.terms import (
    LOG_W_EDGES,
    _clipped_tokens_per_row,
    _per_token,
    _tokens_per_row,
    _unit_product,
    clamped_exp,
    kl_estimate,
    masked_quantile,
    off_policy_keep,
    rollout_correction_weight,
)
from gspo_jax.objectives.validation import _as_float32, _check_inputs, _check_rank2, _validate

# Fields that enter the loss only as arithmetic (never a Python branch or a shape), so a
# population may give each member its own value as a traced array (Objective.with_values). kl_coef
# decides whether the reference pass runs only through "> 0" at build time (a population keeps
# one sign); delta's None (off) is structure, its value is not.
TRACEABLE_FIELDS = ("eps_low", "eps_high", "kl_coef", "delta")


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
    # sequence ratios: s_i = exp(Σ_t δ_{i,t} / |y_i|); False drops the 1/|y_i| (GSPO's ablation)
    length_norm: bool = True

    def __post_init__(self):
        _validate(self)

    def with_values(self, **values) -> Objective:
        """A copy whose TRACEABLE_FIELDS are ``values``, which may be traced arrays: a population's
        per-member values under jax.vmap (rl/population.py). Not validated, and not hashable when
        traced (use it inside the traced function, never as a static argument): validate each
        member's concrete values first (dataclasses.replace(objective, **member_values) does).
        A field that was None (off) stays structural: it cannot be given a value here."""
        unknown = sorted(set(values) - set(TRACEABLE_FIELDS))
        if unknown:
            raise ValueError(f"fields {unknown} cannot be traced; valid: {TRACEABLE_FIELDS}")
        off = sorted(k for k in values if getattr(self, k) is None)
        if off:
            raise ValueError(f"fields {off} are None (off) here; set them on the objective first")
        out = copy.copy(self)
        for k, v in values.items():
            object.__setattr__(out, k, v)  # frozen: the copy is private until returned
        return out

    def __call__(
        self, logp, old_logp, adv, mask, ref_logp=None, rollout_logp=None, entropy=None
    ) -> tuple[jax.Array, dict]:
        """(loss, metrics) of one minibatch: loss = num / den of `self.sums`."""
        return self.sums(logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy).finalize()

    @property
    def per_response(self) -> bool:
        """One ratio per response (sequence, geometric): its advantages must be [B]."""
        return self.ratio_level in PER_RESPONSE_LEVELS

    @property
    def reads_rollout_logp(self) -> bool:
        """Whether a term weighs the rollout engine's log-probs against old_logp (rollout
        correction, off-policy masking): rollout_logp= must then be given."""
        return self.rollout_correction is not None or self.off_policy_mask is not None

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
        if not self.reads_rollout_logp:
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
