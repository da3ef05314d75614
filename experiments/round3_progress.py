"""Round 3's progress, design by design: what is recorded, what is kept, what is left.

    PYTHONPATH=. python experiments/round3_progress.py                    # results/claims
    PYTHONPATH=. python experiments/round3_progress.py --runs_dir /scratch/r3_claims

Round 3 (issue 52) is tens of CPU hours made over many sessions and machines, each resuming
where the last stopped (experiments/claims.py). For every design of the family testbed_round3,
registered or drafted (gspo_jax/claims/entries/), this prints: its runs (the arms it names x its
draws, in the sweeps it reads) recorded under --results_dir, those in progress under --runs_dir
(started, not finished: the step they reached), its draws' warm starts kept
(<results_dir>/warmstart/<entry>.npz.xz), the RL CPU hours its recorded runs took (each record's
``rl_cpu_s``) and what its remaining runs would take at their arm's recorded mean ("?" for an arm
with no recorded run: no figure is guessed). A run two designs share (an arm two entries read) is
counted in each, and once in the total.

    PYTHONPATH=. python experiments/round3_progress.py --finals        # where each draw ended

``--finals`` prints, for each design with a recorded run, one row per draw: its warm start's
held-out accuracy (greedy / sampled, as every arm's record reads it at step 0) and each arm's final
greedy accuracy, from the records alone: the figures docs quote come from here, not from a log.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY = "testbed_round3"


def _claims_launcher():
    sys.path.insert(0, os.path.join(REPO, "experiments"))
    try:
        import claims  # experiments/claims.py: the sweeps and their runs
    finally:
        sys.path.pop(0)
    return claims


def design_runs(entry, launcher) -> list[tuple[str, dict]]:
    """(sweep, run) for every run ``entry`` reads: each arm it names ("<arm>: what it is") from
    each of its draws, in each of its sweeps."""
    out = []
    for name in entry.sweeps:
        sweep = launcher.SWEEPS[name]
        for run in launcher.sweep_runs(sweep, launcher.seeds_of(sweep)):
            if launcher.arm_of(run) in entry.arm_names and run["overrides"]["seed"] in entry.draws:
                out.append((name, run))
    return out


def family_designs(family: str) -> list[tuple[object, str]]:
    """(entry, status) for every design of ``family``: its registered entries ("v<N>"), then its
    drafts ("draft v<N>"), in key order."""
    from gspo_jax import claims as reg

    designs = [(e, f"v{e.version}") for e in reg.family_entries(family)]
    return designs + [(d, f"draft v{d.version}") for d in reg.drafts() if d.family == family]


def _last_step(workdir: str) -> int | None:
    """The last step a started, unfinished run logged (None: not started, or finished)."""
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(os.path.join(workdir, "summary.json")) or not os.path.exists(metrics):
        return None
    last = None
    with open(metrics) as f:
        for line in f:
            if line.strip():
                last = line
    return json.loads(last)["step"] if last else 0


def _summary(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)["summary"]


def _rl_cpu_s(path: str) -> float | None:
    return _summary(path).get("rl_cpu_s")


def pilot_costs(folders) -> dict[tuple[str, str], list[float]]:
    """{(sweep, arm): the RL CPU-s of each run recorded for it} under each of ``folders``
    (<folder>/<sweep>/<arm>_s<draw>.json.gz: a pilot's records, the same arms on other draws)."""
    launcher = _claims_launcher()
    out: dict[tuple[str, str], list[float]] = {}
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "*", "*.json.gz"))):
            name = os.path.basename(path)[: -len(".json.gz")]
            sweep = os.path.basename(os.path.dirname(path))
            if (cpu_s := _rl_cpu_s(path)) is not None:
                out.setdefault((sweep, launcher.arm_of({"name": name})), []).append(cpu_s)
    return out


def progress(
    results_dir: str, runs_dir: str | None = None, family: str = FAMILY, priced_by=()
) -> list[dict]:
    """One row per design of ``family`` (registered entries first, then drafts, key order) and a
    last row "all" over the distinct runs: runs, recorded, in_progress ({run: step}),
    warm_starts, kept, cpu_h (recorded), left_h (None where an arm has no run to price it by),
    unpriced (the arms with none). ``priced_by``: folders of other records of the same arms (the
    pilots') whose costs count in an arm's mean, not among its recorded runs."""
    launcher = _claims_launcher()
    designs = family_designs(family)
    kept_dir = os.path.join(results_dir, launcher.WARM_STARTS)
    pilots = pilot_costs(priced_by)
    seen: dict[tuple[str, str], dict] = {}  # (sweep, run): its facts, once per run
    entries_kept: dict[str, bool] = {}  # warm-start entry name: kept

    def facts(sweep: str, run: dict) -> dict:
        key = (sweep, run["name"])
        if key not in seen:
            record = os.path.join(results_dir, sweep, run["name"] + ".json.gz")
            recorded = os.path.exists(record)
            step = None
            if runs_dir and not recorded:
                step = _last_step(os.path.join(runs_dir, sweep, run["name"]))
            seen[key] = dict(
                name=run["name"],
                arm=(sweep, launcher.arm_of(run)),
                recorded=recorded,
                cpu_s=_rl_cpu_s(record) if recorded else None,
                step=step,
            )
        return seen[key]

    def warm_starts(runs: list[tuple[str, dict]]) -> set[str]:
        names = set()
        for sweep in dict.fromkeys(s for s, _ in runs):
            s = launcher.SWEEPS[sweep]
            flags = [*(launcher.FULL_FLAGS if s.laptop else ()), *s.flags]
            group = launcher.warm_start_groups(s, [r for w, r in runs if w == sweep], flags)
            names |= {os.path.basename(e) for e in group}
        for n in names - set(entries_kept):
            entries_kept[n] = os.path.exists(os.path.join(kept_dir, n + ".npz.xz"))
        return names

    def row(key: str, status: str, runs: list[tuple[str, dict]]) -> dict:
        f = [facts(s, r) for s, r in runs]
        left = [x["arm"] for x in f if not x["recorded"]]
        unpriced = sorted({f"{s}/{a}" for s, a in left if (s, a) not in by_arm})
        names = warm_starts(runs)
        return dict(
            key=key,
            status=status,
            runs=len(f),
            recorded=sum(x["recorded"] for x in f),
            in_progress={x["name"]: x["step"] for x in f if x["step"] is not None},
            warm_starts=len(names),
            kept=sum(entries_kept[n] for n in names),
            cpu_h=sum(x["cpu_s"] or 0.0 for x in f) / 3600,
            left_h=None if unpriced else sum(sum(by_arm[a]) / len(by_arm[a]) for a in left) / 3600,
            unpriced=unpriced,
        )

    rows, every = [], {}
    for entry, status in designs:
        runs = design_runs(entry, launcher)
        rows.append((entry.key, status, runs))
        every.update({(s, r["name"]): (s, r) for s, r in runs})
    for _, _, runs in rows:  # read every record first: an arm's mean is over all its runs
        for s, r in runs:
            facts(s, r)
    by_arm = {arm: list(costs) for arm, costs in pilots.items()}  # (sweep, arm): RL CPU-s each
    for x in seen.values():
        if x["cpu_s"] is not None:
            by_arm.setdefault(x["arm"], []).append(x["cpu_s"])
    out = [row(*r) for r in rows]
    out.append(row("all", f"{len(rows)} designs", list(every.values())))
    return out


def format_table(rows: list[dict]) -> str:
    head = "| design | entry | runs recorded | in progress | warm starts kept | RL CPU-h | left |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join(f"{n} at {s}" for n, s in sorted(r["in_progress"].items()))
        left = "?" if r["left_h"] is None else f"{r['left_h']:.1f}"
        if r["unpriced"]:
            n = len(r["unpriced"])
            left += f" ({n} arm{'' if n == 1 else 's'} not run yet)"
        lines.append(
            f"| {r['key']} | {r['status']} | {r['recorded']}/{r['runs']} | {steps or '-'} | "
            f"{r['kept']}/{r['warm_starts']} | {r['cpu_h']:.1f} | {left} |"
        )
    return "\n".join(lines)


def finals(results_dir: str, family: str = FAMILY) -> list[dict]:
    """One dict per design of ``family`` with a recorded run (registered entries, then drafts):
    key, arms (its arm names) and draws {draw: {"base": (greedy, sampled), arm: final greedy}},
    the arms not yet recorded on a draw absent from it."""
    launcher = _claims_launcher()
    out = []
    for entry, _ in family_designs(family):
        draws: dict[int, dict] = {}
        for sweep, run in design_runs(entry, launcher):
            record = os.path.join(results_dir, sweep, run["name"] + ".json.gz")
            if not os.path.exists(record):
                continue
            s = _summary(record)
            row = draws.setdefault(run["overrides"]["seed"], {})
            row.setdefault("base", (s["base"]["greedy_accuracy"], s["base"]["sample_accuracy"]))
            row[launcher.arm_of(run)] = s["final"]["greedy_accuracy"]
        if draws:
            out.append(dict(key=entry.key, arms=entry.arm_names, draws=dict(sorted(draws.items()))))
    return out


def format_finals(designs: list[dict]) -> str:
    """A markdown table per design: draw, base greedy / sampled, each arm's final greedy ("-":
    not recorded yet)."""
    blocks = []
    for d in designs:
        lines = [
            f"{d['key']}: {len(d['draws'])} draw(s) with a recorded run",
            "",
            "| draw | base greedy / sampled | " + " | ".join(d["arms"]) + " |",
            "|---|---|" + "---|" * len(d["arms"]),
        ]
        for draw, row in d["draws"].items():
            cells = ["-" if a not in row else f"{row[a]:.3f}" for a in d["arms"]]
            base = "{:.3f} / {:.3f}".format(*row["base"])
            lines.append(f"| {draw} | {base} | " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results_dir", default=os.path.join(REPO, "results", "claims"))
    p.add_argument("--runs_dir", default=None, help="where unfinished runs resume (claims.py's)")
    p.add_argument("--family", default=FAMILY)
    p.add_argument(
        "--priced_by",
        action="append",
        default=[],
        help="a folder of other records of the same arms (e.g. results/pilots/r3_lr0.0002) whose "
        "RL CPU-s also price the runs left; repeatable",
    )
    p.add_argument(
        "--finals",
        action="store_true",
        help="each design's draws: base accuracy and each arm's final greedy accuracy",
    )
    args = p.parse_args(argv)
    if args.finals:
        print(format_finals(finals(args.results_dir, args.family)))
        return 0
    print(format_table(progress(args.results_dir, args.runs_dir, args.family, args.priced_by)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
