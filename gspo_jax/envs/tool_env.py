"""Multi-turn episodes with tools: the policy calls tools until it answers, within limits.

A ToolEnvironment subclass gives the problem's first messages and the final verdict; the loop
is here. Each policy turn is parsed for tool calls (tool_calls.py):

- no call: the turn is the answer; the episode ends with the verdict of its text ("answer", or
  "truncated" if it ran out of room before its eos);
- calls: each is answered (a malformed or unknown call, or bad arguments, with an error text;
  a failing tool with its error), each response clipped to ``max_tool_response_tokens`` tokens,
  and the responses are the observation, unless the turn was the ``max_turns``-th ("turns") or
  the observation would leave no room in ``max_total_tokens`` ("length"): the episode then ends
  with the verdict of that turn's text (a call, not an answer: usually reward 0).

A response whose text starts with "error:" counts as a failed call (info "failed_calls").

python_tool wraps the sandboxed Python tool (gspo_jax.tools.run_python) as a Tool.
TaskToolEnvironment offers tools on any task's problems: the task's prompt as the first message
(a chat task's own messages through its template), the task's verifier as the verdict.

Dimension legend: n = a policy turn's ids, m = an observation's ids.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gspo_jax.envs.chat import ChatFormat, Message, PlainChat, TemplateChat
from gspo_jax.envs.environment import (
    Environment,
    Episode,
    EpisodeLimits,
    PendingTurn,
    Transition,
    split_turn,
)
from gspo_jax.envs.tool_calls import Tool, answer_call, parse_tool_calls
from gspo_jax.tasks.task import Task, Verdict
from gspo_jax.tools import check_available, run_python

ERROR_PREFIX = "error:"  # how a response says the call failed (tool_calls.py writes it)


def python_tool(*, timeout_s: float = 5.0, memory_mb: int = 256, run=run_python) -> Tool:
    """The sandboxed Python tool: ``python(code)`` runs the code, answers what it printed;
    a run that does not end with status "ok" answers "error: ..." and its output. Refuses here,
    at construction, where the sandbox is unavailable (not as an error text in every episode)."""
    if run is run_python:
        check_available()

    def python(code: str) -> str:
        r = run(code, timeout_s=timeout_s, memory_mb=memory_mb)
        if r.status == "ok":
            return r.output
        return f"{ERROR_PREFIX} the program ended with status {r.status}\n{r.output}"

    return Tool(
        name="python",
        description="Run a Python program (standard library only) and return what it prints.",
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program"}},
            "required": ["code"],
        },
        fn=python,
    )


class ToolEnvironment(Environment):
    """Subclasses set ``chat``, ``tools``, ``limits`` and write first_messages and verdict."""

    @abc.abstractmethod
    def first_messages(self, record: Mapping[str, Any]) -> list[Message]:
        """The problem as the conversation's first messages (system, user)."""

    @abc.abstractmethod
    def verdict(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        """The final turn's judgement (as a task's verifier: never raises, never evals)."""

    def start(self, record: Mapping[str, Any]) -> Episode:
        return ToolEpisode(self, record)

    def clip(self, text: str) -> str:
        """A tool response cut to the limit's tokens (the policy reads that it was cut)."""
        tok, limit = self.chat.tokenizer, self.limits.max_tool_response_tokens
        ids = tok.encode(text)
        return text if len(ids) <= limit else tok.decode(ids[:limit]) + "\n[truncated]"


class TaskToolEnvironment(ToolEnvironment):
    """``task``'s problems with ``tools`` offered. Rendering: ``chat``, else the task
    tokenizer's chat template (its tools header lists the tools) when it has one, else PlainChat.
    The first messages are the task's ``messages(record)`` under a template (the chat tasks'),
    else its prompt text as the user's message (PlainChat: the task's own prompt ids)."""

    def __init__(
        self,
        task: Task,
        *,
        tools: Sequence[Tool],
        chat: ChatFormat | None = None,
        limits: EpisodeLimits | None = None,
    ):
        self.task = task
        if chat is None and getattr(task.tokenizer, "chat_template", None) is not None:
            chat = TemplateChat(
                task.tokenizer, enable_thinking=getattr(task, "enable_thinking", False)
            )
        self.chat = chat if chat is not None else PlainChat(task.tokenizer)
        self.tools = {t.name: t for t in tools}
        self.limits = limits if limits is not None else EpisodeLimits()

    def first_messages(self, record: Mapping[str, Any]) -> list[Message]:
        if isinstance(self.chat, TemplateChat) and hasattr(self.task, "messages"):
            return list(self.task.messages(record))
        return [{"role": "user", "content": self.task.prompt_text(record)}]

    def verdict(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        return self.task.verify(record, text, terminated)


class ToolEpisode(Episode):
    def __init__(self, env: ToolEnvironment, record: Mapping[str, Any]):
        self.env, self.record = env, record
        self.messages = list(env.first_messages(record))
        self.prompt_ids = env.chat.prompt_ids(
            self.messages, [t.schema() for t in env.tools.values()]
        )
        self.length = len(self.prompt_ids)
        self.turns = self.tool_calls = self.failed_calls = 0

    def begin(self, ids: Sequence[int]) -> PendingTurn:
        ids, text, terminated = split_turn(self.env.chat.tokenizer, ids)
        self.turns += 1
        self.length += len(ids)
        self.messages.append({"role": "assistant", "content": text})
        calls = tuple(parse_tool_calls(text)) if terminated else ()
        jobs: tuple[Callable[[], str], ...] = tuple(answer_call(self.env.tools, c) for c in calls)
        return PendingTurn(text, terminated, calls, jobs)

    def finish(self, pending: PendingTurn, responses: Sequence[str]) -> Transition:
        if len(responses) != len(pending.jobs):
            raise ValueError(f"{len(responses)} responses for {len(pending.jobs)} tool jobs.")
        if not pending.calls:
            return self._end(pending, "answer" if pending.terminated else "truncated")
        self.tool_calls += len(responses)
        self.failed_calls += sum(r.startswith(ERROR_PREFIX) for r in responses)
        if self.turns >= self.env.limits.max_turns:
            return self._end(pending, "turns")
        observation = [{"role": "tool", "content": self.env.clip(r)} for r in responses]
        obs_ids = self.env.chat.observation_ids(self.messages, observation)  # [m]
        if self.length + len(obs_ids) >= self.env.limits.max_total_tokens:
            return self._end(pending, "length")
        self.messages += observation
        self.length += len(obs_ids)
        return Transition(tuple(obs_ids), False)

    def _end(self, pending: PendingTurn, end: str) -> Transition:
        v = self.env.verdict(self.record, pending.text, pending.terminated and end == "answer")
        info = {
            "correct": v.correct,
            "format": v.format,
            **v.extras,
            "turns": float(self.turns),
            "tool_calls": float(self.tool_calls),
            "failed_calls": float(self.failed_calls),
        }
        return Transition((), True, v.reward, 0.0, info, end)
