"""The dry run of the asynchronous pipeline (rl/pipeline.py): both device groups' memory, the
roofline time of the rollout and the update on their groups, the step time of the synchronous and
the pipelined schedule, the resharding's bytes and time, and a suggested split of the slice.

    plan = pipeline_plan.plan(config)        # config.slice; rollout.devices and/or max_staleness
    print(pipeline_plan.format_plan(plan))
    python -m gspo_jax.main --config configs/qwen3_gsm8k.py:model=qwen3_1_7b,slice=v5p-8,fsdp=2 \
        --config.rollout.devices=2 --config.rl.max_staleness=1 --workdir /tmp/plan --dry_run

Dimension legend: D devices of the slice, R of them the rollout's (config.rollout.devices), D − R
the trainer's; s = rl.sync_every.

What it compiles (memory_plan's module docstring says what the figures are and how far a CPU
compile tells a TPU's):
  the synchronous baseline   memory_plan.plan of the same run with rollout.devices = 0 and
                             max_staleness = 0 on the whole slice: the trainer's mesh layout
                             with its filled axis (-1), or else its fsdp axis, widened to D
  with a rollout group       the update on the trainer's group (config.mesh over the first D − R
                             devices) and the rollout with one decode step on the rollout's
                             (config.rollout.mesh over the last R), its parameters on the
                             rollout's shardings, in the rollout's compute dtype (with
                             rl.rollout_quant the projections quantized), as Pipeline's sync
                             puts them

Memory per device: the trainer group holds the parameters, the optimizer state, the reference and
the update's peak; the rollout group the rollout's peak (its parameter copy, the KV cache, the
logits) and no optimizer state. On a shared mesh (rollout.devices = 0, max_staleness > 0) the
rollout's copy is a second copy of the parameters (as the sync sends them) on every device, added
to the baseline's need.

Step time (roofline seconds, an estimate; d = max_staleness − (s − 1), the pipeline's depth):
  synchronous                 t_rollout(D) + t_update(D)
  pipelined on its own group  the steady state of rl/pipeline.py's schedule (step_seconds): the
                              slowest of three loops,
                                the trainer's     t_update(D − R) + t_send / s
                                the rollout's     t_rollout(R) + t_receive / s
                                the chain   (t_update + t_send + t_receive + t_rollout) / (d + 1)
                              (the rollout of step j + d samples the version the update of step
                              j − 1 made, and update j + d waits for it: d + 1 steps hold one of
                              each in sequence; a deeper pipeline hides more of it)
  pipelined on a shared mesh  t_rollout(D) + t_update(D): the same devices do both; pipelining
                              hides the host's work (scoring, dispatch), which a roofline does
                              not count
The sync sends each rollout device its shard of the parameters, device to device
(sharding.transfer, dispatched asynchronously: neither side blocks on it): t_sync = max(bytes
received per rollout device, bytes sent per trainer device) over one direction of the chip's ICI
bandwidth (half its published bidirectional figure), and each group is charged its own side
(sync_sides): the trainer's reshard and send, the rollout's receive, each in its own loop (the
copy's DMA moves the bytes through the same HBM its programs are bound by). An estimate: no
contention, one slice (no DCN).

Memory the sync adds: the trainer devices hold the cast copy and the resharded one (one rollout
device's shard each) beside the parameters and optimizer state until the send completes
(trainer "sync_peak"); where the rollout is the slower loop the new copy lands while the
previous rollout still reads the old one, so a rollout device then holds both ("double
buffer": the rollout's peak + one copy).

The suggested split (an estimate, printed as such): the compiled groups' per-device work, spread
perfectly over a group of any size: a rollout group of R keeps its mesh's model layout (R a
multiple of its model shards, the copy's bytes per device as compiled) and spreads the rows over
R; the trainer's update spreads over D − R. R* minimises step_seconds over the R whose rows
divide and whose groups fit under memory_plan.HEADROOM (the rollout's peak less its copy, and
the trainer's peak, scaled the same way; the double buffer where the rollout is the slower
loop); where no split beats the synchronous step, the suggestion is rollout.devices = 0. On a
shared mesh the baseline's times stand in, with the parameters replicated.
"""

from __future__ import annotations

import copy
from typing import Any

import jax
import ml_collections

from gspo_jax import config as config_lib
from gspo_jax import sharding
from gspo_jax.planning import memory_plan
from gspo_jax.planning.memory_plan import GIB, HEADROOM
from gspo_jax.rl import adapters, build, pipeline, placement
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl import step as ts


def is_pipelined(config) -> bool:
    """Whether ``config`` runs the asynchronous pipeline (and its dry run is this module's)."""
    return placement.check_pipeline(config)[2]


def synchronous_config(config, trainer_devices: int) -> ml_collections.ConfigDict:
    """``config`` as today's synchronous step on the whole slice: rollout.devices = 0,
    max_staleness = 0, and the trainer's mesh widened from ``trainer_devices`` to every device
    (its -1 axis fills them; else its fsdp axis grows by D / (D − R))."""
    c = copy.deepcopy(config)
    n = memory_plan.get_slice(config.slice).devices
    c.rollout.devices, c.rl.max_staleness, c.rl.sync_every = 0.0, 0, 1
    axes = dict(config.mesh)
    if -1 not in axes.values() and trainer_devices != n:
        if n % trainer_devices:
            raise config_lib.ConfigError(
                f"the synchronous baseline widens config.mesh from {trainer_devices} to {n} "
                f"devices, which {trainer_devices} does not divide: give config.rollout.devices "
                f"so that the trainer keeps a divisor of {n} devices"
            )
        c.mesh.fsdp = int(axes.get("fsdp", 1)) * (n // trainer_devices)
    return c


def sync_seconds(
    param_bytes_per_rollout_device: float,
    rollout_devices: int,
    trainer_devices: int,
    chip: memory_plan.Chip,
) -> float | None:
    """Roofline seconds of one sync (module docstring): every rollout device receives its shard,
    the trainer devices send them all between them; None when the chip has no ICI figure."""
    if chip is None or chip.ici_gbps is None:
        return None
    sent_per_trainer_device = param_bytes_per_rollout_device * rollout_devices / trainer_devices
    one_way = chip.ici_gbps * 1e9 / 2
    return max(param_bytes_per_rollout_device, sent_per_trainer_device) / one_way


def sync_sides(
    param_bytes_per_rollout_device: float,
    rollout_devices: int,
    trainer_devices: int,
    chip: memory_plan.Chip,
) -> tuple[float, float]:
    """Roofline seconds of one sync on each side, (trainer, rollout), as sharding.transfer moves
    it: the trainer devices first reshard the copy to the rollout's layout among themselves
    (each gathers at most one rollout device's shard) and then send each rollout device its
    shard (R / (D - R) shards each); a rollout device receives its shard. Each side pays its
    part on its own path: the trainer's before its next update, the rollout's before its next
    rollout. (0, 0) when the chip has no ICI figure."""
    if chip is None or chip.ici_gbps is None:
        return 0.0, 0.0
    one_way = chip.ici_gbps * 1e9 / 2
    b = param_bytes_per_rollout_device
    trainer = (b + b * rollout_devices / trainer_devices) / one_way
    return trainer, b / one_way


def step_seconds(
    t_rollout: float,
    t_update: float,
    sides: tuple[float, float],
    sync_every: int,
    depth: int,
) -> float:
    """The pipelined step's steady-state seconds with a rollout group (module docstring): the
    slowest of the trainer's loop, the rollout's, and the chain through both over d + 1 steps.
    ``sides``: sync_sides' (trainer, rollout) seconds of one sync."""
    send, receive = sides
    trainer = t_update + send / sync_every
    rollout = t_rollout + receive / sync_every
    chain = (t_update + send + receive + t_rollout) / (depth + 1)
    return max(trainer, rollout, chain)


def rollout_bound(t_rollout: float, t_update: float, sides: tuple[float, float], s: int) -> bool:
    """Whether the rollout is the slower loop, so that a sync lands while the previous rollout
    still reads the old copy (the double buffer, module docstring)."""
    return t_rollout + sides[1] / s >= t_update + sides[0] / s


def suggest_split(
    D: int,
    chip: memory_plan.Chip,
    hbm: int,
    rollout: tuple[float, int, int, int, int],
    update: tuple[float, int, int],
    prompts: int,
    sync_every: int,
    depth: int = 1,
):
    """The estimated best rollout group size R* and the pipelined step time at each valid R
    (module docstring) on D devices. ``rollout``: (its roofline seconds, on n devices, peak bytes
    per device, of which the parameter copy's, the model shards m of its mesh); ``update``:
    (seconds, on n devices, peak bytes per device with the reference), both from the compiled
    split (on a shared mesh: the baseline). A group of R keeps the model's layout (R a multiple
    of m, the copy's bytes per device as compiled) and spreads the rows and the work over R; the
    trainer's peak spreads over D − R; a rollout-bound split holds a second copy (the double
    buffer). Returns (R*, {R: seconds}); R* is None when none fits."""
    t_r, n_r, peak_r, copy, m = rollout
    t_u, n_u, peak_u = update
    steps = {}
    for R in range(m, D, m):
        if prompts % (R // m) or max(R, D - R) % min(R, D - R):  # rows; sharding.transfer
            continue
        sides = sync_sides(copy, R, D - R, chip)
        t_rollout, t_update = t_r * n_r / R, t_u * n_u / (D - R)
        second = copy if rollout_bound(t_rollout, t_update, sides, sync_every) else 0
        rollout_peak = copy + (peak_r - copy) * n_r / R + second  # rows (KV cache, logits) over R
        trainer_peak = peak_u * n_u / (D - R)
        if max(rollout_peak, trainer_peak) > HEADROOM * hbm:
            continue
        steps[R] = step_seconds(t_rollout, t_update, sides, sync_every, depth)
    best = min(steps, key=steps.get) if steps else None
    return best, steps


def plan(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Compiles the synchronous baseline and, with a rollout group, the update and the rollout on
    their groups; returns the plan: "sync" (memory_plan.plan's dict), "groups" ({"trainer",
    "rollout"}: devices, mesh, memory and time per device), "step_s" ({"synchronous",
    "pipelined"}), "sync_bytes", "sync_s", "suggested" (R*, {R: step seconds}), and the keys
    memory_plan.check_fits reads (the tighter group's)."""
    slc = memory_plan.get_slice(config.slice)
    k, s, _ = placement.check_pipeline(config)
    depth = pipeline.Schedule(k, s).depth
    D = slc.devices
    R = placement.rollout_device_count(config, D)
    sync = memory_plan.plan(synchronous_config(config, D - R))
    run = build.build_run(config)
    abs_state = build.abstract_state(run, run.abs_params)
    # the whole model as the sync sends it (the rollout's compute dtype; with rl.rollout_quant
    # the projections as qvalues + scales)
    sent = jax.eval_shape(pipeline.rollout_copy(run), run.abs_params)
    params_total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(sent))
    P = run.step.prompts
    out = {
        "slice": config.slice,
        "devices": D,
        "model": sync["model"],
        "shapes": sync["shapes"],
        "chip": slc.chip,
        "hbm": sync["hbm"],
        "max_staleness": k,
        "sync_every": s,
        "depth": depth,
        "sync": sync,
        "params_total": params_total,
    }
    t_sync_step = sync["times"]["rollout"] + sync["times"]["update"]
    if R == 0:  # a shared mesh: a second copy of the parameters, the same devices' time
        shared_copy = memory_plan.shard_bytes(
            sharding.with_shardings(sent, pipeline.copy_shardings(run, run.mesh))
        )
        needed = sync["needed"] + shared_copy
        trainer = dict(
            devices=D,
            mesh=sync["mesh"],
            params=sync["params"],
            optimizer=sync["optimizer"],
            reference=sync["reference"],
            update_peak=sync["update_peak"],
            needed=needed,
            time=sync["times"]["update"],
        )
        rollout_group = dict(
            devices=D,
            mesh=sync["mesh"],
            rollout_peak=sync["rollout_peak"],
            copy=shared_copy,
            needed=needed,
            time=sync["times"]["rollout"],
        )
        out.update(
            sync_bytes=0, sync_s=0.0, step_s={"synchronous": t_sync_step, "pipelined": t_sync_step}
        )
    else:
        phases = ts.make_phases(run, abs_state, with_ref=rl_batch.uses_reference(run))
        upd = memory_plan.update_part(run, phases.update, abs_state, run.mesh, slc)
        # the sync's copy (in the rollout's compute dtype, quantized with rl.rollout_quant) on
        # the rollout's shardings
        r_params = sharding.with_shardings(sent, pipeline.copy_shardings(run, run.rollout_mesh))
        r_fn = ts.make_rollout_fn(run, mesh=run.rollout_mesh)
        roll = memory_plan.rollout_part(run, r_fn, r_params, run.rollout_mesh, slc)
        params = memory_plan.shard_bytes(abs_state.params)
        opt = memory_plan.shard_bytes(abs_state.opt_state)
        ref = params if adapters.keeps_reference_copy(run) else 0
        copy_bytes = memory_plan.shard_bytes(r_params)  # what each rollout device receives
        sides = sync_sides(copy_bytes, R, D - R, slc.chip)
        double = rollout_bound(roll["times"]["rollout"], upd["time"], sides, s)
        # the trainer's devices during a sync: the cast copy, and (with at least as many trainer
        # as rollout devices) one rollout device's shard each, staged for the send
        cast_copy = memory_plan.shard_bytes(
            sharding.with_shardings(sent, pipeline.copy_shardings(run, run.mesh))
        )
        sync_peak = params + opt + ref + cast_copy + (copy_bytes if D - R >= R else 0)
        trainer = dict(
            devices=D - R,
            mesh=dict(run.mesh.shape),
            params=params,
            optimizer=opt,
            reference=ref,
            update_peak=upd["peak"],
            sync_peak=sync_peak,
            needed=max(upd["peak"] + ref, sync_peak),
            time=upd["time"],
            cost=upd["cost"],
        )
        rollout_group = dict(
            devices=R,
            mesh=dict(run.rollout_mesh.shape),
            rollout_peak=roll["peak"],
            copy=copy_bytes,
            double_buffer=double,
            needed=roll["peak"] + (copy_bytes if double else 0),
            time=roll["times"]["rollout"],
            cost=roll["costs"]["rollout"],
            decode_step=roll["times"]["decode_step"],
            decode_steps=roll["decode_steps"],
        )
        t_sync = sync_seconds(copy_bytes, R, D - R, slc.chip)
        pipelined = step_seconds(rollout_group["time"], trainer["time"], sides, s, depth)
        # the split's chip-seconds spread over the slice: the step if the work could be
        # balanced between the groups to a fraction of a chip (no whole-chip split does better)
        balanced = (rollout_group["time"] * R + trainer["time"] * (D - R)) / D
        out.update(
            balanced_s=balanced,
            sync_bytes=copy_bytes * R,
            sync_s=t_sync,
            sync_sides_s={"trainer": sides[0], "rollout": sides[1]},
            step_s={"synchronous": t_sync_step, "pipelined": pipelined},
        )
    out["groups"] = {"trainer": trainer, "rollout": rollout_group}
    # the suggestion scales the compiled split's per-device work and rows (a shared mesh: the
    # baseline's, its parameters replicated on the rollout group)
    if R == 0:
        rollout = (rollout_group["time"], D, sync["rollout_peak"] - sync["optimizer"]
                   - sync["params"] + params_total, params_total, 1)  # fmt: skip
        update = (trainer["time"], D, trainer["update_peak"] + trainer["reference"])
    else:
        m = run.rollout_mesh.size // sharding.row_shards(run.rollout_mesh)  # model shards
        rollout = (rollout_group["time"], R, rollout_group["rollout_peak"], copy_bytes, m)
        update = (trainer["time"], D - R, trainer["update_peak"] + trainer["reference"])
    out["suggested"] = suggest_split(D, slc.chip, out["hbm"], rollout, update, P, s, depth)
    # what memory_plan.check_fits reads: the tighter of the two groups
    tight = max((trainer, rollout_group), key=lambda g: g["needed"])
    out.update(
        params=trainer["params"],
        optimizer=trainer["optimizer"],
        reference=trainer["reference"],
        update_peak=trainer["update_peak"],
        rollout_peak=rollout_group["rollout_peak"],
        needed=tight["needed"],
        fits=tight["needed"] <= HEADROOM * out["hbm"],
    )
    return out


def format_plan(p: dict[str, Any]) -> str:
    """The synchronous baseline's table, then both groups, the step times and the suggestion."""
    g = lambda b: f"{b / GIB:8.3f}"  # noqa: E731
    sec = memory_plan.format_seconds
    mesh = lambda m: " x ".join(f"{a}={v}" for a, v in m.items() if v != 1) or "1"  # noqa: E731
    tr, ro = p["groups"]["trainer"], p["groups"]["rollout"]
    k, s, D = p["max_staleness"], p["sync_every"], p["devices"]
    shared = ro["devices"] == D
    lines = [
        "the synchronous baseline (rollout.devices=0, max_staleness=0, the whole slice):",
        memory_plan.format_plan(p["sync"]),
        "",
        f"pipeline plan: {p['model']} on {p['slice']} (max_staleness={k}, sync_every={s}, "
        f"depth {p['depth']}; "
        + (
            "the rollout shares the mesh"
            if shared
            else f"trainer {tr['devices']} + rollout {ro['devices']} devices"
        )
        + ")",
        f"  trainer group ({tr['devices']} devices, mesh {mesh(tr['mesh'])}), per device:",
        f"    parameters + optimizer    {g(tr['params'] + tr['optimizer'])} GiB",
        f"    update peak (compiled)    {g(tr['update_peak'])} GiB",
        *(
            [f"    during a sync             {g(tr['sync_peak'])} GiB (+ the cast and staged copy)"]
            if "sync_peak" in tr
            else []
        ),
        f"    needed                    {g(tr['needed'])} GiB of {p['hbm'] / GIB:.0f} GiB",
        f"  rollout group ({ro['devices']} devices, mesh {mesh(ro['mesh'])}), per device:",
        f"    parameter copy            {g(ro['copy'])} GiB (in the rollout's dtype: the sync's)",
        f"    rollout peak (compiled)   {g(ro['rollout_peak'])} GiB"
        + ("  + a second copy (the rollout is the slower loop)" if ro.get("double_buffer") else ""),
        f"    needed                    {g(ro['needed'])} GiB "
        f"({'fits' if p['fits'] else 'DOES NOT FIT'}: limit {HEADROOM:.0%})",
        "  step time (roofline ESTIMATE, module docstring of planning/pipeline_plan.py):",
        f"    rollout on its group      {sec(ro['time']):>10}",
        f"    update on its group       {sec(tr['time']):>10}",
    ]
    if not shared:
        t = p["sync_s"]
        lines.append(
            f"    sync (resharding)         {sec(t) if t is not None else 'n/a':>10}  "
            f"({p['sync_bytes'] / 1e9:.2f} GB to the rollout group, {ro['copy'] / 1e9:.2f} GB "
            "per rollout device, over ICI)"
        )
        sides = p.get("sync_sides_s")
        if sides:
            lines.append(
                f"      paid by the trainer group {sec(sides['trainer']):>10}  (reshard + send, "
                f"dispatched before its update); by the rollout group {sec(sides['rollout'])}"
            )
    st = p["step_s"]
    lines += [
        f"    synchronous step          {sec(st['synchronous']):>10}  (rollout + update on all "
        f"{D} devices)",
        f"    pipelined step            {sec(st['pipelined']):>10}  "
        f"({st['synchronous'] / st['pipelined']:.2f}x the synchronous step's rate)",
    ]
    best, steps = p["suggested"]
    if best is None:
        lines.append(
            "  suggested split: none fits (the trainer's update needs every device of this "
            "slice): use a larger slice for a rollout group"
        )
        return "\n".join(lines)
    copy = ro["copy"] if not shared else p["params_total"]
    t_copy = sync_seconds(copy, best, D - best, p["chip"])
    lines.append(
        f"  best split (ESTIMATE, the compiled work scaled perfectly): rollout.devices={best} "
        f"of {D}: {sec(steps[best])} a step, {st['synchronous'] / steps[best]:.2f}x the "
        f"synchronous step's rate; its copy {copy * best / 1e9:.2f} GB "
        f"({copy / 1e9:.2f} GB per rollout device) in "
        f"{sec(t_copy) if t_copy is not None else 'n/a'} a sync"
    )
    if "balanced_s" in p:
        b = p["balanced_s"]
        lines.append(
            f"  balanced bound (this split's chip-seconds over all {D} devices, as if a group "
            f"could hold a fraction of a chip): {sec(b)}, {st['synchronous'] / b:.2f}x"
        )
    if steps[best] >= st["synchronous"]:
        lines.append(
            "  suggested: rollout.devices=0, max_staleness=0 (no split that fits beats the "
            "synchronous step on this slice)"
        )
    else:
        lines.append(f"  suggested: rollout.devices={best}")
    return "\n".join(lines)
