"""Per-device FLOPs of one MoE layer, forward and backward: the dense dispatch vs the sparse one.

    python experiments/benchmarks/moe_flops.py          # Qwen3-30B-A3B, fsdp 4 x expert 16
    python experiments/benchmarks/moe_flops.py --fsdp 4 --expert 4 --rows 16

One MoE layer of a preset (router + experts + load-balance loss) at the config's compute dtype,
on a mesh of simulated CPU devices, with a micro-batch of --rows rows of --slots slots (rows split
over data x fsdp x expert as the trainer splits them). Each program (value and gradient of
Σ y·probe + aux with respect to the layer's parameters and its input) is lowered and compiled
for that mesh, and its dots are read from the compiled, SPMD-partitioned HLO
(gspo_jax/planning/hlo_cost.py):
per device, FLOPs = 2 · (output elements) · (contracted elements) summed over every dot.

The CPU lowers jax.lax.ragged_dot as a masked dense matmul over all of a device's experts, so the
compiled CPU program would count the sparse dispatch's grouped matmuls E_local times over. The
script therefore swaps the grouped matmul for a plain [M, K] x [K, N] dot of the same buffer
(the FLOPs of a grouped matmul whose groups cover all M rows: what megablox's gmm runs on TPU,
which visits only the row tiles of non-empty groups) and counts that. The buffer's M is static:
  capacity c        M = E_local · ceil(c · A / E): the work at capacity factor c (c = 1 is the
                    dropless dispatch's work when routing is balanced)
  dropless bound    M = A (every gathered assignment): the dropless buffer, the work only if all
                    of a device group's tokens chose this device's experts
where A is the number of token-expert assignments of the tokens a device gathers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

_p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
_p.add_argument("--preset", default="qwen3_30b_a3b")
_p.add_argument("--fsdp", type=int, default=4)
_p.add_argument("--expert", type=int, default=16)
_p.add_argument("--rows", type=int, default=64, help="rows of one micro-batch (global)")
_p.add_argument("--slots", type=int, default=1280, help="slots per row (prompt + response)")
ARGS = _p.parse_args()
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_force_host_platform_device_count={ARGS.fsdp * ARGS.expert}"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from gspo_jax import models, sharding  # noqa: E402
from gspo_jax.models import moe_dispatch  # noqa: E402
from gspo_jax.models.layers import MoE  # noqa: E402
from gspo_jax.planning import hlo_cost  # noqa: E402


def dense_proxy(lhs, rhs, group_sizes, kernel):
    """A grouped matmul's FLOPs with all M rows in groups: lhs [M, K] x rhs[0] [K, N]."""
    del group_sizes, kernel
    return lhs @ rhs[0]


@contextlib.contextmanager
def rows_over(axes):
    """sharding.RULES with batch rows over ``axes``: the dense dispatch is measured as it ran
    before the sparse one, with rows over (data, fsdp) and repeated along the expert axis."""
    saved = sharding.RULES
    sharding.RULES = tuple((n, axes if n == "batch" else t) for n, t in saved)
    try:
        yield
    finally:
        sharding.RULES = saved


def layer_program(cfg, mesh):
    """Compiled value-and-grad of one MoE layer on ``mesh`` (abstract inputs, nothing runs)."""
    graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: MoE(cfg, rngs=nnx.Rngs(0))))
    abs_state = sharding.with_shardings(abs_state, sharding.state_shardings(abs_state, mesh))
    rows = (ARGS.rows, ARGS.slots)
    x = jax.ShapeDtypeStruct(
        (*rows, cfg.hidden_size), cfg.compute_dtype, sharding=sharding.rows_sharding(mesh, 3)
    )
    mask = jax.ShapeDtypeStruct(rows, jnp.float32, sharding=sharding.rows_sharding(mesh, 2))

    def loss(state, x, mask, probe):
        y, aux, _ = nnx.merge(graphdef, state)(x, mask)
        return jnp.sum(y.astype(jnp.float32) * probe) + aux

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    with sharding.use_mesh(mesh):
        t0 = time.time()
        compiled = grad.lower(abs_state, x, mask, x).compile()
    return compiled, time.time() - t0


def main():
    mesh = sharding.make_mesh({"fsdp": ARGS.fsdp, "expert": ARGS.expert})
    base = models.get_model_config(ARGS.preset)
    E, k = base.num_experts, base.experts_per_token
    gathered = ARGS.rows // sharding.row_shards(mesh) * ARGS.expert * ARGS.slots  # per device
    print(
        f"{ARGS.preset}: one MoE layer (E={E}, k={k}, D={base.hidden_size}, "
        f"Fe={base.moe_mlp_dim}, {base.dtype}), forward + backward; mesh fsdp {ARGS.fsdp} x "
        f"expert {ARGS.expert} ({mesh.size} simulated devices); micro-batch {ARGS.rows} rows x "
        f"{ARGS.slots} slots; per-device FLOPs from the compiled HLO's dots"
    )
    variants = [("dense (rows data x fsdp)", dict(moe_dispatch="dense"), None)]
    # the buffer layout of TPU's megablox (groups unpadded); the proxy stands in for its gmm
    for c in (1.0, 1.25):
        variants.append((f"sparse, capacity {c}", dict(moe_capacity_factor=c), c))
    variants.append(("sparse, dropless bound", dict(moe_capacity_factor=0.0), 0.0))
    variants[1:] = [(n, {**f, "moe_kernel": "megablox"}, c) for n, f, c in variants[1:]]
    real = moe_dispatch.grouped_matmul
    rows = []
    try:
        moe_dispatch.grouped_matmul = dense_proxy
        for name, fields, c in variants:
            cfg = dataclasses.replace(base, **fields)
            rule = ("data", "fsdp") if c is None else dict(sharding.RULES)["batch"]
            with rows_over(rule):
                compiled, secs = layer_program(cfg, mesh)
            flops = hlo_cost.hlo_text_cost(compiled.as_text())[0]
            if c is None:
                buffer = "-"
            elif c:
                El = E // ARGS.expert
                buffer = str(El * moe_dispatch.capacity_per_expert(c, gathered * k, E))
            else:
                buffer = str(gathered * k)
            rows.append((name, buffer, flops, secs))
    finally:
        moe_dispatch.grouped_matmul = real
    dense = rows[0][2]
    print(f"{'dispatch':<26} {'buffer rows':>12} {'TFLOP/device':>13} {'dense/this':>11} compile")
    for name, buffer, flops, secs in rows:
        print(f"{name:<26} {buffer:>12} {flops / 1e12:13.3f} {dense / flops:10.1f}x {secs:6.1f} s")


if __name__ == "__main__":
    main()
