"""The quantized rollout (config.rl.rollout_quant): the rollout engine decodes with the decoder
layers' projection weights quantized through qwix, the trainer keeps its own parameters.

    model = rollout.quantize_weights(model, "int8")   # or "fp8" (float8_e4m3fn); "" = model

Weight-only, per output channel, absmax (qwix.quantize): a weight W [L, in..., out...] becomes a
qwix.QArray, qvalue = round(W / s) in int8 (or W / s cast to float8_e4m3fn) with one scale s
per (layer, output channel), s = max_in |W| / qmax, so that

    y = x · dequantize(W),    dequantize(W) = qvalue · s      (in the weight's float dtype)

is the matmul the rollout computes (qwix.einsum of x with the QArray gives exactly this product).
The QArray stays quantized where the engines keep the model: the decode loop carries qvalue and
s, the decoder's scan slices layer i of them, and layer i's matmul dequantizes its own slice
(QuantizedParam below), so the weights a decode step loads are 1 byte each (plus the scales)
instead of the parameter dtype's 4; whether the dequantization fuses into the matmul is the
compiler's choice (XLA:CPU writes a float32 copy of the layer first: docs/lora.md). The stacked
layers' logical axis names are not ones qwix's model-level PTQ wrapper (qwix.quantize_model)
accepts, so this quantizes the arrays themselves, the way models/lora.py creates the stacked
adapters itself.

What is quantized: the attention projections (q, k, v, o), the dense SwiGLU's gate/up/down and
the MoE experts' gate/up/down. What is not: the embedding and output matrix, the norms, the
biases and the MoE router (the routes are discrete: a rounded router moves tokens to other
experts, not by a rounding error). One place prepares the rollout's weights: rl/step.py
rollout_model calls quantize_weights inside the rollout's jit, so each step's rollout quantizes
the current parameters afresh; the asynchronous pipeline's sync (rl/pipeline.py rollout_copy)
quantizes them once per refresh and sends the QArrays, which rollout_model reads as they are.
QLoRA (config.lora.base_quant, rl/adapters.py adapted_model) holds the trainer's frozen base so;
state_shardings places such a state on a mesh.

Dimension legend: L layers, D hidden, H query heads, K kv heads, Dh head dim, F SwiGLU hidden,
E experts, Fe per-expert hidden.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import qwix
from flax import nnx
from jax.sharding import NamedSharding

from gspo_jax import sharding

# config.rl.rollout_quant -> the qwix qtype of the stored weights ("" = no quantization)
QTYPES = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}

# The quantized weights, by the module attribute that holds them, and the logical axes each
# contracts with the activation (the other axes, "layers" and "expert" among them, get a scale
# each: per output channel). Every other parameter stays in its dtype.
CONTRACTED_AXES = {
    "q_proj": ("embed",),  # [L, D, H, Dh]
    "k_proj": ("embed",),  # [L, D, K, Dh]
    "v_proj": ("embed",),  # [L, D, K, Dh]
    "o_proj": ("heads", "head_dim"),  # [L, H, Dh, D]
    "gate_proj": ("embed",),  # [L, D, F] or [L, E, D, Fe]
    "up_proj": ("embed",),  # [L, D, F] or [L, E, D, Fe]
    "down_proj": ("mlp", "expert_mlp"),  # [L, F, D] or [L, E, Fe, D]
}

_MISSING = object()


class QuantizedParam(nnx.Param):
    """A parameter held as a qwix.QArray; reading it (``p[...]``, ``p.get_value()``) gives the
    dequantized array, so the layers' ``self.q_proj[...]`` is unchanged. Structural operations
    (nnx.split, the decoder's scan over the stacked [L] axis, jit arguments) see the QArray's
    qvalue and scale.

    Within one trace every read returns the same dequantized array: qwix's LoRA interception
    (models/lora.py) finds the weight an einsum reads by the identity of its array, and a fresh
    array per read would leave the adapters of same-shaped weights (k/v, gate/up) unapplied."""

    __slots__ = ("_dequantized",)  # (trace, the QArray, its dequantized array): get_value's

    def get_value(self, *, index=_MISSING):
        trace = jax.extend.core.get_opaque_trace_state(convention="nnx")
        memo = getattr(self, "_dequantized", None)
        raw = self.get_raw_value()
        if memo is None or memo[0] != trace or memo[1] is not raw:
            memo = (trace, raw, qwix.dequantize(raw))
            object.__setattr__(self, "_dequantized", memo)
        w = memo[2]
        return w if index is _MISSING or index is Ellipsis else w[index]


def channelwise_axes(name: str, axes: tuple) -> tuple[int, ...]:
    """The axes of weight ``name`` (logical axis names ``axes``) that get their own scale: all
    but the ones it contracts (CONTRACTED_AXES; a MoE down_proj contracts expert_mlp, a dense
    one mlp)."""
    contracted = [a for a in CONTRACTED_AXES[name] if a in axes]
    if len(axes) < 2 or not contracted:
        raise ValueError(f"{name} with logical axes {axes}: it contracts none of them")
    return tuple(i for i, a in enumerate(axes) if a not in contracted)


def quantize_array(w: jax.Array, name: str, axes: tuple, quant: str) -> qwix.QArray:
    """Weight ``name`` w [L, ...] with logical axis names ``axes`` -> a QArray of QTYPES[quant],
    one absmax scale per output channel (and layer, and expert)."""
    if len(axes) != w.ndim:
        raise ValueError(f"{name} of shape {w.shape} with logical axes {axes}: one per axis")
    return qwix.quantize(w, QTYPES[quant], channelwise_axes=channelwise_axes(name, axes))


def quantize_weights(model: nnx.Module, quant: str) -> nnx.Module:
    """``model`` with every CONTRACTED_AXES weight of its decoder layers held quantized
    (QuantizedParam of a QTYPES[quant] QArray); the model itself for quant "". Works inside a
    jit (the rollout's) and on a model with LoRA adapters (they stay in their dtype)."""
    if not quant:
        return model
    if quant not in QTYPES:
        raise ValueError(f"rollout_quant={quant!r} is not one of {('', *QTYPES)}.")
    model = nnx.clone(model)
    for _, module in nnx.iter_modules(model.layers):
        for name in CONTRACTED_AXES:
            p = vars(module).get(name)
            if not isinstance(p, nnx.Param) or isinstance(p, (nnx.LoRAParam, QuantizedParam)):
                continue
            axes = tuple(p.get_metadata().get("out_sharding") or ())
            q = quantize_array(p.get_value(), name, axes, quant)
            setattr(module, name, QuantizedParam(q, **_metadata(p)))
    return model


def state_shardings(state: nnx.State, mesh: jax.sharding.Mesh) -> nnx.State:
    """sharding.state_shardings for a state that may hold QuantizedParams: a QArray's qvalue
    takes its weight's logical axes, and so does its scale, whose contracted axes (size 1) stay
    unsharded (logical_to_spec drops a mesh axis that does not divide a dimension)."""

    def one(v):
        q, axes = v.get_raw_value(), v.get_metadata()["out_sharding"]
        named = lambda x: NamedSharding(mesh, sharding.logical_to_spec(axes, x.shape, mesh))  # noqa: E731
        return v.replace(q.replace(qvalue=named(q.qvalue), scale=named(q.scale)))

    quantized = state.filter(QuantizedParam)
    if not jax.tree.leaves(quantized):
        return sharding.state_shardings(state, mesh)
    plain = sharding.state_shardings(state.filter(nnx.Not(QuantizedParam)), mesh)
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    return nnx.merge_state(plain, jax.tree.map(one, quantized, is_leaf=is_var))


def _metadata(p: nnx.Variable) -> dict:
    """The Variable's metadata other than its hooks (the logical axis names among it)."""
    return {k: v for k, v in p.get_metadata().items() if not k.startswith("on_")}


def weight_bytes(model: nnx.Module) -> int:
    """Bytes of every parameter a decode step reads whole: the decoder layers' (quantized ones as
    qvalue + scales) and the output matrix; the embedding is gathered one row per token and not
    counted. For a MoE model every expert is counted (a step over many rows touches them all)."""
    total = 0
    for _, p in nnx.state(model.layers, nnx.Param).flat_state():
        total += sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(p.get_raw_value()))
    out = model.embed if model.cfg.tie_embeddings else model.lm_head
    return total + out.size * out.dtype.itemsize
