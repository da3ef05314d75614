"""Benchmark: the sandboxed Python tool's throughput, tools per second, one at a time and through
ToolPool with several workers (gspo_jax/tools).

    python experiments/benchmarks/tool_pool_bench.py [--tools 64 --workers 1,2,4,8] [--out PATH]

Each tool is a small program of the kind a policy writes for the products task (a product of
two 30-digit numbers, printed): the cost is the container's start (bwrap's namespaces and
mounts), the interpreter's start and its exit, not the arithmetic. One warm-up run precedes the
clock. The machine's other load is not controlled; its 1-minute load average at the start is
reported beside the figures.

Dimension legend: N programs per measurement (--tools).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import describe, write_report  # noqa: E402

from gspo_jax.tools import ToolPool, run_python  # noqa: E402


def programs(n: int) -> list[str]:
    return [f"print({10**29 + 7 * i} * {10**29 + 13 * i})" for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", type=int, default=64, help="programs per measurement (N)")
    ap.add_argument("--workers", default="1,2,4,8", help="pool sizes, comma-separated")
    ap.add_argument("--timeout-s", type=float, default=5.0)
    ap.add_argument("--memory-mb", type=int, default=256)
    ap.add_argument("--out", default=None, help="also write the JSON report here")
    args = ap.parse_args()
    limits = dict(timeout_s=args.timeout_s, memory_mb=args.memory_mb)
    codes = programs(args.tools)
    load = os.getloadavg()[0]
    run_python(codes[0], **limits)  # warm-up: page cache, bwrap's first start

    figures = {}
    t = time.perf_counter()
    serial = [run_python(c, **limits) for c in codes]
    figures["serial"] = args.tools / (time.perf_counter() - t)
    for w in [int(x) for x in args.workers.split(",")]:
        with ToolPool(w) as pool:
            t = time.perf_counter()
            pooled = pool.map(codes, **limits)
            figures[f"pool_{w}"] = args.tools / (time.perf_counter() - t)
        assert [r.output for r in pooled] == [r.output for r in serial]
    assert all(r.status == "ok" for r in serial), [r.output for r in serial if r.status != "ok"]
    report = {
        "machine": describe(tools=args.tools, load_1min_at_start=round(load, 2)),
        "tools_per_second": {k: round(v, 1) for k, v in figures.items()},
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
