"""Whether every claims-registry entry was committed before the runs it decides, and never
edited after them (issues 33 and 52).

The registry is data, gspo_jax/claims/entries/<key>/v<version>.json; before that it was one
Python file, experiments/claims_registry.py. Both are read from git history: at every commit that
changed either, each entry's canonical hash (gspo_jax.claims.entry_hash; an old Python entry is
read into the same canonical form). An entry is registered by the oldest commit that holds it,
with the hash it had then. Its runs are the committed records of its sweeps
(results/claims/<sweep>/*.json.gz) at the entry's seeds (round 2: its own fresh seeds; earlier
entries: 0-4), restricted to the arms its primary criterion and preconditions name. Per run:

- started_at (notebooks/reporting/records.py): when the run first started. A run that started
  after the registering commit is the evidence the issue asks for ("after");
- records made before started_at was kept have none. For them the record's first commit is an
  upper bound of the run's end, so (commit time - the run's wall_s) is an upper bound of its
  start: a start bound before the registration proves a violation ("VIOLATION"). Otherwise the
  sweep that makes the run (experiments/claims.py's first mention of "<name>") bounds the start
  of a run made from committed code from below: when that commit is no older than the
  registering one, the run cannot predate the entry ("sweep no older"); else the order is not
  contradicted but not shown ("not shown").

Edits: an entry whose hash changed after its registration (in a later commit, or in the working
tree: the registry read now, $GSPO_JAX_REGISTRY or the package's entries; the hash leaves out
bookkeeping, claims.schema.BOOKKEEPING) is "EDITED after it" for each run that started before the
change (started_at, else the record's first commit bounds the start from above); "edit order not
shown" where the start cannot be placed. A record that names the hash it was made for
("entries", records.py) must name the registering hash. Records without hashes (made before they
were kept: "pre-hash") are judged by their start alone.

    PYTHONPATH=. python experiments/checks/registration_order.py            # every entry
    PYTHONPATH=. python experiments/checks/registration_order.py r2_ratio   # entries of a sweep

Prints one line per entry with runs and a count per status; exits 1 when any run started before
its entry was registered or an entry was edited after its runs, else 0. This file holds check
logic only; no library code.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import time
import types

from gspo_jax import claims

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OLD_REGISTRY = "experiments/claims_registry.py"  # the registry as one Python file, until data
ENTRIES = "gspo_jax/claims/entries"
CLAIMS = "experiments/claims.py"
RECORDS = os.path.join("results", "claims")
_SEED = re.compile(r"^(?P<arm>.+)_s(?P<seed>\d+)$")


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", REPO, *args], capture_output=True, text=True, check=True
    ).stdout


def load_registry(source: str) -> types.ModuleType | None:
    """An old Python registry module from its source text, or None when that version does not
    load alone."""
    name = "claims_registry_at_commit"
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        exec(compile(source, OLD_REGISTRY, "exec"), module.__dict__)  # noqa: S102 (our own file)
    except Exception:  # an old version that imported what no longer exists
        return None
    finally:
        del sys.modules[name]
    return module if hasattr(module, "ENTRIES") else None


def hashes_at(commit: str) -> dict[tuple[str, int], str]:
    """(key, version) -> entry hash of the registry as ``commit`` holds it (data or Python)."""
    paths = git("ls-tree", "-r", "--name-only", commit, "--", ENTRIES).split()
    # registered versions only: a draft (draft.json) and a retirement (retired.json) are not
    paths = [p for p in paths if re.fullmatch(r"v\d+\.json", os.path.basename(p))]
    if paths:
        out = {}
        for path in paths:
            e = claims.schema.from_dict(json.loads(git("show", f"{commit}:{path}")))
            out[(e.key, e.version)] = claims.entry_hash(e)
        return out
    if not git("ls-tree", "--name-only", commit, "--", OLD_REGISTRY).strip():
        return {}
    module = load_registry(git("show", f"{commit}:{OLD_REGISTRY}"))
    return {(e.key, e.version): claims.entry_hash(e) for e in (module.ENTRIES if module else ())}


@functools.cache
def history() -> tuple[tuple[str, int, dict[tuple[str, int], str]], ...]:
    """(commit, commit time, its entry hashes) of every commit that changed the registry, oldest
    first."""
    log = git("log", "--reverse", "--format=%H %ct", "--", OLD_REGISTRY, ENTRIES).splitlines()
    return tuple((c, int(t), hashes_at(c)) for c, t in (line.split() for line in log))


def registrations() -> dict[tuple[str, int], tuple[str, int, str]]:
    """(key, version) -> (commit, commit time, hash) of the oldest commit that holds it."""
    out: dict[tuple[str, int], tuple[str, int, str]] = {}
    for commit, when, hashes in history():
        for name, h in hashes.items():
            out.setdefault(name, (commit, when, h))
    return out


def edits(name: tuple[str, int], now: str) -> list[tuple[str, int]]:
    """(commit or "working tree", time) of every change of the entry's hash after it was
    registered; ``now``: its hash as the registry reads today (the working tree, time now)."""
    out, last = [], None
    for commit, when, hashes in history():
        h = hashes.get(name)
        if h is not None and last is not None and h != last:
            out.append((commit, when))
        last = h if h is not None else last
    if last is not None and now != last:
        out.append(("working tree", int(time.time())))
    return out


def first_commit_time(path: str) -> int | None:
    """When ``path`` was first committed (Unix seconds), or None when it never was."""
    rel = os.path.relpath(path, REPO)
    lines = git("log", "--diff-filter=A", "--format=%ct", "--", rel).split()
    return int(lines[-1]) if lines else None


def named_arms(entry, arms: set[str]) -> set[str]:
    """The recorded arms among those the entry's primary criterion and preconditions name."""
    names = list(entry.primary.arms) + [p.arm for p in entry.preconditions]
    return {w for n in names for w in re.findall(r"[A-Za-z0-9_.+-]+", n)} & arms


def entry_runs(entry) -> list[tuple[str, str]]:
    """(sweep, record path) of the runs ``entry`` decides (see the module docstring)."""
    seeds = set(entry.seeds) if entry.seeds else {0, 1, 2, 3, 4}
    out = []
    for sweep in entry.sweeps:
        paths = sorted(glob.glob(os.path.join(REPO, RECORDS, sweep, "*.json.gz")))
        parsed = [(p, _SEED.match(os.path.basename(p)[: -len(".json.gz")])) for p in paths]
        parsed = [(p, m) for p, m in parsed if m and int(m["seed"]) in seeds]
        wanted = named_arms(entry, {m["arm"] for _, m in parsed})
        out += [(sweep, p) for p, m in parsed if m["arm"] in wanted]
    return out


@functools.cache
def sweep_defined_at(sweep: str) -> int | None:
    """When experiments/claims.py first named ``sweep`` (Unix seconds: its definition or an
    earlier mention, so never later than the definition), or None."""
    lines = git("log", "--reverse", "--format=%ct", f'-S"{sweep}"', "--", CLAIMS).split()
    return int(lines[0]) if lines else None


def read_record(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def edit_status(path: str, sweep: str, name: str, registered_hash: str, changes) -> str | None:
    """ "EDITED after it" when the record at ``path`` was made for another version of the entry
    ``name`` than the registered one, or its run started before a change of the entry (its
    started_at, else the record's first commit, an upper bound of the start); "edit order not
    shown" when neither that nor the sweep's first mention (a lower bound) places the start;
    None when the run started after every change."""
    record = read_record(path)
    made_for = record.get("entries", {}).get(name)
    if made_for is not None and made_for != registered_hash:
        return "EDITED after it"
    start = record.get("started_at")
    before = start if start is not None else first_commit_time(path)  # start <= this
    after = start if start is not None else sweep_defined_at(sweep)  # start >= this
    for _, when in changes:
        if before is not None and before <= when:
            return "EDITED after it"
        if after is None or after < when:
            return "edit order not shown"
    return None


def status(path: str, sweep: str, registered: int) -> str:
    record = read_record(path)
    start = record.get("started_at")
    if start is not None:
        return "after" if start > registered else "VIOLATION"
    committed = first_commit_time(path)
    if committed is not None:
        start_bound = committed - float(record["summary"].get("wall_s") or 0.0)
        if start_bound < registered:
            return "VIOLATION"
    defined = sweep_defined_at(sweep)
    return "sweep no older" if defined is not None and defined >= registered else "not shown"


def utc(t: int) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweeps", nargs="*", help="only the entries of these sweeps")
    args = p.parse_args(argv)
    registered = registrations()
    violations = 0
    for e in claims.load():
        if args.sweeps and not set(e.sweeps) & set(args.sweeps):
            continue
        runs = entry_runs(e)
        if not runs:
            if e == claims.current(e.key):  # every current entry is listed, decided or not
                gone = claims.retired(e.key)
                how = f"decided by the check {e.check}" if e.check else "undecided"
                how = f"retired in favour of {gone.in_favour_of}" if gone else how
                print(f"{e.name}: no committed runs ({how})")
            continue
        if (e.key, e.version) not in registered:
            print(f"{e.name}: VIOLATION, never committed but {len(runs)} runs decide it")
            violations += 1
            continue
        commit, when, registered_hash = registered[(e.key, e.version)]
        changes = edits((e.key, e.version), claims.entry_hash(e))
        counts: dict[str, int] = {}
        for sweep, path in runs:
            s = edit_status(path, sweep, e.name, registered_hash, changes) or status(
                path, sweep, when
            )
            counts[s] = counts.get(s, 0) + 1
        violations += counts.get("VIOLATION", 0) + counts.get("EDITED after it", 0)
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        edited = "; edited in " + ", ".join(c[:7] for c, _ in changes) if changes else ""
        print(
            f"{e.name}: registered {commit[:7]} ({utc(when)} UTC){edited}; {len(runs)} runs: "
            f"{summary}"
        )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
