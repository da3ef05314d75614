r"""Response length under GSPO vs LUSPO (the LUSPO paper's "length collapse"), on a task variant
built so that the reward does not prefer long answers.

On the default task (configs/arith.py) the long, worked answers are far more often right (69 % vs
39 % for direct answers): the warm start's direct demonstrations forget every carry. So every
objective lengthens responses there and the objectives' length bias cannot show. Here the direct
demonstrations are right (task kwarg direct_style="correct"), so a short answer is wrong only
where the small model cannot carry in one pass, and long (24 tokens) and short (6 tokens) answers
earn rewards of the same order at the start (measured on the cached warm start the claim's runs
use: 88.8 % of worked and 89.5 % of direct samples right; an earlier warm start gave 66 % / 81 %,
and other warm-start seeds or mixes move the direct answers' accuracy a lot: docs/results.md), so
the reward pulls lengths down only a little and the objectives' length bias can show.
GSPO's sequence ratio is a mean over tokens, so each response gets the same weight whatever its
length (a long response's tokens each get 1/|y| of it); LUSPO multiplies by |y|, weighing every
token alike. clip-higher (eps_high > eps_low, the gspo preset's 3e-4 / 4e-4) is where the paper
reports the collapse to be strongest, so GSPO runs with and without it.

A first design (worked demonstrations with one slipped column in 40 % of cases, direct ones
carry-less) did not work: the slipped answers after "A" also degraded the direct answers (9.7 %
right at temperature 1, worked 1.1 %), so the reward favoured neither length for the intended
reason. worked_error_rate is kept as an argument.

Launch (one command for the notebook notebooks/luspo_length.ipynb; the warm start of this task
variant is trained once and cached):

    python experiments/claims.py luspo_length
    python experiments/sweep.py --config configs/luspo_length.py --sweep seeds=3 \
        --workdir runs/claims/luspo_length --config.rl.num_steps=60 --config.eval.every=20
    python -m gspo_jax.main --config configs/luspo_length.py:objective=luspo --workdir runs/luspo

Pod scale (the LUSPO paper trained 7B dense and 30B MoE models on math; the variant here is a
dense Qwen3-1.7B on GSM8K, configs/qwen3_gsm8k.py's v5p-8 layout; every host runs the command):

    python -m gspo_jax.main --config configs/luspo_length.py:pod=/mnt/shared/Qwen3-1.7B,\
objective=luspo --workdir /mnt/shared/runs/luspo --multihost

Arguments: those of configs/arith.py, plus direct_style (str, default "correct"),
worked_error_rate (float, default 0.0), worked_fraction (float, default 0.4: the share of worked
demonstrations) and pod (str: a dense Qwen3 checkpoint folder; set, it
selects the pod-scale variant).
"""

from __future__ import annotations

import ml_collections

from gspo_jax import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    a = config_lib.parse_arg(
        arg,
        **arith.common_args(),
        direct_style="correct",
        worked_error_rate=0.0,
        worked_fraction=0.4,
        pod="",
    )
    if a.pod:  # the pod-scale variant: a dense Qwen3 on GSM8K (configs/qwen3_gsm8k.py)
        qwen = config_lib.sibling_config(__file__, "qwen3_gsm8k.py")
        c = qwen.pod_variant("qwen3_1_7b", a.pod, a.objective, a.seed)
        arith.apply_common_args(c, a)  # eps, steps, lr when given
        c.lock()
        return c
    c = arith.base_config(a.runlocal)
    arith.apply_common_args(c, a)
    c.task.kwargs.direct_style = a.direct_style
    c.task.kwargs.worked_error_rate = a.worked_error_rate
    c.task.kwargs.worked_fraction = a.worked_fraction
    c.lock()
    return c


# (run-name stem, objective, symmetric ε or None for the preset's own)
ARMS = (
    ("gspo_cliphigher", "gspo", None),  # preset: eps_low 3e-4, eps_high 4e-4
    ("gspo_sym", "gspo", 3e-4),
    ("luspo_cliphigher", "luspo", None),  # preset: the same 3e-4 / 4e-4
    ("grpo_nokl", "grpo", None),  # token ratios, KL off (the claims registry's GRPO arm)
)
# round 2 (issue 33): the same arms, as run names and overrides
ROUND2_ARMS = tuple(
    (
        stem,
        {
            "objective.name": name,
            **({} if eps is None else {"objective.eps_low": eps, "objective.eps_high": eps}),
            **({"objective.kl_coef": 0.0} if stem == "grpo_nokl" else {}),
        },
    )
    for stem, name, eps in ARMS
)


def _arith():
    return config_lib.sibling_config(__file__, "arith.py")


# drgrpo_length_bias (gspo_jax/claims/entries/): only the aggregation differs, on this task
# whose short and long answers are both often right: GRPO's 1/|o| (seq-mean-token-mean) without
# std and KL, against Dr. GRPO's constant normaliser.
DRGRPO_ARMS = (
    (
        "grpo_nostd_nokl",
        {"objective.name": "grpo", "objective.kl_coef": 0.0, "rl.advantage_estimator": "dr_grpo"},
    ),
    ("dr_grpo", {"objective.name": "dr_grpo"}),
)


def get_sweep(arg: str | None = None) -> list[dict]:
    """GSPO with and without clip-higher, LUSPO and GRPO without KL, x seeds; study=drgrpo:
    DRGRPO_ARMS; study=r2: ARMS at the registry's fresh seeds (round 2, issue 33), every seed
    from the config's one warm start (luspo_length's precondition was calibrated on that base:
    its format gap swings by 0.6 between warm-start draws, docs/results.md). Arguments: seeds
    (int), study (str: "length", the default, "drgrpo" or "r2")."""
    a = config_lib.parse_arg(arg, seeds=1, study="length")
    if a.study == "r2":  # round 2 (issue 33): ARMS at the fresh seeds 100, 101, ...
        return _arith().round2_sweep(ROUND2_ARMS, a.seeds, draws=1)
    if a.study not in ("length", "drgrpo"):
        raise ValueError(f"study must be 'length', 'drgrpo' or 'r2', got {a.study!r}")
    runs = []
    for seed in range(a.seeds):
        if a.study == "drgrpo":
            runs += [
                dict(name=f"{n}_s{seed}", overrides={**o, "seed": seed}) for n, o in DRGRPO_ARMS
            ]
            continue
        for stem, name, eps in ARMS:
            overrides = {"objective.name": name, "seed": seed}
            if eps is not None:
                overrides.update({"objective.eps_low": eps, "objective.eps_high": eps})
            if stem == "grpo_nokl":
                overrides["objective.kl_coef"] = 0.0
            runs.append(dict(name=f"{stem}_s{seed}", overrides=overrides))
    return runs
