"""What a run says about itself (config/features.py): the features that differ from the plain
default, the configs and their arguments (--list_configs) and the resolved config
(--print_config), neither of which needs --workdir."""

import glob
import os
import subprocess
import sys

import ml_collections

from gspo_jax import config as config_lib
from gspo_jax.config import args as config_args
from gspo_jax.config import features

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")


def _config(spec="configs/arith.py:runlocal", **fields):
    c = config_lib.load_config_file(os.path.join(REPO, spec))
    for key, value in fields.items():
        config_lib.set_field(c, key, value)
    return c


def test_plain_run_names_no_feature():
    assert features.differences(_config()) == []
    assert "plain default" in features.describe(_config())


def test_each_feature_is_named_with_its_field():
    c = _config(
        **{
            "rl.rollout_engine": "continuous",
            "rl.max_staleness": 2,
            "lora.rank": 4,
            "rl.rollout_quant": "int8",
        }
    )
    assert features.differences(c) == [
        ("rollout engine", "continuous", "rl.rollout_engine"),
        ("staleness bound (policy versions)", 2, "rl.max_staleness"),
        ("LoRA rank", 4, "lora.rank"),
        ("rollout quantization", "int8", "rl.rollout_quant"),
    ]
    line = features.describe(c)
    assert "LoRA rank 4 (lora.rank)" in line and "plain default" not in line


def test_population_size_counts_members():
    c = _config()
    c.population.seeds = (0, 1)
    c.population.vary = ml_collections.ConfigDict({"objective": {"eps_low": (1e-4, 3e-4, 1e-3)}})
    assert features.differences(c)[-1][:2] == ("population members", 6)  # product: 2 x 3


def test_arguments_of_a_config_and_parse_arg_afterwards():
    module = config_lib.import_config_module(os.path.join(CONFIGS, "arith_quant.py"))
    got = config_args.arguments_of(module.get_config)
    assert got["quant"] == "" and got["runlocal"] is False and "correction" in got
    # recording leaves parse_arg as it was: the config still builds with arguments
    assert module.get_config("runlocal,quant=int8").rl.rollout_quant == "int8"


def test_list_configs_names_every_config_file():
    text = features.list_configs(CONFIGS)
    for path in glob.glob(os.path.join(CONFIGS, "*.py")):
        assert f"configs/{os.path.basename(path)}: " in text
    assert "staleness=0" in text  # configs/arith_async.py's own argument


def _main(*args):
    return subprocess.run(
        [sys.executable, "-m", "gspo_jax.main", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
        cwd=REPO,
        timeout=120,
    )


def test_cli_list_and_print_config_need_no_workdir():
    r = _main("--list_configs")
    assert r.returncode == 0, r.stderr
    assert "configs/lora_rank.py: " in r.stdout and "rank=0" in r.stdout
    r = _main("--config=configs/arith.py:runlocal", "--print_config", "--config.lora.rank=3")
    assert r.returncode == 0, r.stderr
    assert "lora:\n  alpha: 16.0\n  base_quant: ''\n  rank: 3\n" in r.stdout
    r = _main("--config=configs/arith.py:runlocal")  # a run still needs its folder
    assert r.returncode != 0 and "--workdir is required" in r.stderr
