"""Qwen3-style Flax NNX decoder (dense and MoE with Routing Replay), per-token log-probs, and
Hugging Face checkpoint import/export.

    cfg = models.get_model_config("small", vocab_size=32)
    model = models.create_model(cfg, seed=0, mesh=None)       # the one constructor
    model = models.load_hf_checkpoint(path, dtype="float32", mesh=None)
    models.save_hf_checkpoint(model, path)
    logits = model(input_ids)                                  # [B, S, V] float32
    out = models.response_logprobs(model, prompts, prompt_lengths, responses, temperature=1.0)

The seam: the sampler, the log-prob path and the trainer use a model only through the CausalLM
Protocol of interface.py (forward, logits, output_matrix, init_cache, cfg, __call__, and nnx.Param
state with logical axis names). Qwen2.5 and Llama are flags on the same decoder (qk_norm,
attention_bias), not copies of it.

See config.py (presets, flags), layers.py (blocks, MoE router), moe_dispatch.py (how the
experts run: dense reference, sparse grouped matmuls, expert parallelism), transformer.py
(layout, masks, model, create_model), logprobs.py (chunked log-prob / entropy), interface.py
(the seam), hf.py (Hugging Face checkpoints: hf_config.py their config.json, hf_layout.py where
each parameter is stored) and lora.py (LoRA adapters through qwix: only the
adapters, nnx.LoRAParam, train; docs/lora.md). The continuous rollout engine's paged KV cache
and the attention over its pages are gspo_jax/kernels/ (its names re-exported here).
"""

from gspo_jax.kernels.paged_attention import (
    SCRATCH_PAGE,
    init_paged_cache,
    is_paged,
    paged_cache_bytes,
    write_prompt_pages,
)
from gspo_jax.models import lora
from gspo_jax.models.attention import add_chunk, is_shared_prefix, shared_prefix_cache
from gspo_jax.models.config import EXECUTION_FIELDS, PRESETS, ModelConfig, get_model_config
from gspo_jax.models.hf import config_from_hf, load_hf_checkpoint, save_hf_checkpoint
from gspo_jax.models.interface import CausalLM
from gspo_jax.models.logprobs import (
    chunked_logprobs,
    effective_temperature,
    response_logprobs,
    scale_logits,
    token_logprob_entropy,
)
from gspo_jax.models.transformer import (
    Transformer,
    attention_mask,
    create_model,
    decode_mask,
    param_count,
    sequence_layout,
    slot_mask,
    unembed,
)

__all__ = [
    "EXECUTION_FIELDS",
    "PRESETS",
    "SCRATCH_PAGE",
    "CausalLM",
    "ModelConfig",
    "Transformer",
    "add_chunk",
    "attention_mask",
    "chunked_logprobs",
    "create_model",
    "decode_mask",
    "effective_temperature",
    "get_model_config",
    "init_paged_cache",
    "is_paged",
    "is_shared_prefix",
    "lora",
    "config_from_hf",
    "load_hf_checkpoint",
    "paged_cache_bytes",
    "param_count",
    "response_logprobs",
    "save_hf_checkpoint",
    "scale_logits",
    "sequence_layout",
    "shared_prefix_cache",
    "slot_mask",
    "token_logprob_entropy",
    "unembed",
    "write_prompt_pages",
]
