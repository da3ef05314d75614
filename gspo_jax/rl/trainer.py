"""The RL loop: rollout -> reward -> advantages -> (old/ref log-probs) -> update -> log/eval/save.

    summary = trainer.train(config, workdir)     # what `python -m gspo_jax.main` calls

Setup (task, model, objective, optimizer, mesh, base policy) lives in rl/build.py; one RL step
(its jitted phases and ``rl_step``) in rl/step.py; multi-host data placement in
runtime/distributed.py.
This module is the loop around them: resume, log, evaluate, checkpoint; the run directory's
files (base_eval.json, summary.json, the --start_fresh moves) are runtime/rundir.py's. ``Session``
holds
what one invocation sets up before the first step and finishes after the last; ``train`` is the
loop over steps.

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
from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import adapters, build, evaluation
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl import step as ts
from gspo_jax.rl.partial import PartialQueue
from gspo_jax.rl.pipeline import Pipeline, PipelineQueue
from gspo_jax.runtime import agreement as pod
from gspo_jax.runtime import checkpoint as checkpoint_lib
from gspo_jax.runtime import metrics as metrics_lib
from gspo_jax.runtime import rundir
from gspo_jax.state import Run, TrainState

# ------------------------------------------------------------------------------ evaluation


def evaluate(run: Run, params) -> dict[str, float] | None:
    """Held-out evaluation with the tasks' evaluation function, as eval/ metrics.

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
    """One invocation of ``train``: the run, its data, checkpoints, logs and training state.

    Constructing it does everything before the first step, in the order every process of a pod
    takes the same agreed decisions (runtime/agreement.py): the config and workdir checks,
    --start_fresh, the
    resume config check, the restore with its fallback, config.json and metrics.jsonl, then the
    initial state (the resumed one, or the base policy with its evaluation) and the reference
    parameters. The loop in ``train`` advances ``state``; ``finish`` ends a completed run.
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
        # printed above the progress bar, which starts after the warm start
        self.notes: list[str] = []
        self.run = _checked_run(config, workdir, start_fresh=start_fresh, notes=self.notes)
        self.config, self.workdir = self.run.config, self.run.workdir
        self.ckpt_dir = os.path.join(self.workdir, "checkpoints")
        # nothing is written before the config check
        self.data_iter = data_iterator.make_data_iterator(self.config, self.run.task)
        spec = self.run.step
        if spec.partial_rollout:  # the carried groups travel with the stream (rl/partial.py)
            self.data_iter = PartialQueue(
                self.data_iter,
                carried_batches=spec.partial_rollout,
                group_size=spec.group_size,
                max_new_tokens=spec.response_len,
                pad_id=spec.pad_id,
            )
        if spec.pipelined:  # the batches in flight travel with the stream (rl/pipeline.py)
            self.data_iter = PipelineQueue(self.data_iter)
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
        self.writer = self._open_writer(resumed_step)
        self.meta_config = {
            "config": rundir.config_dict(self.config),
            "config_hash": rundir.config_hash(self.config),
        }
        self.base_eval, self.warm_s, self.prior_wall, self.ref_params = None, 0.0, 0.0, None
        self.base_meta: dict = {}  # what checkpoints hold of the base (adapters.checkpoint_meta)
        pod.set_phase("loading the warm start")
        self.collapse = metrics_lib.CollapseWatch(self.config.rl.collapse_patience)
        if restored is not None:
            self._resume(*restored)
        else:
            self._start(no_checkpoint=latest is None)
        self.phases = ts.make_phases(
            self.run, self.state, with_ref=rl_batch.uses_reference(self.run)
        )
        self.pipeline = Pipeline(self.run, self.phases, self.data_iter) if spec.pipelined else None
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
            build.saved_abstract_state(self.run),
            self.data_iter,
            # every host says it in its own log (a fault may be one host's alone)
            report=self.notes.append if writes else lambda s: print(s, flush=True),
            any_process_count=self.config.data.process_sharding == "slice",
        )
        return latest, restored

    def _open_writer(self, resumed_step: int | None) -> metrics_lib.MetricWriter:
        """The metrics writer (metrics.jsonl cut back to the resumed step) and config.json."""
        writer = metrics_lib.MetricWriter(
            self.workdir, resume_step=resumed_step, tensorboard=self.config.log.tensorboard
        )
        kept = writer.write_config(self.config)
        if kept:
            self.notes.append(f"config.json changed; the earlier one is kept as {kept}")
        if writer.metrics_aside:
            self.notes.append(
                f"metrics.jsonl cut back to step {resumed_step or 0}; the full earlier "
                f"file is kept as {writer.metrics_aside}"
            )
        return writer

    def _resume(self, step: int, state: TrainState, meta: dict) -> None:
        """The restored state; the reference parameters are the base policy's, loaded again."""
        self.state = state
        self.prior_wall = float(meta.get("wall_s", 0.0))
        self.collapse.load(meta.get("collapse"))
        self.notes.append(f"resumed from step {step} in {self.workdir}")
        self.base_eval = rundir.read_base_eval(self.workdir)
        keeps_ref = adapters.keeps_reference_copy(self.run)
        if self.run.step.lora_adapters or keeps_ref:  # the base loads again
            base, _ = pod.together(
                "loading the warm start",
                lambda: build.base_params(self.run, build.cache_dir_of(self.config)),
            )
            self.state = adapters.restored(self.run, state, meta, base, self.ckpt_dir)
            self.base_meta = adapters.checkpoint_meta(self.run, base)
            self.ref_params = base if keeps_ref else None

    def _start(self, *, no_checkpoint: bool) -> None:
        """Step 0: the base policy (also the reference), evaluated when config.eval.at_start."""
        if no_checkpoint and self.writer.metrics_aside:
            self.notes.append(f"no checkpoint in {self.ckpt_dir}: starting from step 0")
        params, self.warm_s = pod.together(
            "loading the warm start",
            lambda: build.base_params(self.run, build.cache_dir_of(self.config)),
        )
        if adapters.keeps_reference_copy(self.run):  # (LoRA: the policy holds the reference)
            self.ref_params = jax.tree.map(jnp.copy, params)
        self.state = build.initial_state(self.run, params)
        self.base_meta = adapters.checkpoint_meta(self.run, params)
        if self.config.eval.at_start and self.config.eval.num_problems > 0:
            t0 = time.time()
            self.base_eval = evaluate(self.run, self.state.params)
            self.base_eval["time/eval_s"] = time.time() - t0
            self.writer.write(0, self.base_eval)
            rundir.write_base_eval(self.workdir, self.base_eval, writer=self.writer.enabled)
            self.notes.append("base  " + _fmt_eval(self.base_eval))

    # ---- what the loop calls

    def step(self, step: int) -> dict[str, float]:
        """Runs RL step ``step + 1``; returns its host metrics."""
        pod.set_phase(f"in RL step {step + 1}")
        if self.pipeline is not None:  # the asynchronous pipeline (rl/pipeline.py)
            self.state, m = self.pipeline.step(self.state, ref_params=self.ref_params)
            if self.pipeline.note:
                self.log.write(self.pipeline.note)
                self.pipeline.note = ""
            return m
        self.state, m = ts.rl_step(
            self.run,
            self.phases,
            self.state,
            next(self.data_iter),
            ref_params=self.ref_params,
            more_batches=lambda: next(self.data_iter),  # dynamic sampling's extra draws
            partial=self.data_iter if self.run.step.partial_rollout else None,
        )
        return m

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

    def evaluate_into(self, m: dict[str, float], done: int) -> dict[str, float]:
        """Evaluates the current policy, adds the figures to the step's metrics, returns them."""
        te = time.time()
        result = evaluate(self.run, self.state.params)
        m.update(result)
        m["time/eval_s"] = time.time() - te
        self.log.write(f"step {done:4d} " + _fmt_eval(result))
        return result

    def save(self, done: int, force: bool) -> None:
        meta = {
            "wall_s": self.prior_wall + time.time() - self.t_start,
            "collapse": self.collapse.state(),
            **self.meta_config,
            **self.base_meta,
        }
        pod.set_phase(f"saving step {done}")
        state = adapters.saved_state(self.run, self.state)
        self.ckpt.save(done, state, self.data_iter, meta, force=force)

    def collapsed(self, done: int, warning: str) -> None:
        """Prints the collapse warning; stops the run with config.rl.stop_on_collapse."""
        self.log.write(warning)
        if self.config.rl.stop_on_collapse:
            reason = warning.removeprefix("warning: ")
            self.stop(
                done,
                metrics_lib.CollapseError(
                    f"stopped at step {done} (config.rl.stop_on_collapse): {reason}"
                ),
            )

    def stop(self, done: int, error: Exception) -> NoReturn:
        """Saves step ``done``, waits for every save in flight, and raises ``error``."""
        self.save(done, force=True)
        self.ckpt.close()
        raise error

    def steps_done(self) -> int:
        return int(jax.device_get(self.state.step))

    def finish(self, last_eval: dict[str, float] | None, t_loop: float) -> dict:
        """The end of a completed run: the final evaluation (unless the last step had one) and
        summary.json; returns the summary."""
        if last_eval is None:
            last_eval = evaluate(self.run, self.state.params)
        summary = rundir.make_summary(
            self.config.objective.name,
            self.workdir,
            self.base_eval,
            last_eval,
            steps=self.steps_done(),
            wall_s=self.prior_wall + time.time() - self.t_start,
            warmstart_s=self.warm_s,
            rl_s=time.time() - t_loop,
        )
        rundir.write_summary(self.workdir, summary, writer=metrics_lib.is_writer_process())
        return summary


def _checked_run(
    config: ml_collections.ConfigDict, workdir: str, *, start_fresh: bool, notes: list[str]
) -> Run:
    """The run, once every process agrees it runs this valid config in this shared workdir.

    ``start_fresh`` then moves the earlier run's checkpoints and files aside.
    """
    pod.configure(pod.timeout_of(config))
    pod.set_phase("checking the config")
    pod.check_same_config(config)  # every host runs the same config,
    run = pod.together("checking the config", lambda: build.build_run(config, workdir))
    pod.check_same_workdir(workdir)  # in the same shared workdir
    ckpt_dir = os.path.join(run.workdir, "checkpoints")
    checkpoint_lib.check_directory(ckpt_dir)  # a file in its place: an error before any work
    if start_fresh:
        moved = checkpoint_lib.move_aside(ckpt_dir)
        if moved:
            notes.append(f"--start_fresh: moved {ckpt_dir} aside to {moved}")
        rundir.move_run_files_aside(run.workdir, writer=metrics_lib.is_writer_process())
    return run


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
    """Runs (or resumes) the experiment ``config`` in ``workdir``; returns the summary dict.

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
    start, last_eval, t_loop = s.steps_done(), None, time.time()
    try:
        with StopSignals() as signals:
            for step in range(start, rl.num_steps):
                if stop_after is not None and step - start >= stop_after:
                    break
                m = s.step(step)
                done = step + 1
                s.check(m, done)
                if s.eval_due(done):
                    last_eval = s.evaluate_into(m, done)
                s.writer.write(done, m)
                warning = s.collapse.update(done, m)  # before the save: the count is run state
                s.save(done, force=done == rl.num_steps)
                s.log.update(m)
                if warning:
                    s.collapsed(done, warning)
                signum = signals.agreed()
                if signum and done < rl.num_steps:
                    s.stop(done, Preempted(signum, done))
    finally:
        s.log.close()
        s.writer.flush()
    s.ckpt.close()
    s.writer.close()
    if stop_after is not None and s.steps_done() < rl.num_steps:
        return None
    return s.finish(last_eval, t_loop)


def _fmt_eval(m: dict[str, float]) -> str:
    acc = m.get("eval/greedy_accuracy", float("nan"))
    length = m.get("eval/mean_response_length", float("nan"))
    return f"held-out greedy accuracy {acc:.3f}  mean response length {length:.1f}"
