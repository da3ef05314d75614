r"""Products of large numbers with the sandboxed Python tool: multi-turn GSPO on a CPU.

The task (tasks/products.py): "What is a * b?" with two ``digits``-digit operands, ending with
"Answer: <the product>". A small model cannot multiply 6-digit numbers in its head, but it can
call the Python tool (Qwen3's ``<tool_call>`` format), read the response and copy it. The rollout
plays episodes (config.env.name="python", docs/tools.md "The trainer side"): the policy's turns,
the tool's responses between them; the loss sees only the policy's tokens.

Launch (the warm start, which shows the call format, included when it is not cached):

    python -m gspo_jax.main --config configs/tools.py --workdir runs/tools
    python -m gspo_jax.main --config configs/tools.py:runlocal --workdir /tmp/tools_local

The warm start (rl/warmstart_tools.py): supervised training on the products environment's
demonstrations played with the real tool, a share ``tool_fraction`` of them calling it and the
rest answering directly (and right: the demonstrator knows the product), the loss on the policy's
tokens only. Held-out evaluation is the task's one turn, without the tool (eval/greedy_accuracy);
the tool episodes' figures are the rollout's (rollout/tool_calls, rollout/failed_calls,
rollout/turns, rollout/correct).

Needs bubblewrap (docs/tools.md "What it relies on from the OS"). Runtime and accuracy of the
warm start and of RL, measured: docs/tools.md "The experiment".

The experiment (issue 51; gspo_jax/claims/entries/tool_use_where_it_helps and
tool_gspo_matches_grpo; notebooks/tool_use_where_it_helps.ipynb): get_sweep's arms on the mixed
task (MIXED: 4-digit products, half of them a * 1000), from one warm start, each RL seed's arms
paired.

Arguments: runlocal (bool: a tiny model, a few steps), objective (str), seed (int), steps (int),
digits (int: operand length, the difficulty), min_digits (int: mix the lengths
min_digits..digits, one per problem), easy_fraction (float: the share of a * 10^(digits-1), easy
by copying; both for the tool-call rate by difficulty), tool_fraction (float:
the share of warm-start demonstrations that call the tool), max_turns (int: policy turns per
episode), engine ("static" or "continuous": the multi-turn engine).
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from gspo_jax import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    a = config_lib.parse_arg(
        arg,
        runlocal=False,
        objective="gspo",
        seed=0,
        steps=config_dict.placeholder(int),
        digits=6,
        min_digits=config_dict.placeholder(int),
        easy_fraction=0.0,
        tool_fraction=0.8,
        max_turns=3,
        engine="static",
    )
    c = config_lib.default_config()
    c.seed = a.seed
    c.objective.name = a.objective
    c.task.name = "products"
    mix = {} if a.min_digits is None else dict(min_digits=a.min_digits)
    if a.easy_fraction:
        mix["easy_fraction"] = a.easy_fraction
    c.task.kwargs = ml_collections.ConfigDict(dict(digits=a.digits, **mix))
    c.env.name = "python"
    c.env.max_turns = a.max_turns
    c.env.max_tool_response_tokens = 64  # a product's digits, or an error's first lines
    c.rl.rollout_engine = a.engine
    # the warm start that shows the call format and teaches copying (the operands into the call,
    # the tool's digits into the answer): the small model copies nothing after 600 steps at 3e-3,
    # and little with operand lengths mixed even after 2,400 at 5e-3 (docs/tools.md)
    c.init.warmstart.update(steps=1600, learning_rate=5e-3, tool_fraction=a.tool_fraction)
    c.rl.num_steps = 60
    c.rl.prompts_per_step = 8
    c.rl.group_size = 4
    c.eval.every = 20
    c.eval.num_problems = 100
    if a.runlocal:
        c.task.kwargs = ml_collections.ConfigDict(
            dict(digits=min(a.digits, 3), num_train=500, num_test=50, **mix)
        )
        c.model.preset = "tiny"
        c.init.warmstart.steps = 20
        c.rl.num_steps = 2
        c.num_devices = 1  # one CPU device (the tests' 8 simulated ones would need 8 prompts)
        c.rl.prompts_per_step = 2
        c.rl.group_size = 2
        c.rl.num_minibatches = 1
        c.eval.every = 0
        c.eval.at_start = False
        c.eval.num_problems = 4
        c.checkpoint.every = 2
        c.log.progress = False
        c.log.tensorboard = False
    if a.steps is not None:
        c.rl.num_steps = a.steps
    c.lock()
    return c


# The experiment's task (issue 51): 4-digit products, half of them a * 1000 (computable by
# copying: the tool-call rate by difficulty at a fixed question length), from one warm start
# (warm-start seed 0: a warm start that copies takes minutes of this CPU per draw, so the design
# varies the RL seed, not the draw; the verdicts speak for this base). Its RL seeds: 11-20 (v2
# of the entries; v1 was registered for 1-10; the pilots ran seed 0, which no entry counts).
MIXED = "digits=4,easy_fraction=0.5,tool_fraction=0.5"
TOOL_SEEDS = tuple(range(11, 21))
# the arms: GSPO (its preset: the sequence ratio over the policy's tokens, eps 3e-4/4e-4) and GRPO
# at its own eps 0.2 without its KL term (no reference model: the ratio level and eps differ)
TOOL_ARMS = {
    "gspo": {"objective.name": "gspo"},
    "grpo_nokl": {"objective.name": "grpo", "objective.kl_coef": 0.0},
}


def get_sweep(arg: str | None = None) -> list[dict]:
    """The tool experiment's runs for experiments/claims.py (sweep "tools"): every arm of
    TOOL_ARMS at each of the first ``seeds`` of TOOL_SEEDS (a seed's arms share their prompts
    and sampling keys while the parameters agree), seed by seed."""
    a = config_lib.parse_arg(arg, seeds=len(TOOL_SEEDS))
    if not 1 <= a.seeds <= len(TOOL_SEEDS):
        raise ValueError(f"seeds must lie in [1, {len(TOOL_SEEDS)}], got {a.seeds}.")
    return [
        dict(name=f"{arm}_s{seed}", overrides={**o, "seed": seed})
        for seed in TOOL_SEEDS[: a.seeds]
        for arm, o in TOOL_ARMS.items()
    ]
