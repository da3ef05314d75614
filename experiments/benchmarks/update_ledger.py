"""The update ledger: the FLOPs one update of an RL step should take at a real model's shape
against what its compiled program does, and (where it runs) its time and MFU.

Dimension legend: B rows per step (P prompts x G samples), S = Lp + T slots per row, N the
decoder's matmul parameters (every layer's projections and the output matrix; an MoE's experts
counted k / E), L layers, H query heads, Dh head dim, D devices of the mesh.

The update is the experiment's own (configs/qwen3_gsm8k.py at model=qwen3_0_6b: bfloat16
compute, float32 master weights, 4 minibatches, the suggested micro-batches and remat "full"),
built as the dry run builds it (rl.build.build_run, abstract state: nothing allocated) and
compiled for this backend on the config's mesh; per device:
  ideal     6 x N x B x S (forward 2, backward 4 per parameter and token; the standard MFU count)
            + attention's 3 x 4 x L x H x Dh x S^2 / 2 x B (causal half), / D
  remat     the ideal plus the recomputed forward of remat "full" (8 instead of 6 per parameter)
  compiled  planning/hlo_cost's trip-counted dot FLOPs (the scans over minibatches,
            micro-batches, layers and log-prob chunks counted every trip)
With --run (an accelerator, or tiny shapes on the CPU) the compiled update is also executed on
zero-filled state and batch (a matmul's time does not depend on its values), timed (median of
--repeats after a warm-up), and MFU = ideal FLOPs / time / the measured bfloat16 matmul peak
(device_check.matmul_peak) is reported.

    PYTHONPATH=. python experiments/benchmarks/update_ledger.py [--config SPEC] [--out F.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

DEFAULT_CONFIG = "configs/qwen3_gsm8k.py:model=qwen3_0_6b,slice=v5p-8"


def _devices_for(spec: str) -> int:
    """The simulated CPU devices the config's slice needs (before JAX starts its backend)."""
    from gspo_jax.config import load_config_file
    from gspo_jax.planning import memory_plan

    config = load_config_file(spec)
    return memory_plan.get_slice(config.slice).devices if config.slice else 1


def ideal_flops(run) -> dict:
    """Ideal update FLOPs of one step, global (module docstring)."""
    cfg, spec = run.model_cfg, run.step
    D, F, V = cfg.hidden_size, cfg.mlp_dim, cfg.vocab_size
    H, K, Dh, L = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    attn = D * (H + 2 * K) * Dh + H * Dh * D
    mlp = 3 * D * (cfg.moe_mlp_dim * cfg.experts_per_token if cfg.is_moe else F)
    router = D * cfg.num_experts if cfg.is_moe else 0
    N = L * (attn + mlp + router) + D * V
    B, S = spec.rows, spec.prompt_len + spec.response_len
    attention = 3 * 4 * L * H * Dh * S * S / 2 * B
    ideal = 6 * N * B * S + attention
    remat = ideal + (2 * N * B * S + attention / 3 if cfg.remat == "full" else 0)
    return {"matmul_params": N, "rows": B, "slots": S, "ideal": ideal, "with_remat": remat}


def build(spec: str):
    """(run, phases, abstract state) of the config, as the dry run builds them."""
    from gspo_jax.config import load_config_file
    from gspo_jax.rl import batch as rl_batch
    from gspo_jax.rl import build as exp
    from gspo_jax.rl import step as ts

    config = load_config_file(spec)
    run = exp.build_run(config)
    abs_state = exp.abstract_state(run, run.abs_params)
    phases = ts.make_phases(run, abs_state, with_ref=rl_batch.uses_reference(run))
    return run, phases, abs_state


def ledger(spec: str, execute: bool = False, repeats: int = 3, peak: float | None = None):
    """The update's ledger entry (module docstring) as a dict."""
    import jax
    import jax.numpy as jnp

    from gspo_jax import sharding
    from gspo_jax.planning import hlo_cost
    from gspo_jax.rl.batch import RLBatch

    run, phases, abs_state = build(spec)
    mesh = run.mesh
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding.replicated(mesh))
    batch = RLBatch.abstract(run)
    with sharding.use_mesh(mesh):
        t0 = time.perf_counter()
        traced = phases.update.trace(abs_state, batch, key)
        compiled = traced.lower().compile()
        compile_s = time.perf_counter() - t0
    cost = hlo_cost.program_cost(compiled, 1, traced.jaxpr, mesh.size)
    ideal = ideal_flops(run)
    n = mesh.size
    out = {
        "config": spec,
        "model": run.model_cfg.name,
        "mesh": dict(mesh.shape),
        "remat": run.model_cfg.remat,
        "minibatches": run.step.num_minibatches,
        **ideal,
        "ideal_per_device": ideal["ideal"] / n,
        "with_remat_per_device": ideal["with_remat"] / n,
        "compiled_per_device": cost.total_flops,
        "compiled_over_ideal": cost.total_flops / (ideal["ideal"] / n),
        "compiled_over_remat": cost.total_flops / (ideal["with_remat"] / n),
        "compile_s": compile_s,
    }
    if execute:
        zeros = lambda a: jax.jit(  # noqa: E731
            lambda: jnp.zeros(a.shape, a.dtype), out_shardings=a.sharding
        )()
        state = jax.tree.map(zeros, abs_state)
        b = jax.tree.map(zeros, batch)
        b = b.replace(mask=jnp.ones_like(b.mask), prompt_lengths=b.prompt_lengths + 1)
        k = jax.device_put(jax.random.key_data(jax.random.key(0)), key.sharding)
        args = lambda: (jax.tree.map(jnp.copy, state), b, k)  # noqa: E731  (state is donated)
        jax.block_until_ready(compiled(*args()))
        times = []
        for _ in range(repeats):
            a = args()
            jax.block_until_ready(a)
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*a))
            times.append(time.perf_counter() - t0)
        times.sort()
        seconds = times[len(times) // 2]
        out["update_s"] = seconds
        out["model_flops_per_s_per_device"] = ideal["ideal"] / n / seconds
        if peak:
            out["matmul_peak_per_device"] = peak
            out["mfu"] = out["model_flops_per_s_per_device"] / peak
    return out


def format_entry(e: dict) -> str:
    lines = [
        f"update ledger: {e['model']} mesh {e['mesh']} remat {e['remat']}, "
        f"{e['rows']} rows x {e['slots']} slots, {e['minibatches']} minibatches",
        f"  matmul parameters N        {e['matmul_params'] / 1e9:10.3f} B",
        f"  ideal (6 N tokens + attn)  {e['ideal_per_device'] / 1e12:10.2f} TFLOP/device",
        f"  with remat recompute       {e['with_remat_per_device'] / 1e12:10.2f} TFLOP/device",
        f"  compiled (hlo_cost)        {e['compiled_per_device'] / 1e12:10.2f} TFLOP/device "
        f"({e['compiled_over_ideal']:.2f}x ideal, {e['compiled_over_remat']:.2f}x with remat)",
        f"  compile                    {e['compile_s']:10.1f} s",
    ]
    if "update_s" in e:
        lines.append(f"  update time                {e['update_s']:10.3f} s")
        if "mfu" in e:
            lines.append(f"  MFU                        {100 * e['mfu']:10.1f} %")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--run", action="store_true", help="also execute and time the update")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if "jax" not in sys.modules and not os.environ.get("GSPO_UPDATE_LEDGER_DEVICE"):
        # the slice's devices, simulated on the CPU (as main.py --dry_run does)
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={_devices_for(a.config)}"
        )
        import jax

        jax.config.update("jax_platforms", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine import describe, write_report

    e = ledger(a.config, execute=a.run, repeats=a.repeats)
    print(format_entry(e))
    if a.out:
        write_report({"machine": describe(), "update": e}, a.out)
    return e


if __name__ == "__main__":
    main()
