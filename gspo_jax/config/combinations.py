"""Which features of a run combine: the features, the pairs refused (each with its reason and
its fix), and ``check``, the one place a combination of features is refused.

    setting = combinations.Setting(moe=model_cfg.is_moe, processes=jax.process_count())
    combinations.check(config, setting)       # ConfigError: the refused pair's line
    combinations.refusal(config, setting)     # that line, or None
    combinations.on(config, setting)          # the keys of the features a run turns on

A feature is one row of FEATURES: what it is, the field that turns it on, and ``turn_on``, the
fields that turn it on at the smallest size with what it needs (partial rollouts need the
continuous engine, routing replay an MoE model), which the docs and the tests read. A refused
combination is one row of REFUSED. Everything not refused runs: tests/test_combinations.py runs
one RL step of every other pair, and docs/features.md is the table printed from these rows
(experiments/checks/combinations_table.py). The checks of one field's value (a bound below 0,
an unknown engine, partial rollouts without the continuous engine) stay with that field.

No array dimensions here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections

from gspo_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Setting:
    """What a run is beyond its config's fields: whether its model is MoE (the preset's or the
    checkpoint's experts) and how many processes run it."""

    moe: bool = False
    processes: int = 1


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature: its key (the table's), what it is, the field that turns it on (named in a
    refusal's line), whether ``config`` turns it on, and the fields that turn it on at the
    smallest size (``turn_on``; ``processes``: the processes it needs)."""

    key: str
    what: str
    field: str
    is_on: Callable[[ml_collections.ConfigDict, Setting], bool]
    turn_on: dict[str, Any]
    processes: int = 1


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return config


def _set(dotted: str) -> Callable[[ml_collections.ConfigDict, Setting], bool]:
    """A feature that is on when its field is truthy (not 0, "", False or ())."""
    return lambda config, setting: bool(_get(config, dotted))


# The features, in the table's order. rl.sync_every is the pipeline's own setting (it needs
# max_staleness), and rl.rollout_dtype / rollout_quant the rollout's numerics.
FEATURES: tuple[Feature, ...] = (
    Feature(
        "continuous",
        "the continuous rollout engine",
        "rl.rollout_engine",
        lambda c, s: c.rl.rollout_engine == "continuous",
        {"rl.rollout_engine": "continuous"},
    ),
    Feature(
        "partial",
        "partial rollouts",
        "rl.partial_rollout",
        _set("rl.partial_rollout"),
        {"rl.rollout_engine": "continuous", "rl.partial_rollout": 1},
    ),
    Feature(
        "pipeline",
        "the asynchronous pipeline",
        "rl.max_staleness",
        _set("rl.max_staleness"),
        {"rl.max_staleness": 1},
    ),
    Feature(
        "rollout_devices",
        "a rollout device group (pipelined)",
        "rollout.devices",
        lambda c, s: float(c.rollout.devices) != 0,
        {"rollout.devices": 1.0, "num_devices": 2},
    ),
    Feature("lora", "LoRA", "lora.rank", _set("lora.rank"), {"lora.rank": 4}),
    Feature(
        "qlora",
        "QLoRA (quantized base)",
        "lora.base_quant",
        _set("lora.base_quant"),
        {"lora.rank": 4, "lora.base_quant": "int8"},
    ),
    Feature(
        "rollout_quant",
        "rollout quantization",
        "rl.rollout_quant",
        _set("rl.rollout_quant"),
        {"rl.rollout_quant": "int8"},
    ),
    Feature(
        "rollout_dtype",
        "a rollout dtype",
        "rl.rollout_dtype",
        _set("rl.rollout_dtype"),
        {"rl.rollout_dtype": "bfloat16"},
    ),
    Feature(
        "moe",
        "an MoE model",
        "model.preset",
        lambda c, s: s.moe,
        {"model.preset": "tiny_moe"},
    ),
    Feature(
        "routing_replay",
        "MoE routing replay",
        "rl.routing_replay",
        _set("rl.routing_replay"),
        {"model.preset": "tiny_moe", "rl.routing_replay": True},
    ),
    Feature(
        "route_change",
        "the MoE route-change log",
        "rl.log_route_change",
        _set("rl.log_route_change"),
        {"model.preset": "tiny_moe", "rl.log_route_change": True},
    ),
    Feature(
        "dynamic_sampling",
        "dynamic sampling",
        "rl.dynamic_sampling",
        _set("rl.dynamic_sampling"),
        {"rl.dynamic_sampling": True},
    ),
    Feature(
        "token_advantages",
        "token advantages",
        "rl.token_advantages",
        _set("rl.token_advantages"),
        {"objective.name": "gspo_token", "rl.token_advantages": True},
    ),
    Feature(
        "recompute_old_logp",
        "old log-probs recomputed by the trainer",
        "rl.recompute_old_logp",
        _set("rl.recompute_old_logp"),
        {"rl.recompute_old_logp": True},
    ),
    Feature(
        "remat",
        "rematerialisation",
        "model.remat",
        lambda c, s: c.model.remat != "none",
        {"model.remat": "full"},
    ),
    Feature(
        "population",
        "a population",
        "population.seeds",
        _set("population.seeds"),
        {"population.seeds": (0, 1)},
    ),
    Feature(
        "environment",
        "a multi-turn environment with tools",
        "env.name",
        _set("env.name"),
        {"env.name": "python"},
    ),
    Feature(
        "multiprocess",
        "a multi-process run",
        "",
        lambda c, s: s.processes > 1,
        {},
        processes=2,
    ),
)
BY_KEY = {f.key: f for f in FEATURES}


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A refused pair of features (keys of FEATURES): why it does not run, and the fix."""

    features: tuple[str, str]
    why: str
    fix: str


_UNPIPELINE = "set config.rl.max_staleness=0 and config.rollout.devices=0"
_NO_PARTIAL = "set config.rl.partial_rollout=0"
_DRAWS = "dynamic sampling draws a data-dependent number of batches per step"

# The refused pairs, each one row. A pipelined run (a staleness bound or a rollout device group)
# refuses the same partners under either of its two fields.
REFUSED: tuple[Refusal, ...] = (
    *(
        Refusal((pipelined, partner), why, _UNPIPELINE)
        for pipelined in ("pipeline", "rollout_devices")
        for partner, why in (
            ("dynamic_sampling", f"the asynchronous pipeline starts rollouts ahead, but {_DRAWS}"),
            ("partial", "partial rollouts carry rows between steps (not yet pipelined)"),
            (
                "population",
                "the pipeline's rollouts run ahead of one run's update (not built "
                "for a population's members)",
            ),
        )
    ),
    Refusal(
        ("rollout_devices", "multiprocess"),
        "each process would need rollout devices of its own (rollout.devices=0 pipelines a "
        "pod run on its one mesh)",
        "set config.rollout.devices=0",
    ),
    Refusal(("partial", "dynamic_sampling"), _DRAWS, _NO_PARTIAL),
    Refusal(
        ("partial", "routing_replay"),
        "routing replay replays routes, which a continued row's new prefill changes",
        _NO_PARTIAL,
    ),
    Refusal(
        ("partial", "route_change"),
        "the route-change log compares the rollout's routes, which a new prefill changes",
        _NO_PARTIAL,
    ),
    Refusal(
        ("partial", "population"),
        "the carried rows are one run's queue (not built for a population's members)",
        _NO_PARTIAL,
    ),
    Refusal(
        ("partial", "multiprocess"),
        "the carried rows are host state of one process",
        f"{_NO_PARTIAL} for a multi-host run",
    ),
    # an MoE model's QLoRA stopped at its first step (an UnexpectedTracerError on the int8
    # experts); the MoE options name the pair first, as they turn the MoE model on
    *(
        Refusal(
            ("qlora", moe),
            "the quantized base of an MoE model's experts is not built (its int8 expert "
            "weights escape a traced function)",
            "set config.lora.base_quant='' (LoRA on the float base) or use a dense preset",
        )
        for moe in ("routing_replay", "route_change", "moe")
    ),
    Refusal(
        ("population", "dynamic_sampling"),
        f"{_DRAWS} per member, and a population runs one batch per member per step",
        "set config.rl.dynamic_sampling=False",
    ),
    # a multi-turn run's rows come from rollout/multi_turn.py's engines, one run's episodes on
    # one host, without routes (rl/episodes.py)
    *(
        Refusal((partner, "environment"), why, "set config.env.name='' (one turn)")
        for partner, why in (
            ("pipeline", "the pipeline's rollout thread samples one-turn rows"),
            ("rollout_devices", "the pipeline's rollout thread samples one-turn rows"),
            ("partial", "the carried rows are one turn's"),
            ("population", "a population's rollout is one program of one-turn rows"),
            ("dynamic_sampling", "its extra generation batches are one-turn rows"),
            ("routing_replay", "the multi-turn engines return no routes"),
            ("route_change", "the multi-turn engines return no routes"),
        )
    ),
    Refusal(
        ("environment", "multiprocess"),
        "the episodes' tools run on one host",
        "set config.env.name='' (one turn) for a multi-host run",
    ),
    Refusal(
        ("population", "multiprocess"),
        "a population's member axis spreads over one process's devices",
        "run a multi-host job without config.population.seeds",
    ),
)


def on(config: ml_collections.ConfigDict, setting: Setting) -> list[str]:
    """The keys of the features ``config`` (in ``setting``) turns on, in FEATURES' order."""
    return [f.key for f in FEATURES if f.is_on(config, setting)]


def named(feature: Feature, config: ml_collections.ConfigDict) -> str:
    """A feature as a refusal's line names it: what it is, and its field with its value."""
    if not feature.field:
        return feature.what
    return f"{feature.what} (config.{feature.field}={_get(config, feature.field)!r})"


def line(refused: Refusal, config: ml_collections.ConfigDict) -> str:
    """The one-line ConfigError of a refused pair, naming both fields, the reason and the fix."""
    a, b = (named(BY_KEY[k], config) for k in refused.features)
    return f"{a} does not run with {b}: {refused.why}; {refused.fix}"


def refusal(config: ml_collections.ConfigDict, setting: Setting) -> str | None:
    """The line of the first refused pair among the features ``config`` turns on, or None."""
    keys = set(on(config, setting))
    for r in REFUSED:
        if set(r.features) <= keys:
            return line(r, config)
    return None


def check(config: ml_collections.ConfigDict, setting: Setting) -> None:
    """Raises the table's ConfigError when ``config`` turns on a refused pair of features."""
    why = refusal(config, setting)
    if why is not None:
        raise ConfigError(why)
