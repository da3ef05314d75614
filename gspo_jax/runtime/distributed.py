"""Multi-host plumbing: jax.distributed start-up and process-local rows <-> global arrays.

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

from gspo_jax import sharding
from gspo_jax.runtime import agreement as pod


def init_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: float = pod.DEFAULT_TIMEOUT_S,
) -> None:
    """jax.distributed.initialize, with gloo collectives when the platform is the CPU, and this
    process's heartbeat watchdog (runtime/agreement.py).

    Must run before any JAX computation. On a TPU pod all three arguments can be None (JAX reads
    them from the environment); on CPUs they are required. ``timeout_s`` (config.multihost
    .timeout_s) bounds every wait for another process: runtime/agreement.py's agreements and
    watchdog use it,
    the coordinator's own heartbeat timeout is four times it and its shutdown barrier waits at
    most this long. Four, not two: the coordinator counts from a process's last heartbeat,
    which can be about half its timeout before the process dies, so at twice ``timeout_s`` its
    abort can come ``timeout_s`` after a death, a tie with the watchdog (which needs
    ``timeout_s`` plus a beat) that the abort can win.
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
        heartbeat_timeout_seconds=max(4, int(4 * timeout_s)),
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
