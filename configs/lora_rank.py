r"""LoRA RL at rank 1, 8 and 64 against full fine-tuning, each at its own learning rate from a
registered grid, on the default experiment (arith, GSPO) or on countdown (its config's GRPO).

RL carries little information per episode (a few bits of reward per sampled response), so a
low-rank update may be all it needs: the claim that LoRA, even at rank 1, matches full
fine-tuning for policy-gradient RL. The adapters (models/lora.py, through qwix) sit on the
attention projections and the MLP of every layer (lora.targets' default), α = lora.alpha's
default, B initialised at zero (the run starts from the base's function exactly); only the
adapters are trained, and the reference policy is the base without them. LoRA's best learning
rate is known to sit about ten times above full fine-tuning's, so each arm has its own grid:

    full  (lora.rank 0)       learning rate 5e-5, 1e-4 (the default experiment's), 2e-4
    r1, r8, r64               learning rate 3e-4, 1e-3, 3e-3

Launch:

    python -m gspo_jax.main --config configs/lora_rank.py:task=arith,rank=8,lr=1e-3 \
        --workdir runs/lora_r8
    python experiments/claims.py lora_rank1_matches_full --runs_only    # the registered sweeps

Arguments: those of configs/arith.py (lr among them), plus task ("arith" or "countdown") and rank
(lora.rank; 0 = full fine-tuning). The claims registry's entries lora_rank1_matches_full and
lora_rank1_matches_full_countdown hold the design and its primary criterion.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from gspo_jax import config as config_lib

TASKS = ("arith", "countdown")
# (arm stem, lora.rank, the learning-rate grid as the arm names write it)
ARMS = (
    ("full", 0, ("5e-5", "1e-4", "2e-4")),
    ("r1", 1, ("3e-4", "1e-3", "3e-3")),
    ("r8", 8, ("3e-4", "1e-3", "3e-3")),
    ("r64", 64, ("3e-4", "1e-3", "3e-3")),
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    # objective: each task config's own default unless given (arith: gspo, the default experiment)
    args = {**arith.common_args(), "objective": config_dict.placeholder(str)}
    a = config_lib.parse_arg(arg, **args, task="arith", rank=0)
    if a.task not in TASKS:
        raise config_lib.ConfigError(
            f"task={a.task!r} is not one of {TASKS} (configs/lora_rank.py)"
        )
    if a.task == "countdown":  # countdown's own warm start and task sizes
        countdown = config_lib.sibling_config(__file__, "countdown.py")
        passed = {k: getattr(a, k) for k in args if getattr(a, k) is not None}
        c = countdown.get_config(",".join(f"{k}={v}" for k, v in passed.items()))
    else:
        c = arith.base_config(a.runlocal)
        arith.apply_common_args(c, a)
        c.objective.name = a.objective or "gspo"
    with c.unlocked():
        c.lora.rank = a.rank
    c.lock()
    return c


def arm_name(stem: str, lr: str) -> str:
    return f"{stem}_lr{lr}"


def get_sweep(arg: str | None = None) -> list[dict]:
    """ARMS x their learning rates x seeds (arguments: seeds (int), first_seed (int)), named
    arm_name(...) + "_s<seed>"; the task is the config's argument (the sweep's config path)."""
    a = config_lib.parse_arg(arg, seeds=1, first_seed=0)
    runs = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        for stem, rank, lrs in ARMS:
            for lr in lrs:
                overrides = {"lora.rank": rank, "optimizer.learning_rate": float(lr), "seed": seed}
                runs.append(dict(name=f"{arm_name(stem, lr)}_s{seed}", overrides=overrides))
    return runs
