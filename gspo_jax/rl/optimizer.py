"""The RL update's optimizer: AdamW with global-norm clipping, its learning-rate schedule (in
optimizer updates), and the MoE routers' step scale (config.optimizer).

    tx, schedule = optimizer.make_optimizer(config.optimizer, total_updates)

rl/build.py builds it once per run (build_run); it acts on adapters.trainable's parameters.

Dimension legend: none (optax transformations).
"""

from __future__ import annotations

from typing import Any

import jax
import optax


def make_schedule(opt_cfg: Any, total_updates: int) -> optax.Schedule:
    """Learning rate per optimizer update: linear warmup then constant / cosine / linear decay.

    Counted in optimizer updates (RL steps × epochs × minibatches).
    """
    lr, warm = float(opt_cfg.learning_rate), int(opt_cfg.warmup_updates)
    kind = opt_cfg.schedule
    decay_steps = max(total_updates - warm, 1)
    end = lr * float(opt_cfg.end_lr_ratio)
    if kind == "constant":
        main = optax.constant_schedule(lr)
    elif kind == "cosine":
        main = optax.cosine_decay_schedule(lr, decay_steps, alpha=float(opt_cfg.end_lr_ratio))
    elif kind == "linear":
        main = optax.linear_schedule(lr, end, decay_steps)
    else:
        raise ValueError(f"unknown schedule {kind!r}; valid: constant, cosine, linear")
    if warm <= 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), main], [warm])


def is_router_path(path) -> bool:
    """Whether a parameter's tree path lies under an MoE router (layers.MoE's ``router``)."""
    return any(getattr(k, "key", None) == "router" for k in path)


def scale_router_updates(scale: float) -> optax.GradientTransformation:
    """Multiplies the MoE routers' updates by ``scale``, after AdamW (whose step does not depend
    on the gradient's scale, so the step size can only be set here). The routers then move
    ``scale`` times as far per update as the rest of the model: a dose of route volatility, the
    routes' drift between the rollout and each update that Routing Replay is for. (AdamW's weight
    decay on the routers is scaled with their step.)"""
    return optax.masked(
        optax.scale(scale),
        lambda params: jax.tree_util.tree_map_with_path(lambda p, _: is_router_path(p), params),
    )


def make_optimizer(opt_cfg: Any, total_updates: int) -> tuple[optax.GradientTransformation, Any]:
    """AdamW with global-norm gradient clipping (and opt_cfg.router_lr_scale on the MoE routers'
    steps, where set); returns (tx, schedule). It acts on the trainable parameters
    (adapters.trainable: with LoRA the adapters alone, their optimizer state, their clipping
    norm)."""
    schedule = make_schedule(opt_cfg, total_updates)
    parts = []
    if opt_cfg.grad_clip and opt_cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(float(opt_cfg.grad_clip)))
    parts.append(
        optax.adamw(
            schedule,
            b1=float(opt_cfg.b1),
            b2=float(opt_cfg.b2),
            eps=float(opt_cfg.eps),
            weight_decay=float(opt_cfg.weight_decay),
        )
    )
    router_lr_scale = float(opt_cfg.router_lr_scale)
    if router_lr_scale != 1.0:
        parts.append(scale_router_updates(router_lr_scale))
    return optax.chain(*parts), schedule
