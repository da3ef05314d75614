"""Multi-host plumbing: process-local data <-> global arrays, the per-process prompt stream.

Dimension legend: P prompts per step (global), P_local = P / process_count on this process,
B = P*G response rows; "rows" is the leading (batch) dimension of any array.

Every process runs the same SPMD program. Host-side work (reading prompts, scoring responses with
the task's verifier) is done on process-local numpy rows; ``to_global`` assembles them into one
array sharded over the mesh's batch axes (data, fsdp), and ``to_local`` takes this process's rows
back. Rows of process i are the contiguous block [i * n_local, (i + 1) * n_local): the mesh's
devices are ordered by process, so the batch sharding puts each process's rows on its own devices,
and group-contiguous response rows (row b answers prompt b // G) stay with their prompt's process.

On a single process all of this reduces to device_put / np.asarray.
"""

from __future__ import annotations

import jax
import numpy as np

from gspo_jax import pod, sharding


def init_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: float = pod.DEFAULT_TIMEOUT_S,
) -> None:
    """jax.distributed.initialize, with gloo collectives when the platform is the CPU, and this
    process's heartbeat watchdog (pod.py).

    Must run before any JAX computation. On a TPU pod all three arguments can be None (JAX reads
    them from the environment); on CPUs they are required. ``timeout_s`` (config.multihost
    .timeout_s) bounds every wait for another process: pod.py's agreements and watchdog use it,
    the coordinator's own heartbeat timeout is twice it (so that the watchdog's one-line report
    comes first, not the coordinator's abort) and its shutdown barrier waits at most this long.
    """
    pod.configure(timeout_s)
    platforms = str(jax.config.jax_platforms or "")
    if platforms in ("", "cpu") or "cpu" in platforms:
        # Cross-process collectives on CPU devices go through gloo (TCP); without it a
        # multi-process CPU computation fails at the first all-reduce.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        heartbeat_timeout_seconds=max(2, int(2 * timeout_s)),
        shutdown_timeout_seconds=max(1, int(timeout_s)),
    )
    pod.start_watchdog()


def to_global(local: np.ndarray, mesh) -> jax.Array:
    """This process's rows [n_local, ...] -> a global array [n_local * process_count, ...]."""
    local = np.asarray(local)
    return jax.make_array_from_process_local_data(sharding.rows_sharding(mesh, local.ndim), local)


def to_local(x: jax.Array) -> np.ndarray:
    """A row-sharded global array -> this process's rows (all rows on a single process), as
    numpy: an explicit device-to-host transfer (jax.device_get)."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    by_start = {}
    for s in x.addressable_shards:
        by_start[s.index[0].start or 0] = s  # replicas along other mesh axes: keep one
    rows = jax.device_get([by_start[k].data for k in sorted(by_start)])
    return np.concatenate([np.asarray(r) for r in rows])


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
    from gspo_jax import data

    pcount, pindex = jax.process_count(), jax.process_index()
    mode = config.data.process_sharding
    kwargs = dict(
        seed=config.data.seed if config.data.seed >= 0 else config.seed,
        data_dir=config.data.data_dir or None,
    )
    P = config.rl.prompts_per_step
    if mode == "slice":
        it = data.make_train_iterator(
            task, batch_size=P, process_index=0, process_count=1, **kwargs
        )
        return ProcessSlice(it, pindex, pcount) if pcount > 1 else it
    if mode == "records":
        return data.make_train_iterator(
            task, batch_size=P, process_index=pindex, process_count=pcount, **kwargs
        )
    from gspo_jax.config import ConfigError

    raise ConfigError(f"config.data.process_sharding={mode!r}; valid: 'slice', 'records'")
