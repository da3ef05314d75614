"""What a run survives and what it refuses: corrupt checkpoints, a changed config, a file in place
of the checkpoint folder, SIGTERM with a save in flight, a failing disk, a collapsed policy.

Every run here starts from a copy of the shared 1-device run (tests/trainer_runs.py) or reruns
its shapes, so nothing recompiles; a resumed run must still equal the uninterrupted one exactly.
"""

import json
import os
import shutil
import signal
import time

import jax
import pytest
from trainer_runs import (
    STEPS,
    assert_records,
    assert_trees,
    edit_step_metrics,
    final_params,
    make_config,
    records,
)

from gspo_jax import config as config_lib
from gspo_jax.rl import step as ts
from gspo_jax.rl import trainer
from gspo_jax.runtime import checkpoint as checkpoint_lib


def _copy_of_single(shared, single, name, *, keep_summary=False) -> str:
    wd = os.path.join(shared["root"], name)
    shutil.copytree(single[0], wd)
    if not keep_summary:
        os.remove(os.path.join(wd, "summary.json"))
    return wd


def _steps(wd) -> list[int]:
    return [r["step"] for r in records(wd)]


def test_truncated_newest_checkpoint_falls_back_and_resumes_exactly(shared, single, capfd):
    wd = _copy_of_single(shared, single, "corrupt_newest")
    d = os.path.join(wd, "checkpoints", str(STEPS), "state")
    data = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if os.path.basename(r) == "d"]
    assert data
    for path in data:  # truncate every array data file of the step-4 checkpoint
        with open(path, "r+b") as f:
            f.truncate(10)
    summary = trainer.train(make_config(shared, num_devices=1), wd)
    out, err = capfd.readouterr()
    assert "Event loop is closed" not in err and "Traceback" not in err, err[-3000:]
    line = [x for x in out.splitlines() if "unreadable" in x]
    assert len(line) == 1 and line[0].startswith(f"checkpoint step {STEPS} is unreadable (")
    assert "falling back to step 2" in line[0] and "resumed from step 2" in out
    assert summary["steps"] == STEPS
    assert_trees(final_params(wd), final_params(single[0]))
    assert_records(records(wd), records(single[0]))  # no step logged twice
    assert os.path.exists(os.path.join(wd, "metrics.1.jsonl"))  # the old log is kept aside
    assert any(
        n.startswith(f"{STEPS}.unreadable-") for n in os.listdir(os.path.join(wd, "checkpoints"))
    )


def test_emptied_checkpoint_folder_starts_over_without_duplicate_steps(shared, single, capsys):
    wd = _copy_of_single(shared, single, "emptied")
    old = records(wd)
    ck_dir = os.path.join(wd, "checkpoints")
    shutil.rmtree(ck_dir)
    os.mkdir(ck_dir)
    trainer.train(make_config(shared, num_devices=1), wd)
    assert "starting from step 0" in capsys.readouterr().out
    assert _steps(wd) == list(range(STEPS + 1))  # each step once
    kept = [json.loads(x) for x in open(os.path.join(wd, "metrics.1.jsonl"))]
    assert [r["step"] for r in kept] == [r["step"] for r in old]
    assert_trees(final_params(wd), final_params(single[0]))


def test_a_file_in_place_of_the_checkpoint_folder_fails_before_any_work(shared, tmp_path):
    wd = str(tmp_path / "run")
    os.makedirs(wd)
    with open(os.path.join(wd, "checkpoints"), "w") as f:
        f.write("oops")
    with pytest.raises(checkpoint_lib.CheckpointError, match="is a file, not a checkpoint folder"):
        trainer.train(make_config(shared, num_devices=1), wd)
    assert sorted(os.listdir(wd)) == ["checkpoints"]  # nothing written, nothing trained


def test_no_readable_checkpoint_refuses_then_start_fresh_moves_it_aside(shared, single):
    wd = _copy_of_single(shared, single, "all_unreadable")
    for step in (2, STEPS):
        shutil.rmtree(os.path.join(wd, "checkpoints", str(step), "state"))
    with pytest.raises(checkpoint_lib.CheckpointError, match="could be restored") as e:
        trainer.train(make_config(shared, num_devices=1), wd)
    assert "--start_fresh" in str(e.value)
    assert _steps(wd) == list(range(STEPS + 1))  # the log is untouched by the refused start
    summary = trainer.train(make_config(shared, num_devices=1), wd, start_fresh=True)
    assert summary["steps"] == STEPS
    assert any(n.startswith("checkpoints.moved-") for n in os.listdir(wd))
    assert any(n.startswith("base_eval.json.moved-") for n in os.listdir(wd))  # the old run's
    assert_trees(final_params(wd), final_params(single[0]))


def test_changed_config_is_refused_safe_changes_and_the_flag_are_allowed(shared, single, capsys):
    wd = _copy_of_single(shared, single, "config_change")
    config_json = open(os.path.join(wd, "config.json")).read()
    changed = make_config(shared, num_devices=1)
    changed.objective.name = "grpo"
    changed.rl.group_size = 2
    with pytest.raises(config_lib.ConfigError) as e:
        trainer.train(changed, wd)
    msg = str(e.value)
    assert "objective.name 'gspo' -> 'grpo'" in msg and "rl.group_size 4 -> 2" in msg
    assert "--allow_config_change" in msg and "\n" not in msg
    assert open(os.path.join(wd, "config.json")).read() == config_json  # the record is intact

    longer = make_config(shared, num_devices=1)
    longer.rl.num_steps = STEPS + 1  # safe: a longer run of the same experiment
    longer.eval.num_problems = 4
    assert trainer.train(longer, wd)["steps"] == STEPS + 1
    assert "resuming with changed" in capsys.readouterr().out
    assert open(os.path.join(wd, "config.1.json")).read() == config_json  # earlier version kept

    grpo = make_config(shared, num_devices=1)
    grpo.objective.name = "grpo"
    grpo.rl.num_steps = STEPS + 2
    assert trainer.train(grpo, wd, allow_config_change=True)["steps"] == STEPS + 2
    assert json.load(open(os.path.join(wd, "config.json")))["objective"]["name"] == "grpo"
    assert _steps(wd) == list(range(STEPS + 3))


def _slow_saves(monkeypatch, seconds):
    """Every array write takes ``seconds`` longer, in the background (a save stays in flight)."""
    import orbax.checkpoint as ocp

    class _Slow:
        def result(self, timeout=None):
            time.sleep(seconds)

    real = ocp.type_handlers.ArrayHandler.serialize

    async def serialize(self, *args, **kwargs):
        return [*(await real(self, *args, **kwargs)), _Slow()]

    monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "serialize", serialize)


def _at_step(monkeypatch, step, action):
    """Runs ``action()`` while RL step ``step`` (1-based) is being computed."""
    real_step = ts.rl_step

    def wrapped(run, phases, state, batch, **kw):
        if int(jax.device_get(state.step)) + 1 == step:
            action()
        return real_step(run, phases, state, batch, **kw)

    monkeypatch.setattr(ts, "rl_step", wrapped)


def test_sigterm_with_a_save_in_flight_saves_the_current_step_and_resumes_exactly(
    shared, single, monkeypatch
):
    wd = os.path.join(shared["root"], "sigterm")
    _slow_saves(monkeypatch, 1.5)  # the step-2 save is still being written during step 3
    _at_step(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(trainer.Preempted) as e:
        trainer.train(make_config(shared, num_devices=1), wd)
    assert str(e.value) == "stopped at step 3, checkpoint saved; rerun the same command to resume"
    assert e.value.exit_code == 128 + signal.SIGTERM
    assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2", "3"]  # both committed
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers are restored
    monkeypatch.undo()
    summary = trainer.train(make_config(shared, num_devices=1), wd)
    assert summary["steps"] == STEPS
    assert_trees(final_params(wd), final_params(single[0]))
    assert_records(records(wd), records(single[0]))


def test_failed_save_surfaces_at_the_next_step_and_keeps_the_previous_checkpoint(
    shared, single, monkeypatch, capfd
):
    import errno

    import orbax.checkpoint as ocp

    class _DiskFull:
        def result(self, timeout=None):
            raise OSError(errno.ENOSPC, "No space left on device")

    real = ocp.type_handlers.ArrayHandler.serialize

    async def failing(self, *args, **kwargs):
        return [*(await real(self, *args, **kwargs)), _DiskFull()]

    def disk_fills_up():
        monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "serialize", failing)

    wd = os.path.join(shared["root"], "disk_full")
    cfg = make_config(shared, num_devices=1)
    cfg.checkpoint.every = 1
    _at_step(monkeypatch, 2, disk_fills_up)  # the save of step 2 fails
    with pytest.raises(checkpoint_lib.CheckpointSaveError) as e:
        trainer.train(cfg, wd)
    msg = str(e.value)
    assert "\n" not in msg and "step 2" in msg and "No space left on device" in msg
    assert "the previous checkpoint, step 1, is kept" in msg
    assert capfd.readouterr().err.count("Traceback") == 0
    assert [n for n in os.listdir(os.path.join(wd, "checkpoints")) if n.isdigit()] == ["1"]
    assert max(_steps(wd)) <= 3  # surfaced at the next step, not later
    monkeypatch.undo()
    assert trainer.train(cfg, wd)["steps"] == STEPS  # resumes from step 1
    assert_trees(final_params(wd), final_params(single[0]))
    assert_records(records(wd), records(single[0]))


def test_collapse_warns_once_per_stretch_and_can_stop_the_run(shared, monkeypatch, capsys):
    edit_step_metrics(monkeypatch, lambda step, m: m.update({"rollout/frac_zero_std_groups": 1.0}))
    cfg = make_config(shared, num_devices=1)
    cfg.rl.collapse_patience = 2
    trainer.train(cfg, os.path.join(shared["root"], "collapse_warn"))
    out = capsys.readouterr().out
    assert out.count("no learning signal for 2 steps in a row (steps 1-2") == 1
    cfg.rl.stop_on_collapse = True
    from gspo_jax.runtime import metrics as metrics_lib

    wd = os.path.join(shared["root"], "collapse_stop")
    with pytest.raises(metrics_lib.CollapseError, match="stopped at step 2"):
        trainer.train(cfg, wd)
    assert "2" in os.listdir(os.path.join(wd, "checkpoints"))


def test_collapse_count_survives_a_resume(shared, monkeypatch):
    """The count is run state (in the checkpoint): crashed after step 2 of a collapse and resumed,
    the run stops at step 3, as an uninterrupted one does (a fresh count would wait to step 5)."""
    from gspo_jax.runtime import metrics as metrics_lib

    edit_step_metrics(monkeypatch, lambda step, m: m.update({"rollout/frac_zero_std_groups": 1.0}))
    cfg = make_config(shared, num_devices=1)
    cfg.rl.collapse_patience, cfg.rl.stop_on_collapse = 3, True
    wd = os.path.join(shared["root"], "collapse_resume")
    assert trainer.train(cfg, wd, stop_after=2) is None  # "crash" right after the step-2 save
    with pytest.raises(metrics_lib.CollapseError, match=r"stopped at step 3 .*steps 1-3"):
        trainer.train(cfg, wd)


def test_a_longer_run_is_a_safe_change_only_with_a_constant_learning_rate(shared):
    from gspo_jax.runtime import rundir

    saved = make_config(shared, num_devices=1)
    longer = make_config(shared, num_devices=1)
    longer.rl.num_steps = STEPS + 10
    notes = rundir.check_resume_config(saved.to_dict(), longer, STEPS, allow_change=False)
    assert notes == [f"resuming with changed rl.num_steps {STEPS} -> {STEPS + 10}"]
    saved.optimizer.schedule = longer.optimizer.schedule = "cosine"
    with pytest.raises(config_lib.ConfigError, match="rl.num_steps"):
        rundir.check_resume_config(saved.to_dict(), longer, STEPS, allow_change=False)


def test_metrics_cut_back_keeps_whole_lines(tmp_path):
    from gspo_jax.runtime import rundir

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}')  # no \n
    assert rundir.cut_metrics(str(tmp_path), 3) is None  # nothing dropped: the line is ended
    assert (tmp_path / "metrics.jsonl").read_text().endswith('{"step": 3}\n')
    assert rundir.cut_metrics(str(tmp_path), 2) == str(tmp_path / "metrics.1.jsonl")
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3')  # cut short
    rundir.cut_metrics(str(tmp_path), 5)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
