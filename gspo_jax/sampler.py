"""The group sampler's public name, kept for users' scripts and notebooks: everything here is
gspo_jax.rollout's (the seam and its engines live there)."""

from gspo_jax.rollout import (  # noqa: F401
    DECODE_LAYOUTS,
    ENGINES,
    RolloutEngine,
    SampleOutput,
    decode_step,
    generate,
    inverse_cdf_sample,
    prefill,
    sample_token,
    truncate_logits,
)
