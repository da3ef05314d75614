"""A population (config.population, rl/population.py): each member's first step equals the single
run with its seed and hyperparameters; members are independent; fields that change shapes or the
program are refused; a diverging member is frozen without stopping the others; resume is exact.

All at runlocal size on one device, sharing the session's warm start, data and compilation cache
(conftest.py `shared`); one population run (3 steps) serves the loop's tests.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import trainer_runs as runs
from flax import nnx

from gspo_jax import config as config_lib
from gspo_jax import sharding
from gspo_jax.config import population as population_cfg
from gspo_jax.data import iterator as data_iterator
from gspo_jax.models import lora
from gspo_jax.rl import build, population, trainer
from gspo_jax.rl import step as ts

# Whole population runs: .ci/run runs them after the README's test command (marker long).
pytestmark = pytest.mark.long

STEPS = 3
ARITH_LOCAL = runs.ARITH + ":runlocal"
# float32 rounding: vmapped matmuls and reductions, traced hyperparameters (rl/population.py)
RTOL, ATOL = 1e-5, 1e-6
# the sampler-vs-trainer log-prob difference is float32 rounding itself (~1e-6): absolute
ATOL_OF = {"rollout/logp_diff_absmax": 1e-5, "rollout/logp_diff_mean": 1e-6}


def pop_config(shared, seeds, vary=None, mode="product", **extra):
    c = runs.make_config(shared, **{"num_devices": 1, **extra})
    with c.unlocked():
        c.population.seeds = tuple(seeds)
        c.population.vary = ml_collections.ConfigDict(vary or {})
        c.population.mode = mode
    return c


def first_step_population(pop: population.Population, params, temperatures=None, own=None):
    """(tokens [M, B, T], each member's host metrics, state) of the population's first step, and
    with ``temperatures`` [M] (when the population varies rl.temperature) the tokens its first
    rollout samples at those temperatures instead (else None). The batched rollout program and,
    on a CPU, the per-member rollouts the step samples with (make_member_rollout) must agree.
    ``own``: each member's initial parameters (LoRA: population.initial_params)."""
    state = population.initial_state(pop, params, own)
    phases = population.make_phases(pop, with_ref=False)
    iters = [data_iterator.make_data_iterator(m.config, pop.run.task) for m in pop.members]
    batches = [next(it) for it in iters]
    keys = phases.keys(state.rng, state.step)
    prompts = np.stack([b["prompt"] for b in batches]).astype(np.int32)
    lengths = np.stack([b["prompt_length"] for b in batches]).astype(np.int32)
    temps = [pop.hparams[population.TEMPERATURE]] if population.TEMPERATURE in pop.hparams else []

    def rollout(*temps):
        out = phases.rollout(state.params, prompts, lengths, keys["rollout"], *temps)
        return np.asarray(out.tokens)

    tokens = rollout(*temps)
    if phases.member_rollout is not None:  # what the step samples with on a CPU: the same tokens
        own = phases.member_rollout(state.params, prompts, lengths, keys["rollout"], *temps)
        np.testing.assert_array_equal(np.asarray(own.tokens), tokens)
        # placed as the batched rollout's: members over the groups, rows over each group's rows
        rows = sharding.row_spec(pop.run.mesh)
        assert own.tokens.sharding.is_equivalent_to(pop.on_members((rows, None)), 3)
    other = None if temperatures is None else rollout(jnp.asarray(temperatures, jnp.float32))
    active = np.ones(pop.size, bool)
    state, ms, kept = population.population_step(pop, phases, state, batches, active)
    assert kept.all()
    return tokens, ms, state, other


def first_step_single(config, params):
    """(tokens [B, T], host metrics, state) of a single run's first step."""
    run = build.build_run(config)
    state = build.initial_state(run, jax.tree.map(jnp.copy, params))  # the update donates it
    phases = ts.make_phases(run, state, with_ref=False)
    batch = next(data_iterator.make_data_iterator(config, run.task))
    keys = phases.keys(state.rng, state.step)
    prompts = batch["prompt"].astype(np.int32)
    lengths = batch["prompt_length"].astype(np.int32)
    tokens = np.asarray(phases.rollout(state.params, prompts, lengths, keys["rollout"]).tokens)
    state, m = ts.rl_step(run, phases, state, batch)
    return tokens, m, state


def assert_member_is_single(pop, first_step, i, single):
    """Member i's first step (first_step_population's tokens, metrics, state) is the single run's
    (first_step_single's): the same tokens, every metric to float32 rounding, the parameters after
    the update within 1e-5 relative or 1 % of the learning rate."""
    tokens, ms, state = first_step
    tok_1, m_1, state_1 = single
    np.testing.assert_array_equal(tokens[i], tok_1)  # the same sampled tokens
    assert set(ms[i]) == set(m_1)
    off = {
        k: (ms[i][k], m_1[k])
        for k in m_1
        if not k.startswith("time/")
        and not np.isclose(ms[i][k], m_1[k], rtol=RTOL, atol=ATOL_OF.get(k, ATOL))
    }
    assert not off, off
    lr = pop.members[i].config.optimizer.learning_rate
    assert_adam_steps_close(population.member(state.params, i), state_1.params, lr)


def assert_adam_steps_close(a, b, lr: float, stray: float = 1e-3):
    """The parameters after Adam's first step from the same ones, computed two ways: each leaf
    within 1e-5 relative or 1 % of lr, except at most max(1, ``stray`` of its size) elements, and
    those within lr. Adam's first step moves an element by lr * g / (|g| + eps): where g cancels
    to near 0, float32 rounding of g (a vmapped vs a single program, another CPU's vector units)
    moves it by up to lr (an AVX-512 machine, 2026-12-07: one element of 2048 by 3.3 % of lr,
    while every other element was within 1 %)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape
        diff = np.abs(x - y)
        assert diff.max() <= 1.001 * lr, f"an element moved {diff.max():.3g} apart; lr is {lr}"
        off = int(np.sum(diff > 0.01 * lr + RTOL * np.abs(y)))
        assert off <= max(1, int(stray * x.size)), f"{off} of {x.size} elements beyond 1 % of lr"


# member 0 has the config's temperature (1.0), member 1 another: traced (rl/population.py)
TEMPERATURES = (1.0, 0.7)
FIRST_VARY = {
    "objective": {"eps_low": (3e-4, 1e-3)},
    "optimizer": {"learning_rate": (1e-4, 3e-4)},
    "rl": {"temperature": TEMPERATURES},
}


@pytest.fixture(scope="module")
def first_steps(shared):
    """The first step of a 2-member zip population (seeds 0 and 1; ε_low, the learning rate and
    the temperature varied too) and of the single runs with each member's config; and the
    population's first rollout with every member at temperature 1."""
    config = pop_config(shared, seeds=(0, 1), vary=FIRST_VARY, mode="zip")
    pop = population.build_population(config)
    params, _ = build.base_params(pop.run, shared["cache"])
    pop_out = first_step_population(pop, params, temperatures=(1.0, 1.0))
    singles = [first_step_single(m.config, params) for m in pop.members]
    return pop, pop_out, singles


def test_first_step_equals_single_runs(first_steps):
    """Each member's first step is the single run's with its seed, ε_low, learning rate and
    temperature: the same tokens, the metrics and the parameters after it to 1e-5."""
    pop, (tokens, ms, state, _), singles = first_steps
    assert [m.name for m in pop.members] == [
        "eps_low=0.0003-learning_rate=0.0001-temperature=1-seed0",
        "eps_low=0.001-learning_rate=0.0003-temperature=0.7-seed1",
    ]
    assert [m.config.rl.temperature for m in pop.members] == list(TEMPERATURES)
    assert population.cpu_deadlock_warning(pop) is None  # one device: no warning
    for i, single in enumerate(singles):
        assert_member_is_single(pop, (tokens, ms, state), i, single)
    # the varied fields took effect: the members' updates differ in size (learning rate x3)
    assert ms[1]["train/update_norm"] > 2 * ms[0]["train/update_norm"]
    assert ms[1]["train/lr"] == pytest.approx(3e-4)


def test_temperature_is_each_members_own(first_steps):
    """The rollout samples each member at its own traced temperature: at temperature 1 for both,
    member 0 (already at 1) draws the same tokens and member 1 (at 0.7) other tokens."""
    _, (tokens, _, _, at_one), _ = first_steps
    np.testing.assert_array_equal(at_one[0], tokens[0])
    assert not np.array_equal(at_one[1], tokens[1])


def test_members_are_independent(shared, first_steps):
    """Changing member 1's seed changes no other member's tokens (and its own)."""
    pop, (tokens, _, _, _), _ = first_steps
    config = pop_config(shared, seeds=(0, 5), vary=FIRST_VARY, mode="zip")
    other = population.build_population(config)
    state = population.initial_state(other, build.base_params(other.run, shared["cache"])[0])
    phases = population.make_phases(other, with_ref=False)
    iters = [data_iterator.make_data_iterator(m.config, other.run.task) for m in other.members]
    batches = [next(it) for it in iters]
    keys = phases.keys(state.rng, state.step)
    prompts = np.stack([b["prompt"] for b in batches]).astype(np.int32)
    lengths = np.stack([b["prompt_length"] for b in batches]).astype(np.int32)
    temps = other.hparams[population.TEMPERATURE]
    tok = np.asarray(phases.rollout(state.params, prompts, lengths, keys["rollout"], temps).tokens)
    np.testing.assert_array_equal(tok[0], tokens[0])
    assert not np.array_equal(tok[1], tokens[1])


@pytest.mark.parametrize(
    "vary, field",
    [
        ({"rl": {"group_size": (4, 8)}}, "rl.group_size"),
        ({"rl": {"temperature": (0.0, 1.0)}}, "rl.temperature"),  # greedy is another program
        ({"model": {"vocab_size": (64, 128)}}, "model.vocab_size"),
        ({"objective": {"kl_coef": (0.0, 0.01)}}, "objective.kl_coef"),
        ({"objective": {"eps_low": ("a", "b")}}, "objective.eps_low"),
    ],
)
def test_refuses_fields_that_change_the_program(shared, vary, field):
    config = pop_config(shared, seeds=(0,), vary=vary)
    with pytest.raises(config_lib.ConfigError, match=f"config.population.vary.{field}") as e:
        population_cfg.members(config)
    assert "\n" not in str(e.value)


def test_refuses_zip_of_unequal_lengths(shared):
    config = pop_config(shared, seeds=(0, 1, 2), vary={"objective": {"eps_low": (0.1, 0.2)}})
    assert len(population_cfg.members(config)) == 6  # product
    with config.unlocked():
        config.population.mode = "zip"
    with pytest.raises(config_lib.ConfigError, match="mode='zip'"):
        population_cfg.members(config)


# LoRA (config.lora): each member's adapters are its single run's (drawn from its own seed)
LORA = {"lora.rank": 2, "lora.alpha": 4.0}
LORA_VARY = {"optimizer": {"learning_rate": (1e-3, 3e-3)}}


@pytest.mark.parametrize(
    "base_quant", ["", pytest.param("int8", marks=pytest.mark.long, id="qlora")]
)
def test_lora_members_are_their_single_runs(shared, base_quant):
    """A LoRA population's member i starts from the adapters its single run draws (its seed:
    A differs between members, B = 0) and its first step is that run's: the same tokens, the
    metrics and the adapters after it to float32 rounding; only adapters change. The same for
    a population of QLoRA runs (its base held quantized, lora.base_quant)."""
    extra = {**LORA, "lora.base_quant": base_quant}
    config = pop_config(shared, seeds=(0, 1), vary=LORA_VARY, mode="zip", **extra)
    pop = population.build_population(config)
    params, own, _ = population.initial_params(pop, shared["cache"])
    assert own is not None and len(own) == 2
    a0, a1 = (o.filter(nnx.LoRAParam) for o in own)  # A from each seed, B = 0
    pairs = zip(jax.tree.leaves(a0), jax.tree.leaves(a1), strict=True)
    assert any(not np.array_equal(x, y) for x, y in pairs)
    tokens, ms, state, _ = first_step_population(pop, params, own=own)
    for i, m in enumerate(pop.members):
        run = build.build_run(m.config)
        single_params, _ = build.base_params(run, shared["cache"])
        runs.assert_trees(own[i], single_params)  # the member's start is its single run's
        single = first_step_single(m.config, single_params)
        assert_member_is_single(pop, (tokens, ms, state), i, single)
    frozen = lambda p: p.filter(nnx.Not(nnx.LoRAParam))  # noqa: E731
    runs.assert_trees(frozen(population.member(state.params, 1)), frozen(params))  # base kept


def _lora_loop_config(shared):
    # grpo: its preset's KL term reads the reference, here each member's base (adapters off)
    return pop_config(
        shared,
        seeds=(0, 1),
        **LORA,
        **{
            "objective.name": "grpo",
            "rl.num_steps": STEPS,
            "checkpoint.every": 1,
            "checkpoint.max_to_keep": 5,
        },
    )


def test_lora_population_checkpoints_adapters_and_resumes_exactly(shared):
    """A LoRA population's checkpoint holds the members' adapters alone (the base loads again on
    resume, its identity checked), and a resume from step 2 equals the uninterrupted run."""
    whole = os.path.join(shared["root"], "lora_population")
    trainer.train(_lora_loop_config(shared), whole)
    split = os.path.join(shared["root"], "lora_population_resumed")
    assert trainer.train(_lora_loop_config(shared), split, stop_after=2) is None
    trainer.train(_lora_loop_config(shared), split)
    saved = runs.final_params(whole, STEPS)
    leaves = jax.tree_util.tree_leaves_with_path(saved["params"])
    assert leaves and all(lora.is_adapter(p) for p, _ in leaves)  # adapters only on disk
    runs.assert_trees(runs.final_params(split, STEPS), saved)
    for name in _members(whole):
        recs = runs.records(os.path.join(whole, "members", name))
        assert recs == runs.records(os.path.join(split, "members", name))
        assert any(r.get("train/kl_ref", 0.0) > 0 for r in recs[1:])  # the reference was read


def _loop_config(shared):
    # member 1's learning rate overflows its update: it diverges at step 1
    return pop_config(
        shared,
        seeds=(0,),
        vary={"optimizer": {"learning_rate": (1e-4, 1e38)}},
        **{"rl.num_steps": STEPS, "checkpoint.every": 1, "checkpoint.max_to_keep": 5},
    )


@pytest.fixture(scope="module")
def loop_run(shared):
    """A 3-step population of 2 members, one of which diverges: (workdir, summaries)."""
    wd = os.path.join(shared["root"], "population")
    return wd, trainer.train(_loop_config(shared), wd)


def _members(wd):
    return sorted(os.listdir(os.path.join(wd, "members")))


def test_member_folders_are_runs(loop_run):
    wd, summaries = loop_run
    names = _members(wd)
    assert names == sorted(summaries)
    for name in names:
        d = os.path.join(wd, "members", name)
        assert {"config.json", "metrics.jsonl", "summary.json", "base_eval.json"} <= set(
            os.listdir(d)
        )
        with open(os.path.join(d, "config.json")) as f:
            assert not json.load(f)["population"]["seeds"]  # a single run's config


def test_diverging_member_is_frozen_alone(loop_run):
    wd, summaries = loop_run
    ok, bad = summaries["learning_rate=0.0001-seed0"], summaries["learning_rate=1e+38-seed0"]
    assert not ok["frozen"] and ok["steps"] == STEPS and ok["frozen_at_step"] is None
    assert bad["frozen"] and bad["frozen_at_step"] == 1
    recs_ok = runs.records(os.path.join(wd, "members", "learning_rate=0.0001-seed0"))
    recs_bad = runs.records(os.path.join(wd, "members", "learning_rate=1e+38-seed0"))
    assert [r["step"] for r in recs_ok] == [0, 1, 2, 3]
    assert [r["step"] for r in recs_bad] == [0, 1] and recs_bad[1]["train/frozen"] == 1.0
    # the frozen member kept its last finite parameters: the base policy's, still finite
    params = runs.final_params(wd, STEPS)["params"]
    assert all(np.isfinite(leaf[1]).all() for leaf in jax.tree.leaves(params))
    assert any(not np.array_equal(x[0], x[1]) for x in jax.tree.leaves(params))  # 0 trained
    first = runs.final_params(wd, 1)["params"]
    runs.assert_trees(
        jax.tree.map(lambda x: x[1], first), jax.tree.map(lambda x: x[1], params)
    )  # unchanged since it froze


def test_resume_is_exact(shared, loop_run):
    wd, _ = loop_run
    wd2 = os.path.join(shared["root"], "population_resumed")
    assert trainer.train(_loop_config(shared), wd2, stop_after=2) is None
    trainer.train(_loop_config(shared), wd2)
    runs.assert_trees(runs.final_params(wd, STEPS), runs.final_params(wd2, STEPS))
    for name in _members(wd):
        a = runs.records(os.path.join(wd, "members", name))
        b = runs.records(os.path.join(wd2, "members", name))
        assert a == b


def test_a_collapsed_member_stops_alone(shared, monkeypatch, capfd):
    """rl.stop_on_collapse in a population: the member with no learning signal for
    collapse_patience steps is warned about and stops there (its summary's steps and
    collapsed_at_step, its parameters kept from then on); the other member runs to the end.
    Each member's summary is printed at the end."""
    config = pop_config(
        shared,
        seeds=(0, 1),
        **{
            "rl.num_steps": STEPS,
            "rl.collapse_patience": 2,
            "rl.stop_on_collapse": True,
            "checkpoint.every": 1,
            "checkpoint.max_to_keep": 5,
        },
    )
    real_step = population.population_step

    def member_1_collapses(*args, **kw):
        state, ms, kept = real_step(*args, **kw)
        for i, frac in enumerate((0.5, 1.0)):  # member 1: every group's rewards equal
            ms[i]["rollout/frac_zero_std_groups"] = frac
        return state, ms, kept

    monkeypatch.setattr(population, "population_step", member_1_collapses)
    wd = os.path.join(shared["root"], "population_collapse")
    summaries = trainer.train(config, wd)
    out, err = capfd.readouterr()  # stdout without a progress bar, above it with one
    assert "member seed1: warning: no learning signal for 2 steps" in out + err
    # each member's closing block, as a single run prints it, and why one stopped early
    for name in ("seed0", "seed1"):
        assert f"== summary (gspo, {os.path.join(wd, 'members', name)}) ==" in out
    assert "member seed1 stopped (collapse) at step 2" in out
    ok, stopped = summaries["seed0"], summaries["seed1"]
    assert ok["steps"] == STEPS and ok["collapsed_at_step"] is None
    assert stopped["steps"] == 2 and stopped["collapsed_at_step"] == 2 and not stopped["frozen"]
    assert [r["step"] for r in runs.records(os.path.join(wd, "members", "seed1"))] == [0, 1, 2]
    at_2, final = runs.final_params(wd, 2)["params"], runs.final_params(wd, STEPS)["params"]
    runs.assert_trees(*(jax.tree.map(lambda x: x[1], p) for p in (at_2, final)))
    assert any(
        not np.array_equal(a[0], b[0])
        for a, b in zip(*map(jax.tree.leaves, (at_2, final)), strict=True)
    )


def test_sigterm_saves_the_step_and_resumes_exactly(shared, loop_run, monkeypatch):
    """SIGTERM during step 2 of a population whose periodic checkpoints are off: the step is
    finished and saved, train raises Preempted (exit code 143) and restores the handlers, and
    the rerun resumes to the uninterrupted run's parameters and records."""
    import signal

    from gspo_jax.rl import trainer

    wd, _ = loop_run
    wd2 = os.path.join(shared["root"], "population_sigterm")
    config = _loop_config(shared)
    config.checkpoint.every = 100  # only the stop's save and the final one
    real_step = population.population_step

    def step_then_sigterm(pop, phases, state, *args, **kw):
        if int(np.max(jax.device_get(state.step))) + 1 == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(pop, phases, state, *args, **kw)

    monkeypatch.setattr(population, "population_step", step_then_sigterm)
    with pytest.raises(trainer.Preempted) as e:
        trainer.train(config, wd2)
    assert e.value.step == 2 and e.value.exit_code == 128 + signal.SIGTERM
    assert sorted(os.listdir(os.path.join(wd2, "checkpoints"))) == ["2"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.undo()
    trainer.train(config, wd2)
    runs.assert_trees(runs.final_params(wd, STEPS), runs.final_params(wd2, STEPS))
    for name in _members(wd):
        a = runs.records(os.path.join(wd, "members", name))
        b = runs.records(os.path.join(wd2, "members", name))
        assert a == b


@pytest.mark.parametrize(
    "groups,data",
    [(8, 1), (4, 2)],
    ids=["a member per device", "2 members per 2-device group"],
)
def test_members_spread_over_a_mesh_axis(shared, first_steps, groups, data):
    """4 ε values x 2 seeds on 8 simulated devices (mesh.population=groups, each group's rows
    over mesh.data=data devices): the state is sharded member by member over the groups, the
    per-member rollout samples each member on its own device group (first_step_population checks
    it against the batched rollout), and the member with the first population's member-0 values
    takes the same first step; on these CPU devices the build warns of XLA:CPU's collective
    deadlock (docs/population.md "Sharding")."""
    _, (tokens, ms, _, _), _ = first_steps
    config = pop_config(
        shared,
        seeds=(0, 1),
        vary={"objective": {"eps_low": (3e-4, 1e-3, 3e-3, 1e-2)}},
        num_devices=8,
        **{"mesh.data": data, "mesh.population": groups},
    )
    pop = population.build_population(config)
    assert "--config.mesh.population=1" in population.cpu_deadlock_warning(pop)
    assert pop.run.mesh.shape["population"] == groups and pop.axis == "population"
    params, _ = build.base_params(pop.run, shared["cache"])
    tok8, ms8, state, _ = first_step_population(pop, params)
    for leaf in jax.tree.leaves(state.params):
        assert leaf.sharding.spec[0] == "population"  # spec: ("population", None, ...)
        # each device holds its group's members: 8 members over `groups` groups
        assert {s.data.shape[0] for s in leaf.addressable_shards} == {8 // groups}
    i = [m.name for m in pop.members].index("eps_low=0.0003-seed0")
    np.testing.assert_array_equal(tok8[i], tokens[0])
    off = {
        k: (ms8[i][k], ms[0][k])
        for k in ms[0]
        if not k.startswith("time/")
        and not np.isclose(ms8[i][k], ms[0][k], rtol=RTOL, atol=ATOL_OF.get(k, ATOL))
    }
    assert not off, off


def test_dry_run_plans_each_member_and_all(shared):
    """The population's dry run (planning/population_plan.py) on 8 simulated devices in 2 member
    groups: 4 members (2 a group) against 2 (1 a group) double a device's parameters, optimizer
    state, update FLOPs and (about) its peaks, while the figures per member stay."""
    from gspo_jax.planning import population_plan

    plans = {}
    for seeds in ((0, 1), (0, 1, 2, 3)):
        config = pop_config(
            shared,
            seeds=seeds,
            num_devices=8,
            **{"slice": "v6e-8", "mesh.data": 4, "mesh.population": 2},
        )
        plans[len(seeds)] = population_plan.plan(config)
    two, four = plans[2], plans[4]
    assert (two["members_per_group"], four["members_per_group"]) == (1, 2)
    assert four["params"] == 2 * two["params"] and four["optimizer"] == 2 * two["optimizer"]
    assert four["per_member"]["params"] == two["per_member"]["params"] == two["params"]
    flops = [p["costs"]["update"].total_flops for p in (two, four)]
    assert 1.9 < flops[1] / flops[0] < 2.1, flops
    for key in ("update_peak", "rollout_peak", "needed"):
        assert 1.5 < four[key] / two[key] < 2.1, (key, two[key], four[key])
        assert 0.75 < four["per_member"][key] / two["per_member"][key] < 1.05, key
    assert four["fits"] and "4 members of tiny on v6e-8" in population_plan.format_plan(four)


def test_sweep_runs_eps_arms_as_one_population(shared, tmp_path):
    """experiments/sweep.py end to end: two ε arms x 2 seeds run as one population process (the
    library accepted it), each run's folder a link to its member with that run's config and
    summary, read by the results table as single runs."""
    sweep = runs.load_repo_module("experiments/sweep.py")
    sweep_runs = [
        {"name": f"eps{e:g}_s{s}", "overrides": {"objective.eps_low": e, "seed": s}}
        for e in (3e-4, 1e-3)
        for s in (0, 1)
    ]
    fields = {**runs.overrides(shared), "rl.num_steps": 2, "num_devices": 1}
    flags = [f"--config.{k}={sweep._flag_value(v)}" for k, v in fields.items()]
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": shared["xla"]}
    root = str(tmp_path)
    codes = sweep.launch(ARITH_LOCAL, sweep_runs, root, extra=flags, env=env, population=True)
    assert codes == {r["name"]: 0 for r in sweep_runs}
    pop = tmp_path / "population" / "eps0.0003+eps0.001"
    assert len(os.listdir(pop / "members")) == 4 and (pop / "summary.json").exists()
    for r in sweep_runs:
        wd = tmp_path / r["name"]
        assert wd.is_symlink() and (wd / "summary.json").exists()
        with open(wd / "config.json") as f:
            config = json.load(f)
        assert config["seed"] == r["overrides"]["seed"]
        assert config["objective"]["eps_low"] == r["overrides"]["objective.eps_low"]
    rows = sweep.collect(sweep_runs, root)
    assert [(row["status"], row["steps"]) for row in rows] == [("ok", 2)] * 4


def test_the_adam_step_comparison_allows_a_stray_element_not_a_wrong_step():
    lr = 3e-4
    before = {"w": np.linspace(-1.0, 1.0, 2048).reshape(2, 1024), "b": np.zeros(8)}
    step = jax.tree.map(
        lambda x: x - lr * np.sign(np.cos(np.arange(x.size))).reshape(x.shape), before
    )
    stray = jax.tree.map(np.copy, step)
    stray["w"][1, 10] += 0.033 * lr  # one element of 2048 rounded across, as measured
    assert_adam_steps_close(stray, step, lr)
    half_rate = jax.tree.map(lambda x, y: (x + y) / 2, before, step)  # a member at lr / 2
    with pytest.raises(AssertionError, match="beyond 1 % of lr"):
        assert_adam_steps_close(half_rate, step, lr)
    far = jax.tree.map(np.copy, step)
    far["b"][0] += 2 * lr  # further than any first step moves
    with pytest.raises(AssertionError, match="moved"):
        assert_adam_steps_close(far, step, lr)
