"""The checks of an Objective's fields (at construction) and of its inputs (at each call): one
ValueError naming the field and the valid range.

Dimension legend: B response rows, T padded response length.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import chex
import jax.numpy as jnp

from gspo_jax.objectives.presets import PER_TOKEN_PRESETS
from gspo_jax.objectives.ratios import PER_RESPONSE_LEVELS, RATIO_LEVELS
from gspo_jax.objectives.surrogates import SURROGATES
from gspo_jax.objectives.terms import AGGREGATIONS, KL_ESTIMATORS, ROLLOUT_CORRECTIONS

if TYPE_CHECKING:  # annotations only
    from gspo_jax.objectives.objective import Objective


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
    if not isinstance(obj.length_norm, bool):
        raise ValueError(f"length_norm must be True or False, got {obj.length_norm!r}")
    if not obj.length_norm and obj.ratio_level not in ("sequence", "sequence_token"):
        raise ValueError(
            f"length_norm=False drops the 1/|y| of a sequence ratio, but {obj.name} uses ratio "
            f"level {obj.ratio_level!r}: use it with gspo, luspo or gspo_token"
        )
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
    if len(adv_shape) == 2 and obj.per_response:
        per_token = tuple(lv for lv in RATIO_LEVELS if lv not in PER_RESPONSE_LEVELS)
        raise ValueError(
            f"{obj.name} has one ratio per response, so adv must be [B] = {(B,)}; per-token "
            f"advantages [B, T] need a per-token ratio (ratio_level one of {per_token}): "
            f"{', '.join(PER_TOKEN_PRESETS)}"
        )
    if rollout_logp is None and obj.reads_rollout_logp:
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
