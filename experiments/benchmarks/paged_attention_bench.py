"""Attention over the continuous engine's pages, one decode step of one layer, by implementation.

Dimension legend: N slots, K kv heads, Gq query heads per kv head, Dh head dim, ps page size,
Pp / Pg prompt / generated pages per slot, L layers.

Implementations, each jitted with the layer index traced (as in the model's layer scan), timed
interleaved in this process over the same steps; figures are microseconds per call and the
ratio to "table" (the median of --repeats passes over --steps sampled steps):
  table:        paged_attention_reference, the whole page table of every slot (the engine's
                attention before the ragged one)
  longest:      a loop over blocks of bp pages up to the longest live slot, all slots per
                block (flash-decoding batched by rows; defined here, not in the library)
  ragged bp/C:  kernels.paged_attention.paged_attention, (slot, bp-page block) work items, C
                per loop trip
Each step's slot lengths: "long_tail" draws each slot's generated age from the geometric
distribution with mean --mean-len capped at the limit (the age of a renewal process with
geometric lifetimes is geometric: the engine's steady state at sampler_bench's long-tailed
shape); "uniform" gives every slot the same age, uniform over the limit (the uniform shape).
Prompt: Pp * ps slots of which the first Pp * ps - 3 real (a padding hole).

    python experiments/benchmarks/paged_attention_bench.py --dist long_tail --N 64 --Pp 2 --Pg 16
    python experiments/benchmarks/paged_attention_bench.py --dist uniform --N 128 --Pp 4 --Pg 8
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from gspo_jax.kernels import paged_attention as pa
from gspo_jax.rollout import paged


def longest_row_blocks(q, cache, key_valid, layer, kv_end, bp):
    """Flash-decoding batched by rows: every slot runs ceil(max(kv_end) / (bp * ps)) blocks of
    bp pages (a traced trip count), so each slot pays for the longest live one."""
    table = cache["page_table"]
    N, _, H, Dh = q.shape
    Pt = table.shape[1]
    K, ps = cache["k_pages"].shape[2], cache["k_pages"].shape[-1]
    Gq = H // K
    nb = -(-Pt // bp)
    pad = nb * bp - Pt
    table = jnp.pad(table, ((0, 0), (0, pad)))
    key_valid = jnp.pad(key_valid, ((0, 0), (0, pad * ps)))
    blocks = jnp.clip((jnp.max(kv_end) + bp * ps - 1) // (bp * ps), 1, nb)
    qg = q.reshape(N, K, Gq, Dh)

    def block(i, carry):
        m, den, acc = carry
        pages = jax.lax.dynamic_slice_in_dim(table, i * bp, bp, axis=1)
        valid = jax.lax.dynamic_slice_in_dim(key_valid, i * bp * ps, bp * ps, axis=1)
        k, v = cache["k_pages"][layer, pages], cache["v_pages"][layer, pages]
        s = jnp.einsum("nkgd,npkdc->nkgpc", qg, k).reshape(N, K, Gq, bp * ps) * Dh**-0.5
        s = jnp.where(valid[:, None, None, :], s, pa.NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        e = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum("nkgpc,npkcd->nkgd", e.reshape(N, K, Gq, bp, ps), v)
        return m_new, den * corr + jnp.sum(e, axis=-1), acc * corr[..., None] + pv

    init = (
        jnp.full((N, K, Gq), pa.NEG_INF),
        jnp.zeros((N, K, Gq)),
        jnp.zeros((N, K, Gq, Dh)),
    )
    _, den, acc = jax.lax.fori_loop(0, blocks, block, init)
    return (acc / den[..., None]).reshape(N, 1, H, Dh)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dist", choices=("long_tail", "uniform"), default="long_tail")
    ap.add_argument("--N", type=int, default=64)
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--Gq", type=int, default=2)
    ap.add_argument("--Dh", type=int, default=32)
    ap.add_argument("--ps", type=int, default=16)
    ap.add_argument("--Pp", type=int, default=2)
    ap.add_argument("--Pg", type=int, default=16)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--mean-len", type=float, default=64.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ragged", default="1/64,1/32,1/128,2/32,2/64,4/16")
    ap.add_argument("--longest", default="1,2,4")
    a = ap.parse_args()
    N, K, Dh, ps, Pp, Pg, L = a.N, a.K, a.Dh, a.ps, a.Pp, a.Pg, a.L
    Pt, T = Pp + Pg, Pg * ps
    NP = 1 + N * Pt
    rng = np.random.default_rng(0)
    cache = {
        "k_pages": jnp.asarray(rng.normal(size=(L, NP, K, Dh, ps)), jnp.float32),
        "v_pages": jnp.asarray(rng.normal(size=(L, NP, K, ps, Dh)), jnp.float32),
        "page_table": jnp.asarray(1 + rng.permutation(N * Pt).reshape(N, Pt), jnp.int32),
    }
    q = jnp.asarray(rng.normal(size=(N, 1, K * a.Gq, Dh)), jnp.float32)
    steps = []
    for _ in range(a.steps):
        if a.dist == "long_tail":
            fed = np.minimum(rng.geometric(1 / a.mean_len, size=N) - 1, T - 1)
        else:
            fed = np.full(N, rng.integers(0, T))
        n = jnp.full((N,), Pp * ps - 3, jnp.int32)
        valid = paged.key_valid(n, jnp.asarray(fed, jnp.int32), Pp, Pt, ps)
        steps.append((valid, jnp.asarray(Pp * ps + fed + 1, jnp.int32)))

    fns = {"table": lambda q, c, kv, y, e: pa.paged_attention_reference(q, c, kv, y)}
    for bp in [int(x) for x in a.longest.split(",") if x]:
        fns[f"longest {bp}"] = functools.partial(longest_row_blocks, bp=bp)
    for spec in [x for x in a.ragged.split(",") if x]:
        bp, C = (int(x) for x in spec.split("/"))
        fns[f"ragged {bp}/{C}"] = functools.partial(pa.paged_attention, block_pages=bp, chunk=C)
    fns = {name: jax.jit(f) for name, f in fns.items()}
    layer = jnp.int32(L - 1)
    want = [fns["table"](q, cache, kv, layer, e) for kv, e in steps]
    times = {name: [] for name in fns}
    for name, f in fns.items():  # compile, and check every implementation against the table
        for (kv, e), w in zip(steps, want, strict=True):
            np.testing.assert_allclose(f(q, cache, kv, layer, e), w, atol=1e-4, err_msg=name)
    for _ in range(a.repeats):
        for name, f in fns.items():
            t0 = time.perf_counter()
            for kv, e in steps:
                f(q, cache, kv, layer, e).block_until_ready()
            times[name].append((time.perf_counter() - t0) / len(steps))
    seen = np.mean([float(e.mean()) for _, e in steps])
    print(
        f"{a.dist}: N={N}, K={K}, Gq={a.Gq}, Dh={Dh}, ps={ps}, table {Pp}+{Pg} pages "
        f"({Pt * ps} slots), mean visible end {seen:.0f} slots; {jax.default_backend()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    base = statistics.median(times["table"])
    for name, t in times.items():
        med = statistics.median(t)
        print(f"  {name:<14}{med * 1e6:10.0f} us{base / med:8.2f}x")


if __name__ == "__main__":
    main()
