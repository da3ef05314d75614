"""Reading finished runs back for the notebooks: records, arms over seeds, spreads, figures.

A sweep writes one workdir per run (experiments/sweep.py), named ``<arm>_s<seed>``; every workdir
holds config.json, metrics.jsonl (one record per RL step, plus the eval records) and, once the run
has ended, summary.json. experiments/claims.py keeps each finished claim run as a committed record
of those three files (results/claims/<sweep>/<run>.json.gz, reporting/records.py), which is read
here the same way. Here:

    runs = analysis.load_runs("runs/claims/arith")          # {name: RunData}
    arms = analysis.by_arm(runs)                            # {"gspo": [s0, s1, s2], ...}
    s = analysis.spread([analysis.run_mean(r, "train/clip_frac") for r in arms["gspo"]])
    print(s)                                                # 0.2156 [0.2101, 0.2203] (3 seeds)
    analysis.plot_arms(ax, {"GSPO": arms["gspo"]}, "rollout/reward")

The verdicts are not made here: notebooks/reporting/verdicts.py decides them from the claims
registry (gspo_jax.claims), on per-seed numbers read with these functions.

The spread of an arm is its mean over seeds with the min and max over seeds (not a confidence
interval: three seeds do not support one). Nothing here trains; it only reads files.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from gspo_jax import claims
from gspo_jax.runtime import metrics as metrics_lib

from . import records as records_lib

_SEED_SUFFIX = re.compile(r"^(?P<arm>.+)_s(?P<seed>\d+)$")


@dataclasses.dataclass
class RunData:
    """One finished (or interrupted) run: its name, arm and seed, config, summary and records."""

    name: str
    arm: str  # the name without its "_s<seed>" suffix
    seed: int
    workdir: str  # the run's folder, or its record's path (reporting/records.py)
    config: dict[str, Any]
    summary: dict[str, Any] | None  # None while the run has not ended
    records: list[dict[str, float]]  # metrics.jsonl, in step order


def load_runs(root: str, pattern: str = "*", *, finished: bool = True) -> dict[str, RunData]:
    """Every run under ``root`` whose directory name matches ``pattern`` (glob), and every
    run record there (``<name>.json.gz``, reporting/records.py; a workdir of the same name wins).

    Raises FileNotFoundError naming the command that makes the runs when none is there, and when
    ``finished`` a run without summary.json (still running, or stopped: rerun its sweep).
    """
    out = {}
    for path in sorted(glob.glob(os.path.join(root, pattern + records_lib.SUFFIX))):
        rec = records_lib.read(path)
        check_entries(path, rec)
        m = _SEED_SUFFIX.match(rec["name"])
        out[rec["name"]] = RunData(
            name=rec["name"],
            arm=m["arm"] if m else rec["name"],
            seed=int(m["seed"]) if m else int(rec["config"].get("seed", 0)),
            workdir=path,
            config=rec["config"],
            summary=rec["summary"],
            records=metrics_lib.parse_jsonl(rec["metrics"].splitlines()),
        )
    for wd in sorted(glob.glob(os.path.join(root, pattern))):
        if not os.path.exists(os.path.join(wd, "config.json")):
            continue  # not a run (the sweep's tables, a preparation log, a record)
        name = os.path.basename(wd)
        m = _SEED_SUFFIX.match(name)
        summary_path = os.path.join(wd, "summary.json")
        summary = None
        if os.path.exists(summary_path):
            with open(summary_path) as f:
                summary = json.load(f)
        elif finished:
            raise FileNotFoundError(
                f"run {wd} has not finished (no summary.json); rerun the command that made it "
                f"(experiments/claims.py resumes unfinished runs)"
            )
        with open(os.path.join(wd, "config.json")) as f:
            config = json.load(f)
        records = metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))
        out[name] = RunData(
            name=name,
            arm=m["arm"] if m else name,
            seed=int(m["seed"]) if m else int(config.get("seed", 0)),
            workdir=wd,
            config=config,
            summary=summary,
            records=records,
        )
    if not out:
        raise FileNotFoundError(
            f"no runs matching {pattern!r} under {root}; make them with "
            f"`python experiments/claims.py <notebook>` (see the notebook's first cell)"
        )
    return out


def check_entries(path: str, record: Mapping[str, Any]) -> None:
    """ValueError naming the record and the entry when a record was made for a registry entry
    whose content has changed since (its hash differs from the entry's hash now): an entry is
    never edited after its runs, a changed criterion is a new version. A record without entry
    hashes ("pre-hash", made before they were kept) is accepted: registration_order checks its
    entries against git history instead."""
    for name, made_for in record.get("entries", {}).items():
        key, _, version = name.rpartition(" v")
        now = next((e for e in claims.entries(key) if e.version == int(version)), None)
        if now is None or claims.entry_hash(now) != made_for:
            raise ValueError(
                f"{path} was made for registry entry {name} (hash {made_for[:12]}), which "
                f"{'no longer exists' if now is None else 'has been edited since'}: restore the "
                "entry as it was and register the change as a new version (supersedes)"
            )


def by_arm(runs: Mapping[str, RunData] | Iterable[RunData]) -> dict[str, list[RunData]]:
    """Runs grouped by arm (name without the seed suffix), each list sorted by seed."""
    values = runs.values() if isinstance(runs, Mapping) else runs
    arms: dict[str, list[RunData]] = {}
    for r in values:
        arms.setdefault(r.arm, []).append(r)
    return {k: sorted(v, key=lambda r: r.seed) for k, v in arms.items()}


def series(run: RunData, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps [N], values [N]) of the records that hold ``key``."""
    rows = [(r["step"], r[key]) for r in run.records if key in r]
    if not rows:
        raise KeyError(f"run {run.name} never logged {key!r}")
    steps, values = zip(*rows, strict=True)
    return np.asarray(steps), np.asarray(values, dtype=np.float64)


def wall_series(run: RunData, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(RL wall seconds [N], values [N]): the x axis is the cumulative time/step_s (the whole RL
    step: rollout, log-prob passes, update; evaluation excluded) up to each record's step."""
    steps, values = series(run, key)
    t_steps, t = series(run, "time/step_s")
    cum = dict(zip(t_steps.tolist(), np.cumsum(t).tolist(), strict=True))
    cum[0] = 0.0
    return np.asarray([cum.get(int(s), np.nan) for s in steps]), values


def stacked(runs: Sequence[RunData], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps [N], values [n_runs, N]) on the steps every run logged ``key`` at."""
    per_run = [dict(zip(*[a.tolist() for a in series(r, key)], strict=True)) for r in runs]
    steps = sorted(set.intersection(*(set(d) for d in per_run)))
    if not steps:
        raise ValueError(f"runs {[r.name for r in runs]} logged {key!r} at no common step")
    return np.asarray(steps), np.asarray([[d[s] for s in steps] for d in per_run])


def _over_steps(run: RunData, key: str, first_step: int) -> np.ndarray:
    steps, values = series(run, key)
    values = values[steps >= first_step]
    if values.size == 0:
        raise ValueError(f"run {run.name} logged {key!r} at no step >= {first_step}")
    return values


def run_mean(run: RunData, key: str, first_step: int = 1) -> float:
    """Mean of ``key`` over the run's RL steps from ``first_step`` on."""
    return float(_over_steps(run, key, first_step).mean())


def run_median(run: RunData, key: str, first_step: int = 2) -> float:
    """Median of ``key`` from ``first_step`` on: for times, where step 1 (which compiles) and a
    resumed run's first step would dominate a mean."""
    return float(np.median(_over_steps(run, key, first_step)))


def _summary_eval(run: RunData, which: str, key: str) -> float:
    if not key.startswith("eval/"):
        raise KeyError(f"{key!r}: summary.json holds evaluation metrics only (eval/...)")
    part = (run.summary or {}).get(which)
    if part is None:
        raise KeyError(f"run {run.name} has no {which!r} evaluation in summary.json")
    value = part.get(key[len("eval/") :])
    return math.nan if value is None else float(value)  # NaN is stored as null


def final(run: RunData, key: str) -> float:
    """An eval/ metric of the final evaluation (summary.json's "final"); for other keys, or a
    run without a summary, the last record that logged ``key``."""
    if key.startswith("eval/") and run.summary and run.summary.get("final"):
        return _summary_eval(run, "final", key)
    return float(series(run, key)[1][-1])


def base(run: RunData, key: str) -> float:
    """An eval/ metric of the evaluation before RL (summary.json's "base")."""
    return _summary_eval(run, "base", key)


class Spread(NamedTuple):
    """Mean over seeds with the min and max over seeds."""

    mean: float
    lo: float
    hi: float
    n: int

    def fmt(self, digits: int = 3, pct: bool = False) -> str:
        k = 100.0 if pct else 1.0
        unit = " %" if pct else ""
        return (
            f"{k * self.mean:.{digits}g}{unit} [{k * self.lo:.{digits}g}, {k * self.hi:.{digits}g}]"
            f" ({self.n} seed{'s' if self.n != 1 else ''})"
        )

    def __str__(self) -> str:
        return self.fmt()

    def below(self, other: Spread) -> bool:
        """True when every seed here is below every seed there (the ranges do not overlap)."""
        return self.hi < other.lo


def spread(values: Iterable[float]) -> Spread:
    v = np.asarray(list(values), dtype=np.float64)
    if v.size == 0:
        raise ValueError("spread of no values: the arm has no runs")
    return Spread(float(v.mean()), float(v.min()), float(v.max()), int(v.size))


def arm_spread(runs: Sequence[RunData], fn) -> Spread:
    """spread of ``fn(run)`` over an arm's seeds."""
    return spread(fn(r) for r in runs)


def plot_arms(
    ax,
    arms: Mapping[str, Sequence[RunData]],
    key: str,
    *,
    wall: bool = False,
    smooth: int = 1,
    **line_kw,
) -> None:
    """One line per arm: the mean over seeds, with the min-max band over seeds shaded.

    ``wall``: x is RL wall seconds (seeds' own times averaged per step) instead of the step;
    ``smooth``: a trailing moving average over that many points (1 = none).
    """
    for label, runs in arms.items():
        steps, values = stacked(runs, key)
        if wall:  # each seed's own cumulative time at these steps, averaged over seeds
            per_run = []
            for r in runs:
                s, _ = series(r, key)
                w, _ = wall_series(r, key)
                d = dict(zip(s.tolist(), w.tolist(), strict=True))
                per_run.append([d[x] for x in steps])
            x = np.asarray(per_run).mean(0)
        else:
            x = steps
        if smooth > 1:
            kernel = np.ones(smooth) / smooth
            values = np.stack(
                [
                    np.convolve(np.pad(v, (smooth - 1, 0), mode="edge"), kernel, "valid")
                    for v in values
                ]
            )
        (line,) = ax.plot(x, values.mean(0), label=f"{label} ({len(runs)})", **line_kw)
        if len(runs) > 1:
            ax.fill_between(x, values.min(0), values.max(0), color=line.get_color(), alpha=0.2)
    ax.set_xlabel("RL wall time (s)" if wall else "RL step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)


def fmt_table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> str:
    """A markdown table of ``rows`` (floats to 4 significant digits)."""

    def cell(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def base_policy_groups(
    run: RunData, *, num_prompts: int = 256, split: str = "train", seed: int = 0
) -> dict[str, np.ndarray]:
    """Groups sampled from a run's base policy (its warm start, from the cache the run used), as
    the run's first RL step samples them: rl.group_size responses per prompt at
    rl.temperature. Returns the task's score parts, each [P, G] (P = ``num_prompts``).

    Used to look at what the advantage estimators make of real groups (notebooks/
    std_normalisation.ipynb) without a training run.
    """
    import jax
    import ml_collections
    from flax import nnx

    from gspo_jax import data, rollout
    from gspo_jax.rl import build as experiment

    config = ml_collections.ConfigDict(run.config)
    config.log.progress = False
    built = experiment.build_run(config)
    params, _ = experiment.base_params(built)
    model = nnx.merge(built.graphdef, params, built.rest)
    task, rl, G = built.task, built.config.rl, built.config.rl.group_size
    parts: dict[str, list[np.ndarray]] = {}
    batches = data.make_eval_batches(
        task,
        split,
        batch_size=min(64, num_prompts),
        num_problems=num_prompts,
        data_dir=config.data.data_dir or None,
    )
    for i, (batch, n) in enumerate(batches):
        out = rollout.generate(
            model,
            batch["prompt"],
            batch["prompt_length"],
            num_samples=G,
            max_new_tokens=rl.max_new_tokens,
            rng=jax.random.fold_in(jax.random.key(seed), i),
            temperature=rl.temperature,
            eos_id=task.tokenizer.eos_id,
            pad_id=task.tokenizer.pad_id,
        )
        scores = task.score(batch, np.asarray(out.tokens), np.asarray(out.mask), G)
        for k, v in scores.items():
            parts.setdefault(k, []).append(np.asarray(v).reshape(-1, G)[:n])
        parts.setdefault("length", []).append(np.asarray(out.mask).sum(-1).reshape(-1, G)[:n])
    return {k: np.concatenate(v) for k, v in parts.items()}
