"""Orbax checkpoints of the full training state, including the data iterator.

One checkpoint step directory holds three items (an ``ocp.args.Composite``):

    state      the train state pytree: params, optimizer state, step, RNG key data (StandardSave;
               arrays are written shard by shard by every process that holds them)
    data_iter  the grain iterator state as JSON, one file per process
               (``process_<i>-of-<n>.json``): with per-process data sharding each process reads a
               different slice, so every process must save and restore its own position
    meta       a small JSON dict (step, wall time, the config hash) for humans and for checks

Restoring takes an abstract state (``jax.ShapeDtypeStruct`` leaves carrying shardings), so restored
arrays land directly in their final sharding on the current mesh: a run may resume on a different
device count than it was saved from.

A save is asynchronous (training continues while it is written) and is committed atomically by
orbax; ``wait()`` blocks until it is on disk, which the trainer does before raising on a non-finite
loss, so that "the last good checkpoint is safe" holds.

No array dimensions here; the state is whatever pytree the trainer passes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath


def _iterator_state_to_json(state: Any) -> str:
    if isinstance(state, bytes | bytearray):
        return json.dumps({"__bytes__": bytes(state).decode()})
    return json.dumps(state, indent=1)


def _iterator_state_from_json(text: str) -> Any:
    state = json.loads(text)
    if isinstance(state, dict) and set(state) == {"__bytes__"}:
        return state["__bytes__"].encode()
    return state


class DataIteratorHandler(ocp.CheckpointHandler):
    """Saves ``iterator.get_state()`` as JSON, one file per process.

    grain ships a similar handler, but it only accepts grain's own iterator classes; this one takes
    any object with get_state()/set_state() returning JSON-able values or bytes (grain's
    DatasetIterator returns a dict, DataLoaderIterator returns bytes), so a data module may wrap its
    grain iterator (e.g. to convert batches) and still be checkpointed.
    """

    def _filename(self, directory: epath.Path) -> epath.Path:
        return directory / f"process_{jax.process_index()}-of-{jax.process_count()}.json"

    def save(self, directory: epath.Path, args: DataIteratorSave) -> None:
        self._filename(epath.Path(directory)).write_text(_iterator_state_to_json(args.state))

    def restore(self, directory: epath.Path, args: DataIteratorRestore | None = None) -> Any:
        filename = self._filename(epath.Path(directory))
        if not filename.exists():
            raise ValueError(
                f"no data-iterator state {filename}: the checkpoint was written by a run with a "
                "different process count; resume with the same number of processes"
            )
        state = _iterator_state_from_json(filename.read_text())
        if args is not None and args.iterator is not None:
            args.iterator.set_state(state)
        return state

    def metadata(self, directory: epath.Path) -> None:
        return None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    state: Any  # the value of iterator.get_state(), taken synchronously at save time


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    iterator: Any = None  # set_state() is called on it when given


class Checkpointer:
    """An orbax CheckpointManager over <workdir>/checkpoints with the three items above.

    Args:
      directory: where step directories go (created if missing).
      save_every: save when step % save_every == 0 (and always when ``force=True``).
      max_to_keep: how many recent checkpoints to keep.
      async_save: write in a background thread (orbax's async checkpointing).
    """

    def __init__(
        self, directory: str, *, save_every: int, max_to_keep: int = 2, async_save: bool = True
    ):
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        self.directory = os.path.abspath(directory)
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,  # the trainer decides when; see should_save()
            create=True,
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "data_iter": DataIteratorHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def should_save(self, step: int) -> bool:
        return step % self.save_every == 0

    def save(
        self, step: int, state: Any, data_iterator: Any, meta: dict | None = None, *, force=False
    ) -> bool:
        """Saves at ``step`` when due (or forced); returns whether a save was started.

        The data iterator's state is read now, synchronously: it must describe the position right
        after the batches consumed by steps <= ``step``.
        """
        if not (force or self.should_save(step)):
            return False
        if step in self._manager.all_steps():
            return False  # already saved (e.g. the periodic save coincided with the final one)
        meta = dict(meta or {}, step=int(step))
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data_iter=DataIteratorSave(data_iterator.get_state()),
            meta=ocp.args.JsonSave(meta),
        )
        return bool(self._manager.save(step, args=args, force=True))

    def restore(self, step: int, abstract_state: Any, data_iterator: Any) -> tuple[Any, dict]:
        """Restores the state into ``abstract_state``'s shapes/shardings and repositions the iterator.

        Returns (state, meta).
        """
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data_iter=DataIteratorRestore(data_iterator),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return restored["state"], dict(restored["meta"])

    def restore_arrays(self, step: int) -> Any:
        """The saved train-state pytree as host numpy arrays, without a target (for comparisons
        and notebooks; containers come back as dicts/lists)."""
        meta = self._manager.item_metadata(step)["state"]
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        # An explicit single-device target: the saved shardings may name devices of another
        # topology (e.g. a multi-process run), which orbax cannot restore onto by itself.
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
            meta,
            is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"),
        )
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
        )
        return jax.tree.map(np.asarray, restored["state"])

    def wait(self) -> None:
        """Blocks until any asynchronous save is committed to disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
