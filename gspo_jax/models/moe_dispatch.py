"""How a top-k MoE layer's experts run, once the router has chosen them (layers.MoE routes).

Dimension legend: B rows, S slots, N = B·S tokens, D hidden, E experts, El experts on one device,
k experts per token, A = N·k token-expert assignments, Fe per-expert SwiGLU hidden, M rows of the
grouped-matmul buffer.

Two dispatches compute the same function, y_n = Σ_j w_nj · expert_{e_nj}(x_n):

``dense_experts`` (cfg.moe_dispatch = "dense") runs every token through every expert and combines
with a [B, S, E] weight that is zero off the chosen experts: E/k times the FLOPs of the chosen
experts. It is the reference the tests compare the sparse dispatch against.

``sparse_experts`` (cfg.moe_dispatch = "sparse", the default) runs each token only through its k
experts: the A assignments are sorted by expert, their token rows copied into a buffer grouped by
expert, each group multiplied by its expert's weights (one grouped matmul per projection), and the
results gathered back to their assignments and summed with the router weights. The grouped
matmul (cfg.moe_kernel): the Pallas megablox ``gmm`` on TPU; elsewhere "tiled", a plain-JAX
batched matmul over fixed-size row blocks that each belong to one group (groups padded to whole
blocks); or ``jax.lax.ragged_dot``, which XLA:CPU lowers as a masked dense matmul over every
group (E/k times the work of the dense dispatch there).

Under a mesh (``jax.set_mesh``) the sparse dispatch runs in ``shard_map``. Token rows are sharded
over the batch rule's axes, which include ``expert`` (sharding.RULES), so no two devices compute
the same token's attention or routing; each device holds El = E / |expert| experts. The ring:

    all_gather(tokens, "expert")       every device of an expert group sees the group's tokens
    local grouped matmuls              only the assignments to this device's El experts
    psum_scatter(outputs, "expert")    each token's k partial outputs summed back on its device

Weights sharded over fsdp along D are all-gathered inside (ZeRO-3, as the dense path does
implicitly), and a tensor-sharded Fe is summed with psum. The gather/scatter ring moves each
token's hidden state (D values) to |expert| devices and back, where an all-to-all would move k
copies once each way; for k ≥ |expert| the ring moves no more, and it needs no count exchange.

Dropless by default: the buffer has a row for every assignment the device could receive (A of the
gathered tokens), and a grouped matmul touches only the rows its groups cover (megablox and tiled
skip the rest). With cfg.moe_capacity_factor = c > 0 each expert keeps at most
C = ceil(c · A / E) assignments (in token order); the rest are dropped (weight 0) and the buffer
shrinks to El · C rows.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from gspo_jax.sharding import logical_constraint, logical_to_spec


def dense_experts(x, top_idx, top_w, gate, up, down, cdt):
    """Every token through every expert. x [B, S, D], top_idx [B, S, k] int32, top_w [B, S, k]
    f32, gate/up [E, D, Fe], down [E, Fe, D] (compute dtype) -> y [B, S, D]."""
    E = gate.shape[0]
    onehot = jax.nn.one_hot(top_idx, E, dtype=jnp.float32)  # [B, S, k, E]
    combine = jnp.einsum("bske,bsk->bse", onehot, top_w)  # [B, S, E], zero off the top-k
    h = jax.nn.silu(jnp.einsum("bsd,edf->bsef", x, gate)) * jnp.einsum("bsd,edf->bsef", x, up)
    h = logical_constraint(h, ("batch", "length", "expert", "expert_mlp"))
    y_e = jnp.einsum("bsef,efd->bsed", h, down)
    return jnp.einsum("bsed,bse->bsd", y_e, combine.astype(cdt))


def resolve_kernel(kernel: str) -> str:
    """ "auto" -> "megablox" on TPU, "tiled" elsewhere; other names unchanged."""
    if kernel != "auto":
        return kernel
    return "megablox" if jax.devices()[0].platform == "tpu" else "tiled"


def tile_rows(assignments: int, groups: int, k_dim: int, n_dim: int) -> int:
    """Rows per block of the "tiled" kernel, a power of two in [8, 128]: about a quarter of a
    group's expected rows (so padding each group to whole blocks wastes little), but no fewer
    than a quarter of K·N / (K + N), since each block reads its [K, N] weights once and that
    traffic is worth K·N / (K + N) rows."""
    quarter_group = assignments // (4 * max(groups, 1))
    weight_rows = k_dim * n_dim // (4 * (k_dim + n_dim))
    target = max(quarter_group, weight_rows, 1)
    return int(min(128, max(8, 2 ** round(math.log2(target)))))


def _megablox_tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    # 128 (the MXU's width) where the dimension allows it; small test shapes take the whole dim.
    return min(128, m), min(128, k), min(128, n)


_CHUNK_WEIGHTS = 2**20  # weight elements one chunk of tiles gathers (4 MiB in float32)


def tiled_matmul(lhs, rhs, group_sizes, tile: int):
    """Grouped matmul over a buffer whose groups start at multiples of ``tile`` rows: each
    [tile, K] block is multiplied by its group's [K, N], so the work is the rows the groups cover
    plus their padding. Plain JAX: the kernel off TPU (XLA:CPU lowers ragged_dot as a masked
    dense matmul over every group).

    The blocks run in chunks (lax.map): a chunk gathers its blocks' weights, at most about
    _CHUNK_WEIGHTS elements, and is rematerialised in the backward pass, so no [blocks, K, N]
    copy of the weights is ever stored. Small experts take one chunk (one batched matmul)."""
    M, K = lhs.shape
    G, N, tiles = rhs.shape[0], rhs.shape[2], M // tile
    ends = jnp.cumsum((group_sizes + tile - 1) // tile * tile)  # [G] padded group ends
    owner = jnp.searchsorted(ends, jnp.arange(tiles) * tile, side="right")  # [tiles]
    owner = jnp.minimum(owner, G - 1)  # blocks past the groups: zero rows, any weights
    blocks = lhs.reshape(tiles, tile, K)

    @jax.checkpoint
    def chunk(block, g):  # [tile, K], group id -> [tile, N]
        return block @ rhs[g]

    per_chunk = max(1, min(tiles, _CHUNK_WEIGHTS // (K * N)))
    # One block per step reads its weights with a dynamic slice; several gather them.
    batch = {"batch_size": per_chunk} if per_chunk > 1 else {}
    out = jax.lax.map(lambda a: chunk(*a), (blocks, owner), **batch)
    return out.reshape(M, N)


def grouped_matmul(lhs, rhs, group_sizes, kernel: str, tile: int = 1):
    """lhs [M, K] rows grouped consecutively by group_sizes [G] (each group starting at a
    multiple of ``tile`` for the "tiled" kernel), rhs [G, K, N] -> [M, N]: row m of group g
    times rhs[g]. Rows outside the groups are unspecified (zero for ragged_dot and tiled,
    unwritten by megablox): callers never read them."""
    if kernel == "tiled":
        return tiled_matmul(lhs, rhs, group_sizes, tile)
    if kernel == "megablox":
        from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

        M = lhs.shape[0]
        tm = _megablox_tiling(M, lhs.shape[1], rhs.shape[2])[0]
        pad = -M % tm  # gmm needs whole row tiles
        out = megablox.gmm(
            jnp.pad(lhs, ((0, pad), (0, 0))),
            rhs,
            group_sizes,
            preferred_element_type=lhs.dtype,
            tiling=_megablox_tiling,
            interpret=jax.devices()[0].platform != "tpu",
        )
        return out[:M]
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


def local_experts(x, top_idx, top_w, gate, up, down, *, first_expert, capacity, kernel, cdt):
    """The partial MoE output of one device's El experts for a flat set of tokens.

    x [N, D], top_idx [N, k] (global expert ids), top_w [N, k] f32, gate/up [El, D, Fe],
    down [El, Fe, D] holding experts [first_expert, first_expert + El); capacity: per-expert cap
    on kept assignments, or None (dropless). Returns y [N, D]: Σ over this device's kept
    assignments of w · expert(x); assignments to other experts contribute 0.
    """
    N, k = top_idx.shape
    El, D = gate.shape[0], x.shape[-1]
    A = N * k
    local = top_idx.reshape(A) - first_expert  # [A]
    is_local = (local >= 0) & (local < El)
    group = jnp.where(is_local, local, El)  # [A]; El = "not here", sorted last
    counts = jnp.bincount(group, length=El + 1)[:El]  # [El] assignments per local expert
    starts = jnp.cumsum(counts) - counts  # [El] first sorted position of each group
    order = jnp.argsort(group, stable=True)  # [A] assignments by expert, token order within
    position = jnp.zeros(A, jnp.int32).at[order].set(jnp.arange(A, dtype=jnp.int32))
    rank = position - starts[jnp.minimum(group, El - 1)]  # [A] place within its expert's group
    kept = counts if capacity is None else jnp.minimum(counts, capacity)
    keep = is_local if capacity is None else is_local & (rank < capacity)
    # Buffer layout: groups one after another, each starting at a multiple of `tile` rows (the
    # tiled kernel's blocks; 1 for the others); M covers the most rows the groups can need.
    tile = tile_rows(A, El, D, gate.shape[-1]) if kernel == "tiled" else 1
    if capacity is None:
        M = -(-(A + El * (tile - 1)) // tile) * tile
    else:
        M = El * (-(-capacity // tile) * tile)
    padded = -(-kept // tile) * tile
    kept_starts = jnp.cumsum(padded) - padded
    # Buffer row of each kept assignment; M (out of range: dropped on write, 0 on read) otherwise.
    dest = jnp.where(keep, kept_starts[jnp.minimum(group, El - 1)] + rank, M)  # [A]
    token_rows = jnp.repeat(x, k, axis=0)  # [A, D]: assignment a is token a // k
    xs = jnp.zeros((M, D), x.dtype).at[dest].set(token_rows, mode="drop", unique_indices=True)
    gmm = lambda lhs, rhs: grouped_matmul(lhs, rhs, kept, kernel, tile)  # noqa: E731
    h = jax.nn.silu(gmm(xs, gate)) * gmm(xs, up)  # [M, Fe]
    ys = gmm(h, down)  # [M, D]
    y_a = ys.at[dest].get(mode="fill", fill_value=0)  # [A, D]
    w = jnp.where(keep, top_w.reshape(A), 0.0).astype(cdt)
    return jnp.einsum("nkd,nk->nd", y_a.reshape(N, k, D), w.reshape(N, k))


def capacity_per_expert(factor: float, assignments: int, num_experts: int) -> int | None:
    """C = ceil(factor · A / E) token copies per expert, or None (dropless) for factor 0."""
    if not factor:
        return None
    return max(1, math.ceil(factor * assignments / num_experts))


def _axes(entry) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def sparse_experts(x, top_idx, top_w, gate, up, down, *, capacity_factor, kernel, cdt):
    """Each token through its k experts only. Shapes as dense_experts; E = gate.shape[0].

    Without a mesh: one device, all experts. Under a mesh: shard_map with the ring of the module
    docstring (capacity counts the assignments of one expert group's gathered tokens).
    """
    B, S, D = x.shape
    k, E = top_idx.shape[-1], gate.shape[0]
    kernel = resolve_kernel(kernel)

    def rows_through_experts(x, idx, w, gate, up, down, first, cap):  # [b, S, ...] -> [b, S, D]
        b = x.shape[0]
        flat = (x.reshape(b * S, D), idx.reshape(b * S, k), w.reshape(b * S, k))
        y = local_experts(
            *flat, gate, up, down, first_expert=first, capacity=cap, kernel=kernel, cdt=cdt
        )
        return y.reshape(b, S, D)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        cap = capacity_per_expert(capacity_factor, B * S * k, E)
        return rows_through_experts(x, top_idx, top_w, gate, up, down, 0, cap)

    x_spec = logical_to_spec(("batch", "length", "act_embed"), x.shape, mesh)
    idx_spec = logical_to_spec(("batch", "length", None), top_idx.shape, mesh)
    gate_spec = logical_to_spec(("expert", "embed", "expert_mlp"), gate.shape, mesh)
    down_spec = logical_to_spec(("expert", "expert_mlp", "embed"), down.shape, mesh)
    ep = _axes(gate_spec[0])  # mesh axes the experts are split over: ("expert",) or ()
    tokens_split_over_ep = bool(ep) and set(ep) <= set(_axes(x_spec[0]))
    n_ep = math.prod(mesh.shape[a] for a in ep)
    rows_per_device = B // math.prod(mesh.shape[a] for a in _axes(x_spec[0]))
    group_tokens = rows_per_device * (n_ep if tokens_split_over_ep else 1) * S
    cap = capacity_per_expert(capacity_factor, group_tokens * k, E)

    def body(x, idx, w, gate, up, down):
        for a in _axes(gate_spec[1]):  # ZeRO-3: the whole D of this device's experts
            gate = jax.lax.all_gather(gate, a, axis=1, tiled=True)
            up = jax.lax.all_gather(up, a, axis=1, tiled=True)
        for a in _axes(down_spec[2]):
            down = jax.lax.all_gather(down, a, axis=2, tiled=True)
        if tokens_split_over_ep:  # the expert group's tokens, on each of its devices
            x, idx, w = (jax.lax.all_gather(t, ep, axis=0, tiled=True) for t in (x, idx, w))
        El = gate.shape[0]
        first = jax.lax.axis_index(ep) * El if ep else 0
        y = rows_through_experts(x, idx, w, gate, up, down, first, cap)
        f_axes = _axes(gate_spec[2])  # a tensor-sharded Fe leaves partial sums
        if f_axes:
            y = jax.lax.psum(y, f_axes)
        if tokens_split_over_ep:  # back to the token's own device, summed over the k experts
            y = jax.lax.psum_scatter(y, ep, scatter_dimension=0, tiled=True)
        elif ep:
            y = jax.lax.psum(y, ep)
        return y

    return jax.shard_map(
        body,
        in_specs=(x_spec, idx_spec, idx_spec, gate_spec, gate_spec, down_spec),
        out_specs=x_spec,
    )(x, top_idx, top_w, gate, up, down)
