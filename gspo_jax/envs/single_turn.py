"""Any single-turn task as an environment: the one-turn case of the seam.

    env = TaskEnvironment(tasks.get_task("arith"))
    episode = env.start(record)       # prompt_ids == task.prompt_ids(record)
    t = episode.step(response_ids)    # done at once; t.reward == the task's score of that row

The prompt is the task's own (its ids unchanged), the response is split and judged by the task's
own functions (split_response, verify), so the reward is the one task.score gives the same row.

Dimension legend: n = a response's ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gspo_jax.envs.chat import PlainChat
from gspo_jax.envs.environment import Environment, Episode, EpisodeLimits, PendingTurn, Transition
from gspo_jax.tasks.task import Task


class TaskEnvironment(Environment):
    """One turn, no tools; the episode's row is the task's prompt and one response."""

    def __init__(self, task: Task):
        self.task = task
        self.chat = PlainChat(task.tokenizer)
        self.tools = {}
        self.limits = EpisodeLimits(
            max_turns=1, max_total_tokens=task.max_prompt_len + task.max_response_len
        )

    def start(self, record: Mapping[str, Any]) -> Episode:
        return _TaskEpisode(self.task, record)


class _TaskEpisode(Episode):
    def __init__(self, task: Task, record: Mapping[str, Any]):
        self.task, self.record = task, record
        self.messages = [{"role": "user", "content": task.prompt_text(record)}]
        self.prompt_ids = task.prompt_ids(record)
        self.length = len(self.prompt_ids)

    def begin(self, ids: Sequence[int]) -> PendingTurn:
        ids = np.asarray(list(ids), np.int64)  # [n]
        text, terminated = self.task.split_response(ids, np.ones_like(ids))
        self.messages.append({"role": "assistant", "content": text})
        self.length += len(ids)
        return PendingTurn(text, terminated, (), ())

    def finish(self, pending: PendingTurn, responses: Sequence[str]) -> Transition:
        v = self.task.verify(self.record, pending.text, pending.terminated)
        info = {"correct": v.correct, "format": v.format, **v.extras, "turns": 1.0}
        end = "answer" if pending.terminated else "truncated"
        return Transition((), True, v.reward, v.reward, info, end)
