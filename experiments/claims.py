"""The papers' claims, one notebook each: run the sweeps a notebook reads, then execute it.

    python experiments/claims.py --list                      # notebooks, their sweeps and runs
    python experiments/claims.py clip_fraction_vs_eps        # its runs (resumable), then execute it
    python experiments/claims.py all                         # every sweep, then every notebook
    python experiments/claims.py luspo_length --runs_only    # only the runs
    python experiments/claims.py luspo_length --notebook_only
    python experiments/claims.py gmpo_ratio_range --runs_only --only '*_k16x2_*'   # some runs
    python experiments/claims.py --sweeps r3_minibatch --warm_starts_only --only '*_s0,*_s1'

Runs go to <runs_dir>/<sweep>/<run> (default runs/claims; a run that finished is skipped, an
interrupted one resumes); each finished run is kept as a committed record,
<results_dir>/<sweep>/<run>.json.gz (default results/claims; notebooks/reporting/records.py), so a
run recorded earlier on another machine is not run again, and the notebooks are executed on the
records. The warm starts the runs start from are kept beside the records
(<results_dir>/warmstart/<entry>, copied into the cache where it lacks them before a sweep), so
every machine's runs of a design start from the same base; round 3's (``Sweep.keep`` "bfloat16") are
rounded to bfloat16 right after training, before any run starts from them, and kept packed,
<results_dir>/warmstart/<entry>.npz.xz (``--warm_starts_only`` makes just them); ``--sweeps`` names
sweeps instead of notebooks (their runs only). At laptop scale: 5 seeds (paired: seed s of every arm
has the same prompts and base), 60 RL steps (a sweep's own flags may say more: the clip sweep runs
150), held-out greedy accuracy on 500 problems every 10 steps (FULL_FLAGS). Several notebooks read
the same sweep (r2_ratio serves four claims), so it runs once. Each claim's design and primary
criterion are in gspo_jax/claims/entries/, committed before its runs; PLANNED names the registry's
claims whose current entry's notebook cells are not written yet (``--runs_only`` makes their runs).
Round 2's entries (issue 33) have their sweeps (``r2_*``) run 12 fresh seeds (100-111,
``Sweep.seeds``) with the warm start drawn per seed (the launcher's populations merge an arm's seeds
that share a warm start: one population per draw). The notebook is executed in place with nbclient
(its outputs are what is committed); it finds the runs (the records) through the GSPO_CLAIMS_RUNS
environment variable, which this launcher sets. tests/test_notebooks.py executes every notebook on
tiny runlocal runs.

This file holds launcher logic only; no library code (docs/design.md "Layout").
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(REPO, "notebooks")
RUNS_ENV = "GSPO_CLAIMS_RUNS"  # where the notebooks look for <sweep>/<run> directories


class Sweep(NamedTuple):
    """A config file's get_sweep(arg) with ``seeds=`` appended; runs under <runs_dir>/<name>.

    (A NamedTuple, not a dataclass: this file is loaded by path, outside sys.modules.)"""

    name: str
    config: str  # relative to the repository root, optionally with its argument (path:arg)
    arg: str = ""
    flags: tuple[str, ...] = ()  # --config.x=y flags after FULL_FLAGS (the later flag wins)
    seeds: int = 0  # the design's seed count (round 2: 12); 0: the launcher's --seeds or SEEDS
    # FULL_FLAGS (the laptop-scale budget) first; False: the config's own budget (the testbed's)
    laptop: bool = True
    # how <results_dir>/warmstart keeps the design's warm starts: "folder", the cache entry as
    # trained (rounds 1-2); "bfloat16" (round 3), rounded once right after training, before any
    # run starts from it, and packed by experiments/warmstart_store.py (a third of the size)
    keep: str = "folder"

    def sweep_arg(self, seeds: int) -> str:
        return ",".join(a for a in (self.arg, f"seeds={seeds}") if a)


# Round 2 (issue 33): 12 fresh seeds (the registry's ROUND2_SEEDS, 100-111); the arith family's
# converged warm start; 200 RL steps where the registry's design asks for them, with held-out
# accuracy every 20 steps.
R2 = 12
ARITH_CONVERGED = "configs/arith.py:warmstart=converged"
LONG = ("--config.rl.num_steps=200", "--config.eval.every=20")

# Round 3 (issue 52): 12 warm-start draws per design (the drafts' draws 0-11), one RL seed each
R3 = 12
ROUND3_STUDIES = (
    "r3_minibatch",
    "r3_moe",
    "r3_sequence",
    "r3_gmpo",
    "r3_dapo",
    "r3_drgrpo",
    "r3_staleness",
)

SWEEPS = {
    s.name: s
    for s in (
        Sweep("arith", "configs/arith.py"),
        Sweep("gspo_token", "configs/arith.py", "study=token_adv"),
        Sweep("luspo_length", "configs/luspo_length.py"),
        Sweep("std_bonus", "configs/std_bonus.py"),
        Sweep("old_logp", "configs/arith_offpolicy.py", "study=old_logp"),
        Sweep("moe", "configs/arith_moe.py", "gspo_token=False,doses=True"),
        # the claims registry's designs (gspo_jax/claims/entries/)
        Sweep("clip", "configs/arith.py", "study=clip", ("--config.rl.num_steps=150",)),
        Sweep("ratio_doses", "configs/arith.py", "study=ratio_doses"),
        Sweep("drgrpo_length", "configs/luspo_length.py", "study=drgrpo"),
        # the staleness dose (issue 31): held-out accuracy every 20 steps, not 10 (40 arms)
        Sweep("staleness", "configs/arith_async.py", "", ("--config.eval.every=20",)),
        # the int8 rollout's mismatch (issue 32), held-out accuracy every 20 steps (8 arms)
        Sweep("quant", "configs/arith_quant.py", "", ("--config.eval.every=20",)),
        # LoRA rank 1 / 8 / 64 against full fine-tuning, a learning-rate grid per arm (issue 32)
        Sweep("lora_arith", "configs/lora_rank.py:task=arith", "", ("--config.eval.every=20",)),
        Sweep(
            "lora_countdown", "configs/lora_rank.py:task=countdown", "", ("--config.eval.every=20",)
        ),
        # round 2 of the registry (issue 33): ROUND2 seeds 100-111, the warm start drawn per seed
        # (seed mod 3; the arith family's converged warm start, docs/warmstart.md)
        Sweep("r2_eps", ARITH_CONVERGED, "study=r2_eps", (), R2),
        Sweep("r2_clip", ARITH_CONVERGED, "study=r2_clip", ("--config.rl.num_steps=150",), R2),
        Sweep("r2_ratio", ARITH_CONVERGED, "study=r2_ratio", LONG, R2),
        Sweep("r2_countdown", "configs/countdown.py", "study=r2", LONG, R2),
        # the entropy claims' v3: their arms of r2_countdown for 400 steps, seeds 300-311
        Sweep(
            "r2_entropy",
            "configs/countdown.py",
            "study=r2_entropy",
            ("--config.rl.num_steps=400", "--config.eval.every=40"),
            R2,
        ),
        Sweep("r2_length", "configs/luspo_length.py", "study=r2", LONG, R2),
        Sweep("r2_std_bonus", "configs/std_bonus.py:warmstart=converged", "study=r2", (), R2),
        Sweep(
            "r2_old_logp",
            "configs/arith_offpolicy.py:warmstart=converged",
            "study=r2_old_logp",
            (),
            R2,
        ),
        Sweep("r2_moe", "configs/arith_moe.py", "study=r2", LONG, R2),
        # issue 51's tool experiment: 60 RL steps, 200 held-out problems (about 100 per level)
        # every 20 steps with 2 sampled episodes each, RL seeds 11-20 from one warm start
        # (configs/tools.py MIXED)
        Sweep(
            "tools",
            "configs/tools.py:digits=4,easy_fraction=0.5,tool_fraction=0.5",
            "",
            ("--config.eval.every=20", "--config.eval.num_problems=200", "--config.eval.pass_k=2"),
            10,
        ),
        # round 3 (issue 52): the drafts' studies on the testbed (configs/testbed.py
        # round3_studies), from the claim draws 0-11 (seeds = draws), at the testbed's own budget
        # (300 RL steps, 200 held-out problems every 25)
        *(
            Sweep(
                name, "configs/testbed.py", f"study={name}", (), R3, laptop=False, keep="bfloat16"
            )
            for name in ROUND3_STUDIES
        ),
    )
}

# notebook (notebooks/<name>.ipynb) -> the sweeps it reads
NOTEBOOKS = {
    "gspo_token_equals_gspo": ("arith", "gspo_token"),
    # the claims registry's new claims (issue 20, item 4)
    "drgrpo_length_bias": ("drgrpo_length",),
    # the asynchronous pipeline's staleness dose (issue 31)
    "staleness_dose": ("staleness",),
    # the int8 rollout's mismatch and LoRA against full fine-tuning (issue 32)
    "int8_rollout_mismatch": ("quant",),
    "lora_rank1_matches_full": ("lora_arith",),
    "lora_rank1_matches_full_countdown": ("lora_countdown",),
    # round 2 (issue 33): the five claims on countdown, each notebook on its newest entry's runs
    # the entropy claims' newest entries (v3) read r2_entropy, and v2's runs in r2_countdown
    "dapo_clip_higher_entropy": ("r2_countdown", "r2_entropy"),
    "gmpo_entropy": ("r2_countdown", "r2_entropy"),
    "gmpo_kl_ref": ("r2_countdown",),
    "gmpo_token_vs_sequence_clip": ("r2_countdown",),
    "gmpo_grpo_wide_clip": ("r2_countdown",),
    # round 2 (issue 33): the eps dose's two claims and the clip fraction's (arith)
    "clip_fraction_vs_eps": ("r2_clip",),
    "eps_objective_sweep": ("r2_eps",),
    "seq_ratio_eps02": ("r2_eps",),
    # round 2 (issue 33): std_normalisation and its negative control (one notebook, two verdicts)
    "std_normalisation": ("r2_std_bonus",),
    # round 2 (issue 33): rollout log-probs and GSPO against GRPO under noise (two verdicts)
    "rollout_logprobs": ("r2_old_logp",),
    # round 2 (issue 33): the three claims on response length (the luspo_length task)
    "luspo_length": ("r2_length",),
    "luspo_clip_higher_negatives": ("r2_length",),
    "grpo_lengthens_responses": ("r2_length",),
    # round 2 (issue 33): MoE's Routing Replay and GSPO without it (two verdicts)
    "moe_routing_replay": ("r2_moe",),
    # round 2 (issue 33): the four claims on the minibatch dose (arith)
    "gmpo_ratio_range": ("r2_ratio",),
    "gspo_minibatch_stability": ("r2_ratio",),
    "gspo_length_normalisation": ("r2_ratio",),
    "deepseekmath_inert_clip": ("r2_ratio",),
    # issue 51: tool use by difficulty, GSPO against GRPO with environment tokens
    "tool_use_where_it_helps": ("tools",),
    # round 3 (issue 52) on the testbed: testbed_<key>, the key's newest entry (its earlier
    # entries' notebooks above keep deciding those)
    "testbed_gspo_minibatch_stability": ("r3_minibatch",),
    "testbed_seq_ratio_eps02": ("r3_minibatch",),
}
ROUND3 = "testbed_"  # a round-3 notebook is named ROUND3 + the key it decides

# registry claims whose current entry has no notebook cells yet -> the sweeps its runs come from
# (--runs_only; a name here takes these sweeps, not the notebook's, "all" the notebooks'): an
# entry registered before its runs waits here until its notebook's cells are written. Round 3's
# registered entries (issue 52), until their testbed notebooks exist.
PLANNED: dict[str, tuple[str, ...]] = {}

WARM_STARTS = "warmstart"  # <results_dir>/warmstart/<entry>: the claims' committed warm starts
SEEDS = 5  # the registry's minimum for a criterion that compares two arms
FULL_FLAGS = (
    "--config.rl.num_steps=60",
    "--config.eval.every=10",
    "--config.eval.num_problems=500",
)


def _load(name: str, path: str):
    """A module loaded by path (this file runs as a script, outside any package); registered in
    sys.modules, which a module's dataclasses need."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _sweep_module():
    return _load("_sweep_launcher", os.path.join(REPO, "experiments", "sweep.py"))


def _records_module():
    return _load("_claims_records", os.path.join(NOTEBOOK_DIR, "reporting", "records.py"))


def sweeps_of(names: Sequence[str], planned: bool = True) -> list[Sweep]:
    """The distinct sweeps the notebooks ``names`` read, in first-use order (``planned``: a name
    in PLANNED takes its planned sweeps, not its notebook's)."""
    known = {**NOTEBOOKS, **PLANNED} if planned else dict(NOTEBOOKS)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"unknown notebook(s) {unknown}; known: {sorted(NOTEBOOKS)}, planned (--runs_only): "
            f"{sorted(PLANNED)}, or 'all'"
        )
    keys = dict.fromkeys(k for n in names for k in known[n])
    return [SWEEPS[k] for k in keys]


def sweep_runs(sweep: Sweep, seeds: int) -> list[dict]:
    """The sweep's runs (name, overrides) for ``seeds`` seeds."""
    return _sweep_module().load_sweep(os.path.join(REPO, sweep.config), sweep.sweep_arg(seeds))


def seeds_of(sweep: Sweep, seeds: int | None = None) -> int:
    """The seed count a sweep runs: ``seeds`` when given, else its design's, else SEEDS."""
    return seeds or sweep.seeds or SEEDS


def warm_start_groups(sweep: Sweep, runs: list[dict], flags: Sequence[str]) -> dict[str, dict]:
    """{warm-start cache entry (gspo_jax/rl/warmstart.py cache_path): the first run that starts
    from it}, one per group of runs that share their preparation (experiments/sweep.py
    preparation_groups); runs that start from no warm start have none. Builds configs only."""
    sw = _sweep_module()
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from gspo_jax import config as config_lib
    from gspo_jax.rl import build, warmstart

    spec = os.path.join(REPO, sweep.config)
    out: dict[str, dict] = {}
    for group in sw.preparation_groups(runs):
        c = config_lib.config_from_flags(spec, sw.run_command(spec, group[0], "")[5:] + list(flags))
        if c.init.kind != "warmstart":
            continue
        task = build.make_task(c)
        model_cfg = build.make_model_config(c, task)
        entry = warmstart.cache_path(task, model_cfg, c.init.warmstart, build.cache_dir_of(c))
        out.setdefault(entry, group[0])
    return out


def warm_start_entries(sweep: Sweep, runs: list[dict], flags: Sequence[str]) -> list[str]:
    """The warm-start cache entries that ``runs`` start from (warm_start_groups)."""
    return list(warm_start_groups(sweep, runs, flags))


def restore_warm_starts(entries: Sequence[str], kept: str) -> list[str]:
    """Copies each of ``entries`` that the cache lacks from its committed copy under ``kept``
    (<results_dir>/warmstart/<entry name>), so that runs on any machine start from the base the
    design's earlier runs started from (a warm start trained on another CPU may differ by
    rounding, and then decide another outcome: docs/warmstart.md). Returns the restored entries."""
    restored = []
    for entry in entries:
        src = os.path.join(kept, os.path.basename(entry))
        if os.path.exists(os.path.join(entry, "meta.json")) or not os.path.exists(
            os.path.join(src, "meta.json")
        ):
            continue  # the cache has it (the local one is used as it is), or nothing is kept
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        tmp = entry + ".restoring"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        os.replace(tmp, entry)
        restored.append(entry)
    return restored


def keep_warm_starts(entries: Sequence[str], kept: str) -> list[str]:
    """Copies each complete entry of ``entries`` that is not yet kept under ``kept`` there (to be
    committed beside the runs' records); returns the newly kept copies."""
    new = []
    for entry in entries:
        dst = os.path.join(kept, os.path.basename(entry))
        if not os.path.exists(os.path.join(entry, "meta.json")) or os.path.exists(dst):
            continue
        shutil.copytree(entry, dst + ".tmp", dirs_exist_ok=True)
        os.replace(dst + ".tmp", dst)
        new.append(dst)
    return new


def _store_module():
    return _load("_warmstart_store", os.path.join(REPO, "experiments", "warmstart_store.py"))


def train_warm_starts(
    config: str,
    runs: Sequence[dict],
    root: str,
    flags: Sequence[str],
    parallel: int = 1,
    on_done=None,
) -> dict[str, int]:
    """Trains the warm start each of ``runs`` starts from (its own --prepare_only, ``parallel``
    at once, logging to <root>/<run>/prepare.log; an interrupted warm start resumes from its
    progress), calling ``on_done(run, exit code)`` as each finishes; returns {run: exit code}."""
    sw = _sweep_module()
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    pending, active, codes = list(runs), {}, {}
    while pending or active:
        while pending and len(active) < max(1, parallel):
            run = pending.pop(0)
            wd = os.path.join(root, run["name"])
            os.makedirs(wd, exist_ok=True)
            log = open(os.path.join(wd, "prepare.log"), "a")  # noqa: SIM115 (closed below)
            cmd = sw.prepare_command(os.path.join(REPO, config), run, wd, flags)
            print(f"[claims] training {run['name']}'s warm start (log: {log.name})", flush=True)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            active[run["name"]] = (proc, log, time.time())
        time.sleep(2)
        for name, (proc, log, t0) in list(active.items()):
            if proc.poll() is None:
                continue
            log.close()
            codes[name] = proc.returncode
            del active[name]
            print(f"[claims] {name}'s warm start: rc={proc.returncode} in {time.time() - t0:.0f}s")
            if on_done is not None:
                on_done(next(r for r in runs if r["name"] == name), proc.returncode)
    return codes


def pack_warm_starts(
    sweep: Sweep,
    runs: list[dict],
    root: str,
    flags: Sequence[str],
    kept: str,
    parallel: int = 1,
) -> list[str]:
    """Round 3's warm starts (``sweep.keep`` "bfloat16"), made ready before any of ``runs``
    starts: one the cache lacks is unpacked from <kept>/<entry>.npz.xz or, kept nowhere, trained
    (train_warm_starts), rounded to bfloat16 and packed there as its training ends, so that every
    run of the design, on any machine, starts from the kept numbers. Returns the newly packed
    files. SystemExit, naming the fix, for a cache entry that differs from its kept file, one
    trained elsewhere and not rounded (runs may have started from its float32 values), or a
    training that failed."""
    store = _store_module()
    groups = warm_start_groups(sweep, runs, flags)  # {entry: its first run}

    def kept_file(entry: str) -> str:
        return os.path.join(kept, os.path.basename(entry) + store.SUFFIX)

    def cached(entry: str) -> bool:
        return os.path.exists(os.path.join(entry, "meta.json"))

    for entry in groups:
        if cached(entry) and os.path.exists(kept_file(entry)):
            if not store.verify(kept_file(entry), entry):
                raise SystemExit(
                    f"warm start {entry} differs from its kept copy {kept_file(entry)}: delete "
                    "the cache entry and rerun (the kept copy is restored into the cache)"
                )
        elif os.path.exists(kept_file(entry)):
            store.unpack(kept_file(entry), entry)
            print(f"[claims] warm start {os.path.basename(entry)}: the kept copy, restored")
        elif cached(entry) and not store.is_bfloat16(store.read_params(entry)):
            raise SystemExit(
                f"warm start {entry} was trained outside this launcher and is not rounded to "
                "bfloat16: if no run started from it, `python experiments/warmstart_store.py "
                "round` it, else delete it to train it here"
            )
    new = []

    def keep(entry: str) -> None:
        if cached(entry) and not os.path.exists(kept_file(entry)):
            new.append(store.pack(entry, kept, "bfloat16"))

    def rounded_and_kept(run: dict, rc: int) -> None:
        # at once, each as it finishes: a launcher stopped later leaves no unrounded entry
        entry = next(e for e, first in groups.items() if first is run)
        if rc == 0 and cached(entry):
            store.round_entry(entry)  # once, before any run starts from it
            keep(entry)

    missing = [e for e in groups if not cached(e)]
    codes = {}
    if missing:
        codes = train_warm_starts(
            sweep.config, [groups[e] for e in missing], root, flags, parallel, rounded_and_kept
        )
    for entry in groups:
        keep(entry)  # rounded before, and not kept yet
    failed = [name for name, rc in codes.items() if rc != 0]
    if failed:
        raise SystemExit(
            f"the warm starts of {failed} failed to train (logs: {root}/<run>/prepare.log); "
            "rerun to resume them"
        )
    return new


def run_sweeps(
    sweeps: Sequence[Sweep],
    runs_dir: str,
    *,
    seeds: int | None = None,
    parallel: int = 1,
    extra: Sequence[str] = (),
    only: str = "",
    population: bool = False,
    results_dir: str | None = None,
    warm_starts_only: bool = False,
) -> list[str]:
    """Launches every run of ``sweeps`` that has not finished (``only``: those whose names match
    one of its comma-separated patterns, in every sweep that has any), with FULL_FLAGS, the
    sweep's own flags and then ``extra`` (the later flag wins); returns the failed run names.
    ``warm_starts_only``: only the round-3 sweeps' warm starts (pack_warm_starts), no runs.
    ``population``: each arm's seeds (and arms a population varies) run as one population where
    the library runs one; other arms one process per run (experiments/sweep.py --population).
    ``results_dir``: a run whose record is in <results_dir>/<sweep> is not run again, and every
    finished run is recorded there (reporting/records.py) as it ends (record_finished; a
    population's members as its process ends), also when others failed or the sweep was
    stopped."""
    if warm_starts_only and not results_dir:
        raise ValueError("warm_starts_only keeps the warm starts under results_dir: pass one")
    if problem := unkept_warm_starts(sweeps, results_dir):
        raise ValueError(problem)
    sw = _sweep_module()
    rec = _records_module()
    failed = []
    for s in sweeps:
        root = os.path.join(runs_dir, s.name)
        runs = sweep_runs(s, seeds_of(s, seeds))
        if only:
            patterns = [p.strip() for p in only.split(",") if p.strip()]
            runs = [r for r in runs if any(fnmatch.fnmatch(r["name"], p) for p in patterns)]
            if not runs:
                continue
        flags = [*(FULL_FLAGS if s.laptop else ()), *s.flags, *extra]
        entries: list[str] = []
        if results_dir:
            kept = os.path.join(results_dir, s.name)
            recorded = [r for r in runs if os.path.exists(rec.path_of(kept, r["name"]))]
            runs = [r for r in runs if r not in recorded]
            print(f"[claims] sweep {s.name}: {len(recorded)} runs recorded in {kept} already")
            if not runs:
                continue
            if s.keep == "bfloat16":  # ready, rounded and kept before the first run
                kept_ws = os.path.join(results_dir, WARM_STARTS)
                for path in pack_warm_starts(s, runs, root, flags, kept_ws, parallel):
                    print(f"[claims] warm start kept: {path}")
                if warm_starts_only:
                    continue
            elif warm_starts_only:
                print(f"[claims] sweep {s.name}: its runs train and keep their warm starts")
                continue
            else:
                entries = warm_start_entries(s, runs, flags)
                for e in restore_warm_starts(entries, os.path.join(results_dir, WARM_STARTS)):
                    print(
                        f"[claims] warm start {os.path.basename(e)}: the committed copy, restored"
                    )
        if s.keep == "bfloat16":  # round 3: a draft's arms wait for its registration
            ready = registered_arms(s.name)  # (its warm starts above are made all the same)
            waiting = sorted({arm_of(r) for r in runs} - ready)
            if waiting:
                print(
                    f"[claims] sweep {s.name}: arms {waiting} wait for their entry's registration"
                )
            runs = [r for r in runs if arm_of(r) in ready]
            if not runs:
                continue
        print(f"[claims] sweep {s.name}: {len(runs)} runs in {root}", flush=True)
        # (population only when asked: a launcher without the option still runs a process per run)
        kw = {"population": True} if population else {}
        made_for = entry_hashes(s.name)  # the entries as the runs start (kept in their records)
        if results_dir:  # each run (a population's members) recorded as it ends (~1 CPU-hour)
            kw["on_end"] = functools.partial(
                record_finished, root, os.path.join(results_dir, s.name), made_for
            )
        try:
            codes = sw.launch(os.path.join(REPO, s.config), runs, root, parallel, flags, **kw)
        finally:
            if results_dir:  # what finished is kept, also when the sweep stopped half way
                new = rec.record_all(root, os.path.join(results_dir, s.name), made_for)
                print(f"[claims] sweep {s.name}: {len(new)} runs recorded in {results_dir}")
                for e in keep_warm_starts(entries, os.path.join(results_dir, WARM_STARTS)):
                    print(f"[claims] warm start kept: {e}")
        sw.write_tables(sw.collect(runs, root), root)
        failed += [f"{s.name}/{n}" for n, c in codes.items() if c != 0]
    return failed


def record_finished(
    root: str, records_dir: str, made_for: dict[str, str], name: str, code: int
) -> None:
    """The launcher's on_end: records run ``name`` under ``records_dir`` when it finished (exit 0
    and its summary written); the sweep's end records the rest again (unchanged bytes)."""
    rec = _records_module()
    wd = os.path.join(root, name)
    if code == 0 and rec.finished(wd):
        path = rec.write(wd, records_dir, made_for)
        print(f"[claims] {name}: recorded in {path}", flush=True)


def unkept_warm_starts(sweeps: Sequence[Sweep], results_dir: str | None) -> str | None:
    """The one-line refusal for round-3 sweeps launched without a results dir (None when fine):
    their runs must start from warm starts rounded to bfloat16 and kept under it, which a
    workdirs-only launch would skip, leaving runs from float32 numbers no kept file gives back."""
    rounded = [s.name for s in sweeps if s.keep == "bfloat16"]
    if rounded and not results_dir:
        return (
            f"sweeps {rounded} start from warm starts rounded and kept under --results_dir: "
            "pass one (e.g. --results_dir results/claims)"
        )
    return None


def arm_of(run: dict) -> str:
    """A run's arm: its name without the seed suffix (<arm>_s<seed>)."""
    return run["name"].rsplit("_s", 1)[0]


def registered_arms(sweep: str) -> set[str]:
    """The arms of ``sweep`` that a registered current entry runs ("<arm>: what it is" in its
    arms): a round-3 run is made only for an entry committed before it, so an arm only a draft
    names is not run until the draft is registered (registration_order would flag its runs)."""
    from gspo_jax import claims as reg

    current = [reg.current(k) for k in sorted({e.key for e in reg.ENTRIES})]
    return {a for e in current if sweep in e.sweeps for a in e.arm_names}


def entry_hashes(sweep: str) -> dict[str, str]:
    """{"<key> v<version>": hash} of the registry's current entries whose design runs ``sweep``:
    what its runs' records keep of the entries they were made for."""
    from gspo_jax import claims as reg

    current = [reg.current(k) for k in sorted({e.key for e in reg.ENTRIES})]
    return {e.name: reg.entry_hash(e) for e in current if sweep in e.sweeps}


def execute_notebook(name: str, runs_dir: str, *, timeout: int = 1800, out: str | None = None):
    """Executes notebooks/<name>.ipynb in the notebooks folder, reading runs under ``runs_dir``;
    writes the executed notebook to ``out`` (default: in place). Returns the notebook."""
    import nbclient
    import nbformat

    path = os.path.join(NOTEBOOK_DIR, name + ".ipynb")
    nb = nbformat.read(path, as_version=4)
    env_before = os.environ.get(RUNS_ENV)
    os.environ[RUNS_ENV] = os.path.abspath(runs_dir)  # the kernel inherits the environment
    try:
        client = nbclient.NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": NOTEBOOK_DIR}},
        )
        client.execute()
    finally:
        if env_before is None:
            os.environ.pop(RUNS_ENV, None)
        else:
            os.environ[RUNS_ENV] = env_before
    nbformat.write(nb, out or path)
    return nb


def verdict_keys(name: str) -> list[str]:
    """The registry claims whose verdicts the notebook ``name`` prints, one VERDICT line each:
    its own claim and every other claim whose current entry names it, once that claim's cells
    have come (it is not in PLANNED)."""
    from gspo_jax import claims as reg

    keys = {e.key for e in reg.ENTRIES}
    named = [k for k in sorted(keys) if reg.current(k).notebook == name and k not in PLANNED]
    own = notebook_key(name)
    return [own] + [k for k in named if k != own]


def notebook_key(name: str) -> str:
    """The registry key the notebook ``name`` is for: its name, or for round 3's testbed_<key>
    the key."""
    return name.removeprefix(ROUND3)


def verdict_lines(nb) -> list[str]:
    """The "VERDICT: ..." lines an executed notebook printed."""
    lines = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text = output.get("text", "")
            lines += [ln for ln in text.splitlines() if ln.startswith("VERDICT:")]
    return lines


def notebook_sweeps(p: argparse.ArgumentParser, args) -> list[Sweep] | None:
    """The sweeps the notebooks named on the command line read (None: --list printed them)."""
    every = args.notebooks in ([], ["all"])
    names = list(NOTEBOOKS) if every else args.notebooks
    if args.list:
        listed = [(n, sweeps_of([n], planned=False)) for n in names if n in NOTEBOOKS]
        planned = list(PLANNED) if every else [n for n in names if n in PLANNED]
        listed += [(f"{n} (planned)", sweeps_of([n])) for n in planned]
        for n, sweeps in listed:
            for s in sweeps:
                k = seeds_of(s, args.seeds)
                runs = [r["name"] for r in sweep_runs(s, k)]
                print(f"{n}: {s.name} ({s.config} --sweep {s.sweep_arg(k)}): {runs}")
        return None
    if not args.notebooks:
        p.error("name a notebook (or all); --list shows them")
    if not (args.runs_only or args.notebook_only) and any(n in PLANNED for n in names):
        p.error(
            f"{sorted(n for n in names if n in PLANNED)}: the current registry entry has no "
            "notebook cells yet: make its runs with --runs_only (--notebook_only executes the "
            "notebook on the runs it reads)"
        )
    if args.notebook_only and any(n not in NOTEBOOKS for n in names):
        p.error(f"no notebook for {[n for n in names if n not in NOTEBOOKS]}")
    return sweeps_of(names, planned=not every)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", help="notebook names (notebooks/<name>.ipynb) or all")
    p.add_argument("--runs_dir", default=os.path.join(REPO, "runs", "claims"))
    p.add_argument(
        "--results_dir",
        default=os.path.join(REPO, "results", "claims"),
        help="the finished runs' committed records (read by the notebooks; a recorded run is "
        "not run again); empty: workdirs only, the notebooks read --runs_dir",
    )
    p.add_argument("--seeds", type=int, default=None, help="default: each sweep's own, else 5")
    p.add_argument("--parallel", type=int, default=1, help="runs at once (each is a process)")
    p.add_argument("--runs_only", action="store_true", help="make the runs, do not execute")
    p.add_argument("--notebook_only", action="store_true", help="execute on the existing runs")
    p.add_argument("--list", action="store_true", help="print notebooks, sweeps and run names")
    p.add_argument("--only", default="", help="comma-separated fnmatch patterns of run names")
    p.add_argument(
        "--sweeps",
        default="",
        help="comma-separated sweep names (SWEEPS), instead of notebooks': their runs only",
    )
    p.add_argument(
        "--warm_starts_only",
        action="store_true",
        help="only train, round and keep the round-3 sweeps' warm starts (no runs)",
    )
    p.add_argument(
        "--population",
        default="true",
        help="true: each arm's seeds run as one population where the library runs one (a "
        "pipelined arm stays a process per run); false: a process per run",
    )
    args, extra = p.parse_known_args(argv)  # extra --config.x=y flags go to every run
    if args.sweeps or args.warm_starts_only:
        names = [n.strip() for n in args.sweeps.split(",") if n.strip()]
        unknown = [n for n in names if n not in SWEEPS]
        if unknown or args.notebooks or not names:
            p.error(
                f"--sweeps names sweeps (not notebooks), one of {sorted(SWEEPS)}; got {names}"
                + (f", notebooks {args.notebooks}" if args.notebooks else "")
            )
        if not args.results_dir:
            p.error("--sweeps and --warm_starts_only record under --results_dir: pass one")
        sweeps, notebooks = [SWEEPS[n] for n in names], []  # their runs only
    else:
        sweeps = notebook_sweeps(p, args)
        if sweeps is None:
            return 0  # --list
        notebooks = list(NOTEBOOKS) if args.notebooks == ["all"] else args.notebooks
    failed = []
    if not args.notebook_only:
        if problem := unkept_warm_starts(sweeps, args.results_dir):
            p.error(problem)
        t0 = time.time()
        failed = run_sweeps(
            sweeps,
            args.runs_dir,
            seeds=args.seeds,
            parallel=args.parallel,
            extra=extra,
            only=args.only,
            population=_sweep_module()._parse_bool(args.population),
            results_dir=args.results_dir or None,
            warm_starts_only=args.warm_starts_only,
        )
        print(f"[claims] runs done in {time.time() - t0:.0f}s; failed: {failed or 'none'}")
    if failed:
        print("[claims] not executing notebooks: rerun this command to resume the failed runs")
        return 1
    if not args.runs_only:
        for n in notebooks:
            t0 = time.time()
            nb = execute_notebook(n, args.results_dir or args.runs_dir)
            print(f"[claims] executed notebooks/{n}.ipynb in {time.time() - t0:.0f}s")
            for line in verdict_lines(nb):
                print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
