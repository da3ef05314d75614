"""Scoring a batch of (reference, answer) pairs in worker processes, for the math tasks.

    results = scoring.score_batch([(reference, answer_text), ...])  # order preserved
    results[i].correct   # 1.0 / 0.0, math_answers.is_equivalent(reference, answer_text)
    results[i].timeouts  # how often its comparison ran past the limit (0 nearly always)

Why processes: math-verify's parsing and SymPy's comparisons take milliseconds to a tenth of a
second per answer and hold the GIL, so the P·G responses of a MATH step scored one after another
keep one core busy while the others wait. A pool of persistent worker processes
(default_workers(): one per core up to MAX_WORKERS; ``GSPO_JAX_SCORING_WORKERS`` overrides)
scores them in parallel. The pool starts on the first batch of at least MIN_POOLED pairs (smaller
batches are scored here, in order: starting processes would cost more), is reused by every later
batch, uses the "spawn" start method (the trainer's process runs JAX's threads, which fork would
copy in an undefined state; a spawned worker re-imports the parent's main module, guarded by
``if __name__ == "__main__"``), and is shut down at interpreter exit. A worker takes CHUNK
consecutive pairs at a time (a group's answers share a reference, which it then reads once) and
returns each verdict as soon as it is decided. When the workers cannot start (a script read from
stdin has no main module to re-import), the batch and every later one are scored here, with a
warning.

Why the result does not depend on time: a verdict is math_answers.is_equivalent, which has no
time limit inside (its work is bounded by the input). The pool adds one last line for what those
bounds miss: an answer whose comparison has not finished LIMIT_S seconds after it started (a
limit that no bounded answer comes near, idle or loaded) has its worker killed and is scored
again in a fresh one; if that also runs past the limit, it scores 0. Each expiry is logged (a
warning naming the answer) and counted in ``timeouts``, which the word-problem tasks turn into
the per-row flag "verify_timeouts"; it is never silent. A worker that dies (killed, out of
memory) has its pair retried the same way, logged but not counted as a timeout. The serial path
(workers=0, small batches) gives the same verdicts.

Dimension legend: N pairs in a batch.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from multiprocessing import connection

from gspo_jax.tasks import math_answers

logger = logging.getLogger(__name__)

LIMIT_S = 60.0  # per answer; bounded answers take well under a second even on a loaded machine
MIN_POOLED = 32  # batches smaller than this are scored in the calling process
MAX_WORKERS = 16
ATTEMPTS = 2  # a comparison that runs past LIMIT_S is tried once more in a fresh worker
CHUNK = 8  # consecutive pairs per message to a worker (a group of the MATH recipe: G = 8)
START_LIMIT_S = 120.0  # a worker imports SymPy and math-verify (seconds) before it is ready


def default_workers() -> int:
    """The pool's size: ``GSPO_JAX_SCORING_WORKERS`` when set (0 scores in the calling process),
    else the machine's cores (at most MAX_WORKERS)."""
    env = os.environ.get("GSPO_JAX_SCORING_WORKERS", "").strip()
    if env:
        try:
            workers = int(env)
        except ValueError:
            workers = -1
        if workers < 0:
            raise ValueError(
                f"GSPO_JAX_SCORING_WORKERS={env!r}: set it to a number of processes >= 0 "
                "(0 scores in the calling process), or unset it for one per core."
            )
        return workers
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


@dataclasses.dataclass(frozen=True)
class Result:
    """One pair's verdict: correct (1.0 / 0.0) and how often its comparison ran past LIMIT_S."""

    correct: float
    timeouts: int = 0


def _worker_main(conn: connection.Connection) -> None:
    """A worker's loop: a chunk [(index, reference, answer)] in, (index, correct) out for each
    pair as soon as it is decided (so the parent knows which pair is running); None ends it."""
    import math_verify  # noqa: F401 - imported before the first pair, not inside its limit

    conn.send("ready")
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if chunk is None:
            return
        for index, reference, answer in chunk:
            conn.send((index, float(math_answers.is_equivalent(reference, answer))))


class _Worker:
    def __init__(self, ctx: multiprocessing.context.BaseContext):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main, args=(child,), name="gspo_jax-scoring", daemon=True
        )
        self.process.start()
        child.close()
        self.jobs: collections.deque[int] = collections.deque()  # its chunk's undecided pairs
        self.started = 0.0  # when jobs[0] started: the chunk's arrival or the last verdict

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


class PoolUnavailable(RuntimeError):
    """The worker processes could not start (score_batch then scores in the calling process)."""


class Pool:
    """Persistent worker processes scoring pairs; ``map`` preserves order. One batch at a time
    (a lock), so the trainer and an evaluation may share it."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"a scoring pool needs workers >= 1, got {workers}.")
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        # All started at once, then awaited: each imports SymPy and math-verify (seconds).
        self.workers = [_Worker(self._ctx) for _ in range(workers)]
        try:
            for worker in self.workers:
                self._await_ready(worker)
        except PoolUnavailable:
            self.close()
            raise

    def _await_ready(self, worker: _Worker) -> _Worker:
        """``worker`` once it has imported its libraries, or PoolUnavailable (a spawned child
        re-imports the parent's main module, which fails for a script read from stdin)."""
        try:
            if worker.conn.poll(START_LIMIT_S) and worker.conn.recv() == "ready":
                return worker
        except (EOFError, OSError):
            pass
        worker.kill()
        raise PoolUnavailable(
            f"a scoring worker process did not start within {START_LIMIT_S:.0f} s (exit code "
            f"{worker.process.exitcode}); set GSPO_JAX_SCORING_WORKERS=0 to score in-process."
        )

    def map(self, pairs: Sequence[tuple[str, str]], *, limit_s: float = LIMIT_S) -> list[Result]:
        with self._lock:
            return self._map(pairs, limit_s)

    def _map(self, pairs: Sequence[tuple[str, str]], limit_s: float) -> list[Result]:
        correct: list[float | None] = [None] * len(pairs)
        timeouts = [0] * len(pairs)
        attempts = [0] * len(pairs)  # ended without a verdict: past the limit, or the worker died
        # Chunks of consecutive pairs: a group's G answers share a reference, which a worker
        # then reads once (its cache), and a verdict costs one message, not a round trip.
        queue = collections.deque(
            list(range(i, min(i + CHUNK, len(pairs)))) for i in range(0, len(pairs), CHUNK)
        )
        busy: dict[connection.Connection, _Worker] = {}

        def fail(w: _Worker, why: str) -> None:
            """w's running pair ended without a verdict: replace w, requeue its chunk's rest
            and the pair itself (alone) unless this was its last attempt."""
            del busy[w.conn]
            index, rest = w.jobs[0], list(w.jobs)[1:]
            attempts[index] += 1
            retry = attempts[index] < ATTEMPTS
            logger.warning(
                "scoring answer %r against %r %s (attempt %d of %d)%s",
                pairs[index][1][:80],
                pairs[index][0][:80],
                why,
                attempts[index],
                ATTEMPTS,
                "; retrying" if retry else "; scored 0",
            )
            w.jobs.clear()
            self._replace(w)
            if rest:
                queue.appendleft(rest)
            if retry:
                queue.appendleft([index])
            else:
                correct[index] = 0.0

        while queue or busy:
            for w in self.workers:  # hand each idle worker the next chunk
                if not w.jobs and queue:
                    chunk = queue.popleft()
                    w.jobs.extend(chunk)
                    w.started = time.monotonic()
                    try:
                        w.conn.send([(i, *pairs[i]) for i in chunk])
                    except (OSError, ValueError):  # it died idle: wait() reports the closed pipe
                        pass
                    busy[w.conn] = w
            next_expiry = min(w.started + limit_s for w in busy.values())
            ready = connection.wait(list(busy), timeout=max(0.0, next_expiry - time.monotonic()))
            for conn in ready:
                w = busy[conn]
                try:
                    while w.jobs and conn.poll():
                        index, verdict = conn.recv()  # in the chunk's order: index == jobs[0]
                        correct[index] = verdict
                        w.jobs.popleft()
                        w.started = time.monotonic()
                except (EOFError, OSError):  # the worker died (killed, out of memory)
                    fail(w, "killed its worker")
                    continue
                if not w.jobs:
                    del busy[conn]
            now = time.monotonic()
            for w in list(busy.values()):
                if now - w.started >= limit_s:
                    timeouts[w.jobs[0]] += 1
                    fail(w, f"ran past {limit_s:.0f} s")
        return [
            Result(c if c is not None else 0.0, t) for c, t in zip(correct, timeouts, strict=True)
        ]

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = self._await_ready(_Worker(self._ctx))

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []


_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()
_UNAVAILABLE: str | None = None  # why the pool could not start; later batches score in-process


def _pool(workers: int) -> Pool:
    """The shared pool of ``workers`` processes, started on first use (resized if asked)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or len(_POOL.workers) != workers:
            if _POOL is not None:
                _POOL.close()
            _POOL = Pool(workers)
        return _POOL


@atexit.register
def shutdown() -> None:
    """Stop the shared pool's workers (at exit; also callable, a later batch starts a new one)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None


def score_batch(
    pairs: Sequence[tuple[str, str]],
    *,
    workers: int | None = None,
    limit_s: float = LIMIT_S,
    min_pooled: int = MIN_POOLED,
) -> list[Result]:
    """Verdicts of ``pairs`` = [(reference, answer text)] in order: math_answers.is_equivalent
    of each, in the shared pool (``workers`` processes, default default_workers()) when there are
    at least ``min_pooled`` pairs, else in this process. Never raises on str pairs."""
    workers = default_workers() if workers is None else workers
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0 scores in this process), got {workers}.")
    global _UNAVAILABLE
    if workers > 0 and len(pairs) >= min_pooled and _UNAVAILABLE is None:
        try:
            return _pool(workers).map(pairs, limit_s=limit_s)
        except PoolUnavailable as e:  # the same verdicts, one after another
            _UNAVAILABLE = str(e)
            logger.warning("scoring in-process from now on: %s", e)
            shutdown()
    return [Result(float(math_answers.is_equivalent(r, a))) for r, a in pairs]
