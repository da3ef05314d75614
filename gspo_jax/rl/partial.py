"""Partial rollouts across steps (config.rl.partial_rollout = k > 0): the queue of groups the
continuous engine works on, and what a step hands to the next.

Dimension legend: P prompts trained per step, G samples per prompt, T = max_new_tokens,
k carried prompt batches, C = k·P carried groups, Q = P + C groups in a step's queue.

Why: with long-tailed response lengths a step that waits for its longest rows idles its decode
slots (the continuous engine refills them, but only from the step's own rows). With partial
rollouts the engine's queue holds more groups than the step trains on: the C groups carried from
the last step (their rows continued where they stopped) and P new ones. It stops as soon as P
groups are complete; the step trains on them, and the C others (rows mid-response, rows not yet
started, a group that completed in the same decode step as the P-th) are carried to the next
step. So no step waits for a row that started late, and a long row spans several steps: its
tokens come from several policy versions (the trainer's step when each was sampled), which the
batch records per token (SampleOutput.versions) and the metrics report as staleness.

The objective's ratio uses the sampler's log-probs as old_logp (the behaviour policy of each
token, whatever its version); with rl.recompute_old_logp the recomputed log-probs are the
proximal policy's and the sampler's go to the rollout corrections, as for any mismatch.

The first step has nothing carried: it draws k more prompt batches (their groups take the
carried places, fresh). The carried groups' prompt data and rows are host state, saved with the
data iterator's state in every checkpoint (PartialQueue.get_state), so a resumed run continues
the same rows and equals an uninterrupted one.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable

import numpy as np

from gspo_jax.rollout import PartialRows


def _concat(batches: list[dict]) -> dict:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def encode(arrays: dict[str, np.ndarray]) -> str:
    """Host arrays as one JSON-able string (npz, base64): how a data stream's wrapper keeps
    arrays in the state a checkpoint saves (here and rl/pipeline.py)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode(text: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def inner_state(inner) -> dict | str:
    """A wrapped data iterator's get_state() as JSON (grain's bytes go base64)."""
    state = inner.get_state()
    if isinstance(state, bytes | bytearray):
        state = {"__b64__": base64.b64encode(bytes(state)).decode("ascii")}
    return state


def restore_inner(inner, state) -> None:
    """inner_state's inverse: sets the wrapped iterator's state."""
    if isinstance(state, dict) and set(state) == {"__b64__"}:
        state = base64.b64decode(state["__b64__"])
    inner.set_state(state)


ROW_FIELDS = ("tokens", "mask", "logp", "sample_logp", "versions", "done")


class PartialQueue:
    """The prompt stream with the carried groups in front (module docstring).

    Iterating it yields the inner stream's batches; queue() assembles a step's queue from the
    carried groups and the step's new batch, keep() stores what the step carries. get_state /
    set_state (what checkpoint.Checkpointer saves for a data iterator) cover both.
    """

    def __init__(self, inner, *, carried_batches: int, group_size: int, max_new_tokens: int,
                 pad_id: int):  # fmt: skip
        self._inner = inner
        self.k, self.G, self.T, self.pad_id = carried_batches, group_size, max_new_tokens, pad_id
        self.batch: dict | None = None  # the carried groups' prompt data, [C, ...]
        self.rows: dict | None = None  # their PartialRows fields as numpy, [C·G, ...]

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._inner)

    def _empty_rows(self, groups: int) -> dict:
        n, T = groups * self.G, self.T
        return {
            "tokens": np.full((n, T), self.pad_id, np.int32),
            "mask": np.zeros((n, T), np.float32),
            "logp": np.zeros((n, T), np.float32),
            "sample_logp": np.zeros((n, T), np.float32),
            "versions": np.zeros((n, T), np.int32),
            "done": np.zeros((n,), bool),
        }

    def queue(self, batch: dict, more_batches: Callable[[], dict]) -> tuple[dict, PartialRows]:
        """(the queue's prompt data [Q, ...], its rows PartialRows [Q·G, T] as numpy): the
        carried groups first, then batch (the step's P new groups). With nothing carried (the
        first step), k more batches drawn with more_batches() take the carried places."""
        P = len(batch["prompt"])
        if self.batch is None:
            front = _concat([more_batches() for _ in range(self.k)])
            front_rows = self._empty_rows(self.k * P)
        else:
            front, front_rows = self.batch, self.rows
        rows = {f: np.concatenate([front_rows[f], self._empty_rows(P)[f]]) for f in ROW_FIELDS}
        return _concat([front, batch]), PartialRows(**rows)

    def keep(self, queue: dict, carried: np.ndarray, rows: PartialRows) -> None:
        """Stores the step's carry: the groups at queue indices carried [C] and their rows."""
        self.batch = {k: v[carried] for k, v in queue.items()}
        self.rows = {f: np.asarray(getattr(rows, f)) for f in ROW_FIELDS}

    def get_state(self) -> dict:
        inner = inner_state(self._inner)
        carry = None
        if self.batch is not None:
            carry = encode(
                {**{f"batch/{k}": v for k, v in self.batch.items()},
                 **{f"rows/{k}": v for k, v in self.rows.items()}}
            )  # fmt: skip
        return {"inner": inner, "partial_rollout": carry}

    def set_state(self, state: dict) -> None:
        restore_inner(self._inner, state["inner"])
        if state["partial_rollout"] is None:
            self.batch = self.rows = None
            return
        arrays = decode(state["partial_rollout"])
        self.batch = {k[6:]: v for k, v in arrays.items() if k.startswith("batch/")}
        self.rows = {k[5:]: v for k, v in arrays.items() if k.startswith("rows/")}


__all__ = ["PartialQueue"]
