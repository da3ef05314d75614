r"""Off-policy corrections: a bfloat16 rollout under a float32 trainer, corrected or not; and
DAPO's dynamic sampling on and off.

An inference engine rarely computes exactly what the trainer computes (bf16 kernels, other
reduction orders), so the rollout's tokens come from a slightly different policy than the old_logp
the trainer recomputes. Here the sampler computes in bfloat16 from the float32 parameters
(rl.rollout_dtype), the trainer recomputes old_logp in float32 (rl.recompute_old_logp), and the
sampler's log-probs become rollout_logp, which the objective's rollout correction (token / sequence
truncated or masked importance sampling) and off-policy sequence masking weigh against old_logp.

Launch:

    python -m gspo_jax.main --config configs/arith_offpolicy.py:objective=gspo,correction=seq_mis \
        --workdir runs/offpolicy_gspo_seq_mis
    python experiments/sweep.py --config configs/arith_offpolicy.py --workdir runs/offpolicy
    python -m gspo_jax.main --config configs/arith_offpolicy.py:runlocal --workdir /tmp/op_local

Each run starts from the same cached warm start as configs/arith.py. The measured sweep table
(final held-out accuracy, mismatch, weights and gates, time per step) is in docs/results.md.

Arguments: those of configs/arith.py, plus rollout_dtype (str, "bfloat16"), correction (str:
"", token_tis, token_mis, seq_tis, seq_mis), opsm (float: the off-policy mask threshold δ; unset =
off) and dynamic_sampling (bool).
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from gspo_jax import config as config_lib

# δ of the off-policy sequence mask in the sweep: mean_t(rollout_logp - logp) above it drops a
# negative-advantage response. The bf16 rollout alone moves log-probs by about 2e-3 per token
# (rollout/mismatch_tok_abs_mean of this config); 4 minibatches of updates move them further.
OPSM_DELTA = 0.01


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    a = config_lib.parse_arg(
        arg,
        **arith.common_args(),
        rollout_dtype="bfloat16",
        correction="",
        opsm=config_dict.placeholder(float),
        dynamic_sampling=False,
    )
    c = arith.base_config(a.runlocal)
    arith.apply_common_args(c, a)
    c.rl.rollout_dtype = a.rollout_dtype
    c.rl.recompute_old_logp = True
    if a.correction:
        c.objective.rollout_correction = a.correction
    if a.opsm is not None:
        c.objective.off_policy_mask = a.opsm
    c.rl.dynamic_sampling = a.dynamic_sampling
    c.lock()
    return c


# The old_logp study (notebooks/rollout_logprobs.ipynb): where old_logp comes from, and the
# correction at the objective's own level (token weights for GRPO, a sequence weight for GSPO).
OLD_LOGP_ARMS = (
    ("sampler", {"rl.recompute_old_logp": False}),  # the bf16 rollout's log-probs as old_logp
    ("recompute", {}),  # a float32 trainer forward; no correction
    ("recompute_tis", None),  # recompute + truncated importance sampling (level per objective)
)
TIS_LEVEL = {"grpo": "token_tis", "gspo": "seq_tis"}
# The claims registry's dose-response (rollout_logprobs): log-prob noise of this std per token
# added between sampler and trainer (rl.rollout_logp_noise), on top of the bf16 mismatch. It
# reaches the sampler arms' old_logp and the correction arms' rollout_logp; the plain recompute
# arm never reads the sampler's log-probs, so it has no dose.
LOGP_NOISE_DOSES = (1e-3, 1e-2, 1e-1)
# Round 2 (issue 33), rollout_logprobs' comparative half: the noise dose extended until GRPO's
# token ratios degrade (a per-token noise of std sigma moves a token ratio by e^sigma: at 0.3 a
# third of them leave GRPO's 0.2; GSPO's geometric mean sees sigma / sqrt(|y|)), the sampler arms
# of both objectives at each dose against their recomputed arms (which no dose reaches).
ROUND2_NOISE_DOSES = (0.1, 0.3, 1.0)
ROUND2_OLD_LOGP_ARMS = tuple(
    (f"{name}_{tag}{suffix}", {"objective.name": name, **extra, **dose})
    for name in ("grpo", "gspo")
    for tag, extra in OLD_LOGP_ARMS[:2]
    for suffix, dose in (
        ("", {}),
        *(
            (f"_noise{n:g}", {"rl.rollout_logp_noise": n})
            for n in (ROUND2_NOISE_DOSES if tag == "sampler" else ())
        ),
    )
)


def get_sweep(arg: str | None = None) -> list[dict]:
    """Two studies, x seeds (arguments: seeds (int), study (str)).

    study=corrections (default): grpo and gspo with a bf16 rollout under no correction /
    token_tis / seq_mis / off-policy masking; dapo with and without dynamic sampling (float32
    rollout, sampler log-probs as old_logp, as in configs/arith.py).
    study=old_logp: grpo and gspo with a bf16 rollout, old_logp from the sampler, recomputed, or
    recomputed with truncated importance sampling (token_tis for grpo, seq_tis for gspo); then
    the sampler and correction arms at each LOGP_NOISE_DOSES ("_noise<std>").
    study=r2_old_logp: ROUND2_OLD_LOGP_ARMS at the registry's fresh seeds 100, 101, ... with the
    warm start drawn per seed (round 2, issue 33; configs/arith.py round2_sweep).
    """
    a = config_lib.parse_arg(arg, seeds=1, study="corrections")
    if a.study == "r2_old_logp":
        return config_lib.sibling_config(__file__, "arith.py").round2_sweep(
            ROUND2_OLD_LOGP_ARMS, a.seeds
        )
    if a.study not in ("corrections", "old_logp"):
        raise ValueError(
            f"study must be 'corrections', 'old_logp' or 'r2_old_logp', got {a.study!r}"
        )
    runs = []
    for seed in range(a.seeds):
        if a.study == "old_logp":
            for name in ("grpo", "gspo"):
                for tag, extra in OLD_LOGP_ARMS:
                    if extra is None:
                        extra = {"objective.rollout_correction": TIS_LEVEL[name]}
                    runs.append(
                        dict(
                            name=f"{name}_{tag}_s{seed}",
                            overrides={"objective.name": name, **extra, "seed": seed},
                        )
                    )
            for noise in LOGP_NOISE_DOSES:
                for name in ("grpo", "gspo"):
                    for tag, extra in OLD_LOGP_ARMS:
                        if tag == "recompute":
                            continue  # never reads the sampler's log-probs: no dose
                        if extra is None:
                            extra = {"objective.rollout_correction": TIS_LEVEL[name]}
                        runs.append(
                            dict(
                                name=f"{name}_{tag}_noise{noise:g}_s{seed}",
                                overrides={
                                    "objective.name": name,
                                    **extra,
                                    "rl.rollout_logp_noise": noise,
                                    "seed": seed,
                                },
                            )
                        )
            continue
        for name in ("grpo", "gspo"):
            for tag, extra in (
                ("none", {}),
                ("token_tis", {"objective.rollout_correction": "token_tis"}),
                ("seq_mis", {"objective.rollout_correction": "seq_mis"}),
                ("opsm", {"objective.off_policy_mask": OPSM_DELTA}),
            ):
                runs.append(
                    dict(
                        name=f"{name}_bf16_{tag}_s{seed}",
                        overrides={"objective.name": name, **extra, "seed": seed},
                    )
                )
        for ds in (False, True):
            runs.append(
                dict(
                    name=f"dapo{'_ds' if ds else ''}_s{seed}",
                    overrides={
                        "objective.name": "dapo",
                        "rl.rollout_dtype": "",
                        "rl.recompute_old_logp": False,
                        "rl.dynamic_sampling": ds,
                        "seed": seed,
                    },
                )
            )
    return runs
