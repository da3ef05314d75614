"""Tests for gspo_jax.models: presets, cached decoding, log-probs, MoE and Routing Replay.

Dimension legend: B rows, Lp padded prompt length, T response length, S = Lp + T, V vocab,
L layers, k experts per token.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gspo_jax import models

LP, T = 6, 5
LENGTHS = np.array([6, 2, 4], np.int32)


@pytest.fixture(scope="module", params=["tiny", "tiny_moe"])
def model(request):
    return models.Transformer(models.get_model_config(request.param), rngs=nnx.Rngs(0))


def _batch(V, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(2, V, (len(LENGTHS), LP)).astype(np.int32)
    prompts[np.arange(LP)[None] >= LENGTHS[:, None]] = 0  # right padding
    responses = rng.integers(2, V, (len(LENGTHS), T)).astype(np.int32)
    return jnp.asarray(prompts), jnp.asarray(LENGTHS), jnp.asarray(responses)


logprobs = nnx.jit(
    models.response_logprobs, static_argnames=("temperature", "chunk", "return_routes")
)


@nnx.jit
def _causal_logits(model, tokens):
    return model(tokens)


def _reference_logits(model, prompts, lengths, responses):
    """Logits predicting each response token, [B, T, V], from a plain causal pass over the
    left-aligned prompt[:n] + response (trailing padding cannot affect earlier positions):
    independent of the padded gap layout."""
    B, T_ = responses.shape
    seq = np.zeros((B, prompts.shape[1] + T_), np.int32)
    for b in range(B):
        n = int(lengths[b])
        seq[b, : n + T_] = np.concatenate([prompts[b, :n], responses[b]])
    logits = _causal_logits(model, jnp.asarray(seq))
    idx = np.asarray(lengths)[:, None] - 1 + np.arange(T_)[None]
    return jnp.take_along_axis(logits, jnp.asarray(idx)[..., None], axis=1)


def test_get_model_config_presets_and_errors():
    cfg = models.get_model_config("small", vocab_size=32)
    assert cfg.vocab_size == 32 and cfg.name == "small"
    assert set(models.PRESETS) >= {
        "tiny",
        "small",
        "small_moe",
        "qwen3_0_6b",
        "qwen3_1_7b",
        "qwen3_30b_a3b",
    }
    with pytest.raises(ValueError, match="valid presets"):
        models.get_model_config("qwen9")
    with pytest.raises(ValueError, match="valid fields"):
        models.get_model_config("tiny", hidden=3)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        models.get_model_config("tiny", num_heads=3)


@pytest.mark.parametrize(
    "name,total,active",
    [("qwen3_0_6b", 0.596e9, None), ("qwen3_1_7b", 1.72e9, None), ("qwen3_30b_a3b", 30.5e9, 3.3e9)],
)
def test_real_shapes_param_counts(name, total, active):
    cfg = models.get_model_config(name)
    abstract = nnx.eval_shape(lambda: models.Transformer(cfg, rngs=nnx.Rngs(0)))
    n = models.param_count(abstract)
    assert abs(n - total) / total < 0.03, n
    if active:
        a = models.param_count(abstract, active=True)
        assert abs(a - active) / active < 0.06, a


def test_small_preset_size():
    cfg = models.get_model_config("small", vocab_size=32)
    model = nnx.eval_shape(lambda: models.Transformer(cfg, rngs=nnx.Rngs(0)))
    assert 0.5e6 < models.param_count(model) < 1.5e6


def test_response_logprobs_matches_unpadded_reference(model):
    """The padded prompt+response layout and the chunked log-softmax equal a plain forward."""
    prompts, lengths, responses = _batch(model.cfg.vocab_size)
    for temperature in (0.7,) if model.cfg.is_moe else (1.0, 0.7):
        out = logprobs(model, prompts, lengths, responses, temperature=temperature, chunk=2)
        ref = jax.nn.log_softmax(
            _reference_logits(model, prompts, lengths, responses) / temperature, axis=-1
        )
        ref_logp = jnp.take_along_axis(ref, responses[..., None], -1)[..., 0]
        ref_ent = -jnp.sum(jnp.exp(ref) * ref, -1)
        np.testing.assert_allclose(out["logp"], ref_logp, atol=1e-5)
        np.testing.assert_allclose(out["entropy"], ref_ent, atol=1e-5)
        assert out["logp"].dtype == jnp.float32
    assert models.effective_temperature(0.0) == 1.0  # greedy log-probs: reported at T = 1


def test_cached_decoding_equals_full_forward(model):
    """Prefill + one-token decode steps through the KV cache give the full pass's logits."""
    prompts, lengths, responses = _batch(model.cfg.vocab_size, seed=1)
    full = _reference_logits(model, prompts, lengths, responses)  # [B, T, V]
    np.testing.assert_allclose(_decode_logits(model, prompts, lengths, responses), full, atol=1e-5)


@nnx.jit
def _decode_logits(model, prompts, lengths, responses):
    B = prompts.shape[0]
    S = LP + T
    slot = jnp.arange(S)
    valid = slot[None] < lengths[:, None]
    pos = jnp.broadcast_to(jnp.arange(LP), (B, LP))
    out = model.forward(
        prompts,
        pos,
        models.attention_mask(valid, jnp.arange(LP)),
        cache=model.init_cache(B, S),
        write_index=0,
    )
    step_logits = [model.logits(out["hidden"][jnp.arange(B), lengths - 1])]
    cache = out["cache"]
    for t in range(1, T):
        q = LP + t - 1
        valid = (slot[None] < lengths[:, None]) | ((slot >= LP) & (slot <= q))[None]
        out = model.forward(
            responses[:, t - 1 : t],
            (lengths + t - 1)[:, None],
            valid[:, None],
            cache=cache,
            write_index=q,
        )
        cache = out["cache"]
        step_logits.append(model.logits(out["hidden"][:, 0]))
    return jnp.stack(step_logits, 1)


def test_grad_through_response_logprobs_is_finite(model):
    prompts, lengths, responses = _batch(model.cfg.vocab_size)

    def loss(m):
        out = logprobs(m, prompts, lengths, responses, chunk=2)
        return -out["logp"].mean() + 0.01 * out["aux_loss"]

    grads = nnx.jit(nnx.grad(loss))(model)
    leaves = jax.tree.leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert sum(float(jnp.abs(g).sum()) for g in leaves) > 0


def test_bf16_compute_keeps_float32_params_and_logprobs():
    cfg = models.get_model_config("tiny_moe", dtype="bfloat16")
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    prompts, lengths, responses = _batch(cfg.vocab_size)
    out = logprobs(m, prompts, lengths, responses)
    assert m.embed[...].dtype == jnp.float32
    assert out["logp"].dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(out["logp"])))
    m32 = models.Transformer(models.get_model_config("tiny_moe"), rngs=nnx.Rngs(0))
    ref = logprobs(m32, prompts, lengths, responses)["logp"]
    np.testing.assert_allclose(out["logp"], ref, atol=0.1)


def test_moe_aux_loss_and_routes():
    cfg = models.get_model_config("tiny_moe")
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    prompts, lengths, responses = _batch(cfg.vocab_size)
    out = logprobs(m, prompts, lengths, responses, return_routes=True)
    routes = out["routes"]
    assert routes.shape == (cfg.num_layers, prompts.shape[0], LP + T, cfg.experts_per_token)
    assert routes.dtype == jnp.int32 and int(routes.max()) < cfg.num_experts
    # top-k experts are distinct per token; aux = E * sum f*P >= ~1 (1 when balanced).
    assert bool(jnp.all(routes[..., 0] != routes[..., 1]))
    assert 0.9 < float(out["aux_loss"]) < cfg.num_experts
    dense = models.Transformer(models.get_model_config("tiny"), rngs=nnx.Rngs(0))
    assert float(logprobs(dense, prompts, lengths, responses)["aux_loss"]) == 0.0
    with pytest.raises(ValueError, match="needs an MoE model"):
        logprobs(dense, prompts, lengths, responses, return_routes=True)


def test_routing_replay():
    """Replaying the routes of the same parameters reproduces the pass exactly; after a router
    update free routing picks other experts while replay keeps the old ones (with weights from
    the current router), finite however far the router moved."""
    cfg = models.get_model_config("tiny_moe")
    m = models.Transformer(cfg, rngs=nnx.Rngs(0))
    prompts, lengths, responses = _batch(cfg.vocab_size)
    free = logprobs(m, prompts, lengths, responses, return_routes=True)
    replay = logprobs(m, prompts, lengths, responses, routes=free["routes"], return_routes=True)
    np.testing.assert_array_equal(replay["logp"], free["logp"])
    np.testing.assert_array_equal(replay["routes"], free["routes"])

    # "Parameter update": perturb every router.
    key = jax.random.key(3)
    r = m.layers.mlp.router  # [L, D, E]: every layer's router
    r.value = r[...] + 0.5 * jax.random.normal(key, r.shape)
    new_free = logprobs(m, prompts, lengths, responses, return_routes=True)
    new_replay = logprobs(m, prompts, lengths, responses, routes=free["routes"], return_routes=True)
    np.testing.assert_array_equal(new_replay["routes"], free["routes"])
    assert bool(jnp.any(new_free["routes"] != free["routes"]))
    assert float(jnp.max(jnp.abs(new_free["logp"] - new_replay["logp"]))) > 1e-4
    # Replay still recomputes weights from the current router: it differs from the old pass.
    assert float(jnp.max(jnp.abs(new_replay["logp"] - free["logp"]))) > 1e-4
    # Gradients reach the router under replay.
    replay_grad = nnx.jit(
        nnx.grad(
            lambda mm: logprobs(mm, prompts, lengths, responses, routes=free["routes"])[
                "logp"
            ].sum()
        )
    )
    g = replay_grad(m)
    assert float(jnp.abs(g.layers.mlp.router[...][0]).sum()) > 0
    # A router that moved far since the rollout (logits ~1e3 apart) gives replayed experts
    # probabilities that underflow to 0 in float32: their renormalised weights are a softmax over
    # their logits, not 0 / 0, so the pass and its gradient stay finite.
    r.value = r[...] + 300.0 * jax.random.normal(jax.random.key(5), r.shape)
    far = logprobs(m, prompts, lengths, responses, routes=free["routes"])["logp"]
    assert bool(jnp.all(jnp.isfinite(far)))
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(replay_grad(m)))


def test_chunked_logprobs_peak_memory_below_naive():
    """Compiled temp memory of the chunked path is a fraction of the naive [B, T, V] path."""
    B, T_, D, V = 2, 256, 64, 8192
    h = jax.ShapeDtypeStruct((B, T_, D), jnp.float32)
    w = jax.ShapeDtypeStruct((D, V), jnp.float32)
    tok = jax.ShapeDtypeStruct((B, T_), jnp.int32)

    def naive(h, w, tok):
        lp = jax.nn.log_softmax(h @ w, -1)
        return jnp.take_along_axis(lp, tok[..., None], -1)[..., 0], -jnp.sum(jnp.exp(lp) * lp, -1)

    chunked = lambda h, w, tok: models.chunked_logprobs(h, w, tok, 1.0, budget_bytes=2**20)
    temp = lambda f: jax.jit(f).lower(h, w, tok).compile().memory_analysis().temp_size_in_bytes
    assert temp(chunked) * 4 < temp(naive)


def test_create_model_is_the_one_constructor_and_flags_keep_the_draws():
    """create_model equals Transformer(cfg, rngs=nnx.Rngs(seed)); qk_norm / attention_bias only
    remove or add parameters (zero biases), never shift the random draws of the others, and a
    zero bias computes the same function as none."""
    cfg = models.get_model_config("tiny", num_layers=1)
    base = models.create_model(cfg, seed=3)
    assert isinstance(base, models.Transformer) and isinstance(base, models.CausalLM)
    ref = models.Transformer(cfg, rngs=nnx.Rngs(3))
    for a, b in zip(jax.tree.leaves(nnx.state(base)), jax.tree.leaves(nnx.state(ref)), strict=True):
        np.testing.assert_array_equal(a, b)
    plain = models.create_model(
        models.get_model_config("tiny", num_layers=1, qk_norm=False), seed=3
    )
    biased_cfg = models.get_model_config("tiny", num_layers=1, qk_norm=False, attention_bias=True)
    biased = models.create_model(biased_cfg, seed=3)
    assert not hasattr(plain.layers.attn, "q_norm") and hasattr(base.layers.attn, "q_norm")
    attn = biased.layers.attn  # stacked: a leading [L] axis
    assert attn.q_bias.shape == (1, cfg.num_heads, cfg.head_dim)
    assert attn.k_bias.shape == attn.v_bias.shape == (1, cfg.num_kv_heads, cfg.head_dim)
    assert not hasattr(base.layers.attn, "q_bias")
    for m in (plain, biased):
        np.testing.assert_array_equal(m.layers.attn.q_proj[...], base.layers.attn.q_proj[...])
        np.testing.assert_array_equal(m.layers.mlp.down_proj[...], base.layers.mlp.down_proj[...])
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 5)), jnp.int32)
    without_norm = _causal_logits(plain, tokens)
    assert float(jnp.max(jnp.abs(without_norm - _causal_logits(base, tokens)))) > 1e-4
    np.testing.assert_array_equal(_causal_logits(biased, tokens), without_norm)
    attn.k_bias.value = attn.k_bias[...] + 1.0
    assert float(jnp.max(jnp.abs(_causal_logits(biased, tokens) - without_norm))) > 1e-4


def test_decode_mask_is_the_teacher_forced_row():
    """The sampler's decode-step mask is the row of the teacher-forced mask at its slot (and the
    boolean the sampler used to build inline)."""
    lengths = jnp.asarray(LENGTHS)
    _, key_valid = models.sequence_layout(lengths, LP, T)
    full = models.attention_mask(key_valid, jnp.arange(LP + T))  # [B, S, S]
    slot = jnp.arange(LP + T)
    for q in range(LP, LP + T):
        got = models.decode_mask(lengths, LP, T, jnp.asarray(q))
        assert got.shape == (len(LENGTHS), 1, LP + T)
        np.testing.assert_array_equal(got[:, 0], full[:, q])
        inline = (slot[None] < lengths[:, None]) | ((slot >= LP) & (slot <= q))[None]
        np.testing.assert_array_equal(got[:, 0], inline)


@pytest.mark.parametrize("preset", ["tiny", "tiny_moe"])
def test_weights_cast_to_the_compute_dtype_give_the_same_logits(preset):
    """models.layers.compute_dtype_params: a bf16 model computes from the cast weights bit for
    bit what it computes from the float32 ones; the norms' scales and the router stay float32."""
    import dataclasses

    from flax import nnx

    from gspo_jax.models import layers

    cfg = models.get_model_config(preset, vocab_size=32)
    _, params = nnx.split(models.create_model(cfg, seed=0, mesh=None))
    bf16 = dataclasses.replace(cfg, dtype="bfloat16")
    graphdef = nnx.split(models.create_model(bf16, seed=0, mesh=None))[0]
    cast = layers.compute_dtype_params(params, jnp.bfloat16)
    for path, x in jax.tree_util.tree_leaves_with_path(cast):
        f32 = any(name in jax.tree_util.keystr(path) for name in layers.FLOAT32_PARAMS)
        assert x.dtype == (jnp.float32 if f32 else jnp.bfloat16), jax.tree_util.keystr(path)
    tokens = jnp.arange(12).reshape(2, 6) % 32
    want = nnx.merge(graphdef, params)(tokens)
    np.testing.assert_array_equal(np.asarray(nnx.merge(graphdef, cast)(tokens)), np.asarray(want))
