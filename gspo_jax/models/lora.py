"""LoRA on the decoder through qwix: low-rank adapters on the weights of chosen modules.

For a weight W of a module whose path matches one of the targets, qwix's LoraProvider
intercepts the module's einsum y = x·W and returns

    y = x·W + (α / r) · (x·A)·B,      A [in..., r] (He-uniform), B [r, out...] (zeros)

so a fresh adapter computes the base's function exactly (B = 0). Dimension legend: L layers,
D hidden, H query heads, K kv heads, Dh head dim, F SwiGLU hidden, E experts, r the rank.
Adapters are nnx.LoRAParam variables (a subclass of nnx.Param) named ``<weight>_lora_a`` and
``<weight>_lora_b`` next to their weight, stacked on the decoder's leading [L] axis like it:

    layers/attn/q_proj [L, D, H, Dh]  ->  q_proj_lora_a [L, D, r], q_proj_lora_b [L, r, H, Dh]

qwix creates adapters on a module's first call; the decoder's layers run inside a scan, where a
variable created on the call would not outlive the trace. So ``add_adapters`` lets qwix create
one layer's adapters on an abstract probe (nnx.eval_shape: shapes, the einsums, logical axes),
creates the stacked ones itself, and then gives the model qwix's interception of ``forward``
(everything the rollout, the log-prob path and ``__call__`` run goes through it).

Module paths are qwix's: "/"-joined attribute names from the model, e.g. "layers/attn" (q, k, v
and o projections), "layers/mlp" (the SwiGLU's gate/up/down, or for MoE the router and, under
moe_dispatch="dense", the experts' einsums; the sparse dispatch's grouped matmuls are not
einsums qwix intercepts). Targets are regular expressions matched in full against them.

What the rest of the code needs (rl/build.py, rl/trainer.py, experiments/export_hf.py):
``add_adapters``, ``is_adapter`` (the optimizer's mask), ``without_adapters`` (the reference
policy: B zeroed, the base's own arrays, no second copy), ``merged`` (a plain decoder with
W + (α / r)·A·B) and ``save_peft`` (the adapters in PEFT's safetensors layout).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import string
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import qwix
from flax import nnx

from gspo_jax.models.config import ModelConfig
from gspo_jax.models.layers import DecoderBlock
from gspo_jax.models.transformer import Transformer, create_model, slot_mask

DEFAULT_TARGETS = ("layers/attn", "layers/mlp")
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
# our weight -> the Hugging Face module that holds it (models/hf_layout.py's names)
_HF_MODULE = {
    ("attn", "q_proj"): "self_attn.q_proj",
    ("attn", "k_proj"): "self_attn.k_proj",
    ("attn", "v_proj"): "self_attn.v_proj",
    ("attn", "o_proj"): "self_attn.o_proj",
    ("mlp", "gate_proj"): "mlp.gate_proj",
    ("mlp", "up_proj"): "mlp.up_proj",
    ("mlp", "down_proj"): "mlp.down_proj",
}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """config.lora, typed: rank r (0 = no adapters), α, the target module-path patterns and
    base_quant, the frozen base's quantization under the adapters (QLoRA: "int8", "fp8"; "" =
    none; rl/adapters.py adapted_model applies it through rollout/quant.py)."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    base_quant: str = ""

    @classmethod
    def of(cls, lora_cfg: Any) -> LoraSpec:
        """From config.lora (a ConfigDict, a dict or None = off)."""
        if lora_cfg is None:
            return cls()
        get = lora_cfg.get
        return cls(
            rank=int(get("rank", 0)),
            alpha=float(get("alpha", 16.0)),
            targets=tuple(get("targets", DEFAULT_TARGETS)),
            base_quant=str(get("base_quant", "")),
        )

    @property
    def scale(self) -> float:
        """α / r: qwix's and PEFT's scaling of x·A·B."""
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class AdaptedWeight:
    """One weight with an adapter: its module (inside one decoder layer), its name, the einsum
    qwix computes the adapter with (lhs, A, B -> out) and A's / B's one-layer shapes and axes."""

    module: tuple[str, ...]  # e.g. ("attn",) under "layers"
    weight: str  # e.g. "q_proj"
    lora_einsum: str  # e.g. "bsd,dr,rhk->bshk"
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    a_axes: tuple
    b_axes: tuple


class _Provider(qwix.LoraProvider):
    """qwix's LoraProvider whose adapted einsum keeps the base einsum's dtype: the adapters are
    float32 (the parameters' dtype) and a bfloat16 activation times them would otherwise come out
    float32 and change the dtype of everything downstream (the KV cache among it)."""

    def einsum(self, einsum_str, *operands, **kwargs):
        out = super().einsum(einsum_str, *operands, **kwargs)
        base = kwargs.get("preferred_element_type") or jnp.result_type(
            *(getattr(o, "dtype", jnp.float32) for o in operands)
        )
        return out.astype(base)


def provider(spec: LoraSpec) -> qwix.LoraProvider:
    """One qwix LoraRule per target pattern (the first that matches a module applies)."""
    rules = [qwix.LoraRule(module_path=p, rank=spec.rank, alpha=spec.alpha) for p in spec.targets]
    return _Provider(rules)


def module_paths(cfg: ModelConfig) -> list[str]:
    """Every module path of the decoder, as qwix matches them ("layers/attn", ...)."""
    abstract = nnx.eval_shape(lambda: create_model(cfg))
    return ["/".join(map(str, p)) for p, _ in abstract.iter_modules() if p]


class _OneLayer(nnx.Module):
    """A decoder layer under the attribute name the model gives it, so qwix sees the module
    paths "layers/attn", "layers/mlp", ... of the full model."""

    def __init__(self, cfg: ModelConfig):
        self.layers = DecoderBlock(cfg, rngs=nnx.Rngs(0))

    def __call__(self, x, positions, mask):
        return self.layers(x, positions, mask)[0]


class _ProbeRngs(nnx.Rngs):
    """Rngs for the abstract probe: qwix draws A's initial value from ``rngs.params()``; the
    probe keeps only shapes, and a counter stepped inside a nested trace is an error."""

    def params(self):
        return jax.random.key(0)


def adapted_weights(spec: LoraSpec, cfg: ModelConfig) -> list[AdaptedWeight]:
    """The weights of one decoder layer that the targets give adapters, as qwix makes them
    (from an abstract call: nothing is allocated)."""
    S = 4

    def probe():
        x = jnp.zeros((1, S, cfg.hidden_size), cfg.compute_dtype)
        positions = jnp.zeros((1, S), jnp.int32)
        mask = slot_mask(jnp.ones((1, S), bool), jnp.arange(S))
        return qwix.apply_lora_to_model(
            _OneLayer(cfg), provider(spec), x, positions, mask, rngs=_ProbeRngs(other=0)
        )

    layer = nnx.eval_shape(probe).layers
    found = []
    for path, module in layer.iter_modules():
        for name, value in vars(module).items():
            if not (name.endswith("_lora_a") and isinstance(value, nnx.LoRAParam)):
                continue
            weight = name[: -len("_lora_a")]
            b = getattr(module, weight + "_lora_b")
            found.append(
                AdaptedWeight(
                    module=tuple(map(str, path)),
                    weight=weight,
                    lora_einsum=getattr(module, weight + "_lora_einsum_str", ""),
                    a_shape=tuple(value.shape),
                    b_shape=tuple(b.shape),
                    a_axes=tuple(value.get_metadata().get("out_sharding") or ()),
                    b_axes=tuple(b.get_metadata().get("out_sharding") or ()),
                )
            )
    if not found:
        raise ValueError(
            f"config.lora.targets={list(spec.targets)} match modules but no weight of theirs "
            f"goes through an einsum qwix adapts; target e.g. {list(DEFAULT_TARGETS)}"
        )
    return sorted(found, key=lambda w: (w.module, w.weight))


def _submodule(model: nnx.Module, path: tuple[str, ...]) -> nnx.Module:
    for name in path:
        model = getattr(model, name)
    return model


def add_adapters(model: Transformer, spec: LoraSpec, *, seed: int = 0) -> Transformer:
    """A copy of ``model`` with rank-r adapters on the targets' weights (A He-uniform from
    ``seed``, B zero: the same function as ``model``) and qwix's interception of ``forward``.
    Works on abstract models (nnx.eval_shape) too."""
    if spec.rank <= 0:
        return model
    model = nnx.clone(model)
    L = model.cfg.num_layers
    key = jax.random.key(seed)
    rule = qwix.LoraRule(module_path="", rank=spec.rank, alpha=spec.alpha)
    for i, w in enumerate(adapted_weights(spec, model.cfg)):
        module = _submodule(model.layers, w.module)
        dtype = getattr(module, w.weight).dtype
        keys = jax.random.split(jax.random.fold_in(key, i), L)  # one draw per layer
        init = functools.partial(rule.lora_a_initializer, shape=w.a_shape, dtype=dtype)
        a = jax.vmap(init)(keys)  # [L, in..., r]
        b = jnp.zeros((L, *w.b_shape), dtype)  # [L, r, out...]
        for name, value, axes in (("_lora_a", a, w.a_axes), ("_lora_b", b, w.b_axes)):
            param = nnx.LoRAParam(value, out_sharding=("layers", *axes), eager_sharding=False)
            setattr(module, w.weight + name, param)
    # skip_nnx_init: the adapters exist; qwix only sets its module paths and wraps forward
    return qwix.apply_lora_to_model(
        model, provider(spec), methods=("forward",), skip_nnx_init=True, rngs=None
    )


def _name(path) -> str:
    """The parameter's name: the last key of its tree path (nnx.State keys, or jax key paths,
    where a Variable's array adds a trailing "value" key: GetAttrKey, or DictKey once restored)."""
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return [n for n in names if n != "value"][-1]


def is_adapter(path) -> bool:
    """Whether a parameter's tree path is an adapter's (the optimizer's and the checkpoint's
    filter)."""
    return _name(path).endswith(("_lora_a", "_lora_b"))


def without_adapters(params):
    """The base policy from the LoRA model's parameters: every B zeroed (x·A·0 adds exactly 0),
    every other leaf the same array (no copy of the weights)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.zeros_like(x) if _name(p).endswith("_lora_b") else x, params
    )


def _delta_einsum(lora_einsum: str, ndim_w: int) -> str:
    """From qwix's "lhs,A,B->out" (A: contracted dims + r, B: r + the rest) the einsum
    "ZA,ZB->ZW" of the stacked delta A·B [L, *W.shape] (Z: the layer axis)."""
    _, a, b = lora_einsum.split("->")[0].split(",")
    r = a[-1]
    z = sorted(set(string.ascii_letters) - set(lora_einsum))[0]
    w = a[:-1] + b[1:]
    if len(w) != ndim_w:
        raise ValueError(f"cannot merge an adapter of einsum {lora_einsum!r} ({ndim_w}-d weight)")
    assert b[0] == r
    return f"{z}{a},{z}{b}->{z}{w}"


def merged(model: Transformer, spec: LoraSpec) -> Transformer:
    """A plain decoder (no adapters, no interception) with every adapted weight replaced by
    W + (α / r)·A·B, computed in float32: the same function as ``model`` to float rounding."""
    plain = create_plain_like(model)
    for w in adapted_weights(spec, model.cfg):
        module = _submodule(model.layers, w.module)
        base = getattr(module, w.weight)[...]
        A = getattr(module, w.weight + "_lora_a")[...]
        B = getattr(module, w.weight + "_lora_b")[...]
        delta = jnp.einsum(_delta_einsum(w.lora_einsum, base.ndim - 1), A, B)
        target = getattr(_submodule(plain.layers, w.module), w.weight)
        target.set_value((base + spec.scale * delta).astype(base.dtype))
    return plain


def create_plain_like(model: Transformer) -> Transformer:
    """The model's base weights under a plain Transformer (no adapters, no qwix); a QLoRA base
    (held quantized: rollout/quant.py QuantizedParam) dequantized, as the model reads it."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: create_model(model.cfg)))
    base = nnx.state(model, nnx.Param).filter(nnx.Not(nnx.LoRAParam))
    weights = {path: v[...] for path, v in nnx.to_flat_state(base)}  # reads dequantize
    for path, v in nnx.to_flat_state(state):
        v.set_value(jnp.copy(weights[path]))
    return nnx.merge(graphdef, state)


def save_peft(model: Transformer, spec: LoraSpec, path: str, *, base_model: str = "") -> list[str]:
    """The adapters in PEFT's layout: ``adapter_model.safetensors`` with tensors
    ``base_model.model.model.layers.{i}.<module>.lora_A.weight`` [r, in] and ``lora_B.weight``
    [out, r] (torch's Linear layout, in and out flattened as models/hf_layout.py flattens
    the weights) and ``adapter_config.json`` (r, lora_alpha, target_modules). Returns the tensor
    names. Only the weights Hugging Face holds as one Linear per layer (attention, dense MLP)."""
    from safetensors.numpy import save_file

    tensors, targets = {}, set()
    for w in adapted_weights(spec, model.cfg):
        hf = _HF_MODULE.get((*w.module, w.weight))
        if hf is None or (model.cfg.is_moe and w.module == ("mlp",)):
            raise ValueError(
                f"layers/{'/'.join(w.module)}/{w.weight} has no one-Linear counterpart in PEFT; "
                "target only 'layers/attn' (and a dense model's 'layers/mlp') to export"
            )
        module = _submodule(model.layers, w.module)
        A = np.asarray(getattr(module, w.weight + "_lora_a")[...], np.float32)  # [L, in..., r]
        B = np.asarray(getattr(module, w.weight + "_lora_b")[...], np.float32)  # [L, r, out...]
        L, r = A.shape[0], spec.rank
        A, B = A.reshape(L, -1, r), B.reshape(L, r, -1)
        for i in range(L):
            prefix = f"base_model.model.model.layers.{i}.{hf}"
            tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(A[i].T)  # [r, in]
            tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(B[i].T)  # [out, r]
        targets.add(hf.split(".")[-1])
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, PEFT_WEIGHTS), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "target_modules": sorted(targets),
    }
    with open(os.path.join(path, PEFT_CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return sorted(tensors)
