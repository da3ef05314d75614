"""Round 3's precondition pilot (issue 52, item 5): each draft's mechanism preconditions, harm
and primary statistic on runs of its arms from the pilot's own draws, before it is registered.

    python experiments/sweep.py --config configs/testbed.py \\
        --sweep study=r3_minibatch,pilot,draws=2 --workdir runs/r3_pilot/r3_minibatch
    python experiments/round3_pilot.py --runs runs/r3_pilot [--key gspo_minibatch_stability] \\
        [--plot runs/r3_pilot/plots]

``--runs`` holds one folder per round-3 sweep (as experiments/claims.py lays out its runs), of run
folders or their records (notebooks/reporting/records.py; the pilot's committed ones are in
results/pilots/r3_lr<rate>/). For every round-3 entry with runs there (the family's registered
entries, then the drafts), per draw: each precondition's and the harm's value against its threshold
(the statistics the verdict will read, notebooks/reporting/round3.py), the primary statistic (a
comparison's per-draw difference), and its spread over the draws: what the thresholds marked
"calibrate" and the power's sd are read from. Unfinished runs are left out unless ``--unfinished``
(their statistics over the steps they have). ``--plot DIR`` draws, per entry, the held-out accuracy
of the arms it reads (greedy solid, sampled dashed), one panel per draw: <DIR>/<key>.png. Nothing
here is a verdict: the pilot's draws are never a claim's.

This file holds launcher logic only; no library code (docs/design.md "Layout").
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "notebooks")]


def _passes(value: float, direction: str, threshold: float) -> bool:
    return math.isfinite(value) and (value > threshold if direction == ">" else value < threshold)


def _line(name: str, arm: str, direction: str, threshold: float, per_seed: dict) -> str:
    cells = [
        f"d{s} {v:.4g} {'ok' if _passes(v, direction, threshold) else 'NO'}"
        for s, v in sorted(per_seed.items())
    ]
    return f"  {name} [{arm} {direction} {threshold:g}]: " + (", ".join(cells) or "no runs")


def primary_per_draw(entry, values: dict) -> dict[int, float]:
    """The primary statistic per draw: a two-arm comparison's difference (first arm minus
    second), else the one arm's value (a level, or a pair's own statistic)."""
    arms = list(entry.primary.arms)
    if len(arms) == 2:
        a, b = values[arms[0]], values[arms[1]]
        return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}
    return dict(values[arms[0]])


def report(entry, arms: dict) -> list[str]:
    from reporting import round3

    values, pre = round3.inputs(entry, arms)
    lines = [f"{entry.name}: {entry.claim}"]
    for p in entry.preconditions:
        lines.append(_line(p.name, p.arm, p.direction, p.threshold, pre[p.name]))
    if entry.harm is not None:
        h = entry.harm
        lines.append(_line(f"harm: {h.name}", h.arm, h.direction, h.threshold, pre[h.name]))
    per_draw = primary_per_draw(entry, values)
    finite = [v for v in per_draw.values() if math.isfinite(v)]
    spread = (
        f"; mean {np.mean(finite):.4g}, sd {np.std(finite, ddof=1):.4g} over {len(finite)} draws"
        if len(finite) > 1
        else ""
    )
    c = entry.primary
    cells = ", ".join(f"d{s} {v:.4g}" for s, v in sorted(per_draw.items())) or "no runs"
    lines.append(
        f"  primary [{' vs '.join(c.arms)} {c.direction} {c.threshold:g}]: {cells}{spread}"
    )
    return lines


CURVES = (("eval/greedy_accuracy", "-"), ("eval/sample_accuracy", "--"))


def entry_arms(entry) -> list[str]:
    """The arms the entry reads: its primary's, then its preconditions' and harm's."""
    named = [*entry.primary.arms, *(p.arm for p in entry.preconditions)]
    if entry.harm is not None:
        named.append(entry.harm.arm)
    return list(dict.fromkeys(named))


def curves(entry, arms: dict):
    """The entry's arms' held-out accuracy, one panel per draw (greedy solid, sampled dashed):
    a matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from reporting import analysis

    names = [a for a in entry_arms(entry) if a in arms]
    draws = sorted({r.seed for a in names for r in arms[a]})
    fig, axes = plt.subplots(
        1, len(draws), figsize=(4.5 * len(draws), 3.4), squeeze=False, sharey=True
    )
    for ax, d in zip(axes[0], draws, strict=True):
        for i, a in enumerate(names):
            for run in (r for r in arms[a] if r.seed == d):
                for key, style in CURVES:
                    if not any(key in r for r in run.records):
                        continue  # (a run without sampled evaluations)
                    steps, values = analysis.series(run, key)
                    label = a if key == CURVES[0][0] else None
                    ax.plot(steps, values, style, color=f"C{i}", label=label)
        ax.set_title(f"draw {d}")
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy (greedy -, sampled --)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(entry.name, fontsize=10)
    fig.tight_layout()
    return fig


def plot(entry, arms: dict, path: str) -> str:
    """curves() saved as ``path``; returns it."""
    import matplotlib.pyplot as plt

    fig = curves(entry, arms)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


FAMILY = "testbed_round3"


def round3_entries() -> list:
    """Round 3's designs: the family's registered entries (whose thresholds the pilot set),
    then the drafts still to register, key order within each."""
    from gspo_jax import claims

    registered = sorted(claims.family_entries(FAMILY), key=lambda e: e.key)
    return registered + [d for d in claims.drafts() if d.family == FAMILY]


def main(argv=None) -> int:
    from reporting import analysis

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", required=True, help="a folder of round-3 sweep folders")
    ap.add_argument("--key", default="", help="one entry (default: every entry with runs)")
    ap.add_argument("--unfinished", action="store_true", help="count runs still going")
    ap.add_argument("--plot", default="", help="a folder for each entry's curves, <key>.png")
    a = ap.parse_args(argv)
    every = round3_entries()
    chosen = [d for d in every if not a.key or d.key == a.key]
    if not chosen:
        raise SystemExit(f"no round-3 entry named {a.key!r}; entries: {[d.key for d in every]}")
    shown = 0
    for d in chosen:
        runs = {}
        for sweep in d.sweeps:
            folder = os.path.join(a.runs, sweep)
            if glob.glob(os.path.join(folder, "*", "config.json")) or glob.glob(
                os.path.join(folder, "*.json.gz")
            ):  # run folders, or their committed records
                found = analysis.load_runs(folder, finished=False)
                runs.update(
                    {k: r for k, r in found.items() if a.unfinished or r.summary is not None}
                )
        if not runs:
            continue
        by_arm = analysis.by_arm(runs)
        print("\n".join(report(d, by_arm)) + "\n")
        if a.plot:
            print(f"  curves: {plot(d, by_arm, os.path.join(a.plot, d.key + '.png'))}\n")
        shown += 1
    if not shown:
        print(f"no runs of any entry's sweeps under {a.runs} (folders named as the sweeps: r3_*)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
