"""One RL step: the jitted phases (rollout, shape, select, prepare, log-prob passes, update) and
rl_step, which runs them.

    phases = train_step.make_phases(run, state, with_ref=False)
    state, host_metrics = train_step.rl_step(run, phases, state, batch_local)

rl/trainer.py is the run loop around rl_step; rl/build.py builds the Run (task, model, objective,
optimizer, mesh) it takes and the TrainState; rl/batch.py makes the RLBatch the update
(rl/update.py) trains on; rl/logprob_passes.py holds the forward-only passes.

Dimension legend: P prompts per step, G samples per prompt, B = P*G response rows, Lp padded
prompt length, T padded response length (= max_new_tokens), L layers, S = Lp+T sequence slots, k
experts per token.

Host-device traffic is explicit: the prompts and the verifier's rewards go to the mesh with
distributed.to_global, the responses come back for scoring with distributed.to_local, and the
step's metrics are computed on the devices (jitted) and come back in one jax.device_get (a test
runs a step under jax.transfer_guard("disallow")).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gspo_jax import models, rollout, sharding
from gspo_jax.rl import adapters
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl.logprob_passes import make_route_change_fn, run_logprob_fn
from gspo_jax.rl.partial import PartialQueue
from gspo_jax.rl.update import make_update_fn
from gspo_jax.runtime import distributed
from gspo_jax.runtime import metrics as metrics_lib
from gspo_jax.state import Run, TrainState, step_keys

LOGP_NOISE_STREAM = 0x6C6F6770  # fold_in constant of the log-prob noise's key ("logp")


def rollout_model(run: Run, params) -> models.Transformer:
    """The model the rollout engine runs, from the trainer's parameters: the one place the
    rollout's weights are prepared. It computes in config.rl.rollout_dtype (run.rollout_graphdef)
    and, with config.rl.rollout_quant, holds the decoder's projection weights quantized
    (rollout/quant.py), quantized afresh from ``params`` at every call (inside the rollout's jit,
    each step). Weights that arrive quantized are read as they are (quantize_weights skips a
    QuantizedParam): the pipeline's sync sends them so (rl/pipeline.py rollout_copy), and a
    QLoRA base (config.lora.base_quant) is held so by the trainer."""
    model = nnx.merge(run.rollout_graphdef, params, run.rest)
    return rollout.quantize_weights(model, run.step.rollout_quant)


def make_rollout_fn(run: Run, mesh: jax.sharding.Mesh | None = None):
    """(params, prompts [P, Lp], lengths [P], key[, temperature []]) -> SampleOutput, rows sharded
    over the mesh (run.mesh, or the rollout's own ``mesh``: rl/pipeline.py), its routes (if any)
    batch-major [B, L, S, k] like the RLBatch's. The
    temperature is config.rl.temperature's constant unless given (a population member's, traced).

    generate() is traced inside this jit so the rollout compiles once with the trainer's
    shardings (its host-side checks then see tracers; the data was checked by the loader). The
    rollout runs rollout_model(run, params): config.rl.rollout_dtype, config.rl.rollout_quant.
    StepSpec.rollout_logp_noise > 0 adds Gaussian noise of that std to each response token's
    reported log-prob (not to the sampling): the claims' dose of sampler-trainer mismatch, which
    reaches the update as old_logp, or as rollout_logp under recompute_old_logp.
    """
    spec = run.step
    noise_std = spec.rollout_logp_noise

    def fn(params, prompts, lengths, key, temperature=None):
        model = rollout_model(run, params)
        out = rollout.generate(
            model,
            prompts,
            lengths,
            num_samples=spec.group_size,
            max_new_tokens=spec.response_len,
            rng=jax.random.wrap_key_data(key),
            temperature=spec.temperature if temperature is None else temperature,
            top_k=spec.top_k,
            top_p=spec.top_p,
            eos_id=spec.eos_id,
            pad_id=spec.pad_id,
            return_routes=spec.records_routes,
            engine=spec.rollout_engine,
            **dict(spec.rollout_options),
        )
        if spec.records_routes:  # the model's [L, B, S, k] -> [B, L, S, k], as in the step
            out = out.replace(routes=jnp.swapaxes(out.routes, 0, 1))
        return _with_logp_noise(out, key, noise_std)

    return jax.jit(fn, out_shardings=_sample_shardings(run, mesh or run.mesh))


def _with_logp_noise(out: rollout.SampleOutput, key, noise_std: float) -> rollout.SampleOutput:
    """StepSpec.rollout_logp_noise: an engine whose log-probs are off by ~noise_std per token."""
    if noise_std <= 0:
        return out
    noise_key = jax.random.fold_in(jax.random.wrap_key_data(key), LOGP_NOISE_STREAM)
    noise = noise_std * jax.random.normal(noise_key, out.logp.shape)  # [B, T]
    return out.replace(logp=jnp.where(out.mask > 0, out.logp + noise, out.logp))


def _sample_shardings(run: Run, mesh: jax.sharding.Mesh) -> rollout.SampleOutput:
    """The rollout's SampleOutput shardings: rows over the mesh's batch axes."""
    spec = run.step
    rows = lambda ndim: sharding.rows_sharding(mesh, ndim)  # noqa: E731
    return rollout.SampleOutput(
        tokens=rows(2),
        mask=rows(2),
        logp=rows(2),
        sample_logp=rows(2),
        lengths=rows(1),
        # the rollout's expert choices (Routing Replay, route-change metric)
        routes=rows(4) if spec.records_routes else None,
        # partial rollouts: the policy version of each token
        versions=rows(2) if spec.partial_rollout else None,
    )


def make_partial_rollout_fn(run: Run):
    """Partial rollouts (rl/partial.py): (params, prompts [Q, Lp], lengths [Q], key, carry
    PartialRows [Q·G, T], version) -> (SampleOutput of the P first complete groups, with
    .versions; selected [P] and carried [C] queue indices; PartialRows [C·G, T] carried).
    version is the trainer's step (the policy version sampling now). Log-prob noise, as in
    make_rollout_fn, goes on each row's tokens once, when the row is trained on."""
    spec = run.step

    def fn(params, prompts, lengths, key, carry, version):
        model = rollout_model(run, params)
        out, selected, carried, rows = rollout.generate_partial(
            model,
            prompts,
            lengths,
            jax.random.wrap_key_data(key),
            carry,
            version=version,
            complete_groups=spec.prompts,
            num_samples=spec.group_size,
            max_new_tokens=spec.response_len,
            temperature=spec.temperature,
            top_k=spec.top_k,
            top_p=spec.top_p,
            eos_id=spec.eos_id,
            pad_id=spec.pad_id,
            **dict(spec.rollout_options),
        )
        return _with_logp_noise(out, key, spec.rollout_logp_noise), selected, carried, rows

    rows = lambda ndim: sharding.rows_sharding(run.mesh, ndim)  # noqa: E731
    every = sharding.replicated(run.mesh)
    carry_sh = rollout.PartialRows(*(rows(2),) * 5, done=rows(1))
    return jax.jit(fn, out_shardings=(_sample_shardings(run, run.mesh), every, every, carry_sh))


def staleness_metrics(versions: jax.Array, mask: jax.Array, version) -> dict[str, jax.Array]:
    """Partial rollouts: how many policy versions behind the updating policy the batch's tokens
    were sampled (versions [B, T] int32, mask [B, T]; version: the step now), over response
    tokens: the mean, the max and the share sampled by the current policy."""
    lag = (version - versions).astype(jnp.float32)  # [B, T]
    n = jnp.maximum(jnp.sum(mask), 1.0)
    return {
        "staleness_mean": jnp.sum(lag * mask) / n,
        "staleness_max": jnp.max(jnp.where(mask > 0, lag, 0.0)),
        "fresh_tokens_frac": jnp.sum((lag == 0) * mask) / n,
    }


def _resample_key(resample: jax.Array, g: int) -> jax.Array:
    """The key of dynamic sampling's generation batch g >= 1: fold_in(the step's resample, g)."""
    return jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(resample), g))


def _step_means(score_parts: list[dict], shaping, valid) -> dict[str, jax.Array]:
    """The step's means over rows (jitted: the metric arithmetic stays on the devices): each of
    the verifier's scores over every response generated this step (all generation batches), the
    mean response length of the right and of the wrong ones (NaN when there are none: Dr. GRPO's
    length bias is about the wrong ones), the overlong shaping (when on) and dynamic sampling's
    share of groups with signal (when on). A part's "length" [B] is used for the lengths only."""
    parts = [{k: v for k, v in p.items() if k != "length"} for p in score_parts]
    m = {k: jnp.mean(jnp.stack([jnp.mean(p[k]) for p in parts])) for k in parts[0]}
    if "length" in score_parts[0]:
        right = jnp.concatenate([p["correct"] for p in parts])  # [N] 0/1
        n = jnp.concatenate([p["length"] for p in score_parts])  # [N] tokens
        for name, w in (("len_correct_mean", right), ("len_wrong_mean", 1.0 - right)):
            m[name] = jnp.where(w.sum() > 0, (n * w).sum() / jnp.maximum(w.sum(), 1.0), jnp.nan)
    if shaping is not None:
        m["overlong_shaping_mean"] = shaping.mean()
    if valid is not None:
        m["ds_valid_groups_frac"] = valid.mean()
    return m


@dataclasses.dataclass
class Phases:
    """The jitted functions of one RL step (built once per run; see rl_step)."""

    rollout: Any
    shape: Any  # overlong shaping and per-group signal
    select: Any  # dynamic sampling: P groups out of several generation batches
    prepare: Any
    logprob: Any  # recompute old_logp; None unless config.rl.recompute_old_logp
    ref: Any  # the reference model's log-probs; None when kl_coef == 0
    update: Any
    # after the update: the new parameters' own routes vs the rollout's; None unless
    # config.rl.log_route_change
    routes: Any = None
    # rl.kl_in_reward: the advantages again, from rewards minus β·KL (after the reference pass)
    kl_reward: Any = None
    # the step's keys from the state's base key and step, on the devices (state.step_keys)
    keys: Any = jax.jit(step_keys)
    resample_key: Any = jax.jit(_resample_key, static_argnums=1)
    recompute_metrics: Any = jax.jit(rl_batch.recompute_metrics)
    means: Any = jax.jit(_step_means)
    staleness: Any = jax.jit(staleness_metrics)


def make_phases(run: Run, state: TrainState, with_ref: bool) -> Phases:
    spec = run.step

    def logprob_pass(replay_routes: bool):
        return jax.jit(run_logprob_fn(run, return_routes=False, replay_routes=replay_routes))

    # old_logp replays the rollout's routes; the reference model routes by itself
    logprob = logprob_pass(replay_routes=True) if spec.recompute_old_logp else None
    ref = None
    if with_ref:  # the reference model routes by itself; it reads adapters.reference_view
        ref_fn = run_logprob_fn(run, return_routes=False, replay_routes=False)
        ref = jax.jit(
            lambda params, batch, *temperature: ref_fn(
                adapters.reference_view(spec, params), batch, *temperature
            )
        )
    update = jax.jit(
        make_update_fn(
            run.graphdef,
            run.rest,
            run.objective,
            run.tx,
            temperature=spec.temperature,
            num_epochs=spec.num_epochs,
            num_minibatches=spec.num_minibatches,
            num_microbatches=spec.num_microbatches,
            shuffle=spec.shuffle_minibatches,
            aux_loss_coef=spec.aux_loss_coef,
            mesh=run.mesh,
            trained=adapters.trained_filter(spec),
        ),
        out_shardings=(jax.tree.map(lambda x: x.sharding, state), None),
        donate_argnums=(0,),
    )
    return Phases(
        make_partial_rollout_fn(run) if spec.partial_rollout else make_rollout_fn(run),
        rl_batch.make_shape_fn(run),
        rl_batch.make_select_fn(run),
        rl_batch.make_prepare_fn(run),
        logprob,
        ref,
        update,
        make_route_change_fn(run) if spec.logs_route_change else None,
        rl_batch.make_kl_reward_fn(run) if spec.kl_in_reward and with_ref else None,
    )


@dataclasses.dataclass
class Collected:
    """What collect_rollouts hands to learn_on_batch: one rollout batch of P groups and what the
    step measured making it."""

    sample: Any  # SampleOutput [B, ...]
    shaped: jax.Array  # [B] rewards after overlong shaping
    shaping: jax.Array  # [B] the shaping term
    truncated: jax.Array  # [B] bool: no EOS within T tokens
    prompts: jax.Array  # [P, Lp]
    lengths: jax.Array  # [P]
    metrics: dict  # the rollout's means (scores, lengths, dynamic sampling's counts)
    rollout_s: float  # seconds sampling
    reward_s: float  # seconds scoring and shaping
    # [B, T] f32, multi-turn rows: 1 on the policy's tokens (None: every token is the policy's)
    action_mask: Any = None


def score_rollout(run: Run, phases: Phases, sample, batch_local: dict):
    """Scores this process's rows of a rollout on the host and shapes the rewards on the mesh:
    (the scores and lengths [B] as global arrays, phases.shape's (shaped, shaping, truncated,
    signal))."""
    mesh = run.mesh
    mask_local = distributed.to_local(sample.mask)
    scores = run.task.score(
        batch_local, distributed.to_local(sample.tokens), mask_local, run.step.group_size
    )
    rewards = distributed.to_global(scores["reward"].astype(np.float32), mesh)
    lens = mask_local.sum(-1).astype(np.float32)  # [B] tokens
    part = {
        k: distributed.to_global(v.astype(np.float32), mesh)
        for k, v in {**scores, "length": lens}.items()
    }
    with sharding.use_mesh(mesh):
        return part, phases.shape(sample, rewards)


def collect_partial(
    run: Run,
    phases: Phases,
    state: TrainState,
    keys: dict,
    batch_local: dict,
    more_batches: Callable[[], dict],
    queue: PartialQueue,
) -> Collected:
    """collect_rollouts with partial rollouts (rl/partial.py): the engine works on the carried
    groups and this step's, stops at P complete groups, and the rest is kept in queue for the
    next step. Scores and trains on the P complete groups; logs their tokens' staleness."""
    mesh = run.mesh
    t0 = time.time()
    queue_local, carry = queue.queue(batch_local, more_batches)  # [Q, ...], [Q·G, T]
    glob = lambda x: distributed.to_global(np.asarray(x), mesh)  # noqa: E731
    with sharding.use_mesh(mesh):
        sample, selected, carried, rows = phases.rollout(
            state.params,
            glob(queue_local["prompt"].astype(np.int32)),
            glob(queue_local["prompt_length"].astype(np.int32)),
            keys["rollout"],
            jax.tree.map(glob, carry),
            state.step,
        )
        jax.block_until_ready(sample.tokens)
    t1 = time.time()
    selected, carried = np.asarray(jax.device_get(selected)), np.asarray(jax.device_get(carried))
    queue.keep(queue_local, carried, jax.tree.map(distributed.to_local, rows))
    batch_local = {k: v[selected] for k, v in queue_local.items()}
    prompts = glob(batch_local["prompt"].astype(np.int32))
    lengths = glob(batch_local["prompt_length"].astype(np.int32))
    part, (shaped, shaping, truncated, _) = score_rollout(run, phases, sample, batch_local)
    with sharding.use_mesh(mesh):
        metrics = dict(
            phases.means([part], shaping if run.step.overlong_penalty > 0 else None, None)
        )
        metrics.update(phases.staleness(sample.versions, sample.mask, state.step))
    return Collected(
        sample, shaped, shaping, truncated, prompts, lengths, metrics, t1 - t0, time.time() - t1
    )


def collect_episodes(
    run: Run, phases: Phases, state: TrainState, keys: dict, batch_local: dict
) -> Collected:
    """collect_rollouts of a multi-turn run (config.env, rl/episodes.py): G episodes of each of
    this process's problems played by the multi-turn engine; the rewards are the environment's,
    the batch carries the action mask, and the step's means add each episode's turns, tool calls
    and failed calls (rollout/turns, rollout/tool_calls, rollout/failed_calls)."""
    mesh = run.mesh
    t0 = time.time()
    with sharding.use_mesh(mesh):
        batch, scores = run.env.play(
            rollout_model(run, state.params), batch_local, keys["rollout"], run.step
        )
    t1 = time.time()
    glob = lambda x: distributed.to_global(np.asarray(x), mesh)  # noqa: E731
    sample = jax.tree.map(glob, batch.sample)
    action_mask = glob(np.asarray(batch.action_mask, np.float32))  # [B, T]
    lens = np.asarray(batch.action_mask).sum(-1).astype(np.float32)  # [B] the policy's tokens
    part = {k: glob(v) for k, v in {**scores, "length": lens}.items()}
    with sharding.use_mesh(mesh):
        shaped, shaping, truncated, _ = phases.shape(sample, part["reward"])
        shaping_m = shaping if run.step.overlong_penalty > 0 else None
        metrics = dict(phases.means([part], shaping_m, None))
    prompts = glob(np.asarray(batch.prompts, np.int32))
    lengths = glob(np.asarray(batch.prompt_lengths, np.int32))
    return Collected(
        sample,
        shaped,
        shaping,
        truncated,
        prompts,
        lengths,
        metrics,
        t1 - t0,
        time.time() - t1,
        action_mask,
    )


def count_signal(signal: jax.Array, mesh) -> int:
    """How many groups of ``signal`` [P] (spread over every process's devices) carry a learning
    signal: summed on the mesh into a replicated scalar, which every process can read."""
    with sharding.use_mesh(mesh):
        count = jax.jit(jnp.sum, out_shardings=sharding.replicated(mesh))(signal)
    return int(jax.device_get(count))


def collect_rollouts(
    run: Run,
    phases: Phases,
    state: TrainState,
    keys: dict,
    batch_local: dict,
    more_batches: Callable[[], dict] | None,
) -> Collected:
    """Samples G responses for each of this process's prompts, scores them on the host and shapes
    the rewards; with StepSpec.dynamic_sampling, drops groups whose rewards are all equal and
    draws more prompt batches (more_batches()) until P groups carry a signal or max_gen_batches
    rollouts were made (generation batch g samples with fold_in(the step's resample key, g))."""
    spec, mesh = run.step, run.mesh
    gens, score_parts = [], []
    t_rollout = t_reward = 0.0
    max_gens = spec.max_gen_batches if spec.dynamic_sampling else 1
    n_signal = 0
    for g in range(max_gens):
        t0 = time.time()
        key = keys["rollout"] if g == 0 else phases.resample_key(keys["resample"], g)
        prompts = distributed.to_global(batch_local["prompt"].astype(np.int32), mesh)
        lengths = distributed.to_global(batch_local["prompt_length"].astype(np.int32), mesh)
        with sharding.use_mesh(mesh):
            sample = phases.rollout(state.params, prompts, lengths, key)
            jax.block_until_ready(sample.tokens)
        t1 = time.time()
        part, (shaped, shaping, truncated, signal) = score_rollout(run, phases, sample, batch_local)
        score_parts.append(part)
        gens.append((sample, shaped, shaping, truncated, signal, prompts, lengths))
        t_rollout += t1 - t0
        t_reward += time.time() - t1
        if not spec.dynamic_sampling:
            break
        n_signal += count_signal(signal, mesh)
        if n_signal >= spec.prompts or g + 1 == max_gens:
            break
        batch_local = more_batches()
    metrics, valid = {}, None
    with sharding.use_mesh(mesh):
        if spec.dynamic_sampling:
            sample, shaped, shaping, truncated, valid, prompts, lengths = phases.select(
                *(tuple(field) for field in zip(*gens, strict=True))
            )
            metrics["ds_gen_batches"] = len(gens)
            metrics["ds_groups_filtered_frac"] = 1.0 - n_signal / (len(gens) * spec.prompts)
        else:
            sample, shaped, shaping, truncated, _, prompts, lengths = gens[0]
        metrics.update(
            phases.means(score_parts, shaping if spec.overlong_penalty > 0 else None, valid)
        )
    return Collected(
        sample, shaped, shaping, truncated, prompts, lengths, metrics, t_rollout, t_reward
    )


def learn_on_batch(
    run: Run, phases: Phases, state: TrainState, got: Collected, keys: dict, ref_params
) -> tuple[TrainState, dict, dict, dict, dict[str, float]]:
    """Makes the RLBatch of the collected rollouts (advantages, the optional recomputed old_logp,
    ref_logp and KL-in-reward) and runs the update on it: (state, train metrics, rollout
    metrics, pass metrics, times)."""
    pass_m = dict(got.metrics)
    t2 = time.time()
    with sharding.use_mesh(run.mesh):
        batch, roll_m = phases.prepare(
            got.sample, got.shaped, got.prompts, got.lengths, got.truncated, got.action_mask
        )
        if phases.logprob is not None:
            logp = phases.logprob(state.params, batch)["logp"]
            pass_m.update(phases.recompute_metrics(logp, batch))
            batch = batch.replace(old_logp=logp)
        if phases.ref is not None:
            ref_in = adapters.reference_params(run.step, state.params, ref_params)
            batch = batch.replace(ref_logp=phases.ref(ref_in, batch)["logp"])
        if phases.kl_reward is not None:  # the KL to the reference enters the rewards
            batch, kl_m = phases.kl_reward(batch, got.shaped)
            pass_m.update(kl_m)
        jax.block_until_ready(batch.old_logp)
        t3 = time.time()
        state, train_m = phases.update(state, batch, keys["shuffle"])
        jax.block_until_ready(train_m["loss"])
        t4 = time.time()
        if phases.routes is not None:  # the updated policy's own experts vs the rollout's
            train_m.update(
                jax.block_until_ready(phases.routes(state.params, batch, got.sample.routes))
            )
    t5 = time.time()
    times = {"time/logp_s": t3 - t2, "time/update_s": t4 - t3}
    if phases.routes is not None:
        times["time/route_change_s"] = t5 - t4
    return state, train_m, roll_m, pass_m, times


def rl_step(
    run: Run,
    phases: Phases,
    state: TrainState,
    batch_local: dict,
    *,
    ref_params=None,
    more_batches: Callable[[], dict] | None = None,
    partial: PartialQueue | None = None,
) -> tuple[TrainState, dict[str, float]]:
    """One RL step on this process's prompts ``batch_local``: collect_rollouts, then
    learn_on_batch; returns (state, host metrics).

    With config.rl.dynamic_sampling, ``more_batches()`` draws further prompt batches (the
    trainer's data iterator, whose state is checkpointed after the step, so a resume replays the
    same draws); a run is a pure function of (seed, step) as before.

    Phases are timed with block_until_ready at their boundaries (time/rollout_s, time/reward_s,
    time/logp_s for the optional old/ref passes and advantages, time/update_s, and with
    config.rl.log_route_change time/route_change_s for the pass after the update that logs
    train/route_change_frac).
    """
    if run.step.dynamic_sampling and more_batches is None:
        raise ValueError(
            "config.rl.dynamic_sampling draws more prompt batches: pass more_batches= (a callable "
            "returning this process's next batch, e.g. lambda: next(data_iterator))"
        )
    if run.step.partial_rollout and (partial is None or more_batches is None):
        raise ValueError(
            "config.rl.partial_rollout carries groups between steps: pass partial= (an "
            "rl.partial.PartialQueue around the data iterator) and more_batches="
        )
    step = int(jax.device_get(state.step))
    t_start = time.time()
    keys = phases.keys(state.rng, state.step)
    # The learning rate of the step's first update: optax's jnp arithmetic on a Python int, a
    # host scalar in and out (allowed here: the guard is for the arrays of the step).
    with jax.transfer_guard("allow"):
        lr = run.schedule(step * run.updates_per_step)
    if run.step.partial_rollout:
        got = collect_partial(run, phases, state, keys, batch_local, more_batches, partial)
    elif run.env is not None:  # multi-turn episodes (config.env)
        got = collect_episodes(run, phases, state, keys, batch_local)
    else:
        got = collect_rollouts(run, phases, state, keys, batch_local, more_batches)
    state, train_m, roll_m, pass_m, times = learn_on_batch(
        run, phases, state, got, keys, ref_params
    )
    return state, host_metrics(
        train_m,
        roll_m,
        pass_m,
        lr=lr,
        times={
            "time/rollout_s": got.rollout_s,
            "time/reward_s": got.reward_s,
            **times,
            "time/step_s": time.time() - t_start,
        },
    )


def host_metrics(train_m, roll_m, pass_m, *, lr, times: dict[str, float]) -> dict[str, float]:
    """The step's metrics, named, on the host (one jax.device_get), with its times and rates."""
    m = metrics_lib.with_prefix("train/", train_m)
    m["train/lr"] = lr
    # The trainer-vs-sampler log-prob difference is about the rollout: report it there.
    m["rollout/logp_diff_mean"] = m.pop("train/logp_diff_mean")
    m["rollout/logp_diff_absmax"] = m.pop("train/logp_diff_absmax")
    m.update(metrics_lib.with_prefix("rollout/", roll_m))
    m.update(metrics_lib.with_prefix("rollout/", pass_m))
    m = metrics_lib.to_host_scalars(m)
    m.update(times)
    m["time/tokens_per_s"] = m["rollout/tokens"] / max(times["time/step_s"], 1e-9)
    m["time/rollout_tokens_per_s"] = m["rollout/tokens"] / max(times["time/rollout_s"], 1e-9)
    return m
