"""QLoRA (config.lora.base_quant): the frozen base held quantized under the LoRA adapters
(rl/adapters.py adapted_model, rollout/quant.py's weights): its function, its gradients (adapters
only), its config checks, the trainer's run and its exact resume (long).

Dimension legend: B rows, S slots, V vocab, L layers, D hidden, r the rank.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix
from flax import nnx
from trainer_runs import assert_records, assert_trees, final_params, make_config, records

from gspo_jax import config as config_lib
from gspo_jax import models, rollout
from gspo_jax.models import lora
from gspo_jax.rl import adapters, build

SPEC = lora.LoraSpec(rank=4, alpha=8.0, base_quant="int8")
TOKENS = jax.random.randint(jax.random.key(1), (2, 7), 0, 16)  # [B, S]


@pytest.fixture(scope="module")
def base():
    return models.create_model(models.get_model_config("tiny", vocab_size=16), seed=0)


@pytest.fixture(scope="module")
def qlora(base):
    return adapters.adapted_model(base, SPEC, seed=1)


def _quantized(model) -> dict:
    """The model's QuantizedParams by path: their QArrays."""
    state = nnx.state(model, rollout.QuantizedParam)
    return {p: v.get_raw_value() for p, v in nnx.to_flat_state(state)}


def test_the_base_is_held_quantized_under_float_adapters(base, qlora):
    held = _quantized(qlora)
    # the seven projections, each rollout/quant.py's int8 QArray of the base's weight
    assert sorted(p[-1] for p in held) == sorted(rollout.quant.CONTRACTED_AXES)
    quantized_base = _quantized(rollout.quantize_weights(base, "int8"))
    for p, q in held.items():
        assert q.qvalue.dtype == jnp.int8
        np.testing.assert_array_equal(q.qvalue, quantized_base[p].qvalue)
        np.testing.assert_array_equal(q.scale, quantized_base[p].scale)
    adapters = jax.tree.leaves(nnx.state(qlora, nnx.LoRAParam))
    assert len(adapters) == 14 and all(a.dtype == jnp.float32 for a in adapters)


def test_zero_b_qlora_computes_the_quantized_base(base, qlora):
    """B = 0: the quantized base's logits (to the compiled graph's float rounding, as for LoRA on
    a float base: tests/test_lora.py), which differ from the float base's by the quantization's
    error only (measured here: max 1.3e-3 on logits of max 0.64)."""
    quantized_base = rollout.quantize_weights(base, "int8")(TOKENS)  # [B, S, V]
    logits = qlora(TOKENS)
    np.testing.assert_allclose(logits, quantized_base, rtol=0, atol=1e-6)
    err = float(jnp.abs(logits - base(TOKENS)).max())
    assert 1e-5 < err < 1e-2, err  # real quantization, bounded


@pytest.mark.long
def test_zero_b_qlora_computes_the_quantized_base_exactly_op_by_op(base):
    one = models.create_model(models.get_model_config("tiny", vocab_size=16, num_layers=1))
    tokens = TOKENS[:1, :4]
    with jax.disable_jit():
        np.testing.assert_array_equal(
            adapters.adapted_model(one, SPEC, seed=1)(tokens),
            rollout.quantize_weights(one, "int8")(tokens),
        )


def test_gradients_reach_the_adapters_only(qlora):
    """The update's gradient (rl/update.py with lora: with respect to the adapters, the frozen
    state merged back) is non-zero on every adapter; the base's qvalues and scales are not
    differentiated (jax.grad over the whole state gives the int8 qvalues float0 and the scales,
    read through the dequantization, a gradient the update never takes)."""
    trained = nnx.clone(qlora)
    for _, module in nnx.iter_modules(trained.layers):
        for name, v in vars(module).items():
            if name.endswith("_lora_b"):
                v.set_value(0.05 * jax.random.normal(jax.random.key(len(name)), v.shape))
    graphdef, params, rest = nnx.split(trained, nnx.Param, ...)
    frozen, adapters = params.filter(nnx.Not(nnx.LoRAParam)), params.filter(nnx.LoRAParam)

    def loss(a):
        model = nnx.merge(graphdef, nnx.merge_state(frozen, a), rest)
        return jnp.mean(jax.nn.log_softmax(model(TOKENS))[..., 3])

    grads = jax.grad(loss)(adapters)
    assert jax.tree.structure(grads) == jax.tree.structure(adapters)
    for p, g in jax.tree_util.tree_leaves_with_path(grads):
        assert lora.is_adapter(p) and float(jnp.abs(g).max()) > 0, p
    # the frozen base: every QArray leaf is the quantized storage (int8 qvalues, f32 scales)
    qleaves = jax.tree.leaves(frozen.filter(rollout.QuantizedParam))
    assert {x.dtype for x in qleaves} == {jnp.dtype(jnp.int8), jnp.dtype(jnp.float32)}
    full = jax.grad(lambda p: jnp.mean(nnx.merge(graphdef, p, rest)(TOKENS)), allow_int=True)(
        params
    )
    int_grads = [
        g
        for g, x in zip(jax.tree.leaves(full), jax.tree.leaves(params), strict=True)
        if x.dtype == jnp.int8
    ]
    assert int_grads and all(g.dtype == jax.dtypes.float0 for g in int_grads)


def test_qlora_shardings_follow_the_weights_and_leave_scales_contracted_axes_whole():
    from gspo_jax import sharding

    cfg = models.get_model_config("tiny", vocab_size=16)
    mesh = sharding.make_mesh(dict(data=1, fsdp=2, tensor=1, expert=1), devices=jax.devices()[:2])
    shardings = build.abstract_params(cfg, mesh, 0, SPEC)[3]
    q = shardings["layers"]["attn"]["q_proj"].get_raw_value()  # [L, D, H, Dh]
    assert isinstance(q, qwix.QArray)
    w = build.abstract_params(cfg, mesh, 0, lora.LoraSpec(rank=4))[3]["layers"]["attn"]["q_proj"]
    assert q.qvalue.spec == w.get_value().spec and "fsdp" in q.qvalue.spec  # the weight's
    assert q.scale.spec[1] is None  # its contracted axis (embed) has size 1 in the scale
    _, params, _ = nnx.split(
        adapters.adapted_model(models.create_model(cfg), SPEC, 0), nnx.Param, ...
    )
    placed = jax.device_put(params, shardings)["layers"]["attn"]["q_proj"].get_raw_value()
    assert placed.qvalue.sharding == q.qvalue and placed.scale.sharding == q.scale


def test_merged_qlora_is_the_dequantized_base_plus_the_delta(qlora):
    """lora.merged (the export's weights) of a QLoRA model with random B: a plain float decoder
    computing the QLoRA model's function to float rounding."""
    trained = nnx.clone(qlora)
    for _, module in nnx.iter_modules(trained.layers):
        for name, v in vars(module).items():
            if name.endswith("_lora_b"):
                v.set_value(0.05 * jax.random.normal(jax.random.key(len(name)), v.shape))
    merged = lora.merged(trained, SPEC)
    assert not nnx.state(merged, rollout.QuantizedParam) and not nnx.state(merged, nnx.LoRAParam)
    assert float(jnp.abs(trained(TOKENS) - qlora(TOKENS)).max()) > 1e-3  # the adapters act
    np.testing.assert_allclose(merged(TOKENS), trained(TOKENS), rtol=1e-5, atol=1e-5)


def test_the_plan_counts_the_base_quantized(shared):
    """The dry run's figures (planning/memory_plan.py): the parameters as held (the int8 base)
    beside the float32 base's, and the rollout's weights the int8 rollout's."""
    from gspo_jax.planning import memory_plan

    small = {"init.kind": "random", "num_devices": 1, "lora.rank": 4}
    q_run = build.build_run(make_config(shared, **small, **{"lora.base_quant": "int8"}))
    r_run = build.build_run(make_config(shared, **small, **{"rl.rollout_quant": "int8"}))
    held = memory_plan.shard_bytes(q_run.abs_params)
    float_base = memory_plan.shard_bytes(memory_plan.float_abstract(q_run)[1])
    assert float_base == memory_plan.shard_bytes(r_run.abs_params)  # LoRA's float32 base
    proj = [  # the quantized projections: 4 bytes -> 1 per weight, plus one scale per channel
        q for p, q in nnx.to_flat_state(q_run.abs_params) if isinstance(q, rollout.QuantizedParam)
    ]
    qbytes = sum(
        x.size * x.dtype.itemsize for q in proj for x in jax.tree.leaves(q.get_raw_value())
    )
    elements = sum(q.get_raw_value().qvalue.size for q in proj)
    assert held == float_base - 4 * elements + qbytes and held < float_base
    w_q, w_r = memory_plan.rollout_weight_bytes(q_run), memory_plan.rollout_weight_bytes(r_run)
    assert w_q == w_r and w_q["quant"] == "int8"
    text = memory_plan._params_note({"base_quant": "int8", "params_float": float_base})
    assert "with a float32 base" in text


def test_bad_base_quant_configs_are_one_line_errors(shared):
    small = {"init.kind": "random", "num_devices": 1}
    for fields, match in (
        ({"lora.rank": 4, "lora.base_quant": "int4"}, r"lora.base_quant='int4'.*valid"),
        ({"lora.base_quant": "int8"}, r"base_quant='int8'.*lora.rank=0.*set lora.rank > 0"),
        (
            {"lora.rank": 4, "lora.base_quant": "int8", "rl.rollout_quant": "fp8"},
            r"rollout_quant='fp8'.*base_quant='int8'.*set rollout_quant=''",
        ),
    ):
        with pytest.raises(config_lib.ConfigError, match=match) as e:
            config_lib.validate(make_config(shared, **small, **fields))
        assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- the trainer (long)

QLORA = {
    "num_devices": 1,
    "init.kind": "random",
    "rl.prompts_per_step": 4,
    "rl.group_size": 4,
    "rl.max_new_tokens": 8,
    "eval.num_problems": 0,
    "rl.num_steps": 2,
    "checkpoint.every": 1,
    "lora.rank": 8,
    "lora.alpha": 16.0,
    "lora.base_quant": "int8",
    "optimizer.learning_rate": 1e-3,
    # random init: every reward is 0 and so is every advantage; the entropy bonus moves B
    "objective.entropy_coef": 0.01,
}


@pytest.mark.long
def test_qlora_run_checkpoints_adapters_only_and_resumes_exactly(shared):
    """A runlocal QLoRA run (int8 base): it trains (the adapters move), the rollout and the
    trainer read the same quantized base (their log-probs agree to float rounding), the
    checkpoint holds the adapters alone (no base, quantized or not), and a run stopped after
    step 1 resumes to the same adapters and records."""
    from gspo_jax.rl import trainer

    wd = os.path.join(shared["root"], "qlora_int8")
    trainer.train(make_config(shared, **QLORA), wd)
    recs = records(wd)
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["train/grad_norm"] > 0 for r in recs)
    assert all(abs(r["rollout/logp_diff_mean"]) < 1e-5 for r in recs)
    saved = final_params(wd, step=2)
    leaves = jax.tree_util.tree_leaves_with_path(saved["params"])
    assert leaves and all(lora.is_adapter(p) for p, _ in leaves)  # adapters only on disk
    split = os.path.join(shared["root"], "qlora_int8_split")
    assert trainer.train(make_config(shared, **QLORA), split, stop_after=1) is None
    trainer.train(make_config(shared, **QLORA), split)
    assert_trees(final_params(split, step=2), saved)
    assert_records(records(split), recs)
