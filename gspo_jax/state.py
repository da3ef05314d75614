"""The records a run is made of: TrainState (what a checkpoint holds), Run (what the builder made
from the config) and the step's random keys. A leaf module: the step, the update and the
passes import these types without importing the builder.

Dimension legend: none (pytrees and configuration objects).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import flax
import jax
import ml_collections

if TYPE_CHECKING:  # annotations only
    import optax
    from flax import nnx

    from gspo_jax.models import ModelConfig
    from gspo_jax.objectives import Objective
    from gspo_jax.tasks import Task


@flax.struct.dataclass
class TrainState:
    """Everything an exact resume needs besides the data iterator (checkpointed as one pytree)."""

    step: jax.Array  # int32 []: RL steps completed
    params: Any  # nnx.State of the trainable nnx.Param leaves
    opt_state: Any  # optax state
    rng: jax.Array  # uint32 [2]: raw key data of the run's base key (step keys are fold_ins)


def step_keys(rng: jax.Array, step: int) -> dict[str, jax.Array]:
    """The independent keys of one RL step: fold_in(base, step), then one stream per phase."""
    key = jax.random.fold_in(jax.random.wrap_key_data(rng), step)
    return {
        "rollout": jax.random.key_data(jax.random.fold_in(key, 0)),
        "shuffle": jax.random.key_data(jax.random.fold_in(key, 1)),
        # dynamic sampling's extra generation batches g = 1, 2, ...: fold_in(resample, g)
        "resample": jax.random.key_data(jax.random.fold_in(key, 2)),
    }


@dataclasses.dataclass
class Run:
    """Everything built from the config before the first step."""

    config: ml_collections.ConfigDict
    workdir: str
    mesh: jax.sharding.Mesh
    task: Task
    model_cfg: ModelConfig
    objective: Objective
    estimator: str
    graphdef: nnx.GraphDef  # the model's structure (trainer dtype)
    rest: nnx.State  # non-trainable model state (empty for the Transformer)
    tx: optax.GradientTransformation
    schedule: optax.Schedule  # learning rate per optimizer update
    state_shardings: nnx.State  # NamedSharding per parameter
    updates_per_step: int
    abs_params: nnx.State  # ShapeDtypeStructs with shardings: the restore target
    rollout_graphdef: (
        nnx.GraphDef
    )  # the model computing in config.rl.rollout_dtype (same parameters)
    uses_rollout_logp: bool  # the objective reads the rollout's log-probs (correction, masking)
