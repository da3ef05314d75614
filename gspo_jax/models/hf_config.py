"""Hugging Face config.json <-> ModelConfig: which architectures the one decoder computes, and
the config fields each reads (models/hf.py loads and saves the weights).

Supported architectures, each a set of ModelConfig flags on the same modules
(gspo_jax/models/config.py), not a copy of them:

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
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gspo_jax.models.config import _DTYPES, ModelConfig


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
