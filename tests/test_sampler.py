"""Tests for gspo_jax.sampler: greedy, sampling distribution, truncation, EOS, shared prefix,
log-prob agreement with the trainer's log-probs, compile caching and bad input.

Dimension legend: P prompts, G samples per prompt, B = P * G rows, Lp padded prompt length,
T = max_new_tokens, V vocab.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from gspo_jax import models, sampler
from gspo_jax.rollout import static

LP = 6
LENGTHS = np.array([6, 2, 4], np.int32)
EOS, PAD = 1, 0

TEMP, G, T = 0.7, 4, 8  # the common sampler settings: most tests share one compile
logprobs = nnx.jit(models.response_logprobs, static_argnames=("temperature", "return_routes"))


@nnx.jit
def _causal_logits(model, tokens):
    return model(tokens)


def _peaked(name, **overrides):
    """A tiny untied model with a scaled-up output projection so next-token distributions are far
    from uniform (a random init is nearly uniform: temperature and truncation untestable)."""
    cfg = models.get_model_config(name, tie_embeddings=False, **overrides)
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    m.lm_head.value = m.lm_head[...] * 15.0
    return m


@pytest.fixture(scope="module")
def dense():
    return _peaked("tiny")


@pytest.fixture(scope="module")
def moe():
    return _peaked("tiny_moe")


def _prompts(V, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(2, V, (len(LENGTHS), LP)).astype(np.int32)
    prompts[np.arange(LP)[None] >= LENGTHS[:, None]] = PAD
    return jnp.asarray(prompts), jnp.asarray(LENGTHS)


def _first_token_logits(model, prompt, n):
    """Full-forward logits [V] predicting the first response token of one prompt."""
    return model(prompt[None, :n])[0, n - 1]


def _check_eos_layout(out):
    tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
    for b in range(tokens.shape[0]):
        eos = np.flatnonzero(tokens[b] == EOS)
        end = eos[0] + 1 if len(eos) else tokens.shape[1]
        assert mask[b, :end].all() and not mask[b, end:].any()
        assert (tokens[b, end:] == PAD).all()
        assert out.lengths[b] == end
        assert (np.asarray(out.logp)[b, end:] == 0).all()


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 0.8)])
def test_sampler_logp_equals_response_logprobs(dense, top_k, top_p):
    prompts, lengths = _prompts(dense.cfg.vocab_size)
    out = sampler.generate(
        dense,
        prompts,
        lengths,
        num_samples=G,
        max_new_tokens=T,
        rng=jax.random.key(0),
        temperature=TEMP,
        top_k=top_k,
        top_p=top_p,
        eos_id=EOS,
        pad_id=PAD,
    )
    ref = logprobs(
        dense, jnp.repeat(prompts, G, 0), jnp.repeat(lengths, G), out.tokens, temperature=TEMP
    )
    np.testing.assert_allclose(ref["logp"] * out.mask, out.logp, atol=1e-5)
    _check_eos_layout(out)
    if top_k or top_p < 1:
        # Renormalising over a truncated set can only raise a kept token's probability.
        assert bool(jnp.all(out.sample_logp >= out.logp - 1e-6))
        assert float(jnp.max((out.sample_logp - out.logp) * out.mask)) > 1e-3
    else:
        np.testing.assert_array_equal(out.sample_logp, out.logp)


def test_moe_sampler_logp_and_routes_equal_response_logprobs(moe):
    prompts, lengths = _prompts(moe.cfg.vocab_size)
    out = sampler.generate(
        moe,
        prompts,
        lengths,
        num_samples=G,
        max_new_tokens=T,
        rng=jax.random.key(1),
        temperature=TEMP,
        eos_id=EOS,
        return_routes=True,
    )
    rows = (jnp.repeat(prompts, G, 0), jnp.repeat(lengths, G), out.tokens)
    ref = logprobs(moe, *rows, temperature=TEMP, return_routes=True)
    np.testing.assert_allclose(ref["logp"] * out.mask, out.logp, atol=1e-5)
    # The rollout's routes are the teacher-forced pass's routes at every slot that matters:
    # valid prompt slots and fed response tokens (all but the last response slot).
    S = LP + T
    slot = np.arange(S)
    n = np.repeat(LENGTHS, G)[:, None]
    fed = (slot[None] < n) | ((slot[None] >= LP) & (slot[None] < LP + T - 1))
    np.testing.assert_array_equal(np.asarray(out.routes)[:, fed], np.asarray(ref["routes"])[:, fed])
    replay = logprobs(moe, *rows, temperature=TEMP, routes=out.routes)
    np.testing.assert_allclose(replay["logp"] * out.mask, out.logp, atol=1e-5)


def test_greedy_is_argmax_and_deterministic(dense):
    prompts, lengths = _prompts(dense.cfg.vocab_size, seed=1)
    kw = dict(num_samples=2, max_new_tokens=6, temperature=0.0, eos_id=EOS)
    a = sampler.generate(dense, prompts, lengths, rng=jax.random.key(0), **kw)
    b = sampler.generate(dense, prompts, lengths, rng=jax.random.key(99), **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.tokens[0::2], a.tokens[1::2])  # G copies agree
    # Step-by-step argmax with plain full forward passes over a left-aligned buffer.
    seq = np.zeros((len(LENGTHS), LP + 6), np.int32)
    n = np.asarray(lengths).copy()
    for p in range(len(LENGTHS)):
        seq[p, : n[p]] = prompts[p, : n[p]]
    stopped = np.zeros(len(LENGTHS), bool)
    for t in range(6):
        logits = np.asarray(_causal_logits(dense, jnp.asarray(seq)))
        for p in range(len(LENGTHS)):
            stopped[p] |= t > 0 and int(a.tokens[2 * p, t - 1]) == EOS
            if not stopped[p]:
                nxt = int(np.argmax(logits[p, n[p] - 1]))
                assert int(a.tokens[2 * p, t]) == nxt
                seq[p, n[p]] = nxt
                n[p] += 1
    # temperature 0 reports log-probs at temperature 1.
    ref = logprobs(dense, jnp.repeat(prompts, 2, 0), jnp.repeat(lengths, 2), a.tokens)
    np.testing.assert_allclose(ref["logp"] * a.mask, a.logp, atol=1e-5)


def _chi2_pvalue(counts, probs):
    expected = probs * counts.sum()
    big = expected >= 5  # pool the rare tokens into one bin
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()  # exact float64 totals for scipy's consistency check
    return stats.chisquare(obs, exp).pvalue


def test_sample_frequencies_match_softmax_chi_square(dense):
    """8192 draws of the first token at temperature 0.7: frequencies fit softmax(logits / 0.7)
    and are rejected against the wrong temperature 1.0."""
    prompts, lengths = _prompts(dense.cfg.vocab_size)
    N, temp = 8192, 0.7
    out = sampler.generate(
        dense,
        prompts[:1],
        lengths[:1],
        num_samples=N,
        max_new_tokens=1,
        rng=jax.random.key(7),
        temperature=temp,
        eos_id=EOS,
    )
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=dense.cfg.vocab_size)
    logits = np.asarray(_first_token_logits(dense, prompts[0], int(lengths[0])), np.float64)
    softmax = lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum()  # float64
    right, wrong = softmax(logits / temp), softmax(logits / 1.0)
    assert right.max() < 0.9  # the test needs a spread-out distribution to have power
    assert _chi2_pvalue(counts, right) > 1e-3
    assert _chi2_pvalue(counts, wrong) < 1e-6


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.6)])
def test_truncation_samples_only_allowed_tokens(dense, top_k, top_p):
    prompts, lengths = _prompts(dense.cfg.vocab_size)
    out = sampler.generate(
        dense,
        prompts[:1],
        lengths[:1],
        num_samples=512,
        max_new_tokens=1,
        rng=jax.random.key(3),
        top_k=top_k,
        top_p=top_p,
        eos_id=EOS,
    )
    probs = np.asarray(jax.nn.softmax(_first_token_logits(dense, prompts[0], int(lengths[0]))))
    order = np.argsort(-probs)
    if top_k:
        allowed = set(order[:top_k].tolist())
    else:
        before = np.cumsum(probs[order]) - probs[order]
        allowed = set(order[before < top_p].tolist())
    seen = set(np.asarray(out.tokens[:, 0]).tolist())
    assert seen <= allowed and len(seen) >= min(2, len(allowed))
    # sample_logp is the log-prob under the renormalised truncated distribution.
    kept = np.array(sorted(allowed))
    trunc = np.log(probs[kept] / probs[kept].sum())
    tok = int(out.tokens[0, 0])
    np.testing.assert_allclose(out.sample_logp[0, 0], trunc[kept.tolist().index(tok)], atol=1e-5)


def test_tokens_after_eos_are_masked(dense):
    """EOS is chosen as a likely token so that rows stop early, at different steps."""
    prompts, lengths = _prompts(dense.cfg.vocab_size, seed=2)
    probs = jax.nn.softmax(_first_token_logits(dense, prompts[0], int(lengths[0])))
    eos = int(jnp.argsort(-probs)[1])
    out = sampler.generate(
        dense,
        prompts,
        lengths,
        num_samples=G,
        max_new_tokens=T,
        rng=jax.random.key(5),
        temperature=TEMP,
        eos_id=eos,
        pad_id=PAD,
    )
    tokens = np.asarray(out.tokens)
    n_eos = [(np.flatnonzero(r == eos)[:1].tolist() or [None])[0] for r in tokens]
    assert any(i is not None and i < T - 1 for i in n_eos)
    for b, i in enumerate(n_eos):
        if i is None:
            assert out.mask[b].all()
        else:
            assert out.lengths[b] == i + 1 and out.mask[b, i] == 1
            assert (tokens[b, i + 1 :] == PAD).all() and not out.mask[b, i + 1 :].any()


def test_shared_prefix_equals_separate_prefill(dense):
    """P prompts x G samples (prefill once, cache repeated) == the P*G repeated prompts with one
    sample each (prefilled separately), at the same RNG."""
    prompts, lengths = _prompts(dense.cfg.vocab_size)
    kw = dict(max_new_tokens=T, rng=jax.random.key(11), temperature=TEMP, eos_id=EOS)
    shared = sampler.generate(dense, prompts, lengths, num_samples=G, **kw)
    separate = sampler.generate(
        dense, jnp.repeat(prompts, G, 0), jnp.repeat(lengths, G), num_samples=1, **kw
    )
    np.testing.assert_array_equal(shared.tokens, separate.tokens)
    np.testing.assert_allclose(shared.logp, separate.logp, atol=1e-5)
    assert len(set(map(tuple, np.asarray(shared.tokens[:G])))) > 1  # the G samples differ


@pytest.fixture(scope="module")
def chunked():
    """The dense model with decode chunks of 4 slots: the shared-prefix decode of T = 8 tokens
    (7 fed) runs two phases, the cache growing to two chunks, the second filled part way."""
    return _peaked("tiny", decode_block=4)


def test_shared_prefix_decode_equals_repeated_decode(chunked):
    """decode="shared_prefix" == decode="repeated" (the earlier sampler) under the same key,
    with temperature, top-k, top-p and EOS (some rows stop early): same tokens, mask and
    lengths; log-probs equal to float32 summation order (the scaled logits here reach ~8, where
    one float32 step is 4.8e-7, so 2e-6 is a few roundings)."""
    prompts, lengths = _prompts(chunked.cfg.vocab_size)
    kw = dict(num_samples=G, max_new_tokens=T, rng=jax.random.key(0), eos_id=EOS, pad_id=PAD)
    kw.update(temperature=TEMP, top_k=5, top_p=0.8)
    new, old = (
        sampler.generate(chunked, prompts, lengths, decode=d, **kw) for d in sampler.DECODE_LAYOUTS
    )
    for f in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(new, f), getattr(old, f), err_msg=f)
    np.testing.assert_allclose(new.logp, old.logp, atol=2e-6, rtol=0)
    np.testing.assert_allclose(new.sample_logp, old.sample_logp, atol=2e-6, rtol=0)
    assert int(new.lengths.min()) < T and bool((new.sample_logp > new.logp + 1e-3).any())


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), pytest.param(0.8, 3, 0.9, marks=pytest.mark.long)],  # ~25 s each
)
def test_decoding_live_rows_only_gives_the_same_tokens(temperature, top_k, top_p):
    """shrink > 0 (each chunk after the first decodes only the narrowest of B, B / 2, ... that
    holds the live rows) == shrink = 0, bit for bit: tokens, mask, lengths and log-probs. A random
    model over 8 tokens ends rows early and at different steps, so the live rows fall to a half
    of B at a chunk start (checked without truncation: a narrow loop ran)."""
    cfg = models.get_model_config("tiny", decode_block=4, vocab_size=8)
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    prompts, lengths = _prompts(cfg.vocab_size)
    kw = dict(num_samples=8, max_new_tokens=16, rng=jax.random.key(3), eos_id=2, pad_id=PAD)
    kw.update(temperature=temperature, top_k=top_k, top_p=top_p)
    wide = sampler.generate(m, prompts, lengths, **kw)
    narrow = sampler.generate(m, prompts, lengths, shrink=3, **kw)
    for f in ("tokens", "mask", "lengths", "logp", "sample_logp"):
        np.testing.assert_array_equal(getattr(narrow, f), getattr(wide, f), err_msg=f)
    B, C = 24, cfg.decode_block
    live = [int((np.asarray(wide.lengths) > p * C + 1).sum()) for p in range(1, 4)]  # chunk starts
    if top_k == 0:
        assert min(live) <= B // 2 < max(live), live  # all B at first, then half or narrower
    assert static.live_widths(B, 3) == (24, 12, 6, 3) and static.live_widths(B, 9)[-1] == 3
    picked = [int(static.narrowest_index((24, 12, 6, 3), n)) for n in (24, 13, 12, 7, 6, 3, 1, 0)]
    assert picked == [0, 0, 1, 1, 2, 3, 3, 3]  # the narrowest width holding the live rows
    # the program holds a loop per width in each chunk after the first: 1 + 3 x 4 (4 without)
    loops = [
        str(
            jax.make_jaxpr(lambda p, s=s: sampler.generate(m, p, lengths, shrink=s, **kw))(prompts)
        ).count("while[")
        for s in (0, 3)
    ]
    assert loops == [4, 13], loops
    with pytest.raises(ValueError, match="shrink"):
        sampler.generate(m, prompts, lengths, shrink=-1, **kw)


def test_new_prompt_contents_do_not_recompile(dense):
    kw = dict(num_samples=G, max_new_tokens=T, temperature=TEMP, eos_id=EOS)
    prompts, lengths = _prompts(dense.cfg.vocab_size, seed=4)
    sampler.generate(dense, prompts, lengths, rng=jax.random.key(0), **kw)
    before = static._TRACES["generate"]
    prompts2, _ = _prompts(dense.cfg.vocab_size, seed=5)
    out = sampler.generate(
        dense, prompts2, jnp.asarray([3, 5, 1], jnp.int32), rng=jax.random.key(1), **kw
    )
    out.tokens.block_until_ready()
    assert static._TRACES["generate"] == before
    # New parameter values (same graph) do not recompile either.
    other = models.Transformer(dense.cfg, rngs=nnx.Rngs(1))
    sampler.generate(other, prompts2, lengths, rng=jax.random.key(1), **kw)
    assert static._TRACES["generate"] == before


def test_bad_input_fails_before_compiling(dense):
    prompts, lengths = _prompts(dense.cfg.vocab_size)
    before = static._TRACES["generate"]
    with pytest.raises(ValueError, match=r"Prompt length 6 \+ max_new_tokens 300.*max_seq_len"):
        sampler.generate(
            dense,
            prompts,
            lengths,
            num_samples=2,
            max_new_tokens=300,
            rng=jax.random.key(0),
            eos_id=EOS,
        )
    with pytest.raises(ValueError, match="prompt_lengths must be in"):
        sampler.generate(
            dense,
            prompts,
            jnp.asarray([0, 2, 3], jnp.int32),
            num_samples=2,
            max_new_tokens=4,
            rng=jax.random.key(0),
            eos_id=EOS,
        )
    with pytest.raises(ValueError, match="top_p"):
        sampler.generate(
            dense,
            prompts,
            lengths,
            num_samples=2,
            max_new_tokens=4,
            rng=jax.random.key(0),
            eos_id=EOS,
            top_p=0.0,
        )
    assert static._TRACES["generate"] == before


def test_generate_under_outer_jit(dense):
    """The trainer calls generate inside its own jitted rollout with a merged model."""
    prompts, lengths = _prompts(dense.cfg.vocab_size)
    graphdef, state = nnx.split(dense)

    @jax.jit
    def rollout(state, prompts, lengths, rng):
        m = nnx.merge(graphdef, state)
        return sampler.generate(
            m,
            prompts,
            lengths,
            num_samples=G,
            max_new_tokens=T,
            rng=rng,
            temperature=TEMP,
            eos_id=EOS,
        )

    a = rollout(state, prompts, lengths, jax.random.key(0))
    b = sampler.generate(
        dense,
        prompts,
        lengths,
        num_samples=G,
        max_new_tokens=T,
        rng=jax.random.key(0),
        temperature=TEMP,
        eos_id=EOS,
    )
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_inverse_cdf_sampler_never_picks_zero_probability():
    probs = jnp.zeros((4, 1030)).at[:, 700].set(0.25).at[:, 3].set(0.75)
    u = jnp.asarray([0.0, 0.5, 0.7499, 0.99999994])
    tok = sampler.inverse_cdf_sample(probs, u, block=512)
    np.testing.assert_array_equal(tok, [3, 3, 3, 700])


@pytest.mark.long  # a two-process launch: .ci/run runs it after the README's test command
def test_two_process_generate_checks_every_row():
    """Outside jit on two hosts, generate reads the prompt lengths of both hosts' rows: a bad row
    on one host makes both raise the same error (rather than one raise and the other hang in the
    rollout), and good global arrays sample."""
    import os
    import socket
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(
        os.environ,
        PYTHONPATH=repo,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    for mode in ("bad", "good"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(repo, "tests", "multihost_generate.py"),
                    str(i),
                    str(port),
                    mode,
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(2)
        ]
        try:
            outs = [p.communicate(timeout=180)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
        results = [[line for line in o.splitlines() if line.startswith("RESULT")] for o in outs]
        assert all(len(r) == 1 for r in results), outs
        if mode == "bad":
            assert all(
                "ValueError prompt_lengths must be in [1, Lp=4]" in r[0] and "max 9" in r[0]
                for r in results
            ), results
        else:
            assert all(r[0] == "RESULT ok (8, 4)" for r in results), results
