"""The command's arguments checked before any model is loaded: the k of pass@k, key=value
knobs, the --out folder, the mesh and a batch that divides over it.

Dimension legend: n samples per problem.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gspo_jax.errors import ConfigError


def parse_ks(text: str, n: int) -> tuple[int, ...]:
    """The k of pass@k, each in [1, n]; default (1, n)."""
    if n < 1:
        raise ConfigError(f"--samples={n} must be >= 1 (samples per problem)")
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()})) or tuple(sorted({1, n}))
    except ValueError:
        raise ConfigError(
            f"--k={text!r} must be integers separated by commas, e.g. 1,4,16"
        ) from None
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ConfigError(
            f"--k={text}: pass@k needs 1 <= k <= n = --samples={n}, but k={bad} is not; raise "
            "--samples or lower k"
        )
    return ks


def parse_knobs(text: str) -> dict[str, Any]:
    """key=value,... with values read as JSON where they parse (numbers, true/false), else text."""
    knobs = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise ConfigError(f"--task_args: {part!r} is not key=value; e.g. max_digits=3")
        try:
            knobs[key] = json.loads(value)
        except json.JSONDecodeError:
            knobs[key] = value
    return knobs


def check_out(out: str) -> None:
    """--out's folder, created if missing; an unwritable one is an error before any work."""
    folder = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"--out={out}: cannot create {folder} ({e.strerror}); pick another"
        ) from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--out={out}: {folder} is not writable; pick another --out")


def make_mesh(text: str, batch_size: int):
    """The evaluation's mesh from --mesh, and a batch that divides over its batch axes."""
    from gspo_jax import sharding

    axes = parse_knobs(text)
    try:
        mesh = sharding.make_mesh(axes)
    except ValueError as e:
        raise ConfigError(f"--mesh={text}: {str(e).rstrip('.')}") from None
    shards = sharding.row_shards(mesh)
    if batch_size % shards:
        raise ConfigError(
            f"--batch_size={batch_size} does not divide over the mesh's {shards} data-parallel "
            f"devices; use a multiple of {shards}"
        )
    return mesh
