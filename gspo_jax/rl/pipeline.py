"""The asynchronous pipeline: rollouts run ahead of the update, on their own device group or on
the training mesh, and no batch lags the update that uses it by more than
config.rl.max_staleness policy versions.

    pipe = pipeline.Pipeline(run, phases, queue)      # queue: a PipelineQueue around the data
    state, host_metrics = pipe.step(state, ref_params)

Dimension legend: P prompts per step, G samples per prompt, B = P·G rows, Lp prompt slots, T
response slots.

The schedule (Schedule; k = rl.max_staleness, s = rl.sync_every). The rollout samples from its
own copy of the parameters, refreshed from the trainer's at every step t with t % s == 0 (before
that step's rollout starts), so at step t it holds version r(t) = s·⌊t/s⌋. The pipeline's depth
is d = k − (s − 1): at step t the rollout of step t + d starts, while step t updates on the batch
that started d steps before. A batch used at step j was sampled by version r(j − d) ≥ j − d −
(s − 1) = j − k, so its staleness j − r(j − d) is at most k. A run's first d batches start at
step 0 (version 0, staleness j < k).

Step t, in dispatch order (JAX dispatches asynchronously: with config.rollout.devices > 0 the
rollout runs on its devices while the update runs on the trainer's):
  1. sync, when due: the trainer's parameters are copied onto the rollout's mesh, dispatched and
     not waited for (sharding.transfer: whatever the two layouts, each shard moves device to
     device, never through the host, where jax.device_put would fetch whole leaves when the
     layouts differ; on a shared mesh a jitted copy, so the update's donated state does not free
     the rollout's weights). The rollouts started after it read the new copy; one still running
     keeps reading the old one until it ends. With rollout.sync_dtype "rollout" the copy is in
     the rollout's compute dtype (rl.rollout_dtype, else the model's), cast on the trainer's
     devices before it moves: every weight except those the layers read in float32
     (models.layers.compute_dtype_params; LoRA adapters keep the trainer's dtype), half the bytes
     under a bf16 rollout. The layers cast at use, so the rollout computes the same; but a
     compiler that keeps a float32 weight's excess precision through a bf16 cast (XLA:CPU does)
     differs from it by float rounding. With "trainer" the copy keeps the parameters' dtype and
     the rollout computes exactly as the synchronous one, so staleness is the only difference.
     With rl.rollout_quant the copy holds the projection weights already quantized (qvalues +
     scales, quantized from the parameters' dtype as the synchronous rollout does), about a
     quarter of their float32 bytes, and the rollout reads them without quantizing again;
  2. start the rollout of step t + d: its prompts are the data stream's next batch and its key is
     step t + d's rollout key, so a batch's tokens do not depend on the schedule;
  3. take step t's batch (for d = 0 after waiting for it), score it, make its RLBatch and update.
     old_logp is the sampler's log-probs, i.e. the behaviour policy's (the version that sampled
     the batch); with rl.recompute_old_logp the current policy's (the proximal policy), and the
     sampler's become rollout_logp for the objective's corrections (rollout_correction,
     off_policy_mask), which then weigh staleness and sampler mismatch together;
  4. nothing waits for the rollouts started in 2: they run on the rollout's devices (up to d in
     flight after the step) until their own steps fetch them (InFlight.fetch: this process's
     rows as host arrays), or a checkpoint does (PipelineQueue.get_state).

d = 0 on a shared mesh is the synchronous step: the same data, keys and arithmetic as
rl/step.py's rl_step (a test compares them). The batches in flight are kept with the data
stream's state (PipelineQueue.get_state, which first waits for those still running), so a
checkpoint holds them and a resumed run continues
with the same batches and equals an uninterrupted one. With s > 1 the checkpoint interval is a
multiple of s (build-time check), so a scheduled save finds the rollout's copy equal to the
trainer's parameters; a save at another step (a preemption) resumes with a fresh sync, which only
lowers the staleness of the batches after it (the run continues correctly, not bit for bit).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gspo_jax import models, rollout, sharding
from gspo_jax.errors import ConfigError
from gspo_jax.rl import adapters, partial
from gspo_jax.rl import step as ts
from gspo_jax.runtime import distributed
from gspo_jax.state import Run, TrainState

# ------------------------------------------------------------------------------ the schedule


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Which rollouts start at a step, and when the rollout's parameters are refreshed (module
    docstring). Pure: the property tests drive it over schedules and resumes."""

    max_staleness: int  # k
    sync_every: int = 1  # s

    @property
    def depth(self) -> int:
        """d = k − (s − 1): how many steps ahead of the update a rollout starts."""
        return self.max_staleness - (self.sync_every - 1)

    def sync_due(self, t: int, copy_version: int | None) -> bool:
        """Refresh the rollout's copy before step t's rollout starts: on the sync steps, and
        whenever there is no copy yet (a run's first step, a resumed run)."""
        return copy_version is None or t % self.sync_every == 0

    def to_start(self, t: int, pending: list[int]) -> list[int]:
        """The steps whose rollouts start at step t, ascending: every step in t..t+d that has
        no batch in flight (all of them at a run's first step, t + d afterwards)."""
        return [j for j in range(t, t + self.depth + 1) if j not in pending]

    def check(self, step: int, version: int) -> None:
        """Raises if the batch of ``step``, sampled by ``version``, lags more than k versions."""
        if step - version > self.max_staleness or version > step:
            raise RuntimeError(
                f"step {step}'s batch was sampled by policy version {version}: outside the bound "
                f"of config.rl.max_staleness={self.max_staleness} (a pipeline bug)"
            )


# ------------------------------------------------------------------------------ batches in flight

SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(rollout.SampleOutput))


@dataclasses.dataclass
class InFlight:
    """One rollout batch between its start and its update. While ``running`` it is the rollout's
    output on its devices (dispatched, maybe still computing); ``fetch`` waits for it and keeps
    this process's rows as host arrays in ``sample`` (what the update and a checkpoint read)."""

    step: int  # the RL step that trains on it
    version: int  # the policy version that sampled it
    batch: dict  # the data stream's batch (prompt [P, Lp], prompt_length [P], answers...)
    sample: dict | None  # SampleOutput's fields as numpy ([B, T]; routes [B, L, S, k]); no Nones
    running: dict | None = None  # {"sample": SampleOutput on the rollout's devices, "done": Watch}
    seconds: float = 0.0  # the rollout's wall time, from its dispatch to its last token (fetched)

    def fetch(self) -> InFlight:
        """Waits for the rollout (where it still runs) and keeps its rows on the host."""
        if self.running is not None:
            out, done = self.running["sample"], self.running["done"]
            self.seconds = done.seconds()
            self.sample = {
                f: distributed.to_local(getattr(out, f))
                for f in SAMPLE_FIELDS
                if getattr(out, f) is not None
            }
            self.running = None
        return self


class Watch:
    """When a dispatched computation's arrays are ready, seen by a thread, so the host goes on
    dispatching (jax.block_until_ready here would hold the pipeline's critical path)."""

    def __init__(self, arrays):
        self.t0, self.t1 = time.time(), None
        self._thread = threading.Thread(target=self._wait, args=(arrays,), daemon=True)
        self._thread.start()

    def _wait(self, arrays) -> None:
        jax.block_until_ready(arrays)
        self.t1 = time.time()

    def seconds(self) -> float:
        """Waits for the arrays; the seconds from the dispatch to their being ready."""
        self._thread.join()
        return self.t1 - self.t0


class PipelineQueue:
    """The data stream with the pipeline's batches in flight (what a checkpoint saves of the
    pipeline). Iterating yields the inner stream's batches; get_state / set_state (what
    runtime/checkpoint.py saves for a data iterator) cover the stream and the batches in flight,
    so a restored run continues with the same batches."""

    def __init__(self, inner):
        self._inner = inner
        self.in_flight: list[InFlight] = []

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._inner)

    def get_state(self) -> dict:
        """The stream's state and the batches in flight, the running rollouts waited for: a
        checkpoint holds every batch it will train on, so a resumed run equals an
        uninterrupted one."""
        arrays, meta = {}, []
        for i, b in enumerate(self.in_flight):
            b.fetch()
            meta.append({"step": b.step, "version": b.version})
            arrays.update({f"{i}/batch/{k}": v for k, v in b.batch.items()})
            arrays.update({f"{i}/sample/{k}": v for k, v in b.sample.items()})
        return {
            "inner": partial.inner_state(self._inner),
            "pipeline": {"in_flight": meta, "arrays": partial.encode(arrays) if meta else None},
        }

    def set_state(self, state: dict) -> None:
        partial.restore_inner(self._inner, state["inner"])
        saved = state.get("pipeline") or {"in_flight": []}
        arrays = partial.decode(saved["arrays"]) if saved["in_flight"] else {}
        self.in_flight = []
        for i, m in enumerate(saved["in_flight"]):
            part = {"batch": {}, "sample": {}}
            for name, v in arrays.items():
                index, kind, field = name.split("/", 2)
                if int(index) == i:
                    part[kind][field] = v
            self.in_flight.append(InFlight(m["step"], m["version"], part["batch"], part["sample"]))


# ------------------------------------------------------------------------------ the pipeline


class Pipeline:
    """The asynchronous step (module docstring): a Schedule, the rollout's copy of the
    parameters and its mesh, and the batches in flight (kept in ``queue``)."""

    def __init__(self, run: Run, phases: ts.Phases, queue: PipelineQueue):
        spec = run.step
        self.run, self.phases, self.queue = run, phases, queue
        self.schedule = Schedule(spec.max_staleness, spec.sync_every)
        self.mesh = run.rollout_mesh or run.mesh
        shared = run.rollout_mesh is None
        # the rollout's program on its mesh (the synchronous one when it shares the mesh)
        self.rollout = phases.rollout if shared else ts.make_rollout_fn(run, mesh=self.mesh)
        # a copy (not an alias) of the parameters in the rollout's dtype, on the trainer's
        # shardings; with a rollout group then moved onto its shardings device to device
        # (sharding.transfer: jax.device_put goes through the host when the layouts differ)
        cast = jax.jit(rollout_copy(run), out_shardings=copy_shardings(run, run.mesh))
        if shared:
            self._copy = cast
        else:
            n_t, n_r = run.mesh.size, self.mesh.size
            if max(n_t, n_r) % min(n_t, n_r):
                raise ConfigError(
                    f"config.rollout.devices: {n_r} rollout devices beside {n_t} trainer "
                    "devices, and the sync moves each shard device to device only where one "
                    "count divides the other: split the devices so that it does (e.g. 4 + 4, 6 + 2)"
                )
            to_rollout = copy_shardings(run, self.mesh)
            self._copy = lambda p: sharding.transfer(cast(p), to_rollout)
        self.params = None  # the rollout's copy of the parameters
        self.version: int | None = None  # the policy version it holds
        self._synced: Watch | None = None  # the last sync, until the step reads its time
        self.note = ""  # printed once by the trainer (a resume that re-synced off schedule)

    # ---- the rollout side

    def _sync(self, state: TrainState, t: int) -> None:
        """The rollout's copy <- the trainer's parameters (version t), dispatched: the rollouts
        started after it read it, the update after it on the trainer's devices runs once the
        copy has left them; nothing waits here (Watch times it)."""
        if self.version is None and t % self.schedule.sync_every:
            self.note = (
                f"resumed at step {t}, between two syncs (rl.sync_every="
                f"{self.schedule.sync_every}): the rollout's parameters are re-synced now"
            )
        self.params = self._copy(state.params)
        self.version = t
        self._synced = Watch(self.params)

    def _start(self, state: TrainState, j: int) -> InFlight:
        """Starts step j's rollout (asynchronously) on the data stream's next batch."""
        batch = next(self.queue)
        glob = lambda x: distributed.to_global(np.asarray(x, np.int32), self.mesh)  # noqa: E731
        key = self.phases.keys(state.rng, j)["rollout"]
        if self.run.rollout_mesh is not None:  # the key from the trainer's devices to the rollout's
            key = jax.device_put(key, sharding.replicated(self.mesh))
        with sharding.use_mesh(self.mesh):
            sample = self.rollout(
                self.params, glob(batch["prompt"]), glob(batch["prompt_length"]), key
            )
        return InFlight(j, self.version, batch, None, {"sample": sample, "done": Watch(sample)})

    # ---- the trainer side

    def _collected(self, b: InFlight, t: int) -> ts.Collected:
        """The batch of step t on the trainer's mesh, scored and shaped (rl/step.py Collected),
        with its staleness metrics."""
        run, phases, mesh = self.run, self.phases, self.run.mesh
        t0 = time.time()
        fields = {f: distributed.to_global(v, mesh) for f, v in b.sample.items()}
        sample = rollout.SampleOutput(**{f: fields.get(f) for f in SAMPLE_FIELDS})
        part, (shaped, shaping, truncated, _) = ts.score_rollout(run, phases, sample, b.batch)
        versions = np.full(b.sample["mask"].shape, b.version, np.int32)  # [B, T]
        with sharding.use_mesh(mesh):
            metrics = dict(
                phases.means([part], shaping if run.step.overlong_penalty > 0 else None, None)
            )
            metrics.update(phases.staleness(distributed.to_global(versions, mesh), sample.mask, t))
        metrics["version"] = float(b.version)
        prompts = distributed.to_global(b.batch["prompt"].astype(np.int32), mesh)
        lengths = distributed.to_global(b.batch["prompt_length"].astype(np.int32), mesh)
        return ts.Collected(
            sample, shaped, shaping, truncated, prompts, lengths, metrics, 0.0, time.time() - t0
        )

    def step(self, state: TrainState, ref_params=None) -> tuple[TrainState, dict[str, float]]:
        """One asynchronous RL step (module docstring): returns (state, host metrics)."""
        run, phases, sched = self.run, self.phases, self.schedule
        t = int(jax.device_get(state.step))
        t_start = time.time()
        if sched.sync_due(t, self.version):
            self._sync(state, t)
        pending = [b.step for b in self.queue.in_flight]
        # dispatched, not waited for: each runs on the rollout's devices until its step fetches it
        self.queue.in_flight += [self._start(state, j) for j in sched.to_start(t, pending)]
        batch = self.queue.in_flight.pop(0).fetch()  # step t's (depth 0: started just now)
        if batch.step != t:
            raise RuntimeError(f"step {t} found step {batch.step}'s batch first (a pipeline bug)")
        sched.check(t, batch.version)
        keys = phases.keys(state.rng, state.step)
        with jax.transfer_guard("allow"):  # as in rl_step: a host scalar in and out
            lr = run.schedule(t * run.updates_per_step)
        got = self._collected(batch, t)
        t_update = time.time()
        state, train_m, roll_m, pass_m, times = ts.learn_on_batch(
            run, phases, state, got, keys, ref_params
        )
        t_updated = time.time()
        sync_s, self._synced = (self._synced.seconds() if self._synced else 0.0), None
        rollout_s = batch.seconds  # its own rollout's wall time (0 for one a checkpoint held)
        step_s = time.time() - t_start
        trainer_busy = times["time/logp_s"] + times["time/update_s"]
        return state, ts.host_metrics(
            train_m,
            roll_m,
            pass_m,
            lr=lr,
            times={
                "time/rollout_s": rollout_s,
                "time/reward_s": got.reward_s,
                **times,
                "time/sync_s": sync_s,
                "time/update_wall_s": t_updated - t_update,
                "time/step_s": step_s,
                # the share of the step each device group computed nothing (on a shared mesh
                # and on this CPU's cores the two overlap little: docs/pipeline.md)
                "time/trainer_idle_frac": max(0.0, 1.0 - trainer_busy / step_s),
                "time/rollout_idle_frac": max(0.0, 1.0 - rollout_s / step_s),
            },
        )


def rollout_copy(run: Run):
    """params -> the rollout's copy of them (module docstring, step 1): each leaf a fresh array;
    with rollout.sync_dtype "rollout" in the rollout's compute dtype where the layers read it so
    (not with LoRA adapters, which qwix computes from the stored dtype); with rl.rollout_quant
    the decoder's projection weights already quantized (rollout/quant.py, from the parameters'
    own dtype, as the synchronous rollout quantizes them: int8 / fp8 qvalues + float32 scales,
    about a quarter of float32's bytes), which rl/step.py rollout_model then reads as they are."""
    cast = run.config.rollout.sync_dtype == "rollout" and adapters.rollout_cast_allowed(run)
    dtype = jnp.dtype(run.config.rl.rollout_dtype or run.model_cfg.dtype)
    quant = run.step.rollout_quant

    def copy(params):
        sent = models.layers.compute_dtype_params(params, dtype) if cast else params
        if quant:
            model = rollout.quantize_weights(nnx.merge(run.graphdef, params, run.rest), quant)
            quantized = nnx.state(model, rollout.QuantizedParam)
            sent = nnx.merge_state(sent.filter(nnx.Not(rollout.QuantizedParam)), quantized)
        return jax.tree.map(jnp.copy, sent)

    return copy


def copy_shardings(run: Run, mesh: jax.sharding.Mesh):
    """The shardings of rollout_copy's output on ``mesh`` (the trainer's or the rollout's): the
    parameters' own, and with rl.rollout_quant the quantized weights' (rollout/quant.py)."""
    sent = jax.eval_shape(rollout_copy(run), run.abs_params)
    return rollout.quant.state_shardings(sent, mesh)


__all__ = [
    "InFlight",
    "Watch",
    "Pipeline",
    "PipelineQueue",
    "Schedule",
    "copy_shardings",
    "rollout_copy",
]
