"""Per-token log-probs and entropies of given responses, without [B, T, V] float32 logits.

Dimension legend: B rows (= P * G, group-contiguous, for RL batches), Lp padded prompt length,
T padded response length, C chunk of response positions, D hidden, V vocab, L layers,
k experts per token.

The same two functions process logits here and in the sampler (`scale_logits`,
`token_logprob_entropy`), so the sampler's log-prob of a token it drew equals response_logprobs
of that token under the same parameters (the trainer's old_logp can come straight from the
rollout and the first importance ratio is exactly 1 up to float32 rounding).
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from gspo_jax.models.transformer import sequence_layout, slot_mask, unembed


def effective_temperature(temperature: float) -> float:
    """temperature 0 means greedy sampling; its log-probs are reported at temperature 1."""
    if isinstance(temperature, int | float):
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy).")
        return 1.0 if temperature == 0 else float(temperature)
    return temperature


def scale_logits(logits: jax.Array, temperature) -> jax.Array:
    """float32 logits / temperature: the one logits-processing step of the policy (no masking)."""
    logits = logits.astype(jnp.float32)
    if isinstance(temperature, int | float) and temperature == 1.0:
        return logits
    return logits / temperature


def token_logprob_entropy(scaled: jax.Array, tokens: jax.Array):
    """scaled logits [..., V] f32, tokens [...] -> (log p(token), entropy, lse), each [...]."""
    lse = jax.nn.logsumexp(scaled, axis=-1)
    tok = jnp.take_along_axis(scaled, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    p = jnp.exp(scaled - lse[..., None])
    entropy = lse - jnp.sum(p * scaled, axis=-1)
    return tok - lse, entropy, lse


def chunk_size(batch: int, length: int, vocab: int, budget_bytes: int) -> int:
    """Response positions per chunk so that [B, C, V] float32 logits fit in budget_bytes."""
    return max(1, min(length, budget_bytes // max(1, batch * vocab * 4)))


def chunked_logprobs(
    hidden: jax.Array,
    w_out: jax.Array,
    tokens: jax.Array,
    temperature,
    dtype=jnp.float32,
    chunk: int | None = None,
    budget_bytes: int = 256 * 2**20,
    with_entropy: bool = True,
):
    """log p and entropy [B, T] of tokens [B, T] given the hidden states that predict them.

    hidden [B, T, D] (final-normed), w_out [D, V]. Loops over chunks of C positions with
    lax.map; each chunk's body is rematerialised (jax.checkpoint), so neither the forward nor the
    backward pass keeps more than one [B, C, V] float32 block alive. The entropy is differentiable
    (an objective's entropy terms train through it); with_entropy=False skips it (None returned),
    for passes that only need log-probs.
    """
    B, T, D = hidden.shape
    V = w_out.shape[-1]
    C = chunk or chunk_size(B, T, V, budget_bytes)
    n = math.ceil(T / C)
    pad = n * C - T
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(B, n, C, D).swapaxes(0, 1)
    tok = jnp.pad(tokens, ((0, 0), (0, pad))).reshape(B, n, C).swapaxes(0, 1)

    @jax.checkpoint
    def one(args):
        h_c, tok_c = args  # [B, C, D], [B, C]
        scaled = scale_logits(unembed(h_c, w_out, dtype), temperature)
        if not with_entropy:  # log p only: the entropy's sum over V is never computed
            lse = jax.nn.logsumexp(scaled, axis=-1)
            picked = jnp.take_along_axis(scaled, tok_c[..., None].astype(jnp.int32), axis=-1)
            return (picked[..., 0] - lse,)
        logp, ent, _ = token_logprob_entropy(scaled, tok_c)
        return logp, ent

    if n == 1:
        outs = one((h[0], tok[0]))
    else:
        outs = jax.lax.map(one, (h, tok))  # each [n, B, C]
        outs = tuple(x.swapaxes(0, 1).reshape(B, n * C) for x in outs)
    logp = outs[0][:, :T]
    return logp, (outs[1][:, :T] if with_entropy else None)


def response_logprobs(
    model,
    prompts,
    prompt_lengths,
    responses,
    *,
    temperature=1.0,
    routes=None,
    return_routes=False,
    response_mask=None,
    chunk: int | None = None,
    with_entropy: bool = True,
):
    """Teacher-forced log-probs of `responses` under softmax(logits / temperature).

    prompts [B, Lp] int32 right-padded, prompt_lengths [B] int32 (1 <= n <= Lp),
    responses [B, T] int32 (whatever follows EOS is ignored by the caller's mask).
    For RL batches, B = P * G rows: repeat each prompt G times (jnp.repeat(prompts, G, 0)).
    temperature 0 (greedy) is reported at temperature 1.
    routes [L, B, Lp + T, k] int32: MoE Routing Replay (use these experts, as returned by an
    earlier call with return_routes=True). response_mask [B, T] (optional) restricts the MoE
    load-balancing statistics to real response tokens.

    Returns dict(logp [B, T] f32, entropy [B, T] f32 (differentiable; absent with
    with_entropy=False), aux_loss scalar f32 (0 for dense) and, if return_routes, routes
    [L, B, Lp + T, k] int32). Jittable; never materialises [B, T, V]
    float32 (see chunked_logprobs).
    """
    chex.assert_rank([prompts, prompt_lengths, responses], [2, 1, 2])
    B, Lp = prompts.shape
    T = responses.shape[1]
    chex.assert_shape(prompt_lengths, (B,))
    chex.assert_shape(responses, (B, T))
    temperature = effective_temperature(temperature)
    positions, key_valid = sequence_layout(prompt_lengths, Lp, T)  # [B, S]
    tokens = jnp.concatenate([prompts, responses], axis=1).astype(jnp.int32)  # [B, S]
    token_mask = key_valid
    if response_mask is not None:
        chex.assert_shape(response_mask, (B, T))
        token_mask = key_valid & jnp.concatenate(
            [jnp.ones((B, Lp), bool), response_mask.astype(bool)], axis=1
        )
    mask = slot_mask(key_valid, jnp.arange(Lp + T, dtype=jnp.int32))
    out = model.forward(
        tokens, positions, mask, token_mask=token_mask, routes=routes, return_routes=return_routes
    )
    # Hidden state that predicts response token t: the last prompt slot for t = 0, else Lp+t-1.
    t = jnp.arange(T, dtype=jnp.int32)[None, :]
    src = jnp.where(t == 0, prompt_lengths.astype(jnp.int32)[:, None] - 1, Lp + t - 1)  # [B, T]
    h_prev = jnp.take_along_axis(out["hidden"], src[..., None], axis=1)  # [B, T, D]
    logp, entropy = chunked_logprobs(
        h_prev,
        model.output_matrix(),
        responses,
        temperature,
        model.cfg.compute_dtype,
        chunk=chunk,
        budget_bytes=model.cfg.logprob_chunk_bytes,
        with_entropy=with_entropy,
    )
    result = {"logp": logp, "aux_loss": out["aux_loss"]}
    if with_entropy:
        result["entropy"] = entropy
    if return_routes:
        result["routes"] = out["routes"]
    return result
