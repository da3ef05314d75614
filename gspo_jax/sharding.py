"""Device mesh from config, logical-axis rules, sharded parameter creation, batch placement.

Dimension legend: B batch rows, S sequence slots, D hidden, V vocab, H/K query/kv heads,
F MLP hidden, E experts.

Model code names *logical* axes only (DESIGN.md convention 5): every parameter carries an
``out_sharding`` metadata tuple of logical names (batch, length, embed, heads, kv_heads, head_dim,
mlp, vocab, expert, expert_mlp), and a few activations are constrained with
``logical_constraint``. The rules below map logical names onto the mesh axes
("data", "fsdp", "tensor", "expert"):

    batch      -> ("data", "fsdp")   data parallel; FSDP shards batch as well as weights
    embed      -> "fsdp"             weights' D dimension (ZeRO-3 style)
    vocab, heads, kv_heads, mlp, expert_mlp -> "tensor"   Megatron-style tensor parallel
    expert     -> "expert"           expert parallel
    length, head_dim, act_embed -> replicated

A mesh axis that does not divide a dimension is dropped for that array (e.g. 2 kv heads on a
4-way tensor axis stay replicated) so every preset shards on every mesh without padding.
Parameters are created already sharded: eval_shape -> shardings -> jit(init, out_shardings).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.core import spmd as flax_spmd
from jax.sharding import NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("act_embed", None),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert", "expert"),
    ("expert_mlp", "tensor"),
)


def make_mesh(mesh_cfg: Mapping[str, int] | Any | None = None, devices=None) -> jax.sharding.Mesh:
    """Mesh with axes ("data", "fsdp", "tensor", "expert") sized from a dict / ConfigDict.

    Missing axes have size 1; one axis may be -1 (fill the remaining devices). The product must
    equal the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    cfg = dict(mesh_cfg or {"data": -1})
    unknown = sorted(set(cfg) - set(MESH_AXES) - {"rules"})
    if unknown:
        raise ValueError(f"Unknown mesh axes {unknown}; valid axes: {MESH_AXES}.")
    sizes = [int(cfg.get(a, 1)) for a in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"At most one mesh axis may be -1 (fill); got {dict(zip(MESH_AXES, sizes, strict=True))}.")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"Mesh axis sizes must be >= 1 or -1; got {dict(zip(MESH_AXES, sizes, strict=True))}.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"Cannot fill a mesh axis: {len(devices)} devices are not divisible by the product "
                f"{known} of the other axes {dict(zip(MESH_AXES, sizes, strict=True))}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"Mesh {dict(zip(MESH_AXES, sizes, strict=True))} needs {math.prod(sizes)} devices but "
            f"{len(devices)} are available; set one axis to -1 to fill.")
    return jax.sharding.Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def logical_rules(mesh_cfg: Mapping[str, Any] | Any | None = None) -> tuple:
    """DEFAULT_RULES updated with mesh_cfg["rules"] (a sequence of (logical, mesh axes) pairs)."""
    rules = dict(DEFAULT_RULES)
    extra = (dict(mesh_cfg) if mesh_cfg is not None else {}).get("rules") or ()
    for name, axes in (extra.items() if isinstance(extra, Mapping) else extra):
        rules[name] = tuple(axes) if isinstance(axes, list) else axes
    return tuple(rules.items())


def _mesh_axis_sizes(mesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int], mesh,
                    rules=None) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dimensions carry `logical_axes`.

    Mesh axes absent from `mesh`, of size 1, already used by an earlier dimension, or not
    dividing the dimension are dropped (that dimension is then less sharded, never wrong).
    """
    rules = dict(DEFAULT_RULES if rules is None else rules)
    sizes = _mesh_axis_sizes(mesh)
    used: set[str] = set()
    spec = []
    for name, dim in zip(logical_axes, shape, strict=True):
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        kept = []
        for a in axes:
            if a in sizes and sizes[a] > 1 and a not in used and dim % (
                    math.prod(sizes[k] for k in kept) * sizes[a]) == 0:
                kept.append(a)
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def logical_constraint(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical names; a no-op outside a mesh context.

    Active when traced under ``jax.set_mesh(mesh)`` (or ``sharding.use_mesh``); the rules are the
    ones set by ``use_mesh`` (flax's logical-rules context), else DEFAULT_RULES.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    rules = flax_spmd.get_logical_axis_rules() or DEFAULT_RULES
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, mesh, rules))


@contextlib.contextmanager
def use_mesh(mesh: jax.sharding.Mesh, rules=None):
    """Context for tracing sharded computations: sets the mesh and the logical-axis rules."""
    with jax.set_mesh(mesh), flax_spmd.logical_axis_rules(rules or DEFAULT_RULES):
        yield


def state_shardings(state, mesh: jax.sharding.Mesh, rules=None):
    """NamedSharding tree for an nnx.State (abstract or concrete) from its out_sharding metadata."""

    def one(v):
        if isinstance(v, nnx.Variable):
            axes = v.get_metadata().get("out_sharding")
            shape = v.get_value().shape
            spec = (logical_to_spec(axes, shape, mesh, rules) if axes else PartitionSpec())
            return v.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, state, is_leaf=lambda v: isinstance(v, nnx.Variable))


def with_shardings(abstract, shardings):
    """ShapeDtypeStructs of ``abstract`` (arrays or ShapeDtypeStructs) carrying ``shardings`` (a
    tree of the same structure): the target orbax restores into and jit lowers with."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


def create_sharded_model(cfg, mesh: jax.sharding.Mesh, rng_seed: int = 0, rules=None):
    """Transformer(cfg, rngs=nnx.Rngs(rng_seed)) with every parameter created already sharded.

    The values equal the single-device model's (threefry is partitionable), so a sharded model
    and an unsharded one with the same seed compute the same function.
    """
    from gspo_jax.models import Transformer  # late import: models imports this module

    def build():
        return Transformer(cfg, rngs=nnx.Rngs(rng_seed))

    abstract = nnx.eval_shape(build)
    graphdef, abs_state = nnx.split(abstract)
    shardings = state_shardings(abs_state, mesh, rules)

    def init():
        return nnx.state(build())

    with jax.set_mesh(mesh):
        state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int = 2, rules=None) -> NamedSharding:
    """NamedSharding for a [B, ...] array: rows over the batch axes (data, fsdp), rest replicated.

    B must be divisible by the product of the data and fsdp axis sizes.
    """
    rules = dict(DEFAULT_RULES if rules is None else rules)
    target = rules["batch"]
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    sizes = _mesh_axis_sizes(mesh)
    axes = tuple(a for a in axes if sizes.get(a, 1) > 1)
    first = None if not axes else axes[0] if len(axes) == 1 else axes
    return NamedSharding(mesh, PartitionSpec(first, *([None] * (ndim - 1))))


def shard_batch(batch, mesh: jax.sharding.Mesh, rules=None):
    """device_put every array of a pytree with batch_sharding (rows over data+fsdp)."""
    return jax.tree.map(
        lambda x: jax.device_put(x, batch_sharding(mesh, np.ndim(x), rules)), batch)
