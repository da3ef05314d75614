"""The one place a run is built: task, model config, objective, mesh, optimizer, train state.

    run = build.build_run(config, workdir)      # checks as it builds (ConfigError: the fix)
    params, seconds = build.base_params(run)    # warm start (cached) or random, on the mesh
    state = build.initial_state(run, params)

build_run builds each part once, and every builder checks its own input as it builds
(make_objective, make_task, make_model_config, placement.place), after config.validate's checks
of the config alone and before the workdir is probed; before the mesh, config/combinations.py's
table refuses a pair of features that does not run together (its one place). The layers of rl/
stack: build (this module; placement.py decides where each role runs) -> the steppers (step.py's
synchronous step, pipeline.py, population.py), which read the Run it returns -> trainer.py, the
loop. Nothing here runs an RL step; notebooks and benchmarks use these functions to get the
objects the trainer uses.

Dimension legend: none (configuration objects and parameter pytrees).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from gspo_jax import advantages, data, models, objectives, rollout, sharding, tasks
from gspo_jax import config as config_lib
from gspo_jax.config import ConfigError, combinations
from gspo_jax.data import files as data_files
from gspo_jax.rl import adapters, episodes, optimizer, placement, warmstart
from gspo_jax.runtime import metrics as metrics_lib
from gspo_jax.state import Run, StepSpec, TrainState

# ------------------------------------------------------------------------------------ builders
# Each builder checks its own input as it builds: a ConfigError naming the field and the fix.


def make_objective(config: ml_collections.ConfigDict) -> objectives.Objective:
    """The objective preset with config.objective's overrides, checked against the advantage
    options that depend on it (per-token advantages need per-token ratios; kl_in_reward needs a
    kl_coef)."""
    name = config.objective.name
    try:
        objective = objectives.get_objective(
            name, **config_lib.objective_overrides(config.objective)
        )
    except ValueError as e:
        raise ConfigError(f"config.objective: {e}") from None
    rl = config.rl
    estimator = config_lib.resolve_estimator(config)
    per_token = ", ".join(objectives.PER_TOKEN_PRESETS)
    if estimator in advantages.TOKEN_ESTIMATORS and objective.per_response:
        group = [e for e in advantages.ESTIMATORS if e not in advantages.TOKEN_ESTIMATORS]
        raise ConfigError(
            f"config.rl.advantage_estimator={estimator!r} gives one advantage per token, but "
            f"{name} has one ratio per response; use an objective with per-token "
            f"ratios ({per_token}) or a group estimator ({', '.join(group)})"
        )
    if objective.reads_rollout_logp and not rl.recompute_old_logp:
        raise ConfigError(
            "config.objective.rollout_correction / off_policy_mask weigh the rollout's log-probs "
            "against the trainer's, but without config.rl.recompute_old_logp=True the trainer "
            "uses the rollout's log-probs as old_logp and every weight is 1: set "
            "--config.rl.recompute_old_logp=True (and a config.rl.rollout_dtype that differs "
            "from the model's, or a config.rl.rollout_quant, for a real mismatch)"
        )
    if rl.kl_in_reward and not objective.kl_coef > 0:
        raise ConfigError(
            f"config.rl.kl_in_reward=True subtracts kl_coef · KL from the rewards, but "
            f"{name}'s kl_coef is {objective.kl_coef!r}: set "
            "--config.objective.kl_coef > 0 (e.g. 0.001) or kl_in_reward=False"
        )
    if rl.kl_in_reward and rl.log_kl_ref:
        raise ConfigError(
            "config.rl.log_kl_ref=True logs train/kl_ref from the loss's KL term, which "
            "kl_in_reward=True moves into the rewards (logged there as rollout/kl_reward_*): "
            "set one of them False"
        )
    if rl.token_advantages and objective.per_response:
        raise ConfigError(
            f"config.rl.token_advantages=True gives every token its response's advantage "
            f"([B, T]), but {name} has one ratio per response; use an "
            f"objective with per-token ratios ({per_token}) "
            "or set --config.rl.token_advantages=False"
        )
    return objective


def make_task(config: ml_collections.ConfigDict) -> tasks.Task:
    """``tasks.get_task(config.task.name, **config.task.kwargs)``, or ConfigError naming the valid
    tasks, the valid knobs, or the knob the task rejects; then the eval split and the overlong
    buffer against the task (its splits, its response length)."""
    name, knobs = config.task.name, dict(config.task.kwargs)
    if name not in tasks.TASKS:
        raise ConfigError(
            f"config.task.name={name!r} is not a task; valid tasks: {sorted(tasks.TASKS)}. "
            "Set --config.task.name to one of them"
        )
    try:
        task = tasks.get_task(name, **knobs)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"config.task.kwargs={knobs} for task {name!r}: {str(e).rstrip('.')}. Fix the knob "
            "in config.task.kwargs (--config.task.kwargs.<knob>=<value>, or the config file)"
        ) from None
    check_eval_split(config, task)
    T = config.rl.max_new_tokens or task.max_response_len
    rl = config.rl
    if rl.overlong_buffer < 0 or rl.overlong_buffer >= T or rl.overlong_penalty < 0:
        raise ConfigError(
            f"config.rl.overlong_buffer={rl.overlong_buffer} must be in [0, max_new_tokens={T}) "
            f"and config.rl.overlong_penalty={rl.overlong_penalty} >= 0"
        )
    return task


def model_overrides(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The ModelConfig fields config.model sets beside its preset (None means the preset's)."""
    return {k: v for k, v in config.model.items() if k != "preset" and v is not None}


def make_model_config(config: ml_collections.ConfigDict, task: tasks.Task) -> models.ModelConfig:
    """The model config of the experiment (preset, the task's vocabulary, config.model
    overrides), or ConfigError naming the valid presets or the rejected field; then prompt +
    response lengths against its max_seq_len, and the MoE-only options against a dense model."""
    preset = config.model.preset
    if preset not in models.PRESETS:
        raise ConfigError(
            f"config.model.preset={preset!r} is not a model preset; valid presets: "
            f"{list(models.PRESETS)}. Set --config.model.preset to one of them"
        )
    # The vocabulary is the tokenizer's unless config.model sets it (a released checkpoint's
    # embedding is padded past its tokenizer: Qwen3's 151,936 rows for 151,669 tokens).
    fields = {"vocab_size": task.tokenizer.vocab_size, **model_overrides(config)}
    try:
        if config.init.kind == "hf":
            cfg = checkpoint_model_config(config)
        else:
            cfg = models.get_model_config(preset, **fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"config.model (preset {preset!r}): {str(e).rstrip('.')}. Fix that field of "
            "config.model"
        ) from None
    if cfg.vocab_size < task.tokenizer.vocab_size:
        raise ConfigError(
            f"config.model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's "
            f"{task.tokenizer.vocab_size} ids; unset it (the tokenizer's) or match the checkpoint"
        )
    check_lengths(config, task, cfg)
    if config.rl.routing_replay and not cfg.is_moe:
        raise ConfigError(
            f"config.rl.routing_replay=True needs an MoE model, but preset "
            f"{config.model.preset!r} is dense; use a *_moe preset or turn routing_replay off"
        )
    router_lr_scale = config.optimizer.router_lr_scale
    if not router_lr_scale > 0:
        raise ConfigError(
            f"config.optimizer.router_lr_scale={router_lr_scale} multiplies the MoE routers' "
            "steps and must be > 0 (1.0: the same step as the rest of the model)"
        )
    if router_lr_scale != 1.0 and not cfg.is_moe:
        raise ConfigError(
            f"config.optimizer.router_lr_scale={router_lr_scale} scales MoE routers' steps, but "
            f"preset {config.model.preset!r} is dense; use a *_moe preset or set it to 1.0"
        )
    if config.rl.log_route_change and not cfg.is_moe:
        raise ConfigError(
            f"config.rl.log_route_change=True measures how often MoE expert routes change, but "
            f"preset {config.model.preset!r} is dense; use a *_moe preset or set "
            "--config.rl.log_route_change=False"
        )
    return cfg


def checkpoint_model_config(config: ml_collections.ConfigDict) -> models.ModelConfig:
    """The model of config.init.checkpoint (its config.json; compute dtype config.model.dtype):
    a run that starts from a released checkpoint takes its shapes from there, not a preset."""
    path = config.init.checkpoint
    cfg_file = os.path.join(path, "config.json")
    if not path or not os.path.exists(cfg_file):
        raise ConfigError(
            f"config.init.kind='hf' needs config.init.checkpoint, a Hugging Face checkpoint folder "
            f"with config.json and *.safetensors; {cfg_file!r} does not exist"
        )
    with open(cfg_file) as f:
        cfg = models.config_from_hf(json.load(f), dtype=config.model.dtype)
    # The checkpoint fixes the shapes; config.model still chooses how the model is computed (the
    # MoE dispatch, the remat policy), which Hugging Face's config.json does not say.
    how = {k: v for k, v in model_overrides(config).items() if k.startswith("moe_") or k == "remat"}
    return dataclasses.replace(cfg, **how)


def check_eval_split(config: ml_collections.ConfigDict, task: tasks.Task) -> None:
    """The held-out evaluation reads config.eval.split: it must be one of the task's splits; a task
    reading released files must have the train split and that one in its folder (caught here,
    not after a checkpoint has loaded)."""
    split = config.eval.split
    if split not in task.splits:
        raise ConfigError(
            f"config.eval.split={split!r} is not a split of task {task.name!r}; valid splits: "
            f"{list(task.splits)}. Set --config.eval.split=test (the held-out problems)"
        )
    if task.data_path:  # released files: the run reads the train split and the eval split
        present = data_files.present_splits(task)
        needed = ["train"] + ([split] if config.eval.num_problems else [])
        missing = [s for s in dict.fromkeys(needed) if s not in present]
        if missing:
            raise ConfigError(
                f"config.task.kwargs.data_path={task.data_path!r} has no {missing} split "
                f"(it has {present}); add {missing[0]}.jsonl or {missing[0]}-*.parquet there"
            )


def check_lengths(
    config: ml_collections.ConfigDict, task: tasks.Task, model_cfg: models.ModelConfig
) -> None:
    """Prompt + response must fit the model's max_seq_len (the slots of the sampler's KV cache).

    Prompts are padded to task.max_prompt_len (Lp) and the sampler allocates Lp + T slots, so a
    T that does not fit would only fail at the first rollout or evaluation, after the warm start.
    T is config.rl.max_new_tokens (0 = task.max_response_len), and config.eval.max_new_tokens
    (0 = the rollout's T).
    """
    lp, limit = task.max_prompt_len, model_cfg.max_seq_len
    t_rl = config.rl.max_new_tokens or task.max_response_len
    t_eval = config.eval.max_new_tokens or t_rl
    for field, value, t in (
        ("rl.max_new_tokens", config.rl.max_new_tokens, t_rl),
        ("eval.max_new_tokens", config.eval.max_new_tokens, t_eval),
    ):
        if lp + t <= limit:
            continue
        # (eval's 0 is the rollout's T, which the first iteration checked)
        what = f"0 (= task.max_response_len {t})" if value == 0 else str(value)
        room = limit - lp
        fix = (
            f"lower --config.{field} to at most {room}"
            if room >= 1
            else "shorten the task's prompts (config.task.kwargs)"
        )
        raise ConfigError(
            f"config.{field}={what}: task {task.name!r} prompts take up to {lp} tokens and "
            f"{lp} + {t} = {lp + t} exceeds max_seq_len={limit} of model preset "
            f"{model_cfg.name!r} (the prompt + response slots of the sampler's KV cache); {fix}, "
            "or use a preset with a longer max_seq_len"
        )


def _split_model(model):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, params, rest


def abstract_params(model_cfg, mesh, seed: int, lora=None):
    """(graphdef, params ShapeDtypeStructs with their mesh shardings, rest) without allocating;
    with a LoraSpec of rank > 0 the model carries its adapters (and its quantized base: QLoRA)."""
    spec = lora or models.lora.LoraSpec()
    abstract = nnx.eval_shape(
        lambda: adapters.adapted_model(models.create_model(model_cfg, seed=seed), spec, seed)
    )
    graphdef, params, rest = _split_model(abstract)
    shardings = rollout.quant.state_shardings(params, mesh)
    abs_params = sharding.with_shardings(params, shardings)
    return graphdef, abs_params, rest, shardings


def abstract_state(run: Run, abs_params) -> TrainState:
    """The TrainState's shapes and shardings (the restore target), without allocating.

    Every optimizer-state leaf that mirrors a parameter (Adam's moments) takes that parameter's
    sharding, so FSDP shards the optimizer state as it shards the weights (2/3 of a run's
    float32 state); the rest (the step count) is replicated over the mesh. Left to jit, the
    moments came back replicated, and the count on one device, which a resumed multi-device run
    could not use. initial_state creates the state with these same shardings.
    """
    abs_trainable = adapters.trainable(run, abs_params)
    opt_shapes = jax.eval_shape(run.tx.init, abs_trainable)
    replicated = sharding.replicated(run.mesh)

    def like_param(leaf, param):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=param.sharding)

    def not_param(leaf):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated)

    abs_opt = optax.tree_map_params(
        run.tx, like_param, opt_shapes, abs_trainable, transform_non_params=not_param
    )
    return TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
        params=abs_params,
        opt_state=abs_opt,
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated),
    )


def base_params(run: Run, cache_dir: str | None = None) -> tuple[Any, float]:
    """The initial policy's parameters on the mesh (warm start or random), and the seconds spent."""
    t0 = time.time()
    params = policy_params(run, base_model(run, cache_dir), run.config.seed)
    return params, time.time() - t0


def base_model(run: Run, cache_dir: str | None = None):
    """The base policy's model on the mesh: the warm start, a released checkpoint or random."""
    config = run.config
    cache_dir = cache_dir or cache_dir_of(config)
    if config.init.kind == "warmstart":
        return _base_model(
            config,
            run.task,
            run.model_cfg,
            cache_dir,
            mesh=run.mesh,
            progress=config.log.progress and metrics_lib.is_writer_process(),
        )
    if config.init.kind == "hf":  # a released checkpoint, read slice by slice onto the mesh
        return models.load_hf_checkpoint(
            config.init.checkpoint, dtype=run.model_cfg.dtype, mesh=run.mesh
        )
    if config.init.kind == "random":
        return models.create_model(run.model_cfg, seed=config.seed, mesh=run.mesh)
    raise ConfigError(f"config.init.kind={config.init.kind!r}; valid: 'warmstart', 'hf', 'random'")


def policy_params(run: Run, model, seed: int):
    """The policy's parameters from the base ``model`` (base_model): its own, or with LoRA the
    base's under fresh adapters drawn from ``seed`` (B = 0: the base's function; a run's are its
    config.seed's, a population member's its own seed's)."""
    config = run.config
    spec = adapters.lora_spec(config)
    _, params, _ = _split_model(adapters.adapted_model(model, spec, seed))
    if config.init.kind == "warmstart" or spec.rank > 0:
        params = jax.device_put(params, run.state_shardings)  # a no-op unless the rules differ
    return params


def _base_model(config, task, model_cfg, cache_dir: str, *, mesh, progress: bool):
    """warmstart.get_base_model for this config; a multi-host run with a cold cache is a
    ConfigError (one clear line from main.py, not a traceback on every host)."""
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
        raise ConfigError(str(e)) from None


def cache_dir_of(config) -> str:
    return config.init.cache_dir or warmstart.default_cache_dir()


def build_run(config: ml_collections.ConfigDict, workdir: str | None = None) -> Run:
    """Checks ``config`` and builds everything but the state, each part once; probes ``workdir``
    (created if missing) last, when everything else passed. ConfigError names the fix."""
    config_lib.validate(config)
    config = copy.deepcopy(config)  # a private copy (resolving max_new_tokens writes into it)
    episodes.envs_refusals(config)
    rl = config.rl
    objective = make_objective(config)
    task = make_task(config)
    model_cfg = make_model_config(config, task)
    # which features combine: config/combinations.py's table, the one place a pair is refused
    setting = combinations.Setting(moe=model_cfg.is_moe, processes=jax.process_count())
    combinations.check(config, setting)
    where = placement.place(config)  # the trainer's mesh and the rollout's, once
    mesh = where.trainer
    if workdir is not None:
        config_lib.check_workdir_writable(workdir)
    if rl.max_new_tokens <= 0:
        rl.max_new_tokens = task.max_response_len
    env = episodes.make_env_rollout(
        config, task, prompt_len=task.max_prompt_len, response_len=rl.max_new_tokens
    )
    updates_per_step = rl.num_epochs * rl.num_minibatches
    lora = adapters.lora_spec(config)
    adapters.check_lora(lora, model_cfg)
    tx, schedule = optimizer.make_optimizer(config.optimizer, rl.num_steps * updates_per_step)
    graphdef, abs_params, rest, state_sh = abstract_params(model_cfg, mesh, config.seed, lora)
    rollout_graphdef = graphdef
    if rl.rollout_dtype and rl.rollout_dtype != model_cfg.dtype:
        # The same parameters (float32) under a model whose layers compute in rollout_dtype: the
        # rollout engine's numerics differ from the trainer's, as with a bf16 inference server.
        rollout_cfg = dataclasses.replace(model_cfg, dtype=rl.rollout_dtype)
        rollout_graphdef = abstract_params(rollout_cfg, mesh, config.seed, lora)[0]
    if jax.tree.leaves(rest):
        raise NotImplementedError("models with non-parameter state are not supported")
    r_mesh, r_shardings = where.rollout, None
    if r_mesh is not None:  # the rollout's own device group (rl/placement.py, rl/pipeline.py)
        r_shardings = abstract_params(model_cfg, r_mesh, config.seed, lora)[3]
    return Run(
        config=config,
        workdir=os.path.abspath(workdir) if workdir else "",
        mesh=mesh,
        task=task,
        model_cfg=model_cfg,
        objective=objective,
        step=step_spec(config, task, objective),
        graphdef=graphdef,
        rest=rest,
        tx=tx,
        schedule=schedule,
        state_shardings=state_sh,
        updates_per_step=updates_per_step,
        abs_params=abs_params,
        rollout_graphdef=rollout_graphdef,
        rollout_mesh=r_mesh,
        rollout_shardings=r_shardings,
        env=env,
    )


def rollout_options(config) -> tuple:
    """The engine's options from config.rl as (name, value) pairs, checked: an unknown engine or
    a slot or page count below 1 is a ConfigError naming the fix."""
    rl = config.rl
    if rl.rollout_engine not in rollout.ENGINES:
        raise ConfigError(
            f"config.rl.rollout_engine={rl.rollout_engine!r} is not an engine; valid: "
            f"{tuple(rollout.ENGINES)}"
        )
    if rl.rollout_shrink < 0:
        raise ConfigError(
            f"config.rl.rollout_shrink={rl.rollout_shrink} must be >= 0 (0 = decode all B rows)"
        )
    if rl.rollout_engine == "static":
        return (("shrink", rl.rollout_shrink),) if rl.rollout_shrink else ()
    if rl.rollout_engine != "continuous":
        return ()
    if (rl.rollout_slots is not None and rl.rollout_slots < 1) or rl.rollout_page_size < 1:
        raise ConfigError(
            f"config.rl.rollout_slots={rl.rollout_slots} and rollout_page_size="
            f"{rl.rollout_page_size} must be >= 1 (rollout_slots None = one slot per row)"
        )
    return (("slots", rl.rollout_slots), ("page_size", rl.rollout_page_size))


def partial_rollout_of(config) -> int:
    """config.rl.partial_rollout, checked: >= 0, and the continuous engine only (one-line
    ConfigErrors naming the fix)."""
    rl, k = config.rl, config.rl.partial_rollout
    if k == 0:
        return 0
    fix = "set config.rl.partial_rollout=0"
    if k < 0:
        raise ConfigError(f"config.rl.partial_rollout={k} must be >= 0 (carried prompt batches)")
    if rl.rollout_engine != "continuous":
        raise ConfigError(
            f"config.rl.partial_rollout={k} needs config.rl.rollout_engine='continuous' (the "
            f"static engine decodes one batch to its end); set it, or {fix}"
        )
    return int(k)  # what it does not run with: config/combinations.py (build_run checks)


def step_spec(config, task, objective: objectives.Objective) -> StepSpec:
    """What one RL step of this config does (StepSpec): the config's step fields, typed, and the
    rules that follow from them, each decided here once. config.rl.max_new_tokens is resolved
    (0 = the task's max_response_len) before this is called."""
    rl = config.rl
    estimator = config_lib.resolve_estimator(config)
    uses_reference = objective.kl_coef > 0 or rl.log_kl_ref  # a KL term, or its log alone
    max_staleness, sync_every, pipelined = placement.check_pipeline(config)
    return StepSpec(
        prompts=rl.prompts_per_step,
        group_size=rl.group_size,
        prompt_len=task.max_prompt_len,
        response_len=rl.max_new_tokens,
        temperature=rl.temperature,
        top_k=rl.top_k,
        top_p=rl.top_p,
        eos_id=task.tokenizer.eos_id,
        pad_id=task.tokenizer.pad_id,
        rollout_logp_noise=float(rl.rollout_logp_noise),
        # Routing Replay replays the rollout's routes; log_route_change compares them after the
        # update
        records_routes=rl.routing_replay or rl.log_route_change,
        rollout_engine=rl.rollout_engine,
        rollout_quant=rl.rollout_quant,
        rollout_options=rollout_options(config),
        partial_rollout=partial_rollout_of(config),
        max_staleness=max_staleness,
        sync_every=sync_every,
        pipelined=pipelined,
        multi_turn=bool(config.env.name),
        overlong_buffer=rl.overlong_buffer,
        overlong_penalty=rl.overlong_penalty,
        mask_truncated=rl.mask_truncated,
        dynamic_sampling=rl.dynamic_sampling,
        max_gen_batches=rl.max_gen_batches,
        estimator=estimator,
        adv_eps=rl.adv_eps,
        adv_std_ddof=rl.adv_std_ddof,
        scale_rewards=rl.scale_rewards,
        token_advantages=rl.token_advantages,
        per_token_advantages=estimator in advantages.TOKEN_ESTIMATORS or rl.token_advantages,
        kl_in_reward=rl.kl_in_reward,
        recompute_old_logp=rl.recompute_old_logp,
        keeps_rollout_logp=objective.reads_rollout_logp,
        uses_reference=uses_reference,
        # moved into the rewards (kl_in_reward), ref_logp leaves the batch; with kl_coef 0 the
        # objective only logs train/kl_ref from it (its KL term is 0·KL)
        ref_logp_in_batch=uses_reference and not rl.kl_in_reward,
        replays_routes=rl.routing_replay,
        logs_route_change=rl.log_route_change,
        num_epochs=rl.num_epochs,
        num_minibatches=rl.num_minibatches,
        num_microbatches=rl.num_microbatches,
        shuffle_minibatches=rl.shuffle_minibatches,
        aux_loss_coef=rl.aux_loss_coef,
        lora_adapters=adapters.has_adapters(config),
    )


def initial_state(run: Run, params) -> TrainState:
    """Step 0: the given (base) parameters, a fresh optimizer state, the run's base key; every
    leaf placed as abstract_state says (the same shardings a resumed run restores into)."""
    target = abstract_state(run, run.abs_params)
    shardings = jax.tree.map(lambda a: a.sharding, target)
    params = jax.device_put(params, shardings.params)
    with sharding.use_mesh(run.mesh):
        opt_state = jax.jit(run.tx.init, out_shardings=shardings.opt_state)(
            adapters.trainable(run, params)
        )
    key = jax.random.key_data(jax.random.key(run.config.seed))
    return TrainState(
        step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step),
        params=params,
        opt_state=opt_state,
        rng=jax.device_put(key, shardings.rng),
    )


def saved_abstract_state(run: Run) -> TrainState:
    """What a checkpoint holds (adapters.saved_state) as shapes and shardings: the restore
    target."""
    return adapters.saved_state(run, abstract_state(run, run.abs_params))


def prepare(config: ml_collections.ConfigDict, workdir: str | None = None) -> None:
    """Checks and builds the run, prepares the dataset and trains/caches the warm start, then
    returns.

    Run it once single-process before a multi-host run (``main --prepare_only``): the multi-host
    loader reads the cached warm start but does not train it.
    """
    run = build_run(config, workdir)
    data.prepare(run.task, config.data.data_dir or None)
    if config.init.kind == "warmstart":
        _base_model(
            config,
            run.task,
            run.model_cfg,
            cache_dir_of(config),
            mesh=None,
            progress=config.log.progress,
        )
