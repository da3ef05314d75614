"""Metric writers (JSONL + TensorBoard), the progress display and the non-finite guard.

Every run directory gets:

    <workdir>/config.json      the full config, written once at start
    <workdir>/metrics.jsonl    one JSON object per line: {"step": int, "<prefix>/<name>": float, ...}
    <workdir>/tb/              TensorBoard event files with the same scalars

Metric names carry one of the prefixes ``train/`` (update step: loss, clip fractions, ratios,
gradient norm), ``rollout/`` (sampling and rewards: reward parts, response lengths, entropy,
zero-variance groups, rollout-vs-trainer log-prob difference), ``eval/`` (held-out evaluation) and
``time/`` (phase timings and throughput). The prefix is enforced so that notebooks and the sweep
collector can rely on it.

Only process 0 writes (DESIGN.md convention 9): every other process gets a writer whose methods do
nothing, so the trainer calls the same code on every host.

A resumed run truncates metrics.jsonl to the restored step and purges TensorBoard events after it,
so that the resumed run's log equals that of an uninterrupted run.

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


def check_finite(metrics: Mapping[str, float], step: int, names: Iterable[str] = GUARDED) -> None:
    """Raises NonFiniteError naming every guarded quantity that is NaN or inf.

    Only the quantities that would corrupt the parameters are guarded (loss, gradient and update
    norms); a NaN in a diagnostic (say a ratio statistic of an empty batch) is reported but does not
    stop the run.
    """
    bad = [f"{n}={metrics[n]}" for n in names if n in metrics and not math.isfinite(metrics[n])]
    if bad:
        raise NonFiniteError(
            f"non-finite {', '.join(bad)} at step {step}: the update diverged. The state of this "
            "step was not saved; the last checkpoint in the workdir is intact. Lower the learning "
            "rate (config.optimizer.learning_rate) or tighten config.optimizer.grad_clip, then "
            "restart the same command to resume from that checkpoint."
        )


def truncate_jsonl(path: str, max_step: int) -> None:
    """Keeps only records with step <= max_step (used when a run resumes from a checkpoint)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= max_step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError):
            continue  # a line cut by a crash mid-write
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def read_jsonl(path: str) -> list[dict[str, float]]:
    """Reads a metrics.jsonl file into a list of dicts (for tests, the sweep collector, notebooks).

    Non-finite values, stored as the strings "nan" / "inf" / "-inf", come back as floats.
    """
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [{k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in r.items()}
            for r in recs]


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
        self._tb = None
        if not self.enabled:
            return
        if resume_step is not None:
            truncate_jsonl(self.jsonl_path, resume_step)
        self._jsonl = open(self.jsonl_path, "a")  # noqa: SIM115 (closed in close())
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=purge, flush_secs=30)

    def write_config(self, config: Any) -> None:
        """Writes config.json (a ConfigDict, dict, or anything with to_dict())."""
        if not self.enabled:
            return
        d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        with open(os.path.join(self.workdir, "config.json"), "w") as f:
            json.dump(d, f, indent=2, sort_keys=True, default=str)

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
        from tqdm.auto import tqdm

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
        """Prints a line above the bar (process 0 only)."""
        if self.enabled:
            self._bar.write(msg)

    def close(self) -> None:
        self._bar.close()
