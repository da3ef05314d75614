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

What can go wrong, and what this module does about it (each reported in one line):

- A save fails in the background (disk full, permissions): ``check_background()``, called after
  every step, raises CheckpointSaveError naming the step, the cause and the checkpoint that is kept;
  orbax's own logging of the background traceback is muted (the error is reported once, here).
- A checkpoint cannot be read (a truncated array file, a missing item, an empty step folder):
  ``restore_latest`` reports it, moves the step folder aside to ``<step>.unreadable-<time>`` (never
  deleted: it may still be salvageable) and falls back to the next newest; with none readable it
  raises CheckpointError naming the folder and the two ways on.
- A file where the checkpoint folder should be: CheckpointError before anything is written.

On a pod run (several processes) each of these may happen on one host only: each process reads
its own shards and writes its own files. So every process tries alone and then the processes agree
(pod.gather, bounded by config.multihost.timeout_s) before anyone acts: a restore is read without
orbax's cross-process barriers (nobody waits inside orbax for a peer whose read failed), a step
unreadable on any host is unreadable on all, and a save that failed on any host fails on all,
at once, without waiting for the other hosts' part of it (it can never commit).

No array dimensions here; the state is whatever pytree the trainer passes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from gspo_jax.errors import CheckpointError
from gspo_jax.errors import one_line as _one_line
from gspo_jax.runtime import agreement as pod


def unstacked_layers_error(saved_tree: Any, where: str) -> str | None:
    """The one-line error for a saved tree (an orbax checkpoint's metadata) that holds the
    decoder layers one by one (layers/0/..., layers/1/...), as every checkpoint written before
    the layers were stacked for the scan does; None for any other tree."""

    def unstacked(node) -> bool:
        if isinstance(node, dict):
            layers = node.get("layers")
            if isinstance(layers, dict) and any(str(k).isdigit() for k in layers):
                return True
            return any(unstacked(v) for v in node.values())
        if isinstance(node, (list, tuple)):
            return any(unstacked(v) for v in node)
        return False

    if not unstacked(saved_tree):
        return None
    return (
        f"the checkpoint in {where} holds the decoder layers one by one (layers/0/...), the "
        "layout before they were stacked on a leading axis ([L, ...]) for the scan; this "
        "version cannot resume it. Resume it with the commit that wrote it, or export it with "
        "that commit (experiments/export_hf.py) and start a run from the exported folder "
        "(config.init.kind='hf', config.init.checkpoint=<folder>), or rerun with --start_fresh"
    )


class CheckpointSaveError(CheckpointError):
    """A save failed (in the background or at the call); earlier checkpoints are kept."""


ITEMS = ("state", "data_iter", "meta")


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

    def _restore_filename(self, directory: epath.Path, any_process_count: bool) -> epath.Path:
        """This process's file; with ``any_process_count`` (every process saved the same state),
        the first process's file of a run with another process count will do."""
        own = self._filename(directory)
        if own.exists() or not any_process_count:
            return own
        others = sorted(directory.glob("process_0-of-*.json"))
        return others[0] if others else own

    def save(self, directory: epath.Path, args: DataIteratorSave) -> None:
        self._filename(epath.Path(directory)).write_text(_iterator_state_to_json(args.state))

    def restore(self, directory: epath.Path, args: DataIteratorRestore | None = None) -> Any:
        directory = epath.Path(directory)
        any_count = bool(args is not None and args.any_process_count)
        filename = self._restore_filename(directory, any_count)
        if not filename.exists():
            others = sorted(p.name for p in directory.glob("process_*-of-*.json"))
            if others and not any(p.endswith(f"-of-{jax.process_count()}.json") for p in others):
                raise ValueError(
                    f"{filename} is missing: the checkpoint was written by a run with another "
                    f"process count ({others[0]}); resume with that number of processes, or use "
                    "config.data.process_sharding='slice' (the same stream on every process)"
                )
            raise FileNotFoundError(f"missing file {filename}")
        try:
            state = _iterator_state_from_json(filename.read_text())
        except ValueError as e:
            raise ValueError(f"{filename} is not an iterator state ({e})") from e
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
    any_process_count: bool = False  # every process saved the same state (process_sharding=slice)


class _MuteOrbaxBackgroundErrors(logging.Filter):
    """Drops orbax's ERROR records of a failed background save (their tracebacks): the failure is
    reported once, in one line, by Checkpointer.check_background (a disk-full save otherwise
    prints ~100 tracebacks). Every other orbax error (say, failing to delete an old step) passes."""

    SAVE_FAILURES = ("raised an exception", "background save thread", "Save Finalize thread")

    def filter(self, record: logging.LogRecord) -> bool:
        from_orbax = "orbax" in (record.pathname or "")
        if not (from_orbax and record.levelno >= logging.ERROR and record.exc_info):
            return True
        return not any(m in record.getMessage() for m in self.SAVE_FAILURES)


_MUTE = _MuteOrbaxBackgroundErrors()


def _is_timeout(one_line: str) -> bool:
    """A wait for another process that ran out (orbax's barriers): a symptom, not a cause."""
    return any(m in one_line for m in ("DEADLINE_EXCEEDED", "TimeoutError", "Barrier timed out"))


def _file_in(e: BaseException, root: str) -> str | None:
    """The most specific path under ``root`` named anywhere in the exception chain, if any."""
    seen, found = set(), []
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        found += re.findall(re.escape(root) + r"[^\s'\"\],)]*", str(e))
        e = e.__cause__ or e.__context__
    return max(found, key=len) if found else None


class Checkpointer:
    """An orbax CheckpointManager over <workdir>/checkpoints with the three items above.

    Args:
      directory: where step directories go (created if missing).
      save_every: save when step % save_every == 0 (and always when ``force=True``).
      max_to_keep: how many recent checkpoints to keep.
      async_save: write in a background thread (orbax's async checkpointing).
      timeout_s: how long orbax's background save waits for the other processes (pod runs).
    """

    def __init__(
        self,
        directory: str,
        *,
        save_every: int,
        max_to_keep: int = 2,
        async_save: bool = True,
        timeout_s: float = pod.DEFAULT_TIMEOUT_S,
    ):
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        self.directory = os.path.abspath(directory)
        check_directory(self.directory)
        self.save_every = save_every
        self._pending: int | None = None  # the step of a save that may still be in flight
        logging.getLogger("absl").addFilter(_MUTE)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,  # the trainer decides when; see should_save()
            create=True,
            enable_async_checkpointing=async_save,
            async_options=ocp.AsyncOptions(timeout_secs=max(1, int(timeout_s))),
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

    def describe(self) -> str:
        """Where the newest checkpoint is, in words (for messages saying what is kept)."""
        steps = self.all_steps()
        if not steps:
            return f"no checkpoint has been written yet in {self.directory}"
        return f"the newest checkpoint is step {max(steps)} in {self.directory}"

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
        self.check_background(wait=True)  # orbax would wait for it anyway, and blame this step
        meta = dict(meta or {}, step=int(step))
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data_iter=DataIteratorSave(data_iterator.get_state()),
            meta=ocp.args.JsonSave(meta),
        )
        try:
            started = bool(self._manager.save(step, args=args, force=True))
        except Exception as e:  # noqa: BLE001 (any failure of the writer: report it in one line)
            raise self._save_error(step, e) from e
        if started:
            self._pending = step
        return started

    def _save_error(self, step: int, e: BaseException) -> CheckpointSaveError:
        kept = [s for s in self.all_steps() if s != step]
        keep = (
            f"the previous checkpoint, step {max(kept)}, is kept"
            if kept
            else "no earlier checkpoint exists"
        )
        return CheckpointSaveError(
            f"saving the checkpoint of step {step} in {self.directory} failed ({_one_line(e)}); "
            f"{keep}. Fix the cause (free disk space, permissions) and rerun the same command to "
            "resume"
        )

    def check_background(self, wait: bool = False) -> None:
        """Raises CheckpointSaveError if the last asynchronous save has failed (a no-op while it is
        still being written, unless ``wait``, and after it committed). Cheap: call it after every
        step. On a multi-host run every process calls it at the same steps and they agree (one
        pod.gather): a save that failed on any process fails on all of them, at the same step,
        without waiting for this process's part (orbax would wait for the failed host)."""
        multi = jax.process_count() > 1
        if self._pending is None and not multi:
            return
        error, done = None, True
        if self._pending is not None:
            done = wait or not self._manager.is_saving_in_progress()
            if done:
                error = self._finish()
        if multi:
            mine = json.dumps([_one_line(error) if error is not None else "", done])
            states = [json.loads(v) for v in pod.gather("the checkpoint save check", mine)]
            failed = [(p, why) for p, (why, _) in enumerate(states) if why]
            # A process that waited for a failed peer reports a timeout: name the peer's cause.
            causes = [(p, why) for p, why in failed if not _is_timeout(why)] or failed
            peer, why = causes[0] if causes else (None, "")
            own = error is not None and (
                peer in (None, jax.process_index()) or not _is_timeout(_one_line(error))
            )
            if failed and not own and self._pending is not None:
                error = RuntimeError(f"it failed on process {peer}: {why}")
            if failed:
                done = True
            elif not all(d for _, d in states):
                return
        if not done or self._pending is None:
            return
        step, self._pending = self._pending, None
        if error is not None:
            raise self._save_error(step, error) from error

    def _finish(self) -> BaseException | None:
        """Waits for the save in flight; its exception (the cause, not a barrier timeout that
        orbax raised on top of it), if it failed."""
        try:
            self._manager.wait_until_finished()
            self._manager.check_for_errors()
            if self._pending not in self._manager.all_steps():
                raise RuntimeError("the step folder was not committed")
        except Exception as e:  # noqa: BLE001 (reported by the caller, in one line)
            chain, seen = [], set()
            while e is not None and id(e) not in seen:
                seen.add(id(e))
                chain.append(e)
                e = e.__cause__ or e.__context__
            return next((c for c in chain if not _is_timeout(_one_line(c))), chain[0])
        return None

    def restore(
        self, step: int, abstract_state: Any, data_iterator: Any, *, any_process_count: bool = False
    ) -> tuple[Any, dict]:
        """Restores the state into ``abstract_state``'s shapes/shardings; repositions the iterator.

        ``any_process_count``: the iterator state is the same on every process (the trainer's
        process_sharding="slice"), so a run may resume on another number of processes.
        Returns (state, meta).
        """
        self._check_items(step)
        self._check_layout(step)
        # The items' handlers, not the manager: the manager's restore ends in a barrier across
        # processes, where a process whose read succeeded would wait for one whose read failed.
        handler = ocp.CompositeCheckpointHandler(
            state=ocp.StandardCheckpointHandler(),
            data_iter=DataIteratorHandler(),
            meta=ocp.JsonCheckpointHandler(),
        )
        restored = handler.restore(
            epath.Path(self._step_dir(step)),
            ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data_iter=DataIteratorRestore(data_iterator, any_process_count),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return restored["state"], dict(restored["meta"])

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _check_items(self, step: int) -> None:
        """A step folder without one of ITEMS is unreadable; say which (orbax says KeyError)."""
        step_dir = self._step_dir(step)
        missing = [i for i in ITEMS if not os.path.isdir(os.path.join(step_dir, i))]
        if missing:
            what = "the step folder is empty" if len(missing) == len(ITEMS) else "missing"
            raise FileNotFoundError(
                f"{what}: no {', '.join(m + '/' for m in missing)} in {step_dir}"
            )

    def read_meta(self, step: int) -> dict:
        """The small meta dict of a checkpoint (step, wall time, config), without the arrays (read
        by this process alone: no cross-process barrier)."""
        meta_dir = epath.Path(self._step_dir(step)) / "meta"
        return dict(ocp.JsonCheckpointHandler().restore(meta_dir, ocp.args.JsonRestore()))

    def restore_latest(
        self,
        abstract_state: Any,
        data_iterator: Any,
        *,
        report: Callable[[str], None] = print,
        any_process_count: bool = False,
    ) -> tuple[int, Any, dict] | None:
        """Restores the newest readable checkpoint: (step, state, meta), or None if there is none.

        Steps are tried newest first. Only once an older step restores are the newer ones that
        failed taken as unreadable: each is reported in one line (which step, which file, why) and
        moved aside to ``<step>.unreadable-<time>``. The same target restored the older step, so
        their failure is the files', not a changed config, process count or memory. If no step
        restores, nothing is moved and CheckpointError gives every step's reason. On a multi-host
        run the processes agree on each attempt (one pod.gather), so all of them fall back alike.
        """
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            return None
        self._check_layout(steps[0])
        failed = []  # (step, one-line reason)
        for step in steps:
            error = None
            try:
                state, meta = self.restore(
                    step, abstract_state, data_iterator, any_process_count=any_process_count
                )
            except Exception as e:  # noqa: BLE001 (judged below, against the older steps)
                error = e
            where = self._step_dir(step)
            if error is not None:
                where = _file_in(error, where) or where
            mine = f"{where}: {_one_line(error)}" if error is not None else ""
            statuses = pod.gather(f"restoring checkpoint step {step}", mine)
            if any(statuses):
                peer = next(p for p, why in enumerate(statuses) if why)
                own = error is not None
                failed.append((step, mine if own else f"on process {peer}, {statuses[peer]}"))
                continue
            for bad, reason in failed:
                report(
                    f"checkpoint step {bad} is unreadable ({reason}); moved aside; falling back "
                    f"to step {step}"
                )
                self._move_aside(bad)
            if failed:
                self._manager.reload()
            return step, state, meta
        reasons = "; ".join(f"step {st}: {why}" for st, why in failed)
        raise CheckpointError(
            f"no checkpoint in {self.directory} could be restored ({reasons}). If the config "
            "changed, rerun with the config the checkpoints were written with; otherwise move "
            "the folder away to keep it, or rerun with --start_fresh to start from step 0 (the "
            "folder is moved aside, not deleted)"
        )

    def _check_layout(self, step: int) -> None:
        """CheckpointError (one line, what to do) for a checkpoint of the model's older layout,
        before any step is tried (so none is taken as unreadable and moved aside)."""
        try:
            saved = self._manager.item_metadata(step)["state"]
        except Exception:  # noqa: BLE001 (an unreadable step is judged by the restore loop)
            return
        why = unstacked_layers_error(getattr(saved, "tree", saved), self._step_dir(step))
        if why:
            raise CheckpointError(why)

    def _move_aside(self, step: int) -> None:
        if jax.process_index() == 0:
            src = self._step_dir(step)
            os.replace(src, f"{src}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        pod.barrier(f"moving checkpoint step {step} aside")

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
        """Waits for any save in flight (raising CheckpointSaveError if it failed) and closes."""
        try:
            self.check_background(wait=True)
        finally:
            self._manager.close()


def check_directory(directory: str) -> None:
    """CheckpointError if ``directory`` exists but is not a folder (checked before any work)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(
            f"{directory} is a file, not a checkpoint folder: move it away (or pass another "
            "--workdir) and rerun"
        )


def move_aside(directory: str) -> str | None:
    """Renames a checkpoint folder to ``<dir>.moved-<time>`` (``--start_fresh``); returns the new
    name, or None if there was nothing to move. Process 0 moves; every process waits for it."""
    new = None
    if os.path.exists(directory):
        new = f"{directory}.moved-{time.strftime('%Y%m%d-%H%M%S')}"
        if jax.process_index() == 0:
            os.replace(directory, new)
    pod.barrier("moving the checkpoint folder aside")
    return new
