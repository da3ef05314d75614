"""Every bad input fails in one line before any work.

A configuration problem (an unknown task, model preset or eval split, a task knob out of range, a
bad ``config.py:arg``, a response longer than the model's KV cache, a NaN or infinite
hyperparameter) is a ConfigError raised by config.load_config_file or build.build_run, before
the workdir is created, the dataset prepared or the warm start trained; main.py prints it as one
``error: ...`` line on stderr and exits with code 2. Most cases call build_run directly (no JAX
start-up per case); a few run ``python -m gspo_jax.main`` to cover the command-line path.
"""

import os
import re
import subprocess
import sys

import ml_collections
import pytest

from gspo_jax import config as config_lib
from gspo_jax.config import ConfigError
from gspo_jax.rl import build

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARITH = os.path.join("configs", "arith.py")
MOE = os.path.join("configs", "arith_moe.py")


def _runlocal(**fields) -> ml_collections.ConfigDict:
    """The runlocal arith config, unlocked, with ``fields`` set (``task__name`` sets task.name)."""
    c = ml_collections.ConfigDict(
        config_lib.load_config_file(os.path.join(REPO, ARITH) + ":runlocal")
    )
    c.unlock()
    for key, value in fields.items():
        config_lib.set_field(c, key.replace("__", "."), value)
    return c


# (id, fields of the runlocal config, pattern the ConfigError message must match)
BAD_CONFIGS = [
    (
        "unknown_task",
        dict(task__name="nope"),
        r"^config\.task\.name='nope' is not a task; valid tasks: "
        r"\['arith', 'chainsum', 'countdown', 'gsm8k', 'math', 'products'\]\. Set "
        r"--config\.task\.name",
    ),
    (
        "unknown_model_preset",
        dict(model__preset="nope"),
        r"^config\.model\.preset='nope' is not a model preset; valid presets: \['tiny', .*'small'"
        r".*Set --config\.model\.preset",
    ),
    (
        "unknown_model_field_value",
        dict(model__dtype="float8"),
        r"^config\.model \(preset 'tiny'\): dtype='float8' is not one of",
    ),
    (
        "arith_knob_out_of_range",
        dict(task__kwargs__max_digits=12),
        r"^config\.task\.kwargs=.*'max_digits': 12.* for task 'arith': need 1 <= min_digits <= "
        r"max_digits <= 9, got 1, 12\. Fix the knob in config\.task\.kwargs",
    ),
    (
        "countdown_knob_out_of_range",
        dict(task__name="countdown", task__kwargs=dict(num_numbers=9)),
        r"for task 'countdown': num_numbers must be in \[2, 6\], got 9\. Fix the knob",
    ),
    (
        "unknown_task_knob",
        dict(task__kwargs__max_digitz=3),
        r"for task 'arith': unknown knobs \['max_digitz'\] for task 'arith'; valid knobs: "
        r"\['min_digits', 'max_digits'",
    ),
    (
        "unknown_eval_split",
        dict(eval__split="nope"),
        r"^config\.eval\.split='nope' is not a split of task 'arith'; valid splits: "
        r"\['train', 'test'\]\. Set --config\.eval\.split=test",
    ),
    (
        "rl_max_new_tokens_too_long",
        dict(rl__max_new_tokens=300),
        r"^config\.rl\.max_new_tokens=300: task 'arith' prompts take up to 7 tokens and 7 \+ 300 "
        r"= 307 exceeds max_seq_len=256 of model preset 'tiny' .*lower --config\.rl\.max_new_tokens"
        r" to at most 249",
    ),
    (
        "eval_max_new_tokens_too_long",
        dict(eval__max_new_tokens=250),
        r"^config\.eval\.max_new_tokens=250: .* 7 \+ 250 = 257 exceeds max_seq_len=256 .*at most "
        r"249",
    ),
    (
        "default_max_new_tokens_too_long",  # 0 resolves to the task's max_response_len (512)
        dict(task__name="gsm8k", task__kwargs=dict(max_prompt_len=100)),
        r"^config\.rl\.max_new_tokens=0 \(= task\.max_response_len 512\): task 'gsm8k' prompts "
        r"take up to 100 tokens and 100 \+ 512 = 612 exceeds max_seq_len=256 .*at most 156",
    ),
    (
        "learning_rate_nan",
        dict(optimizer__learning_rate=float("nan")),
        r"^config\.optimizer\.learning_rate=nan: hyperparameters must be finite numbers",
    ),
    (
        "learning_rate_inf",
        dict(optimizer__learning_rate=float("inf")),
        r"^config\.optimizer\.learning_rate=inf: hyperparameters must be finite numbers",
    ),
    (
        "several_non_finite",  # each one named, whichever section it is in
        dict(
            objective__eps_high=float("inf"),
            rl__temperature=float("nan"),
            rl__top_p=float("nan"),
            optimizer__weight_decay=float("-inf"),
            optimizer__grad_clip=float("nan"),
        ),
        r"^(?=.*config\.objective\.eps_high=inf\b)(?=.*config\.rl\.temperature=nan\b)"
        r"(?=.*config\.rl\.top_p=nan\b)(?=.*config\.optimizer\.weight_decay=-inf\b)"
        r"(?=.*config\.optimizer\.grad_clip=nan\b).*: hyperparameters must be finite numbers",
    ),
]


@pytest.mark.parametrize(
    "fields, pattern", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_validate_rejects_bad_config_before_any_work(fields, pattern, tmp_path):
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        build.build_run(_runlocal(**fields), str(workdir))
    message = str(e.value)
    assert re.search(pattern, message), message
    assert "\n" not in message
    assert not workdir.exists()  # build_run touches the workdir last, only when all else passed


@pytest.mark.parametrize(
    "arg, pattern",
    [
        ("nope=1", r"unknown config argument 'nope' in 'nope=1'; valid arguments: \['eps', 'lr', "),
        ("seed=abc", r"config argument seed='abc': expected int \(default 0\)"),
        ("runlocal=maybe", r"config argument runlocal='maybe': expected bool .*not a boolean"),
    ],
)
def test_config_file_argument_errors_are_config_errors(arg, pattern):
    spec = os.path.join(REPO, ARITH) + f":{arg}"
    with pytest.raises(ConfigError, match=rf"^--config={re.escape(spec)}: {pattern}.*get_config"):
        config_lib.load_config_file(spec)


def test_good_configs_still_validate():
    """The new checks do not reject the shipped experiments (dense and MoE, with replay)."""
    for spec in (ARITH, f"{ARITH}:runlocal", f"{MOE}:runlocal,routing_replay", MOE):
        build.build_run(config_lib.load_config_file(os.path.join(REPO, spec)), None)
    build.build_run(_runlocal(task__name="countdown", task__kwargs={}), None)
    build.build_run(_runlocal(eval__split="train", rl__max_new_tokens=249), None)


# Through `python -m gspo_jax.main`: one line on stderr, exit code 2, nothing written or trained.
MAIN_CASES = {
    "config_arg": ([f"--config={ARITH}:nope=1"], r"unknown config argument 'nope'"),
    "unknown_task": (
        [f"--config={ARITH}:runlocal", "--config.task.name=nope"],
        r"config\.task\.name='nope' is not a task; valid tasks",
    ),
    "learning_rate_nan": (
        [f"--config={ARITH}:runlocal", "--config.optimizer.learning_rate=nan"],
        r"config\.optimizer\.learning_rate=nan: hyperparameters must be finite",
    ),
    "max_new_tokens": (
        [f"--config={ARITH}:runlocal", "--config.rl.max_new_tokens=300"],
        r"config\.rl\.max_new_tokens=300: .*exceeds max_seq_len=256",
    ),
}


def test_main_prints_one_error_line_and_exits_2(tmp_path):
    cache, data_dir = tmp_path / "cache", tmp_path / "data"
    env = dict(
        os.environ,
        PYTHONPATH=REPO,
        GSPO_JAX_CACHE=str(cache),
        GSPO_JAX_DATA_DIR=str(data_dir),
        JAX_PLATFORMS="cpu",
    )
    procs = {}
    for name, (args, _) in MAIN_CASES.items():  # concurrently: each one is a JAX start-up
        workdir = tmp_path / name
        workdir.mkdir()
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "gspo_jax.main", *args, f"--workdir={workdir}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
    for name, (_, pattern) in MAIN_CASES.items():
        _, stderr = procs[name].communicate(timeout=120)
        lines = stderr.splitlines()
        assert procs[name].returncode == 2, (name, stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, stderr)
        assert re.search(pattern, lines[0]), (name, lines[0])
        assert not os.listdir(tmp_path / name), name  # nothing written to the workdir
    assert not cache.exists() and not data_dir.exists()  # no dataset built, no warm start trained
