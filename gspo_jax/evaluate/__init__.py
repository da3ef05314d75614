"""Evaluate any checkpoint the way papers report it: ``python -m gspo_jax.evaluate``
(__main__.py: the command and its flags; docs/evaluation.md).

args.py (the arguments checked before any model is loaded), sources.py (what is evaluated: a
run's checkpoint, an HF folder, a config's base; on which task), problems.py (per-problem
results through the rollout seam, resumable from a side file), report.py (the figures of
eval_figures, the JSON, the table, the pass@k plot).
"""

from gspo_jax.evaluate.args import check_out, make_mesh, parse_knobs, parse_ks
from gspo_jax.evaluate.problems import (
    Settings,
    read_side_file,
    sample_problems,
    side_file,
    write_side_file,
)
from gspo_jax.evaluate.report import difference, format_table, plot_pass_at_k, summary
from gspo_jax.evaluate.sources import Source, check_data, load_model, make_task, resolve_source

__all__ = [
    "Settings",
    "Source",
    "check_data",
    "check_out",
    "difference",
    "format_table",
    "load_model",
    "make_mesh",
    "make_task",
    "parse_knobs",
    "parse_ks",
    "plot_pass_at_k",
    "read_side_file",
    "resolve_source",
    "sample_problems",
    "side_file",
    "summary",
    "write_side_file",
]
