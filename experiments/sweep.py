"""Expand a config's sweep into runs, launch them, and collect their final metrics into one table.

    python experiments/sweep.py --config configs/arith.py:runlocal --sweep seeds=1 \\
        --workdir runs/sweep_local --parallel 2

A config file that defines ``get_sweep(arg=None)`` returns a list of runs, each a dict
``{"name": str, "overrides": {"dotted.key": value, ...}}``. Every run is launched as its own process
(``python -m gspo_jax.main --config <file>:<arg> --workdir <root>/<name> --config.k=v ...``), so
that runs are isolated (separate JAX runtimes, separate checkpoints) and a crashed run does not take
the sweep down; ``--parallel N`` keeps N of them running at once. A run whose workdir already holds
a summary.json is skipped (re-running the sweep resumes it), and an interrupted run resumes from its
last checkpoint because it is the same command in the same workdir.

With ``--parallel`` above 1 the launcher first prepares, once, what the runs share: for each
distinct dataset and warm start among the pending runs (runs that differ only outside the config
sections ``experiment.prepare`` reads: task, data, model, init), one ``gspo_jax.main
--prepare_only`` process builds the dataset and trains the cached warm start before any run starts.
It is a subprocess, not a call in the launcher, so that the launcher never holds the accelerator
its runs need. The runs then load the cached entries instead of all waiting on the first one (the
library's file locks make concurrent preparation safe, not parallel). If that preparation fails,
each run prepares for itself and reports the error in its own log.

When every run has ended, the table of final figures is written to <root>/results.csv and
<root>/results.md (and printed): per run its overrides, base and final held-out greedy accuracy,
mean response length, the last step's reward and policy entropy, and the mean clip fraction and
entropy over the run; <root>/results_by_arm.md averages them per arm over its seeds.

With ``--population`` (the default; ``--population=false`` keeps one process per run) runs that
differ only in their seed, and arms that differ only in fields a population varies
(config.schema.POPULATION_FIELDS: ε, kl_coef, delta, the learning rate, the temperature; each run
setting them), run as one population (gspo_jax/rl/population.py: one process, one program, the
members stacked): an arm's seeds as population.seeds, several arms as population.vary with
population.mode="zip" (member i is run i). Its workdir is <root>/population/<arm>[+<arm>...],
and each run's folder <root>/<run> is a link to its member's folder
(<root>/population/<arm>/members/seed<s>, or eps_low=0.2-seed<s>), which holds what a single run
writes, so the table, the analysis and the notebooks read it unchanged. Before merging, the
launcher asks the library (rl/population.py refusal, in a CPU-only child process) which
populations it runs: a group it refuses falls back to each arm's seeds, and an arm it refuses (a
pipelined run, rl.max_staleness > 0) runs one process per run, as does an arm with one seed.
With ``--parallel N`` and fewer than N population runs, each is split into parts of consecutive
members (<root>/population/<arm>.part<i>of<k>), so that N processes run: one population is one
program, which keeps one core busy (docs/population.md "Runs per hour").

This file holds launcher logic only; no library code (docs/design.md "Layout").
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import importlib.util
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Figures averaged over all steps of a run (the rest are read from summary.json / the last step).
MEAN_OVER_RUN = (
    "train/clip_frac",
    "train/seq_clip_frac",
    "rollout/response_len_mean",
    "train/entropy",
)
# The same, for figures only some runs log (rollout correction, off-policy masking, a rollout in
# another dtype, dynamic sampling): a column appears only when some run of the sweep has it.
MEAN_IF_LOGGED = (
    "rollout/mismatch_tok_abs_mean",
    "rollout/mismatch_seq_abs_mean",
    "train/rollout_is_mean",
    "train/rollout_is_masked_frac",
    "train/opsm_drop_frac",
    "train/cov_frac",
    "train/entropy_kept_frac",
    "rollout/ds_gen_batches",
    "rollout/ds_groups_filtered_frac",
    "time/step_s",
)


def load_sweep(config_spec: str, sweep_arg: str | None) -> list[dict]:
    """Calls get_sweep(sweep_arg) of the config file named in ``config_spec`` (path[:arg])."""
    path = config_spec.split(":", 1)[0]
    spec = importlib.util.spec_from_file_location("_sweep_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"{path} defines no get_sweep(arg); add one next to get_config")
    runs = module.get_sweep(sweep_arg)
    names = [r["name"] for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"sweep of {path} has duplicate run names {dup}")
    return runs


def _flag_value(v) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, dict):  # population.vary: one JSON dict (gspo_jax/config/args.py)
        return json.dumps(v, sort_keys=True)
    if isinstance(v, tuple | list):
        return "(" + ",".join(_flag_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return str(v)


def run_command(config_spec: str, run: dict, workdir: str, extra: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "gspo_jax.main", f"--config={config_spec}", f"--workdir={workdir}"]
    cmd += [f"--config.{k}={_flag_value(v)}" for k, v in run["overrides"].items()]
    return cmd + list(extra)


# The config sections experiment.prepare reads (dataset, model, warm start): runs whose overrides
# agree on them share one dataset and one warm start.
PREPARED_FROM = ("task", "data", "model", "init")


def preparation_groups(runs: list[dict]) -> list[list[dict]]:
    """The runs grouped by their overrides under PREPARED_FROM, in the order of the runs."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        key = tuple(
            sorted(
                (k, _flag_value(v))
                for k, v in run["overrides"].items()
                if k.split(".", 1)[0] in PREPARED_FROM
            )
        )
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def prepare_command(
    config_spec: str, run: dict, workdir: str, extra: Sequence[str] = ()
) -> list[str]:
    """The run's own command with --prepare_only: validates its config, prepares the dataset and
    trains the cached warm start (experiment.prepare), then exits."""
    return run_command(config_spec, run, workdir, extra) + ["--prepare_only"]


def prepare_once(
    config_spec: str,
    runs: list[dict],
    root: str,
    extra: Sequence[str] = (),
    env: dict | None = None,
) -> dict[str, int]:
    """Prepares each distinct dataset + warm start of ``runs`` once, one group after another, in
    a subprocess logging to <root>/prepare.log; returns the exit code of each group's preparation
    by the name of its first run."""
    codes = {}
    for group in preparation_groups(runs):
        first = group[0]
        cmd = prepare_command(config_spec, first, os.path.join(root, first["name"]), extra)
        names = ", ".join(r["name"] for r in group)
        log_path = os.path.join(root, "prepare.log")
        print(
            f"[sweep] preparing the dataset and warm start once for {len(group)} run(s) "
            f"({names}), before they start; log: {log_path}",
            flush=True,
        )
        t0 = time.time()
        with open(log_path, "a") as log:
            log.write(f"$ {' '.join(cmd[2:])}\n")
            log.flush()
            start = log.tell()
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        if rc == 0:
            print(f"[sweep] prepared in {time.time() - t0:.0f}s", flush=True)
        else:
            print(
                f"[sweep] preparation FAILED rc={rc}: {_last_line(log_path, start)} (log: "
                f"{log_path}); each run will prepare for itself",
                flush=True,
            )
        codes[first["name"]] = rc
    return codes


def _last_line(path: str, start: int) -> str:
    """The last non-empty line written to ``path`` after byte offset ``start`` (progress bars'
    carriage returns split lines too)."""
    with open(path, errors="replace") as f:
        f.seek(start)
        lines = [ln.strip() for ln in f.read().replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _library():
    """gspo_jax of this checkout (the launcher's children get it through PYTHONPATH): importing
    it imports JAX but starts no backend."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from gspo_jax.config import population as population_cfg
    from gspo_jax.config import schema

    return schema, population_cfg


def varied_fields(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The fields a population may vary (POPULATION_FIELDS) that no flag of ``extra`` sets (such
    a flag overrides every run's value after its own, so it is no arm's)."""
    fixed = {f[len("--config.") :].split("=", 1)[0] for f in extra if f.startswith("--config.")}
    return tuple(f for f in _library()[0].POPULATION_FIELDS if f not in fixed)


def population_groups(runs: list[dict], fields: Sequence[str] = ()) -> list[list[dict]]:
    """The runs grouped into would-be populations, in the order of their first runs: runs whose
    overrides agree except in "seed" and in ``fields`` (varied_fields), which every run of a
    group sets (a field left at its preset is not a number the launcher knows)."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        o = run["overrides"]
        fixed = tuple(
            sorted((k, _flag_value(v)) for k, v in o.items() if k != "seed" and k not in fields)
        )
        groups.setdefault((fixed, tuple(sorted(k for k in o if k in fields))), []).append(run)
    return list(groups.values())


def arm_groups(runs: list[dict]) -> list[list[dict]]:
    """The runs grouped by arm (overrides equal except "seed"), in the order of their first runs."""
    arms: dict[tuple, list[dict]] = {}
    for run in runs:
        key = tuple(sorted((k, _flag_value(v)) for k, v in run["overrides"].items() if k != "seed"))
        arms.setdefault(key, []).append(run)
    return list(arms.values())


def _arm(run: dict) -> str:
    return re.sub(r"_s\d+$", "", run["name"])


def population_run(group: list[dict], fields: Sequence[str] = ()) -> dict | None:
    """The population run that stands for ``group`` (population_groups over ``fields``), or None
    when it is one
    run, a run without its own "seed", or two runs with the same seed and values.

    Its overrides are the group's common ones plus population.seeds; runs that differ in varied
    fields add population.vary (nested, one value per run) and population.mode="zip" (member i
    is run i). "members" maps each member folder (config/population.py member_name: ``seed1``,
    ``eps_high=0.2-eps_low=0.2-seed1``) to the run it stands for. Its name is
    population/<arm>, or population/<arm>+<arm>... for several arms."""
    population_cfg = _library()[1]
    if len(group) < 2 or any("seed" not in r["overrides"] for r in group):
        return None
    fields = [k for k in group[0]["overrides"] if k in fields]
    # the fields whose values differ are varied; the others are common overrides
    varied = sorted(f for f in fields if len({_flag_value(r["overrides"][f]) for r in group}) > 1)
    seeds = [r["overrides"]["seed"] for r in group]
    values = [{f: r["overrides"][f] for f in varied} for r in group]
    folders = [population_cfg.member_name(s, v) for s, v in zip(seeds, values, strict=True)]
    if len(set(folders)) < len(folders):
        return None
    overrides = {k: v for k, v in group[0]["overrides"].items() if k != "seed" and k not in varied}
    overrides["population.seeds"] = tuple(seeds)
    if varied:
        vary: dict = {}
        for f in varied:
            section, name = f.split(".", 1)
            vary.setdefault(section, {})[name] = tuple(v[f] for v in values)
        overrides["population.vary"] = vary
        overrides["population.mode"] = "zip"
    arms = list(dict.fromkeys(_arm(r) for r in group))
    name = "+".join(arms)
    if len(name) > 120:  # a folder name stays short, and the same for the same arms
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{arms[0]}+{len(arms) - 1}_more_{digest}"
    members = {f: r["name"] for f, r in zip(folders, group, strict=True)}
    return {"name": f"population/{name}", "overrides": overrides, "members": members}


def population_runs(
    runs: list[dict], check=None, extra: Sequence[str] = (), parallel: int = 1
) -> list[dict]:
    """The runs with each population_groups group that can be one merged into its population run
    (population_run), in the order of the runs; the others stay as they are.

    ``check(population runs) -> {name: why a population refuses it}`` (refusals: the library's
    own check) decides which merge: a refused group of several arms falls back to each arm's
    seeds as a population (checked too), and a refused arm runs one process per run.
    ``extra``: the flags every run gets after its own; a field they set varies in no population
    (varied_fields). ``parallel``: the processes the launcher runs at once; when fewer
    population runs than that stand for all the runs, each is split into parts (split_group),
    so that no process slot idles: one population is one program on one core, so on two cores
    two populations beat one (the figures: docs/population.md "Runs per hour")."""
    units: dict[str, dict] = {}  # the first run's name -> its population run
    accepted: dict[str, list[dict]] = {}  # the first run's name -> its group

    def merge(groups: list[list[dict]]) -> list[list[dict]]:
        cands = [(g, population_run(g, fields)) for g in groups]
        cands = [(g, c) for g, c in cands if c is not None]
        name_apart([c for _, c in cands])
        refused = check([c for _, c in cands]) if check and cands else {}
        retry, notes = [], {}
        for g, c in cands:
            why = refused.get(c["name"])
            if why is None:
                units[g[0]["name"]], accepted[g[0]["name"]] = c, g
                continue
            arms = arm_groups(g)
            fallback = "each arm's seeds as a population" if len(arms) > 1 else "a process per run"
            notes.setdefault((fallback, why), []).append(c["name"])
            if len(arms) > 1:
                retry += arms
        for (fallback, why), names in notes.items():  # one line per reason
            print(
                f"[sweep] {fallback} for {', '.join(names)}: the library refuses: {why}",
                flush=True,
            )
        return retry

    fields = varied_fields(extra)
    groups = population_groups(runs, fields)
    while groups:  # at most twice: an arm's seeds are one group
        groups = merge(groups)
    out, merged, first = [], set(), {}  # first: population run name -> its first run's
    for run in runs:
        if run["name"] in units:
            unit = units[run["name"]]
            out.append(unit)
            merged |= set(unit["members"].values())
            first[unit["name"]] = run["name"]
        elif run["name"] not in merged:
            out.append(run)
    if units and len(out) < parallel:
        parts = -(-parallel // len(units))  # ceil: every process slot gets a part
        out = [
            p
            for u in out
            for p in (
                split_group(accepted[first[u["name"]]], parts, fields, u["name"])
                if u["name"] in first
                else [u]
            )
        ]
    return out


def name_apart(units: list[dict]) -> None:
    """Population runs of one arm that differ in a common override are named apart in place,
    population/<arm>.<field>=<value> for the fields that differ (round 2's sweeps draw the warm
    start per seed, so an arm's seeds form one population per draw: ``init.warmstart.seed=1``)."""
    by_name: dict[str, list[dict]] = {}
    for u in units:
        by_name.setdefault(u["name"], []).append(u)
    own = ("population.seeds", "population.vary", "population.mode")
    for same in by_name.values():
        if len(same) < 2:
            continue
        keys = sorted({k for u in same for k in u["overrides"] if k not in own})
        differ = [k for k in keys if len({_flag_value(u["overrides"].get(k)) for u in same}) > 1]
        for u in same:
            u["name"] += "." + ",".join(f"{k}={_flag_value(u['overrides'].get(k))}" for k in differ)


def split_group(
    group: list[dict], parts: int, fields: Sequence[str] = (), name: str = ""
) -> list[dict]:
    """``group``'s population run as ``parts`` population runs of consecutive members (as even
    as they go; a part of one run is that run), named <name>.part<i>of<parts> (``name``: the
    whole group's population run's, by default population/<arm>)."""
    parts = min(parts, len(group))
    size, extra = divmod(len(group), parts)
    out, start = [], 0
    for i in range(parts):
        chunk = group[start : start + size + (i < extra)]
        start += len(chunk)
        unit = population_run(chunk, fields)
        if unit is None:
            out += chunk
            continue
        if name:
            unit["name"] = name
        if parts > 1:
            unit["name"] += f".part{i + 1}of{parts}"
        out.append(unit)
    return out


def check_populations(
    config_spec: str, candidates: list[dict], extra: Sequence[str] = ()
) -> dict[str, str]:
    """{population run name: why a population refuses it} for those of ``candidates``
    (population_run's) whose config, as gspo_jax.main would build it from the run's flags and
    ``extra``, the library refuses (gspo_jax/rl/population.py refusal: build_population's own
    checks) or whose member folders would be named otherwise than its "members". Builds the
    abstract Runs, so it starts a JAX backend: launch asks it in a CPU-only process (refusals)."""
    _library()
    from gspo_jax import config as config_lib
    from gspo_jax.config import population as population_cfg
    from gspo_jax.rl import population

    out = {}
    for cand in candidates:
        flags = run_command(config_spec, cand, "")[5:] + list(extra)
        try:
            config = config_lib.config_from_flags(config_spec, flags)
            folders = [m.name for m in population_cfg.members(config)]
            why = population.refusal(config)
            if why is None and folders != list(cand["members"]):
                why = f"its member folders would be {folders}, not {list(cand['members'])}"
        except Exception as e:  # whatever stops the check stops the merge, not the sweep
            why = f"{type(e).__name__}: {' '.join(str(e).split())}"
        if why:
            out[cand["name"]] = why
    return out


CHECK_FLAG = "--check_populations"  # sweep.py's own CPU-only child: check_populations on stdin


def refusals(
    config_spec: str, candidates: list[dict], extra: Sequence[str] = (), env: dict | None = None
) -> dict[str, str]:
    """check_populations in a child process on the CPU (JAX_PLATFORMS=cpu), so the launcher never
    holds the accelerator its runs need; if the child fails, every candidate is refused (its
    runs then run one process each) with its last line as the reason."""
    env = dict(os.environ if env is None else env)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    payload = json.dumps({"config": config_spec, "extra": list(extra), "candidates": candidates})
    print(f"[sweep] asking the library which of {len(candidates)} populations it runs", flush=True)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), CHECK_FLAG],
        input=payload,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {
        c["name"]: f"the population check failed (rc={proc.returncode}): {last}" for c in candidates
    }


def _check_main() -> int:
    """The child of refusals: reads its JSON from stdin, prints check_populations' as one line."""
    job = json.load(sys.stdin)
    print(json.dumps(check_populations(job["config"], job["candidates"], job["extra"])))
    return 0


def link_members(root: str, runs: list[dict]) -> None:
    """<root>/<run> -> the population's member folder, for every member of a finished (or
    resumable) population run, so a run's folder is where a single run would have written."""
    for run in runs:
        for folder, name in run.get("members", {}).items():
            src = os.path.join(root, run["name"], "members", folder)
            dst = os.path.join(root, name)
            if os.path.isdir(src) and not os.path.lexists(dst):
                os.symlink(os.path.relpath(src, root), dst)


def _is_done(root: str, run: dict) -> bool:
    return os.path.exists(os.path.join(root, run["name"], "summary.json"))


def launch(
    config_spec: str,
    runs: list[dict],
    root: str,
    parallel: int = 1,
    extra: Sequence[str] = (),
    env: dict | None = None,
    population: bool = False,
    on_end: Callable[[str, int], None] | None = None,
) -> dict[str, int]:
    """Runs every run (at most ``parallel`` at once); returns name -> exit code (0 = skipped/done).

    ``on_end(name, exit code)``: called as each launched run's process ends, while the others go
    on (the claims launcher records a finished run there, so that a sweep stopped hours later has
    kept it already). Not called for the runs skipped as done; with ``population``, called for
    each member of a population as its process ends, once the member's folder is linked.

    ``population``: the pending runs run as populations where the library runs them
    (population_runs, refusals); the codes are then the runs' own names' (each member takes its
    population's code).

    With parallel > 1 the pending runs' datasets and warm starts are prepared once first
    (prepare_once). Run one at a time, the first run prepares them and the others find them
    cached.
    """
    os.makedirs(root, exist_ok=True)
    if population:
        todo = [r for r in runs if not _is_done(root, r)]  # a finished run stays as it is

        def check(candidates: list[dict]) -> dict[str, str]:
            return refusals(config_spec, candidates, extra, env)

        merged = population_runs(todo, check, extra, parallel)
        if len(merged) < len(todo):
            by_name = {r["name"]: r for r in merged}

            def ended(name: str, code: int) -> None:  # a population's members are runs as it ends
                link_members(root, [by_name[name]])
                for member in list(by_name[name].get("members", {}).values()) or [name]:
                    on_end(member, code)

            each = ended if on_end else None
            try:
                codes = launch(config_spec, merged, root, parallel, extra, env, on_end=each)
            finally:  # a sweep stopped half way keeps its finished populations' runs as runs
                link_members(root, merged)
            by_run = {r["name"]: 0 for r in runs if r not in todo}
            for run in merged:
                for name in run.get("members", {}).values():
                    by_run[name] = codes.get(run["name"], 1)
                if "members" not in run:
                    by_run[run["name"]] = codes.get(run["name"], 1)
            return by_run
    pending = list(runs)
    active: dict[str, tuple[subprocess.Popen, float, object]] = {}
    codes: dict[str, int] = {}
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    todo = [r for r in runs if not _is_done(root, r)]
    if parallel > 1 and len(todo) > 1:
        prepare_once(config_spec, todo, root, extra, env)
    while pending or active:
        while pending and len(active) < parallel:
            run = pending.pop(0)
            wd = os.path.join(root, run["name"])
            if _is_done(root, run):
                print(f"[sweep] {run['name']}: done already, skipped", flush=True)
                codes[run["name"]] = 0
                continue
            os.makedirs(wd, exist_ok=True)
            log = open(os.path.join(wd, "stdout.log"), "a")  # noqa: SIM115 (closed below)
            cmd = run_command(config_spec, run, wd, extra)
            print(f"[sweep] start {run['name']}: {' '.join(cmd[2:])}", flush=True)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            active[run["name"]] = (proc, time.time(), log)
        time.sleep(0.5)
        for name, (proc, t0, log) in list(active.items()):
            if proc.poll() is not None:
                log.close()
                codes[name] = proc.returncode
                status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
                print(f"[sweep] end {name}: {status} in {time.time() - t0:.0f}s", flush=True)
                del active[name]
                if on_end is not None:
                    on_end(name, proc.returncode)
    return codes


def _parse_bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low not in ("true", "false", "1", "0", "yes", "no"):
        raise SystemExit(f"--population={text!r}: use true or false")
    return low in ("true", "1", "yes")


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def collect(runs: list[dict], root: str) -> list[dict]:
    """One row per run from <workdir>/summary.json and metrics.jsonl (missing figures are NaN)."""
    rows = []
    for run in runs:
        wd = os.path.join(root, run["name"])
        row = {"run": run["name"]}
        row.update({k: v for k, v in run["overrides"].items()})
        summary = {}
        if os.path.exists(os.path.join(wd, "summary.json")):
            with open(os.path.join(wd, "summary.json")) as f:
                summary = json.load(f)
        records = _read_jsonl(os.path.join(wd, "metrics.jsonl"))
        base, final = summary.get("base") or {}, summary.get("final") or {}
        row["status"] = "ok" if summary else "missing"
        row["steps"] = summary.get("steps", records[-1]["step"] if records else 0)
        row["base_acc"] = _num(base.get("greedy_accuracy"))
        row["final_acc"] = _num(final.get("greedy_accuracy"))
        row["delta_acc"] = row["final_acc"] - row["base_acc"]
        row["base_len"] = _num(base.get("mean_response_length"))
        row["final_len"] = _num(final.get("mean_response_length"))
        last = records[-1] if records else {}
        row["last_reward"] = _num(last.get("rollout/reward"))
        row["last_entropy"] = _num(last.get("train/entropy"))
        for k in MEAN_OVER_RUN + MEAN_IF_LOGGED:
            vals = [_num(r[k]) for r in records if k in r]
            if vals or k in MEAN_OVER_RUN:
                row["mean_" + k.split("/", 1)[1]] = sum(vals) / len(vals) if vals else math.nan
        row["wall_s"] = _num(summary.get("wall_s"))
        rows.append(row)
    return rows


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)


def write_tables(rows: list[dict], root: str) -> str:
    """Writes results.csv and results.md under ``root``; returns the markdown table."""
    override_cols = [c for r in rows for c in r if "." in c or c == "seed"]
    cols: list[str] = ["run"] + list(dict.fromkeys(override_cols))  # the sweep's axes first
    for r in rows:
        cols += [c for c in r if c not in cols]
    with open(os.path.join(root, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(root, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(root, "results_by_arm.md"), "w") as f:
        f.write(arm_table(rows))
    return md


# Figures the per-arm table averages over seeds (those of them the runs have).
ARM_FIGURES = (
    "final_acc",
    "mean_clip_frac",
    "mean_entropy",
    "last_entropy",
    "mean_cov_frac",
    "final_len",
)


def arm_table(rows: list[dict]) -> str:
    """Markdown: per arm (a run name without its _s<seed> suffix), over its finished seeds, the
    mean (± the sample std across seeds when there are several) of ARM_FIGURES."""
    arms: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            arms.setdefault(re.sub(r"_s\d+$", "", r["run"]), []).append(r)
    figures = [f for f in ARM_FIGURES if any(f in r for rs in arms.values() for r in rs)]
    lines = ["| arm | seeds | " + " | ".join(figures) + " |", "|" + "---|" * (len(figures) + 2)]
    for arm, rs in arms.items():
        cells = []
        for f in figures:
            vals = [r[f] for r in rs if f in r and not math.isnan(r[f])]
            if not vals:
                cells.append("-")
            elif len(vals) == 1:
                cells.append(f"{vals[0]:.4g}")
            else:
                cells.append(f"{statistics.mean(vals):.4g} ± {statistics.stdev(vals):.2g}")
        lines.append(f"| {arm} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def select_runs(runs: list[dict], only: str) -> list[dict]:
    """The runs whose names match one of the comma-separated fnmatch patterns (all if empty)."""
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    if not patterns:
        return runs
    chosen = [r for r in runs if any(fnmatch.fnmatch(r["name"], p) for p in patterns)]
    if not chosen:
        raise SystemExit(f"--only {only!r} matches no run; runs: {[r['name'] for r in runs]}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="config file with get_sweep, as path[:arg]")
    p.add_argument("--sweep", default=None, help="argument string for get_sweep (e.g. seeds=2)")
    p.add_argument("--workdir", required=True, help="root directory; one sub-directory per run")
    p.add_argument("--parallel", type=int, default=1, help="runs at once (each is a process)")
    p.add_argument("--dry_run", action="store_true", help="print the commands only")
    p.add_argument(
        "--population",
        default="true",
        help="true: an arm's seeds, and arms differing only in fields a population varies, run as "
        "one population where the library runs one; false: a process per run",
    )
    p.add_argument("--collect_only", action="store_true", help="only rebuild the results table")
    p.add_argument(
        "--only", default="", help="comma-separated run-name patterns (fnmatch), e.g. 'cispo_*'"
    )
    args, extra = p.parse_known_args(argv)  # extra --config.x=y flags apply to every run
    runs = select_runs(load_sweep(args.config, args.sweep), args.only)
    population = _parse_bool(args.population)
    if args.dry_run:
        if population:
            check = lambda c: refusals(args.config, c, extra)  # noqa: E731
            runs = population_runs(runs, check, extra, args.parallel)
        if args.parallel > 1:
            for group in preparation_groups(runs):
                wd = os.path.join(args.workdir, group[0]["name"])
                print(shlex.join(prepare_command(args.config, group[0], wd, extra)))
        for run in runs:  # quoted as a shell takes them
            wd = os.path.join(args.workdir, run["name"])
            print(shlex.join(run_command(args.config, run, wd, extra)))
        return 0
    codes = {}
    if not args.collect_only:
        codes = launch(args.config, runs, args.workdir, args.parallel, extra, population=population)
    md = write_tables(collect(runs, args.workdir), args.workdir)
    print(md)
    failed = sorted(n for n, c in codes.items() if c != 0)
    if failed:
        print(f"[sweep] failed runs: {failed} (see <workdir>/<run>/stdout.log)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_check_main() if sys.argv[1:] == [CHECK_FLAG] else main())
