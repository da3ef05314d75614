"""Tests for gspo_jax.models.hf: Hugging Face checkpoint import and export.

Every checkpoint is made here with random weights, written the Hugging Face way (config.json,
model.safetensors or shards + model.safetensors.index.json, [out, in] Linear weights, one tensor
per expert), and the imported model is checked against a float64 numpy forward pass of the
architecture written from Hugging Face's definition (rotate_half rotary, repeat_kv GQA), not
from this codebase's modules.

Dimension legend: B rows, S sequence, V vocab, D hidden, H query heads, K kv heads, Dh head dim,
F MLP hidden, E experts, k experts per token, Fe per-expert MLP hidden.
"""

import dataclasses
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors
from flax import nnx
from safetensors.numpy import save_file

from gspo_jax import models, sharding
from gspo_jax.models import hf, hf_layout

B, S = 2, 7
COMMON = dict(
    vocab_size=48,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=40,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    hidden_act="silu",
)
# Each family's distinguishing fields; `storage` says how its test checkpoint is written.
FAMILIES = {
    "qwen3_tied": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        head_dim=8,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
    ),
    # head_dim 16 != hidden / heads = 8, as in the real Qwen3 shapes (128 vs 64 for 0.6B).
    "qwen3_untied": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        head_dim=16,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
    ),
    "qwen3_moe": dict(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        head_dim=8,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
    "qwen3_moe_unnormed": dict(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        head_dim=8,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=False,
    ),
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
        use_sliding_window=False,
    ),
    "llama": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        num_key_value_heads=1,  # 4 query heads per kv head
        tie_word_embeddings=False,
        rope_theta=500_000.0,
        rope_scaling=None,
        attention_bias=False,
        mlp_bias=False,
    ),
}
STORAGE = {"qwen3_moe": "sharded", "qwen2": "bf16", "llama": "sharded"}
MESHES = {
    "qwen3_moe": {"fsdp": 2, "tensor": 2, "expert": 2},
    "qwen2": {"data": 2, "fsdp": 2, "tensor": 2},
}


def _hf_config(family: str) -> dict:
    return {**COMMON, **FAMILIES[family]}


def _random_tensors(c: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 tensors of config c, scaled so activations and logits are O(1)."""
    rng = np.random.default_rng(seed)
    D, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    Dh = c.get("head_dim") or D // H
    arch = c["architectures"][0]

    def w(*shape, std=None):
        std = std or shape[-1] ** -0.5
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, D, std=1.0), "model.norm.weight": norm(D)}
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = w(V, D)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "self_attn.q_proj.weight"] = w(H * Dh, D)
        t[p + "self_attn.k_proj.weight"] = w(K * Dh, D)
        t[p + "self_attn.v_proj.weight"] = w(K * Dh, D)
        t[p + "self_attn.o_proj.weight"] = w(D, H * Dh)
        if arch.startswith("Qwen3"):
            t[p + "self_attn.q_norm.weight"] = norm(Dh)
            t[p + "self_attn.k_norm.weight"] = norm(Dh)
        if arch == "Qwen2ForCausalLM":
            t[p + "self_attn.q_proj.bias"] = w(H * Dh, std=0.5)
            t[p + "self_attn.k_proj.bias"] = w(K * Dh, std=0.5)
            t[p + "self_attn.v_proj.bias"] = w(K * Dh, std=0.5)
        if "num_experts" in c:
            E, Fe = c["num_experts"], c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = w(E, D, std=1.0)
            for e in range(E):
                t[p + f"mlp.experts.{e}.gate_proj.weight"] = w(Fe, D)
                t[p + f"mlp.experts.{e}.up_proj.weight"] = w(Fe, D)
                t[p + f"mlp.experts.{e}.down_proj.weight"] = w(D, Fe)
        else:
            t[p + "mlp.gate_proj.weight"] = w(F, D)
            t[p + "mlp.up_proj.weight"] = w(F, D)
            t[p + "mlp.down_proj.weight"] = w(D, F)
    return t


def _write_checkpoint(path, c: dict, tensors: dict, storage: str = "single"):
    """config.json + weights as save_pretrained writes them. storage: single | sharded (3 files
    and an index) | bf16 (one bfloat16 file). Returns the tensors as stored, in float32."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**c, "torch_dtype": "bfloat16" if storage == "bf16" else "float32"}, f)
    if storage == "bf16":
        tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
    meta = {"format": "pt"}
    if storage == "sharded":
        names = list(tensors)
        files = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
        weight_map = {n: files[j % 3] for j, n in enumerate(names)}
        for fname in files:
            part = {n: tensors[n] for n in names if weight_map[n] == fname}
            save_file(part, os.path.join(path, fname), metadata=meta)
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f)
    else:
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata=meta)
    return {k: np.asarray(v, np.float32) for k, v in tensors.items()}


# ------------------------------------------------------------------ numpy reference forward


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _rope(x, theta):
    """HF apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, cos/sin = cat(freqs, freqs)."""
    Dh = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, Dh, 2, dtype=np.float64) / Dh)
    freqs = np.arange(x.shape[1], dtype=np.float64)[:, None] * inv_freq  # [S, Dh/2]
    emb = np.concatenate([freqs, freqs], -1)[None, :, None, :]  # [1, S, 1, Dh]
    rotate_half = np.concatenate([-x[..., Dh // 2 :], x[..., : Dh // 2]], -1)
    return x * np.cos(emb) + rotate_half * np.sin(emb)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _reference_logits(c: dict, t: dict, ids: np.ndarray) -> np.ndarray:
    """Causal LM logits [B, S, V] in float64, following the transformers modeling files."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    D, H, K = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    Dh = c.get("head_dim") or D // H
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    Bn, Sn = ids.shape
    x = t["model.embed_tokens.weight"][ids]  # [B, S, D]
    causal = np.tril(np.ones((Sn, Sn), bool))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, t[p + "input_layernorm.weight"], eps)

        def proj(name, n, p=p, h=h):
            y = h @ t[p + f"self_attn.{name}.weight"].T
            if p + f"self_attn.{name}.bias" in t:
                y = y + t[p + f"self_attn.{name}.bias"]
            return y.reshape(Bn, Sn, n, Dh)

        q, k, v = proj("q_proj", H), proj("k_proj", K), proj("v_proj", K)
        if p + "self_attn.q_norm.weight" in t:
            q = _rms(q, t[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, t[p + "self_attn.k_norm.weight"], eps)
        q, k = _rope(q, theta), _rope(k, theta)
        k, v = np.repeat(k, H // K, axis=2), np.repeat(v, H // K, axis=2)  # repeat_kv
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(Dh)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(Bn, Sn, H * Dh)
        x = x + attn @ t[p + "self_attn.o_proj.weight"].T
        h = _rms(x, t[p + "post_attention_layernorm.weight"], eps)

        def mlp(h, pre):
            g = _silu(h @ t[pre + "gate_proj.weight"].T) * (h @ t[pre + "up_proj.weight"].T)
            return g @ t[pre + "down_proj.weight"].T

        if "num_experts" in c:
            logits = h @ t[p + "mlp.gate.weight"].T  # [B, S, E]
            rw = np.exp(logits - logits.max(-1, keepdims=True))
            rw /= rw.sum(-1, keepdims=True)
            top = np.argsort(-rw, -1)[..., : c["num_experts_per_tok"]]  # [B, S, k]
            w = np.take_along_axis(rw, top, -1)
            if c["norm_topk_prob"]:
                w /= w.sum(-1, keepdims=True)
            out = np.zeros_like(h)
            for e in range(c["num_experts"]):
                we = np.sum(np.where(top == e, w, 0.0), -1)[..., None]  # [B, S, 1]
                out += we * mlp(h, p + f"mlp.experts.{e}.")
            x = x + out
        else:
            x = x + mlp(h, p + "mlp.")
    x = _rms(x, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if c["tie_word_embeddings"] else t["lm_head.weight"]
    return x @ head.T


def _ids(V: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, V, (B, S)).astype(np.int32)


@nnx.jit
def _logits(model, ids):
    return model(ids)


def _assert_close_relative(got, want, rtol=1e-4):
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))
    assert err < rtol, err


def _params(model) -> dict[tuple, jax.Array]:
    flat = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return {tuple(getattr(k, "key", k) for k in p): x for p, x in flat}


# -------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (dir, hf config, tensors as stored in float32); written once per module."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for fam in FAMILIES:
        c = _hf_config(fam)
        d = str(root / fam)
        out[fam] = (d, c, _write_checkpoint(d, c, _random_tensors(c), STORAGE.get(fam, "single")))
    return out


@pytest.fixture(scope="module")
def loaded(checkpoints):
    """family -> the model imported without a mesh (each is compiled and loaded once)."""
    return {fam: models.load_hf_checkpoint(d) for fam, (d, _, _) in checkpoints.items()}


# ----------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("family", list(FAMILIES))
def test_import_matches_numpy_reference(family, checkpoints, loaded):
    """Imported logits equal an independent float64 forward of the architecture (1e-4 rel)."""
    d, c, tensors = checkpoints[family]
    model = loaded[family]
    cfg = model.cfg
    assert isinstance(model, models.CausalLM)
    assert cfg.qk_norm == family.startswith("qwen3")
    assert cfg.attention_bias == (family == "qwen2")
    assert cfg.tie_embeddings == c["tie_word_embeddings"]
    assert cfg.head_dim == c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    assert cfg.num_experts == c.get("num_experts", 0) and cfg.rope_theta == c["rope_theta"]
    assert cfg.norm_topk_prob == c.get("norm_topk_prob", cfg.norm_topk_prob)
    assert all(x.dtype == jnp.float32 for x in _params(model).values())
    if STORAGE.get(family) == "bf16":  # bf16 storage loads exactly into float32 parameters
        q = np.asarray(model.layers.attn.q_proj[...])
        np.testing.assert_array_equal(q, q.astype(ml_dtypes.bfloat16).astype(np.float32))
    ids = _ids(c["vocab_size"])
    logits = _logits(model, jnp.asarray(ids))
    assert logits.shape == (B, S, c["vocab_size"]) and logits.dtype == jnp.float32
    want = _reference_logits(c, tensors, ids)
    assert np.std(want) > 0.5  # the random weights give logits worth comparing
    _assert_close_relative(logits, want)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_import_round_trip_is_bit_identical(family, checkpoints, loaded, tmp_path):
    """Export writes HF's names, shapes and config fields; importing it gives the same bits.
    One family is exported in several shards with an index."""
    d, c, tensors = checkpoints[family]
    model = loaded[family]
    sharded = family == "qwen3_untied"
    out = str(tmp_path / "export")
    models.save_hf_checkpoint(model, out, max_shard_bytes=8_000 if sharded else 10**9)
    files = sorted(os.listdir(out))
    if sharded:
        assert "model.safetensors.index.json" in files and len(files) > 4, files
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
    else:
        assert files == ["config.json", "model.safetensors"]
        weight_map = None
    # The stored tensors are the checkpoint's own (a tied head is not written, as HF does).
    written = {}
    for fname in files:
        if fname.endswith(".safetensors"):
            with safetensors.safe_open(os.path.join(out, fname), framework="numpy") as f:
                for name in f.keys():
                    written[name] = f.get_tensor(name)
                    assert weight_map is None or weight_map[name] == fname
    assert sorted(written) == sorted(tensors)
    for name, x in written.items():
        assert x.dtype == np.float32 and x.shape == tensors[name].shape, name
        np.testing.assert_array_equal(x, tensors[name], err_msg=name)
    with open(os.path.join(out, "config.json")) as f:
        exported_cfg = json.load(f)
    assert exported_cfg["torch_dtype"] == "float32"
    for key, value in c.items():  # every field the test config sets, written back the same
        assert exported_cfg[key] == value, key
    again = models.load_hf_checkpoint(out)
    assert again.cfg == model.cfg
    a, b = _params(model), _params(again)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=str(key))
    # A second export into the same directory replaces the first (no stale shards survive).
    models.save_hf_checkpoint(again, out, dtype="bfloat16")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    with safetensors.safe_open(os.path.join(out, "model.safetensors"), framework="numpy") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == ml_dtypes.bfloat16


def _param_of(name: str) -> tuple[tuple, int]:
    """Our parameter path for a HF tensor name, and how many leading axes of that parameter the
    name indexes (1: one layer of the stacked layers, 2: one expert of one layer; an independent
    spelling of the name mapping, for the read-size checks)."""
    top = {
        "model.embed_tokens.weight": ("embed",),
        "model.norm.weight": ("final_norm", "scale"),
        "lm_head.weight": ("lm_head",),
    }
    if name in top:
        return top[name], 0
    rest = re.fullmatch(r"model\.layers\.\d+\.(.+)", name)[1]
    expert = re.fullmatch(r"mlp\.experts\.\d+\.(\w+)\.weight", rest)
    if expert:
        return ("layers", "mlp", expert[1]), 2
    layer = {
        "input_layernorm.weight": ("input_norm", "scale"),
        "post_attention_layernorm.weight": ("post_attn_norm", "scale"),
        "self_attn.q_norm.weight": ("attn", "q_norm", "scale"),
        "self_attn.k_norm.weight": ("attn", "k_norm", "scale"),
        "mlp.gate.weight": ("mlp", "router"),
    }
    if rest in layer:
        return ("layers", *layer[rest]), 1
    m = re.fullmatch(r"(self_attn|mlp)\.(\w)(\w+)\.(weight|bias)", rest)
    module = "attn" if m[1] == "self_attn" else "mlp"
    leaf = f"{m[2]}_bias" if m[4] == "bias" else m[2] + m[3]
    return ("layers", module, leaf), 1


class _RecordingSafetensors:
    """safe_open whose handles record every get_slice read (name, stored shape, read shape) and
    offer no get_tensor: a whole-tensor read would have to go through get_slice."""

    def __init__(self, real_open):
        self.real_open = real_open
        self.reads: list[tuple[str, tuple, tuple]] = []

    def __call__(self, filename, framework, **kw):
        handle = self.real_open(filename, framework=framework, **kw)
        reads = self.reads

        class Slice:
            def __init__(self, name, real):
                self.name, self.real = name, real

            def get_shape(self):
                return self.real.get_shape()

            def __getitem__(self, index):
                out = self.real[index]
                reads.append((self.name, tuple(self.real.get_shape()), tuple(out.shape)))
                return out

        class Handle:
            def __enter__(self):
                handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def keys(self):
                return handle.keys()

            def get_slice(self, name):
                return Slice(name, handle.get_slice(name))

        return Handle()


@pytest.mark.parametrize("family", list(MESHES))
def test_sharded_load_reads_only_each_devices_slice(family, checkpoints, loaded, monkeypatch):
    """On 8 devices each shard equals the slice of the whole parameter, and every read from the
    files is at most one device's shard (one expert's part of it for stacked experts): no host
    ever reads a whole sharded tensor."""
    d = checkpoints[family][0]
    mesh = sharding.make_mesh(MESHES[family])
    recorder = _RecordingSafetensors(safetensors.safe_open)
    monkeypatch.setattr(safetensors, "safe_open", recorder)
    model = models.load_hf_checkpoint(d, mesh=mesh)
    monkeypatch.undo()
    full, sharded = _params(loaded[family]), _params(model)
    n_sharded = 0
    for key, x in sharded.items():
        assert x.sharding.mesh == mesh and len(x.sharding.device_set) == 8
        n_sharded += not x.sharding.is_fully_replicated
        for shard in x.addressable_shards:
            np.testing.assert_array_equal(shard.data, np.asarray(full[key])[shard.index])
    assert n_sharded >= 8  # the mesh really splits most parameters
    q = ("layers", "attn", "q_proj")
    assert sharded[q].sharding.spec == sharding.logical_to_spec(
        ("layers", "embed", "heads", "head_dim"), full[q].shape, mesh
    )
    read_names = set()
    for name, stored, got in recorder.reads:
        key, lead = _param_of(name)
        x = sharded[key]
        shard = x.addressable_shards[0].data.shape
        assert math.prod(got) <= math.prod(shard[lead:]), (name, got, shard)
        if shard[lead:] != x.shape[lead:]:  # the shard cuts the tensor: only a slice is read
            assert got != stored, f"{name}: whole tensor {stored} read for a sharded parameter"
        read_names.add(name)
    assert read_names == set(checkpoints[family][2])  # every tensor read, through slices only


@pytest.mark.parametrize("preset", ["qwen3_0_6b", "qwen3_30b_a3b"])
def test_released_qwen3_configs_map_to_the_presets(preset):
    """The fields of the released config.json files (Qwen/Qwen3-0.6B, Qwen/Qwen3-30B-A3B) give
    exactly the preset shapes, so a real checkpoint of either loads onto the preset's model."""
    common = dict(
        vocab_size=151_936,
        head_dim=128,
        max_position_embeddings=40_960,
        rope_theta=1_000_000,
        rope_scaling=None,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attention_bias=False,
        use_sliding_window=False,
        initializer_range=0.02,
    )
    released = {
        "qwen3_0_6b": dict(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            tie_word_embeddings=True,
        ),
        "qwen3_30b_a3b": dict(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
        ),
    }[preset]
    cfg = hf.config_from_hf({**common, **released}, dtype="bfloat16")
    assert dataclasses.replace(cfg, name=preset) == models.get_model_config(preset)


def test_read_block_handles_non_contiguous_slices():
    """A block whose merged stored axis is cut inside its minor part (e.g. head_dim split, which
    the rule table never does today) is assembled from several reads and still exact."""
    H, Dh, D = 3, 4, 5
    stored = np.arange(H * Dh * D, dtype=np.float32).reshape(H * Dh, D)  # q_proj [H*Dh, D]
    ours = stored.T.reshape(D, H, Dh)
    spec = hf_layout.Spec(("q",), (1, 2, 0), (2, 1))
    for ranges in ([(1, 4), (1, 3), (0, 4)], [(0, 5), (0, 3), (1, 3)], [(2, 3), (1, 2), (3, 4)]):
        got = hf_layout.read_block(stored, spec, ours.shape, ranges)
        np.testing.assert_array_equal(got, ours[tuple(slice(a, b) for a, b in ranges)])


def test_missing_files_and_unsupported_checkpoints_fail_clearly(checkpoints, tmp_path):
    d, c, tensors = checkpoints["qwen3_tied"]
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.load_hf_checkpoint(tmp_path / "nothing")
    gpt2 = str(tmp_path / "gpt2")
    _write_checkpoint(gpt2, {**c, "architectures": ["GPT2LMHeadModel"]}, tensors)
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*Qwen3ForCausalLM.*LlamaForCausalLM"):
        models.load_hf_checkpoint(gpt2)
    llama31 = str(tmp_path / "llama31")
    rope = {"rope_type": "llama3", "factor": 8.0}
    cl = _hf_config("llama")
    _write_checkpoint(llama31, {**cl, "rope_scaling": rope}, _random_tensors(cl))
    with pytest.raises(ValueError, match="llama3.*not implemented"):
        models.load_hf_checkpoint(llama31)
    no_weights = str(tmp_path / "no_weights")
    _write_checkpoint(no_weights, c, tensors)
    os.remove(os.path.join(no_weights, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="model.safetensors.index.json"):
        models.load_hf_checkpoint(no_weights)
    lost_shard = str(tmp_path / "lost_shard")
    _write_checkpoint(lost_shard, c, tensors, "sharded")
    os.remove(os.path.join(lost_shard, "model-00002-of-00003.safetensors"))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors"):
        models.load_hf_checkpoint(lost_shard)
    missing = str(tmp_path / "missing_tensor")
    name = "model.layers.1.self_attn.k_norm.weight"
    _write_checkpoint(missing, c, {k: v for k, v in tensors.items() if k != name})
    with pytest.raises(ValueError, match=re.escape(name)):
        models.load_hf_checkpoint(missing)
    extra = str(tmp_path / "extra_tensor")
    bias = "model.layers.0.self_attn.o_proj.bias"
    _write_checkpoint(extra, c, {**tensors, bias: np.zeros(32, np.float32)})
    with pytest.raises(ValueError, match=re.escape(bias)):
        models.load_hf_checkpoint(extra)
    wrong = str(tmp_path / "wrong_shape")
    _write_checkpoint(wrong, {**c, "intermediate_size": 41}, tensors)
    with pytest.raises(ValueError, match="mlp.gate_proj.weight.*shape"):
        models.load_hf_checkpoint(wrong)
    cfg = models.get_model_config("tiny", attention_bias=True)  # q/k norm and biases: no HF twin
    with pytest.raises(ValueError, match="No supported Hugging Face architecture"):
        models.save_hf_checkpoint(nnx.eval_shape(lambda: models.create_model(cfg)), tmp_path)


@pytest.mark.parametrize("family", ["qwen3_untied", "qwen3_moe", "qwen2", "llama"])
def test_matches_transformers(family, checkpoints, loaded, tmp_path):
    """Optional: logits of transformers' own implementation, from the test checkpoint and from
    our export of it (so the export is what from_pretrained reads)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    d, c, _ = checkpoints[family]
    ids = _ids(c["vocab_size"])
    ours = np.asarray(_logits(loaded[family], jnp.asarray(ids)))
    out = str(tmp_path / "export")
    models.save_hf_checkpoint(loaded[family], out)
    for path in (d, out):
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32, attn_implementation="eager"
        ).eval()
        with torch.no_grad():
            want = ref(torch.as_tensor(ids, dtype=torch.long)).logits.double().numpy()
        _assert_close_relative(ours, want)


@pytest.mark.long  # a trainer run from a written folder: .ci/run's long stage
def test_a_run_starts_from_a_checkpoint_folder(shared, tmp_path):
    """config.init.kind='hf': the model's shapes come from the folder's config.json and its
    weights are the checkpoint's (here an export of the arith task's tiny model)."""
    from trainer_runs import make_config

    from gspo_jax import config as config_lib
    from gspo_jax.rl import build as experiment
    from gspo_jax.rl import trainer

    cfg = make_config(shared, num_devices=1)
    cfg.rl.num_steps, cfg.eval.num_problems = 1, 0
    task = experiment.make_task(cfg)
    source = models.create_model(experiment.make_model_config(cfg, task), seed=7)
    models.save_hf_checkpoint(source, str(tmp_path / "ckpt"))
    cfg.init.kind = "hf"
    cfg.init.checkpoint = str(tmp_path / "ckpt")
    run = experiment.build_run(cfg)
    params, _ = experiment.base_params(run)
    expected = nnx.state(source, nnx.Param)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert trainer.train(cfg, str(tmp_path / "run"))["steps"] == 1
    cfg.init.checkpoint = str(tmp_path / "missing")
    with pytest.raises(config_lib.ConfigError, match="needs config.init.checkpoint"):
        experiment.build_run(cfg, None)


@pytest.mark.long  # a trained run exported and reloaded: .ci/run's long stage
def test_a_trained_run_exports_to_a_checkpoint_folder(single, tmp_path):
    """experiments/export_hf.py: the newest checkpoint's parameters, as a loadable folder."""
    from trainer_runs import final_params, load_repo_module

    export_hf = load_repo_module("experiments/export_hf.py")
    assert export_hf.export(single[0], str(tmp_path / "out")) == 4
    loaded = models.load_hf_checkpoint(str(tmp_path / "out"))
    trained = final_params(single[0])["params"]
    got = nnx.to_pure_dict(nnx.state(loaded, nnx.Param))
    flat_got = sorted(jax.tree_util.tree_flatten_with_path(got)[0], key=lambda kv: str(kv[0]))
    flat_want = sorted(jax.tree_util.tree_flatten_with_path(trained)[0], key=lambda kv: str(kv[0]))
    assert len(flat_got) == len(flat_want) > 0
    for (_, a), (_, b) in zip(flat_got, flat_want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
