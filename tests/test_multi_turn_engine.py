"""Tests for multi-turn rollouts (gspo_jax/rollout/multi_turn.py): the continuous engine's
episodes equal the static re-prefill's (tokens, log-probs in float32) over random tool
schedules, dense and MoE, with every page returned; the action mask marks exactly the policy's
tokens; the trainer's recomputation equals the sampler's log-probs on them; a one-turn episode
samples what rollout.generate samples; bad input.

A fake environment (_DiceEnv) answers each turn after a random delay with a random number of
observation tokens and ends after a random number of turns, all drawn from the episode's seed
and the turn's tokens (never from the timing), so any schedule gives the same episodes.

Dimension legend: P problems, G episodes per problem, B = P * G rows, T = max_new_tokens.
"""

import concurrent.futures
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gspo_jax import envs, models, rollout
from gspo_jax.errors import ConfigError
from gspo_jax.rollout import multi_turn

G, T = 3, 40
PAD = 0
SETTINGS = dict(temperature=0.8, top_k=0, top_p=1.0)
logprobs = nnx.jit(models.response_logprobs, static_argnames=("temperature",))


class _DiceEpisode(envs.Episode):
    """Turn k's answer: after a random delay, 0-5 observation tokens (0 while the episode goes
    on is allowed: the next turn follows the eos at once); the episode ends after its random
    number of turns, reward = turns + the last turn's length / 100."""

    def __init__(self, env, record):
        self.env, self.seed = env, record["seed"]
        self.prompt_ids = list(record["prompt"])
        self.length = len(self.prompt_ids)
        self.turns = 0
        self.max_turns = 1 + record["seed"] % 4

    def _rng(self, ids):
        return np.random.default_rng([self.seed, self.turns, int(np.sum(ids)) % 997])

    def begin(self, ids):
        ids = list(ids)
        self.turns += 1
        self.length += len(ids)
        r = self._rng(ids)
        obs = [int(x) for x in r.integers(2, self.env.vocab, r.integers(0, 6))]
        delay = float(r.uniform(0, self.env.max_delay_s))

        def job():
            time.sleep(delay)
            return " ".join(map(str, obs))

        return envs.PendingTurn(str(len(ids)), ids[-1:] == [self.env.eos], (), (job,))

    def finish(self, pending, responses):
        if self.turns >= self.max_turns:
            info = {"turns": float(self.turns)}
            return envs.Transition(
                (), True, self.turns + int(pending.text) / 100, 0.0, info, "answer"
            )
        obs = tuple(int(x) for x in responses[0].split())
        self.length += len(obs)
        return envs.Transition(obs, False)


@dataclasses.dataclass
class _DiceEnv(envs.Environment):
    vocab: int
    eos: int
    max_delay_s: float = 0.0
    limits: envs.EpisodeLimits = envs.EpisodeLimits(max_turns=8, max_total_tokens=10_000)
    chat = None

    def start(self, record):
        return _DiceEpisode(self, record)


def _records(V, P=4, seed=0):
    r = np.random.default_rng(seed)
    return [
        {"seed": int(r.integers(1 << 20)), "prompt": [int(x) for x in r.integers(2, V, n)]}
        for n in r.integers(2, 7, P)
    ]


def _peaked(name):
    """A tiny untied model with a scaled-up output projection (as tests/test_continuous_engine):
    far-from-uniform next-token distributions. Its eos: the token it samples closest to 15% of
    the time (drawn without an eos), so turns run a few tokens and episodes several turns.
    -> (model, eos)."""
    cfg = models.get_model_config(name, tie_embeddings=False)
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    m.lm_head.value = m.lm_head[...] * 15.0
    prompts = np.random.default_rng(9).integers(2, cfg.vocab_size, (4, 6)).astype(np.int32)
    kw = dict(num_samples=4, max_new_tokens=16, rng=jax.random.key(9), pad_id=PAD, **SETTINGS)
    out = rollout.generate(m, prompts, np.full((4,), 6, np.int32), eos_id=-1, **kw)
    ids, counts = np.unique(np.asarray(out.tokens), return_counts=True)
    return m, int(ids[np.argmin(np.abs(counts / counts.sum() - 0.15))])


def _play(model, env, records, engine="static", **kw):
    args = dict(num_samples=G, max_new_tokens=T, rng=jax.random.key(3), eos_id=env.eos, pad_id=PAD)
    args.update(SETTINGS)
    args.update(kw)
    return multi_turn.run_episodes(model, env, records, engine=engine, **args)


@pytest.fixture(scope="module")
def dense():
    model, eos = _peaked("tiny")
    env = _DiceEnv(model.cfg.vocab_size, eos)
    records = _records(model.cfg.vocab_size)
    batch, stats = _play(model, env, records)
    return model, env, records, batch, stats


def _turns(batch, b, eos):
    """Row b's policy turns as (start, end) pairs: runs of its action mask, split after each
    eos (an empty observation puts two turns side by side)."""
    a, tokens = np.asarray(batch.action_mask[b]), np.asarray(batch.sample.tokens[b])
    turns, start = [], None
    for t in range(len(a)):
        if a[t] and start is None:
            start = t
        if start is not None and (not a[t] or tokens[t] == eos):
            end = t + 1 if a[t] else t
            turns.append((start, end))
            start = None
    return turns + ([(start, len(a))] if start is not None else [])


def test_static_episodes_follow_the_environment(dense):
    """Every row played its episode to the end: as many policy turns as the episode's turns,
    each ending with eos or cut at the region's end; observations between them (mask 1,
    action 0, log-probs 0); rewards and infos from the final transition."""
    model, env, records, batch, stats = dense
    B = len(records) * G
    assert batch.sample.tokens.shape == (B, T) and batch.rewards.shape == (B,)
    mask, action = np.asarray(batch.sample.mask), np.asarray(batch.action_mask)
    tokens, logp = np.asarray(batch.sample.tokens), np.asarray(batch.sample.logp)
    assert np.all(action <= mask)
    np.testing.assert_array_equal(logp[action == 0], 0.0)
    assert np.all(logp[action == 1] < 0)
    several = 0
    for b in range(B):
        info = batch.infos[b]
        turns = _turns(batch, b, env.eos)
        n = int(mask[b].sum())
        np.testing.assert_array_equal(mask[b], np.arange(T) < n)  # contiguous real tokens
        assert np.all(tokens[b, n:] == PAD)
        if info["end"] == "length":  # an observation that did not fit in the region
            continue
        assert len(turns) == info["turns"] == 1 + records[b // G]["seed"] % 4
        assert all(tokens[b, e - 1] == env.eos for _, e in turns[:-1])
        s, e = turns[-1]
        assert batch.rewards[b] == pytest.approx(len(turns) + (e - s) / 100)
        several += len(turns) > 1
    assert several > 0 and stats["turns"] > 1


def test_recomputed_logprobs_equal_the_samplers_on_policy_tokens(dense):
    """The trainer's teacher-forced pass over prompt + region gives the sampler's log-probs
    wherever the action mask is 1 (the observations are context in both)."""
    model, _, _, batch, _ = dense
    rows = (
        jnp.repeat(batch.prompts, G, 0),
        jnp.repeat(batch.prompt_lengths, G),
        batch.sample.tokens,
    )
    got = np.asarray(logprobs(model, *rows, temperature=SETTINGS["temperature"])["logp"])
    a = np.asarray(batch.action_mask) > 0
    np.testing.assert_allclose(got[a], np.asarray(batch.sample.logp)[a], atol=2e-5, rtol=0)


def _assert_same_episodes(got, ref, atol=2e-5):
    for f in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(got.sample, f), getattr(ref.sample, f), err_msg=f)
    np.testing.assert_array_equal(got.action_mask, ref.action_mask)
    np.testing.assert_array_equal(got.rewards, ref.rewards)
    assert got.infos == ref.infos
    np.testing.assert_allclose(got.sample.logp, ref.sample.logp, atol=atol, rtol=0)
    np.testing.assert_allclose(got.sample.sample_logp, ref.sample.sample_logp, atol=atol, rtol=0)


def _play_continuous(model, env, records, **options):
    """The continuous engine, the tools answering after random delays up to 20 ms on 4 pool
    threads (so rows come back in any order)."""
    env = dataclasses.replace(env, max_delay_s=0.02)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return _play(model, env, records, engine="continuous", executor=pool, **options)


@pytest.mark.parametrize("slots, page_size, chunk", [(4, 4, 3), (12, 8, 16)])
def test_continuous_equals_static_reprefill_over_random_tool_schedules(
    dense, slots, page_size, chunk
):
    """Tools answering after random delays, fewer slots than rows, pages smaller than a turn:
    the same episodes as the static re-prefill, log-probs to float32 summation order, and
    every page back in the pool."""
    model, env, records, ref, _ = dense
    got, stats = _play_continuous(
        model, env, records, slots=slots, page_size=page_size, chunk=chunk, prefill_chunk=3
    )
    _assert_same_episodes(got, ref)
    assert stats["pages_held"] == 0 and stats["peak_pages"] > 0
    assert stats["prefills"] > 0  # observations were prefilled into kept pages


@pytest.mark.long  # the MoE model through both engines (about 35 s): after the README's command
def test_moe_continuous_equals_static_reprefill():
    """The same over a mixture-of-experts model."""
    model, eos = _peaked("tiny_moe")
    V = model.cfg.vocab_size
    records = _records(V, seed=1)
    ref, _ = _play(model, _DiceEnv(V, eos), records)
    got, stats = _play_continuous(model, _DiceEnv(V, eos), records, slots=5, page_size=4)
    assert max(i["turns"] for i in ref.infos) > 1
    _assert_same_episodes(got, ref)
    assert stats["pages_held"] == 0


def test_one_turn_episodes_sample_what_generate_samples():
    """An environment that ends every episode after its first turn: the static multi-turn engine
    gives rollout.generate's tokens and log-probs (the same draw per (row, position))."""
    model, eos = _peaked("tiny")
    V = model.cfg.vocab_size
    records = [dict(r, seed=4 * r["seed"]) for r in _records(V)]  # seed % 4 == 0: one turn
    batch, _ = _play(model, _DiceEnv(V, eos), records, max_new_tokens=12)
    ref = rollout.generate(
        model,
        batch.prompts,
        batch.prompt_lengths,
        num_samples=G,
        max_new_tokens=12,
        rng=jax.random.key(3),
        eos_id=eos,
        pad_id=PAD,
        **SETTINGS,
    )
    np.testing.assert_array_equal(batch.sample.tokens, ref.tokens)
    np.testing.assert_array_equal(batch.action_mask, ref.mask)
    np.testing.assert_allclose(batch.sample.logp, ref.logp, atol=1e-5, rtol=0)


def test_bad_input_fails_with_a_named_fix():
    model, eos = _peaked("tiny")
    env = _DiceEnv(model.cfg.vocab_size, eos)
    with pytest.raises(ConfigError, match="engine='paged' is not one of"):
        _play(model, env, _records(64), engine="paged")
    with pytest.raises(ConfigError, match="max_seq_len"):
        _play(model, env, _records(64), max_new_tokens=300)
    with pytest.raises(ConfigError, match="records is empty"):
        _play(model, env, [])
