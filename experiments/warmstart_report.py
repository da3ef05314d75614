"""Figures of the warm-start base policy for each task, and its convergence check.

    python experiments/warmstart_report.py [--tasks arith,countdown] [--num_problems 512]
        [--cache_dir DIR] [--data_dir DIR] [--no_2x] [--out report.json]

For each task: trains (or loads from the cache) the default warm start of the "small" preset, then
reports held-out greedy accuracy, pass@8 (temperature 1), mean response length, worked vs direct
accuracy (arith) and the warm start's wall time; then trains a warm start twice as long and
reports its greedy accuracy (the base must stay mediocre because of what it learned, not because
training was cut short). Expected runtime: about 2 x (1 + 2) x the warm-start time plus a minute of
evaluation per task on 2 CPU cores; cached warm starts are not trained again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

import jax

from gspo_jax import models, tasks
from gspo_jax.rl import evaluation, warmstart


def _wall_s(task, model_cfg, warm_cfg, cache_dir) -> float:
    with open(
        os.path.join(warmstart.cache_path(task, model_cfg, warm_cfg, cache_dir), "meta.json")
    ) as f:
        return float(json.load(f)["wall_s"])


def report_task(name: str, args) -> dict[str, float]:
    task = tasks.get_task(name)
    model_cfg = models.get_model_config("small", vocab_size=task.tokenizer.vocab_size)
    warm_cfg = warmstart.as_warm_config(None, task)  # the task's default step count
    model = warmstart.get_base_model(
        task, model_cfg, warm_cfg, args.cache_dir, data_dir=args.data_dir
    )
    t0 = time.time()
    m = evaluation.evaluate(
        model, task, num_problems=args.num_problems, pass_k=8, data_dir=args.data_dir
    )
    print(name, "1x:", json.dumps({k: round(v, 4) for k, v in m.items()}), flush=True)
    out = {f"{name}/{k}": v for k, v in m.items()}
    out[f"{name}/eval_s"] = time.time() - t0
    out[f"{name}/warmstart_s"] = _wall_s(task, model_cfg, warm_cfg, args.cache_dir)
    out[f"{name}/warmstart_steps"] = warm_cfg.steps
    if not args.no_2x:
        long_cfg = dataclasses.replace(warm_cfg, steps=2 * warm_cfg.steps)
        long_model = warmstart.get_base_model(
            task, model_cfg, long_cfg, args.cache_dir, data_dir=args.data_dir
        )
        m2 = evaluation.evaluate(
            long_model, task, num_problems=args.num_problems, pass_k=8, data_dir=args.data_dir
        )
        out[f"{name}/2x_greedy_accuracy"] = m2["greedy_accuracy"]
        out[f"{name}/2x_pass@8"] = m2["pass@8"]
        out[f"{name}/2x_warmstart_s"] = _wall_s(task, model_cfg, long_cfg, args.cache_dir)
        for k in ("worked_accuracy", "direct_accuracy"):
            if k in m2:
                out[f"{name}/2x_{k}"] = m2[k]
    print(json.dumps({k: round(v, 4) for k, v in out.items()}), flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="arith,countdown")
    parser.add_argument("--num_problems", type=int, default=512)
    parser.add_argument("--cache_dir", default=warmstart.default_cache_dir())
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--no_2x", action="store_true", help="skip the 2x-long warm start")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    figures: dict[str, float] = {}
    for name in args.tasks.split(","):
        figures.update(report_task(name, args))

    rows = [
        "greedy_accuracy",
        "pass@8",
        "sample_accuracy",
        "mean_response_length",
        "sample_mean_response_length",
        "worked_accuracy",
        "direct_accuracy",
        "worked_fraction",
        "greedy_worked_fraction",
        "greedy_partial",
        "warmstart_s",
        "2x_greedy_accuracy",
        "2x_pass@8",
        "2x_warmstart_s",
    ]
    names = args.tasks.split(",")
    print(f"\n{'figure':<30}" + "".join(f"{n:>14}" for n in names))
    for r in rows:
        vals = [figures.get(f"{n}/{r}") for n in names]
        if any(v is not None for v in vals):
            print(
                f"{r:<30}" + "".join(f"{v:>14.3f}" if v is not None else f"{'-':>14}" for v in vals)
            )
    targets = {}
    for n in names:
        targets[f"{n}/greedy_accuracy"] = {"op": ">=", "threshold": 0.2}
        targets[f"{n}/warmstart_s"] = {"op": "<=", "threshold": 300.0}
        if f"{n}/2x_greedy_accuracy" in figures:
            targets[f"{n}/2x_greedy_accuracy"] = {"op": "<=", "threshold": 0.6}
    if "arith/worked_accuracy" in figures:
        targets["arith/worked_accuracy"] = {"op": ">=", "threshold": 0.5}
    if args.out:
        machine = {
            "platform": platform.platform(),
            "devices": str(jax.devices()),
            "jax": jax.__version__,
            "cpus": os.cpu_count(),
        }
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "figures": figures, "targets": targets}, f, indent=2)


if __name__ == "__main__":
    main()
