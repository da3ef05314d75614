"""Where each role of a run computes, decided once with its checks: the trainer's mesh, the
rollout's own device group (or the trainer's mesh, shared), the population's member axis (a
mesh axis of the trainer's), and whether the rollout runs ahead of the update (the pipeline's
schedule fields).

    where = placement.place(config)      # ConfigError (the fix) for a placement that cannot run
    where.trainer, where.rollout         # jax meshes; rollout None = the trainer's mesh, shared

rl/build.py asks this module once (build_run) and keeps the meshes in the Run; the steppers
(rl/step.py, rl/pipeline.py, rl/population.py) read them from the Run. Nothing here builds a
model or a program.

Dimension legend: none (devices and meshes).
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

from gspo_jax import sharding
from gspo_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Placement:
    """The meshes of one run: the trainer's (config.mesh, over the devices the rollout leaves;
    a population's member axis is its sharding.POPULATION_AXIS) and the rollout's own
    (config.rollout.mesh over config.rollout.devices; None when it shares the trainer's)."""

    trainer: jax.sharding.Mesh
    rollout: jax.sharding.Mesh | None

    @property
    def population_axis(self) -> str | None:
        """The trainer mesh's member axis (config.mesh.population > 1), or None."""
        names = self.trainer.axis_names
        return sharding.POPULATION_AXIS if sharding.POPULATION_AXIS in names else None


def place(config: ml_collections.ConfigDict) -> Placement:
    """The run's placement: the devices (mesh_devices) split once between the trainer and the
    rollout (split_devices), each mesh built and checked against the batch."""
    trainer_devices, rollout_devices = split_devices(config, mesh_devices(config))
    trainer = trainer_mesh(config, trainer_devices)
    rollout = rollout_mesh(config, rollout_devices) if rollout_devices else None
    return Placement(trainer=trainer, rollout=rollout)


def mesh_devices(config: ml_collections.ConfigDict) -> list:
    """The devices the mesh spans: all of them, or the first config.num_devices (single-process
    only; lets one process compare a 1-device run with an 8-device run)."""
    n = config.num_devices
    if n is None or n < 0:
        return list(jax.devices())
    if jax.process_count() > 1:
        raise ConfigError("config.num_devices must be -1 (all devices) in a multi-process run")
    if not 1 <= n <= jax.device_count():
        raise ConfigError(
            f"config.num_devices={n}, but {jax.device_count()} devices exist; use -1 for all"
        )
    return list(jax.devices()[:n])


def rollout_device_count(config, n_devices: int) -> int:
    """config.rollout.devices as a device count: a whole number >= 1, or a fraction in (0, 1) of
    ``n_devices`` (rounded to the nearest count >= 1); 0 = none (the rollout shares the mesh). A
    count that leaves the trainer no device is a ConfigError naming the fix."""
    v = float(config.rollout.devices)
    if v == 0:
        return 0
    if v < 0 or (v >= 1 and v != int(v)):
        raise ConfigError(
            f"config.rollout.devices={v:g}: use a whole device count >= 1, a fraction in (0, 1) "
            "of the devices, or 0 (the rollout shares the training mesh)"
        )
    n = int(v) if v >= 1 else max(1, round(v * n_devices))
    if n >= n_devices:
        raise ConfigError(
            f"config.rollout.devices={v:g} gives the rollout {n} of the {n_devices} devices and "
            "the trainer none: use fewer, or 0 to share the mesh"
        )
    return n


def split_devices(config, devices: list) -> tuple[list, list]:
    """(the trainer's devices, the rollout's): the rollout takes config.rollout.devices from the
    end of the list (none: it shares the trainer's)."""
    n = rollout_device_count(config, len(devices))
    return (devices[: len(devices) - n], devices[len(devices) - n :]) if n else (devices, [])


def check_pipeline(config) -> tuple[int, int, bool]:
    """(max_staleness, sync_every, pipelined), checked: one-line ConfigErrors naming the fix for
    a bound below 0, a sync interval the bound cannot absorb, a checkpoint interval that is not a
    multiple of it (what the pipeline does not run with: config/combinations.py)."""
    rl = config.rl
    k, s = int(rl.max_staleness), int(rl.sync_every)
    pipelined = k > 0 or float(config.rollout.devices) != 0
    if k < 0 or s < 1:
        raise ConfigError(
            f"config.rl.max_staleness={k} must be >= 0 (0 = synchronous) and sync_every={s} >= 1"
        )
    if s > k + 1:
        raise ConfigError(
            f"config.rl.sync_every={s} lets the rollout's parameters lag {s - 1} versions, more "
            f"than config.rl.max_staleness={k} allows: use sync_every <= max_staleness + 1"
        )
    if config.rollout.sync_dtype not in ("rollout", "trainer"):
        raise ConfigError(
            f"config.rollout.sync_dtype={config.rollout.sync_dtype!r}: use 'rollout' (the copy "
            "in the rollout's compute dtype) or 'trainer' (the parameters' own dtype)"
        )
    if s > 1 and config.checkpoint.every % s:
        raise ConfigError(
            f"config.checkpoint.every={config.checkpoint.every} is not a multiple of "
            f"config.rl.sync_every={s}: a resume needs the rollout's parameters equal to the "
            "trainer's at each saved step; make checkpoint.every a multiple of sync_every"
        )
    return k, s, pipelined


def trainer_mesh(config: ml_collections.ConfigDict, devices: list) -> jax.sharding.Mesh:
    """The trainer's mesh of config.mesh over ``devices``, checked against the batch: every
    process loads whole prompts, and the rollout batch, its minibatches and micro-batches divide
    over the rows' data x fsdp x expert shards."""
    try:
        mesh = sharding.make_mesh(dict(config.mesh), devices=devices)
    except ValueError as e:
        raise ConfigError(f"config.mesh: {e}") from None
    rl, process_count = config.rl, jax.process_count()
    dp = sharding.row_shards(mesh)  # rows split over data x fsdp x expert
    P, G, K, U = rl.prompts_per_step, rl.group_size, rl.num_minibatches, rl.num_microbatches
    B = P * G
    if P % process_count:
        raise ConfigError(
            f"config.rl.prompts_per_step={P} is not divisible by the {process_count} processes; "
            "each process loads an equal share of prompts: use a multiple of the process count"
        )
    if P % dp:
        raise ConfigError(
            f"config.rl.prompts_per_step={P} does not divide over the data axis: the mesh shards "
            f"rows over data x fsdp x expert = {dp} devices, and every device needs whole prompts. "
            f"Use a multiple of {dp} prompts, or shrink config.mesh.data / fsdp / expert"
        )
    if B % K or (B // K) % dp:
        raise ConfigError(
            f"the rollout batch of {P} prompts x {G} samples = {B} rows must split into "
            f"config.rl.num_minibatches={K} minibatches whose size divides over the {dp} "
            "data-parallel devices; change num_minibatches or prompts_per_step"
        )
    if (B // K) % U or (B // K // U) % dp:
        raise ConfigError(
            f"a minibatch of {B // K} rows must split into config.rl.num_microbatches={U} "
            f"micro-batches whose size divides over the {dp} data-parallel devices"
        )
    return mesh


def rollout_mesh(config, devices: list) -> jax.sharding.Mesh:
    """The rollout's own mesh over ``devices`` (config.rollout.mesh's axes), checked against the
    batch: its rows divide over the mesh's row shards."""
    try:
        mesh = sharding.make_mesh(dict(config.rollout.mesh), devices=devices)
    except ValueError as e:
        raise ConfigError(f"config.rollout.mesh: {e}") from None
    dp, P = sharding.row_shards(mesh), config.rl.prompts_per_step
    if P % dp:
        raise ConfigError(
            f"config.rl.prompts_per_step={P} does not divide over the rollout mesh's {dp} row "
            f"shards (config.rollout.mesh over {len(devices)} devices): use a multiple of {dp} "
            "prompts, or change config.rollout.mesh / rollout.devices"
        )
    return mesh
