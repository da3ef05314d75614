"""An exclusive lock on one cache entry, so that concurrent runs prepare it once.

    with filelock.locked(entry, what=f"the arith dataset at {entry}"):
        if not is_complete(entry):  # re-check: the process we waited for may have finished it
            prepare(entry)

Why: the caches (the TFDS dataset of a generated task, the warm-start base policy) are shared by
every run on a machine, and by the hosts of a pod when they sit on shared storage. Runs started
together (experiments/sweep.py --parallel, a pod's hosts) find the same entry missing at the same
moment; unlocked, each prepares it and the later ones crash on the first one's files (TFDS: "Cannot
rename ... already exists") or redo minutes of work. Under this lock the first process prepares,
the others print one line saying what they wait for, block, then find the finished entry and load
it.

Why ``fcntl.flock`` on ``<entry>.lock``: the kernel releases the lock when its holder exits or
dies, so a killed preparation never leaves a stale lock behind (a lock made by creating a file
would, and every later run would hang on it). The lock file is never removed: removing it would let
a late process lock a new file while another still holds the old one. Linux NFS clients emulate
flock with POSIX byte-range locks, so hosts sharing an NFS cache exclude each other too. Where the
filesystem has no locks (some FUSE mounts of object stores) a one-line warning says so and the
entry is prepared unlocked: prepare it once with ``--prepare_only`` there before launching.

The lock is not re-entrant: a process must not take the same entry's lock twice.

Dimension legend: none (files only).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Iterator


def lock_path(entry: str | os.PathLike) -> str:
    """The lock file of a cache entry: ``<entry>.lock``, next to it."""
    return os.fspath(entry).rstrip(os.sep) + ".lock"


def _holder(fd: int) -> str:
    """' (pid N on HOST)' as written by the current holder, or '' if it has not written it yet."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f" ({text})" if text else ""


def _acquire(fd: int, path: str, what: str) -> bool:
    """Takes the lock on ``fd``, waiting (and saying so) while another process holds it. Returns
    False when the filesystem cannot lock (after a warning): the caller proceeds unlocked."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    except OSError as e:
        print(
            f"warning: cannot lock {path} ({e.strerror or e}); preparing {what} without a lock",
            file=sys.stderr,
            flush=True,
        )
        return False
    print(f"waiting for another process{_holder(fd)} preparing {what}", file=sys.stderr, flush=True)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return True


@contextlib.contextmanager
def locked(entry: str | os.PathLike, what: str | None = None) -> Iterator[None]:
    """Holds the exclusive lock of cache entry ``entry`` (a path, existing or not) for the body.

    Blocks while another process holds it, after printing ``waiting for another process (pid N on
    HOST) preparing <what>`` to stderr. ``what`` names the entry for that line (default: its
    path). The body should re-check whether the entry exists: it may have been finished by the
    process this one waited for.
    """
    path = lock_path(entry)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    held = False
    try:
        held = _acquire(fd, path, what or os.fspath(entry))
        if held:
            # Who holds it, for the waiting line of the others (best effort: a message only).
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        if held:
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def try_locked(entry: str | os.PathLike) -> Iterator[bool]:
    """Holds the lock of ``entry`` for the body and yields True if no other process holds it;
    yields False at once, without waiting, if one does: for processes that split a list of
    entries between them (each takes the ones nobody holds, then waits for the rest with
    ``locked``). Where the filesystem cannot lock, yields True (unlocked, as ``locked``)."""
    path = lock_path(entry)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:
            pass  # no locks here: proceed, as locked() does after its warning
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock
