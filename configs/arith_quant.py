r"""The int8 rollout: the default experiment with the rollout's weights quantized through qwix
(rl.rollout_quant = "int8", rollout/quant.py) under the float32 trainer, a training-inference
mismatch of the kind a quantized serving engine creates.

Whether GSPO's length-normalised sequence ratio tolerates that mismatch better than GRPO's token
ratios is the GSPO papers' question; the corrections the field uses for it are token-level
truncated importance sampling (token_tis: each token's loss weighed by min(π_train / π_rollout,
C)) and sequence-level masked importance sampling (seq_mis: a response whose sequence weight
leaves the band is dropped). Arms per objective (grpo, gspo, each at its preset's ε):

    f32_none       the float32 rollout: the sampler's log-probs are the trainer's (no mismatch)
    int8_none      the int8 rollout; old_logp is the sampler's (the behaviour policy), so the
                   objective's ratio carries the mismatch and its clip is all that bounds it
    int8_token_tis the int8 rollout; old_logp recomputed by the trainer, the sampler's log-probs
    int8_seq_mis   weighed against it by the named correction (objective.rollout_correction)

Launch:

    python -m gspo_jax.main --config configs/arith_quant.py:objective=grpo,quant=int8 \
        --workdir runs/quant_grpo_int8
    python experiments/claims.py int8_rollout_mismatch --runs_only   # the registered sweep

Arguments: those of configs/arith.py, plus quant ("" or one of the rollout quantizations) and
correction ("" or one of objectives.ROLLOUT_CORRECTIONS). The claims registry's entry
int8_rollout_mismatch holds the design and its primary criterion.
"""

from __future__ import annotations

import ml_collections

from gspo_jax import config as config_lib

OBJECTIVES = ("grpo", "gspo")
# (rollout quantization, correction) per arm: the float32 baseline, then int8 without and with
# each correction
ARMS = (("", ""), ("int8", ""), ("int8", "token_tis"), ("int8", "seq_mis"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    a = config_lib.parse_arg(arg, **arith.common_args(), quant="", correction="")
    c = arith.base_config(a.runlocal)
    arith.apply_common_args(c, a)
    c.rl.rollout_quant = a.quant
    if a.correction:
        c.rl.recompute_old_logp = True  # old_logp: the trainer's; the sampler's: the weight
        c.objective.rollout_correction = a.correction
    c.lock()
    return c


def arm_name(objective: str, quant: str, correction: str) -> str:
    return f"{objective}_{quant or 'f32'}_{correction or 'none'}"


def get_sweep(arg: str | None = None) -> list[dict]:
    """OBJECTIVES x ARMS x seeds (arguments: seeds (int), first_seed (int)), named
    arm_name(...) + "_s<seed>"."""
    a = config_lib.parse_arg(arg, seeds=1, first_seed=0)
    runs = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        for objective in OBJECTIVES:
            for quant, correction in ARMS:
                overrides = {"objective.name": objective, "rl.rollout_quant": quant, "seed": seed}
                if correction:
                    overrides["rl.recompute_old_logp"] = True
                    overrides["objective.rollout_correction"] = correction
                name = f"{arm_name(objective, quant, correction)}_s{seed}"
                runs.append(dict(name=name, overrides=overrides))
    return runs
