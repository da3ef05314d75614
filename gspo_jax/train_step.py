"""One RL step: train state, the jitted phases (rollout, prepare, log-prob passes, update), rl_step.

    phases = train_step.make_phases(run, state, with_ref=False)
    state, host_metrics = train_step.rl_step(run, phases, state, batch_local)

trainer.py is the run loop around rl_step; experiment.py builds the Run (task, model, objective,
optimizer, mesh) it takes.

Dimension legend: B = P*G response rows of one rollout batch (group-contiguous), Bm = B/K rows of
a minibatch, Bu = Bm/U rows of a micro-batch, K minibatches per epoch, U micro-batches per
minibatch, Lp padded prompt length, T padded response length (= max_new_tokens), L layers, S = Lp+T
sequence slots, k experts per token.

An RL batch is a dict of arrays with a leading B axis:

    prompts        [B, Lp] int32   each prompt repeated G times (response_logprobs wants rows)
    prompt_lengths [B] int32
    responses      [B, T] int32
    mask           [B, T] f32      1 up to and including EOS
    old_logp       [B, T] f32      π_old, from the sampler (default) or recomputed
    adv            [B] f32         group advantages ([B, T] for the REINFORCE++ estimators or
                                   rl.token_advantages)
    ref_logp       [B, T] f32      only when kl_coef > 0 (and not rl.kl_in_reward: there it
                                   enters the advantages, see make_kl_reward_fn)
    routes         [B, L, S, k]    only with Routing Replay (batch-major here; the model wants
                                   [L, B, S, k], transposed at the call)

With config.rl.log_route_change (MoE) the rollout also returns its routes, but they enter the batch
(and so the update and the old_logp recomputation) only with config.rl.routing_replay; after the
update a forward pass with the new parameters routes afresh and ``route_change_frac`` compares its
experts with the rollout's (train/route_change_frac, see route_change_frac).

``make_update_fn`` builds the pure function (state, batch) -> (state, metrics) that runs μ epochs
over K minibatches, each one optax step. Everything happens in one jit call: minibatches are picked
by a per-epoch permutation (``jax.random.fold_in(rng, step)``) and scanned, so the host dispatches
once per RL step and the train state is donated.

Global normalisation (docs/objectives.md "Aggregation"): the minibatch's normaliser comes from
``objective.denominator(mask)`` over the whole minibatch before any forward pass; with U > 1 the
gradient is Σ_u ∇ num_u / den (gradient accumulation that equals the un-accumulated step), and
under batch sharding XLA's sums are global, so a sharded step equals the single-device step.

The rollout-vs-trainer log-prob difference comes for free: the first minibatch of the first epoch is
evaluated with the parameters that sampled the rollout, so mean(logp − old_logp) there is exactly
what a recompute would report (when old_logp comes from the sampler).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from gspo_jax import advantages, distributed, models, sampler, sharding
from gspo_jax import metrics as metrics_lib
from gspo_jax.experiment import Run, TrainState, step_keys

# ------------------------------------------------------------------------------------ helpers


def _constrain_rows(x: jax.Array, row_spec: Any, mesh) -> jax.Array:
    """Keeps a [rows, ...] array sharded over the batch axes (a no-op without a mesh)."""
    if mesh is None:
        return x
    spec = PartitionSpec(row_spec, *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _chunk_rows(tree: dict, n: int, row_spec, mesh) -> dict:
    """[B, ...] -> [n, B/n, ...] with rows of chunk c = c*B/n ... (c+1)*B/n - 1."""

    def one(x):
        y = x.reshape(n, x.shape[0] // n, *x.shape[1:])
        if mesh is None:
            return y
        spec = PartitionSpec(None, row_spec, *([None] * (x.ndim - 1)))
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, spec))

    return jax.tree.map(one, tree)


def _masked_mean(x, mask):
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def _forward(
    graphdef, params, rest, mb: dict, temperature: float, *, return_routes=False, with_entropy=True
):
    """response_logprobs of a batch dict (routes, if present, are replayed)."""
    model = nnx.merge(graphdef, params, rest)
    routes = mb.get("routes")
    if routes is not None:
        routes = jnp.swapaxes(routes, 0, 1)  # [B, L, S, k] -> [L, B, S, k]
    out = models.response_logprobs(
        model,
        mb["prompts"],
        mb["prompt_lengths"],
        mb["responses"],
        temperature=temperature,
        routes=routes,
        return_routes=return_routes,
        response_mask=mb["mask"],
        with_entropy=with_entropy,
    )
    if return_routes:
        out["routes"] = jnp.swapaxes(out["routes"], 0, 1)  # -> [B, L, S, k]
    return out


# ------------------------------------------------------------------------------------ passes


def make_logprob_fn(
    graphdef,
    rest,
    *,
    temperature: float,
    num_chunks: int,
    return_routes: bool,
    row_spec,
    mesh,
    replay_routes: bool = True,
) -> Callable:
    """(params, batch) -> dict(logp [B, T] (, routes [B, L, S, k])): a forward-only pass.

    Used to recompute old_logp (replaying the batch's routes when it has them and
    ``replay_routes``), for the reference model's ref_logp (its own routing: replay_routes=False),
    or to record routes. Runs in ``num_chunks`` sequential chunks of rows to bound memory.
    """

    def fn(params, batch):
        keys = ("prompts", "prompt_lengths", "responses", "mask")
        keys += ("routes",) if replay_routes else ()
        fields = {k: batch[k] for k in keys if k in batch}
        chunks = _chunk_rows(fields, num_chunks, row_spec, mesh)

        def one(mb):
            out = _forward(
                graphdef,
                params,
                rest,
                mb,
                temperature,
                return_routes=return_routes,
                with_entropy=False,  # old_logp, ref_logp, routes: no entropy needed
            )
            keep = ("logp", "routes") if return_routes else ("logp",)
            return {k: out[k] for k in keep}

        out = jax.lax.map(one, chunks)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    return fn


def make_update_fn(
    graphdef,
    rest,
    objective,
    tx: optax.GradientTransformation,
    *,
    temperature: float,
    num_epochs: int,
    num_minibatches: int,
    num_microbatches: int = 1,
    shuffle: bool = True,
    aux_loss_coef: float = 0.0,
    row_spec=None,
    mesh=None,
) -> Callable:
    """(state, batch, shuffle_key) -> (state, metrics): μ epochs × K minibatches of optax steps.

    metrics (scalars): loss and the objective's finalised metrics averaged over the μ·K updates
    (ratio_min / ratio_max: min / max over them), grad_norm (mean and max), update_norm, entropy,
    aux_loss, and logp_diff_mean / logp_diff_absmax of the very first minibatch (pre-update
    parameters: the rollout-vs-trainer log-prob difference).
    """
    K, U = num_minibatches, num_microbatches

    def micro_loss(params, mb, den):
        out = _forward(graphdef, params, rest, mb, temperature)
        rollout = {"rollout_logp": mb["rollout_logp"]} if "rollout_logp" in mb else {}
        # The entropy is computed in the log-prob pass anyway (for the metric); its gradient is
        # taken only when a term of the objective reads it.
        entropy = {"entropy": out["entropy"]} if objective.needs_entropy else {}
        sums = objective.sums(
            out["logp"],
            mb["old_logp"],
            mb["adv"],
            mb["mask"],
            mb.get("ref_logp"),
            **rollout,
            **entropy,
        )
        mask = mb["mask"]
        diff = (out["logp"] - mb["old_logp"]) * mask
        extra = {
            "entropy_sum": (out["entropy"] * mask).sum(),
            "tokens": mask.sum(),
            "logp_diff_sum": diff.sum(),
            "logp_diff_absmax": jnp.abs(diff).max(),
            "aux_loss": out["aux_loss"],
        }
        # num/den with the whole minibatch's den: summing these over micro-batches gives the loss
        # (and gradient) of the un-accumulated minibatch.
        value = sums.num / jnp.maximum(den, 1.0) + aux_loss_coef * out["aux_loss"] / U
        return value, (sums, extra)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def minibatch_step(carry, mb):
        params, opt_state = carry
        mb = jax.tree.map(lambda x: _constrain_rows(x, row_spec, mesh), mb)
        den = objective.denominator(mb["mask"])  # whole-minibatch normaliser, mask only
        if U == 1:
            (_, (sums, extra)), grads = grad_fn(params, mb, den)
        else:
            micro = _chunk_rows(mb, U, row_spec, mesh)

            def acc(g_sum, m):
                (_, aux), g = grad_fn(params, m, den)
                return jax.tree.map(jnp.add, g_sum, g), aux

            zeros = jax.tree.map(jnp.zeros_like, params)
            grads, (sums_u, extra_u) = jax.lax.scan(acc, zeros, micro)
            sums = sums_u.reduce_stacked()
            extra = {
                "entropy_sum": extra_u["entropy_sum"].sum(),
                "tokens": extra_u["tokens"].sum(),
                "logp_diff_sum": extra_u["logp_diff_sum"].sum(),
                "logp_diff_absmax": extra_u["logp_diff_absmax"].max(),
                "aux_loss": extra_u["aux_loss"].mean(),
            }
        loss, m = sums.finalize()
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        tokens = jnp.maximum(extra["tokens"], 1.0)
        m = dict(m)
        m.update(
            loss=loss,
            grad_norm=optax.global_norm(grads),
            update_norm=optax.global_norm(updates),
            entropy=extra["entropy_sum"] / tokens,
            aux_loss=extra["aux_loss"],
            logp_diff_mean=extra["logp_diff_sum"] / tokens,
            logp_diff_absmax=extra["logp_diff_absmax"],
        )
        return (params, opt_state), m

    def update(state: TrainState, batch: dict, shuffle_key: jax.Array):
        B, T = batch["mask"].shape
        chex.assert_shape([batch["responses"], batch["old_logp"]], (B, T))
        chex.assert_shape(batch["prompt_lengths"], (B,))
        if batch["adv"].shape not in ((B,), (B, T)):  # per response, or per token
            raise ValueError(f"adv has shape {batch['adv'].shape}; need {(B,)} or {(B, T)}")
        chex.assert_rank(batch["prompts"], 2)
        if B % K:
            raise ValueError(
                f"{B} rows do not split into {K} minibatches; see experiment.make_mesh"
            )
        key = jax.random.wrap_key_data(shuffle_key)
        if shuffle:
            perms = [
                jax.random.permutation(jax.random.fold_in(key, e), B) for e in range(num_epochs)
            ]
        else:
            perms = [jnp.arange(B) for _ in range(num_epochs)]
        idx = jnp.stack(perms).reshape(num_epochs * K, B // K)  # [μK, Bm] rows of each minibatch

        def body(carry, rows):
            mb = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), batch)
            return minibatch_step(carry, mb)

        (params, opt_state), ms = jax.lax.scan(body, (state.params, state.opt_state), idx)
        metrics = {}
        for k, v in ms.items():
            if k.endswith("_min"):
                metrics[k] = v.min()
            elif k.endswith("_max") or k == "logp_diff_absmax":
                metrics[k] = v.max()
            else:
                metrics[k] = v.mean()
        metrics["grad_norm_max"] = ms["grad_norm"].max()
        # Before any update of this step: the trainer's log-probs vs the rollout's.
        metrics["logp_diff_mean"] = ms["logp_diff_mean"][0]
        metrics["logp_diff_absmax"] = ms["logp_diff_absmax"][0]
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    return update


# ---------------------------------------------------------------------------------- RL step phases


def overlong_penalty(
    lengths: jax.Array, truncated: jax.Array, max_len: int, buffer: int, penalty: float
) -> jax.Array:
    """DAPO's overlong reward shaping (its eq. 13), in tokens: [B] lengths -> [B] reward terms.

        0                                          |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache * pen  inside the buffer
        -pen                                       truncated (no EOS within L_max tokens)

    with L_max = max_len (= max_new_tokens) and L_cache = buffer; buffer = 0 gives only the
    truncation term.
    """
    chex.assert_equal_shape([lengths, truncated])
    lengths = lengths.astype(jnp.float32)
    soft = max_len - buffer
    inside = jnp.where(lengths > soft, (soft - lengths) / max(buffer, 1) * penalty, 0.0)
    return jnp.where(truncated, -penalty, inside)


def make_rollout_fn(run: Run):
    """(params, prompts [P, Lp], lengths [P], key) -> SampleOutput, rows sharded over the mesh.

    generate() is traced inside this jit so the rollout compiles once with the trainer's
    shardings (its host-side checks then see tracers; the data was checked by the loader). The
    rollout computes in config.rl.rollout_dtype (run.rollout_graphdef) from the float32 parameters.
    """
    rl = run.config.rl
    eos_id, pad_id = run.task.tokenizer.eos_id, run.task.tokenizer.pad_id
    # Routing Replay replays the rollout's routes; log_route_change compares them after the update
    with_routes = rl.routing_replay or rl.log_route_change

    def fn(params, prompts, lengths, key):
        model = nnx.merge(run.rollout_graphdef, params, run.rest)
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
            return_routes=with_routes,
        )

    rows = sharding.row_spec(run.mesh)
    out_sh = sampler.SampleOutput(
        tokens=sharding.rows_sharding(run.mesh, 2),
        mask=sharding.rows_sharding(run.mesh, 2),
        logp=sharding.rows_sharding(run.mesh, 2),
        sample_logp=sharding.rows_sharding(run.mesh, 2),
        lengths=sharding.rows_sharding(run.mesh, 1),
        # [L, B, S, k]: the rollout's expert choices (Routing Replay, route-change metric)
        routes=NamedSharding(run.mesh, PartitionSpec(None, rows, None, None))
        if with_routes
        else None,
    )
    return jax.jit(fn, out_shardings=out_sh)


def make_shape_fn(run: Run):
    """(sample, rewards [B]) -> Rollout: the verifier's rewards plus overlong shaping, and which
    groups carry a learning signal (rewards not all equal)."""
    rl = run.config.rl
    G, T = rl.group_size, rl.max_new_tokens
    eos_id = run.task.tokenizer.eos_id

    def fn(sample, rewards):
        B = rewards.shape[0]
        chex.assert_shape([sample.tokens, sample.mask], (B, T))
        lens = sample.mask.sum(-1)  # [B] tokens, EOS included
        has_eos = ((sample.tokens == eos_id) & (sample.mask > 0)).any(-1)
        truncated = (~has_eos) & (lens >= T)  # [B]
        shaping = jnp.zeros_like(rewards)
        if rl.overlong_penalty > 0:
            shaping = overlong_penalty(lens, truncated, T, rl.overlong_buffer, rl.overlong_penalty)
        shaped = rewards + shaping
        by_group = shaped.reshape(B // G, G)
        signal = by_group.max(-1) > by_group.min(-1)  # [P]
        return shaped, shaping, truncated, signal

    return jax.jit(fn)


def make_select_fn(run: Run):
    """Dynamic sampling: n generation batches -> one batch of the first P groups with signal.

    (samples, rewards, shaping, truncated, signal, prompts, lengths), each a tuple over the n
    batches, -> the same fields of P groups, and valid [P]: groups with signal come first, in the
    order they were generated; if fewer than P have signal, the rest are zero-signal groups whose
    response mask is zeroed (they change nothing, see docs/objectives.md on empty rows).
    """
    G, P = run.config.rl.group_size, run.config.rl.prompts_per_step

    def fn(samples, rewards, shaping, truncated, signal, prompts, lengths):
        cat = lambda xs, axis=0: jnp.concatenate(xs, axis=axis)  # noqa: E731
        signal = cat(signal)  # [nP]
        groups = jnp.argsort(~signal, stable=True)[:P]  # [P] signal first, in generated order
        valid = signal[groups]  # [P]
        rows = (groups[:, None] * G + jnp.arange(G)[None, :]).reshape(-1)  # [B]
        row_valid = jnp.repeat(valid, G)  # [B]
        take = lambda xs, idx, axis=0: jnp.take(cat(xs, axis), idx, axis=axis)  # noqa: E731
        sample = sampler.SampleOutput(
            tokens=take([s.tokens for s in samples], rows),
            mask=take([s.mask for s in samples], rows) * row_valid[:, None],
            logp=take([s.logp for s in samples], rows),
            sample_logp=take([s.sample_logp for s in samples], rows),
            lengths=take([s.lengths for s in samples], rows),
            routes=None
            if samples[0].routes is None
            else take([s.routes for s in samples], rows, axis=1),
        )
        return (
            sample,
            take(rewards, rows),
            take(shaping, rows),
            take(truncated, rows),
            valid,
            take(prompts, groups),
            take(lengths, groups),
        )

    return jax.jit(fn)


def make_prepare_fn(run: Run):
    """(sample, rewards [B], prompts, lengths, truncated [B]) -> (RL batch, rollout metrics).

    Advantages from the (shaped) rewards; with config.rl.mask_truncated a truncated response is
    masked out of the loss. With config.rl.recompute_old_logp the sampler's log-probs are kept
    as ``rollout_logp`` (the objective's rollout correction / off-policy masking read them) and
    old_logp is replaced by the trainer's recomputation.
    """
    rl = run.config.rl
    G, T = rl.group_size, rl.max_new_tokens
    eos_id = run.task.tokenizer.eos_id

    def fn(sample, rewards, prompts, lengths, truncated):
        B = prompts.shape[0] * G
        chex.assert_shape([sample.tokens, sample.mask, sample.logp], (B, T))
        chex.assert_shape([rewards, truncated], (B,))
        mask = sample.mask
        if rl.mask_truncated:
            mask = mask * (~truncated)[:, None]
        adv, adv_metrics = run_advantages(run, rewards, mask)
        batch = {
            "prompts": jnp.repeat(prompts, G, axis=0),  # [B, Lp]
            "prompt_lengths": jnp.repeat(lengths, G, axis=0),  # [B]
            "responses": sample.tokens,
            "mask": mask,
            "old_logp": sample.logp,
            "adv": adv,
        }
        if run.uses_rollout_logp:
            batch["rollout_logp"] = sample.logp  # [B, T] the rollout engine's log-probs
        if rl.routing_replay:  # the update replays the rollout's experts
            # (with only log_route_change the routes stay out of the batch: the update routes
            # afresh, and rl_step compares the rollout's routes after it)
            batch["routes"] = jnp.swapaxes(sample.routes, 0, 1)  # [B, L, S, k]
        batch = {
            k: jax.lax.with_sharding_constraint(v, sharding.rows_sharding(run.mesh, v.ndim))
            for k, v in batch.items()
        }
        lens = sample.mask.sum(-1)  # [B]; 0 only for dynamic sampling's masked filler rows
        has_eos = ((sample.tokens == eos_id) & (sample.mask > 0)).any(-1)
        rows = jnp.maximum((lens > 0).sum(), 1)
        m = {
            "response_len_mean": lens.sum() / rows,
            "response_len_max": lens.max(),
            "truncated_frac": ((~has_eos) & (lens >= T)).sum() / rows,
            "frac_zero_std_groups": adv_metrics["frac_zero_std_groups"],
            "reward_std": adv_metrics["reward_std"],
            "adv_abs_mean": _adv_abs_mean(adv, mask),
            "sample_logp_mean": (sample.logp * sample.mask).sum() / jnp.maximum(lens.sum(), 1),
            "tokens": lens.sum(),
        }
        return batch, m

    return jax.jit(fn)


def run_advantages(run: Run, rewards: jax.Array, mask: jax.Array):
    """The run's advantages of rewards ([B] per response, or [B, T] per token) and their metrics:
    [B], or [B, T] for the REINFORCE++ estimators and with rl.token_advantages (each response's
    advantage on its tokens)."""
    rl = run.config.rl
    adv, adv_metrics = advantages.group_advantages(
        rewards,
        rl.group_size,
        estimator=run.estimator,
        eps=rl.adv_eps,
        std_ddof=rl.adv_std_ddof,
        scale_rewards=rl.get("scale_rewards", "group"),
        mask=mask,
    )
    if adv.ndim == 1 and rl.token_advantages:
        adv = jnp.broadcast_to(adv[:, None], mask.shape)
    return adv, adv_metrics


def _adv_abs_mean(adv: jax.Array, mask: jax.Array) -> jax.Array:
    """mean |A| over responses ([B]) or over response tokens ([B, T])."""
    if adv.ndim == 1:
        return jnp.abs(adv).mean()
    return _masked_mean(jnp.abs(adv), mask)


def make_kl_reward_fn(run: Run):
    """rl.kl_in_reward (verl's use_kl_in_reward): (batch with ref_logp, rewards [B]) -> (batch,
    metrics). The token rewards become r_{i,t} = r_i·[t = last] − β·k1_{i,t}, k1 = old_logp −
    ref_logp (β = the objective's kl_coef), the advantages are recomputed from them (a group
    estimator sums them over the response), and ref_logp leaves the batch, so that the loss
    has no KL term of its own. Jitted."""
    beta = run.objective.kl_coef

    def fn(batch, rewards):
        mask = batch["mask"]
        k1 = (batch["old_logp"] - batch["ref_logp"]) * mask  # [B, T]
        if run.estimator in advantages.TOKEN_ESTIMATORS:  # REINFORCE++: per token
            shaped = advantages.outcome_token_rewards(rewards, mask) - beta * k1  # [B, T]
        else:  # the same summed over the response (keeps a masked-out row's own reward)
            shaped = rewards - beta * k1.sum(-1)  # [B]
        adv, _ = run_advantages(run, shaped, mask)
        out = {k: v for k, v in batch.items() if k != "ref_logp"}
        out["adv"] = adv
        rows = jnp.maximum((mask.sum(-1) > 0).sum(), 1)
        m = {
            "kl_reward_k1_mean": _masked_mean(k1, mask),  # per token
            "kl_reward_penalty_mean": beta * k1.sum() / rows,  # β·Σ_t k1 per response
            "kl_reward_adv_abs_mean": _adv_abs_mean(adv, mask),
        }
        return out, m

    return jax.jit(fn)


def mismatch_metrics(old_logp: jax.Array, rollout_logp: jax.Array, mask: jax.Array) -> dict:
    """Training-inference mismatch Δ = old_logp − rollout_logp [B, T]: mean / max |Δ| per token,
    |Σ_t Δ| per sequence (the log of the sequence ratio the correction modes weigh) and
    |Σ_t Δ| / |y| per sequence (the log of the geometric-mean ratio GSPO's ε is compared with)."""
    delta = (old_logp - rollout_logp) * mask  # [B, T]
    seq = jnp.abs(delta.sum(-1))  # [B]
    lens = mask.sum(-1)  # [B]
    has = lens > 0  # [B]
    geo = seq / jnp.maximum(lens, 1.0)  # [B]
    rows = jnp.maximum(has.sum(), 1)
    return {
        "mismatch_tok_abs_mean": jnp.abs(delta).sum() / jnp.maximum(mask.sum(), 1.0),
        "mismatch_tok_abs_max": jnp.abs(delta).max(),
        "mismatch_seq_abs_mean": (seq * has).sum() / rows,
        "mismatch_seq_abs_max": seq.max(),
        "mismatch_geo_abs_mean": (geo * has).sum() / rows,
        "mismatch_geo_abs_max": geo.max(),
    }


def route_change_frac(
    old_routes: jax.Array, new_routes: jax.Array, prompt_lengths: jax.Array, mask: jax.Array
) -> jax.Array:
    """Fraction of (response token, layer) pairs whose set of top-k experts differs.

    old_routes, new_routes [B, L, S, k] (S = Lp + T slots), prompt_lengths [B], mask [B, T].
    The experts of response token t are those of the slot whose hidden state predicts it (as in
    models.response_logprobs): the last prompt slot n - 1 for t = 0, else slot Lp + t - 1, the
    previous response token. These are the routes that enter log p(y_t), and the sampler fed
    every one of them for every valid t (the slot of the last response token itself may never be
    fed, so the rollout's routes there are zeros). Only mask > 0 tokens count; the k indices are
    sorted before comparing (a set, not an order). 0 when no token is valid.
    """
    B, L, S, k = old_routes.shape
    T = mask.shape[1]
    chex.assert_shape(new_routes, (B, L, S, k))
    chex.assert_shape(prompt_lengths, (B,))
    t = jnp.arange(T, dtype=jnp.int32)[None, :]
    Lp = S - T
    src = jnp.where(t == 0, prompt_lengths.astype(jnp.int32)[:, None] - 1, Lp + t - 1)  # [B, T]
    idx = src[:, None, :, None]  # [B, 1, T, 1]

    def experts(r):  # [B, L, S, k] -> the sorted experts of each response token [B, L, T, k]
        return jnp.sort(jnp.take_along_axis(r, idx, axis=2), axis=-1)

    changed = jnp.any(experts(old_routes) != experts(new_routes), axis=-1)  # [B, L, T]
    weight = (mask > 0).astype(jnp.float32)[:, None, :]  # [B, 1, T]
    return (changed * weight).sum() / jnp.maximum(weight.sum() * L, 1.0)


def run_logprob_fn(run: Run, *, return_routes: bool, replay_routes: bool) -> Callable:
    """make_logprob_fn with the run's model, temperature, chunking (one chunk per minibatch) and
    mesh: the old_logp recompute, the reference pass and the route-change pass (not jitted)."""
    rl = run.config.rl
    return make_logprob_fn(
        run.graphdef,
        run.rest,
        temperature=rl.temperature,
        num_chunks=rl.num_minibatches,
        return_routes=return_routes,
        row_spec=sharding.row_spec(run.mesh),
        mesh=run.mesh,
        replay_routes=replay_routes,
    )


def make_route_change_fn(run: Run) -> Callable:
    """(params, batch, rollout_routes [L, B, S, k]) -> dict(route_change_frac): the routes the
    given parameters choose by themselves (one forward-only pass, never replaying) against the
    rollout's, over the batch's valid response tokens (route_change_frac). Jitted; rows stay
    sharded over the mesh."""
    row_spec = sharding.row_spec(run.mesh)
    own_routes = run_logprob_fn(run, return_routes=True, replay_routes=False)

    def fn(params, batch, rollout_routes):
        new = _constrain_rows(own_routes(params, batch)["routes"], row_spec, run.mesh)
        old = _constrain_rows(jnp.swapaxes(rollout_routes, 0, 1), row_spec, run.mesh)
        frac = route_change_frac(old, new, batch["prompt_lengths"], batch["mask"])
        return {"route_change_frac": frac}

    return jax.jit(fn)


@dataclasses.dataclass
class Phases:
    """The jitted functions of one RL step (built once per run; see rl_step)."""

    rollout: Any
    shape: Any  # overlong shaping and per-group signal
    select: Any  # dynamic sampling: P groups out of several generation batches
    prepare: Any
    logprob: Any  # recompute old_logp / record routes; None when neither is configured
    ref: Any  # the reference model's log-probs; None when kl_coef == 0
    update: Any
    # after the update: the new parameters' own routes vs the rollout's; None unless
    # config.rl.log_route_change
    routes: Any = None
    # rl.kl_in_reward: the advantages again, from rewards minus β·KL (after the reference pass)
    kl_reward: Any = None


def make_phases(run: Run, state: TrainState, with_ref: bool) -> Phases:
    rl = run.config.rl
    row_spec = sharding.row_spec(run.mesh)

    def logprob_pass(replay_routes: bool):
        return jax.jit(run_logprob_fn(run, return_routes=False, replay_routes=replay_routes))

    # old_logp replays the rollout's routes; the reference model routes by itself
    logprob = logprob_pass(replay_routes=True) if rl.recompute_old_logp else None
    ref = logprob_pass(replay_routes=False) if with_ref else None
    update = jax.jit(
        make_update_fn(
            run.graphdef,
            run.rest,
            run.objective,
            run.tx,
            temperature=rl.temperature,
            num_epochs=rl.num_epochs,
            num_minibatches=rl.num_minibatches,
            num_microbatches=rl.num_microbatches,
            shuffle=rl.shuffle_minibatches,
            aux_loss_coef=rl.aux_loss_coef,
            row_spec=row_spec,
            mesh=run.mesh,
        ),
        out_shardings=(jax.tree.map(lambda x: x.sharding, state), None),
        donate_argnums=(0,),
    )
    return Phases(
        make_rollout_fn(run),
        make_shape_fn(run),
        make_select_fn(run),
        make_prepare_fn(run),
        logprob,
        ref,
        update,
        make_route_change_fn(run) if rl.log_route_change else None,
        make_kl_reward_fn(run) if rl.get("kl_in_reward", False) and with_ref else None,
    )


def rl_step(
    run: Run,
    phases: Phases,
    state: TrainState,
    batch_local: dict,
    *,
    ref_params=None,
    more_batches: Callable[[], dict] | None = None,
) -> tuple[TrainState, dict[str, float]]:
    """One RL step on this process's prompts ``batch_local``; returns (state, host metrics).

    With config.rl.dynamic_sampling, groups whose rewards are all equal are dropped and further
    prompt batches are drawn with ``more_batches()`` (the trainer's data iterator, whose state is
    checkpointed after the step, so a resume replays the same draws) until P groups carry a
    signal or config.rl.max_gen_batches rollouts were made; generation batch g samples with
    fold_in(the step's resample key, g), so a run is a pure function of (seed, step) as before.

    Phases are timed with block_until_ready at their boundaries (time/rollout_s, time/reward_s,
    time/logp_s for the optional old/ref passes and advantages, time/update_s, and with
    config.rl.log_route_change time/route_change_s for the pass after the update that logs
    train/route_change_frac).
    """
    rl, mesh = run.config.rl, run.mesh
    if rl.dynamic_sampling and more_batches is None:
        raise ValueError(
            "config.rl.dynamic_sampling draws more prompt batches: pass more_batches= (a callable "
            "returning this process's next batch, e.g. lambda: next(data_iterator))"
        )
    step = int(jax.device_get(state.step))
    t_start = time.time()
    keys = step_keys(np.asarray(jax.device_get(state.rng)), step)
    gens, score_parts = [], []
    t_rollout = t_reward = 0.0
    max_gens = rl.max_gen_batches if rl.dynamic_sampling else 1
    n_signal = 0
    for g in range(max_gens):
        t0 = time.time()
        key = keys["rollout"]
        if g > 0:
            resample = jax.random.wrap_key_data(keys["resample"])
            key = jax.random.key_data(jax.random.fold_in(resample, g))
        prompts = distributed.to_global(batch_local["prompt"].astype(np.int32), mesh)
        lengths = distributed.to_global(batch_local["prompt_length"].astype(np.int32), mesh)
        with sharding.use_mesh(mesh):
            sample = phases.rollout(state.params, prompts, lengths, key)
            jax.block_until_ready(sample.tokens)
        t1 = time.time()
        scores = run.task.score(
            batch_local,
            distributed.to_local(sample.tokens),
            distributed.to_local(sample.mask),
            rl.group_size,
        )
        rewards = distributed.to_global(scores["reward"].astype(np.float32), mesh)
        score_parts.append(
            {k: distributed.to_global(v.astype(np.float32), mesh) for k, v in scores.items()}
        )
        with sharding.use_mesh(mesh):
            shaped, shaping, truncated, signal = phases.shape(sample, rewards)
        gens.append((sample, shaped, shaping, truncated, signal, prompts, lengths))
        t_rollout += t1 - t0
        t_reward += time.time() - t1
        if not rl.dynamic_sampling:
            break
        n_signal += int(jax.device_get(signal.sum()))
        if n_signal >= rl.prompts_per_step or g + 1 == max_gens:
            break
        batch_local = more_batches()
    t2 = time.time()
    pass_m = {}
    with sharding.use_mesh(mesh):
        if rl.dynamic_sampling:
            sample, shaped, shaping, truncated, valid, prompts, lengths = phases.select(
                *(tuple(field) for field in zip(*gens, strict=True))
            )
            pass_m["ds_gen_batches"] = len(gens)
            pass_m["ds_groups_filtered_frac"] = 1.0 - n_signal / (len(gens) * rl.prompts_per_step)
            pass_m["ds_valid_groups_frac"] = valid.mean()
        else:
            sample, shaped, shaping, truncated, _, prompts, lengths = gens[0]
        batch, roll_m = phases.prepare(sample, shaped, prompts, lengths, truncated)
        if rl.overlong_penalty > 0:
            pass_m["overlong_shaping_mean"] = shaping.mean()
        if phases.logprob is not None:
            out = phases.logprob(state.params, batch)
            diff = (out["logp"] - batch["old_logp"]) * batch["mask"]
            pass_m["recompute_logp_diff_mean"] = diff.sum() / jnp.maximum(batch["mask"].sum(), 1.0)
            pass_m["recompute_logp_diff_absmax"] = jnp.abs(diff).max()
            pass_m.update(mismatch_metrics(out["logp"], batch["old_logp"], batch["mask"]))
            batch["old_logp"] = out["logp"]
        if phases.ref is not None:
            batch["ref_logp"] = phases.ref(ref_params, batch)["logp"]
        if phases.kl_reward is not None:  # the KL to the reference enters the rewards
            batch, kl_m = phases.kl_reward(batch, shaped)
            pass_m.update(kl_m)
        jax.block_until_ready(batch["old_logp"])
        t3 = time.time()
        state, train_m = phases.update(state, batch, keys["shuffle"])
        jax.block_until_ready(train_m["loss"])
        t4 = time.time()
        if phases.routes is not None:  # the updated policy's own experts vs the rollout's
            fields = ("prompts", "prompt_lengths", "responses", "mask")
            route_m = phases.routes(state.params, {k: batch[k] for k in fields}, sample.routes)
            train_m.update(jax.block_until_ready(route_m))
    t5 = time.time()

    m = metrics_lib.with_prefix("train/", train_m)
    m["train/lr"] = run.schedule(step * run.updates_per_step)
    # The trainer-vs-sampler log-prob difference is about the rollout: report it there.
    m["rollout/logp_diff_mean"] = m.pop("train/logp_diff_mean")
    m["rollout/logp_diff_absmax"] = m.pop("train/logp_diff_absmax")
    m.update(metrics_lib.with_prefix("rollout/", roll_m))
    m.update(metrics_lib.with_prefix("rollout/", pass_m))
    # The verifier's scores of every response generated this step (all generation batches).
    for k in score_parts[0]:
        m[f"rollout/{k}"] = jnp.mean(jnp.stack([jnp.mean(p[k]) for p in score_parts]))
    m = metrics_lib.to_host_scalars(m)
    m.update(
        {
            "time/rollout_s": t_rollout,
            "time/reward_s": t_reward,
            "time/logp_s": t3 - t2,
            "time/update_s": t4 - t3,
            "time/step_s": t5 - t_start,
            "time/tokens_per_s": m["rollout/tokens"] / max(t5 - t_start, 1e-9),
            "time/rollout_tokens_per_s": m["rollout/tokens"] / max(t_rollout, 1e-9),
        }
    )
    if phases.routes is not None:
        m["time/route_change_s"] = t5 - t4
    return state, m
