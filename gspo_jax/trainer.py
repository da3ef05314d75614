"""The RL loop: rollout -> reward -> group advantages -> (old/ref log-probs) -> update -> log/eval/save.

    summary = trainer.train(config, workdir)     # what `python -m gspo_jax.main` calls

Dimension legend: P prompts per step (P_local on this process), G samples per prompt, B = P*G
response rows (group-contiguous), Lp padded prompt length, T = max_new_tokens.

One RL step (DESIGN.md "data flow"):

    prompts (grain, this process's share)  ─► global [P, Lp] array on the mesh
    sampler.generate (G per prompt)        ─► tokens, mask, logp [B, T]  (jit, batch-sharded)
    task.score on this process's rows      ─► rewards [B_local] (numpy)  ─► global [B]
    advantages.group_advantages            ─► adv [B]
    optional passes (jit): recompute old_logp / record MoE routes (Routing Replay) / ref_logp
    train_step.update (jit, donated state) ─► μ epochs × K minibatches of AdamW
    metrics (process 0) ─► periodic evaluation ─► orbax checkpoint

Randomness is a pure function of (config.seed, step) (train_step.step_keys), and the data
iterator's state is checkpointed, so restarting the same command in the same workdir resumes
exactly: parameters and metrics equal those of an uninterrupted run. The same config gives the same
results on one device and on a mesh of many (sharding changes only the order of float sums).

Multi-host: every process runs this same loop (SPMD). Each loads 1/process_count of the prompts;
jax.make_array_from_process_local_data assembles the global batch, and each process scores the
response rows of its own prompts. Only process 0 writes metrics, config.json and summary.json;
orbax writes checkpoint shards from every process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from gspo_jax import advantages, models, objectives, sampler, sharding
from gspo_jax import checkpoint as checkpoint_lib
from gspo_jax import config as config_lib
from gspo_jax import metrics as metrics_lib
from gspo_jax import train_step as ts

# ------------------------------------------------------------------------------ host <-> mesh


def _row_spec(mesh) -> Any:
    """The PartitionSpec entry for a batch-row dimension on this mesh (data+fsdp, or None)."""
    return sharding.batch_sharding(mesh, 1).spec[0]


def rows_sharding(mesh, ndim: int) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(_row_spec(mesh), *([None] * (ndim - 1))))


def to_global(local: np.ndarray, mesh) -> jax.Array:
    """This process's rows [n_local, ...] -> a global array [n_local * process_count, ...]."""
    local = np.asarray(local)
    return jax.make_array_from_process_local_data(rows_sharding(mesh, local.ndim), local)


def to_local(x: jax.Array) -> np.ndarray:
    """A row-sharded global array -> this process's rows (all rows on a single process)."""
    if x.is_fully_addressable:
        return np.asarray(x)
    by_start = {}
    for s in x.addressable_shards:
        by_start[s.index[0].start or 0] = s  # replicas along other mesh axes: keep one
    return np.concatenate([np.asarray(by_start[k].data) for k in sorted(by_start)])


class ProcessSlice:
    """This process's rows of a global batch stream (config.data.process_sharding="slice").

    Every process reads the same global batch of P prompts and keeps rows
    [i * P / n, (i + 1) * P / n): the global batch, and so the whole run, is then independent of
    the process count (a 2-host run equals a 1-host run), and every process's iterator state is the
    same. Prompt records are tiny, so reading P of them per step on every host costs nothing next
    to sampling. ("records" instead gives each process a disjoint shard of the records, for
    datasets too large to scan on every host; results then depend on the process count.)
    """

    def __init__(self, iterator, process_index: int, process_count: int):
        self._it, self._i, self._n = iterator, process_index, process_count

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._it)
        rows = len(batch["prompt"]) // self._n
        return {k: v[self._i * rows : (self._i + 1) * rows] for k, v in batch.items()}

    def get_state(self):
        return self._it.get_state()

    def set_state(self, state) -> None:
        self._it.set_state(state)


def make_data_iterator(config, task):
    """The training prompt stream of this process (see ProcessSlice for the two sharding modes)."""
    from gspo_jax import data

    pcount, pindex = jax.process_count(), jax.process_index()
    mode = config.data.process_sharding
    kwargs = dict(
        seed=config.data.seed if config.data.seed >= 0 else config.seed,
        data_dir=config.data.data_dir or None,
    )
    P = config.rl.prompts_per_step
    if mode == "slice":
        it = data.make_train_iterator(task, batch_size=P, process_index=0, process_count=1, **kwargs)
        return ProcessSlice(it, pindex, pcount) if pcount > 1 else it
    if mode == "records":
        return data.make_train_iterator(
            task, batch_size=P, process_index=pindex, process_count=pcount, **kwargs
        )
    raise config_lib.ConfigError(
        f"config.data.process_sharding={mode!r}; valid: 'slice', 'records'"
    )


# ------------------------------------------------------------------------------ setup


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


def _model_overrides(config) -> dict:
    over = {k: v for k, v in config.model.items() if k != "preset" and v is not None}
    return over


def build_model_config(config, task) -> models.ModelConfig:
    return models.get_model_config(
        config.model.preset, vocab_size=task.tokenizer.vocab_size, **_model_overrides(config)
    )


def make_task(config):
    from gspo_jax import tasks

    return tasks.get_task(config.task.name, **dict(config.task.kwargs))


def _split_model(model):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, params, rest


def abstract_params(model_cfg, mesh, seed: int):
    """(graphdef, params ShapeDtypeStructs with their mesh shardings, rest) without allocating."""
    abstract = nnx.eval_shape(lambda: models.Transformer(model_cfg, rngs=nnx.Rngs(seed)))
    graphdef, params, rest = _split_model(abstract)
    shardings = sharding.state_shardings(params, mesh)
    abs_params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, shardings
    )
    return graphdef, abs_params, rest, shardings


def abstract_state(run: Run, abs_params) -> ts.TrainState:
    """The TrainState's shapes and shardings (the restore target), without allocating."""
    compiled = jax.jit(run.tx.init).lower(abs_params).compile()
    opt_shapes = jax.eval_shape(run.tx.init, abs_params)
    abs_opt = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        opt_shapes,
        compiled.output_shardings,
    )
    replicated = NamedSharding(run.mesh, PartitionSpec())
    return ts.TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
        params=abs_params,
        opt_state=abs_opt,
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated),
    )


def base_params(run: Run, cache_dir: str) -> tuple[Any, float]:
    """The initial policy's parameters on the mesh (warm start or random), and the seconds spent."""
    config = run.config
    t0 = time.time()
    if config.init.kind == "warmstart" and jax.process_count() > 1:
        params = _load_cached_warmstart(run, cache_dir)
    elif config.init.kind == "warmstart":
        from gspo_jax import warmstart

        model = warmstart.get_base_model(
            run.task,
            run.model_cfg,
            config.init.warmstart,
            cache_dir,
            data_dir=config.data.data_dir or None,
            progress=config.log.progress and metrics_lib.is_writer_process(),
        )
        _, params, _ = _split_model(model)
        params = jax.device_put(params, run.state_shardings)
    elif config.init.kind == "random":
        model = sharding.create_sharded_model(run.model_cfg, run.mesh, config.seed)
        _, params, _ = _split_model(model)
    else:
        raise config_lib.ConfigError(
            f"config.init.kind={config.init.kind!r}; valid: 'warmstart', 'random'"
        )
    return params, time.time() - t0


def _warmstart_path(run: Run, cache_dir: str) -> str:
    from gspo_jax import warmstart

    warm_cfg = warmstart.as_warm_config(run.config.init.warmstart)
    key = warmstart.cache_key(run.task, run.model_cfg, warm_cfg)
    return os.path.abspath(os.path.join(cache_dir, "warmstart", f"{run.task.name}_{key}"))


def _load_cached_warmstart(run: Run, cache_dir: str):
    """Multi-host: restore the cached warm start straight into its mesh shardings.

    warmstart.get_base_model restores onto one local device (and would train on every host at
    once when the cache is cold), which a multi-process run cannot do; here every process reads
    only its shards. The cache must exist: fill it once with a single-process
    ``python -m gspo_jax.main ... --prepare_only`` (same config, shared filesystem).
    """
    import orbax.checkpoint as ocp

    path = _warmstart_path(run, cache_dir)
    if not os.path.exists(os.path.join(path, "meta.json")):
        raise config_lib.ConfigError(
            f"multi-host run: the warm start is not cached at {path}. Run the same command once "
            "in a single process with --prepare_only (it trains and caches the base policy), on "
            "a filesystem every host sees, then launch the multi-host run."
        )
    abstract = nnx.eval_shape(lambda: models.Transformer(run.model_cfg, rngs=nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
    shardings = sharding.state_shardings(abs_state, run.mesh)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abs_state, shardings
    )
    restored = ocp.StandardCheckpointer().restore(
        os.path.join(path, "params"), nnx.to_pure_dict(target)
    )
    nnx.replace_by_pure_dict(abs_state, restored)
    _, params, _ = _split_model(nnx.merge(graphdef, abs_state))
    return params


def _cache_dir(config) -> str:
    if config.init.cache_dir:
        return config.init.cache_dir
    return os.environ.get(
        "GSPO_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "gspo_jax")
    )


# ------------------------------------------------------------------------------ jitted phases


def make_rollout_fn(run: Run):
    """(params, prompts [P, Lp], lengths [P], key) -> SampleOutput, rows sharded over the mesh.

    generate() is traced inside this jit so that its host-side checks see tracers (they would
    otherwise read non-addressable arrays on multi-host runs); the data was checked by the loader.
    """
    rl = run.config.rl
    eos_id, pad_id = run.task.tokenizer.eos_id, run.task.tokenizer.pad_id

    def fn(params, prompts, lengths, key):
        model = nnx.merge(run.graphdef, params, run.rest)
        return sampler.generate(
            model,
            prompts,
            lengths,
            num_samples=rl.group_size,
            max_new_tokens=rl.max_new_tokens,
            rng=jax.random.wrap_key_data(key),
            temperature=rl.temperature,
            top_k=rl.top_k,
            top_p=rl.top_p,
            eos_id=eos_id,
            pad_id=pad_id,
        )

    out_sh = sampler.SampleOutput(
        tokens=rows_sharding(run.mesh, 2),
        mask=rows_sharding(run.mesh, 2),
        logp=rows_sharding(run.mesh, 2),
        sample_logp=rows_sharding(run.mesh, 2),
        lengths=rows_sharding(run.mesh, 1),
    )
    return jax.jit(fn, out_shardings=out_sh)


def make_prepare_fn(run: Run):
    """(sample, rewards [B], prompts, lengths) -> (RL batch, rollout metrics): advantages etc."""
    rl = run.config.rl
    G, T = rl.group_size, rl.max_new_tokens
    eos_id = run.task.tokenizer.eos_id

    def fn(sample, rewards, prompts, lengths):
        adv, adv_metrics = advantages.group_advantages(
            rewards, G, estimator=run.estimator, eps=rl.adv_eps, std_ddof=rl.adv_std_ddof
        )
        batch = {
            "prompts": jnp.repeat(prompts, G, axis=0),  # [B, Lp]
            "prompt_lengths": jnp.repeat(lengths, G, axis=0),  # [B]
            "responses": sample.tokens,
            "mask": sample.mask,
            "old_logp": sample.logp,
            "adv": adv,
        }
        batch = {k: jax.lax.with_sharding_constraint(v, rows_sharding(run.mesh, v.ndim))
                 for k, v in batch.items()}
        lens = sample.mask.sum(-1)  # [B]
        has_eos = ((sample.tokens == eos_id) & (sample.mask > 0)).any(-1)
        m = {
            "response_len_mean": lens.mean(),
            "response_len_max": lens.max(),
            "truncated_frac": ((~has_eos) & (lens >= T)).mean(),
            "frac_zero_std_groups": adv_metrics["frac_zero_std_groups"],
            "reward_std": adv_metrics["reward_std"],
            "adv_abs_mean": jnp.abs(adv).mean(),
            "sample_logp_mean": (sample.logp * sample.mask).sum() / jnp.maximum(lens.sum(), 1),
            "tokens": lens.sum(),
        }
        return batch, m

    return jax.jit(fn)


# ------------------------------------------------------------------------------ evaluation


def evaluate(run: Run, params) -> dict[str, float] | None:
    """Held-out evaluation with the tasks' evaluation function, as eval/ metrics.

    None when evaluation is off (config.eval.num_problems = 0).
    """
    from gspo_jax import evaluation

    ev = run.config.eval
    if ev.num_problems <= 0:
        return None
    mesh_ctx = sharding.use_mesh(run.mesh)
    if jax.process_count() > 1:
        # evaluation.evaluate reads the sampler's outputs with np.asarray, which needs whole
        # arrays in this process: every process evaluates its own single-device copy of the
        # parameters (the same numbers on every host; fine for the models this runs on CPUs, a
        # pod-scale model would need an evaluation loop over sharded outputs instead).
        replicated = NamedSharding(run.mesh, PartitionSpec())
        params = jax.jit(lambda p: p, out_shardings=replicated)(params)
        local = jax.local_devices()[0]
        params = jax.tree.map(lambda x: jax.device_put(x.addressable_data(0), local), params)
        mesh_ctx = contextlib.nullcontext()
    model = nnx.merge(run.graphdef, params, run.rest)
    with mesh_ctx:
        out = evaluation.evaluate(
            model,
            run.task,
            split=ev.split,
            num_problems=ev.num_problems,
            pass_k=ev.pass_k,
            max_new_tokens=ev.max_new_tokens or run.config.rl.max_new_tokens,
            batch_size=ev.batch_size,
            seed=ev.seed,
            data_dir=run.config.data.data_dir or None,
        )
    scalars = {}
    for k, v in dict(out).items():
        try:
            scalars[k] = float(np.asarray(v))
        except (TypeError, ValueError):
            continue  # non-scalar extras (e.g. examples) are not metrics
    return metrics_lib.with_prefix("eval/", scalars)


def _eval_summary(m: dict[str, float] | None) -> dict[str, float] | None:
    if m is None:
        return None
    return {k.split("/", 1)[1]: v for k, v in m.items()}


# ------------------------------------------------------------------------------ the loop


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
        from gspo_jax import warmstart

        warmstart.get_base_model(
            task,
            build_model_config(config, task),
            config.init.warmstart,
            _cache_dir(config),
            data_dir=config.data.data_dir or None,
            progress=config.log.progress,
        )


def train(config: ml_collections.ConfigDict, workdir: str, *, stop_after: int | None = None
          ) -> dict | None:
    """Runs (or resumes) the experiment ``config`` in ``workdir``; returns the summary dict.

    Every configuration check runs first (config.validate), so a bad config fails in seconds.
    ``stop_after=n`` stops after n steps of this invocation without a final checkpoint, summary or
    evaluation, like a preemption (tests use it); it returns None then.
    """
    t_start = time.time()
    workdir = os.path.abspath(workdir)
    config_lib.validate(config, workdir)
    config = ml_collections.ConfigDict(config)  # a private copy (resolved fields go in it)
    rl = config.rl
    mesh = sharding.make_mesh(dict(config.mesh), devices=config_lib.mesh_devices(config))
    task = make_task(config)
    model_cfg = build_model_config(config, task)
    objective = objectives.get_objective(
        config.objective.name, **config_lib.objective_overrides(config.objective)
    )
    updates_per_step = rl.num_epochs * rl.num_minibatches
    tx, schedule = ts.make_optimizer(config.optimizer, rl.num_steps * updates_per_step)
    graphdef, abs_params, rest, state_sh = abstract_params(model_cfg, mesh, config.seed)
    run = Run(
        config=config,
        workdir=workdir,
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
    )
    if jax.tree.leaves(rest):
        raise NotImplementedError("models with non-parameter state are not supported")

    # ---- data, checkpoints, logs
    data_iter = make_data_iterator(config, task)
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        save_every=config.checkpoint.every,
        max_to_keep=config.checkpoint.max_to_keep,
        async_save=config.checkpoint.async_save,
    )
    latest = ckpt.latest_step()
    writer = metrics_lib.MetricWriter(
        workdir, resume_step=latest, tensorboard=config.log.tensorboard
    )
    writer.write_config(config)
    log = metrics_lib.Progress(total=rl.num_steps, initial=latest or 0,
                               enabled=None if config.log.progress else False)

    # ---- initial state: resume, or the base policy
    cache_dir = _cache_dir(config)
    base_eval, warm_s, prior_wall = None, 0.0, 0.0
    base_eval_path = os.path.join(workdir, "base_eval.json")
    ref_params = None
    if latest is not None:
        state, meta = ckpt.restore(latest, abstract_state(run, abs_params), data_iter)
        prior_wall = float(meta.get("wall_s", 0.0))
        log.write(f"resumed from step {latest} in {workdir}")
        if os.path.exists(base_eval_path):
            with open(base_eval_path) as f:
                base_eval = json.load(f)
        if objective.kl_coef > 0:
            ref_params, _ = base_params(run, cache_dir)
    else:
        params, warm_s = base_params(run, cache_dir)
        if objective.kl_coef > 0:
            ref_params = jax.tree.map(jnp.copy, params)
        with sharding.use_mesh(mesh):
            opt_state = jax.jit(tx.init)(params)
        replicated = NamedSharding(mesh, PartitionSpec())
        state = ts.TrainState(
            step=jax.device_put(jnp.zeros((), jnp.int32), replicated),
            params=params,
            opt_state=opt_state,
            rng=jax.device_put(jax.random.key_data(jax.random.PRNGKey(config.seed)), replicated),
        )
        if config.eval.at_start and config.eval.num_problems > 0:
            t0 = time.time()
            base_eval = evaluate(run, state.params)
            base_eval["time/eval_s"] = time.time() - t0
            writer.write(0, base_eval)
            if writer.enabled:
                with open(base_eval_path, "w") as f:
                    json.dump(base_eval, f, indent=2)
            log.write("base  " + _fmt_eval(base_eval))

    # ---- jitted phases
    row_spec = _row_spec(mesh)
    rollout_fn = make_rollout_fn(run)
    prepare_fn = make_prepare_fn(run)
    need_pass = rl.recompute_old_logp or rl.routing_replay
    logprob_fn = ref_fn = None
    if need_pass:
        logprob_fn = jax.jit(ts.make_logprob_fn(
            graphdef, rest, temperature=rl.temperature, num_chunks=rl.num_minibatches,
            return_routes=rl.routing_replay, row_spec=row_spec, mesh=mesh))
    if ref_params is not None:
        ref_fn = jax.jit(ts.make_logprob_fn(
            graphdef, rest, temperature=rl.temperature, num_chunks=rl.num_minibatches,
            return_routes=False, row_spec=row_spec, mesh=mesh))
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    update_fn = jax.jit(
        ts.make_update_fn(
            graphdef, rest, objective, tx,
            temperature=rl.temperature,
            num_epochs=rl.num_epochs,
            num_minibatches=rl.num_minibatches,
            num_microbatches=rl.num_microbatches,
            shuffle=rl.shuffle_minibatches,
            aux_loss_coef=rl.aux_loss_coef,
            row_spec=row_spec,
            mesh=mesh,
        ),
        out_shardings=(state_shardings, None),
        donate_argnums=(0,),
    )

    # ---- the loop
    start = int(jax.device_get(state.step))
    last_eval = None
    t_loop = time.time()
    try:
        for step in range(start, rl.num_steps):
            if stop_after is not None and step - start >= stop_after:
                break
            t0 = time.time()
            keys = ts.step_keys(np.asarray(jax.device_get(state.rng)), step)
            batch_local = next(data_iter)
            prompts = to_global(batch_local["prompt"].astype(np.int32), mesh)
            lengths = to_global(batch_local["prompt_length"].astype(np.int32), mesh)
            with sharding.use_mesh(mesh):
                sample = rollout_fn(state.params, prompts, lengths, keys["rollout"])
                jax.block_until_ready(sample.tokens)
            t1 = time.time()
            scores = task.score(batch_local, to_local(sample.tokens), to_local(sample.mask),
                                rl.group_size)
            rewards = to_global(scores["reward"].astype(np.float32), mesh)
            score_means = {k: to_global(v.astype(np.float32), mesh) for k, v in scores.items()}
            t2 = time.time()
            with sharding.use_mesh(mesh):
                batch, roll_m = prepare_fn(sample, rewards, prompts, lengths)
                pass_m = {}
                if need_pass:
                    out = logprob_fn(state.params, batch)
                    diff = (out["logp"] - batch["old_logp"]) * batch["mask"]
                    pass_m["recompute_logp_diff_mean"] = diff.sum() / jnp.maximum(
                        batch["mask"].sum(), 1.0)
                    pass_m["recompute_logp_diff_absmax"] = jnp.abs(diff).max()
                    if rl.recompute_old_logp:
                        batch["old_logp"] = out["logp"]
                    if rl.routing_replay:
                        batch["routes"] = out["routes"]
                if ref_fn is not None:
                    batch["ref_logp"] = ref_fn(ref_params, batch)["logp"]
                jax.block_until_ready(batch["old_logp"])
                t3 = time.time()
                state, train_m = update_fn(state, batch, keys["shuffle"])
                jax.block_until_ready(train_m["loss"])
            t4 = time.time()

            m = {}
            m.update(metrics_lib.with_prefix("train/", train_m))
            m["train/lr"] = schedule(step * run.updates_per_step)
            # trainer vs rollout log-probs: a rollout metric (it is about the sampler)
            m["rollout/logp_diff_mean"] = m.pop("train/logp_diff_mean")
            m["rollout/logp_diff_absmax"] = m.pop("train/logp_diff_absmax")
            m.update(metrics_lib.with_prefix("rollout/", roll_m))
            m.update(metrics_lib.with_prefix("rollout/", pass_m))
            m.update({f"rollout/{k}": jnp.mean(v) for k, v in score_means.items()})
            m = metrics_lib.to_host_scalars(m)
            m.update({
                "time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/logp_s": t3 - t2,
                "time/update_s": t4 - t3, "time/step_s": t4 - t0,
                "time/tokens_per_s": m["rollout/tokens"] / max(t4 - t0, 1e-9),
                "time/rollout_tokens_per_s": m["rollout/tokens"] / max(t1 - t0, 1e-9),
            })
            metrics_lib.check_finite(m, step + 1)
            done = step + 1
            due = done == rl.num_steps or (config.eval.every and done % config.eval.every == 0)
            if due and config.eval.num_problems > 0:
                te = time.time()
                last_eval = evaluate(run, state.params)
                m.update(last_eval)
                m["time/eval_s"] = time.time() - te
                log.write(f"step {done:4d} " + _fmt_eval(last_eval))
            writer.write(done, m)
            ckpt.save(done, state, data_iter,
                      {"wall_s": prior_wall + time.time() - t_start}, force=done == rl.num_steps)
            log.update(m)
    except metrics_lib.NonFiniteError:
        ckpt.wait()  # the last good checkpoint is committed before the error propagates
        raise
    finally:
        log.close()
        writer.flush()
    ckpt.close()
    writer.close()
    if stop_after is not None and int(jax.device_get(state.step)) < rl.num_steps:
        return None

    if last_eval is None:
        last_eval = evaluate(run, state.params)
    wall = prior_wall + time.time() - t_start
    summary = {
        "base": _eval_summary(base_eval),
        "final": _eval_summary(last_eval),
        "steps": int(jax.device_get(state.step)),
        "wall_s": wall,
        "warmstart_s": warm_s,
        "rl_s": time.time() - t_loop,
        "objective": config.objective.name,
        "workdir": workdir,
    }
    if summary["base"] and summary["final"]:
        summary["delta_greedy_accuracy"] = (
            summary["final"].get("greedy_accuracy", np.nan)
            - summary["base"].get("greedy_accuracy", np.nan)
        )
    if metrics_lib.is_writer_process():
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print(format_summary(summary), flush=True)
    return summary


def _fmt_eval(m: dict[str, float]) -> str:
    acc = m.get("eval/greedy_accuracy", float("nan"))
    length = m.get("eval/mean_response_length", float("nan"))
    return f"held-out greedy accuracy {acc:.3f}  mean response length {length:.1f}"


def format_summary(s: dict) -> str:
    """The closing block printed at the end of a run."""
    lines = ["", f"== summary ({s['objective']}, {s['workdir']}) =="]
    for name in ("base", "final"):
        e = s.get(name)
        if e:
            lines.append(
                f"{name:5s}  held-out greedy accuracy {e.get('greedy_accuracy', float('nan')):.3f}"
                f"  mean response length {e.get('mean_response_length', float('nan')):.1f}"
            )
    if "delta_greedy_accuracy" in s:
        lines.append(f"delta  {100 * s['delta_greedy_accuracy']:+.1f} points")
    lines.append(
        f"steps {s['steps']}  wall {s['wall_s']:.0f} s  (warm start {s['warmstart_s']:.0f} s,"
        f" RL {s['rl_s']:.0f} s)"
    )
    return "\n".join(lines)
