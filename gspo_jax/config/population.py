"""A population's members from config.population: each member is an ordinary run's config (its
seed, its values of the varied fields), checked here before anything is traced.

    members = population.members(config)       # [] when config.population.seeds is empty
    members[0].name, members[0].seed, members[0].values, members[0].config

The member configs are what a single run of that member would be given (no population fields, no
member mesh axis): rl/population.py builds one Run from the population's config with the first
member's seed and values (every member has the same shapes and program structure) and passes each
member's seed and values as arrays on the member axis.

No array dimensions here.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from typing import Any

import ml_collections

from gspo_jax.config.args import flatten, set_field
from gspo_jax.config.schema import POPULATION_FIELDS
from gspo_jax.errors import ConfigError

MODES = ("product", "zip")
BATCHING = ("auto", "vmap", "map")
# Why the other numeric fields one might vary are refused (one line each, naming the field).
REFUSED = {
    "seed": "members' seeds are config.population.seeds",
}


@dataclasses.dataclass(frozen=True)
class Member:
    """One run of the population: its name (its folder under WORKDIR/members/), its seed, its
    values of the varied fields (dotted keys) and the config a single run of it would take."""

    name: str
    seed: int
    values: dict[str, float]
    config: ml_collections.ConfigDict


def is_population(config: ml_collections.ConfigDict) -> bool:
    """Whether config describes a population (config.population.seeds is not empty)."""
    return bool(config.population.seeds)


def vary_fields(config: ml_collections.ConfigDict) -> dict[str, tuple]:
    """config.population.vary as {dotted field: values}."""
    return {k: tuple(v) for k, v in flatten(config.population.vary).items()}


def check_population(config: ml_collections.ConfigDict) -> None:
    """The population fields alone: ConfigError naming the field and the fix."""
    pop = config.population
    seeds, vary = tuple(pop.seeds), vary_fields(config)
    mesh_pop = config.mesh.population
    if not seeds:
        if mesh_pop != 1:
            raise ConfigError(
                f"config.mesh.population={mesh_pop} spreads a population's members over devices, "
                "but config.population.seeds is empty: set --config.mesh.population=1"
            )
        if vary:
            raise ConfigError(
                "config.population.vary is set but config.population.seeds is empty: give the "
                "members' seeds, e.g. --config.population.seeds='(0,)'"
            )
        return
    if pop.batching not in BATCHING:
        raise ConfigError(f"config.population.batching={pop.batching!r}; valid: {BATCHING}")
    if pop.mode not in MODES:
        raise ConfigError(f"config.population.mode={pop.mode!r}; valid: {MODES}")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ConfigError(f"config.population.seeds={seeds} must be integers >= 0")
    for field, values in vary.items():
        if field not in POPULATION_FIELDS:
            why = REFUSED.get(field, "it is not a numeric field that keeps shapes and structure")
            raise ConfigError(
                f"config.population.vary.{field} cannot vary across members: {why}; valid: "
                f"{', '.join(POPULATION_FIELDS)}"
            )
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int | float)]
        if not values or bad or not all(math.isfinite(v) for v in values):
            raise ConfigError(
                f"config.population.vary.{field}={values} must be a non-empty tuple of finite "
                "numbers"
            )
    temps = vary.get("rl.temperature")
    if temps is not None and len({t > 0 for t in temps}) > 1:
        raise ConfigError(
            f"config.population.vary.rl.temperature={temps} mixes 0 (greedy: another program) "
            "and > 0 (sampling); vary it within temperatures > 0"
        )
    kl = vary.get("objective.kl_coef")
    if kl is not None and len({v > 0 for v in kl}) > 1:
        raise ConfigError(
            f"config.population.vary.objective.kl_coef={kl} mixes 0 and > 0: a KL coefficient "
            "> 0 adds the reference model's pass (another program); vary it within one sign"
        )
    if kl is not None and config.rl.kl_in_reward:
        raise ConfigError(
            "config.population.vary.objective.kl_coef with config.rl.kl_in_reward=True: the "
            "KL-in-reward pass reads one kl_coef; set kl_in_reward=False or do not vary kl_coef"
        )
    if pop.mode == "zip":
        lengths = {"seeds": len(seeds), **{f: len(v) for f, v in vary.items()}}
        if len(set(lengths.values())) > 1:
            raise ConfigError(
                f"config.population.mode='zip' pairs the lists element by element, but their "
                f"lengths differ ({lengths}); give them equal lengths or use mode='product'"
            )
    n = len(members_values(seeds, vary, pop.mode))
    if mesh_pop > 1 and n % mesh_pop:
        raise ConfigError(
            f"config.mesh.population={mesh_pop} does not divide the {n} members: use a divisor "
            f"of {n} (members are split evenly over the population axis)"
        )


def _short(field: str) -> str:
    return field.rsplit(".", 1)[-1]


def member_name(seed: int, values: dict[str, Any]) -> str:
    """The member's folder name: ``seed3`` or ``eps_low=0.0003-seed3`` (varied fields first)."""
    parts = [f"{_short(f)}={v:g}" for f, v in values.items()]
    return "-".join([*parts, f"seed{seed}"])


def members_values(seeds: tuple, vary: dict[str, tuple], mode: str) -> list[tuple[int, dict]]:
    """(seed, {field: value}) of each member: the product (seeds innermost) or the zip."""
    fields = list(vary)
    if mode == "zip":
        rows = zip(seeds, *vary.values(), strict=True)  # equal lengths: check_population
        return [(s, dict(zip(fields, vs, strict=True))) for s, *vs in rows]
    return [
        (s, dict(zip(fields, vs, strict=True)))
        for vs in itertools.product(*vary.values())
        for s in seeds
    ]


def members(config: ml_collections.ConfigDict) -> list[Member]:
    """The members of config.population (checked; [] when it is not a population)."""
    check_population(config)
    if not is_population(config):
        return []
    seeds, vary = tuple(config.population.seeds), vary_fields(config)
    out = []
    for seed, values in members_values(seeds, vary, config.population.mode):
        cfg = copy.deepcopy(config)
        with cfg.unlocked():
            cfg.seed = int(seed)
            for field, v in values.items():
                set_field(cfg, field, float(v))
            cfg.population.seeds = ()  # a single run's config: no population, no member axis
            cfg.population.vary = ml_collections.ConfigDict()
            cfg.mesh.population = 1
        out.append(Member(member_name(seed, values), int(seed), values, cfg))
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"config.population gives two members the same seed and values ({names}); "
            "remove the repeated seed or value"
        )
    return out
