"""sharding.transfer: the trainer -> rollout parameter copy between meshes on different devices
and in different layouts moves every shard device to device, never through host memory.

Eight simulated devices (conftest): the trainer's four (fsdp=4) and the rollout's others, laid
out as in docs/pods.md (data=4; data=2 x fsdp=2; and fewer or more rollout devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from gspo_jax import models, sharding


def _mesh(devices, **axes):
    shape = tuple(axes.values())
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), tuple(axes))


def _trainer_params():
    """The tiny model's parameters, created sharded on devices 0-3 with fsdp=4."""
    mesh = _mesh(jax.devices()[:4], fsdp=4)
    cfg = models.get_model_config("tiny", hidden_size=64, mlp_dim=128)
    return nnx.state(models.create_model(cfg, seed=0, mesh=mesh), nnx.Param)


def _no_host_transfers():
    """Any device -> host or host -> device transfer inside raises."""
    return (
        jax.transfer_guard_device_to_host("disallow_explicit"),
        jax.transfer_guard_host_to_device("disallow_explicit"),
    )


DEVICES = jax.devices()
LAYOUTS = {
    "fsdp4_to_data4": lambda: _mesh(DEVICES[4:8], data=4),
    "fsdp4_to_data2_fsdp2": lambda: _mesh(DEVICES[4:8], data=2, fsdp=2),
    "fsdp4_to_tensor2": lambda: _mesh(DEVICES[4:6], tensor=2),
    "fsdp4_to_fsdp2_on_2": lambda: _mesh(DEVICES[6:8], fsdp=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_transfer_moves_params_device_to_device_between_mismatched_meshes(layout):
    params = _trainer_params()
    target = nnx.to_pure_dict(sharding.state_shardings(params, LAYOUTS[layout]()))
    flat_params = nnx.to_pure_dict(params)
    expected = jax.tree.map(lambda x: np.asarray(x, np.float32), flat_params)
    d2h, h2d = _no_host_transfers()
    with d2h, h2d:
        moved = sharding.transfer(flat_params, target, dtype=jnp.bfloat16)
        jax.block_until_ready(moved)
    for x, t, e in zip(
        jax.tree.leaves(moved), jax.tree.leaves(target), jax.tree.leaves(expected), strict=True
    ):
        assert x.sharding == t, (x.sharding, t)
        assert x.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(x, np.float32), e.astype(jnp.bfloat16))


def test_plain_device_put_between_these_layouts_goes_through_the_host():
    """The guard above catches the host path: jax.device_put from fsdp=4 to data=4 on other
    devices fetches shards to the host (why transfer exists)."""
    flat = nnx.to_pure_dict(_trainer_params())
    target = nnx.to_pure_dict(
        sharding.state_shardings(_trainer_params(), LAYOUTS["fsdp4_to_data4"]())
    )
    d2h, h2d = _no_host_transfers()
    with pytest.raises(Exception, match="(?i)disallowed"):
        with d2h, h2d:
            jax.block_until_ready(jax.device_put(flat, target))


def test_transfer_from_fewer_to_more_devices():
    """2 source devices (fsdp=2) -> 4 target devices (data=2 x fsdp=2): copied, then resharded
    on the target side."""
    src = _mesh(DEVICES[:2], fsdp=2)
    dst = _mesh(DEVICES[4:8], data=2, fsdp=2)
    x = jax.device_put(
        jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8),
        jax.sharding.NamedSharding(src, jax.sharding.PartitionSpec("fsdp", None)),
    )
    t = jax.sharding.NamedSharding(dst, jax.sharding.PartitionSpec(None, "fsdp"))
    d2h, h2d = _no_host_transfers()
    with d2h, h2d:
        y = sharding.transfer({"w": x}, {"w": t})["w"]
        jax.block_until_ready(y)
    assert y.sharding == t
    np.testing.assert_array_equal(np.asarray(y), np.arange(64 * 8).reshape(64, 8))


def test_transfer_refuses_device_counts_that_do_not_divide():
    src = _mesh(DEVICES[:4], fsdp=4)
    dst = _mesh(DEVICES[4:7], data=3)
    x = jax.device_put(
        jnp.zeros((12, 4)), jax.sharding.NamedSharding(src, jax.sharding.PartitionSpec("fsdp"))
    )
    with pytest.raises(ValueError, match="divide"):
        sharding.transfer([x], [jax.sharding.NamedSharding(dst, jax.sharding.PartitionSpec())])
