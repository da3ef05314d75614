"""Multi-turn rollouts: G episodes of each problem played against an environment, the policy's
turns sampled by a rollout engine and the environment's tools run off the decode path.

    batch = multi_turn.generate_episodes(model, env, records, engine="continuous",
                                         num_samples=G, max_new_tokens=T, rng=key,
                                         temperature=1.0, eos_id=eos, pad_id=0,
                                         executor=pool, slots=8)
    batch.prompts [P, Lp], batch.prompt_lengths [P]    # the episodes' first prompts
    batch.sample [B, T]        # SampleOutput: policy turns and observations as the row reads
    batch.action_mask [B, T]   # 1 on the policy's tokens (the loss's tokens)
    batch.rewards [B], batch.infos (B dicts: turns, tool_calls, failed_calls, end, ...)

The trainer's log-probs of the same rows: models.response_logprobs(model, repeat(prompts, G),
repeat(prompt_lengths, G), batch.sample.tokens) equal batch.sample.logp where action_mask is 1
(the observations are context: their log-probs are the model's, but no one sampled them).

Engines (ENGINES): "static" (rollout/reprefill.py: each turn re-prefills every playing row's
whole context; all rows' tools run between turns) and "continuous" (rollout/multi_turn_paged.py:
a row whose turn ends leaves its decode slot, its KV kept in its pages, while its tools run and
other rows decode; the observation is prefilled into its pages and it takes a slot again). Both
draw row b's token at response position t with uniform(fold_in(rng, t), (B,))[b], so they sample
the same tokens; EpisodeBatch and the host's record of the rows are rollout/episodes.py's.

executor: None runs a turn's tool jobs at once on the host; a tools.ToolPool (submit_job) or any
executor with submit(fn) runs them concurrently.

Dimension legend: P problems (records), G = num_samples, B = P * G rows (group-contiguous), Lp
padded first-prompt length, T = max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gspo_jax.errors import ConfigError
from gspo_jax.rollout.episodes import EpisodeBatch, InlineExecutor, Rows
from gspo_jax.rollout.multi_turn_paged import play_continuous
from gspo_jax.rollout.reprefill import play_static
from gspo_jax.rollout.sampling import static_temperature

# The multi-turn engines by name: play(model, rows, rng, eos_id=, executor=, settings=,
# **options) -> figures dict (turns or decode steps, slot_steps, live_slot_steps).
ENGINES = {"static": play_static, "continuous": play_continuous}


def run_episodes(
    model,
    env,
    records: Sequence[Mapping[str, Any]],
    *,
    engine: str = "static",
    rng,
    num_samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int,
    pad_id: int = 0,
    executor=None,
    **engine_options,
) -> tuple[EpisodeBatch, dict]:
    """generate_episodes and the engine's figures: decode_steps, slot_steps (the decode
    steps' widths summed: B per step for the static engine, the slots for the continuous one),
    live_slot_steps (those sampling a playing row's token) and occupancy, their ratio."""
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is not one of {tuple(ENGINES)}.")
    if num_samples < 1 or max_new_tokens < 1:
        raise ConfigError(
            f"num_samples={num_samples} and max_new_tokens={max_new_tokens} must be >= 1."
        )
    if not static_temperature(temperature) or temperature < 0:
        raise ConfigError(f"temperature={temperature} must be a number >= 0 (0 = greedy).")
    cfg = model.cfg
    if not 0 <= eos_id < cfg.vocab_size or not 0 <= pad_id < cfg.vocab_size:
        raise ConfigError(
            f"eos_id={eos_id} and pad_id={pad_id} must be token ids in [0, {cfg.vocab_size}): "
            "a multi-turn rollout needs the eos that ends a turn."
        )
    rows = Rows(env, records, int(num_samples), int(max_new_tokens), int(pad_id))
    Lp = rows.prompts.shape[1]
    if Lp + max_new_tokens > cfg.max_seq_len:
        raise ConfigError(
            f"the longest first prompt {Lp} + max_new_tokens {max_new_tokens} exceeds the "
            f"model's max_seq_len={cfg.max_seq_len}; lower max_new_tokens or build the model "
            f"with get_model_config(..., max_seq_len={Lp + max_new_tokens})."
        )
    settings = dict(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    stats = ENGINES[engine](
        model,
        rows,
        rng,
        eos_id=int(eos_id),
        executor=InlineExecutor() if executor is None else executor,
        settings=settings,
        **engine_options,
    )
    stats["occupancy"] = stats["live_slot_steps"] / max(1, stats["slot_steps"])
    return rows.batch(), stats


def generate_episodes(model, env, records, **kwargs) -> EpisodeBatch:
    """P = len(records) problems, num_samples episodes each, played to their ends (module
    docstring); kwargs: run_episodes's (engine, num_samples, max_new_tokens, rng, temperature,
    top_k, top_p, eos_id, pad_id, executor, and the engine's options: the continuous engine's
    slots, page_size, chunk)."""
    return run_episodes(model, env, records, **kwargs)[0]
