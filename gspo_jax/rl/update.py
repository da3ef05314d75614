"""The update: μ epochs over K minibatches of an RL batch, each one optax step, in one jit call.

    update = jax.jit(make_update_fn(graphdef, rest, objective, tx, ...), donate_argnums=(0,))
    state, metrics = update(state, batch, shuffle_key)    # batch: rl_batch.RLBatch

Dimension legend: B rows of the RL batch, Bm = B/K rows of a minibatch, Bu = Bm/U rows of a
micro-batch, K minibatches per epoch, U micro-batches per minibatch, μ epochs, T response length.

Minibatches are picked by a per-epoch permutation (the step's shuffle key folded with the epoch)
and scanned, so the host dispatches once per RL step and the train state is donated.

Global normalisation (docs/objectives.md "Aggregation"): the minibatch's normaliser comes from
``objective.denominator(mask)`` over the whole minibatch before any forward pass; with U > 1 the
gradient is Σ_u ∇ num_u / den (gradient accumulation that equals the un-accumulated step), and
under batch sharding XLA's sums are global, so a sharded step equals the single-device step.

The loss sees the batch's ``loss_mask`` (its action mask: the policy's tokens); the forward pass
reads every response token, the environment's too (multi-turn rows), as context.

The rollout-vs-trainer log-prob difference comes for free: the first minibatch of the first epoch is
evaluated with the parameters that sampled the rollout, so mean(logp − old_logp) there is exactly
what a recompute would report (when old_logp comes from the sampler).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from gspo_jax import objectives, sharding
from gspo_jax.rl.batch import RLBatch
from gspo_jax.rl.logprob_passes import forward
from gspo_jax.state import TrainState


def make_micro_loss(graphdef, rest, objective, *, temperature: float, aux_loss_coef: float, U: int):
    """(params, micro-batch, den) -> (num / den + aux term, (Sums, extra sums)): the loss of one
    micro-batch with the whole minibatch's normaliser ``den``, so that summing the values (and
    gradients) over the U micro-batches gives the un-accumulated minibatch's."""

    def micro_loss(params, mb: RLBatch, den):
        out = forward(graphdef, params, rest, mb, temperature)
        rollout = {"rollout_logp": mb.rollout_logp} if mb.rollout_logp is not None else {}
        # The entropy is computed in the log-prob pass anyway (for the metric); its gradient is
        # taken only when a term of the objective reads it.
        entropy = {"entropy": out["entropy"]} if objective.needs_entropy else {}
        mask = mb.loss_mask  # the policy's tokens: the environment's are context, not actions
        sums = objective.sums(
            out["logp"],
            mb.old_logp,
            mb.adv,
            mask,
            mb.ref_logp,
            **rollout,
            **entropy,
        )
        diff = jnp.where(mask > 0, out["logp"] - mb.old_logp, 0.0)  # [B, T]
        extra = {
            "entropy_sum": (out["entropy"] * mask).sum(),
            "tokens": mask.sum(),
            "logp_diff_sum": diff.sum(),
            "logp_diff_absmax": jnp.abs(diff).max(),
            "aux_loss": out["aux_loss"],
        }
        value = sums.num / jnp.maximum(den, 1.0) + aux_loss_coef * out["aux_loss"] / U
        return value, (sums, extra)

    return micro_loss


def minibatch_gradient(grad_fn, params, mb: RLBatch, den, U: int, mesh):
    """(grads, Sums, extra sums) of one minibatch: one gradient, or the sum of U micro-batches'
    gradients (gradient accumulation under lax.scan) and their sums combined."""
    if U == 1:
        (_, (sums, extra)), grads = grad_fn(params, mb, den)
        return grads, sums, extra
    micro = sharding.chunk_rows(mb, U, mesh)

    def acc(g_sum, m):
        (_, aux), g = grad_fn(params, m, den)
        return jax.tree.map(jnp.add, g_sum, g), aux

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, (sums_u, extra_u) = jax.lax.scan(acc, zeros, micro)
    extra = {
        "entropy_sum": extra_u["entropy_sum"].sum(),
        "tokens": extra_u["tokens"].sum(),
        "logp_diff_sum": extra_u["logp_diff_sum"].sum(),
        "logp_diff_absmax": extra_u["logp_diff_absmax"].max(),
        "aux_loss": extra_u["aux_loss"].mean(),
    }
    return grads, sums_u.reduce_stacked(), extra


def minibatch_rows(shuffle_key, B: int, K: int, num_epochs: int, shuffle: bool) -> jax.Array:
    """[μK, Bm] row indices of each minibatch: a permutation per epoch (the step's shuffle key
    folded with the epoch), or the rows in order."""
    key = jax.random.wrap_key_data(shuffle_key)
    if shuffle:
        perms = [jax.random.permutation(jax.random.fold_in(key, e), B) for e in range(num_epochs)]
    else:
        perms = [jnp.arange(B) for _ in range(num_epochs)]
    return jnp.stack(perms).reshape(num_epochs * K, B // K)


def step_metrics(ms: dict) -> dict:
    """The step's metrics from the μK updates' [μK] stacks: means, except min / max for the
    _min / _max metrics, |log w| percentiles from the summed counts, the largest gradient norm,
    and the first minibatch's log-prob difference (before any update of this step: the
    trainer's log-probs vs the rollout's)."""
    percentiles = {}
    if "abs_log_w_below" in ms:  # [μK, edges]: the step's counts, not a mean of edges
        percentiles = objectives.log_w_percentiles_from_counts(
            ms.pop("abs_log_w_below").sum(0), ms.pop("abs_log_w_tokens").sum()
        )
    metrics = {}
    for k, v in ms.items():
        if k.endswith("_min"):
            metrics[k] = v.min()
        elif k.endswith("_max") or k == "logp_diff_absmax":
            metrics[k] = v.max()
        else:
            metrics[k] = v.mean()
    metrics.update(percentiles)
    metrics["grad_norm_max"] = ms["grad_norm"].max()
    metrics["logp_diff_mean"] = ms["logp_diff_mean"][0]
    metrics["logp_diff_absmax"] = ms["logp_diff_absmax"][0]
    return metrics


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
    mesh=None,
    trained=None,
) -> Callable:
    """(state, batch: RLBatch, shuffle_key) -> (state, metrics): μ epochs × K minibatches of
    optax steps; rows stay sharded over ``mesh`` (None: one device).

    metrics (scalars): loss and the objective's finalised metrics averaged over the μ·K updates
    (ratio_min / ratio_max: min / max over them), grad_norm (mean and max), update_norm, entropy,
    aux_loss, and logp_diff_mean / logp_diff_absmax of the very first minibatch (pre-update
    parameters: the rollout-vs-trainer log-prob difference).

    trained: the nnx filter of the parameters that train (adapters.trained_filter; None: all).
    With one (LoRA: the adapters) the gradient is taken with respect to them alone (no gradient or
    accumulator of the frozen parameters' size), ``tx`` and the optimizer state are theirs
    (adapters.trainable), and the frozen leaves pass through unchanged.
    """
    K, U = num_minibatches, num_microbatches
    micro_loss = make_micro_loss(
        graphdef, rest, objective, temperature=temperature, aux_loss_coef=aux_loss_coef, U=U
    )
    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def minibatch_step(carry, mb):
        params, opt_state = carry
        mb = jax.tree.map(lambda x: sharding.constrain_rows(x, mesh), mb)
        den = objective.denominator(mb.loss_mask)  # whole-minibatch normaliser, mask only
        if trained is not None:
            frozen = params.filter(nnx.Not(trained))
            subset_grad_fn = jax.value_and_grad(
                lambda a, m, d: micro_loss(nnx.merge_state(frozen, a), m, d), has_aux=True
            )
            params = params.filter(trained)  # what tx updates; the frozen ones are put back below
            grads, sums, extra = minibatch_gradient(subset_grad_fn, params, mb, den, U, mesh)
        else:
            grads, sums, extra = minibatch_gradient(grad_fn, params, mb, den, U, mesh)
        loss, m = sums.finalize()
        if "abs_log_w_below" in sums.metrics:  # percentiles: once per step, from the step's counts
            m["abs_log_w_below"] = sums.metrics["abs_log_w_below"]
            m["abs_log_w_tokens"] = sums.metrics["tokens"]
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if trained is not None:
            params = nnx.merge_state(frozen, params)
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

    def update(state: TrainState, batch: RLBatch, shuffle_key: jax.Array):
        B, T = batch.mask.shape
        chex.assert_shape([batch.responses, batch.old_logp, batch.loss_mask], (B, T))
        chex.assert_shape(batch.prompt_lengths, (B,))
        if batch.adv.shape not in ((B,), (B, T)):  # per response, or per token
            raise ValueError(f"adv has shape {batch.adv.shape}; need {(B,)} or {(B, T)}")
        chex.assert_rank(batch.prompts, 2)
        if B % K:
            raise ValueError(
                f"{B} rows do not split into {K} minibatches; see placement.trainer_mesh"
            )
        idx = minibatch_rows(shuffle_key, B, K, num_epochs, shuffle)

        def body(carry, rows):
            mb = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), batch)
            return minibatch_step(carry, mb)

        (params, opt_state), ms = jax.lax.scan(body, (state.params, state.opt_state), idx)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, step_metrics(ms)

    return update
