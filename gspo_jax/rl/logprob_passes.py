"""The forward-only passes over an RL batch: recomputed old_logp, the reference model's ref_logp,
and the routes the updated parameters choose (the route-change metric).

    logp = jax.jit(run_logprob_fn(run, return_routes=False, replay_routes=True))(params, batch)

Dimension legend: B rows of an RL batch, T response length, L layers, S = Lp + T sequence slots,
k experts per token. ``forward`` is the one place an RLBatch meets the model: the model's routes
are layer-major ([L, B, S, k]), the batch's batch-major ([B, L, S, k]).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from gspo_jax import models, sharding
from gspo_jax.rl.batch import RLBatch, route_change_frac
from gspo_jax.state import Run


def forward(
    graphdef,
    params,
    rest,
    batch: RLBatch,
    temperature: float,
    *,
    return_routes: bool = False,
    with_entropy: bool = True,
) -> dict[str, jax.Array]:
    """models.response_logprobs of the batch's responses (its routes, if any, are replayed):
    logp [B, T], entropy [B, T], aux_loss [] and with return_routes routes [B, L, S, k]. Every
    response position under batch.mask, the environment's tokens too (each given all before it);
    the loss reads only batch.loss_mask's."""
    model = nnx.merge(graphdef, params, rest)
    routes = batch.routes
    if routes is not None:
        routes = jnp.swapaxes(routes, 0, 1)  # [B, L, S, k] -> [L, B, S, k]
    out = models.response_logprobs(
        model,
        batch.prompts,
        batch.prompt_lengths,
        batch.responses,
        temperature=temperature,
        routes=routes,
        return_routes=return_routes,
        response_mask=batch.mask,
        with_entropy=with_entropy,
    )
    if return_routes:
        out["routes"] = jnp.swapaxes(out["routes"], 0, 1)  # -> [B, L, S, k]
    return out


def make_logprob_fn(
    graphdef,
    rest,
    *,
    temperature: float,
    num_chunks: int,
    return_routes: bool,
    mesh=None,
    replay_routes: bool = True,
) -> Callable:
    """(params, batch: RLBatch[, temperature []]) -> dict(logp [B, T] (, routes [B, L, S, k])): a
    forward-only pass; a temperature given replaces ``temperature`` (a population member's, traced).

    Used to recompute old_logp (replaying the batch's routes when it has them and
    ``replay_routes``), for the reference model's ref_logp (its own routing: replay_routes=False),
    or to record routes. Runs in ``num_chunks`` sequential chunks of rows to bound memory, each
    chunk's rows sharded over ``mesh`` (None: one device).
    """

    def fn(params, batch: RLBatch, temp=None):
        chunks = sharding.chunk_rows(batch.sequences(with_routes=replay_routes), num_chunks, mesh)

        def one(mb):
            out = forward(
                graphdef,
                params,
                rest,
                mb,
                temperature if temp is None else temp,
                return_routes=return_routes,
                with_entropy=False,  # old_logp, ref_logp, routes: no entropy needed
            )
            keep = ("logp", "routes") if return_routes else ("logp",)
            return {k: out[k] for k in keep}

        out = jax.lax.map(one, chunks)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    return fn


def run_logprob_fn(run: Run, *, return_routes: bool, replay_routes: bool) -> Callable:
    """make_logprob_fn with the run's model, temperature, chunking (one chunk per minibatch) and
    mesh: the old_logp recompute, the reference pass and the route-change pass (not jitted)."""
    return make_logprob_fn(
        run.graphdef,
        run.rest,
        temperature=run.step.temperature,
        num_chunks=run.step.num_minibatches,
        return_routes=return_routes,
        mesh=run.mesh,
        replay_routes=replay_routes,
    )


def make_route_change_fn(run: Run) -> Callable:
    """(params, batch, rollout_routes [B, L, S, k]) -> dict(route_change_frac): the routes the
    given parameters choose by themselves (one forward-only pass, never replaying) against the
    rollout's, over the batch's valid response tokens (route_change_frac). Jitted; rows stay
    sharded over the mesh."""
    own_routes = run_logprob_fn(run, return_routes=True, replay_routes=False)

    def fn(params, batch: RLBatch, rollout_routes):
        new = sharding.constrain_rows(own_routes(params, batch)["routes"], run.mesh)
        old = sharding.constrain_rows(rollout_routes, run.mesh)
        frac = route_change_frac(old, new, batch.prompt_lengths, batch.mask)
        return {"route_change_frac": frac}

    return jax.jit(fn)
