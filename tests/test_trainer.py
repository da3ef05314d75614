"""End-to-end trainer runs (runlocal size): outputs, exact resume, 1 vs 8 devices, multi-host.

The shared runs and helpers are in tests/trainer_runs.py and tests/conftest.py.

Runs (4 RL steps each, checkpoints every 2):
  single   1 device, uninterrupted
  split    1 device, stopped after 3 steps (a "crash" one step past the step-2 checkpoint), then
           restarted in the same workdir: must equal `single` exactly (parameters and metrics)
  sharded  8 simulated devices: must equal `single` to float32 tolerance
  multi    2 processes x 4 simulated devices (jax.distributed on 127.0.0.1, gloo): must equal
           `sharded`; only process 0 writes
"""

import glob
import json
import math
import os
import shutil
import time

import pytest
import trainer_runs as runs
from trainer_runs import (
    STEPS,
    assert_records,
    assert_trees,
    final_params,
    make_config,
    records,
)

from gspo_jax.rl import trainer
from gspo_jax.runtime import metrics as metrics_lib


def test_run_writes_metrics_tensorboard_checkpoints_summary(single):
    wd, summary = single
    recs = records(wd, drop_time=False)
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]  # 0: the base evaluation
    for key in (
        "rollout/reward",
        "rollout/correct",
        "rollout/format",
        "rollout/response_len_mean",
        "rollout/len_correct_mean",  # by correctness (NaN when none): Dr. GRPO's length bias
        "rollout/len_wrong_mean",
        "rollout/response_len_max",
        "rollout/truncated_frac",
        "rollout/frac_zero_std_groups",
        "rollout/logp_diff_mean",
        "train/loss",
        "train/clip_frac",
        "train/clip_frac_low",
        "train/clip_frac_high",
        "train/seq_clip_frac",
        "train/ratio_mean",
        "train/ratio_min",
        "train/ratio_max",
        "train/entropy",
        "train/grad_norm",
        "train/lr",
        "time/rollout_s",
        "time/reward_s",
        "time/update_s",
        "time/tokens_per_s",
    ):
        assert key in recs[1], key
    assert "eval/greedy_accuracy" in recs[0] and "eval/greedy_accuracy" in recs[-1]
    # the policy actually moved (a test of equality below would be vacuous otherwise)
    assert any(r["train/grad_norm"] > 0 for r in recs[1:])
    # sampler and trainer compute the same log-probs (GSPO's ε = 3e-4 depends on it)
    assert all(abs(r["rollout/logp_diff_mean"]) < 1e-5 for r in recs[1:])
    assert glob.glob(os.path.join(wd, "tb", "events.out.tfevents.*"))
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2", "4"]
    assert json.load(open(os.path.join(wd, "config.json")))["objective"]["name"] == "gspo"
    on_disk = json.load(open(os.path.join(wd, "summary.json")))
    assert on_disk["steps"] == STEPS and on_disk["wall_s"] > 0
    # CPU seconds, the cost on a shared machine: the whole process's and the RL loop's within it
    assert on_disk["cpu_s"] >= on_disk["rl_cpu_s"] > 0 and on_disk["warmstart_cpu_s"] >= 0
    assert set(on_disk["base"]) >= {"greedy_accuracy", "mean_response_length"}
    assert on_disk["final"]["greedy_accuracy"] == summary["final"]["greedy_accuracy"]


def test_interrupted_run_resumes_exactly(shared, single):
    wd = os.path.join(shared["root"], "split")
    cfg = make_config(shared, num_devices=1)
    assert trainer.train(cfg, wd, stop_after=3) is None  # "crash" after step 3
    assert [r["step"] for r in records(wd)] == [0, 1, 2, 3]
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2"]  # step 3 is lost
    assert not os.path.exists(os.path.join(wd, "summary.json"))
    c0 = time.process_time()
    summary = trainer.train(cfg, wd)  # the same command again: resumes from step 2
    assert summary["steps"] == STEPS
    # the CPU seconds carry over the resume: more than this invocation's alone
    assert summary["cpu_s"] > time.process_time() - c0
    assert_trees(final_params(wd), final_params(single[0]))
    assert_records(records(wd), records(single[0]))


def test_eight_devices_equal_one(single, sharded):
    assert_trees(final_params(sharded), final_params(single[0]), rtol=2e-5, atol=2e-6)
    assert_records(records(sharded), records(single[0]), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_process_run_equals_one_process(two_process, sharded):
    wd, outs = two_process
    assert "== summary" in outs[0] and "== summary" not in outs[1]  # only process 0 prints
    assert len(glob.glob(os.path.join(wd, "tb", "events.out.tfevents.*"))) == 1
    assert_trees(final_params(wd), final_params(sharded), rtol=2e-5, atol=2e-6)
    assert_records(records(wd), records(sharded), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_process_checkpoint_resumes_on_eight_devices_of_one_process(
    shared, two_process, sharded
):
    """A pod run's checkpoint (2 processes) resumes on one process with 8 devices."""
    wd = os.path.join(shared["root"], "multi_to_8")
    shutil.copytree(two_process[0], wd)
    shutil.rmtree(os.path.join(wd, "checkpoints", str(STEPS)))  # as if it stopped after step 2
    os.remove(os.path.join(wd, "summary.json"))
    summary = trainer.train(make_config(shared, num_devices=8), wd)
    assert summary["steps"] == STEPS
    assert_trees(final_params(wd), final_params(sharded), rtol=2e-5, atol=2e-6)
    assert_records(records(wd), records(sharded), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("first_devices", [8, 1])
def test_resume_on_eight_devices(shared, sharded, first_devices):
    """Stopped after 3 steps on 8 (or 1) devices, resumed on 8: equals the 8-device run. (The
    optimizer's scalar step count used to restore onto device 0 and fail the first update.)"""
    wd = os.path.join(shared["root"], f"resume_{first_devices}_to_8")
    assert trainer.train(make_config(shared, num_devices=first_devices), wd, stop_after=3) is None
    summary = trainer.train(make_config(shared, num_devices=8), wd)
    assert summary["steps"] == STEPS
    tol = dict(rtol=2e-5, atol=2e-6)
    assert_trees(final_params(wd), final_params(sharded), **tol)
    assert_records(records(wd), records(sharded), rtol=1e-4, atol=1e-5)


def test_non_finite_loss_stops_after_last_good_checkpoint(shared, single, monkeypatch):
    def poison(step, m):
        if step == 3:
            m["train/loss"] = float("nan")

    runs.edit_step_metrics(monkeypatch, poison)
    wd = os.path.join(shared["root"], "nan")
    with pytest.raises(metrics_lib.NonFiniteError, match="train/loss=nan at step 3") as e:
        trainer.train(make_config(shared, num_devices=1), wd)
    assert "the newest checkpoint is step 2 in" in str(e.value)
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2"]  # committed, not tmp
    assert [r["step"] for r in records(wd)] == [0, 1, 2]  # the bad step was not logged
    assert not os.path.exists(os.path.join(wd, "summary.json"))
    assert_trees(final_params(wd, step=2), final_params(single[0], step=2))


def test_divergence_before_any_checkpoint_says_none_exists(shared, monkeypatch):
    runs.edit_step_metrics(monkeypatch, lambda step, m: m.update({"train/grad_norm": math.inf}))
    wd = os.path.join(shared["root"], "nan_first")
    with pytest.raises(metrics_lib.NonFiniteError, match="grad_norm=inf at step 1") as e:
        trainer.train(make_config(shared, num_devices=1), wd)
    assert "no checkpoint has been written yet" in str(e.value)
    assert "intact" not in str(e.value)
