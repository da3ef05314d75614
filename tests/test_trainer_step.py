"""The functional update step: recomputed vs rollout old_logp, micro-batching, Routing Replay."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gspo_jax import advantages, models, objectives, sampler, sharding
from gspo_jax import config as config_lib
from gspo_jax.rl import logprob_passes
from gspo_jax.rl.batch import RLBatch
from gspo_jax.rl.optimizer import make_optimizer, make_schedule
from gspo_jax.rl.update import make_update_fn
from gspo_jax.state import TrainState, step_keys

P, G, LP, T = 4, 4, 6, 10
EOS, PAD, V = 1, 0, 20


def _opt_cfg(**kw):
    d = config_lib.default_config().optimizer  # every field of the schema
    d.update(dict(learning_rate=1e-3, schedule="constant", warmup_updates=0))
    d.update(kw)
    return d


def _rollout(preset="tiny", seed=0):
    """A model and an RL batch sampled from it (one device)."""
    cfg = models.get_model_config(preset, vocab_size=V)
    model = models.Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    prompts = jnp.asarray(rng.integers(3, V, (P, LP)), jnp.int32)
    lengths = jnp.asarray(rng.integers(2, LP + 1, P), jnp.int32)
    out = sampler.generate(
        model,
        prompts,
        lengths,
        num_samples=G,
        max_new_tokens=T,
        rng=jax.random.key(seed + 1),
        eos_id=EOS,
        pad_id=PAD,
    )
    rewards = (out.tokens[:, 0] % 3 == 0).astype(jnp.float32) + 0.1 * out.mask.sum(-1) / T
    adv, _ = advantages.group_advantages(rewards, G)
    batch = RLBatch(
        prompts=jnp.repeat(prompts, G, 0),
        prompt_lengths=jnp.repeat(lengths, G, 0),
        responses=out.tokens,
        mask=out.mask,
        old_logp=out.logp,
        adv=adv,
    )
    return model, batch


def test_recomputed_old_logp_equals_rollout_logp():
    model, batch = _rollout("tiny")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    fn = jax.jit(
        logprob_passes.make_logprob_fn(
            graphdef,
            rest,
            temperature=1.0,
            num_chunks=2,
            return_routes=model.cfg.is_moe,
            mesh=None,
        )
    )
    out = fn(params, batch)
    mask = np.asarray(batch.mask)
    assert mask.sum() > P * G  # responses longer than one token
    np.testing.assert_allclose(
        np.asarray(out["logp"]) * mask, np.asarray(batch.old_logp) * mask, atol=2e-5, rtol=1e-5
    )


def _update_fn(model, *, U=1, shuffle=True, objective="gspo", K=2, epochs=2, tx=None):
    """batch -> (state, metrics): one jitted update from the model's parameters (reusable)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = tx or make_optimizer(_opt_cfg(), 10)[0]
    fn = jax.jit(
        make_update_fn(
            graphdef,
            rest,
            objective
            if isinstance(objective, objectives.Objective)
            else objectives.get_objective(objective),
            tx,
            temperature=1.0,
            num_epochs=epochs,
            num_minibatches=K,
            num_microbatches=U,
            shuffle=shuffle,
            aux_loss_coef=1e-3,
        )
    )
    state = TrainState(
        step=jnp.int32(0),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(jax.random.key(0)),
    )
    return lambda batch: fn(state, batch, jax.random.key_data(jax.random.key(3)))


def _update(batch, model, **kw):
    return _update_fn(model, **kw)(batch)


def test_microbatching_equals_whole_minibatch():
    model, batch = _rollout()
    # SGD: Adam would blow float rounding of near-zero gradients up to ±lr per parameter.
    # token-mean (dapo) is the normaliser that micro-batch means would get wrong; the entropy
    # bonus (the log-prob pass's entropy, differentiated) adds over micro-batches like the rest.
    dapo = objectives.get_objective("dapo", entropy_coef=0.1)
    s1, m1 = _update(batch, model, U=1, objective=dapo, tx=optax.sgd(0.5))
    s2, m2 = _update(batch, model, U=2, objective=dapo, tx=optax.sgd(0.5))
    assert int(s1.step) == 1
    assert float(m1["grad_norm"]) > 0
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for k in ("loss", "clip_frac", "ratio_mean", "grad_norm", "entropy", "entropy_loss"):
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-4, atol=1e-6, err_msg=k)
    # token-mean: the aggregated entropy is the logged token-mean entropy
    np.testing.assert_allclose(m1["entropy_loss"], m1["entropy"], rtol=1e-5)
    np.testing.assert_allclose(m1["loss"], m1["pg_loss"] - 0.1 * m1["entropy_loss"], rtol=1e-5)
    # the first minibatch sees the rollout's parameters: trainer logp == sampler logp
    assert abs(float(m1["logp_diff_mean"])) < 1e-5 and float(m1["logp_diff_absmax"]) < 1e-4
    # the ratio moved away from 1 over the later minibatches (clipping can act)
    assert float(m1["ratio_max"]) > 1.0


def _max_param_diff(a, b) -> float:
    return max(
        float(jnp.abs(x - y).max())
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.long  # about 35 s: after the README's command
def test_routing_replay_update_uses_the_routes():
    """The update's forward takes its experts from batch.routes.

    Replaying the routes the same parameters chose reproduces the rollout (log-probs, loss and
    update equal those of routing afresh); replaying other routes changes all three, so an update
    that dropped the routes (or routed afresh) fails here.
    """
    model, batch = _rollout("tiny_moe")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    fn = jax.jit(
        logprob_passes.make_logprob_fn(
            graphdef,
            rest,
            temperature=1.0,
            num_chunks=1,
            return_routes=True,
            mesh=None,
        )
    )
    out = fn(params, batch)
    cfg = model.cfg
    own = out["routes"]  # [B, L, S, k]: the experts these parameters choose
    assert own.shape == (P * G, cfg.num_layers, LP + T, cfg.experts_per_token)
    mask = np.asarray(batch.mask)  # MoE: recomputed old_logp == rollout logp too
    np.testing.assert_allclose(
        np.asarray(out["logp"]) * mask, np.asarray(batch.old_logp) * mask, atol=2e-5, rtol=1e-5
    )
    # Every choice moved to the next expert: still k distinct experts per token, none the router's.
    other = (own + 1) % cfg.num_experts
    assert not np.any(np.asarray(other) == np.asarray(own))

    # One epoch of one minibatch: the whole update runs at the rollout's parameters.
    update = _update_fn(model, objective="grpo", K=1, epochs=1)
    s_fresh, m_fresh = update(batch)
    s_own, m_own = update(batch.replace(routes=own))
    s_other, m_other = update(batch.replace(routes=other))
    # replaying the routes the same parameters chose reproduces the rollout's log-probs ...
    assert abs(float(m_own["logp_diff_mean"])) < 1e-5 and float(m_own["logp_diff_absmax"]) < 1e-4
    # ... and so the loss and the update of routing afresh (with a load-balancing loss)
    assert float(m_own["aux_loss"]) > 0
    for k in ("loss", "grad_norm", "entropy", "aux_loss"):
        np.testing.assert_allclose(m_own[k], m_fresh[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert _max_param_diff(s_own.params, s_fresh.params) < 1e-6
    # other routes give other log-probs, loss, gradient and parameters
    assert float(m_other["logp_diff_absmax"]) > 1e-2, m_other["logp_diff_absmax"]
    assert abs(float(m_other["loss"]) - float(m_fresh["loss"])) > 1e-4
    assert abs(float(m_other["grad_norm"]) - float(m_fresh["grad_norm"])) > 1e-3
    assert _max_param_diff(s_other.params, s_fresh.params) > 1e-4  # Adam: ~lr per parameter

    # The recomputed old_logp replays the batch's routes too (and not with replay_routes=False).
    replay = batch.replace(routes=other)
    logp_other = np.asarray(fn(params, replay)["logp"]) * mask
    assert np.abs(logp_other - np.asarray(batch.old_logp) * mask).max() > 1e-2
    no_replay = jax.jit(
        logprob_passes.make_logprob_fn(
            graphdef,
            rest,
            temperature=1.0,
            num_chunks=1,
            return_routes=False,
            mesh=None,
            replay_routes=False,
        )
    )
    np.testing.assert_allclose(
        np.asarray(no_replay(params, replay)["logp"]) * mask,
        np.asarray(batch.old_logp) * mask,
        atol=2e-5,
        rtol=1e-5,
    )


def test_schedules_and_step_keys():
    sched = make_schedule(_opt_cfg(warmup_updates=4, schedule="cosine"), 14)
    assert float(sched(0)) == 0.0 and float(sched(4)) == pytest.approx(1e-3)
    assert float(sched(14)) == pytest.approx(0.0, abs=1e-9)
    const = make_schedule(_opt_cfg(), 100)
    assert float(const(0)) == float(const(99)) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="schedule"):
        make_schedule(_opt_cfg(schedule="step"), 10)
    base = jax.random.key_data(jax.random.key(0))
    k1, k1b, k2 = step_keys(base, 1), step_keys(base, 1), step_keys(base, 2)
    np.testing.assert_array_equal(k1["rollout"], k1b["rollout"])
    assert not np.array_equal(k1["rollout"], k2["rollout"])
    assert not np.array_equal(k1["rollout"], k1["shuffle"])
    assert isinstance(make_optimizer(_opt_cfg(), 10)[0], optax.GradientTransformation)


def test_router_lr_scale_multiplies_only_the_routers_steps():
    params = {"mlp": {"router": jnp.ones((3, 2)), "up_proj": jnp.ones((3, 2))}}
    grads = {"mlp": {"router": jnp.full((3, 2), 0.5), "up_proj": jnp.full((3, 2), -0.5)}}

    def updates(**kw):
        tx = make_optimizer(_opt_cfg(**kw), 10)[0]
        return tx.update(grads, tx.init(params), params)[0]["mlp"]

    base, scaled = updates(), updates(router_lr_scale=3.0)
    assert np.all(np.asarray(base["router"]) != 0)
    np.testing.assert_allclose(scaled["router"], 3.0 * base["router"], rtol=1e-6)
    np.testing.assert_array_equal(scaled["up_proj"], base["up_proj"])


def test_row_sharding_helpers_on_eight_devices():
    from gspo_jax.runtime import distributed

    mesh = sharding.make_mesh({"data": -1})
    x = np.arange(32).reshape(16, 2)
    g = distributed.to_global(x, mesh)
    assert g.sharding.spec[0] == "data" and g.shape == (16, 2)
    np.testing.assert_array_equal(distributed.to_local(g), x)
