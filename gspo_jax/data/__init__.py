"""Data: a task's problems as fixed-shape prompt batches.

pipeline.py (grain pipelines from TFDS or converted files to batches), builders.py (the TFDS
builders of the generated tasks), files.py (released JSONL / parquet files converted once to
array_record), iterator.py (each process's training prompt stream).

    data.prepare(task, data_dir)                                   # once; cached
    it = data.make_train_iterator(task, batch_size=P, seed=0)      # {"prompt": [P, Lp], ...}
"""

from gspo_jax.data.pipeline import (
    collate,
    encode_record,
    load_source,
    make_eval_batches,
    make_train_iterator,
    prepare,
    record_dataset,
)

__all__ = [
    "collate",
    "encode_record",
    "load_source",
    "make_eval_batches",
    "make_train_iterator",
    "prepare",
    "record_dataset",
]
