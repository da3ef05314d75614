"""LoRA and QLoRA as one concept: every question the rest of the library asks about a policy
with adapters is answered here, for a full fine-tuning run too (where each answer is the plain
one).

    spec = adapters.lora_spec(config)             # config.lora, typed (rank 0: no adapters)
    model = adapters.adapted_model(base, spec, seed)   # the base under its adapters (QLoRA:
                                                  # the base's projections held quantized)
    adapters.trainable(run, params)               # what the optimizer updates
    adapters.reference_view(step_spec, params)    # what the reference pass reads
    adapters.saved_state(run, state)              # what a checkpoint holds
    adapters.restored(run, state, meta, base, where)   # a checkpoint's state made whole again
    adapters.exported(run, model)                 # the model an export writes

With config.lora.rank > 0 the policy's parameters are the frozen base and the adapters
(nnx.LoRAParam, models/lora.py through qwix): only the adapters train; the reference policy is
the base with the adapters off (reference_view, the one place that rule is written), so the
policy's own parameters hold the reference and no copy of the base is kept
(keeps_reference_copy); a checkpoint holds the adapters and their optimizer state, with the base's
identity in its metadata (checkpoint_meta), and a resume or an export loads the base again from
its source and checks it is the one the adapters trained on. With config.lora.base_quant (QLoRA)
the base's projection weights are held quantized under the adapters (rollout/quant.py), read
dequantized by the trainer, the reference and the rollout.

Dimension legend: none (parameter pytrees).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from gspo_jax import models, rollout
from gspo_jax.errors import ConfigError
from gspo_jax.state import Run, StepSpec, TrainState


def lora_spec(config: ml_collections.ConfigDict) -> models.lora.LoraSpec:
    """config.lora, typed (rank 0, the default, is full fine-tuning)."""
    return models.lora.LoraSpec.of(config.get("lora"))


def check_lora(spec: models.lora.LoraSpec, model_cfg: models.ModelConfig) -> None:
    """ConfigError for a negative rank, a non-positive α, a target that matches no module (the
    model's module paths listed) or targets whose modules have no weight qwix adapts."""
    if spec.rank < 0:
        raise ConfigError(
            f"config.lora.rank={spec.rank} must be >= 0 (0 = full fine-tuning, no adapters)"
        )
    if spec.rank == 0:
        return
    if not spec.alpha > 0:
        raise ConfigError(f"config.lora.alpha={spec.alpha} must be > 0 (the scale is α / r)")
    paths = models.lora.module_paths(model_cfg)
    for pattern in spec.targets:
        try:
            hits = [p for p in paths if re.fullmatch(pattern, p)]
        except re.error as e:
            raise ConfigError(f"config.lora.targets: {pattern!r} is not a regex ({e})") from None
        if not hits:
            raise ConfigError(
                f"config.lora.targets: {pattern!r} matches no module of the model; its module "
                f"paths: {paths}"
            )
    try:
        models.lora.adapted_weights(spec, model_cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def adapted_model(model, spec: models.lora.LoraSpec, seed: int):
    """The policy's model from the base ``model``: with LoRA the base under its adapters
    (models/lora.py), and with spec.base_quant (QLoRA) the base's projection weights held
    quantized under them (rollout/quant.py: QuantizedParam, read dequantized by the trainer,
    the reference and the rollout; the adapters stay in their dtype). The one place the policy
    gets its adapters and its quantized base, for the abstract model and the concrete one."""
    if spec.rank <= 0:  # full fine-tuning: every weight trains, none is held quantized
        return model
    return rollout.quantize_weights(
        models.lora.add_adapters(model, spec, seed=seed), spec.base_quant
    )


# ------------------------------------------------------------------- which parameters train


def has_adapters(config: ml_collections.ConfigDict) -> bool:
    """Whether the policy carries LoRA adapters (config.lora.rank > 0; StepSpec.lora_adapters)."""
    return lora_spec(config).rank > 0


def trained_filter(spec: StepSpec):
    """The nnx filter of the parameters that train, for an update that takes the gradient with
    respect to them alone: None (all of them train), or with LoRA the adapters (nnx.LoRAParam)."""
    return nnx.LoRAParam if spec.lora_adapters else None


def trainable(run: Run, params):
    """The parameters the optimizer updates: all of them, or with LoRA the adapters alone."""
    only = trained_filter(run.step)
    return params if only is None else params.filter(only)


def draws_own_adapters(run: Run) -> bool:
    """Whether a policy's initial parameters depend on its seed beyond the base's: with LoRA its
    adapters are drawn from it, so each population member has its own; else all share the base."""
    return run.step.lora_adapters


def rollout_cast_allowed(run: Run) -> bool:
    """Whether the rollout's copy of the parameters may be cast to the rollout's compute dtype:
    not with LoRA adapters, which qwix computes from the parameters' stored dtype."""
    return not run.step.lora_adapters


def summary(run: Run) -> str:
    """What the policy carries beside its model, for a plan's title: " + LoRA rank r", or ""."""
    return f" + LoRA rank {lora_spec(run.config).rank}" if run.step.lora_adapters else ""


# ------------------------------------------------------------------- the reference policy


def reference_in_policy(spec: StepSpec) -> bool:
    """Whether the policy's own parameters hold the reference policy (LoRA: the base under the
    adapters), so that no copy of the base is kept for it."""
    return spec.lora_adapters


def reference_view(spec: StepSpec, params):
    """The parameters the reference pass reads from those it is given: with LoRA the policy's
    own with the adapters off (the reference is the base), else the reference's copy as given."""
    return models.lora.without_adapters(params) if reference_in_policy(spec) else params


def keeps_reference_copy(run: Run) -> bool:
    """Whether the run keeps a copy of the base's parameters for the reference pass: a reference
    runs (StepSpec.uses_reference) and the policy does not hold it (reference_in_policy)."""
    return run.step.uses_reference and not reference_in_policy(run.step)


def reference_params(spec: StepSpec, params, ref_params):
    """What the reference pass is given at a step: the policy's parameters when they hold the
    reference (reference_view turns their adapters off), else the kept copy ``ref_params``."""
    return params if reference_in_policy(spec) else ref_params


def base_quant(run: Run) -> str:
    """How the frozen base is held: config.lora.base_quant under LoRA (QLoRA), else ""."""
    return lora_spec(run.config).base_quant if run.step.lora_adapters else ""


# ------------------------------------------------------------------- what a checkpoint holds


def checkpoint_has_base(run: Run) -> bool:
    """Whether a checkpoint holds the base's parameters: not with LoRA (saved_state), so a resume
    or an export loads the base again from its source (restored)."""
    return not run.step.lora_adapters


def resume_loads_base(run: Run) -> bool:
    """Whether a resume loads the base again: the checkpoint lacks it (checkpoint_has_base) or the
    reference keeps a copy of it (keeps_reference_copy)."""
    return not checkpoint_has_base(run) or keeps_reference_copy(run)


def saved_state(run: Run, state: TrainState) -> TrainState:
    """What a checkpoint holds of ``state``: all of it, or with LoRA the adapters' parameters."""
    return state.replace(params=trainable(run, state.params))


def with_base(run: Run, restored: TrainState, base: Any) -> TrainState:
    """A restored (saved_state) state with the base's parameters put back: the base policy's
    non-adapter leaves of ``base`` (base_params) and the checkpoint's adapters."""
    if checkpoint_has_base(run):
        return restored
    frozen = base.filter(nnx.Not(nnx.LoRAParam))
    return restored.replace(params=nnx.merge_state(frozen, restored.params))


def base_identity(config: ml_collections.ConfigDict, params: Any) -> dict:
    """The base a LoRA checkpoint's adapters belong to: its source (config.init) and a fingerprint
    of its weights (sum of squares over every non-adapter parameter, float64 on the host)."""
    frozen = params.filter(nnx.Not(nnx.LoRAParam))
    sq = [jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(frozen)]
    init = config.init
    source = {"random": f"seed {config.seed}", "hf": init.checkpoint}.get(init.kind, "warm start")
    return {"kind": init.kind, "source": source, "sum_sq": float(np.sum(np.asarray(sq, "f8")))}


def check_base_identity(saved: dict | None, now: dict, where: str) -> None:
    """ConfigError when the base loaded now is not the one the checkpoint's adapters trained on."""
    if saved is None:
        raise ConfigError(
            f"the checkpoint in {where} holds no LoRA base identity (it was written without "
            "config.lora); resume it with config.lora.rank=0, or --start_fresh"
        )
    same = saved["kind"] == now["kind"] and saved["source"] == now["source"]
    if not same or not np.isclose(saved["sum_sq"], now["sum_sq"], rtol=1e-6, atol=0.0):
        raise ConfigError(
            f"the LoRA adapters in {where} were trained on base {saved}, but the base loaded now "
            f"is {now}; resume with the base they were trained on, or --start_fresh"
        )


def checkpoint_meta(run: Run, base: Any) -> dict:
    """What a checkpoint's metadata holds of the policy beside the state: with LoRA the base's
    identity (checked when the adapters are loaded again), else nothing."""
    return {} if checkpoint_has_base(run) else {"lora_base": base_identity(run.config, base)}


def restored(
    run: Run, state: TrainState, meta: dict, base: Any, where: str, put_back=None
) -> TrainState:
    """A checkpoint's state (saved_state) made whole: with LoRA the base loaded again (``base``,
    its parameters), checked against the identity in ``meta``, under the saved adapters
    (``put_back(state, base)``: with_base, or a population's for its stacked members)."""
    if checkpoint_has_base(run):
        return state
    check_base_identity(meta.get("lora_base"), base_identity(run.config, base), where)
    return (put_back or functools.partial(with_base, run))(state, base)


def exported(run: Run, model, peft: str | None = None):
    """The model an export writes: with LoRA the adapters merged into the base (and, with
    ``peft``, the adapters alone written there in PEFT's layout), else ``model`` (``peft``
    unused: the caller refuses it)."""
    spec = lora_spec(run.config)
    if spec.rank <= 0:
        return model
    if peft:
        models.lora.save_peft(model, spec, peft, base_model=run.config.init.get("checkpoint", ""))
    return models.lora.merged(model, spec)
