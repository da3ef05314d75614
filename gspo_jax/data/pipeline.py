"""Grain pipelines from TFDS data sources (or converted files) to fixed-shape numpy batches.

    it = data.make_train_iterator(task, batch_size=P, seed=0, data_dir=D)   # infinite, resumable
    batch = next(it)  # {"prompt": [P, Lp] int32, "prompt_length": [P] int32, <record fields>}
    state = it.get_state()    # JSON-serialisable dict; it.set_state(state) resumes at that element
    for batch, num_valid in data.make_eval_batches(task, "test", batch_size=P, data_dir=D): ...

Generated tasks are written once by their TFDS builder (tasks/builders.py) as array_record files
under ``data_dir`` (with a progress bar) and read back through ``tfds.data_source``, a random-access
source that grain shuffles by index: the same path a real catalogue dataset (gsm8k) takes when it
has been prepared under ``data_dir``. A task reading released files (``task.data_path``: GSM8K's
JSONL, Hugging Face parquet) has them converted once to array_record under ``data_dir`` and read by
grain's ArrayRecordDataSource (data/files.py), with no TensorFlow. Runs started together share one
preparation: the first generates the files under a file lock, the others wait for it (see
``prepare``).

Pipeline order, and why: shard by process first (each host reads a disjoint slice of the records),
then shuffle (global, seeded; grain folds the epoch into the seed, so each epoch has its own order),
then repeat forever, then encode and batch with drop_remainder, so every batch has exactly the same
shapes (no recompilation) and the iterator state is a single element index (cheap to checkpoint,
exact to resume).

Dimension legend: P prompts per batch on this process, Lp = task.max_prompt_len (prompts are
right-padded with task.tokenizer.pad_id to this fixed length).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from gspo_jax import filelock
from gspo_jax.data import files as data_files
from gspo_jax.tasks.task import Task

DEFAULT_DATA_DIR = os.path.join(os.path.expanduser("~"), ".cache", "gspo_jax", "tfds")


def _data_dir(data_dir: str | os.PathLike | None) -> str:
    """``data_dir``, else $GSPO_JAX_DATA_DIR, else $GSPO_JAX_CACHE/tfds, else DEFAULT_DATA_DIR
    (one environment variable moves every cache of a run, docs/data.md "The cache")."""
    if data_dir is not None:
        return os.fspath(data_dir)
    if "GSPO_JAX_DATA_DIR" in os.environ:
        return os.environ["GSPO_JAX_DATA_DIR"]
    if "GSPO_JAX_CACHE" in os.environ:
        return os.path.join(os.environ["GSPO_JAX_CACHE"], "tfds")
    return DEFAULT_DATA_DIR


def prepare(task: Task, data_dir: str | os.PathLike | None = None):
    """Make ``task``'s dataset readable under ``data_dir`` and return what reads it.

    Generated tasks: generate it unless it is there already and return its prepared TFDS
    builder. Safe to call from many processes at once (parallel runs, the hosts of a pod sharing
    ``data_dir``): the first one generates the files under a lock next to them
    (``<version dir>.lock``, see filelock.py), the others wait for it and then read its
    files.
    Tasks reading files (``task.data_path``): convert every split the folder holds (data/files.py,
    the same lock) and return {split: array_record path}. Catalogue datasets: check that they are
    prepared, in array_record format, and return the builder.
    """
    data_dir = _data_dir(data_dir)
    if getattr(task, "data_path", ""):
        return {
            s: data_files.prepare_split(task, s, data_dir) for s in data_files.present_splits(task)
        }
    if task.catalogue_name:
        return _catalogue_builder(task, data_dir)
    from gspo_jax.data import builders  # imports tensorflow_datasets (seconds): only when needed

    builder = builders.get_builder(task, data_dir)
    if builder.is_prepared():
        return builder
    entry = os.fspath(builder.data_dir)
    with filelock.locked(entry, f"the {task.name} dataset at {entry}"):
        # The process this one waited for may have prepared it; a new builder reads its info.
        builder = builders.get_builder(task, data_dir)
        if not builder.is_prepared():
            builders.build(builder)
    return builder


def _catalogue_builder(task: Task, data_dir: str):
    """The prepared TFDS catalogue builder of ``task`` under ``data_dir``, in array_record format.

    The builder's module is imported first (``task.catalogue_module``): TFDS registers a
    catalogue dataset only when its module is imported, so ``tfds.builder(name)`` alone does not
    find it.
    """
    import importlib

    import tensorflow_datasets as tfds

    if task.catalogue_module:
        importlib.import_module(task.catalogue_module)
    how = (
        f"Point the task at the released files instead (data_path=<folder with "
        f"train.jsonl/test.jsonl or *.parquet>, docs/data.md), or prepare it once on a machine "
        f"with network access: tfds.builder('{task.catalogue_name}', data_dir={data_dir!r}, "
        f"file_format='array_record').download_and_prepare() after importing "
        f"{task.catalogue_module or 'its module'} (`tfds build {task.catalogue_name} "
        f"--file_format=array_record` needs TensorFlow), then copy that directory here."
    )
    try:
        builder = tfds.builder(task.catalogue_name, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001 - TFDS raises many types for a missing dataset
        raise FileNotFoundError(
            f"TFDS dataset {task.catalogue_name!r} could not be opened under {data_dir}: {e}. "
            + how
        ) from e
    if not builder.is_prepared():
        raise FileNotFoundError(
            f"TFDS dataset {task.catalogue_name!r} is not present under data_dir={data_dir} "
            "(this codebase never downloads). " + how
        )
    fmt = getattr(builder.info, "file_format", None)
    fmt = getattr(fmt, "value", fmt)  # a tfds FileFormat enum ("array_record"), or a str
    if fmt != "array_record":
        raise ValueError(
            f"{task.catalogue_name!r} under {data_dir} is stored as {fmt or 'unknown format'}; "
            "grain needs random access: rebuild it with file_format='array_record'. " + how
        )
    return builder


def load_source(task: Task, split: str, data_dir: str | os.PathLike | None = None):
    """Random-access data source of one split: records as dicts (numpy values from TFDS, str from
    files)."""
    data_dir = _data_dir(data_dir)
    if getattr(task, "data_path", ""):
        if split not in task.splits:
            raise ValueError(f"split {split!r} not in {task.name}; available: {list(task.splits)}.")
        return data_files.load_split(task, split, data_dir)
    if task.catalogue_name:
        builder = _catalogue_builder(task, data_dir)
    else:
        builder = prepare(task, data_dir)
    if split not in builder.info.splits:
        raise ValueError(
            f"split {split!r} not in {task.name}; available: {sorted(builder.info.splits)}."
        )
    source = builder.as_data_source(split=split)
    if len(source) == 0:
        raise ValueError(
            f"the {split!r} split of {task.name} under {data_dir} is empty; "
            "regenerate it with num_train/num_test >= 1."
        )
    return source


def encode_record(task: Task, record: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """One record -> prompt [Lp] int32 (right-padded), prompt_length int32, and the record fields
    the verifier and demonstrations need (text as str)."""
    ids = task.prompt_ids(record)
    prompt = np.full((task.max_prompt_len,), task.tokenizer.pad_id, np.int32)  # [Lp]
    prompt[: len(ids)] = ids
    out = {"prompt": prompt, "prompt_length": np.int32(len(ids))}
    for k in task.record_fields:
        v = record[k]
        out[k] = np.str_(v.decode("utf-8", "replace")) if isinstance(v, bytes) else np.asarray(v)
    return out


def collate(records: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in records]) for k in records[0]}


def record_dataset(
    task: Task,
    split: str,
    *,
    seed: int,
    data_dir: str | os.PathLike | None = None,
    process_index: int = 0,
    process_count: int = 1,
    shuffle: bool = True,
    repeat: bool = True,
) -> grain.MapDataset:
    """Raw records of one split: this process's shard, shuffled by seed, repeated forever."""
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"need 0 <= process_index < process_count, got {process_index}, "
            f"{process_count}; pass jax.process_index(), jax.process_count()."
        )
    ds = grain.MapDataset.source(load_source(task, split, data_dir))
    if process_count > 1:
        if len(ds) < process_count:
            raise ValueError(
                f"{len(ds)} records cannot be sharded over {process_count} "
                "processes; generate a larger split."
            )
        ds = ds[process_index::process_count]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if repeat:
        ds = ds.repeat(None)
    return ds


def make_train_iterator(
    task: Task,
    batch_size: int,
    seed: int,
    data_dir: str | os.PathLike | None = None,
    process_index: int = 0,
    process_count: int = 1,
    split: str = "train",
) -> grain.DatasetIterator:
    """Infinite iterator of training batches for this process.

    ``batch_size`` is the number of prompts per batch *on this process* (P); a multi-host run
    passes global_batch // process_count and every process reads its own disjoint shard of the
    records. Batches: prompt [P, Lp] int32, prompt_length [P] int32 and ``task.record_fields``
    ([P] or [P, ...]). The iterator's get_state() / set_state() resume exactly at the next batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1 (prompts per process).")
    if task.data_path:  # convert (and check) every split now, not the eval split mid-run
        prepare(task, data_dir)
    ds = record_dataset(
        task,
        split,
        seed=seed,
        data_dir=data_dir,
        process_index=process_index,
        process_count=process_count,
    )
    ds = ds.map(lambda r: encode_record(task, r))
    ds = ds.batch(batch_size, drop_remainder=True, batch_fn=collate)
    # Records are small and already on local disk: reading in the calling thread is fastest on a
    # few shared cores and keeps the iterator state trivially exact.
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


def make_eval_batches(
    task: Task,
    split: str = "test",
    *,
    batch_size: int,
    num_problems: int | None = None,
    data_dir: str | os.PathLike | None = None,
    first: int = 0,
) -> list[tuple[dict[str, np.ndarray], int]]:
    """``num_problems`` records of ``split`` in order from record ``first`` (a negative ``first``
    counts from the end: the last -first records, all of them when the split holds fewer, as a
    stopping rule's "last stop_problems" on a small split), as (batch, num_valid) pairs.

    Every batch has exactly ``batch_size`` rows (fixed shapes: one compilation); the last one is
    padded by repeating its last record, and num_valid says how many rows are real.
    """
    source = load_source(task, split, data_dir)
    start0 = max(len(source) + first, 0) if first < 0 else first
    left = max(len(source) - start0, 0)
    n = left if num_problems is None else min(num_problems, left)
    if n < 1:
        raise ValueError(
            f"num_problems={num_problems} from record first={first} selects no problem of the "
            f"{len(source)} in {split!r}; pass num_problems >= 1 and a first inside the split."
        )
    batches = []
    for start in range(start0, start0 + n, batch_size):
        idx = list(range(start, min(start + batch_size, start0 + n)))
        records = [encode_record(task, source[i]) for i in idx]
        records += [records[-1]] * (batch_size - len(records))
        batches.append((collate(records), len(idx)))
    return batches
