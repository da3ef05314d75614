"""Tools the policy calls during an episode, each run confined: the sandboxed Python tool.

    from gspo_jax.tools import run_python, ToolPool
    r = run_python("print(12345 * 6789)", timeout_s=5, memory_mb=256)   # r.status, r.output
    with ToolPool(max_workers=8) as pool:
        results = pool.map(codes, timeout_s=5, memory_mb=256)          # many rows' tools at once

sandbox.py: one program in a bubblewrap container with rlimits (docs/tools.md: the attack table
and what the sandbox relies on from the OS). pool.py: many at once, on threads.
"""

from gspo_jax.tools.pool import ToolPool
from gspo_jax.tools.sandbox import (
    STATUSES,
    Limits,
    SandboxUnavailable,
    ToolResult,
    check_available,
    run_python,
)

__all__ = [
    "STATUSES",
    "Limits",
    "SandboxUnavailable",
    "ToolPool",
    "ToolResult",
    "check_available",
    "run_python",
]
