"""Warm-start draws: does the default experiment's base depend on the draw?

    python experiments/warmstart_draws.py --variant before [--out runs/warmstart_draws]
    python experiments/warmstart_draws.py --variant after

Trains the warm start of configs/arith.py (not cached: every draw trains from scratch) five times,
one after the other: warm-start seeds 0, 1 and 2, and seed 0 with a rounding nudge (the embedding
scaled by 1 + 1e-7 at initialisation; the blockwise attention kernel, another summation order).
"before" is the warm start as it was until issue 33 (2400 steps at 1e-2, no stopping rule);
"after" is configs/arith.py:warmstart=converged's. For each draw it prints the worked format's
sampled accuracy (temperature 1, held-out test problems), the share of worked samples, greedy
accuracy, the final loss (mean of the last 50 steps), the steps trained and the wall time, then
the table.
With --every N it also evaluates every N steps (a learning curve; its time is not in wall_s).

Expected runtime: five warm starts plus one evaluation each (~2-3 min per draw on an idle 2-core
CPU for "before"); run it alone, the draws are sequential by design.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time

import jax.numpy as jnp

from gspo_jax import config as config_lib
from gspo_jax import models
from gspo_jax.rl import build, evaluation, warmstart

# The warm start of configs/arith.py before issue 33: the library's default warm start (2400 steps
# at 1e-2, cosine to 1e-3, no stopping rule), whose values that config pinned until then.
BEFORE = dict(config_lib.default_config().init.warmstart)
# (name, warm-config overrides, model-config overrides, embedding scale at initialisation)
DRAWS = (
    ("seed 0", {"seed": 0}, {}, 1.0),
    ("seed 1", {"seed": 1}, {}, 1.0),
    ("seed 2", {"seed": 2}, {}, 1.0),
    ("seed 0, embed x (1+1e-7)", {"seed": 0}, {}, 1.0 + 1e-7),
    ("seed 0, blockwise attention", {"seed": 0}, {"attention": "blockwise"}, 1.0),
)
DESCRIBED = ("task", "task_config", "model", "warm")  # meta.json's configs (not statistics)
COLUMNS = ("worked_accuracy", "worked_fraction", "greedy_accuracy", "final_loss", "steps", "wall_s")


@contextlib.contextmanager
def scaled_embedding(scale: float):
    """warmstart.train's initial model with its embedding multiplied by ``scale`` (one float32
    rounding step: 1 + 1e-7 moves about half the entries by one ulp)."""
    if scale == 1.0:
        yield
        return
    create = models.create_model

    def create_scaled(cfg, *args, **kwargs):
        model = create(cfg, *args, **kwargs)
        model.embed[...] = model.embed[...] * jnp.float32(scale)
        return model

    models.create_model = create_scaled
    try:
        yield
    finally:
        models.create_model = create


def held_out(model, task, num_problems: int, data_dir) -> dict:
    return evaluation.evaluate(
        model, task, num_problems=num_problems, pass_k=4, seed=1, data_dir=data_dir
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=("before", "after"), required=True)
    parser.add_argument("--num_problems", type=int, default=500)
    parser.add_argument("--every", type=int, default=0, help="also evaluate every N steps")
    parser.add_argument("--draws", default="", help="comma-separated draw indices (default all)")
    parser.add_argument("--out", default="runs/warmstart_draws")
    parser.add_argument(
        "--cache_dir", default="", help="where the draws are cached (default <out>/cache_<variant>)"
    )
    args = parser.parse_args()

    # "after": configs/arith.py's converged warm start (its argument warmstart=converged)
    config = config_lib.load_config_file("configs/arith.py:warmstart=converged")
    args.cache_dir = args.cache_dir or os.path.join(args.out, f"cache_{args.variant}")
    task = build.make_task(config)
    data_dir = config.data.data_dir or None
    warm = dict(config.init.warmstart) if args.variant == "after" else BEFORE
    picked = [int(i) for i in args.draws.split(",")] if args.draws else range(len(DRAWS))
    rows = []
    for i in picked:
        name, warm_over, model_over, scale = DRAWS[i]
        model_cfg = dataclasses.replace(build.make_model_config(config, task), **model_over)
        warm_cfg = warmstart.as_warm_config({**warm, **warm_over}, task)
        curve = []

        def on_eval(step, model, curve=curve, name=name):
            m = held_out(model, task, 256, data_dir)
            curve.append((step, m["worked_accuracy"], m["worked_fraction"]))
            print(f"  {name} step {step}: worked acc {m['worked_accuracy']:.3f}", file=sys.stderr)

        if scale == 1.0 and not args.every:
            # The base exactly as the main job gets it, cached under --cache_dir: the main job's
            # draws (GSPO_JAX_CACHE=<cache_dir> ... --config.init.warmstart.seed=1) load it.
            path = warmstart.cache_path(task, model_cfg, warm_cfg, args.cache_dir)
            if os.path.exists(path):
                sys.exit(f"{path} exists: pass an empty --cache_dir (every draw trains)")
            model = warmstart.get_base_model(
                task, model_cfg, warm_cfg, args.cache_dir, data_dir=data_dir, progress=False
            )
            with open(os.path.join(path, "meta.json")) as f:
                stats = {k: v for k, v in json.load(f).items() if k not in DESCRIBED}
        else:
            with scaled_embedding(scale):
                model, stats = warmstart.train(
                    task,
                    model_cfg,
                    warm_cfg,
                    data_dir=data_dir,
                    progress=False,
                    callback=on_eval if args.every else None,
                    callback_every=args.every,
                )
        m = held_out(model, task, args.num_problems, data_dir)
        row = dict(draw=name, **{k: m[k] for k in COLUMNS[:3]}, **stats, curve=curve)
        row.setdefault("stop_checks", [])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)

    print(f"\nwarm start '{args.variant}': {json.dumps(warm)}")
    print(f"{'draw':<30}" + "".join(f"{c:>17}" for c in COLUMNS))
    for r in rows:
        cells = (f"{r[c]:>17.3f}" if isinstance(r[c], float) else f"{r[c]:>17}" for c in COLUMNS)
        print(f"{r['draw']:<30}" + "".join(cells))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.variant}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(dict(variant=args.variant, warm=warm, rows=rows), f, indent=2, default=str)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
