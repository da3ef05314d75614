"""A task's released data files: which folder holds its splits, which files each split has, their
rows, and a content key over their bytes. Tasks that read files (gsm8k, math) check their folder
with find_folder when they are built and key caches with fingerprint; data/files.py converts the
rows into records.

Layouts, as released:

* ``<split>.jsonl``: one JSON object per line (GSM8K's and MATH-500's own releases);
* ``<split>-*.parquet`` (or ``<split>.parquet``): Hugging Face's parquet layout, either in the
  folder itself or one level down in a single config folder (``main/train-00000-of-00001.parquet``).
  A folder with several config folders (GSM8K's ``main`` and ``socratic``) is ambiguous: name the
  one you mean (``PATH/main``).

Errors are one line naming the file and the fix (DataFileError, a ValueError).

Dimension legend: none (rows are per problem).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any


class DataFileError(ValueError):
    """A dataset folder or file the task cannot read; the message names it and the fix."""


# Bump when the stored record format changes (the cache key covers it).
_FORMAT_VERSION = 2  # 2: MATH records keep the release's level


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
