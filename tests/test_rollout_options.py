"""The trainer's rollout options: DAPO dynamic sampling and overlong shaping, a bfloat16 rollout
under a float32 trainer (a real training-inference mismatch), and their exact resume."""

import dataclasses
import os

import jax.numpy as jnp
import numpy as np
import pytest
from trainer_runs import assert_records, assert_trees, final_params, make_config, records

from gspo_jax import config as config_lib
from gspo_jax import sampler, sharding
from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl import build, trainer
from gspo_jax.rollout import continuous


def test_overlong_penalty_matches_dapo_eq13_by_hand():
    # L_max = 10, L_cache = 4: free up to 6 tokens, linear to -pen at 10, -pen when truncated.
    lengths = jnp.array([3, 6, 7, 8, 10, 10])
    truncated = jnp.array([False, False, False, False, False, True])
    got = rl_batch.overlong_penalty(lengths, truncated, max_len=10, buffer=4, penalty=2.0)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -2.0, -2.0])
    only_truncation = rl_batch.overlong_penalty(
        lengths, truncated, max_len=10, buffer=0, penalty=1.0
    )
    np.testing.assert_allclose(only_truncation, [0, 0, 0, 0, 0, -1.0])


def _fake_sample(tokens):
    tokens = jnp.asarray(tokens, jnp.int32)
    ones = jnp.ones(tokens.shape, jnp.float32)
    return sampler.SampleOutput(
        tokens=tokens,
        mask=ones,
        logp=-ones,
        sample_logp=-ones,
        lengths=ones.sum(-1).astype(jnp.int32),
        routes=None,
    )


def test_dynamic_sampling_keeps_groups_with_signal_in_generated_order(shared):
    """P = 2 prompts, G = 2: batch 1 has groups (flat, signal), batch 2 (signal, flat): the step
    trains on batch 1's second group and batch 2's first; with none to spare, flat groups fill
    the step with their mask zeroed."""
    cfg = make_config(shared, num_devices=1)
    cfg.rl.prompts_per_step, cfg.rl.group_size = 2, 2
    run = build.build_run(cfg)
    select = rl_batch.make_select_fn(run)
    s1, s2 = _fake_sample([[1], [2], [3], [4]]), _fake_sample([[5], [6], [7], [8]])
    r1, r2 = jnp.array([1.0, 1.0, 0.0, 1.0]), jnp.array([1.0, 0.0, 0.5, 0.5])
    sig1, sig2 = jnp.array([False, True]), jnp.array([True, False])
    trunc = jnp.zeros(4, bool)
    prompts = (jnp.array([[10], [11]]), jnp.array([[12], [13]]))
    lengths = (jnp.array([1, 1]), jnp.array([1, 1]))
    sample, rewards, _, _, valid, p, _ = select(
        (s1, s2), (r1, r2), (r1 * 0, r2 * 0), (trunc, trunc), (sig1, sig2), prompts, lengths
    )
    np.testing.assert_array_equal(sample.tokens[:, 0], [3, 4, 5, 6])
    np.testing.assert_array_equal(rewards, [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(p[:, 0], [11, 12])
    np.testing.assert_array_equal(valid, [True, True])
    np.testing.assert_array_equal(sample.mask[:, 0], [1, 1, 1, 1])
    # only one group with signal in all: the second slot is a flat group, masked out
    sample, _, _, _, valid, p, _ = select(
        (s1,), (r1,), (r1 * 0,), (trunc,), (sig1,), prompts[:1], lengths[:1]
    )
    np.testing.assert_array_equal(valid, [True, False])
    np.testing.assert_array_equal(p[:, 0], [11, 10])
    np.testing.assert_array_equal(sample.mask[:, 0], [1, 1, 0, 0])


def _options_config(shared):
    cfg = make_config(shared, num_devices=1)
    cfg.rl.dynamic_sampling = True
    cfg.rl.max_gen_batches = 3
    cfg.rl.overlong_buffer = 4
    cfg.rl.overlong_penalty = 0.5
    cfg.rl.rollout_dtype = "bfloat16"
    cfg.rl.recompute_old_logp = True
    return cfg


@pytest.fixture(scope="module")
def options_run(shared):
    wd = os.path.join(shared["root"], "options")
    trainer.train(_options_config(shared), wd)
    return wd


def test_bf16_rollout_dynamic_sampling_and_shaping_are_logged(options_run):
    recs = records(options_run)[1:]
    for r in recs:
        assert 1 <= r["rollout/ds_gen_batches"] <= 3
        assert 0.0 <= r["rollout/ds_groups_filtered_frac"] <= 1.0
        assert r["rollout/overlong_shaping_mean"] <= 0.0
        # a bf16 sampler's log-probs differ from the float32 trainer's recomputation
        assert r["rollout/mismatch_tok_abs_mean"] > 1e-5
        assert r["rollout/mismatch_seq_abs_max"] >= r["rollout/mismatch_seq_abs_mean"] > 0.0
        assert r["rollout/mismatch_tok_abs_max"] >= r["rollout/mismatch_tok_abs_mean"]
    # the extra generation batches drew extra prompts at least once in the run
    assert any(r["rollout/ds_gen_batches"] > 1 for r in recs)


def test_dynamic_sampling_run_resumes_exactly(shared, options_run):
    """The data iterator's state after a step that drew extra prompts restores exactly."""
    wd = os.path.join(shared["root"], "options_split")
    assert trainer.train(_options_config(shared), wd, stop_after=3) is None
    trainer.train(_options_config(shared), wd)
    assert_trees(final_params(wd), final_params(options_run))
    assert_records(records(wd), records(options_run))


def test_float32_rollout_has_no_mismatch(shared, single):
    recs = records(single[0])[1:]
    assert all(abs(r["rollout/logp_diff_mean"]) < 1e-5 for r in recs)
    assert "rollout/mismatch_tok_abs_mean" not in recs[0]  # no recompute pass: nothing to log


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("rl.rollout_dtype", "float16", "rollout_dtype"),
        ("rl.max_gen_batches", 0, "max_gen_batches"),
        ("rl.overlong_buffer", 99, "overlong_buffer"),
        ("rl.collapse_patience", -1, "collapse_patience"),
        ("rl.scale_rewards", "global", "scale_rewards.*group"),
        ("rl.scale_rewards", "batch", "advantage_estimator=grpo"),  # gspo pairs with grpo...
        ("rl.advantage_estimator", "reinforce_pp", "one ratio per response"),  # ...gspo: [B]
        ("rl.kl_in_reward", True, "kl_coef"),  # gspo's kl_coef is 0
        ("rl.log_kl_ref", True, "log_kl_ref.*kl_in_reward"),  # with the two lines below
    ],
)
def test_bad_rollout_options_are_config_errors(shared, field, value, match):
    cfg = make_config(shared, num_devices=1)
    section, name = field.split(".")
    cfg[section][name] = value
    if value == "batch":
        cfg.rl.advantage_estimator = "rloo"
    if field == "rl.log_kl_ref":  # the KL moved into the rewards, where kl_ref is not logged
        cfg.objective.kl_coef, cfg.rl.kl_in_reward = 0.01, True
    with pytest.raises(config_lib.ConfigError, match=match):
        build.build_run(cfg, None)


def test_mismatch_metrics_by_hand():
    """Per token, per sequence and per sequence over its length (the geometric-mean ratio's
    log), on rows of 3 tokens and 1 token."""
    from gspo_jax.rl.batch import mismatch_metrics

    old = np.array([[0.1, -0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0]], np.float32)  # 9: masked out
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    m = {k: float(v) for k, v in mismatch_metrics(old, np.zeros_like(old), mask).items()}
    np.testing.assert_allclose(m["mismatch_tok_abs_mean"], (0.1 + 0.2 + 0.3 + 0.5) / 4, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch_tok_abs_max"], 0.5, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch_seq_abs_mean"], (0.2 + 0.5) / 2, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch_geo_abs_mean"], (0.2 / 3 + 0.5) / 2, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch_geo_abs_max"], 0.5, rtol=1e-6)


def _rollout(rng, B: int, T: int, random_logp: bool):
    """A fake rollout of B responses of random lengths up to T: (SampleOutput, mask [B, T],
    0/1 rewards [B]); its log-probs are zero or, with random_logp, drawn negative."""
    mask = (np.arange(T)[None, :] < rng.integers(1, T + 1, B)[:, None]).astype(np.float32)
    logp = -rng.exponential(1.0, (B, T)) if random_logp else np.zeros((B, T))
    sample = sampler.SampleOutput(
        tokens=jnp.ones((B, T), jnp.int32),
        mask=jnp.asarray(mask),
        logp=jnp.asarray(logp, jnp.float32),
        sample_logp=jnp.zeros((B, T)),
        lengths=jnp.asarray(mask.sum(-1), jnp.int32),
    )
    rewards = jnp.asarray(rng.integers(0, 2, B), jnp.float32)
    return sample, mask, rewards


def test_token_advantages_put_each_response_advantage_on_its_tokens(shared):
    """rl.token_advantages: the RL batch's adv is [B, T], each row its response's [B] advantage
    (the objective's per-token path); without it adv stays [B]."""
    base = make_config(shared, num_devices=1, **{"objective.name": "gspo_token"})
    tok = make_config(
        shared, num_devices=1, **{"objective.name": "gspo_token", "rl.token_advantages": True}
    )
    runs = [build.build_run(c) for c in (base, tok)]
    P, G, T = base.rl.prompts_per_step, base.rl.group_size, runs[0].config.rl.max_new_tokens
    B = P * G
    rng = np.random.default_rng(0)
    sample, mask, rewards = _rollout(rng, B, T, random_logp=False)
    prompts, lengths = jnp.ones((P, 4), jnp.int32), jnp.full((P,), 4, jnp.int32)
    adv = {}
    for name, run in zip(("base", "tok"), runs, strict=True):
        with sharding.use_mesh(run.mesh):
            batch, _ = rl_batch.make_prepare_fn(run)(
                sample, rewards, prompts, lengths, jnp.zeros(B, bool)
            )
        adv[name] = np.asarray(batch.adv)
    assert adv["base"].shape == (B,) and adv["tok"].shape == (B, T)
    np.testing.assert_array_equal(adv["tok"], np.broadcast_to(adv["base"][:, None], (B, T)))
    assert np.abs(adv["base"]).max() > 0


def test_reinforce_pp_advantages_and_kl_in_reward_phases(shared):
    """rl.advantage_estimator=reinforce_pp: the RL batch's adv is [B, T] (whitened over the
    batch's response tokens); rl.kl_in_reward: the advantages are recomputed from the rewards
    minus β·(old_logp − ref_logp) on the tokens, and ref_logp leaves the batch."""
    from gspo_jax import advantages

    cfg = make_config(
        shared,
        num_devices=1,
        **{
            "objective.name": "grpo",
            "rl.advantage_estimator": "reinforce_pp",
            "rl.kl_in_reward": True,
        },
    )
    build.build_run(cfg, None)
    run = build.build_run(cfg)
    P, G, T = cfg.rl.prompts_per_step, cfg.rl.group_size, run.config.rl.max_new_tokens
    B = P * G
    rng = np.random.default_rng(0)
    sample, mask, rewards = _rollout(rng, B, T, random_logp=True)
    prompts, lengths = jnp.ones((P, 4), jnp.int32), jnp.full((P,), 4, jnp.int32)
    with sharding.use_mesh(run.mesh):
        batch, _ = rl_batch.make_prepare_fn(run)(
            sample, rewards, prompts, lengths, jnp.zeros(B, bool)
        )
        want, _ = advantages.group_advantages(rewards, G, "reinforce_pp", mask=mask)
        np.testing.assert_allclose(batch.adv, want, rtol=1e-6)
        ref_logp = batch.old_logp - jnp.asarray(rng.normal(0.0, 0.1, (B, T)), jnp.float32)
        out, m = rl_batch.make_kl_reward_fn(run)(batch.replace(ref_logp=ref_logp), rewards)
    beta = run.objective.kl_coef
    k1 = (np.asarray(batch.old_logp) - np.asarray(ref_logp)) * mask
    token_rewards = np.asarray(advantages.outcome_token_rewards(rewards, mask)) - beta * k1
    want, _ = advantages.group_advantages(token_rewards, G, "reinforce_pp", mask=mask)
    np.testing.assert_allclose(out.adv, want, rtol=1e-5, atol=1e-6)
    assert out.ref_logp is None and not np.allclose(out.adv, batch.adv)
    np.testing.assert_allclose(float(m["kl_reward_k1_mean"]), k1.sum() / mask.sum(), rtol=1e-5)
    # a group estimator: the response's reward minus β·Σ_t k1, then the group advantage
    grpo_run = dataclasses.replace(run, step=dataclasses.replace(run.step, estimator="grpo"))
    with sharding.use_mesh(run.mesh):
        out, _ = rl_batch.make_kl_reward_fn(grpo_run)(batch.replace(ref_logp=ref_logp), rewards)
    want, _ = advantages.group_advantages(np.asarray(rewards) - beta * k1.sum(-1), G)
    np.testing.assert_allclose(out.adv, want, rtol=1e-5, atol=1e-6)


def test_rollout_logp_noise_moves_only_the_reported_logp(shared):
    """rl.rollout_logp_noise: the same tokens are sampled; the reported log-probs of the response
    tokens move by Gaussian noise of that std (padding untouched), a different draw each key."""
    import jax

    from gspo_jax.rl import step as ts

    small = {
        "init.kind": "random",
        "rl.prompts_per_step": 8,
        "rl.group_size": 4,
        "rl.max_new_tokens": 8,
        "eval.num_problems": 0,
    }
    run = build.build_run(make_config(shared, num_devices=1, **small))
    noisy = build.build_run(
        make_config(shared, num_devices=1, **small, **{"rl.rollout_logp_noise": 0.1})
    )
    params, _ = build.base_params(run)
    batch = next(data_iterator.make_data_iterator(run.config, run.task))
    prompts, lengths = jnp.asarray(batch["prompt"]), jnp.asarray(batch["prompt_length"])
    keys = [jax.random.key_data(jax.random.key(k)) for k in (0, 1)]
    clean = ts.make_rollout_fn(run)(params, prompts, lengths, keys[0])
    dosed = [ts.make_rollout_fn(noisy)(params, prompts, lengths, k) for k in keys]
    np.testing.assert_array_equal(dosed[0].tokens, clean.tokens)
    np.testing.assert_array_equal(dosed[0].sample_logp, clean.sample_logp)
    mask = np.asarray(clean.mask) > 0
    diff = np.asarray(dosed[0].logp - clean.logp)
    assert np.all(diff[~mask] == 0)
    assert 0.08 < diff[mask].std() < 0.12 and abs(diff[mask].mean()) < 0.03
    clean_1 = ts.make_rollout_fn(run)(params, prompts, lengths, keys[1])
    assert not np.array_equal(np.asarray(dosed[1].logp - clean_1.logp), diff)  # a fresh draw
    with pytest.raises(config_lib.ConfigError, match="rollout_logp_noise"):
        build.build_run(
            make_config(shared, num_devices=1, **small, **{"rl.rollout_logp_noise": -1.0})
        )


def test_trainer_rollout_on_the_continuous_engine_samples_the_static_tokens(shared):
    """config.rl.rollout_engine="continuous" reaches the step's rollout (make_rollout_fn, inside
    the trainer's jit): the same tokens and lengths as the static engine from the same key, with
    fewer slots than rows; an unknown engine, a slot count below 1 or a negative shrink is a
    ConfigError."""
    import jax

    from gspo_jax.rl import step as ts

    small = {
        "init.kind": "random",
        "rl.prompts_per_step": 4,
        "rl.group_size": 4,
        "rl.max_new_tokens": 8,
        "eval.num_problems": 0,
    }
    static = build.build_run(make_config(shared, num_devices=1, **small))
    cont = build.build_run(
        make_config(
            shared,
            num_devices=1,
            **small,
            **{"rl.rollout_engine": "continuous", "rl.rollout_slots": 4},
        )
    )
    # the config's default page size is the engine's (config/ cannot import rollout/)
    page_size = continuous.DEFAULT_PAGE_SIZE
    assert dict(cont.step.rollout_options) == {"slots": 4, "page_size": page_size}
    params, _ = build.base_params(static)
    batch = next(data_iterator.make_data_iterator(static.config, static.task))
    prompts, lengths = jnp.asarray(batch["prompt"]), jnp.asarray(batch["prompt_length"])
    key = jax.random.key_data(jax.random.key(3))
    a = ts.make_rollout_fn(static)(params, prompts, lengths, key)
    b = ts.make_rollout_fn(cont)(params, prompts, lengths, key)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
    np.testing.assert_allclose(np.asarray(a.logp), np.asarray(b.logp), atol=1e-5)
    # the static engine's live-row decoding reaches it from the config (tokens: test_sampler.py)
    assert dict(static.step.rollout_options) == {}
    live = make_config(shared, num_devices=1, **small, **{"rl.rollout_shrink": 2})
    assert dict(build.rollout_options(live)) == {"shrink": 2}
    for bad in (
        {"rl.rollout_engine": "vllm"},
        {"rl.rollout_engine": "continuous", "rl.rollout_slots": 0},
        {"rl.rollout_shrink": -1},
    ):
        with pytest.raises(config_lib.ConfigError, match="rollout_"):
            build.build_run(make_config(shared, num_devices=1, **small, **bad))
