"""Device mesh from config, logical-axis rules, sharded parameter creation, batch placement.

Dimension legend: B batch rows, S sequence slots, D hidden, V vocab, H/K query/kv heads,
F MLP hidden, E experts.

Model code names *logical* axes only (docs/design.md convention 5): every parameter carries an
``out_sharding`` metadata tuple of logical names (batch, length, embed, heads, kv_heads, head_dim,
mlp, vocab, expert, expert_mlp), and a few activations are constrained with
``logical_constraint``. The rules below map logical names onto the mesh axes
("data", "fsdp", "tensor", "expert"):

    batch      -> ("data", "fsdp", "expert")   data parallel; FSDP and expert parallelism shard
                                  rows as well as weights (no device computes another's token)
    embed      -> "fsdp"             weights' D dimension (ZeRO-3 style)
    vocab, heads, kv_heads, mlp, expert_mlp -> "tensor"   Megatron-style tensor parallel
    expert     -> "expert"           expert parallel
    length, head_dim, act_embed -> replicated

A mesh axis that does not divide a dimension is dropped for that array (e.g. 2 kv heads on a
4-way tensor axis stay replicated) so every preset shards on every mesh without padding.
Parameters are created already sharded (eval_shape -> state_shardings -> jit(init,
out_shardings)) by models.create_model(cfg, seed=..., mesh=mesh); this module does not import
the models package, which imports it.

The rules are one fixed table (RULES): every preset and mesh so far shards well with it, and a
table that could differ per run would have to be threaded through the model, the sampler, the
update and the checkpoint shardings alike. Change the table here, in one place, if a model needs it.

Batch rows (prompts, responses, every per-row array of the RL step) are sharded by one helper,
``rows_sharding(mesh, ndim)``: rows over (data, fsdp, expert), everything else replicated;
``row_shards(mesh)`` is how many ways the rows split. Inside jit, ``constrain_rows`` and
``chunk_rows`` keep rows (and the chunks a pass runs in) sharded that way.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")
POPULATION_AXIS = "population"  # a population's member axis (config.mesh.population)

RULES: tuple[tuple[str, Any], ...] = (
    # Rows over the expert axis too: the sparse MoE (models/moe_dispatch.py) gathers an expert
    # group's tokens itself, and attention, router and head are not repeated on that axis.
    ("batch", ("data", "fsdp", "expert")),
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
    ("layers", None),  # the stacked decoder layers' leading axis (the scan runs along it)
)


def make_mesh(mesh_cfg: Mapping[str, int] | Any | None = None, devices=None) -> jax.sharding.Mesh:
    """Mesh with axes ("data", "fsdp", "tensor", "expert") sized from a dict / ConfigDict.

    Missing axes have size 1; one axis may be -1 (fill the remaining devices). The product must
    equal the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    cfg = dict(mesh_cfg or {"data": -1})
    # A population's member axis (rl/population.py) comes first, outermost (each member on its
    # own device group); the mesh has it only when it is not 1, so a single run's mesh is as
    # before.
    axes = MESH_AXES if int(cfg.get(POPULATION_AXIS, 1)) == 1 else (POPULATION_AXIS, *MESH_AXES)
    cfg = {k: v for k, v in cfg.items() if k != POPULATION_AXIS or axes != MESH_AXES}
    unknown = sorted(set(cfg) - set(axes) - {POPULATION_AXIS})
    if unknown:
        raise ValueError(f"Unknown mesh axes {unknown}; valid axes: {MESH_AXES}.")
    sizes = [int(cfg.get(a, 1)) for a in axes]
    if sizes.count(-1) > 1:
        raise ValueError(
            f"At most one mesh axis may be -1 (fill); got {dict(zip(axes, sizes, strict=True))}."
        )
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(
            f"Mesh axis sizes must be >= 1 or -1; got {dict(zip(axes, sizes, strict=True))}."
        )
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"Cannot fill a mesh axis: {len(devices)} devices are not divisible by the product "
                f"{known} of the other axes {dict(zip(axes, sizes, strict=True))}."
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"Mesh {dict(zip(axes, sizes, strict=True))} needs {math.prod(sizes)} devices but "
            f"{len(devices)} are available; set one axis to -1 to fill."
        )
    return jax.sharding.Mesh(np.asarray(devices).reshape(sizes), axes)


def _mesh_axis_sizes(mesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))


def logical_to_spec(
    logical_axes: Sequence[str | None], shape: Sequence[int], mesh
) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dimensions carry `logical_axes`.

    Mesh axes absent from `mesh`, of size 1, already used by an earlier dimension, or not
    dividing the dimension are dropped (that dimension is then less sharded, never wrong).
    """
    rules = dict(RULES)
    sizes = _mesh_axis_sizes(mesh)
    used: set[str] = set()
    spec = []
    for name, dim in zip(logical_axes, shape, strict=True):
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        kept = []
        for a in axes:
            if (
                a in sizes
                and sizes[a] > 1
                and a not in used
                and dim % (math.prod(sizes[k] for k in kept) * sizes[a]) == 0
            ):
                kept.append(a)
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def logical_constraint(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical names; a no-op outside a mesh context.

    Active when traced under ``jax.set_mesh(mesh)`` (or ``sharding.use_mesh``).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, mesh))


@contextlib.contextmanager
def use_mesh(mesh: jax.sharding.Mesh):
    """Context for tracing sharded computations on ``mesh`` (logical constraints become active)."""
    with jax.set_mesh(mesh):
        yield


def state_shardings(state, mesh: jax.sharding.Mesh):
    """NamedSharding tree for an nnx.State (abstract or concrete) from its out_sharding metadata."""

    def one(v):
        if isinstance(v, nnx.Variable):
            axes = v.get_metadata().get("out_sharding")
            shape = v.get_value().shape
            spec = logical_to_spec(axes, shape, mesh) if axes else PartitionSpec()
            return v.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, state, is_leaf=lambda v: isinstance(v, nnx.Variable))


def with_shardings(abstract, shardings):
    """ShapeDtypeStructs of ``abstract`` (arrays or ShapeDtypeStructs) carrying ``shardings`` (a
    tree of the same structure): the target orbax restores into and jit lowers with."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )


def row_spec(mesh: jax.sharding.Mesh) -> Any:
    """The PartitionSpec entry of a batch-row dimension: the batch rule's mesh axes of size > 1
    (one name, a tuple of them, or None on a mesh that does not split rows)."""
    target = dict(RULES)["batch"]
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    sizes = _mesh_axis_sizes(mesh)
    axes = tuple(a for a in axes if sizes.get(a, 1) > 1)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def row_shards(mesh: jax.sharding.Mesh) -> int:
    """How many ways batch rows split on ``mesh`` (the product of the batch rule's axes)."""
    sizes = _mesh_axis_sizes(mesh)
    entry = row_spec(mesh)
    axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
    return math.prod(sizes[a] for a in axes)


def rows_sharding(mesh: jax.sharding.Mesh, ndim: int = 2) -> NamedSharding:
    """NamedSharding for a [B, ...] array: rows over the batch axes (data, fsdp, expert), rest
    replicated. B must be divisible by row_shards(mesh).
    """
    return NamedSharding(mesh, PartitionSpec(row_spec(mesh), *([None] * (ndim - 1))))


def constrain_rows(x: jax.Array, mesh: jax.sharding.Mesh | None) -> jax.Array:
    """Inside jit: keeps a [B, ...] array's rows sharded over the batch axes (rows_sharding); a
    no-op without a mesh (a single-device caller)."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, rows_sharding(mesh, x.ndim))


def chunk_rows(tree, n: int, mesh: jax.sharding.Mesh | None):
    """Inside jit: every [B, ...] leaf -> [n, B/n, ...], chunk c holding rows c*B/n ...
    (c+1)*B/n - 1, each chunk's rows sharded over the batch axes (without a mesh: unconstrained).
    How a pass runs in sequential chunks (lax.map / scan over the leading axis) to bound memory."""

    def one(x):
        y = x.reshape(n, x.shape[0] // n, *x.shape[1:])
        if mesh is None:
            return y
        spec = PartitionSpec(None, row_spec(mesh), *([None] * (x.ndim - 1)))
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, spec))

    return jax.tree.map(one, tree)


def shard_batch(batch, mesh: jax.sharding.Mesh):
    """device_put every array of a pytree with rows_sharding (rows over the batch axes)."""
    return jax.tree.map(lambda x: jax.device_put(x, rows_sharding(mesh, np.ndim(x))), batch)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    """A NamedSharding that puts a whole copy of an array on every device of ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())


def _spread(sharding: NamedSharding, devices, copies: int) -> NamedSharding:
    """``sharding``'s layout (its mesh shape and spec) on ``devices``, a multiple ``copies`` of
    its device count, each of its shards held by ``copies`` of them (a leading replicated axis)."""
    mesh = sharding.mesh
    shape = (copies, *mesh.devices.shape)
    grid = np.asarray(devices, dtype=object).reshape(shape)
    spread = jax.sharding.Mesh(grid, ("_copies", *mesh.axis_names))
    return NamedSharding(spread, sharding.spec)


def transfer(tree, shardings, dtype=None):
    """Every leaf of ``tree`` (committed jax.Arrays, NamedShardings) moved to ``shardings`` (a
    tree of NamedShardings of the same structure), whatever the two layouts and device sets,
    device to device: no leaf passes through host memory, and nothing blocks (each part is
    dispatched asynchronously). dtype: the floating leaves cast first, on the source devices
    (fewer bytes to move), e.g. the rollout's compute dtype.

    Why: jax.device_put between shardings on different device sets copies shard to shard only
    where every target shard is a source shard; otherwise (fsdp=4 -> data=4, fsdp=4 ->
    data=2 x fsdp=2) it fetches the whole array to the host and uploads it again. Here the
    layout change is a collective on one side and the move a shard-to-shard copy: with at least
    as many source as target devices, the source reshards to the target's layout (each target
    shard held by n_src / n_dst source devices) and each target device copies its shard; with
    more target devices, each source shard is copied to n_dst / n_src target devices first, and
    the target devices reshard. The larger device count must be a multiple of the smaller."""
    leaves, treedef = jax.tree.flatten(tree)
    targets = treedef.flatten_up_to(shardings)
    if not leaves:
        return tree
    src = leaves[0].sharding
    for x in leaves:
        if not isinstance(x.sharding, NamedSharding) or x.sharding.device_set != src.device_set:
            raise ValueError(
                "transfer: every leaf must be a jax.Array with a NamedSharding on one mesh; got "
                f"{x.sharding} beside {src} (device_put the tree onto one mesh first)."
            )
    n_src, n_dst = len(src.device_set), len(targets[0].device_set)
    if max(n_src, n_dst) % min(n_src, n_dst):
        raise ValueError(
            f"transfer: {n_src} source and {n_dst} target devices; one count must divide the "
            "other (split the devices so that it does, e.g. 4 + 4 or 4 + 2)."
        )

    def cast(x):
        floating = dtype is not None and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
        return x.astype(dtype) if floating else x

    src_devices = list(src.mesh.devices.flat)
    dst_devices = list(targets[0].mesh.devices.flat)
    if n_src >= n_dst:  # reshard on the source devices, then copy shard to shard
        mids = [_spread(t, src_devices, n_src // n_dst) for t in targets]
        staged = jax.jit(lambda xs: [cast(x) for x in xs], out_shardings=mids)(leaves)
        moved = [jax.device_put(x, t) for x, t in zip(staged, targets, strict=True)]
    else:  # copy each source shard to n_dst / n_src target devices, then reshard there
        cast_leaves = jax.jit(
            lambda xs: [cast(x) for x in xs], out_shardings=[x.sharding for x in leaves]
        )(leaves)
        mids = [_spread(x.sharding, dst_devices, n_dst // n_src) for x in cast_leaves]
        copied = [jax.device_put(x, m) for x, m in zip(cast_leaves, mids, strict=True)]
        moved = jax.jit(lambda xs: xs, out_shardings=targets)(copied)
    return treedef.unflatten(moved)
