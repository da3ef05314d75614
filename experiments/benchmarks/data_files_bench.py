"""Benchmark: converting a GSM8K-sized dataset from its released files, against reading it back.

A train split of 7,473 rows and a test split of 1,319 (GSM8K's sizes; the rows are
tests/data/gsm8k_sample.jsonl's, repeated with numbered questions, since this machine is offline)
is written as OpenAI's JSONL and as Hugging Face's parquet layout (``main/``), then, for each
layout, from an empty cache: the one-time conversion to array_record (data/files.py), a second
load (the cache hit: hashing the files and opening the records), and 20 character-mode training
batches of 64 through grain. The ratio that matters is conversion over the batches a run reads
anyway: a conversion costing a few batches is paid once per content of the files.

    python experiments/benchmarks/data_files_bench.py [--out PATH]

Dimension legend: none (records are per problem).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
from machine import describe  # this folder is on sys.path: the script runs from it

from gspo_jax import data, tasks

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "gsm8k_sample.jsonl")
SIZES = {"train": 7473, "test": 1319}


def write_folders(root: str) -> dict[str, str]:
    with open(FIXTURE) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    n = SIZES["train"]
    big = [
        dict(r, question=f"{r['question']} ({i})")
        for i, r in enumerate(rows * (n // len(rows) + 1))
    ]
    folders = {"jsonl": os.path.join(root, "jsonl"), "parquet": os.path.join(root, "hf")}
    os.makedirs(folders["jsonl"])
    os.makedirs(os.path.join(folders["parquet"], "main"))
    for split, size in SIZES.items():
        with open(os.path.join(folders["jsonl"], f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in big[:size])
        path = os.path.join(folders["parquet"], "main", f"{split}-00000-of-00001.parquet")
        pq.write_table(pa.Table.from_pylist(big[:size]), path)
    return folders


def measure(folder: str, cache: str, batches: int = 20) -> dict[str, float]:
    task = tasks.get_task("gsm8k", data_path=folder)
    t = time.perf_counter()
    n = len(data.load_source(task, "train", cache))
    convert = time.perf_counter() - t
    t = time.perf_counter()
    data.load_source(task, "train", cache)
    cached = time.perf_counter() - t
    it = data.make_train_iterator(task, batch_size=64, seed=0, data_dir=cache)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    read = time.perf_counter() - t
    return dict(
        rows=n,
        convert_s=convert,
        cached_load_s=cached,
        batches_s=read,
        convert_over_batches=convert / read,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    results = {"machine": describe()}
    with tempfile.TemporaryDirectory() as root:
        folders = write_folders(root)
        for layout, folder in folders.items():
            cache = os.path.join(root, f"cache_{layout}")
            shutil.rmtree(cache, ignore_errors=True)
            r = measure(folder, cache)
            results[layout] = r
            print(
                f"{layout:8s} {r['rows']} rows: convert {r['convert_s']:.2f} s, cached load "
                f"{r['cached_load_s'] * 1e3:.1f} ms, 20 batches of 64 {r['batches_s']:.2f} s "
                f"(convert / batches {r['convert_over_batches']:.1f}x)",
                flush=True,
            )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
