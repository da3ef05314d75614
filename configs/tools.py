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

Needs bubblewrap (docs/tools.md "What it relies on from the OS"). Expected runtime and accuracy:
not measured yet.

Arguments: runlocal (bool: a tiny model, a few steps), objective (str), seed (int), steps (int),
digits (int: operand length, the difficulty), tool_fraction (float: the share of warm-start
demonstrations that call the tool), max_turns (int: policy turns per episode), engine ("static"
or "continuous": the multi-turn engine).
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
        tool_fraction=0.8,
        max_turns=3,
        engine="static",
    )
    c = config_lib.default_config()
    c.seed = a.seed
    c.objective.name = a.objective
    c.task.name = "products"
    c.task.kwargs = ml_collections.ConfigDict(dict(digits=a.digits))
    c.env.name = "python"
    c.env.max_turns = a.max_turns
    c.env.max_tool_response_tokens = 64  # a product's digits, or an error's first lines
    c.rl.rollout_engine = a.engine
    # the warm start that shows the call format (600 steps: not measured where it levels off)
    c.init.warmstart.update(steps=600, learning_rate=3e-3, tool_fraction=a.tool_fraction)
    c.rl.num_steps = 60
    c.rl.prompts_per_step = 8
    c.rl.group_size = 4
    c.eval.every = 20
    c.eval.num_problems = 100
    if a.runlocal:
        c.task.kwargs = ml_collections.ConfigDict(
            dict(digits=min(a.digits, 3), num_train=500, num_test=50)
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
