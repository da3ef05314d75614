"""The continuous multi-turn engine (multi_turn.generate_episodes(..., engine="continuous")): N
decode slots over a paged KV cache; a row whose turn ends leaves its slot while its tools run,
its KV kept in its pages, and other rows decode meanwhile.

Dimension legend: P problems, G episodes per problem, B = P * G rows, N slots, Lp padded
first-prompt length, T = max_new_tokens (the response region), ps page size, Pp = ceil(Lp / ps)
prompt pages, Pg = ceil((T - 1) / ps) generated pages per row, Pt = Pp + Pg table entries, C
decode steps per chunk, Cp observation tokens per prefill call, NP pages in the pool, V vocab.

A row's layout is the single-turn continuous engine's (rollout/paged.py): logical key slots
[0, Pp * ps) are its problem's prompt pages (prefilled once per problem, shared by its G rows,
reference-counted), and response-region token t (the policy's or the environment's) sits at
logical slot Pp * ps + t, position n + t: the layout of the trainer's prompt + response pass.

The host loop (play_continuous), until every episode has ended:
1. Rows whose tool jobs finished are answered (Episode.finish). The observation's tokens are
   prefilled into the row's pages: one [1, Cp] forward per Cp tokens of only the new tokens
   (the eos that ended the turn and the observation but its last token, which the next decode
   step feeds), attending to the row's kept KV (its pages gathered into one row's plain cache
   and the new slots written back: _prefill_tokens). No context is prefilled again. The row
   is then ready for a slot. A row whose episode ended returns all its pages.
2. Free slots take ready rows; when there are more free slots than ready rows, the next
   problem's prompt is prefilled and its G rows sample their first token from its logits.
3. A jitted chunk of up to C decode steps of the rows in slots (one token per row, rows at
   their own positions, the pages' attention of kernels/paged_attention.py), N wide, or with
   fewer live rows the narrowest of N / 2, N / 4, ... that holds them (the single-turn
   engine's drain widths: slot-steps follow the rows decoding). A slot whose row
   samples eos or reaches its turn's room frees; the chunk stops early once a slot is free while
   a ready row waits. The host then hands each ended turn to its episode (Episode.begin) and its
   tool jobs to the executor, and the row holds no slot until they answer; pages past its KV
   go back to the pool.

Rows waiting on tools hold no slot, so with enough rows the slots keep decoding live rows
while the tools run (the figures: run_episodes's occupancy; experiments/benchmarks/
multi_turn_occupancy.py). Randomness as the static engine's (rollout/reprefill.py): row b's
token at position t draws uniform(fold_in(rng, t), (B,))[b], so the tokens do not depend on the
schedule, the tools' timing or the slots; log-probs agree to float32 summation order.
"""

from __future__ import annotations

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gspo_jax.errors import ConfigError
from gspo_jax.models import SCRATCH_PAGE, init_paged_cache, slot_mask, write_prompt_pages
from gspo_jax.rollout import paged
from gspo_jax.rollout.continuous_step import drain_width_for
from gspo_jax.rollout.episodes import Rows
from gspo_jax.rollout.sampling import row_uniforms, sample_with_uniform
from gspo_jax.rollout.static import prefill


def _prefill_prompt(graphdef, params, pool, prompt, n, pages, rows, rng, *, B: int, settings):
    """Problem p's prompt [1, Lp] (n [1] real tokens) into its pages [Pp]; its G rows [G] sample
    their first token (position 0) -> (pool, tok [G], logp [G], sample_logp [G])."""
    model = nnx.merge(graphdef, params)
    G = rows.shape[0]
    logits, cache, _ = prefill(
        model, prompt, n, num_samples=1, cache_len=prompt.shape[1], decode="repeated"
    )
    pool = write_prompt_pages(pool, cache, pages)
    u = row_uniforms(rng, jnp.zeros((G,), jnp.int32), rows, B)
    tok, lp, slp = sample_with_uniform(jnp.repeat(logits, G, 0), u, **dict(settings))
    return pool, tok, lp, slp


def _prefill_tokens(graphdef, params, pool, table_row, n, start, toks, count, *, Pp: int):
    """Response tokens toks[:count] (toks [Cp]) at positions start .. start + count - 1 of one
    row (table_row [Pt], n its prompt length) into its pages, attending to its KV of tokens
    before them: the row's pages gathered into a plain [1, Pt * ps + Cp] cache, one forward,
    the generated pages written back (the prompt pages, shared, are left alone)."""
    model = nnx.merge(graphdef, params)
    L, _, K, Dh, ps = pool["k_pages"].shape
    Pt, Cp = table_row.shape[0], toks.shape[0]
    Sk = Pt * ps
    k = pool["k_pages"][:, table_row].transpose(0, 2, 3, 1, 4).reshape(L, 1, K, Dh, Sk)
    v = pool["v_pages"][:, table_row].transpose(0, 2, 1, 3, 4).reshape(L, 1, K, Sk, Dh)
    cache = {  # Cp slots of room past the table, so the write never shifts back
        "k": jnp.pad(k, ((0, 0),) * 4 + ((0, Cp),)),
        "v": jnp.pad(v, ((0, 0),) * 3 + ((0, Cp), (0, 0))),
    }
    w = Pp * ps + start  # logical slot of toks[0]
    j = jnp.arange(Sk + Cp, dtype=jnp.int32)
    i = jnp.arange(Cp, dtype=jnp.int32)
    valid = (j < n) | ((j >= Pp * ps) & (j < w + count))  # [Sk + Cp]
    out = model.forward(
        toks[None],
        (n + start + i)[None],
        slot_mask(valid[None], w + i),
        token_mask=(i < count)[None],
        cache=cache,
        write_index=w,
    )
    k2 = out["cache"]["k"][:, 0, ..., :Sk].reshape(L, K, Dh, Pt, ps).transpose(0, 3, 1, 2, 4)
    v2 = out["cache"]["v"][:, 0, :, :Sk].reshape(L, K, Pt, ps, Dh).transpose(0, 2, 1, 3, 4)
    gen = table_row[Pp:]  # unallocated entries are the scratch page: nobody reads it
    return dict(
        pool,
        k_pages=pool["k_pages"].at[:, gen].set(k2[:, Pp:]),
        v_pages=pool["v_pages"].at[:, gen].set(v2[:, Pp:]),
    )


def _decode_chunk(
    graphdef,
    params,
    pool,
    table,
    row,
    t,
    end,
    prev,
    n,
    active,
    backlog,
    rng,
    eos_id,
    *,
    B,
    C,
    Pp,
    settings,
):
    """Up to C decode steps of the N slots: slot s (row [N], next position t [N], turn end [N]
    exclusive, prev [N] the token it feeds, n [N] prompt lengths, active [N]) feeds prev at
    position n + t - 1 and samples token t. Stops after C steps, when no slot is active, or
    when a slot is free while backlog (ready rows without a slot) > 0. Returns (pool, tokens
    [N, C], logp, sample_logp, live [N, C] bool (the slot sampled at that step), steps, t,
    active, prev)."""
    model = nnx.merge(graphdef, params)
    N, Pt = table.shape
    ps = pool["k_pages"].shape[-1]
    settings = dict(settings)
    zeros = jnp.zeros((N, C), jnp.float32)

    def body(c):
        i, pool, t, active, prev, toks, lps, slps, live = c
        fed = t - 1  # response index of the token fed (sampled at t - 1)
        valid = paged.key_valid(n, fed, Pp, Pt, ps)  # [N, Pt * ps]
        o = model.forward(
            prev[:, None],
            (n + fed)[:, None],
            slot_mask(valid, jnp.full((1,), Pt * ps - 1, jnp.int32)),
            cache=dict(pool, page_table=jnp.where(active[:, None], table, SCRATCH_PAGE)),
            write_index=Pp * ps + fed,
        )
        u = row_uniforms(rng, t, row, B)
        tok, lp, slp = sample_with_uniform(model.logits(o["hidden"][:, 0]), u, **settings)
        put = lambda buf, v: buf.at[:, i].set(jnp.where(active, v, 0))  # noqa: E731
        ended = active & ((tok == eos_id) | (t + 1 >= end))
        return (
            i + 1,
            {"k_pages": o["cache"]["k_pages"], "v_pages": o["cache"]["v_pages"]},
            jnp.where(active, t + 1, t),
            active & ~ended,
            jnp.where(active, tok, prev),
            put(toks, tok),
            put(lps, lp),
            put(slps, slp),
            live.at[:, i].set(active),
        )

    def cond(c):
        i, active = c[0], c[3]
        waiting = (jnp.sum(active) < N) & (backlog > 0)
        return (i < C) & jnp.any(active) & ~waiting

    init = (jnp.zeros((), jnp.int32), pool, t, active, prev)
    init += (jnp.zeros((N, C), jnp.int32), zeros, zeros, jnp.zeros((N, C), bool))
    i, pool, t, active, prev, toks, lps, slps, live = jax.lax.while_loop(cond, body, init)
    return pool, toks, lps, slps, live, i, t, active, prev


_prefill_prompt_jit = jax.jit(_prefill_prompt, static_argnames=("graphdef", "B", "settings"))
_prefill_tokens_jit = jax.jit(_prefill_tokens, static_argnames=("graphdef", "Pp"))
_decode_chunk_jit = jax.jit(_decode_chunk, static_argnames=("graphdef", "B", "C", "Pp", "settings"))


class _Pages:
    """The pool's reference counts, on the host: a page is free at count 0 (never the scratch
    page); take() gives the lowest free ids."""

    def __init__(self, num_pages: int):
        self.refs = np.zeros((num_pages,), np.int64)
        self.peak = 0

    def take(self, count: int, refs: int = 1) -> np.ndarray:
        free = np.flatnonzero(self.refs == 0)
        free = free[free != SCRATCH_PAGE][:count]
        if len(free) < count:
            raise ConfigError(
                f"the page pool ran out ({len(self.refs)} pages); raise num_pages (default: "
                "every row's whole table)."
            )
        self.refs[free] = refs
        self.peak = max(self.peak, int(np.sum(self.refs > 0)))
        return free.astype(np.int32)

    def drop(self, pages) -> None:
        pages = np.asarray(pages)
        pages = pages[pages != SCRATCH_PAGE]
        np.subtract.at(self.refs, pages, 1)


def play_continuous(
    model,
    rows: Rows,
    rng,
    *,
    eos_id: int,
    executor,
    settings: dict,
    slots: int | None = None,
    page_size: int = 16,
    chunk: int = 8,
    prefill_chunk: int = 16,
    num_pages: int | None = None,
    shrink: int = 3,
) -> dict:
    """Plays every row's episode to its end (module docstring). slots: decode slots N (default
    B); page_size: KV slots per page; chunk: decode steps per jitted call (C); prefill_chunk:
    observation tokens per prefill call (Cp); num_pages: the pool (default 1 + P * Pp + B * Pg,
    every row's whole table); shrink: with fewer live rows than slots a chunk decodes N / 2,
    N / 4, ... N / 2^shrink slots, the narrowest that holds them (0: always N). Returns the
    figures: decode_steps, slot_steps (the chunks' widths summed over their steps),
    live_slot_steps (slots sampling a row's token), prefills (observation prefill calls),
    peak_pages, pages_held (pages still referenced at the end: 0)."""
    B, T, G = rows.B, rows.T, rows.G
    P, Lp = rows.prompts.shape
    N = B if slots is None else min(int(slots), B)
    ps, C, Cp = int(page_size), int(chunk), int(prefill_chunk)
    if min(N, ps, C, Cp) < 1:
        raise ConfigError(
            f"slots={slots}, page_size={page_size}, chunk={chunk} and prefill_chunk="
            f"{prefill_chunk} must all be >= 1."
        )
    Pp, Pg = paged.page_counts(Lp, T, ps)
    Pt = Pp + Pg
    pages = _Pages(1 + P * Pp + B * Pg if num_pages is None else int(num_pages))
    pool = init_paged_cache(model.cfg, len(pages.refs), ps, np.zeros((1, Pt), np.int32))
    pool = {"k_pages": pool["k_pages"], "v_pages": pool["v_pages"]}
    graphdef, params = nnx.split(model)
    key = tuple(sorted(settings.items()))
    eos = jnp.asarray(eos_id, jnp.int32)

    table = np.full((B, Pt), SCRATCH_PAGE, np.int32)  # each row's page table
    kv = np.zeros((B,), np.int64)  # tokens of the row's region whose KV is in its pages
    turn: dict[int, tuple] = {}  # row -> (tokens, logp, sample_logp) of its turn so far
    slot: dict[int, list] = {}  # decoding row -> [t, end, prev]: at most N of them
    ready: collections.deque[int] = collections.deque()  # rows waiting for a slot
    stats = dict(decode_steps=0, slot_steps=0, live_slot_steps=0, prefills=0)

    def cover(b: int, last: int) -> None:
        """Row b's table holds pages for its response slots 0 .. last."""
        for e in range(Pp, Pp + last // ps + 1 if last >= 0 else Pp):
            if table[b, e] == SCRATCH_PAGE:
                table[b, e] = pages.take(1)[0]

    def end_turn(b: int) -> None:
        ids, lp, slp = turn.pop(b)
        rows.turn_ended(b, np.asarray(ids), np.asarray(lp), np.asarray(slp), executor)
        keep = Pp + math.ceil(kv[b] / ps)  # pages past the row's KV go back while it waits
        pages.drop(table[b, keep:])
        table[b, keep:] = SCRATCH_PAGE

    def end_episode(b: int) -> None:
        pages.drop(table[b])
        table[b] = SCRATCH_PAGE

    def start_turn(b: int, first=None) -> None:
        """Row b ready to decode from its region's end; first: its token 0 (token, logp,
        sample_logp), sampled from its prompt's prefill."""
        t0, room = int(rows.length[b]), rows.room(b)
        turn[b] = ([], [], []) if first is None else tuple([x] for x in first)
        if first is not None and (first[0] == eos_id or room <= 1):
            end_turn(b)  # a one-token turn: no slot
            return
        cover(b, t0 + room - 2)  # the turn feeds tokens up to t0 + room - 2
        prev = first[0] if first is not None else rows.tokens[b, t0 - 1]
        starts[b] = [t0 + (first is not None), t0 + room, prev]  # slot's t, end, prev
        ready.append(b)

    starts: dict[int, tuple] = {}

    def admit_observation(b: int) -> None:
        """The row's new tokens (kv .. t_new - 2) prefilled into its pages; it is ready."""
        nonlocal pool
        t_new, n = int(rows.length[b]), int(rows.prompt_lengths[b // G])
        cover(b, t_new - 2)
        for s in range(int(kv[b]), t_new - 1, Cp):
            count = min(Cp, t_new - 1 - s)
            toks = np.zeros((Cp,), np.int32)
            toks[:count] = rows.tokens[b, s : s + count]
            pool = _prefill_tokens_jit(
                graphdef,
                params,
                pool,
                jnp.asarray(table[b]),
                n,
                s,
                jnp.asarray(toks),
                count,
                Pp=Pp,
            )
            stats["prefills"] += 1
        kv[b] = t_new - 1
        start_turn(b)

    def open_problem(p: int) -> None:
        """Problem p's prompt prefilled into fresh pages (one reference per row of its group);
        its G rows sample their first tokens."""
        nonlocal pool
        pp = pages.take(Pp, refs=G)
        table[p * G : (p + 1) * G, :Pp] = pp
        pool, tok, lp, slp = _prefill_prompt_jit(
            graphdef,
            params,
            pool,
            jnp.asarray(rows.prompts[p : p + 1]),
            jnp.asarray(rows.prompt_lengths[p : p + 1]),
            jnp.asarray(pp),
            jnp.arange(p * G, (p + 1) * G, dtype=jnp.int32),
            rng,
            B=B,
            settings=key,
        )
        firsts = zip(np.asarray(tok), np.asarray(lp), np.asarray(slp), strict=True)
        for g, first in enumerate(firsts):
            start_turn(p * G + g, first)

    next_problem = 0
    while not rows.done.all():
        idle = not ready and not slot and next_problem >= P
        waiting = set(rows.waiting)
        for b in rows.ready_rows(block=idle):  # nothing to decode: wait for a tool
            admit_observation(b)
        for b in waiting - set(rows.waiting):
            if rows.done[b]:
                end_episode(b)
        while N - len(slot) > len(ready) and next_problem < P:
            open_problem(next_problem)
            next_problem += 1
        while ready and len(slot) < N:
            b = ready.popleft()
            slot[b] = starts.pop(b)
        if not slot:
            continue
        # The chunk decodes the live rows in the narrowest width that holds them (the
        # single-turn engine's drain widths), so slot-steps follow the rows decoding.
        w = drain_width_for(N, shrink, len(slot))
        r = np.zeros((w,), np.int64)
        r[: len(slot)] = list(slot)
        state = np.zeros((3, w), np.int32)  # t, end, prev per slot
        state[:, : len(slot)] = np.array(list(slot.values()), np.int32).T
        active = np.arange(w) < len(slot)
        pool, toks, lps, slps, live, steps, t, act, prev = _decode_chunk_jit(
            graphdef,
            params,
            pool,
            jnp.asarray(table[r]),
            jnp.asarray(r, jnp.int32),
            *map(jnp.asarray, state),
            jnp.asarray(rows.prompt_lengths[r // G]),
            jnp.asarray(active),
            len(ready),
            rng,
            eos,
            B=B,
            C=C,
            Pp=Pp,
            settings=key,
        )
        toks, lps, slps, live, act = map(np.asarray, (toks, lps, slps, live, act))
        t, prev = np.asarray(t), np.asarray(prev)
        stats["decode_steps"] += int(steps)
        stats["slot_steps"] += w * int(steps)
        stats["live_slot_steps"] += int(live.sum())
        for s, b in enumerate(r[: len(slot)]):
            for buf, x in zip(turn[b], (toks, lps, slps), strict=True):
                buf.extend(x[s][live[s]])
            slot[b][0], slot[b][2] = int(t[s]), int(prev[s])
            if not act[s]:  # the turn ended: KV for tokens 0 .. t - 2 is in the pages
                kv[b] = t[s] - 1
                del slot[b]
                end_turn(b)
    stats["peak_pages"] = pages.peak
    stats["pages_held"] = int(np.sum(pages.refs > 0))
    return stats
