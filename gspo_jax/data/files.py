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
entry's file lock (filelock.py: runs started together convert it once). The hash covers the
split
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

import json
import os
import sys
from collections.abc import Sequence

import grain
from tqdm import tqdm

from gspo_jax import filelock
from gspo_jax.tasks.released import (  # noqa: F401 (part of this module's API)
    DataFileError,
    content_key,
    find_folder,
    fingerprint,
    present_splits,
    read_rows,
    split_files,
)

RECORDS_FILE = "records.array_record"
COUNT_FILE = "count.json"  # written last: an entry with it is complete


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
