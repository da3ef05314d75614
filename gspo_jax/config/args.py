"""Reading configs: typed ``key=value,...`` arguments for get_config(arg), config files loaded by
path, ``--config.x.y=`` keys checked, and dotted-key helpers.

An experiment is one file ``configs/<name>.py`` with ``get_config(arg=None)`` returning an
``ml_collections.ConfigDict`` (big_vision convention). ``arg`` is the string after the colon in
``--config=configs/arith.py:runlocal=True,seed=3`` and is parsed here against typed defaults:
an unknown key or a value that does not parse as the default's type is a ValueError naming the
valid keys. Nested fields are then overridden with ``--config.objective.eps_low=3e-4`` (handled by
ml_collections.config_flags on the locked ConfigDict, which rejects unknown keys and wrong types);
``population.vary``, a dict, is one flag holding the whole dict
(``--config.population.vary='{"objective": {"eps_low": [1e-4, 3e-4]}}'``, check_vary_flag).
config_from_flags builds the config a command line gives, as main.py does.

No array dimensions here.
"""

from __future__ import annotations

import ast
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from gspo_jax.errors import ConfigError


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
    if _recording:  # arguments_of: the config's arguments are all it wanted
        raise _Recorded(values)
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


_recording: list[bool] = []  # non-empty while arguments_of runs a get_config


class _Recorded(Exception):
    """Stops a get_config at its parse_arg call once its arguments are known."""

    def __init__(self, defaults: dict[str, Any]):
        super().__init__("arguments recorded")
        self.defaults = defaults


def arguments_of(get_config) -> dict[str, Any]:
    """{argument: default} that a config's ``get_config`` accepts: the keyword arguments of the
    first parse_arg call it makes ({} for a config that takes no arguments)."""
    _recording.append(True)
    try:
        get_config(None)
    except _Recorded as r:
        return r.defaults
    finally:
        _recording.pop()
    return {}


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
        path, sep, text = a[len("--config.") :].partition("=")
        if path.startswith(VARY + "."):
            check_vary_flag(a, None)
        if path == VARY:
            if sep:  # (a value in the next argument is left to ml_collections' parser)
                check_vary_flag(a, text)
            continue
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


VARY = "population.vary"  # the one config field the command line gives as a whole dict
VARY_EXAMPLE = '--config.population.vary=\'{"objective": {"eps_low": [1e-4, 3e-4]}}\''


def check_vary_flag(flag: str, text: str | None) -> None:
    """Checks the form of a ``--config.population.vary=TEXT`` flag (``text``; None for a flag that
    names a field below it): one Python or JSON dict literal, nested like the config, whose leaves
    are lists or tuples; ml_collections parses it into the ConfigDict. Which fields may vary and
    their values are config/population.py's check. Raises ConfigError in one line."""
    fix = f"give it as one nested dict, e.g. {VARY_EXAMPLE}"
    if text is None:
        raise ConfigError(f"{flag.split('=', 1)[0]} is not a flag: {VARY} is one dict; {fix}")
    try:
        value = ast.literal_eval(text.strip())
    except (SyntaxError, ValueError):
        raise ConfigError(f"{flag!r} is not a dict literal; {fix}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag!r} is a {type(value).__name__}, not a dict; {fix}")

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if not isinstance(k, str) or "." in k:
                raise ConfigError(
                    f"{flag!r}: key {k!r} must be one field name (nest the sections, no dots); "
                    f"{fix}"
                )
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif not isinstance(v, list | tuple):
                raise ConfigError(
                    f"{flag!r}: {VARY}.{prefix}{k}={v!r} must be a list of the members' values; "
                    f"{fix}"
                )

    walk(value, "")


def config_from_flags(spec: str, flags: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """The config ``python -m gspo_jax.main --config=SPEC FLAGS...`` runs: the file's
    ``get_config(arg)`` with the ``--config.x.y=v`` flags among ``flags`` applied by
    ml_collections' config_flags (as main.py does; other flags are ignored). Nothing is checked
    beyond what the flags' parsing checks.

    Raises:
      ConfigError: the file or its arguments (load_config_file), an unknown key
        (check_override_keys) or a value that does not parse, in one line.
    """
    from absl import flags as absl_flags
    from ml_collections import config_flags

    overrides = [f for f in flags if f.startswith("--config.")]
    check_override_keys(load_config_file(spec), overrides)
    argv = ["config_from_flags", f"--config={spec}", *overrides]
    values = absl_flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    try:
        values(argv)
    except absl_flags.Error as e:
        raise ConfigError(f"{' '.join(str(e).split())}") from None
    return values.config


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
