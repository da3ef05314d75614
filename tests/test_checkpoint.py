"""Orbax checkpoints: full state round trip, data-iterator state, resharding on restore."""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gspo_jax import checkpoint


def _iterator():
    ds = grain.MapDataset.range(100).shuffle(seed=0).repeat().batch(4).to_iter_dataset()
    return iter(ds)


def _state(mesh):
    sh = NamedSharding(mesh, PartitionSpec("data"))
    params = {"w": jax.device_put(jnp.arange(16.0), sh), "b": jnp.ones(3)}
    tx = optax.adamw(1e-2)
    opt = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt = tx.update(grads, opt, params)  # non-trivial moments
    rng = jax.random.key_data(jax.random.key(7))
    return {"params": params, "opt": opt, "step": jnp.int32(5), "rng": rng}


def _abstract(tree, mesh=None):
    def one(x):
        sh = x.sharding
        if mesh is not None:
            sh = NamedSharding(mesh, PartitionSpec(*([None] * x.ndim)))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)

    return jax.tree.map(one, tree)


def test_round_trip_state_and_iterator(tmp_path):
    mesh = jax.make_mesh((8,), ("data",))
    state = _state(mesh)
    it = _iterator()
    next(it), next(it)
    ck = checkpoint.Checkpointer(str(tmp_path / "ck"), save_every=5)
    assert ck.latest_step() is None
    assert not ck.save(3, state, it)  # not due
    assert ck.save(5, state, it, {"wall_s": 1.5})
    ck.wait()
    expected_next = next(it)

    ck2 = checkpoint.Checkpointer(str(tmp_path / "ck"), save_every=5)
    assert ck2.latest_step() == 5
    it2 = _iterator()
    restored, meta = ck2.restore(5, _abstract(state), it2)
    np.testing.assert_array_equal(next(it2), expected_next)
    assert meta["wall_s"] == 1.5 and meta["step"] == 5
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored["params"]["w"].sharding == state["params"]["w"].sharding
    assert type(restored["opt"][0]).__name__ == "ScaleByAdamState"
    # one JSON file per process for the data iterator
    files = list((tmp_path / "ck" / "5" / "data_iter").glob("process_*.json"))
    assert [f.name for f in files] == ["process_0-of-1.json"]
    ck.close()
    ck2.close()


def test_restore_onto_another_mesh(tmp_path):
    state = _state(jax.make_mesh((8,), ("data",)))
    it = _iterator()
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1, async_save=False)
    ck.save(1, state, it)
    one = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    restored, _ = ck.restore(1, _abstract(state, one), _iterator())
    assert restored["params"]["w"].sharding.mesh.size == 1
    np.testing.assert_array_equal(restored["params"]["w"], np.arange(16.0))
    ck.close()


class _BytesIterator:
    """An iterator whose state is bytes (like grain's DataLoaderIterator)."""

    def __init__(self):
        self.pos = 0

    def get_state(self):
        return f'{{"pos": {self.pos}}}'.encode()

    def set_state(self, s):
        import json

        self.pos = json.loads(s.decode())["pos"]


def test_bytes_iterator_state_and_forced_save(tmp_path):
    it = _BytesIterator()
    it.pos = 11
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=100)
    assert ck.save(3, {"x": jnp.zeros(2)}, it, force=True)
    assert not ck.save(3, {"x": jnp.zeros(2)}, it, force=True)  # already there
    ck.wait()
    it2 = _BytesIterator()
    ck.restore(3, {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}, it2)
    assert it2.pos == 11
    ck.close()
    with pytest.raises(ValueError, match="save_every"):
        checkpoint.Checkpointer(str(tmp_path), save_every=0)
