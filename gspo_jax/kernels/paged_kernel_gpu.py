"""A Pallas GPU (Triton) kernel for one decode step of attention over the continuous engine's
paged KV cache (kernels/paged_attention.py): the GPU counterpart of kernels/paged_kernel.py.

Dimension legend: N decode rows, H query heads, K kv heads, Gq = H // K (padded to Gp, a power
of two >= 16, the smallest matmul a GPU kernel runs), Dh head dim, L layers, NP pages in the
pool, ps page size, Pt page-table entries per row.

Why a kernel: the plain-JAX pages (paged_attention.paged_attention) gather each work item's
pages into a copy and fold items into rows by scatters, a few small XLA kernels per loop trip
per layer; on a GPU those launches, not the bytes, set the decode step's time. JAX's GPU kernel
(jax.experimental.pallas.ops.gpu.paged_attention) takes each row's keys as the contiguous
logical slots [0, length) of one layer's [K, NP, ps, Dh] pages; the engine's rows see their
prompt's n real slots, a right-padding hole, then their generated slots, in a pool that holds
every layer heads-major with keys transposed ([L, NP, K, Dh, ps]). This kernel reads that
layout as it is, the mask saying which slots a row sees.

The kernel: grid (N, K), one program per (row, kv head). It holds the row's Gq query heads
([Gp, Dh], padded rows zero) and loops over the row's table entries below its kv_end, loading
page table[n, p] of layer `layer` straight from the pool (no gathered copy, and not one layer's
slice of the pool: the layer index is a scalar the program reads), and folds each page's ps
keys into a float32 online softmax (m' = max(m, max_j s_j), den' = den e^(m - m') +
sum_j e^(s_j - m'), acc likewise), then writes acc / den. Pages at or past kv_end are never
loaded. float32 inputs are multiplied at full float32 precision, so the kernel agrees with the
plain pages to summation order; bfloat16 ones as the GPU's bf16 matmul does.

Compiled where paged_attention_gpu_supported (a CUDA GPU, Triton through jaxlib); interpret
mode (interpret=True) runs it on any platform, which is how the tests check it on the CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gspo_jax.kernels.paged_kernel import step_operands

NEG_INF = -1e30  # as paged_attention.NEG_INF: finite, so a row's first masked page gives no NaN
MIN_DOT = 16  # the smallest matmul side a Triton dot takes


def paged_attention_gpu_supported() -> bool:
    """The compiled kernel needs a CUDA GPU (Pallas' Triton lowering); elsewhere only interpret
    mode runs it."""
    return jax.default_backend() == "gpu"


def _kernel(layer_ref, table_ref, end_ref, valid_ref, k_ref, v_ref, q_ref, o_ref, *, precision):
    """One (row n, kv head h) program. layer_ref [1], table_ref [N, Pt], end_ref [N] and
    valid_ref [N, Pt * ps] int32, k_ref [L, NP, K, Dh, ps] and v_ref [L, NP, K, ps, Dh] whole
    (read page by page), q_ref / o_ref [Gp, Dh] (this row's and head's block)."""
    n, h = pl.program_id(0), pl.program_id(1)
    ps = k_ref.shape[-1]
    layer = layer_ref[0]
    q = q_ref[...]  # [Gp, Dh]
    Gp, Dh = q.shape
    scale = Dh**-0.5

    def fold(p, carry):
        m, den, acc = carry  # [Gp], [Gp], [Gp, Dh] float32
        page = table_ref[n, p]
        k = k_ref[layer, page, h].astype(q.dtype)  # [Dh, ps]
        v = v_ref[layer, page, h].astype(q.dtype)  # [ps, Dh]
        valid = valid_ref[n, pl.ds(p * ps, ps)]  # [ps]
        s = jnp.dot(q, k, preferred_element_type=jnp.float32, precision=precision) * scale
        s = jnp.where(valid[None, :] != 0, s, NEG_INF)  # [Gp, ps]
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        e = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        pv = jnp.dot(e.astype(q.dtype), v, preferred_element_type=jnp.float32, precision=precision)
        return m_new, den * corr + jnp.sum(e, axis=-1), acc * corr[:, None] + pv

    pages = (end_ref[n] + ps - 1) // ps  # the entries holding a slot below kv_end
    init = (
        jnp.full((Gp,), NEG_INF, jnp.float32),
        jnp.zeros((Gp,), jnp.float32),
        jnp.zeros((Gp, Dh), jnp.float32),
    )
    _, den, acc = jax.lax.fori_loop(0, pages, fold, init)
    o_ref[...] = (acc / den[:, None]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("interpret",))
def paged_attention_gpu(
    q: jax.Array,
    cache: dict,
    key_valid: jax.Array,
    layer,
    kv_end: jax.Array,
    interpret: bool = False,
) -> jax.Array:
    """paged_attention.paged_attention's step as one Pallas GPU call: q [N, 1, H, Dh]; cache's
    k_pages [L, NP, K, Dh, ps], v_pages [L, NP, K, ps, Dh], page_table [N, Pt] int32;
    key_valid [N, Pt * ps] bool; layer (int or scalar); kv_end [N] int32 (no visible slot at or
    past it) -> [N, 1, H, Dh] in q's dtype. Compiled, ps and Dh must be powers of two >= 16
    (Triton's block and matmul sizes); interpret=True runs any shape on any platform."""
    table, kp, vp, (N, H, Dh, K, ps, Pt, Gq) = step_operands(q, cache, key_valid, kv_end)
    if not interpret and not all(x >= MIN_DOT and x & (x - 1) == 0 for x in (ps, Dh)):
        raise ValueError(
            f"the GPU paged-attention kernel needs a page size and head dim that are powers of "
            f"two >= {MIN_DOT} (got page_size={ps}, head_dim={Dh}); set rl.rollout_page_size=64 or "
            "model.paged_attention='plain'."
        )
    Gp = max(MIN_DOT, 1 << (Gq - 1).bit_length())
    qh = jnp.pad(q.reshape(N, K, Gq, Dh), ((0, 0), (0, 0), (0, Gp - Gq), (0, 0)))
    end = jnp.clip(kv_end.astype(jnp.int32), 1, Pt * ps)
    layer = jnp.asarray(layer, jnp.int32).reshape(1)
    full = pl.BlockSpec()  # the whole array: the program indexes it
    block = pl.BlockSpec((None, None, Gp, Dh), lambda n, h: (n, h, 0, 0))
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    kwargs = {}
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        kwargs["compiler_params"] = plgpu.CompilerParams(num_warps=4, num_stages=2)
    out = pl.pallas_call(
        functools.partial(_kernel, precision=precision),
        grid=(N, K),
        in_specs=[full, full, full, full, full, full, block],
        out_specs=block,
        out_shape=jax.ShapeDtypeStruct((N, K, Gp, Dh), q.dtype),
        interpret=interpret,
        **kwargs,
    )(layer, table, end, key_valid.astype(jnp.int32), kp, vp, qh)
    return out[:, :, :Gq].reshape(N, 1, H, Dh)


__all__ = ["paged_attention_gpu", "paged_attention_gpu_supported"]
