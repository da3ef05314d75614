"""Supervised warm start: the base policy RL starts from, trained once and cached.

    model = warmstart.get_base_model(task, model_cfg, warm_cfg, cache_dir)

RL from a random policy sees no reward, and the papers start from pretrained models; this codebase
must run offline on a CPU, so it makes its base policy by next-token training on the task's
demonstrations (``task.demonstration``: for the default arithmetic task a mix of carry-less direct
answers and correct worked answers, see tasks/arithmetic.py for why that mix makes the base
mediocre *by what it learned*). The demonstrations come from the train split through the same
TFDS + grain path as RL prompts; each epoch draws a fresh demonstration per problem
(warmstart_demos.py). A tool task's warm start (``tool_fraction`` > 0) shows the call format: that
share of its demonstrations are episodes played with the real tool, the loss on the policy's
tokens only.

Caching: the trained parameters are saved with orbax under
``cache_dir/warmstart/<task>_<hash>`` where the hash covers the task knobs, the model config (its
execution fields too: another kernel's summation order trains another model, see _keyed_fields),
the warm-start config and a code version, so every run asking for the same base reuses it and any
change to one of them trains a new one. A ``meta.json`` next to the checkpoint records the configs,
the final loss, the wall time and the stopping rule's checks.

Stopping rule (WarmStartConfig.stop_*, off by default): train until a held-out metric of the
format (arith: the worked format's sampled accuracy) passes a threshold at a few checks in a row,
with ``steps`` as the cap; docs/warmstart.md says why the default experiment uses it.

A training killed part way keeps its progress in ``<entry>.progress`` (parameters, optimizer
state, data position, the stopping rule's state; at every check, or every PROGRESS_EVERY steps
without a rule): the next run asking for the entry resumes it and ends with the parameters the
uninterrupted training would have had.

Runs started together train it once: the first trains under a file lock (``<entry>.lock``, see
filelock.py) while the others wait, then load its entry. An entry is written into a
private folder and renamed into place, so it is either absent or complete; one that cannot be
read (files deleted or truncated since) is moved aside to
``<entry>.corrupt-<time>`` (never deleted) and trained again.

Dimension legend: P demonstrations per step, Lp = task.max_prompt_len, T = task.max_response_len.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from tqdm import tqdm  # the terminal bar (tqdm.auto warns in kernels without ipywidgets)

from gspo_jax import filelock, models, sharding
from gspo_jax.rl import evaluation
from gspo_jax.rl.warmstart_demos import (  # noqa: F401 (public names, importable from here)
    DemonstrationStats,
    demonstration_iterator,
    encode_demonstration,
    encode_tool_demonstration,
    tool_environment,
)
from gspo_jax.tasks.task import Task

# Bump when the training procedure or the saved layout changes in a way the configs do not
# capture. 2: the decoder layers are stacked ("layers/<param>" [L, ...], not "layers/<i>/...").
_CODE_VERSION = 2


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm-start hyperparameters (all of them key the cache; the stop_* fields only
    when the stopping rule is on).

    steps=None takes the task's ``warm_start_steps`` (arith 2400, countdown 4800: where each
    task's held-out accuracy has levelled off, see experiments/warmstart_curve.py and
    docs/getting_started.md "How good the warm start is"; 2400 for a task that sets none). A small
    decoder learns these digit lookups only after a long plateau of updates, so updates are what
    is short, not examples: hence batches of 16. experiments/warmstart_report.py measures the
    wall times.
    """

    steps: int | None = None  # None = task.warm_start_steps
    batch_size: int = 16  # P: small batches, many updates (the compute per step is what is short)
    learning_rate: float = 1e-2
    warmup_steps: int = 50
    end_lr_ratio: float = 0.1  # cosine decay to learning_rate * end_lr_ratio
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    loss_norm: str = "sequence"  # or "token" (see sft_loss)
    seed: int = 0
    # The stopping rule (off when stop_every = 0; then every one of `steps` is trained): every
    # stop_every steps, evaluate `stop_metric` (a key of evaluation.evaluate's metrics, e.g. arith's
    # "worked_accuracy": the worked format's accuracy over temperature-1 samples) on the last
    # stop_problems problems of the test split (held out: RL evaluates the first ones), with
    # stop_samples samples per problem; stop once it is >= stop_threshold at stop_patience checks
    # in a row. `steps` is then the cap. Why: whether a small decoder has learned a format by a
    # fixed step count is a draw (a rounding step decides it); a rule on the format itself is not.
    stop_every: int = 0
    stop_metric: str = "worked_accuracy"
    stop_threshold: float = 0.9
    stop_patience: int = 2
    stop_problems: int = 256
    stop_samples: int = 4
    # A ceiling on the base (0 = none; keys the cache only when set): a small decoder often learns
    # a format in a jump between two checks (the testbed's 0.17 -> 0.58 in 25 steps), so the check
    # that meets the rule can land far above the threshold. With a ceiling, the warm start then
    # returns the parameters of the latest check at or below it (meta.json: stop_kept_step).
    stop_ceiling: float = 0.0
    # With a ceiling, a finer look back (0 = off; keys the cache only when set): the parameters
    # are also kept every stop_lookback steps between two checks, and when the rule is met above
    # the ceiling they are evaluated newest first; the first at or below the ceiling is the base.
    # Why: the jump can span most of the band between two checks (docs/warmstart.md), so the
    # checks alone keep a base at its edge or below it; checking every few steps throughout
    # would cost an evaluation each. Holds one copy per stop_lookback steps since the kept check.
    stop_lookback: int = 0
    # A tool task's warm start: the share of demonstrations that are its tool episodes, played
    # with the sandboxed Python tool (warmstart_demos.py); 0 = the task's own demonstrations
    # only. Keys the cache only when > 0.
    tool_fraction: float = 0.0

    def __post_init__(self):
        if self.loss_norm not in ("sequence", "token"):
            raise ValueError(f"loss_norm={self.loss_norm!r}; valid: 'sequence', 'token'.")
        if self.stop_every < 0 or self.stop_patience < 1 or self.stop_problems < 1:
            raise ValueError(
                f"the stopping rule needs stop_every >= 0 (0 = off), stop_patience >= 1 and "
                f"stop_problems >= 1; got {self.stop_every}, {self.stop_patience}, "
                f"{self.stop_problems}."
            )
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"tool_fraction={self.tool_fraction} must lie in [0, 1].")
        if self.stop_samples < 1:
            raise ValueError(f"stop_samples={self.stop_samples}; pass >= 1.")
        if self.stop_lookback and not (
            self.stop_ceiling
            and 0 < self.stop_lookback < self.stop_every
            and self.stop_every % self.stop_lookback == 0
        ):
            raise ValueError(
                f"stop_lookback={self.stop_lookback} needs a ceiling (stop_ceiling > 0) and must "
                f"divide stop_every={self.stop_every} into shorter intervals (e.g. "
                f"{max(self.stop_every // 10, 1)}); or 0 for no look back."
            )
        if self.stop_ceiling and self.stop_ceiling < self.stop_threshold:
            raise ValueError(
                f"stop_ceiling={self.stop_ceiling} is below stop_threshold={self.stop_threshold}: "
                "the ceiling bounds the base from above; raise it, or 0 for none."
            )
        bad_steps = self.steps is not None and self.steps < 1
        if bad_steps or self.batch_size < 1 or self.learning_rate <= 0:
            raise ValueError(
                f"warm start needs steps >= 1, batch_size >= 1 and learning_rate > 0;"
                f" got {self.steps}, {self.batch_size}, {self.learning_rate}."
            )


def as_warm_config(warm_cfg: Any = None, task: Task | None = None) -> WarmStartConfig:
    """WarmStartConfig from None (defaults), a WarmStartConfig, or a dict / ConfigDict of
    overrides; unknown keys raise ValueError naming the valid ones. With ``task``, steps=None
    becomes the task's warm_start_steps."""
    if warm_cfg is None:
        cfg = WarmStartConfig()
    elif isinstance(warm_cfg, WarmStartConfig):
        cfg = warm_cfg
    else:
        overrides = dict(warm_cfg.to_dict() if hasattr(warm_cfg, "to_dict") else warm_cfg)
        valid = [f.name for f in dataclasses.fields(WarmStartConfig)]
        unknown = sorted(set(overrides) - set(valid))
        if unknown:
            raise ValueError(f"unknown warm-start field(s) {unknown}; valid fields: {valid}.")
        cfg = WarmStartConfig(**overrides)
    if cfg.steps is None and task is not None:
        cfg = dataclasses.replace(cfg, steps=int(task.warm_start_steps))
    return cfg


_STOP_FIELDS = tuple(f.name for f in dataclasses.fields(WarmStartConfig) if f.name[:5] == "stop_")


def _keyed_fields(model_cfg: models.ModelConfig, warm_cfg: WarmStartConfig) -> dict[str, Any]:
    """The model and warm-start fields that key the cache: every field that can change the
    trained parameters. The execution fields (attention kernel, its block, MoE dispatch, remat)
    compute the same function in another summation order, and the warm start amplifies one
    rounding step into another model, so they key it too; each only when it is not at its
    default, and the stopping rule's fields only when the rule is on, so that the keys of entries
    cached before these fields keyed anything stay as they were."""
    defaults = models.ModelConfig()
    model = {
        k: v
        for k, v in dataclasses.asdict(model_cfg).items()
        if k not in models.EXECUTION_FIELDS or v != getattr(defaults, k)
    }
    warm = dataclasses.asdict(warm_cfg)
    if not warm_cfg.stop_every:
        warm = {k: v for k, v in warm.items() if k not in _STOP_FIELDS}
    if not warm_cfg.tool_fraction:  # the keys of one-turn warm starts stay as they were
        del warm["tool_fraction"]
    if not warm_cfg.stop_ceiling:  # and those of warm starts without a ceiling
        warm.pop("stop_ceiling", None)
    if not warm_cfg.stop_lookback:  # or without a look back
        warm.pop("stop_lookback", None)
    return dict(model=model, warm=warm)


def cache_key(task: Task, model_cfg: models.ModelConfig, warm_cfg: Any = None) -> str:
    warm_cfg = as_warm_config(warm_cfg, task)
    # A task reading files keys on their content too (an edited file is another dataset); only
    # then, so the keys of the other tasks stay as they were.
    data_key = getattr(task, "data_fingerprint", lambda: "")()
    blob = json.dumps(
        dict(
            task=task.name,
            task_config=task.data_config,
            **_keyed_fields(model_cfg, warm_cfg),
            version=_CODE_VERSION,
            **({"data": data_key} if data_key else {}),
        ),
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ training


def sft_loss(model, batch: Mapping[str, jax.Array], loss_norm: str = "sequence") -> jax.Array:
    """Negative log-likelihood of the demonstration tokens (eos included).

    loss_norm "sequence" (default): per demonstration, the first token's NLL plus the mean NLL of
    its other tokens, averaged over demonstrations. "token": the mean over all tokens.

    Why "sequence": with "token", a 24-token worked demonstration outweighs a 6-token direct one
    four to one, so the short direct answers are learned last and a few-minute warm start
    reproduces them poorly. Normalising per demonstration weighs every demonstration the same. The
    first token, which chooses the response format (worked or direct), is kept out of that mean
    and counted once per demonstration, so the policy's format probabilities match the
    demonstration mix (inside the mean, a short direct answer would give its format token four
    times the weight of a worked one's).
    """
    chex.assert_rank([batch["prompt"], batch["response"], batch["mask"]], [2, 2, 2])
    chex.assert_equal_shape([batch["response"], batch["mask"]])
    out = models.response_logprobs(
        model, batch["prompt"], batch["prompt_length"], batch["response"]
    )
    mask = batch["mask"]  # [P, T]
    nll = -out["logp"] * mask  # [P, T]
    if loss_norm == "token":
        return jnp.sum(nll) / jnp.maximum(jnp.sum(mask), 1.0)
    rest = jnp.sum(nll[:, 1:], axis=-1) / jnp.maximum(jnp.sum(mask[:, 1:], axis=-1), 1.0)  # [P]
    return jnp.mean(nll[:, 0] + rest)


def make_optimizer(warm_cfg: WarmStartConfig) -> optax.GradientTransformation:
    if warm_cfg.steps is None:
        raise ValueError(
            "make_optimizer needs a step count: resolve steps=None with "
            "as_warm_config(warm_cfg, task)."
        )
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=warm_cfg.learning_rate,
        warmup_steps=min(warm_cfg.warmup_steps, warm_cfg.steps - 1),
        decay_steps=warm_cfg.steps,
        end_value=warm_cfg.learning_rate * warm_cfg.end_lr_ratio,
    )
    return optax.chain(
        optax.clip_by_global_norm(warm_cfg.grad_clip),
        optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=warm_cfg.weight_decay),
    )


def train(
    task: Task,
    model_cfg: models.ModelConfig,
    warm_cfg: Any = None,
    *,
    data_dir: str | os.PathLike | None = None,
    progress: bool = True,
    callback: Callable[[int, nnx.Module], Any] | None = None,
    callback_every: int = 0,
    progress_dir: str | None = None,
) -> tuple[nnx.Module, dict[str, Any]]:
    """Train a base policy from scratch (no cache). Returns (model, stats) with stats
    final_loss, wall_s, cpu_s, steps.

    ``progress_dir``: where the training's progress is kept (at every stopping check, or every
    PROGRESS_EVERY steps without a rule): parameters, optimizer state, the data iterator's
    position and the rule's state. A training that finds progress there resumes from it, and
    ends with the parameters the uninterrupted training would have (tests/test_warmstart.py):
    a warm start killed after an hour loses at most one interval.

    ``callback(step, model)`` runs after every ``callback_every`` steps (and after the last one),
    e.g. to evaluate a learning curve (experiments/warmstart_curve.py); its time is not counted
    in wall_s.
    """
    warm_cfg = as_warm_config(warm_cfg, task)
    if callback is not None and callback_every < 1:
        raise ValueError(
            f"callback_every={callback_every}: a callback needs callback_every >= 1 "
            "(the number of steps between calls)."
        )
    if model_cfg.vocab_size < task.tokenizer.vocab_size:
        raise ValueError(
            f"model vocab_size={model_cfg.vocab_size} < the {task.name} tokenizer's "
            f"{task.tokenizer.vocab_size}; build it with get_model_config(..., "
            f"vocab_size=task.tokenizer.vocab_size)."
        )
    t0, callback_s, c0 = time.time(), 0.0, time.process_time()
    model = models.create_model(model_cfg, seed=warm_cfg.seed)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(warm_cfg)
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, batch):
        def loss_fn(p):
            return sft_loss(nnx.merge(graphdef, p, rest), batch, warm_cfg.loss_norm)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    demo_stats = DemonstrationStats()
    tools = {}  # a tool task's episodes, played with the real tool (warmstart_demos.py)
    if warm_cfg.tool_fraction:
        tools = dict(tool_env=tool_environment(task), tool_fraction=warm_cfg.tool_fraction)
    it = demonstration_iterator(
        task, warm_cfg.batch_size, warm_cfg.seed, data_dir, demo_stats, **tools
    )
    losses = []
    stop = _StoppingRule(task, warm_cfg, data_dir, model)
    kept = None  # with a ceiling: the parameters of the latest check at or below it
    between: list[tuple[int, Any]] = []  # with a look back: (step, parameters) since then
    start, prior = 0, dict(wall_s=0.0, cpu_s=0.0)
    saved = _load_progress(progress_dir, params, opt_state) if progress_dir else None
    if saved is not None:
        start, params, opt_state, kept, between, state = saved
        it.set_state(state["iterator"])
        demo_stats.seen, demo_stats.dropped = state["seen"], state["dropped"]
        losses = [jnp.float32(x) for x in state["losses"]]
        stop.restore(state["stop"])
        prior = dict(wall_s=state["wall_s"], cpu_s=state["cpu_s"])
        print(
            f"warm start ({task.name}): resuming at step {start} from {progress_dir}",
            file=sys.stderr,
            flush=True,
        )
    bar = tqdm(
        range(start, warm_cfg.steps),
        desc=f"warm start ({task.name})",
        disable=not progress,
        file=sys.stderr,
        mininterval=1.0,
        initial=start,
        total=warm_cfg.steps,
    )
    done = start
    for i in bar:
        params, opt_state, loss = step(params, opt_state, next(it))
        losses.append(loss)
        done = i + 1
        if progress and (i % 50 == 0 or i == warm_cfg.steps - 1):
            bar.set_postfix(loss=f"{float(loss):.4f}")
        # evaluate() returns host floats, so it is done with `params` before the next step
        # donates them.
        checked = stop.due(i + 1)
        if checked:  # the steps queued so far belong to training, not to the check's time
            jax.block_until_ready(params)
        met = checked and stop.check(i + 1, nnx.merge(graphdef, params, rest))
        if checked and not progress:  # no bar (a log file): a line per check says how far it is
            print(
                f"warm start step {i + 1}/{warm_cfg.steps}: {warm_cfg.stop_metric} "
                f"{stop.checks[-1][1]:.3f} (stops at {warm_cfg.stop_threshold})",
                file=sys.stderr,
                flush=True,
            )
        if stop.keep_last_check():  # at or below the ceiling: the base if the next overshoots
            kept, between = jax.tree.map(jnp.copy, params), []
        elif warm_cfg.stop_lookback and (i + 1) % warm_cfg.stop_lookback == 0 and not checked:
            between.append((i + 1, jax.tree.map(jnp.copy, params)))
        if callback is not None and (
            (i + 1) % callback_every == 0 or i == warm_cfg.steps - 1 or met
        ):
            jax.block_until_ready(params)  # queued steps belong to training, not the callback
            tc = time.time()
            # A copy: the next step donates `params`, and the callback may keep its model.
            callback(i + 1, nnx.merge(graphdef, jax.tree.map(jnp.copy, params), rest))
            callback_s += time.time() - tc
        if met:
            break
        if (
            progress_dir
            and done < warm_cfg.steps
            and (checked if warm_cfg.stop_every else done % PROGRESS_EVERY == 0)
        ):
            state = dict(
                iterator=it.get_state(),
                seen=demo_stats.seen,
                dropped=demo_stats.dropped,
                losses=[float(x) for x in jax.device_get(losses[-50:])],
                stop=stop.state(),
                wall_s=prior["wall_s"] + time.time() - t0 - callback_s,
                cpu_s=prior["cpu_s"] + time.process_time() - c0,
            )
            _save_progress(progress_dir, done, params, opt_state, kept, between, state)
    final_loss = float(np.mean(jax.device_get(losses[-50:])))
    if not np.isfinite(final_loss):
        raise FloatingPointError(
            f"warm-start loss became {final_loss}; lower warm_cfg.learning_rate."
        )
    if demo_stats.dropped:
        print(demo_stats.summary(task), file=sys.stderr, flush=True)
    if warm_cfg.stop_every and not stop.met:
        print(stop.not_met_warning(), file=sys.stderr, flush=True)
    if stop.met and stop.overshot():
        params = kept  # the latest check at or below the ceiling (stop.record: its step)
        for step_j, params_j in reversed(between):  # a finer look back, newest first
            if stop.look_back(step_j, nnx.merge(graphdef, params_j, rest)):
                params = params_j
                break
    model = nnx.merge(graphdef, params, rest)
    return model, dict(
        final_loss=final_loss,
        wall_s=prior["wall_s"] + time.time() - t0 - callback_s,
        # CPU seconds of every thread (the callback's included): the cost on a shared machine
        cpu_s=prior["cpu_s"] + time.process_time() - c0,
        steps=done,
        demonstrations_dropped=demo_stats.dropped,
        demonstrations_seen=demo_stats.seen,
        **stop.record(),
    )


# ------------------------------------------------------------------- progress (resumable)

PROGRESS_EVERY = 100  # steps between progress saves of a warm start without a stopping rule


def _save_progress(
    folder: str, step: int, params, opt_state, kept, between: list, state: Mapping[str, Any]
) -> None:
    """The training's state at ``step`` into ``folder`` (module: train's progress_dir): every
    array's leaves in one .npz (exact bits), the rest as JSON; written aside and renamed into
    place, so a kill mid-save leaves the previous progress whole."""
    trees = {"params": params, "opt_state": opt_state}
    if kept is not None:
        trees["kept"] = kept
    trees.update({f"between{s}": p for s, p in between})
    arrays = {
        f"{name}:{j}": np.asarray(leaf)
        for name, tree in trees.items()
        for j, leaf in enumerate(jax.tree.leaves(tree))
    }
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    np.savez(os.path.join(tmp, "trees.npz"), **arrays)
    meta = dict(state, step=step, has_kept=kept is not None, between=[s for s, _ in between])
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump(meta, f, default=str)
    old = f"{folder}.old-{os.getpid()}"
    if os.path.exists(folder):
        os.rename(folder, old)
    os.rename(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def _load_progress(folder: str, params, opt_state):
    """(step, params, opt_state, kept, between, state) saved by _save_progress, or None when
    ``folder`` holds no progress. ``params`` and ``opt_state`` give the trees' structure."""
    if not os.path.exists(os.path.join(folder, "state.json")):
        return None
    with open(os.path.join(folder, "state.json")) as f:
        state = json.load(f)
    with np.load(os.path.join(folder, "trees.npz")) as z:

        def tree(name, like):
            leaves, treedef = jax.tree.flatten(like)
            return jax.tree.unflatten(
                treedef, [jnp.asarray(z[f"{name}:{j}"]) for j in range(len(leaves))]
            )

        kept = tree("kept", params) if state["has_kept"] else None
        between = [(s, tree(f"between{s}", params)) for s in state["between"]]
        return (
            state["step"],
            tree("params", params),
            tree("opt_state", opt_state),
            kept,
            between,
            state,
        )


class _StoppingRule:
    """WarmStartConfig's stopping rule: every stop_every steps, stop_metric on the last
    stop_problems held-out problems; met once it is >= stop_threshold at stop_patience checks in
    a row. record() is what meta.json keeps: every check (step, value) and whether it was met."""

    def __init__(self, task: Task, warm_cfg: WarmStartConfig, data_dir, model: nnx.Module):
        self.task, self.cfg, self.data_dir = task, warm_cfg, data_dir
        self.checks: list[tuple[int, float]] = []
        self.met, self.check_s = False, 0.0
        self.kept_step: int | None = None  # with a ceiling: the latest check at or below it
        self.lookback_checks: list[tuple[int, float]] = []  # with a look back: newest first
        # every check's headline metrics (e.g. greedy and sampled accuracy from the same
        # evaluation, at no extra cost): the rule reads one, the pilot's band reads both
        self.last_metrics: dict[str, float] = {}
        self.check_metrics: list[tuple[int, dict[str, float]]] = []
        self.lookback_metrics: list[tuple[int, dict[str, float]]] = []
        if warm_cfg.stop_every:  # a metric the evaluation lacks fails now, not after training
            self._evaluate(model, num_problems=1)

    def _evaluate(self, model: nnx.Module, num_problems: int) -> float:
        metrics = evaluation.evaluate(
            model,
            self.task,
            split="test",
            num_problems=num_problems,
            first=-self.cfg.stop_problems,
            pass_k=self.cfg.stop_samples,
            data_dir=self.data_dir,
        )
        if self.cfg.stop_metric not in metrics:
            raise ValueError(
                f"warm start stop_metric={self.cfg.stop_metric!r} is not one of the "
                f"{self.task.name} evaluation's metrics {sorted(metrics)}; set "
                "init.warmstart.stop_metric to one of them (or stop_every=0: no stopping rule)."
            )
        self.last_metrics = {
            k: float(v) for k, v in metrics.items() if "/" not in k and np.ndim(v) == 0
        }
        return float(metrics[self.cfg.stop_metric])

    def state(self) -> dict[str, Any]:
        """What a resumed training needs of the rule (JSON): its checks and the kept step."""
        return dict(
            checks=self.checks,
            check_metrics=self.check_metrics,
            kept_step=self.kept_step,
            check_s=self.check_s,
        )

    def restore(self, state: Mapping[str, Any]) -> None:
        self.checks = [tuple(c) for c in state["checks"]]
        self.check_metrics = [tuple(c) for c in state["check_metrics"]]
        self.kept_step, self.check_s = state["kept_step"], state["check_s"]

    def due(self, step: int) -> bool:
        return bool(self.cfg.stop_every) and step % self.cfg.stop_every == 0

    def check(self, step: int, model: nnx.Module) -> bool:
        t0 = time.time()
        value = self._evaluate(model, self.cfg.stop_problems)
        self.checks.append((step, value))
        self.check_metrics.append((step, self.last_metrics))
        self.check_s += time.time() - t0
        recent = [v for _, v in self.checks[-self.cfg.stop_patience :]]
        self.met = len(recent) == self.cfg.stop_patience and min(recent) >= self.cfg.stop_threshold
        return self.met  # NaN (no sample in the format) compares False: not met

    def keep_last_check(self) -> bool:
        """Whether the check just made is at or below the ceiling (its parameters are kept)."""
        if not self.cfg.stop_ceiling or not self.checks or self.checks[-1][0] == self.kept_step:
            return False
        step, value = self.checks[-1]
        if value <= self.cfg.stop_ceiling:
            self.kept_step = step
            return True
        return False

    def overshot(self) -> bool:
        """The rule was met above the ceiling and an earlier check is kept instead."""
        return self.kept_step is not None and self.kept_step != self.checks[-1][0]

    def look_back(self, step: int, model: nnx.Module) -> bool:
        """After an overshoot: whether the parameters kept at ``step`` (between the kept check
        and the last one) are at or below the ceiling; if so they become the kept step."""
        t0 = time.time()
        value = self._evaluate(model, self.cfg.stop_problems)
        self.lookback_checks.append((step, value))
        self.lookback_metrics.append((step, self.last_metrics))
        self.check_s += time.time() - t0
        if value <= self.cfg.stop_ceiling:
            self.kept_step = step
            return True
        return False

    def not_met_warning(self) -> str:
        last = ", ".join(f"{v:.3f} at {s}" for s, v in self.checks[-3:])
        return (
            f"warm start ({self.task.name}): the stopping rule ({self.cfg.stop_metric} >= "
            f"{self.cfg.stop_threshold} at {self.cfg.stop_patience} checks in a row) was not met "
            f"within the cap of {self.cfg.steps} steps (last checks: {last}); the base is kept, "
            "and its meta.json says stop_met=false. Raise init.warmstart.steps to train longer."
        )

    def record(self) -> dict[str, Any]:
        if not self.cfg.stop_every:
            return {}
        out = dict(
            stop_met=self.met,
            stop_checks=self.checks,
            stop_check_metrics=self.check_metrics,
            stop_check_s=self.check_s,
        )
        if self.cfg.stop_ceiling:  # None: the last step's parameters are the base
            out["stop_kept_step"] = self.kept_step if self.overshot() else None
        if self.cfg.stop_lookback:
            out["stop_lookback_checks"] = self.lookback_checks
            out["stop_lookback_metrics"] = self.lookback_metrics
        return out


def default_cache_dir() -> str:
    """$GSPO_JAX_CACHE, else ~/.cache/gspo_jax."""
    return os.environ.get(
        "GSPO_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "gspo_jax")
    )


def cache_path(
    task: Task,
    model_cfg: models.ModelConfig,
    warm_cfg: Any = None,
    cache_dir: str | os.PathLike | None = None,
) -> str:
    """Where the base policy for (task, model_cfg, warm_cfg) is cached:
    ``cache_dir/warmstart/<task>_<hash>`` (a complete entry has a meta.json)."""
    key = cache_key(task, model_cfg, warm_cfg)
    return os.path.abspath(
        os.path.join(os.fspath(cache_dir or default_cache_dir()), "warmstart", f"{task.name}_{key}")
    )


def _restore(path: str, model_cfg: models.ModelConfig, mesh) -> nnx.Module:
    """The cached parameters as a model: on the default device, or (mesh given) straight into
    the model's mesh shardings, so each process of a multi-host run reads only its shards."""
    abstract = nnx.eval_shape(lambda: models.create_model(model_cfg))
    graphdef, abs_state = nnx.split(abstract)
    target = abs_state
    if mesh is not None:
        target = sharding.with_shardings(abs_state, sharding.state_shardings(abs_state, mesh))
    restored = ocp.StandardCheckpointer().restore(
        os.path.join(path, "params"), nnx.to_pure_dict(target)
    )
    nnx.replace_by_pure_dict(abs_state, restored)
    return nnx.merge(graphdef, abs_state)


def _why_unreadable(e: BaseException) -> str:
    """An exception as one short line (orbax / tensorstore messages span many lines)."""
    lines = str(e).strip().splitlines()
    first = (lines[0] if lines else "").split(" See full TensorStore details")[0]
    text = f"{type(e).__name__}: {first}"
    return text if len(text) <= 200 else text[:197] + "..."


def _load_entry(path: str, model_cfg: models.ModelConfig, mesh) -> tuple[nnx.Module | None, str]:
    """(model, "") for a complete entry, (None, "") for no entry, (None, why) for an entry that
    cannot be loaded: files missing, truncated or otherwise unreadable."""
    if not os.path.exists(path):
        return None, ""
    if not os.path.exists(os.path.join(path, "meta.json")):
        return None, "no meta.json: an interrupted or partly deleted entry"
    try:
        return _restore(path, model_cfg, mesh), ""
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many types for bad files
        return None, _why_unreadable(e)


def _move_aside(path: str) -> str:
    """Renames a broken entry to ``<entry>.corrupt-<time>`` (kept for inspection, not deleted)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = f"{path}.corrupt-{stamp}", 1
    while os.path.exists(aside):
        aside, n = f"{path}.corrupt-{stamp}-{n}", n + 1
    os.rename(path, aside)
    return aside


def _write_entry(path: str, model: nnx.Module, meta: Mapping[str, Any]) -> None:
    """Saves ``model`` and ``meta`` as the entry ``path``: written into a private folder next to it
    and renamed into place, so a reader sees no entry or a complete one, never a half-written one
    (a crash mid-save leaves only the private folder). If another process's entry got there
    first (a filesystem without locks), that one is kept and this one dropped."""
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"
    try:
        os.makedirs(tmp, exist_ok=True)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(
            os.path.join(tmp, "params"), nnx.to_pure_dict(nnx.state(model)), force=True
        )
        checkpointer.wait_until_finished()
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2, default=str)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.exists(os.path.join(path, "meta.json")):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # the winner's entry is the same base
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # only this process's own unfinished files
        raise


def _load_only_error(path: str, why: str) -> FileNotFoundError:
    """The error of a multi-host run (which only loads) for a missing or broken entry."""
    if why:
        what = f"the cached warm start at {path} cannot be loaded ({why})"
        does = "it moves the broken entry aside, then trains and caches the base policy again"
    else:
        what = f"the warm start is not cached at {path}"
        does = "it trains and caches the base policy"
    return FileNotFoundError(
        f"multi-host run: {what}. Run the same command once on one host in a single process "
        "(python -m gspo_jax.main --config ... --workdir ... --prepare_only, without --multihost "
        f"/ --coordinator_address): {does}. Put the cache on a filesystem every host sees, then "
        "launch the multi-host run."
    )


def get_base_model(
    task: Task,
    model_cfg: models.ModelConfig,
    warm_cfg: Any = None,
    cache_dir: str | os.PathLike | None = None,
    *,
    data_dir: str | os.PathLike | None = None,
    progress: bool = True,
    mesh: jax.sharding.Mesh | None = None,
) -> nnx.Module:
    """The warm-started base policy for (task, model_cfg, warm_cfg): loaded from
    ``cache_dir/warmstart/<task>_<hash>`` when present, else trained (progress bar) and saved.

    cache_dir defaults to $GSPO_JAX_CACHE or ~/.cache/gspo_jax; data_dir is where the task's
    TFDS dataset lives (see data.py). With ``mesh`` the parameters come back sharded over it by
    the model's logical axis rules.

    Processes started together on a cold cache train once: the first trains under the entry's
    file lock, the others print what they wait for and load its result. An entry that cannot be
    loaded is reported in one line, moved aside to ``<entry>.corrupt-<time>`` and trained again.
    A multi-process run (jax.process_count() > 1) only loads: it raises FileNotFoundError naming
    --prepare_only if the entry is missing or broken, rather than train the same base on every
    host at once.
    """
    warm_cfg = as_warm_config(warm_cfg, task)
    path = cache_path(task, model_cfg, warm_cfg, cache_dir)
    model, why = _load_entry(path, model_cfg, mesh)
    if model is not None:
        return model
    if jax.process_count() > 1:
        raise _load_only_error(path, why)

    with filelock.locked(path, f"the {task.name} warm start at {path}"):
        # The process this one waited for may have trained (or repaired) it meanwhile.
        model, why = _load_entry(path, model_cfg, mesh)
        if model is not None:
            return model
        if why:
            aside = _move_aside(path)
            print(
                f"warm start cache entry {path} is unreadable ({why}); moved it to {aside} "
                "and training it again",
                file=sys.stderr,
                flush=True,
            )
        done_so_far = f"{path}.progress"  # an interrupted training's, resumed (train)
        model, stats = train(
            task,
            model_cfg,
            warm_cfg,
            data_dir=data_dir,
            progress=progress,
            progress_dir=done_so_far,
        )
        meta = dict(
            task=task.name,
            task_config=task.config,
            model=dataclasses.asdict(model_cfg),
            warm=dataclasses.asdict(warm_cfg),
            **stats,
        )
        _write_entry(path, model, meta)
        shutil.rmtree(done_so_far, ignore_errors=True)
    if progress:
        print(
            f"warm start ({task.name}): {stats['wall_s']:.0f} s, final loss "
            f"{stats['final_loss']:.4f}; cached at {path}",
            file=sys.stderr,
        )
    if mesh is not None:
        graphdef, state = nnx.split(model)
        model = nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))
    return model
