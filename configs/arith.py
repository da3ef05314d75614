r"""The default experiment: GSPO on multi-digit addition from a supervised warm start, on a CPU.

Launch (warm start included when it is not cached; restart the same command to resume):

    python -m gspo_jax.main --config configs/arith.py --workdir runs/arith

Variants are arguments or overrides:

    python -m gspo_jax.main --config configs/arith.py:objective=grpo,seed=1 --workdir runs/grpo
    python -m gspo_jax.main --config configs/arith.py --workdir runs/eps \
        --config.objective.eps_low=0.2 --config.objective.eps_high=0.2
    python -m gspo_jax.main --config configs/arith.py:runlocal --workdir /tmp/arith_local

The sweep (objective x ε x seeds), launched by experiments/sweep.py:

    python experiments/sweep.py --config configs/arith.py --sweep seeds=3 --workdir runs/sweep
    python experiments/sweep.py --config configs/arith.py:runlocal --sweep seeds=1 \
        --workdir runs/sweep_local --parallel 2

The rest of the family (clip_cov, kl_cov, dppo_tv, dppo_kl against grpo, and grpo under rloo,
REINFORCE++, REINFORCE++-baseline and batch reward scaling; docs/results.md):

    python experiments/sweep.py --config configs/arith.py --sweep study=family,seeds=3 \
        --workdir runs/family_sweep --parallel 2 --config.rl.num_steps=60

Expected runtime (this 2-core CPU, idle, from an empty cache): 3 min 11 s in all: dataset
preparation, the warm start (2400 SFT steps, 135 s; cached afterwards, keyed by its config) and RL
(80 steps with 3 evaluations, 47 s). With three other jobs on the two cores: 10 min. runlocal: about
a minute per run, mostly compilation.

Headline metric: eval/greedy_accuracy (held-out greedy accuracy), base vs final, in
<workdir>/summary.json. The base policy answers directly when greedy (wrong whenever a column
carries: 0.395); RL moves it to the worked, column-by-column format, which is mostly right:
measured 0.395 -> 0.880 (+48.5 points; seed 1: 0.850), the switch happening around step 45. Also
watch rollout/response_len_mean (the worked format is longer), train/clip_frac (GSPO clips whole
sequences) and rollout/logp_diff_mean (sampler vs trainer log-probs: must stay ~1e-7, or GSPO's ε =
3e-4 clips everything).

Arguments (``get_config("key=value,...")``): runlocal (bool), objective (str), eps (float: sets
eps_low = eps_high; default the preset's), seed (int), steps (int, default by size), lr (float),
warmstart ("fixed", the default: 2400 SFT steps; "converged": trained until the worked format is
learned, a stopping rule with a cap of 4800 steps: docs/warmstart.md, which says why it is not
the default yet).
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from gspo_jax import config as config_lib
from gspo_jax import objectives

OBJECTIVES = objectives.PRESET_NAMES
# The warm starts a config may take (argument warmstart): the pinned fixed-length one, and the
# one trained until the worked (scratchpad) format is learned: its held-out sampled accuracy
# checked every 600 steps, stopping at two checks in a row >= 0.9, the cosine decaying over the
# cap of 4800 steps (docs/warmstart.md has its draws; every field keys the warm-start cache).
WARMSTARTS = {
    "fixed": {},
    "converged": dict(
        steps=4800,
        stop_every=600,
        stop_metric="worked_accuracy",
        stop_threshold=0.9,
        stop_patience=2,
        stop_problems=256,
        stop_samples=4,
    ),
}


RUNLOCAL_WARMSTART_STEPS = 100


def base_config(runlocal: bool) -> ml_collections.ConfigDict:
    """The default experiment (the library's defaults, config.default_config, with this
    experiment's warm start pinned); ``runlocal`` shrinks every size to run in seconds."""
    c = config_lib.default_config()
    # warmstart.get_base_model's warm_cfg, pinned field by field so that the base policy of this
    # experiment does not move when the library's defaults do (every field keys the cache).
    # 2400 steps: at 2000 the worked (scratchpad) format is not learned yet (33 % greedy accuracy
    # when forced to start with "W", below the direct answers' 40 %, so RL moves away from it);
    # at 2400 it is (77 %), and RL has a better format to find. Another task needs its own step
    # count here: countdown's warm start levels off at 4800 (--config.init.warmstart.steps=4800).
    c.init.warmstart = ml_collections.ConfigDict(
        dict(
            steps=2400,
            batch_size=16,
            learning_rate=1e-2,
            warmup_steps=50,
            end_lr_ratio=0.1,
            weight_decay=0.01,
            grad_clip=1.0,
            loss_norm="sequence",
            seed=0,
        )
    )
    if runlocal:
        c.task.kwargs = ml_collections.ConfigDict(dict(max_digits=2, num_train=2000, num_test=200))
        c.model.preset = "tiny"
        # seed: the field round 2's sweeps draw per seed (round2_sweep); 0 is the library's
        # default, so the runlocal cache key is the same as without it
        c.init.warmstart = ml_collections.ConfigDict(dict(steps=RUNLOCAL_WARMSTART_STEPS, seed=0))
        c.rl.num_steps = 4
        c.rl.prompts_per_step = 8
        c.rl.group_size = 4
        c.eval.every = 2
        c.eval.num_problems = 16
        c.checkpoint.every = 2
    return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    a = config_lib.parse_arg(arg, **common_args())
    c = base_config(a.runlocal)
    apply_common_args(c, a)
    c.lock()
    return c


def common_args() -> dict:
    """The arguments every arith-family config takes, with their defaults (fresh placeholders on
    every call); shared with configs/arith_moe.py."""
    return dict(
        runlocal=False,
        objective="gspo",
        eps=config_dict.placeholder(float),
        seed=0,
        steps=config_dict.placeholder(int),
        lr=config_dict.placeholder(float),
        warmstart="fixed",
    )


def apply_common_args(c: ml_collections.ConfigDict, a) -> None:
    """Applies the arguments every arith-family config takes (runlocal, seed, objective, eps,
    steps, lr, warmstart) to ``c``; shared with configs/arith_moe.py."""
    if a.warmstart not in WARMSTARTS:
        raise config_lib.ConfigError(
            f"warmstart={a.warmstart!r} is not one of {tuple(WARMSTARTS)} (configs/arith.py)"
        )
    c.init.warmstart.update(WARMSTARTS[a.warmstart])
    if a.runlocal and "steps" in WARMSTARTS[a.warmstart]:
        # runlocal runs in seconds: the variant's stopping rule, checked twice within runlocal's
        # cap on a few problems (the full cap would train the tiny model thousands of steps
        # against a rule set for the small one, which it never meets)
        c.init.warmstart.update(
            steps=RUNLOCAL_WARMSTART_STEPS,
            stop_every=RUNLOCAL_WARMSTART_STEPS // 2,
            stop_problems=16,
        )
    apply_run_args(c, a)


def apply_run_args(c: ml_collections.ConfigDict, a) -> None:
    """Applies the run's arguments (runlocal, seed, objective, eps, steps, lr) to ``c``; shared
    with configs/testbed.py, whose warm start is its own."""
    c.runlocal = a.runlocal
    c.seed = a.seed
    c.objective.name = a.objective
    if a.eps is not None:
        c.objective.eps_low = a.eps
        c.objective.eps_high = a.eps
    if a.steps is not None:
        c.rl.num_steps = a.steps
    if a.lr is not None:
        c.optimizer.learning_rate = a.lr


def get_sweep(arg: str | None = None) -> list[dict]:
    """The objective x ε x seed sweep, as runs for experiments/sweep.py.

    Every preset at its own ε, plus GRPO and GSPO each at ε = 0.2 and ε = 3e-4 (symmetric:
    eps_low = eps_high). grpo at 0.2 is the grpo preset itself and is not repeated; gspo at a
    symmetric 3e-4 differs from the preset's 3e-4 / 4e-4 and is kept. Arguments: seeds (int),
    study (str: "eps", the default, is this sweep; "token_adv" is gspo_token with every token
    given its response's advantage, rl.token_advantages; "family" is family_sweep; "clip" and
    "ratio_doses" are CLAIM_STUDIES; "r2_eps", "r2_clip" and "r2_ratio" are ROUND2_STUDIES, at
    the fresh seeds 100, 101, ... with the warm start drawn per seed: round2_sweep).
    """
    a = config_lib.parse_arg(arg, seeds=1, study="eps")
    if a.study == "family":
        return family_sweep(a.seeds)
    if a.study in CLAIM_STUDIES:  # gspo_jax/claims/entries/'s designs
        return arm_sweep(CLAIM_STUDIES[a.study], a.seeds)
    if a.study in ROUND2_STUDIES:  # the registry's round 2 (issue 33)
        return round2_sweep(ROUND2_STUDIES[a.study], a.seeds)
    if a.study == "token_adv":  # notebooks/gspo_token_equals_gspo.ipynb
        return [
            dict(
                name=f"gspo_token_tokadv_s{seed}",
                overrides={
                    "objective.name": "gspo_token",
                    "rl.token_advantages": True,
                    "seed": seed,
                },
            )
            for seed in range(a.seeds)
        ]
    if a.study != "eps":
        raise ValueError(
            f"study must be 'eps', 'token_adv', 'family' or one of "
            f"{sorted(CLAIM_STUDIES) + sorted(ROUND2_STUDIES)}, got {a.study!r}"
        )
    runs = []
    for seed in range(a.seeds):
        for name in OBJECTIVES:
            runs.append(
                dict(name=f"{name}_s{seed}", overrides={"objective.name": name, "seed": seed})
            )
        for name, eps in (("grpo", 3e-4), ("gspo", 0.2), ("gspo", 3e-4)):
            runs.append(
                dict(
                    name=f"{name}_eps{eps:g}_s{seed}",
                    overrides={
                        "objective.name": name,
                        "objective.eps_low": eps,
                        "objective.eps_high": eps,
                        "seed": seed,
                    },
                )
            )
    return runs


# The rest of the objective family against grpo: the covariance and divergence presets, and the
# advantage estimators under the grpo objective (docs/results.md has the table).
FAMILY_PRESETS = ("grpo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl")
FAMILY_ADVANTAGES = (
    ("rloo", {"rl.advantage_estimator": "rloo"}),
    ("reinforce_pp", {"rl.advantage_estimator": "reinforce_pp"}),
    ("reinforce_pp_baseline", {"rl.advantage_estimator": "reinforce_pp_baseline"}),
    ("scale_batch", {"rl.advantage_estimator": "grpo", "rl.scale_rewards": "batch"}),
)


def family_sweep(seeds: int) -> list[dict]:
    """grpo and the family's presets, then grpo under each advantage variant, seed by seed (so
    that a sweep cut short still has every variant at the first seeds)."""
    runs = []
    for seed in range(seeds):
        for name in FAMILY_PRESETS:
            runs.append(
                dict(name=f"{name}_s{seed}", overrides={"objective.name": name, "seed": seed})
            )
        for label, overrides in FAMILY_ADVANTAGES:
            runs.append(
                dict(
                    name=f"grpo_{label}_s{seed}",
                    overrides={"objective.name": "grpo", **overrides, "seed": seed},
                )
            )
    return runs


# Arms of the claims registry's designs (gspo_jax/claims/entries/), as (name, overrides).
NO_KL = {"objective.kl_coef": 0.0}  # comparisons against GRPO: the KL term is not the confound
CLIP_ARMS = (  # clip_fraction_vs_eps: GSPO's clipping against GRPO with and without its KL
    ("gspo", {"objective.name": "gspo"}),
    ("grpo_nokl", {"objective.name": "grpo", **NO_KL}),
    ("grpo", {"objective.name": "grpo"}),
    (
        "gspo_eps0.2",
        {"objective.name": "gspo", "objective.eps_low": 0.2, "objective.eps_high": 0.2},
    ),
)
# How far the update moves off the rollout's policy: minibatches x epochs per batch. Token ratios
# leave 1 as the dose grows (gmpo_ratio_range, gmpo_entropy, gmpo_kl_ref, dapo_clip_higher_entropy).
RATIO_DOSES = ((4, 1), (8, 2), (16, 2))
_RATIO_ARMS = (
    ("grpo_nokl", {"objective.name": "grpo", **NO_KL}),
    ("gmpo", {"objective.name": "gmpo"}),  # log-space ±0.4
    (
        "gmpo_eps0.2",
        {"objective.name": "gmpo", "objective.eps_low": 0.2, "objective.eps_high": 0.2},
    ),
    ("dapo", {"objective.name": "dapo"}),  # clip-higher 0.2 / 0.28, token-mean
    ("dapo_eps0.2", {"objective.name": "dapo", "objective.eps_high": 0.2}),
)
# Every ratio-dose arm logs the KL to the base policy (gmpo_kl_ref; kl_coef stays 0) and the
# percentiles of |log w| (gmpo_ratio_range's secondary check).
RATIO_LOGS = {"rl.log_kl_ref": True, "objective.log_w_percentiles": True}
RATIO_DOSE_ARMS = tuple(
    (f"{name}_k{k}x{e}", {**o, **RATIO_LOGS, "rl.num_minibatches": k, "rl.num_epochs": e})
    for k, e in RATIO_DOSES
    for name, o in _RATIO_ARMS
)
CLAIM_STUDIES = {"clip": CLIP_ARMS, "ratio_doses": RATIO_DOSE_ARMS}


def arm_sweep(arms, seeds: int) -> list[dict]:
    """Every arm at every seed, seed by seed (a sweep cut short has every arm at its first seeds;
    the same seed in two arms: the same prompts and base, for the registry's paired tests)."""
    return [
        dict(name=f"{name}_s{seed}", overrides={**overrides, "seed": seed})
        for seed in range(seeds)
        for name, overrides in arms
    ]


# --- round 2 of the claims registry (issue 33): fresh seeds, the warm start a random factor -----

ROUND2_FIRST_SEED = 100  # the earlier entries ran seeds 0-4; round 2 never reuses them
ROUND2_WARMSTART_DRAWS = 3  # warm-start draws (init.warmstart.seed 0, 1, 2), nested in the seeds


def round2_sweep(
    arms, seeds: int, draws: int = ROUND2_WARMSTART_DRAWS, first_seed: int = ROUND2_FIRST_SEED
) -> list[dict]:
    """Every arm at the fresh seeds first_seed .. first_seed + seeds - 1 (100 .. 111: round 2's;
    a later entry of the same claim takes seeds none of its versions ran), seed by seed. Seed s
    trains from the
    warm-start draw s mod ``draws`` (``init.warmstart.seed``): every arm of one seed shares its
    base (the registry's tests are paired by seed), and over the seeds the warm start is a random
    factor, 12 seeds giving each of 3 draws 4 (docs/warmstart.md: the draw can decide a run).
    ``draws`` = 1: every seed from the config's own warm start (draw 0), for a design whose
    precondition was calibrated on that one base (luspo_length's)."""
    return [
        dict(
            name=f"{name}_s{seed}",
            overrides={**overrides, "seed": seed, "init.warmstart.seed": seed % draws},
        )
        for seed in range(first_seed, first_seed + seeds)
        for name, overrides in arms
    ]


def _sym(eps: float) -> dict:
    return {"objective.eps_low": eps, "objective.eps_high": eps}


# eps_objective_sweep v2: GRPO (without its KL) and GSPO at each eps of the dose, both symmetric,
# and every preset at its own eps; the statistic is the held-out gain over the base.
ROUND2_EPS_DOSES = (0.2, 2e-2, 2e-3, 3e-4, 3e-5)
ROUND2_EPS_ARMS = (
    *((name, {"objective.name": name}) for name in OBJECTIVES),
    *(
        (f"grpo_nokl_eps{e:g}", {"objective.name": "grpo", **NO_KL, **_sym(e)})
        for e in ROUND2_EPS_DOSES
    ),
    *((f"gspo_eps{e:g}", {"objective.name": "gspo", **_sym(e)}) for e in ROUND2_EPS_DOSES),
)
# How many updates each batch takes (minibatches x epochs): 1 x 1 is on-policy at every update
# (DeepSeekMath: the clip is inert); 32 x 4 takes 128 updates of 4 responses from one batch (the
# GSPO paper's case: many minibatches per batch make token ratios, not sequence ratios, unstable).
ROUND2_MINIBATCH_DOSES = ((1, 1), (4, 1), (16, 2), (32, 4))
ROUND2_RATIO_ARMS = (
    *(
        (f"{name}_k{k}x{e}", {**o, **RATIO_LOGS, "rl.num_minibatches": k, "rl.num_epochs": e})
        for k, e in ROUND2_MINIBATCH_DOSES
        for name, o in (
            ("grpo_nokl", {"objective.name": "grpo", **NO_KL}),
            ("gspo", {"objective.name": "gspo"}),
        )
    ),
    (  # gspo_length_normalisation: GSPO's sequence ratio without its 1/|y|, at 4 x 1
        "gspo_nonorm_k4x1",
        {
            "objective.name": "gspo",
            "objective.length_norm": False,
            **RATIO_LOGS,
            "rl.num_minibatches": 4,
            "rl.num_epochs": 1,
        },
    ),  # fmt: skip
    (  # gmpo_ratio_range's confirmation at its dose
        "gmpo_k16x2",
        {"objective.name": "gmpo", **RATIO_LOGS, "rl.num_minibatches": 16, "rl.num_epochs": 2},
    ),
)
ROUND2_STUDIES = {"r2_eps": ROUND2_EPS_ARMS, "r2_clip": CLIP_ARMS, "r2_ratio": ROUND2_RATIO_ARMS}
