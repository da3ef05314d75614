"""The dry run of a population (config.population): memory and time per member and for all members,
read from the population's own compiled programs.

    plan = population_plan.plan(config)      # config.population.seeds set, config.slice set
    print(population_plan.format_plan(plan))
    python -m gspo_jax.main --config configs/arith.py --workdir /tmp/plan --dry_run \
        --config.slice=v6e-8 --config.population.seeds='(0,1,2,3)' --config.mesh.population=4

A population (rl/population.py) stacks its M members on a leading axis that spreads over
config.mesh.population = n device groups, each of D / n devices holding M / n members. The plan
lowers and compiles the two programs of a population step, the rollout and the update, at the run's
real shapes ([M, P, Lp] prompts, the stacked state, the stacked batch) on the slice's simulated
devices, as memory_plan.plan does for a single run (its module docstring: what the figures are and
how far a CPU compile tells a TPU's), and reads per device:

    parameters, optimizer   the stacked state's shard: the group's M / n members
    reference               one copy shared by all members (kl_coef > 0 or rl.log_kl_ref)
    update peak             XLA's peak for the members' update
    rollout peak            XLA's peak for the members' rollout, plus the resident optimizer state

and the roofline time of each program (hlo_cost: every loop counted, the decode loops at most
decode_block trips each, as memory_plan counts a single run's rollout). "All members" is what a
device holds and computes for its group's M / n members; "per member" is that divided by M / n
(vmapped members cost the same matmuls and bytes each, so the population's figures grow with
M / n). It fits when a device's need (its group's members) is at most HEADROOM of its HBM.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from gspo_jax import config as config_lib
from gspo_jax import sharding
from gspo_jax.planning import hlo_cost, memory_plan
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl import build, population
from gspo_jax.rl.batch import RLBatch

GIB = memory_plan.GIB
MEMORY_KEYS = ("params", "optimizer", "reference", "update_peak", "rollout_peak", "needed")


def _abstract_inputs(pop: population.Population):
    """The population step's abstract inputs: prompts [M, P, Lp], lengths [M, P], keys [M, 2],
    the stacked batch [M, B, ...] and the active mask [M], sharded as population_step puts them."""
    spec, mesh, M = pop.run.step, pop.run.mesh, pop.size
    P, Lp = spec.prompts, spec.prompt_len
    rows = sharding.row_spec(mesh)
    prompts = jax.ShapeDtypeStruct((M, P, Lp), jnp.int32, sharding=pop.on_members((rows, None)))
    lengths = jax.ShapeDtypeStruct((M, P), jnp.int32, sharding=pop.on_members((rows,)))
    keys = jax.ShapeDtypeStruct((M, 2), jnp.uint32, sharding=pop.on_members((None,)))
    batch = population.stacked_abstract(pop, RLBatch.abstract(pop.run))
    active = jax.ShapeDtypeStruct((M,), jnp.bool_, sharding=pop.on_members())
    return prompts, lengths, keys, batch, active


def plan(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Compiles the population's rollout and update on its mesh and returns the plan: the keys
    of memory_plan.plan that check_fits reads (per device, all of a group's members), and
    members, members_per_group, groups, per_member {key: bytes}, times {program: s} and
    per_member_times {program: s}."""
    slc = memory_plan.get_slice(config.slice)
    if jax.device_count() != slc.devices:
        raise config_lib.ConfigError(
            f"the dry run of slice {config.slice} needs {slc.devices} devices, but JAX has "
            f"{jax.device_count()}: run it through `python -m gspo_jax.main ... --dry_run`"
        )
    pop = population.build_population(config)
    run, M = pop.run, pop.size
    groups = run.mesh.shape[pop.axis] if pop.axis else 1
    per_group = M // groups
    uses_ref = rl_batch.uses_reference(run)
    phases = population.make_phases(pop, with_ref=uses_ref)
    state = population.abstract_state(pop)
    prompts, lengths, keys, batch, active = _abstract_inputs(pop)
    temps = (pop.hparams[population.TEMPERATURE],) if population.TEMPERATURE in pop.hparams else ()
    clock = time.time
    with sharding.use_mesh(run.mesh):
        t0 = clock()
        rollout_traced = phases.rollout.trace(state.params, prompts, lengths, keys, *temps)
        rollout = rollout_traced.lower().compile()
        t1 = clock()
        update_traced = phases.update.trace(state, batch, keys, pop.hparams, active)
        update = update_traced.lower().compile()
        t2 = clock()
    n, spec = slc.devices, run.step
    trips = max(min(spec.response_len - 1, run.model_cfg.decode_block), 1)
    costs = {
        "rollout": hlo_cost.program_cost(rollout, trips, rollout_traced.jaxpr, n),
        "update": hlo_cost.program_cost(update, 1, update_traced.jaxpr, n),
    }
    times = {k: slc.roofline_s(c) for k, c in costs.items()}
    params = memory_plan.shard_bytes(state.params)
    opt = memory_plan.shard_bytes(state.opt_state)
    ref = memory_plan.shard_bytes(build.abstract_state(run, run.abs_params).params) * uses_ref
    update_peak = memory_plan.peak_bytes(update)
    rollout_peak = memory_plan.peak_bytes(rollout) + opt
    needed = max(update_peak, rollout_peak) + ref
    hbm = int(slc.hbm_gib * GIB)
    out = {
        "slice": config.slice,
        "devices": n,
        "mesh": dict(run.mesh.shape),
        "model": run.model_cfg.name,
        "shapes": f"P={spec.prompts} G={spec.group_size} Lp={spec.prompt_len} "
        f"T={spec.response_len} K={spec.num_minibatches}",
        "members": M,
        "groups": groups,
        "members_per_group": per_group,
        "params": params,
        "optimizer": opt,
        "reference": ref,
        "update_peak": update_peak,
        "rollout_peak": rollout_peak,
        "needed": needed,
        "hbm": hbm,
        "fits": needed <= memory_plan.HEADROOM * hbm,
        "compile_rollout_s": t1 - t0,
        "compile_update_s": t2 - t1,
        "chip": slc.chip,
        "costs": costs,
        "times": times,
    }
    # the reference copy is shared: it is not a member's
    out["per_member"] = {k: out[k] / per_group for k in MEMORY_KEYS if k != "reference"}
    out["per_member_times"] = {k: t / per_group for k, t in times.items()}
    return out


def format_plan(p: dict[str, Any]) -> str:
    """The population's plan: per device, for all of a device group's members and per member."""
    unit, size = ("GiB", GIB) if p["needed"] >= GIB else ("MiB", 2**20)
    g = lambda b: f"{b / size:10.3f}"  # noqa: E731
    mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items())
    per = p["per_member"]
    lines = [
        f"population plan: {p['members']} members of {p['model']} on {p['slice']} "
        f"({p['devices']} devices, mesh {mesh}: {p['groups']} device group(s) of "
        f"{p['members_per_group']} member(s); {p['shapes']})",
        f"  per device ({unit})             {'all members':>10} {'per member':>10}",
    ]
    for label, key in (
        ("parameters (float32)", "params"),
        ("optimizer state", "optimizer"),
        ("update peak (compiled)", "update_peak"),
        ("rollout peak + optimizer", "rollout_peak"),
        ("needed", "needed"),
    ):
        lines.append(f"  {label:<28} {g(p[key])} {g(per[key])}")
    lines += [
        f"  reference parameters         {g(p['reference'])}  (one copy, shared)",
        f"  needed {p['needed'] / size:.3f} {unit} of {p['hbm'] / GIB:.0f} GiB HBM "
        f"({'fits' if p['fits'] else 'DOES NOT FIT'}: limit {memory_plan.HEADROOM:.0%})",
        f"  compile: rollout {p['compile_rollout_s']:.1f} s, update {p['compile_update_s']:.1f} s",
        f"  time per step (roofline ESTIMATE, {p['chip'].bf16_tflops:g} TFLOP/s bf16, "
        f"{p['chip'].hbm_gbps:g} GB/s HBM): all members, per member",
    ]
    s = memory_plan.format_seconds
    for key in ("rollout", "update"):
        c, t, t1 = p["costs"][key], p["times"][key], p["per_member_times"][key]
        lines.append(
            f"    {key:<10} {c.total_flops / 1e12:10.4f} TFLOP {c.bytes / 1e9:10.4f} GB "
            f"{s(t):>10} {s(t1):>10}"
        )
    return "\n".join(lines)
