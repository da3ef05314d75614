"""Tests for the continuous-batching engine (gspo_jax/rollout/continuous.py) and its paged KV
cache: the same tokens as the static engine whatever the schedule, log-probs equal to the
trainer's, routes for Routing Replay, every page returned, the paged attention against the
dense reference, and bad input.

Dimension legend: P prompts, G samples per prompt, B = P * G rows, N slots, Lp padded prompt
length, T = max_new_tokens, ps page size. Tiny models and one compile per engine setting.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gspo_jax import models, rollout
from gspo_jax.kernels import paged_attention
from gspo_jax.models import attention
from gspo_jax.rollout import continuous, paged

LP, G, T = 6, 4, 12
LENGTHS = np.array([6, 2, 4], np.int32)  # P = 3, B = 12
B = len(LENGTHS) * G
EOS, PAD = 1, 0
SETTINGS = dict(temperature=0.7, top_k=5, top_p=0.8)
logprobs = nnx.jit(models.response_logprobs, static_argnames=("temperature", "return_routes"))


def _peaked(name):
    """A tiny untied model with a scaled-up output projection: far-from-uniform next-token
    distributions, so truncation and EOS (token 1) matter (as tests/test_sampler.py)."""
    cfg = models.get_model_config(name, tie_embeddings=False)
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    m.lm_head.value = m.lm_head[...] * 15.0
    return m


def _prompts(V, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(2, V, (len(LENGTHS), LP)).astype(np.int32)
    prompts[np.arange(LP)[None] >= LENGTHS[:, None]] = PAD
    return jnp.asarray(prompts), jnp.asarray(LENGTHS)


def _kw(**over):
    kw = dict(num_samples=G, max_new_tokens=T, eos_id=EOS, pad_id=PAD, **SETTINGS)
    kw.update(over)
    return kw


@pytest.fixture(scope="module")
def dense():
    m = _peaked("tiny")
    prompts, lengths = _prompts(m.cfg.vocab_size)
    static = rollout.generate(m, prompts, lengths, rng=jax.random.key(0), **_kw())
    return m, prompts, lengths, static


def _run(model, prompts, lengths, outer_jit=False, **config):
    """continuous.run -> (SampleOutput, final EngineState); outer_jit: inside a jitted function
    of the model's state, as the trainer calls generate (a merged model, traced prompts)."""
    kw = _kw(return_routes=False)
    kw.update(config)
    if not outer_jit:
        return continuous.run(model, prompts, lengths, jax.random.key(0), **kw)
    graphdef, state = nnx.split(model)

    @jax.jit
    def rollout_fn(state, prompts, lengths, rng):
        return continuous.run(nnx.merge(graphdef, state), prompts, lengths, rng, **kw)

    return rollout_fn(state, prompts, lengths, jax.random.key(0))


def _assert_same_rollout(out, ref, atol=1e-5):
    for f in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(out, f), getattr(ref, f), err_msg=f)
    np.testing.assert_allclose(out.logp, ref.logp, atol=atol, rtol=0)
    np.testing.assert_allclose(out.sample_logp, ref.sample_logp, atol=atol, rtol=0)


def _assert_pages_returned(state):
    refcount = np.asarray(state.refcount)
    assert not bool(state.failed)
    assert (refcount[1:] == 0).all(), refcount  # page 0 is the scratch page
    assert not np.asarray(state.active).any() and int(state.next_row) == B


def test_row_uniforms_are_the_static_engines_draws():
    """Row b's uniform at step t, drawn alone, is bit for bit jax.random.uniform(fold_in(rng, t),
    (B,))[b], for typed and raw keys."""
    steps = jnp.asarray([0, 1, 7, 3, 100, 3])
    rows = jnp.asarray([0, 4, 2, 4, 1, 255])
    for rng in (jax.random.key(3), jax.random.PRNGKey(4)):
        got = rollout.row_uniforms(rng, steps, rows, 256)
        want = [
            jax.random.uniform(jax.random.fold_in(rng, int(t)), (256,))[int(b)]
            for t, b in zip(steps, rows, strict=True)
        ]
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    "config",
    [
        dict(slots=B, page_size=4, outer_jit=True),  # a slot per row, under the trainer's jit
        dict(slots=B // 4, page_size=5, refill="chunked", chunk=3),  # refilled between calls
    ],
    ids=["slots=B-outer-jit", "slots=B/4-chunked"],
)
def test_continuous_equals_static_and_the_trainers_logprobs(dense, config):
    """Same key: the same tokens as the static engine with temperature, top-k, top-p and EOS
    (some rows stop early), with a slot per row (refilled on device, inside an outer jit as the
    trainer calls it) and with B/4 slots refilled as rows end (every 3 decode steps, between
    jitted calls, with pages of 5 slots: dividing neither Lp nor T); the last rows drained one
    slot at a time in both; log-probs equal the static engine's and
    the trainer's response_logprobs; every page is back in the pool at the end."""
    model, prompts, lengths, static = dense
    out, state = _run(model, prompts, lengths, **config)
    _assert_same_rollout(out, static)
    assert int(static.lengths.min()) < T and int(static.lengths.max()) == T  # EOS and limit
    assert bool((out.sample_logp > out.logp + 1e-3).any())  # truncation was active
    ref = logprobs(
        model,
        jnp.repeat(prompts, G, 0),
        jnp.repeat(lengths, G),
        out.tokens,
        temperature=SETTINGS["temperature"],
    )
    np.testing.assert_allclose(ref["logp"] * out.mask, out.logp, atol=1e-5)
    _assert_pages_returned(state)
    # Each of the N slots decoded at most one kept token per step, and with B/4 slots the
    # rollout needed more steps than the longest row (T - 1 decode steps).
    slots = config["slots"]
    assert int(jnp.sum(out.lengths - 1)) <= slots * int(state.decode_steps)
    if slots < B:
        assert int(state.decode_steps) > T - 1


@pytest.mark.long  # two engine compiles (about 70 s): with the population tests it serves
@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_a_traced_temperature_samples_as_its_constant(dense, engine):
    """A temperature given as an array, traced inside a jitted function (a population member's,
    rl/population.py), samples the tokens of the static engine at that constant, with its
    log-probs; another value samples other tokens with the same program (no recompile)."""
    model, prompts, lengths, static = dense
    graphdef, state = nnx.split(model)

    @jax.jit
    def fn(state, temperature):  # temperature [] f32
        kw = _kw(engine=engine, temperature=temperature)
        return rollout.generate(
            nnx.merge(graphdef, state), prompts, lengths, rng=jax.random.key(0), **kw
        )

    _assert_same_rollout(fn(state, jnp.float32(SETTINGS["temperature"])), static)
    hotter = fn(state, jnp.float32(1.5))
    assert not np.array_equal(hotter.tokens, static.tokens)
    assert fn._cache_size() == 1


def test_moe_continuous_equals_static_with_routes():
    """MoE with return_routes, 5 slots refilled on device (no narrowed drain: one decode step
    in the program, the drain is covered by the dense tests): the same tokens and log-probs as
    the static engine, routes
    [L, B, Lp + T, k] equal to the static engine's at every slot that matters (valid prompt
    slots and fed response tokens), and replaying them gives the sampler's log-probs."""
    model = _peaked("tiny_moe")
    prompts, lengths = _prompts(model.cfg.vocab_size)
    kw = _kw(rng=jax.random.key(1), return_routes=True)
    static = rollout.generate(model, prompts, lengths, **kw)
    out = rollout.generate(
        model, prompts, lengths, engine="continuous", slots=5, page_size=4, shrink=0, **kw
    )
    _assert_same_rollout(out, static)
    assert out.routes.shape == static.routes.shape
    # Fed slots: the valid prompt slots and the response tokens fed back (all but the last of
    # the row; the static engine goes on decoding pad after EOS, this one stops).
    slot = np.arange(LP + T)[None]
    n, length = np.repeat(LENGTHS, G)[:, None], np.asarray(out.lengths)[:, None]
    fed = (slot < n) | ((slot >= LP) & (slot < LP + length - 1))
    np.testing.assert_array_equal(np.asarray(out.routes)[:, fed], np.asarray(static.routes)[:, fed])
    rows = (jnp.repeat(prompts, G, 0), jnp.repeat(lengths, G), out.tokens)
    replay = logprobs(model, *rows, temperature=SETTINGS["temperature"], routes=out.routes)
    np.testing.assert_allclose(replay["logp"] * out.mask, out.logp, atol=1e-5)


def test_paged_attention_equals_the_dense_reference():
    """Attention over pages (a shared prompt page set, generated pages in scattered pool order,
    a page table per row) == reference_attention over the same keys laid out contiguously."""
    rng = np.random.default_rng(0)
    N, H, K, Dh, ps, Pt, NP = 3, 4, 2, 8, 4, 3, 10
    q = jnp.asarray(rng.normal(size=(N, 1, H, Dh)), jnp.float32)
    k_pages = jnp.asarray(rng.normal(size=(1, NP, K, Dh, ps)), jnp.float32)
    v_pages = jnp.asarray(rng.normal(size=(1, NP, K, ps, Dh)), jnp.float32)
    table = jnp.asarray([[1, 7, 4], [1, 2, 9], [5, 3, 0]], jnp.int32)  # rows 0, 1 share page 1
    valid = jnp.asarray(rng.random((N, Pt * ps)) < 0.6).at[:, 0].set(True)
    cache = {"k_pages": k_pages, "v_pages": v_pages, "page_table": table}
    got = paged_attention.paged_attention(q, cache, valid, 0)
    kT = k_pages[0, table].transpose(0, 2, 3, 1, 4).reshape(N, K, Dh, Pt * ps)
    v = v_pages[0, table].transpose(0, 2, 1, 3, 4).reshape(N, K, Pt * ps, Dh)
    want = attention.reference_attention(q, kT, v, valid[:, None, :])
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_page_allocation_and_release():
    """Pages come from the free ones (never the scratch page 0), a shared prompt page is freed
    only when its last reference goes, and a pool that runs dry says so."""
    refcount = jnp.zeros((6,), jnp.int32)
    refcount, prompt, failed = paged.allocate(refcount, 2, 3)  # a prompt shared by 3 rows
    np.testing.assert_array_equal(prompt, [1, 2])
    assert not bool(failed)
    refcount, pages, failed = paged.allocate_rows(refcount, jnp.asarray([True, False, True]))
    np.testing.assert_array_equal(pages, [3, 0, 4])
    table = jnp.asarray([[1, 2, 3], [1, 2, 0], [1, 2, 4]], jnp.int32)
    refcount = paged.release(refcount, table, jnp.asarray([True, False, True]))
    np.testing.assert_array_equal(refcount, [0, 1, 1, 0, 0, 0])  # rows 0, 2 ended; row 1 holds
    refcount = paged.release(refcount, table, jnp.asarray([False, True, False]))
    assert int(refcount.sum()) == 0
    _, _, failed = paged.allocate_rows(refcount, jnp.ones((6,), bool))  # 5 free pages, 6 asked
    assert bool(failed)


def test_plan_hooks_lower_and_cache_bytes_match(dense):
    """decode_step_for_plan lowers (what the plan compiles to cost a step) with the engine's
    pool as its state, and paged_cache_bytes is that pool's byte size."""
    model = dense[0]
    cfg = dict(num_samples=G, max_new_tokens=T, slots=5, page_size=4, return_routes=False)
    fn, args = rollout.decode_step_for_plan(model, num_prompts=3, prompt_len=LP, **cfg, **SETTINGS)
    state = args[2]
    pool = state.cache["k_pages"], state.cache["v_pages"]
    num_pages = rollout.pages_needed(5, LP, T, 4)
    assert pool[0].shape[1] == num_pages == 1 + 5 * (2 + 3)
    nbytes = sum(a.size * a.dtype.itemsize for a in pool)
    assert models.paged_cache_bytes(model.cfg, num_pages, 4) == nbytes
    fn.lower(*args)


def test_bad_engine_options_fail_before_compiling(dense):
    model, prompts, lengths, _ = dense
    before = continuous._TRACES["run"]
    for options, match in (
        (dict(slots=0), "slots=0 must be >= 1"),
        (dict(page_size=0), "page_size=0 must be >= 1"),
        (dict(num_pages=10), "num_pages=10 is too small a cache"),
        (dict(refill="host"), "refill='host' is not one of"),
    ):
        with pytest.raises(ValueError, match=match):
            rollout.generate(
                model,
                prompts,
                lengths,
                rng=jax.random.key(0),
                engine="continuous",
                **options,
                **_kw(),
            )
    assert continuous._TRACES["run"] == before
