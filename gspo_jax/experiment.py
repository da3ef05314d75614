"""What an experiment is built from: task, model config, objective, optimizer, mesh, base policy.

    run = experiment.build_run(config, workdir)      # validates first: ConfigError names the fix
    params, seconds = experiment.base_params(run)    # warm start (cached) or random, on the mesh
    state = experiment.initial_state(run, params)

Nothing here runs an RL step (that is trainer.py); notebooks and benchmarks use these functions to
get the same objects the trainer uses.

Dimension legend: none (configuration objects and parameter pytrees).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from gspo_jax import config as config_lib
from gspo_jax import metrics as metrics_lib
from gspo_jax import models, objectives, sharding
from gspo_jax import train_step as ts

# ------------------------------------------------------------------------------------ optimizer


def make_schedule(opt_cfg: Any, total_updates: int) -> optax.Schedule:
    """Learning rate per optimizer update: linear warmup then constant / cosine / linear decay.

    Counted in optimizer updates (RL steps × epochs × minibatches).
    """
    lr, warm = float(opt_cfg.learning_rate), int(opt_cfg.warmup_updates)
    kind = opt_cfg.schedule
    decay_steps = max(total_updates - warm, 1)
    end = lr * float(opt_cfg.end_lr_ratio)
    if kind == "constant":
        main = optax.constant_schedule(lr)
    elif kind == "cosine":
        main = optax.cosine_decay_schedule(lr, decay_steps, alpha=float(opt_cfg.end_lr_ratio))
    elif kind == "linear":
        main = optax.linear_schedule(lr, end, decay_steps)
    else:
        raise ValueError(f"unknown schedule {kind!r}; valid: constant, cosine, linear")
    if warm <= 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), main], [warm])


def make_optimizer(opt_cfg: Any, total_updates: int) -> tuple[optax.GradientTransformation, Any]:
    """AdamW with global-norm gradient clipping; returns (tx, schedule)."""
    schedule = make_schedule(opt_cfg, total_updates)
    parts = []
    if opt_cfg.grad_clip and opt_cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(float(opt_cfg.grad_clip)))
    parts.append(
        optax.adamw(
            schedule,
            b1=float(opt_cfg.b1),
            b2=float(opt_cfg.b2),
            eps=float(opt_cfg.eps),
            weight_decay=float(opt_cfg.weight_decay),
        )
    )
    return optax.chain(*parts), schedule


@dataclasses.dataclass
class Run:
    """Everything built from the config before the first step."""

    config: ml_collections.ConfigDict
    workdir: str
    mesh: Any
    task: Any
    model_cfg: models.ModelConfig
    objective: objectives.Objective
    estimator: str
    graphdef: Any
    rest: Any  # non-trainable model state (empty for the Transformer)
    tx: Any
    schedule: Any
    state_shardings: Any
    updates_per_step: int
    abs_params: Any  # ShapeDtypeStructs with shardings: the restore target
    rollout_graphdef: Any  # the model computing in config.rl.rollout_dtype (same parameters)
    uses_rollout_logp: bool  # the objective reads the rollout's log-probs (correction, masking)


# The task and model config of an experiment, built (and checked) the one way config.validate does.
make_task = config_lib.make_task
build_model_config = config_lib.make_model_config


def _split_model(model):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, params, rest


def abstract_params(model_cfg, mesh, seed: int):
    """(graphdef, params ShapeDtypeStructs with their mesh shardings, rest) without allocating."""
    abstract = nnx.eval_shape(lambda: models.create_model(model_cfg, seed=seed))
    graphdef, params, rest = _split_model(abstract)
    shardings = sharding.state_shardings(params, mesh)
    abs_params = sharding.with_shardings(params, shardings)
    return graphdef, abs_params, rest, shardings


def abstract_state(run: Run, abs_params) -> ts.TrainState:
    """The TrainState's shapes and shardings (the restore target), without allocating.

    Every optimizer-state leaf that mirrors a parameter (Adam's moments) takes that parameter's
    sharding, so FSDP shards the optimizer state as it shards the weights (2/3 of a run's
    float32 state); the rest (the step count) is replicated over the mesh. Left to jit, the
    moments came back replicated, and the count on one device, which a resumed multi-device run
    could not use. initial_state creates the state with these same shardings.
    """
    opt_shapes = jax.eval_shape(run.tx.init, abs_params)
    replicated = sharding.replicated(run.mesh)

    def like_param(leaf, param):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=param.sharding)

    def not_param(leaf):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated)

    abs_opt = optax.tree_map_params(
        run.tx, like_param, opt_shapes, abs_params, transform_non_params=not_param
    )
    return ts.TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
        params=abs_params,
        opt_state=abs_opt,
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated),
    )


def base_params(run: Run, cache_dir: str | None = None) -> tuple[Any, float]:
    """The initial policy's parameters on the mesh (warm start or random), and the seconds spent."""
    config = run.config
    cache_dir = cache_dir or cache_dir_of(config)
    t0 = time.time()
    if config.init.kind == "warmstart":
        model = _base_model(
            config,
            run.task,
            run.model_cfg,
            cache_dir,
            mesh=run.mesh,
            progress=config.log.progress and metrics_lib.is_writer_process(),
        )
        _, params, _ = _split_model(model)
        params = jax.device_put(params, run.state_shardings)  # a no-op unless the rules differ
    elif config.init.kind == "hf":  # a released checkpoint, read slice by slice onto the mesh
        model = models.load_hf_checkpoint(
            config.init.checkpoint, dtype=run.model_cfg.dtype, mesh=run.mesh
        )
        _, params, _ = _split_model(model)
    elif config.init.kind == "random":
        model = models.create_model(run.model_cfg, seed=config.seed, mesh=run.mesh)
        _, params, _ = _split_model(model)
    else:
        raise config_lib.ConfigError(
            f"config.init.kind={config.init.kind!r}; valid: 'warmstart', 'hf', 'random'"
        )
    return params, time.time() - t0


def _base_model(config, task, model_cfg, cache_dir: str, *, mesh, progress: bool):
    """warmstart.get_base_model for this config; a multi-host run with a cold cache is a
    ConfigError (one clear line from main.py, not a traceback on every host)."""
    from gspo_jax import warmstart

    try:
        return warmstart.get_base_model(
            task,
            model_cfg,
            config.init.warmstart,
            cache_dir,
            data_dir=config.data.data_dir or None,
            progress=progress,
            mesh=mesh,
        )
    except FileNotFoundError as e:
        raise config_lib.ConfigError(str(e)) from None


def cache_dir_of(config) -> str:
    from gspo_jax import warmstart

    return config.init.cache_dir or warmstart.default_cache_dir()


def build_run(config: ml_collections.ConfigDict, workdir: str | None = None) -> Run:
    """Validates ``config`` (ConfigError naming the fix) and builds everything but the state."""
    config_lib.validate(config, workdir)
    config = copy.deepcopy(config)  # a private copy (resolving max_new_tokens writes into it)
    rl = config.rl
    mesh = sharding.make_mesh(dict(config.mesh), devices=config_lib.mesh_devices(config))
    task = make_task(config)
    if rl.max_new_tokens <= 0:
        rl.max_new_tokens = task.max_response_len
    model_cfg = build_model_config(config, task)
    objective = objectives.get_objective(
        config.objective.name, **config_lib.objective_overrides(config.objective)
    )
    updates_per_step = rl.num_epochs * rl.num_minibatches
    tx, schedule = make_optimizer(config.optimizer, rl.num_steps * updates_per_step)
    graphdef, abs_params, rest, state_sh = abstract_params(model_cfg, mesh, config.seed)
    rollout_graphdef = graphdef
    if rl.rollout_dtype and rl.rollout_dtype != model_cfg.dtype:
        # The same parameters (float32) under a model whose layers compute in rollout_dtype: the
        # rollout engine's numerics differ from the trainer's, as with a bf16 inference server.
        rollout_cfg = dataclasses.replace(model_cfg, dtype=rl.rollout_dtype)
        rollout_graphdef = abstract_params(rollout_cfg, mesh, config.seed)[0]
    if jax.tree.leaves(rest):
        raise NotImplementedError("models with non-parameter state are not supported")
    return Run(
        config=config,
        workdir=os.path.abspath(workdir) if workdir else "",
        mesh=mesh,
        task=task,
        model_cfg=model_cfg,
        objective=objective,
        estimator=config_lib.resolve_estimator(config),
        graphdef=graphdef,
        rest=rest,
        tx=tx,
        schedule=schedule,
        state_shardings=state_sh,
        updates_per_step=updates_per_step,
        abs_params=abs_params,
        rollout_graphdef=rollout_graphdef,
        uses_rollout_logp=bool(
            getattr(objective, "rollout_correction", None)
            or getattr(objective, "off_policy_mask", None) is not None
        ),
    )


def initial_state(run: Run, params) -> ts.TrainState:
    """Step 0: the given (base) parameters, a fresh optimizer state, the run's base key; every
    leaf placed as abstract_state says (the same shardings a resumed run restores into)."""
    target = abstract_state(run, run.abs_params)
    shardings = jax.tree.map(lambda a: a.sharding, target)
    params = jax.device_put(params, shardings.params)
    with sharding.use_mesh(run.mesh):
        opt_state = jax.jit(run.tx.init, out_shardings=shardings.opt_state)(params)
    key = jax.random.key_data(jax.random.key(run.config.seed))
    return ts.TrainState(
        step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step),
        params=params,
        opt_state=opt_state,
        rng=jax.device_put(key, shardings.rng),
    )


def prepare(config: ml_collections.ConfigDict, workdir: str | None = None) -> None:
    """Validates the config, prepares the dataset and trains/caches the warm start, then returns.

    Run it once single-process before a multi-host run (``main --prepare_only``): the multi-host
    loader reads the cached warm start but does not train it.
    """
    from gspo_jax import data

    config_lib.validate(config, workdir)
    task = make_task(config)
    data.prepare(task, config.data.data_dir or None)
    if config.init.kind == "warmstart":
        _base_model(
            config,
            task,
            build_model_config(config, task),
            cache_dir_of(config),
            mesh=None,
            progress=config.log.progress,
        )
