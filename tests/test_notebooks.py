"""Every claim notebook executes, end to end, on tiny runs and prints one computed verdict line.

The runs are the notebooks' own sweeps (experiments/claims.py SWEEPS) at runlocal size with one
seed and 2 RL steps, trained once per session, split between pytest-xdist's workers (sharing the
session's warm-start cache, data and compilation cache), and read by every notebook: a notebook
that no longer runs against what the trainer writes fails here. The verdicts of tiny runs mean
nothing (one seed: every primary criterion that needs paired seeds is inconclusive); that the
registry's verdict is computed, and is one of its three outcomes, is what is checked.
"""

import os

import pytest
from reporting import verdicts
from trainer_runs import REPO, load_repo_module, set_fields

from gspo_jax import config as config_lib

claims = load_repo_module("experiments/claims.py")
# The notebooks' tiny runs take minutes: .ci/run executes them after the README's test command
# (`python -m pytest -q -m long`), which deselects them (pyproject.toml).
pytestmark = pytest.mark.long

STEPS = 2
# The arith sweep's arms the notebooks name (GSPO-token's identity); its other arms add compile
# time here and no notebook code path.
ARITH_ARMS = {"gspo", "gspo_token"}
# The same for the registry's dose and KL-off sweeps: the arms a notebook's primary criterion,
# precondition or figure reads at runlocal size (the notebooks tolerate missing secondary arms).
TINY_ARMS = {
    "arith": ARITH_ARMS,
    # round 2's MoE: both entries' primary and precondition arms at v6 (gspo_rr_v6 and the
    # dose-response's v2 and v5 arms are read with .get)
    "r2_moe": {"grpo_v6", "grpo_rr_v6", "gspo_v6"},
    # round 2's length claims: every arm is a primary or precondition arm of one of the three
    "r2_length": {"gspo_cliphigher", "gspo_sym", "luspo_cliphigher", "grpo_nokl"},
    # round 2's rollout log-probs: both entries' primary and precondition arms (the other doses
    # and grpo_sampler are read with .get)
    "r2_old_logp": {
        "grpo_recompute",
        "gspo_sampler",
        "gspo_recompute",
        "grpo_sampler_noise0.3",
        "gspo_sampler_noise0.3",
    },
    # the primary criterion's and the precondition's arms: synchronous and 8 versions stale
    "staleness": {"grpo_k0_none", "grpo_k8_none", "gspo_k0_none", "gspo_k8_none"},
    # the int8 rollout: GRPO's float32 and int8 arms (the GSPO arms are read with .get)
    "quant": {"grpo_f32_none", "grpo_int8_none"},
    # LoRA: one rate of full fine-tuning and of rank 1 (each then its arm's tuned rate)
    "lora_arith": {"full_lr1e-4", "r1_lr1e-3"},
    "lora_countdown": {"full_lr1e-4", "r1_lr1e-3"},
    # round 2 on countdown: the eps_high dose's four arms (the trend needs each) and the GMPO
    # claims' primary arms (GRPO at its own 0.2 is read with .get)
    "r2_countdown": {
        "dapo_eh0.2",
        "dapo_eh0.24",
        "dapo_eh0.28",
        "dapo_eh0.35",
        "gmpo",
        "gmpo_seqclip",
        "grpo_nokl_w0.4",
    },
    # the entropy claims' v3: the four eps_high doses (the trend needs each), GMPO and GRPO at
    # +-0.4 (the sweep's every arm)
    "r2_entropy": {
        "dapo_eh0.2",
        "dapo_eh0.24",
        "dapo_eh0.28",
        "dapo_eh0.35",
        "gmpo",
        "grpo_nokl_w0.4",
    },
    # round 2's eps dose: the primary and precondition arms of both claims (the preset table and
    # the other doses are read with .get; gspo is a preset)
    "r2_eps": {"grpo_nokl_eps0.2", "grpo_nokl_eps0.0003", "gspo_eps0.2", "gspo"},
    # round 2's std normalisation and its control (dr_grpo is read with .get)
    "r2_std_bonus": {"grpo_nokl", "grpo_nokl_nostd"},
    # round 2's clip fraction: v1's arms but GSPO at 0.2 (read with .get)
    "r2_clip": {"gspo", "grpo_nokl", "grpo"},
    # round 2's minibatch dose: the four claims' primary and precondition arms (the other doses
    # and gspo_k1x1 are read with .get)
    "r2_ratio": {
        "grpo_nokl_k1x1",
        "grpo_nokl_k16x2",
        "grpo_nokl_k32x4",
        "gspo_k4x1",
        "gspo_k32x4",
        "gspo_nonorm_k4x1",
        "gmpo_k16x2",
    },
}


def tiny_config(shared, sweep, run):
    """The run's config at runlocal size, with the session's shared directories."""
    path, _, arg = sweep.config.partition(":")  # the sweep's own argument, then runlocal
    c = config_lib.load_config_file(
        os.path.join(REPO, path) + ":" + ",".join(a for a in (arg, "runlocal") if a)
    )
    overrides = {
        **run["overrides"],
        "init.cache_dir": shared["cache"],
        "data.data_dir": shared["data"],
        "log.progress": False,
        "log.tensorboard": False,
        "num_devices": 1,
        "rl.num_steps": STEPS,
        "checkpoint.every": STEPS,
        "eval.every": 1,
        "eval.num_problems": 8,
        "eval.batch_size": 8,
        # a notebook reads a run's seed from its name (_s<seed>), and a tiny run's verdict means
        # nothing: one seed for every tiny run, so that the sweeps' shared arms and warm starts
        # are trained once (make_claim_runs)
        "seed": 0,
        **({"init.warmstart.seed": 0} if "seed" in c.init.warmstart else {}),
    }
    return set_fields(c, overrides)


def make_claim_runs(shared, root):
    """Trains the runs the notebooks read (one seed) under root/<sweep>/<run>; a run whose tiny
    config another sweep's run has too (an arm two sweeps share) is a link to that one. Processes
    sharing ``root`` (pytest-xdist's workers) split them: each first trains the runs no other
    holds (a run's lock, filelock.try_locked), then waits for the rest (or trains what a dead one
    left)."""
    from gspo_jax import filelock
    from gspo_jax.rl import trainer

    read = {s for sweeps in claims.NOTEBOOKS.values() for s in sweeps}
    todo, links, trained_as = [], [], {}
    for sweep in claims.SWEEPS.values():
        if sweep.name not in read:
            continue  # a registry claim whose notebook comes with its runs (claims.PLANNED)
        for run in claims.sweep_runs(sweep, seeds=1):
            arm = claims.arm_of(run)
            if sweep.name in TINY_ARMS and arm not in TINY_ARMS[sweep.name]:
                continue
            c, wd = tiny_config(shared, sweep, run), os.path.join(root, sweep.name, run["name"])
            key = c.to_json_best_effort(sort_keys=True)
            if key in trained_as:
                links.append((wd, trained_as[key]))
            else:
                trained_as[key] = wd
                todo.append((c, wd))

    def train(c, wd):
        if not os.path.exists(os.path.join(wd, "summary.json")):
            trainer.train(c, wd)

    for c, wd in todo:
        with filelock.try_locked(wd) as held:
            if held:
                train(c, wd)
    for c, wd in todo:
        with filelock.locked(wd, what=f"the tiny run {os.path.relpath(wd, root)}"):
            train(c, wd)
    for wd, target in links:
        os.makedirs(os.path.dirname(wd), exist_ok=True)
        try:
            os.symlink(target, wd)
        except FileExistsError:  # another worker linked it first
            pass
    return root


@pytest.fixture(scope="module")
def claim_runs(shared):
    # beside the shared caches, so that xdist's workers split the runs instead of each making all
    return make_claim_runs(shared, os.path.join(os.path.dirname(shared["cache"]), "claims"))


def test_every_notebook_has_a_sweep_and_a_file():
    on_disk = {f[: -len(".ipynb")] for f in os.listdir(claims.NOTEBOOK_DIR) if f.endswith(".ipynb")}
    assert on_disk == set(claims.NOTEBOOKS)
    assert len(claims.NOTEBOOKS) >= 8
    for sweeps in claims.NOTEBOOKS.values():
        assert all(s in claims.SWEEPS for s in sweeps)


@pytest.mark.parametrize("name", sorted(claims.NOTEBOOKS))
def test_notebook_executes_and_prints_a_verdict(claim_runs, name, tmp_path, monkeypatch):
    # the kernel is a fresh process: one CPU device is enough for what a notebook computes
    monkeypatch.setenv("XLA_FLAGS", "")
    nb = claims.execute_notebook(name, claim_runs, out=str(tmp_path / f"{name}.ipynb"))
    lines = claims.verdict_lines(nb)
    assert len(lines) == len(claims.verdict_keys(name)), lines  # one per claim it decides
    for line in lines:
        verdicts.outcome_of(line)  # reproduced, not reproduced or inconclusive: <x> absent
    out = "".join(o.get("text", "") for cell in nb.cells for o in cell.get("outputs", []))
    assert "primary criterion: " in out, f"{name} does not print its registry entry"
    figures = [
        o for cell in nb.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert figures, f"{name} drew no figure"
