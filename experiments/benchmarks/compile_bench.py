"""Compile time of the update's forward + backward against the number of decoder layers.

    python experiments/benchmarks/compile_bench.py                       # L = 2, 4, 8, 16
    python experiments/benchmarks/compile_bench.py --depths 2,8,28 --remat full

For each depth L: a "small" model with L layers, jit(value_and_grad) of the summed response
log-probs (models.response_logprobs, the update's forward) at B rows x (Lp + T) slots, lowered
and compiled on shapes only. Prints the compile seconds (wall and this process's CPU) and their
ratio to the shallowest depth, in the same process. With the layers under one scan the compiled
program holds one layer whatever L, so the ratio stays near 1; an unrolled stack grows with L.
Uses only the public model API, so it runs on older checkouts too (PYTHONPATH=<checkout>).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, REPO)

from gspo_jax import models  # noqa: E402


def compile_seconds(num_layers: int, remat: str, rows: int, prompt_len: int, T: int):
    """(wall s, CPU s) to lower and compile the log-prob gradient of an L-layer small model."""
    extra = {} if remat == "none" else {"remat": remat}  # older checkouts have no remat field
    cfg = models.get_model_config("small", num_layers=num_layers, **extra)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: models.create_model(cfg)))
    prompts = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32)
    lengths = jax.ShapeDtypeStruct((rows,), jnp.int32)
    responses = jax.ShapeDtypeStruct((rows, T), jnp.int32)

    def loss(p, prompts, lengths, responses):
        out = models.response_logprobs(nnx.merge(graphdef, p), prompts, lengths, responses)
        return out["logp"].sum()

    w0, c0 = time.perf_counter(), time.process_time()
    jax.jit(jax.value_and_grad(loss)).lower(params, prompts, lengths, responses).compile()
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="2,4,8,16")
    p.add_argument("--remat", default="none")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt_len", type=int, default=32)
    p.add_argument("--response_len", type=int, default=32)
    args = p.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    print(f"compile_bench: small model, remat {args.remat}, {jax.default_backend()}")
    print(f"{'layers':>7}{'wall s':>9}{'cpu s':>9}{'wall / first':>14}")
    compile_seconds(depths[0], args.remat, args.rows, args.prompt_len, args.response_len)  # warm-up
    first = None
    for L in depths:
        wall, cpu = compile_seconds(L, args.remat, args.rows, args.prompt_len, args.response_len)
        first = first or wall
        print(f"{L:>7}{wall:>9.2f}{cpu:>9.2f}{wall / first:>14.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
