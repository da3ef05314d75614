"""Tests for partial rollouts (rollout/continuous.py generate_partial): a step stops when enough
groups are complete, hands its unfinished rows to the next step's engine, and the rows come out
as if decoded in one go, each token tagged with the policy version that sampled it.

Dimension legend: Q groups in the queue, G samples per group, T = max_new_tokens, N slots.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gspo_jax import models
from gspo_jax.rollout import PartialRows, continuous

LP, G, T, N = 6, 4, 12, 6  # N > G: a stop leaves the next group's rows mid-way
LENGTHS = np.array([6, 2, 4], np.int32)  # Q = 3 groups, 12 rows
Q = len(LENGTHS)
EOS, PAD = 1, 0
logprobs = nnx.jit(models.response_logprobs, static_argnames=("temperature", "return_routes"))


@pytest.fixture(scope="module")
def setup():
    cfg = models.get_model_config("tiny", tie_embeddings=False)
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    m.lm_head.value = m.lm_head[...] * 15.0  # peaked: EOS (token 1) ends rows early
    rng = np.random.default_rng(0)
    prompts = rng.integers(2, cfg.vocab_size, (Q, LP)).astype(np.int32)
    prompts[np.arange(LP)[None] >= LENGTHS[:, None]] = PAD
    return m, jnp.asarray(prompts), jnp.asarray(LENGTHS)


def _partial(m, prompts, lengths, carry, version, complete, temperature, key=0):
    return continuous.generate_partial(
        m,
        prompts,
        lengths,
        jax.random.key(key),
        carry,
        version=version,
        complete_groups=complete,
        num_samples=G,
        max_new_tokens=T,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        eos_id=EOS,
        pad_id=PAD,
        slots=N,
    )


def _two_steps(setup, temperature):
    """Step 1 stops at 1 complete group; step 2 finishes the carried groups. Returns the rows
    of every group in queue order [Q * G, ...] (tokens, mask, logp, versions), step 1's carry
    and the queue order of the groups step 2 got."""
    m, prompts, lengths = setup
    out1, sel1, car1, carry = _partial(
        m, prompts, lengths, PartialRows.empty(Q * G, T, PAD), 0, 1, temperature
    )
    car1 = np.asarray(car1)
    out2, sel2, _, _ = _partial(
        m, prompts[car1], lengths[car1], carry, 1, Q - 1, temperature, key=1
    )
    rows = {}
    for out, groups in ((out1, np.asarray(sel1)), (out2, car1[np.asarray(sel2)])):
        for i, g in enumerate(groups):
            rows[int(g)] = jax.tree.map(lambda x, i=i: np.asarray(x[i * G : (i + 1) * G]), out)
    full = jax.tree.map(lambda *xs: np.concatenate(xs), *[rows[g] for g in range(Q)])
    return full, carry, car1


@pytest.fixture(scope="module")
def greedy(setup):
    return _two_steps(setup, temperature=0.0)


@pytest.fixture(scope="module")
def sampled(setup):
    return _two_steps(setup, temperature=1.0)


@pytest.mark.long  # two engine steps of the carried rows: .ci/run's long stage
def test_greedy_rows_continued_across_steps_equal_one_uninterrupted_rollout(setup, greedy):
    m, prompts, lengths = setup
    full, carry, _ = greedy
    ref, _ = continuous.run(
        m, prompts, lengths, jax.random.key(0), eos_id=EOS, pad_id=PAD, num_samples=G,
        max_new_tokens=T, temperature=0.0, top_k=0, top_p=1.0, return_routes=False, slots=N,
    )  # fmt: skip
    np.testing.assert_array_equal(full.tokens, ref.tokens)
    np.testing.assert_array_equal(full.mask, ref.mask)
    np.testing.assert_allclose(full.logp, ref.logp, atol=1e-5, rtol=0)
    # the step stopped with rows unfinished: some carried rows had tokens, some were running
    n = np.asarray(carry.mask).sum(1)
    assert (n > 0).any() and (~np.asarray(carry.done) & (n > 0)).any()


@pytest.mark.long  # two engine steps of the carried rows: .ci/run's long stage
@pytest.mark.parametrize("rollout", ["greedy", "sampled"])
def test_carried_tokens_keep_their_versions_and_the_trainers_logprobs(setup, rollout, request):
    """The carried prefix is kept token for token with version 0, the continuation is version
    1, and every token's log-prob equals the trainer's for the whole row (the continuation's KV
    was recomputed correctly after the step boundary)."""
    m, prompts, lengths = setup
    full, carry, car1 = request.getfixturevalue(rollout)
    temperature = 0.0 if rollout == "greedy" else 1.0
    rows = (car1[:, None] * G + np.arange(G)).reshape(-1)
    n = np.asarray(carry.mask).sum(1).astype(int)  # tokens each carried row had
    for j, r in enumerate(rows):
        np.testing.assert_array_equal(full.tokens[r, : n[j]], np.asarray(carry.tokens)[j, : n[j]])
        length = int(full.mask[r].sum())
        np.testing.assert_array_equal(full.versions[r, : n[j]], 0)
        np.testing.assert_array_equal(full.versions[r, n[j] : length], 1)
    trainer = logprobs(
        m, jnp.repeat(prompts, G, 0), jnp.repeat(lengths, G), jnp.asarray(full.tokens),
        temperature=max(temperature, 1.0),
    )["logp"]  # fmt: skip
    np.testing.assert_allclose(np.asarray(trainer) * full.mask, full.logp, atol=1e-5, rtol=0)


@pytest.mark.long  # a whole queue through the engine: .ci/run's long stage
def test_a_queue_run_to_the_end_is_the_plain_engine(setup):
    m, prompts, lengths = setup
    out, sel, car, carry = _partial(
        m, prompts, lengths, PartialRows.empty(Q * G, T, PAD), 3, Q, 1.0
    )
    ref, _ = continuous.run(
        m, prompts, lengths, jax.random.key(0), eos_id=EOS, pad_id=PAD, num_samples=G,
        max_new_tokens=T, temperature=1.0, top_k=0, top_p=1.0, return_routes=False, slots=N,
    )  # fmt: skip
    np.testing.assert_array_equal(sel, np.arange(Q))
    assert car.shape == (0,) and carry.tokens.shape == (0, T)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.versions, 3 * np.asarray(ref.mask, np.int32))


def test_partial_options_are_checked(setup):
    m, prompts, lengths = setup
    with pytest.raises(ValueError, match="complete_groups=4 must be in"):
        _partial(m, prompts, lengths, PartialRows.empty(Q * G, T, PAD), 0, Q + 1, 1.0)


# ---- the trainer with partial rollouts (runlocal size, 4 steps, checkpoints every 2)

PARTIAL = {"rl.rollout_engine": "continuous", "rl.partial_rollout": 1, "rl.rollout_slots": 8}


@pytest.mark.long  # two trainer runs with the continuous engine: after the README's command
def test_partial_run_resumes_exactly_with_rows_in_flight(shared):
    from trainer_runs import STEPS, assert_records, assert_trees, final_params, make_config, records

    from gspo_jax.rl import trainer

    cfg = lambda: make_config(shared, num_devices=1, **PARTIAL)  # noqa: E731
    whole = os.path.join(shared["root"], "partial_whole")
    trainer.train(cfg(), whole)
    recs = records(whole)
    steps = recs[1:]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    # rows carried over step boundaries: from step 2 on, some trained tokens are a version old,
    # and the step-1 batch is all fresh
    assert steps[0]["rollout/staleness_max"] == 0 and steps[0]["rollout/fresh_tokens_frac"] == 1
    assert max(r["rollout/staleness_max"] for r in steps[1:]) >= 1
    assert all(0 < r["rollout/fresh_tokens_frac"] <= 1 for r in steps)
    # killed after step 3 with groups carried in the step-2 checkpoint, restarted
    split = os.path.join(shared["root"], "partial_split")
    assert trainer.train(cfg(), split, stop_after=3) is None
    trainer.train(cfg(), split)
    assert_trees(final_params(split), final_params(whole))
    assert_records(records(split), recs)


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"rl.partial_rollout": 1}, "needs config.rl.rollout_engine='continuous'"),
        ({**PARTIAL, "rl.dynamic_sampling": True}, "does not run with dynamic sampling"),
        ({**PARTIAL, "rl.partial_rollout": -1}, "must be >= 0"),
    ],
)
def test_partial_rollout_config_errors(shared, fields, match):
    from trainer_runs import make_config

    from gspo_jax.config import ConfigError
    from gspo_jax.rl import build

    with pytest.raises(ConfigError, match=match):
        build.build_run(make_config(shared, num_devices=1, **fields), None)
