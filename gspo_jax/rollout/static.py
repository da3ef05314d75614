"""The static engine: prefill each prompt once, then one lax.while_loop decode of all B rows
over a shared KV cache, until every row has ended or T tokens.

Dimension legend: P prompts, G samples per prompt (num_samples), B = P * G response rows
(group-contiguous: row b belongs to prompt b // G), Lp padded prompt length, T = max_new_tokens,
S = Lp + T cache slots, V vocab, D hidden. Called through rollout.generate (engine="static", the
default); its fields are rollout.SampleOutput's.

How it works (and why):
- Layout: prompts stay right-padded in slots [0, Lp); the t-th generated token of every row goes
  to slot Lp + t at position n_b + t (models/transformer.py). All rows write the same cache slot
  each step (a dynamic_update_slice, no scatter) and the teacher-forced pass in
  models.response_logprobs sees exactly the same attention pattern.
- Shared prefix: the P prompts are prefilled once ([P, Lp] forward); only the last prompt
  position's logits are computed. decode="shared_prefix" (the default) keeps the prompts' KV
  once per prompt, [P, ...], and gives each row a cache for its generated tokens only; a decode
  step attends to the prompt (its G samples are G query rows of one matmul per prompt) and to
  the generated cache, the two softmaxes combined by log-sum-exp (models/attention.py,
  shared_prefix_attention). The generated cache grows by chunks of cfg.decode_block slots in
  static-length phases: the decode loop runs one lax.while_loop per chunk, whose steps attend
  over the chunks filled so far. So a step reads the prompt's KV once per group and the
  generated KV up to the end of the current chunk, not [B, Lp + T] slots. decode="repeated"
  is the earlier layout (prompt caches repeated G times, every step attends over all Lp + T
  slots), kept for the benchmark's comparison; both give the same tokens and log-probs up to
  float32 summation order.
- Randomness: the token of every row at step t is drawn with the uniform
  uniform(fold_in(rng, t), (B,))[b] (sampling.sample_token), so a row's draws depend only on the
  step's key, its index and t.
- One compile per (graphdef, shapes, num_samples, max_new_tokens, temperature, top_k, top_p,
  decode); with decode="shared_prefix" the program holds one decode loop per chunk
  (ceil((max_new_tokens - 1) / decode_block) of them):
  parameters, prompts, lengths, the RNG, eos_id and pad_id are traced arguments, so new prompt
  contents never recompile. Changing temperature does (it is a static Python float so that the
  division is bit-identical to response_logprobs'), unless it is given as an array: then it is
  a traced argument of another program (a population's per-member temperature).
- Live rows only (shrink > 0, shared_prefix): rows that have ended still cost a full row per
  step in a B-wide batch (a long tail of lengths leaves most of B dead for most steps). So at
  the start of each chunk after the first, the loop narrows to the narrowest of B, B / 2, ...,
  B / 2^shrink rows that holds the live ones (lax.switch: one loop per width and chunk, shrink + 1
  per chunk): the live rows' generated chunks are gathered, each with its prompt's KV as a group
  of one (P' = width, G' = 1: the same attention code), the chunk is decoded at that width, and
  the chunks are scattered back. A narrow step reads the width's rows, not B, and its tokens are
  the same: a row's uniform is still uniform(fold_in(rng, t), (B,))[b]. The gather and scatter
  cost two copies of the width's KV per chunk of C steps.
- The loop stops when every row has emitted EOS or after max_new_tokens.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from gspo_jax.models import (
    add_chunk,
    decode_mask,
    is_shared_prefix,
    sequence_layout,
    shared_prefix_cache,
    slot_mask,
)
from gspo_jax.rollout.output import SampleOutput
from gspo_jax.rollout.sampling import sample_token, sample_with_uniform, static_temperature

DECODE_LAYOUTS = ("shared_prefix", "repeated")

_TRACES = {"generate": 0}  # incremented at trace time; tests use it to prove "no recompile"


@flax.struct.dataclass
class _LoopState:
    step: jax.Array  # scalar int32: index of the next token to sample
    tokens: jax.Array  # [B, T]
    mask: jax.Array  # [B, T]
    logp: jax.Array  # [B, T]
    sample_logp: jax.Array  # [B, T]
    done: jax.Array  # [B] bool: EOS already emitted
    cache: dict  # stacked on [L]: a shared-prefix or a plain cache (see prefill)
    routes: jax.Array | None  # [L, B, S, k] int32 when routes are requested


def prefill(
    model,
    prompts,
    prompt_lengths,
    *,
    num_samples: int,
    cache_len: int,
    return_routes: bool = False,
    decode: str = "shared_prefix",
):
    """Prefills each of the P prompts once and shares the result with its G samples.

    prompts [P, Lp], prompt_lengths [P] -> (logits [B, V] f32 predicting the first response
    token, cache, n [B] prompt lengths per row). The cache, every leaf stacked on a leading
    [L] layer axis (Transformer.init_cache; forward's layer scan carries it):
    decode="shared_prefix": {"prefix_k": [L, P, K, Dh, Lp], "prefix_v": [L, P, K, Lp, Dh],
    "k": ([L, B, K, Dh, C],), "v": ([L, B, K, C, Dh],)}: one chunk of C = cfg.decode_block
    generated slots, more appended as decoding fills them (attention.shared_prefix_cache,
    add_chunk; cache_len is not used); decode="repeated": {"k": [L, B, K, Dh, cache_len],
    "v": [L, B, K, cache_len, Dh]}, the prompts' KV zero-extended to cache_len and repeated G
    times.
    Attention runs over the Lp prompt slots only. Only the last real prompt position's logits
    are computed. With return_routes (MoE), also the prompt routes [L, B, cache_len, k] (zeros
    after Lp).
    """
    P, Lp = prompts.shape
    G = num_samples
    n = prompt_lengths.astype(jnp.int32)  # [P]
    slot = jnp.arange(Lp, dtype=jnp.int32)
    pos, valid = sequence_layout(n, Lp, 0)  # [P, Lp]: the prompt slots of the layout
    out = model.forward(
        prompts.astype(jnp.int32),
        pos,
        slot_mask(valid, slot),
        token_mask=valid,
        cache=model.init_cache(P, Lp),
        write_index=0,
        return_routes=return_routes,
    )
    h_last = jnp.take_along_axis(out["hidden"], (n - 1)[:, None, None], axis=1)[:, 0]  # [P, D]
    logits = jnp.repeat(model.logits(h_last), G, axis=0)  # [B, V]

    def extend(c, slot_axis):  # zero-extend the slot axis to cache_len, repeat rows G times
        slot_axis = slot_axis % c.ndim
        pad = [(0, 0)] * c.ndim
        pad[slot_axis] = (0, cache_len - Lp)
        return jnp.repeat(jnp.pad(c, pad), G, axis=c.ndim - 4)

    if decode == "shared_prefix":
        cache = shared_prefix_cache(out["cache"], G, model.cfg.decode_block)
    else:
        cache = {"k": extend(out["cache"]["k"], -1), "v": extend(out["cache"]["v"], -2)}
    if return_routes:
        routes = jnp.pad(
            jnp.repeat(out["routes"], G, axis=1), ((0, 0), (0, 0), (0, cache_len - Lp), (0, 0))
        )  # [L, B, cache_len, k]
        return logits, cache, jnp.repeat(n, G), routes
    return logits, cache, jnp.repeat(n, G)


def decode_step(model, cache, prev, n_b, t, prompt_len: int, response_len: int, routes=False):
    """One step of the decode loop: feeds prev [B] (the token sampled at step t - 1) at slot
    prompt_len + t - 1 -> (logits [B, V] f32 for step t, the forward's output dict with the
    written cache). cache: prefill's, either layout (a shared-prefix cache takes the layout's
    SlotMask, a plain one the materialised [B, 1, S] decode mask). The memory plan compiles it
    alone to cost one token step."""
    q_slot = prompt_len + t - 1
    if is_shared_prefix(cache):
        mask = slot_mask(sequence_layout(n_b, prompt_len, response_len)[1], q_slot)
    else:
        mask = decode_mask(n_b, prompt_len, response_len, q_slot)  # [B, 1, S]
    o = model.forward(
        prev[:, None],
        (n_b + t - 1)[:, None],
        mask,
        cache=cache,
        write_index=q_slot,
        return_routes=routes,
    )
    return model.logits(o["hidden"][:, 0]), o


def _body(
    model, s: _LoopState, rng, n_b, eos_id, pad_id, Lp: int, T: int, settings, routes, rows=None
):
    """One trip of the decode loop: feeds each row's token t - 1, samples token t of every row
    (rows that ended get pad_id and mask 0) and writes it into the [B, T] buffers.
    rows [W] (a narrow step, module docstring): the rows decoded, s.cache holding theirs (its
    [W] rows in that order); the [B, T] buffers and done [B] stay whole and are written at rows."""
    t = s.step
    q_slot = Lp + t - 1  # slot of the token being fed (sampled at step t - 1)
    key = jax.random.fold_in(rng, t)
    if rows is None:
        prev = jax.lax.dynamic_slice_in_dim(s.tokens, t - 1, 1, axis=1)[:, 0]  # [B]
        logits, o = decode_step(model, s.cache, prev, n_b, t, Lp, T, routes)
        new_tok, new_lp, new_slp = sample_token(logits, key, **settings)
        alive = ~s.done
    else:  # the rows' own uniforms of the B-wide draw: the same tokens as the full-width step
        prev = s.tokens[rows, t - 1]  # [W]
        logits, o = decode_step(model, s.cache, prev, n_b[rows], t, Lp, T, routes)
        u = jax.random.uniform(key, s.done.shape, jnp.float32)[rows]
        new_tok, new_lp, new_slp = sample_with_uniform(logits, u, **settings)
        alive = ~s.done[rows]
    new_tok = jnp.where(alive, new_tok, pad_id)
    if rows is None:
        put = lambda buf, v: jax.lax.dynamic_update_slice_in_dim(buf, v[:, None], t, axis=1)  # noqa: E731
        done = s.done | (new_tok == eos_id)
    else:
        put = lambda buf, v: buf.at[rows, t].set(v)  # noqa: E731
        done = s.done.at[rows].set(~alive | (new_tok == eos_id))
    return _LoopState(
        step=t + 1,
        tokens=put(s.tokens, new_tok),
        mask=put(s.mask, alive.astype(jnp.float32)),
        logp=put(s.logp, jnp.where(alive, new_lp, 0.0)),
        sample_logp=put(s.sample_logp, jnp.where(alive, new_slp, 0.0)),
        done=done,
        cache=o["cache"],
        routes=jax.lax.dynamic_update_slice_in_dim(s.routes, o["routes"], q_slot, axis=2)
        if routes
        else None,
    )


def _generate(
    graphdef,
    state,
    prompts,
    prompt_lengths,
    rng,
    eos_id,
    pad_id,
    *,
    num_samples,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    return_routes,
    decode,
    shrink=0,
):
    _TRACES["generate"] += 1
    model = nnx.merge(graphdef, state)
    G, T = num_samples, max_new_tokens
    P, Lp = prompts.shape
    B, S = P * G, Lp + T
    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    pre = prefill(
        model,
        prompts,
        prompt_lengths,
        num_samples=G,
        cache_len=S,
        return_routes=return_routes,
        decode=decode,
    )
    logits0, cache, n_b = pre[:3]

    tok, lp, slp = sample_token(logits0, jax.random.fold_in(rng, 0), **settings)
    zeros = jnp.zeros((B, T), jnp.float32)
    init = _LoopState(
        step=jnp.array(1, jnp.int32),
        tokens=jnp.full((B, T), pad_id, jnp.int32).at[:, 0].set(tok),
        mask=zeros.at[:, 0].set(1.0),
        logp=zeros.at[:, 0].set(lp),
        sample_logp=zeros.at[:, 0].set(slp),
        done=tok == eos_id,
        cache=cache,
        routes=pre[3] if return_routes else None,
    )

    def body(s: _LoopState) -> _LoopState:
        return _body(model, s, rng, n_b, eos_id, pad_id, Lp, T, settings, return_routes)

    def run(state: _LoopState, stop: int, rows=None) -> _LoopState:  # until `stop` or all done
        def step(s):
            return _body(model, s, rng, n_b, eos_id, pad_id, Lp, T, settings, return_routes, rows)

        return jax.lax.while_loop(lambda s: (s.step < stop) & ~jnp.all(s.done), step, state)

    widths = live_widths(B, shrink if decode == "shared_prefix" and not return_routes else 0)

    def run_narrowest(state: _LoopState, stop: int) -> _LoopState:
        """The chunk's steps at the narrowest width holding the live rows (module docstring)."""

        def at_width(w):
            def branch(state):
                if w == B:
                    return run(state, stop)
                rows = jnp.argsort(state.done, stable=True)[:w].astype(jnp.int32)  # live first
                narrow = run(state.replace(cache=narrow_cache(state.cache, rows, G)), stop, rows)
                return narrow.replace(cache=widen_cache(state.cache, narrow.cache, rows))

            return branch

        which = narrowest_index(widths, jnp.sum(~state.done))
        return jax.lax.switch(which, [at_width(w) for w in widths], state)

    if decode == "shared_prefix":
        # Phase p feeds generated slots [p C, (p + 1) C) (steps p C + 1 .. (p + 1) C) with
        # p + 1 chunks in the cache, so each step reads the chunks filled so far and no more.
        C = model.cfg.decode_block
        final = init
        for p in range(math.ceil((T - 1) / C)):
            if p:
                final = final.replace(cache=add_chunk(final.cache))
            stop = min(T, (p + 1) * C + 1)
            # the first chunk starts with every row live: no narrower loop to compile for it
            final = run_narrowest(final, stop) if p and len(widths) > 1 else run(final, stop)
    else:
        final = run(init, T)
    return SampleOutput(
        tokens=final.tokens,
        mask=final.mask,
        logp=final.logp,
        sample_logp=final.sample_logp,
        lengths=jnp.sum(final.mask, axis=-1).astype(jnp.int32),
        routes=final.routes,
    )


_STATIC = (
    "graphdef",
    "num_samples",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "return_routes",
    "decode",
    "shrink",
)
_generate_jit = jax.jit(_generate, static_argnames=_STATIC)


def _generate_traced_temperature(*args, temperature, **static):
    """_generate with the temperature a traced scalar: one program for every value."""
    return _generate(*args, temperature=temperature, **static)


_generate_traced_temperature_jit = jax.jit(
    _generate_traced_temperature, static_argnames=tuple(n for n in _STATIC if n != "temperature")
)


def generate_static(
    model,
    prompts,
    prompt_lengths,
    rng,
    *,
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    eos_id: int,
    pad_id: int,
    return_routes: bool,
    decode: str = "shared_prefix",
    shrink: int = 0,
) -> SampleOutput:
    """The static engine behind rollout.generate (which checks the arguments first).
    decode: the KV-cache layout of the decode loop, "shared_prefix" (prompt KV once per prompt,
    reads only the filled generated slots) or "repeated" (the earlier layout; module docstring).
    shrink: each chunk after the first decodes only the narrowest of B, B / 2, ... B / 2^shrink
    rows that holds the live ones (0: always all B; shared_prefix only, and not with
    return_routes, which then decode all B; module docstring).
    """
    if decode not in DECODE_LAYOUTS:
        raise ValueError(f"decode={decode!r} is not one of {DECODE_LAYOUTS}.")
    if int(shrink) < 0:
        raise ValueError(f"shrink={shrink} must be >= 0 (the loop narrows to B / 2^shrink rows).")
    graphdef, state = nnx.split(model)
    if static_temperature(temperature):
        generate, temperature = _generate_jit, float(temperature)
    else:  # an array (a population member's): traced, one program for every value
        generate = _generate_traced_temperature_jit
        temperature = jnp.asarray(temperature, jnp.float32)
    return generate(
        graphdef,
        state,
        prompts,
        prompt_lengths,
        rng,
        jnp.asarray(eos_id, jnp.int32),
        jnp.asarray(pad_id, jnp.int32),
        num_samples=int(num_samples),
        max_new_tokens=int(max_new_tokens),
        temperature=temperature,
        top_k=int(top_k),
        top_p=float(top_p),
        return_routes=bool(return_routes),
        decode=decode,
        shrink=int(shrink),
    )


def live_widths(rows: int, shrink: int) -> tuple[int, ...]:
    """The widths the loop can narrow to: rows, rows / 2, ... rows / 2^shrink, descending, each
    a whole number of rows (halving stops at an odd width)."""
    out = [rows]
    while len(out) <= shrink and out[-1] % 2 == 0:
        out.append(out[-1] // 2)
    return tuple(out)


def narrowest_index(widths: tuple[int, ...], live) -> jax.Array:
    """The index in ``widths`` (live_widths': descending) of the narrowest width holding ``live``
    rows: the widest when live exceeds every narrower one."""
    return jnp.sum(jnp.array(widths[1:]) >= live)


def narrow_cache(cache: dict, rows: jax.Array, num_samples: int) -> dict:
    """A shared-prefix cache of the rows [W] alone: their generated chunks ([L, W, ...]) and
    each one's prompt KV as a group of one ("prefix_k" [L, W, ...]: P' = W, G' = 1)."""
    prompts = rows // num_samples
    return {
        "prefix_k": cache["prefix_k"][:, prompts],
        "prefix_v": cache["prefix_v"][:, prompts],
        "k": tuple(c[:, rows] for c in cache["k"]),
        "v": tuple(c[:, rows] for c in cache["v"]),
    }


def widen_cache(full: dict, narrow: dict, rows: jax.Array) -> dict:
    """``full`` with the rows' generated chunks taken from ``narrow`` (narrow_cache's layout)."""
    put = lambda whole, part: whole.at[:, rows].set(part)  # noqa: E731
    out = dict(full)
    out["k"] = tuple(map(put, full["k"], narrow["k"]))
    out["v"] = tuple(map(put, full["v"], narrow["v"]))
    return out


def loop_step_for_plan(
    model,
    *,
    num_prompts: int,
    prompt_len: int,
    num_samples: int,
    max_new_tokens: int,
    chunks: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    width: int | None = None,
):
    """(jitted function, abstract arguments): one trip of the shared-prefix decode loop (_body:
    the decode step, sampling and the buffers' writes) with `chunks` generated chunks of
    cfg.decode_block slots in the cache, for the ledger and the plan to lower and cost:
    fn.lower(*args).compile(). width (< B): a narrow trip of that many rows (shrink, module
    docstring). Nothing is allocated (the model may be abstract, nnx.eval_shape)."""
    graphdef, params = nnx.split(model)
    P, Lp, G, T = num_prompts, prompt_len, num_samples, max_new_tokens
    B = P * G
    narrow = width is not None and width < B
    settings = dict(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))

    def cache_of(params):
        m = nnx.merge(graphdef, params)
        if narrow:  # width rows, each its own group of one (narrow_cache's layout)
            cache = shared_prefix_cache(m.init_cache(width, Lp), 1, m.cfg.decode_block)
        else:
            cache = shared_prefix_cache(m.init_cache(P, Lp), G, m.cfg.decode_block)
        for _ in range(chunks - 1):
            cache = add_chunk(cache)
        return cache

    i32, f32 = jnp.int32, jnp.float32
    state = _LoopState(
        step=jax.ShapeDtypeStruct((), i32),
        tokens=jax.ShapeDtypeStruct((B, T), i32),
        mask=jax.ShapeDtypeStruct((B, T), f32),
        logp=jax.ShapeDtypeStruct((B, T), f32),
        sample_logp=jax.ShapeDtypeStruct((B, T), f32),
        done=jax.ShapeDtypeStruct((B,), bool),
        cache=jax.eval_shape(cache_of, params),
        routes=None,
    )

    def one_step(params, s, rng, n_b, rows):
        m = nnx.merge(graphdef, params)
        return _body(m, s, rng, n_b, -1, 0, Lp, T, settings, False, rows)

    rows = jax.ShapeDtypeStruct((width,), i32) if narrow else None
    args = (params, state, jax.random.key(0), jax.ShapeDtypeStruct((B,), i32), rows)
    return jax.jit(one_step, donate_argnums=1), args


def narrowing_for_plan(
    model, *, num_prompts: int, prompt_len: int, num_samples: int, chunks: int, width: int
):
    """(jitted function, abstract arguments): what a chunk's narrowing to `width` rows costs
    once (narrow_cache, then widen_cache of the same rows) with `chunks` chunks in the cache, for
    the ledger to lower and cost. Nothing is allocated."""
    graphdef, params = nnx.split(model)
    P, Lp, G = num_prompts, prompt_len, num_samples

    def cache_of(params):
        m = nnx.merge(graphdef, params)
        cache = shared_prefix_cache(m.init_cache(P, Lp), G, m.cfg.decode_block)
        for _ in range(chunks - 1):
            cache = add_chunk(cache)
        return cache

    def both(cache, rows):
        return widen_cache(cache, narrow_cache(cache, rows, G), rows)

    args = (jax.eval_shape(cache_of, params), jax.ShapeDtypeStruct((width,), jnp.int32))
    return jax.jit(both, donate_argnums=0), args
