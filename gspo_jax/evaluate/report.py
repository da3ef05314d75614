"""The figures of per-problem results (eval_figures), and how they are shown: the JSON's
layout, the terminal table and the pass@k plot.

Dimension legend: P problems, n samples per problem, k of pass@k.
"""

from __future__ import annotations

from typing import Any

from gspo_jax import eval_figures


def problem_values(results: dict[str, Any], ks) -> dict[str, Any]:
    """eval_figures' per-problem values of sample_problems' results."""
    return eval_figures.per_problem(
        results["greedy_correct"],
        results["sample_correct"],
        ks,
        greedy_length=results["greedy_length"],
        sample_length=results["sample_length"],
    )


def summary(results: dict[str, Any], ks, label: str, **interval_args) -> dict[str, Any]:
    """One checkpoint's figures, intervals and per-difficulty rows (the JSON's layout)."""
    values = problem_values(results, ks)
    return dict(
        checkpoint=label,
        num_problems=int(len(results["greedy_correct"])),
        samples=int(results["sample_correct"].shape[1]),
        **eval_figures.aggregate(values),
        intervals={k: list(v) for k, v in eval_figures.intervals(values, **interval_args).items()},
        by_difficulty=eval_figures.by_level(values, results["level"], **interval_args),
    )


def difference(a: dict[str, Any], b: dict[str, Any], ks, **interval_args) -> dict[str, Any]:
    """b minus a per figure with its paired interval: {figure: {"value", "interval"}}."""
    pairs = eval_figures.paired(problem_values(a, ks), problem_values(b, ks), **interval_args)
    return {k: dict(value=d, interval=[lo, hi]) for k, (d, lo, hi) in pairs.items()}


def figure_names(result: dict[str, Any]) -> list[str]:
    """The figures of a report in reading order."""
    return [k for k in result["intervals"] if not k.startswith("_")]


def format_table(result: dict[str, Any]) -> str:
    """The terminal table: one row per figure, a column per checkpoint (value [interval]), the
    difference column with --compare, then the per-difficulty rows of each checkpoint."""
    reports = [result] + ([result["compare"]] if "compare" in result else [])
    names = figure_names(result)
    head = ["figure"] + [r["checkpoint"] for r in reports]
    if "difference" in result:
        head.append("difference")
    rows = [head]
    for name in names:
        row = [name]
        for r in reports:
            lo, hi = r["intervals"][name]
            row.append(f"{r[name]:.3f} [{lo:.3f}, {hi:.3f}]")
        if "difference" in result:
            d = result["difference"][name]
            lo, hi = d["interval"]
            row.append(f"{d['value']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        rows.append(row)
    lines = [f"{result['num_problems']} problems, {result['samples']} samples each"]
    lines += _aligned(rows)
    for r in reports:
        if r["by_difficulty"]:
            lines.append(f"\nby difficulty ({r['checkpoint']}):")
            rows = [["level", "problems"] + names]
            for level, row in r["by_difficulty"].items():
                f = row["figures"]
                rows.append([level, str(row["num_problems"])] + [f"{f[k]:.3f}" for k in names])
            lines += _aligned(rows)
    return "\n".join(lines)


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def plot_pass_at_k(result: dict[str, Any], ks, path: str) -> None:
    """pass@k against k (log2 axis), one line per checkpoint, the intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in [result] + ([result["compare"]] if "compare" in result else []):
        ys = [r[f"pass@{k}"] for k in ks]
        lo = [y - r["intervals"][f"pass@{k}"][0] for y, k in zip(ys, ks, strict=True)]
        hi = [r["intervals"][f"pass@{k}"][1] - y for y, k in zip(ys, ks, strict=True)]
        ax.errorbar(ks, ys, yerr=[lo, hi], marker="o", capsize=3, label=r["checkpoint"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ks), [str(k) for k in ks])
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"pass@k, {result['num_problems']} problems, n = {result['samples']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_tools(label: str, figures: dict) -> str:
    """One line of the tool-use figures (rl/evaluation.py evaluate_tools) of checkpoint label."""
    return (
        f"{label} with the tool: accuracy {figures['tool_accuracy']:.3f}, "
        f"tool calls {figures['tool_calls_per_episode']:.2f} "
        f"(failed {figures['failed_calls_per_episode']:.2f}) and turns "
        f"{figures['turns_per_episode']:.2f} per episode, episodes with a call "
        f"{figures['tool_call_rate']:.3f} (accuracy {figures['tool_accuracy_with_call']:.3f}; "
        f"without a call {figures['tool_accuracy_without_call']:.3f})"
    )
