"""The memory plan of an experiment on a TPU slice, read from its compiled programs (the dry run).

    plan = memory_plan.plan(config)          # compiles the rollout and the update, real shapes
    print(memory_plan.format_plan(plan))     # per-device GiB; plan["fits"]
    python -m gspo_jax.main --config configs/qwen3_gsm8k.py:model=qwen3_0_6b,slice=v5p-8 \
        --workdir /tmp/plan --dry_run

Before paying for a slice, a researcher wants to know whether a config fits its HBM. The dry run
builds the abstract train state on the requested mesh (nothing is allocated), lowers and compiles
the two programs of an RL step at the run's real shapes (the rollout: P prompts x G samples, Lp + T
cache slots; the update: μ·K minibatches of B/K rows), and reads per-device sizes from them:

    parameters         float32 master weights, this device's shard (from the shardings); with
                       LoRA (config.lora.rank > 0) the frozen base and the adapters, and with
                       QLoRA (config.lora.base_quant) the base's projections as qvalues + scales
    optimizer          Adam moments and count, this device's shard (with LoRA: the adapters')
    reference          a second copy of the parameters when kl_coef > 0 or rl.log_kl_ref (none
                       with LoRA: the policy holds it, adapters.keeps_reference_copy)
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

A population's plan (config.population.seeds set) is planning/population_plan.py's.

Slices (config.slice): ``v5p-N`` and ``v4-N`` count TensorCores (two per chip), ``v5e-N`` and
``v6e-N`` count chips; per chip HBM, peak bf16 FLOP/s and HBM bandwidth are in CHIPS.

Time (an estimate). The plan also counts, per device, the FLOPs and HBM bytes of three compiled
programs -- one decode step of the rollout (compiled alone: rollout.decode_step, over the
shared-prefix cache of the middle decode phase, see decode_chunks), the rollout and
the update -- with every loop counted its trip count (gspo_jax/planning/hlo_cost.py; XLA's own
cost_analysis counts a loop body once, and the layers, minibatches, micro-batches and decode
steps are all loops), and turns them into a roofline time: max(FLOPs / peak FLOP/s, bytes / HBM
bandwidth) of the chip. The rollout is its decode steps (T - 1 of them, the most a rollout runs)
at the step's roofline plus the rest (prefill, sampling) at its own. It assumes perfect overlap
and peak rates, and its bytes come from the CPU compiler's fusion: a lower bound on a TPU's
time, not a measurement.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from gspo_jax import config as config_lib
from gspo_jax import models, rollout, sharding
from gspo_jax.planning import hlo_cost
from gspo_jax.rl import adapters, build
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl import step as ts
from gspo_jax.rl.batch import RLBatch

GIB = 2**30
HEADROOM = 0.9  # keep 10 % of HBM for the runtime, fragmentation and what XLA does not count


@dataclasses.dataclass(frozen=True)
class Chip:
    hbm_gib: float  # HBM per chip
    bf16_tflops: float  # peak dense bf16 matmul throughput per chip, 1e12 FLOP/s
    hbm_gbps: float  # HBM bandwidth per chip, 1e9 bytes/s
    cores: int  # TensorCores per chip (what a v4-N / v5p-N slice name counts)
    ici_gbps: float | None = None  # bidirectional inter-chip interconnect, 1e9 bytes/s per chip


# Google's published per-chip figures (Cloud TPU documentation, system architecture pages; v4's
# page gives no per-chip ICI figure).
CHIPS = {
    "v4": Chip(hbm_gib=32.0, bf16_tflops=275.0, hbm_gbps=1200.0, cores=2),
    "v5e": Chip(hbm_gib=16.0, bf16_tflops=197.0, hbm_gbps=819.0, cores=1, ici_gbps=400.0),
    "v5p": Chip(hbm_gib=95.0, bf16_tflops=459.0, hbm_gbps=2765.0, cores=2, ici_gbps=1200.0),
    "v6e": Chip(hbm_gib=32.0, bf16_tflops=918.0, hbm_gbps=1640.0, cores=1, ici_gbps=800.0),
}


@dataclasses.dataclass(frozen=True)
class Slice:
    devices: int  # chips (JAX devices)
    hbm_gib: float  # HBM per chip
    chip: Chip | None = None

    def roofline_s(self, cost: hlo_cost.Cost) -> float:
        """Seconds of `cost` (per device) at the chip's peak FLOP/s or HBM bandwidth, whichever
        bounds it (an estimate: perfect overlap, peak rates)."""
        return max(
            cost.total_flops / (self.chip.bf16_tflops * 1e12),
            cost.bytes / (self.chip.hbm_gbps * 1e9),
        )


def get_slice(name: str) -> Slice:
    """``v5p-8`` -> Slice(devices=4, hbm_gib=95.0, chip=CHIPS["v5p"]): a TPU slice's chips."""
    family, _, count = name.partition("-")
    if family not in CHIPS or not count.isdigit() or int(count) % CHIPS[family].cores:
        raise config_lib.ConfigError(
            f"config.slice={name!r} is not a TPU slice name; use <family>-<count> with family in "
            f"{sorted(CHIPS)} (v4 and v5p count TensorCores, two per chip: v5p-8 is 4 chips; v5e "
            "and v6e count chips), e.g. v5p-8, v5p-32, v6e-8"
        )
    chip = CHIPS[family]
    return Slice(int(count) // chip.cores, chip.hbm_gib, chip)


def shard_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with shardings (the largest shard)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def peak_bytes(compiled) -> int:
    """Peak bytes of a compiled program on one device: arguments + temporaries + the outputs not
    aliased to (donated) arguments, or the backend's own peak when it is larger (the CPU
    backend's peak counts only the arguments, so the sum is the bound used there)."""
    m = compiled.memory_analysis()
    out = max(m.output_size_in_bytes - m.alias_size_in_bytes, 0)
    total = m.argument_size_in_bytes + m.temp_size_in_bytes + out
    return int(max(total, getattr(m, "peak_memory_in_bytes", 0) or 0))


def plan(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Compiles the rollout and the update of ``config`` on its mesh and returns the plan.

    Keys: slice, devices, mesh, the per-device bytes listed in the module docstring, needed,
    hbm, fits, and the compile seconds of each program.
    """
    slc = get_slice(config.slice)
    if jax.device_count() != slc.devices:
        raise config_lib.ConfigError(
            f"the dry run of slice {config.slice} needs {slc.devices} devices, but JAX has "
            f"{jax.device_count()}: run it through `python -m gspo_jax.main ... --dry_run`, which "
            "simulates the slice's devices on the CPU"
        )
    run = build.build_run(config)
    abs_state = build.abstract_state(run, run.abs_params)
    phases = ts.make_phases(run, abs_state, with_ref=rl_batch.uses_reference(run))
    spec, mesh = run.step, run.mesh
    P, Lp, T = spec.prompts, spec.prompt_len, spec.response_len
    upd = update_part(run, phases.update, abs_state, mesh, slc)
    roll = rollout_part(run, phases.rollout, abs_state.params, mesh, slc)
    costs = {**roll["costs"], "update": upd["cost"]}
    times = {**roll["times"], "update": upd["time"]}
    rollout_peak, steps, engine = roll["peak"], roll["decode_steps"], roll["engine"]
    (t_roll, t_step), t_upd = roll["compile_s"], upd["compile_s"]
    params = shard_bytes(abs_state.params)  # QLoRA: the quantized base as it is held
    base_quant = adapters.base_quant(run)
    opt = shard_bytes(abs_state.opt_state)
    ref = params if adapters.keeps_reference_copy(run) else 0
    update_peak = upd["peak"]
    needed = max(update_peak, rollout_peak + opt) + ref
    hbm = int(slc.hbm_gib * GIB)
    return {
        "slice": config.slice,
        "devices": slc.devices,
        "mesh": dict(mesh.shape),
        "model": run.model_cfg.name + adapters.summary(run),
        "shapes": f"P={P} G={spec.group_size} Lp={Lp} T={T} K={spec.num_minibatches}",
        "params": params,
        "base_quant": base_quant,
        # the parameters' bytes were the base held in float32 (QLoRA's saving is the difference)
        "params_float": shard_bytes(float_abstract(run)[1]) if base_quant else params,
        "optimizer": opt,
        "reference": ref,
        "update_peak": update_peak,
        "rollout_peak": rollout_peak + opt,
        "needed": needed,
        "hbm": hbm,
        "fits": needed <= HEADROOM * hbm,
        "compile_rollout_s": t_roll[0],
        "compile_update_s": t_upd[0],
        "compile_decode_step_s": t_step[0],
        "compile_cpu_s": {"rollout": t_roll[1], "update": t_upd[1]},
        "chip": slc.chip,
        "decode_steps": steps,
        "costs": costs,
        "times": times,
        "engine": engine,
        "rollout_weights": rollout_weight_bytes(run),
    }


def _clock() -> tuple[float, float]:
    """(wall, CPU) seconds: CPU seconds are fair to compare under load."""
    return time.time(), time.process_time()


def _key(mesh):
    return jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding.replicated(mesh))


def update_part(run, update_fn, abs_state, mesh, slc: Slice) -> dict:
    """Compiles the update (``update_fn``: phases.update) on ``mesh`` at the run's batch and
    returns per device: peak (bytes), cost, time (the roofline) and compile_s (wall, CPU)."""
    with sharding.use_mesh(mesh):
        t0 = _clock()
        traced = update_fn.trace(abs_state, RLBatch.abstract(run), _key(mesh))
        compiled = traced.lower().compile()
        t1 = _clock()
    cost = hlo_cost.program_cost(compiled, 1, traced.jaxpr, mesh.size)
    return {
        "peak": peak_bytes(compiled),
        "cost": cost,
        "time": slc.roofline_s(cost),
        "compile_s": (t1[0] - t0[0], t1[1] - t0[1]),
    }


def rollout_part(run, rollout_fn, params, mesh, slc: Slice) -> dict:
    """Compiles the rollout (``rollout_fn``, jitted: phases.rollout, or the pipeline's program on
    the rollout's own mesh) and one decode step on ``mesh`` with the abstract ``params`` sharded
    for it, and returns per device of ``mesh``: peak (bytes), costs and times of "decode_step" and
    "rollout" (the roofline, module docstring), decode_steps, the engine's sizes (continuous) and
    compile_s ((wall, CPU) of the rollout, (wall, CPU) of the decode step)."""
    spec = run.step
    T = spec.response_len
    continuous = spec.rollout_engine == "continuous"
    with sharding.use_mesh(mesh):
        t0 = _clock()
        rollout_traced = rollout_fn.trace(*_rollout_args(run, params, mesh, _key(mesh)))
        compiled = rollout_traced.lower().compile()
        t1 = _clock()
        if continuous:
            step_fn, step_args = _engine_decode_step(run, params)
        else:
            step_fn, step_args = _decode_step_fn(run), _decode_step_args(run, params, mesh)
        step_traced = step_fn.trace(*step_args)
        step = step_traced.lower().compile()
        t2 = _clock()
    n = mesh.size
    # Loops counted at their trip counts: the static engine's decode phases run at most
    # decode_block steps each; the continuous engine's loop (data-dependent) once, its decode
    # steps added below.
    trips = 1 if continuous else max(min(T - 1, run.model_cfg.decode_block), 1)
    costs = {
        "decode_step": hlo_cost.program_cost(step, 1, step_traced.jaxpr, n),
        "rollout": hlo_cost.program_cost(compiled, trips, rollout_traced.jaxpr, n),
    }
    steps = max(T - 1, 0)  # decode steps of the longest rollout (the first token is prefill's)
    engine = {}
    if continuous:
        engine = _engine_plan(run)
        steps = engine["decode_steps_max"]
        # the loop body counted once: one refill (a prompt's prefill) and one decode step;
        # every prompt of the queue is prefilled once
        once = costs["rollout"] + costs["decode_step"] * -1
        rest = hlo_cost.Cost(
            *(engine["queue_prompts"] * max(v, 0.0) for v in dataclasses.astuple(once))
        )
    else:
        rest = costs["rollout"] + costs["decode_step"] * -steps
        rest = hlo_cost.Cost(*(max(v, 0.0) for v in dataclasses.astuple(rest)))
    times = {
        "decode_step": slc.roofline_s(costs["decode_step"]),
        "rollout": slc.roofline_s(rest) + steps * slc.roofline_s(costs["decode_step"]),
    }
    return {
        "peak": peak_bytes(compiled),
        "costs": costs,
        "times": times,
        "decode_steps": steps,
        "engine": engine,
        "compile_s": ((t1[0] - t0[0], t1[1] - t0[1]), (t2[0] - t1[0], t2[1] - t1[1])),
    }


def _rollout_args(run, params, mesh, key) -> tuple:
    """Abstract arguments of phases.rollout: (params, prompts [Q, Lp], lengths [Q], key), and
    with partial rollouts the queue's carried rows [Q·G, T] and the policy version; Q = P, or
    (1 + k)·P groups with partial rollouts."""
    spec = run.step
    Q, Lp, T = spec.prompts * (1 + spec.partial_rollout), spec.prompt_len, spec.response_len
    rows = lambda shape, dtype: jax.ShapeDtypeStruct(  # noqa: E731
        shape, dtype, sharding=sharding.rows_sharding(mesh, len(shape))
    )
    args = (params, rows((Q, Lp), jnp.int32), rows((Q,), jnp.int32), key)
    if not spec.partial_rollout:
        return args
    R = Q * spec.group_size
    carry = rollout.PartialRows(
        tokens=rows((R, T), jnp.int32),
        mask=rows((R, T), jnp.float32),
        logp=rows((R, T), jnp.float32),
        sample_logp=rows((R, T), jnp.float32),
        versions=rows((R, T), jnp.int32),
        done=rows((R,), bool),
    )
    version = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(mesh))
    return (*args, carry, version)


def _engine_config(run) -> dict:
    """The continuous engine's keywords for this run's rollout (rollout.decode_step_for_plan)."""
    spec = run.step
    return dict(
        num_samples=spec.group_size,
        max_new_tokens=spec.response_len,
        temperature=spec.temperature,
        top_k=spec.top_k,
        top_p=spec.top_p,
        return_routes=spec.records_routes,
        **dict(spec.rollout_options),
    )


def _engine_plan(run) -> dict:
    """The continuous engine's sizes: slots, the paged KV cache (pages and bytes, in the rollout
    dtype) and the most decode steps a rollout takes (every row to the limit, N at a time)."""
    spec = run.step
    Q = spec.prompts * (1 + spec.partial_rollout)
    rows = Q * spec.group_size
    opts = dict(spec.rollout_options)
    slots = min(opts.get("slots") or rows, rows)
    page_size = opts.get("page_size") or rollout.continuous.DEFAULT_PAGE_SIZE
    resumed = slots if spec.partial_rollout else 0  # carried rows' pages (continuous.py)
    pages = rollout.pages_needed(slots, spec.prompt_len, spec.response_len, page_size, resumed)
    cfg = nnx.merge(run.rollout_graphdef, run.abs_params, run.rest).cfg
    return {
        "slots": slots,
        "queue_prompts": Q,
        "page_size": page_size,
        "pages": pages,
        "paged_cache_bytes": models.paged_cache_bytes(cfg, pages, page_size),
        "decode_steps_max": math.ceil(rows / slots) * max(spec.response_len - 1, 0),
    }


def _engine_decode_step(run, params):
    """(jitted function, abstract arguments) of one N-slot decode step of the continuous engine
    (rollout.decode_step_for_plan) on the rollout's model, nothing allocated."""
    spec = run.step
    model = nnx.merge(run.rollout_graphdef, params, run.rest)
    Q = spec.prompts * (1 + spec.partial_rollout)
    return rollout.decode_step_for_plan(
        model, num_prompts=Q, prompt_len=spec.prompt_len, **_engine_config(run)
    )


def _decode_step_fn(run):
    """jit of one rollout decode step (rollout.decode_step) on the rollout's model; the cache is
    donated (written in place, as in the rollout's loop)."""
    Lp, T = run.step.prompt_len, run.step.response_len
    with_routes = run.step.records_routes

    def fn(params, cache, prev, n_b, t):
        model = nnx.merge(run.rollout_graphdef, params, run.rest)
        logits, out = rollout.decode_step(model, cache, prev, n_b, t, Lp, T, with_routes)
        return logits, out["cache"]

    return jax.jit(fn, donate_argnums=(1,))


def decode_chunks(model_cfg, max_new_tokens: int) -> int:
    """Generated-cache chunks of the decode step the plan costs: the middle phase's, as the
    sampler's steps read 1 .. ceil((T - 1) / C) chunks, one phase of C steps each, so this step
    stands for their mean (the first and last phases are the cheapest and dearest)."""
    phases = max(math.ceil((max_new_tokens - 1) / model_cfg.decode_block), 1)
    return (phases + 1) // 2


def _decode_step_args(run, params, mesh):
    """Abstract arguments of _decode_step_fn at the rollout's shapes: B = P * G rows and the
    sampler's shared-prefix cache (prompt KV [L, P, ...], generated chunks [L, B, ...]) holding
    decode_chunks of its chunks, with its rows sharded like the rollout's."""
    spec = run.step
    P, G, Lp, T = spec.prompts, spec.group_size, spec.prompt_len, spec.response_len
    B = spec.rows

    def decode_cache(p):  # the rollout's shared-prefix cache in its middle decode phase
        model = nnx.merge(run.rollout_graphdef, p, run.rest)
        cache = models.shared_prefix_cache(model.init_cache(P, Lp), G, model.cfg.decode_block)
        for _ in range(decode_chunks(model.cfg, T) - 1):
            cache = models.add_chunk(cache)
        return cache

    cache = jax.eval_shape(decode_cache, params)
    rows = sharding.row_spec(mesh)

    def leaf(c):  # [L, B, ...]: rows over the batch axes
        spec = PartitionSpec(None, rows, *([None] * (c.ndim - 2)))
        return jax.ShapeDtypeStruct(c.shape, c.dtype, sharding=NamedSharding(mesh, spec))

    vec = lambda dtype: jax.ShapeDtypeStruct((B,), dtype, sharding=sharding.rows_sharding(mesh, 1))  # noqa: E731
    t = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(mesh))
    return params, jax.tree.map(leaf, cache), vec(jnp.int32), vec(jnp.int32), t


def format_plan(p: dict[str, Any]) -> str:
    """A small per-device table of the plan (GiB)."""
    g = lambda b: f"{b / GIB:8.3f}"  # noqa: E731
    mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items())
    lines = [
        f"memory plan: {p['model']} on {p['slice']} ({p['devices']} devices, mesh {mesh}; "
        f"{p['shapes']})",
        f"  {'parameters (' + _params_label(p) + ')':<28}{g(p['params'])} GiB per device"
        + _params_note(p),
        f"  optimizer state             {g(p['optimizer'])} GiB",
        f"  reference parameters        {g(p['reference'])} GiB",
        f"  update peak (compiled)      {g(p['update_peak'])} GiB",
        f"  rollout peak + optimizer    {g(p['rollout_peak'])} GiB",
        f"  needed                      {g(p['needed'])} GiB of {p['hbm'] / GIB:.0f} GiB HBM "
        f"({'fits' if p['fits'] else 'DOES NOT FIT'}: limit {HEADROOM:.0%})",
        f"  compile: rollout {p['compile_rollout_s']:.1f} s, update {p['compile_update_s']:.1f} s, "
        f"decode step {p['compile_decode_step_s']:.1f} s (CPU: rollout "
        f"{p['compile_cpu_s']['rollout']:.1f} s, update {p['compile_cpu_s']['update']:.1f} s)",
    ]
    chip = p["chip"]
    lines += [
        f"  time per device (roofline ESTIMATE: max(FLOPs / {chip.bf16_tflops:g} TFLOP/s bf16, "
        f"bytes / {chip.hbm_gbps:g} GB/s HBM); matmul FLOPs and HBM bytes of the compiled "
        "programs, loops counted)",
    ]
    e = p.get("engine") or {}
    if e:
        lines.insert(
            6,
            f"  paged KV cache (continuous) {g(e['paged_cache_bytes'])} GiB in all: {e['pages']} "
            f"pages of {e['page_size']} slots for {e['slots']} decode slots",
        )
    steps_note = (
        f"  (at most {p['decode_steps']} steps of {e['slots']} slots + {e['queue_prompts']} "
        "prefills)"
        if e
        else f"  ({p['decode_steps']} decode steps + prefill)"
    )
    rows = [
        ("decode step", "decode_step", ""),
        ("rollout", "rollout", steps_note),
        ("update", "update", ""),
    ]
    for label, key, note in rows:
        c, t = p["costs"][key], p["times"][key]
        lines.append(
            f"    {label:<12} {c.total_flops / 1e12:10.3f} TFLOP {c.bytes / 1e9:10.3f} GB "
            f"{format_seconds(t):>10}{note}"
        )
    ragged = sum(c.ragged_flops for c in p["costs"].values())
    if ragged:
        lines.append(
            "    (ragged_dot FLOPs counted from its shapes, 2·M·K·N per group-sum: XLA:CPU lowers "
            "it as a dense masked matmul over every group)"
        )
    if "rollout_weights" in p:
        lines.append(format_rollout_weights(p))
    return "\n".join(lines)


def _params_label(p: dict[str, Any]) -> str:
    """The parameters' dtype in the table (QLoRA: the quantized base's)."""
    quant = p.get("base_quant")
    return f"{quant} base" if quant else "float32"


def _params_note(p: dict[str, Any]) -> str:
    """QLoRA: the float32 base's figure beside the quantized one."""
    if not p.get("base_quant"):
        return ""
    return f" ({p['params_float'] / GIB:.3f} GiB with a float32 base)"


def format_seconds(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t < 1.0 else f"{t:.2f} s"


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


def rollout_weight_bytes(run) -> dict[str, Any]:
    """The weights one decode step of the rollout reads, one copy of them (all devices
    together): the decoder layers' parameters and the output matrix (rollout.weight_bytes; every
    MoE expert counted), in the trainer's dtype and as the rollout holds them with
    config.rl.rollout_quant (int8 / fp8 qvalues + float32 scales; shapes only, nothing is
    allocated). Keys: quant, float_bytes, rollout_bytes."""
    quant = run.step.rollout_quant
    base_quant = adapters.base_quant(run)

    def prepared(params):
        model = rollout.quantize_weights(nnx.merge(run.rollout_graphdef, params, run.rest), quant)
        return nnx.split(model)

    # QLoRA: the rollout reads the base as the trainer holds it (quantized), the float figure is
    # the float32 base's
    plain = nnx.merge(*float_abstract(run), run.rest)
    graphdef, state = jax.eval_shape(prepared, run.abs_params)
    return {
        "quant": quant or base_quant,
        "float_bytes": rollout.weight_bytes(plain),
        "rollout_bytes": rollout.weight_bytes(nnx.merge(graphdef, state)),
    }


def float_abstract(run):
    """(graphdef, abstract params) of the run's model with its base in float32: the run's own
    unless QLoRA (config.lora.base_quant) holds the base quantized (shapes only)."""
    if not adapters.base_quant(run):
        return run.rollout_graphdef, run.abs_params
    spec = dataclasses.replace(adapters.lora_spec(run.config), base_quant="")
    graphdef, abs_params, _, _ = build.abstract_params(
        run.model_cfg, run.mesh, run.config.seed, spec
    )
    return graphdef, abs_params


def format_rollout_weights(p: dict[str, Any]) -> str:
    """The plan's line for rollout_weight_bytes."""
    w = p["rollout_weights"]
    quant = w["quant"] or "none"
    return (
        f"  rollout weights per decode step (one copy, all devices): "
        f"{w['rollout_bytes'] / GIB:.3f} GiB with rollout_quant={quant} "
        f"({w['float_bytes'] / GIB:.3f} GiB in the trainer's dtype)"
    )
