"""Model configuration: one frozen dataclass and named presets.

Dimension legend: V vocab, D hidden (embed), L layers, H query heads, K kv heads, Dh head dim,
F SwiGLU hidden (dense MLP), E experts, k experts per token, Fe per-expert SwiGLU hidden.

The presets follow Qwen3 (the family the GSPO, LUSPO and GMPO papers train): RMSNorm, RoPE with
theta 1e6, grouped-query attention with per-head q/k RMSNorm, SwiGLU, no biases. The three real
shapes (qwen3_0_6b, qwen3_1_7b, qwen3_30b_a3b) are for abstract construction (nnx.eval_shape) in
sharding and memory planning.

Other families are flags on the same decoder, not copies of it (models/hf_config.py maps Hugging
Face checkpoints onto them): Qwen2.5 is qk_norm=False, attention_bias=True; Llama (rope type
"default") is qk_norm=False, attention_bias=False; Qwen3-MoE is num_experts > 0. The defaults
are Qwen3's, so every preset builds the same parameters and computes the same function as before
the flags.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from gspo_jax.kernels.paged_attention import PAGED_IMPLEMENTATIONS
from gspo_jax.models.attention import IMPLEMENTATIONS

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MOE_DISPATCHES = ("sparse", "dense")
MOE_KERNELS = ("auto", "tiled", "ragged_dot", "megablox")
# Fields that choose how the model is computed, not which function it computes (the same
# parameters give the same function, to float rounding, whatever their values): a warm start
# cached under one value serves the others (warmstart.cache_key leaves them out).
EXECUTION_FIELDS = (
    "moe_dispatch",
    "moe_kernel",
    "remat",
    "attention",
    "attention_block",
    "decode_block",
    "paged_attention",
)

# ModelConfig.remat values: "none", "full", and the jax.checkpoint_policies that are policies
# themselves (not factories taking names). Resolved in transformer.remat_policy.
REMAT_POLICIES = (
    "none",
    "full",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "everything_saveable",
    "nothing_saveable",
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder. Frozen and hashable so it can key jit caches.

    num_experts == 0 means a dense model; > 0 makes every layer's MLP a top-k MoE.
    dtype is the compute dtype (bfloat16 on accelerators); parameters are stored in float32 and
    log-probabilities are always computed in float32.
    """

    name: str = "custom"
    vocab_size: int = 256
    hidden_size: int = 64  # D
    num_layers: int = 2  # L
    num_heads: int = 4  # H
    num_kv_heads: int = 2  # K
    head_dim: int = 16  # Dh
    mlp_dim: int = 128  # F (dense SwiGLU)
    num_experts: int = 0  # E (0 = dense)
    experts_per_token: int = 2  # k
    moe_mlp_dim: int = 64  # Fe
    norm_topk_prob: bool = True  # renormalise the top-k router weights to sum to 1 (Qwen3-MoE)
    # How the experts run (models/moe_dispatch.py): "sparse" sorts the token-expert assignments
    # by expert and runs grouped matmuls (expert-parallel under a mesh with an expert axis);
    # "dense" runs every token through every expert (the reference the tests compare against).
    moe_dispatch: str = "sparse"
    # Grouped-matmul kernel of the sparse dispatch: "auto" (Pallas megablox gmm on TPU, "tiled"
    # elsewhere), "tiled" (plain JAX), "ragged_dot" or "megablox" (interpret mode off TPU).
    moe_kernel: str = "auto"
    # 0 = dropless. > 0: each expert takes at most ceil(factor * assignments / E) token copies per
    # dispatch group, and the assignments past that are dropped (their combine weight is 0).
    moe_capacity_factor: float = 0.0
    tie_embeddings: bool = True
    qk_norm: bool = True  # per-head RMSNorm of q and k before RoPE (Qwen3; not Qwen2.5 / Llama)
    attention_bias: bool = False  # biases on the q/k/v projections (Qwen2.5), none on o
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    max_seq_len: int = 512  # prompt + response slots the sampler's KV cache may hold
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    init_std: float = 0.02
    # Bytes of float32 logits a log-prob chunk may hold ([B, C, V] * 4); sets the chunk size C.
    logprob_chunk_bytes: int = 256 * 2**20
    # What the backward pass of each scanned decoder layer keeps (see REMAT_POLICIES): "none"
    # keeps every activation, "full" only the layer's input (recomputing the rest), a named
    # jax.checkpoint_policies policy something in between (e.g. the matmul outputs).
    remat: str = "none"
    # Attention kernel (models/attention.py): "auto" (splash on TPU, cuDNN on GPU where they
    # apply, else blockwise), "blockwise" (plain-JAX flash attention, no score matrix kept for
    # the backward pass) or "reference" (dense softmax); key slots per block of the blockwise
    # kernel.
    attention: str = "auto"
    attention_block: int = 512
    # Generated slots per chunk of the sampler's shared-prefix decode: a step reads the chunks
    # filled so far, and the sampler compiles one decode loop per chunk (ceil((T - 1) / C) of
    # them). Smaller reads less per step; larger compiles fewer loops (raise it for long
    # responses when compile time matters).
    decode_block: int = 64
    # The continuous rollout engine's attention over its paged KV cache
    # (paged_attention.attend_pages): "plain" (plain JAX, every platform; the reference),
    # "auto" (the backend's Pallas kernel on a TPU or a GPU, else plain), "pallas" (the kernel:
    # kernels/paged_kernel.py on a TPU, kernels/paged_kernel_gpu.py on a GPU), or "interpret" /
    # "interpret_gpu" (the TPU / GPU kernel in Pallas interpret mode: tests).
    paged_attention: str = "plain"

    def __post_init__(self):
        for f in ("dtype", "param_dtype"):
            if getattr(self, f) not in _DTYPES:
                raise ValueError(f"{f}={getattr(self, f)!r} is not one of {sorted(_DTYPES)}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention); change one of them."
            )
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} must be in [1, num_experts="
                f"{self.num_experts}]."
            )
        if self.moe_dispatch not in MOE_DISPATCHES:
            raise ValueError(
                f"moe_dispatch={self.moe_dispatch!r} is not one of {list(MOE_DISPATCHES)}."
            )
        if self.moe_kernel not in MOE_KERNELS:
            raise ValueError(f"moe_kernel={self.moe_kernel!r} is not one of {list(MOE_KERNELS)}.")
        if self.moe_capacity_factor < 0 or (
            self.moe_dispatch == "dense" and self.moe_capacity_factor
        ):
            raise ValueError(
                f"moe_capacity_factor={self.moe_capacity_factor} must be 0 (dropless) or > 0 "
                "with moe_dispatch='sparse' (the dense dispatch never drops)."
            )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"remat={self.remat!r} is not a remat policy; valid: {', '.join(REMAT_POLICIES)}."
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings.")
        if self.attention not in IMPLEMENTATIONS:
            raise ValueError(
                f"attention={self.attention!r} is not one of {IMPLEMENTATIONS}; 'auto' picks "
                "the platform's kernel (blockwise on CPU)."
            )
        if self.paged_attention not in PAGED_IMPLEMENTATIONS:
            raise ValueError(
                f"paged_attention={self.paged_attention!r} is not one of "
                f"{PAGED_IMPLEMENTATIONS}; 'plain' runs everywhere, 'auto' picks the TPU kernel."
            )
        for f in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "max_seq_len",
            "attention_block",
            "decode_block",
        ):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}={getattr(self, f)} must be >= 1.")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def params_dtype(self):
        return _DTYPES[self.param_dtype]


_PRESETS: dict[str, dict] = {
    # Unit tests: the smallest shapes, quick to compile.
    "tiny": dict(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=64,
        max_seq_len=256,
    ),
    "tiny_moe": dict(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        num_experts=4,
        experts_per_token=2,
        moe_mlp_dim=32,
        max_seq_len=256,
    ),
    # CPU experiments (the arith configs): ~0.8M parameters (+ V*128 embedding).
    "small": dict(
        vocab_size=256,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        mlp_dim=384,
        max_seq_len=512,
    ),
    # A wider, deeper small model (docs/testbed.md: the room-to-learn arm): about 3x the matmul
    # parameters of "small".
    "medium": dict(
        vocab_size=256,
        hidden_size=192,
        num_layers=6,
        num_heads=6,
        num_kv_heads=2,
        head_dim=32,
        mlp_dim=512,
        max_seq_len=512,
    ),
    "small_moe": dict(
        vocab_size=256,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        num_experts=8,
        experts_per_token=2,
        moe_mlp_dim=96,
        max_seq_len=512,
    ),
    # Real Qwen3 shapes (from the released config.json files).
    "qwen3_0_6b": dict(
        vocab_size=151_936,
        hidden_size=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=3072,
        tie_embeddings=True,
        max_seq_len=40_960,
        dtype="bfloat16",
    ),
    "qwen3_1_7b": dict(
        vocab_size=151_936,
        hidden_size=2048,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=6144,
        tie_embeddings=True,
        max_seq_len=40_960,
        dtype="bfloat16",
    ),
    "qwen3_30b_a3b": dict(
        vocab_size=151_936,
        hidden_size=2048,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        mlp_dim=6144,
        num_experts=128,
        experts_per_token=8,
        moe_mlp_dim=768,
        tie_embeddings=False,
        max_seq_len=40_960,
        dtype="bfloat16",
    ),
}

PRESETS = tuple(_PRESETS)


def get_model_config(name: str, **overrides) -> ModelConfig:
    """Returns preset `name` with field overrides, e.g. get_model_config("small", vocab_size=32).

    Unknown preset names or fields raise ValueError naming the valid ones.
    """
    if name not in _PRESETS:
        raise ValueError(f"Unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}.")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"Unknown ModelConfig field(s) {unknown}; valid fields: {', '.join(sorted(fields))}."
        )
    return ModelConfig(**{"name": name, **_PRESETS[name], **overrides})
