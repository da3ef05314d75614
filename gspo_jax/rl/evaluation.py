"""Held-out evaluation of a policy on a task, batched through the sampler.

    metrics = evaluation.evaluate(model, task, split="test", num_problems=256, pass_k=8)

Returns floats:
    greedy_accuracy           fraction of problems solved with greedy decoding
    greedy_reward             mean task reward of the greedy responses
    greedy_format             fraction of well-formed, terminated greedy responses
    mean_response_length      mean greedy response length in tokens (eos included)
    sample_accuracy           fraction of the temperature-`temperature` samples that are correct
    avg@k                     the same figure under the papers' name (mean correctness of k
                              samples per problem)
    pass@k                    fraction of problems with at least one correct sample among k (the
                              unbiased estimator with n = k samples)
    sample_mean_response_length
    greedy_accuracy/<level>, sample_accuracy/<level>   the same per difficulty (task.difficulty,
                              spaces as "_": "greedy_accuracy/07_terms"), for a task whose
                              problems have several levels: which problems RL is solving
    and, for tasks with several response formats (arith: worked vs direct),
    <fmt>_fraction            share of samples in that format (and greedy_<fmt>_fraction)
    <fmt>_accuracy            accuracy of the samples in that format (NaN if there are none)
    greedy_<key>              mean of each extra score part (e.g. greedy_partial for countdown)
    num_problems

Tool use (evaluate_tools, a run with config.env): greedy episodes of the same problems in the
environment as configured (the tool offered), one per problem, through the multi-turn engine:
    tool_accuracy             fraction solved with the tool offered
    tool_reward               mean environment reward
    tool_calls_per_episode    mean tool calls per episode; failed_calls_per_episode those whose
                              response was an error; turns_per_episode the policy's turns
    tool_call_rate            share of episodes with at least one call
    tool_accuracy_with_call, tool_accuracy_without_call   accuracy of the episodes that called
                              the tool and of those that answered directly (NaN if none)
    tool_call_rate/<level>, tool_accuracy/<level>, tool_accuracy_with_call/<level>   the same per
                              difficulty (task.difficulty, spaces as "_":
                              "tool_call_rate/4_digits"), for a task with several levels: whether a
                              policy calls the tool where it helps
    tool_sample_*             (samples > 0) the same figures over ``samples`` episodes per problem
                              at ``temperature``: the call probability that greedy decoding rounds
                              to 0 or 1 per problem, so a shift RL makes shows before greedy flips
"Without tools" is evaluate's greedy_accuracy on the same problems: the task's one turn, no tool
offered (its prompt has no tools header; with PlainChat the prompt is the same).

The figures are computed by gspo_jax/eval_figures.py, as the evaluation command's
(python -m gspo_jax.evaluate, docs/evaluation.md: any checkpoint, pass@k for k < n, intervals);
sample_batch is the batch both sample with.

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

from gspo_jax import data, eval_figures, rollout, sharding
from gspo_jax.rl import episodes
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


def batch_keys(seed: int, i: int) -> tuple[jax.Array, jax.Array]:
    """The keys of batch i's greedy pass and of its samples (one key per batch and pass: the
    samples of a problem depend on its batch and row, so a resumed or repeated evaluation with
    the same batch size draws the same ones)."""
    key = jax.random.key(seed)
    return jax.random.fold_in(key, 2 * i), jax.random.fold_in(key, 2 * i + 1)


def sample_batch(
    model,
    task: Task,
    batch: dict[str, np.ndarray],
    n: int,
    i: int,
    *,
    pass_k: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    engine: str = "static",
    mesh: jax.sharding.Mesh | None = None,
    **engine_options,
) -> dict[str, dict[str, np.ndarray]]:
    """The greedy response and pass_k samples of the first n problems of batch i, scored.

    Returns {"greedy": score parts [n] plus "length" and "format_name", "samples": the same
    [n * pass_k], group-contiguous}; "format_name" only for tasks with several formats.
    With ``mesh`` the prompts are placed with their rows over the mesh's batch axes (the batch
    size must divide over them): the engine then samples data-parallel over problems, as the
    trainer's rollout does. Call it inside ``sharding.use_mesh(mesh)`` with the model on it.
    """
    prompts, lengths = batch["prompt"], batch["prompt_length"]  # [P, Lp], [P]
    if mesh is not None:
        prompts = jax.device_put(prompts, sharding.rows_sharding(mesh, 2))
        lengths = jax.device_put(lengths, sharding.rows_sharding(mesh, 1))
    records = {k: v[:n] for k, v in batch.items()}
    out = {}
    for name, key, k, temp in zip(
        ("greedy", "samples"), batch_keys(seed, i), (1, pass_k), (0.0, temperature), strict=True
    ):
        sampled = rollout.generate(
            model,
            prompts,
            lengths,
            num_samples=k,
            rng=key,
            temperature=temp,
            max_new_tokens=max_new_tokens,
            eos_id=task.tokenizer.eos_id,
            pad_id=task.tokenizer.pad_id,
            engine=engine,
            **engine_options,
        )
        tokens = np.asarray(sampled.tokens)[: n * k]  # [n * k, T]
        mask = np.asarray(sampled.mask)[: n * k]
        scores = task.score(records, tokens, mask, k)
        scores["length"] = mask.sum(-1)
        if task.formats:
            scores["format_name"] = _formats(task, tokens, mask)
        out[name] = scores
    return out


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
    engine: str = "static",
) -> dict[str, float]:
    """Greedy accuracy, pass@k (temperature sampling), response lengths and per-format accuracy
    on ``num_problems`` problems of ``split`` (None = all of them) from problem ``first``
    (negative: counted from the end; the warm start's stopping rule checks the last ones).

    The figures (greedy_accuracy, sample_accuracy = avg@k, pass@k, the lengths) are
    eval_figures' (the gspo_jax.evaluate command's), on the same samples the command draws with
    the same batch size and seed.

    Works in multi-host runs: every process evaluates the same problems on its own copy of the
    model (see process_local_copy) and returns the same metrics."""
    if pass_k < 1:
        raise ValueError(f"pass_k={pass_k} must be >= 1.")
    model = process_local_copy(model)
    T = max_new_tokens or task.max_response_len
    parts, levels = [], []  # levels [num]: each problem's task.difficulty
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
        parts.append(
            sample_batch(
                model,
                task,
                batch,
                n,
                i,
                pass_k=pass_k,
                max_new_tokens=T,
                temperature=temperature,
                seed=seed,
                engine=engine,
            )
        )
        levels += [task.difficulty(task.record_from_batch(batch, p)) for p in range(n)]
    g = {k: np.concatenate([p["greedy"][k] for p in parts]) for k in parts[0]["greedy"]}
    s = {k: np.concatenate([p["samples"][k] for p in parts]) for k in parts[0]["samples"]}
    num = len(g["correct"])
    values = eval_figures.per_problem(
        g["correct"],
        s["correct"].reshape(num, pass_k),
        ks=(pass_k,),
        greedy_length=g["length"],
        sample_length=s["length"].reshape(num, pass_k),
    )
    figures = eval_figures.aggregate(values)
    metrics = {
        "greedy_accuracy": figures["greedy_accuracy"],
        "greedy_reward": float(g["reward"].mean()),
        "greedy_format": float(g["format"].mean()),
        "mean_response_length": figures["greedy_length_mean"],
        "sample_accuracy": figures[f"avg@{pass_k}"],
        f"avg@{pass_k}": figures[f"avg@{pass_k}"],
        f"pass@{pass_k}": figures[f"pass@{pass_k}"],
        "sample_mean_response_length": figures["length_mean"],
        "num_problems": float(num),
    }
    for k in task.score_keys:
        if k not in ("reward", "correct", "format"):
            metrics[f"greedy_{k}"] = float(g[k].mean())
    levels = np.asarray(levels)
    if len(set(levels.tolist()) - {""}) > 1:  # where accuracy moves: by difficulty
        per_sample = s["correct"].reshape(num, pass_k).mean(-1)
        for level in sorted(set(levels.tolist())):
            sel, name = levels == level, level.replace(" ", "_")
            metrics[f"greedy_accuracy/{name}"] = float(g["correct"][sel].mean())
            metrics[f"sample_accuracy/{name}"] = float(per_sample[sel].mean())
    if task.formats:
        gf, sf = g["format_name"], s["format_name"]
        for fmt in task.formats:
            sel = sf == fmt
            metrics[f"{fmt}_fraction"] = float(sel.mean())
            metrics[f"greedy_{fmt}_fraction"] = float((gf == fmt).mean())
            metrics[f"{fmt}_accuracy"] = (
                float(s["correct"][sel].mean()) if sel.any() else float("nan")
            )
    return metrics


def evaluate_tools(
    model,
    env,
    split: str = "test",
    num_problems: int | None = 256,
    max_new_tokens: int | None = None,
    *,
    batch_size: int = 64,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    engine: str = "static",
    with_episodes: bool = False,
    samples: int = 0,
    temperature: float = 1.0,
) -> dict:
    """Greedy episodes of ``num_problems`` problems of ``split`` in the tool environment ``env``
    (an envs.TaskToolEnvironment: its task gives the problems), one per problem: the tool-use
    figures of the module docstring, as floats; with ``samples`` > 0 also that many episodes per
    problem at ``temperature`` (tool_sample_*: the policy's call probability, which greedy
    decoding rounds to 0 or 1 per problem); with ``with_episodes`` also "episodes", a list per
    greedy episode of {tool_calls, failed_calls, turns, correct, reward, end, level}."""
    model = process_local_copy(model)
    task = env.task
    T = max_new_tokens or task.max_response_len
    rows, sampled = [], []
    for i, (batch, n) in enumerate(
        data.make_eval_batches(
            task, split, batch_size=batch_size, num_problems=num_problems, data_dir=data_dir
        )
    ):
        records = [task.record_from_batch(batch, p) for p in range(n)]
        levels = [task.difficulty(r) for r in records]
        greedy_key, sample_key = batch_keys(seed, i)
        for out, k, key, temp in (
            (rows, 1, greedy_key, 0.0),
            (sampled, samples, sample_key, temperature),
        ):
            if k == 0:
                continue
            played = episodes.generate_episodes()(
                model,
                env,
                records,
                engine=engine,
                num_samples=k,
                max_new_tokens=T,
                rng=key,
                temperature=temp,
                eos_id=task.tokenizer.eos_id,
                pad_id=task.tokenizer.pad_id,
            )
            scores = episodes.episode_scores(played)
            for b in range(n * k):  # rows problem-major: problem b // k
                row = {name: float(v[b]) for name, v in scores.items()}
                info = played.infos[b]
                out.append({**row, "end": info.get("end", ""), "level": levels[b // k]})
    out = _tool_figures(rows, "tool_")
    if sampled:
        out.update(_tool_figures(sampled, "tool_sample_"))
    out["tool_num_problems"] = float(len(rows))
    if with_episodes:
        out["episodes"] = rows
    return out


def _tool_figures(rows: list[dict], prefix: str) -> dict[str, float]:
    """The tool-use figures of ``rows`` (one dict per episode), keys under ``prefix``: accuracy,
    reward, counts per episode, call rate, accuracy with and without a call, and per difficulty
    level (when there are several) the call rate, accuracy and accuracy with a call."""
    col = {k: np.asarray([r[k] for r in rows]) for k in ("correct", "reward", "tool_calls")}
    called = col["tool_calls"] > 0

    def mean_of(x, sel):
        return float(x[sel].mean()) if sel.any() else float("nan")

    name = f"{prefix}accuracy"
    out = {
        name: float(col["correct"].mean()),
        f"{prefix}reward": float(col["reward"].mean()),
        **{
            # the greedy counts keep their first names (turns_per_episode, ...)
            f"{'' if prefix == 'tool_' else prefix}{k}_per_episode": float(
                np.mean([r[k] for r in rows])
            )
            for k in episodes.EPISODE_COUNTS
        },
        f"{prefix}call_rate": float(called.mean()),
        f"{name}_with_call": mean_of(col["correct"], called),
        f"{name}_without_call": mean_of(col["correct"], ~called),
    }
    levels = np.asarray([r["level"] for r in rows])
    if len(set(levels)) > 1:
        for level in sorted(set(levels)):
            at, slug = levels == level, level.replace(" ", "_")
            out[f"{prefix}call_rate/{slug}"] = float(called[at].mean())
            out[f"{name}/{slug}"] = float(col["correct"][at].mean())
            out[f"{name}_with_call/{slug}"] = mean_of(col["correct"], at & called)
    return out
