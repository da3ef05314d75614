"""The RL loop: rollout -> reward -> advantages -> (old/ref log-probs) -> update -> log/eval/save.

    summary = trainer.train(config, workdir)     # what `python -m gspo_jax.main` calls

Setup (task, model, objective, optimizer, mesh, base policy) lives in experiment.py; one RL step
(its jitted phases and ``rl_step``) in train_step.py; multi-host data placement in distributed.py.
This module is the loop around them: resume, log, evaluate, checkpoint; the run directory's
files (base_eval.json, summary.json, the --start_fresh moves) are rundir.py's.

Dimension legend: P prompts per step (P_local on this process), G samples per prompt, B = P*G
response rows (group-contiguous), Lp padded prompt length, T = max_new_tokens.

One RL step, phase by phase, is described once, in docs/design.md "The data flow of one RL step".

Randomness is a pure function of (config.seed, step) (experiment.step_keys), and the data
iterator's state is checkpointed, so restarting the same command in the same workdir resumes
exactly: parameters and metrics equal those of an uninterrupted run. The same config gives the same
results on one device and on a mesh of many (sharding changes only the order of float sums).

Multi-host: every process runs this same loop (SPMD) on its share of the prompts (see
distributed.py: by default every host reads the global batch and keeps its rows, so results do not
depend on the process count); jax.make_array_from_process_local_data assembles the global batch,
and each process scores the response rows of its own prompts. Only process 0 writes metrics,
config.json and summary.json; orbax writes checkpoint shards from every process. Every decision one
host could take alone (the config check, the restore and its fallback, the warm-start load, a
failed save, a stop signal) is agreed first (pod.py), within config.multihost.timeout_s, and
before any work every process checks that all run the same config in the same shared workdir.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from gspo_jax import checkpoint as checkpoint_lib
from gspo_jax import distributed, pod, rundir, sharding
from gspo_jax import experiment as exp
from gspo_jax import metrics as metrics_lib
from gspo_jax import train_step as ts

# ------------------------------------------------------------------------------ evaluation


def evaluate(run: exp.Run, params) -> dict[str, float] | None:
    """Held-out evaluation with the tasks' evaluation function, as eval/ metrics.

    None when evaluation is off (config.eval.num_problems = 0).
    """
    from gspo_jax import evaluation

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

    Every configuration check runs first (experiment.build_run), so a bad config fails in seconds; a
    resume with a config that differs from the checkpoint's in a field outside
    rundir.SAFE_TO_CHANGE is refused unless ``allow_config_change``. ``start_fresh`` moves the
    checkpoint folder aside and starts from step 0 (for a folder with no readable checkpoint).
    ``stop_after=n`` stops after n steps of this invocation without a final checkpoint, summary or
    evaluation, like a crash (tests use it); it returns None then. SIGTERM / SIGINT save the
    current step and raise Preempted.
    """
    t_start = time.time()
    pod.configure(pod.timeout_of(config))
    pod.set_phase("checking the config")
    pod.check_same_config(config)  # every host runs the same config,
    run = pod.together("checking the config", lambda: exp.build_run(config, workdir))
    pod.check_same_workdir(workdir)  # in the same shared workdir
    config, rl, workdir = run.config, run.config.rl, run.workdir
    ckpt_dir = os.path.join(workdir, "checkpoints")
    checkpoint_lib.check_directory(ckpt_dir)  # a file in its place: an error before any work
    notes = []  # printed above the progress bar, which starts after the warm start
    if start_fresh:
        moved = checkpoint_lib.move_aside(ckpt_dir)
        if moved:
            notes.append(f"--start_fresh: moved {ckpt_dir} aside to {moved}")
        rundir.move_run_files_aside(workdir, writer=metrics_lib.is_writer_process())

    # ---- data, checkpoints, config identity, logs (nothing is written before the config check)
    data_iter = distributed.make_data_iterator(config, run.task)
    ckpt = checkpoint_lib.Checkpointer(
        ckpt_dir,
        save_every=config.checkpoint.every,
        max_to_keep=config.checkpoint.max_to_keep,
        async_save=config.checkpoint.async_save,
        timeout_s=pod.timeout_of(config),
    )
    pod.describe_kept(ckpt.describe)
    latest = ckpt.latest_step()
    if latest is not None:
        notes += pod.together(
            "comparing the config with the checkpoint's",
            lambda: rundir.check_resume_config(
                _saved_config(ckpt, latest, workdir),
                config,
                latest,
                allow_change=allow_config_change,
            ),
        )
    pod.set_phase("restoring the newest checkpoint")
    restored = ckpt.restore_latest(
        exp.abstract_state(run, run.abs_params),
        data_iter,
        # every host says it in its own log (a fault may be one host's alone)
        report=notes.append if metrics_lib.is_writer_process() else lambda s: print(s, flush=True),
        any_process_count=config.data.process_sharding == "slice",
    )
    resumed_step = restored[0] if restored is not None else None
    writer = metrics_lib.MetricWriter(
        workdir, resume_step=resumed_step, tensorboard=config.log.tensorboard
    )
    kept = writer.write_config(config)
    if kept:
        notes.append(f"config.json changed; the earlier one is kept as {kept}")
    if writer.metrics_aside:
        notes.append(
            f"metrics.jsonl cut back to step {resumed_step or 0}; the full earlier "
            f"file is kept as {writer.metrics_aside}"
        )
    meta_config = {"config": rundir.config_dict(config), "config_hash": rundir.config_hash(config)}

    # ---- initial state: resume, or the base policy
    cache_dir = exp.cache_dir_of(config)
    base_eval, warm_s, prior_wall, ref_params = None, 0.0, 0.0, None
    pod.set_phase("loading the warm start")
    collapse = metrics_lib.CollapseWatch(rl.collapse_patience)
    if restored is not None:
        _, state, meta = restored
        prior_wall = float(meta.get("wall_s", 0.0))
        collapse.load(meta.get("collapse"))
        notes.append(f"resumed from step {resumed_step} in {workdir}")
        base_eval = rundir.read_base_eval(workdir)
        if run.objective.kl_coef > 0:
            ref_params, _ = pod.together(
                "loading the warm start", lambda: exp.base_params(run, cache_dir)
            )
    else:
        if latest is None and writer.metrics_aside:
            notes.append(f"no checkpoint in {ckpt_dir}: starting from step 0")
        params, warm_s = pod.together(
            "loading the warm start", lambda: exp.base_params(run, cache_dir)
        )
        if run.objective.kl_coef > 0:
            ref_params = jax.tree.map(jnp.copy, params)
        state = exp.initial_state(run, params)
        if config.eval.at_start and config.eval.num_problems > 0:
            t0 = time.time()
            base_eval = evaluate(run, state.params)
            base_eval["time/eval_s"] = time.time() - t0
            writer.write(0, base_eval)
            rundir.write_base_eval(workdir, base_eval, writer=writer.enabled)
            notes.append("base  " + _fmt_eval(base_eval))
    phases = ts.make_phases(run, state, with_ref=ref_params is not None)
    log = metrics_lib.Progress(
        total=rl.num_steps,
        initial=resumed_step or 0,
        enabled=None if config.log.progress else False,
    )
    for note in notes:
        log.write(note)

    # ---- the loop
    start = int(jax.device_get(state.step))
    last_eval = None
    t_loop = time.time()

    def save(done: int, force: bool) -> None:
        meta = {
            "wall_s": prior_wall + time.time() - t_start,
            "collapse": collapse.state(),
            **meta_config,
        }
        pod.set_phase(f"saving step {done}")
        ckpt.save(done, state, data_iter, meta, force=force)

    try:
        with StopSignals() as signals:
            for step in range(start, rl.num_steps):
                if stop_after is not None and step - start >= stop_after:
                    break
                pod.set_phase(f"in RL step {step + 1}")
                state, m = ts.rl_step(
                    run,
                    phases,
                    state,
                    next(data_iter),
                    ref_params=ref_params,
                    more_batches=lambda: next(data_iter),  # dynamic sampling's extra draws
                )
                done = step + 1
                if metrics_lib.non_finite(m):
                    on_disk = ckpt.describe()
                    try:  # the last good checkpoint is committed before the error
                        ckpt.check_background(wait=True)
                        on_disk = ckpt.describe()
                    except checkpoint_lib.CheckpointSaveError as e:
                        on_disk += f" (and: {e})"
                    metrics_lib.check_finite(m, done, on_disk=on_disk)
                ckpt.check_background()  # a failed save of an earlier step surfaces here
                due = done == rl.num_steps or (config.eval.every and done % config.eval.every == 0)
                if due and config.eval.num_problems > 0:
                    te = time.time()
                    last_eval = evaluate(run, state.params)
                    m.update(last_eval)
                    m["time/eval_s"] = time.time() - te
                    log.write(f"step {done:4d} " + _fmt_eval(last_eval))
                writer.write(done, m)
                warning = collapse.update(done, m)  # before the save: the count is run state
                save(done, force=done == rl.num_steps)
                log.update(m)
                if warning:
                    log.write(warning)
                    if rl.stop_on_collapse:
                        save(done, force=True)
                        ckpt.close()
                        raise metrics_lib.CollapseError(
                            f"stopped at step {done} (config.rl.stop_on_collapse): "
                            f"{warning.removeprefix('warning: ')}"
                        )
                signum = signals.agreed()
                if signum and done < rl.num_steps:
                    save(done, force=True)
                    ckpt.close()  # waits for every save in flight
                    raise Preempted(signum, done)
    finally:
        log.close()
        writer.flush()
    ckpt.close()
    writer.close()
    if stop_after is not None and int(jax.device_get(state.step)) < rl.num_steps:
        return None

    if last_eval is None:
        last_eval = evaluate(run, state.params)
    summary = rundir.make_summary(
        config.objective.name,
        workdir,
        base_eval,
        last_eval,
        steps=int(jax.device_get(state.step)),
        wall_s=prior_wall + time.time() - t_start,
        warmstart_s=warm_s,
        rl_s=time.time() - t_loop,
    )
    rundir.write_summary(workdir, summary, writer=metrics_lib.is_writer_process())
    return summary


def _fmt_eval(m: dict[str, float]) -> str:
    acc = m.get("eval/greedy_accuracy", float("nan"))
    length = m.get("eval/mean_response_length", float("nan"))
    return f"held-out greedy accuracy {acc:.3f}  mean response length {length:.1f}"
