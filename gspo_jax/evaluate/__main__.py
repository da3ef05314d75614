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
from (its warm start, trained and cached first if need be; --config RUN_DIR: the one that run
started from, under the run's own config.json, overrides included). --compare (and
--compare_step) names a second one, evaluated on the same problems with the same samples' keys;
the table and the JSON then add the difference (second minus first) with its paired interval.

Figures (eval_figures.py, the same code as the trainer's in-run evaluation): greedy_accuracy,
avg@n, pass@k for each --k (k <= --samples), the sampled responses' length_mean and length_std
and greedy_length_mean, each with a percentile-bootstrap interval over problems; per-difficulty
rows where the task has levels (arith: the digits of the longer operand; MATH: its level).

Output: a progress bar while it samples, the table on the terminal, and with --out FILE.json the
JSON (``greedy_accuracy``, ``avg@16``, ``pass@1`` ... at the top level for the first checkpoint,
``intervals``, ``by_difficulty``, ``settings``; ``compare`` and ``difference`` for the second),
FILE.png (pass@k against k, one line per checkpoint) and FILE.<label>.problems.json per
checkpoint: the per-problem results, rewritten atomically after every batch. Run the same
command again after a stop and it continues from them without redoing a problem; a side file
of another checkpoint or other settings is an error naming it.

With --env python the same problems are also played as greedy episodes with the sandboxed Python
tool offered (rl/evaluation.py evaluate_tools): the table adds accuracy with the tool, tool calls,
failed calls and turns per episode, the share of episodes with a call and the accuracy of those
with and without one, and the JSON holds them under ``tools`` with every episode's counts
("without the tool" is the table's greedy_accuracy: the task's one turn, no tool offered).

Execution: data-parallel over problems on a mesh over every device (--mesh, as config.mesh),
through the rollout seam (--engine static | continuous); a batch of --batch_size problems is two
rollout calls (greedy, then n samples each), its rows split over the mesh's batch axes. One
process (a pod slice's hosts would each evaluate alone).

Bad input (a path that is neither a run directory nor an HF folder, a missing step, an unknown
task or knob, a split the task does not have or whose file the release lacks, --checkpoint and
--config together, a k above --samples, a batch that does not divide over the mesh, a side file
of other settings) is one ``error: ...`` line, exit code 2, before any model is loaded.

Dimension legend: P problems, n = --samples per problem, B = --batch_size problems per batch.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from absl import app, flags, logging

from gspo_jax import eval_figures
from gspo_jax.errors import ConfigError
from gspo_jax.evaluate import args, problems, report, sources
from gspo_jax.rl import episodes, evaluation

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A run directory or a Hugging Face checkpoint folder."
)
_STEP = flags.DEFINE_integer("step", None, "The run's checkpoint step (default: the newest).")
_CONFIG = flags.DEFINE_string(
    "config",
    None,
    "Without --checkpoint: evaluate the base policy of this config (path[:args]) or of this run "
    "directory (the policy the run started from, under its own config.json).",
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
_ENV = flags.DEFINE_enum(
    "env",
    "",
    ["", "python"],
    "Also evaluate with the task's problems in this environment "
    "(python: the sandboxed Python tool offered; greedy episodes).",
)
_MAX_TURNS = flags.DEFINE_integer("max_turns", 4, "--env: the policy's turns per episode.")
_RESAMPLES = flags.DEFINE_integer("resamples", eval_figures.DEFAULT_RESAMPLES, "Bootstrap draws.")
_LEVEL = flags.DEFINE_float("level", eval_figures.DEFAULT_LEVEL, "The intervals' coverage.")


def main(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    # Everything a user can get wrong is checked here, before any model is loaded.
    ks = args.parse_ks(_K.value, _SAMPLES.value)
    if _BATCH_SIZE.value < 1 or _NUM_PROBLEMS.value < 0:
        raise ConfigError("--batch_size must be >= 1 and --num_problems >= 0 (0 = all)")
    first = sources.resolve_source(_CHECKPOINT.value, _STEP.value, _CONFIG.value, "checkpoint")
    policies = [first]
    if _COMPARE.value:
        second = sources.resolve_source(_COMPARE.value, _COMPARE_STEP.value, None, "compare")
        if second.label == first.label:
            second = dataclasses.replace(second, label=f"{second.label} (compare)")
        policies.append(second)
    task = sources.make_task(first, _TASK.value, args.parse_knobs(_TASK_ARGS.value), _SPLIT.value)
    settings = problems.Settings(
        task=task.name,
        task_config=json.loads(json.dumps(task.config, default=str)),
        split=_SPLIT.value,
        num_problems=_NUM_PROBLEMS.value,
        samples=_SAMPLES.value,
        temperature=_TEMPERATURE.value,
        max_new_tokens=_MAX_NEW_TOKENS.value or sources.default_max_new_tokens(first, task),
        batch_size=_BATCH_SIZE.value,
        seed=_SEED.value,
        engine=_ENGINE.value,
    )
    mesh = args.make_mesh(_MESH.value, _BATCH_SIZE.value)
    sources.check_data(task, settings.split, _DATA_DIR.value or None)
    out = _OUT.value
    if out:
        args.check_out(out)
    sides = [problems.side_file(out, p.label) if out else None for p in policies]
    for policy, side in zip(policies, sides, strict=True):
        if side:  # another checkpoint's or other settings': the error now, not after sampling
            problems.read_side_file(side, settings, policy.identity)
    interval_args = dict(level=_LEVEL.value, num_resamples=_RESAMPLES.value)
    tool_env, tools_by_label = make_tool_env(task, settings.max_new_tokens), {}
    results = []
    for policy, side in zip(policies, sides, strict=True):
        model = sources.load_model(policy, mesh, _CACHE_DIR.value or None)
        sources.check_vocab(model, task, policy)
        results.append(
            problems.sample_problems(
                model,
                task,
                settings,
                mesh=mesh,
                data_dir=_DATA_DIR.value or None,
                side=side,
                label=policy.label,
                policy=policy.identity,
            )
        )
        if tool_env is not None:  # the same problems with the tool offered
            tools_by_label[policy.label] = evaluation.evaluate_tools(
                model,
                tool_env,
                settings.split,
                settings.num_problems or None,
                settings.max_new_tokens,
                batch_size=settings.batch_size,
                seed=settings.seed,
                data_dir=_DATA_DIR.value or None,
                engine=settings.engine,
                with_episodes=True,
            )
        del model
    result = report.summary(results[0], ks, policies[0].label, **interval_args)
    if len(results) > 1:
        result["compare"] = report.summary(results[1], ks, policies[1].label, **interval_args)
        result["difference"] = report.difference(results[0], results[1], ks, **interval_args)
    result["settings"] = dict(dataclasses.asdict(settings), ks=list(ks), level=_LEVEL.value)
    print(report.format_table(result), flush=True)
    if tools_by_label:
        result["tools"] = tools_by_label
        for label, figures in tools_by_label.items():
            print(report.format_tools(label, figures), flush=True)
    if out:
        from gspo_jax.runtime import rundir

        with open(out, "w") as f:
            json.dump(rundir.strict_json(result), f, indent=1)
        png = (out[: -len(".json")] if out.endswith(".json") else out) + ".png"
        report.plot_pass_at_k(result, ks, png)
        print(f"wrote {out} and {png}", flush=True)


def make_tool_env(task, max_new_tokens: int):
    """--env's environment over ``task`` (None without --env); a machine without the sandbox is
    the error line naming what to install, before any model is loaded."""
    if not _ENV.value:
        return None
    if _MAX_TURNS.value < 1:
        raise ConfigError(f"--max_turns={_MAX_TURNS.value} must be >= 1")
    return episodes.python_environment(
        task,
        max_turns=_MAX_TURNS.value,
        max_tool_response_tokens=256,
        max_total_tokens=task.max_prompt_len + max_new_tokens,
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
