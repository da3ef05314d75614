"""Rollouts: G responses per prompt, through one seam (engine.generate) in front of the engines.

    out = rollout.generate(model, prompts, prompt_lengths, num_samples=G, max_new_tokens=T,
                           rng=key, eos_id=eos, engine="static")   # -> SampleOutput [B = P·G]

output.py (SampleOutput), engine.py (the seam, the engine table, argument checks), sampling.py
(truncation and the inverse-CDF draw every engine samples with), static.py (one fixed batch
decoded by a lax.while_loop over a shared-prefix KV cache), continuous.py (engine="continuous":
a fixed number of decode slots refilled from the queue of rows as rows end) over paged.py (the
paged KV cache's page tables and reference counts; continuous_step.py holds the loop's state
and step), quant.py (config.rl.rollout_quant: the
decoder's weights quantized through qwix for the rollout).

Multi-turn: multi_turn.generate_episodes plays episodes against an environment (-> EpisodeBatch,
episodes.py) with engine="static" (reprefill.py) or "continuous" (multi_turn_paged.py).
"""

from gspo_jax.rollout.continuous import (
    REFILL_STRATEGIES,
    decode_step_for_plan,
    generate_partial,
)
from gspo_jax.rollout.engine import ENGINES, RolloutEngine, generate
from gspo_jax.rollout.episodes import EpisodeBatch
from gspo_jax.rollout.multi_turn import generate_episodes
from gspo_jax.rollout.output import PartialRows, SampleOutput
from gspo_jax.rollout.paged import pages_needed
from gspo_jax.rollout.quant import QTYPES, QuantizedParam, quantize_weights, weight_bytes
from gspo_jax.rollout.sampling import (
    inverse_cdf_sample,
    row_uniforms,
    sample_token,
    sample_with_uniform,
    truncate_logits,
)
from gspo_jax.rollout.static import DECODE_LAYOUTS, decode_step, prefill

__all__ = [
    "DECODE_LAYOUTS",
    "ENGINES",
    "EpisodeBatch",
    "PartialRows",
    "QTYPES",
    "QuantizedParam",
    "REFILL_STRATEGIES",
    "RolloutEngine",
    "SampleOutput",
    "decode_step",
    "decode_step_for_plan",
    "generate",
    "generate_episodes",
    "generate_partial",
    "inverse_cdf_sample",
    "pages_needed",
    "prefill",
    "quantize_weights",
    "row_uniforms",
    "sample_token",
    "sample_with_uniform",
    "truncate_logits",
    "weight_bytes",
]
