"""Warm start and evaluation: a tiny warm start beats the untrained model; the cache is reused."""

import dataclasses
import json
import math
import os
import time

import jax
import numpy as np
import pytest
from flax import nnx

from gspo_jax import models
from gspo_jax import tasks as tasks_lib
from gspo_jax.rl import evaluation, warmstart

# Two-number countdown: the tiny preset learns to copy the numbers and pick an operator in a few
# hundred steps (held-out greedy accuracy ~0.2 vs 0 untrained), which is what a test can afford.
_KNOBS = dict(num_numbers=2, max_number=20, num_train=400, num_test=64)
_WARM = dict(steps=250, batch_size=32, learning_rate=1e-2, warmup_steps=10)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    task = tasks_lib.get_task("countdown", **_KNOBS)
    cfg = models.get_model_config("tiny", vocab_size=task.tokenizer.vocab_size, max_seq_len=64)
    root = tmp_path_factory.mktemp("ws")
    return task, cfg, str(root / "tfds"), str(root / "cache")


def _eval(model, task, data_dir):
    return evaluation.evaluate(
        model, task, num_problems=64, pass_k=4, batch_size=64, data_dir=data_dir
    )


def test_tiny_warm_start_beats_untrained_and_is_cached(setup):
    task, cfg, data_dir, cache_dir = setup
    before = _eval(models.Transformer(cfg, rngs=nnx.Rngs(0)), task, data_dir)
    t0 = time.time()
    model = warmstart.get_base_model(task, cfg, _WARM, cache_dir, data_dir=data_dir, progress=False)
    train_s = time.time() - t0
    after = _eval(model, task, data_dir)
    assert before["greedy_accuracy"] <= 0.05
    assert after["greedy_accuracy"] >= before["greedy_accuracy"] + 0.1, (before, after)
    assert after["greedy_format"] > 0.8 and after["greedy_reward"] > before["greedy_reward"]

    # Same configs: loaded from the orbax cache (no training), identical parameters.
    t0 = time.time()
    again = warmstart.get_base_model(task, cfg, _WARM, cache_dir, data_dir=data_dir, progress=False)
    assert time.time() - t0 < train_s
    for x, y in zip(
        jax.tree.leaves(nnx.state(model, nnx.Param)),
        jax.tree.leaves(nnx.state(again, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_cache_key_covers_every_config(setup):
    task, cfg, _, _ = setup
    base = warmstart.cache_key(task, cfg, warmstart.as_warm_config(_WARM))
    assert base == warmstart.cache_key(task, cfg, warmstart.as_warm_config(dict(_WARM)))
    assert base != warmstart.cache_key(task, cfg, warmstart.as_warm_config({**_WARM, "seed": 1}))
    assert base != warmstart.cache_key(
        tasks_lib.get_task("countdown", **{**_KNOBS, "wrong_fraction": 0.5}),
        cfg,
        warmstart.as_warm_config(_WARM),
    )
    assert base != warmstart.cache_key(
        task,
        models.get_model_config("tiny", vocab_size=task.tokenizer.vocab_size, max_seq_len=128),
        warmstart.as_warm_config(_WARM),
    )
    # The execution fields compute the same function in another summation order, which the warm
    # start amplifies into another model: each keys the cache (a blockwise run gets its own
    # base, not whichever kernel filled the cache first); at its default it leaves the key as is.
    warm = warmstart.as_warm_config(_WARM)
    for field, value in dict(
        attention="blockwise", attention_block=8, remat="full", moe_dispatch="dense"
    ).items():
        assert base != warmstart.cache_key(task, dataclasses.replace(cfg, **{field: value}), warm)
    defaults = {f: getattr(models.ModelConfig(), f) for f in models.EXECUTION_FIELDS}
    assert base == warmstart.cache_key(task, dataclasses.replace(cfg, **defaults), warm)
    # The stopping rule keys it when it is on; its fields are inert (and unkeyed) when it is off.
    assert base == warmstart.cache_key(task, cfg, {**_WARM, "stop_threshold": 0.5})
    on = warmstart.cache_key(task, cfg, {**_WARM, "stop_every": 50})
    assert (
        base
        != on
        != warmstart.cache_key(task, cfg, {**_WARM, "stop_every": 50, "stop_threshold": 0.5})
    )


def test_bad_warm_configs_fail_early(setup):
    task, _, _, _ = setup
    with pytest.raises(ValueError, match="valid fields"):
        warmstart.as_warm_config(dict(step=10))
    with pytest.raises(ValueError, match="steps"):
        warmstart.as_warm_config(dict(steps=0))
    small_vocab = models.get_model_config("tiny", vocab_size=8)
    with pytest.raises(ValueError, match="vocab_size"):
        warmstart.train(task, small_vocab, dict(steps=1))


def test_demonstration_batches(setup):
    task, _, data_dir, _ = setup
    it = warmstart.demonstration_iterator(task, batch_size=8, seed=0, data_dir=data_dir)
    b = next(it)
    assert b["response"].shape == b["mask"].shape == (8, task.max_response_len)
    for resp, mask in zip(b["response"], b["mask"], strict=True):
        n = int(mask.sum())
        assert resp[n - 1] == task.tokenizer.eos_id and (resp[n:] == task.tokenizer.pad_id).all()


def test_evaluate_reports_formats_and_untrained_is_nan_safe(setup):
    _, _, data_dir, _ = setup
    task = tasks_lib.get_task("arith", num_train=100, num_test=16)
    cfg = models.get_model_config("tiny", vocab_size=task.tokenizer.vocab_size, max_seq_len=64)
    m = evaluation.evaluate(
        models.Transformer(cfg, rngs=nnx.Rngs(1)),
        task,
        num_problems=16,
        pass_k=2,
        batch_size=16,
        data_dir=data_dir,
    )
    for k in (
        "greedy_accuracy",
        "pass@2",
        "mean_response_length",
        "worked_accuracy",
        "direct_accuracy",
        "worked_fraction",
        "greedy_worked_fraction",
        "num_problems",
    ):
        assert k in m
    assert m["num_problems"] == 16
    assert 0 <= m["mean_response_length"] <= task.max_response_len
    for k, v in m.items():
        assert isinstance(v, float) and (math.isfinite(v) or k.endswith("_accuracy"))


def _assert_on_mesh(model, mesh):
    from gspo_jax import sharding

    state = nnx.state(model)
    want = sharding.state_shardings(state, mesh)
    for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True):
        assert x.sharding.is_equivalent_to(s, x.ndim)
    assert any(
        len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
        for x in jax.tree.leaves(state)
    )


def _assert_same_numbers(a, b):
    for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_base_model_comes_on_the_mesh_when_loaded_or_trained(setup, tmp_path):
    """With a mesh, the base comes back sharded by the model's logical rules (how the trainer
    loads it, one shard per device, also in multi-host runs) with the same numbers: restored
    from the cache, and just trained."""
    from gspo_jax import sharding

    task, cfg, data_dir, cache_dir = setup
    mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
    plain = warmstart.get_base_model(task, cfg, _WARM, cache_dir, data_dir=data_dir, progress=False)
    restored = warmstart.get_base_model(
        task, cfg, _WARM, cache_dir, data_dir=data_dir, progress=False, mesh=mesh
    )
    _assert_on_mesh(restored, mesh)
    _assert_same_numbers(plain, restored)

    short = {**_WARM, "steps": 2}
    trained = warmstart.get_base_model(
        task, cfg, short, str(tmp_path), data_dir=data_dir, progress=False, mesh=mesh
    )  # cold cache: trains
    _assert_on_mesh(trained, mesh)
    _assert_same_numbers(
        trained,
        warmstart.get_base_model(
            task, cfg, short, str(tmp_path), data_dir=data_dir, progress=False
        ),
    )


def test_multi_process_run_with_cold_cache_fails_before_training(setup, monkeypatch, tmp_path):
    task, cfg, data_dir, _ = setup
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(warmstart, "train", lambda *a, **k: pytest.fail("trained on every host"))
    with pytest.raises(FileNotFoundError, match="--prepare_only"):
        warmstart.get_base_model(task, cfg, _WARM, str(tmp_path), data_dir=data_dir, progress=False)


def test_train_callback_sees_the_model_every_n_steps(setup):
    task, cfg, data_dir, _ = setup
    seen = []
    final, stats = warmstart.train(
        task,
        cfg,
        {**_WARM, "steps": 5},
        data_dir=data_dir,
        progress=False,
        callback_every=2,
        callback=lambda step, m: seen.append((step, m)),
    )
    assert [step for step, _ in seen] == [2, 4, 5]
    assert stats["steps"] == 5 and math.isfinite(stats["final_loss"])
    # The models it was given stay readable after training went on (the step donates its
    # parameters), hold that step's parameters, and the last one is the returned model.
    kernels = [np.asarray(jax.tree.leaves(nnx.state(m, nnx.Param))[0]) for _, m in seen]
    assert not np.array_equal(kernels[0], kernels[1])
    np.testing.assert_array_equal(
        kernels[2], np.asarray(jax.tree.leaves(nnx.state(final, nnx.Param))[0])
    )
    with pytest.raises(ValueError, match="callback_every"):
        warmstart.train(
            task,
            cfg,
            {**_WARM, "steps": 1},
            data_dir=data_dir,
            progress=False,
            callback=lambda step, m: None,
        )


def test_default_steps_come_from_the_task(setup):
    task, cfg, _, _ = setup
    arith = tasks_lib.get_task("arith", num_train=100, num_test=16)
    assert warmstart.as_warm_config(None, task).steps == task.warm_start_steps == 4800
    assert warmstart.as_warm_config({"seed": 1}, arith).steps == arith.warm_start_steps == 2400
    assert warmstart.as_warm_config(dict(steps=7), task).steps == 7  # explicit steps win
    # The cache is keyed by the resolved step count: steps=None and the task's own are one base.
    assert warmstart.cache_key(task, cfg, None) == warmstart.cache_key(
        task, cfg, dict(steps=task.warm_start_steps)
    )
    with pytest.raises(ValueError, match="step count"):
        warmstart.make_optimizer(warmstart.WarmStartConfig())


@pytest.mark.long  # trains a warm start with its checks (about 90 s): after the README's command
def test_a_ceiling_returns_the_latest_check_at_or_below_it(setup, monkeypatch):
    """With stop_ceiling, a check that meets the rule above the ceiling (a format learned in a
    jump between checks) is not the base: the parameters of the latest check at or below the
    ceiling are, and meta's stop_kept_step names it. Scripted check values: 0.1, 0.2, then 0.9."""
    task, cfg, data_dir, _ = setup
    values = iter([0.0, 0.1, 0.2, 0.9])  # the first: the metric's check when the rule is built
    monkeypatch.setattr(
        warmstart._StoppingRule, "_evaluate", lambda self, model, num_problems: next(values)
    )
    rule = dict(stop_every=3, stop_metric="greedy_format", stop_problems=16, stop_samples=1)
    warm = {**_WARM, **rule, "steps": 20, "stop_threshold": 0.25, "stop_patience": 1}
    seen = {}

    def keep(step, model):
        seen[step] = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))

    model, stats = warmstart.train(
        task, cfg, {**warm, "stop_ceiling": 0.45}, data_dir=data_dir, progress=False,
        callback=keep, callback_every=3,
    )  # fmt: skip
    assert stats["steps"] == 9 and stats["stop_met"] and stats["stop_kept_step"] == 6
    got = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, got, seen[6])))
    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, got, seen[9])))
    # without a ceiling the key is as before; a ceiling below the threshold is refused
    assert warmstart.cache_key(task, cfg, warm) != warmstart.cache_key(
        task, cfg, {**warm, "stop_ceiling": 0.45}
    )
    assert (
        "stop_ceiling" not in warmstart._keyed_fields(cfg, warmstart.as_warm_config(warm))["warm"]
    )
    with pytest.raises(ValueError, match="stop_ceiling"):
        warmstart.as_warm_config({**warm, "stop_ceiling": 0.1})


@pytest.mark.long  # trains a warm start with its checks (about 90 s): after the README's command
def test_a_look_back_returns_the_latest_parameters_at_or_below_the_ceiling(setup, monkeypatch):
    """With stop_lookback, the parameters kept every few steps between the kept check and the
    one that overshot are evaluated newest first, and the first at or below the ceiling is the
    base (meta: stop_kept_step and stop_lookback_checks). Scripted values: check 4 at 0.2, check 8
    at 0.9 (met above the ceiling 0.45), then step 7 at 0.6 and step 6 at 0.3."""
    task, cfg, data_dir, _ = setup
    values = iter([0.0, 0.2, 0.9, 0.6, 0.3])  # the first: the metric's check when built
    monkeypatch.setattr(
        warmstart._StoppingRule, "_evaluate", lambda self, model, num_problems: next(values)
    )
    rule = dict(stop_every=4, stop_metric="greedy_format", stop_problems=16, stop_samples=1)
    warm = {**_WARM, **rule, "steps": 20, "stop_threshold": 0.25, "stop_patience": 1}
    warm = {**warm, "stop_ceiling": 0.45, "stop_lookback": 1}
    seen = {}

    def keep(step, model):
        seen[step] = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))

    model, stats = warmstart.train(
        task, cfg, warm, data_dir=data_dir, progress=False, callback=keep, callback_every=1
    )
    assert stats["steps"] == 8 and stats["stop_met"] and stats["stop_kept_step"] == 6
    assert stats["stop_lookback_checks"] == [(7, 0.6), (6, 0.3)]
    got = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, got, seen[6])))
    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, got, seen[4])))
    # the look back keys the cache; one without a ceiling, or not dividing the checks, is refused
    no_look = {**warm, "stop_lookback": 0}
    assert warmstart.cache_key(task, cfg, warm) != warmstart.cache_key(task, cfg, no_look)
    assert (
        "stop_lookback"
        not in warmstart._keyed_fields(cfg, warmstart.as_warm_config(no_look))["warm"]
    )
    for bad in ({"stop_ceiling": 0.0}, {"stop_lookback": 3}, {"stop_lookback": 4}):
        with pytest.raises(ValueError, match="stop_lookback"):
            warmstart.as_warm_config({**warm, **bad})


def test_stopping_rule_stops_after_patience_checks_and_is_recorded(setup, tmp_path, capsys):
    """The rule checks stop_metric every stop_every steps on held-out problems and stops at the
    first stop_patience passing checks in a row; a threshold never met trains to the cap, says
    so, and meta.json records the checks either way."""
    task, cfg, data_dir, _ = setup
    rule = dict(stop_every=3, stop_metric="greedy_format", stop_problems=16, stop_samples=1)
    always = {**_WARM, **rule, "steps": 20, "stop_threshold": 0.0, "stop_patience": 2}
    model = warmstart.get_base_model(
        task, cfg, always, str(tmp_path), data_dir=data_dir, progress=False
    )
    with open(f"{warmstart.cache_path(task, cfg, always, str(tmp_path))}/meta.json") as f:
        meta = json.load(f)
    assert meta["steps"] == 6 and meta["stop_met"] is True and meta["cpu_s"] > 0
    assert [s for s, _ in meta["stop_checks"]] == [3, 6] and meta["warm"]["stop_every"] == 3
    assert model is not None
    # each check's headline metrics from the same evaluation: the rule's, and the sampled ones
    for (s, v), (s_m, m) in zip(meta["stop_checks"], meta["stop_check_metrics"], strict=True):
        assert s == s_m and m["greedy_format"] == v and 0.0 <= m["sample_accuracy"] <= 1.0

    never = {**always, "steps": 7, "stop_threshold": 1.5}
    _, stats = warmstart.train(task, cfg, never, data_dir=data_dir, progress=False)
    assert stats["steps"] == 7 and stats["stop_met"] is False
    assert [s for s, _ in stats["stop_checks"]] == [3, 6]
    err = capsys.readouterr().err
    assert "stopping rule (greedy_format >= 1.5 at 2 checks in a row) was not met" in err
    # no progress bar (a log file): one line per check says how far the warm start is
    for s, v in stats["stop_checks"]:
        assert f"warm start step {s}/7: greedy_format {v:.3f} (stops at 1.5)" in err
    with pytest.raises(ValueError, match="stop_metric='worked_accuracy' is not one of"):
        warmstart.train(
            task,
            cfg,
            {**always, "stop_metric": "worked_accuracy"},
            data_dir=data_dir,
            progress=False,
        )
    with pytest.raises(ValueError, match="stop_patience"):
        warmstart.as_warm_config({**always, "stop_patience": 0})


class _Killed(Exception):
    pass


@pytest.mark.long  # three short trainings with their checks (~35 s): after the README's command
def test_an_interrupted_warm_start_resumes_to_the_same_parameters(setup, tmp_path, capsys):
    """A warm start killed part way resumes from its progress (<entry>.progress: saved at each
    stopping check) and ends with the parameters, checks and loss of the uninterrupted one: the
    data iterator's position, the optimizer's state and the rule's checks all carry over; the
    progress is gone once the entry is written."""
    task, cfg, data_dir, _ = setup
    rule = dict(stop_every=3, stop_metric="greedy_format", stop_problems=8, stop_samples=1)
    warm = {**_WARM, **rule, "steps": 10, "stop_threshold": 1.5, "stop_patience": 1}
    whole, whole_stats = warmstart.train(task, cfg, warm, data_dir=data_dir, progress=False)

    def kill_at_7(step, model):
        if step == 7:
            raise _Killed  # after the progress of step 6 was saved

    cache = str(tmp_path / "cache")
    path = warmstart.cache_path(task, cfg, warm, cache)
    with pytest.raises(_Killed):
        warmstart.train(
            task,
            cfg,
            warm,
            data_dir=data_dir,
            progress=False,
            callback=kill_at_7,
            callback_every=1,
            progress_dir=f"{path}.progress",
        )
    with open(f"{path}.progress/state.json") as f:
        assert json.load(f)["step"] == 6
    resumed = warmstart.get_base_model(task, cfg, warm, cache, data_dir=data_dir, progress=False)
    assert "resuming at step 6" in capsys.readouterr().err
    for x, y in zip(
        jax.tree.leaves(nnx.state(whole, nnx.Param)),
        jax.tree.leaves(nnx.state(resumed, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not os.path.exists(f"{path}.progress")
    with open(f"{path}/meta.json") as f:
        meta = json.load(f)
    assert meta["steps"] == 10 and meta["final_loss"] == pytest.approx(whole_stats["final_loss"])
    assert meta["stop_checks"] == [list(c) for c in whole_stats["stop_checks"]]
