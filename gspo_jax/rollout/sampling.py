"""Drawing one token per row from logits: top-k / top-p truncation, the inverse-CDF draw, and
the log-probs the trainer compares against. Every rollout engine samples through sample_token,
so engines given the same logits and uniforms draw the same tokens.

- Sampling: one uniform per row and a two-level inverse CDF (block sums, then one block): O(V)
  work and B random numbers per step instead of B * V Gumbel draws (jax.random.categorical),
  which dominates a step at V = 151,936 on CPU.
- Log-probs: logits pass through models.scale_logits / token_logprob_entropy, the functions
  response_logprobs uses, so sampler and trainer agree to float32 rounding. temperature=0 is
  greedy (argmax) and its log-probs are reported at temperature 1.
- Temperature: a Python number is a constant of the compiled program (greedy, 0, is another
  program); an array is traced (a population member's, rl/population.py), and always samples.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

from gspo_jax.models import effective_temperature, scale_logits, token_logprob_entropy


def static_temperature(temperature) -> bool:
    """Whether ``temperature`` is a Python number (a compile-time constant; 0 = greedy) rather
    than a traced array (a population member's, > 0: config/population.py refuses greedy ones)."""
    return isinstance(temperature, int | float)


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
    """logits [B, V] f32 -> (token [B] int32, logp [B], sample_logp [B]); row b draws with
    uniform(key, (B,))[b]."""
    u = jax.random.uniform(key, (logits.shape[0],), jnp.float32)
    return sample_with_uniform(logits, u, temperature=temperature, top_k=top_k, top_p=top_p)


def sample_with_uniform(
    logits: jax.Array, u: jax.Array, *, temperature: float, top_k: int, top_p: float
):
    """sample_token with the rows' uniforms u [B] in [0, 1) given (unused when greedy): an
    engine whose rows are at different steps draws each row's own uniform (row_uniforms)."""
    temp = effective_temperature(temperature)
    scaled = scale_logits(logits, temp)
    if static_temperature(temperature) and temperature == 0:
        tok = jnp.argmax(scaled, axis=-1).astype(jnp.int32)
        logp = token_logprob_entropy(scaled, tok)[0]
        return tok, logp, logp
    truncated = (0 < top_k < logits.shape[-1]) or top_p < 1.0
    trunc = truncate_logits(scaled, top_k, top_p) if truncated else scaled
    lse = jax.nn.logsumexp(trunc, axis=-1)
    tok = inverse_cdf_sample(jnp.exp(trunc - lse[:, None]), u)
    logp = token_logprob_entropy(scaled, tok)[0]
    sample_logp = token_logprob_entropy(trunc, tok)[0] if truncated else logp
    return tok, logp, sample_logp


def row_uniforms(rng, steps: jax.Array, rows: jax.Array, num_rows: int) -> jax.Array:
    """u [N] with u[i] == jax.random.uniform(fold_in(rng, steps[i]), (num_rows,))[rows[i]]: the
    uniform row rows[i] draws at its token steps[i], bit for bit, without drawing the other
    num_rows - 1 (the static engine draws all B of a step at once; a continuous engine's slots
    are at different steps of different rows).

    With the partitionable threefry (JAX's default, jax_threefry_partitionable), element b of a
    (num_rows,) uniform is the threefry2x32 hash of the counter b under the key, its two words
    xor-ed, its top 23 bits made a float in [1, 2) minus 1 (jax.random.uniform's recipe). Other
    PRNG settings fall back to drawing the whole (num_rows,) vector per row (O(N * B)).
    tests/test_continuous_engine.py checks the equality against jax.random.uniform.
    """
    keys = jax.vmap(lambda t: jax.random.fold_in(rng, t))(steps)  # [N] keys
    rows = rows.astype(jnp.int32)
    threefry = str(jax.random.key_impl(rng)) == "threefry2x32"  # typed and raw uint32 keys
    if not (jax.config.jax_threefry_partitionable and threefry):
        draw = lambda k, b: jax.random.uniform(k, (num_rows,), jnp.float32)[b]  # noqa: E731
        return jax.vmap(draw)(keys, rows)
    data = jax.random.key_data(keys)  # [N, 2] uint32
    counter = rows.astype(jnp.uint32)
    hi, lo = threefry2x32_p.bind(data[:, 0], data[:, 1], jnp.zeros_like(counter), counter)
    mantissa = jax.lax.shift_right_logical(hi ^ lo, jnp.uint32(32 - 23))
    one_to_two = jax.lax.bitcast_convert_type(mantissa | jnp.uint32(0x3F800000), jnp.float32)
    return jnp.maximum(0.0, one_to_two - 1.0)
