"""The presets: one line per objective of the family (objective.get_objective builds one).

Dimension legend: none.

A preset (PRESETS) is a ratio level, a surrogate, an aggregation and field values; luspo is gspo
with seq-mean-token-sum, gspo with eps 0.2 is `get_objective("gspo", eps_low=0.2, eps_high=0.2)`.
For gmpo, eps_low and eps_high bound δ in log space (clip (e^−0.4, e^0.4)), so eps_low < 1 is not
required there. The cispo value contains logp itself: only its gradient is meaningful.
"""

from __future__ import annotations

from gspo_jax.objectives.ratios import PER_RESPONSE_LEVELS

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
# The presets with a per-token ratio: the ones per-token advantages ([B, T]) can train.
PER_TOKEN_PRESETS = tuple(
    n for n, p in PRESETS.items() if p["ratio_level"] not in PER_RESPONSE_LEVELS
)
