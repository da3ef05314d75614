"""The testbed's calibration pilot (issue 52, docs/testbed.md): GRPO's defaults from the pilot's
own warm-start draws (configs/testbed.py PILOT_DRAWS, never a claim's), and the figures that say
whether the testbed has headroom.

    python experiments/testbed_pilot.py run --root runs/testbed_pilot [--draws 3] [--parallel 2]
        [--lr 5e-4] [--only grpo_d901_lr0.0005]
    python experiments/testbed_pilot.py collect --root runs/testbed_pilot \\
        [--out results/pilots/testbed]

``run`` launches one gspo_jax.main process per draw (``--parallel`` at once; a finished run is
skipped, an interrupted one resumes from its checkpoint) and writes, next to each run's folder,
``<run>.cpu.json``: the CPU seconds the process and its children used (getrusage), the
load-independent cost of a run on this machine (wall time depends on who else is on the cores).

``collect`` reads every run folder under ``--root`` (finished or not) and the warm-start cache
entries they start from, and writes into ``--out``: the record of each finished run
(notebooks/reporting/records.py, as the claims keep theirs), ``pilot.json`` (per run: the warm
start's checks and cost, base and final held-out accuracy greedy and sampled, the evaluation
curve, the largest evaluation-to-evaluation rise, response lengths, time and CPU seconds, and the
issue's criteria checked; the runs of an earlier collect whose folders are elsewhere are kept;
per recipe, the runs that differ only in their draw, the share of draws passing each criterion
and each figure's mean and draw-to-draw sd),
and ``curves.png`` (accuracy and response length against RL steps, this root's runs).
It prints the calibration table and a design's cost from the measured CPU seconds.

The criteria (issue 52): base held-out accuracy in [0.15, 0.45] greedy and sampled; under GRPO's
defaults a rise to [0.6, 0.9] over at least 200 steps with no evaluation-to-evaluation rise above
0.15 (``no_jump``: greedy or sampled; ``no_jump_sampled``, the proposed criterion: sampled only,
docs/testbed.md says why).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "testbed.py")
BASE_BAND = (0.15, 0.45)
FINAL_BAND = (0.6, 0.9)
MAX_JUMP = 0.15
MIN_STEPS = 200
# A claim's smallest design (issue 52): 8 warm-start draws x 2 arms, in 4 hours of 2 cores.
DESIGN_DRAWS, DESIGN_ARMS, DESIGN_HOURS, CORES = 8, 2, 4.0, 2


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _testbed():
    return _load("_testbed_config", CONFIG)


# ------------------------------------------------------------------------------------ run


def _run_one(root: str, run: dict, extra: list[str]) -> tuple[str, int]:
    """One pilot run as its own process; its CPU seconds go to <root>/<name>.cpu.json."""
    wd = os.path.join(root, run["name"])
    if os.path.exists(os.path.join(wd, "summary.json")):
        return run["name"], 0
    overrides = [f"--config.{k}={v}" for k, v in run["overrides"].items()]
    cmd = [sys.executable, "-m", "gspo_jax.main", f"--config={CONFIG}", f"--workdir={wd}"]
    cmd += overrides + ["--config.log.progress=False"] + extra
    env = dict(os.environ, PYTHONPATH=REPO)
    t0 = time.time()
    with open(os.path.join(root, run["name"] + ".log"), "a") as log:
        # a child process per run: its own getrusage(RUSAGE_CHILDREN) is read in a wrapper
        wrapper = (
            "import resource, subprocess, sys, json; "
            "rc = subprocess.call(sys.argv[2:]); "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "json.dump({'cpu_s': u.ru_utime + u.ru_stime, 'rc': rc}, open(sys.argv[1], 'w')); "
            "sys.exit(rc)"
        )
        cpu_file = os.path.join(root, run["name"] + ".cpu.part.json")
        rc = subprocess.call(
            [sys.executable, "-c", wrapper, cpu_file, *cmd], stdout=log, stderr=log, env=env
        )
    _merge_cpu(root, run["name"], cpu_file, time.time() - t0)
    return run["name"], rc


def _merge_cpu(root: str, name: str, part: str, wall_s: float) -> None:
    """Adds one invocation's CPU and wall seconds to <root>/<name>.cpu.json (a resumed run is
    several invocations)."""
    total_path = os.path.join(root, name + ".cpu.json")
    total = {"cpu_s": 0.0, "wall_s": 0.0, "invocations": 0}
    if os.path.exists(total_path):
        with open(total_path) as f:
            total = json.load(f)
    if os.path.exists(part):
        with open(part) as f:
            total["cpu_s"] += json.load(f)["cpu_s"]
        os.remove(part)
    total["wall_s"] += wall_s
    total["invocations"] += 1
    with open(total_path, "w") as f:
        json.dump(total, f, indent=1)


def run(args) -> None:
    os.makedirs(args.root, exist_ok=True)
    arms = f"draws={args.draws}" + (f",lr={args.lr}" if args.lr else "")
    runs = [r for r in _testbed().get_sweep(arms) if not args.only or r["name"] in args.only]
    extra = [f"--config.rl.num_steps={args.steps}"] if args.steps else []
    extra += [f"--config.{kv}" for kv in args.set]
    if args.tag:  # an arm that differs by --set: its own run folder
        runs = [dict(r, name=f"{r['name']}_{args.tag}") for r in runs]
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        for name, rc in pool.map(lambda r: _run_one(args.root, r, extra), runs):
            print(f"{name}: exit {rc}", flush=True)


# ------------------------------------------------------------------------------------ collect


def _jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _warm_start_meta(wd: str) -> dict:
    """The meta.json of the warm-start cache entry the run at ``wd`` starts from (its steps,
    stopping checks, wall time), or {} where it is not on this machine."""
    from gspo_jax import models, tasks
    from gspo_jax.rl import warmstart

    with open(os.path.join(wd, "config.json")) as f:
        c = json.load(f)
    task = tasks.get_task(c["task"]["name"], **c["task"]["kwargs"])
    model_cfg = models.get_model_config(c["model"]["preset"], vocab_size=task.tokenizer.vocab_size)
    cache = c["init"]["cache_dir"] or None
    path = warmstart.cache_path(task, model_cfg, c["init"]["warmstart"], cache)
    meta_path = os.path.join(path, "meta.json")
    if not os.path.exists(meta_path):
        return {}
    with open(meta_path) as f:
        meta = json.load(f)
    keep = (
        "steps",
        "wall_s",
        "cpu_s",
        "final_loss",
        "stop_met",
        "stop_checks",
        "stop_check_metrics",
        "stop_check_s",
        "stop_kept_step",
        "stop_lookback_checks",
        "stop_lookback_metrics",
    )
    return {k: meta[k] for k in keep if k in meta} | {"entry": os.path.basename(path)}


def _summarise(wd: str, root: str) -> dict:
    """One run's figures and the issue's criteria, from its folder (finished or not)."""
    name = os.path.basename(wd)
    metrics = _jsonl(os.path.join(wd, "metrics.jsonl"))
    evals = [m for m in metrics if "eval/greedy_accuracy" in m]
    curve = [
        dict(
            step=m["step"],
            greedy=m["eval/greedy_accuracy"],
            sample=m["eval/sample_accuracy"],
            greedy_len=m["eval/mean_response_length"],
            sample_len=m["eval/sample_mean_response_length"],
        )
        for m in evals
    ]
    steps = [m for m in metrics if "time/step_s" in m]
    out = dict(
        name=name,
        finished=os.path.exists(os.path.join(wd, "summary.json")),
        last_step=max((m["step"] for m in steps), default=0),
        curve=curve,
        rollout_len=[[m["step"], m["rollout/response_len_mean"]] for m in steps],
        step_s_median=float(np.median([m["time/step_s"] for m in steps[1:]]))
        if len(steps) > 1
        else None,
        warm_start=_warm_start_meta(wd),
    )
    summary_path = os.path.join(wd, "summary.json")
    if out["finished"]:  # the RL loop's own CPU seconds (runs from 2026-12-07 on)
        with open(summary_path) as f:
            rl_cpu = json.load(f).get("rl_cpu_s")
        if rl_cpu is not None:
            out["rl_cpu_s"] = rl_cpu
    cpu_path = os.path.join(root, name + ".cpu.json")
    if os.path.exists(cpu_path):
        with open(cpu_path) as f:
            out["cost"] = json.load(f)
    if curve:
        g = [c["greedy"] for c in curve]
        s = [c["sample"] for c in curve]
        out["base"] = dict(greedy=g[0], sample=s[0])
        out["final"] = dict(greedy=g[-1], sample=s[-1], step=curve[-1]["step"])
        # greedy and sampled apart: greedy accuracy is a threshold on each token's probability,
        # so a base whose errors share one rule flips them all in one evaluation while its
        # sampled accuracy rises step by step (docs/testbed.md)
        out["max_jump_greedy"] = float(max(np.diff(g), default=0.0))
        out["max_jump_sampled"] = float(max(np.diff(s), default=0.0))
        out["max_jump"] = max(out["max_jump_greedy"], out["max_jump_sampled"])
        out["criteria"] = dict(
            base_in_band=all(BASE_BAND[0] <= x <= BASE_BAND[1] for x in (g[0], s[0])),
            final_in_band=out["finished"]
            and all(FINAL_BAND[0] <= x <= FINAL_BAND[1] for x in (g[-1], s[-1])),
            no_jump=out["max_jump"] <= MAX_JUMP,
            no_jump_sampled=out["max_jump_sampled"] <= MAX_JUMP,  # the proposed criterion
            steps=out["last_step"] >= MIN_STEPS,
        )
    return out


def _demonstration_lengths() -> dict:
    """Tokens of the worked answers to the held-out problems, by number of terms (the task's
    length distribution, fixed by its knobs)."""
    from gspo_jax import tasks

    tb = _testbed()
    task = tasks.get_task("chainsum", **tb.TASK)
    rng = np.random.default_rng(0)
    lengths = [
        len(task.tokenizer.encode(task.demonstration(r, rng), add_eos=True))
        for r in task.generate_split("test")
    ]
    values, counts = np.unique(lengths, return_counts=True)
    return dict(
        histogram={int(v): int(c) for v, c in zip(values, counts, strict=True)},
        min=int(min(lengths)),
        max=int(max(lengths)),
        mean=float(np.mean(lengths)),
        std=float(np.std(lengths)),
    )


def _plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        steps = [c["step"] for c in r["curve"]]
        line = ax.plot(steps, [c["greedy"] for c in r["curve"]], "-o", ms=3, label=r["name"])[0]
        ax.plot(steps, [c["sample"] for c in r["curve"]], "--", color=line.get_color())
        if r["rollout_len"]:
            s, n = np.array(r["rollout_len"]).T
            bx.plot(s, n, color=line.get_color(), label=r["name"])
    for lo, hi, color in (BASE_BAND + ("0.9",), FINAL_BAND + ("0.8",)):
        ax.axhspan(lo, hi, color=color, alpha=0.3)
    ax.set(xlabel="RL step", ylabel="held-out accuracy (solid greedy, dashed sampled)", ylim=(0, 1))
    ax.legend(fontsize=8)
    bx.set(xlabel="RL step", ylabel="mean response length (tokens, rollout)")
    fig.suptitle("testbed pilot: GRPO defaults from the pilot's warm-start draws")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _design_cost(runs: list[dict]) -> dict:
    """A design's RL cost (DESIGN_DRAWS x DESIGN_ARMS runs) from the measured CPU seconds,
    spread over CORES cores: the RL loop's own (summary.json rl_cpu_s) where the runs recorded
    it, else the whole process's (<run>.cpu.json, which counts a warm start trained inside the
    run: an upper bound)."""
    finished = [r for r in runs if r.get("finished")]
    rl = [r["rl_cpu_s"] for r in finished if "rl_cpu_s" in r]
    source = "rl_cpu_s"
    if not rl:
        rl, source = [r["cost"]["cpu_s"] for r in finished if "cost" in r], "process cpu_s"
    if not rl:
        return {}
    run_cpu = float(np.mean(rl))
    design_cpu = DESIGN_DRAWS * DESIGN_ARMS * run_cpu
    return dict(
        source=source,
        runs_measured=len(rl),
        run_cpu_s_mean=run_cpu,
        design_runs=DESIGN_DRAWS * DESIGN_ARMS,
        design_rl_hours_on_cores=design_cpu / CORES / 3600,
        budget_hours=DESIGN_HOURS,
    )


def _recipe_of(name: str) -> str:
    """A run's recipe: its name without the draw (grpo_d903_lr0.0002_tagtok50 -> lr0.0002_tagtok50;
    grpo_d901 -> the config's defaults, "")."""
    return name.split("_", 2)[2] if name.count("_") >= 2 else ""


def _final_statistic(run: dict) -> float | None:
    """Round 3's primary statistic on a run: held-out greedy accuracy, the mean of the last 3
    evaluations (the drafts' "final held-out greedy accuracy")."""
    g = [c["greedy"] for c in run["curve"]]
    return float(np.mean(g[-3:])) if run.get("finished") and len(g) >= 3 else None


def _recipes(runs: list[dict]) -> dict:
    """Per recipe (runs that differ only in their draw): how many draws, how many of them pass
    each criterion, and the figures' mean and draw-to-draw sd (ddof 1) over its finished runs:
    the spread the power calculation of round 3's designs starts from (a level's sd; the sd of a
    paired difference needs two arms on the same draws)."""
    out = {}
    for recipe in sorted({_recipe_of(r["name"]) for r in runs}):
        done = [
            r
            for r in runs
            if _recipe_of(r["name"]) == recipe and r.get("finished") and r.get("curve")
        ]
        if not done:
            continue
        g = [[c["greedy"] for c in r["curve"]] for r in done]  # (from the curves: pilot.json's
        x = [[c["sample"] for c in r["curve"]] for r in done]  # older runs lack later keys)
        figures = dict(
            base_greedy=[v[0] for v in g],
            base_sampled=[v[0] for v in x],
            final_greedy=[v[-1] for v in g],
            final_sampled=[v[-1] for v in x],
            final_last3_greedy=[_final_statistic(r) for r in done],
            max_jump_greedy=[float(max(np.diff(v), default=0.0)) for v in g],
            max_jump_sampled=[float(max(np.diff(v), default=0.0)) for v in x],
        )
        out[recipe or "(defaults)"] = dict(
            draws=len(done),
            passed={
                k: sum(bool(r["criteria"].get(k)) for r in done)
                for k in sorted({k for r in done for k in r["criteria"]})
            },
            **{
                k: dict(
                    mean=float(np.mean(v)),
                    sd=float(np.std(v, ddof=1)) if len(v) > 1 else None,
                    min=float(min(v)),
                    max=float(max(v)),
                )
                for k, v in figures.items()
                if None not in v
            },
        )
    return out


def _previous_runs(path: str) -> list[dict]:
    """The runs an earlier ``collect`` wrote into ``path`` (none when it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["runs"]


def _merged(previous: list[dict], current: list[dict]) -> list[dict]:
    """The runs of an earlier collect whose folders are not under this root (another machine's,
    or removed) kept as they were, then this root's, which replace any of the same name: a
    pilot spans sessions and machines, and its table must not lose a run it once had."""
    names = {r["name"] for r in current}
    return [r for r in previous if r["name"] not in names] + current


def collect(args) -> None:
    rec = _load("_pilot_records", os.path.join(REPO, "notebooks", "reporting", "records.py"))
    folders = sorted(p for p in glob.glob(os.path.join(args.root, "grpo_d*")) if os.path.isdir(p))
    runs = _merged(
        _previous_runs(os.path.join(args.out, "pilot.json")),
        [_summarise(wd, args.root) for wd in folders],
    )
    os.makedirs(args.out, exist_ok=True)
    for r in runs:
        if r["finished"] and os.path.isdir(os.path.join(args.root, r["name"])):
            rec.write(os.path.join(args.root, r["name"]), args.out)
    pilot = dict(
        criteria=dict(
            base_band=BASE_BAND, final_band=FINAL_BAND, max_jump=MAX_JUMP, min_steps=MIN_STEPS
        ),
        demonstration_lengths=_demonstration_lengths(),
        runs=runs,
        recipes=_recipes(runs),
        design=_design_cost(runs),
    )
    # serialised first and replaced whole: a failure never leaves the earlier pilot.json cut
    text, path = json.dumps(pilot, indent=1), os.path.join(args.out, "pilot.json")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    # the figure: this root's runs (the latest arms; every run's curve stays in pilot.json)
    here = [r for r in runs if os.path.isdir(os.path.join(args.root, r["name"]))]
    if any(r["curve"] for r in here):  # no empty figure before the first evaluation
        _plot(here, os.path.join(args.out, "curves.png"))
    print(
        "| run | status | warm start steps | base greedy | base sampled | final greedy "
        "| final sampled | max jump greedy / sampled | step s (median) | CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        b, f = r.get("base", {}), r.get("final", {})
        status = "done" if r["finished"] else f"at step {r['last_step']}"
        print(
            f"| {r['name']} | {status} | {r['warm_start'].get('steps', '?')} "
            f"| {b.get('greedy', float('nan')):.3f} | {b.get('sample', float('nan')):.3f} "
            f"| {f.get('greedy', float('nan')):.3f} | {f.get('sample', float('nan')):.3f} "
            f"| {r.get('max_jump_greedy', float('nan')):.3f} / "
            f"{r.get('max_jump_sampled', float('nan')):.3f} "
            f"| {r['step_s_median'] or float('nan'):.1f} "
            f"| {r.get('cost', {}).get('cpu_s', float('nan')):.0f} |"
        )
    for recipe, fig in pilot["recipes"].items():
        spread = ", ".join(
            f"{k} {v['mean']:.3f} (sd {v['sd'] if v['sd'] is None else round(v['sd'], 3)})"
            for k, v in fig.items()
            if isinstance(v, dict) and "mean" in v
        )
        print(f"recipe {recipe}: {fig['draws']} draws; passed {fig['passed']}; {spread}")
    print(json.dumps(pilot["demonstration_lengths"]))
    print(json.dumps(pilot["design"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--root", required=True)
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="0 = the config's")
    p.add_argument("--lr", type=float, default=0.0, help="0 = the config's learning rate")
    p.add_argument("--only", nargs="*", default=[], help="run names (default: every draw's)")
    p.add_argument("--set", nargs="*", default=[], help="config overrides key=value (with --tag)")
    p.add_argument("--tag", default="", help="suffix of the run names of a --set arm")
    p.set_defaults(fn=run)
    p = sub.add_parser("collect")
    p.add_argument("--root", required=True)
    p.add_argument("--out", default=os.path.join(REPO, "results", "pilots", "testbed"))
    p.set_defaults(fn=collect)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
