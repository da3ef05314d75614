"""Environments: episodes over several turns, in which the policy may call tools.

    from gspo_jax import envs
    env = envs.ProductsEnvironment(digits=8)                  # a task where the tool matters
    env = envs.TaskEnvironment(tasks.get_task("arith"))       # any task: the one-turn case
    episode = env.start(record)
    t = episode.step(policy_ids)            # t.observation_ids, t.done, t.reward, t.info
    row = envs.run_episode(env, record, policy)   # row.ids, row.policy_mask, row.reward

environment.py: the seam (Environment, Episode, Transition, EpisodeLimits, run_episode).
tool_calls.py: Qwen3's <tool_call> format, parsed; Tool, and the answer to any call.
chat.py: the token stream (a checkpoint's chat template, or the plain character format).
tool_env.py: the multi-turn loop with tools and limits; the Python tool (gspo_jax.tools);
TaskToolEnvironment: any task's problems with tools offered.
single_turn.py: a tasks.Task as a one-turn environment. products.py: products of large numbers.
"""

from gspo_jax.envs.chat import ChatFormat, PlainChat, TemplateChat
from gspo_jax.envs.environment import (
    Environment,
    Episode,
    EpisodeLimits,
    PendingTurn,
    Rollout,
    Transition,
    run_episode,
    scripted_policy,
    split_turn,
)
from gspo_jax.envs.products import ProductsEnvironment
from gspo_jax.envs.single_turn import TaskEnvironment
from gspo_jax.envs.tool_calls import MalformedCall, Tool, ToolCall, answer_call, parse_tool_calls
from gspo_jax.envs.tool_env import (
    TaskToolEnvironment,
    ToolEnvironment,
    ToolEpisode,
    python_tool,
)

__all__ = [
    "ChatFormat",
    "Environment",
    "Episode",
    "EpisodeLimits",
    "MalformedCall",
    "PendingTurn",
    "PlainChat",
    "ProductsEnvironment",
    "Rollout",
    "TaskEnvironment",
    "TaskToolEnvironment",
    "TemplateChat",
    "Tool",
    "ToolCall",
    "ToolEnvironment",
    "ToolEpisode",
    "Transition",
    "answer_call",
    "parse_tool_calls",
    "python_tool",
    "run_episode",
    "scripted_policy",
    "split_turn",
]
