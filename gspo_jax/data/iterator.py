"""The training prompt stream of each process: every process reads the global batch and keeps
its rows ("slice"), or reads its own shard of the records ("records").

Dimension legend: P prompts per step (global); a batch is a dict of [P or P_local, ...] arrays.
"""

from __future__ import annotations

import jax
import numpy as np

from gspo_jax.data import pipeline
from gspo_jax.errors import ConfigError


class ProcessSlice:
    """This process's rows of a global batch stream (config.data.process_sharding="slice").

    Every process reads the same global batch of P prompts and keeps rows
    [i * P / n, (i + 1) * P / n): the global batch, and so the whole run, is then independent of
    the process count (a 2-host run equals a 1-host run), and every process's iterator state is the
    same. Prompt records are tiny, so reading P of them per step on every host costs nothing next
    to sampling. ("records" instead gives each process a disjoint shard of the records, for
    datasets too large to scan on every host; results then depend on the process count.)
    """

    def __init__(self, iterator, process_index: int, process_count: int):
        self._it, self._i, self._n = iterator, process_index, process_count

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._it)
        rows = len(batch["prompt"]) // self._n
        return {k: v[self._i * rows : (self._i + 1) * rows] for k, v in batch.items()}

    def get_state(self):
        return self._it.get_state()

    def set_state(self, state) -> None:
        self._it.set_state(state)


def make_data_iterator(config, task):
    """The training prompt stream of this process (see ProcessSlice for the two sharding modes)."""
    pcount, pindex = jax.process_count(), jax.process_index()
    mode = config.data.process_sharding
    kwargs = dict(
        seed=config.data.seed if config.data.seed >= 0 else config.seed,
        data_dir=config.data.data_dir or None,
    )
    P = config.rl.prompts_per_step
    if mode == "slice":
        it = pipeline.make_train_iterator(
            task, batch_size=P, process_index=0, process_count=1, **kwargs
        )
        return ProcessSlice(it, pindex, pcount) if pcount > 1 else it
    if mode == "records":
        return pipeline.make_train_iterator(
            task, batch_size=P, process_index=pindex, process_count=pcount, **kwargs
        )
    raise ConfigError(f"config.data.process_sharding={mode!r}; valid: 'slice', 'records'")
