"""Whether results/ stays within its budget, so the repository stays cloneable (issue 52, item
6): round 3's committed results (records, warm starts) may add at most 100 MB to what results/
held before round 3.

The size counted is the sum of the file sizes git tracks under results/ plus those it would add
(untracked files that are not ignored): what a commit of the working tree would carry. Git's own
compression of the records (already gzip) and warm starts (xz, experiments/warmstart_store.py)
gains little, so the file sizes are the honest measure of what a clone downloads.

    PYTHONPATH=. python experiments/checks/results_size.py      # prints the size; exit 1 if over

This file holds check logic only; no library code.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# results/ at commit ae6987d (2026-12-06), before round 3: 888 tracked files, 32.8 MB of them the
# round-1/2 warm starts (results/claims/warmstart)
BEFORE_ROUND3 = 67_439_111
ROUND3_ALLOWANCE = 100_000_000
BUDGET = BEFORE_ROUND3 + ROUND3_ALLOWANCE


def results_files(repo: str = REPO) -> list[str]:
    """The files under results/ a commit of the working tree would hold (tracked, and untracked
    but not ignored), repository-relative."""
    out = subprocess.run(
        [
            "git",
            "-C",
            repo,
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            "results",
        ],
        capture_output=True,
        check=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p})


def results_bytes(repo: str = REPO) -> int:
    """The sum of their sizes (a tracked file deleted in the working tree counts 0)."""
    paths = (os.path.join(repo, p) for p in results_files(repo))
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def over_budget(size: int, budget: int = BUDGET) -> str | None:
    """None within the budget, else the one-line error naming the excess and the fix."""
    if size <= budget:
        return None
    return (
        f"results/ holds {size / 1e6:.1f} MB, {(size - budget) / 1e6:.1f} MB over its budget of "
        f"{budget / 1e6:.1f} MB (before round 3 + 100 MB): keep warm starts as bfloat16 "
        "(experiments/warmstart_store.py) or as a recipe and SHA-256 (docs/results.md)"
    )


def main() -> int:
    size = results_bytes()
    print(
        f"results/: {size / 1e6:.1f} MB of {BUDGET / 1e6:.1f} MB ({len(results_files())} files; "
        f"round 3 has added {(size - BEFORE_ROUND3) / 1e6:.1f} MB of its 100 MB)"
    )
    error = over_budget(size)
    if error:
        print(error)
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
