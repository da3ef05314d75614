"""The asynchronous pipeline on this machine: per RL step of the default experiment, the step
time and each device group's idle fraction, synchronous against pipelined, on a shared mesh and
with the rollout on its own device group.

    python experiments/benchmarks/pipeline_bench.py --steps 12 --devices 8

Arms (each a trainer run of configs/arith.py, evaluation and checkpoints off, in this process):
  sync            rl.max_staleness 0, rollout.devices 0 (today's step)
  stale1          rl.max_staleness 1 on the shared mesh
  group_sync      rl.max_staleness 0, the rollout on half of the devices
  group_stale1    rl.max_staleness 1, the rollout on half of the devices

The figures are the medians over the steps after the first two (compiles, the pipeline filling):
time/step_s, the rollout's busy time (from its start to its tokens being ready, seen by a thread)
and the trainer's (its log-prob passes and update), and the idle fractions 1 - busy / step. With
--devices 8 the devices are simulated (XLA_FLAGS, set before JAX starts) and all share this
machine's cores, so the two groups' work cannot truly overlap here: the figures say how the
schedule spends a step, not what a pod gains (the dry run's plan costs that: docs/pods.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices")
    p.add_argument("--arms", default="sync,stale1,group_sync,group_stale1")
    p.add_argument("--runlocal", action="store_true", help="the tiny runlocal experiment")
    a = p.parse_args(argv)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={a.devices}"
    )
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine import describe

    from gspo_jax import config as config_lib
    from gspo_jax.rl import trainer
    from gspo_jax.runtime import metrics as metrics_lib

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    arms = {
        "sync": {},
        "stale1": {"rl.max_staleness": 1},
        "group_sync": {"rollout.devices": 0.5},
        "group_stale1": {"rollout.devices": 0.5, "rl.max_staleness": 1},
    }
    chosen = a.arms.split(",")
    report = {"machine": describe(steps=a.steps, load_before=os.getloadavg()), "arms": {}}
    with tempfile.TemporaryDirectory() as root:
        for name in chosen:
            arg = ":runlocal" if a.runlocal else ""
            c = config_lib.load_config_file(os.path.join(repo, "configs", "arith.py") + arg)
            for k, v in {
                "rl.num_steps": a.steps,
                "eval.num_problems": 0,
                "checkpoint.every": 10_000,
                "log.progress": False,
                "log.tensorboard": False,
                **arms[name],
            }.items():
                config_lib.set_field(c, k, v)
            wd = os.path.join(root, name)
            t0 = time.time()
            trainer.train(c, wd)
            recs = metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))[2:]  # after 2 steps

            def med(key, recs=recs):
                return statistics.median(r[key] for r in recs if key in r)

            step = med("time/step_s")
            trainer_busy = med("time/logp_s") + med("time/update_s")
            row = {
                "step_s": step,
                "rollout_busy_s": med("time/rollout_s"),
                "trainer_busy_s": trainer_busy,
                "wall_s": time.time() - t0,
            }
            if "time/rollout_idle_frac" in recs[0]:
                row["rollout_idle_frac"] = med("time/rollout_idle_frac")
                row["trainer_idle_frac"] = med("time/trainer_idle_frac")
                row["staleness_max"] = max(r["rollout/staleness_max"] for r in recs)
            else:  # the synchronous step: the rollout waits for the update and vice versa
                row["rollout_idle_frac"] = 1 - row["rollout_busy_s"] / step
                row["trainer_idle_frac"] = 1 - trainer_busy / step
            report["arms"][name] = row
            print(f"{name:>13}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    base = report["arms"].get("sync", {}).get("step_s")
    if base:
        for row in report["arms"].values():
            row["step_time_vs_sync"] = row["step_s"] / base
    report["machine"]["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
