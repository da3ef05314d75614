"""Multi-turn rows in the trainer: config.env names an environment, the rollout plays episodes.

    envs_refusals(config)                       # the features an environment run does not carry
    env_rollout = make_env_rollout(config, task, prompt_len=Lp, response_len=T)   # or None
    batch, scores = env_rollout.play(model, batch_local, key, spec)   # EpisodeBatch, [B] each

With config.env.name "" (the default) nothing here runs: the rollout is the task's one turn,
unchanged. With "python" the environment is envs.TaskToolEnvironment: the task's problems (its
prompt, its verifier) with the sandboxed Python tool offered, and the rollout is the multi-turn
engine's (rollout/multi_turn.py generate_episodes, with config.rl.rollout_engine). Its
EpisodeBatch carries the action mask (1 on the policy's tokens) that the batch preparation takes
(rl/batch.py: the loss sees only the policy's tokens) and the environment's rewards, which
replace the task's scoring of the response.

The environment's limits: config.env.max_turns policy turns, config.env.max_tool_response_tokens
per tool response, and the whole row (prompt, turns and tool responses) within the prompt slots
and rl.max_new_tokens, so every end is the environment's own.

Dimension legend: P prompts, G samples per prompt, B = P*G rows, Lp padded prompt length,
T = max_new_tokens (the response region: turns and observations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from gspo_jax import envs, tasks, tools
from gspo_jax.config import ConfigError
from gspo_jax.rollout import multi_turn

ENVIRONMENTS = ("python",)  # config.env.name's values besides "" (one turn)
# what a row's info holds that the trainer logs per episode (means over the step's rows)
EPISODE_COUNTS = ("turns", "tool_calls", "failed_calls")


def envs_refusals(config: ml_collections.ConfigDict) -> None:
    """config.env checked against the features an environment run does not carry: one-line
    ConfigErrors naming the fix. Nothing to check with config.env.name "" (one turn)."""
    name = config.env.name
    if not name:
        return
    if name not in ENVIRONMENTS:
        raise ConfigError(
            f"config.env.name={name!r} is not an environment; valid: {('',) + ENVIRONMENTS} "
            "('' = one turn, no environment)"
        )
    # the features an environment run does not carry are config/combinations.py's rows; here
    # the engine (a value of one field) and the log-prob noise dose (a claims experiment's knob)
    fix = "set config.env.name='' (one turn) or turn the feature off"
    rl = config.rl
    engines = tuple(multi_turn.ENGINES)
    refused = (
        (rl.rollout_logp_noise > 0, "rl.rollout_logp_noise: the dose is one-turn rows'"),
        (
            rl.rollout_engine not in engines,
            f"rl.rollout_engine={rl.rollout_engine!r}: the multi-turn engines are {engines}",
        ),
    )
    for refused_here, what in refused:
        if refused_here:
            raise ConfigError(f"config.env.name={name!r} with {what}; {fix}")
    for field in ("max_turns", "max_tool_response_tokens", "tool_workers", "tool_memory_mb"):
        if config.env[field] < 1:
            raise ConfigError(f"config.env.{field}={config.env[field]} must be >= 1")
    if not config.env.tool_timeout_s > 0:
        raise ConfigError(f"config.env.tool_timeout_s={config.env.tool_timeout_s} must be > 0")


@dataclasses.dataclass
class EnvRollout:
    """An environment run's rollout: the environment and the pool its tools run on."""

    env: envs.Environment
    pool: Any  # tools.ToolPool (submit_job)

    def play(self, model, batch_local: Mapping[str, np.ndarray], key, spec):
        """The P problems of ``batch_local``, G episodes each, played by ``model`` through the
        multi-turn engine: (EpisodeBatch with prompts padded to spec.prompt_len, the rows'
        scores {reward, correct, format, turns, tool_calls, failed_calls} [B] float32)."""
        task = self.env.task
        records = [
            task.record_from_batch(batch_local, p) for p in range(len(batch_local["prompt"]))
        ]
        batch = generate_episodes()(
            model,
            self.env,
            records,
            engine=spec.rollout_engine,
            num_samples=spec.group_size,
            max_new_tokens=spec.response_len,
            rng=jax.random.wrap_key_data(key),
            temperature=spec.temperature,
            top_k=spec.top_k,
            top_p=spec.top_p,
            eos_id=spec.eos_id,
            pad_id=spec.pad_id,
            executor=self.pool,
            **dict(spec.rollout_options),
        )
        return padded_prompts(batch, spec.prompt_len, spec.pad_id), episode_scores(batch)


def generate_episodes():
    """The multi-turn engine's generate_episodes (rollout/multi_turn.py); tests swap it."""
    return multi_turn.generate_episodes


def padded_prompts(batch, prompt_len: int, pad_id: int):
    """The EpisodeBatch with its first prompts right-padded from [P, Lp'] to [P, prompt_len] (the
    run's compiled prompt slots); ValueError naming the fix when a prompt is longer."""
    prompts = np.asarray(batch.prompts)  # [P, Lp']
    if prompts.shape[1] > prompt_len:
        longest = int(np.max(np.asarray(batch.prompt_lengths)))
        if longest > prompt_len:
            raise ValueError(
                f"the environment's first prompt takes {longest} tokens, more than the task's "
                f"max_prompt_len={prompt_len} (a chat template's tools header adds to it); "
                "raise config.task.kwargs.max_prompt_len"
            )
        prompts = prompts[:, :prompt_len]
    pad = np.full((prompts.shape[0], prompt_len - prompts.shape[1]), pad_id, prompts.dtype)
    return batch.replace(prompts=np.concatenate([prompts, pad], axis=1))


def episode_scores(batch) -> dict[str, np.ndarray]:
    """Per row [B] float32: the environment's reward, the verdict's correct and format parts,
    and the episode's turns, tool calls and failed calls (0 where the info lacks one)."""
    infos = batch.infos
    out = {"reward": np.asarray(batch.rewards, np.float32)}
    for k in ("correct", "format", *EPISODE_COUNTS):
        out[k] = np.asarray([float(i.get(k, 0.0)) for i in infos], np.float32)
    return out


def make_env_rollout(
    config: ml_collections.ConfigDict, task: tasks.Task, *, prompt_len: int, response_len: int
) -> EnvRollout | None:
    """config.env's rollout (None for one turn): the environment over ``task`` with its limits
    (the row: prompt_len + response_len tokens) and its tools' pool. Refuses where the sandbox
    is unavailable (the line names what to install)."""
    envs_refusals(config)
    e = config.env
    if not e.name:
        return None
    try:
        env = python_environment(
            task,
            max_turns=e.max_turns,
            max_tool_response_tokens=e.max_tool_response_tokens,
            max_total_tokens=prompt_len + response_len,
            timeout_s=e.tool_timeout_s,
            memory_mb=e.tool_memory_mb,
        )
        pool = tools.ToolPool(max_workers=e.tool_workers)
    except tools.SandboxUnavailable as err:
        raise ConfigError(
            f"config.env.name={e.name!r} runs the sandboxed Python tool: {err}"
        ) from None
    return EnvRollout(env, pool)


def python_environment(
    task: tasks.Task,
    *,
    max_turns: int,
    max_tool_response_tokens: int,
    max_total_tokens: int,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
) -> envs.TaskToolEnvironment:
    """``task``'s problems with the sandboxed Python tool offered, within these limits (the
    "python" environment: the trainer's, the warm start's and the evaluation command's); a
    ConfigError naming what to install where the sandbox is unavailable."""
    limits = envs.EpisodeLimits(
        max_turns=max_turns,
        max_tool_response_tokens=max_tool_response_tokens,
        max_total_tokens=max_total_tokens,
    )
    try:
        tool = envs.python_tool(timeout_s=timeout_s, memory_mb=memory_mb)
    except tools.SandboxUnavailable as err:
        raise ConfigError(f"the Python tool runs in the sandbox: {err}") from None
    return envs.TaskToolEnvironment(task, tools=[tool], limits=limits)
