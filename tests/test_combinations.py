"""Which features combine (config/combinations.py): every pair of features either is refused by
the table, and building the config (rl/build.py build_run, rl/population.py build_population)
raises exactly the table's line, or runs one RL step at the smallest size.

The fast suite builds every refused pair, every feature alone, and runs the pairs of FAST; the
long stage runs a covering set (every feature beside another); every other pair runs one step
under the `pairs` marker (`python -m pytest -q -m pairs`), a multi-process pair as a 2-process
pod (tests/trainer_runs.py launch_pod).
"""

import itertools
import json
import os

import jax
import numpy as np
import pytest
from test_sandbox import needs_sandbox
from trainer_runs import launch_pod, load_repo_module, make_config

from gspo_jax.config import ConfigError, combinations

KEYS = [f.key for f in combinations.FEATURES]
PAIRS = list(itertools.combinations(KEYS, 2))
# The smallest run: a random tiny model, 1 step of 2 prompts x 2 samples of 4 tokens, no
# evaluation (a pod's 8 devices need 8 prompts: POD below)
TINY = {
    "num_devices": 1,
    "init.kind": "random",
    "model.preset": "tiny",
    "rl.num_steps": 1,
    "rl.prompts_per_step": 2,
    "rl.group_size": 2,
    "rl.max_new_tokens": 4,
    "rl.num_minibatches": 1,
    "eval.num_problems": 0,
    "checkpoint.every": 1,
    "log.tensorboard": False,
}
POD = {k: v for k, v in TINY.items() if k != "num_devices"} | {"rl.prompts_per_step": 8}
# The pairs the fast suite runs (the population of QLoRA runs, which the table once refused, and
# a pipelined MoE run); the rest are long.
FAST = {("qlora", "population"), ("pipeline", "moe")}


def test_every_printed_feature_is_in_the_table():
    """config/features.py's fields (what a run's first line names) are the table's features,
    but for rl.sync_every, the pipeline's own setting (it needs rl.max_staleness)."""
    from gspo_jax.config import features

    fields = {f.field for f in combinations.FEATURES}
    assert {field for field, _ in features.FEATURES} - fields == {"rl.sync_every"}


def test_docs_page_holds_the_generated_table():
    table = load_repo_module("experiments/checks/combinations_table.py")
    with open(table.PAGE) as f:
        text = f.read()
    assert table.replaced(text, table.table()) == text, (
        "docs/features.md's table is stale: run "
        "`PYTHONPATH=. python experiments/checks/combinations_table.py --write`"
    )
    rows = table.table().splitlines()
    # one matrix row per feature, each naming every refusal of its feature by number
    matrix = [r.removesuffix(" |").split(" | ") for r in rows if r.startswith("| **")]
    assert len(matrix) == len(KEYS)
    for i, r in enumerate(combinations.REFUSED, 1):
        a, b = (KEYS.index(k) for k in r.features)
        assert matrix[a][b + 1] == f"R{i}" == matrix[b][a + 1]


def turn_on(keys) -> dict:
    """The fields that turn every feature of ``keys`` on together (their needs included)."""
    fields = {}
    for key in keys:
        for field, value in combinations.BY_KEY[key].turn_on.items():
            assert fields.get(field, value) == value, f"{keys} set {field} two ways"
            fields[field] = value
    return fields


def needs(key) -> set[str]:
    """The feature ``key`` and those its turn_on turns on with it (QLoRA: LoRA)."""
    config = make_config({"cache": "", "data": ""}, **turn_on([key]))
    moe = config.model.preset.endswith("_moe")
    setting = combinations.Setting(moe=moe, processes=processes([key]))
    return set(combinations.on(config, setting))


def processes(keys) -> int:
    return max(combinations.BY_KEY[k].processes for k in keys)


def config_of(shared, keys):
    return make_config(shared, **{**TINY, **turn_on(keys)})


def refused_line(config, keys) -> str | None:
    """The table's line for ``config`` with the features ``keys`` (None: it runs)."""
    moe = config.model.preset.endswith("_moe")
    setting = combinations.Setting(moe=moe, processes=processes(keys))
    # the features and what they need (partial rollouts: the continuous engine), no other
    assert set(keys) <= set(combinations.on(config, setting)) <= set().union(*map(needs, keys))
    return combinations.refusal(config, setting)


def build(config):
    """The real entry point: a population's build (every member checked, then the shared Run's
    build) or a single run's."""
    from gspo_jax.rl import build as build_lib
    from gspo_jax.rl import population

    if config.population.seeds:
        return population.build_population(config)
    return build_lib.build_run(config)


def as_processes(monkeypatch, n: int) -> None:
    """This process counts as one of ``n``: the multi-process refusals are decided before any
    device or peer is touched (build_run asks jax.process_count once, for the table)."""
    if n > 1:
        monkeypatch.setattr(jax, "process_count", lambda: n)


def test_every_refusal_names_two_features_and_one_line():
    for r in combinations.REFUSED:
        assert len(set(r.features)) == 2 and set(r.features) <= set(KEYS), r
        assert r.why and r.fix.startswith(("set ", "run ")), r
    refused = [frozenset(r.features) for r in combinations.REFUSED]
    assert len(set(refused)) == len(refused), "a pair refused twice"
    config = make_config({"cache": "", "data": ""}, **turn_on(["partial", "dynamic_sampling"]))
    line = combinations.refusal(config, combinations.Setting())
    assert line == (
        "partial rollouts (config.rl.partial_rollout=1) does not run with dynamic sampling "
        "(config.rl.dynamic_sampling=True): dynamic sampling draws a data-dependent number of "
        "batches per step; set config.rl.partial_rollout=0"
    )
    assert (
        combinations.refusal(make_config({"cache": "", "data": ""}), combinations.Setting()) is None
    )


@pytest.mark.parametrize("key", KEYS)
def test_each_feature_alone_builds(shared, monkeypatch, key):
    """Every feature alone passes the table and builds, so a pair's refusal is the pair's."""
    config = config_of(shared, [key])
    assert refused_line(config, [key]) is None
    as_processes(monkeypatch, processes([key]))
    if processes([key]) > 1:  # one process cannot build a pod's run: the table alone passes
        return
    if key == "environment" and needs_sandbox.args[0]:  # its tool needs bubblewrap (.ci/run's)
        pytest.skip(needs_sandbox.kwargs["reason"])
    build(config)


REFUSED = [p for p in PAIRS if any(set(r.features) == set(p) for r in combinations.REFUSED)]
RUNS = [p for p in PAIRS if p not in REFUSED]


@pytest.mark.parametrize("pair", REFUSED, ids="+".join)
def test_a_refused_pair_is_the_tables_line(shared, monkeypatch, pair):
    config = config_of(shared, pair)
    line = refused_line(config, pair)
    assert line is not None and "\n" not in line
    as_processes(monkeypatch, processes(pair))
    with pytest.raises(ConfigError) as e:
        build(config)
    assert str(e.value) == line


def _metrics(workdir: str) -> list[list[dict]]:
    """Each run's metrics records: one run's, or each member's of a population."""
    members = os.path.join(workdir, "members")
    folders = (
        [os.path.join(members, m) for m in sorted(os.listdir(members))]
        if os.path.isdir(members)
        else [workdir]
    )
    out = []
    for folder in folders:
        with open(os.path.join(folder, "metrics.jsonl")) as f:
            out.append([json.loads(line) for line in f])
    return out


def run_pair(shared, tmp_path, pair):
    """One RL step of the pair (a pod of 2 processes for a multi-process pair): every run's
    metrics hold step 1 with a finite loss."""
    from gspo_jax.rl import build as build_lib
    from gspo_jax.rl import trainer

    wd = str(tmp_path / "+".join(pair))
    if processes(pair) > 1:
        # the dataset prepared first, in one process, as `main --prepare_only` before a pod run
        fields = {**POD, **turn_on(pair)}
        build_lib.prepare(make_config(shared, **fields))
        outs, codes = launch_pod(shared, wd, timeout=600, **fields)
        assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    else:
        trainer.train(config_of(shared, pair), wd)
    for records in _metrics(wd):
        assert [r["step"] for r in records] == [1]
        assert np.isfinite(records[0]["train/loss"])


@pytest.mark.parametrize("pair", sorted(p for p in RUNS if p in FAST), ids="+".join)
def test_a_pair_runs_one_step(shared, tmp_path, pair):
    assert refused_line(config_of(shared, pair), pair) is None
    run_pair(shared, tmp_path, pair)


# The long stage (.ci/run) runs COVERING: every feature beside another, with FAST; every other
# pair that runs is marked `pairs` (python -m pytest -q -m pairs: seconds each, about a minute for
# a 2-process pod pair), outside the README's command and .ci/run's budget.
COVERING = [
    ("continuous", "partial"),
    ("continuous", "environment"),
    ("pipeline", "lora"),
    ("rollout_devices", "token_advantages"),
    ("qlora", "dynamic_sampling"),
    ("rollout_quant", "moe"),
    ("rollout_quant", "route_change"),
    ("rollout_dtype", "multiprocess"),
    ("lora", "routing_replay"),
    ("lora", "population"),
    ("recompute_old_logp", "remat"),
]


def test_the_long_stage_runs_every_feature_beside_another():
    assert set(COVERING) <= set(RUNS) and not set(COVERING) & FAST
    assert set().union(*map(set, COVERING), *map(set, FAST)) == set(KEYS)


@pytest.mark.long
@pytest.mark.parametrize("pair", COVERING, ids="+".join)
def test_a_pair_runs_one_step_long(shared, tmp_path, pair):
    assert refused_line(config_of(shared, pair), pair) is None
    run_pair(shared, tmp_path, pair)


@pytest.mark.pairs
@pytest.mark.parametrize(
    "pair", [p for p in RUNS if p not in FAST and p not in COVERING], ids="+".join
)
def test_every_other_pair_runs_one_step(shared, tmp_path, pair):
    assert refused_line(config_of(shared, pair), pair) is None
    run_pair(shared, tmp_path, pair)
