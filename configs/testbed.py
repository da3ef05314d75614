r"""The testbed (issue 52, docs/testbed.md): addition chains worked step by step, 77-221 tokens.

Round 2's arith testbed ended at its ceiling (a format switch, not learning) on responses of 7-24
tokens; this one has a single worked format whose every step is a local lookup, a base stopped
early so that it slips (held-out accuracy in 0.15-0.45 greedy and sampled), and a gradual climb
under RL because a problem is right only when all of its steps are (tasks/chain_sum.py).

Launch (the warm start is trained when not cached, keyed by its config and its draw):

    python -m gspo_jax.main --config configs/testbed.py --workdir runs/testbed
    python -m gspo_jax.main --config configs/testbed.py:objective=gspo,draw=3 --workdir runs/tb
    python -m gspo_jax.main --config configs/testbed.py:moe,routing_replay --workdir runs/tb_moe
    python -m gspo_jax.main --config configs/testbed.py:runlocal --workdir /tmp/testbed_local

The pilot that calibrated it (its own draws, PILOT_DRAWS, never reused by a claim):

    python experiments/testbed_pilot.py --workdir runs/testbed_pilot

Arguments (``get_config("key=value,...")``): runlocal (bool), objective (str, default "grpo": the
calibration is under GRPO's defaults), seed (int: the RL run's seed), draw (int: the warm-start
draw, init.warmstart.seed; a claim's draws are 0, 1, ..., the pilot's PILOT_DRAWS), steps (int),
lr (float), eps (float: eps_low = eps_high), step_credit (float: the reward's credit for the
share of column entries written right, tasks/chain_sum.py; 0 = the answer's value and the format
only; it does not change the warm start), tagged (bool, default True: operands lettered in the
prompt and each step led by its operand's letter, tasks/chain_sum.py), ceiling (float, default
0.40: the warm start's stopping rule keeps the latest check at or below it, rl/warmstart.py; 0 =
off), lookback (int, default 5: with a ceiling, the parameters also kept every N steps between
checks, the latest at or below the ceiling then the base; 0 = off), loss_norm (str, default
"token": the warm start's, "sequence" or "token": every token weighed the same, so long chains
weigh more; rl/warmstart.py sft_loss), moe (bool: the small_moe preset, its own warm start),
routing_replay (bool, with moe).

Round 3's sweeps (the registry's drafts on this testbed, draws as the unit): get_sweep's
``study``, round3_studies(), run by experiments/claims.py's r3_* sweeps.

Headline metrics: eval/greedy_accuracy and eval/sample_accuracy (held-out, the same worked format
in both), base vs final in <workdir>/summary.json; rollout/response_len_mean.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from gspo_jax import config as config_lib

# The pilot's warm-start draws and RL seeds: far from a claim's 0, 1, ... so that no claim reuses
# them (issue 52: the calibration is a pilot, never evidence). Eight, a design's worth, so that the
# pilot can tell a recipe's spread over draws before any claim runs on it.
PILOT_DRAWS = tuple(range(900, 908))

# The task: 4-10 operands of 3 digits (3-9 worked steps of 4 columns; tasks/chain_sum.py), the
# operands lettered (tagged): each step names the operand it adds, so the model can find it.
TASK = dict(min_terms=4, max_terms=10, digits=3, tagged=True, num_train=20000, num_test=1000)

# The warm start: configs/arith.py's pinned recipe (the same supervised training) with the loss
# averaged over tokens, not demonstrations (loss_norm "token": a 221-token chain weighs 2.9 times
# a 77-token one, so the late steps only long chains have are trained as much as the early ones;
# averaged over demonstrations, each draw's base was near perfect up to some number of terms and
# near zero past it, and RL climbed from one such base of four), and a stopping rule that is a
# band, not a convergence test: every STOPPING["stop_every"] steps the held-out greedy accuracy
# on the last 128 test problems; training stops at the first check at or above STOP_AT, and when
# that check overshoots the ceiling (a small decoder often learns in a jump between two checks)
# the base is the latest parameters at or below it, looked back every stop_lookback steps
# (rl/warmstart.py). The cap is long enough that no draw reaches it first. Every field keys the
# cache; docs/testbed.md has the pilot this recipe was read from.
STOP_AT = 0.25
STOPPING = dict(
    steps=4000,
    stop_every=50,
    stop_metric="greedy_accuracy",
    stop_threshold=STOP_AT,
    stop_patience=1,
    stop_problems=128,
    stop_samples=1,
    stop_ceiling=0.40,
    stop_lookback=5,
    loss_norm="token",
)


def base_config(runlocal: bool) -> ml_collections.ConfigDict:
    """The testbed under GRPO's defaults (config.default_config's RL fields), the task and warm
    start pinned; ``runlocal`` shrinks every size to run in seconds."""
    c = config_lib.default_config()
    c.task.name = "chainsum"
    c.task.kwargs = ml_collections.ConfigDict(dict(TASK))
    c.model.preset = "small"
    c.init.warmstart = (
        config_lib.sibling_config(__file__, "arith.py").base_config(False).init.warmstart
    )
    c.init.warmstart.update(STOPPING)
    c.objective.name = "grpo"
    c.rl.num_steps = 300
    # P = 8 prompts x G = 8 samples: half the library's P, for the budget (docs/testbed.md: a
    # step's cost is its B x T tokens; a design's 16+ runs must fit 4 hours of the 2-core CPU)
    c.rl.prompts_per_step = 8
    c.eval.every = 25
    c.eval.num_problems = 200  # the first 200 test problems; the stopping rule reads the last 128
    c.eval.pass_k = 1  # eval/sample_accuracy: one temperature-1 sample per problem
    c.checkpoint.every = 50
    if runlocal:
        c.task.kwargs = ml_collections.ConfigDict(
            dict(min_terms=2, max_terms=3, digits=2, num_train=2000, num_test=200)
        )
        c.model.preset = "tiny"
        c.init.warmstart.update(dict(steps=40, stop_every=20, stop_problems=16))
        c.rl.update(dict(num_steps=2, prompts_per_step=8, group_size=4))
        c.eval.update(dict(every=1, num_problems=8))
        c.checkpoint.every = 2
    return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    a = config_lib.parse_arg(
        arg,
        runlocal=False,
        objective="grpo",
        seed=0,
        draw=0,
        steps=config_dict.placeholder(int),
        lr=config_dict.placeholder(float),
        eps=config_dict.placeholder(float),
        step_credit=0.0,
        tagged=TASK["tagged"],
        ceiling=STOPPING["stop_ceiling"],
        lookback=STOPPING["stop_lookback"],
        loss_norm=STOPPING["loss_norm"],
        moe=False,
        routing_replay=False,
    )
    if a.routing_replay and not a.moe:
        raise config_lib.ConfigError(
            "routing_replay replays expert routes and needs the MoE model: pass moe too "
            "(configs/testbed.py:moe,routing_replay)"
        )
    if a.lookback and not a.ceiling:
        raise config_lib.ConfigError(
            f"lookback={a.lookback} looks back below a ceiling, and ceiling=0 turns it off: pass "
            "lookback=0 with it (configs/testbed.py:ceiling=0,lookback=0)"
        )
    c = base_config(a.runlocal)
    config_lib.sibling_config(__file__, "arith.py").apply_run_args(c, a)
    c.init.warmstart.seed = a.draw
    c.task.kwargs.step_credit = a.step_credit
    c.task.kwargs.tagged = a.tagged
    c.init.warmstart.stop_ceiling = a.ceiling
    c.init.warmstart.stop_lookback = a.lookback
    c.init.warmstart.loss_norm = a.loss_norm
    if a.moe:
        c.model.preset = "tiny_moe" if a.runlocal else "small_moe"
        c.rl.routing_replay = a.routing_replay
    c.lock()
    return c


# --- round 3 of the claims registry (issue 52): the drafts' arms, each run from every draw -------
# A study is one sweep: every arm from each warm-start draw (RL seed = the draw, so the arms of
# one draw share their base and their prompts, and the registry's tests are paired by draw).
# Comparisons against GRPO drop its KL term, as round 2's did (the KL is not the confound); the
# arms the registry's round 2 ran on other tasks are taken from those configs, not restated.
_MANY_MINIBATCHES = {"rl.num_minibatches": 16, "rl.num_epochs": 2}  # 32 updates per rollout
# The minibatch study's learning rate: twice the library's. Its precondition pilot (docs/
# testbed.md) found GRPO's harm only there: at 1e-4 both objectives climb to ~0.98 at 16 x 2 and
# GRPO clips 0.13 % of its tokens; at 2e-4 GRPO collapses or swings below its base.
MINIBATCH_LR = 2e-4


def round3_studies() -> dict[str, tuple[tuple[str, dict], ...]]:
    """{study: ((arm, overrides), ...)}. An arm two drafts need is run once, in one study, and
    both entries read it (as round 2's r2_ratio served four): the ratio claims share the
    many-minibatch arms, the staleness dose's k = 0 arms are the sequence study's (the
    library's 4 minibatches x 1 epoch, max_staleness 0). Why it matters: a design is 12 draws,
    and a 16 x 2 arm costs about twice a 4 x 1 arm (the update is ~80 % of a step)."""
    arith = config_lib.sibling_config(__file__, "arith.py")
    countdown = config_lib.sibling_config(__file__, "countdown.py")
    luspo_length = config_lib.sibling_config(__file__, "luspo_length.py")
    grpo_nokl = {"objective.name": "grpo", **arith.NO_KL}
    gspo = {"objective.name": "gspo"}
    countdown_arms = dict(countdown.ROUND2_ARMS)  # at 16 x 2 minibatches x epochs, KL to the base
    tis = {"rl.recompute_old_logp": True, "objective.rollout_correction": "seq_tis"}
    return {
        # gspo_minibatch_stability (GSPO against GRPO at 32 updates per rollout) and
        # seq_ratio_eps02 (sequence ratios at 0.2 and at GSPO's own 3e-4 / 4e-4, token ratios at
        # 0.2: off-policy enough for token ratios to reach the clip), at MINIBATCH_LR
        "r3_minibatch": tuple(
            (name, {**o, **_MANY_MINIBATCHES, "optimizer.learning_rate": MINIBATCH_LR})
            for name, o in (
                ("gspo_mb16", gspo),
                ("grpo_nokl_mb16", grpo_nokl),
                ("gspo_eps0.2_mb16", {**gspo, **arith._sym(0.2)}),
            )
        ),
        # moe_routing_replay: GRPO with and without the replay, GSPO without it, on small_moe
        "r3_moe": tuple(
            (
                name,
                {
                    "model.preset": "small_moe",
                    "objective.name": objective,
                    "rl.routing_replay": replay,
                    **_MANY_MINIBATCHES,
                },
            )
            for name, objective, replay in (
                ("grpo_moe_replay", "grpo", True),
                ("grpo_moe", "grpo", False),
                ("gspo_moe", "gspo", False),
            )
        ),
        # gspo_length_normalisation, luspo_length, and staleness_dose's k = 0 arms
        "r3_sequence": (
            ("gspo", gspo),
            ("gspo_nonorm", {**gspo, "objective.length_norm": False}),
            ("luspo", {"objective.name": "luspo"}),
            ("grpo_nokl", grpo_nokl),
        ),
        # staleness_dose: batches 4 updates stale, without and with the sequence-level TIS
        "r3_staleness": tuple(
            (
                f"{name}_k4{'_tis' if corrected else ''}",
                {**o, "rl.max_staleness": 4, **(tis if corrected else {})},
            )
            for name, o in (("grpo_nokl", grpo_nokl), ("gspo", gspo))
            for corrected in (False, True)
        ),
        # gmpo_ratio_range and gmpo_entropy: GMPO against GRPO at the same ratio range e^+-0.4,
        # with the ratios' percentiles logged (the range claim's statistic)
        "r3_gmpo": tuple(
            (name, {**countdown_arms[name], **arith.RATIO_LOGS})
            for name in ("gmpo", "grpo_nokl_w0.4")
        ),
        # dapo_clip_higher_entropy: DAPO's eps_high 0.28 against the symmetric 0.2
        "r3_dapo": tuple((name, countdown_arms[name]) for name in ("dapo_eh0.28", "dapo_eh0.2")),
        # drgrpo_length_bias: GRPO's 1/|o| against Dr. GRPO's constant normaliser
        "r3_drgrpo": luspo_length.DRGRPO_ARMS,
    }


def round3_sweep(study: str, draws) -> list[dict]:
    """``study``'s arms from each of ``draws``, draw by draw (a sweep cut short has every arm at
    its first draws), named ``<arm>_s<draw>``: the RL seed is the draw, so the run's seed names its
    draw too (notebooks/reporting reads ``_s<seed>``)."""
    studies = round3_studies()
    if study not in studies:
        raise ValueError(f"study must be one of {sorted(studies)}, got {study!r}")
    return [
        dict(name=f"{name}_s{d}", overrides={**o, "seed": d, "init.warmstart.seed": d})
        for d in draws
        for name, o in studies[study]
    ]


def get_sweep(arg: str | None = None) -> list[dict]:
    """The pilot's runs for experiments/testbed_pilot.py: GRPO from each of ``draws`` pilot warm
    starts (PILOT_DRAWS), RL seed = the draw, draw by draw; ``lr`` (default: the config's) names
    a calibration arm ``grpo_d<draw>_lr<lr>``. With ``study`` (one of round3_studies()): that
    round-3 sweep from the claim draws 0 .. seeds - 1 (experiments/claims.py passes ``seeds``),
    or with ``pilot`` from the first ``draws`` pilot draws (an entry's preconditions are piloted
    on draws no claim uses)."""
    a = config_lib.parse_arg(
        arg,
        draws=len(PILOT_DRAWS),
        lr=config_dict.placeholder(float),
        study="",
        seeds=12,
        pilot=False,
    )
    if not 1 <= a.draws <= len(PILOT_DRAWS):
        raise ValueError(f"draws must lie in [1, {len(PILOT_DRAWS)}], got {a.draws}.")
    if a.study:
        return round3_sweep(a.study, PILOT_DRAWS[: a.draws] if a.pilot else range(a.seeds))
    runs = []
    for d in PILOT_DRAWS[: a.draws]:
        overrides, name = {"seed": d, "init.warmstart.seed": d}, f"grpo_d{d}"
        if a.lr is not None:
            overrides["optimizer.learning_rate"], name = a.lr, f"{name}_lr{a.lr:g}"
        runs.append(dict(name=name, overrides=overrides))
    return runs
