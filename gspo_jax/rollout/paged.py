"""Page bookkeeping of the continuous engine: the page pool's reference counts, page tables per
slot, allocation and release, and the logical layout of a slot's keys.

Dimension legend: N decode slots, NP pages in the pool, ps page size, Lp padded prompt length,
T = max_new_tokens, Pp = ceil(Lp / ps) prompt pages, Pg generated pages per row, Pt = Pp + Pg
table entries per slot.

The pool itself (keys and values, [L, NP, ...]) and attention over it are the model's
(kernels/paged_attention.py); here is who holds which page. A page is free iff its reference
count is 0. A prompt's Pp pages are written by its prefill and counted once per sample of its
group still decoding (the shared prefix: G rows, one copy of the prompt's KV), and a generated
page is held by the one row that writes it, so a row that ends returns its generated pages and
drops one reference to its prompt's pages. Page SCRATCH_PAGE (0) is never allocated: unused
table entries point there, and slots with nothing to decode write there.

A slot's logical key slots: [0, Pp * ps) are its prompt's pages (slots [0, n) hold the n real
prompt tokens, the rest right-padding, as the static layout's [n, Lp)), and generated token t is
at logical slot Pp * ps + t, in table entry Pp + t // ps. Its position is n + t, as in
models/transformer.py's layout, so the model computes what the static engine computes.
Everything is fixed-shape JAX, run inside the engine's jitted loop.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from gspo_jax.models import SCRATCH_PAGE


def page_counts(prompt_len: int, max_new_tokens: int, page_size: int) -> tuple[int, int]:
    """(Pp prompt pages, Pg generated pages per row). A row feeds tokens 0 .. T - 2 back into the
    model (the last token is never fed), so T - 1 generated slots need keys (at least 1 page so
    shapes stay non-empty)."""
    return math.ceil(prompt_len / page_size), max(1, math.ceil((max_new_tokens - 1) / page_size))


def pages_needed(
    slots: int, prompt_len: int, max_new_tokens: int, page_size: int, resumed: int = 0
) -> int:
    """Pages the pool needs so that allocation never fails: the scratch page, Pp pages for each
    prompt that still has rows decoding (at most one per slot: the queue is group-contiguous, so
    every prompt with live references but the one being scheduled has a row in a slot, and the
    engine prefills a prompt only when a slot is free for it) and Pg pages per slot; with
    partial rollouts, Pg more for each of the `resumed` carried rows whose pages are written
    before they take a slot."""
    Pp, Pg = page_counts(prompt_len, max_new_tokens, page_size)
    return 1 + slots * (Pp + Pg) + resumed * Pg


def free_mask(refcount: jax.Array) -> jax.Array:
    """[NP] bool: pages nobody holds (the scratch page is never free)."""
    return (refcount == 0).at[SCRATCH_PAGE].set(False)


def allocate(refcount: jax.Array, count: int, refs) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Takes `count` free pages (the lowest ids) and gives each `refs` references.

    refcount [NP] int32 -> (refcount, pages [count] int32, failed: bool scalar, True when the
    pool had fewer than `count` free pages; the missing ones are SCRATCH_PAGE)."""
    pages = jnp.nonzero(free_mask(refcount), size=count, fill_value=SCRATCH_PAGE)[0]
    pages = pages.astype(jnp.int32)
    failed = jnp.any(pages == SCRATCH_PAGE)
    return refcount.at[pages].set(jnp.asarray(refs, jnp.int32)), pages, failed


def allocate_rows(refcount: jax.Array, need: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One fresh page (1 reference) for every slot with need [N] bool.

    -> (refcount, pages [N] int32: the slot's new page where need, SCRATCH_PAGE elsewhere,
    failed: bool scalar). Slots take the free pages in slot order."""
    N = need.shape[0]
    free = jnp.nonzero(free_mask(refcount), size=N, fill_value=SCRATCH_PAGE)[0]
    rank = jnp.cumsum(need) - 1  # [N]: the i-th needing slot takes the i-th free page
    pages = jnp.where(need, free[jnp.clip(rank, 0, N - 1)], SCRATCH_PAGE).astype(jnp.int32)
    failed = jnp.any(need & (pages == SCRATCH_PAGE))
    NP = refcount.shape[0]
    refcount = refcount.at[jnp.where(need, pages, NP)].set(1, mode="drop")
    return refcount, pages, failed


def release(refcount: jax.Array, page_table: jax.Array, ended: jax.Array) -> jax.Array:
    """Drops one reference to every page in the tables of the slots with ended [N] bool.

    page_table [N, Pt] int32; scratch entries are skipped. A generated page falls to 0 (free), a
    prompt page when the last sample of its group ends."""
    NP = refcount.shape[0]
    held = ended[:, None] & (page_table != SCRATCH_PAGE)
    return refcount.at[jnp.where(held, page_table, NP)].add(-1, mode="drop")


def key_valid(
    prompt_lengths: jax.Array, fed: jax.Array, prompt_pages: int, table_len: int, page_size: int
) -> jax.Array:
    """[N, Pt * ps] bool: the logical key slots a slot's query sees when it feeds generated
    token `fed` [N] (its own key included): its n [N] real prompt slots and generated slots
    0 .. fed."""
    j = jnp.arange(table_len * page_size, dtype=jnp.int32)[None, :]
    first = prompt_pages * page_size  # logical slot of generated token 0
    n, fed = prompt_lengths[:, None], fed[:, None]
    return (j < n) | ((j >= first) & (j <= first + fed))
