"""One decode step of the continuous engine, with its attention over pages swapped out: how much
of the step the attention is.

Dimension legend: P prompts, G samples per prompt, N = slots = P * G, Lp prompt length,
T new tokens.

The step is rollout.decode_step_for_plan's (every slot decoding, as in the uniform shape of
sampler_bench --compare-engines: P=16 x G=8, prompt 64, 128 new tokens, slots = B, the "small"
shape), every slot at generated token --fed. Variants, each traced with
kernels.paged_attention.attend_pages replaced, timed interleaved in this process (medians):
  plain:    the attention as configured (ragged plain JAX)
  table:    paged_attention_reference (each slot's whole page table)
  none:     no attention at all (the step's query passed through): the rest of the step
  static:   the static engine's decode step at the same shape and generated token
            (rollout.static.decode_step over its shared-prefix cache, fed // decode_block + 1
            chunks filled), the step the continuous one is compared with
Times are wall-clock medians and, beside them, the process's CPU-time medians (less sensitive
to other jobs on a shared machine).

    PYTHONPATH=. python experiments/benchmarks/continuous_step_bench.py --fed 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from sampler_bench import make_model

from gspo_jax.kernels import paged_attention as pa
from gspo_jax.models import attention
from gspo_jax.rollout import continuous, paged, static

VARIANTS = {
    "plain": None,
    "table": lambda q, cache, kv, layer, end, impl: pa.paged_attention_reference(
        q, cache, kv, layer
    ),
    "none": lambda q, cache, kv, layer, end, impl: q,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--P", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--fed", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    P, G, Lp, T = a.P, a.G, a.prompt_len, a.new_tokens
    N = P * G
    model = make_model("small", max_seq_len=Lp + T)
    cfg = dict(
        num_samples=G,
        max_new_tokens=T,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        return_routes=False,
        slots=N,
    )
    Pp, Pg = paged.page_counts(Lp, T, continuous.DEFAULT_PAGE_SIZE)
    original = pa.attend_pages
    steps = {}
    for name, attend in VARIANTS.items():
        pa.attend_pages = attend or original  # read when the step is traced, below
        fn, (params, inputs, abstract) = continuous.decode_step_for_plan(
            model, num_prompts=P, prompt_len=Lp, **cfg
        )
        s = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), abstract)
        # a group's G slots share its prompt's Pp pages; every slot its own generated pages
        prompt_pages = 1 + np.arange(P * Pp).reshape(P, Pp)
        generated = 1 + P * Pp + np.arange(N * Pg).reshape(N, Pg)
        table = np.concatenate([np.repeat(prompt_pages, G, axis=0), generated], axis=1)
        s = s.replace(
            prompt_pages=jnp.asarray(prompt_pages, jnp.int32),
            active=jnp.ones((N,), bool),
            slot_row=jnp.arange(N, dtype=jnp.int32),
            slot_t=jnp.full((N,), a.fed + 1, jnp.int32),
            cache=dict(s.cache, page_table=jnp.asarray(table, jnp.int32)),
        )
        fresh = lambda s=s: jax.tree.map(lambda x: jnp.array(x, copy=True), s)  # noqa: E731
        jax.block_until_ready(fn(params, inputs, fresh()))  # trace and compile (donates s)
        steps[name] = (fn, params, inputs, fresh)
    pa.attend_pages = original
    steps["static"] = static_step(model, P, G, Lp, T, a.fed)
    times = {name: [] for name in steps}
    cpu = {name: [] for name in steps}
    for _ in range(a.repeats):
        for name, (fn, params, inputs, fresh) in steps.items():
            s = jax.block_until_ready(fresh())
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(fn(params, inputs, s))
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    print(
        f"decode step, N={N} slots at generated token {a.fed} (prompt {Lp}, limit {T}); "
        f"{jax.default_backend()}, load average {os.getloadavg()[0]:.1f}"
    )
    base, cbase = statistics.median(times["plain"]), statistics.median(cpu["plain"])
    print(f"  {'':<8}{'wall':>9}{'x plain':>10}{'cpu':>12}{'x plain':>10}")
    for name, t in times.items():
        m, c = statistics.median(t), statistics.median(cpu[name])
        print(f"  {name:<8}{m * 1e3:9.1f} ms{m / base:7.2f}x{c * 1e3:9.1f} ms{c / cbase:7.2f}x")
    print(f"  load average at the end {os.getloadavg()[0]:.1f}")


def static_step(model, P, G, Lp, T, fed):
    """(fn, params, inputs, fresh state) of one static decode step feeding generated token `fed`
    (rollout.static.decode_step at slot Lp + fed), over a shared-prefix cache holding the chunks
    that step attends to, as the static engine's loop has it at that step."""
    B, C = P * G, model.cfg.decode_block
    graphdef, params = nnx.split(model)
    prefix = model.init_cache(P, Lp)
    cache = attention.shared_prefix_cache(prefix, G, C)
    for _ in range(fed // C):  # step fed + 1 runs in phase fed // C: that many chunks added
        cache = attention.add_chunk(cache)
    n_b = jnp.full((B,), Lp, jnp.int32)
    prev = jnp.ones((B,), jnp.int32)

    def one_step(params, inputs, cache):
        prev, n_b = inputs
        m = nnx.merge(graphdef, params)
        logits, o = static.decode_step(m, cache, prev, n_b, fed + 1, Lp, T)
        return logits, o["cache"]

    fn = jax.jit(one_step, donate_argnums=2)
    fresh = lambda: jax.tree.map(lambda x: jnp.array(x, copy=True), cache)  # noqa: E731
    jax.block_until_ready(fn(params, (prev, n_b), fresh()))  # compile
    return fn, params, (prev, n_b), fresh


if __name__ == "__main__":
    main()
