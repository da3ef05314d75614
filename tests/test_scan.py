"""The decoder layers under one scan over stacked parameters, with remat, and the checkpoint
layout that came before them."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gspo_jax import models
from gspo_jax.models.transformer import remat
from gspo_jax.runtime import checkpoint

B, S = 2, 6


def _inputs(cfg):
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, S)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    key_valid = jnp.asarray(np.arange(S)[None] < np.array([[S], [S - 2]]))  # row 1 padded
    mask = models.attention_mask(key_valid, jnp.arange(S, dtype=jnp.int32))
    return tokens, positions, mask, key_valid


def _per_layer_forward(model, tokens, positions, mask, token_mask, routes=None):
    """The reference: the same stacked weights applied layer by layer in a Python loop."""
    cfg = model.cfg
    x = jnp.take(model.embed[...], tokens, axis=0).astype(cfg.compute_dtype)
    aux, used = [], []
    for i in range(cfg.num_layers):
        x, _, a, r = model.layer(i)(
            x,
            positions,
            mask,
            token_mask=token_mask,
            routes=None if routes is None else routes[i],
        )
        aux.append(a)
        used.append(r)
    out = {"hidden": model.final_norm(x), "aux_loss": jnp.mean(jnp.stack(aux))}
    if cfg.is_moe:
        out["routes"] = jnp.stack(used)
    return out


def _loss_and_grads(model, forward, *inputs):
    """(outputs, gradients of a fixed random projection of hidden + aux w.r.t. the params)."""
    graphdef, params = nnx.split(model, nnx.Param)
    proj = jax.random.normal(jax.random.key(1), (model.cfg.hidden_size,))

    def loss(p):
        out = forward(nnx.merge(graphdef, p), *inputs)
        return jnp.sum(out["hidden"] @ proj) + out["aux_loss"], out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return out, grads


def _scanned(model, tokens, positions, mask, token_mask):
    return model.forward(
        tokens, positions, mask, token_mask=token_mask, return_routes=model.cfg.is_moe
    )


def _assert_trees_close(a, b):
    """Leaf by leaf to float32 summation-order rounding (relative to the leaf's scale)."""
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
    ):
        scale = float(np.max(np.abs(y))) or 1.0
        np.testing.assert_allclose(
            x, y, rtol=1e-5, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path)
        )


@functools.cache
def _model(preset: str, policy: str = "none"):
    """The 3-layer model of `preset` under remat `policy` (the same parameters for every policy)."""
    cfg = models.get_model_config(preset, num_layers=3)
    state = nnx.state(models.create_model(cfg, seed=0))
    with_policy = dataclasses.replace(cfg, remat=policy)
    graphdef = nnx.split(nnx.eval_shape(lambda: models.create_model(with_policy)))[0]
    return nnx.merge(graphdef, state)


@functools.cache
def _scanned_grads(preset: str, policy: str = "none"):
    model = _model(preset, policy)
    return _loss_and_grads(model, _scanned, *_inputs(model.cfg))


def test_scanned_layers_equal_the_per_layer_application():
    """forward's scan gives the values and gradients of applying each layer's slice of the
    stacked weights in turn, with the MoE's routes, aux loss and Routing Replay. (MoE covers the
    scan's every part; the dense MLP runs scanned in the HF tests' numpy comparison.)"""
    preset = "tiny_moe"
    model = _model(preset)
    cfg = model.cfg
    tokens, positions, mask, valid = _inputs(cfg)
    out, grads = _scanned_grads(preset)
    ref, ref_grads = _loss_and_grads(model, _per_layer_forward, tokens, positions, mask, valid)
    np.testing.assert_allclose(out["hidden"], ref["hidden"], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out["aux_loss"], ref["aux_loss"], rtol=1e-6)
    _assert_trees_close(grads, ref_grads)
    assert float(jnp.abs(grads["layers"]["attn"]["q_proj"][...][-1]).sum()) > 0  # last layer too
    if cfg.is_moe:
        np.testing.assert_array_equal(out["routes"], ref["routes"])
        assert out["routes"].shape == (cfg.num_layers, B, S, cfg.experts_per_token)
        replay = model.forward(tokens, positions, mask, token_mask=valid, routes=out["routes"])
        np.testing.assert_allclose(replay["hidden"], out["hidden"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("policy", ["full", "dots_with_no_batch_dims_saveable"])
def test_remat_policies_give_the_same_gradients(policy):
    """A remat policy changes what the backward pass stores, not the gradients: they equal
    remat="none"'s, and the layer really runs under jax.checkpoint."""
    model = _model("tiny_moe", policy)
    assert model.cfg.remat == policy
    _assert_trees_close(_scanned_grads("tiny_moe", policy)[1], _scanned_grads("tiny_moe")[1])
    graphdef, params = nnx.split(model, nnx.Param)
    tokens, positions, mask, valid = _inputs(model.cfg)
    loss = lambda p: nnx.merge(graphdef, p).forward(tokens, positions, mask)["hidden"].sum()
    assert "remat" in str(jax.make_jaxpr(jax.grad(loss))(params))
    assert remat(np.sin, "none") is np.sin


def test_unknown_remat_policy_is_one_line_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"remat='dots'.*valid: none, full, dots_saveable"):
        models.get_model_config("tiny", remat="dots")


def test_program_does_not_grow_with_depth():
    """The traced forward holds one layer's operations whatever the number of layers."""

    def ops(num_layers):
        cfg = models.get_model_config("tiny", num_layers=num_layers)
        model = nnx.eval_shape(lambda: models.create_model(cfg))
        graphdef, state = nnx.split(model)
        tokens, positions, mask, valid = _inputs(cfg)
        run = lambda s: nnx.merge(graphdef, s).forward(tokens, positions, mask)["hidden"]
        return str(jax.make_jaxpr(run)(state)).count("dot_general")

    assert ops(2) == ops(6) > 0


class _Iterator:
    def get_state(self):
        return b"0"

    def set_state(self, s):
        pass


def test_a_checkpoint_with_layers_one_by_one_fails_in_one_line(tmp_path):
    """A train state saved before the layers were stacked (layers/0/..., layers/1/...) is not
    restored into the stacked model, not taken as corrupt, and the error says what to do."""
    cfg = models.get_model_config("tiny")
    model = models.create_model(cfg, seed=0)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    old = dict(params, layers={str(i): nnx.to_pure_dict(nnx.state(model.layer(i))) for i in (0, 1)})
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1, async_save=False)
    ck.save(1, {"params": old}, _Iterator())
    ck.close()
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), {"params": params}
    )
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1)
    with pytest.raises(checkpoint.CheckpointError) as e:
        ck.restore_latest(target, _Iterator(), report=pytest.fail)
    msg = str(e.value)
    assert "\n" not in msg and "layers/0" in msg and "export_hf.py" in msg, msg
    with pytest.raises(checkpoint.CheckpointError, match="layers/0"):  # one step, as export_hf
        ck.restore(1, target, _Iterator())
    assert ck.all_steps() == [1] and not list(tmp_path.glob("*.unreadable-*"))
    ck.close()
    assert checkpoint.unstacked_layers_error({"params": params}, "x") is None
