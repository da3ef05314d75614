"""A finished run kept as one committed file, so the claims' runs outlive the machine that made
them.

A run's workdir (config.json, metrics.jsonl, summary.json, checkpoints) lives under runs/, which
git ignores: a new machine starts without it, and a claim whose runs took several machines would
start again from none. experiments/claims.py therefore writes every finished run of a claim sweep
as a record,

    results/claims/<sweep>/<run>.json.gz      {"format", "name", "config", "summary", "metrics",
                                               "started_at", "entries"}

(metrics: metrics.jsonl's text, line for line; no checkpoints; started_at: when the run first
started, so that anyone can check it started after the registry entry it decides:
experiments/checks/registration_order.py; entries: {"<key> v<version>": the entry's hash} of the
registry entries its sweep was launched for, gspo_jax.claims.entry_hash, kept from the record's
first writing on, so that analysis.load_runs refuses it once its entry has been edited. Records
made before the hashes were kept have no "entries": "pre-hash", accepted, and covered by
registration_order, which compares each entry's hash at its registering commit with every later
version from git history), skips a run whose record exists, and executes the
notebooks on the records; analysis.load_runs reads a folder of records as it reads a folder of
workdirs. A record is a few tens of kB, written with fixed gzip metadata so the
same run gives the same bytes (git sees no change when it is written again).

    records.write("runs/claims/quant/gspo_int8_none_s0", "results/claims/quant")   # -> path
    records.read("results/claims/quant/gspo_int8_none_s0.json.gz")                 # -> dict
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from typing import Any

FORMAT = 1
SUFFIX = ".json.gz"


def path_of(records_dir: str, name: str) -> str:
    return os.path.join(records_dir, name + SUFFIX)


def finished(workdir: str) -> bool:
    """A run has finished when its summary.json exists (runtime/train.py writes it last)."""
    return os.path.exists(os.path.join(workdir, "summary.json"))


def started_at(workdir: str) -> int | None:
    """When the run at ``workdir`` first started (Unix seconds, UTC), or None where it cannot tell.

    The trainer opens its TensorBoard writer as a run starts (and again at each resume), and the
    writer names its file events.out.tfevents.<Unix seconds>.<host>: the oldest such file is the
    first start. A run made with log.tensorboard=False has none."""
    times = []
    for path in glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*")):
        stamp = os.path.basename(path).split(".")[3]
        if stamp.isdigit():
            times.append(int(stamp))
    return min(times) if times else None


def write(workdir: str, records_dir: str, entries: dict[str, str] | None = None) -> str:
    """The record of the finished run at ``workdir`` written to ``records_dir``; returns its path.
    ``entries``: {entry name: hash} of the registry entries the run was made for; a record that
    exists keeps the entries it was first written with (the run was made for those).

    Raises FileNotFoundError, naming the run, when the run has not finished (no summary.json)."""
    name = os.path.basename(os.path.normpath(workdir))
    if not finished(workdir):
        raise FileNotFoundError(
            f"run {workdir} has not finished (no summary.json): rerun the command that made it "
            "before recording it"
        )
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        metrics = f.read()
    path = path_of(records_dir, name)
    if os.path.exists(path):
        entries = read(path).get("entries", entries)
    record = {
        "format": FORMAT,
        "name": name,
        "config": config,
        "summary": summary,
        "metrics": metrics,
        "started_at": started_at(workdir),
    }
    if entries:
        record["entries"] = dict(entries)
    data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    os.makedirs(records_dir, exist_ok=True)
    tmp = path + ".tmp"
    # mtime=0 and no file name in the header: the same run gives the same bytes
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(data)
    os.replace(tmp, path)  # a reader never sees half a record
    return path


def read(path: str) -> dict[str, Any]:
    """A record written by ``write``; ValueError naming the file when its format is unknown."""
    with gzip.open(path, "rt") as f:
        record = json.load(f)
    if record.get("format") != FORMAT:
        raise ValueError(
            f"{path}: record format {record.get('format')!r}, this reader knows {FORMAT}; "
            "update notebooks/reporting/records.py or rewrite the record from its run"
        )
    return record


def record_all(
    runs_root: str, records_dir: str, entries: dict[str, str] | None = None
) -> list[str]:
    """Records every finished run under ``runs_root`` (a sweep's folder: <run>/summary.json,
    population members through their links) into ``records_dir``; returns the new or rewritten
    records' paths (an unchanged record is left as it is); ``entries`` as for write."""
    written = []
    for wd in sorted(glob.glob(os.path.join(runs_root, "*"))):
        if not (os.path.isdir(wd) and finished(wd)):
            continue  # not a run (a table, a population's own folder) or not finished yet
        if not os.path.exists(os.path.join(wd, "config.json")):
            continue
        path = path_of(records_dir, os.path.basename(wd))
        before = open(path, "rb").read() if os.path.exists(path) else None
        write(wd, records_dir, entries)
        with open(path, "rb") as f:
            if f.read() != before:
                written.append(path)
    return written
