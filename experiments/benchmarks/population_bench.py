"""Runs per hour: N seeds of an experiment as one population vs N separate processes, back to back.

    python experiments/benchmarks/population_bench.py --workdir /tmp/popbench --seeds 8 \
        --steps 80 --parallel 2 --out bench_out/population.json

First (untimed) the dataset and the warm start are prepared once (`main --prepare_only`): both
arms share them, as every sweep does. Then, timed from the first launch to the last exit:
  processes   N runs of `python -m gspo_jax.main` (config.seed = 0..N-1), --parallel at once
              (two at a time on a 2-core CPU: today's practice)
  population  one process running config.population.seeds = (0, ..., N-1) (rl/population.py),
              or with --populations K, K processes at once, each with a K-th of the seeds (a
              sweep with --parallel 2 runs two arms' populations so on a 2-core CPU)
The population runs on --population_devices host devices (default 1, as the sweeps run it; more
spread its member groups over simulated CPU devices, mesh.population, which can deadlock XLA:CPU
on a host with as few cores as devices: docs/population.md). No persistent compilation cache unless
JAX_COMPILATION_CACHE_DIR is set (the main job sets none: every process compiles, today's
practice). Each arm's wall time includes its start-up, compiles, evaluations and checkpoints. It
prints the runs per hour of each and the ratio, each run's final held-out greedy accuracy with the
processes' seed spread (min, max, mean, std) and which members lie within it, and the median
seconds per step of each timed phase (one process, the population) from their metrics.jsonl.
The figures belong in docs/population.md, with the machine's load (not in this docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from machine import write_report  # this folder is on sys.path: the script runs from it

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(devices: int = 0) -> dict:
    """The runs' environment: this checkout first on the path; ``devices`` > 0: that many host
    (CPU) devices, one per core, for a population spread over them (mesh.population)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _main_cmd(config: str, workdir: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "gspo_jax.main", f"--config={config}", f"--workdir={workdir}"] + [
        f"--config.{o}" for o in overrides
    ]


def run_processes(config, root, seeds, parallel, overrides) -> float:
    """N single runs, ``parallel`` at once; returns the wall seconds (raises on a failed run)."""
    pending = list(seeds)
    active: dict[int, tuple[subprocess.Popen, object]] = {}
    t0 = time.time()
    while pending or active:
        while pending and len(active) < parallel:
            s = pending.pop(0)
            wd = os.path.join(root, f"seed{s}")
            os.makedirs(wd, exist_ok=True)
            log = open(os.path.join(wd, "log.txt"), "w")  # noqa: SIM115 (closed below)
            cmd = _main_cmd(config, wd, [f"seed={s}", *overrides])
            active[s] = (
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env()),
                log,
            )
        time.sleep(0.5)
        for s, (proc, log) in list(active.items()):
            if proc.poll() is not None:
                log.close()
                del active[s]
                if proc.returncode:
                    raise RuntimeError(f"seed {s} failed (code {proc.returncode}); see {root}")
    return time.time() - t0


POPULATION_RUNNER = """
import ast, sys
from gspo_jax import config as config_lib
from gspo_jax.rl import trainer
config = config_lib.load_config_file(sys.argv[1])
with config.unlocked():
    for kv in sys.argv[4:]:
        k, v = kv.split("=", 1)
        try:
            v = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            pass  # a string
        config_lib.set_field(config, k, v)
    config.population.seeds = tuple(int(s) for s in sys.argv[3].split(","))
trainer.train(config, sys.argv[2])
"""


def population_roots(root: str, populations: int) -> list[str]:
    """Where each population writes (one: ``root``; several: ``root/p<i>``)."""
    return [root] if populations == 1 else [os.path.join(root, f"p{i}") for i in range(populations)]


def run_population(config, root, seeds, overrides, devices: int = 0, populations: int = 1) -> float:
    """The seeds as ``populations`` populations at once (one process each, the seeds split in
    order: two on a 2-core CPU keep both cores busy, as a sweep's --parallel 2 does with two
    arms' populations), each over ``devices`` host devices (one member group each, when > 1);
    returns the wall seconds until the last one ends."""
    if devices > 1:
        overrides = [*overrides, "mesh.data=1", f"mesh.population={devices}"]
    chunks = [list(c) for c in np.array_split(np.asarray(seeds), populations)]
    t0 = time.time()
    procs = []
    for wd, chunk in zip(population_roots(root, populations), chunks, strict=True):
        os.makedirs(wd, exist_ok=True)
        seeds_arg = ",".join(str(int(s)) for s in chunk)
        cmd = [sys.executable, "-c", POPULATION_RUNNER, config, wd, seeds_arg, *overrides]
        log = open(os.path.join(wd, "log.txt"), "w")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(devices), cwd=REPO
        )
        procs.append((proc, log, wd))
    for proc, log, wd in procs:
        rc = proc.wait()
        log.close()
        if rc:
            raise RuntimeError(f"the population failed (code {rc}); see {wd}/log.txt")
    return time.time() - t0


def _final_accuracy(run_dir: str) -> float:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)["final"]["greedy_accuracy"]


def _spread(xs: list[float]) -> dict[str, float]:
    """The seed spread of the single runs' final accuracies (std: the sample std, ddof 1)."""
    a = np.asarray(xs, np.float64)
    std = a.std(ddof=min(1, a.size - 1))
    return {
        "min": float(a.min()),
        "max": float(a.max()),
        "mean": float(a.mean()),
        "std": float(std),
    }


def _step_times(run_dir: str) -> dict[str, float]:
    """The median seconds of each timed phase over a run's steps after the first two (the
    compiles), from its metrics.jsonl (time/rollout_s, time/update_s, ...)."""
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "time/step_s" in r and r.get("step", 0) > 2:
                rows.append(r)
    keys = ("time/step_s", "time/rollout_s", "time/reward_s", "time/logp_s", "time/update_s")
    return {k: float(np.median([r[k] for r in rows])) for k in keys if rows and k in rows[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(REPO, "configs", "arith.py"))
    p.add_argument("--workdir", required=True)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="RL steps of every run")
    p.add_argument("--parallel", type=int, default=2, help="separate processes at once")
    p.add_argument("--order", default="processes,population", help="which arm runs first")
    p.add_argument(
        "--population_devices",
        type=int,
        default=1,
        help="host devices the population spreads over (mesh.population; default 1)",
    )
    p.add_argument(
        "--populations",
        type=int,
        default=1,
        help="split the seeds into this many populations run at once (one process each)",
    )
    p.add_argument("--out", default="")
    args = p.parse_args()
    seeds = list(range(args.seeds))
    overrides = [f"rl.num_steps={args.steps}", "log.progress=False"]
    prep = os.path.join(args.workdir, "prepare")
    subprocess.check_call(
        [*_main_cmd(args.config, prep, overrides), "--prepare_only"], env=_env(), cwd=REPO
    )
    walls = {}
    for arm in args.order.split(","):
        root = os.path.join(args.workdir, arm)
        if arm == "processes":
            walls[arm] = run_processes(args.config, root, seeds, args.parallel, overrides)
        else:
            walls[arm] = run_population(
                args.config, root, seeds, overrides, args.population_devices, args.populations
            )
        print(f"{arm}: {len(seeds)} runs in {walls[arm]:.1f} s", flush=True)
    acc_proc = [_final_accuracy(os.path.join(args.workdir, "processes", f"seed{s}")) for s in seeds]
    pop_roots = population_roots(os.path.join(args.workdir, "population"), args.populations)
    member_dirs = {
        s: os.path.join(r, "members", f"seed{s}")
        for r in pop_roots
        for s in seeds
        if os.path.isdir(os.path.join(r, "members", f"seed{s}"))
    }
    acc_pop = [_final_accuracy(member_dirs[s]) for s in seeds]
    spread = _spread(acc_proc)
    per_hour = {arm: len(seeds) * 3600.0 / w for arm, w in walls.items()}
    result = {
        "config": args.config,
        "seeds": len(seeds),
        "steps": args.steps,
        "parallel": args.parallel,
        "population_devices": args.population_devices,
        "populations": args.populations,
        "compilation_cache": os.environ.get("JAX_COMPILATION_CACHE_DIR", ""),
        "wall_s": walls,
        "runs_per_hour": per_hour,
        "ratio": per_hour["population"] / per_hour["processes"],
        "final_greedy_accuracy": {"processes": acc_proc, "population": acc_pop},
        # the single runs' seed spread, and which members lie within [min, max]
        "processes_spread": spread,
        "population_within_spread": [spread["min"] <= a <= spread["max"] for a in acc_pop],
        "population_spread": _spread(acc_pop),
        # median phase seconds per step: one process (seed 0) and the whole population
        "step_times": {
            "process_seed0": _step_times(os.path.join(args.workdir, "processes", "seed0")),
            "population": _step_times(member_dirs[seeds[0]]),
        },
        "load_average": os.getloadavg(),
    }
    write_report(result, args.out)


if __name__ == "__main__":
    main()
