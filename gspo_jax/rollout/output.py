"""What every rollout engine returns: SampleOutput, B = P·G group-contiguous response rows; and
what partial rollouts carry from one step's engine to the next: PartialRows."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class SampleOutput:
    tokens: jax.Array  # [B, T] int32, pad_id after EOS
    mask: jax.Array  # [B, T] float32, 1 up to and including EOS
    logp: jax.Array  # [B, T] float32, temperature-scaled policy (0 where mask is 0)
    sample_logp: jax.Array  # [B, T] float32, truncated sampling distribution (0 where masked)
    lengths: jax.Array  # [B] int32 = mask.sum(-1)
    # MoE only, with return_routes=True: experts used at every slot of the prompt+response
    # layout, [L, B, Lp + T, k] int32, ready for response_logprobs(..., routes=...) (Routing
    # Replay). The last slot's token is never fed to the model; its routes are 0 (they cannot
    # affect any log-prob).
    routes: jax.Array | None = None
    # Partial rollouts only (engine="continuous" with a carry): the policy version (the trainer's
    # step) that sampled each token, [B, T] int32 (0 where mask is 0). Rows carried over a step
    # boundary hold tokens of several versions.
    versions: jax.Array | None = None


@flax.struct.dataclass
class PartialRows:
    """The rows of a queue of groups as far as they were generated: the state a partial rollout
    hands to the next step's engine (rollout/continuous.py, "Partial rollouts").

    A row with mask.sum() = n > 0 has generated tokens 0 .. n - 1 (under the policy versions
    in versions); the next engine keeps them (not sampled again, their log-probs kept),
    recomputes their KV and samples from token n on. done marks rows that already ended (EOS
    or the limit). A row with n = 0 is new. B = Q·G rows, group-contiguous.
    """

    tokens: jax.Array  # [B, T] int32 (pad where mask is 0)
    mask: jax.Array  # [B, T] float32
    logp: jax.Array  # [B, T] float32
    sample_logp: jax.Array  # [B, T] float32
    versions: jax.Array  # [B, T] int32
    done: jax.Array  # [B] bool

    @classmethod
    def empty(cls, rows: int, max_new_tokens: int, pad_id) -> PartialRows:
        """rows new rows: nothing generated yet."""
        zeros = jnp.zeros((rows, max_new_tokens), jnp.float32)
        return cls(
            tokens=jnp.full((rows, max_new_tokens), pad_id, jnp.int32),
            mask=zeros,
            logp=zeros,
            sample_logp=zeros,
            versions=jnp.zeros((rows, max_new_tokens), jnp.int32),
            done=jnp.zeros((rows,), bool),
        )
