"""What a multi-turn rollout returns (EpisodeBatch) and the host's side of its rows (Rows): each
row's Episode, its response region as the turns fill it, and its tool jobs in flight.

Dimension legend: P problems, G episodes per problem, B = P * G rows (group-contiguous: row b
plays problem b // G), Lp padded first-prompt length, T = max_new_tokens (the response region:
the policy's turns and the environment's observations, as the row reads).

A row's response region holds, in order, turn 1 (the policy's tokens, ending with eos or cut by
the row's room), observation 1 (the environment's: tool responses and the next generation
prompt), turn 2, ... the last turn. Both engines write it through Rows, so what a turn and an
observation put in the row, how a row's room is counted and how it ends are written once:

- room of a turn: min(T - t0, limits.max_total_tokens - episode.length) tokens (t0: the row's
  tokens so far), as envs.run_episode's budget, so the environment's limit and the region's
  both hold;
- an observation that would leave no room in the region (t0 + m >= T) ends the episode there,
  as the environment's own "length" end does, with reward 0 and end "length": the region is the
  engine's limit, which the environment does not know (set limits.max_total_tokens <= the
  shortest first prompt + T to let the environment judge every end itself).

The environment is duck-typed (env.start(record) -> an Episode with prompt_ids, length,
begin(ids) -> PendingTurn with jobs, finish(pending, responses) -> Transition; env.limits):
gspo_jax.envs holds the seam and its environments; rollout does not import them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import numpy as np

from gspo_jax.errors import ConfigError
from gspo_jax.rollout.output import SampleOutput


@flax.struct.dataclass
class EpisodeBatch:
    """B = P·G played episodes, as the trainer's batch.

    prompts [P, Lp] int32 right-padded (the episodes' first prompts), prompt_lengths [P] int32;
    sample: SampleOutput over the response region [B, T] (mask 1 on every real token, the
    policy's and the environment's; logp and sample_logp 0 on the environment's); action_mask
    [B, T] f32 (1 on the policy's tokens only); rewards [B] f32 (each episode's final reward).
    infos: a tuple of B dicts (turns, tool_calls, failed_calls, end, and the environment's
    verdict parts), a static field: not a pytree leaf, so jax.tree.map passes it through
    untouched, and a jitted function should take the arrays (batch.replace(infos=()) or the
    fields) since dicts do not hash.
    """

    prompts: jax.Array
    prompt_lengths: jax.Array
    sample: SampleOutput
    action_mask: jax.Array
    rewards: jax.Array
    infos: tuple = flax.struct.field(pytree_node=False, default=())


class InlineExecutor:
    """executor=None: a row's tool jobs run at once, on the host, when its turn ends."""

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(job())
        return future


def submit(executor, job: Callable[[], Any]) -> concurrent.futures.Future:
    """A tool job on the executor: ToolPool.submit_job, or any executor's submit(fn)."""
    return executor.submit_job(job) if hasattr(executor, "submit_job") else executor.submit(job)


@dataclasses.dataclass
class _Waiting:
    pending: Any  # the Episode's PendingTurn
    futures: list[concurrent.futures.Future]


class Rows:
    """The host's record of the B rows: their episodes, response regions and tool jobs.

    The engines call turn_ended when a row's turn ends (its jobs are submitted), ready_rows to
    collect rows whose jobs finished (their observations written), and batch at the end.
    """

    def __init__(self, env, records: Sequence[Mapping[str, Any]], G: int, T: int, pad_id: int):
        P = len(records)
        if P < 1:
            raise ConfigError("records is empty: generate_episodes needs at least one problem.")
        self.env, self.G, self.T, self.pad_id = env, G, T, pad_id
        self.episodes = [env.start(records[b // G]) for b in range(P * G)]
        firsts = [list(self.episodes[p * G].prompt_ids) for p in range(P)]
        if min(len(f) for f in firsts) < 1:
            raise ConfigError("an episode's first prompt is empty; every prompt needs a token.")
        Lp = max(len(f) for f in firsts)
        self.prompts = np.full((P, Lp), pad_id, np.int32)  # [P, Lp]
        for p, f in enumerate(firsts):
            self.prompts[p, : len(f)] = f
        self.prompt_lengths = np.array([len(f) for f in firsts], np.int32)  # [P]
        B = P * G
        self.tokens = np.full((B, T), pad_id, np.int32)
        self.mask = np.zeros((B, T), np.float32)
        self.action = np.zeros((B, T), np.float32)
        self.logp = np.zeros((B, T), np.float32)
        self.sample_logp = np.zeros((B, T), np.float32)
        self.length = np.zeros((B,), np.int32)  # t0: tokens in the row's region so far
        self.done = np.zeros((B,), bool)
        self.rewards = np.zeros((B,), np.float32)
        self.infos: list[dict] = [{} for _ in range(B)]
        self.waiting: dict[int, _Waiting] = {}

    @property
    def B(self) -> int:
        return self.tokens.shape[0]

    def room(self, b: int) -> int:
        """Tokens row b's next turn may take (module docstring)."""
        ep = self.episodes[b]
        return int(min(self.T - self.length[b], self.env.limits.max_total_tokens - ep.length))

    def turn_ended(self, b: int, ids, logp, sample_logp, executor) -> None:
        """Row b's turn: ids [n] (ending with eos, or cut by its room) and their log-probs [n],
        written at the row's end; the episode parses it and its tool jobs go to the executor."""
        n, t0 = len(ids), int(self.length[b])
        sl = slice(t0, t0 + n)
        self.tokens[b, sl], self.logp[b, sl], self.sample_logp[b, sl] = ids, logp, sample_logp
        self.mask[b, sl] = self.action[b, sl] = 1.0
        self.length[b] = t0 + n
        pending = self.episodes[b].begin([int(i) for i in ids])
        self.waiting[b] = _Waiting(pending, [submit(executor, job) for job in pending.jobs])

    def ready_rows(self, block: bool = False) -> list[int]:
        """Rows whose tool jobs all finished, answered (finish) and written: the rows that play
        another turn (those that ended are marked done). block: wait for at least one."""
        if block and self.waiting:
            futures = [f for w in self.waiting.values() for f in w.futures]
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
        ready = [b for b, w in self.waiting.items() if all(f.done() for f in w.futures)]
        playing = []
        for b in sorted(ready):
            w = self.waiting.pop(b)
            t = self.episodes[b].finish(w.pending, [f.result() for f in w.futures])
            if not t.done and self.length[b] + len(t.observation_ids) >= self.T:
                self._end(b, 0.0, dict(_counts(self.episodes[b]), end="length"))
            elif t.done:
                self._end(b, t.reward, dict(t.info, end=t.end))
            else:
                obs, t0 = np.asarray(t.observation_ids, np.int32), int(self.length[b])
                self.tokens[b, t0 : t0 + len(obs)] = obs
                self.mask[b, t0 : t0 + len(obs)] = 1.0
                self.length[b] = t0 + len(obs)
                playing.append(b)
        return playing

    def _end(self, b: int, reward: float, info: dict) -> None:
        self.done[b], self.rewards[b], self.infos[b] = True, reward, info

    def batch(self) -> EpisodeBatch:
        mask = self.mask
        return EpisodeBatch(
            prompts=jax.numpy.asarray(self.prompts),
            prompt_lengths=jax.numpy.asarray(self.prompt_lengths),
            sample=SampleOutput(
                tokens=jax.numpy.asarray(self.tokens),
                mask=jax.numpy.asarray(mask),
                logp=jax.numpy.asarray(self.logp),
                sample_logp=jax.numpy.asarray(self.sample_logp),
                lengths=jax.numpy.asarray(mask.sum(-1).astype(np.int32)),
            ),
            action_mask=jax.numpy.asarray(self.action),
            rewards=jax.numpy.asarray(self.rewards),
            infos=tuple(self.infos),
        )


def _counts(episode) -> dict:
    """The episode's counts where it keeps them (envs.ToolEpisode does)."""
    names = ("turns", "tool_calls", "failed_calls")
    return {k: float(getattr(episode, k)) for k in names if hasattr(episode, k)}
