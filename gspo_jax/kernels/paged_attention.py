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

(the plain cache's heads-major layouts, attention.init_cache, with [NP, ..., ps] for [B, ..., S]),
and for a decode step, optionally, its shared prefixes: "prefix_table" [Q, Pp] int32 (the pages
of Q prefixes, each the first Pp table entries of the rows attending it) and "prefix_rows" [Q, G]
int32 (those rows, N where none; the engine's rollout.continuous.shared_prefixes). With them
paged_attention reads each prefix's pages once for all its rows (prefix_attention: its rows'
queries are G x Gq rows of one matmul over the prefix's Pp * ps keys, as the static engine's
shared-prefix decode reads a prompt once per group), and each row's own pages past the prefix
in the ragged items below; without them (and in the Pallas kernel, which ignores them) every
row reads its whole table. A one-token decode step passes forward this cache, write_index = [N]
int32 logical slots (one per row: rows are at different steps of their sequences) and a SlotMask
whose key_valid [N, Sk] says which logical slots each row sees (causality included: the rows'
query slots differ, so the mask does not use query_slots). layers.Attention writes the step's
key/value at each row's slot (write_paged, a scatter) and attends over the row's pages
(paged_attention). Page 0 is the engine's scratch page: table entries no row owns point there,
and rows with nothing to decode write there, so a write never lands in a page someone reads.

layers.Attention calls attend_pages, which runs the implementation ModelConfig.paged_attention
selects: paged_attention (plain JAX, every platform, the default) or the Pallas kernel of
kernels/paged_kernel.py (compiled on TPU) or kernels/paged_kernel_gpu.py (compiled on a GPU), each
runnable in interpret mode elsewhere. Each reads only the pages
that can hold a visible key: a row's keys end at kv_end = its write slot + 1, so a step costs
what the rows' own lengths cost, not Pt pages per row.

paged_attention is ragged flash-decoding in plain JAX. Its work is the list of (row, block)
items below each row's kv_end, a block being bp = block_pages table entries:
sum_r ceil(kv_end_r / (bp * ps)) items, row-major; a loop with a traced trip count takes
`chunk` items per trip, gathers their pages ([C, bp, K, Dh, ps], a copy of bp * ps keys per
item) and runs each item's own masked softmax (float32 max m_i, normaliser l_i, output o_i),
folded into its row's running one by scatter: m' = max(m, m_i), l' = l e^(m - m') +
l_i e^(m_i - m'), acc' = acc e^(m - m') + o_i e^(m_i - m'): the items' [C, K, Gq, bp * ps]
exp reads no row statistics, only the [C, K, Gq] rescaling does. Batching by rows instead (one
loop over page blocks up to the longest live row) costs every row the longest row's length,
which with long-tailed lengths is most of the table (docs/benchmarks.md).
paged_attention_reference is the whole-table softmax both are tested against. (JAX's Pallas TPU
kernels, jax.experimental.pallas.ops.tpu.paged_attention and ragged_paged_attention, expect each
row's keys contiguous in [0, length) in another layout; this layout keeps the prompt's
right-padding hole, hence our own kernel.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import chex
import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # annotations only: the model's config reads this module's names
    from gspo_jax.models.config import ModelConfig

# ModelConfig.paged_attention's values (attend_pages)
PAGED_IMPLEMENTATIONS = ("plain", "auto", "pallas", "interpret", "interpret_gpu")
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


def paged_attention(
    q: jax.Array,
    cache: dict,
    key_valid: jax.Array,
    layer,
    kv_end: jax.Array | None = None,
    block_pages: int = 1,
    chunk: int | None = None,
) -> jax.Array:
    """One decode step over layer `layer` of a paged cache, in plain JAX, reading only the pages
    below each row's kv_end (module docstring: ragged flash-decoding).

    q [N, 1, H, Dh]; key_valid [N, Pt * ps] bool (the row's visible logical slots, this step's
    own key included); kv_end [N] int32: row r sees no logical slot at or past kv_end[r] (None:
    the whole table) -> [N, 1, H, Dh] in q's dtype. block_pages: pages per work item (a row
    reads at most block_pages - 1 pages past its end). One page per item by default: an item of
    several pages gathers [C, bp, K, Dh, ps], which XLA:CPU transposes into the matmul's layout
    before every use, while one page is already [C, K, Dh, ps]; the engine sets the item's keys
    with its page size instead (docs/benchmarks.md has the sizes tried);
    chunk: items per loop trip (default N). Equals paged_attention_reference to float32 summation
    order for rows that see at least one key.

    With shared prefixes in the cache (prefix_table [Q, Pp], prefix_rows [Q, G]: module
    docstring), table entries [0, Pp) are read once per prefix for all its rows
    (prefix_attention) and the ragged items cover entries [Pp, Pt) only, starting from the
    prefix's softmax statistics.
    """
    table = cache["page_table"]  # [N, Pt]
    N, _, H, Dh = q.shape
    Pt = table.shape[1]
    K, ps = cache["k_pages"].shape[2], cache["k_pages"].shape[-1]
    Gq = H // K
    chex.assert_shape(key_valid, (N, Pt * ps))
    kv_end = jnp.full((N,), Pt * ps, jnp.int32) if kv_end is None else kv_end
    qg = q.reshape(N, K, Gq, Dh)
    stats = (
        jnp.full((N + 1, K, Gq), NEG_INF, jnp.float32),
        jnp.zeros((N + 1, K, Gq), jnp.float32),
        jnp.zeros((N + 1, K, Gq, Dh), jnp.float32),
    )
    Pp = 0
    if has_prefixes(cache):
        Pp = cache["prefix_table"].shape[1]
        stats = prefix_attention(qg, cache, key_valid[:, : Pp * ps], layer)
    m, den, acc = _ragged_pages(
        qg,
        cache,
        table[:, Pp:],
        key_valid[:, Pp * ps :],
        kv_end - Pp * ps,
        layer,
        stats,
        block_pages,
        N if chunk is None else int(chunk),
    )
    return (acc[:N] / den[:N, ..., None]).reshape(N, 1, H, Dh).astype(q.dtype)


def has_prefixes(cache: dict) -> bool:
    return "prefix_table" in cache


def prefix_attention(qg: jax.Array, cache: dict, key_valid: jax.Array, layer):
    """The softmax statistics of every row over its shared prefix (table entries [0, Pp)).

    qg [N, K, Gq, Dh]; cache's prefix_table [Q, Pp] (each prefix's pages) and prefix_rows
    [Q, G] (the rows attending each prefix, N where none); key_valid [N, Pp * ps] (which prefix
    slots each row sees) -> (m, den, acc) [N + 1, K, Gq](, Dh) float32, the running max,
    normaliser and unnormalised output of the online softmax (row N and rows of no prefix:
    m = NEG_INF, den = acc = 0). One gather of Q * Pp pages, not N * Pp, and each prefix's G
    rows' queries are G * Gq rows of one matmul per (prefix, page, kv head)."""
    pt, rows = cache["prefix_table"], cache["prefix_rows"]  # [Q, Pp], [Q, G]
    N, K, Gq, Dh = qg.shape
    (Q, Pp), G = pt.shape, rows.shape[1]
    ps, cdt = cache["k_pages"].shape[-1], qg.dtype
    M, S = G * Gq, Pp * ps
    chex.assert_shape(key_valid, (N, S))
    qpad = jnp.concatenate([qg, jnp.zeros((1, K, Gq, Dh), cdt)])  # row N: no row
    qq = qpad[rows].transpose(0, 2, 1, 3, 4).reshape(Q, K, M, Dh)  # [Q, K, G * Gq, Dh]
    valid = jnp.concatenate([key_valid, jnp.zeros((1, S), bool)])[rows]  # [Q, G, S]
    # The prefix's pages as one [Q, K, Dh, S] / [Q, K, S, Dh] operand (a copy of Q * Pp pages),
    # so that the softmax runs over S = Pp * ps keys at once, as the static engine's shared
    # prefix does: a [Q, Pp, K, ..] page axis made the matmuls ps keys wide and the exp's
    # elementwise loop about 6x slower per element on XLA:CPU (docs/benchmarks.md).
    k = cache["k_pages"][layer, pt].astype(cdt).transpose(0, 2, 3, 1, 4).reshape(Q, K, Dh, S)
    v = cache["v_pages"][layer, pt].astype(cdt).transpose(0, 2, 1, 3, 4).reshape(Q, K, S, Dh)
    s = jnp.einsum("qkmd,qkds->qkms", qq, k, preferred_element_type=jnp.float32)
    s = jnp.where(valid[:, None, :, None, :], s.reshape(Q, K, G, Gq, S) * Dh**-0.5, NEG_INF)
    m = jnp.max(s, axis=-1)  # [Q, K, G, Gq]
    e = jnp.exp(s - m[..., None])  # [Q, K, G, Gq, S]
    den = jnp.sum(e, axis=-1)  # [Q, K, G, Gq]
    pv = jnp.einsum(
        "qkms,qksd->qkmd", e.astype(cdt).reshape(Q, K, M, S), v, preferred_element_type=jnp.float32
    ).reshape(Q, K, G, Gq, Dh)
    to_rows = rows.reshape(-1)  # [Q * G]; N (no row) lands in the padding row

    def scatter(x, fill):  # [Q, K, G, Gq, ...] -> [N + 1, K, Gq, ...] by row
        x = jnp.moveaxis(x, 2, 1).reshape(Q * G, *x.shape[1:2], *x.shape[3:])
        out = jnp.full((N + 1, *x.shape[1:]), fill, jnp.float32)
        return out.at[to_rows].set(x)

    return scatter(m, NEG_INF), scatter(den, 0.0), scatter(pv, 0.0)


def _ragged_pages(qg, cache, table, key_valid, kv_end, layer, stats, block_pages, C):
    """The ragged items' loop (module docstring) over table [N, Pt'] (its entries the first
    Pt' * ps logical slots of key_valid [N, Pt' * ps] and kv_end [N]), folded into stats
    (m, den, acc) [N + 1, K, Gq](, Dh) -> the folded stats.

    The items' rows, pages and masks are listed once, before the trips (they do not depend on
    the layer: XLA hoists them out of the layer scan), so a trip only slices its part of the
    list. The items, rounded up to m whole C-wide pieces, run as m // 4 trips 4 C wide, then
    at most one 2 C wide and one C wide (trip_widths): a long step runs a quarter of the trips
    (fewer, larger ops), a short one at most two, and the last trip pads at most C - 1 items,
    as C-wide trips alone would."""
    N, K, Gq, Dh = qg.shape
    Pt = table.shape[1]
    ps, cdt = cache["k_pages"].shape[-1], qg.dtype
    bp = max(1, min(int(block_pages), Pt))
    nb = -(-Pt // bp)
    pad = nb * bp - Pt
    table = jnp.pad(table, ((0, 0), (0, pad)), constant_values=SCRATCH_PAGE).reshape(N, nb, bp)
    key_valid = jnp.pad(key_valid, ((0, 0), (0, pad * ps))).reshape(N, nb, bp * ps)
    per_row = jnp.clip((kv_end + bp * ps - 1) // (bp * ps), 1, nb).astype(jnp.int32)  # [N]
    first = jnp.cumsum(per_row) - per_row  # [N]: each row's first item
    total = jnp.sum(per_row)
    wide = 4 * C
    # The list of items: N * nb at most, padded by a wide trip's worth (padding items: row N).
    n_items = N * nb + wide
    item = jnp.arange(n_items, dtype=jnp.int32)
    row = jnp.repeat(jnp.arange(N, dtype=jnp.int32), per_row, total_repeat_length=n_items)
    row = jnp.where(item < total, row, N)  # [n_items]
    rr = jnp.minimum(row, N - 1)
    blk = jnp.clip(item - first[rr], 0, nb - 1)
    pages = table[rr, blk]  # [n_items, bp]
    # Row N (the padding items' row) sees nothing.
    valid = jnp.concatenate([key_valid, jnp.zeros((1, nb, bp * ps), bool)])[row, blk]

    def trip(start, width, carry):
        m, den, acc = carry  # [N + 1, K, Gq](, Dh): row N collects the padding items
        take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, width)  # noqa: E731
        r, p, ok = take(row), take(pages), take(valid)  # [w], [w, bp], [w, bp * ps]
        # One gather each, the layer index part of it (a slice of the layer first would copy
        # the layer's whole pool).
        k = cache["k_pages"][layer, p].astype(cdt)  # [w, bp, K, Dh, ps]
        v = cache["v_pages"][layer, p].astype(cdt)  # [w, bp, K, ps, Dh]
        q = qg[jnp.minimum(r, N - 1)]
        s = jnp.einsum("ckgd,cpkdx->ckgpx", q, k, preferred_element_type=jnp.float32)
        s = jnp.where(ok[:, None, None, :], s.reshape(width, K, Gq, bp * ps) * Dh**-0.5, NEG_INF)
        # The item's own softmax (max m_i, normaliser l_i, output pv), then folded into its
        # row's: the [w, K, Gq, bp * ps] exp reads no row statistics.
        m_i = jnp.max(s, axis=-1)  # [w, K, Gq]
        e = jnp.exp(s - m_i[..., None])
        pv = jnp.einsum(
            "ckgpx,cpkxd->ckgd",
            e.astype(cdt).reshape(width, K, Gq, bp, ps),
            v,
            preferred_element_type=jnp.float32,
        )
        m_new = m.at[r].max(m_i)
        corr = jnp.exp(m - m_new)  # [N + 1, K, Gq]: the rows' old statistics rescaled
        w = jnp.exp(m_i - m_new[r])  # [w, K, Gq]: the items' rescaled
        den = (den * corr).at[r].add(jnp.sum(e, axis=-1) * w)
        acc = (acc * corr[..., None]).at[r].add(pv * w[..., None])
        return m_new, den, acc

    done = 0
    for width, trips in zip((wide, 2 * C, C), trip_widths(total, C), strict=True):
        stats = jax.lax.fori_loop(
            0, trips, lambda c, x, w=width, d=done: trip(d + c * w, w, x), stats
        )
        done = done + trips * width
    return stats


def trip_widths(items, C: int):
    """(trips 4 C wide, 2 C wide, C wide) that cover `items` items (an int or a traced int32)
    in the fewest trips whose padding stays under C: the items rounded up to m C-wide pieces,
    m // 4 wide trips, then the remainder (0-3 pieces) as at most one 2 C and one C trip."""
    m = (items + C - 1) // C
    return m // 4, (m % 4) // 2, m % 2


def attend_pages(
    q: jax.Array, cache: dict, key_valid: jax.Array, layer, kv_end: jax.Array, implementation: str
) -> jax.Array:
    """One decode step over the pages with the selected implementation (PAGED_IMPLEMENTATIONS,
    ModelConfig.paged_attention): "plain" paged_attention (every platform); "pallas" this
    backend's Pallas kernel, compiled (kernels/paged_kernel.py on a TPU, kernels/paged_kernel_gpu.py
    on a GPU); "interpret" / "interpret_gpu" the TPU / GPU kernel in Pallas interpret mode (any
    platform, slow: tests); "auto" the kernel where one compiles, else plain. Arguments as
    paged_attention's."""
    # Pallas imported only when a kernel is asked for.
    from gspo_jax.kernels import paged_kernel, paged_kernel_gpu

    # (capability check, kernel): the first whose check passes is this backend's compiled kernel
    kernels = (
        (paged_kernel.paged_attention_kernel_supported, paged_kernel.paged_attention_kernel),
        (paged_kernel_gpu.paged_attention_gpu_supported, paged_kernel_gpu.paged_attention_gpu),
    )
    compiled = next((kernel for supported, kernel in kernels if supported()), None)
    if implementation == "auto":
        implementation = "pallas" if compiled else "plain"
    if implementation == "plain":
        return paged_attention(q, cache, key_valid, layer, kv_end)
    if implementation == "pallas" and compiled is None:
        raise ValueError(
            f"model.paged_attention='pallas' needs a TPU or a GPU (this backend is "
            f"{jax.default_backend()}); use 'plain' or 'auto' (the kernel where it runs)."
        )
    if implementation not in PAGED_IMPLEMENTATIONS:
        raise ValueError(
            f"paged_attention={implementation!r} is not one of {PAGED_IMPLEMENTATIONS}."
        )
    if implementation == "pallas":
        return compiled(q, cache, key_valid, layer, kv_end)
    # interpret mode, on any platform: the TPU kernel ("interpret") or the GPU one
    kernel = kernels[0 if implementation == "interpret" else 1][1]
    return kernel(q, cache, key_valid, layer, kv_end, interpret=True)


def paged_attention_reference(q: jax.Array, cache: dict, key_valid: jax.Array, layer) -> jax.Array:
    """paged_attention's reference: gathers each row's whole page table ([N, Pt, K, Dh, ps])
    and runs the masked softmax of attention.reference_attention over it (float32 scores).
    Same arguments; reads all Pt pages of every row whatever it sees."""
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
    "attend_pages",
    "has_prefixes",
    "SCRATCH_PAGE",
    "init_paged_cache",
    "is_paged",
    "paged_attention",
    "paged_attention_reference",
    "paged_cache_bytes",
    "write_paged",
    "write_prompt_pages",
]
