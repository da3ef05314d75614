"""Datasets from the files a researcher holds (JSONL, Hugging Face parquet), read through grain.

    folder = data_files.find_folder(path, ("train", "test"))  # the folder holding the split files
    source = data_files.load_split(task, "train", data_dir)  # random access: source[i] -> dict

A task that reads files (``task.data_path`` set: gsm8k, math) names a folder holding its splits
as released:

* ``<split>.jsonl``: one JSON object per line (GSM8K's and MATH-500's own releases);
* ``<split>-*.parquet`` (or ``<split>.parquet``): Hugging Face's parquet layout, either in the
  folder itself or one level down in a single config folder (``main/train-00000-of-00001.parquet``).
  A folder with several config folders (GSM8K's ``main`` and ``socratic``) is ambiguous: name the
  one you mean (``PATH/main``).

Each split is converted once into one array_record file of JSON records in the cache
(``<data_dir>/files/<task>_<split>_<hash>/records.array_record``), with a progress bar, under the
entry's file lock (filelock.py: runs started together convert it once). The hash covers the split
files' bytes, the task and the record format, so an edited file gets a new entry and an unchanged
one is never converted again. Records are what ``task.record_from_example(row)`` makes of each row
(text fields as str); grain reads them by index (ArrayRecordDataSource), so shuffling, sharding
and resuming work as for every other dataset. No TensorFlow: parquet is read by pyarrow.

Errors are one line naming the file and the fix (DataFileError, a ValueError; main.py prints it as
``error: ...``): a missing folder or split, an unknown layout, a malformed line (file:line), a row
the task cannot read (file:line or file row N, and why).

Dimension legend: none (records are per problem).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import grain
from tqdm import tqdm

from gspo_jax import filelock


class DataFileError(ValueError):
    """A dataset folder or file the task cannot read; the message names it and the fix."""


RECORDS_FILE = "records.array_record"
COUNT_FILE = "count.json"  # written last: an entry with it is complete
# Bump when the stored record format changes (the cache key covers it).
_FORMAT_VERSION = 1


def _split_patterns(split: str) -> dict[str, list[str]]:
    return {"jsonl": [f"{split}.jsonl"], "parquet": [f"{split}.parquet", f"{split}-*.parquet"]}


def _split_files_in(folder: str, split: str) -> tuple[str, list[str]] | None:
    """("jsonl" | "parquet", sorted files) of ``split`` in ``folder`` (JSONL first), or None."""
    for kind, patterns in _split_patterns(split).items():
        files = sorted({f for p in patterns for f in glob.glob(os.path.join(folder, p))})
        if files:
            return kind, files
    return None


def _holds_splits(folder: str, splits: Sequence[str]) -> bool:
    return any(_split_files_in(folder, s) for s in splits)


def find_folder(path: str | os.PathLike, splits: Sequence[str]) -> str:
    """The folder of ``path`` (itself or its one config subfolder) that holds split files;
    DataFileError naming what was found and what is expected."""
    path = os.path.abspath(os.fspath(path))
    expected = (
        f"expected {splits[0]}.jsonl / {splits[-1]}.jsonl or Hugging Face parquet shards "
        f"({splits[0]}-*.parquet / {splits[-1]}-*.parquet) in it or in one config folder below it"
    )
    if not os.path.isdir(path):
        raise DataFileError(f"data_path={path!r} is not a folder; {expected}.")
    if _holds_splits(path, splits):
        return path
    subs = sorted(
        d
        for d in os.listdir(path)
        if os.path.isdir(os.path.join(path, d)) and _holds_splits(os.path.join(path, d), splits)
    )
    if len(subs) == 1:
        return os.path.join(path, subs[0])
    if len(subs) > 1:
        raise DataFileError(
            f"data_path={path!r} holds several dataset configurations ({', '.join(subs)}); "
            f"pass the one you mean, e.g. data_path={os.path.join(path, subs[0])!r}."
        )
    found = sorted(os.listdir(path))
    shown = ", ".join(found[:8]) + (", ..." if len(found) > 8 else "") or "nothing"
    raise DataFileError(
        f"unknown dataset layout in data_path={path!r} (found {shown}); {expected}."
    )


def present_splits(task) -> list[str]:
    """The splits of ``task.splits`` that ``task.data_path`` holds files for."""
    folder = find_folder(task.data_path, task.splits)
    return [s for s in task.splits if _split_files_in(folder, s)]


def split_files(folder: str, split: str) -> tuple[str, list[str]]:
    """("jsonl" | "parquet", files) of one split; DataFileError naming the folder if none."""
    found = _split_files_in(folder, split)
    if found is None:
        names = sorted(os.listdir(folder))
        raise DataFileError(
            f"no {split!r} split in {folder} (found {', '.join(names) or 'nothing'}): add "
            f"{split}.jsonl or {split}-*.parquet there, or read another split."
        )
    return found


def read_rows(kind: str, files: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for every row of the files in order; ``where`` is "file:line" (JSONL) or
    "file row N" (parquet, from 0). A line that is not a JSON object is a ValueError naming it."""
    for path in files:
        if kind == "jsonl":
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataFileError(f"{where}: malformed JSON line ({e.msg}).") from None
                    if not isinstance(row, dict):
                        raise DataFileError(f"{where}: expected a JSON object, got {row!r:.60}.")
                    yield where, row
        else:
            import pyarrow.parquet as pq

            try:
                batches = list(pq.ParquetFile(path).iter_batches(batch_size=1024))
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
                why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise DataFileError(f"{path}: not a readable parquet file ({why}).") from None
            n = 0
            for batch in batches:
                for row in batch.to_pylist():
                    yield f"{path} row {n}", row
                    n += 1


@functools.cache
def _file_sha(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's bytes (memoised by path, size and mtime: hashed once per process)."""
    del size, mtime_ns  # part of the memo key only
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_key(task_name: str, files: Sequence[str]) -> str:
    """The cache key of a split: the task, the record format and every file's bytes (in order)."""
    h = hashlib.sha256(f"{task_name}:{_FORMAT_VERSION}".encode())
    for f in files:
        st = os.stat(f)
        h.update(_file_sha(os.path.abspath(f), st.st_size, st.st_mtime_ns).encode())
    return h.hexdigest()[:16]


def fingerprint(task) -> str:
    """One key for every split file of a file-backed task (what a cache of anything trained on
    its data must be keyed by)."""
    folder = find_folder(task.data_path, task.splits)
    files = [f for s in task.splits if (sf := _split_files_in(folder, s)) for f in sf[1]]
    return content_key(task.name, files)


def _write_records(task, kind: str, files: Sequence[str], entry: str) -> int:
    """Converts the rows to records and writes them into ``entry`` (a new folder); returns the
    count. The records file is written under a temporary name and renamed into place."""
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(entry, exist_ok=True)
    tmp = os.path.join(entry, RECORDS_FILE + f".tmp-{os.getpid()}")
    writer = ArrayRecordWriter(tmp, "group_size:1")
    n = 0
    try:
        rows = tqdm(
            read_rows(kind, files), desc=f"converting {entry}", unit=" rows", file=sys.stderr
        )
        for where, row in rows:
            try:
                record = task.record_from_example(row)
            except (KeyError, TypeError, ValueError) as e:
                msg = f"no {e} field" if isinstance(e, KeyError) else str(e).rstrip(".")
                raise DataFileError(
                    f"{where}: {msg} (fields: {sorted(row)}); fix or remove that row."
                ) from None
            writer.write(json.dumps(record, ensure_ascii=False).encode("utf-8"))
            n += 1
    except BaseException:
        writer.close()
        os.remove(tmp)  # a half-written file is never read: the entry has no count.json yet
        raise
    writer.close()
    if n == 0:
        os.remove(tmp)
        raise DataFileError(f"{', '.join(files)}: no rows; the split is empty.")
    os.replace(tmp, os.path.join(entry, RECORDS_FILE))
    with open(os.path.join(entry, COUNT_FILE), "w") as f:
        json.dump({"records": n, "files": list(files)}, f)
    return n


class JsonRecords(Sequence):
    """Random-access records of one converted split: ``source[i]`` is the i-th record (a dict)."""

    def __init__(self, path: str):
        self.path = path
        self._source = grain.sources.ArrayRecordDataSource([path])

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, i):
        return json.loads(self._source[i])

    def __repr__(self) -> str:
        return f"JsonRecords({self.path!r}, {len(self)} records)"


def prepare_split(task, split: str, data_dir: str) -> str:
    """The array_record file of one split of ``task.data_path``, converting it if it is not in
    the cache (once, under the entry's lock)."""
    folder = find_folder(task.data_path, task.splits)
    kind, files = split_files(folder, split)
    entry = os.path.join(data_dir, "files", f"{task.name}_{split}_{content_key(task.name, files)}")
    done = os.path.join(entry, COUNT_FILE)
    if not os.path.exists(done):
        with filelock.locked(entry, f"the {split} split of {folder} at {entry}"):
            if not os.path.exists(done):  # the process we waited for may have converted it
                _write_records(task, kind, files, entry)
    return os.path.join(entry, RECORDS_FILE)


def load_split(task, split: str, data_dir: str) -> JsonRecords:
    """Random-access records of one split of ``task.data_path`` (converted on first use)."""
    return JsonRecords(prepare_split(task, split, data_dir))
