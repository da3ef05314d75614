"""Tests for gspo_jax/models/attention.py: the blockwise kernel against the dense reference
(values and gradients, layout masks, a fully masked row, GQA), what its backward pass keeps, the
GPU adapter's plumbing, and the shared-prefix decode step. (Every model test runs the blockwise
kernel too: model.attention "auto" is blockwise on CPU.)

Dimension legend: B rows, Lp prompt slots, T response slots, S = Lp + T, H query heads, K kv
heads, Dh head dim, P prompts, G samples per prompt.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from gspo_jax import models
from gspo_jax.models import attention

B, LP, T, H, K, DH = 3, 7, 6, 4, 2, 8  # GQA: 2 query heads per kv head
S = LP + T
LENGTHS = jnp.asarray([1, 4, 7], jnp.int32)  # one row with a single real prompt token


def _normal(seed, shape):
    # numpy draws: eager jax.random here would compile its threefry ops one by one
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _qkv(seed=0, sq=S, sk=S, b=B):
    """q [b, sq, H, Dh], kT [b, K, Dh, sk], v [b, K, sk, Dh]."""
    return (
        _normal(seed, (b, sq, H, DH)),
        _normal(seed + 100, (b, K, DH, sk)),
        _normal(seed + 200, (b, K, sk, DH)),
    )


def _layout_mask():
    _, key_valid = models.sequence_layout(LENGTHS, LP, T)
    return models.slot_mask(key_valid, jnp.arange(S))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _values_and_grads(impl, mask, block, q, kT, v, dout):
    def f(q, kT, v):
        out = attention.attend(q, kT, v, mask, implementation=impl, block=block)
        return jnp.sum(out * dout), out

    (_, out), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, kT, v)
    return out, grads


@pytest.mark.parametrize(
    "kind,block",  # several blocks; a ragged last block and a row that sees no key
    [("slot", 4), ("dense_fully_masked_row", 5)],
)
def test_blockwise_equals_reference_values_and_gradients(kind, block):
    q, kT, v = _qkv()
    mask = _layout_mask()
    if kind == "dense_fully_masked_row":  # any explicit mask, with a query that sees no key
        mask = attention.DenseMask(mask.dense().at[1, 3].set(False))
    dout = _normal(9, q.shape)
    ref, ref_g = _values_and_grads("reference", mask, block, q, kT, v, dout)
    out, g = _values_and_grads("blockwise", mask, block, q, kT, v, dout)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)
    for name, a, b in zip(("dq", "dk", "dv"), g, ref_g, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=name)


def test_blockwise_backward_keeps_no_score_matrix():
    """The residuals saved for the backward pass are O(S * Dh): nothing of size S * S per head
    (the reference keeps its [B, K, Gq, S, S] probabilities)."""
    s = 64
    q, kT, v = _qkv(sq=s, sk=s, b=1)
    mask = models.slot_mask(jnp.ones((1, s), bool), jnp.arange(s))

    def biggest(impl):
        def f(q, kT, v):
            return jnp.sum(attention.attend(q, kT, v, mask, implementation=impl, block=16))

        return max(np.prod(aval.shape) for aval, _ in saved_residuals(f, q, kT, v))

    assert biggest("reference") >= H * s * s
    assert biggest("blockwise") <= s * H * DH  # q / out sized


def test_dot_product_attention_adapter_equals_reference():
    """cudnn_attention's layouts and mask through jax.nn.dot_product_attention (its "xla"
    implementation here; "cudnn" on a GPU)."""
    q, kT, v = _qkv(1)
    mask = _layout_mask()
    out = jax.jit(attention.cudnn_attention, static_argnums=4)(q, kT, v, mask, "xla")
    ref = jax.jit(attention.reference_attention)(q, kT, v, mask)
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_shared_prefix_step_equals_reference():
    """One decode step over a shared-prefix cache (the prompt's KV once per prompt, two chunks of
    generated slots, the second filled up to the current token) == the reference attention over
    the repeated layout of the same keys."""
    P, G, chunk, t = 2, 3, 4, 5  # generated slot 5 lies in chunk 1
    Tg = 2 * chunk
    b = P * G
    n = jnp.asarray([3, 7], jnp.int32)
    _, key_valid = models.sequence_layout(jnp.repeat(n, G), LP, Tg)  # [b, LP + Tg]
    q, kT_full, v_full = _qkv(2, sq=1, sk=LP + Tg, b=b)
    # The prompt's KV is the same for a prompt's G rows (as the sampler's prefill makes it).
    kT_full = kT_full.at[:, :, :, :LP].set(jnp.repeat(kT_full[::G, :, :, :LP], G, 0))
    v_full = v_full.at[:, :, :LP].set(jnp.repeat(v_full[::G, :, :LP], G, 0))
    cache = {
        "prefix_k": kT_full[::G, :, :, :LP],
        "prefix_v": v_full[::G, :, :LP],
        "k": tuple(kT_full[..., LP + c * chunk : LP + (c + 1) * chunk] for c in range(2)),
        "v": tuple(v_full[:, :, LP + c * chunk : LP + (c + 1) * chunk] for c in range(2)),
    }
    mask = models.slot_mask(key_valid, jnp.asarray([LP + t]))
    out = jax.jit(attention.shared_prefix_attention)(q, cache, mask)
    ref = jax.jit(attention.reference_attention)(q, kT_full, v_full, mask)
    np.testing.assert_allclose(out, ref, atol=1e-6, rtol=0)
