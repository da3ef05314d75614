"""Peak memory of per-token log-probs: chunked (gspo_jax.models.chunked_logprobs) vs naive.

Dimension legend: B rows, T response positions, D hidden, V vocab, C chunk positions.

Compiles both paths with abstract inputs (nothing is executed or allocated) and reads XLA's
memory analysis: temp_size is the scratch the compiled program needs beyond its inputs and
outputs, i.e. the peak the log-prob computation adds. Forward (log-prob + entropy) and
forward+backward (gradient w.r.t. the hidden states and the output matrix, as in training).

    python experiments/benchmarks/logprob_memory.py [--B 8 --T 2048 --V 151936 --D 1024]
        [--out bench_out/logprob_memory.json]

Runs in seconds on a CPU (compilation only).
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
from machine import describe  # this folder is on sys.path: the script runs from it

from gspo_jax import models


def naive(h, w, tok, temperature=1.0):
    """[B, T, V] float32 logits at once, then log_softmax."""
    lp = jax.nn.log_softmax(models.unembed(h, w, jnp.float32) / temperature, axis=-1)
    logp = jnp.take_along_axis(lp, tok[..., None], axis=-1)[..., 0]
    return logp, -jnp.sum(jnp.exp(lp) * lp, axis=-1)


def chunked(h, w, tok, temperature=1.0, budget=256 * 2**20):
    return models.chunked_logprobs(h, w, tok, temperature, jnp.float32, budget_bytes=budget)


def with_grad(fn):
    def loss(h, w, tok):
        logp, ent = fn(h, w, tok)
        return jnp.mean(logp) + 0.01 * jnp.mean(ent)

    return jax.grad(loss, argnums=(0, 1))


def temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--V", type=int, default=151_936)
    ap.add_argument("--D", type=int, default=1024)
    ap.add_argument("--budget-mib", type=int, default=256, help="chunk logits budget")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    h = jax.ShapeDtypeStruct((a.B, a.T, a.D), jnp.float32)
    w = jax.ShapeDtypeStruct((a.D, a.V), jnp.float32)
    tok = jax.ShapeDtypeStruct((a.B, a.T), jnp.int32)
    budget = a.budget_mib * 2**20
    ch = lambda h, w, tok: chunked(h, w, tok, budget=budget)
    C = models.logprobs.chunk_size(a.B, a.T, a.V, budget)
    figs = {
        "naive_fwd_temp_gib": temp_bytes(naive, h, w, tok) / 2**30,
        "chunked_fwd_temp_gib": temp_bytes(ch, h, w, tok) / 2**30,
        "naive_fwd_bwd_temp_gib": temp_bytes(with_grad(naive), h, w, tok) / 2**30,
        "chunked_fwd_bwd_temp_gib": temp_bytes(with_grad(ch), h, w, tok) / 2**30,
        "full_logits_f32_gib": a.B * a.T * a.V * 4 / 2**30,
        "chunk_positions": C,
    }
    figs["fwd_reduction_x"] = figs["naive_fwd_temp_gib"] / figs["chunked_fwd_temp_gib"]
    figs["fwd_bwd_reduction_x"] = figs["naive_fwd_bwd_temp_gib"] / figs["chunked_fwd_bwd_temp_gib"]
    print(
        f"log-prob peak temp memory, B={a.B} T={a.T} V={a.V} D={a.D} (chunk C={C} positions; "
        f"[B,T,V] f32 = {figs['full_logits_f32_gib']:.2f} GiB)"
    )
    print(f"{'path':<10}{'forward GiB':>14}{'fwd+bwd GiB':>14}")
    print(
        f"{'naive':<10}{figs['naive_fwd_temp_gib']:>14.3f}{figs['naive_fwd_bwd_temp_gib']:>14.3f}"
    )
    print(
        f"{'chunked':<10}{figs['chunked_fwd_temp_gib']:>14.3f}"
        f"{figs['chunked_fwd_bwd_temp_gib']:>14.3f}"
    )
    print(f"{'ratio':<10}{figs['fwd_reduction_x']:>13.1f}x{figs['fwd_bwd_reduction_x']:>13.1f}x")
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(
                {
                    "machine": describe(),
                    "figures": figs,
                    "targets": {
                        "fwd_reduction_x": {"op": ">=", "threshold": 10.0},
                        "fwd_bwd_reduction_x": {"op": ">=", "threshold": 5.0},
                    },
                },
                f,
                indent=2,
            )
    return figs


if __name__ == "__main__":
    main()
