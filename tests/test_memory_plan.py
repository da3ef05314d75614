"""The dry run's memory plan: slice names, sharded optimizer state, and the compiled plan of
qwen3_0_6b on 8 simulated devices (compile only)."""

import math

import jax
import jax.numpy as jnp
import pytest

from gspo_jax import config as config_lib
from gspo_jax.planning import hlo_cost, memory_plan
from gspo_jax.rl import build as exp

QWEN = "configs/qwen3_gsm8k.py"


def test_slice_names():
    v5p, v6e = memory_plan.CHIPS["v5p"], memory_plan.CHIPS["v6e"]
    assert memory_plan.get_slice("v5p-8") == memory_plan.Slice(4, 95.0, v5p)  # 2 cores a chip
    assert memory_plan.get_slice("v5p-32").devices == 16
    assert memory_plan.get_slice("v6e-8") == memory_plan.Slice(8, 32.0, v6e)  # chips
    for bad in ("v9-8", "v5p", "v5p-3", "tpu"):
        with pytest.raises(config_lib.ConfigError, match="not a TPU slice name"):
            memory_plan.get_slice(bad)


def test_optimizer_state_is_sharded_like_the_parameters():
    """FSDP must shard Adam's moments as it shards the weights (they are 2/3 of the state)."""
    run = exp.build_run(config_lib.load_config_file(QWEN + ":runlocal"))
    state = exp.abstract_state(run, run.abs_params)
    params = {p.shape: p.sharding for p in jax.tree.leaves(state.params)}
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.shape]
    assert len(moments) == 2 * len(jax.tree.leaves(state.params))
    assert any("fsdp" in str(m.sharding.spec) for m in moments)
    for m in moments:
        assert m.sharding == params[m.shape]
    count = [x for x in jax.tree.leaves(state.opt_state) if not x.shape]
    assert count and all(c.sharding.is_fully_replicated for c in count)
    assert all(len(c.sharding.device_set) == jax.device_count() for c in count)


@pytest.mark.slow
def test_dry_run_of_qwen3_0_6b_on_eight_devices():
    cfg = config_lib.load_config_file(
        QWEN + ":model=qwen3_0_6b,slice=v6e-8,fsdp=8,prompts=16,group=2,max_new_tokens=16,micro=1"
    )
    plan = memory_plan.plan(cfg)
    run = exp.build_run(cfg)
    total = sum(math.prod(p.shape) * 4 for p in jax.tree.leaves(run.abs_params))
    assert 0.55e9 * 4 < total < 0.65e9 * 4  # Qwen3-0.6B: about 0.6B float32 parameters
    # FSDP over 8 devices: about an eighth of the weights, twice that for Adam's two moments
    assert total / 8 <= plan["params"] < total / 8 * 1.01
    assert abs(plan["optimizer"] - 2 * plan["params"]) < 0.01 * plan["optimizer"]
    assert plan["update_peak"] >= plan["params"] + plan["optimizer"]
    assert plan["fits"] and plan["needed"] < plan["hbm"]
    # The update's matmuls: at least 6 FLOPs per parameter and token (forward + backward),
    # split over the 8 devices; every program has a positive time estimate.
    tokens = 16 * 2 * 16
    assert plan["costs"]["update"].total_flops > 6 * total / 4 * tokens / 8 * 0.9
    assert all(t > 0 for t in plan["times"].values())
    text = memory_plan.format_plan(plan)
    assert "qwen3_0_6b on v6e-8 (8 devices" in text and "fits" in text
    small = dict(plan, hbm=plan["needed"] // 2, fits=False)
    with pytest.raises(config_lib.ConfigError, match="does not fit v6e-8") as e:
        memory_plan.check_fits(small)
    assert "GiB per device" in str(e.value) and "larger slice" in str(e.value)


def _scan_of_matmuls(w, x):  # w [L, D, D], x [M, D]: L chained matmuls under one scan
    return jax.lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)[0]


def test_program_cost_counts_every_trip_of_a_loop():
    """A scan of L matmuls costs L matmuls (XLA's cost_analysis counts its body once), and a
    program without loops costs what XLA's cost_analysis says (FLOPs and bytes)."""
    L, M, D = 5, 32, 64
    w, x = jax.ShapeDtypeStruct((L, D, D), jnp.float32), jax.ShapeDtypeStruct((M, D), jnp.float32)
    scanned = jax.jit(_scan_of_matmuls).lower(w, x).compile()
    cost = hlo_cost.program_cost(scanned)
    assert cost.flops == L * 2 * M * D * D
    assert scanned.cost_analysis()["flops"] < 2 * (2 * M * D * D)  # one trip, as documented
    grad = jax.jit(jax.grad(lambda w, x: _scan_of_matmuls(w, x).sum())).lower(w, x).compile()
    assert hlo_cost.program_cost(grad).flops == 3 * L * 2 * M * D * D  # forward + two backward

    def unrolled(w0, w1, x):
        return jnp.tanh(jnp.tanh(x @ w0) @ w1)

    wl = jax.ShapeDtypeStruct((D, D), jnp.float32)
    flat = jax.jit(unrolled).lower(wl, wl, x).compile()
    xla = flat.cost_analysis()
    assert hlo_cost.program_cost(flat).flops == 2 * 2 * M * D * D
    assert hlo_cost.program_cost(flat).bytes == xla["bytes accessed"]


def test_gather_and_in_place_scatter_count_the_rows_they_touch():
    """A paged KV cache is read by a gather and written by a scatter: a decode step touches a
    few pages of a large pool, and the pool's size must not count (the plan's paged cache)."""
    NP, R, D, n = 4096, 8, 64, 16  # pool [NP, R, D] (8 MiB float32), n pages touched

    def read_write(pool, pages, update):
        rows = pool[pages]  # gather [n, R, D]
        return pool.at[pages].set(update + rows), rows.sum()

    args = (
        jax.ShapeDtypeStruct((NP, R, D), jnp.float32),
        jax.ShapeDtypeStruct((n,), jnp.int32),
        jax.ShapeDtypeStruct((n, R, D), jnp.float32),
    )
    compiled = jax.jit(read_write, donate_argnums=0).lower(*args).compile()
    pool_bytes, touched = NP * R * D * 4, n * R * D * 4
    cost = hlo_cost.program_cost(compiled)
    assert touched <= cost.bytes <= 8 * touched + 1024 < pool_bytes / 4


def test_ragged_dot_flops_come_from_its_shapes():
    """XLA:CPU lowers ragged_dot densely over every group; the cost counts 2 M K N instead."""
    M, K, N, G = 64, 32, 16, 4
    args = (
        jax.ShapeDtypeStruct((M, K), jnp.float32),
        jax.ShapeDtypeStruct((G, K, N), jnp.float32),
        jax.ShapeDtypeStruct((G,), jnp.int32),
    )
    f = jax.jit(jax.lax.ragged_dot)
    compiled = f.lower(*args).compile()
    dense = hlo_cost.program_cost(compiled)
    cost = hlo_cost.program_cost(compiled, jaxpr=f.trace(*args).jaxpr)
    assert dense.flops == G * 2 * M * K * N  # the dense lowering
    assert cost.flops == 0 and cost.ragged_flops == cost.total_flops == 2 * M * K * N


def test_plan_prints_time_estimates():
    """The table marks the time as an estimate, the roofline of the chip's peak rates."""
    v5p = memory_plan.get_slice("v5p-8")
    step = hlo_cost.Cost(flops=2e9, bytes=5.53e9)  # memory-bound: 2 ms at 2765 GB/s
    update = hlo_cost.Cost(flops=459e12, bytes=1e9)  # compute-bound: 1 s at 459 TFLOP/s
    assert v5p.roofline_s(step) == pytest.approx(2e-3)
    assert v5p.roofline_s(update) == pytest.approx(1.0)
    plan = dict(
        slice="v5p-8",
        devices=4,
        mesh={"fsdp": 4},
        model="m",
        shapes="P=1",
        params=0,
        optimizer=0,
        reference=0,
        update_peak=0,
        rollout_peak=0,
        needed=0,
        hbm=1,
        fits=True,
        compile_rollout_s=1.0,
        compile_update_s=1.0,
        compile_decode_step_s=1.0,
        compile_cpu_s={"rollout": 1.0, "update": 1.0},
        chip=v5p.chip,
        decode_steps=3,
        costs={"decode_step": step, "rollout": step * 4, "update": update},
        times={"decode_step": 2e-3, "rollout": 8e-3, "update": 1.0},
    )
    text = memory_plan.format_plan(plan)
    assert "ESTIMATE" in text and "459 TFLOP/s" in text and "2765 GB/s" in text
    assert "decode step" in text and "2.00 ms" in text and "1.00 s" in text
    assert "3 decode steps + prefill" in text


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"objective.name": "gspo_token", "rl.token_advantages": True},  # adv [B, T]
        {"objective.name": "grpo", "objective.kl_coef": 0.01},  # ref_logp
        {"objective.name": "grpo", "objective.kl_coef": 0.01, "rl.kl_in_reward": True},  # none
        {"objective.name": "gmpo", "rl.log_kl_ref": True},  # ref_logp with kl_coef 0
        {
            "objective.name": "grpo",
            "objective.rollout_correction": "token_tis",
            "rl.recompute_old_logp": True,
        },
    ],
    ids=["plain", "token_adv", "ref", "kl_in_reward", "log_kl_ref", "rollout_logp"],
)
def test_the_dry_run_plans_the_batch_the_run_makes(shared, extra):
    """RLBatch.abstract(run), which the dry run compiles the update with, has the fields, shapes
    and dtypes of the batch the step's phases make (traced abstractly: nothing runs); the update
    logs train/kl_ref exactly when the batch carries ref_logp (rl.log_kl_ref: also at kl_coef 0)."""
    from trainer_runs import make_config

    from gspo_jax.rl import batch as rl_batch
    from gspo_jax.rl import step as ts
    from gspo_jax.rl.batch import RLBatch

    run = exp.build_run(make_config(shared, num_devices=1, **extra))
    state = exp.abstract_state(run, run.abs_params)
    phases = ts.make_phases(run, state, with_ref=rl_batch.uses_reference(run))
    rl = run.config.rl
    P, B = rl.prompts_per_step, rl.prompts_per_step * rl.group_size
    prompts = jax.ShapeDtypeStruct((P, run.task.max_prompt_len), jnp.int32)
    lengths = jax.ShapeDtypeStruct((P,), jnp.int32)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    rewards, truncated = jax.ShapeDtypeStruct((B,), jnp.float32), jax.ShapeDtypeStruct((B,), bool)
    sample = jax.eval_shape(phases.rollout, state.params, prompts, lengths, key)
    batch, _ = jax.eval_shape(phases.prepare, sample, rewards, prompts, lengths, truncated)
    if phases.ref is not None:
        batch = batch.replace(ref_logp=jax.eval_shape(phases.ref, state.params, batch)["logp"])
    if phases.kl_reward is not None:
        batch, _ = jax.eval_shape(phases.kl_reward, batch, rewards)
    want = RLBatch.abstract(run)
    assert jax.tree.structure(batch) == jax.tree.structure(want)
    for got, planned in zip(jax.tree.leaves(batch), jax.tree.leaves(want), strict=True):
        assert (got.shape, got.dtype) == (planned.shape, planned.dtype)
    _, train_m = jax.eval_shape(phases.update, state, batch, key)
    assert ("kl_ref" in train_m) == (batch.ref_logp is not None)
    if extra.get("rl.log_kl_ref"):  # gmpo's kl_coef is 0: the reference is there for the log
        assert run.objective.kl_coef == 0 and batch.ref_logp is not None


# ------------------------------------------------------------------- the pipeline's plan


def test_pipeline_sync_time_is_the_shard_over_one_direction_of_ici():
    """A sync's roofline: each rollout device receives its shard over half the chip's
    bidirectional ICI bandwidth, or the trainer devices' share of sending is longer."""
    from gspo_jax.planning import pipeline_plan

    v5p = memory_plan.CHIPS["v5p"]  # 1,200 GB/s bidirectional: 600 GB/s one way
    assert pipeline_plan.sync_seconds(6e9, 2, 2, v5p) == pytest.approx(0.01)
    # 6 rollout devices each receiving 6 GB from 2 trainer devices: 18 GB sent by each
    assert pipeline_plan.sync_seconds(6e9, 6, 2, v5p) == pytest.approx(0.03)
    assert pipeline_plan.sync_seconds(6e9, 2, 2, memory_plan.CHIPS["v4"]) is None


def test_pipeline_split_suggestion_balances_the_two_programs():
    """With the rollout three times the update's work, the split that gives the rollout three
    quarters of the devices balances them; a split whose groups cannot hold their programs, or
    whose rows do not divide, or that breaks the rollout's model layout, is never suggested."""
    from gspo_jax.planning import pipeline_plan

    v5p, gib = memory_plan.CHIPS["v5p"], 2**30
    hbm = 100 * gib

    def split(update_peak=10 * gib, rollout_peak=10 * gib, copy=0, shards=1, prompts=48):
        rollout = (3.0 * 8 / 4, 4, rollout_peak, copy, shards)  # 24 device-seconds on 4
        update = (1.0 * 8 / 4, 4, update_peak)  # 8 device-seconds on 4
        return pipeline_plan.suggest_split(8, v5p, hbm, rollout, update, prompts, 1)

    best, steps = split()
    assert best == 6 and steps[6] == pytest.approx(4.0)  # max(24 / 6, 8 / 2)
    # perfectly scaling work balanced over D devices: the synchronous step's (24 + 8) / 8, no
    # better; the split gains only where a program scales worse than perfectly
    assert steps[best] == pytest.approx((24 + 8) / 8)
    assert set(split(prompts=4)[1]) == {1, 2, 4}  # 4 prompts over R data shards
    assert set(split(shards=2)[1]) == {2, 4, 6}  # the model's 2 shards kept
    assert max(split(update_peak=80 * gib)[1]) == 4  # 4 / (8 - R) x 80 GiB <= 90 GiB
    # 4 / R x 60 GiB <= 90 GiB from R = 3, but sharding.transfer needs one group's device count
    # to divide the other's: 3 + 5 (and 5 + 3) are never suggested
    assert min(split(rollout_peak=60 * gib)[1]) == 4
    assert not {3, 5} & set(split()[1])
    assert split(update_peak=200 * gib) == (None, {})  # 800 GiB of update on at most 7


def test_the_synchronous_baseline_widens_the_trainers_mesh():
    from gspo_jax.planning import pipeline_plan

    cfg = config_lib.load_config_file(QWEN + ":model=qwen3_1_7b,slice=v5p-8,fsdp=2")
    with cfg.unlocked():
        cfg.rollout.devices, cfg.rl.max_staleness = 2.0, 1
    base = pipeline_plan.synchronous_config(cfg, 2)
    assert base.mesh.fsdp == 4 and base.rollout.devices == 0 and base.rl.max_staleness == 0
    assert cfg.mesh.fsdp == 2  # the config itself is left as it was
    with pytest.raises(config_lib.ConfigError, match="does not divide"):
        pipeline_plan.synchronous_config(cfg, 3)


@pytest.mark.long
def test_the_dry_run_plans_a_rollout_device_group():
    """The tiny preset on v6e-8: trainer 4 + rollout 4 devices compiled on their own meshes; the
    rollout group holds no optimizer state and the plan prints both groups and the step times."""
    from gspo_jax.planning import pipeline_plan

    cfg = config_lib.load_config_file(QWEN + ":runlocal")
    with cfg.unlocked():
        cfg.rollout.devices, cfg.mesh.data, cfg.rl.max_staleness = 4.0, 1, 1
    p = pipeline_plan.plan(cfg)
    tr, ro = p["groups"]["trainer"], p["groups"]["rollout"]
    assert (tr["devices"], ro["devices"]) == (4, 4) and tr["mesh"]["fsdp"] == 4
    assert ro["rollout_peak"] < tr["update_peak"]
    assert p["sync_bytes"] == 4 * ro["copy"] and ro["copy"] == p["params_total"]  # replicated
    assert p["step_s"]["pipelined"] >= max(ro["time"], tr["time"])
    assert p["balanced_s"] <= p["step_s"]["pipelined"]  # no split beats the balanced work
    text = pipeline_plan.format_plan(p)
    assert "trainer 4 + rollout 4 devices" in text and "pipelined step" in text


def test_pipeline_sync_is_charged_to_each_group_on_its_own_path():
    """sync_sides: a rollout device pays receiving its shard; a trainer device pays gathering
    one rollout shard (the reshard) and sending its R / (D - R) share; the suggested split
    adds each side to its own group's time."""
    from gspo_jax.planning import pipeline_plan

    v5p = memory_plan.CHIPS["v5p"]  # 600 GB/s one way
    trainer, rollout = pipeline_plan.sync_sides(6e9, 2, 2, v5p)
    assert rollout == pytest.approx(0.01) and trainer == pytest.approx(0.02)
    assert pipeline_plan.sync_sides(6e9, 6, 2, v5p) == pytest.approx((0.04, 0.01))
    # an update-bound split: the trainer's side of the sync lengthens the step, not the rollout's
    rollout_prog = (1.0, 4, 1, 6e9, 1)  # 4 device-seconds, a 6 GB copy per rollout device
    update_prog = (3.0, 4, 1)  # 12 device-seconds
    _, steps = pipeline_plan.suggest_split(8, v5p, 100 * 2**30, rollout_prog, update_prog, 48, 1)
    send, _ = pipeline_plan.sync_sides(6e9, 2, 6, v5p)
    assert steps[2] == pytest.approx(12 / 6 + send)


def test_the_pipelined_step_is_the_slowest_of_three_loops():
    """step_seconds: the trainer's loop, the rollout's, and the chain update -> sync -> rollout
    -> update spread over depth + 1 steps; a deeper pipeline hides the chain, not a loop."""
    from gspo_jax.planning import pipeline_plan

    sides = (0.5, 0.25)  # (trainer, rollout) seconds of a sync
    assert pipeline_plan.step_seconds(4.0, 3.0, sides, 1, 1) == pytest.approx(4.25)  # rollout's
    assert pipeline_plan.step_seconds(1.0, 3.0, sides, 2, 3) == pytest.approx(3.25)  # trainer's
    # depth 0 on a rollout group: the serial step, both sides of the sync included
    assert pipeline_plan.step_seconds(4.0, 3.0, sides, 1, 0) == pytest.approx(7.75)
    # a sync every 2 steps at depth 1 (k = 2): each loop pays half a sync, the chain a whole one
    # over 2 steps; depth 2 (k = 3) hides it
    assert pipeline_plan.step_seconds(3.0, 3.0, (1.0, 1.0), 2, 1) == pytest.approx(8 / 2)
    assert pipeline_plan.step_seconds(3.0, 3.0, (1.0, 1.0), 2, 2) == pytest.approx(3.5)


def test_a_rollout_bound_split_holds_a_second_copy():
    """Where the rollout is the slower loop, the next copy lands while the previous rollout
    reads the old one: the split must hold both, and an update-bound split need not."""
    from gspo_jax.planning import pipeline_plan

    v5p, gib = memory_plan.CHIPS["v5p"], 2**30
    update = (1.0, 4, 10 * gib)  # 4 device-seconds: every split of 8 is rollout-bound
    rollout = (3.0, 4, 60 * gib, 30 * gib, 2)  # a 30 GiB copy, 2 model shards
    _, steps = pipeline_plan.suggest_split(8, v5p, 100 * gib, rollout, update, 48, 1)
    # R = 4: 30 + 30 rows + 30 second copy = 90 GiB fits; R = 2: 30 + 60 + 30 does not
    assert set(steps) == {4, 6}
    assert pipeline_plan.rollout_bound(3.0, 1.0, (0.0, 0.0), 1)
    assert not pipeline_plan.rollout_bound(1.0, 3.0, (0.0, 0.0), 1)
