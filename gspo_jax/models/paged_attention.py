"""The paged KV cache the continuous rollout engine decodes with, and attention over its pages.

Dimension legend: L layers, NP pages in the pool, ps page size (slots per page), K kv heads,
Dh head dim, H query heads, Gq = H // K, N decode rows (the engine's slots), Pt pages per row's
table, Sk = Pt * ps logical key slots of a row.

A paged cache is a pool of fixed-size pages and, per decode row, a page table: row r's logical
key slot j lives in page page_table[r, j // ps] at offset j % ps. Rows that share a prompt point
their first table entries at the same prompt pages, so a prompt's KV is held once however many
of its samples are decoding; which pages are free, and who holds them, is the engine's business
(gspo_jax/rollout/paged.py). The model only needs the cache's three arrays:

    {"k_pages": [L, NP, K, Dh, ps], "v_pages": [L, NP, K, ps, Dh], "page_table": [N, Pt] int32}

(the plain cache's heads-major layouts, attention.init_cache, with [NP, ..., ps] for [B, ..., S]).
A one-token decode step passes forward this cache, write_index = [N] int32 logical slots (one per
row: rows are at different steps of their sequences) and a SlotMask whose key_valid [N, Sk] says
which logical slots each row sees (causality included: the rows' query slots differ, so the mask
does not use query_slots). layers.Attention writes the step's key/value at each row's slot
(write_paged, a scatter) and attends over the row's pages (paged_attention). Page 0 is the
engine's scratch page: table entries no row owns point there, and rows with nothing to decode
write there, so a write never lands in a page someone reads.

paged_attention is plain JAX: it gathers each row's Pt pages ([N, Pt, K, Dh, ps]) and runs one
masked softmax over them, which is what every platform can run. (The Pallas TPU kernel
jax.experimental.pallas.ops.tpu.paged_attention expects each row's keys to be the contiguous
slots [0, length); this layout keeps the prompt's right-padding hole, so it is not wired.)
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from gspo_jax.models.config import ModelConfig

NEG_INF = -1e30  # as attention.NEG_INF: a row with every key masked averages, never NaN
SCRATCH_PAGE = 0  # the page unowned table entries point at (module docstring)


def init_paged_cache(cfg: ModelConfig, num_pages: int, page_size: int, page_table) -> dict:
    """A zeroed page pool of num_pages pages of page_size slots for every layer, in the compute
    dtype, with page_table [N, Pt] int32 (module docstring for the layout)."""
    L, K, Dh, dt = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.compute_dtype
    return {
        "k_pages": jnp.zeros((L, num_pages, K, Dh, page_size), dt),
        "v_pages": jnp.zeros((L, num_pages, K, page_size, Dh), dt),
        "page_table": jnp.asarray(page_table, jnp.int32),
    }


def paged_cache_bytes(cfg: ModelConfig, num_pages: int, page_size: int) -> int:
    """Bytes of init_paged_cache's page pool (keys and values, every layer; the page table is
    negligible): what the memory plan charges for the continuous engine's cache."""
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim
    return num_pages * page_size * per_slot * jnp.dtype(cfg.compute_dtype).itemsize


def is_paged(cache) -> bool:
    return isinstance(cache, dict) and "page_table" in cache


def write_prompt_pages(cache: dict, prefix: dict, pages: jax.Array) -> dict:
    """The paged cache with one prompt's prefill cache copied into `pages`.

    prefix: init_cache's plain cache of one row, {"k": [L, 1, K, Dh, Lp], "v": [L, 1, K, Lp, Dh]};
    pages [Pp] int32 with Pp * ps >= Lp: logical slots [0, Lp) of every row pointing at them.
    """
    kp, vp = prefix["k"][:, 0], prefix["v"][:, 0]  # [L, K, Dh, Lp], [L, K, Lp, Dh]
    L, K, Dh, Lp = kp.shape
    ps = cache["k_pages"].shape[-1]
    Pp = pages.shape[0]
    if Pp * ps < Lp:
        raise ValueError(f"{Pp} pages of {ps} slots cannot hold a {Lp}-slot prompt.")
    pad = Pp * ps - Lp
    kp = jnp.pad(kp, ((0, 0), (0, 0), (0, 0), (0, pad))).reshape(L, K, Dh, Pp, ps)
    vp = jnp.pad(vp, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(L, K, Pp, ps, Dh)
    out = dict(cache)
    kd, vd = cache["k_pages"].dtype, cache["v_pages"].dtype
    out["k_pages"] = cache["k_pages"].at[:, pages].set(kp.transpose(0, 3, 1, 2, 4).astype(kd))
    out["v_pages"] = cache["v_pages"].at[:, pages].set(vp.transpose(0, 2, 1, 3, 4).astype(vd))
    return out


def write_paged(cache: dict, kT: jax.Array, v: jax.Array, slots: jax.Array, layer) -> dict:
    """The paged cache with layer `layer`'s one-token kT [N, K, Dh, 1] / v [N, K, 1, Dh] written
    at each row's logical slot slots [N]: page page_table[r, slot // ps], offset slot % ps.

    A scatter (rows write different pages and offsets); the engine keeps every row's target page
    its own or the scratch page, so no two live rows write the same place.
    """
    table = cache["page_table"]
    ps = cache["k_pages"].shape[-1]
    N = table.shape[0]
    slots = slots.astype(jnp.int32)
    page = jnp.take_along_axis(table, (slots // ps)[:, None], axis=1)[:, 0]  # [N]
    off = slots % ps
    out = dict(cache)
    kd, vd = cache["k_pages"].dtype, cache["v_pages"].dtype
    out["k_pages"] = cache["k_pages"].at[layer, page, :, :, off].set(kT[..., 0].astype(kd))
    out["v_pages"] = cache["v_pages"].at[layer, page, :, off, :].set(v[:, :, 0].astype(vd))
    chex.assert_shape(kT, (N, None, None, 1))
    return out


def paged_attention(q: jax.Array, cache: dict, key_valid: jax.Array, layer) -> jax.Array:
    """One decode step over layer `layer` of a paged cache, in plain JAX.

    q [N, 1, H, Dh]; key_valid [N, Pt * ps] bool (the row's visible logical slots, this step's
    own key included) -> [N, 1, H, Dh] in q's dtype. Gathers each row's pages and runs the
    masked softmax of attention.reference_attention over them (float32 scores).
    """
    table = cache["page_table"]  # [N, Pt]
    N, _, H, Dh = q.shape
    Pt = table.shape[1]
    K, ps = cache["k_pages"].shape[2], cache["k_pages"].shape[-1]
    Gq, cdt = H // K, q.dtype
    chex.assert_shape(key_valid, (N, Pt * ps))
    k = cache["k_pages"][layer, table].astype(cdt)  # [N, Pt, K, Dh, ps]
    v = cache["v_pages"][layer, table].astype(cdt)  # [N, Pt, K, ps, Dh]
    qg = q.reshape(N, K, Gq, Dh)
    s = jnp.einsum("nkgd,npkdc->nkgpc", qg, k, preferred_element_type=jnp.float32)
    s = s.reshape(N, K, Gq, Pt * ps) * (Dh**-0.5)
    s = jnp.where(key_valid[:, None, None, :], s, NEG_INF)
    p = jax.nn.softmax(s, axis=-1).astype(cdt).reshape(N, K, Gq, Pt, ps)
    out = jnp.einsum("nkgpc,npkcd->nkgd", p, v)
    return out.reshape(N, 1, H, Dh).astype(cdt)


__all__ = [
    "SCRATCH_PAGE",
    "init_paged_cache",
    "is_paged",
    "paged_attention",
    "paged_cache_bytes",
    "write_paged",
    "write_prompt_pages",
]
