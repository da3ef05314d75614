"""Agreement between the processes of a pod run, with bounded waits.

A pod run is several processes running the same SPMD program. A fault that only one host sees (a
checkpoint file only it reads, a disk that fills on one host, a config typed differently on one
host, a host that dies) must not leave the others one collective apart, waiting for ever. So every
decision one host could take alone is agreed first:

    values = gather("restoring checkpoint step 4", my_status)    # every process's status string
    result = together("loading the warm start", fn)              # fn() everywhere, or all raise

Both go through the distributed client's key-value store (``jax.distributed``'s coordination
service), not through a device collective: a get there has a timeout, so a peer that died or hung is
reported in one line naming it and what was awaited (PeerError), never waited for in gloo/XLA.

A watchdog thread (started by ``start_watchdog``) covers the waits this module does not own (a
peer dying inside a compiled step's collective, or inside orbax's barriers): every process beats
in the key-value store; a peer whose beat stops for ``timeout_s`` makes this process print one line
naming it, what this process was doing (``set_phase``) and the newest committed checkpoint, and
exit with code 1 at once (a process stuck in a collective cannot unwind).

On a single process every function here is a local no-op. No array dimensions here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from gspo_jax import config as config_lib
from gspo_jax.errors import CheckpointError, ConfigError, PeerError, one_line
from gspo_jax.runtime import rundir

DEFAULT_TIMEOUT_S = config_lib.MULTIHOST_TIMEOUT_S  # the schema's default of multihost.timeout_s

_settings = {"timeout_s": DEFAULT_TIMEOUT_S}
_state = {"seq": 0, "own_key": None, "phase": "starting", "kept": None, "done": False}
_DONE = "done"  # the last heartbeat of a process that finished its work without error
_last_beat: dict[int, float] = {}  # peer -> monotonic time its heartbeat last changed
_beat_lock = threading.Lock()  # a beat never overwrites the last one, _DONE


def configure(timeout_s: float) -> None:
    """Sets how long any cross-process wait of this module (and the watchdog) may last."""
    if not timeout_s > 0:
        raise ConfigError(f"config.multihost.timeout_s must be > 0 seconds, got {timeout_s}")
    _settings["timeout_s"] = float(timeout_s)


def timeout_of(config) -> float:
    """config.multihost.timeout_s (the default for a config written before it existed)."""
    return float(config.get("multihost", {}).get("timeout_s", DEFAULT_TIMEOUT_S))


def timeout_s() -> float:
    return _settings["timeout_s"]


def set_phase(what: str) -> None:
    """What this process is doing now, for the watchdog's message ("in RL step 3")."""
    _state["phase"] = what


def describe_kept(fn: Callable[[], str] | None) -> None:
    """``fn()`` says which checkpoint is kept (for the one-line messages of a lost peer)."""
    _state["kept"] = fn


def _kept() -> str:
    try:
        return _state["kept"]() if _state["kept"] is not None else ""
    except Exception:  # noqa: BLE001 (a message helper must not fail the report)
        return ""


def _client():
    from jax._src import distributed as jax_distributed

    return jax_distributed.global_state.client


def _lost(peer: int, why: str) -> str:
    kept = _kept()
    kept = f"; {kept}" if kept else ""
    return (
        f"process {peer} {why} while this process was {_state['phase']}: it died, hung or "
        f"stopped on its own error (see its output){kept}. Rerun every process with the same "
        "command to resume"
    )


def gather(what: str, value: str = "") -> list[str]:
    """Every process's ``value`` (index = process index), once all have reached ``what``.

    Every process must call gather at the same points in the same order (they are numbered); a
    peer that does not arrive within timeout_s, or arrives at another ``what`` (the processes went
    different ways: a bug), raises PeerError naming it.
    """
    n, me = jax.process_count(), jax.process_index()
    if n == 1:
        return [value]
    client = _client()
    _state["seq"] += 1
    prefix = f"gspo_jax/agree/{_state['seq']}"
    client.key_value_set(f"{prefix}/{me}", json.dumps([what, value]))
    phase, _state["phase"] = _state["phase"], f"waiting for the other processes at {what}"
    limit = timeout_s()
    deadline = time.monotonic() + limit
    values = []
    try:
        for peer in range(n):
            if peer == me:
                values.append(value)
                continue
            ms = max(1, int(1000 * (deadline - time.monotonic())))
            try:
                theirs, v = json.loads(client.blocking_key_value_get(f"{prefix}/{peer}", ms))
            except Exception as e:  # noqa: BLE001 (DEADLINE_EXCEEDED, or the coordinator is gone)
                raise PeerError(_lost(peer, f"did not reach {what} within {limit:g} s")) from e
            if theirs != what:
                raise PeerError(
                    f"process {peer} is at {theirs} where this process is at {what}: the "
                    "processes went different ways (a bug); rerun every process"
                )
            values.append(v)
    finally:
        _state["phase"] = phase
    if _state["own_key"] is not None:
        # Every process has reached this agreement, so all have read the previous one's keys.
        client.key_value_delete(_state["own_key"])
    _state["own_key"] = f"{prefix}/{me}"
    return values


def barrier(what: str) -> None:
    """Waits (at most timeout_s) until every process has reached ``what``."""
    gather(what)


def _error_kind(e: BaseException) -> str:
    if isinstance(e, ConfigError):
        return "config"
    if isinstance(e, CheckpointError):
        return "checkpoint"
    return "other"


def _one_line(e: BaseException) -> str:
    if _error_kind(e) != "other":
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return one_line(e)


def raise_for(what: str, statuses: list[str]) -> None:
    """Raises, on every process, the first failure among gathered ``status_of`` strings."""
    for peer, status in enumerate(statuses):
        if status:
            kind, msg = json.loads(status)
            cls = {"config": ConfigError, "checkpoint": CheckpointError}
            raise cls.get(kind, PeerError)(f"process {peer}, {what}: {msg}")


def status_of(e: BaseException | None) -> str:
    """A failure as a string for gather ("" for success): its kind and its one-line message."""
    return "" if e is None else json.dumps([_error_kind(e), _one_line(e)])


def together(what: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` on every process, then an agreement: its result where it succeeded everywhere;
    otherwise every process raises (the failing one its own exception, the others the first
    failure's one line, as a ConfigError / CheckpointError / PeerError like the original)."""
    if jax.process_count() == 1:
        return fn()
    try:
        result, error = fn(), None
    except Exception as e:  # noqa: BLE001 (agreed on below, then re-raised)
        result, error = None, e
    statuses = gather(what, status_of(error))
    if error is not None:
        raise error
    raise_for(what, statuses)
    return result


# ------------------------------------------------------------------------------ the watchdog


def _watch(interval_s: float) -> None:
    client, me, n = _client(), jax.process_index(), jax.process_count()
    beat, now = 0, time.monotonic()
    seen = {p: (None, now) for p in range(n) if p != me}  # peer -> (last beat, when it changed)
    _last_beat.update({p: now for p in seen})
    reachable = now
    while True:
        beat += 1
        now = time.monotonic()
        try:
            with _beat_lock:
                if _state["done"]:
                    return
                client.key_value_set(f"gspo_jax/beat/{me}", str(beat), allow_overwrite=True)
            for p in seen:
                try:
                    v = client.key_value_try_get(f"gspo_jax/beat/{p}")
                except Exception:  # noqa: BLE001 (not beating yet)
                    v = None
                if v is not None and v != seen[p][0]:
                    seen[p] = (v, now)
                    _last_beat[p] = now
            reachable = now
        except Exception:  # noqa: BLE001 (the coordinator, process 0, is unreachable)
            if now - reachable > timeout_s():
                _exit_lost(0, f"(the coordinator) has been unreachable for {timeout_s():g} s")
        for p, (last, since) in seen.items():
            if last != _DONE and now - since > timeout_s():
                _exit_lost(p, f"sent no heartbeat for {timeout_s():g} s")
        time.sleep(interval_s)


def _exit_lost(peer: int, why: str) -> None:
    os.write(2, f"\nerror: {_lost(peer, why)}\n".encode())
    os._exit(1)


def start_watchdog() -> None:
    """Starts the heartbeat thread of this process (a no-op on a single process or if running)."""
    if jax.process_count() == 1 or any(
        t.name == "gspo_jax-watchdog" for t in threading.enumerate()
    ):
        return
    interval = max(0.1, min(2.0, timeout_s() / 10))
    threading.Thread(target=_watch, args=(interval,), name="gspo_jax-watchdog", daemon=True).start()


def wait_for_peers() -> None:
    """Returns once every peer has beaten again (they are alive); if one has died the watchdog
    exits this process with its one-line report first. At most timeout_s plus a few beats."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s() + 5:
        if _last_beat and all(t > t0 for t in _last_beat.values()):
            return
        time.sleep(0.1)


def finished() -> None:
    """This process finished without error: its heartbeat stops, and the others no longer watch
    it (they may still be writing their last files when it exits)."""
    if jax.process_count() == 1:
        return
    with _beat_lock:
        _state["done"] = True
        _client().key_value_set(f"gspo_jax/beat/{jax.process_index()}", _DONE, allow_overwrite=True)


def exit_together(code: int) -> None:
    """Ends a failed multi-process run: shuts the distributed client down (every process does,
    bounded by timeout_s) and exits with ``code`` without joining other threads (an orbax thread
    may wait in a barrier for a save that can no longer commit)."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    t = threading.Thread(target=jax.distributed.shutdown, daemon=True)
    t.start()
    t.join(timeout_s())
    os._exit(code)


# ------------------------------------------------------------------------------ same run everywhere


def check_same_config(config) -> None:
    """ConfigError on every process, before any work, unless all run the same config (compared
    field by field; the message names every differing field and each process's value)."""
    if jax.process_count() == 1:
        return
    mine = config_lib.flatten(rundir.config_dict(config))
    configs = [json.loads(v) for v in gather("comparing the configs", json.dumps(mine))]
    diffs = []
    for key in sorted(set().union(*configs)):
        values = [c.get(key) for c in configs]
        if any(v != values[0] for v in values):
            diffs.append(
                f"{key} ({', '.join(f'process {p}: {v!r}' for p, v in enumerate(values))})"
            )
    if diffs:
        raise ConfigError(
            f"the processes run different configs: {'; '.join(diffs)}. Every process of a pod run "
            "must run the same command"
        )


def check_same_workdir(workdir: str) -> None:
    """ConfigError on every process, before any work, unless all share ``workdir``: process 0
    writes a probe file there that every other process must see (comparing path strings would
    accept host-local disks, which cannot hold one checkpoint, and refuse one shared disk mounted
    at another path)."""
    if jax.process_count() == 1:
        return
    workdir = os.path.abspath(workdir)
    probe = None
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".pod-probe-{os.getpid()}-{time.time_ns()}")
        with open(probe, "w") as f:
            f.write(probe)
    name, workdir0 = json.loads(
        gather("writing the workdir probe", json.dumps([probe, workdir]))[0]
    )
    here = os.path.join(workdir, os.path.basename(name))
    sees = os.path.exists(here) and open(here).read() == name
    seen = gather("looking for the workdir probe", json.dumps([sees, workdir]))
    if jax.process_index() == 0:
        os.remove(probe)
    blind = [(p, json.loads(v)[1]) for p, v in enumerate(seen) if not json.loads(v)[0]]
    if blind:
        where = ", ".join(f"process {p}: {wd}" for p, wd in blind)
        raise ConfigError(
            f"the processes do not share one workdir: process 0 writes to {workdir0}, which "
            f"{where} cannot see. A pod run needs one workdir every host reads and writes (a "
            "shared file system or bucket), passed as the same --workdir"
        )
