"""train/route_change_frac (config.rl.log_route_change): how often a response token's MoE experts
differ between the rollout and the parameters after the step's updates.

The runs are tiny_moe from random parameters (no warm start) on 2 simulated devices, 2 RL steps of
4 prompts x 2 samples and 8 response tokens.
"""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from trainer_runs import REPO, assert_trees, make_config, overrides

from gspo_jax import config as config_lib
from gspo_jax import sharding
from gspo_jax import state as state_lib
from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import batch as rl_batch
from gspo_jax.rl import build, optimizer, population
from gspo_jax.rl import step as ts
from gspo_jax.runtime import distributed

MOE = os.path.join(REPO, "configs", "arith_moe.py")
FRAC = "train/route_change_frac"


def _moe_config(shared, **extra) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(config_lib.load_config_file(MOE + ":runlocal"))
    small = {
        "init.kind": "random",
        "num_devices": 2,
        "rl.prompts_per_step": 4,
        "rl.group_size": 2,
        "rl.num_minibatches": 2,
        "rl.max_new_tokens": 8,
        "optimizer.learning_rate": 3e-2,  # large: the router moves within one step
        "eval.num_problems": 0,
    }
    for k, v in {**overrides(shared), **small, **extra}.items():
        section, name = k.split(".") if "." in k else (None, k)
        (c[section] if section else c)[name] = v
    return c


def _steps(run, n=2):
    """n RL steps from the run's base parameters: (phases, final state, [host metrics])."""
    state = build.initial_state(run, build.base_params(run)[0])
    phases = ts.make_phases(run, state, with_ref=False)
    data = data_iterator.make_data_iterator(run.config, run.task)
    ms = []
    for _ in range(n):
        state, m = ts.rl_step(run, phases, state, next(data), more_batches=lambda: next(data))
        ms.append(m)
    return phases, state, ms


@pytest.fixture(scope="module")
def logged(shared):
    """2 steps with log_route_change=True (the arith_moe default): (run, phases, state, metrics)."""
    run = build.build_run(_moe_config(shared))
    assert run.config.rl.log_route_change and not run.config.rl.routing_replay
    return (run, *_steps(run))


def test_route_change_frac_by_hand():
    """Response token t takes the experts of the slot predicting it: n - 1 for t = 0, else
    Lp + t - 1; a permutation of the k experts is no change; masked tokens do not count."""
    L, Lp, T, k = 2, 3, 3, 2
    lengths = jnp.array([2, 3])
    old = jnp.zeros((2, L, Lp + T, k), jnp.int32).at[..., 1].set(1)  # experts {0, 1} everywhere
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # 5 valid tokens x 2 layers = 10 pairs
    frac = lambda new, m=mask: float(rl_batch.route_change_frac(old, new, lengths, m))  # noqa: E731
    assert frac(old) == 0.0
    assert frac(old[..., ::-1]) == 0.0  # same sets, other order
    # row 0, layer 1: prompt slot n - 1 = 1 (token 0) and slot Lp = 3 (token 1) change
    new = old.at[0, 1, 1, 0].set(5).at[0, 1, 3, 1].set(7)
    assert frac(new) == pytest.approx(2 / 10)
    # slots that predict no valid token: row 0's padding slot 2, its token-1 slot 4 (predicts the
    # masked token 2) and the last slot (predicts nothing; the sampler never feeds it)
    new = old.at[0, :, 2].set(6).at[0, :, 4].set(6).at[:, :, Lp + T - 1].set(6)
    assert frac(new) == 0.0
    new = old.at[1, 0, Lp + 1, 0].set(4)  # row 1, token 2, layer 0
    assert frac(new) == pytest.approx(1 / 10)
    assert frac(new, jnp.zeros_like(mask)) == 0.0  # no valid token: 0, not NaN


def test_route_change_is_logged_and_moves(logged):
    run, phases, _, ms = logged
    assert phases.routes is not None
    for m in ms:
        assert math.isfinite(m[FRAC]) and 0.0 <= m[FRAC] <= 1.0
        assert m["time/route_change_s"] >= 0.0
    # a router updated at lr 3e-2 (Adam) sends some of the tokens elsewhere
    assert max(m[FRAC] for m in ms) > 0.0


def test_no_parameter_change_gives_no_route_change(shared):
    """Learning rate 0 (config.validate wants lr > 0, so the optimizer is swapped for SGD at 0):
    the same parameters route every valid response token as the rollout did."""
    run = dataclasses.replace(build.build_run(_moe_config(shared)), tx=optax.sgd(0.0))
    _, state, ms = _steps(run)
    assert int(state.step) == 2
    assert [m[FRAC] for m in ms] == [0.0, 0.0]


def test_routes_reach_the_update_only_with_routing_replay(shared, logged):
    """log_route_change alone: the rollout returns routes, the RL batch has none; with
    routing_replay the batch carries them (the update and the old_logp pass replay them)."""
    run, phases, state, _ = logged
    data = data_iterator.make_data_iterator(run.config, run.task)
    b = next(data)
    prompts = distributed.to_global(b["prompt"].astype(np.int32), run.mesh)
    lengths = distributed.to_global(b["prompt_length"].astype(np.int32), run.mesh)
    key = state_lib.step_keys(np.asarray(jax.device_get(state.rng)), 0)["rollout"]
    B = prompts.shape[0] * run.config.rl.group_size
    rewards, truncated = jnp.zeros(B), jnp.zeros(B, bool)
    rr = build.build_run(_moe_config(shared, **{"rl.routing_replay": True}))
    with sharding.use_mesh(run.mesh):
        sample = phases.rollout(state.params, prompts, lengths, key)
        assert sample.routes is not None
        batch, _ = phases.prepare(sample, rewards, prompts, lengths, truncated)
        assert batch.routes is None
        batch, _ = rl_batch.make_prepare_fn(rr)(sample, rewards, prompts, lengths, truncated)
    np.testing.assert_array_equal(batch.routes, sample.routes)  # both batch-major


def test_turning_the_metric_off_changes_nothing_else(shared, logged):
    """log_route_change=False: no metric, no extra pass, no routes anywhere; the trained
    parameters and every other metric equal those of the logged run (its routes never reached
    the update)."""
    _, _, state_on, ms_on = logged
    run = build.build_run(_moe_config(shared, **{"rl.log_route_change": False}))
    phases, state, ms = _steps(run)
    assert phases.routes is None
    assert_trees(state.params, state_on.params)
    for m, m_on in zip(ms, ms_on, strict=True):
        assert FRAC not in m and "time/route_change_s" not in m
        want = {k: v for k, v in m_on.items() if k != FRAC and not k.startswith("time/")}
        got = {k: v for k, v in m.items() if not k.startswith("time/")}
        np.testing.assert_equal(got, want)  # NaN equals NaN (a length mean with no response)


def test_log_route_change_on_a_dense_model_is_a_config_error(shared):
    c = make_config(shared, **{"rl.log_route_change": True})
    with pytest.raises(config_lib.ConfigError, match="log_route_change=True .* is dense"):
        build.build_run(c, None)


def test_router_lr_scale_selects_exactly_the_routers(shared):
    """optimizer.router_lr_scale (a volatility dose): the mask covers the MoE routers' weights
    and nothing else, and a scale <= 0 is refused before anything is built."""
    run = build.build_run(_moe_config(shared))
    leaves = jax.tree_util.tree_leaves_with_path(run.abs_params)
    routers = [jax.tree_util.keystr(p) for p, _ in leaves if optimizer.is_router_path(p)]
    assert routers and all("['router']" in p for p in routers)
    assert len(routers) == sum("router" in jax.tree_util.keystr(p) for p, _ in leaves)
    with pytest.raises(config_lib.ConfigError, match="router_lr_scale=0.0 .* must be > 0"):
        build.build_run(_moe_config(shared, **{"optimizer.router_lr_scale": 0.0}), None)
    dense = {"model.preset": "tiny", "optimizer.router_lr_scale": 5.0}
    with pytest.raises(config_lib.ConfigError, match="router_lr_scale=5.0 .* is dense"):
        build.build_run(_moe_config(shared, **dense), None)


@pytest.mark.long
def test_a_population_logs_each_members_route_change(shared):
    """A population's step is the single run's learn_on_batch over its members, the route-change
    pass included: every member logs train/route_change_frac."""
    c = _moe_config(shared, num_devices=1)
    with c.unlocked():
        c.population.seeds = (0, 1)
    pop = population.build_population(c)
    params, own, _ = population.initial_params(pop)
    state = population.initial_state(pop, params, own)
    phases = population.make_phases(pop, with_ref=False)
    iters = [data_iterator.make_data_iterator(m.config, pop.run.task) for m in pop.members]
    batches = [next(it) for it in iters]
    _, ms, kept = population.population_step(pop, phases, state, batches, np.ones(2, bool))
    assert kept.all() and len(ms) == 2
    for m in ms:
        assert 0.0 <= m[FRAC] <= 1.0 and m["time/route_change_s"] >= 0.0
