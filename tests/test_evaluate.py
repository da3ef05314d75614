"""The evaluation command (gspo_jax/evaluate/) and its figures (gspo_jax/eval_figures.py): the
unbiased pass@k against hand-computed values and brute force, the trainer's in-run figures on the
same samples, an HF folder against the run checkpoint it was exported from, data-parallel and
continuous-engine sampling, resume, bad input, and the command end to end on a tiny model."""

import dataclasses
import itertools
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import trainer_runs as runs
from flax import nnx
from hf_fixtures import random_model

from gspo_jax import eval_figures, models, sharding
from gspo_jax import evaluate as ev
from gspo_jax.errors import ConfigError
from gspo_jax.rl import adapters, build, evaluation
from gspo_jax.runtime import checkpoint as checkpoint_lib
from gspo_jax.runtime import rundir
from gspo_jax.tasks import ArithmeticTask, ChainSumTask, Verdict, math_problems

# ------------------------------------------------------------------------------ the estimator


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 1, 0.3),  # pass@1 = c / n
        (4, 0, 3, 0.0),  # nothing correct
        (4, 2, 3, 1.0),  # n - c < k: every 3-subset holds a correct sample
        (6, 1, 6, 1.0),  # pass@n: any correct
        (8, 2, 4, 1 - 15 / 70),  # 1 - C(6,4)/C(8,4)
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert eval_figures.pass_at_k(n, np.array([c]), k)[0] == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_brute_force_over_all_k_subsets():
    for n in range(1, 7):
        for c in range(n + 1):
            correct = [i < c for i in range(n)]
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
                got = eval_figures.pass_at_k(n, np.array([c]), k)[0]
                assert got == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    """n = 1000: binomials of ~1e299 would overflow floats; the product form stays exact."""
    n, c, k = 1000, 7, 300
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python ints: exact, then one division
    assert eval_figures.pass_at_k(n, np.array([c]), k)[0] == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k <= n"):
        eval_figures.pass_at_k(4, np.array([1]), 5)


def test_figures_intervals_levels_and_paired_difference():
    rng = np.random.default_rng(0)
    sc = (rng.random((40, 8)) < 0.4).astype(np.float32)  # [P, n]
    gc = (rng.random(40) < 0.5).astype(np.float32)
    sl = rng.integers(5, 20, (40, 8))
    values = eval_figures.per_problem(gc, sc, (1, 8), greedy_length=sl[:, 0], sample_length=sl)
    fig = eval_figures.aggregate(values)
    assert fig["avg@8"] == pytest.approx(sc.mean())
    assert fig["pass@1"] == pytest.approx(sc.mean())  # pass@1 is avg@n
    assert fig["pass@8"] == pytest.approx(sc.max(-1).mean())  # pass@n: any correct
    assert fig["length_std"] == pytest.approx(sl.std())
    ci = eval_figures.intervals(values)
    for name, (lo, hi) in ci.items():
        assert lo <= fig[name] <= hi and lo < hi, name
    levels = np.array(["1 digits"] * 10 + ["2 digits"] * 30)
    rows = eval_figures.by_level(values, levels)
    assert list(rows) == ["1 digits", "2 digits"]
    assert rows["1 digits"]["figures"]["avg@8"] == pytest.approx(sc[:10].mean())
    same = eval_figures.paired(values, values)
    assert all(d == lo == hi == 0 for d, lo, hi in same.values())
    better = dict(values, greedy_accuracy=np.minimum(values["greedy_accuracy"] + 0.25, 1))
    d, lo, hi = eval_figures.paired(values, better)["greedy_accuracy"]
    assert 0 < lo <= d <= hi


def test_difficulty_levels_of_the_tasks():
    assert ArithmeticTask(**KNOBS).difficulty({"a": 7, "b": 42}) == "2 digits"
    assert ArithmeticTask(**KNOBS).difficulty({"a": 7, "b": 0}) == "1 digit"
    chain = ChainSumTask(min_terms=4, max_terms=10, num_train=8, num_test=8)
    assert chain.difficulty({"num_terms": 7, "operands": [1] * 10}) == "07 terms"
    assert chain.difficulty({"num_terms": 10, "operands": [1] * 10}) == "10 terms"  # sorts last
    row = {"problem": "p", "solution": r"so \boxed{1}"}
    assert "level" not in math_problems.record_from_example(row)
    math_row = math_problems.record_from_example({**row, "level": "Level 4"})  # MATH
    assert math_row["level"] == "level 4"
    assert math_problems.record_from_example({**row, "level": 2})["level"] == "level 2"  # -500
    task = object.__new__(math_problems.MathTask)
    assert task.difficulty(math_row) == "level 4" and task.difficulty(row) == ""


# ------------------------------------------------------------------------------ tiny model, run


class ParityArith(ArithmeticTask):
    """arith whose verifier calls a response correct when its text has even length: a random
    model then gets some samples right and some wrong, so figures are not all 0."""

    def verify(self, record, text, terminated):
        ok = float(len(text) % 2 == 0)
        return Verdict(reward=ok, correct=ok, format=float(terminated))


KNOBS = dict(max_digits=2, num_train=64, num_test=24)


class _NoIterator:
    def get_state(self):
        return {}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A run directory with a random tiny policy at step 3, the same weights exported as an HF
    folder, and the data dir: {"run", "hf", "data", "root"}."""
    root = tmp_path_factory.mktemp("evaluate")
    data_dir, workdir = str(root / "data"), str(root / "run")
    config = runs.make_config(
        {"cache": str(root / "cache"), "data": data_dir, "xla": ""},
        **{"init.kind": "random", "num_devices": 1, "eval.num_problems": 0},
        **{f"task.kwargs.{k}": v for k, v in KNOBS.items()},
    )
    run = build.build_run(config, workdir)
    model = random_model(run.model_cfg, seed=1, std=0.3)
    params = nnx.split(model, nnx.Param, ...)[1]
    state = build.initial_state(run, params)
    rundir.write_config_json(workdir, config)
    ck = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=1)
    ck.save(3, adapters.saved_state(run, state), _NoIterator(), force=True)
    ck.close()
    export_hf = runs.load_repo_module("experiments/export_hf.py")
    hf_dir = str(root / "hf")
    assert export_hf.export(workdir, hf_dir) == 3
    return {"run": workdir, "hf": hf_dir, "data": data_dir, "root": root}


def settings(task, **kw) -> ev.Settings:
    base = dict(
        task=task.name,
        task_config=json.loads(json.dumps(task.config)),
        split="test",
        num_problems=0,
        samples=4,
        temperature=1.0,
        max_new_tokens=task.max_response_len,
        batch_size=8,
        seed=0,
        engine="static",
    )
    return ev.Settings(**{**base, **kw})


def evaluate_path(path, task, s, data_dir, devices=1, side=None, **kw):
    """What the command does for one --checkpoint: resolve, load onto the mesh, sample."""
    source = ev.resolve_source(path, None, None, "checkpoint")
    mesh = sharding.make_mesh({"data": -1}, devices=jax_devices(devices))
    model = ev.load_model(source, mesh, None)
    return ev.sample_problems(
        model, task, s, mesh=mesh, data_dir=data_dir, side=side, policy=source.identity, **kw
    )


def jax_devices(n):
    import jax

    return jax.devices()[:n]


def test_in_run_figures_equal_the_commands_on_the_same_samples(tiny):
    task = ParityArith(**KNOBS)
    s = settings(task)
    results = evaluate_path(tiny["run"], task, s, tiny["data"])
    figures = ev.summary(results, (1, 2, 4), "run")
    source = ev.resolve_source(tiny["run"], None, None, "checkpoint")
    model = ev.load_model(source, sharding.make_mesh({"data": 1}, devices=jax_devices(1)), None)
    in_run = evaluation.evaluate(
        model, task, num_problems=None, pass_k=4, batch_size=8, seed=0, data_dir=tiny["data"]
    )
    assert 0 < figures["avg@4"] < 1 and 0 < figures["greedy_accuracy"] < 1  # not all-or-nothing
    assert in_run["avg@4"] == in_run["sample_accuracy"] == figures["avg@4"]
    assert in_run["pass@4"] == figures["pass@4"]
    assert in_run["greedy_accuracy"] == figures["greedy_accuracy"]
    assert in_run["mean_response_length"] == figures["greedy_length_mean"]
    assert in_run["sample_mean_response_length"] == figures["length_mean"]
    assert in_run["num_problems"] == figures["num_problems"] == KNOBS["num_test"]
    levels = np.asarray(results["level"])
    assert set(levels.tolist()) == {"1 digit", "2 digits"}
    for level in ("1 digit", "2 digits"):  # the in-run figures by difficulty, by hand
        sel, name = levels == level, level.replace(" ", "_")
        want = np.mean(results["greedy_correct"][sel])  # float32 scores: rtol 1e-6
        np.testing.assert_allclose(in_run[f"greedy_accuracy/{name}"], want, rtol=1e-6)
        want = np.mean(np.asarray(results["sample_correct"])[sel])
        np.testing.assert_allclose(in_run[f"sample_accuracy/{name}"], want, rtol=1e-6)


def test_hf_folder_and_run_checkpoint_evaluate_to_the_same_numbers(tiny):
    task = ArithmeticTask(**KNOBS)
    s = settings(task)
    from_run = evaluate_path(tiny["run"], task, s, tiny["data"])
    from_hf = evaluate_path(tiny["hf"], task, s, tiny["data"])
    for k in from_run:
        np.testing.assert_array_equal(from_run[k], from_hf[k], err_msg=k)
    assert ev.summary(from_run, (1, 4), "a") == dict(ev.summary(from_hf, (1, 4), "a"))
    assert len(set(from_run["sample_length"].ravel().tolist())) > 1  # lengths tell models apart


def test_a_run_written_before_a_config_section_existed_still_evaluates(tiny, tmp_path):
    """A run directory whose config.json predates fields the schema has since gained (here the
    whole `env` section and rl.rollout_shrink, as runs written before them) loads with those
    fields at their defaults and evaluates to the same numbers as the current run."""
    old = tmp_path / "old_run"
    shutil.copytree(tiny["run"], old)
    with open(old / "config.json") as f:
        written = json.load(f)
    del written["env"], written["rl"]["rollout_shrink"]
    with open(old / "config.json", "w") as f:
        json.dump(written, f)
    task = ArithmeticTask(**KNOBS)
    s = settings(task, samples=2)
    got = evaluate_path(str(old), task, s, tiny["data"])
    want = evaluate_path(tiny["run"], task, s, tiny["data"])
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.long  # two engines and a mesh end to end (about 45 s): after the README's command
def test_data_parallel_and_continuous_engine_sample_the_same_problems(tiny):
    """Four devices (rows of a batch split over the data axis) and the continuous engine give
    the single-device static engine's per-problem results."""
    task = ParityArith(**KNOBS)
    one = evaluate_path(tiny["hf"], task, settings(task), tiny["data"])
    four = evaluate_path(tiny["hf"], task, settings(task), tiny["data"], devices=4)
    cont = evaluate_path(tiny["hf"], task, settings(task, engine="continuous"), tiny["data"])
    for k in one:
        np.testing.assert_array_equal(one[k], four[k], err_msg=k)
        np.testing.assert_array_equal(one[k], cont[k], err_msg=k)


def test_resume_does_not_redo_problems(tiny, monkeypatch):
    task = ParityArith(**KNOBS)
    s = settings(task)  # 24 problems in 3 batches of 8
    side = str(tiny["root"] / "resume.step3.problems.json")
    whole = evaluate_path(tiny["run"], task, s, tiny["data"])

    class Stop(Exception):
        pass

    def stop_after_first(i):
        raise Stop

    with pytest.raises(Stop):
        evaluate_path(tiny["run"], task, s, tiny["data"], side=side, on_batch=stop_after_first)
    assert list(json.load(open(side))["batches"]) == ["0"]
    sampled = []
    real = evaluation.sample_batch
    monkeypatch.setattr(
        evaluation, "sample_batch", lambda *a, **kw: sampled.append(a[4]) or real(*a, **kw)
    )
    resumed = evaluate_path(tiny["run"], task, s, tiny["data"], side=side)
    assert sampled == [1, 2]  # batch 0 came from the side file
    for k in whole:
        np.testing.assert_array_equal(whole[k], resumed[k], err_msg=k)
    with pytest.raises(ConfigError, match="other settings"):
        ev.read_side_file(side, dataclasses.replace(s, samples=8))
    with pytest.raises(ConfigError, match="another checkpoint"):
        ev.read_side_file(side, s, "hf:/elsewhere")


def test_moe_hf_folder_with_its_tokenizer_and_chat_template(tmp_path):
    """A released-style MoE folder (config.json, safetensors, tokenizer.json and Qwen3's chat
    template) on GSM8K's files: the task takes the folder's tokenizer, the MoE model samples."""
    from test_hf_tokenizer import QWEN_CONFIG, write_folder

    from gspo_jax import tasks

    ckpt = write_folder(tmp_path / "moe", QWEN_CONFIG, dict(eos_token_id=[2, 0]))
    vocab = tasks.HFTokenizer(ckpt).vocab_size
    cfg = models.get_model_config("tiny_moe", vocab_size=vocab, max_seq_len=160, num_layers=1)
    models.save_hf_checkpoint(random_model(cfg), ckpt)
    lines = open(os.path.join(runs.REPO, "tests", "data", "gsm8k_sample.jsonl")).readlines()
    gsm = tmp_path / "gsm8k"
    gsm.mkdir()
    (gsm / "train.jsonl").write_text("".join(lines[:4]))
    (gsm / "test.jsonl").write_text("".join(lines[4:8]))
    source = ev.resolve_source(str(ckpt), None, None, "checkpoint")
    task = ev.make_task(source, "gsm8k", {"data_path": str(gsm), "max_prompt_len": 128}, "test")
    assert isinstance(task.tokenizer, tasks.HFTokenizer) and task.config["tokenizer_path"]
    assert task.prompt_text({"question": "q"}).startswith("<|im_start|>user\n")
    s = settings(task, samples=2, max_new_tokens=8, batch_size=4)
    results = evaluate_path(str(ckpt), task, s, str(tmp_path / "data"))
    assert results["sample_correct"].shape == (4, 2) and results["greedy_length"].max() <= 8
    assert ev.summary(results, (1, 2), "moe")["num_problems"] == 4


# ------------------------------------------------------------------------------ bad input


def test_bad_input_is_one_line_before_any_work(tiny, tmp_path):
    with pytest.raises(ConfigError, match="is not a folder"):
        ev.resolve_source(str(tmp_path / "missing"), None, None, "checkpoint")
    with pytest.raises(ConfigError, match="neither a run directory"):
        ev.resolve_source(str(tmp_path), None, None, "checkpoint")
    with pytest.raises(ConfigError, match=r"no checkpoint of step 7; its checkpoints: \[3\]"):
        ev.resolve_source(tiny["run"], 7, None, "checkpoint")
    source = ev.resolve_source(tiny["run"], None, None, "checkpoint")
    with pytest.raises(ConfigError, match="has the splits"):
        ev.make_task(source, None, {}, "validation")
    with pytest.raises(ConfigError, match="not a task"):
        ev.make_task(source, "chess", {}, "test")
    with pytest.raises(ConfigError, match="1 <= k <= n"):
        ev.parse_ks("1,8", 4)
    only_train = tmp_path / "gsm8k"
    only_train.mkdir()
    with open(os.path.join(runs.REPO, "tests", "data", "gsm8k_sample.jsonl")) as f:
        (only_train / "train.jsonl").write_text("".join(f.readlines()[:3]))
    gsm8k = ev.make_task(source, "gsm8k", {"data_path": str(only_train)}, "test")
    with pytest.raises(ConfigError, match="no 'test' split"):  # the release lacks that file
        ev.check_data(gsm8k, "test", str(tmp_path / "data"))
    with pytest.raises(ConfigError, match="pass one of them"):
        ev.resolve_source(tiny["run"], None, "configs/arith.py", "checkpoint")
    hf_source = ev.resolve_source(tiny["hf"], None, None, "checkpoint")
    with pytest.raises(ConfigError, match="name its task"):
        ev.make_task(hf_source, None, {}, "test")
    # The command: one `error:` line, exit code 2, nothing loaded.
    cmd = [sys.executable, "-m", "gspo_jax.evaluate", "--checkpoint", tiny["run"], "--k=32"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=runs.REPO, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and p.stderr.startswith("error: --k=32"), p.stderr


# ------------------------------------------------------------------------------ the command


def test_config_may_name_a_run_directory_for_the_base_it_started_from(tiny, tmp_path):
    """--config RUN_DIR: the base under the run's own config.json (its overrides included), not a
    checkpoint; a folder without config.json is a one-line error."""
    source = ev.resolve_source(None, None, tiny["run"], "config")
    assert (source.kind, source.label) == ("config", "base")
    assert source.config.init.kind == "random" and source.config.task.kwargs.max_digits == 2
    with pytest.raises(ConfigError, match="without config.json"):
        ev.resolve_source(None, None, str(tmp_path), "config")


def test_command_end_to_end(tiny, tmp_path):
    out = tmp_path / "ev.json"
    cmd = [
        sys.executable,
        "-m",
        "gspo_jax.evaluate",
        f"--checkpoint={tiny['run']}",
        f"--compare={tiny['hf']}",
        "--task=arith",
        f"--data_dir={tiny['data']}",
        "--num_problems=8",
        "--samples=2",
        "--k=1,2",
        "--batch_size=4",
        "--resamples=200",
        f"--out={out}",
    ]
    env = dict(os.environ, PYTHONPATH=runs.REPO, XLA_FLAGS="")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.load(open(out))
    for key in ("greedy_accuracy", "avg@2", "pass@1", "pass@2", "length_mean"):
        assert key in result and key in result["compare"] and key in result["intervals"]
        assert result["difference"][key]["value"] == 0  # the same weights
    assert result["checkpoint"] == "step 3" and result["compare"]["checkpoint"] == "hf"
    assert set(result["by_difficulty"]) <= {"1 digit", "2 digits"}
    assert "greedy_accuracy" in p.stdout and "difference" in p.stdout
    assert (tmp_path / "ev.png").stat().st_size > 0
    assert (tmp_path / "ev.step3.problems.json").exists()
