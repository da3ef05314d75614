"""Metric writers, resume truncation, the non-finite guard and the progress bar."""

import glob
import json
import math
import os

import jax
import jax.numpy as jnp
import pytest

from gspo_jax.runtime import metrics as metrics_lib


def test_writer_jsonl_tensorboard_and_config(tmp_path):
    w = metrics_lib.MetricWriter(str(tmp_path))
    w.write_config({"seed": 1, "objective": {"name": "gspo"}})
    w.write(1, {"train/loss": 0.5, "rollout/reward": jnp.float32(0.25)})
    w.write(2, {"train/loss": 0.4, "eval/greedy_accuracy": 0.7, "time/step_s": 1.0})
    w.close()
    recs = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[0]["rollout/reward"] == 0.25 and recs[1]["eval/greedy_accuracy"] == 0.7
    assert json.load(open(tmp_path / "config.json"))["objective"]["name"] == "gspo"
    events = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert events and os.path.getsize(events[0]) > 0
    # The scalars are in the event file (tags are stored verbatim).
    blob = open(events[0], "rb").read()
    assert b"train/loss" in blob and b"eval/greedy_accuracy" in blob


def test_writer_rejects_unprefixed_names(tmp_path):
    w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=False)
    with pytest.raises(ValueError, match="lack a prefix"):
        w.write(1, {"loss": 1.0})
    w.close()
    assert metrics_lib.with_prefix("train/", {"loss": 1, "eval/x": 2}) == {
        "train/loss": 1,
        "eval/x": 2,
    }
    with pytest.raises(ValueError, match="prefix"):
        metrics_lib.with_prefix("foo/", {})


def test_resume_truncates_later_records(tmp_path):
    w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=False)
    for s in range(1, 6):
        w.write(s, {"train/loss": float(s)})
    w.close()
    w = metrics_lib.MetricWriter(str(tmp_path), resume_step=3, tensorboard=False)
    w.write(4, {"train/loss": 40.0})
    w.close()
    recs = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [(r["step"], r["train/loss"]) for r in recs] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_only_process_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    w = metrics_lib.MetricWriter(str(tmp_path))
    w.write_config({"a": 1})
    w.write(1, {"train/loss": 1.0})
    w.close()
    assert os.listdir(tmp_path) == []


def test_non_finite_guard_names_the_quantity():
    metrics_lib.check_finite({"train/loss": 1.0, "train/grad_norm": 2.0}, step=3)
    metrics_lib.check_finite({"train/loss": 1.0, "train/ratio_max": math.nan}, step=3)  # diagnostic
    with pytest.raises(metrics_lib.NonFiniteError, match=r"train/grad_norm=inf at step 7"):
        metrics_lib.check_finite({"train/loss": 1.0, "train/grad_norm": math.inf}, step=7)
    with pytest.raises(FloatingPointError, match=r"train/loss=nan.*last checkpoint"):
        metrics_lib.check_finite({"train/loss": math.nan}, step=1)


def test_non_finite_values_stay_valid_json(tmp_path):
    w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=False)
    w.write(1, {"train/ratio_max": math.inf})
    w.close()
    assert '"inf"' in (tmp_path / "metrics.jsonl").read_text()  # valid JSON on disk
    assert metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))[0]["train/ratio_max"] == math.inf


def test_to_host_scalars_and_progress(capsys):
    m = metrics_lib.to_host_scalars({"a": jnp.ones(()), "b": 2})
    assert m == {"a": 1.0, "b": 2.0}
    with pytest.raises(ValueError, match="scalars"):
        metrics_lib.to_host_scalars({"a": jnp.ones(3)})
    p = metrics_lib.Progress(total=2)
    p.update({"rollout/reward": 0.5, "train/clip_frac": 0.1})
    p.write("hello")
    p.update({"eval/greedy_accuracy": 0.9})
    p.close()
    err = capsys.readouterr()
    assert "hello" in err.out + err.err
    assert "rew=0.500" in err.err and "eval=0.900" in err.err


def test_non_finite_scalars_stay_in_jsonl_but_not_tensorboard(tmp_path):
    w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=True)
    sent = []
    w._tb.add_scalar = lambda k, v, global_step: sent.append((k, v))
    w.write(1, {"train/loss": 1.5, "train/ratio_max": math.nan, "train/kl_ref": math.inf})
    w.close()
    assert sent == [("train/loss", 1.5)]
    rec = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))[0]
    assert math.isnan(rec["train/ratio_max"]) and rec["train/kl_ref"] == math.inf


def test_fresh_start_in_a_used_workdir_keeps_the_old_log_aside(tmp_path):
    w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=False)
    w.write(1, {"train/loss": 1.0})
    w.close()
    w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=False)  # no checkpoint: step 0 again
    w.write(1, {"train/loss": 2.0})
    w.close()
    assert w.metrics_aside == str(tmp_path / "metrics.1.jsonl")
    assert [r["train/loss"] for r in metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))] == [
        2.0
    ]
    assert [r["train/loss"] for r in metrics_lib.read_jsonl(w.metrics_aside)] == [1.0]


def test_collapse_watch_warns_once_per_stretch():
    watch = metrics_lib.CollapseWatch(patience=3)
    flat, live = {"rollout/frac_zero_std_groups": 1.0}, {"rollout/frac_zero_std_groups": 0.5}
    said = [watch.update(s, m) for s, m in enumerate([flat] * 5 + [live] + [flat] * 3, start=1)]
    warned = [s for s, msg in enumerate(said, start=1) if msg]
    assert warned == [3, 9]  # once at step 3 (stretch 1-5), once at step 9 (stretch 7-9)
    assert "steps 1-3" in said[2] and "steps 7-9" in said[8]
    assert all(m is None for m in (metrics_lib.CollapseWatch(0).update(1, flat),))


def test_summary_json_is_strict():
    from gspo_jax.runtime import rundir

    s = rundir.strict_json({"a": math.nan, "b": [1.0, math.inf], "c": {"d": 2}})
    assert json.loads(json.dumps(s, allow_nan=False)) == {
        "a": None,
        "b": [1.0, None],
        "c": {"d": 2},
    }
