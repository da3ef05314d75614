"""The warm start's demonstrations: the task's one-turn answers, and a tool environment's
episodes played with a scripted policy (the call format shown with a real tool response).

    it = demonstration_iterator(task, batch_size=16, seed=0)            # the task's own
    it = demonstration_iterator(task, 16, 0, tool_env=env, tool_fraction=0.8)

A batch: prompt [P, Lp], prompt_length [P], response [P, T] and its loss mask [P, T]. A one-turn
demonstration's mask is 1 on its tokens and eos. A tool episode's response is the whole row after
the first prompt (the policy's turns and the environment's tool responses between them, as the
rollout's rows hold them), and its mask is the row's policy mask: the loss is on the policy's
tokens only, the tool's responses and the prompts are context (the action mask of the RL batch).

Dimension legend: P demonstrations per step, Lp = task.max_prompt_len, T = task.max_response_len.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import grain
import numpy as np

from gspo_jax import data, envs
from gspo_jax.rl import episodes
from gspo_jax.tasks.task import Task


def encode_demonstration(task: Task, record: Mapping[str, Any], rng: np.random.Generator):
    """One record -> prompt [Lp], prompt_length, response [T] (demonstration + eos, pad after) and
    its loss mask [T] (1 on demonstration tokens and eos); None when the demonstration does not
    fit T = task.max_response_len (the iterator drops it, see DemonstrationStats)."""
    ids = task.tokenizer.encode(task.demonstration(record, rng), add_eos=True)
    T = task.max_response_len
    if len(ids) > T:
        return None
    out = data.encode_record(task, record)
    response = np.full((T,), task.tokenizer.pad_id, np.int32)  # [T]
    response[: len(ids)] = ids
    mask = np.zeros((T,), np.float32)  # [T]
    mask[: len(ids)] = 1.0
    return {
        "prompt": out["prompt"],
        "prompt_length": out["prompt_length"],
        "response": response,
        "mask": mask,
    }


@dataclasses.dataclass
class DemonstrationStats:
    """How many demonstrations the iterator has drawn, and how many it dropped for being longer
    than the task's max_response_len (real datasets have a long tail: truncating a worked
    solution would teach an answer-less ending, so the whole demonstration is skipped)."""

    seen: int = 0
    dropped: int = 0

    def summary(self, task: Task) -> str:
        return (
            f"warm start ({task.name}): dropped {self.dropped} of {self.seen} demonstrations "
            f"longer than max_response_len={task.max_response_len} tokens (raise the task's "
            "max_response_len to keep them)"
        )


def demonstration_iterator(
    task: Task,
    batch_size: int,
    seed: int,
    data_dir: str | os.PathLike | None = None,
    stats: DemonstrationStats | None = None,
    *,
    tool_env: envs.Environment | None = None,
    tool_fraction: float = 0.0,
):
    """Infinite batches of demonstrations from the train split, deterministic by seed.

    Demonstrations longer than task.max_response_len are skipped and counted in ``stats``; a
    train split none of whose demonstrations fit is a ValueError at the first batch, before any
    training step. With ``tool_env``, a share ``tool_fraction`` of them (drawn per record) are
    the task's tool episodes played in it (encode_tool_demonstration), the rest the task's own."""
    stats = stats if stats is not None else DemonstrationStats()
    ds = data.record_dataset(task, "train", seed=seed, data_dir=data_dir)
    num_records = len(data.load_source(task, "train", data_dir))

    # The global element index (epochs included) seeds the demonstration choice, so each epoch
    # shows a fresh mix of worked / direct / wrong answers for the same problem.
    def encode(i, record):
        rng = np.random.default_rng([seed, i])
        if tool_env is not None and rng.random() < tool_fraction:
            out = encode_tool_demonstration(tool_env, record)
        else:
            out = encode_demonstration(task, record, rng)
        stats.seen += 1
        stats.dropped += out is None
        if stats.dropped == stats.seen >= num_records:  # a whole epoch and nothing fits
            raise ValueError(
                f"no {task.name} demonstration of the train split fits max_response_len="
                f"{task.max_response_len} tokens; raise the task's max_response_len."
            )
        return out

    ds = ds.map_with_index(encode).filter(lambda x: x is not None)
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    return iter(it.batch(batch_size, drop_remainder=True, batch_fn=data.collate))


def tool_environment(task: Task) -> envs.Environment:
    """The environment a tool warm start plays ``task``'s tool demonstrations in: the task's
    problems with the sandboxed Python tool, a row within the task's prompt and response slots.
    ValueError naming the fix for a task without tool demonstrations."""
    if not hasattr(task, "tool_demonstration"):
        raise ValueError(
            f"the {task.name} task has no tool demonstrations (tool_demonstration); set the warm "
            "start's tool_fraction=0 (config.init.warmstart.tool_fraction)."
        )
    return episodes.python_environment(
        task,
        max_turns=8,
        max_tool_response_tokens=256,
        max_total_tokens=task.max_prompt_len + task.max_response_len,
    )


def encode_tool_demonstration(env: envs.Environment, record: Mapping[str, Any]):
    """One record's tool episode (the task's tool_demonstration turns played in ``env`` with the
    real tool) -> prompt [Lp], prompt_length, response [T] (the row after the first prompt) and
    its loss mask [T] (the policy's tokens); None when it does not fit Lp and T, or the
    demonstrated episode went wrong (a tool that failed: no right answer to show)."""
    task = env.task
    tok = task.tokenizer
    row = envs.run_episode(env, record, envs.scripted_policy(task.tool_demonstration(record), tok))
    n = len(env.start(record).prompt_ids)
    Lp, T = task.max_prompt_len, task.max_response_len
    ids, policy = row.ids[n:], row.policy_mask[n:]
    if n > Lp or len(ids) > T or row.info.get("correct", 0.0) < 1:
        return None
    prompt = np.full((Lp,), tok.pad_id, np.int32)  # [Lp]
    prompt[:n] = row.ids[:n]
    response = np.full((T,), tok.pad_id, np.int32)  # [T]
    response[: len(ids)] = ids
    mask = np.zeros((T,), np.float32)  # [T]
    mask[: len(ids)] = policy
    return {"prompt": prompt, "prompt_length": np.int32(n), "response": response, "mask": mask}
