"""TFDS dataset builders for the generated tasks (array_record files, train and test splits).

Why TFDS for generated data: the generated tasks take exactly the path a real catalogue dataset
takes (builder -> array_record files on disk -> ``tfds.data_source`` random access -> grain), so
the pipeline, its sharding and its checkpointable state are exercised by every run, and generation
is cached: a builder whose files exist is not generated again. TFDS shows a progress bar while it
writes. The builder config name encodes every task knob (and a hash of them), so two tasks with
different knobs never share files.

These classes must live in an importable module (TFDS pickles builders by module path), which is why
they are here and not next to the code that calls them.

Dimension legend: none (records are per problem).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
from typing import Any

import tensorflow_datasets as tfds

from gspo_jax.tasks.task import Task


class _QuietCustomConfig(logging.Filter):
    """Drops TFDS's per-call warnings about custom builder configs (every task config is one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not ("Using custom data configuration" in msg or "has no dataset_info.json" in msg)


logging.getLogger("absl").addFilter(_QuietCustomConfig())


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


@dataclasses.dataclass(eq=False)
class TaskBuilderConfig(tfds.core.BuilderConfig):
    """BuilderConfig carrying the task object that generates the records."""

    task: Task | None = None


class _TaskBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def _info(self) -> tfds.core.DatasetInfo:
        task = self.builder_config.task
        return self.dataset_info_from_configs(
            description=f"Procedurally generated {task.name} problems: {task.data_config}",
            features=tfds.features.FeaturesDict(task.tfds_features()),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download: records are generated from the task's seed
        return {split: self._generate_examples(split) for split in ("train", "test")}

    def _generate_examples(self, split: str):
        yield from enumerate(self.builder_config.task.generate_split(split))


class GspoArith(_TaskBuilder):
    """Addition problems of tasks.ArithmeticTask."""


class GspoCountdown(_TaskBuilder):
    """Countdown problems of tasks.CountdownTask."""


class GspoChainsum(_TaskBuilder):
    """Addition chains of tasks.ChainSumTask (the testbed)."""


class GspoProducts(_TaskBuilder):
    """Products of large numbers of tasks.ProductsTask (the Python tool's task)."""


_BUILDERS = {
    "arith": GspoArith,
    "countdown": GspoCountdown,
    "chainsum": GspoChainsum,
    "products": GspoProducts,
}


def get_builder(task: Task, data_dir: str) -> tfds.core.DatasetBuilder:
    """The builder of ``task``'s dataset under ``data_dir`` (not yet prepared)."""
    if task.name not in _BUILDERS:
        raise ValueError(
            f"task {task.name!r} has no generated dataset builder; generated tasks are "
            f"{sorted(_BUILDERS)}."
        )
    name = f"{task.name}_{config_hash(task.data_config)}"
    cfg = TaskBuilderConfig(
        name=name, description=json.dumps(task.data_config, sort_keys=True), task=task
    )
    return _BUILDERS[task.name](data_dir=data_dir, config=cfg)


def build(builder: tfds.core.DatasetBuilder) -> None:
    """Generates ``builder``'s files (array_record) with a progress bar.

    Not safe to run twice at once on the same files: TFDS writes into a private folder and renames
    it into place, and the second rename fails. data.prepare calls this under the entry's lock.
    """
    print(
        f"Preparing the {builder.builder_config.task.name} dataset "
        f"({builder.builder_config.name}) under {builder.data_dir} ...",
        file=sys.stderr,
        flush=True,
    )
    tfds.display_progress_bar(True)
    builder.download_and_prepare(file_format="array_record")
