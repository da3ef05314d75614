"""The memory plan of an experiment on a TPU slice, read from its compiled programs (the dry run).

    plan = memory_plan.plan(config)          # compiles the rollout and the update, real shapes
    print(memory_plan.format_plan(plan))     # per-device GiB; plan["fits"]
    python -m gspo_jax.main --config configs/qwen3_gsm8k.py:model=qwen3_0_6b,slice=v5p-8 \
        --workdir /tmp/plan --dry_run

Before paying for a slice, a researcher wants to know whether a config fits its HBM. The dry run
builds the abstract train state on the requested mesh (nothing is allocated), lowers and compiles
the two programs of an RL step at the run's real shapes (the rollout: P prompts x G samples, Lp + T
cache slots; the update: μ·K minibatches of B/K rows), and reads per-device sizes from them:

    parameters         float32 master weights, this device's shard (from the shardings)
    optimizer          Adam moments and count, this device's shard
    reference          a second copy of the parameters when kl_coef > 0
    update peak        XLA's peak for the update program (arguments: state and batch; temporaries:
                       activations, gradients, the chunked log-softmax)
    rollout peak       XLA's peak for the rollout program (parameters, KV cache in the rollout
                       dtype, logits), plus the optimizer state that stays resident meanwhile

The step needs the larger of the two peaks (plus the reference copy); it fits when that is at most
HEADROOM of the slice's HBM per device. Without an accelerator the programs are compiled for
simulated CPU devices (``--xla_force_host_platform_device_count``, set by main.py's --dry_run): the
shardings and shapes are the slice's, but the buffer assignment is the CPU compiler's, so the
activation figures are an estimate (TPU fusion usually needs less); parameter and optimizer figures
are exact.

Slices (config.slice): ``v5p-N`` and ``v4-N`` count TensorCores (two per chip), ``v5e-N`` and
``v6e-N`` count chips; HBM per chip: v4 32 GiB, v5e 16 GiB, v5p 95 GiB, v6e 32 GiB.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from gspo_jax import config as config_lib
from gspo_jax import sharding
from gspo_jax import train_step as ts

GIB = 2**30
HEADROOM = 0.9  # keep 10 % of HBM for the runtime, fragmentation and what XLA does not count


@dataclasses.dataclass(frozen=True)
class Slice:
    devices: int  # chips (JAX devices)
    hbm_gib: float  # HBM per chip


_HBM = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}


def get_slice(name: str) -> Slice:
    """``v5p-8`` -> Slice(devices=4, hbm_gib=95.0): a TPU slice's chips and HBM per chip."""
    family, _, count = name.partition("-")
    if family not in _HBM or not count.isdigit() or int(count) % _CORES_PER_CHIP[family]:
        raise config_lib.ConfigError(
            f"config.slice={name!r} is not a TPU slice name; use <family>-<count> with family in "
            f"{sorted(_HBM)} (v4 and v5p count TensorCores, two per chip: v5p-8 is 4 chips; v5e "
            "and v6e count chips), e.g. v5p-8, v5p-32, v6e-8"
        )
    return Slice(int(count) // _CORES_PER_CHIP[family], _HBM[family])


def shard_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with shardings (the largest shard)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def _peak(compiled) -> int:
    """Peak bytes of a compiled program on one device: arguments + temporaries + the outputs not
    aliased to (donated) arguments, or the backend's own peak when it is larger (the CPU
    backend's peak counts only the arguments, so the sum is the bound used there)."""
    m = compiled.memory_analysis()
    out = max(m.output_size_in_bytes - m.alias_size_in_bytes, 0)
    total = m.argument_size_in_bytes + m.temp_size_in_bytes + out
    return int(max(total, getattr(m, "peak_memory_in_bytes", 0) or 0))


def abstract_batch(run, abs_state) -> dict:
    """ShapeDtypeStructs of one RL batch at the run's shapes (rows sharded like the trainer's)."""
    rl, mesh = run.config.rl, run.mesh
    P, G, T = rl.prompts_per_step, rl.group_size, rl.max_new_tokens
    B, Lp = P * G, run.task.max_prompt_len

    def rows(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.rows_sharding(mesh, len(shape)))

    batch = {
        "prompts": rows((B, Lp), jnp.int32),
        "prompt_lengths": rows((B,), jnp.int32),
        "responses": rows((B, T), jnp.int32),
        "mask": rows((B, T), jnp.float32),
        "old_logp": rows((B, T), jnp.float32),
        "adv": rows((B,), jnp.float32),
    }
    if run.uses_rollout_logp:
        batch["rollout_logp"] = rows((B, T), jnp.float32)
    if run.objective.kl_coef > 0:
        batch["ref_logp"] = rows((B, T), jnp.float32)
    if rl.routing_replay:
        cfg = run.model_cfg
        batch["routes"] = rows((B, cfg.num_layers, Lp + T, cfg.experts_per_token), jnp.int32)
    return batch


def plan(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Compiles the rollout and the update of ``config`` on its mesh and returns the plan.

    Keys: slice, devices, mesh, the per-device bytes listed in the module docstring, needed,
    hbm, fits, and the compile seconds of each program.
    """
    from gspo_jax import experiment as exp

    slc = get_slice(config.slice)
    if jax.device_count() != slc.devices:
        raise config_lib.ConfigError(
            f"the dry run of slice {config.slice} needs {slc.devices} devices, but JAX has "
            f"{jax.device_count()}: run it through `python -m gspo_jax.main ... --dry_run`, which "
            "simulates the slice's devices on the CPU"
        )
    run = exp.build_run(config)
    abs_state = exp.abstract_state(run, run.abs_params)
    phases = ts.make_phases(run, abs_state, with_ref=run.objective.kl_coef > 0)
    rl, mesh = run.config.rl, run.mesh
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding.replicated(mesh))
    P, Lp = rl.prompts_per_step, run.task.max_prompt_len
    prompts = jax.ShapeDtypeStruct((P, Lp), jnp.int32, sharding=sharding.rows_sharding(mesh, 2))
    lengths = jax.ShapeDtypeStruct((P,), jnp.int32, sharding=sharding.rows_sharding(mesh, 1))
    with sharding.use_mesh(mesh):
        t0 = time.time()
        rollout = phases.rollout.lower(abs_state.params, prompts, lengths, key).compile()
        t1 = time.time()
        update = phases.update.lower(abs_state, abstract_batch(run, abs_state), key).compile()
        t2 = time.time()
    params = shard_bytes(abs_state.params)
    opt = shard_bytes(abs_state.opt_state)
    ref = params if run.objective.kl_coef > 0 else 0
    update_peak, rollout_peak = _peak(update), _peak(rollout)
    needed = max(update_peak, rollout_peak + opt) + ref
    hbm = int(slc.hbm_gib * GIB)
    return {
        "slice": config.slice,
        "devices": slc.devices,
        "mesh": dict(mesh.shape),
        "model": run.model_cfg.name,
        "shapes": f"P={P} G={rl.group_size} Lp={Lp} T={rl.max_new_tokens} K={rl.num_minibatches}",
        "params": params,
        "optimizer": opt,
        "reference": ref,
        "update_peak": update_peak,
        "rollout_peak": rollout_peak + opt,
        "needed": needed,
        "hbm": hbm,
        "fits": needed <= HEADROOM * hbm,
        "compile_rollout_s": t1 - t0,
        "compile_update_s": t2 - t1,
    }


def format_plan(p: dict[str, Any]) -> str:
    """A small per-device table of the plan (GiB)."""
    g = lambda b: f"{b / GIB:8.3f}"  # noqa: E731
    mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items())
    lines = [
        f"memory plan: {p['model']} on {p['slice']} ({p['devices']} devices, mesh {mesh}; "
        f"{p['shapes']})",
        f"  parameters (float32)        {g(p['params'])} GiB per device",
        f"  optimizer state             {g(p['optimizer'])} GiB",
        f"  reference parameters        {g(p['reference'])} GiB",
        f"  update peak (compiled)      {g(p['update_peak'])} GiB",
        f"  rollout peak + optimizer    {g(p['rollout_peak'])} GiB",
        f"  needed                      {g(p['needed'])} GiB of {p['hbm'] / GIB:.0f} GiB HBM "
        f"({'fits' if p['fits'] else 'DOES NOT FIT'}: limit {HEADROOM:.0%})",
        f"  compile: rollout {p['compile_rollout_s']:.1f} s, update {p['compile_update_s']:.1f} s",
    ]
    return "\n".join(lines)


def check_fits(p: dict[str, Any]) -> None:
    """ConfigError with the numbers when the plan does not fit the slice."""
    if not p["fits"]:
        raise config_lib.ConfigError(
            f"{p['model']} does not fit {p['slice']}: a step needs {p['needed'] / GIB:.1f} GiB per "
            f"device (update peak {p['update_peak'] / GIB:.1f}, rollout peak with optimizer "
            f"{p['rollout_peak'] / GIB:.1f}, parameters {p['params'] / GIB:.1f}, optimizer "
            f"{p['optimizer'] / GIB:.1f}) of {p['hbm'] / GIB:.0f} GiB (limit {HEADROOM:.0%}). Use "
            "a larger slice, more fsdp, fewer prompts per step or more minibatches"
        )
