"""What every rollout engine returns: SampleOutput, B = P·G group-contiguous response rows."""

from __future__ import annotations

import flax.struct
import jax


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
