"""Metric writers (JSONL + TensorBoard), the progress display and the non-finite guard.

Every run directory gets:

    <workdir>/config.json      the full config, written once at start
    <workdir>/metrics.jsonl    one JSON object per line: {"step": int, "<prefix>/<name>": float}
    <workdir>/tb/              TensorBoard event files with the same scalars

Metric names carry one of the prefixes ``train/`` (update step: loss, clip fractions, ratios,
gradient norm), ``rollout/`` (sampling and rewards: reward parts, response lengths, entropy,
zero-variance groups, rollout-vs-trainer log-prob difference), ``eval/`` (held-out evaluation) and
``time/`` (phase timings and throughput). The prefix is enforced so that notebooks and the sweep
collector can rely on it.

Only process 0 writes (docs/design.md convention 9): every other process gets a writer whose
methods do nothing, so the trainer calls the same code on every host.

A resumed run cuts metrics.jsonl back to the restored step (a fresh start in a used workdir, to
nothing), keeping the old file beside it (rundir.cut_metrics), and purges TensorBoard events after
it, so that no step is logged twice and the resumed run's log equals an uninterrupted run's.
Non-finite scalars are kept in metrics.jsonl (as the strings "nan", "inf") but not sent to
TensorBoard, which warns on every one.

``CollapseWatch`` says when the run has had no learning signal (every group's rewards equal, so
every advantage is 0) for a stretch of steps: a policy collapsed by too large a learning rate looks
exactly like that, and otherwise "succeeds" quietly.

No array dimensions here: every value is a host scalar.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from gspo_jax.runtime import rundir

PREFIXES = ("train/", "rollout/", "eval/", "time/")
# Quantities whose non-finiteness stops the run (the loss and everything that feeds the update).
GUARDED = ("train/loss", "train/grad_norm", "train/update_norm")
# Headline figures shown on the progress bar: (metric name, short label, format).
HEADLINE = (
    ("rollout/reward", "rew", "{:.3f}"),
    ("rollout/correct", "acc", "{:.3f}"),
    ("rollout/response_len_mean", "len", "{:.1f}"),
    ("train/clip_frac", "clip", "{:.3f}"),
    ("train/kl_ref", "kl", "{:.2e}"),
    ("eval/greedy_accuracy", "eval", "{:.3f}"),
)


class NonFiniteError(FloatingPointError):
    """A loss or gradient became NaN or inf; the message names the quantity and the step."""


def is_writer_process() -> bool:
    """True on the one process that writes files (process 0)."""
    return jax.process_index() == 0


def to_host_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Converts a flat dict of 0-d arrays / numbers into Python floats (one device transfer)."""
    host = jax.device_get(dict(metrics))
    out = {}
    for k, v in host.items():
        arr = np.asarray(v)
        if arr.size != 1:
            raise ValueError(f"metric {k!r} has shape {arr.shape}; metrics must be scalars")
        out[k] = float(arr.reshape(()))
    return out


def with_prefix(prefix: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Adds ``prefix`` (one of PREFIXES) to every key that does not already have one."""
    if prefix not in PREFIXES:
        raise ValueError(f"metric prefix {prefix!r} is not one of {PREFIXES}")
    return {(k if k.startswith(PREFIXES) else prefix + k): v for k, v in metrics.items()}


def non_finite(metrics: Mapping[str, float], names: Iterable[str] = GUARDED) -> list[str]:
    """``name=value`` of every guarded quantity that is NaN or inf.

    Only the quantities that would corrupt the parameters are guarded (loss, gradient and update
    norms); a NaN in a diagnostic (say a ratio statistic of an empty batch) is logged but does not
    stop the run.
    """
    return [f"{n}={metrics[n]}" for n in names if n in metrics and not math.isfinite(metrics[n])]


def check_finite(
    metrics: Mapping[str, float],
    step: int,
    names: Iterable[str] = GUARDED,
    *,
    on_disk: str = "the last checkpoint in the workdir is intact",
) -> None:
    """Raises NonFiniteError naming every guarded quantity that is NaN or inf at ``step``.

    ``on_disk`` says what the user can resume from (the trainer passes the checkpoint folder's
    actual state, e.g. "the newest checkpoint is step 40 in ..." or "no checkpoint ... yet").
    """
    bad = non_finite(metrics, names)
    if bad:
        raise NonFiniteError(
            f"non-finite {', '.join(bad)} at step {step}: the update diverged and this step was "
            f"not saved; {on_disk}. Lower the learning rate (config.optimizer.learning_rate) or "
            "tighten config.optimizer.grad_clip, then rerun the same command."
        )


class CollapseError(RuntimeError):
    """The run had no learning signal for too long and config.rl.stop_on_collapse asked to stop."""


class CollapseWatch:
    """Counts consecutive steps whose every group has zero reward variance (no learning signal).

    ``update`` returns a warning once per stretch, when the stretch reaches ``patience`` steps
    (patience 0: never). The run decides whether to stop (config.rl.stop_on_collapse). The count
    is run state: ``state()`` goes into every checkpoint and ``load`` restores it, so a resumed
    run warns (or stops) at the same step as an uninterrupted one.
    """

    def __init__(self, patience: int):
        self.patience = patience
        self.stretch = 0
        self.since = 0

    def state(self) -> dict[str, int]:
        return {"stretch": self.stretch, "since": self.since}

    def load(self, state: Mapping[str, int] | None) -> None:
        """Restores ``state()`` (None: a checkpoint from before the count was saved)."""
        state = state or {}
        self.stretch, self.since = int(state.get("stretch", 0)), int(state.get("since", 0))

    def update(self, step: int, metrics: Mapping[str, float]) -> str | None:
        frac = metrics.get("rollout/frac_zero_std_groups")
        if frac is None or self.patience <= 0:
            return None
        if frac < 1.0:
            self.stretch = 0
            return None
        self.stretch += 1
        if self.stretch == 1:
            self.since = step
        if self.stretch != self.patience:
            return None
        reward = metrics.get("rollout/reward", math.nan)
        return (
            f"warning: no learning signal for {self.patience} steps in a row (steps {self.since}-"
            f"{step}: in every group all rewards are equal, mean reward {reward:.3f}, so every "
            "advantage is 0); the policy may have collapsed (learning rate too high?). "
            "config.rl.stop_on_collapse=True stops such a run"
        )


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def read_jsonl(path: str) -> list[dict[str, float]]:
    """Reads a metrics.jsonl file into a list of dicts (for tests, the sweep collector, notebooks).

    Non-finite values, stored as the strings "nan" / "inf" / "-inf", come back as floats.
    """
    with open(path) as f:
        return parse_jsonl(f)


def parse_jsonl(lines: Iterable[str]) -> list[dict[str, float]]:
    """The records of metrics.jsonl's lines (read_jsonl's parsing, for text held elsewhere)."""
    recs = [json.loads(line) for line in lines if line.strip()]
    return [
        {k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in r.items()} for r in recs
    ]


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # JSON has no NaN/inf; keep them readable instead of invalid
    return x


class MetricWriter:
    """Writes scalars to metrics.jsonl and TensorBoard from process 0; a no-op elsewhere.

    Args:
      workdir: run directory (must exist and be writable on process 0).
      resume_step: when resuming, the restored step: later JSONL records are dropped and
        TensorBoard events after it are purged.
      tensorboard: write TensorBoard event files too.
    """

    def __init__(self, workdir: str, *, resume_step: int | None = None, tensorboard: bool = True):
        self.enabled = is_writer_process()
        self.workdir = workdir
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self.metrics_aside: str | None = None  # where an older metrics.jsonl was kept, if any
        self._tb = None
        if not self.enabled:
            return
        keep_until = -1 if resume_step is None else resume_step
        self.metrics_aside = rundir.cut_metrics(workdir, keep_until)
        self._jsonl = open(self.jsonl_path, "a")  # noqa: SIM115 (closed in close())
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(
                os.path.join(workdir, "tb"), purge_step=keep_until + 1, flush_secs=30
            )

    def write_config(self, config: Any) -> str | None:
        """Writes config.json (a ConfigDict, dict, or anything with to_dict()); an earlier,
        different config.json is kept as config.<n>.json, whose path is returned."""
        if not self.enabled:
            return None
        return rundir.write_config_json(self.workdir, config)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Writes one record. Every name must carry one of PREFIXES."""
        bad = [k for k in metrics if not k.startswith(PREFIXES)]
        if bad:
            raise ValueError(f"metric names {bad} lack a prefix; use one of {PREFIXES}")
        if not self.enabled:
            return
        record = {"step": int(step)}
        record.update({k: _jsonable(float(v)) for k, v in sorted(metrics.items())})
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if math.isfinite(float(v)):
                    self._tb.add_scalar(k, float(v), global_step=int(step))

    def flush(self) -> None:
        if self.enabled:
            self._jsonl.flush()
            if self._tb is not None:
                self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()


class Progress:
    """A tqdm progress bar over RL steps showing the headline figures (process 0 only)."""

    def __init__(self, total: int, initial: int = 0, desc: str = "rl", enabled: bool | None = None):
        from tqdm import tqdm  # the terminal bar (tqdm.auto warns in kernels without ipywidgets)

        self.enabled = is_writer_process() if enabled is None else enabled
        self._bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            disable=not self.enabled,
            dynamic_ncols=True,
            mininterval=1.0,
        )
        self._last: dict[str, str] = {}

    def update(self, metrics: Mapping[str, float], n: int = 1) -> None:
        for name, label, fmt in HEADLINE:
            if name in metrics:
                self._last[label] = fmt.format(metrics[name])
        self._bar.set_postfix(self._last, refresh=False)
        self._bar.update(n)

    def write(self, msg: str) -> None:
        """Prints a line above the bar (process 0 only; printed plainly when the bar is off)."""
        if self.enabled:
            self._bar.write(msg)
        elif is_writer_process():
            print(msg, flush=True)

    def close(self) -> None:
        self._bar.close()
