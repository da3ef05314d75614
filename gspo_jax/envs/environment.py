"""The environment seam: an episode over several turns, in token ids.

    env = ProductsEnvironment(digits=6)            # or TaskEnvironment(tasks.get_task("arith"))
    episode = env.start(record)                    # the problem: episode.messages, prompt_ids
    t = episode.step(policy_ids)                   # the policy's turn [n] (ending with eos)
    t.done, t.reward, t.observation_ids            # the environment's answer [m] when not done

An Environment is the shared, stateless part (its tools, chat format and limits); an Episode is
one problem's state (the conversation, the turn count, the row's length). A policy's turn is its
sampled ids, kept as they are in the row; the environment answers with the ids that follow them
(tool responses and the next generation prompt, chat.py) or ends the episode with its reward.

The step is split in two for engines that run tools off the decode path: ``begin(ids)`` parses
the turn and returns its tool jobs (zero-argument callables returning the response text, which
never raise), which run anywhere (a pool, while other rows decode), and ``finish(pending,
responses)`` builds the Transition. ``step`` is both, running the jobs here.

run_episode plays one episode with a policy function and returns the row with its policy mask
(1 on the policy's tokens, the actions; 0 on the prompt's and the environment's, the context).

Dimension legend: L = number of tokens in one row; n a policy turn's ids; m an observation's.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gspo_jax.envs.chat import ChatFormat, Message
from gspo_jax.envs.tool_calls import MalformedCall, Tool, ToolCall


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """How long an episode may run: policy turns, each tool response's tokens (clipped past it),
    and the whole row's tokens (prompt, turns and observations together)."""

    max_turns: int = 4
    max_tool_response_tokens: int = 256
    max_total_tokens: int = 1024

    def __post_init__(self):
        if min(self.max_turns, self.max_tool_response_tokens, self.max_total_tokens) < 1:
            raise ValueError(f"every episode limit must be >= 1, got {self}.")


@dataclasses.dataclass(frozen=True)
class Transition:
    """The environment's answer to one policy turn.

    ``observation_ids`` [m]: what follows the turn in the row (empty when done). ``reward``: the
    episode's reward, set when done. ``turn_reward``: this turn's own reward (0 unless the
    environment gives per-turn rewards). ``info``: the verdict's parts and the episode's counts
    (turns, tool_calls, failed_calls) when done. ``end``: why it ended ("answer", "turns",
    "length", "truncated"), "" while it goes on.
    """

    observation_ids: tuple[int, ...]
    done: bool
    reward: float = 0.0
    turn_reward: float = 0.0
    info: Mapping[str, float] = dataclasses.field(default_factory=dict)
    end: str = ""


@dataclasses.dataclass(frozen=True)
class PendingTurn:
    """A policy turn, parsed: its text, whether it ended with eos, its calls and their jobs."""

    text: str
    terminated: bool
    calls: tuple[ToolCall | MalformedCall, ...]
    jobs: tuple[Callable[[], str], ...]


class Episode(abc.ABC):
    """One problem's episode. ``messages``: the conversation so far; ``prompt_ids`` [L0]: the
    first prompt; ``length``: the row's tokens so far."""

    messages: list[Message]
    prompt_ids: list[int]
    length: int

    @abc.abstractmethod
    def begin(self, ids: Sequence[int]) -> PendingTurn:
        """Take the policy's turn [n] (cut after its first eos, if any)."""

    @abc.abstractmethod
    def finish(self, pending: PendingTurn, responses: Sequence[str]) -> Transition:
        """Answer the turn, given its jobs' responses in order."""

    def step(self, ids: Sequence[int]) -> Transition:
        pending = self.begin(ids)
        return self.finish(pending, [job() for job in pending.jobs])


class Environment(abc.ABC):
    """A family of episodes: ``chat`` renders them, ``tools`` are what the policy may call (name
    -> Tool), ``limits`` bound them."""

    chat: ChatFormat
    tools: Mapping[str, Tool] = {}
    limits: EpisodeLimits = EpisodeLimits()

    @abc.abstractmethod
    def start(self, record: Mapping[str, Any]) -> Episode:
        """A new episode of the problem ``record`` (a task record)."""


def split_turn(tokenizer, ids: Sequence[int]) -> tuple[list[int], str, bool]:
    """A policy turn's ids cut after the first eos, its text (without eos) and whether it ended
    with eos (a turn without one ran out of room)."""
    ids = [int(i) for i in ids]
    if tokenizer.eos_id in ids:
        ids = ids[: ids.index(tokenizer.eos_id) + 1]
        return ids, tokenizer.decode(ids[:-1]), True
    return ids, tokenizer.decode(ids), False


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One played episode as a row: ``ids`` [L] and ``policy_mask`` [L] (1 on the policy's
    tokens), the final transition's reward, info and end, and each turn's reward."""

    ids: tuple[int, ...]
    policy_mask: tuple[int, ...]
    reward: float
    turn_rewards: tuple[float, ...]
    info: Mapping[str, float]
    end: str


def run_episode(
    env: Environment,
    record: Mapping[str, Any],
    policy: Callable[[list[int], int], Sequence[int]],
) -> Rollout:
    """Play one episode: ``policy(context_ids [L], budget) -> turn ids [n <= budget]`` samples
    each turn (ending with eos, or cut by the budget: the row's room left)."""
    episode = env.start(record)
    ids = list(episode.prompt_ids)
    mask = [0] * len(ids)
    turn_rewards = []
    while True:
        budget = env.limits.max_total_tokens - len(ids)
        turn, _, _ = split_turn(env.chat.tokenizer, list(policy(list(ids), budget))[:budget])
        ids += turn
        mask += [1] * len(turn)
        t = episode.step(turn)
        turn_rewards.append(t.turn_reward)
        if t.done:
            return Rollout(tuple(ids), tuple(mask), t.reward, tuple(turn_rewards), t.info, t.end)
        ids += t.observation_ids
        mask += [0] * len(t.observation_ids)


def scripted_policy(turns: Sequence[str], tokenizer) -> Callable[[list[int], int], list[int]]:
    """A policy that writes ``turns`` in order, each ending with eos (then only eos): the
    warm start's demonstrations and the tests play episodes with it."""
    queue = [tokenizer.encode(t, add_eos=True) for t in turns]

    def policy(context: list[int], budget: int) -> list[int]:
        del context, budget
        return queue.pop(0) if queue else [tokenizer.eos_id]

    return policy
