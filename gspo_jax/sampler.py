"""Group sampler: prefill each prompt once, then a lax.while_loop decode over a shared KV cache.

Dimension legend: P prompts, G samples per prompt (num_samples), B = P * G response rows
(group-contiguous: row b belongs to prompt b // G), Lp padded prompt length, T = max_new_tokens,
S = Lp + T cache slots, V vocab, D hidden.

    out = sampler.generate(model, prompts, prompt_lengths, num_samples=G, max_new_tokens=T,
                           rng=jax.random.fold_in(key, step), temperature=1.0, top_k=0,
                           top_p=1.0, eos_id=task.tokenizer.eos_id, pad_id=0)
    out.tokens [B, T] int32 (pad_id after EOS), out.mask [B, T] f32 (1 up to and including EOS),
    out.logp [B, T] f32 (log-prob under softmax(logits / temperature): the trainer's old_logp),
    out.sample_logp [B, T] f32 (under the top-k/top-p truncated distribution actually sampled
    from; == logp without truncation), out.lengths [B] int32, out.routes (MoE, only with
    return_routes=True) [L, B, Lp + T, k] int32.

The trainer's log-probs for the same rows: models.response_logprobs(model, jnp.repeat(prompts,
G, 0), jnp.repeat(prompt_lengths, G), out.tokens, temperature=temperature) (and, for Routing
Replay, routes=out.routes); its logp equals out.logp wherever out.mask is 1.

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
- Sampling: one uniform per row and a two-level inverse CDF (block sums, then one block): O(V)
  work and B random numbers per step instead of B * V Gumbel draws (jax.random.categorical),
  which dominates a step at V = 151,936 on CPU.
- Log-probs: logits pass through models.scale_logits / token_logprob_entropy, the functions
  response_logprobs uses, so sampler and trainer agree to float32 rounding. temperature=0 is
  greedy (argmax) and its log-probs are reported at temperature 1.
- One compile per (graphdef, shapes, num_samples, max_new_tokens, temperature, top_k, top_p,
  decode); with decode="shared_prefix" the program holds one decode loop per chunk
  (ceil((max_new_tokens - 1) / decode_block) of them):
  parameters, prompts, lengths, the RNG, eos_id and pad_id are traced arguments, so new prompt
  contents never recompile. Changing temperature does (it is a static Python float so that the
  division is bit-identical to response_logprobs').
- The loop stops when every row has emitted EOS or after max_new_tokens.
"""

from __future__ import annotations

import math

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from gspo_jax.models import (
    decode_mask,
    effective_temperature,
    scale_logits,
    sequence_layout,
    slot_mask,
)
from gspo_jax.models.attention import add_chunk, is_shared_prefix, shared_prefix_cache
from gspo_jax.models.logprobs import token_logprob_entropy

DECODE_LAYOUTS = ("shared_prefix", "repeated")

_TRACES = {"generate": 0}  # incremented at trace time; tests use it to prove "no recompile"


@flax.struct.dataclass
class SampleOutput:
    tokens: jax.Array  # [B, T] int32, pad_id after EOS
    mask: jax.Array  # [B, T] float32, 1 up to and including EOS
    logp: jax.Array  # [B, T] float32, temperature-scaled policy (0 where mask is 0)
    sample_logp: jax.Array  # [B, T] float32, truncated sampling distribution (0 where masked)
    lengths: jax.Array  # [B] int32 = mask.sum(-1)
    # MoE only, with return_routes=True: experts used at every slot of the prompt+response
    # layout, [L, B, Lp + T, k] int32, ready for response_logprobs(..., routes=...) (Routing
    # Replay). The last slot's token is never fed to the model; its routes are 0 (they cannot
    # affect any log-prob).
    routes: jax.Array | None = None


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


def truncate_logits(scaled: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """-inf outside the top-k tokens and then outside the smallest top-p nucleus. scaled [B, V].

    Ties at the cut-off value are all kept (so slightly more than k tokens can survive).
    """
    V = scaled.shape[-1]
    if top_k and top_k < V:
        top_vals = jax.lax.top_k(scaled, top_k)[0]  # [B, k] descending
        scaled = jnp.where(scaled >= top_vals[:, -1:], scaled, -jnp.inf)
    else:
        top_vals = None
    if top_p < 1.0:
        sorted_vals = top_vals if top_vals is not None else -jnp.sort(-scaled, axis=-1)
        p = jax.nn.softmax(sorted_vals, axis=-1)  # [B, k or V] descending
        before = jnp.cumsum(p, axis=-1) - p  # mass strictly above each token
        n_keep = jnp.sum(before < top_p, axis=-1)  # >= 1
        cut = jnp.take_along_axis(sorted_vals, (n_keep - 1)[:, None], axis=-1)  # [B, 1]
        scaled = jnp.where(scaled >= cut, scaled, -jnp.inf)
    return scaled


def inverse_cdf_sample(probs: jax.Array, u: jax.Array, block: int = 512) -> jax.Array:
    """Index i with cdf[i-1] <= u * total < cdf[i], for probs [B, V] (unnormalised ok), u [B].

    Two levels (block sums, then the chosen block) keep the prefix sums short. Zero-probability
    tokens are never returned, even when float rounding pushes the target past the last one.
    """
    B, V = probs.shape
    bs = min(block, V)
    nb = math.ceil(V / bs)
    blocks = jnp.pad(probs, ((0, 0), (0, nb * bs - V))).reshape(B, nb, bs)
    bsum = jnp.sum(blocks, axis=-1)  # [B, nb]
    bcum = jnp.cumsum(bsum, axis=-1)
    target = u * bcum[:, -1]  # [B]
    last_block = jnp.max(jnp.where(bsum > 0, jnp.arange(nb), 0), axis=-1)
    j = jnp.minimum(jnp.sum(bcum <= target[:, None], axis=-1), last_block)  # [B]
    start = jnp.take_along_axis(bcum - bsum, j[:, None], axis=-1)[:, 0]
    blk = jnp.take_along_axis(blocks, j[:, None, None], axis=1)[:, 0]  # [B, bs]
    wcum = jnp.cumsum(blk, axis=-1)
    last_in = jnp.max(jnp.where(blk > 0, jnp.arange(bs), 0), axis=-1)
    i = jnp.minimum(jnp.sum(wcum <= (target - start)[:, None], axis=-1), last_in)
    return (j * bs + i).astype(jnp.int32)


def sample_token(logits: jax.Array, key, *, temperature: float, top_k: int, top_p: float):
    """logits [B, V] f32 -> (token [B] int32, logp [B], sample_logp [B])."""
    temp = effective_temperature(temperature)
    scaled = scale_logits(logits, temp)
    if temperature == 0:
        tok = jnp.argmax(scaled, axis=-1).astype(jnp.int32)
        logp = token_logprob_entropy(scaled, tok)[0]
        return tok, logp, logp
    truncated = (0 < top_k < logits.shape[-1]) or top_p < 1.0
    trunc = truncate_logits(scaled, top_k, top_p) if truncated else scaled
    lse = jax.nn.logsumexp(trunc, axis=-1)
    u = jax.random.uniform(key, (logits.shape[0],), jnp.float32)
    tok = inverse_cdf_sample(jnp.exp(trunc - lse[:, None]), u)
    logp = token_logprob_entropy(scaled, tok)[0]
    sample_logp = token_logprob_entropy(trunc, tok)[0] if truncated else logp
    return tok, logp, sample_logp


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

    def body(s: _LoopState):
        t = s.step
        q_slot = Lp + t - 1  # slot of the token being fed (sampled at step t - 1)
        prev = jax.lax.dynamic_slice_in_dim(s.tokens, t - 1, 1, axis=1)  # [B, 1]
        logits, o = decode_step(model, s.cache, prev[:, 0], n_b, t, Lp, T, return_routes)
        new_tok, new_lp, new_slp = sample_token(logits, jax.random.fold_in(rng, t), **settings)
        alive = ~s.done
        new_tok = jnp.where(alive, new_tok, pad_id)
        put = lambda buf, v: jax.lax.dynamic_update_slice_in_dim(buf, v[:, None], t, axis=1)
        return _LoopState(
            step=t + 1,
            tokens=put(s.tokens, new_tok),
            mask=put(s.mask, alive.astype(jnp.float32)),
            logp=put(s.logp, jnp.where(alive, new_lp, 0.0)),
            sample_logp=put(s.sample_logp, jnp.where(alive, new_slp, 0.0)),
            done=s.done | (new_tok == eos_id),
            cache=o["cache"],
            routes=jax.lax.dynamic_update_slice_in_dim(s.routes, o["routes"], q_slot, axis=2)
            if return_routes
            else None,
        )

    def run(state: _LoopState, stop: int) -> _LoopState:  # steps until `stop` or all done
        return jax.lax.while_loop(lambda s: (s.step < stop) & ~jnp.all(s.done), body, state)

    if decode == "shared_prefix":
        # Phase p feeds generated slots [p C, (p + 1) C) (steps p C + 1 .. (p + 1) C) with
        # p + 1 chunks in the cache, so each step reads the chunks filled so far and no more.
        C = model.cfg.decode_block
        final = init
        for p in range(math.ceil((T - 1) / C)):
            if p:
                final = final.replace(cache=add_chunk(final.cache))
            final = run(final, min(T, (p + 1) * C + 1))
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
)
_generate_jit = jax.jit(_generate, static_argnames=_STATIC)


def generate(
    model,
    prompts,
    prompt_lengths,
    *,
    num_samples: int,
    max_new_tokens: int,
    rng,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int,
    pad_id: int = 0,
    return_routes: bool = False,
    decode: str = "shared_prefix",
) -> SampleOutput:
    """Samples num_samples responses for each of P right-padded prompts.

    prompts [P, Lp] int32 right-padded, prompt_lengths [P] int32 (1 <= n <= Lp). Returns a
    SampleOutput with B = P * num_samples group-contiguous rows (row b from prompt b // G). See the
    module docstring for the fields. rng: a fresh key per call (e.g. fold_in(key, step)).
    temperature 0 = greedy; top_k 0 = off; top_p 1 = off; eos_id -1 = no early stop (benchmarks).
    Raises ValueError for settings or shapes the cache cannot hold, before compiling anything.
    return_routes (MoE only): also
    return the experts used at every slot (SampleOutput.routes) for Routing Replay.
    decode: the KV-cache layout of the decode loop, "shared_prefix" (prompt KV once per prompt,
    reads only the filled generated slots) or "repeated" (the earlier layout; module docstring).
    """
    cfg = model.cfg
    prompts = jnp.asarray(prompts)
    prompt_lengths = jnp.asarray(prompt_lengths)
    if prompts.ndim != 2 or prompt_lengths.shape != prompts.shape[:1]:
        raise ValueError(
            f"prompts must be [P, Lp] and prompt_lengths [P]; got {prompts.shape} "
            f"and {prompt_lengths.shape}."
        )
    P, Lp = prompts.shape
    if Lp + max_new_tokens > cfg.max_seq_len:
        raise ValueError(
            f"Prompt length {Lp} + max_new_tokens {max_new_tokens} = {Lp + max_new_tokens} "
            f"exceeds the model's cache limit max_seq_len={cfg.max_seq_len}. Truncate the prompts "
            f"(or pad them less), lower max_new_tokens, or build the model with "
            f"get_model_config(..., max_seq_len={Lp + max_new_tokens})."
        )
    if num_samples < 1 or max_new_tokens < 1:
        raise ValueError(
            f"num_samples={num_samples} and max_new_tokens={max_new_tokens} must be >= 1."
        )
    if not 0 <= top_k <= cfg.vocab_size:
        raise ValueError(f"top_k={top_k} must be in [0, vocab_size={cfg.vocab_size}] (0 = off).")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (1 = off).")
    if decode not in DECODE_LAYOUTS:
        raise ValueError(f"decode={decode!r} is not one of {DECODE_LAYOUTS}.")
    if return_routes and not cfg.is_moe:
        raise ValueError("return_routes=True needs an MoE model (num_experts > 0).")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy).")
    if not -1 <= eos_id < cfg.vocab_size or not 0 <= pad_id < cfg.vocab_size:
        raise ValueError(
            f"eos_id={eos_id} and pad_id={pad_id} must be token ids in "
            f"[0, {cfg.vocab_size}) (eos_id=-1: never stop early)."
        )
    if not isinstance(prompt_lengths, jax.core.Tracer):
        # Multi-host: np.asarray cannot read rows other hosts hold, so every process gathers all
        # of them (a small collective; every host calls generate alike) and all raise together.
        lengths = (
            np.asarray(prompt_lengths)
            if prompt_lengths.is_fully_addressable
            else np.asarray(multihost_utils.process_allgather(prompt_lengths, tiled=True))
        )
        if lengths.min() < 1 or lengths.max() > Lp:
            raise ValueError(
                f"prompt_lengths must be in [1, Lp={Lp}]; got min {lengths.min()}, "
                f"max {lengths.max()}. Every prompt needs at least one token."
            )
    chex.assert_type([prompts, prompt_lengths], [int, int])
    graphdef, state = nnx.split(model)
    return _generate_jit(
        graphdef,
        state,
        prompts,
        prompt_lengths,
        rng,
        jnp.asarray(eos_id, jnp.int32),
        jnp.asarray(pad_id, jnp.int32),
        num_samples=int(num_samples),
        max_new_tokens=int(max_new_tokens),
        temperature=float(temperature),
        top_k=int(top_k),
        top_p=float(top_p),
        return_routes=bool(return_routes),
        decode=decode,
    )
