"""Policy objectives of the GRPO family: grpo, dapo, dr_grpo, gspo, gspo_token, luspo, gmpo, cispo,
sapo, clip_cov, kl_cov, dppo_tv, dppo_kl; with optional rollout correction, off-policy sequence
masking, a two-sided clip, high-entropy token selection, an entropy bonus and an unbiased KL.

Dimension legend: B response rows (P prompts x G samples, group-contiguous), T padded response
length. Inputs are [B, T] float32 (bf16 is upcast; float64 stays float64 under jax_enable_x64),
`mask` is the action mask: 1 on the policy's response tokens (EOS included), 0 on padding and on
tokens an environment wrote into the response, which no term reads (bool, int or float, but 0/1);
`adv` is one advantage per response [B] or per token [B, T] (per-token needs a per-token ratio:
token or sequence_token).

    obj = get_objective("gspo", eps_low=0.2, eps_high=0.2)   # preset + any OVERRIDABLE_FIELDS
    loss, metrics = obj(logp, old_logp, adv, mask, ref_logp=None, rollout_logp=None, entropy=None)
    num, den, metric_sums = obj.sums(logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy)

`entropy` [B, T] is the policy's per-token entropy (differentiable), needed only when a term reads
it (obj.needs_entropy: entropy_coef > 0 or top_entropy_quantile < 1).

Every objective is assembled from orthogonal parts, each written where it is computed: a ratio
level (ratios.py: token w_{i,t}, sequence s_i, sequence_token s_{i,t}, geometric), a surrogate
(surrogates.py: clip, cispo, sapo, clip_cov, kl_cov, dppo_tv, dppo_kl), an optional weight
(rollout correction, off-policy masking, high-entropy tokens), an aggregation, a KL term and an
entropy bonus (objective.py), combined as num / den over parts of a batch (sums.py: global
normalisation and every metric); presets.py names the combinations (PRESETS), validation.py
checks fields and inputs, terms.py holds the building blocks. docs/objectives.md has every formula
with its reference number. A new objective is one ratio or surrogate function plus one line in
presets.PRESETS (surrogates.py shows CISPO as the example).

Performance: experiments/benchmarks/objectives_bench.py times loss + gradient of every preset
against a masked mean of logp with its gradient (the floor). On CPU each metric costs its own
pass over [B, T] (GPU/TPU fuse them); a KL term, per-token advantages or rollout_logp read one
more [B, T] input. GSPO-token with [B] advantages takes GSPO's path (equal in value and gradient
for every surrogate); the per-token path needs no per-token exp (see _sequence_token_ratio).
"""

from gspo_jax.objectives.objective import (
    OVERRIDABLE_FIELD_TYPES,
    OVERRIDABLE_FIELDS,
    TRACEABLE_FIELDS,
    Objective,
    get_objective,
)
from gspo_jax.objectives.presets import PER_TOKEN_PRESETS, PRESET_NAMES, PRESETS
from gspo_jax.objectives.ratios import PER_RESPONSE_LEVELS, RATIO_LEVELS
from gspo_jax.objectives.sums import Sums, log_w_percentiles_from_counts
from gspo_jax.objectives.surrogates import SURROGATES
from gspo_jax.objectives.terms import (
    AGGREGATIONS,
    EXP_CLAMP,
    KL_ESTIMATORS,
    LOG_W_EDGES,
    LOG_W_PERCENTILES,
    ROLLOUT_CORRECTIONS,
    TOP_K_BLOCK,
    clamped_exp,
    clip,
    clipped_surrogate,
    dppo_keep,
    dual_clipped,
    kl_estimate,
    masked_quantile,
    off_policy_keep,
    rollout_correction_weight,
    sequence_log_ratio,
    token_covariance,
    top_k_indices,
    top_k_mask,
)

__all__ = [
    "AGGREGATIONS",
    "EXP_CLAMP",
    "KL_ESTIMATORS",
    "LOG_W_EDGES",
    "LOG_W_PERCENTILES",
    "OVERRIDABLE_FIELDS",
    "OVERRIDABLE_FIELD_TYPES",
    "PER_TOKEN_PRESETS",
    "PRESETS",
    "PRESET_NAMES",
    "PER_RESPONSE_LEVELS",
    "RATIO_LEVELS",
    "ROLLOUT_CORRECTIONS",
    "SURROGATES",
    "TRACEABLE_FIELDS",
    "TOP_K_BLOCK",
    "Objective",
    "Sums",
    "clamped_exp",
    "clip",
    "clipped_surrogate",
    "dppo_keep",
    "dual_clipped",
    "get_objective",
    "kl_estimate",
    "log_w_percentiles_from_counts",
    "masked_quantile",
    "off_policy_keep",
    "rollout_correction_weight",
    "sequence_log_ratio",
    "token_covariance",
    "top_k_indices",
    "top_k_mask",
]
