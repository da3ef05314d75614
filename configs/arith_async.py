r"""The staleness dose: the asynchronous pipeline's bound (rl.max_staleness) as a research axis,
under a bfloat16 rollout whose log-probs differ from the float32 trainer's.

A pipelined run trains on batches sampled up to k policy versions before the update that uses
them (rl/pipeline.py). Whether an objective tolerates that is the question a researcher choosing
one for an asynchronous run asks: GRPO's and CISPO's token ratios, GSPO's length-normalised
sequence ratio, SAPO's soft gate. Each runs at k = 0, 1, 2, 4, 8, without a correction (old_logp
is the sampler's log-probs: the behaviour policy, whose ratio the objective clips) and with the
sequence-level one (old_logp recomputed by the trainer before the update, the proximal policy,
and the sampler's log-probs weighed against it by truncated sequence-level importance sampling,
objective.rollout_correction = "seq_tis", which then covers staleness and the bf16 mismatch).

Launch:

    python -m gspo_jax.main --config configs/arith_async.py:objective=grpo,staleness=4 \
        --workdir runs/async_grpo_k4
    python experiments/claims.py staleness_dose        # the registered sweep, then its notebook

Arguments: those of configs/arith.py, plus staleness (int: rl.max_staleness), correction (str:
"" or one of objectives.ROLLOUT_CORRECTIONS) and rollout_dtype (str, "bfloat16").
The claims registry's entry staleness_dose holds the design and its primary criterion.
"""

from __future__ import annotations

import ml_collections

from gspo_jax import config as config_lib

OBJECTIVES = ("grpo", "gspo", "cispo", "sapo")
STALENESS = (0, 1, 2, 4, 8)
CORRECTIONS = ("", "seq_tis")  # none; the sequence-level truncated importance weight


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    a = config_lib.parse_arg(
        arg, **arith.common_args(), staleness=0, correction="", rollout_dtype="bfloat16"
    )
    c = arith.base_config(a.runlocal)
    arith.apply_common_args(c, a)
    c.rl.rollout_dtype = a.rollout_dtype
    c.rl.max_staleness = a.staleness
    # the rollout's copy keeps float32 (exact on XLA:CPU): at depth 0 the pipeline is the
    # synchronous step bit for bit, so the arms differ by their staleness alone
    c.rollout.sync_dtype = "trainer"
    if a.correction:
        c.rl.recompute_old_logp = True  # old_logp: the proximal policy; the sampler's: the weight
        c.objective.rollout_correction = a.correction
    c.lock()
    return c


def arm_name(objective: str, staleness: int, correction: str) -> str:
    return f"{objective}_k{staleness}_{correction or 'none'}"


def get_sweep(arg: str | None = None) -> list[dict]:
    """OBJECTIVES x STALENESS x CORRECTIONS x seeds (arguments: seeds (int), first_seed (int)),
    arms named arm_name(...) + "_s<seed>"."""
    a = config_lib.parse_arg(arg, seeds=1, first_seed=0)
    runs = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        for objective in OBJECTIVES:
            for k in STALENESS:
                for correction in CORRECTIONS:
                    overrides = {"objective.name": objective, "rl.max_staleness": k, "seed": seed}
                    if correction:
                        overrides["rl.recompute_old_logp"] = True
                        overrides["objective.rollout_correction"] = correction
                    runs.append(
                        dict(
                            name=f"{arm_name(objective, k, correction)}_s{seed}",
                            overrides=overrides,
                        )
                    )
    return runs
