"""The sparse MoE dispatch (models/moe_dispatch.py) computes the dense reference's function.

One MoE layer with 8 experts (so an expert axis of 2, 4 or 8 holds whole experts), compared in
float32: outputs, the load-balance loss and the gradients with respect to every parameter and the
input, with the router's own routes and with replayed routes (Routing Replay), on one device and
on 8 simulated devices with expert 2, 4 and 8 (beside fsdp and tensor axes).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gspo_jax import models, sharding
from gspo_jax.models import moe_dispatch
from gspo_jax.models.layers import MoE

CFG = models.get_model_config(
    "tiny_moe", num_experts=8, experts_per_token=2, moe_mlp_dim=16, moe_dispatch="dense"
)
B, S = 8, 6  # 8 rows split over every mesh below


def _inputs():
    kx, kr, kc = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (B, S, CFG.hidden_size), jnp.float32)
    routes = jax.random.randint(kr, (B, S, CFG.experts_per_token), 0, CFG.num_experts)
    # distinct experts per token, as top-k gives them
    routes = routes.at[..., 1].set((routes[..., 0] + 1 + routes[..., 1] % 7) % CFG.num_experts)
    mask = (jax.random.uniform(kc, (B, S)) > 0.2).astype(jnp.float32)
    probe = jax.random.normal(kc, (B, S, CFG.hidden_size), jnp.float32)
    return x, routes, mask, probe


def _loss_and_grads(cfg, mesh=None):
    """jitted (state, x, routes, mask, probe) -> per replay mode (free, replayed): (y, aux,
    grads wrt state and x) of loss = Σ y·probe + aux, for an MoE layer of ``cfg``."""
    graphdef, _ = nnx.split(MoE(cfg, rngs=nnx.Rngs(0)))

    def loss(state, x, routes, mask, probe):
        y, aux, _ = nnx.merge(graphdef, state)(x, mask, routes)
        return jnp.sum(y * probe) + aux, (y, aux)

    def both(state, x, routes, mask, probe):
        out = {}
        for name, r in (("free", None), ("replay", routes)):
            (_, (y, aux)), g = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
                state, x, r, mask, probe
            )
            out[name] = (y, aux, g)
        return out

    fn = jax.jit(both)
    if mesh is None:
        return fn

    def sharded(state, *args):
        state = jax.device_put(state, sharding.state_shardings(state, mesh))
        args = sharding.shard_batch(args, mesh)
        with sharding.use_mesh(mesh):
            return fn(state, *args)

    return sharded


@pytest.fixture(scope="module")
def reference():
    """The dense dispatch on one device, and the layer's parameters and inputs."""
    _, state = nnx.split(MoE(CFG, rngs=nnx.Rngs(0)))
    args = _inputs()
    return state, args, _loss_and_grads(CFG)(state, *args)


def _assert_same(got, want, atol=2e-5):
    for mode in ("free", "replay"):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol),
            got[mode],
            want[mode],
        )


CASES = [  # (mesh axes or None for one device, grouped-matmul kernel)
    (None, "tiled"),
    (None, "ragged_dot"),
    ({"fsdp": 2, "tensor": 2, "expert": 2}, "tiled"),
    ({"fsdp": 2, "expert": 4}, "tiled"),
    ({"expert": 8}, "ragged_dot"),
]


@pytest.mark.parametrize("mesh_axes,kernel", CASES, ids=lambda c: "1dev" if c is None else str(c))
def test_sparse_equals_dense(reference, mesh_axes, kernel):
    state, args, want = reference
    cfg = dataclasses.replace(CFG, moe_dispatch="sparse", moe_kernel=kernel)
    mesh = None if mesh_axes is None else sharding.make_mesh(mesh_axes)
    got = _loss_and_grads(cfg, mesh)(state, *args)
    _assert_same(got, want)
    # the replayed routes are the ones used, the free ones are the router's own
    assert not np.allclose(got["free"][0], got["replay"][0])


def test_expert_parallel_does_not_repeat_tokens():
    """With an expert axis, token rows are split over it (the batch rule), so each device routes
    and attends only its own rows."""
    mesh = sharding.make_mesh({"fsdp": 2, "expert": 4})
    assert sharding.rows_sharding(mesh).spec[0] == ("fsdp", "expert")
    assert sharding.row_shards(mesh) == 8


def test_capacity_drops_the_overflow_in_token_order():
    """capacity factor c: expert e keeps its first C = ceil(c·A/E) assignments in token order;
    the output equals the dense reference with the dropped assignments' weights set to 0."""
    x, routes, _, _ = _inputs()
    _, state = nnx.split(MoE(CFG, rngs=nnx.Rngs(0)))
    p = {k: state[k][...] for k in ("gate_proj", "up_proj", "down_proj")}
    w = jax.random.uniform(jax.random.key(5), routes.shape)
    N, k, E = B * S, CFG.experts_per_token, CFG.num_experts
    cap = moe_dispatch.capacity_per_expert(0.25, N * k, E)
    assert cap == 3  # ceil(0.25 * 96 / 8): most experts overflow
    flat = np.asarray(routes).reshape(-1)
    seen = np.zeros(E, int)
    kept = np.zeros_like(flat, bool)
    for a, e in enumerate(flat):  # assignment a = token a // k, slot a % k, in token order
        kept[a] = seen[e] < cap
        seen[e] += 1
    assert 0 < kept.sum() < kept.size
    args = (x, routes, w, p["gate_proj"], p["up_proj"], p["down_proj"])

    @jax.jit
    def both(x, routes, w, gate, up, down, kept_w):
        def sparse(factor, kernel):
            return moe_dispatch.sparse_experts(
                x, routes, w, gate, up, down, capacity_factor=factor, kernel=kernel,
                cdt=jnp.float32,
            )  # fmt: skip

        dense = lambda w: moe_dispatch.dense_experts(x, routes, w, gate, up, down, jnp.float32)
        capped = [sparse(0.25, kernel) for kernel in ("tiled", "ragged_dot")]
        return capped, dense(kept_w), sparse(0.0, "tiled"), dense(w)

    capped, capped_ref, dropless, dropless_ref = both(*args, w * kept.reshape(w.shape))
    for got in capped:
        np.testing.assert_allclose(got, capped_ref, atol=2e-5)
    np.testing.assert_allclose(dropless, dropless_ref, atol=2e-5)


def test_megablox_kernel_in_interpret_mode():
    """The Pallas megablox gmm (interpret mode off TPU) gives ragged_dot's values and
    gradients, rows past the groups aside (megablox leaves them unwritten). (The tiled kernel
    is checked against the dense reference above, end to end.)"""
    kx, kw = jax.random.split(jax.random.key(2))
    lhs = jax.random.normal(kx, (16, 32), jnp.float32)
    rhs = jax.random.normal(kw, (4, 32, 16), jnp.float32)
    sizes = jnp.array([5, 0, 7, 2], jnp.int32)  # 14 of 16 rows in groups, one group empty
    rows = slice(0, 14)

    def f(kernel):
        def loss(lhs, rhs):
            out = moe_dispatch.grouped_matmul(lhs, rhs, sizes, kernel)
            return jnp.sum(out[rows] ** 2), out

        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(lhs, rhs)
        return out[rows], grads[0][rows], grads[1]

    for a, b in zip(jax.jit(f, static_argnums=0)("megablox"), f("ragged_dot"), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
