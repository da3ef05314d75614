"""The rollout seam: one call, rollout.generate, in front of every rollout engine.

An engine takes P right-padded prompts and a group size G and returns a SampleOutput of
B = P·G group-contiguous rows (rollout/output.py). The trainer, the log-prob passes, evaluation
and the plan call generate (or an engine's own decode step, for costing) and nothing else of an
engine, so a new engine is one file plus one line in ENGINES.

    out = rollout.generate(model, prompts, prompt_lengths, num_samples=G, max_new_tokens=T,
                           rng=jax.random.fold_in(key, step), temperature=1.0, top_k=0,
                           top_p=1.0, eos_id=task.tokenizer.eos_id, pad_id=0)
    out.tokens [B, T] int32 (pad_id after EOS), out.mask [B, T] f32 (1 up to and including EOS),
    out.logp [B, T] f32 (log-prob under softmax(logits / temperature): the trainer's old_logp),
    out.sample_logp [B, T] f32 (under the top-k/top-p truncated distribution actually sampled
    from; == logp without truncation), out.lengths [B] int32, out.routes (MoE, only with
    return_routes=True) [L, B, Lp + T, k] int32.

The trainer's log-probs for the same rows: models.response_logprobs(model, jnp.repeat(prompts,
G, 0), jnp.repeat(prompt_lengths, G), out.tokens, temperature=temperature) (and, for Routing
Replay, routes=out.routes); its logp equals out.logp wherever out.mask is 1, whichever engine
sampled them.
"""

from __future__ import annotations

from typing import Protocol

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from gspo_jax.rollout.continuous import generate_continuous
from gspo_jax.rollout.output import SampleOutput
from gspo_jax.rollout.sampling import static_temperature
from gspo_jax.rollout.static import generate_static


class RolloutEngine(Protocol):
    """What an engine implements: the checked arguments of generate in, a SampleOutput out.
    Engine-specific options (the static engine's decode layout, a continuous engine's slots)
    arrive as keyword arguments."""

    def __call__(
        self,
        model,
        prompts: jax.Array,  # [P, Lp] int32, right-padded
        prompt_lengths: jax.Array,  # [P] int32
        rng: jax.Array,
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
        eos_id: int,
        pad_id: int,
        return_routes: bool,
        **options,
    ) -> SampleOutput: ...


# The engines by name (config field rl.rollout_engine); one line per engine.
ENGINES: dict[str, RolloutEngine] = {
    "static": generate_static,
    "continuous": generate_continuous,
}


def generate(
    model,
    prompts,
    prompt_lengths,
    *,
    num_samples: int,
    max_new_tokens: int,
    rng,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int,
    pad_id: int = 0,
    return_routes: bool = False,
    engine: str = "static",
    **options,
) -> SampleOutput:
    """Samples num_samples responses for each of P right-padded prompts.

    prompts [P, Lp] int32 right-padded, prompt_lengths [P] int32 (1 <= n <= Lp). Returns a
    SampleOutput with B = P * num_samples group-contiguous rows (row b from prompt b // G). See the
    module docstring for the fields. rng: a fresh key per call (e.g. fold_in(key, step)).
    temperature 0 = greedy (an array temperature is traced and samples: rollout/sampling.py);
    top_k 0 = off; top_p 1 = off; eos_id -1 = no early stop (benchmarks).
    Raises ValueError for settings or shapes the cache cannot hold, before compiling anything.
    return_routes (MoE only): also return the experts used at every slot (SampleOutput.routes)
    for Routing Replay. engine: a name in ENGINES; options go to it (the static engine's
    decode="shared_prefix" | "repeated", rollout/static.py; the continuous engine's slots=N,
    page_size, num_pages, refill="device" | "chunked", chunk, rollout/continuous.py). Both
    engines sample the same tokens from the same key (row b's t-th token draws
    uniform(fold_in(rng, t), (B,))[b] in either).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {tuple(ENGINES)}.")
    cfg = model.cfg
    prompts = jnp.asarray(prompts)
    prompt_lengths = jnp.asarray(prompt_lengths)
    if prompts.ndim != 2 or prompt_lengths.shape != prompts.shape[:1]:
        raise ValueError(
            f"prompts must be [P, Lp] and prompt_lengths [P]; got {prompts.shape} "
            f"and {prompt_lengths.shape}."
        )
    P, Lp = prompts.shape
    if Lp + max_new_tokens > cfg.max_seq_len:
        raise ValueError(
            f"Prompt length {Lp} + max_new_tokens {max_new_tokens} = {Lp + max_new_tokens} "
            f"exceeds the model's cache limit max_seq_len={cfg.max_seq_len}. Truncate the prompts "
            f"(or pad them less), lower max_new_tokens, or build the model with "
            f"get_model_config(..., max_seq_len={Lp + max_new_tokens})."
        )
    if num_samples < 1 or max_new_tokens < 1:
        raise ValueError(
            f"num_samples={num_samples} and max_new_tokens={max_new_tokens} must be >= 1."
        )
    if not 0 <= top_k <= cfg.vocab_size:
        raise ValueError(f"top_k={top_k} must be in [0, vocab_size={cfg.vocab_size}] (0 = off).")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (1 = off).")
    if return_routes and not cfg.is_moe:
        raise ValueError("return_routes=True needs an MoE model (num_experts > 0).")
    if static_temperature(temperature) and temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy).")
    if not -1 <= eos_id < cfg.vocab_size or not 0 <= pad_id < cfg.vocab_size:
        raise ValueError(
            f"eos_id={eos_id} and pad_id={pad_id} must be token ids in "
            f"[0, {cfg.vocab_size}) (eos_id=-1: never stop early)."
        )
    if not isinstance(prompt_lengths, jax.core.Tracer):
        # Multi-host: np.asarray cannot read rows other hosts hold, so every process gathers all
        # of them (a small collective; every host calls generate alike) and all raise together.
        lengths = (
            np.asarray(prompt_lengths)
            if prompt_lengths.is_fully_addressable
            else np.asarray(multihost_utils.process_allgather(prompt_lengths, tiled=True))
        )
        if lengths.min() < 1 or lengths.max() > Lp:
            raise ValueError(
                f"prompt_lengths must be in [1, Lp={Lp}]; got min {lengths.min()}, "
                f"max {lengths.max()}. Every prompt needs at least one token."
            )
    chex.assert_type([prompts, prompt_lengths], [int, int])
    return ENGINES[engine](
        model,
        prompts,
        prompt_lengths,
        rng,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        pad_id=pad_id,
        return_routes=return_routes,
        **options,
    )
