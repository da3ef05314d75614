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

import math

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


# Round 2 of the claims registry (issue 33): the entropy claims on a task with entropy headroom
# (partial credit, held-out accuracy ~0.5 after the warm start), every arm 16 minibatches x 2
# epochs per batch (token ratios reach the clip) and logging the KL to the base policy:
# DAPO's eps_high dose (eps_low 0.2), GMPO (log-space +-0.4) against GRPO at the same ratio range
# (e^-0.4, e^0.4), GMPO with its clip moved to the sequence (the geometric mean s_i clipped to
# (e^-0.4, e^0.4): the gspo ratio level, whose PPO clip on s_i is GMPO's sign-aware log clip
# applied once per response), and GRPO at its own 0.2.
ROUND2_EPS_HIGH_DOSES = (0.2, 0.24, 0.28, 0.35)
_WIDE = dict(eps_low=1.0 - math.exp(-0.4), eps_high=math.exp(0.4) - 1.0)  # ratio (e^-0.4, e^0.4)
_OFF = {"rl.num_minibatches": 16, "rl.num_epochs": 2, "rl.log_kl_ref": True}
ROUND2_ARMS = (
    *(
        (f"dapo_eh{e:g}", {"objective.name": "dapo", "objective.eps_high": e, **_OFF})
        for e in ROUND2_EPS_HIGH_DOSES
    ),
    ("gmpo", {"objective.name": "gmpo", **_OFF}),
    (
        "gmpo_seqclip",
        {
            "objective.name": "gspo",
            "objective.eps_low": _WIDE["eps_low"],
            "objective.eps_high": _WIDE["eps_high"],
            **_OFF,
        },
    ),
    (
        "grpo_nokl_w0.4",
        {
            "objective.name": "grpo",
            "objective.kl_coef": 0.0,
            "objective.eps_low": _WIDE["eps_low"],
            "objective.eps_high": _WIDE["eps_high"],
            **_OFF,
        },
    ),
    ("grpo_nokl", {"objective.name": "grpo", "objective.kl_coef": 0.0, **_OFF}),
)


# The entropy claims' v3 (dapo_clip_higher_entropy, gmpo_entropy): v2's arms that those two read,
# run twice as long (400 steps), because in 200 steps their collapsing arm did not lose the >= 50 %
# of its entropy the claims are about; the length comes from a one-seed pilot (docs/results.md,
# "The entropy pilot"). Fresh seeds 300-311 (v2 ran 100-111, the pilot 200).
ROUND2_ENTROPY_FIRST_SEED = 300
ROUND2_ENTROPY_ARMS = tuple(
    (name, o)
    for name, o in ROUND2_ARMS
    if name.startswith("dapo_eh") or name in ("gmpo", "grpo_nokl_w0.4")
)


def get_sweep(arg: str | None = None) -> list[dict]:
    """grpo, grpo without the std division (only the advantage differs), dr_grpo, and the two
    grpo arms with kl_coef 0, x seeds. Arguments: seeds (int), study (str: "std", the default,
    is this sweep; "r2" is ROUND2_ARMS at the fresh seeds 100, 101, ... with the warm start drawn
    per seed, configs/arith.py round2_sweep; "r2_entropy" is ROUND2_ENTROPY_ARMS from seed 300)."""
    a = config_lib.parse_arg(arg, seeds=1, study="std")
    arith = config_lib.sibling_config(__file__, "arith.py")
    if a.study == "r2":
        return arith.round2_sweep(ROUND2_ARMS, a.seeds)
    if a.study == "r2_entropy":
        return arith.round2_sweep(
            ROUND2_ENTROPY_ARMS, a.seeds, first_seed=ROUND2_ENTROPY_FIRST_SEED
        )
    if a.study != "std":
        raise ValueError(f"study must be 'std', 'r2' or 'r2_entropy', got {a.study!r}")
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
