"""The checks of a config that need nothing but the config: each raises ConfigError naming the
field and the fix.

``validate(config)`` runs them (a NaN or infinite hyperparameter, group size 1, a count below 1,
an unknown estimator or rollout dtype, ...). rl/build.py calls it first, then builds the objective,
the mesh, the task and the model config, each builder checking its own input as it builds (an
unknown objective or bad ε, a batch that does not divide over the data axis, an unknown task, knob,
split or model preset, a response length the model's KV cache cannot hold), and probes the workdir
last: a misconfigured job dies in seconds with a message that names the fix instead of after the
warm start. main.py prints a ConfigError as one ``error: ...`` line.

No array dimensions here.
"""

from __future__ import annotations

import math

import ml_collections

from gspo_jax import advantages
from gspo_jax.config.args import flatten
from gspo_jax.config.population import check_population
from gspo_jax.errors import ConfigError


def validate(config: ml_collections.ConfigDict) -> None:
    """The checks that need nothing but the config; raises ConfigError naming the fix.

    Covers: finite float hyperparameters, the advantage estimator and scale_rewards, group size
    >= 2, positive counts (prompts, minibatches, micro-batches, epochs, steps), temperature,
    response lengths, the schedule and intervals, and the rollout options. The checks that need a
    built part (the objective, the mesh, the task, the model config) run where rl/build.py builds
    it, and the workdir is probed last (build.build_run).
    """
    rl = config.rl
    check_finite(config)
    estimator = resolve_estimator(config)
    if estimator not in advantages.ESTIMATORS:
        raise ConfigError(
            f"config.rl.advantage_estimator={estimator!r} is unknown; "
            f"valid: {advantages.ESTIMATORS}"
        )
    if rl.group_size < 2:
        raise ConfigError(
            f"config.rl.group_size={rl.group_size}: group-relative advantages compare each "
            f"response with the other samples of its prompt ({estimator!r} divides by the "
            "group's std, which "
            "is 0 for a single sample), so every advantage would be 0 and nothing would train. "
            "Set --config.rl.group_size to 2 or more (8 is the default)."
        )
    if min(rl.prompts_per_step, rl.num_minibatches, rl.num_microbatches, rl.num_epochs) < 1:
        raise ConfigError(
            "config.rl.prompts_per_step, num_minibatches, num_microbatches and "
            "num_epochs must all be >= 1"
        )
    if rl.num_steps < 1:
        raise ConfigError(f"config.rl.num_steps={rl.num_steps} must be >= 1")
    if rl.temperature <= 0:
        raise ConfigError(
            f"config.rl.temperature={rl.temperature}: RL needs sampling (temperature > 0); "
            "greedy decoding is for evaluation only"
        )
    if rl.max_new_tokens < 0:
        raise ConfigError(
            f"config.rl.max_new_tokens={rl.max_new_tokens} must be >= 1 (or 0 for the task's "
            "max_response_len)"
        )
    opt = config.optimizer
    if opt.learning_rate <= 0 or opt.schedule not in ("constant", "cosine", "linear"):
        raise ConfigError(
            f"config.optimizer: learning_rate={opt.learning_rate} must be > 0 and "
            f"schedule={opt.schedule!r} one of constant, cosine, linear"
        )
    if config.checkpoint.every < 1 or config.eval.every < 0:
        raise ConfigError(
            "config.checkpoint.every must be >= 1 and config.eval.every >= 0 "
            "(0 = evaluate only at the start and the end)"
        )
    if not rl.rollout_logp_noise >= 0:
        raise ConfigError(
            f"config.rl.rollout_logp_noise={rl.rollout_logp_noise} must be >= 0 (the std of the "
            "noise added to each sampled token's log-prob; 0 = none)"
        )
    if config.eval.max_new_tokens < 0:
        raise ConfigError(
            f"config.eval.max_new_tokens={config.eval.max_new_tokens} must be >= 1 (or 0 for "
            "config.rl.max_new_tokens)"
        )
    check_scale_rewards(config, estimator)
    check_rollout_options(config)
    check_population(config)  # config.population (config/population.py: the members)


def check_scale_rewards(config: ml_collections.ConfigDict, estimator: str) -> None:
    """rl.scale_rewards: a known choice, and one other than "group" only for grpo's std."""
    scale = config.rl.scale_rewards
    if scale not in advantages.SCALE_REWARDS:
        raise ConfigError(
            f"config.rl.scale_rewards={scale!r} is unknown; valid: {advantages.SCALE_REWARDS}"
        )
    if scale != "group" and estimator != "grpo":
        raise ConfigError(
            f"config.rl.scale_rewards={scale!r} chooses grpo's std, but the advantage estimator "
            f"is {estimator!r}: set --config.rl.advantage_estimator=grpo or scale_rewards=group"
        )


ROLLOUT_DTYPES = ("", "float32", "bfloat16")
ROLLOUT_QUANTS = ("", "int8", "fp8")  # rollout/quant.py QTYPES


def check_rollout_options(config: ml_collections.ConfigDict) -> None:
    """The rollout dtype and weight quantization, dynamic sampling, collapse watch and the
    objective's use of the rollout's log-probs, each against the rest of the config (the
    overlong buffer needs the task's response length: build.make_task checks it)."""
    rl = config.rl
    if rl.rollout_dtype not in ROLLOUT_DTYPES:
        raise ConfigError(
            f"config.rl.rollout_dtype={rl.rollout_dtype!r}; valid: {ROLLOUT_DTYPES} "
            "('' = the model's compute dtype)"
        )
    if rl.rollout_quant not in ROLLOUT_QUANTS:
        raise ConfigError(
            f"config.rl.rollout_quant={rl.rollout_quant!r}; valid: {ROLLOUT_QUANTS} "
            "('' = the rollout's weights in their own dtype)"
        )
    lora = config.get("lora") or {}
    base_quant, rank = lora.get("base_quant", ""), lora.get("rank", 0)
    if base_quant not in ROLLOUT_QUANTS:
        raise ConfigError(
            f"config.lora.base_quant={base_quant!r}; valid: {ROLLOUT_QUANTS} "
            "('' = the frozen base in the parameters' dtype)"
        )
    if base_quant and rank == 0:
        raise ConfigError(
            f"config.lora.base_quant={base_quant!r} quantizes the frozen base under LoRA "
            "adapters, but config.lora.rank=0 trains every weight: set lora.rank > 0 or "
            "base_quant=''"
        )
    if base_quant and rl.rollout_quant not in ("", base_quant):
        raise ConfigError(
            f"config.rl.rollout_quant={rl.rollout_quant!r} with config.lora.base_quant="
            f"{base_quant!r}: the rollout reads the base as quantized already; set "
            f"rollout_quant='' or {base_quant!r}"
        )
    if rl.max_gen_batches < 1:
        raise ConfigError(
            f"config.rl.max_gen_batches={rl.max_gen_batches} must be >= 1 (rollouts per step "
            "with dynamic sampling)"
        )
    if rl.collapse_patience < 0:
        raise ConfigError(
            f"config.rl.collapse_patience={rl.collapse_patience} must be >= 0 (0 = never warn)"
        )


def check_finite(config: ml_collections.ConfigDict) -> None:
    """Raises ConfigError naming every float field of ``config`` that is NaN or infinite.

    Range checks such as ``learning_rate <= 0`` are False for NaN, so a NaN learning rate (or
    temperature, ε, weight decay, ...) would pass them and turn the parameters into NaN at step 1.
    """
    bad = [
        f"config.{k}={v}"
        for k, v in flatten(config).items()
        if isinstance(v, float) and not math.isfinite(v)
    ]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: hyperparameters must be finite numbers (NaN or inf would make the "
            "loss and the parameters NaN at the first step); set a finite value, e.g. "
            f"--{bad[0].split('=')[0]}=<number>"
        )


def resolve_estimator(config: ml_collections.ConfigDict) -> str:
    """The advantage estimator: config.rl.advantage_estimator, else the objective's pairing
    (dr_grpo advantages for the dr_grpo objective, z-scored grpo advantages otherwise)."""
    if config.rl.advantage_estimator:
        return config.rl.advantage_estimator
    return "dr_grpo" if config.objective.name == "dr_grpo" else "grpo"
