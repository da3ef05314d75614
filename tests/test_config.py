"""Config machinery: typed get_config arguments, CLI overrides, sweeps, early validation."""

import collections
import json
import os
import subprocess
import sys

import ml_collections
import pytest
from ml_collections import config_dict
from trainer_runs import load_repo_module

from gspo_jax import config as config_lib
from gspo_jax import objectives
from gspo_jax.config import ConfigError
from gspo_jax.rl import build

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARITH = os.path.join(REPO, "configs", "arith.py")


def get_config(arg=None):
    return config_lib.load_config_file(ARITH + (f":{arg}" if arg else ""))


def test_parse_arg_types_and_defaults():
    a = config_lib.parse_arg(
        "n=3,x=0.5,flag,name=gmpo,opt=2.5",
        n=1,
        x=0.1,
        flag=False,
        name="gspo",
        opt=config_dict.placeholder(float),
        other=config_dict.placeholder(int),
    )
    assert (a.n, a.x, a.flag, a.name, a.opt, a.other) == (3, 0.5, True, "gmpo", 2.5, None)
    assert isinstance(a.n, int) and isinstance(a.x, float)
    assert config_lib.parse_arg("flag=false", flag=True).flag is False
    assert config_lib.parse_arg("t=(1,2)", t=(0,)).t == (1, 2)


@pytest.mark.parametrize(
    "arg, match",
    [
        ("nope=1", "unknown config argument 'nope'.*valid arguments"),
        ("n=abc", "expected int"),
        ("flag=maybe", "not a boolean"),
        ("n", "needs a value"),
    ],
)
def test_parse_arg_errors(arg, match):
    with pytest.raises(ValueError, match=match):
        config_lib.parse_arg(arg, n=1, flag=False)


def test_arith_config_args():
    c = get_config("runlocal,objective=grpo,eps=0.2,seed=3,steps=5,lr=2e-5")
    assert c.runlocal and c.model.preset == "tiny"
    assert c.objective.name == "grpo" and c.objective.eps_low == c.objective.eps_high == 0.2
    assert c.seed == 3 and c.rl.num_steps == 5 and c.optimizer.learning_rate == 2e-5
    default = get_config()
    assert default.objective.name == "gspo" and default.objective.eps_low is None
    assert config_lib.objective_overrides(default.objective) == {}
    with pytest.raises(ValueError, match="unknown config argument 'objetive'"):
        get_config("objetive=grpo")
    # The result is locked: a typo'd field cannot be added silently.
    with pytest.raises(AttributeError):
        default.rl.grup_size = 4


def test_a_runlocal_converged_warm_start_keeps_its_rule_within_runlocals_cap():
    full, tiny = get_config("warmstart=converged"), get_config("runlocal,warmstart=converged")
    assert (full.init.warmstart.steps, full.init.warmstart.stop_every) == (4800, 600)
    assert tiny.init.warmstart.steps == get_config("runlocal").init.warmstart.steps == 100
    assert tiny.init.warmstart.stop_every == 50  # two checks within runlocal's cap
    rule = ("stop_metric", "stop_threshold", "stop_patience", "stop_samples")
    assert [tiny.init.warmstart[k] for k in rule] == [full.init.warmstart[k] for k in rule]


def test_arith_sweep_covers_objectives_and_eps():
    arith = load_repo_module("configs/arith.py")
    runs = arith.get_sweep("seeds=2")
    names = [r["name"] for r in runs]
    presets = set(objectives.PRESET_NAMES)
    assert presets >= {"grpo", "dapo", "dr_grpo", "gspo", "gspo_token", "luspo", "gmpo"}
    assert presets >= {"cispo", "sapo"}
    assert len(names) == len(set(names)) == 2 * (len(presets) + 3)  # + the three ε variants
    objs = {r["overrides"]["objective.name"] for r in runs}
    assert objs == presets
    eps_runs = {
        (r["overrides"]["objective.name"], r["overrides"]["objective.eps_low"])
        for r in runs
        if "objective.eps_low" in r["overrides"]
    }
    assert eps_runs == {("grpo", 3e-4), ("gspo", 0.2), ("gspo", 3e-4)}
    # every run's overrides apply to the config (keys exist, types match)
    for r in runs[:10]:
        c = ml_collections.ConfigDict(get_config("runlocal"))
        c.unlock()
        for k, v in r["overrides"].items():
            node = c
            *path, last = k.split(".")
            for p in path:
                node = node[p]
            node[last] = v


def test_override_key_check_names_path():
    c = get_config()
    config_lib.check_override_keys(c, ["--config.objective.eps_low=0.2", "--workdir=x"])
    with pytest.raises(ConfigError, match=r"objective has no field 'eps_lo'.*eps_low"):
        config_lib.check_override_keys(c, ["--config.objective.eps_lo=0.2"])
    with pytest.raises(ConfigError, match="<top level> has no field 'rll'"):
        config_lib.check_override_keys(c, ["--config.rll.group_size=2"])


def _main(*args, timeout=60):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, "-m", "gspo_jax.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def test_cli_wrong_key_and_type_fail_clearly(tmp_path):
    r = _main(f"--config={ARITH}:runlocal", f"--workdir={tmp_path}", "--config.objective.epslow=1")
    assert r.returncode != 0
    assert "unknown config key 'objective.epslow'" in r.stderr
    r = _main(f"--config={ARITH}:runlocal", f"--workdir={tmp_path}", "--config.rl.group_size=abc")
    assert r.returncode != 0 and "group_size" in r.stderr and "abc" in r.stderr
    r = _main(f"--config={ARITH}:runlocal,bogus=1", f"--workdir={tmp_path}")
    assert r.returncode != 0 and "unknown config argument 'bogus'" in r.stderr
    assert not os.listdir(tmp_path)  # nothing was written


def _cfg(**rl):
    c = ml_collections.ConfigDict(get_config("runlocal"))
    c.unlock()
    for k, v in rl.items():
        c.rl[k] = v
    return c


def test_validate_accepts_default_and_runlocal(tmp_path):
    build.build_run(get_config(), str(tmp_path / "a"))
    build.build_run(get_config("runlocal"), str(tmp_path / "b"))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(group_size=1), "group_size=1.*at least 2|2 or more"),
        (dict(prompts_per_step=6), "does not divide over the data axis"),
        (dict(num_minibatches=3), "num_minibatches=3"),
        (dict(temperature=0.0), "temperature"),
        (dict(routing_replay=True), "needs an MoE model"),
        (dict(advantage_estimator="ppo"), "advantage_estimator='ppo'"),
    ],
)
def test_validate_rejects(change, match, tmp_path):
    # 8 simulated devices (conftest): the data axis has 8 shards.
    with pytest.raises(ConfigError, match=match):
        build.build_run(_cfg(**change), str(tmp_path))


def test_validate_objective_and_mesh(tmp_path):
    c = _cfg()
    c.objective.name = "ppo"
    with pytest.raises(ConfigError, match="config.objective.*gspo"):
        build.build_run(c, str(tmp_path))
    c = _cfg()
    c.objective.eps_low = 1.5
    with pytest.raises(ConfigError, match="eps_low"):
        build.build_run(c, str(tmp_path))
    c = _cfg()
    c.mesh.data, c.mesh.tensor = 3, 1
    with pytest.raises(ConfigError, match="config.mesh"):
        build.build_run(c, str(tmp_path))


def test_build_run_builds_each_part_once(monkeypatch):
    """build_run checks and builds the objective, the mesh, the task and the model config once
    each: no second build to check them (the libraries' constructors are counted)."""
    from gspo_jax import models, sharding, tasks

    calls = collections.Counter()
    for module, name in (
        (objectives, "get_objective"),
        (sharding, "make_mesh"),
        (tasks, "get_task"),
        (models, "get_model_config"),
    ):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    build.build_run(get_config("runlocal"), None)
    assert calls == {"get_objective": 1, "make_mesh": 1, "get_task": 1, "get_model_config": 1}


def test_validate_unwritable_workdir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    # (chmod cannot make a directory unwritable for root; a path under a file fails for everyone)
    with pytest.raises(ConfigError, match="not writable.*--workdir"):
        build.build_run(get_config("runlocal"), str(blocker / "run"))


def test_sweep_expands_to_commands_and_collects_tables(tmp_path, capsys):
    sweep = load_repo_module("experiments/sweep.py")
    assert (
        sweep.main(
            [
                "--config",
                f"{ARITH}:runlocal",
                "--sweep",
                "seeds=1",
                "--workdir",
                str(tmp_path),
                "--dry_run",
                "--population=false",  # a process per run (tests/test_sweep_population.py)
                "--config.rl.num_steps=2",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(objectives.PRESET_NAMES) + 3
    assert all("gspo_jax.main" in ln and "--config.rl.num_steps=2" in ln for ln in lines)
    assert any("--config.objective.name=gspo --config.objective.eps_low=0.2" in ln for ln in lines)
    # collection: one finished run, one missing
    runs = sweep.load_sweep(ARITH, "seeds=1")[:2]
    wd = tmp_path / runs[0]["name"]
    wd.mkdir()
    (wd / "summary.json").write_text(
        json.dumps(
            {
                "base": {"greedy_accuracy": 0.3, "mean_response_length": 6.0},
                "final": {"greedy_accuracy": 0.5, "mean_response_length": 20.0},
                "steps": 2,
                "wall_s": 9.0,
            }
        )
    )
    (wd / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "train/clip_frac": 0.1, "rollout/reward": 0.4})
        + "\n"
        + json.dumps({"step": 2, "train/clip_frac": 0.3, "rollout/reward": 0.6})
        + "\n"
    )
    rows = sweep.collect(runs, str(tmp_path))
    assert rows[0]["status"] == "ok" and rows[1]["status"] == "missing"
    assert rows[0]["delta_acc"] == pytest.approx(0.2)
    assert rows[0]["mean_clip_frac"] == pytest.approx(0.2) and rows[0]["last_reward"] == 0.6
    md = sweep.write_tables(rows, str(tmp_path))
    assert md.startswith("| run |") and (tmp_path / "results.csv").exists()
    arms = (tmp_path / "results_by_arm.md").read_text().splitlines()
    assert arms[0].startswith("| arm | seeds | final_acc | mean_clip_frac")
    assert arms[2].startswith(f"| {runs[0]['name'][:-3]} | 1 | 0.5 | 0.2 |")  # one finished run


def test_multihost_cold_warm_start_cache_is_a_config_error(tmp_path, monkeypatch):
    """A multi-host run whose warm start is not cached stops with one ConfigError line (main.py
    prints it without a traceback) naming --prepare_only, and trains nothing."""
    import jax

    from gspo_jax.rl import warmstart

    c = get_config("runlocal")
    c.init.cache_dir = str(tmp_path / "cache")
    c.data.data_dir = str(tmp_path / "data")
    task = build.make_task(c)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(warmstart, "train", lambda *a, **k: pytest.fail("trained on every host"))
    with pytest.raises(ConfigError, match="--prepare_only"):
        build._base_model(
            c,
            task,
            build.make_model_config(c, task),
            c.init.cache_dir,
            mesh=None,
            progress=False,
        )


def test_claim_sweeps_and_pod_variants():
    """The claim configs' sweeps name what experiments/claims.py's notebooks read, and their
    pod variants are configs/qwen3_gsm8k.py with the claim's model and switches."""
    luspo = load_repo_module("configs/luspo_length.py")
    moe = load_repo_module("configs/arith_moe.py")
    countdown = load_repo_module("configs/countdown.py")
    offpolicy = load_repo_module("configs/arith_offpolicy.py")
    assert [r["name"] for r in luspo.get_sweep("seeds=1")] == [
        "gspo_cliphigher_s0",
        "gspo_sym_s0",
        "luspo_cliphigher_s0",
        "grpo_nokl_s0",  # the claims registry's GRPO arm, KL off
    ]
    dr = {r["name"]: r["overrides"] for r in luspo.get_sweep("study=drgrpo,seeds=1")}
    assert dr["grpo_nostd_nokl_s0"]["objective.kl_coef"] == 0.0 and "dr_grpo_s0" in dr
    assert luspo.get_config().task.kwargs.direct_style == "correct"
    std_bonus = {
        r["name"]: r["overrides"] for r in load_repo_module("configs/std_bonus.py").get_sweep()
    }
    assert "task.kwargs.bonus" not in std_bonus["grpo_nokl_s0"]  # the design's bonus (0.01)
    assert std_bonus["grpo_nokl_nostd_bonus0.1_s0"]["task.kwargs.bonus"] == 0.1
    assert len(std_bonus) == 7  # 3 arms, then GRPO with and without the std at 2 more bonuses
    assert [r["name"] for r in moe.get_sweep("gspo_token=False,seeds=1")] == [
        "grpo_s0",
        "grpo_rr_s0",
        "gspo_s0",
    ]
    assert len(moe.get_sweep("seeds=2")) == 10  # with gspo_token, with and without replay
    doses = {r["name"]: r["overrides"] for r in moe.get_sweep("gspo_token=False,doses,seeds=1")}
    assert len(doses) == 21 and doses["grpo_rr_v2_s0"]["rl.aux_loss_coef"] == 0.0
    assert doses["grpo_rr_v5_s0"]["optimizer.router_lr_scale"] == 20.0  # the routers' step size
    # the v3 dose: more experts, more per token, on the model the run builds
    v3 = moe.get_config()
    for k, v in doses["grpo_v3_s0"].items():
        config_lib.set_field(v3, k, v)
    model = build.make_model_config(v3, build.make_task(v3))
    assert (model.num_experts, model.experts_per_token) == (16, 4)
    c = countdown.get_config()
    assert c.task.name == "countdown" and c.init.warmstart.steps == 4800
    cd = {r["name"]: r["overrides"] for r in countdown.get_sweep("seeds=1")}
    assert sorted(cd) == [
        "dr_grpo_s0",
        "grpo_nokl_nostd_s0",
        "grpo_nokl_s0",
        "grpo_nostd_s0",
        "grpo_s0",
    ]
    assert cd["grpo_nokl_nostd_s0"]["objective.kl_coef"] == 0.0
    assert cd["grpo_nostd_s0"] == {
        "objective.name": "grpo",
        "seed": 0,
        "rl.advantage_estimator": "dr_grpo",
    }
    arith = load_repo_module("configs/arith.py")
    tok = arith.get_sweep("study=token_adv,seeds=2")
    assert [r["overrides"]["rl.token_advantages"] for r in tok] == [True, True]
    fam = {r["name"]: r["overrides"] for r in arith.get_sweep("study=family,seeds=2")}
    assert len(fam) == 18 and {"clip_cov_s1", "kl_cov_s0", "dppo_tv_s0", "dppo_kl_s1"} <= set(fam)
    estimators = {o.get("rl.advantage_estimator") for o in fam.values()}
    assert estimators == {None, "rloo", "reinforce_pp", "reinforce_pp_baseline", "grpo"}
    assert fam["grpo_scale_batch_s0"]["rl.scale_rewards"] == "batch"
    clip = {r["name"]: r["overrides"] for r in arith.get_sweep("study=clip,seeds=1")}
    assert clip["grpo_nokl_s0"] == {"objective.name": "grpo", "objective.kl_coef": 0.0, "seed": 0}
    ratio = {r["name"]: r["overrides"] for r in arith.get_sweep("study=ratio_doses,seeds=1")}
    assert len(ratio) == 15 and ratio["gmpo_k16x2_s0"]["rl.num_minibatches"] == 16
    old = {r["name"]: r["overrides"] for r in offpolicy.get_sweep("study=old_logp,seeds=1")}
    assert old["gspo_sampler_s0"]["rl.recompute_old_logp"] is False
    assert old["grpo_recompute_tis_s0"]["objective.rollout_correction"] == "token_tis"
    assert old["gspo_recompute_tis_s0"]["objective.rollout_correction"] == "seq_tis"
    assert old["gspo_sampler_noise0.01_s0"]["rl.rollout_logp_noise"] == 0.01
    assert "gspo_recompute_noise0.01_s0" not in old  # never reads the sampler's log-probs
    assert len(old) == 6 + 3 * 4
    with pytest.raises(ValueError, match="study must be"):
        offpolicy.get_sweep("study=nope")
    pod = moe.get_config("pod=/ckpt/Qwen3-30B-A3B,objective=grpo,routing_replay,seed=2")
    assert (pod.model.preset, pod.task.name, pod.init.kind) == ("qwen3_30b_a3b", "gsm8k", "hf")
    assert pod.rl.routing_replay and pod.rl.log_route_change and pod.seed == 2
    # every arm of the pod sweep keeps its own preset's ε (not GSPO's, pinned for objective=gspo)
    pod = moe.get_config("pod=/ckpt/Qwen3-30B-A3B")
    assert pod.objective.eps_low is None and pod.objective.eps_high is None
    pod = luspo.get_config("pod=/ckpt/Qwen3-1.7B,objective=luspo")
    assert (pod.model.preset, pod.objective.name) == ("qwen3_1_7b", "luspo")


def test_token_advantages_need_a_per_token_ratio():
    c = get_config("runlocal,objective=gspo")
    with c.unlocked():
        c.rl.token_advantages = True
    with pytest.raises(ConfigError, match="token_advantages=True .* one ratio per response"):
        build.build_run(c, None)
    with c.unlocked():
        c.objective.name = "gspo_token"
    build.build_run(c, None)


def test_pod_timeout_must_be_positive():
    from gspo_jax.runtime import agreement as pod

    with pytest.raises(config_lib.ConfigError, match=r"multihost.timeout_s must be > 0 seconds"):
        pod.configure(0)
    assert pod.timeout_of(ml_collections.ConfigDict()) == pod.DEFAULT_TIMEOUT_S  # an older config


def test_the_tool_experiments_sweep_pairs_its_arms_on_each_seed():
    """configs/tools.py get_sweep: GSPO and GRPO (KL off) at each RL seed from the config's own
    warm start (seed 0's pilot excluded); more seeds than the design's refused."""
    tools = load_repo_module("configs/tools.py")
    runs = tools.get_sweep("seeds=2")
    first, second = tools.TOOL_SEEDS[:2]
    assert [r["name"] for r in runs] == [
        f"gspo_s{first}",
        f"grpo_nokl_s{first}",
        f"gspo_s{second}",
        f"grpo_nokl_s{second}",
    ]
    for r in runs:
        assert r["overrides"]["seed"] == int(r["name"].rsplit("_s", 1)[1])
        assert "init.warmstart.seed" not in r["overrides"]  # one base
    assert runs[1]["overrides"]["objective.kl_coef"] == 0.0
    assert 0 not in tools.TOOL_SEEDS and len(tools.get_sweep()) == 2 * len(tools.TOOL_SEEDS) >= 16
    with pytest.raises(ValueError, match="seeds must lie in"):
        tools.get_sweep(f"seeds={len(tools.TOOL_SEEDS) + 1}")
    mixed = config_lib.load_config_file(os.path.join(REPO, "configs", "tools.py:" + tools.MIXED))
    assert mixed.task.kwargs.easy_fraction == 0.5 and mixed.task.kwargs.digits == 4
    assert mixed.init.warmstart.tool_fraction == 0.5
    claims = load_repo_module("experiments/claims.py")
    assert claims.SWEEPS["tools"].config == "configs/tools.py:" + tools.MIXED  # one design
