"""The action mask: the tokens the environment wrote into a response (tool responses,
observations) are context, never actions (docs/objectives.md "The action mask").

Every objective's `mask` is the action mask: perturbing an environment token's logp, old_logp,
ref_logp, rollout_logp, entropy or advantage changes no loss, metric or gradient (w.r.t. the
log-probs, and w.r.t. a tiny model's parameters through models.response_logprobs on an
interleaved batch); the loss equals the loss of the same rows with the environment's tokens cut
out; the RL batch (rl/batch.py) and the update (rl/update.py) read it, and without one every
number is today's.

Dimension legend: B response rows, T padded response length, P prompts, G samples per prompt,
Lp padded prompt length.
"""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gspo_jax import advantages, models, objectives, rollout
from gspo_jax import config as config_lib
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl import build
from gspo_jax.rl.batch import RLBatch
from gspo_jax.rl.logprob_passes import forward
from gspo_jax.rl.update import make_update_fn
from gspo_jax.state import TrainState

B, T = 6, 12
# Two settings per preset, so that every term that could read a token runs: a KL term, the
# entropy bonus and a per-token rollout correction; and the unbiased KL, the high-entropy
# selection, off-policy masking, a per-sequence correction and the |log w| percentiles.
VARIANTS = {
    "kl_entropy_tis": dict(kl_coef=0.1, entropy_coef=0.01, rollout_correction="token_tis"),
    "selections": dict(
        kl_coef=0.1,
        kl_unbiased=True,
        top_entropy_quantile=0.5,
        off_policy_mask=0.05,
        rollout_correction="seq_tis",
        log_w_percentiles=True,
    ),
}


def interleaved_rows(seed=0, per_token_adv=False):
    """[B, T] float32 inputs of rows whose responses interleave the policy's tokens with spans the
    environment wrote: mask (the response), action (the policy's tokens), logp, old_logp,
    ref_logp, rollout_logp, entropy, adv. Row 2 is empty, row 3 all environment."""
    rng = np.random.default_rng(seed)
    lengths = np.array([T, 9, 0, 5, T, 8])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    env = np.zeros((B, T), bool)
    env[0, 3:6] = env[1, 2:4] = env[1, 6] = env[3, :5] = env[4, 0:2] = env[5, 2:6] = True
    action = mask * ~env
    old = -rng.exponential(1.0, (B, T)).astype(np.float32)
    x = dict(
        mask=mask,
        action=action.astype(np.float32),
        logp=old + rng.normal(0.0, 0.3, (B, T)).astype(np.float32),
        old_logp=old,
        ref_logp=old + rng.normal(0.0, 0.2, (B, T)).astype(np.float32),
        rollout_logp=old + rng.normal(0.0, 0.1, (B, T)).astype(np.float32),
        entropy=rng.uniform(0.1, 3.0, (B, T)).astype(np.float32),
        adv=rng.normal(size=(B, T) if per_token_adv else (B,)).astype(np.float32),
    )
    # Guard: environment spans sit between the policy's tokens, not only after them.
    assert ((mask > 0) & (action == 0)).sum() >= 10
    assert any(np.diff(np.flatnonzero(action[b])).max(initial=1) > 1 for b in range(B))
    return x


@functools.cache
def loss_and_grads(obj: objectives.Objective):
    """Jitted ((loss, metrics), (d/d logp, d/d entropy)); cached: one compile per objective."""

    def fn(logp, entropy, old_logp, adv, mask, ref_logp, rollout_logp):
        return obj(logp, old_logp, adv, mask, ref_logp, rollout_logp=rollout_logp, entropy=entropy)

    return jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))


def run(obj, x, mask):
    (loss, metrics), (g_logp, g_ent) = loss_and_grads(obj)(
        x["logp"], x["entropy"], x["old_logp"], x["adv"], mask, x["ref_logp"], x["rollout_logp"]
    )
    return float(loss), {k: np.asarray(v) for k, v in metrics.items()}, g_logp, g_ent


def perturbed(x, where, how):
    """x with every per-token input changed on the tokens ``where`` [B, T]: shifted by noise, or
    NaN (logp: NaN too, the entropy and a per-token advantage as well)."""
    rng = np.random.default_rng(7)
    out = dict(x)
    keys = ["logp", "old_logp", "ref_logp", "rollout_logp", "entropy"]
    keys += ["adv"] if x["adv"].ndim == 2 else []
    for k in keys:
        junk = x[k] + rng.normal(0.0, 3.0, (B, T)) if how == "shift" else np.full((B, T), np.nan)
        out[k] = np.where(where, junk, x[k]).astype(np.float32)
    return out


def assert_same(a, b):
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=k)
    np.testing.assert_array_equal(a[2], b[2])
    np.testing.assert_array_equal(a[3], b[3])


def _check_environment_tokens_change_nothing(obj, x, how):
    env = (x["mask"] > 0) & (x["action"] == 0)
    clean = run(obj, x, x["action"])
    dirty = run(obj, perturbed(x, env, how), x["action"])
    assert_same(dirty, clean)
    assert not np.asarray(clean[2])[env].any() and not np.asarray(clean[3])[env].any()
    # Guard: the same perturbation under the response mask moves the loss (the test can fail).
    if how == "shift":
        assert run(obj, perturbed(x, env, how), x["mask"])[0] != run(obj, x, x["mask"])[0]


@pytest.mark.parametrize("how", ["shift", "nan"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", objectives.PRESET_NAMES)
def test_environment_tokens_change_no_loss_and_no_gradient(name, variant, how):
    obj = objectives.get_objective(name, **VARIANTS[variant])
    _check_environment_tokens_change_nothing(obj, interleaved_rows(seed=1), how)


@pytest.mark.parametrize("name", objectives.PER_TOKEN_PRESETS)
def test_environment_tokens_change_nothing_with_per_token_advantages(name):
    obj = objectives.get_objective(name, **VARIANTS["kl_entropy_tis"])
    _check_environment_tokens_change_nothing(obj, interleaved_rows(2, per_token_adv=True), "nan")


def compacted(a, action):
    """[B, T] -> the policy's tokens of each row moved to its front, in order, 0 after them: the
    same rows with the environment's tokens cut out (the same T)."""
    out = np.zeros_like(a)
    for b in range(a.shape[0]):
        kept = a[b][action[b] > 0]
        out[b, : kept.size] = kept
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", objectives.PRESET_NAMES)
def test_action_mask_equals_the_rows_without_environment_tokens(name, variant):
    """|y_i|, the sequence ratio s_i, the token-mean and Dr. GRPO normalisers, R, the batch-level
    statistics (covariance top-k, entropy quantile) and every metric count the policy's tokens
    only: the loss equals that of the rows with the environment's tokens cut out (the objective
    sees token values; the model's context is another matter, tested below)."""
    obj = objectives.get_objective(name, **VARIANTS[variant])
    x = interleaved_rows(seed=3)
    action = x["action"]
    loss, metrics, g_logp, g_ent = run(obj, x, action)
    cut = {k: compacted(v, action) if v.ndim == 2 else v for k, v in x.items()}
    cut_loss, cut_metrics, cut_g_logp, cut_g_ent = run(obj, cut, compacted(action, action))
    np.testing.assert_allclose(loss, cut_loss, rtol=1e-6, atol=1e-7)
    for k in metrics:
        np.testing.assert_allclose(metrics[k], cut_metrics[k], rtol=1e-6, atol=1e-7, err_msg=k)
    np.testing.assert_allclose(compacted(g_logp, action), cut_g_logp, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(compacted(g_ent, action), cut_g_ent, rtol=1e-5, atol=1e-8)
    # Guard: counting the environment's tokens too would give another loss.
    assert abs(run(obj, x, x["mask"])[0] - loss) > 1e-4


# ------------------------------------------------------------------- a tiny model, the RL batch

P, G, LP, TM = 2, 4, 6, 10
EOS, PAD, V = 1, 0, 20


@functools.cache
def tiny_interleaved_batch(seed=0):
    """A tiny model and an RLBatch of P·G rows in which the 'environment' wrote tokens 2..4 of
    every row long enough (its spans interleave with the policy's tokens), with the action mask,
    and old_logp, ref_logp, rollout_logp the model's log-probs over the interleaved context
    (teacher-forced) + noise, so that ratios move and clip."""
    cfg = models.get_model_config("tiny", vocab_size=V)
    model = models.Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    prompts = jnp.asarray(rng.integers(3, V, (P, LP)), jnp.int32)
    lengths = jnp.asarray(rng.integers(2, LP + 1, P), jnp.int32)
    lens = rng.integers(1, TM + 1, P * G)
    lens[:3] = (TM, 8, 7)  # guard: rows long enough to interleave
    mask = (np.arange(TM)[None, :] < lens[:, None]).astype(np.float32)
    responses = np.where(mask > 0, rng.integers(3, V, mask.shape), PAD).astype(np.int32)
    env = np.zeros_like(mask, bool)
    env[lens >= 7, 2:5] = True
    rewards = jnp.asarray(rng.normal(size=P * G), jnp.float32)
    batch = RLBatch(
        prompts=jnp.repeat(prompts, G, 0),
        prompt_lengths=jnp.repeat(lengths, G, 0),
        responses=jnp.asarray(responses),
        mask=jnp.asarray(mask),
        old_logp=None,
        adv=advantages.group_advantages(rewards, G).adv,
        action_mask=jnp.asarray(mask * ~env),
    )
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    logp = np.asarray(forward(graphdef, params, rest, batch, 1.0)["logp"]) * mask
    noisy = lambda s: jnp.asarray(logp + rng.normal(0, s, logp.shape), jnp.float32)  # noqa: E731
    batch = batch.replace(old_logp=noisy(0.1), ref_logp=noisy(0.2), rollout_logp=noisy(0.1))
    return (graphdef, params, rest), batch, env


def _dirty(batch, env):
    """The batch with NaN on the environment's tokens of old_logp, ref_logp and rollout_logp."""
    nan = lambda a: jnp.where(jnp.asarray(env), jnp.nan, a)  # noqa: E731
    return batch.replace(
        old_logp=nan(batch.old_logp), ref_logp=nan(batch.ref_logp),
        rollout_logp=nan(batch.rollout_logp),
    )  # fmt: skip


@functools.cache
def model_logprobs_and_vjp():
    """logp, entropy [B, T] of the tiny interleaved batch under models.response_logprobs, and the
    jitted pullback of a cotangent (d loss / d logp, d loss / d entropy) to the parameters: the
    parameter gradient of any objective, compiled once for every preset."""
    (graphdef, params, rest), batch, _ = tiny_interleaved_batch()

    def logprobs(params):
        out = forward(graphdef, params, rest, batch, 1.0)
        return out["logp"], out["entropy"]

    (logp, entropy), pullback = jax.vjp(logprobs, params)
    return logp, entropy, jax.jit(pullback)


def param_grad(obj, batch, logp, entropy, mask):
    """d loss / d params of obj on the batch, through the model's log-probs (the chain rule)."""
    pullback = model_logprobs_and_vjp()[2]
    x = dict(
        logp=logp, entropy=entropy, old_logp=batch.old_logp, adv=batch.adv,
        ref_logp=batch.ref_logp, rollout_logp=batch.rollout_logp,
    )  # fmt: skip
    _, _, g_logp, g_ent = run(obj, x, mask)
    return jax.tree.leaves(pullback((g_logp, g_ent)))


@pytest.mark.parametrize("name", objectives.PRESET_NAMES)
def test_environment_tokens_give_no_parameter_gradient(name):
    """Through the model on an interleaved batch: other values of the environment tokens'
    log-probs (+5) and NaN on their old / ref / rollout log-probs give the parameters the same
    gradient."""
    obj = objectives.get_objective(name, **VARIANTS["kl_entropy_tis"])
    _, batch, env = tiny_interleaved_batch()
    logp, entropy, _ = model_logprobs_and_vjp()
    clean = param_grad(obj, batch, logp, entropy, batch.loss_mask)
    moved = jnp.where(jnp.asarray(env), logp + 5.0, logp)
    dirty = param_grad(obj, _dirty(batch, env), moved, entropy, batch.loss_mask)
    for a, b in zip(clean, dirty, strict=True):
        np.testing.assert_array_equal(a, b)
    # Guard: with the environment's tokens in the loss mask the gradient is another one.
    as_actions = param_grad(obj, batch, logp, entropy, batch.mask)
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(clean, as_actions, strict=True))
    assert diff > 1e-3 * max(float(jnp.abs(a).max()) for a in clean)


def _update(graphdef, params, rest, objective, batch):
    tx = optax.sgd(0.5)
    fn = make_update_fn(
        graphdef, rest, objective, tx, temperature=1.0, num_epochs=1, num_minibatches=1,
        num_microbatches=2,
    )  # fmt: skip
    state = TrainState(
        step=jnp.int32(0),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(jax.random.key(0)),
    )
    return jax.jit(fn)(state, batch, jax.random.key_data(jax.random.key(3)))


def test_update_reads_the_action_mask():
    """rl/update.py: NaN on the environment tokens' old / ref / rollout log-probs changes no
    updated parameter and no metric (the loss, its normaliser, the entropy and log-prob
    difference metrics all read the action mask)."""
    obj = objectives.get_objective("grpo", **VARIANTS["kl_entropy_tis"])
    (graphdef, params, rest), batch, env = tiny_interleaved_batch()
    s1, m1 = _update(graphdef, params, rest, obj, batch)
    s2, m2 = _update(graphdef, params, rest, obj, _dirty(batch, env))
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_array_equal(a, b)
    for k in m1:
        np.testing.assert_array_equal(m1[k], m2[k], err_msg=k)
    assert all(np.isfinite(v) for v in jax.tree.leaves(m1))


def test_update_without_an_action_mask_is_todays():
    """action_mask=None (every response token the policy's) and an action mask equal to the
    response mask give the same step, bit for bit."""
    obj = objectives.get_objective("dapo", kl_coef=0.1, entropy_coef=0.01)
    (graphdef, params, rest), batch, _ = tiny_interleaved_batch()
    s1, m1 = _update(graphdef, params, rest, obj, batch.replace(action_mask=None))
    s2, m2 = _update(graphdef, params, rest, obj, batch.replace(action_mask=batch.mask))
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_array_equal(a, b)
    for k in m1:
        np.testing.assert_array_equal(m1[k], m2[k], err_msg=k)


# ------------------------------------------------------------------- making the batch


def _run(**spec_fields):
    """The parts of a Run that make_prepare_fn / make_kl_reward_fn read: its StepSpec (the
    default config's, resized), no mesh, the objective."""
    cfg = config_lib.default_config()
    cfg.rl.update(max_new_tokens=TM, prompts_per_step=P, group_size=G)
    obj = objectives.get_objective("grpo", kl_coef=0.1)
    tok = types.SimpleNamespace(eos_id=EOS, pad_id=PAD)
    spec = build.step_spec(cfg, types.SimpleNamespace(max_prompt_len=LP, tokenizer=tok), obj)
    spec = dataclasses.replace(spec, **spec_fields)
    return types.SimpleNamespace(step=spec, mesh=None, objective=obj)


def _sample(seed=0):
    """A SampleOutput [B, T], rewards [B], prompts, lengths, truncated, env [B, T]."""
    rng = np.random.default_rng(seed)
    lens = np.array([TM, 7, 3, TM, 9, 1, 6, TM])
    mask = (np.arange(TM)[None, :] < lens[:, None]).astype(np.float32)
    tokens = np.where(mask > 0, rng.integers(3, V, mask.shape), PAD).astype(np.int32)
    env = np.zeros_like(mask, bool)
    env[[0, 1, 3, 4], 2:5] = True
    logp = np.where(mask > 0, -rng.exponential(1.0, mask.shape), 0.0).astype(np.float32)
    sample = rollout.SampleOutput(
        tokens=jnp.asarray(tokens),
        mask=jnp.asarray(mask),
        logp=jnp.asarray(logp),
        sample_logp=jnp.asarray(logp),
        lengths=jnp.asarray(lens, jnp.int32),
    )
    rewards = jnp.asarray(rng.normal(size=P * G), jnp.float32)
    prompts = jnp.asarray(rng.integers(3, V, (P, LP)), jnp.int32)
    lengths = jnp.full((P,), LP, jnp.int32)
    truncated = jnp.asarray(lens >= TM)
    return sample, rewards, prompts, lengths, truncated, env


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp"])
def test_prepare_carries_the_action_mask(estimator):
    """make_prepare_fn: the action mask enters the batch (with mask_truncated's zeros), the
    sampler's log-probs of the environment's tokens become 0, the advantages count the policy's
    tokens; without one the batch is today's (no action mask, the sampler's log-probs)."""
    run = _run(
        mask_truncated=True, keeps_rollout_logp=True, estimator=estimator,
        per_token_advantages=estimator == "reinforce_pp",
    )  # fmt: skip
    sample, rewards, prompts, lengths, truncated, env = _sample()
    prepare = rl_batch.make_prepare_fn(run)
    action = sample.mask * ~env
    batch, m = prepare(sample, rewards, prompts, lengths, truncated, action_mask=action)
    plain, m0 = prepare(sample, rewards, prompts, lengths, truncated)
    keep = (~np.asarray(truncated))[:, None]
    np.testing.assert_array_equal(batch.action_mask, np.asarray(action) * keep)
    np.testing.assert_array_equal(batch.loss_mask, batch.action_mask)
    np.testing.assert_array_equal(batch.mask, plain.mask)
    assert (
        not np.asarray(batch.old_logp)[env].any() and not np.asarray(batch.rollout_logp)[env].any()
    )
    policy = np.asarray(action) > 0
    np.testing.assert_array_equal(
        np.asarray(batch.old_logp)[policy], np.asarray(sample.logp)[policy]
    )
    assert plain.action_mask is None
    np.testing.assert_array_equal(plain.old_logp, sample.logp)
    np.testing.assert_array_equal(plain.loss_mask, plain.mask)
    if estimator == "reinforce_pp":  # per token: no advantage on the environment's tokens
        assert not np.asarray(batch.adv)[env].any() and np.asarray(plain.adv)[env & keep].any()
    assert 0 < float(m["policy_token_frac"]) < 1 and "policy_token_frac" not in m0
    # an action mask equal to the response mask: today's batch and metrics (up to the rounding of
    # another compiled graph; without one, the graph is today's)
    same, m1 = prepare(sample, rewards, prompts, lengths, truncated, action_mask=sample.mask)
    np.testing.assert_allclose(same.adv, plain.adv, rtol=1e-6, atol=1e-7)
    for k in m0:
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-6, err_msg=k)


def test_kl_reward_and_recompute_metrics_read_the_action_mask():
    """make_kl_reward_fn's KL and recompute_metrics' differences skip the environment's tokens."""
    run = _run(estimator="reinforce_pp", per_token_advantages=True, kl_in_reward=True)
    sample, rewards, prompts, lengths, truncated, env = _sample(1)
    prepare = rl_batch.make_prepare_fn(run)
    batch, _ = prepare(sample, rewards, prompts, lengths, truncated, action_mask=sample.mask * ~env)
    batch = batch.replace(ref_logp=batch.old_logp - 0.3)
    kl_reward = rl_batch.make_kl_reward_fn(run)
    clean, m = kl_reward(batch, rewards)
    dirty, m2 = kl_reward(batch.replace(ref_logp=jnp.where(env, 5.0, batch.ref_logp)), rewards)
    np.testing.assert_array_equal(clean.adv, dirty.adv)
    assert m == m2
    new_logp = batch.old_logp + 0.01
    r1 = rl_batch.recompute_metrics(new_logp, batch)
    r2 = rl_batch.recompute_metrics(jnp.where(env, 9.0, new_logp), batch)
    assert r1 == r2
    np.testing.assert_allclose(r1["recompute_logp_diff_absmax"], 0.01, rtol=1e-4)


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda m, a: a.at[1, 8].set(1.0),
            ["row 1, token 8", "response mask is 0.0", "policy_mask"],
        ),
        (lambda m, a: a.at[0, 0].set(0.5), ["0.5 at row 0, token 0", "0/1"]),
        (lambda m, a: a[:, :-1], ["shape", "[B, T]"]),
    ],
)
def test_an_action_mask_outside_the_response_raises_one_line(change, words):
    run = _run()
    sample, rewards, prompts, lengths, truncated, env = _sample()
    bad = change(sample.mask, sample.mask * ~env)
    with pytest.raises(ValueError) as e:
        rl_batch.make_prepare_fn(run)(sample, rewards, prompts, lengths, truncated, bad)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
