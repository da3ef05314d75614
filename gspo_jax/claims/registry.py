"""The claims registry: its entries, read from one JSON file per entry, and its own consistency.

    registry.registry_dir()          # where the entries are (the path resolver below)
    registry.load()                  # every entry, (key, version) order
    registry.entries("gmpo_entropy") # every version of a claim, oldest first
    registry.current("gmpo_entropy") # the newest: the one that decides the verdict
    registry.drafts()                # designs not yet registered (<key>/draft.json)
    registry.retired("seq_ratio_eps02")  # why a claim's newest entry will not be run, or None

Where: the folder named by the environment variable GSPO_JAX_REGISTRY (a copy to try an edit on),
else this package's entries/ folder (installed with the package), holding
``<key>/v<version>.json`` (schema.py's canonical form). An entry is committed before the runs it
decides (experiments/checks/registration_order.py shows the order from git history); a criterion
changed after a run is a new version (``supersedes`` the old one, with its ``reason``), never an
edit of the old file.

Beside the versions, a claim's folder may hold ``draft.json`` (the next version's design, status
"draft": not registered, decides nothing; registered by renaming it v<N>.json without its
status) and ``retired.json`` (``{"version", "reason", "in_favour_of"}``: the newest version will
not be run, and why; its file, hash and records stay as they were).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os

from gspo_jax.claims.schema import MIN_DRAWS, Claim, from_dict

ENV = "GSPO_JAX_REGISTRY"
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "entries")


def registry_dir() -> str:
    """The registry's folder: $GSPO_JAX_REGISTRY, else this package's entries/;
    FileNotFoundError naming it when it is not there."""
    folder = os.environ.get(ENV) or DEFAULT_DIR
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"no claims registry at {folder}: set {ENV} to a folder holding "
            "<key>/v<version>.json, or unset it to read the package's own entries"
        )
    return folder


def entry_path(key: str, version: int, folder: str | None = None) -> str:
    return os.path.join(folder or registry_dir(), key, f"v{version}.json")


def read_entry(path: str) -> Claim:
    """One entry file; ValueError naming the file when it does not describe an entry or its
    name disagrees with its key and version."""
    with open(path) as f:
        try:
            claim = from_dict(json.load(f))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(
                f"{path}: not a registry entry ({e}); see gspo_jax/claims/schema.py"
            ) from None
    key, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)
    if (key, name) != (claim.key, f"v{claim.version}.json"):
        raise ValueError(f"{path} holds {claim.name}: name it {claim.key}/v{claim.version}.json")
    return claim


@functools.cache
def _load(files: tuple[tuple[str, int, int], ...]) -> tuple[Claim, ...]:
    found = sorted((read_entry(p) for p, _, _ in files), key=lambda e: (e.key, e.version))
    check(found)
    return tuple(found)


def load(folder: str | None = None) -> tuple[Claim, ...]:
    """Every entry of the registry at ``folder`` (default registry_dir()), checked (check);
    read again when a file has changed (its path, size or modification time)."""
    paths = sorted(glob.glob(os.path.join(folder or registry_dir(), "*", "v*.json")))
    return _load(tuple((p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths))


def entries(key: str, folder: str | None = None) -> list[Claim]:
    """Every version of the claim ``key``, oldest first; ValueError naming the known keys."""
    all_entries = load(folder)
    found = [e for e in all_entries if e.key == key]
    if not found:
        raise ValueError(
            f"no registry entry {key!r}; known: {sorted({e.key for e in all_entries})}"
        )
    return found


def current(key: str, folder: str | None = None) -> Claim:
    """The newest version of the claim ``key`` (the one that decides the verdict)."""
    return entries(key, folder)[-1]


@dataclasses.dataclass(frozen=True)
class Retirement:
    """A claim whose newest entry will never be run: which version, why, and what replaces it."""

    version: int
    reason: str
    in_favour_of: str  # the entry (or draft) that tests the claim instead


def retired(key: str, folder: str | None = None) -> Retirement | None:
    """The claim's retirement (<key>/retired.json) when it retires the newest version, else None:
    none, or it retired an earlier version and a newer entry took the key up again (the file
    stays as that version's history). ValueError naming the file when it names a version the
    registry does not hold, or gives no reason."""
    path = os.path.join(folder or registry_dir(), key, "retired.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        r = Retirement(**json.load(f))
    newest = current(key, folder).version
    versions = {e.version for e in load(folder) if e.key == key}
    if r.version in versions and r.version < newest and r.reason and r.in_favour_of:
        return None
    if r.version != newest or not r.reason or not r.in_favour_of:
        raise ValueError(
            f"{path}: retires v{r.version}; name the newest version "
            f"(v{current(key, folder).version}), the reason and the entry in favour of which"
        )
    return r


def drafts(folder: str | None = None) -> tuple[Claim, ...]:
    """Every draft (<key>/draft.json: status "draft", supersedes the key's newest version if it
    has one), key order; ValueError naming the file when it is not one."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder or registry_dir(), "*", "draft.json"))):
        with open(path) as f:
            d = from_dict(json.load(f))
        key = os.path.basename(os.path.dirname(path))
        newest = [e for e in load(folder) if e.key == key]
        if (
            d.status != "draft"
            or d.key != key
            or d.supersedes != (newest[-1].version if newest else None)
        ):
            raise ValueError(
                f"{path}: a draft has status 'draft', key {key!r} and supersedes the newest "
                f"version ({newest[-1].version if newest else None})"
            )
        if len(d.draws) < MIN_DRAWS:
            raise ValueError(f"{path}: {len(d.draws)} draws, a round-3 design needs {MIN_DRAWS}")
        out.append(d)
    return tuple(out)


def check(all_entries) -> None:
    """The registry's own consistency: unique (key, version), supersedes point at the previous
    version with a reason, every version but the newest is superseded, no draft among the
    registered versions, and an entry with draws has at least MIN_DRAWS of them."""
    seen = set()
    for e in all_entries:
        if e.status == "draft":
            raise ValueError(f"{e.name}: a draft is <key>/draft.json; registered, it has no status")
        if e.draws and len(e.draws) < MIN_DRAWS:
            raise ValueError(f"{e.name}: {len(e.draws)} draws, at least {MIN_DRAWS} needed")
        if (e.key, e.version) in seen:
            raise ValueError(f"registry entry {e.name} twice: a changed criterion is a new version")
        seen.add((e.key, e.version))
        if e.supersedes is not None and (e.supersedes >= e.version or not e.reason):
            raise ValueError(f"{e.name}: supersedes an earlier version and says why (reason)")
    for key in {e.key for e in all_entries}:
        versions = sorted((e for e in all_entries if e.key == key), key=lambda e: e.version)
        for old, new in zip(versions, versions[1:], strict=False):
            if new.supersedes != old.version:
                raise ValueError(f"{new.name} must supersede v{old.version} (set supersedes)")
