r"""Evaluate a checkpoint the way papers report it: greedy accuracy, avg@n and unbiased pass@k
with bootstrap intervals over problems, per difficulty, and a paired comparison of two.

    python -m gspo_jax.evaluate --checkpoint runs/arith --samples 16 --k 1,4,16 --out ev.json
    python -m gspo_jax.evaluate --checkpoint runs/arith --step 40 ...     # a given step
    python -m gspo_jax.evaluate --checkpoint /ckpt/Qwen3-0.6B --task gsm8k \
        --task_args data_path=/data/gsm8k --max_new_tokens 512 ...         # an HF folder
    python -m gspo_jax.evaluate --config configs/arith.py --compare runs/arith --out ev.json

What it evaluates (--checkpoint, else the base of --config): a run directory (config.json and
checkpoints/; the newest checkpoint or --step; the run's task and knobs unless --task says
otherwise), a Hugging Face checkpoint folder (dense or MoE; its tokenizer and chat template when
the folder has them; --task needed), or with --config alone the policy that config's runs start
from (its warm start, trained and cached first if need be). --compare (and --compare_step) names
a second one, evaluated on the same problems with the same samples' keys; the table and the JSON
then add the difference (second minus first) with its paired interval.

Figures (eval_figures.py, the same code as the trainer's in-run evaluation): greedy_accuracy,
avg@n, pass@k for each --k (k <= --samples), the sampled responses' length_mean and length_std
and greedy_length_mean, each with a percentile-bootstrap interval over problems; per-difficulty
rows where the task has levels (arith: the digits of the longer operand).

Output: a progress bar while it samples, the table on the terminal, and with --out FILE.json the
JSON (``greedy_accuracy``, ``avg@16``, ``pass@1`` ... at the top level for the first checkpoint,
``intervals``, ``by_difficulty``, ``settings``; ``compare`` and ``difference`` for the second),
FILE.png (pass@k against k, one line per checkpoint) and FILE.<label>.problems.json per
checkpoint: the per-problem results, rewritten atomically after every batch. Run the same
command again after a stop and it continues from them without redoing a problem; a side file
written with other settings is an error naming it.

Execution: data-parallel over problems on a mesh over every device (--mesh, as config.mesh),
through the rollout seam (--engine static | continuous); a batch of --batch_size problems is one
rollout call, its rows split over the mesh's batch axes. One process (a pod slice's hosts would
each evaluate alone).

Bad input (a path that is neither a run directory nor an HF folder, a missing step, an unknown
task or knob, a split the task does not have, a k above --samples, a batch that does not divide
over the mesh, a side file of other settings) is one ``error: ...`` line, exit code 2, before
any model is loaded.

Dimension legend: P problems, n = --samples per problem, B = --batch_size problems per batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from typing import Any

from absl import app, flags, logging

from gspo_jax import config as config_lib
from gspo_jax import eval_figures
from gspo_jax.errors import CheckpointError, ConfigError

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A run directory or a Hugging Face checkpoint folder."
)
_STEP = flags.DEFINE_integer("step", None, "The run's checkpoint step (default: the newest).")
_CONFIG = flags.DEFINE_string(
    "config", None, "Without --checkpoint: evaluate the base policy of this config (path[:args])."
)
_COMPARE = flags.DEFINE_string(
    "compare", None, "A second run directory or HF folder, compared on the same problems."
)
_COMPARE_STEP = flags.DEFINE_integer("compare_step", None, "--compare's step (default: newest).")
_TASK = flags.DEFINE_string("task", None, "Task name (default: the run's or the config's task).")
_TASK_ARGS = flags.DEFINE_string(
    "task_args", "", "Task knobs as key=value,... (e.g. max_digits=3 or data_path=/data/gsm8k)."
)
_SPLIT = flags.DEFINE_string("split", "test", "The split to evaluate.")
_NUM_PROBLEMS = flags.DEFINE_integer("num_problems", 0, "Problems from the first (0 = all).")
_SAMPLES = flags.DEFINE_integer("samples", 16, "n: sampled responses per problem.")
_K = flags.DEFINE_string("k", "", "pass@k for these k <= n, e.g. 1,4,16 (default 1 and n).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_MAX_NEW_TOKENS = flags.DEFINE_integer(
    "max_new_tokens", 0, "Response length limit (0 = the task's max_response_len)."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Problems per rollout call.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_ENGINE = flags.DEFINE_enum("engine", "static", ["static", "continuous"], "Rollout engine.")
_MESH = flags.DEFINE_string("mesh", "data=-1", "Mesh axes as axis=size,... (as config.mesh).")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "Where the task's dataset is (or goes).")
_CACHE_DIR = flags.DEFINE_string("cache_dir", "", "The warm-start cache (--config's base).")
_OUT = flags.DEFINE_string("out", None, "The JSON file to write (and resume from).")
_RESAMPLES = flags.DEFINE_integer("resamples", eval_figures.DEFAULT_RESAMPLES, "Bootstrap draws.")
_LEVEL = flags.DEFINE_float("level", eval_figures.DEFAULT_LEVEL, "The intervals' coverage.")


@dataclasses.dataclass(frozen=True)
class Source:
    """One policy to evaluate: kind "run" (a run directory and its step), "hf" (a checkpoint
    folder) or "config" (a config's base policy), and its label in the table and files."""

    kind: str
    path: str
    step: int | None = None
    config: Any = None
    label: str = ""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that decides which problems are evaluated and which samples are drawn: a side
    file is resumed only under the same settings."""

    task: str
    task_config: dict
    split: str
    num_problems: int
    samples: int
    temperature: float
    max_new_tokens: int
    batch_size: int
    seed: int
    engine: str


# ------------------------------------------------------------------------- checks (no model)


def parse_ks(text: str, n: int) -> tuple[int, ...]:
    """The k of pass@k, each in [1, n]; default (1, n)."""
    if n < 1:
        raise ConfigError(f"--samples={n} must be >= 1 (samples per problem)")
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()})) or tuple(sorted({1, n}))
    except ValueError:
        raise ConfigError(
            f"--k={text!r} must be integers separated by commas, e.g. 1,4,16"
        ) from None
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ConfigError(
            f"--k={text}: pass@k needs 1 <= k <= n = --samples={n}, but k={bad} is not; raise "
            "--samples or lower k"
        )
    return ks


def parse_knobs(text: str) -> dict[str, Any]:
    """key=value,... with values read as JSON where they parse (numbers, true/false), else text."""
    knobs = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise ConfigError(f"--task_args: {part!r} is not key=value; e.g. max_digits=3")
        try:
            knobs[key] = json.loads(value)
        except json.JSONDecodeError:
            knobs[key] = value
    return knobs


def resolve_source(path: str | None, step: int | None, config_spec: str | None, flag: str):
    """The Source of --checkpoint / --compare (or of --config's base), or a one-line error."""
    from gspo_jax.models import hf
    from gspo_jax.rl import policies

    if path is None:
        if not config_spec:
            raise ConfigError(
                "pass --checkpoint PATH (a run directory or an HF folder) or --config"
            )
        config = config_lib.load_config_file(config_spec)
        return Source("config", config_spec, config=config, label="base")
    if not os.path.isdir(path):
        raise ConfigError(
            f"--{flag}={path!r} is not a folder; pass a run directory (config.json, "
            "checkpoints/) or a Hugging Face checkpoint folder (config.json, *.safetensors)"
        )
    if policies.is_run_dir(path):
        try:
            step = policies.check_step(path, step)
        except CheckpointError as e:
            raise ConfigError(f"--{flag}: {e}") from None
        config = policies.read_run_config(path)
        return Source("run", path, step, config, f"step {step}")
    has_weights = any(n.endswith(".safetensors") for n in os.listdir(path))
    if os.path.isfile(os.path.join(path, hf.CONFIG_FILE)) and has_weights:
        return Source("hf", path, label=os.path.basename(os.path.normpath(path)))
    raise ConfigError(
        f"--{flag}={path!r} is neither a run directory (config.json and checkpoints/) nor a "
        "Hugging Face checkpoint folder (config.json and *.safetensors); pass one of them"
    )


def make_task(source: Source, name: str | None, knobs: dict[str, Any], split: str):
    """The task the problems come from: the run's / config's (its knobs, updated by knobs) unless
    --task names another; an HF folder's tokenizer when the task reads one. Checks the split."""
    from gspo_jax import tasks

    base_name, base_knobs = None, {}
    if source.config is not None:
        base_name, base_knobs = source.config.task.name, dict(source.config.task.kwargs)
    name = name or base_name
    if name is None:
        raise ConfigError(f"--checkpoint={source.path} is an HF folder: name its task, --task=...")
    if name not in tasks.TASKS:
        raise ConfigError(f"--task={name!r} is not a task; valid tasks: {sorted(tasks.TASKS)}")
    knobs = {**(base_knobs if name == base_name else {}), **knobs}
    wants_tokenizer = "tokenizer_path" in tasks.TASKS[name].__init__.__code__.co_varnames
    has_tokenizer = source.kind == "hf" and os.path.exists(
        os.path.join(source.path, "tokenizer.json")
    )
    if wants_tokenizer and has_tokenizer and not knobs.get("tokenizer_path"):
        knobs["tokenizer_path"] = source.path
    try:
        task = tasks.get_task(name, **knobs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--task={name} with knobs {knobs}: {str(e).rstrip('.')}") from None
    if split not in task.splits:
        raise ConfigError(
            f"--split={split!r}: the {name} task has the splits {list(task.splits)}; pass one"
        )
    return task


def side_file(out: str, label: str) -> str:
    """The per-problem results of one checkpoint next to --out (FILE.<label>.problems.json)."""
    stem = out[: -len(".json")] if out.endswith(".json") else out
    return f"{stem}.{label.replace(' ', '')}.problems.json"


def read_side_file(path: str, settings: Settings) -> dict[str, Any]:
    """The batches done so far ({} for a new file), or ConfigError if it holds other settings."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        saved = json.load(f)
    if saved.get("settings") != json.loads(json.dumps(dataclasses.asdict(settings))):
        raise ConfigError(
            f"{path} holds results under other settings than this command's; pass another --out "
            "or delete that file to start over"
        )
    return saved["batches"]


def write_side_file(path: str, settings: Settings, batches: dict[str, Any]) -> None:
    """Rewrites the side file atomically (a stop mid-write leaves the previous one)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"settings": dataclasses.asdict(settings), "batches": batches}, f)
    os.replace(tmp, path)


# ------------------------------------------------------------------------- evaluation


def load_model(source: Source, mesh, cache_dir: str | None):
    """The source's model with its parameters placed on ``mesh`` (replicated over the batch
    axes: every device samples its share of problems)."""
    import jax
    from flax import nnx

    from gspo_jax import models, sharding
    from gspo_jax.rl import policies

    if source.kind == "hf":
        return models.load_hf_checkpoint(source.path, mesh=mesh)
    if source.kind == "run":
        _, model, _ = policies.run_policy(source.path, source.step, source.config)
    else:
        _, model = policies.config_base_policy(source.config, cache_dir)
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, sharding.state_shardings(state, mesh))
    return nnx.merge(graphdef, state)


def sample_problems(
    model,
    task,
    settings: Settings,
    *,
    mesh=None,
    data_dir: str | None = None,
    side: str | None = None,
    label: str = "",
    on_batch=None,
) -> dict[str, Any]:
    """Per-problem results of ``settings``' problems: greedy_correct [P], greedy_length [P],
    sample_correct [P, n], sample_length [P, n], level [P]. With ``side`` (a side file) the
    batches it holds are not sampled again and each new one is added to it as it finishes.
    on_batch(i) runs after batch i is stored (tests stop an evaluation there)."""
    import numpy as np
    from tqdm import tqdm

    from gspo_jax import data, sharding
    from gspo_jax.rl import evaluation

    done = read_side_file(side, settings) if side else {}
    batches = data.make_eval_batches(
        task,
        settings.split,
        batch_size=settings.batch_size,
        num_problems=settings.num_problems or None,
        data_dir=data_dir,
    )
    total = sum(n for _, n in batches)
    source = data.load_source(task, settings.split, data_dir)
    n = settings.samples
    bar = tqdm(
        total=total,
        initial=sum(len(b["greedy_correct"]) for b in done.values()),
        desc=f"evaluating {label}".strip(),
        unit=" problems",
        file=sys.stderr,
    )
    with sharding.use_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        for i, (batch, count) in enumerate(batches):
            if str(i) in done:
                continue
            out = evaluation.sample_batch(
                model,
                task,
                batch,
                count,
                i,
                pass_k=n,
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                seed=settings.seed,
                engine=settings.engine,
                mesh=mesh,
            )
            g, s = out["greedy"], out["samples"]
            first = i * settings.batch_size
            done[str(i)] = dict(
                greedy_correct=g["correct"].tolist(),
                greedy_length=g["length"].tolist(),
                sample_correct=s["correct"].reshape(count, n).tolist(),
                sample_length=s["length"].reshape(count, n).tolist(),
                level=[task.difficulty(source[first + p]) for p in range(count)],
            )
            if side:
                write_side_file(side, settings, done)
            bar.update(count)
            if on_batch is not None:
                on_batch(i)
    bar.close()
    order = sorted(done, key=int)
    return {
        k: np.concatenate([np.asarray(done[i][k]) for i in order])
        for k in ("greedy_correct", "greedy_length", "sample_correct", "sample_length", "level")
    }


def problem_values(results: dict[str, Any], ks) -> dict[str, Any]:
    """eval_figures' per-problem values of sample_problems' results."""
    return eval_figures.per_problem(
        results["greedy_correct"],
        results["sample_correct"],
        ks,
        greedy_length=results["greedy_length"],
        sample_length=results["sample_length"],
    )


def report(results: dict[str, Any], ks, label: str, **interval_args) -> dict[str, Any]:
    """One checkpoint's figures, intervals and per-difficulty rows (the JSON's layout)."""
    values = problem_values(results, ks)
    return dict(
        checkpoint=label,
        num_problems=int(len(results["greedy_correct"])),
        samples=int(results["sample_correct"].shape[1]),
        **eval_figures.aggregate(values),
        intervals={k: list(v) for k, v in eval_figures.intervals(values, **interval_args).items()},
        by_difficulty=eval_figures.by_level(values, results["level"], **interval_args),
    )


def difference(a: dict[str, Any], b: dict[str, Any], ks, **interval_args) -> dict[str, Any]:
    """b minus a per figure with its paired interval: {figure: {"value", "interval"}}."""
    pairs = eval_figures.paired(problem_values(a, ks), problem_values(b, ks), **interval_args)
    return {k: dict(value=d, interval=[lo, hi]) for k, (d, lo, hi) in pairs.items()}


# ------------------------------------------------------------------------- output


def figure_names(result: dict[str, Any]) -> list[str]:
    """The figures of a report in reading order."""
    return [k for k in result["intervals"] if not k.startswith("_")]


def format_table(result: dict[str, Any]) -> str:
    """The terminal table: one row per figure, a column per checkpoint (value [interval]), the
    difference column with --compare, then the per-difficulty rows of each checkpoint."""
    reports = [result] + ([result["compare"]] if "compare" in result else [])
    names = figure_names(result)
    head = ["figure"] + [r["checkpoint"] for r in reports]
    if "difference" in result:
        head.append("difference")
    rows = [head]
    for name in names:
        row = [name]
        for r in reports:
            lo, hi = r["intervals"][name]
            row.append(f"{r[name]:.3f} [{lo:.3f}, {hi:.3f}]")
        if "difference" in result:
            d = result["difference"][name]
            lo, hi = d["interval"]
            row.append(f"{d['value']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        rows.append(row)
    lines = [f"{result['num_problems']} problems, {result['samples']} samples each"]
    lines += _aligned(rows)
    for r in reports:
        if r["by_difficulty"]:
            lines.append(f"\nby difficulty ({r['checkpoint']}):")
            rows = [["level", "problems"] + names]
            for level, row in r["by_difficulty"].items():
                f = row["figures"]
                rows.append([level, str(row["num_problems"])] + [f"{f[k]:.3f}" for k in names])
            lines += _aligned(rows)
    return "\n".join(lines)


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def plot_pass_at_k(result: dict[str, Any], ks, path: str) -> None:
    """pass@k against k (log2 axis), one line per checkpoint, the intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in [result] + ([result["compare"]] if "compare" in result else []):
        ys = [r[f"pass@{k}"] for k in ks]
        lo = [y - r["intervals"][f"pass@{k}"][0] for y, k in zip(ys, ks, strict=True)]
        hi = [r["intervals"][f"pass@{k}"][1] - y for y, k in zip(ys, ks, strict=True)]
        ax.errorbar(ks, ys, yerr=[lo, hi], marker="o", capsize=3, label=r["checkpoint"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ks), [str(k) for k in ks])
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"pass@k, {result['num_problems']} problems, n = {result['samples']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------- the command


def main(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    # Everything a user can get wrong is checked here, before any model is loaded.
    ks = parse_ks(_K.value, _SAMPLES.value)
    if _BATCH_SIZE.value < 1 or _NUM_PROBLEMS.value < 0:
        raise ConfigError("--batch_size must be >= 1 and --num_problems >= 0 (0 = all)")
    first = resolve_source(_CHECKPOINT.value, _STEP.value, _CONFIG.value, "checkpoint")
    sources = [first]
    if _COMPARE.value:
        second = resolve_source(_COMPARE.value, _COMPARE_STEP.value, None, "compare")
        if second.label == first.label:
            second = dataclasses.replace(second, label=f"{second.label} (compare)")
        sources.append(second)
    task = make_task(first, _TASK.value, parse_knobs(_TASK_ARGS.value), _SPLIT.value)
    settings = Settings(
        task=task.name,
        task_config=json.loads(json.dumps(task.config, default=str)),
        split=_SPLIT.value,
        num_problems=_NUM_PROBLEMS.value,
        samples=_SAMPLES.value,
        temperature=_TEMPERATURE.value,
        max_new_tokens=_MAX_NEW_TOKENS.value or default_max_new_tokens(first, task),
        batch_size=_BATCH_SIZE.value,
        seed=_SEED.value,
        engine=_ENGINE.value,
    )
    mesh = make_mesh(_MESH.value, _BATCH_SIZE.value)
    out = _OUT.value
    if out:
        check_out(out)
    sides = [side_file(out, s.label) if out else None for s in sources]
    for side in sides:
        if side:
            read_side_file(side, settings)  # other settings: the error now, not after sampling
    interval_args = dict(level=_LEVEL.value, num_resamples=_RESAMPLES.value)
    results = []
    for source, side in zip(sources, sides, strict=True):
        model = load_model(source, mesh, _CACHE_DIR.value or None)
        check_vocab(model, task, source)
        results.append(
            sample_problems(
                model,
                task,
                settings,
                mesh=mesh,
                data_dir=_DATA_DIR.value or None,
                side=side,
                label=source.label,
            )
        )
        del model
    result = report(results[0], ks, sources[0].label, **interval_args)
    if len(results) > 1:
        result["compare"] = report(results[1], ks, sources[1].label, **interval_args)
        result["difference"] = difference(results[0], results[1], ks, **interval_args)
    result["settings"] = dict(dataclasses.asdict(settings), ks=list(ks), level=_LEVEL.value)
    print(format_table(result), flush=True)
    if out:
        from gspo_jax.runtime import rundir

        with open(out, "w") as f:
            json.dump(rundir.strict_json(result), f, indent=1)
        png = (out[: -len(".json")] if out.endswith(".json") else out) + ".png"
        plot_pass_at_k(result, ks, png)
        print(f"wrote {out} and {png}", flush=True)


def default_max_new_tokens(source: Source, task) -> int:
    """The run's (or config's) evaluation length on its own task, else the task's."""
    config = source.config
    if config is not None and config.task.name == task.name:
        return int(config.eval.max_new_tokens or config.rl.max_new_tokens or task.max_response_len)
    return task.max_response_len


def check_out(out: str) -> None:
    """--out's folder, created if missing; an unwritable one is an error before any work."""
    folder = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"--out={out}: cannot create {folder} ({e.strerror}); pick another"
        ) from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--out={out}: {folder} is not writable; pick another --out")


def make_mesh(text: str, batch_size: int):
    """The evaluation's mesh from --mesh, and a batch that divides over its batch axes."""
    from gspo_jax import sharding

    axes = parse_knobs(text)
    try:
        mesh = sharding.make_mesh(axes)
    except ValueError as e:
        raise ConfigError(f"--mesh={text}: {str(e).rstrip('.')}") from None
    shards = sharding.row_shards(mesh)
    if batch_size % shards:
        raise ConfigError(
            f"--batch_size={batch_size} does not divide over the mesh's {shards} data-parallel "
            f"devices; use a multiple of {shards}"
        )
    return mesh


def check_vocab(model, task, source: Source) -> None:
    if model.cfg.vocab_size < task.tokenizer.vocab_size:
        raise ConfigError(
            f"{source.path}: the model's {model.cfg.vocab_size} token ids are fewer than the "
            f"{task.name} tokenizer's {task.tokenizer.vocab_size}; evaluate it on its own task"
        )


def run() -> None:
    """Console entry point: a bad input is one ``error: ...`` line and exit code 2."""
    from gspo_jax.data import files as data_files

    try:
        app.run(main)
    except (ConfigError, data_files.DataFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
