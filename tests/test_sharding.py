"""Tests for gspo_jax.sharding on 8 simulated CPU devices (tests/conftest.py).

Dimension legend: P prompts, G samples per prompt, B = P * G rows, Lp padded prompt length,
T response length, V vocab, D hidden, E experts.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as PS

from gspo_jax import models, sampler, sharding

LP, T, G = 6, 6, 2
LENGTHS = np.array([6, 2, 4, 5], np.int32)
MESHES = {
    "tiny": {"data": 2, "fsdp": 2, "tensor": 2},
    "tiny_moe": {"data": 2, "tensor": 2, "expert": 2},
}


def test_make_mesh_sizes_and_errors():
    mesh = sharding.make_mesh({"data": -1, "tensor": 2})
    assert dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True)) == {
        "data": 4,
        "fsdp": 1,
        "tensor": 2,
        "expert": 1,
    }
    assert sharding.make_mesh(None).axis_sizes == (8, 1, 1, 1)
    with pytest.raises(ValueError, match="valid axes"):
        sharding.make_mesh({"model": 2})
    with pytest.raises(ValueError, match="needs 4 devices"):
        sharding.make_mesh({"data": 2, "tensor": 2})
    with pytest.raises(ValueError, match="At most one"):
        sharding.make_mesh({"data": -1, "fsdp": -1})


def test_logical_to_spec_drops_axes_that_do_not_fit():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert sharding.logical_to_spec(("vocab", "embed"), (64, 32), mesh) == PS("tensor", "fsdp")
    # 3 is not divisible by the tensor axis: that dimension stays replicated.
    assert sharding.logical_to_spec(("kv_heads", "embed"), (3, 32), mesh) == PS(None, "fsdp")
    assert sharding.logical_to_spec(("batch", None), (8, 5), mesh) == PS(("data", "fsdp"), None)
    assert sharding.logical_to_spec(("batch",), (2,), mesh) == PS("data")
    assert sharding.rows_sharding(mesh).spec == PS(("data", "fsdp"), None)
    assert sharding.rows_sharding(sharding.make_mesh({"data": 1, "tensor": -1}), 1).spec == PS(None)


@pytest.fixture(scope="module", params=["tiny", "tiny_moe"])
def pair(request):
    """(single-device model, sharded model with the same seed, mesh). One layer: the
    partitioning is the same in every layer and each layer costs compile time."""
    cfg = models.get_model_config(request.param, num_layers=1)
    mesh = sharding.make_mesh(MESHES[request.param])
    return (
        models.Transformer(cfg, rngs=nnx.Rngs(0)),
        models.create_model(cfg, seed=0, mesh=mesh),
        mesh,
    )


def test_params_created_sharded_with_same_values(pair):
    single, sharded, mesh = pair
    q = sharded.layers.attn.q_proj[...]  # [L, D, H, Dh]: the stacked layers
    assert q.sharding.spec == sharding.logical_to_spec(
        ("layers", "embed", "heads", "head_dim"), q.shape, mesh
    )
    assert len(q.sharding.device_set) == 8 and not q.sharding.is_fully_replicated
    if single.cfg.is_moe:
        assert sharded.layers.mlp.gate_proj[...].sharding.spec[1] == "expert"
    for a, b in zip(
        jax.tree.leaves(nnx.state(single)), jax.tree.leaves(nnx.state(sharded)), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def _inputs(V):
    rng = np.random.default_rng(0)
    prompts = rng.integers(2, V, (len(LENGTHS), LP)).astype(np.int32)
    prompts[np.arange(LP)[None] >= LENGTHS[:, None]] = 0
    return jnp.asarray(prompts), jnp.asarray(LENGTHS)


def test_sharded_sampling_and_forward_equal_single_device(pair):
    single, sharded, mesh = pair
    prompts, lengths = _inputs(single.cfg.vocab_size)
    kw = dict(num_samples=G, max_new_tokens=T, rng=jax.random.key(0), eos_id=1)
    ref = sampler.generate(single, prompts, lengths, **kw)
    with sharding.use_mesh(mesh):
        out = sampler.generate(sharded, *sharding.shard_batch((prompts, lengths), mesh), **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logp, ref.logp, atol=1e-5)
    assert out.tokens.sharding.spec[0] is not None  # rows stay distributed

    fwd = nnx.jit(models.response_logprobs)
    rows = (jnp.repeat(prompts, G, 0), jnp.repeat(lengths, G), ref.tokens)
    ref_lp = fwd(single, *rows)
    with sharding.use_mesh(mesh):
        out_lp = fwd(sharded, *sharding.shard_batch(rows, mesh))
    np.testing.assert_allclose(out_lp["logp"], ref_lp["logp"], atol=1e-5)
    np.testing.assert_allclose(out_lp["entropy"], ref_lp["entropy"], atol=1e-5)
    np.testing.assert_allclose(out_lp["aux_loss"], ref_lp["aux_loss"], atol=1e-5)
    np.testing.assert_allclose(out_lp["logp"] * ref.mask, ref.logp, atol=1e-5)
