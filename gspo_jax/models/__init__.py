"""Qwen3-style Flax NNX decoder (dense and MoE with Routing Replay) and per-token log-probs.

    cfg = models.get_model_config("small", vocab_size=32)
    model = models.Transformer(cfg, rngs=nnx.Rngs(0))
    out = models.response_logprobs(model, prompts, prompt_lengths, responses, temperature=1.0)

See config.py (presets), layers.py (blocks, MoE), transformer.py (layout, model) and
logprobs.py (chunked log-prob / entropy).
"""

from gspo_jax.models.config import PRESETS, ModelConfig, get_model_config
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
    param_count,
    sequence_layout,
    unembed,
)

__all__ = [
    "PRESETS",
    "ModelConfig",
    "Transformer",
    "attention_mask",
    "chunked_logprobs",
    "effective_temperature",
    "get_model_config",
    "param_count",
    "response_logprobs",
    "scale_logits",
    "sequence_layout",
    "token_logprob_entropy",
    "unembed",
]
