"""The model seam: what the sampler, the log-prob path and the trainer need from a model.

Dimension legend: B rows, S query slots, Sk key slots (the KV cache length when decoding),
D hidden, V vocab, L layers, K kv heads, Dh head dim, k experts per token.

Nothing outside gspo_jax/models/ calls more of a model than this Protocol:

- gspo_jax/rollout/ (the engines): ``forward`` (prefill with a cache, then one-token decode
  steps writing the cache at a slot), ``init_cache``, ``logits``, ``cfg`` (vocab_size,
  max_seq_len, is_moe), and the cache-layout helpers models/ exports (shared_prefix_cache,
  add_chunk, is_shared_prefix; the paged cache's init_paged_cache, write_prompt_pages,
  SCRATCH_PAGE), so no engine reaches into models/attention.py or kernels/paged_attention.py;
- gspo_jax/models/logprobs.py (response_logprobs, which rl/step.py, rl/warmstart.py and
  rl/evaluation.py call): ``forward`` without a cache, ``output_matrix`` and ``cfg``
  (compute_dtype, logprob_chunk_bytes, num_layers, experts_per_token);
- gspo_jax/rl/step.py, rl/build.py, rl/warmstart.py and rl/evaluation.py: the model is an
  ``nnx.Module`` whose trainable state is its ``nnx.Param`` variables (split with
  ``nnx.split(model, nnx.Param, ...)``, merged back inside jit) and each Param carries logical axis
  names in its ``out_sharding`` metadata (gspo_jax/sharding.py turns them into shardings);
- tests and supervised code: ``__call__(tokens)`` -> causal logits [B, S, V] float32.

The masks and positions a caller passes come from the layout helpers in models/transformer.py
(sequence_layout, slot_mask, attention_mask, decode_mask), and a model is built by
models.create_model (or loaded by models.load_hf_checkpoint). A new family is config flags on
ModelConfig (qk_norm, attention_bias, tie_embeddings, num_experts, ...) or, if it cannot be, one
module that satisfies this Protocol; the sampler and trainer then need no change.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from gspo_jax.models.config import ModelConfig


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model the sampler, response_logprobs and the trainer can drive."""

    cfg: ModelConfig

    def forward(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        *,
        token_mask: jax.Array | None = None,
        cache: Any = None,
        write_index: Any = None,
        routes: jax.Array | None = None,
        return_routes: bool = False,
    ) -> dict[str, Any]:
        """tokens [B, S] int32, positions [B, S] int32, mask: transformer.slot_mask(...) or an
        explicit [B, S, Sk] bool ->
        dict(hidden [B, S, D] final-normed, aux_loss scalar f32, cache (init_cache's pytree or
        the sampler's shared-prefix cache, written at slot write_index) or None, routes
        [L, B, S, k] int32 if return_routes (MoE))."""
        ...

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] (final-normed) -> float32 logits [..., V]."""
        ...

    def output_matrix(self) -> jax.Array:
        """[D, V] output projection; response_logprobs unembeds chunk by chunk with it."""
        ...

    def init_cache(self, batch: int, length: int) -> Any:
        """A zeroed KV cache of `length` slots for `batch` rows: a pytree whose leaves carry a
        leading [L] layer axis (the per-layer caches, stacked; the sampler turns a prefill cache
        into its shared-prefix decode cache with models.shared_prefix_cache)."""
        ...

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        key_valid: jax.Array | None = None,
    ) -> jax.Array:
        """Causal logits [B, S, V] float32 for left-aligned tokens [B, S]."""
        ...
