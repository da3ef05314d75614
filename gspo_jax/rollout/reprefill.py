"""The static multi-turn engine (multi_turn.generate_episodes(..., engine="static")): turn by
turn, every row still playing is prefilled again with its whole context (first prompt, turns and
observations so far) and decodes until eos or its room; then every row's tools run, and the next
turn starts when all have answered. The reference the continuous engine is compared with.

Dimension legend: B rows, Lp padded first-prompt length, T = max_new_tokens, S0 = Lp + T (a
context's slots, right-padded: one program for every turn), V vocab.

Randomness: row b's token at response position t draws uniform(fold_in(rng, t), (B,))[b]
(sampling.row_uniforms), the single-turn engines' draw, so it depends on (row, position) only:
the continuous engine, whose rows reach a position at any time, samples the same tokens; a
one-turn episode samples what rollout.generate samples.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gspo_jax.rollout.episodes import Rows
from gspo_jax.rollout.sampling import row_uniforms, sample_with_uniform
from gspo_jax.rollout.static import decode_step, prefill


@flax.struct.dataclass
class _Turn:
    step: jax.Array  # scalar int32: the turn's next token index
    tokens: jax.Array  # [B, T] the turn's tokens
    logp: jax.Array  # [B, T]
    sample_logp: jax.Array  # [B, T]
    count: jax.Array  # [B] int32: tokens the row took
    done: jax.Array  # [B] bool
    cache: dict  # the static engine's plain cache of the contexts, [L, B, ..., S0 + T]


def _turn(graphdef, params, contexts, lengths, t0, room, rng, eos_id, *, T: int, settings):
    """One turn of every row: contexts [B, S0] right-padded, lengths [B] (0: the row does not
    play), t0 [B] its region's tokens so far, room [B] -> _Turn (count tokens per row)."""
    model = nnx.merge(graphdef, params)
    B, S0 = contexts.shape
    rows = jnp.arange(B, dtype=jnp.int32)
    logits0, cache, n_b = prefill(
        model, contexts, jnp.maximum(lengths, 1), num_samples=1, cache_len=S0 + T, decode="repeated"
    )

    def draw(logits, i):
        u = row_uniforms(rng, t0 + i, rows, B)
        return sample_with_uniform(logits, u, **dict(settings))

    tok, lp, slp = draw(logits0, 0)
    playing = lengths > 0
    zeros = jnp.zeros((B, T), jnp.float32)
    init = _Turn(
        step=jnp.array(1, jnp.int32),
        tokens=jnp.zeros((B, T), jnp.int32).at[:, 0].set(tok),
        logp=zeros.at[:, 0].set(lp),
        sample_logp=zeros.at[:, 0].set(slp),
        count=playing.astype(jnp.int32),
        done=~playing | (tok == eos_id) | (room <= 1),
        cache=cache,
    )

    def body(s: _Turn) -> _Turn:
        i = s.step
        prev = jax.lax.dynamic_index_in_dim(s.tokens, i - 1, axis=1, keepdims=False)
        logits, o = decode_step(model, s.cache, prev, n_b, i, S0, T)
        tok, lp, slp = draw(logits, i)
        alive = ~s.done
        put = lambda buf, v: jax.lax.dynamic_update_slice_in_dim(buf, v[:, None], i, 1)  # noqa: E731
        return s.replace(
            step=i + 1,
            tokens=put(s.tokens, jnp.where(alive, tok, 0)),
            logp=put(s.logp, jnp.where(alive, lp, 0.0)),
            sample_logp=put(s.sample_logp, jnp.where(alive, slp, 0.0)),
            count=s.count + alive,
            done=s.done | (tok == eos_id) | (i + 1 >= room),
            cache=o["cache"],
        )

    s = jax.lax.while_loop(lambda s: (s.step < T) & ~jnp.all(s.done), body, init)
    return s.replace(cache=None)


_turn_jit = jax.jit(_turn, static_argnames=("graphdef", "T", "settings"))


def play_static(model, rows: Rows, rng, *, eos_id: int, executor, settings: dict) -> dict:
    """Plays every row's episode to its end, turn by turn (module docstring). Returns the
    engine's figures: turns run, decode row-steps of the padded batch (B per step) and the
    useful ones (a playing row sampling a token)."""
    B, T = rows.B, rows.T
    P, Lp = rows.prompts.shape
    graphdef, params = nnx.split(model)
    playing = list(range(B))
    stats = dict(turns=0, decode_steps=0, slot_steps=0, live_slot_steps=0)
    key = tuple(sorted(settings.items()))
    while playing:
        contexts = np.full((B, Lp + T), rows.pad_id, np.int32)  # [B, S0]
        lengths = np.zeros((B,), np.int32)
        room = np.zeros((B,), np.int32)
        for b in playing:
            p, t0 = b // rows.G, int(rows.length[b])
            n = int(rows.prompt_lengths[p])
            contexts[b, :n] = rows.prompts[p, :n]
            contexts[b, n : n + t0] = rows.tokens[b, :t0]
            lengths[b], room[b] = n + t0, rows.room(b)
        s = _turn_jit(
            graphdef,
            params,
            jnp.asarray(contexts),
            jnp.asarray(lengths),
            jnp.asarray(rows.length),
            jnp.asarray(room),
            rng,
            jnp.asarray(eos_id, jnp.int32),
            T=T,
            settings=key,
        )
        tokens, logp, slp = np.asarray(s.tokens), np.asarray(s.logp), np.asarray(s.sample_logp)
        count = np.asarray(s.count)
        stats["turns"] += 1
        stats["decode_steps"] += int(s.step)
        stats["slot_steps"] += B * int(s.step)
        stats["live_slot_steps"] += int(count.sum())
        for b in playing:
            n = int(count[b])
            rows.turn_ended(b, tokens[b, :n], logp[b, :n], slp[b, :n], executor)
        playing = []
        while rows.waiting:  # every row's tools answer before the next turn
            playing += rows.ready_rows(block=True)
        playing.sort()
    return stats
