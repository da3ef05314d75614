"""The continuous engine's loop state and the parts of one trip of its loop: refill (with the
prompt prefills it runs), the decode step of the slots, and the drain's narrowed steps.
rollout/continuous.py runs them (its docstring says how the engine works and why) and
re-exports the public names.

Dimension legend: continuous.py's (P prompts, G samples per prompt, B = P * G rows, N slots,
Lp, T, ps, Pp / Pg / Pt page-table entries, NP pages, L layers, k experts per token).
"""

from __future__ import annotations

import chex
import flax.struct
import jax
import jax.numpy as jnp

from gspo_jax.models import (
    SCRATCH_PAGE,
    init_paged_cache,
    sequence_layout,
    slot_mask,
    write_prompt_pages,
)
from gspo_jax.rollout import paged
from gspo_jax.rollout.output import PartialRows
from gspo_jax.rollout.sampling import row_uniforms, sample_with_uniform


@flax.struct.dataclass
class EngineState:
    """The engine's loop state; every field fixed-shape."""

    next_row: jax.Array  # scalar int32: the queue's head, the next row to schedule
    slot_row: jax.Array  # [N] int32: the row in each slot (B when the slot is free)
    slot_t: jax.Array  # [N] int32: index of the next token the slot's row samples
    active: jax.Array  # [N] bool: the slot holds a row that has not ended
    refcount: jax.Array  # [NP] int32: references to each page (paged.py)
    prompt_pages: jax.Array  # [P, Pp] int32: each prefilled prompt's pages
    cache: dict  # models.init_paged_cache: k_pages, v_pages [L, NP, ...], page_table [N, Pt]
    tokens: jax.Array  # [B, T] int32
    mask: jax.Array  # [B, T] f32
    logp: jax.Array  # [B, T] f32
    sample_logp: jax.Array  # [B, T] f32
    routes: jax.Array | None  # [L, B, Lp + T, k] int32 when routes are requested
    decode_steps: jax.Array  # scalar int32: decode steps run
    decoded_slots: jax.Array  # scalar int32: slot-steps decoded (the steps' widths summed)
    failed: jax.Array  # scalar bool: an allocation found no free page (never, by pages_needed)
    versions: jax.Array  # [B, T] int32: the policy version that sampled each token
    forced: jax.Array  # [B] int32: tokens a carried row already has (kept, not sampled again)
    ended: jax.Array  # [B] bool: the row ended (EOS, its limit, or it never takes a slot)
    row_pages: jax.Array  # [B, Pg] int32: a carried row's generated pages (resume_carried)

    def finished(self) -> jax.Array:
        return (self.next_row >= self.tokens.shape[0]) & ~jnp.any(self.active)

    def complete_groups(self, G: int) -> jax.Array:
        """Scalar int32: groups whose G rows have all ended."""
        return jnp.sum(jnp.all(self.ended.reshape(-1, G), axis=1)).astype(jnp.int32)

    def stopped(self, cfg: dict) -> jax.Array:
        """Every row ended, or (partial rollouts) cfg["complete_groups"] groups are complete."""
        target = cfg["complete_groups"]
        if target is None:
            return self.finished()
        return self.finished() | (self.complete_groups(cfg["G"]) >= target)


@flax.struct.dataclass
class _Inputs:
    """The traced inputs every part of the loop reads."""

    prompts: jax.Array  # [P, Lp] int32
    prompt_lengths: jax.Array  # [P] int32
    rng: jax.Array
    eos_id: jax.Array  # scalar int32
    pad_id: jax.Array  # scalar int32
    version: jax.Array  # scalar int32: the policy version sampling now (partial rollouts)
    carry: PartialRows  # [B, T] rows as far as earlier steps generated them (new rows: empty)
    temperature: jax.Array | None = None  # scalar f32 when traced (cfg's is None), else None


def _settings(s: dict, inputs: _Inputs) -> dict:
    t = s["temperature"] if inputs.temperature is None else inputs.temperature
    return dict(temperature=t, top_k=s["top_k"], top_p=s["top_p"])


def init_state(model, inputs: _Inputs, cfg: dict) -> EngineState:
    """Empty slots, a free pool, pad-filled outputs. cfg: engine_config's dict (static)."""
    P, Lp = inputs.prompts.shape
    B, T, N = P * cfg["G"], cfg["T"], cfg["slots"]
    Pp, Pg = paged.page_counts(Lp, T, cfg["page_size"])
    c = inputs.carry
    chex.assert_shape([c.tokens, c.mask, c.logp, c.sample_logp, c.versions], (B, T))
    mc = model.cfg
    table = jnp.full((N, Pp + Pg), SCRATCH_PAGE, jnp.int32)
    return EngineState(
        next_row=jnp.zeros((), jnp.int32),
        slot_row=jnp.full((N,), B, jnp.int32),
        slot_t=jnp.ones((N,), jnp.int32),
        active=jnp.zeros((N,), bool),
        refcount=jnp.zeros((cfg["num_pages"],), jnp.int32),
        prompt_pages=jnp.full((P, Pp), SCRATCH_PAGE, jnp.int32),
        cache=init_paged_cache(mc, cfg["num_pages"], cfg["page_size"], table),
        tokens=c.tokens,
        mask=c.mask,
        logp=c.logp,
        sample_logp=c.sample_logp,
        routes=jnp.zeros((mc.num_layers, B, Lp + T, mc.experts_per_token), jnp.int32)
        if cfg["return_routes"]
        else None,
        decode_steps=jnp.zeros((), jnp.int32),
        decoded_slots=jnp.zeros((), jnp.int32),
        failed=jnp.zeros((), bool),
        versions=c.versions,
        forced=jnp.sum(c.mask, axis=1).astype(jnp.int32),
        ended=c.done,
        row_pages=jnp.full((B, Pg), SCRATCH_PAGE, jnp.int32),
    )


def _prefill(model, inputs: _Inputs, s: EngineState, p, cfg: dict) -> EngineState:
    """Prefills prompt p into fresh pages and samples its G rows' first tokens (token 0)."""
    P, Lp = inputs.prompts.shape
    G, T = cfg["G"], cfg["T"]
    B = P * G
    Pp = s.prompt_pages.shape[1]
    prompt = jax.lax.dynamic_slice_in_dim(inputs.prompts, p, 1, axis=0)  # [1, Lp]
    n = jax.lax.dynamic_slice_in_dim(inputs.prompt_lengths, p, 1)  # [1]
    pos, valid = sequence_layout(n, Lp, 0)  # [1, Lp]
    out = model.forward(
        prompt.astype(jnp.int32),
        pos,
        slot_mask(valid, jnp.arange(Lp, dtype=jnp.int32)),
        token_mask=valid,
        cache=model.init_cache(1, Lp),
        write_index=0,
        return_routes=cfg["return_routes"],
    )
    h_last = jax.lax.dynamic_index_in_dim(out["hidden"][0], n[0] - 1, keepdims=True)  # [1, D]
    logits = jnp.repeat(model.logits(h_last), G, axis=0)  # [G, V]
    rows = p * G + jnp.arange(G, dtype=jnp.int32)
    u = row_uniforms(inputs.rng, jnp.zeros((G,), jnp.int32), rows, B)
    tok, lp, slp = sample_with_uniform(logits, u, **_settings(cfg, inputs))
    # A carried row keeps its token 0 (and its log-probs and version): it is fed, not sampled.
    kept = s.forced[rows] > 0
    tok = jnp.where(kept, s.tokens[rows, 0], tok)
    lp = jnp.where(kept, s.logp[rows, 0], lp)
    slp = jnp.where(kept, s.sample_logp[rows, 0], slp)
    version = jnp.where(kept, s.versions[rows, 0], inputs.version)
    # rows that will take a slot (a carried row that already ended never does)
    alive = (tok != inputs.eos_id) & (T > 1) & ~s.ended[rows]
    refcount, pages, failed = paged.allocate(s.refcount, Pp, jnp.sum(alive))
    routes = s.routes
    if cfg["return_routes"]:
        L, _, _, k = out["routes"].shape  # [L, 1, Lp, k]: the prompt's, for its G rows
        routes = routes.at[:, rows, :Lp].set(jnp.broadcast_to(out["routes"], (L, G, Lp, k)))
    return s.replace(
        refcount=refcount,
        prompt_pages=s.prompt_pages.at[p].set(pages),
        cache=write_prompt_pages(s.cache, out["cache"], pages),
        tokens=s.tokens.at[rows, 0].set(tok),
        mask=s.mask.at[rows, 0].set(1.0),
        logp=s.logp.at[rows, 0].set(lp),
        sample_logp=s.sample_logp.at[rows, 0].set(slp),
        routes=routes,
        failed=s.failed | failed,
        versions=s.versions.at[rows, 0].set(version),
        ended=s.ended.at[rows].set(~alive),
    )


def refill(model, inputs: _Inputs, s: EngineState, cfg: dict) -> EngineState:
    """Gives every free slot the next row of the queue (prefilling prompts as their first row
    comes up), until no slot is free or the queue is empty."""
    B, G = s.tokens.shape[0], cfg["G"]
    N = s.active.shape[0]

    def body(s: EngineState) -> EngineState:
        b = s.next_row
        p = b // G
        # Prefill the prompts due, p + i for i < due (0 or 1: row b opens its group). The
        # prompt index depends on the loop's counter on purpose: with p alone, the prompt's
        # forward reads only values the loop does not change, and XLA hoisted it out of the
        # loop, so every refilled row ran its prompt's prefill, due or not (G times too many).
        due = (b % G == 0).astype(jnp.int32)
        s = jax.lax.fori_loop(0, due, lambda i, s: _prefill(model, inputs, s, p + i, cfg), s)
        alive = ~s.ended[b]  # set by the prefill: EOS first, T = 1, or a carried ended row
        slot = jnp.where(alive, jnp.argmin(s.active), N)  # the first free slot; N: none
        table = s.cache["page_table"]
        row_table = jnp.concatenate([s.prompt_pages[p], s.row_pages[b]])  # resume_carried's
        cache = dict(s.cache, page_table=table.at[slot].set(row_table, mode="drop"))
        s = s.replace(
            next_row=b + 1,
            slot_row=s.slot_row.at[slot].set(b, mode="drop"),
            # a carried row resumes at its first token not yet generated
            slot_t=s.slot_t.at[slot].set(jnp.maximum(s.forced[b], 1), mode="drop"),
            active=s.active.at[slot].set(True, mode="drop"),
            cache=cache,
        )
        return s

    return jax.lax.while_loop(lambda s: (s.next_row < B) & ~jnp.all(s.active), body, s)


def decode(model, inputs: _Inputs, s: EngineState, cfg: dict, width: int | None = None, start=0):
    """One decode step of slots [start, start + width) (default all N): each active slot's row
    samples its next token. Counts width decoded slot-steps (not a decode step: the caller)."""
    P, Lp = inputs.prompts.shape
    B, T, G, ps = s.tokens.shape[0], cfg["T"], cfg["G"], cfg["page_size"]
    w = s.active.shape[0] if width is None else width
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, w)  # noqa: E731
    table = take(s.cache["page_table"])  # [w, Pt]
    Pt = table.shape[1]
    Pp = s.prompt_pages.shape[1]
    act, t = take(s.active), take(s.slot_t)
    row = jnp.minimum(take(s.slot_row), B - 1)  # free slots read row B - 1's entries, then drop
    fed = t - 1  # generated index of the token fed this step (sampled at step t - 1)

    # A slot that starts a page takes a free one.
    need = act & (fed % ps == 0)
    refcount, new_pages, failed = paged.allocate_rows(s.refcount, need)
    entry = jnp.where(need, Pp + fed // ps, Pt)  # Pt: out of range, dropped
    table = table.at[jnp.arange(w), entry].set(new_pages, mode="drop")

    n = inputs.prompt_lengths[row // G].astype(jnp.int32)  # [w]
    prev = s.tokens[row, fed]  # [w]
    mask = slot_mask(paged.key_valid(n, fed, Pp, Pt, ps), jnp.full((1,), Pt * ps - 1, jnp.int32))
    prefix_table, prefix_rows = shared_prefixes(s.prompt_pages, row, act, G)
    o = model.forward(
        prev[:, None],
        (n + fed)[:, None],
        mask,
        cache=dict(s.cache, page_table=table, prefix_table=prefix_table, prefix_rows=prefix_rows),
        write_index=Pp * ps + fed,
        return_routes=cfg["return_routes"],
    )
    logits = model.logits(o["hidden"][:, 0])  # [w, V]
    u = row_uniforms(inputs.rng, t, row, B)
    tok, lp, slp = sample_with_uniform(logits, u, **_settings(cfg, inputs))
    version = jnp.full_like(tok, inputs.version)  # a slot samples only tokens not yet generated

    out_row = jnp.where(act, row, B)  # B: dropped
    put = lambda buf, v: buf.at[out_row, t].set(v, mode="drop")  # noqa: E731
    routes = s.routes
    if cfg["return_routes"]:
        routes = routes.at[:, out_row, Lp + fed].set(o["routes"][:, :, 0], mode="drop")
    ended = act & ((tok == inputs.eos_id) | (t == T - 1))
    refcount = paged.release(refcount, table, ended)
    table = jnp.where(ended[:, None], SCRATCH_PAGE, table)
    active = act & ~ended
    put_slots = lambda x, v: jax.lax.dynamic_update_slice_in_dim(x, v, start, 0)  # noqa: E731
    return s.replace(
        slot_row=put_slots(s.slot_row, jnp.where(active, row, B)),
        slot_t=put_slots(s.slot_t, jnp.where(active, t + 1, 1)),
        active=put_slots(s.active, active),
        refcount=refcount,
        cache=dict(
            k_pages=o["cache"]["k_pages"],
            v_pages=o["cache"]["v_pages"],
            page_table=put_slots(s.cache["page_table"], table),
        ),
        tokens=put(s.tokens, tok),
        mask=put(s.mask, jnp.ones_like(lp)),
        logp=put(s.logp, lp),
        sample_logp=put(s.sample_logp, slp),
        routes=routes,
        decoded_slots=s.decoded_slots + w,
        failed=s.failed | failed,
        versions=put(s.versions, version),
        ended=s.ended.at[jnp.where(ended, row, B)].set(True, mode="drop"),
    )


def shared_prefixes(prompt_pages: jax.Array, row: jax.Array, act: jax.Array, G: int):
    """The decode step's shared prefixes (kernels/paged_attention.py prefix_attention): the
    prompts of the active slots, each listed once, so that a prompt's pages are read once per
    step for all its rows in slots, not once per slot.

    prompt_pages [P, Pp] (each prefilled prompt's pages), row [w] int32 (each slot's row),
    act [w] bool -> (prefix_table [Q, Pp]: the listed prompts' pages, prefix_rows [Q, G] int32:
    the slot holding member j of the listed prompt (row p * G + j), w where none),
    Q = min(P, w) (every listed prompt has an active slot). Unused entries point at the scratch
    page."""
    P = prompt_pages.shape[0]
    w = act.shape[0]
    Q = min(P, w)
    prompt = jnp.where(act, row // G, P)  # [w]; P: an inactive slot
    listed = jnp.unique(prompt, size=Q, fill_value=P)  # [Q] ascending, P where unused
    q = jnp.searchsorted(listed, prompt).astype(jnp.int32)  # [w]: the slot's prefix
    q = jnp.where(act, q, Q)  # Q: dropped
    prefix_rows = jnp.full((Q, G), w, jnp.int32)
    prefix_rows = prefix_rows.at[q, row % G].set(jnp.arange(w, dtype=jnp.int32), mode="drop")
    prefix_table = jnp.where(
        (listed < P)[:, None], prompt_pages[jnp.minimum(listed, P - 1)], SCRATCH_PAGE
    )
    return prefix_table.astype(jnp.int32), prefix_rows


def drain_width(slots: int, shrink: int) -> int:
    """The narrowest width the drain decodes: slots / 2^shrink, at least 1."""
    return max(1, slots >> shrink)


def drain_widths(slots: int, shrink: int) -> tuple[int, ...]:
    """The drain's decode widths, widest first: slots / 2, slots / 4, ... down to
    drain_width(slots, shrink) (none with shrink = 0)."""
    return tuple(sorted({max(1, slots >> i) for i in range(1, shrink + 1)} - {slots}, reverse=True))


def drain_width_for(slots: int, shrink: int, live: int) -> int:
    """The width a drain step of `live` rows decodes (the narrowest of drain_widths holding
    them), or slots when none does."""
    fit = [w for w in drain_widths(slots, shrink) if live <= w]
    return fit[-1] if fit else slots


def compact(s: EngineState) -> EngineState:
    """The slots reordered so that the active ones come first (stable). Moving a row between
    slots moves its page-table row only: its KV stays in its pages."""
    order = jnp.argsort(~s.active, stable=True)
    table = s.cache["page_table"]
    return s.replace(
        slot_row=s.slot_row[order],
        slot_t=s.slot_t[order],
        active=s.active[order],
        cache=dict(s.cache, page_table=table[order]),
    )


def decode_draining(model, inputs: _Inputs, s: EngineState, cfg: dict) -> EngineState:
    """One decode step, narrowed once the queue is empty and at most half the slots are live.
    Until then every slot decodes at once (N wide); after, the live rows are moved to the first
    slots (compact) and decoded in one step of the narrowest width of drain_widths (N / 2, N / 4,
    ... N / 2^shrink) that holds them all (one decode of each width in the program), so the
    drain's slot-steps follow the live rows and each step is still one pass over the layers
    (sub-batches of a fixed width would repeat every layer's ops once per sub-batch)."""
    widths = drain_widths(s.active.shape[0], cfg["shrink"])
    full = lambda s: decode(model, inputs, s, cfg)  # noqa: E731
    stepped = s.decode_steps + jnp.any(s.active)
    if not widths:
        s = full(s)
    else:
        live = jnp.sum(s.active)
        drain = s.next_row >= s.tokens.shape[0]
        # fits: how many widths hold every live row (they are sorted widest first): 0 = none
        fits = sum((drain & (live <= w)).astype(jnp.int32) for w in widths)
        s = compact(s)  # the identity while the queue has rows: refill has filled every slot
        s = _when(fits == 0, full, s)
        for j, w in enumerate(widths):
            narrow = lambda s, w=w: decode(model, inputs, s, cfg, w, 0)  # noqa: E731
            s = _when(fits == j + 1, narrow, s)
    return s.replace(decode_steps=stepped)


def _when(pred, fn, s: EngineState) -> EngineState:
    """fn(s) if pred else s, as a loop of 0 or 1 trips rather than lax.cond: on XLA:CPU a
    conditional whose branch writes the page pool copied the whole pool (a decode step took
    twice as long), while a loop updates its carry in place."""
    return jax.lax.fori_loop(0, pred.astype(jnp.int32), lambda _, s: fn(s), s)
