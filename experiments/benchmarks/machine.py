"""The "machine" block every benchmark's JSON report starts with: where its figures were measured.

from machine import describe      # the benchmarks' folder is on sys.path when one runs
report = {"machine": describe(shape={"B": 64}), "figures": ..., "targets": ...}
"""

from __future__ import annotations

import os
import platform
from typing import Any

import jax


def describe(**extra: Any) -> dict[str, Any]:
    """Platform, JAX backend, devices, JAX version and CPUs, plus a benchmark's own ``extra``
    entries (its shapes, its peers' threads)."""
    return {
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        **extra,
    }


def write_report(result: dict[str, Any], out: str | None) -> None:
    """Prints a benchmark's JSON report and, with ``out``, writes it there too."""
    import json

    print(json.dumps(result, indent=1))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
