"""A trained or base policy as a model, from what a user holds: a run directory's checkpoint, or
the base of a config (its warm start, released checkpoint or random initialisation).

    run, model, step = policies.run_policy("runs/arith")            # newest checkpoint
    run, model, step = policies.run_policy("runs/arith", step=40)
    run, model = policies.config_base_policy(config)                  # step 0 of that config

A run directory holds config.json (the run's config) and checkpoints/<step>/ (orbax). The model
is the run's policy on the run's mesh (config.mesh); a LoRA run's adapters come back on their
base (loaded again from its source and checked to be the one they were trained on), unmerged.
A Hugging Face checkpoint folder is models.load_hf_checkpoint's.

Dimension legend: none.
"""

from __future__ import annotations

import json
import os

import ml_collections
from flax import nnx

from gspo_jax.config import schema
from gspo_jax.errors import CheckpointError, ConfigError
from gspo_jax.rl import adapters, build
from gspo_jax.runtime import checkpoint as checkpoint_lib

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"


def is_run_dir(path: str) -> bool:
    """Whether ``path`` is a run directory (config.json and a checkpoints folder)."""
    return os.path.isfile(os.path.join(path, CONFIG_FILE)) and os.path.isdir(
        os.path.join(path, CHECKPOINTS)
    )


def saved_steps(workdir: str) -> list[int]:
    """The steps of the complete checkpoints of a run directory, oldest first (read from the
    folder names; nothing is opened)."""
    folder = os.path.join(workdir, CHECKPOINTS)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(int(n) for n in names if n.isdigit())


def check_step(workdir: str, step: int | None) -> int:
    """The step to load (the newest when None), or CheckpointError naming the saved ones."""
    steps = saved_steps(workdir)
    if not steps:
        raise CheckpointError(
            f"{workdir} holds no checkpoint in {CHECKPOINTS}/; train it first, or pass a "
            "Hugging Face checkpoint folder"
        )
    if step is None:
        return steps[-1]
    if step not in steps:
        raise CheckpointError(
            f"{workdir} has no checkpoint of step {step}; its checkpoints: {steps}. Pass one of "
            "them (or no step: the newest)"
        )
    return step


def read_run_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's config.json, with the fields added to the schema since it was written at their
    defaults (a new field defaults to the behaviour before it), so an older run still loads."""
    with open(os.path.join(workdir, CONFIG_FILE)) as f:
        written = json.load(f)
    return ml_collections.ConfigDict(_filled(schema.default_config().to_dict(), written))


def _filled(defaults: dict, written: dict) -> dict:
    """written, plus every key of defaults it lacks (recursively); written's values win."""
    out = dict(written)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _filled(value, out[key])
    return out


class _NoData:
    """The policy is the parameters; the data position in the checkpoint is ignored."""

    def set_state(self, state) -> None:
        del state


def run_policy(workdir: str, step: int | None = None, config=None):
    """(run, model, step): the policy of ``workdir``'s checkpoint ``step`` (newest: None) under
    ``config`` (default: the run's config.json) on the run's mesh."""
    step = check_step(workdir, step)
    config = read_run_config(workdir) if config is None else config
    run = build.build_run(config)
    ckpt = checkpoint_lib.Checkpointer(os.path.join(workdir, CHECKPOINTS), save_every=1)
    try:
        state, meta = ckpt.restore(step, build.saved_abstract_state(run), _NoData())
    finally:
        ckpt.close()
    if not adapters.checkpoint_has_base(run):  # the adapters on their base, loaded and checked
        base, _ = build.base_params(run)
        state = adapters.restored(run, state, meta, base, workdir)
    return run, nnx.merge(run.graphdef, state.params, run.rest), step


def config_base_policy(config: ml_collections.ConfigDict, cache_dir: str | None = None):
    """(run, model): the policy a run of ``config`` starts from (trained and cached first when
    it is a warm start that is not cached yet), on the config's mesh."""
    if config.init.kind not in ("warmstart", "hf", "random"):
        raise ConfigError(
            f"config.init.kind={config.init.kind!r}; valid: 'warmstart', 'hf', 'random'"
        )
    run = build.build_run(config)
    params, _ = build.base_params(run, cache_dir)
    return run, nnx.merge(run.graphdef, params, run.rest)
