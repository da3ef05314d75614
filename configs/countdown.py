r"""Dr. GRPO's std normalisation on countdown, whose rewards give partial credit.

Countdown (gspo_jax/tasks/countdown.py) scores a response with partial credit for closeness to the
target and for using the given numbers, so many groups hold rewards that differ only a little.
GRPO divides each group's advantages by the group's reward std: such a group's advantages are
blown up to unit scale, as large as those of a group with a right and a wrong answer. Dr. GRPO
leaves the std out (and sums over tokens with a constant normaliser, without a KL term). Three
arms separate the two: grpo, grpo_nostd (the grpo objective with Dr. GRPO's advantages: only the
std division differs) and the dr_grpo preset.

The claims registry's std-normalisation design now runs on arith with an irrelevant bonus
(configs/std_bonus.py), where the low-spread groups are common by construction; this sweep stays
for the countdown comparison. Launch:

    python experiments/sweep.py --config configs/countdown.py --sweep seeds=3 \
        --workdir runs/claims/countdown --config.rl.num_steps=60 --config.eval.every=20
    python -m gspo_jax.main --config configs/countdown.py:objective=dr_grpo --workdir runs/cd

The warm start is 4,800 supervised steps (where countdown's held-out accuracy levels off), trained
once and cached. Arguments: those of configs/arith.py (objective defaults to grpo here).
"""

from __future__ import annotations

import ml_collections

from gspo_jax import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    args = arith.common_args()
    args["objective"] = "grpo"
    a = config_lib.parse_arg(arg, **args)
    c = arith.base_config(a.runlocal)
    arith.apply_common_args(c, a)
    c.task.name = "countdown"
    if a.runlocal:
        c.task.kwargs = ml_collections.ConfigDict(dict(num_train=2000, num_test=200))
    else:
        c.task.kwargs = ml_collections.ConfigDict()
        c.init.warmstart.steps = 4800
    # Countdown has no worked format to stop on: its warm start trains every step, as before.
    c.init.warmstart.stop_every = 0
    c.lock()
    return c


# (run-name stem, objective, advantage estimator override or None for the objective's own)
ARMS = (
    ("grpo", "grpo", None),  # z-score advantages, KL 0.04, per-response token mean
    ("grpo_nostd", "grpo", "dr_grpo"),  # the same objective without the std division
    ("dr_grpo", "dr_grpo", None),  # the Dr. GRPO preset: no std, no KL, constant normaliser
    # the claims registry's design (std_normalisation): both GRPO arms without the KL term
    ("grpo_nokl", "grpo", None),
    ("grpo_nokl_nostd", "grpo", "dr_grpo"),
)


def get_sweep(arg: str | None = None) -> list[dict]:
    """grpo, grpo without the std division (only the advantage differs), dr_grpo, and the two
    grpo arms with kl_coef 0, x seeds. Argument: seeds (int)."""
    a = config_lib.parse_arg(arg, seeds=1)
    runs = []
    for seed in range(a.seeds):
        for stem, name, estimator in ARMS:
            overrides = {"objective.name": name, "seed": seed}
            if estimator:
                overrides["rl.advantage_estimator"] = estimator
            if "nokl" in stem:
                overrides["objective.kl_coef"] = 0.0
            runs.append(dict(name=f"{stem}_s{seed}", overrides=overrides))
    return runs
