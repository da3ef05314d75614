"""The RL loop: rollout -> reward -> advantages -> (old/ref log-probs) -> update -> log/eval/save.

    summary = trainer.train(config, workdir)     # what `python -m gspo_jax.main` calls

Setup (task, model, objective, optimizer, mesh, base policy) lives in rl/build.py; how a step is
taken in a stepper (rl/steppers.py: the synchronous step of rl/step.py, the asynchronous
pipeline of rl/pipeline.py; rl/population.py: many runs as one program); multi-host data
placement in runtime/distributed.py. This module is the one loop around every stepper: resume,
log, evaluate, watch for collapse, checkpoint, summarise; the run directory's files
(base_eval.json, summary.json, the --start_fresh moves) are runtime/rundir.py's. ``Session``
holds what one invocation sets up before the first step and finishes after the last, and each
step's housekeeping (``advance``); ``train`` is the loop over steps.

Dimension legend: P prompts per step (P_local on this process), G samples per prompt, B = P*G
response rows (group-contiguous), Lp padded prompt length, T = max_new_tokens.

One RL step, phase by phase, is described once, in docs/design.md "The data flow of one RL step".

Randomness is a pure function of (config.seed, step) (state.step_keys), and the data
iterator's state is checkpointed, so restarting the same command in the same workdir resumes
exactly: parameters and metrics equal those of an uninterrupted run. The same config gives the same
results on one device and on a mesh of many (sharding changes only the order of float sums).

Multi-host: every process runs this same loop (SPMD) on its share of the prompts (see
runtime/distributed.py: by default every host reads the global batch and keeps its rows, so results
do not
depend on the process count); jax.make_array_from_process_local_data assembles the global batch,
and each process scores the response rows of its own prompts. Only process 0 writes metrics,
config.json and summary.json; orbax writes checkpoint shards from every process. Every decision one
host could take alone (the config check, the restore and its fallback, the warm-start load, a
failed save, a stop signal) is agreed first (runtime/agreement.py), within
config.multihost.timeout_s, and
before any work every process checks that all run the same config in the same shared workdir.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from typing import NoReturn

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from gspo_jax import sharding
from gspo_jax.config import population as population_cfg
from gspo_jax.rl import adapters, build, evaluation, population, steppers
from gspo_jax.rl import batch as rl_batch
from gspo_jax.runtime import agreement as pod
from gspo_jax.runtime import checkpoint as checkpoint_lib
from gspo_jax.runtime import metrics as metrics_lib
from gspo_jax.runtime import rundir
from gspo_jax.state import Run, TrainState

# ------------------------------------------------------------------------------ evaluation


def evaluate(run: Run, params) -> dict[str, float] | None:
    """Held-out evaluation with the tasks' evaluation function, as eval/ metrics; a run with an
    environment (config.env) adds its tool-use figures (evaluation.evaluate_tools: eval/tool_*).

    None when evaluation is off (config.eval.num_problems = 0).
    """
    ev = run.config.eval
    if ev.num_problems <= 0:
        return None
    # Multi-host: evaluation.evaluate gives every process its own whole copy of the parameters
    # and leaves the mesh; single-process it samples on the mesh.
    mesh_ctx = sharding.use_mesh(run.mesh) if jax.process_count() == 1 else contextlib.nullcontext()
    model = nnx.merge(run.graphdef, params, run.rest)
    with mesh_ctx:
        out = evaluation.evaluate(
            model,
            run.task,
            split=ev.split,
            num_problems=ev.num_problems,
            pass_k=ev.pass_k,
            max_new_tokens=ev.max_new_tokens or run.config.rl.max_new_tokens,
            batch_size=ev.batch_size,
            seed=ev.seed,
            data_dir=run.config.data.data_dir or None,
        )
        if run.env is not None:  # with the tool offered; the figures above are without it
            out.update(
                evaluation.evaluate_tools(
                    model,
                    run.env.env,
                    split=ev.split,
                    num_problems=ev.num_problems,
                    max_new_tokens=ev.max_new_tokens or run.config.rl.max_new_tokens,
                    batch_size=ev.batch_size,
                    seed=ev.seed,
                    data_dir=run.config.data.data_dir or None,
                    engine=run.step.rollout_engine,
                    samples=ev.pass_k,  # eval/tool_sample_*: the call probability
                    temperature=run.config.rl.temperature,
                )
            )
    scalars = {}
    for k, v in dict(out).items():
        try:
            scalars[k] = float(np.asarray(v))
        except (TypeError, ValueError):
            continue  # non-scalar extras (e.g. examples) are not metrics
    return metrics_lib.with_prefix("eval/", scalars)


# ------------------------------------------------------------------------------ the loop


class Preempted(Exception):
    """The run stopped on SIGTERM / SIGINT after saving the step it had reached."""

    def __init__(self, signum: int, step: int):
        self.signum, self.step = signum, step
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
        super().__init__(
            f"stopped at step {step}, checkpoint saved; rerun the same command to resume"
        )


class StopSignals:
    """SIGTERM (how TPU VMs are preempted) and SIGINT (Ctrl-C) ask the loop to stop cleanly.

    The first signal only sets a flag: the current step finishes, the loop saves it, waits for
    every save in flight and raises Preempted. A second Ctrl-C exits at once. On a multi-host run
    the processes agree after every step (pod.gather), so all of them stop at, and save,
    the same step even when the signal reached them at different times.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum = 0
        self._previous = {}

    def _handle(self, signum, frame):
        # os.write, not print: a handler may run inside an interrupted write to the same stream.
        if self.signum and signum == signal.SIGINT:
            os.write(
                2,
                b"\nsecond interrupt: exiting now (a save in flight is abandoned; the previous "
                b"checkpoint is intact)\n",
            )
            os._exit(128 + signum)
        self.signum = self.signum or signum
        name = signal.Signals(signum).name
        note = f"\n{name}: stopping after this step and saving it (Ctrl-C again to exit at once)\n"
        os.write(2, note.encode())

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def agreed(self) -> int:
        """The signal number every process stops for (0: go on)."""
        return max(int(s) for s in pod.gather("the stop-signal check", str(self.signum)))


class Session:
    """One invocation of ``train``: the run's stepper, its data, checkpoints, logs and training
    state, and each member's writer, collapse watch and end (one member for a single run).

    Constructing it does everything before the first step, in the order every process of a pod
    takes the same agreed decisions (runtime/agreement.py): the config and workdir checks,
    --start_fresh, the resume config check, the restore with its fallback, config.json and
    metrics.jsonl, then the initial state (the resumed one, or the base policy with its
    evaluation) and the reference parameters. ``advance`` runs one step and its housekeeping;
    ``finish`` ends a completed run.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        workdir: str,
        *,
        allow_config_change: bool,
        start_fresh: bool,
    ):
        self.t_start = time.time()
        # CPU seconds (every thread of this process): the cost of a run on a shared machine, whose
        # wall time depends on who else is on the cores; cumulative over resumes (checkpoint meta)
        self.cpu_start, self.cpu_loop = time.process_time(), None
        self.prior_cpu = self.prior_rl_cpu = self.warm_cpu_s = 0.0
        # printed above the progress bar, which starts after the warm start
        self.notes: list[str] = []
        self.stepper = _checked_stepper(config, workdir, start_fresh=start_fresh, notes=self.notes)
        self.run = self.stepper.run
        self.config, self.workdir = self.run.config, self.run.workdir
        self.members = self.stepper.members
        self.ckpt_dir = os.path.join(self.workdir, "checkpoints")
        # nothing is written before the config check
        self.data_iter = self.stepper.open_data()
        self.ckpt = checkpoint_lib.Checkpointer(
            self.ckpt_dir,
            save_every=self.config.checkpoint.every,
            max_to_keep=self.config.checkpoint.max_to_keep,
            async_save=self.config.checkpoint.async_save,
            timeout_s=pod.timeout_of(self.config),
        )
        pod.describe_kept(self.ckpt.describe)
        latest, restored = self._restore(allow_config_change)
        resumed_step = restored[0] if restored is not None else None
        self.writers = [self._open_writer(m, resumed_step) for m in self.members]
        self.meta_config = {
            "config": rundir.config_dict(self.config),
            "config_hash": rundir.config_hash(self.config),
        }
        self.base_eval, self.warm_s, self.prior_wall, self.ref_params = None, 0.0, 0.0, None
        self.base_meta: dict = {}  # what checkpoints hold of the base (adapters.checkpoint_meta)
        M = len(self.members)
        patience = self.config.rl.collapse_patience
        self.watches = [metrics_lib.CollapseWatch(patience) for _ in range(M)]
        self.frozen_at: list[int | None] = [None] * M  # a population member's divergence
        self.collapsed_at: list[int | None] = [None] * M  # a member stopped (stop_on_collapse)
        self.last_eval: list[dict | None] = [None] * M
        pod.set_phase("loading the warm start")
        if restored is not None:
            self._resume(*restored)
        else:
            self._start(no_checkpoint=latest is None)
        self.stepper.start(self.state, with_ref=rl_batch.uses_reference(self.run))
        self.log = metrics_lib.Progress(
            total=self.config.rl.num_steps,
            initial=resumed_step or 0,
            enabled=None if self.config.log.progress else False,
        )
        for note in self.notes:
            self.log.write(note)

    def _restore(self, allow_config_change: bool) -> tuple[int | None, tuple | None]:
        """(the newest checkpoint's step, (step, state, meta) restored from it or a fallback)."""
        latest = self.ckpt.latest_step()
        if latest is not None:
            self.notes += pod.together(
                "comparing the config with the checkpoint's",
                lambda: rundir.check_resume_config(
                    _saved_config(self.ckpt, latest, self.workdir),
                    self.config,
                    latest,
                    allow_change=allow_config_change,
                ),
            )
        pod.set_phase("restoring the newest checkpoint")
        writes = metrics_lib.is_writer_process()
        restored = self.ckpt.restore_latest(
            self.stepper.saved_abstract_state(),
            self.data_iter,
            # every host says it in its own log (a fault may be one host's alone)
            report=self.notes.append if writes else lambda s: print(s, flush=True),
            any_process_count=self.config.data.process_sharding == "slice",
        )
        return latest, restored

    def _open_writer(self, member, resumed_step: int | None) -> metrics_lib.MetricWriter:
        """A member's metrics writer (metrics.jsonl cut back to the resumed step), config.json."""
        os.makedirs(member.workdir, exist_ok=True)
        writer = metrics_lib.MetricWriter(
            member.workdir, resume_step=resumed_step, tensorboard=self.config.log.tensorboard
        )
        kept = writer.write_config(member.config)
        if kept:
            self.notes.append(f"config.json changed; the earlier one is kept as {kept}")
        if writer.metrics_aside:
            self.notes.append(
                f"metrics.jsonl cut back to step {resumed_step or 0}; the full earlier "
                f"file is kept as {writer.metrics_aside}"
            )
        return writer

    def _resume(self, step: int, state: TrainState, meta: dict) -> None:
        """The restored state and counts; the base loads again where the policy needs it back
        (LoRA: under the saved adapters) or the reference keeps a copy of it."""
        self.prior_wall = float(meta.get("wall_s", 0.0))
        self.prior_cpu = float(meta.get("cpu_s", 0.0))
        self.prior_rl_cpu = float(meta.get("rl_cpu_s", 0.0))
        if self.stepper.is_population:
            self.frozen_at = list(meta["frozen_at"])
            self.collapsed_at = list(meta.get("collapsed_at") or self.collapsed_at)
            counts = meta.get("collapse") or [None] * len(self.watches)
            for w, count in zip(self.watches, counts, strict=True):
                w.load(count)
        else:
            self.watches[0].load(meta.get("collapse"))
        self.notes.append(f"resumed from step {step} in {self.workdir}")
        self.base_eval = rundir.read_base_eval(self.members[0].workdir)
        keeps_ref = adapters.keeps_reference_copy(self.run)
        if adapters.resume_loads_base(self.run):
            base, _ = pod.together(
                "loading the warm start",
                lambda: build.base_params(self.run, build.cache_dir_of(self.config)),
            )
            state = self.stepper.restored(state, meta, base, self.ckpt_dir)
            self.base_meta = adapters.checkpoint_meta(self.run, base)
            self.ref_params = base if keeps_ref else None
        self.state = state

    def _start(self, *, no_checkpoint: bool) -> None:
        """Step 0: the base policy (also the reference), evaluated when config.eval.at_start."""
        if no_checkpoint and self.writers[0].metrics_aside:
            self.notes.append(f"no checkpoint in {self.ckpt_dir}: starting from step 0")
        c0 = time.process_time()
        params, own, self.warm_s = pod.together(
            "loading the warm start",
            lambda: self.stepper.load_base(build.cache_dir_of(self.config)),
        )
        self.warm_cpu_s = time.process_time() - c0  # training it, when it was not cached
        if adapters.keeps_reference_copy(self.run):  # (LoRA: the policy holds the reference)
            self.ref_params = jax.tree.map(jnp.copy, params)
        self.state = self.stepper.initial_state(params, own)
        self.base_meta = adapters.checkpoint_meta(self.run, params)
        if self.config.eval.at_start and self.config.eval.num_problems > 0:
            t0 = time.time()  # one base policy for every member
            self.base_eval = evaluate(self.run, self.stepper.params_of(self.state, 0))
            self.base_eval["time/eval_s"] = time.time() - t0
            for member, writer in zip(self.members, self.writers, strict=True):
                writer.write(0, self.base_eval)
                rundir.write_base_eval(member.workdir, self.base_eval, writer=writer.enabled)
            self.notes.append("base  " + _fmt_eval(self.base_eval))

    # ---- what the loop calls

    def ended(self) -> list[bool]:
        """Each member's run has ended (frozen, or stopped on collapse): no more steps."""
        pairs = zip(self.frozen_at, self.collapsed_at, strict=True)
        return [f is not None or c is not None for f, c in pairs]

    def advance(self, step: int) -> bool:
        """Runs RL step ``step + 1`` of every live member and its housekeeping (checks,
        evaluation, metrics, the collapse watch, the checkpoint); True when every member's run
        has ended (a population's)."""
        done, rl = step + 1, self.config.rl
        pod.set_phase(f"in RL step {done}")
        ended = self.ended()
        self.state, ms, kept = self.stepper.step(self.state, self.ref_params, ~np.asarray(ended))
        if note := self.stepper.take_note():
            self.log.write(note)
        stop_run = None  # a single run's collapse with rl.stop_on_collapse
        for i, m in enumerate(ms):
            if ended[i]:
                continue  # a frozen or stopped member's run ended: no more metrics
            who = f"member {self.members[i].name} " if self.stepper.is_population else ""
            if not self.stepper.is_population:
                self.check(m, done)  # a single run stops on a non-finite metric
            evaluated = False
            if not kept[i]:  # a population member: frozen, the others go on
                self.frozen_at[i], self.last_eval[i] = done, None  # the end evaluates it
                m["train/frozen"] = 1.0
                self.log.write(f"{who}diverged at step {done}: frozen")
            elif evaluated := self.eval_due(done):
                self.last_eval[i] = self.evaluate_into(m, done, i)
            self.writers[i].write(done, m)
            # before the save: the count is run state
            warning = self.watches[i].update(done, m) if kept[i] else None
            if warning:
                self.log.write(f"{who.rstrip()}: {warning}" if who else warning)
            if warning and rl.stop_on_collapse:
                if not self.stepper.is_population:
                    stop_run = warning
                    continue
                self.collapsed_at[i] = done
                self.last_eval[i] = self.last_eval[i] if evaluated else None
                self.log.write(f"{who}stopped at step {done} (collapse)")
        over = all(self.ended())
        self.save(done, force=done == rl.num_steps or over)
        live = [m for i, m in enumerate(ms) if not ended[i] and self.frozen_at[i] is None]
        self.log.update(live[0] if live else ms[0])
        if stop_run:
            reason = stop_run.removeprefix("warning: ")
            self.stop(
                done,
                metrics_lib.CollapseError(
                    f"stopped at step {done} (config.rl.stop_on_collapse): {reason}"
                ),
            )
        return over

    def check(self, m: dict[str, float], done: int) -> None:
        """Raises on a non-finite metric or on a failed save of an earlier step."""
        if metrics_lib.non_finite(m):
            on_disk = self.ckpt.describe()
            try:  # the last good checkpoint is committed before the error
                self.ckpt.check_background(wait=True)
                on_disk = self.ckpt.describe()
            except checkpoint_lib.CheckpointSaveError as e:
                on_disk += f" (and: {e})"
            metrics_lib.check_finite(m, done, on_disk=on_disk)
        self.ckpt.check_background()  # a failed save of an earlier step surfaces here

    def eval_due(self, done: int) -> bool:
        ev = self.config.eval
        due = done == self.config.rl.num_steps or (ev.every and done % ev.every == 0)
        return bool(due and ev.num_problems > 0)

    def evaluate_into(self, m: dict[str, float], done: int, i: int = 0) -> dict[str, float]:
        """Evaluates member i's policy, adds the figures to its step's metrics, returns them."""
        te = time.time()
        result = evaluate(self.run, self.stepper.params_of(self.state, i))
        m.update(result)
        m["time/eval_s"] = time.time() - te
        who = f" member {self.members[i].name}" if self.stepper.is_population else ""
        self.log.write(f"step {done:4d}{who} " + _fmt_eval(result))
        return result

    def cpu_figures(self) -> dict[str, float]:
        """CPU seconds so far, over every invocation: the whole process (warm start, base
        evaluation, RL) and the RL loop's alone."""
        now = time.process_time()
        loop = now - self.cpu_loop if self.cpu_loop is not None else 0.0
        return dict(cpu_s=self.prior_cpu + now - self.cpu_start, rl_cpu_s=self.prior_rl_cpu + loop)

    def save(self, done: int, force: bool) -> None:
        meta = {"wall_s": self.prior_wall + time.time() - self.t_start, **self.cpu_figures()}
        if self.stepper.is_population:  # each member's counts and end
            meta.update(
                frozen_at=self.frozen_at,
                collapsed_at=self.collapsed_at,
                collapse=[w.state() for w in self.watches],
                members=[m.name for m in self.members],
            )
        else:
            meta["collapse"] = self.watches[0].state()
        meta.update(**self.meta_config, **self.base_meta)
        pod.set_phase(f"saving step {done}")
        state = adapters.saved_state(self.run, self.state)
        self.ckpt.save(done, state, self.data_iter, meta, force=force)

    def stop(self, done: int, error: Exception) -> NoReturn:
        """Saves step ``done``, waits for every save in flight, and raises ``error``."""
        self.save(done, force=True)
        self.ckpt.close()
        raise error

    def steps_done(self) -> int:
        return int(np.max(jax.device_get(self.state.step)))

    def finish(self, t_loop: float) -> dict:
        """The end of a completed run: each member's final evaluation (unless its last step had
        one), its summary.json and closing block; returns the summary (a population's: {member
        name: summary}, also WORKDIR/summary.json)."""
        summaries = {}
        for i, member in enumerate(self.members):
            last = self.last_eval[i]
            if last is None:
                last = evaluate(self.run, self.stepper.params_of(self.state, i))
            frozen, collapsed = self.frozen_at[i], self.collapsed_at[i]
            summary = rundir.make_summary(
                member.config.objective.name,
                member.workdir,
                self.base_eval,
                last,
                steps=frozen - 1 if frozen is not None else collapsed or self.steps_done(),
                wall_s=self.prior_wall + time.time() - self.t_start,
                warmstart_s=self.warm_s,
                rl_s=time.time() - t_loop,
                # (a population's members share one process: each reports the population's)
                warmstart_cpu_s=self.warm_cpu_s,
                **self.cpu_figures(),
            )
            if self.stepper.is_population:
                summary.update(member.summary_fields, frozen=frozen is not None)
                summary.update(frozen_at_step=frozen, collapsed_at_step=collapsed)
            writes = metrics_lib.is_writer_process()
            rundir.write_summary(member.workdir, summary, writer=writes)
            if writes and (frozen is not None or collapsed is not None):
                why = "froze (not finite)" if frozen is not None else "stopped (collapse)"
                print(f"member {member.name} {why} at step {frozen or collapsed}", flush=True)
            summaries[member.name] = summary
        if not self.stepper.is_population:
            return summaries[""]
        with open(os.path.join(self.workdir, "summary.json"), "w") as f:
            json.dump(rundir.strict_json({"members": summaries}), f, indent=2, allow_nan=False)
        return summaries


def make_stepper(config: ml_collections.ConfigDict, workdir: str):
    """The stepper of ``config`` (its checks and its Run built): a population's
    (config.population.seeds), the asynchronous pipeline's, or the synchronous step's."""
    if population_cfg.is_population(config):
        return steppers.PopulationStepper(population.build_population(config, workdir))
    run = build.build_run(config, workdir)
    return steppers.PipelineStepper(run) if run.step.pipelined else steppers.SyncStepper(run)


def _checked_stepper(
    config: ml_collections.ConfigDict, workdir: str, *, start_fresh: bool, notes: list[str]
):
    """The run's stepper, once every process agrees it runs this valid config in this shared
    workdir. ``start_fresh`` then moves the earlier run's checkpoints and files aside."""
    pod.configure(pod.timeout_of(config))
    pod.set_phase("checking the config")
    pod.check_same_config(config)  # every host runs the same config,
    stepper = pod.together("checking the config", lambda: make_stepper(config, workdir))
    run = stepper.run
    pod.check_same_workdir(workdir)  # in the same shared workdir
    ckpt_dir = os.path.join(run.workdir, "checkpoints")
    checkpoint_lib.check_directory(ckpt_dir)  # a file in its place: an error before any work
    if start_fresh:
        moved = checkpoint_lib.move_aside(ckpt_dir)
        if moved:
            notes.append(f"--start_fresh: moved {ckpt_dir} aside to {moved}")
        rundir.move_run_files_aside(run.workdir, writer=metrics_lib.is_writer_process())
    return stepper


def _saved_config(ckpt: checkpoint_lib.Checkpointer, step: int, workdir: str) -> dict | None:
    """The config a checkpoint was written with (its meta; config.json for older checkpoints)."""
    try:
        saved = ckpt.read_meta(step).get("config")
    except Exception:  # noqa: BLE001 (an unreadable checkpoint is reported by restore_latest)
        saved = None
    return saved if saved is not None else rundir.read_config_json(workdir)


def train(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    stop_after: int | None = None,
    allow_config_change: bool = False,
    start_fresh: bool = False,
) -> dict | None:
    """Runs (or resumes) the experiment ``config`` in ``workdir``; returns the summary dict (a
    population's: {member name: summary}).

    Every configuration check runs first (build.build_run), so a bad config fails in seconds; a
    resume with a config that differs from the checkpoint's in a field outside
    rundir.SAFE_TO_CHANGE is refused unless ``allow_config_change``. ``start_fresh`` moves the
    checkpoint folder aside and starts from step 0 (for a folder with no readable checkpoint).
    ``stop_after=n`` stops after n steps of this invocation without a final checkpoint, summary or
    evaluation, like a crash (tests use it); it returns None then. SIGTERM / SIGINT save the
    current step and raise Preempted.
    """
    s = Session(config, workdir, allow_config_change=allow_config_change, start_fresh=start_fresh)
    rl = s.config.rl
    start, t_loop = s.steps_done(), time.time()
    s.cpu_loop = time.process_time()
    try:
        with StopSignals() as signals:
            for step in range(start, rl.num_steps):
                if stop_after is not None and step - start >= stop_after:
                    break
                if s.advance(step):  # every member's run has ended
                    break
                done = step + 1
                signum = signals.agreed()
                if signum and done < rl.num_steps:
                    s.stop(done, Preempted(signum, done))
    finally:
        s.log.close()
        for w in s.writers:
            w.flush()
    s.ckpt.close()
    for w in s.writers:
        w.close()
    if stop_after is not None and s.steps_done() < rl.num_steps:
        return None
    return s.finish(t_loop)


def _fmt_eval(m: dict[str, float]) -> str:
    acc = m.get("eval/greedy_accuracy", float("nan"))
    length = m.get("eval/mean_response_length", float("nan"))
    tools = rundir.tool_figures_text(m, "eval/")
    return f"held-out greedy accuracy {acc:.3f}  mean response length {length:.1f}" + tools
