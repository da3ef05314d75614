"""Rollouts: G responses per prompt, through one seam (engine.generate) in front of the engines.

    out = rollout.generate(model, prompts, prompt_lengths, num_samples=G, max_new_tokens=T,
                           rng=key, eos_id=eos, engine="static")   # -> SampleOutput [B = P·G]

output.py (SampleOutput), engine.py (the seam, the engine table, argument checks), sampling.py
(truncation and the inverse-CDF draw every engine samples with), static.py (one fixed batch
decoded by a lax.while_loop over a shared-prefix KV cache).
"""

from gspo_jax.rollout.engine import ENGINES, RolloutEngine, generate
from gspo_jax.rollout.output import SampleOutput
from gspo_jax.rollout.sampling import inverse_cdf_sample, sample_token, truncate_logits
from gspo_jax.rollout.static import DECODE_LAYOUTS, decode_step, prefill

__all__ = [
    "DECODE_LAYOUTS",
    "ENGINES",
    "RolloutEngine",
    "SampleOutput",
    "decode_step",
    "generate",
    "inverse_cdf_sample",
    "prefill",
    "sample_token",
    "truncate_logits",
]
