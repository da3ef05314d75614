"""Where each parameter of the decoder lives in a Hugging Face checkpoint: one table
(tensor_specs) says, for every parameter, which stored tensor(s) hold it and how the axes
correspond; import (read_block) and export (hf_tensors) both read it, so an export followed by an
import is bit-identical.

Dimension legend: V vocab, D hidden, L layers, H query heads, K kv heads, Dh head dim,
F MLP hidden, E experts, Fe per-expert MLP hidden.

Hugging Face Linear weights are [out, in]; this codebase keeps [in, out] with the head axes split
out (q_proj [D, H, Dh], o_proj [H, Dh, D], see layers.py) and stacks the experts of a layer on a
leading axis (gate_proj [E, D, Fe]) where Hugging Face stores one tensor per expert
(mlp.experts.{e}.gate_proj.weight [Fe, D]); the decoder layers are stacked too (every layer
parameter has a leading [L] axis, models/transformer.py), where Hugging Face stores
model.layers.{i}.*.

Rotary embeddings need no permutation: Hugging Face's rotate_half pairs dimension i with
i + Dh/2 and uses inv_freq = theta^(-2i/Dh), exactly as layers.apply_rope does, so q_proj/k_proj
load as stored (Meta's original, interleaved Llama checkpoints would need one; they are not
supported).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gspo_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Spec:
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

    def sub(self, i: int, n: int) -> Spec:
        """The spec of index i of the first leading axis (of size n): one layer's tensors."""
        per = len(self.names) // n
        return dataclasses.replace(
            self, names=self.names[i * per : (i + 1) * per], lead=self.lead - 1
        )


SAME = ((0,), (1,))  # 1-D tensors (norm scales): stored as they are
LINEAR = ((1, 0), (1, 1))  # [in, out] here, [out, in] stored


def tensor_specs(cfg: ModelConfig) -> dict[tuple, Spec]:
    """Parameter path (as in nnx.state(model)) -> Spec, in the checkpoint's tensor order.

    The decoder layers are one stacked module (transformer.stack_layers): each of its parameters
    [L, ...] is held by the L tensors model.layers.{i}.<name>.
    """
    specs: dict[tuple, Spec] = {("embed",): Spec(("model.embed_tokens.weight",), (0, 1), (1, 1))}
    layers = range(cfg.num_layers)

    def one(path, name, perm_merge=SAME):
        names = tuple(f"model.layers.{i}.{name}" for i in layers)
        specs[("layers", *path)] = Spec(names, *perm_merge, lead=1)

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
        one(("mlp", "router"), "mlp.gate.weight", LINEAR)  # [E, D]
        for w in ("gate_proj", "up_proj", "down_proj"):
            names = tuple(
                f"model.layers.{i}.mlp.experts.{e}.{w}.weight"
                for i in layers
                for e in range(cfg.num_experts)
            )
            specs[("layers", "mlp", w)] = Spec(names, *LINEAR, lead=2)
    else:
        for w in ("gate_proj", "up_proj", "down_proj"):
            one(("mlp", w), f"mlp.{w}.weight", LINEAR)
    specs[("final_norm", "scale")] = Spec(("model.norm.weight",), *SAME)
    if not cfg.tie_embeddings:
        specs[("lm_head",)] = Spec(("lm_head.weight",), *LINEAR)  # [V, D]
    return specs


def ignorable(name: str, cfg: ModelConfig) -> bool:
    """Stored tensors that carry nothing the model lacks: a tied head saved anyway, and the
    rotary inv_freq buffers older exports contain."""
    return (name == "lm_head.weight" and cfg.tie_embeddings) or name.endswith("rotary_emb.inv_freq")


def path_key(path) -> tuple:
    return tuple(getattr(k, "key", k) for k in path)


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


def read_block(slicer, spec: Spec, shape: Sequence[int], ranges) -> np.ndarray:
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


def hf_tensors(spec: Spec, x: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """(name, stored tensor) for our parameter array x: the inverse of read_block."""
    for j, idx in enumerate(np.ndindex(*x.shape[: spec.lead])):
        yield (
            spec.names[j],
            np.ascontiguousarray(x[idx].transpose(spec.perm).reshape(spec.stored_shape(x.shape))),
        )
