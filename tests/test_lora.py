"""LoRA through qwix (models/lora.py): the adapters' function, gradients, reference, merge,
export and checks on a tiny decoder; the trainer's LoRA run and its exact resume (long).

Dimension legend: B rows, S slots, V vocab, L layers, D hidden, r the rank.
"""

import json
import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gspo_jax import models
from gspo_jax.config import ConfigError, default_config
from gspo_jax.models import lora
from gspo_jax.rl import adapters, build, optimizer, placement

SPEC = lora.LoraSpec(rank=4, alpha=8.0)
TOKENS = jax.random.randint(jax.random.key(1), (2, 7), 0, 16)  # [B, S]


def tiny(**kw):
    return models.get_model_config("tiny", vocab_size=16, **kw)


def perturbed(model, scale=0.05, seed=3):
    """The LoRA model with every B drawn at random (a trained adapter's shape of function)."""
    graphdef, state = nnx.split(model)
    key = jax.random.key(seed)

    def draw(path, x):
        if not lora._name(path).endswith("_lora_b"):
            return x
        k = jax.random.fold_in(key, zlib.crc32(jax.tree_util.keystr(path).encode()))
        return scale * jax.random.normal(k, x.shape, x.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(draw, state))


@pytest.fixture(scope="module")
def base():
    return models.create_model(tiny(), seed=0)


@pytest.fixture(scope="module")
def adapted(base):
    return lora.add_adapters(base, SPEC, seed=1)


def test_adapters_sit_on_attention_and_mlp_stacked_per_layer(adapted):
    shapes = {
        "/".join(map(str, p)): v.shape
        for p, v in nnx.to_flat_state(nnx.state(adapted, nnx.LoRAParam))
    }
    cfg = adapted.cfg
    L, D, F = cfg.num_layers, cfg.hidden_size, cfg.mlp_dim
    H, K, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    assert shapes == {
        "layers/attn/q_proj_lora_a": (L, D, 4),
        "layers/attn/q_proj_lora_b": (L, 4, H, Dh),
        "layers/attn/k_proj_lora_a": (L, D, 4),
        "layers/attn/k_proj_lora_b": (L, 4, K, Dh),
        "layers/attn/v_proj_lora_a": (L, D, 4),
        "layers/attn/v_proj_lora_b": (L, 4, K, Dh),
        "layers/attn/o_proj_lora_a": (L, H, Dh, 4),
        "layers/attn/o_proj_lora_b": (L, 4, D),
        "layers/mlp/gate_proj_lora_a": (L, D, 4),
        "layers/mlp/gate_proj_lora_b": (L, 4, F),
        "layers/mlp/up_proj_lora_a": (L, D, 4),
        "layers/mlp/up_proj_lora_b": (L, 4, F),
        "layers/mlp/down_proj_lora_a": (L, F, 4),
        "layers/mlp/down_proj_lora_b": (L, 4, D),
    }


def test_zero_b_adapters_compute_the_base(base, adapted):
    # Compiled, XLA rewrites the graph with the adapters' extra matmuls (x·W + x·A·B may become
    # one matmul over concatenated operands): the base's logits to float rounding. Op by op they
    # are the base's bit for bit (the long test below).
    np.testing.assert_allclose(adapted(TOKENS), base(TOKENS), rtol=0, atol=1e-6)


@pytest.mark.long
def test_zero_b_adapters_compute_the_base_exactly_op_by_op():
    # x·W + (α/r)·(x·A)·0 is x·W bit for bit (one layer, 4 tokens: op by op is slow)
    one = models.create_model(tiny(num_layers=1), seed=0)
    tokens = TOKENS[:1, :4]
    with jax.disable_jit():
        np.testing.assert_array_equal(lora.add_adapters(one, SPEC)(tokens), one(tokens))


def test_reference_is_the_base_with_adapters_off(base, adapted):
    trained = perturbed(adapted)
    graphdef, params, rest = nnx.split(trained, nnx.Param, ...)
    assert float(jnp.abs(trained(TOKENS) - base(TOKENS)).max()) > 1e-3  # the adapters act
    ref_params = lora.without_adapters(params)
    # no second copy: every base leaf is the policy's own array
    for p, x in jax.tree_util.tree_leaves_with_path(ref_params):
        if not lora.is_adapter(p):
            assert x is dict(jax.tree_util.tree_leaves_with_path(params))[p]
    # exactly the base up to the compiled graph's float rounding (the test above)
    np.testing.assert_allclose(
        nnx.merge(graphdef, ref_params, rest)(TOKENS), base(TOKENS), rtol=0, atol=1e-6
    )


def test_merged_weights_compute_the_adapted_model(adapted):
    trained = perturbed(adapted)
    merged = lora.merged(trained, SPEC)
    assert not nnx.state(merged, nnx.LoRAParam)  # a plain decoder
    np.testing.assert_allclose(merged(TOKENS), trained(TOKENS), rtol=1e-5, atol=1e-5)


def test_an_rl_update_trains_only_the_adapters(adapted):
    """One update (2 epochs x 2 minibatches x 2 micro-batches) of the RL update function: the
    base leaves come back bit for bit, the adapters move, Adam's state is the adapters'."""
    from gspo_jax import advantages, objectives, sampler
    from gspo_jax.rl.batch import RLBatch
    from gspo_jax.rl.update import make_update_fn
    from gspo_jax.state import TrainState

    G, T = 4, 6
    prompts, lengths = jnp.array([[3, 4, 5], [6, 7, 0]]), jnp.array([3, 2])  # [P, Lp], [P]
    out = sampler.generate(adapted, prompts, lengths, num_samples=G, max_new_tokens=T,
                           rng=jax.random.key(0), eos_id=1, pad_id=0)  # fmt: skip
    adv, _ = advantages.group_advantages((out.tokens[:, 0] % 2).astype(jnp.float32), G)
    rep = lambda x: jnp.repeat(x, G, 0)  # noqa: E731
    batch = RLBatch(prompts=rep(prompts), prompt_lengths=rep(lengths), responses=out.tokens,
                    mask=out.mask, old_logp=out.logp, adv=adv)  # fmt: skip
    graphdef, params, rest = nnx.split(adapted, nnx.Param, ...)
    tx, _ = optimizer.make_optimizer(default_config().optimizer, 10)
    adapters = params.filter(nnx.LoRAParam)
    update = make_update_fn(graphdef, rest, objectives.get_objective("grpo"), tx,
                            temperature=1.0, num_epochs=2, num_minibatches=2,
                            num_microbatches=2, trained=nnx.LoRAParam)  # fmt: skip
    state = TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(adapters),
                       rng=jax.random.key_data(jax.random.key(0)))  # fmt: skip
    new, metrics = jax.jit(update)(state, batch, jax.random.key_data(jax.random.key(1)))
    assert float(metrics["grad_norm"]) > 0
    moved = False
    for (p, x), y in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(new.params), strict=True
    ):
        if lora.is_adapter(p):
            moved |= bool(jnp.any(x != y))
        else:
            np.testing.assert_array_equal(x, y)  # the base is frozen bit for bit
    assert moved

    def nbytes(tree):
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))

    # Adam's two moments (and a count) for the adapters alone: a fifth of the full model's here
    assert nbytes(new.opt_state) <= 2 * nbytes(adapters) + 64
    assert nbytes(new.opt_state) < nbytes(tx.init(params)) / 4


def test_bad_lora_configs_are_one_line_errors():
    cfg = tiny()
    with pytest.raises(ConfigError, match="rank=-1 must be >= 0"):
        adapters.check_lora(lora.LoraSpec(rank=-1), cfg)
    with pytest.raises(ConfigError, match=r"'layers/nothing' matches no module.*layers/attn"):
        adapters.check_lora(lora.LoraSpec(rank=2, targets=("layers/attn", "layers/nothing")), cfg)
    with pytest.raises(ConfigError, match="but no weight"):
        adapters.check_lora(lora.LoraSpec(rank=2, targets=("final_norm",)), cfg)
    adapters.check_lora(lora.LoraSpec(rank=0, targets=("anything",)), cfg)  # rank 0: off, unchecked


def test_peft_export_has_peft_keys_shapes_and_the_merged_delta(adapted, tmp_path):
    from safetensors.numpy import load_file

    trained = perturbed(adapted)
    names = lora.save_peft(trained, SPEC, str(tmp_path / "peft"), base_model="base")
    tensors = load_file(str(tmp_path / "peft" / lora.PEFT_WEIGHTS))
    conf = json.load(open(tmp_path / "peft" / lora.PEFT_CONFIG))
    assert conf["peft_type"] == "LORA" and conf["r"] == 4 and conf["lora_alpha"] == 8.0
    assert sorted(conf["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    cfg = trained.cfg
    modules = [f"self_attn.{w}_proj" for w in "qkvo"]
    modules += [f"mlp.{w}_proj" for w in ("gate", "up", "down")]
    want = {
        f"base_model.model.model.layers.{i}.{m}.lora_{x}.weight"
        for i in range(cfg.num_layers)
        for m in modules
        for x in "AB"
    }
    assert set(names) == set(tensors) == want
    # The delta PEFT computes, (α/r)·B·A in torch's [out, in] layout, is the merged weights'
    # minus the base's in the Hugging Face export's layout.
    models.save_hf_checkpoint(lora.merged(trained, SPEC), tmp_path / "merged")
    models.save_hf_checkpoint(lora.create_plain_like(trained), tmp_path / "base")
    merged_w = load_file(str(tmp_path / "merged" / "model.safetensors"))
    base_w = load_file(str(tmp_path / "base" / "model.safetensors"))
    for i in range(cfg.num_layers):
        for m in modules:
            p = f"base_model.model.model.layers.{i}.{m}"
            A, B = tensors[f"{p}.lora_A.weight"], tensors[f"{p}.lora_B.weight"]  # [r, in], [out, r]
            assert A.shape[0] == B.shape[1] == 4
            w = f"model.layers.{i}.{m}.weight"  # [out, in]
            np.testing.assert_allclose(
                SPEC.scale * B @ A, merged_w[w] - base_w[w], rtol=1e-4, atol=1e-6
            )


def test_peft_round_trip_through_transformers(adapted, tmp_path):
    pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import peft

    trained = perturbed(adapted)
    models.save_hf_checkpoint(lora.create_plain_like(trained), tmp_path / "base")
    lora.save_peft(trained, SPEC, str(tmp_path / "peft"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    hf = peft.PeftModel.from_pretrained(hf, tmp_path / "peft").eval()
    with torch.no_grad():
        got = hf(torch.tensor(np.asarray(TOKENS))).logits.numpy()
    np.testing.assert_allclose(got, trained(TOKENS), rtol=1e-4, atol=1e-4)


def test_rank_zero_leaves_the_model_alone(base):
    assert lora.add_adapters(base, lora.LoraSpec(rank=0)) is base
    _, params, _, _ = build.abstract_params(tiny(), placement.place(default_config()).trainer, 0)
    assert not any(lora.is_adapter(p) for p, _ in jax.tree_util.tree_leaves_with_path(params))


# --------------------------------------------------------------------------- the trainer (long)


@pytest.mark.long
def test_lora_run_checkpoints_adapters_and_resumes_exactly(shared):
    import trainer_runs as runs

    from gspo_jax.rl import trainer

    extra = {"num_devices": 1, "lora.rank": 8, "lora.alpha": 16.0, "optimizer.learning_rate": 1e-3}
    whole = os.path.join(shared["root"], "lora_single")
    trainer.train(runs.make_config(shared, **extra), whole)
    split = os.path.join(shared["root"], "lora_split")
    assert trainer.train(runs.make_config(shared, **extra), split, stop_after=3) is None
    trainer.train(runs.make_config(shared, **extra), split)  # resumes from step 2
    saved = runs.final_params(whole)
    leaves = jax.tree_util.tree_leaves_with_path(saved["params"])
    assert leaves and all(lora.is_adapter(p) for p, _ in leaves)  # adapters only on disk
    runs.assert_trees(runs.final_params(split), saved)
    runs.assert_records(runs.records(split), runs.records(whole))
    recs = runs.records(whole)
    assert any(r["train/grad_norm"] > 0 for r in recs[1:])
    assert all(abs(r["rollout/logp_diff_mean"]) < 1e-5 for r in recs[1:])
    # the export: the base loaded again under the checkpoint's adapters, merged; the adapters alone
    export_hf = runs.load_repo_module("experiments/export_hf.py")
    out, peft = os.path.join(shared["root"], "lora_hf"), os.path.join(shared["root"], "lora_peft")
    assert export_hf.export(whole, out, peft=peft) == runs.STEPS
    assert os.path.exists(os.path.join(out, "model.safetensors"))
    assert json.load(open(os.path.join(peft, lora.PEFT_CONFIG)))["r"] == 8
