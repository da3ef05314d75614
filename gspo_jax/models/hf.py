"""Hugging Face checkpoints: import onto the one decoder (load_hf_checkpoint) and export from it.

Dimension legend: V vocab, D hidden, L layers, H query heads, K kv heads, Dh head dim,
F MLP hidden, E experts, Fe per-expert MLP hidden.

    model = models.load_hf_checkpoint(path, dtype="float32", mesh=None)   # -> models.Transformer
    models.save_hf_checkpoint(model, path)                                  # same names and shapes
    logits = model(input_ids)                                               # [B, S, V] float32

A checkpoint directory holds config.json and model.safetensors, or shards named by
model.safetensors.index.json. Supported architectures, each a set of ModelConfig flags on the
same modules (gspo_jax/models/config.py), not a copy of them:

    Qwen3ForCausalLM      per-head q/k RMSNorm, no biases         qk_norm=True
    Qwen3MoeForCausalLM   the same with top-k experts per layer    qk_norm=True, num_experts=E
    Qwen2ForCausalLM      q/k/v biases, no q/k norm (Qwen2.5)      qk_norm=False, attention_bias
    LlamaForCausalLM      no biases, no q/k norm                   qk_norm=False

config.json is read as transformers 4.x and 5.x write it: 5.x renamed Qwen3-MoE's num_experts to
num_local_experts, torch_dtype to dtype, and moved rope_theta / rope_scaling into
rope_parameters {rope_type, rope_theta}; either name is accepted (ALIASES). Anything these modules
do not compute -- a rope type other than "default" (e.g. Llama-3.1's "llama3"), sliding-window
attention (use_sliding_window, layer_types), an o_proj or MLP bias, dense layers inside an MoE
stack (mlp_only_layers, decoder_sparse_step), an activation other than SiLU -- is a ValueError
naming the field, rather than a model that loads and computes something else.

Layout. Hugging Face Linear weights are [out, in]; this codebase keeps [in, out] with the head
axes split out (q_proj [D, H, Dh], o_proj [H, Dh, D], see layers.py) and stacks the experts of a
layer on a leading axis (gate_proj [E, D, Fe]) where Hugging Face stores one tensor per expert
(mlp.experts.{e}.gate_proj.weight [Fe, D]); the decoder layers are stacked too (every layer
parameter has a leading [L] axis, models/transformer.py), where Hugging Face stores
model.layers.{i}.*. One table (_tensor_specs) says, for every parameter,
which tensor(s) hold it and how the axes correspond; import and export both read it, so an
export followed by an import is bit-identical.

Rotary embeddings need no permutation: Hugging Face's rotate_half pairs dimension i with
i + Dh/2 and uses inv_freq = theta^(-2i/Dh), exactly as layers.apply_rope does, so q_proj/k_proj
load as stored (Meta's original, interleaved Llama checkpoints would need one; they are not
supported).

Sharded import. With a mesh, every parameter is created by jax.make_array_from_callback with the
shardings of the abstract model (gspo_jax/sharding.py state_shardings), and the callback
reads only the slice of the stored tensor that the device's shard covers (safetensors get_slice; the
slice index is permuted to the stored layout and a layer- or expert-stacked parameter is read one
layer's / expert's slice at a time). So each process reads only what its devices hold, and no host
ever holds a whole sharded tensor of, say, a 30B checkpoint. Parameters are float32 whatever the
stored dtype (bfloat16 weights load exactly into float32); `dtype` is the compute dtype.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import itertools
import json
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import chex
import jax
import numpy as np
from flax import nnx

from gspo_jax.models.config import _DTYPES, ModelConfig
from gspo_jax.models.transformer import Transformer, create_model
from gspo_jax.sharding import state_shardings

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # Hugging Face's default max_shard_size, "5GB"


@dataclasses.dataclass(frozen=True)
class _Family:
    model_type: str
    qk_norm: bool
    attention_bias: bool
    moe: bool
    default_head_dim: int | None  # None: hidden_size // num_attention_heads


ARCHITECTURES: dict[str, _Family] = {
    # Qwen3Config defaults head_dim to 128 rather than hidden // heads; Qwen3MoeConfig has no
    # head_dim default (its attention falls back to hidden // heads), nor do Llama and Qwen2.
    "Qwen3ForCausalLM": _Family("qwen3", True, False, False, 128),
    "Qwen3MoeForCausalLM": _Family("qwen3_moe", True, False, True, None),
    "Qwen2ForCausalLM": _Family("qwen2", False, True, False, None),
    "LlamaForCausalLM": _Family("llama", False, False, False, None),
}
SUPPORTED = tuple(ARCHITECTURES)


# ---------------------------------------------------------------------------------- config


def _safetensors():
    """The safetensors package, imported on first use so that the models package imports
    without it."""
    try:
        import safetensors
        import safetensors.numpy
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Hugging Face checkpoints need the safetensors package: pip install safetensors."
        ) from e
    return safetensors


# Fields transformers renamed between 4.x and 5.x: (the value's meaning, names in either version).
# A config.json may carry either name; both with different values is an error.
ALIASES = {
    "num_experts": ("num_experts", "num_local_experts"),  # Qwen3-MoE: 5.x writes num_local_experts
    "dtype": ("torch_dtype", "dtype"),  # 5.x writes dtype
}


def _field(hf: dict, key: str, default: Any = None) -> Any:
    """The value of ``key`` under whichever of its names (ALIASES) config.json uses."""
    names = ALIASES.get(key, (key,))
    found = {n: hf[n] for n in names if hf.get(n) is not None}
    if len(set(map(json.dumps, found.values()))) > 1:
        raise ValueError(
            f"config.json sets {' and '.join(f'{n}={v!r}' for n, v in found.items())}: two names "
            "for one field with different values; keep one."
        )
    return next(iter(found.values()), default)


def _require(hf: dict, key: str, arch: str) -> Any:
    value = _field(hf, key)
    if value is None:
        names = " or ".join(repr(n) for n in ALIASES.get(key, (key,)))
        raise ValueError(f"config.json of a {arch} checkpoint has no {names}; it is required.")
    return value


def _rope_theta(hf: dict) -> float:
    """Rotary base: 4.x writes rope_theta (and rope_scaling), 5.x rope_parameters {rope_type,
    rope_theta}. Only the plain ("default") rotary embedding is implemented."""
    scaling, params = hf.get("rope_scaling") or {}, hf.get("rope_parameters") or {}
    nested = sorted(k for k, v in params.items() if isinstance(v, dict))
    if nested:  # 5.x's per-layer-type form (sliding / full attention with their own rope)
        raise ValueError(
            f"config.json rope_parameters has per-layer-type entries {nested}; only one rotary "
            "embedding for every layer is implemented."
        )
    for where, rope in (("rope_scaling", scaling), ("rope_parameters", params)):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"config.json {where} has rope type {rope_type!r}, which is not implemented; only "
                "the 'default' rotary embedding is (layers.apply_rope)."
            )
    top, inner = hf.get("rope_theta"), params.get("rope_theta")
    if top is not None and inner is not None and float(top) != float(inner):
        raise ValueError(
            f"config.json sets rope_theta={top!r} and rope_parameters.rope_theta={inner!r}: two "
            "names for one field with different values; keep one."
        )
    return float(next((t for t in (top, inner) if t is not None), 10_000.0))


def _dense_layers(hf: dict, num_layers: int) -> list[int]:
    """Layers of a Qwen3-MoE stack that transformers builds with a dense MLP: those in
    mlp_only_layers, and those whose (index + 1) is not a multiple of decoder_sparse_step."""
    only = set(hf.get("mlp_only_layers") or [])
    step = int(hf.get("decoder_sparse_step") or 1)
    return [i for i in range(num_layers) if i in only or (i + 1) % step != 0]


def config_from_hf(hf: dict, dtype: str = "float32") -> ModelConfig:
    """ModelConfig for a Hugging Face config.json dict, as transformers 4.x or 5.x writes it
    (ALIASES, rope_parameters); ValueError for what the decoder lacks."""
    archs = hf.get("architectures") or []
    if len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise ValueError(
            f"config.json architectures={archs!r} is not supported; supported: "
            f"{', '.join(SUPPORTED)}."
        )
    arch = archs[0]
    fam = ARCHITECTURES[arch]
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported; the MLPs here are SwiGLU (silu).")
    theta = _rope_theta(hf)
    if hf.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported: attention here is full.")
    # 5.x writes every layer's attention kind (Qwen2 / Qwen3: "full_attention" unless sliding).
    other = sorted(set(hf.get("layer_types") or []) - {"full_attention"})
    if other:
        raise ValueError(
            f"config.json layer_types has {other}: only full attention is implemented here."
        )
    if hf.get("mlp_bias"):
        raise ValueError("mlp_bias=true is not supported: the MLPs here have no biases.")
    if hf.get("attention_bias") and not fam.attention_bias:
        raise ValueError(
            f"attention_bias=true on {arch} (biases on q/k/v and o_proj) is not supported; only "
            "Qwen2's q/k/v biases are (Qwen2ForCausalLM)."
        )
    stored = _field(hf, "dtype")
    if stored is not None and stored not in _DTYPES:
        raise ValueError(
            f"config.json torch_dtype/dtype={stored!r} is not one of {sorted(_DTYPES)}; the "
            "weights are read in their stored dtype, so fix that field."
        )
    heads = int(_require(hf, "num_attention_heads", arch))
    hidden = int(_require(hf, "hidden_size", arch))
    head_dim = hf.get("head_dim") or fam.default_head_dim or hidden // heads
    num_layers = int(_require(hf, "num_hidden_layers", arch))
    fields = dict(
        name=hf.get("model_type", fam.model_type),
        vocab_size=int(_require(hf, "vocab_size", arch)),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        mlp_dim=int(_require(hf, "intermediate_size", arch)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=fam.qk_norm,
        attention_bias=fam.attention_bias,
        rope_theta=theta,
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_seq_len=int(_require(hf, "max_position_embeddings", arch)),
        dtype=dtype,
    )
    if "initializer_range" in hf:
        fields["init_std"] = float(hf["initializer_range"])
    if fam.moe:
        dense = _dense_layers(hf, num_layers)
        if dense:
            raise ValueError(
                f"config.json mlp_only_layers={hf.get('mlp_only_layers')} / decoder_sparse_step="
                f"{hf.get('decoder_sparse_step')} make layers {dense} dense inside the MoE stack; "
                "not supported: every layer here is MoE (mlp_only_layers=[], "
                "decoder_sparse_step=1)."
            )
        fields.update(
            num_experts=int(_require(hf, "num_experts", arch)),
            experts_per_token=int(_require(hf, "num_experts_per_tok", arch)),
            moe_mlp_dim=int(_require(hf, "moe_intermediate_size", arch)),
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        )
    return ModelConfig(**fields)


def architecture_of(cfg: ModelConfig) -> str:
    """The Hugging Face architecture computing the same function as cfg (ValueError if none)."""
    for arch, fam in ARCHITECTURES.items():
        if (fam.qk_norm, fam.attention_bias, fam.moe) == (
            cfg.qk_norm,
            cfg.attention_bias,
            cfg.is_moe,
        ):
            return arch
    raise ValueError(
        f"No supported Hugging Face architecture has qk_norm={cfg.qk_norm}, "
        f"attention_bias={cfg.attention_bias}, num_experts={cfg.num_experts}; supported: "
        + "; ".join(
            f"{a} (qk_norm={f.qk_norm}, attention_bias={f.attention_bias}, moe={f.moe})"
            for a, f in ARCHITECTURES.items()
        )
    )


def config_to_hf(cfg: ModelConfig, torch_dtype: str = "float32") -> dict:
    """The config.json dict of cfg, with the fields its architecture's config class reads."""
    arch = architecture_of(cfg)
    fam = ARCHITECTURES[arch]
    out = dict(
        architectures=[arch],
        model_type=fam.model_type,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.mlp_dim,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.rms_eps,
        rope_theta=cfg.rope_theta,
        rope_scaling=None,
        tie_word_embeddings=cfg.tie_embeddings,
        attention_dropout=0.0,
        initializer_range=cfg.init_std,
        use_cache=True,
        torch_dtype=torch_dtype,
    )
    if fam.model_type in ("qwen3", "qwen3_moe", "qwen2"):
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.num_layers)
    if fam.model_type in ("qwen3", "qwen3_moe", "llama"):
        out.update(attention_bias=False)
    if fam.model_type == "llama":
        out.update(mlp_bias=False, pretraining_tp=1)
    if fam.moe:
        out.update(
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.experts_per_token,
            moe_intermediate_size=cfg.moe_mlp_dim,
            norm_topk_prob=cfg.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            router_aux_loss_coef=0.001,
            output_router_logits=False,
        )
    return out


# ------------------------------------------------------------------------- tensor mapping


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Where one parameter lives in the checkpoint.

    names: the Hugging Face tensor, or one tensor per index of our `lead` leading axes, in
        row-major order (layers, then experts: model.layers.{i}.mlp.experts.{e}.*).
    perm: the stored tensor viewed with its merged axes split is our (per-layer, per-expert)
        array transposed by perm: view axis i is our axis perm[i].
    merge: stored axis j is the row-major merge of the next merge[j] view axes (q_proj's
        [H * Dh, D] is the view [H, Dh, D] with merge (2, 1)).
    lead: how many leading axes of our array index the tensors (0, 1 = layers, 2 = layers and
        experts).
    """

    names: tuple[str, ...]
    perm: tuple[int, ...]
    merge: tuple[int, ...]
    lead: int = 0

    def view_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        sub = shape[self.lead :]
        return tuple(sub[p] for p in self.perm)

    def stored_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """Shape of each stored tensor for our parameter shape."""
        view, out, i = self.view_shape(shape), [], 0
        for m in self.merge:
            out.append(math.prod(view[i : i + m]))
            i += m
        return tuple(out)

    def sub(self, i: int, n: int) -> _Spec:
        """The spec of index i of the first leading axis (of size n): one layer's tensors."""
        per = len(self.names) // n
        return dataclasses.replace(
            self, names=self.names[i * per : (i + 1) * per], lead=self.lead - 1
        )


_SAME = ((0,), (1,))  # 1-D tensors (norm scales): stored as they are
_LINEAR = ((1, 0), (1, 1))  # [in, out] here, [out, in] stored


def _tensor_specs(cfg: ModelConfig) -> dict[tuple, _Spec]:
    """Parameter path (as in nnx.state(model)) -> _Spec, in the checkpoint's tensor order.

    The decoder layers are one stacked module (transformer.stack_layers): each of its parameters
    [L, ...] is held by the L tensors model.layers.{i}.<name>.
    """
    specs: dict[tuple, _Spec] = {("embed",): _Spec(("model.embed_tokens.weight",), (0, 1), (1, 1))}
    layers = range(cfg.num_layers)

    def one(path, name, perm_merge=_SAME):
        names = tuple(f"model.layers.{i}.{name}" for i in layers)
        specs[("layers", *path)] = _Spec(names, *perm_merge, lead=1)

    one(("input_norm", "scale"), "input_layernorm.weight")
    one(("attn", "q_proj"), "self_attn.q_proj.weight", ((1, 2, 0), (2, 1)))  # [H*Dh, D]
    one(("attn", "k_proj"), "self_attn.k_proj.weight", ((1, 2, 0), (2, 1)))  # [K*Dh, D]
    one(("attn", "v_proj"), "self_attn.v_proj.weight", ((1, 2, 0), (2, 1)))  # [K*Dh, D]
    one(("attn", "o_proj"), "self_attn.o_proj.weight", ((2, 0, 1), (1, 2)))  # [D, H*Dh]
    if cfg.attention_bias:
        for x in "qkv":
            one(("attn", f"{x}_bias"), f"self_attn.{x}_proj.bias", ((0, 1), (2,)))
    if cfg.qk_norm:
        one(("attn", "q_norm", "scale"), "self_attn.q_norm.weight")
        one(("attn", "k_norm", "scale"), "self_attn.k_norm.weight")
    one(("post_attn_norm", "scale"), "post_attention_layernorm.weight")
    if cfg.is_moe:
        one(("mlp", "router"), "mlp.gate.weight", _LINEAR)  # [E, D]
        for w in ("gate_proj", "up_proj", "down_proj"):
            names = tuple(
                f"model.layers.{i}.mlp.experts.{e}.{w}.weight"
                for i in layers
                for e in range(cfg.num_experts)
            )
            specs[("layers", "mlp", w)] = _Spec(names, *_LINEAR, lead=2)
    else:
        for w in ("gate_proj", "up_proj", "down_proj"):
            one(("mlp", w), f"mlp.{w}.weight", _LINEAR)
    specs[("final_norm", "scale")] = _Spec(("model.norm.weight",), *_SAME)
    if not cfg.tie_embeddings:
        specs[("lm_head",)] = _Spec(("lm_head.weight",), *_LINEAR)  # [V, D]
    return specs


def _ignorable(name: str, cfg: ModelConfig) -> bool:
    """Stored tensors that carry nothing the model lacks: a tied head saved anyway, and the
    rotary inv_freq buffers older exports contain."""
    return (name == "lm_head.weight" and cfg.tie_embeddings) or name.endswith("rotary_emb.inv_freq")


def _path_key(path) -> tuple:
    return tuple(getattr(k, "key", k) for k in path)


# ---------------------------------------------------------------------------------- import


def _chunks(sizes: Sequence[int], ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Contiguous [start, stop) runs, in row-major order, of the block `ranges` of the merged axis
    whose split sizes are `sizes`: one run unless an axis before the last partial one is cut."""
    partial = [i for i, (r, n) in enumerate(zip(ranges, sizes, strict=True)) if r != (0, n)]
    q = max(partial, default=0)  # axes after q are whole
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    runs = []
    for lead in itertools.product(*(range(a, b) for a, b in ranges[:q])):
        base = sum(c * s for c, s in zip(lead, strides[:q], strict=True))
        a, b = ranges[q]
        runs.append((base + a * strides[q], base + b * strides[q]))
    return runs


def _read_block(slicer, spec: _Spec, shape: Sequence[int], ranges) -> np.ndarray:
    """Our array's block `ranges` ([start, stop) per our per-expert axis) from one stored tensor,
    reading only the stored slices it covers."""
    view = spec.view_shape(shape)
    vranges = [ranges[p] for p in spec.perm]
    per_axis, i = [], 0
    for m in spec.merge:
        per_axis.append(_chunks(view[i : i + m], vranges[i : i + m]))
        i += m
    if all(len(c) == 1 for c in per_axis):  # the usual case: one slice read
        block = slicer[tuple(slice(*c[0]) for c in per_axis)]
    else:
        parts = {}
        for combo in itertools.product(*(enumerate(c) for c in per_axis)):
            parts[tuple(j for j, _ in combo)] = slicer[tuple(slice(*r) for _, r in combo)]
        block = np.block(_nest(parts, [len(c) for c in per_axis]))
    block = np.asarray(block).reshape([b - a for a, b in vranges])
    return block.transpose(np.argsort(spec.perm))


def _nest(parts: dict, counts: list[int], prefix: tuple = ()) -> Any:
    if len(prefix) == len(counts):
        return parts[prefix]
    return [_nest(parts, counts, (*prefix, j)) for j in range(counts[len(prefix)])]


class _Reader:
    """Open safetensors files of a checkpoint directory, by tensor name."""

    def __init__(self, path: str, stack: contextlib.ExitStack):
        safe_open = _safetensors().safe_open
        single, index = os.path.join(path, WEIGHTS_FILE), os.path.join(path, INDEX_FILE)
        if os.path.exists(single):
            self.files = {WEIGHTS_FILE: stack.enter_context(safe_open(single, framework="numpy"))}
            self.weight_map = dict.fromkeys(self.files[WEIGHTS_FILE].keys(), WEIGHTS_FILE)
            return
        if not os.path.exists(index):
            raise FileNotFoundError(
                f"No weights in {path}: neither {WEIGHTS_FILE} nor {INDEX_FILE} (with the shards "
                "it names) is there. Hugging Face safetensors checkpoints are supported; "
                "convert .bin / .pth weights to safetensors first."
            )
        with open(index) as f:
            self.weight_map = dict(json.load(f)["weight_map"])
        self.files = {}
        for name in sorted(set(self.weight_map.values())):
            shard = os.path.join(path, name)
            if not os.path.exists(shard):
                raise FileNotFoundError(
                    f"{INDEX_FILE} in {path} names the shard {name}, which is not there."
                )
            self.files[name] = stack.enter_context(safe_open(shard, framework="numpy"))

    def slicer(self, name: str):
        return self.files[self.weight_map[name]].get_slice(name)


def _check_tensors(reader: _Reader, specs: dict, shapes: dict, cfg: ModelConfig, path: str):
    """Every tensor present with its expected shape, and none the model would silently drop."""
    expected = {}
    for key, spec in specs.items():
        for name in spec.names:
            expected[name] = spec.stored_shape(shapes[key])
    missing = [n for n in expected if n not in reader.weight_map]
    if missing:
        raise ValueError(
            f"{len(missing)} tensor(s) missing from the checkpoint in {path}, e.g. "
            f"{missing[:3]}; a {architecture_of(cfg)} with this config.json needs them."
        )
    extra = sorted(n for n in reader.weight_map if n not in expected and not _ignorable(n, cfg))
    if extra:
        raise ValueError(
            f"The checkpoint in {path} has tensor(s) this model has no parameter for, e.g. "
            f"{extra[:3]} (biases, shared experts, ... that the decoder does not compute); "
            f"supported: {', '.join(SUPPORTED)} as described in gspo_jax/models/hf.py."
        )
    for name, shape in expected.items():
        got = tuple(reader.slicer(name).get_shape())
        if got != shape:
            raise ValueError(
                f"Tensor {name} in {path} has shape {got}; config.json implies {shape}."
            )


def load_hf_checkpoint(
    path: str | os.PathLike, dtype: str = "float32", mesh: jax.sharding.Mesh | None = None
) -> Transformer:
    """A Transformer with the weights of the Hugging Face checkpoint directory `path`.

    dtype: the compute dtype (parameters are always float32). mesh: create every parameter
    already sharded, each process reading only the slices its devices hold (module docstring).
    Raises FileNotFoundError for a missing config.json, weights file or shard, ValueError for an
    unsupported architecture or config field and for missing, extra or misshapen tensors.
    """
    path = os.fspath(path)
    cfg_file = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(cfg_file):
        raise FileNotFoundError(
            f"No {CONFIG_FILE} in {path}: a Hugging Face checkpoint directory holds {CONFIG_FILE} "
            f"and {WEIGHTS_FILE} (or {INDEX_FILE} and its shards); supported architectures: "
            f"{', '.join(SUPPORTED)}."
        )
    with open(cfg_file) as f:
        cfg = config_from_hf(json.load(f), dtype=dtype)
    graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: create_model(cfg)))
    abstract = nnx.to_pure_dict(abs_state)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: device, abstract)
    else:
        shardings = nnx.to_pure_dict(state_shardings(abs_state, mesh))
    flat_abs = {_path_key(p): a for p, a in jax.tree_util.tree_leaves_with_path(abstract)}
    specs = _tensor_specs(cfg)
    if set(specs) != set(flat_abs):  # the table and the modules describe the same parameters
        raise AssertionError(f"hf.py table mismatch: {sorted(set(specs) ^ set(flat_abs))}")
    param_dtype = np.dtype(cfg.params_dtype)

    with contextlib.ExitStack() as stack:
        reader = _Reader(path, stack)
        _check_tensors(reader, specs, {k: a.shape for k, a in flat_abs.items()}, cfg, path)

        def load(p, a, sharding):
            spec, shape = specs[_path_key(p)], a.shape

            def callback(index) -> np.ndarray:
                ranges = []
                for s, n in zip(index, shape, strict=True):
                    start, stop, step = s.indices(n)
                    assert step == 1, index
                    ranges.append((start, stop))
                # One read per tensor the shard covers (layer, expert), each only its slice.
                lead, rest = ranges[: spec.lead], ranges[spec.lead :]
                blocks = []
                for idx in itertools.product(*(range(a, b) for a, b in lead)):
                    name = spec.names[int(np.ravel_multi_index(idx, shape[: spec.lead]))]
                    blocks.append(_read_block(reader.slicer(name), spec, shape, rest))
                block = np.stack(blocks).reshape(*(b - a for a, b in lead), *blocks[0].shape)
                return np.ascontiguousarray(block, dtype=param_dtype)

            return jax.make_array_from_callback(shape, sharding, callback)

        params = jax.tree_util.tree_map_with_path(load, abstract, shardings)
    nnx.replace_by_pure_dict(abs_state, params)
    model = nnx.merge(graphdef, abs_state)
    chex.assert_shape(model.embed[...], (cfg.vocab_size, cfg.hidden_size))
    return model


# ---------------------------------------------------------------------------------- export


def _host_array(x: jax.Array) -> np.ndarray:
    """The whole array on this host (an all-gather when other processes hold parts of it)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _hf_tensors(spec: _Spec, x: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """(name, stored tensor) for our parameter array x: the inverse of _read_block."""
    for j, idx in enumerate(np.ndindex(*x.shape[: spec.lead])):
        yield (
            spec.names[j],
            np.ascontiguousarray(x[idx].transpose(spec.perm).reshape(spec.stored_shape(x.shape))),
        )


def _export_units(specs: dict[tuple, _Spec], num_layers: int) -> list[tuple[tuple, int | None]]:
    """(parameter path, layer or None) in Hugging Face's tensor order: the embedding, then layer
    by layer every per-layer parameter, then the rest. A unit is what export gathers at once."""
    layered = [k for k in specs if k[0] == "layers"]
    rest = [(k, None) for k in specs if k[0] != "layers" and k != ("embed",)]
    return [(("embed",), None), *((k, i) for i in range(num_layers) for k in layered), *rest]


def save_hf_checkpoint(
    model: Transformer,
    path: str | os.PathLike,
    *,
    dtype: str = "float32",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> None:
    """Writes config.json and model.safetensors (or model-0000i-of-0000n.safetensors shards and
    model.safetensors.index.json when the weights exceed max_shard_bytes) with Hugging Face's
    tensor names and shapes, so transformers' from_pretrained and load_hf_checkpoint read it.

    dtype: the stored dtype and config.json torch_dtype ("float32" keeps an export -> import
    round trip bit-identical; "bfloat16" halves the size and rounds). Weight files of an earlier
    export in `path` are removed first, so a stale model.safetensors cannot shadow new shards. In
    a multi-process run every process must call this (parameters are gathered tensor by tensor);
    only process 0 writes.
    """
    save_file = _safetensors().numpy.save_file
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPES)}.")
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be >= 1.")
    cfg = model.cfg
    hf_cfg = config_to_hf(cfg, torch_dtype=dtype)
    specs = _tensor_specs(cfg)
    params = {
        _path_key(p): x
        for p, x in jax.tree_util.tree_leaves_with_path(
            nnx.to_pure_dict(nnx.state(model, nnx.Param))
        )
    }
    if set(specs) != set(params):
        raise ValueError(
            "The model's parameters are not those of a "
            f"{architecture_of(cfg)}: {sorted(set(specs) ^ set(params))[:5]}."
        )
    out_dtype = np.dtype(_DTYPES[dtype])
    # Plan the shards from shapes alone, then convert one shard at a time (peak host memory:
    # one shard, not the model). A stacked per-layer parameter is split into its layers.
    L = cfg.num_layers
    units = _export_units(specs, L)

    def unit_spec(key, i) -> _Spec:
        return specs[key] if i is None else specs[key].sub(i, L)

    def unit_shape(key, i) -> tuple[int, ...]:
        shape = params[key].shape
        return shape if i is None else shape[1:]

    sizes = {
        u: len(unit_spec(*u).names)
        * math.prod(unit_spec(*u).stored_shape(unit_shape(*u)))
        * out_dtype.itemsize
        for u in units
    }
    shards: list[list[tuple]] = [[]]
    used = 0
    for u in units:
        if shards[-1] and used + sizes[u] > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(u)
        used += sizes[u]
    n = len(shards)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    if n == 1:
        files = [WEIGHTS_FILE]
    path = os.fspath(path)
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(path, exist_ok=True)
        stale = [os.path.join(path, WEIGHTS_FILE), os.path.join(path, INDEX_FILE)]
        stale += glob.glob(os.path.join(path, "model-*-of-*.safetensors"))
        for f in stale:
            if os.path.exists(f):
                os.remove(f)
    weight_map = {}
    for keys, fname in zip(shards, files, strict=True):
        tensors = {}
        for key, i in keys:
            x = _host_array(params[key] if i is None else params[key][i])
            for name, t in _hf_tensors(unit_spec(key, i), x):
                tensors[name] = t.astype(out_dtype)
                weight_map[name] = fname
        if writer:
            save_file(tensors, os.path.join(path, fname), metadata={"format": "pt"})
    if not writer:
        return
    if n > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        with open(os.path.join(path, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_cfg, f, indent=2, sort_keys=True)
