"""The claims registry: its entries, read from one JSON file per entry, and its own consistency.

    registry.registry_dir()          # where the entries are (the path resolver below)
    registry.load()                  # every entry, (key, version) order
    registry.entries("gmpo_entropy") # every version of a claim, oldest first
    registry.current("gmpo_entropy") # the newest: the one that decides the verdict

Where: the folder named by the environment variable GSPO_JAX_REGISTRY (a copy to try an edit on),
else this package's entries/ folder (installed with the package), holding
``<key>/v<version>.json`` (schema.py's canonical form). An entry is committed before the runs it
decides (experiments/checks/registration_order.py shows the order from git history); a criterion
changed after a run is a new version (``supersedes`` the old one, with its ``reason``), never an
edit of the old file.
"""

from __future__ import annotations

import functools
import glob
import json
import os

from gspo_jax.claims.schema import Claim, from_dict

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


def check(all_entries) -> None:
    """The registry's own consistency: unique (key, version), supersedes point at the previous
    version with a reason, and every version but the newest is superseded."""
    seen = set()
    for e in all_entries:
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
