r"""Dr. GRPO's std normalisation, with the cause made common on purpose: arith's reward plus a
tiny irrelevant bonus.

The arith task with its irrelevant marker on (gspo_jax/tasks/arithmetic.py: a response may end
with "+", which changes neither correctness nor format; 30 % of the demonstrations carry it, so the
base policy writes it about as often) and a bonus of 0.01 for it. A group whose responses are all
right (or all wrong) but differ in the marker has a reward std of about 0.005: GRPO's division by
the std blows its advantages up to unit scale, as large as a right-against-wrong group's, so the
policy is pushed to write the marker; without the division they stay at the bonus's scale. The
claims registry's design (gspo_jax/claims/entries/, std_normalisation): the grpo objective
without its KL term, with and without the std division (only the advantage differs), and the
dr_grpo preset; the marker's share in the rollouts is rollout/bonus.

Launch:

    python experiments/claims.py std_normalisation
    python -m gspo_jax.main --config configs/std_bonus.py:objective=dr_grpo --workdir runs/sb

Arguments: those of configs/arith.py (objective defaults to grpo here).
"""

from __future__ import annotations

import ml_collections

from gspo_jax import config as config_lib

MARKER_FRACTION = 0.3  # share of the demonstrations that end with the marker
BONUS = 0.01  # the irrelevant bonus: a tenth of the format reward, a hundredth of correctness


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    args = arith.common_args()
    args["objective"] = "grpo"
    a = config_lib.parse_arg(arg, **args)
    c = arith.base_config(a.runlocal)
    arith.apply_common_args(c, a)
    c.task.kwargs.marker_fraction = MARKER_FRACTION
    c.task.kwargs.bonus = BONUS
    c.lock()
    return c


# (run-name stem, overrides): the registry's arms, all without a KL term
ARMS = (
    ("grpo_nokl", {"objective.name": "grpo", "objective.kl_coef": 0.0}),  # z-score advantages
    (  # the same objective without the std division
        "grpo_nokl_nostd",
        {"objective.name": "grpo", "objective.kl_coef": 0.0, "rl.advantage_estimator": "dr_grpo"},
    ),
    ("dr_grpo", {"objective.name": "dr_grpo"}),  # no std, constant normaliser, no KL
)


# The dose-response (added after the registry's verdict, so descriptive only): the bonus's size.
# GRPO's z-score gives a marker-only group the same advantages whatever the bonus (r -> a r + b
# leaves (r - mean) / std unchanged), so its pull towards the marker should not shrink with the
# bonus; without the std division the advantages scale with it.
BONUS_DOSES = (0.001, 0.1)
DOSE_ARMS = ("grpo_nokl", "grpo_nokl_nostd")


def get_sweep(arg: str | None = None) -> list[dict]:
    """The registry's three arms x seeds, then DOSE_ARMS at each of BONUS_DOSES x seeds (run
    names <arm>_bonus<b>_s<seed>). Arguments: seeds (int), study (str: "bonus", the default, is
    this sweep; "r2" is ARMS at the registry's fresh seeds 100, 101, ... with the warm start
    drawn per seed: round 2, issue 33, configs/arith.py round2_sweep)."""
    a = config_lib.parse_arg(arg, seeds=1, study="bonus")
    if a.study == "r2":
        return config_lib.sibling_config(__file__, "arith.py").round2_sweep(ARMS, a.seeds)
    if a.study != "bonus":
        raise ValueError(f"study must be 'bonus' or 'r2', got {a.study!r}")
    runs = [
        dict(name=f"{stem}_s{seed}", overrides={**overrides, "seed": seed})
        for seed in range(a.seeds)
        for stem, overrides in ARMS
    ]
    return runs + [
        dict(
            name=f"{stem}_bonus{b:g}_s{seed}",
            overrides={**overrides, "task.kwargs.bonus": b, "seed": seed},
        )
        for seed in range(a.seeds)
        for b in BONUS_DOSES
        for stem, overrides in ARMS
        if stem in DOSE_ARMS
    ]
