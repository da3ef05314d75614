"""Config machinery: typed ``key=value,...`` arguments for get_config(arg), and early validation.

An experiment is one file ``configs/<name>.py`` with ``get_config(arg=None)`` returning an
``ml_collections.ConfigDict`` (big_vision convention). ``arg`` is the string after the colon in
``--config=configs/arith.py:runlocal=True,seed=3`` and is parsed here against typed defaults:
an unknown key or a value that does not parse as the default's type is a ValueError naming the
valid keys. Nested fields are then overridden with ``--config.objective.eps_low=3e-4`` (handled by
ml_collections.config_flags on the locked ConfigDict, which rejects unknown keys and wrong types).

``validate(config)`` runs the checks that need nothing but the config (a NaN or infinite
hyperparameter, group size 1, a count below 1, an unknown estimator or rollout dtype, ...).
experiment.build_run calls it first, then builds the objective, the mesh, the task and the model
config, each builder checking its own input as it builds (an unknown objective or bad ε, a batch
that does not divide over the data axis, an unknown task, knob, split or model preset, a response
length the model's KV cache cannot hold), and probes the workdir last: a misconfigured job dies in
seconds with a message that names the fix instead of after the warm start. Every such problem is a
ConfigError, which main.py prints as one ``error: ...`` line.

No array dimensions here.
"""

from __future__ import annotations

import ast
import math
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections import config_dict

from gspo_jax import objectives


class ConfigError(ValueError):
    """A configuration problem found before any step; the message names the problem and the fix."""


# Objective fields a config may override (None means "the preset's value"): the objective
# library's own list, so a field added there is overridable here too.
OBJECTIVE_FIELDS = objectives.OVERRIDABLE_FIELDS


def _parse_bool(s: str) -> bool:
    low = s.strip().lower()
    if low in ("1", "true", "yes", "on", "t", "y"):
        return True
    if low in ("0", "false", "no", "off", "f", "n"):
        return False
    raise ValueError(f"{s!r} is not a boolean (use True/False)")


def _parse_value(key: str, text: str, default: Any) -> Any:
    """Parses ``text`` as the type of ``default`` (a value or a typed placeholder)."""
    if isinstance(default, config_dict.FieldReference):
        typ, default_value = default.get_type(), default.get()
    else:
        typ, default_value = type(default), default
    if typ is type(None):
        raise ValueError(f"default of {key!r} has no type; use config_dict.placeholder(type)")
    try:
        if text.strip().lower() == "none" and default_value is None:
            return None
        if typ is bool:
            return _parse_bool(text)
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
        if typ is str:
            return text
        if typ in (tuple, list):
            value = ast.literal_eval(text)
            return typ(value if isinstance(value, tuple | list) else (value,))
        return typ(text)
    except ValueError as e:
        raise ValueError(
            f"config argument {key}={text!r}: expected {typ.__name__} "
            f"(default {default_value!r}): {e}"
        ) from None


def _split_top_level(arg: str) -> list[str]:
    """Splits on commas that are not inside brackets/parentheses (tuples may be values)."""
    parts, depth, cur = [], 0, []
    for ch in arg:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (p.strip() for p in parts) if p]


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
    """Parses ``"key=value,key2=value2"`` against typed ``defaults``.

    A default is a value (its type is the field's type) or ``config_dict.placeholder(type)`` for an
    optional field that defaults to None. A bare ``key`` means ``key=True`` for boolean fields
    (``runlocal`` alone switches the local size on).

    Returns a locked ConfigDict with every default, overridden by ``arg``.

    Raises:
      ValueError: on an unknown key, a malformed item, or a value of the wrong type.
    """
    values = {
        k: (v.get() if isinstance(v, config_dict.FieldReference) else v)
        for k, v in defaults.items()
    }
    for item in _split_top_level(arg or ""):
        key, sep, text = item.partition("=")
        key = key.strip()
        if key not in defaults:
            raise ValueError(
                f"unknown config argument {key!r} in {arg!r}; valid arguments: {sorted(defaults)}"
            )
        if not sep:
            if not isinstance(values[key], bool):
                raise ValueError(f"config argument {key!r} needs a value: {key}=<value>")
            values[key] = True
            continue
        values[key] = _parse_value(key, text, defaults[key])
    out = ml_collections.ConfigDict()
    for k, v in values.items():
        d = defaults[k]
        if v is None and isinstance(d, config_dict.FieldReference):
            out[k] = config_dict.placeholder(d.get_type())
        else:
            out[k] = v
    out.lock()
    return out


def objective_placeholders() -> ml_collections.ConfigDict:
    """The override fields of an objective, all None (= preset value) but typed for the CLI.

    Derived from the Objective dataclass (objectives.OVERRIDABLE_FIELD_TYPES: each field's type
    besides None), so a field added there is ``--config.objective.<field>=...`` here too.
    """
    return ml_collections.ConfigDict(
        {
            name: config_dict.placeholder(typ)
            for name, typ in objectives.OVERRIDABLE_FIELD_TYPES.items()
        }
    )


def objective_overrides(objective_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of config.objective that are set (not None), minus the preset name."""
    return {
        k: objective_cfg[k]
        for k in OBJECTIVE_FIELDS
        if k in objective_cfg and objective_cfg[k] is not None
    }


def check_workdir_writable(workdir: str) -> None:
    """Creates ``workdir`` if needed and proves it is writable, or raises ConfigError saying so."""
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=workdir, prefix=".write_probe_", delete=True) as f:
            f.write(b"ok")
            f.flush()
    except OSError as e:
        raise ConfigError(
            f"workdir {workdir!r} is not writable ({e.strerror or e}); pass a --workdir you can "
            "write to, or fix its permissions"
        ) from None


def import_config_module(path: str):
    """The module of a config file, loaded by path (config files are not a package); configs
    that extend another one (configs/arith_moe.py extends configs/arith.py) load it with this."""
    import importlib.util

    name = "_gspo_config_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def sibling_config(config_file: str, name: str):
    """The config module ``name`` in the folder of ``config_file`` (a config's ``__file__``):
    how configs/arith_moe.py and the others load configs/arith.py, which they extend."""
    return import_config_module(os.path.join(os.path.dirname(os.path.abspath(config_file)), name))


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Loads ``path/to/config.py[:arg]`` and returns ``get_config(arg)`` (as --config does).

    Raises:
      ConfigError: the file does not exist, or ``get_config`` rejected ``arg`` (an unknown
        argument or a value of the wrong type: parse_arg's ValueError, which names the valid
        arguments), so that main.py reports it in one line before ml_collections' flag parsing
        turns it into a traceback.
    """
    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist; pass --config=configs/<name>.py")
    module = import_config_module(path)
    try:
        return module.get_config(arg or None) if arg else module.get_config()
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(
            f"--config={spec}: {e}; fix the arguments after the colon (see get_config in {path})"
        ) from None


def check_override_keys(cfg: ml_collections.ConfigDict, argv: list[str]) -> None:
    """Raises ConfigError for a ``--config.a.b=v`` flag whose key path is not in ``cfg``.

    ml_collections rejects such a flag too, but with a bare ``AttributeError: 'b'`` deep in a
    traceback; this names the full path and the valid keys at the level where it went wrong.
    """
    for a in argv:
        if not a.startswith("--config."):
            continue
        path = a[len("--config.") :].split("=", 1)[0]
        node, walked = cfg, []
        for part in path.split("."):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                where = ".".join(walked) or "<top level>"
                valid = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
                raise ConfigError(
                    f"unknown config key {path!r} in {a!r}: {where} has no field {part!r}; "
                    f"valid fields there: {valid}"
                )
            node = node[part]
            walked.append(part)


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flattens a nested ConfigDict/dict into dotted keys (for sweep tables and logging)."""
    out = {}
    for k, v in cfg.items():
        if isinstance(v, Mapping | ml_collections.ConfigDict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def set_field(cfg: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets the dotted ``key`` ("rl.num_steps") of ``cfg``; on a locked config a misspelt key
    is an error."""
    *parents, leaf = key.split(".")
    node = cfg
    for name in parents:
        node = node[name]
    node[leaf] = value


def validate(config: ml_collections.ConfigDict) -> None:
    """The checks that need nothing but the config; raises ConfigError naming the fix.

    Covers: finite float hyperparameters, the advantage estimator and scale_rewards, group size
    >= 2, positive counts (prompts, minibatches, micro-batches, epochs, steps), temperature,
    response lengths, the schedule and intervals, and the rollout options. The checks that need a
    built part (the objective, the mesh, the task, the model config) run where experiment.py builds
    it, and the workdir is probed last (experiment.build_run).
    """
    from gspo_jax import advantages

    rl = config.rl
    check_finite(config)
    estimator = resolve_estimator(config)
    if estimator not in advantages.ESTIMATORS:
        raise ConfigError(
            f"config.rl.advantage_estimator={estimator!r} is unknown; "
            f"valid: {advantages.ESTIMATORS}"
        )
    if rl.group_size < 2:
        raise ConfigError(
            f"config.rl.group_size={rl.group_size}: group-relative advantages compare each "
            f"response with the other samples of its prompt ({estimator!r} divides by the "
            "group's std, which "
            "is 0 for a single sample), so every advantage would be 0 and nothing would train. "
            "Set --config.rl.group_size to 2 or more (8 is the default)."
        )
    if min(rl.prompts_per_step, rl.num_minibatches, rl.num_microbatches, rl.num_epochs) < 1:
        raise ConfigError(
            "config.rl.prompts_per_step, num_minibatches, num_microbatches and "
            "num_epochs must all be >= 1"
        )
    if rl.num_steps < 1:
        raise ConfigError(f"config.rl.num_steps={rl.num_steps} must be >= 1")
    if rl.temperature <= 0:
        raise ConfigError(
            f"config.rl.temperature={rl.temperature}: RL needs sampling (temperature > 0); "
            "greedy decoding is for evaluation only"
        )
    if rl.max_new_tokens < 0:
        raise ConfigError(
            f"config.rl.max_new_tokens={rl.max_new_tokens} must be >= 1 (or 0 for the task's "
            "max_response_len)"
        )
    opt = config.optimizer
    if opt.learning_rate <= 0 or opt.schedule not in ("constant", "cosine", "linear"):
        raise ConfigError(
            f"config.optimizer: learning_rate={opt.learning_rate} must be > 0 and "
            f"schedule={opt.schedule!r} one of constant, cosine, linear"
        )
    if config.checkpoint.every < 1 or config.eval.every < 0:
        raise ConfigError(
            "config.checkpoint.every must be >= 1 and config.eval.every >= 0 "
            "(0 = evaluate only at the start and the end)"
        )
    if not rl.get("rollout_logp_noise", 0.0) >= 0:
        raise ConfigError(
            f"config.rl.rollout_logp_noise={rl.rollout_logp_noise} must be >= 0 (the std of the "
            "noise added to each sampled token's log-prob; 0 = none)"
        )
    if config.eval.max_new_tokens < 0:
        raise ConfigError(
            f"config.eval.max_new_tokens={config.eval.max_new_tokens} must be >= 1 (or 0 for "
            "config.rl.max_new_tokens)"
        )
    check_scale_rewards(config, estimator)
    check_rollout_options(config)


def check_scale_rewards(config: ml_collections.ConfigDict, estimator: str) -> None:
    """rl.scale_rewards: a known choice, and one other than "group" only for grpo's std."""
    from gspo_jax import advantages

    scale = config.rl.get("scale_rewards", "group")
    if scale not in advantages.SCALE_REWARDS:
        raise ConfigError(
            f"config.rl.scale_rewards={scale!r} is unknown; valid: {advantages.SCALE_REWARDS}"
        )
    if scale != "group" and estimator != "grpo":
        raise ConfigError(
            f"config.rl.scale_rewards={scale!r} chooses grpo's std, but the advantage estimator "
            f"is {estimator!r}: set --config.rl.advantage_estimator=grpo or scale_rewards=group"
        )


ROLLOUT_DTYPES = ("", "float32", "bfloat16")


def check_rollout_options(config: ml_collections.ConfigDict) -> None:
    """The rollout dtype, dynamic sampling, collapse watch and the objective's use of the
    rollout's log-probs, each against the rest of the config (the overlong buffer needs the
    task's response length: experiment.make_task checks it)."""
    rl, obj = config.rl, config.objective
    if rl.rollout_dtype not in ROLLOUT_DTYPES:
        raise ConfigError(
            f"config.rl.rollout_dtype={rl.rollout_dtype!r}; valid: {ROLLOUT_DTYPES} "
            "('' = the model's compute dtype)"
        )
    if rl.max_gen_batches < 1:
        raise ConfigError(
            f"config.rl.max_gen_batches={rl.max_gen_batches} must be >= 1 (rollouts per step "
            "with dynamic sampling)"
        )
    if rl.collapse_patience < 0:
        raise ConfigError(
            f"config.rl.collapse_patience={rl.collapse_patience} must be >= 0 (0 = never warn)"
        )
    reads_rollout = obj.get("rollout_correction") or obj.get("off_policy_mask") is not None
    if reads_rollout and not rl.recompute_old_logp:
        raise ConfigError(
            "config.objective.rollout_correction / off_policy_mask weigh the rollout's log-probs "
            "against the trainer's, but without config.rl.recompute_old_logp=True the trainer "
            "uses the rollout's log-probs as old_logp and every weight is 1: set "
            "--config.rl.recompute_old_logp=True (and a config.rl.rollout_dtype that differs "
            "from the model's for a real mismatch)"
        )


def check_finite(config: ml_collections.ConfigDict) -> None:
    """Raises ConfigError naming every float field of ``config`` that is NaN or infinite.

    Range checks such as ``learning_rate <= 0`` are False for NaN, so a NaN learning rate (or
    temperature, ε, weight decay, ...) would pass them and turn the parameters into NaN at step 1.
    """
    bad = [
        f"config.{k}={v}"
        for k, v in flatten(config).items()
        if isinstance(v, float) and not math.isfinite(v)
    ]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: hyperparameters must be finite numbers (NaN or inf would make the "
            "loss and the parameters NaN at the first step); set a finite value, e.g. "
            f"--{bad[0].split('=')[0]}=<number>"
        )


def resolve_estimator(config: ml_collections.ConfigDict) -> str:
    """The advantage estimator: config.rl.advantage_estimator, else the objective's pairing
    (dr_grpo advantages for the dr_grpo objective, z-scored grpo advantages otherwise)."""
    if config.rl.advantage_estimator:
        return config.rl.advantage_estimator
    return "dr_grpo" if config.objective.name == "dr_grpo" else "grpo"
