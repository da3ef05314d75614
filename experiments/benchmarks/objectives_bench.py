"""Benchmark: jitted loss + gradient of every objective preset against the floor.

The floor is the cheapest loss a trainer could compute on the same arrays: the masked mean of
logp, with its gradient. Each preset runs value_and_grad w.r.t. logp (metrics included as aux,
as the trainer computes them), jitted, on [B, T] float32 inputs. Compile time is measured
separately; the figure is the median of repeats after warm-up, and the target is a ratio
(shared, noisy machines): every preset within 3x of the floor.

    python experiments/benchmarks/objectives_bench.py [--batch 256 --length 2048] [--out PATH]

Dimension legend: B response rows, T padded response length.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from gspo_jax import objectives

TARGET_RATIO = 3.0


def make_inputs(batch: int, length: int, seed: int = 0):
    """Realistic rollout arrays: variable lengths, small policy drift, +-1 advantages."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(length // 8, length + 1, size=batch)  # [B]
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)  # [B, T]
    old_logp = -rng.exponential(1.0, size=(batch, length)).astype(np.float32)  # [B, T]
    logp = old_logp + rng.normal(0.0, 1e-3, size=(batch, length)).astype(np.float32)
    ref_logp = old_logp + rng.normal(0.0, 1e-2, size=(batch, length)).astype(np.float32)
    adv = rng.choice([-1.0, 1.0], size=batch).astype(np.float32)  # [B]
    return tuple(jnp.asarray(x) for x in (logp, old_logp, adv, mask, ref_logp))


def floor_loss(logp, mask):
    """Masked mean of logp: the least a token-level loss can cost (one read, one reduce)."""
    return (logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def time_fn(fn, args, repeats: int, warmup: int = 2):
    """(compile seconds, median run seconds) of a jitted fn."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - t0)
    return compile_s, statistics.median(runs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", type=str, default=None, help="write the JSON result here")
    args = parser.parse_args(argv)

    logp, old_logp, adv, mask, ref_logp = make_inputs(args.batch, args.length)
    floor = jax.value_and_grad(floor_loss)
    compile_s, floor_s = time_fn(floor, (logp, mask), args.repeats)
    rows = [("floor (masked mean)", compile_s, floor_s)]

    cases = [(name, objectives.get_objective(name), False) for name in objectives.PRESETS]
    cases.append(("grpo+kl_ref", objectives.get_objective("grpo"), True))
    figures, targets = {"floor_ms": floor_s * 1e3}, {}
    for label, obj, with_ref in cases:
        if with_ref:
            fn = jax.value_and_grad(lambda lp, o, a, m, r, obj=obj: obj(lp, o, a, m, r), has_aux=True)
            call_args = (logp, old_logp, adv, mask, ref_logp)
        else:
            fn = jax.value_and_grad(lambda lp, o, a, m, obj=obj: obj(lp, o, a, m), has_aux=True)
            call_args = (logp, old_logp, adv, mask)
        compile_s, run_s = time_fn(fn, call_args, args.repeats)
        rows.append((label, compile_s, run_s))
        key = label.replace("+", "_")
        figures[f"{key}_ms"] = run_s * 1e3
        figures[f"{key}_over_floor"] = run_s / floor_s
        targets[f"{key}_over_floor"] = {"op": "<=", "threshold": TARGET_RATIO}

    print(f"B={args.batch} T={args.length} float32, {jax.devices()[0].platform}, "
          f"median of {args.repeats} after warm-up")
    print(f"{'objective':<22}{'compile s':>10}{'run ms':>10}{'x floor':>9}")
    for label, compile_s, run_s in rows:
        print(f"{label:<22}{compile_s:>10.2f}{run_s * 1e3:>10.3f}{run_s / floor_s:>9.2f}")

    if args.out:
        result = {
            "machine": {
                "platform": jax.devices()[0].platform,
                "devices": [str(d) for d in jax.devices()],
                "jax": jax.__version__,
                "cpu": platform.processor() or platform.machine(),
                "shape": {"B": args.batch, "T": args.length},
            },
            "figures": figures,
            "targets": targets,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
