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


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """What one RL step does, derived once from the config by rl/build.py (step_spec): the
    step's phases read these typed values, never the config, so each rule lives in one place.

    Sizes: P prompts, G samples per prompt, B = P·G rows, Lp prompt slots, T response slots.
    """

    prompts: int  # P per step
    group_size: int  # G
    prompt_len: int  # Lp: the task's padded prompt length
    response_len: int  # T = max_new_tokens
    # the rollout
    temperature: float
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    eos_id: int
    pad_id: int
    rollout_logp_noise: float  # std of the noise on each reported log-prob (0 = none)
    records_routes: bool  # the rollout returns its expert routes (replay or route-change log)
    rollout_engine: str  # a name in rollout.ENGINES
    rollout_quant: str  # the rollout's weights: "" (as they are), "int8", "fp8" (rollout/quant.py)
    rollout_options: tuple  # (name, value) pairs the engine takes (continuous: slots, page_size)
    partial_rollout: int  # prompt batches carried between steps (0 = off; rl/partial.py)
    # rewards and advantages
    overlong_buffer: int
    overlong_penalty: float  # 0 = no overlong shaping
    mask_truncated: bool
    dynamic_sampling: bool
    max_gen_batches: int  # rollouts per step at most, with dynamic sampling
    estimator: str  # advantages.ESTIMATORS
    adv_eps: float
    adv_std_ddof: int
    scale_rewards: str
    token_advantages: bool  # a [B] advantage broadcast to every token of its response
    per_token_advantages: bool  # adv is [B, T] (a per-token estimator or token_advantages)
    kl_in_reward: bool  # β·KL enters the rewards, not the loss
    # the batch's optional fields and the passes that fill them
    recompute_old_logp: bool  # old_logp from a trainer forward instead of the sampler
    keeps_rollout_logp: bool  # the batch keeps the sampler's log-probs (the objective weighs them)
    uses_reference: bool  # the base policy's forward runs each step (a KL term, or its log)
    ref_logp_in_batch: bool  # the batch carries ref_logp (the KL is in the loss)
    replays_routes: bool  # Routing Replay: the update replays the rollout's routes
    logs_route_change: bool  # a forward after the update compares routes (route_change_frac)
    # the update
    num_epochs: int  # μ
    num_minibatches: int  # K
    num_microbatches: int  # U per minibatch
    shuffle_minibatches: bool
    aux_loss_coef: float  # MoE load balancing
    # LoRA (config.lora.rank > 0): the questions it raises are answered by rl/adapters.py
    lora_adapters: bool = False
    # The asynchronous pipeline (rl/pipeline.py): how many policy versions a batch may lag the
    # update that uses it (0 = synchronous) and how often the rollout's parameters are refreshed
    max_staleness: int = 0
    sync_every: int = 1
    # the step runs through rl/pipeline.py (max_staleness > 0 or a rollout device group)
    pipelined: bool = False
    # multi-turn rows (config.env.name set): the batch carries an action mask (rl/episodes.py)
    multi_turn: bool = False

    @property
    def rows(self) -> int:
        """B = P·G response rows of one rollout batch."""
        return self.prompts * self.group_size


@dataclasses.dataclass
class Run:
    """Everything built from the config before the first step."""

    config: ml_collections.ConfigDict
    workdir: str
    mesh: jax.sharding.Mesh
    task: Task
    model_cfg: ModelConfig
    objective: Objective
    step: StepSpec  # what one RL step does (the step's phases read it, not the config)
    graphdef: nnx.GraphDef  # the model's structure (trainer dtype)
    rest: nnx.State  # non-trainable model state (empty for the Transformer)
    tx: optax.GradientTransformation
    schedule: optax.Schedule  # learning rate per optimizer update
    state_shardings: nnx.State  # NamedSharding per parameter
    updates_per_step: int
    abs_params: nnx.State  # ShapeDtypeStructs with shardings: the restore target
    # the model computing in config.rl.rollout_dtype (the same parameters)
    rollout_graphdef: nnx.GraphDef
    # config.rollout.devices > 0: the rollout's own mesh and its parameters' shardings there
    # (rl/pipeline.py); None = the rollout runs on ``mesh``
    rollout_mesh: jax.sharding.Mesh | None = None
    rollout_shardings: nnx.State | None = None
    # config.env.name set: the environment and its tools' pool (rl/episodes.py EnvRollout), whose
    # episodes are the rollout; None = one turn, the task's
    env: Any = None
