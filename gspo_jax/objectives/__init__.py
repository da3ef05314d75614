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

Modules: terms.py (the building blocks and the names of the choices), ratios.py (ratio levels),
surrogates.py, sums.py (Sums: global normalisation over parts), objective.py (the Objective),
presets.py (PRESETS, the override fields, get_objective), validation.py (field and input checks).
A new objective is one ratio or surrogate function there plus one line in presets.PRESETS.

Performance: experiments/benchmarks/objectives_bench.py times loss + gradient of every preset
against a masked mean of logp with its gradient (the floor). On CPU each metric costs its own
pass over [B, T] (GPU/TPU fuse them); a KL term, per-token advantages or rollout_logp read one
more [B, T] input. GSPO-token with [B] advantages takes GSPO's path (equal in value and gradient
for every surrogate); the per-token path needs no per-token exp (see _sequence_token_ratio).
"""

from gspo_jax.objectives.objective import Objective
from gspo_jax.objectives.presets import (
    OVERRIDABLE_FIELD_TYPES,
    OVERRIDABLE_FIELDS,
    PER_TOKEN_PRESETS,
    PRESET_NAMES,
    PRESETS,
    get_objective,
)
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
