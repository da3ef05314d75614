"""What a run directory records, and how a restart keeps that record consistent.

    <workdir>/config.json          the config of the run; an earlier, different one is kept as
                                   config.1.json, config.2.json, ... (oldest first)
    <workdir>/metrics.jsonl        one record per step, never a step twice (see cut_metrics)
    <workdir>/checkpoints/<step>/  orbax checkpoints; their meta item holds the config and its hash
    <workdir>/base_eval.json       the base policy's held-out evaluation (written at step 0)
    <workdir>/summary.json         the closing summary of a finished run (strict JSON: no NaN)

``--start_fresh`` moves the checkpoints (checkpoint.move_aside), summary.json and base_eval.json
aside (move_run_files_aside), so a new run in the same workdir does not mix with the old one's
record. The functions that write take ``writer``: only the writer process (process 0) writes.

A restart in the same workdir resumes from the newest checkpoint. It must be the same experiment:
``check_resume_config`` compares the checkpoint's config with the new one and refuses a change in
any field outside SAFE_TO_CHANGE, listing the changed fields, unless the user passes
``--allow_config_change``. config.json is rewritten only after that check, so a refused restart
leaves the record of what ran untouched.

Fields safe to change on resume (they change when, where or how often, not what is trained):
the step budget (rl.num_steps, with a constant learning rate: a decaying schedule is stretched to
the new length, so there it is a change), evaluation settings (eval.*), logging (log.*),
checkpoint cadence (checkpoint.*), pod timeouts (multihost.*), the device layout (mesh.*,
num_devices, slice: a run may resume on another device count), micro-batching
(rl.num_microbatches: the same gradient, summed in another order), the MoE route-change metric
(rl.log_route_change: one extra forward pass after the update, which changes nothing it updates)
and the locations of the data and warm-start caches (data.data_dir, init.cache_dir).

No array dimensions here.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax import config as config_lib

SAFE_TO_CHANGE = (
    "rl.num_steps",
    "eval.",
    "log.",
    "checkpoint.",
    "multihost.",
    "mesh.",
    "num_devices",
    "slice",
    "rl.num_microbatches",
    "rl.log_route_change",
    "model.moe_dispatch",  # the same function, computed another way (models.EXECUTION_FIELDS)
    "model.moe_kernel",
    "model.remat",
    "model.attention",
    "model.paged_attention",
    "data.data_dir",
    "init.cache_dir",
)


def config_dict(config: Any) -> dict:
    """A config as plain JSON data (tuples become lists), as it is stored in config.json."""
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return json.loads(json.dumps(d, sort_keys=True, default=str))


def config_hash(config: Any) -> str:
    """A short stable hash of the config's JSON form (recorded with every checkpoint)."""
    text = json.dumps(config_dict(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_safe(key: str, config: Mapping[str, Any] | None = None) -> bool:
    """Whether changing ``key`` on resume keeps the experiment (see the module docstring)."""
    if key == "rl.num_steps" and config is not None:
        schedule = config_lib.flatten(config_dict(config)).get("optimizer.schedule", "constant")
        if schedule != "constant":
            return False  # the decay would be stretched to the new length mid-run
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in SAFE_TO_CHANGE)


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every field that differs; a missing one is None."""
    a, b = config_lib.flatten(config_dict(old)), config_lib.flatten(config_dict(new))
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_resume_config(
    saved: Mapping[str, Any] | None, config: Any, step: int, *, allow_change: bool
) -> list[str]:
    """Refuses to resume a checkpoint written with another config; returns notes to print.

    Raises ConfigError listing every changed field outside SAFE_TO_CHANGE (unless
    ``allow_change``); changed safe fields are returned as a note.
    """
    if saved is None:
        return []
    changes = changed_fields(saved, config)
    unsafe = [c for c in changes if not is_safe(c[0], config)]
    safe = [c for c in changes if is_safe(c[0], config)]
    notes = [f"resuming with changed {_fmt(safe)}"] if safe else []
    if unsafe and not allow_change:
        raise config_lib.ConfigError(
            f"this workdir's checkpoint (step {step}) was written with a different config: "
            f"{_fmt(unsafe)}. Rerun with the same config, pass another --workdir for a new run, or "
            f"pass --allow_config_change to resume with the new config anyway (safe to change "
            f"without it: {_safe_list()})"
        )
    if unsafe:
        notes.append(f"resuming with a changed config (--allow_config_change): {_fmt(unsafe)}")
    return notes


def _safe_list() -> str:
    return ", ".join(s.rstrip(".") + ("*" if s.endswith(".") else "") for s in SAFE_TO_CHANGE)


def _fmt(changes: list[tuple[str, Any, Any]]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changes)


def read_config_json(workdir: str) -> dict | None:
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_config_json(workdir: str, config: Any) -> str | None:
    """Writes config.json; a different earlier one is kept as config.<n>.json (returned)."""
    path = os.path.join(workdir, "config.json")
    new = config_dict(config)
    kept = None
    if os.path.exists(path):
        try:
            with open(path) as f:
                old = json.load(f)
        except (OSError, json.JSONDecodeError):
            old = None
        if old == new:
            return None
        kept = _keep_aside(path, "config.{}.json")
    _write_replacing(path, json.dumps(new, indent=2, sort_keys=True))
    return kept


def _keep_aside(path: str, pattern: str) -> str:
    """Renames ``path`` to the first free name ``pattern.format(n)``, n = 1, 2, ... beside it."""
    folder = os.path.dirname(path)
    n = 1
    while os.path.exists(os.path.join(folder, pattern.format(n))):
        n += 1
    aside = os.path.join(folder, pattern.format(n))
    os.replace(path, aside)
    return aside


def _write_replacing(path: str, text: str) -> None:
    """Writes ``path`` whole or not at all (a temporary file renamed over it)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def cut_metrics(workdir: str, keep_until: int) -> str | None:
    """Cuts metrics.jsonl back to the records with step <= ``keep_until`` (-1 for a fresh start).

    Records of steps that will be run again would otherwise appear twice. The whole old file is
    kept beside it as metrics.<n>.jsonl (returned) whenever a record is dropped; a line cut short
    by a crash mid-write is dropped too.
    """
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= keep_until:
                kept.append(line if line.endswith("\n") else line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    if len(kept) == len(lines):
        if lines and not lines[-1].endswith("\n"):  # complete, but the newline was cut off
            with open(path, "a") as f:
                f.write("\n")
        return None
    aside = _keep_aside(path, "metrics.{}.jsonl")
    _write_replacing(path, "".join(kept))
    return aside


# ------------------------------------------------------------------------------ fresh start


def move_run_files_aside(workdir: str, *, writer: bool) -> None:
    """--start_fresh: summary.json and base_eval.json describe the run whose checkpoints were
    moved aside; they are kept beside themselves as <name>.moved-<time>."""
    for name in ("summary.json", "base_eval.json"):
        path = os.path.join(workdir, name)
        if writer and os.path.exists(path):
            os.replace(path, f"{path}.moved-{time.strftime('%Y%m%d-%H%M%S')}")


# ------------------------------------------------------------------------------ base eval, summary


def read_base_eval(workdir: str) -> dict[str, float] | None:
    """The base policy's evaluation recorded at step 0 (None if there is none)."""
    path = os.path.join(workdir, "base_eval.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_base_eval(workdir: str, base_eval: dict[str, float], *, writer: bool) -> None:
    """Records the base policy's evaluation."""
    if writer:
        with open(os.path.join(workdir, "base_eval.json"), "w") as f:
            json.dump(base_eval, f, indent=2)


def make_summary(
    objective: str,
    workdir: str,
    base_eval: dict[str, float] | None,
    last_eval: dict[str, float] | None,
    **figures: float,
) -> dict:
    """The closing summary: base and final evaluation (eval/ prefixes dropped), their greedy
    accuracy difference when both exist, and ``figures`` (steps, wall_s, warmstart_s, rl_s, and
    the CPU seconds cpu_s, warmstart_cpu_s, rl_cpu_s)."""
    summary = {
        "base": _eval_summary(base_eval),
        "final": _eval_summary(last_eval),
        **figures,
        "objective": objective,
        "workdir": workdir,
    }
    if summary["base"] and summary["final"]:
        keys = ["greedy_accuracy"] + ["tool_accuracy"] * ("tool_accuracy" in summary["final"])
        for key in keys:  # tool_accuracy: a run with tools
            base, final = summary["base"].get(key, np.nan), summary["final"].get(key, np.nan)
            summary[f"delta_{key}"] = final - base
    return summary


def tool_figures_text(m: dict[str, float], prefix: str = "") -> str:
    """ "  with the tool A (call rate R)" for an evaluation with tool episodes (a run with
    config.env), else "": greedy_accuracy is the one turn without the tool, which a policy that
    opens with a call fails whatever its calls answer."""
    if f"{prefix}tool_accuracy" not in m:
        return ""
    return (
        f"  with the tool {m[prefix + 'tool_accuracy']:.3f} "
        f"(call rate {m.get(prefix + 'tool_call_rate', float('nan')):.2f})"
    )


def write_summary(workdir: str, summary: dict, *, writer: bool) -> None:
    """summary.json (strict JSON) and the closing block on stdout."""
    if writer:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(strict_json(summary), f, indent=2, allow_nan=False)
        print(format_summary(summary), flush=True)


def _eval_summary(m: dict[str, float] | None) -> dict[str, float] | None:
    if m is None:
        return None
    return {k.split("/", 1)[1]: v for k, v in m.items()}


def strict_json(x):
    """NaN / inf -> None (JSON null), recursively: summary.json must parse anywhere."""
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict_json(v) for v in x]
    if isinstance(x, float | np.floating) and not np.isfinite(x):
        return None
    return x


def format_summary(s: dict) -> str:
    """The closing block printed at the end of a run."""
    lines = ["", f"== summary ({s['objective']}, {s['workdir']}) =="]
    for name in ("base", "final"):
        e = s.get(name)
        if e:
            lines.append(
                f"{name:5s}  held-out greedy accuracy {e.get('greedy_accuracy', float('nan')):.3f}"
                f"  mean response length {e.get('mean_response_length', float('nan')):.1f}"
                + tool_figures_text(e)
            )
    if "delta_greedy_accuracy" in s:
        lines.append(f"delta  {100 * s['delta_greedy_accuracy']:+.1f} points")
    if "delta_tool_accuracy" in s:
        lines.append(f"delta  {100 * s['delta_tool_accuracy']:+.1f} points with the tool")
    lines.append(
        f"steps {s['steps']}  wall {s['wall_s']:.0f} s  (warm start {s['warmstart_s']:.0f} s,"
        f" RL {s['rl_s']:.0f} s)"
        + (f"  CPU {s['cpu_s']:.0f} s (RL {s['rl_cpu_s']:.0f} s)" if "cpu_s" in s else "")
    )
    return "\n".join(lines)
