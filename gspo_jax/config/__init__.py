"""Configs: the schema every experiment starts from (schema.py), reading config files and their
arguments (args.py), and the checks of a config alone (checks.py).

    c = config.default_config()          # every field, its default and type; configs change fields
    c = config.load_config_file("configs/arith.py:runlocal")
    config.validate(c)                   # ConfigError naming the field and the fix

No array dimensions here.
"""

from gspo_jax.config.args import (
    check_override_keys,
    check_vary_flag,
    check_workdir_writable,
    config_from_flags,
    flatten,
    import_config_module,
    load_config_file,
    parse_arg,
    set_field,
    sibling_config,
)
from gspo_jax.config.checks import (
    ROLLOUT_DTYPES,
    check_finite,
    check_rollout_options,
    check_scale_rewards,
    resolve_estimator,
    validate,
)
from gspo_jax.config.schema import (
    MULTIHOST_TIMEOUT_S,
    OBJECTIVE_FIELDS,
    default_config,
    objective_overrides,
    objective_placeholders,
)
from gspo_jax.errors import ConfigError

__all__ = [
    "MULTIHOST_TIMEOUT_S",
    "OBJECTIVE_FIELDS",
    "ROLLOUT_DTYPES",
    "ConfigError",
    "check_finite",
    "check_override_keys",
    "check_vary_flag",
    "check_rollout_options",
    "check_scale_rewards",
    "check_workdir_writable",
    "config_from_flags",
    "default_config",
    "flatten",
    "import_config_module",
    "load_config_file",
    "objective_overrides",
    "objective_placeholders",
    "parse_arg",
    "resolve_estimator",
    "set_field",
    "sibling_config",
    "validate",
]
