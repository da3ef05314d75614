"""A Pallas kernel for one decode step of attention over a paged KV cache (the continuous rollout
engine's, kernels/paged_attention.py), the kernel counterpart of paged_attention.paged_attention.

Dimension legend: N decode rows, H query heads, K kv heads, Gq = H // K, Dh head dim, L layers,
NP pages in the pool, ps page size, Pt page-table entries per row.

Why a kernel of our own: JAX's TPU kernels (jax.experimental.pallas.ops.tpu.paged_attention and
ragged_paged_attention) take each row's keys as the contiguous logical slots [0, length), in a
[pages, page_size, heads, head_dim] layout. The engine's rows see their prompt's n real slots,
then a right-padding hole up to the prompt pages' end, then their generated slots; its pool is
heads-major with keys transposed ([L, NP, K, Dh, ps], as the plain cache's matmuls read it).
This kernel takes the layout as it is: the mask says which slots a row sees.

The kernel: grid (N, K, Pt), one program per (row, kv head, table entry), the table entries
innermost ("arbitrary": they accumulate). The page table, each row's kv_end and the layer index
are scalar-prefetched, so the key/value BlockSpecs' index maps read page table[n, p] of layer
`layer` straight from the pool: no gathered copy. Each program folds its page's ps keys into a
running softmax held in scratch (float32 max m [Gq, 1], normaliser den [Gq, 1], output acc
[Gq, Dh]; m' = max(m, max_j s_j), den' = den e^(m - m') + sum_j e^(s_j - m'), acc likewise), and the
last entry writes acc / den. Entries at or past a row's kv_end compute nothing, and their index
maps repeat the row's last needed page, so the pipeline fetches no page a row does not see.

It runs compiled on a TPU (Mosaic) and, with interpret=True, on any platform (the tests check it
there against the plain-JAX pages). paged_attention_kernel_supported is the capability check.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG_INF = -1e30  # as paged_attention.NEG_INF: finite, so a row's first masked page gives no NaN


def paged_attention_kernel_supported() -> bool:
    """The compiled kernel needs a TPU (Mosaic); elsewhere only interpret mode runs it."""
    return jax.default_backend() == "tpu"


def _kernel(table_ref, end_ref, layer_ref, q_ref, valid_ref, k_ref, v_ref, o_ref, m, den, acc):
    """One (row n, kv head, table entry p) program. q_ref [Gq, Dh], valid_ref [1, ps] int32,
    k_ref [Dh, ps], v_ref [ps, Dh] (page table[n, p] of the layer), o_ref [Gq, Dh]; scratch
    m, den [Gq, 1] and acc [Gq, Dh] float32."""
    del table_ref, layer_ref  # read by the index maps
    n, p = pl.program_id(0), pl.program_id(2)
    ps = k_ref.shape[-1]

    @pl.when(p == 0)
    def _init():
        m[...] = jnp.full(m.shape, NEG_INF, jnp.float32)
        den[...] = jnp.zeros(den.shape, jnp.float32)
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    @pl.when(p * ps < end_ref[n])
    def _fold():
        q = q_ref[...]
        s = jnp.dot(q, k_ref[...].astype(q.dtype), preferred_element_type=jnp.float32)
        s = jnp.where(valid_ref[...] != 0, s * q.shape[-1] ** -0.5, NEG_INF)  # [Gq, ps]
        m_new = jnp.maximum(m[...], jnp.max(s, axis=-1, keepdims=True))
        e = jnp.exp(s - m_new)
        corr = jnp.exp(m[...] - m_new)
        den[...] = den[...] * corr + jnp.sum(e, axis=-1, keepdims=True)
        pv = jnp.dot(
            e.astype(q.dtype), v_ref[...].astype(q.dtype), preferred_element_type=jnp.float32
        )
        acc[...] = acc[...] * corr + pv
        m[...] = m_new

    @pl.when(p == pl.num_programs(2) - 1)
    def _write():
        o_ref[...] = (acc[...] / den[...]).astype(o_ref.dtype)


def step_operands(q: jax.Array, cache: dict, key_valid: jax.Array, kv_end: jax.Array):
    """What a kernel's decode step reads, its shapes checked (q [N, 1, H, Dh], key_valid
    [N, Pt * ps], kv_end [N]) -> (page_table int32, k_pages, v_pages, (N, H, Dh, K, ps, Pt,
    Gq)). Shared by this kernel and kernels/paged_kernel_gpu.py."""
    table = cache["page_table"].astype(jnp.int32)
    kp, vp = cache["k_pages"], cache["v_pages"]
    N, _, H, Dh = q.shape
    _, _, K, _, ps = kp.shape
    Pt, Gq = table.shape[1], H // K
    chex.assert_shape(key_valid, (N, Pt * ps))
    chex.assert_shape(kv_end, (N,))
    return table, kp, vp, (N, H, Dh, K, ps, Pt, Gq)


@functools.partial(jax.jit, static_argnames=("interpret",))
def paged_attention_kernel(
    q: jax.Array,
    cache: dict,
    key_valid: jax.Array,
    layer,
    kv_end: jax.Array,
    interpret: bool = False,
) -> jax.Array:
    """paged_attention.paged_attention's step as one Pallas call: q [N, 1, H, Dh]; cache's
    k_pages [L, NP, K, Dh, ps], v_pages [L, NP, K, ps, Dh], page_table [N, Pt] int32;
    key_valid [N, Pt * ps] bool; layer (int or scalar); kv_end [N] int32 (no visible slot at or
    past it) -> [N, 1, H, Dh] in q's dtype. interpret=True runs it on any platform."""
    table, kp, vp, (N, H, Dh, K, ps, Pt, Gq) = step_operands(q, cache, key_valid, kv_end)
    qh = q.reshape(N, K, Gq, Dh)
    valid = key_valid.astype(jnp.int32).reshape(N, Pt, 1, ps)
    end = jnp.clip(kv_end.astype(jnp.int32), 1, Pt * ps)
    layer = jnp.asarray(layer, jnp.int32).reshape(1)

    def last(n, p, end):  # the entry to fetch: p, or the row's last needed one past its end
        return jnp.minimum(p, (end[n] - 1) // ps)

    def page(n, k, p, table, end, layer):
        return (layer[0], table[n, last(n, p, end)], k, 0, 0)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(N, K, Pt),
        in_specs=[
            pl.BlockSpec((None, None, Gq, Dh), lambda n, k, p, *_: (n, k, 0, 0)),
            pl.BlockSpec((None, None, 1, ps), lambda n, k, p, t, e, y: (n, last(n, p, e), 0, 0)),
            pl.BlockSpec((None, None, None, Dh, ps), page),
            pl.BlockSpec((None, None, None, ps, Dh), page),
        ],
        out_specs=pl.BlockSpec((None, None, Gq, Dh), lambda n, k, p, *_: (n, k, 0, 0)),
        scratch_shapes=[
            pltpu.VMEM((Gq, 1), jnp.float32),
            pltpu.VMEM((Gq, 1), jnp.float32),
            pltpu.VMEM((Gq, Dh), jnp.float32),
        ],
    )
    out = pl.pallas_call(
        _kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((N, K, Gq, Dh), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
    )(table, end, layer, qh, valid, kp, vp)
    return out.reshape(N, 1, H, Dh)


__all__ = ["paged_attention_kernel", "paged_attention_kernel_supported"]
