"""What a run is, said in one line at its start, and what the config files accept.

    features.differences(config)  # [("rollout engine", "continuous", "rl.rollout_engine"), ...]
    features.describe(config)     # "features: objective gspo, ...; LoRA rank 4 (lora.rank)"
    features.list_configs("configs")  # per config file: its first sentence and arguments

A plain run (the default engine, synchronous, full fine-tuning, no quantization, one run) and a
run with the continuous engine, LoRA or a staleness bound would otherwise print the same
progress: ``describe`` names every feature whose field differs from default_config(), so the
first line of a run says what ran. main.py prints it, and --list_configs prints list_configs.
No array dimensions here.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import ml_collections

from gspo_jax.config import args as args_lib
from gspo_jax.config import population
from gspo_jax.config.schema import default_config
from gspo_jax.errors import ConfigError

# (dotted field, what it is): the features a config turns on with one line (the README's
# feature table), in the order they are printed.
FEATURES: tuple[tuple[str, str], ...] = (
    ("env.name", "environment (multi-turn, tools)"),
    ("rl.rollout_engine", "rollout engine"),
    ("rl.partial_rollout", "partial rollouts (prompt batches carried)"),
    ("rl.max_staleness", "staleness bound (policy versions)"),
    ("rl.sync_every", "weight sync every (steps)"),
    ("rollout.devices", "rollout devices"),
    ("lora.rank", "LoRA rank"),
    ("lora.base_quant", "QLoRA base quantization"),
    ("rl.rollout_quant", "rollout quantization"),
    ("rl.rollout_dtype", "rollout dtype"),
    ("rl.routing_replay", "MoE routing replay"),
    ("rl.dynamic_sampling", "dynamic sampling"),
    ("rl.token_advantages", "token advantages"),
    ("rl.recompute_old_logp", "old log-probs recomputed by the trainer"),
    ("model.remat", "rematerialisation"),
)


def _get(cfg: ml_collections.ConfigDict, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


def differences(config: ml_collections.ConfigDict) -> list[tuple[str, Any, str]]:
    """(what, value, dotted field) for every FEATURES field whose value differs from
    default_config()'s, then the population's size when the config is a population."""
    default = default_config()
    out = [
        (what, _get(config, field), field)
        for field, what in FEATURES
        if _get(config, field) != _get(default, field)
    ]
    if population.is_population(config):
        members = len(population.members(config))
        out.append(("population members", members, "population.seeds, population.vary"))
    return out


def describe(config: ml_collections.ConfigDict) -> str:
    """One line: the objective, then the features that differ from the plain default."""
    found = differences(config)
    head = f"features: objective {config.objective.name}, model {config.model.preset}; "
    if not found:
        return head + "plain default (static engine, synchronous, full fine-tuning, one run)"
    return head + "; ".join(f"{what} {value} ({field})" for what, value, field in found)


def list_configs(folder: str) -> str:
    """Every config file in ``folder``: its name, the first sentence of its docstring and its
    arguments with their defaults (``--config=<file>:key=value,...``)."""
    paths = sorted(glob.glob(os.path.join(folder, "*.py")))
    if not paths:
        raise ConfigError(
            f"no config files in {folder}: --list_configs reads a checkout's configs/ folder "
            "(pip install -e . from the repository)"
        )
    blocks = []
    for path in paths:
        module = args_lib.import_config_module(path)
        first = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
        arguments = args_lib.arguments_of(module.get_config)
        listed = ", ".join(f"{k}={v!r}" for k, v in arguments.items()) or "none"
        # the first sentence: a period then a space ends it, except after an abbreviation ("Dr.")
        sentence = re.split(r"(?<!\bDr)\.\s", first)[0].rstrip(".")
        name = os.path.join(os.path.basename(os.path.normpath(folder)), os.path.basename(path))
        blocks.append(f"{name}: {sentence}\n    arguments: {listed}")
    return "\n".join(blocks)
