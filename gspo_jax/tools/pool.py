"""A pool of sandbox workers: the tools of many rows run at once.

    with ToolPool(max_workers=8) as pool:
        futures = [pool.submit(code, timeout_s=5, memory_mb=256) for code in codes]
        results = pool.map(codes, timeout_s=5, memory_mb=256)   # list of ToolResult, in order

Threads suffice: each run is a separate container process, and a thread only waits on its pipe,
so the trainer's interpreter lock is not what limits throughput (the machine's cores are).

Dimension legend: N programs in one map call.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from gspo_jax.tools.sandbox import _UID_SLOTS, ToolResult, check_available, run_python

T = TypeVar("T")


class ToolPool:
    """``max_workers`` sandboxes at a time; ``submit`` and ``map`` take run_python's keywords."""

    def __init__(self, max_workers: int):
        if not 1 <= max_workers <= _UID_SLOTS:
            raise ValueError(f"max_workers must lie in [1, {_UID_SLOTS}], got {max_workers}.")
        check_available()  # refuse at construction, before any row waits on a tool
        self.max_workers = max_workers
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers, thread_name_prefix="tool"
        )

    def submit(self, code: str, **kwargs: Any) -> concurrent.futures.Future[ToolResult]:
        return self._executor.submit(run_python, code, **kwargs)

    def submit_job(self, job: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Any tool job on the pool's threads (an environment's answer_call jobs: a row's tool
        calls, run while the engine goes on with other rows)."""
        return self._executor.submit(job)

    def map(self, codes: Iterable[str], **kwargs: Any) -> list[ToolResult]:
        """Run every program [N]; the results in the programs' order."""
        return [f.result() for f in [self.submit(c, **kwargs) for c in codes]]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> ToolPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
