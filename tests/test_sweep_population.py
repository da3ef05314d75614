"""experiments/sweep.py's populations, decided on the configs without training: an arm's seeds and
arms that differ only in the fields a population varies merge into one population run; an arm
whose config the library refuses as a population (a pipelined run) stays one process per run; the
command line gives config.population.vary as one dict (gspo_jax/config/args.py).
"""

import json
import os
import shlex
import subprocess
import sys

import pytest
import trainer_runs as runs

from gspo_jax import config as config_lib
from gspo_jax.config import population as population_cfg

ARITH = os.path.join(runs.REPO, "configs", "arith.py")
ASYNC = os.path.join(runs.REPO, "configs", "arith_async.py")
VARY = '--config.population.vary={"objective": {"eps_low": [1e-4, 3e-4]}}'


@pytest.fixture(scope="module")
def sweep():
    return runs.load_repo_module("experiments/sweep.py")


def _run(name, seed, **overrides):
    return {"name": f"{name}_s{seed}", "overrides": {**overrides, "seed": seed}}


def test_an_arms_seeds_run_as_one_population(sweep, tmp_path):
    """Runs differing only in their seed merge into one population run, whose member folders
    become the runs' folders; one seed per arm stays one run per arm."""
    all_runs = sweep.load_sweep(ARITH, "study=clip,seeds=2")  # no two arms differ in ε alone
    merged = sweep.population_runs(all_runs)
    assert len(merged) == len(all_runs) // 2
    gspo = next(r for r in merged if r["name"] == "population/gspo")
    assert gspo["overrides"] == {"objective.name": "gspo", "population.seeds": (0, 1)}
    assert gspo["members"] == {"seed0": "gspo_s0", "seed1": "gspo_s1"}
    cmd = sweep.run_command(ARITH, gspo, str(tmp_path / gspo["name"]))
    assert "--config.population.seeds=(0,1)" in cmd
    # a finished member folder is linked where the single run would have written
    member = tmp_path / "population" / "gspo" / "members" / "seed1"
    member.mkdir(parents=True)
    (member / "summary.json").write_text("{}")
    sweep.link_members(str(tmp_path), [gspo])
    assert (tmp_path / "gspo_s1" / "summary.json").exists()
    assert sweep._is_done(str(tmp_path), {"name": "gspo_s1"})
    one_seed = sweep.load_sweep(ARITH, "study=clip,seeds=1")
    assert sweep.population_runs(one_seed) == one_seed


def test_a_sweep_stopped_half_way_links_its_finished_populations(sweep, tmp_path, monkeypatch):
    """An interrupted sweep (Ctrl-C, a signal) still links the populations that finished, so
    the launcher's records (experiments/claims.py) keep their runs; an unfinished population's
    runs are not done."""
    all_runs = sweep.load_sweep(ARITH, "study=clip,seeds=2")
    real_launch = sweep.launch

    def interrupted(config_spec, merged, root, *a, **k):  # the populations' own launch
        done = tmp_path / "population" / "gspo" / "members"
        for seed in (0, 1):
            (done / f"seed{seed}").mkdir(parents=True)
            (done / f"seed{seed}" / "summary.json").write_text("{}")
        (tmp_path / "population" / "grpo" / "members" / "seed0").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "refusals", lambda *a, **k: {})
    monkeypatch.setattr(sweep, "launch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        real_launch(ARITH, all_runs, str(tmp_path), population=True)
    assert sweep._is_done(str(tmp_path), {"name": "gspo_s0"})
    assert sweep._is_done(str(tmp_path), {"name": "gspo_s1"})
    assert not sweep._is_done(str(tmp_path), {"name": "grpo_s0"})


def test_a_population_is_split_to_fill_the_parallel_slots(sweep):
    """With fewer population runs than --parallel, each is split into consecutive parts, one per
    process slot (a part of one run is that run); with as many as --parallel, none is."""
    gspo = [_run("gspo", s, **{"objective.name": "gspo"}) for s in range(5)]
    parts = sweep.population_runs(gspo, parallel=2)
    assert [p["name"] for p in parts] == ["population/gspo.part1of2", "population/gspo.part2of2"]
    assert [p["overrides"]["population.seeds"] for p in parts] == [(0, 1, 2), (3, 4)]
    assert parts[1]["members"] == {"seed3": "gspo_s3", "seed4": "gspo_s4"}
    three = sweep.population_runs(gspo[:3], parallel=3)  # parts of one run are the runs
    assert [r["name"] for r in three] == ["gspo_s0", "gspo_s1", "gspo_s2"]
    grpo = [_run("grpo", s, **{"objective.name": "grpo"}) for s in range(2)]
    two_arms = sweep.population_runs(gspo + grpo, parallel=2)
    assert [r["name"] for r in two_arms] == ["population/gspo", "population/grpo"]
    assert sweep.population_runs(gspo) == sweep.population_runs(gspo, parallel=1)
    assert len(sweep.population_runs(gspo)) == 1


def test_an_arms_seeds_on_different_bases_are_populations_named_apart(sweep):
    """Seeds whose warm-start draw differs (round 2: draw = seed mod 3) never share a population:
    one population per draw, named by the draw, also when split to fill the process slots."""
    runs_ = [
        _run("gspo", s, **{"objective.name": "gspo", "init.warmstart.seed": s % 2})
        for s in range(8)
    ]
    pops = sweep.population_runs(runs_)
    assert [p["name"] for p in pops] == [
        "population/gspo.init.warmstart.seed=0",
        "population/gspo.init.warmstart.seed=1",
    ]
    assert [p["overrides"]["population.seeds"] for p in pops] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert [p["overrides"]["init.warmstart.seed"] for p in pops] == [0, 1]
    parts = sweep.population_runs(runs_, parallel=4)
    assert [p["name"] for p in parts] == [
        f"population/gspo.init.warmstart.seed={d}.part{i}of2" for d in (0, 1) for i in (1, 2)
    ]


def test_numeric_arms_merge_into_one_population(sweep):
    """Arms that differ only in fields a population varies (ε here) merge with their seeds into
    one zip population, one member per run, named as the library names its members; an arm that
    leaves ε at its preset, or differs in another field, is not in it."""
    eps = (0.2, 3e-4)
    sweep_runs = [_run("gspo", s, **{"objective.name": "gspo"}) for s in (0, 1)]
    for e in eps:
        fields = {"objective.name": "gspo", "objective.eps_low": e, "objective.eps_high": 0.2}
        sweep_runs += [_run(f"gspo_eps{e:g}", s, **fields) for s in (0, 1)]
    sweep_runs += [_run("grpo_eps0.2", 0, **{"objective.name": "grpo", "objective.eps_low": 0.2})]
    merged = {r["name"]: r for r in sweep.population_runs(sweep_runs, check=lambda c: {})}
    assert sorted(merged) == [
        "grpo_eps0.2_s0",
        "population/gspo",
        "population/gspo_eps0.2+gspo_eps0.0003",
    ]
    pop = merged["population/gspo_eps0.2+gspo_eps0.0003"]
    assert pop["overrides"] == {
        "objective.name": "gspo",
        "objective.eps_high": 0.2,  # the same in every run: not varied
        "population.seeds": (0, 1, 0, 1),
        "population.vary": {"objective": {"eps_low": (0.2, 0.2, 3e-4, 3e-4)}},
        "population.mode": "zip",
    }
    assert pop["members"] == {
        "eps_low=0.2-seed0": "gspo_eps0.2_s0",
        "eps_low=0.2-seed1": "gspo_eps0.2_s1",
        "eps_low=0.0003-seed0": "gspo_eps0.0003_s0",
        "eps_low=0.0003-seed1": "gspo_eps0.0003_s1",
    }
    # the library accepts it, and its member folders are the ones the sweep links
    assert sweep.check_populations(ARITH + ":runlocal", [pop]) == {}
    flags = sweep.run_command(ARITH + ":runlocal", pop, "")[5:]
    config = config_lib.config_from_flags(ARITH + ":runlocal", flags)
    members = population_cfg.members(config)
    assert [m.name for m in members] == list(pop["members"])
    assert [m.config.objective.eps_low for m in members] == [0.2, 0.2, 3e-4, 3e-4]
    assert [m.seed for m in members] == [0, 1, 0, 1]
    # a flag every run gets after its own sets ε for all of them: no population varies it
    merged = sweep.population_runs(sweep_runs, lambda c: {}, ["--config.objective.eps_low=0.1"])
    assert [r["name"] for r in merged] == [
        "population/gspo",
        "population/gspo_eps0.2",  # each arm's seeds
        "population/gspo_eps0.0003",
        "grpo_eps0.2_s0",
    ]
    assert not any("population.vary" in r["overrides"] for r in merged)


def test_refused_arms_stay_one_process_per_run(sweep, capsys):
    """The staleness sweep: the library refuses a pipelined population (rl.max_staleness > 0),
    so those arms stay single runs while k = 0 merges its seeds; a group of arms the library
    refuses (kl_coef 0 and > 0: another program) falls back to each arm's seeds."""
    staleness = [
        r
        for r in sweep.load_sweep(ASYNC, "seeds=2")
        if r["name"].startswith(("grpo_k0_none", "grpo_k1_none"))
    ]

    def check(cands):
        return sweep.check_populations(ASYNC + ":runlocal", cands, ["--config.eval.every=20"])

    merged = sweep.population_runs(staleness, check)
    assert [r["name"] for r in merged] == [
        "population/grpo_k0_none",
        "grpo_k1_none_s0",
        "grpo_k1_none_s1",
    ]
    out = capsys.readouterr().out
    assert (
        "a process per run for population/grpo_k1_none: the library refuses: the asynchronous "
        in out
    )
    kl = [
        _run(f"grpo_kl{k:g}", s, **{"objective.name": "grpo", "objective.kl_coef": k})
        for k in (0.0, 0.01)
        for s in (0, 1)
    ]
    merged = sweep.population_runs(kl, lambda c: sweep.check_populations(ARITH + ":runlocal", c))
    assert [r["name"] for r in merged] == ["population/grpo_kl0", "population/grpo_kl0.01"]
    out = capsys.readouterr().out
    assert "each arm's seeds as a population for population/grpo_kl0+grpo_kl0.01" in out
    assert "mixes 0 and > 0" in out


def test_population_vary_from_the_command_line():
    """--config.population.vary takes one dict (JSON or a Python literal), nested like the
    config; a malformed one is one ConfigError line naming the fix."""
    config = config_lib.config_from_flags(
        ARITH + ":runlocal", ["--config.population.seeds=(0,)", VARY]
    )
    assert [m.name for m in population_cfg.members(config)] == [
        "eps_low=0.0001-seed0",
        "eps_low=0.0003-seed0",
    ]
    bad = {
        "--config.population.vary=oops": "not a dict literal",
        "--config.population.vary=[1, 2]": "a list, not a dict",
        '--config.population.vary={"objective.eps_low": [1e-4]}': "no dots",
        '--config.population.vary={"objective": {"eps_low": 1e-4}}': "must be a list",
        "--config.population.vary.objective.eps_low=(1e-4,)": "is not a flag",
    }
    for flag, why in bad.items():
        with pytest.raises(config_lib.ConfigError, match=why) as e:
            config_lib.config_from_flags(ARITH, ["--config.population.seeds=(0,)", flag])
        assert "\n" not in str(e.value) and "--config.population.vary='{" in str(e.value)
    # a field a population cannot vary: the population's own check, in one line
    config = config_lib.config_from_flags(
        ARITH,
        [
            "--config.population.seeds=(0,)",
            '--config.population.vary={"rl": {"group_size": [4, 8]}}',
        ],
    )
    with pytest.raises(config_lib.ConfigError, match="population.vary.rl.group_size cannot vary"):
        population_cfg.members(config)


def test_main_reports_a_bad_vary_flag_in_one_line(tmp_path):
    """gspo_jax.main: a malformed --config.population.vary stops before any work, exit code 2."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gspo_jax.main",
            f"--config={ARITH}:runlocal",
            f"--workdir={tmp_path}",
            "--config.population.seeds=(0,)",
            "--config.population.vary={'objective.eps_low': (1e-4,)}",
        ],
        capture_output=True,
        text=True,
        cwd=runs.REPO,
        env={**os.environ, "PYTHONPATH": runs.REPO},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nest the sections" in lines[0]


def test_dry_run_prints_the_populations_the_library_accepts(sweep, capsys):
    """sweep.py --dry_run (population by default) asks the library in a CPU-only child process:
    the arith sweep's two GSPO ε arms run as one population, every other arm as its run."""
    argv = ["--config", f"{ARITH}:runlocal", "--sweep", "seeds=1", "--workdir", "/tmp/x"]
    assert sweep.main([*argv, "--dry_run", "--config.rl.num_steps=2"]) == 0
    out = capsys.readouterr().out
    commands = [ln for ln in out.splitlines() if "gspo_jax.main" in ln]
    assert len(commands) == len(sweep.load_sweep(ARITH, "seeds=1")) - 1
    (pop,) = [ln for ln in commands if "population" in ln]
    args = shlex.split(pop)  # quoted as a shell takes it
    assert "--workdir=/tmp/x/population/gspo_eps0.2+gspo_eps0.0003" in args
    vary = {"objective": {"eps_high": [0.2, 0.0003], "eps_low": [0.2, 0.0003]}}
    assert f"--config.population.vary={json.dumps(vary)}" in args
    assert "--config.population.mode=zip" in args and args[-1] == "--config.rl.num_steps=2"
