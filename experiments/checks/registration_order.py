"""Whether every claims-registry entry was committed before the first run it decides (issue 33).

For each entry (key, version) of experiments/claims_registry.py: the commit that registered it is
the oldest commit of that file whose registry holds (key, version) (each version of the file is
loaded from git, so an entry later edited in place would show as registered when it first
appeared). Its runs are the committed records of its sweeps (results/claims/<sweep>/*.json.gz)
at the entry's seeds (round 2: its own fresh seeds; earlier entries: 0-4), restricted to the arms
its primary criterion and preconditions name. Per run:

- started_at (notebooks/reporting/records.py): when the run first started. A run that started
  after the registering commit is the evidence the issue asks for ("after");
- records made before started_at was kept have none. For them the record's first commit is an
  upper bound of the run's end, so (commit time - the run's wall_s) is an upper bound of its
  start: a start bound before the registration proves a violation ("VIOLATION"). Otherwise the
  sweep that makes the run (experiments/claims.py's first mention of "<name>") bounds the start
  of a run made from committed code from below: when that commit is no older than the
  registering one, the run cannot predate the entry ("sweep no older"); else the order is not
  contradicted but not shown ("not shown").

    PYTHONPATH=. python experiments/checks/registration_order.py            # every entry
    PYTHONPATH=. python experiments/checks/registration_order.py r2_ratio   # entries of a sweep

Prints one line per entry with runs and a count per status; exits 1 when any run started before
its entry was registered, else 0. This file holds check logic only; no library code.
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
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGISTRY = "experiments/claims_registry.py"
CLAIMS = "experiments/claims.py"
RECORDS = os.path.join("results", "claims")
_SEED = re.compile(r"^(?P<arm>.+)_s(?P<seed>\d+)$")


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", REPO, *args], capture_output=True, text=True, check=True
    ).stdout


def load_registry(source: str) -> types.ModuleType | None:
    """A registry module from its source text, or None when that version does not load alone."""
    name = "claims_registry_at_commit"
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        exec(compile(source, REGISTRY, "exec"), module.__dict__)  # noqa: S102 (our own file)
    except Exception:  # an old version that imported what no longer exists
        return None
    finally:
        del sys.modules[name]
    return module if hasattr(module, "ENTRIES") else None


def registrations() -> dict[tuple[str, int], tuple[str, int]]:
    """(key, version) -> (commit, commit time) of the oldest commit whose registry holds it."""
    out: dict[tuple[str, int], tuple[str, int]] = {}
    for line in git("log", "--reverse", "--format=%H %ct", "--", REGISTRY).splitlines():
        commit, when = line.split()
        module = load_registry(git("show", f"{commit}:{REGISTRY}"))
        for e in module.ENTRIES if module else ():
            out.setdefault((e.key, e.version), (commit, int(when)))
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


def status(path: str, sweep: str, registered: int) -> str:
    with gzip.open(path, "rt") as f:
        record = json.load(f)
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
    with open(os.path.join(REPO, REGISTRY)) as f:
        registry = load_registry(f.read())
    registered = registrations()
    violations = 0
    for e in registry.ENTRIES:
        if args.sweeps and not set(e.sweeps) & set(args.sweeps):
            continue
        runs = entry_runs(e)
        if not runs:
            continue
        commit, when = registered[(e.key, e.version)]
        counts: dict[str, int] = {}
        for sweep, path in runs:
            s = status(path, sweep, when)
            counts[s] = counts.get(s, 0) + 1
        violations += counts.get("VIOLATION", 0)
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        print(f"{e.name}: registered {commit[:7]} ({utc(when)} UTC); {len(runs)} runs: {summary}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
