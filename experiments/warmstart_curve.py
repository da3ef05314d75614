"""Learning curve of the supervised warm start: held-out accuracy as training goes on.

    python experiments/warmstart_curve.py --task countdown [--steps 9600] [--every 1200]
        [--num_problems 256] [--out_dir runs/warmstart_curve]

Trains one warm start of the "small" preset (not cached: the callback needs the model mid-run) and,
every ``--every`` steps, evaluates greedy accuracy and temperature-1 sample accuracy on held-out
problems and on as many train problems (a train-test gap means memorising). Prints a table and
writes ``curve_<task>.json`` and ``curve_<task>.png``. With ``--steps`` twice the default it shows
where the default's step count sits on the curve: whether the base is mediocre because of what it
learned (a plateau) or because its training was cut short (still rising). The schedule decays over
``--steps``, so the curve's mid-points are not the same as a shorter run's end points; the 2x-long
run of experiments/warmstart_report.py is the like-for-like check.

Expected runtime: the warm start's wall time for --steps plus ~5 s per evaluation point.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from gspo_jax import models, tasks
from gspo_jax.rl import evaluation, warmstart


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="arith")
    parser.add_argument(
        "--steps", type=int, default=0, help="0 = twice the task's default warm-start steps"
    )
    parser.add_argument("--every", type=int, default=1200)
    parser.add_argument("--num_problems", type=int, default=256)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--out_dir", default="runs/warmstart_curve")
    args = parser.parse_args()

    task = tasks.get_task(args.task)
    model_cfg = models.get_model_config("small", vocab_size=task.tokenizer.vocab_size)
    default_steps = warmstart.as_warm_config(None, task).steps
    args.steps = args.steps or 2 * default_steps
    warm_cfg = dataclasses.replace(warmstart.WarmStartConfig(), steps=args.steps)
    rows = []

    def on_eval(step, model):
        row = {"step": step}
        for split in ("test", "train"):
            m = evaluation.evaluate(
                model,
                task,
                split=split,
                num_problems=args.num_problems,
                pass_k=1,
                data_dir=args.data_dir,
            )
            row[f"{split}_greedy"] = m["greedy_accuracy"]
            row[f"{split}_sample"] = m["sample_accuracy"]
            if split == "test" and "greedy_partial" in m:
                row["test_greedy_partial"] = m["greedy_partial"]
        rows.append(row)
        print(
            " ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
            ),
            file=sys.stderr,
            flush=True,
        )

    t0 = time.time()
    _, stats = warmstart.train(
        task,
        model_cfg,
        warm_cfg,
        data_dir=args.data_dir,
        callback=on_eval,
        callback_every=args.every,
    )
    print(
        f"{args.task}: {args.steps} steps, training {stats['wall_s']:.0f} s, total "
        f"{time.time() - t0:.0f} s, final loss {stats['final_loss']:.4f}"
    )
    keys = list(rows[0])
    print("".join(f"{k:>20}" for k in keys))
    for r in rows:
        print("".join(f"{r[k]:>20.3f}" if isinstance(r[k], float) else f"{r[k]:>20}" for k in keys))

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"curve_{args.task}.json"), "w") as f:
        json.dump(
            {
                "task": args.task,
                "warm": dataclasses.asdict(warm_cfg),
                "stats": stats,
                "default_steps": default_steps,
                "rows": rows,
            },
            f,
            indent=2,
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in rows]
    for k, style in (("test_greedy", "-o"), ("test_sample", "--o"), ("train_greedy", "-x")):
        ax.plot(steps, [r[k] for r in rows], style, label=k.replace("_", " "))
    ax.axvline(default_steps, color="gray", ls=":", label="default steps")
    ax.set(
        xlabel="warm-start step",
        ylabel="accuracy",
        ylim=(0, 1),
        title=f"{args.task} warm start ({args.steps} steps, cosine schedule)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, f"curve_{args.task}.png"), dpi=100)
    print(f"wrote {args.out_dir}/curve_{args.task}.json and .png")


if __name__ == "__main__":
    main()
