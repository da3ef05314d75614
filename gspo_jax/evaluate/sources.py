"""What the command evaluates (a run directory's checkpoint, a Hugging Face folder, a config's
base policy) and on which task, resolved and checked before any model is loaded; then loaded
onto the evaluation's mesh.

Dimension legend: none.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

from gspo_jax import config as config_lib
from gspo_jax.errors import CheckpointError, ConfigError


@dataclasses.dataclass(frozen=True)
class Source:
    """One policy to evaluate: kind "run" (a run directory and its step), "hf" (a checkpoint
    folder) or "config" (a config's base policy), and its label in the table and files."""

    kind: str
    path: str
    step: int | None = None
    config: Any = None
    label: str = ""

    @property
    def identity(self) -> str:
        """Which policy this is, for a side file: kind, absolute path (or config spec), step."""
        where = self.path if self.kind == "config" else os.path.abspath(self.path)
        return f"{self.kind}:{where}" + (f"@{self.step}" if self.step is not None else "")


def resolve_source(path: str | None, step: int | None, config_spec: str | None, flag: str):
    """The Source of --checkpoint / --compare (or of --config's base), or a one-line error."""
    from gspo_jax.models import hf
    from gspo_jax.rl import policies

    if path is not None and config_spec:
        raise ConfigError(
            f"--config={config_spec} evaluates that config's base policy, --{flag}={path} a "
            "checkpoint: pass one of them (a run directory's own config.json is read anyway)"
        )
    if path is None:
        if not config_spec:
            raise ConfigError(
                "pass --checkpoint PATH (a run directory or an HF folder) or --config"
            )
        if os.path.isdir(config_spec):  # a run directory: the base that run started from
            if not os.path.isfile(os.path.join(config_spec, policies.CONFIG_FILE)):
                raise ConfigError(
                    f"--config={config_spec!r} is a folder without {policies.CONFIG_FILE}; pass "
                    "a config file (configs/arith.py[:args]) or a run directory"
                )
            config = policies.read_run_config(config_spec)
        else:
            config = config_lib.load_config_file(config_spec)
        return Source("config", config_spec, config=config, label="base")
    if not os.path.isdir(path):
        raise ConfigError(
            f"--{flag}={path!r} is not a folder; pass a run directory (config.json, "
            "checkpoints/) or a Hugging Face checkpoint folder (config.json, *.safetensors)"
        )
    if policies.is_run_dir(path):
        try:
            step = policies.check_step(path, step)
        except CheckpointError as e:
            raise ConfigError(f"--{flag}: {e}") from None
        config = policies.read_run_config(path)
        return Source("run", path, step, config, f"step {step}")
    has_weights = any(n.endswith(".safetensors") for n in os.listdir(path))
    if os.path.isfile(os.path.join(path, hf.CONFIG_FILE)) and has_weights:
        return Source("hf", path, label=os.path.basename(os.path.normpath(path)))
    raise ConfigError(
        f"--{flag}={path!r} is neither a run directory (config.json and checkpoints/) nor a "
        "Hugging Face checkpoint folder (config.json and *.safetensors); pass one of them"
    )


def make_task(source: Source, name: str | None, knobs: dict[str, Any], split: str):
    """The task the problems come from: the run's / config's (its knobs, updated by knobs) unless
    --task names another; an HF folder's tokenizer when the task reads one. Checks the split."""
    from gspo_jax import tasks

    base_name, base_knobs = None, {}
    if source.config is not None:
        base_name, base_knobs = source.config.task.name, dict(source.config.task.kwargs)
    name = name or base_name
    if name is None:
        raise ConfigError(f"--checkpoint={source.path} is an HF folder: name its task, --task=...")
    if name not in tasks.TASKS:
        raise ConfigError(f"--task={name!r} is not a task; valid tasks: {sorted(tasks.TASKS)}")
    knobs = {**(base_knobs if name == base_name else {}), **knobs}
    wants_tokenizer = "tokenizer_path" in inspect.signature(tasks.TASKS[name]).parameters
    has_tokenizer = source.kind == "hf" and os.path.exists(
        os.path.join(source.path, "tokenizer.json")
    )
    if wants_tokenizer and has_tokenizer and not knobs.get("tokenizer_path"):
        knobs["tokenizer_path"] = source.path
    try:
        task = tasks.get_task(name, **knobs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--task={name} with knobs {knobs}: {str(e).rstrip('.')}") from None
    if split not in task.splits:
        raise ConfigError(
            f"--split={split!r}: the {name} task has the splits {list(task.splits)}; pass one"
        )
    return task


def check_data(task, split: str, data_dir: str | None) -> None:
    """The split's problems can be read (generated, converted or found): a missing split file
    or an empty split is a one-line error before any model is loaded."""
    from gspo_jax import data

    try:
        data.load_source(task, split, data_dir)
    except ValueError as e:  # DataFileError included
        raise ConfigError(f"--split={split} of {task.name}: {str(e).rstrip('.')}") from None


def default_max_new_tokens(source: Source, task) -> int:
    """The run's (or config's) evaluation length on its own task, else the task's."""
    config = source.config
    if config is not None and config.task.name == task.name:
        return int(config.eval.max_new_tokens or config.rl.max_new_tokens or task.max_response_len)
    return task.max_response_len


def load_model(source: Source, mesh, cache_dir: str | None):
    """The source's model with its parameters placed on ``mesh`` (replicated over the batch
    axes: every device samples its share of problems)."""
    import jax
    from flax import nnx

    from gspo_jax import models, sharding
    from gspo_jax.rl import policies

    if source.kind == "hf":
        return models.load_hf_checkpoint(source.path, mesh=mesh)
    if source.kind == "run":
        _, model, _ = policies.run_policy(source.path, source.step, source.config)
    else:
        _, model = policies.config_base_policy(source.config, cache_dir)
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, sharding.state_shardings(state, mesh))
    return nnx.merge(graphdef, state)


def check_vocab(model, task, source: Source) -> None:
    if model.cfg.vocab_size < task.tokenizer.vocab_size:
        raise ConfigError(
            f"{source.path}: the model's {model.cfg.vocab_size} token ids are fewer than the "
            f"{task.name} tokenizer's {task.tokenizer.vocab_size}; evaluate it on its own task"
        )
