"""Held-out evaluation of a policy on a task, batched through the sampler.

    metrics = evaluation.evaluate(model, task, split="test", num_problems=256, pass_k=8)

Returns floats:
    greedy_accuracy           fraction of problems solved with greedy decoding
    greedy_reward             mean task reward of the greedy responses
    greedy_format             fraction of well-formed, terminated greedy responses
    mean_response_length      mean greedy response length in tokens (eos included)
    sample_accuracy           fraction of the temperature-`temperature` samples that are correct
    pass@k                    fraction of problems with at least one correct sample among k
    sample_mean_response_length
    and, for tasks with several response formats (arith: worked vs direct),
    <fmt>_fraction            share of samples in that format (and greedy_<fmt>_fraction)
    <fmt>_accuracy            accuracy of the samples in that format (NaN if there are none)
    greedy_<key>              mean of each extra score part (e.g. greedy_partial for countdown)
    num_problems

Why samples for the per-format accuracy: greedy decoding always picks one format for every
problem, while the temperature-1 samples hold both, and their per-format accuracy is exactly what
RL can exploit by moving probability between formats.

Dimension legend: P prompts per batch, k = pass_k samples per prompt, T = max_new_tokens.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from gspo_jax import data, rollout
from gspo_jax.tasks.task import Task


def _formats(task: Task, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Format name of each response row."""
    return np.array(
        [
            task.response_format(task.split_response(t, m)[0])
            for t, m in zip(tokens, mask, strict=True)
        ]
    )


def process_local_copy(model):
    """The model with whole parameters on this process's first device.

    evaluate scores the sampler's outputs on the host, which needs whole arrays in this process.
    A model sharded over a multi-host mesh is first replicated (one all-gather) and each process
    keeps its own copy: every host evaluates the same numbers, fine for the models that run on
    CPUs here; a pod-scale model would want an evaluation loop over sharded outputs instead.
    A model whose arrays this process already holds whole is returned unchanged.

    Preconditions (the trainer's models meet them): every array this process does not hold whole
    has a NamedSharding over one mesh, and the caller is outside that mesh's context (the copy
    lives on one local device).
    """
    graphdef, state = nnx.split(model)
    leaves = jax.tree.leaves(state)
    if all(getattr(x, "is_fully_addressable", True) for x in leaves):
        return model
    replicated = jax.tree.map(lambda x: NamedSharding(x.sharding.mesh, PartitionSpec()), state)
    state = jax.jit(lambda s: s, out_shardings=replicated)(state)
    local = jax.local_devices()[0]
    state = jax.tree.map(lambda x: jax.device_put(x.addressable_data(0), local), state)
    return nnx.merge(graphdef, state)


def evaluate(
    model,
    task: Task,
    split: str = "test",
    num_problems: int | None = 256,
    pass_k: int = 8,
    max_new_tokens: int | None = None,
    *,
    batch_size: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    first: int = 0,
) -> dict[str, float]:
    """Greedy accuracy, pass@k (temperature sampling), response lengths and per-format accuracy
    on ``num_problems`` problems of ``split`` (None = all of them) from problem ``first``
    (negative: counted from the end; the warm start's stopping rule checks the last ones).

    Works in multi-host runs: every process evaluates the same problems on its own copy of the
    model (see process_local_copy) and returns the same metrics."""
    if pass_k < 1:
        raise ValueError(f"pass_k={pass_k} must be >= 1.")
    model = process_local_copy(model)
    T = max_new_tokens or task.max_response_len
    key = jax.random.key(seed)
    greedy, samples, g_fmt, s_fmt = [], [], [], []
    for i, (batch, n) in enumerate(
        data.make_eval_batches(
            task,
            split,
            batch_size=batch_size,
            num_problems=num_problems,
            data_dir=data_dir,
            first=first,
        )
    ):
        common = dict(max_new_tokens=T, eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id)
        out = rollout.generate(
            model,
            batch["prompt"],
            batch["prompt_length"],
            num_samples=1,
            rng=jax.random.fold_in(key, 2 * i),
            temperature=0.0,
            **common,
        )
        tokens, mask = np.asarray(out.tokens)[:n], np.asarray(out.mask)[:n]  # [n, T]
        scores = task.score({k: v[:n] for k, v in batch.items()}, tokens, mask, 1)
        scores["length"] = mask.sum(-1)
        greedy.append(scores)
        out = rollout.generate(
            model,
            batch["prompt"],
            batch["prompt_length"],
            num_samples=pass_k,
            rng=jax.random.fold_in(key, 2 * i + 1),
            temperature=temperature,
            **common,
        )
        s_tokens = np.asarray(out.tokens)[: n * pass_k]  # [n * k, T]
        s_mask = np.asarray(out.mask)[: n * pass_k]
        s_scores = task.score({k: v[:n] for k, v in batch.items()}, s_tokens, s_mask, pass_k)
        s_scores["length"] = s_mask.sum(-1)
        samples.append(s_scores)
        if task.formats:
            g_fmt.append(_formats(task, tokens, mask))
            s_fmt.append(_formats(task, s_tokens, s_mask))
    g = {k: np.concatenate([s[k] for s in greedy]) for k in greedy[0]}
    s = {k: np.concatenate([x[k] for x in samples]) for k in samples[0]}
    num = len(g["correct"])
    metrics = {
        "greedy_accuracy": float(g["correct"].mean()),
        "greedy_reward": float(g["reward"].mean()),
        "greedy_format": float(g["format"].mean()),
        "mean_response_length": float(g["length"].mean()),
        "sample_accuracy": float(s["correct"].mean()),
        f"pass@{pass_k}": float(s["correct"].reshape(num, pass_k).max(-1).mean()),
        "sample_mean_response_length": float(s["length"].mean()),
        "num_problems": float(num),
    }
    for k in task.score_keys:
        if k not in ("reward", "correct", "format"):
            metrics[f"greedy_{k}"] = float(g[k].mean())
    if task.formats:
        gf, sf = np.concatenate(g_fmt), np.concatenate(s_fmt)
        for fmt in task.formats:
            sel = sf == fmt
            metrics[f"{fmt}_fraction"] = float(sel.mean())
            metrics[f"greedy_{fmt}_fraction"] = float((gf == fmt).mean())
            metrics[f"{fmt}_accuracy"] = (
                float(s["correct"][sel].mean()) if sel.any() else float("nan")
            )
    return metrics
