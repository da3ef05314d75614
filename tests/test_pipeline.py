"""Tests for the asynchronous pipeline (rl/pipeline.py): the schedule's staleness bound over
schedules and resumes, the batches in flight saved with the data stream, depth 0 equal to the
synchronous step bit for bit, the rollout's own device group, and exact resume with rollouts in
flight.

Dimension legend: B rows, T response slots.
"""

import os

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gspo_jax.config import ConfigError
from gspo_jax.rl import pipeline, placement
from gspo_jax.rl.pipeline import InFlight, PipelineQueue, Schedule

# ---- the schedule, driven as the Pipeline drives it, over kills and resumes


def _simulate(k: int, s: int, steps: int, kills: set[int]) -> list[tuple[int, int, int]]:
    """Runs Schedule like Pipeline.step: (step, the version that sampled its batch, the data
    draw it trained on) per step. A kill before step t restores the batches in flight saved
    after step t - 1 and loses the rollout's copy of the parameters (a fresh process)."""
    sched = Schedule(k, s)
    in_flight: list[tuple[int, int, int]] = []  # (step, version, draw)
    copy_version, draws, used = None, 0, []
    for t in range(steps):
        if t in kills:
            copy_version = None
        if sched.sync_due(t, copy_version):
            copy_version = t
        for j in sched.to_start(t, [b[0] for b in in_flight]):
            in_flight.append((j, copy_version, draws))
            draws += 1
        in_flight.sort()
        step, version, draw = in_flight.pop(0)
        assert step == t
        sched.check(t, version)
        used.append((t, version, draw))
    return used


@settings(max_examples=300, deadline=None)
@given(
    k=st.integers(0, 8),
    s_off=st.integers(0, 8),
    steps=st.integers(1, 40),
    kills=st.sets(st.integers(1, 39), max_size=5),
)
def test_the_bound_is_never_exceeded_over_schedules_and_resumes(k, s_off, steps, kills):
    s = 1 + s_off % (k + 1)  # sync_every <= max_staleness + 1 (check_pipeline)
    used = _simulate(k, s, steps, kills)
    lags = [t - v for t, v, _ in used]
    assert all(0 <= lag <= k for lag in lags)
    # each step trains on its own draw of the data stream, in order, whatever the schedule
    assert [d for _, _, d in used] == list(range(steps))
    # kills at sync steps (where checkpoint.every, a multiple of sync_every, saves) change nothing
    at_syncs = {t for t in kills if t % s == 0}
    assert _simulate(k, s, steps, at_syncs) == _simulate(k, s, steps, set())
    # the bound is reached once the pipeline is full (the schedule uses the staleness it may)
    if steps > k + s:
        assert max(t - v for t, v, _ in _simulate(k, s, steps, set())) == k


def test_versions_of_a_depth_two_schedule():
    assert [v for _, v, _ in _simulate(2, 1, 6, set())] == [0, 0, 0, 1, 2, 3]
    assert [v for _, v, _ in _simulate(3, 2, 8, set())] == [0, 0, 0, 0, 2, 2, 4, 4]
    assert [v for _, v, _ in _simulate(0, 1, 4, set())] == [0, 1, 2, 3]


# ---- the batches in flight travel with the data stream's state


class _Stream:
    def __init__(self):
        self.i = 0

    def __next__(self):
        self.i += 1
        return {"prompt": np.full((2, 3), self.i, np.int32)}

    def get_state(self):
        return b"grain-bytes-%d" % self.i

    def set_state(self, state):
        self.i = int(state.split(b"-")[-1])


def test_batches_in_flight_are_saved_with_the_stream():
    q = PipelineQueue(_Stream())
    next(q)
    rng = np.random.default_rng(0)
    q.in_flight = [
        InFlight(
            step,
            version,
            {"prompt": rng.integers(0, 9, (2, 3)).astype(np.int32)},
            {
                "tokens": rng.integers(0, 9, (4, 5)),
                "logp": rng.normal(size=(4, 5)),
                "routes": rng.integers(0, 4, (4, 2, 8, 1)),
            },
        )  # fmt: skip
        for step, version in ((3, 1), (4, 2))
    ]
    state = q.get_state()
    import json

    state = json.loads(json.dumps(state))  # what the checkpoint writes
    r = PipelineQueue(_Stream())
    r.set_state(state)
    assert r._inner.i == 1 and next(r)["prompt"][0, 0] == 2
    assert [(b.step, b.version) for b in r.in_flight] == [(3, 1), (4, 2)]
    for a, b in zip(q.in_flight, r.in_flight, strict=True):
        for part in ("batch", "sample"):
            x, y = getattr(a, part), getattr(b, part)
            assert set(x) == set(y)
            for f in x:
                np.testing.assert_array_equal(x[f], y[f])
                assert x[f].dtype == y[f].dtype


# ---- config checks


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"rl.max_staleness": -1}, "must be >= 0"),
        ({"rl.max_staleness": 1, "rl.sync_every": 3}, "sync_every <= max_staleness \\+ 1"),
        ({"rl.max_staleness": 2, "rl.sync_every": 2, "checkpoint.every": 3}, "multiple of"),
        ({"rl.max_staleness": 1, "rl.dynamic_sampling": True}, "dynamic_sampling"),
        ({"rollout.devices": 8.0, "num_devices": 8}, "the trainer none"),
        ({"rollout.devices": 2.5, "num_devices": 8}, "whole device count"),
        ({"rollout.devices": 0.5, "num_devices": 8, "rollout.mesh.data": 3}, "rollout.mesh"),
        ({"rl.max_staleness": 1, "rollout.sync_dtype": "bf16"}, "use 'rollout'"),
    ],
)
def test_pipeline_config_errors(shared, fields, match):
    from trainer_runs import make_config

    from gspo_jax.rl import build

    fields = {"num_devices": 1, **fields}
    with pytest.raises(ConfigError, match=match):
        build.build_run(make_config(shared, **fields), None)


def test_rollout_devices_count_or_fraction():
    from ml_collections import ConfigDict

    def count(v, n):
        return placement.rollout_device_count(ConfigDict({"rollout": {"devices": v}}), n)

    assert [count(0.0, 8), count(4.0, 8), count(0.25, 8), count(0.01, 8)] == [0, 4, 2, 1]


# ---- the step: depth 0 is the synchronous step; a rollout device group


def _run_and_state(shared, **fields):
    from trainer_runs import make_config

    from gspo_jax.rl import build

    run = build.build_run(make_config(shared, **fields), None)
    params, _ = build.base_params(run, shared["cache"])
    return run, params


def _stream(run):
    from gspo_jax.data import iterator as data_iterator

    return data_iterator.make_data_iterator(run.config, run.task)


def _fresh_state(run, params):
    """Step 0 on a copy of the parameters (the update donates its state)."""
    import jax.numpy as jnp

    from gspo_jax.rl import build

    return build.initial_state(run, jax.tree.map(jnp.copy, params))


def _sync_steps(run, params, n):
    from gspo_jax.rl import step as ts

    state, stream, ms = _fresh_state(run, params), _stream(run), []
    phases = ts.make_phases(run, state, with_ref=False)
    for _ in range(n):
        state, m = ts.rl_step(run, phases, state, next(stream))
        ms.append(m)
    return state, ms, phases


def _pipeline_steps(run, params, n, phases=None):
    from gspo_jax.rl import step as ts

    state = _fresh_state(run, params)
    phases = phases or ts.make_phases(run, state, with_ref=False)
    pipe = pipeline.Pipeline(run, phases, PipelineQueue(_stream(run)))
    ms = []
    for _ in range(n):
        state, m = pipe.step(state)
        ms.append(m)
    return state, ms, pipe


PIPELINE_ONLY = {
    "rollout/version",
    "rollout/staleness_mean",
    "rollout/staleness_max",
    "rollout/fresh_tokens_frac",
}


def _same_metrics(a: dict, b: dict, **tol):
    """The pipeline's step metrics ``a`` equal the synchronous step's ``b``; it adds only its
    staleness metrics (and times)."""
    assert {k for k in set(a) - set(b) if not k.startswith("time/")} == PIPELINE_ONLY
    for k in (k for k in b if not k.startswith("time/")):
        if tol:
            np.testing.assert_allclose(a[k], b[k], err_msg=k, **tol)
        else:
            assert a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])), k


BF16_TRAINER_COPY = {"rl.rollout_dtype": "bfloat16", "rollout.sync_dtype": "trainer"}


@pytest.mark.parametrize(
    "devices,fields",
    [
        (1, {}),
        (8, {}),
        (1, BF16_TRAINER_COPY),
        # two more trainer runs each (about a minute): .ci/run's long stage
        pytest.param(1, {"rl.rollout_quant": "int8"}, marks=pytest.mark.long),
        pytest.param(1, {"lora.rank": 4, "lora.base_quant": "int8"}, marks=pytest.mark.long),
    ],
    ids=["1", "8", "1-bf16", "1-int8", "1-qlora"],
)
def test_depth_zero_pipeline_is_the_synchronous_step_bit_for_bit(shared, devices, fields):
    """Also under a bf16 rollout whose sync keeps the parameters' dtype (rollout.sync_dtype
    "trainer"), under an int8 rollout, whose sync sends the weights quantized
    (tests/test_quant_sync.py), and with QLoRA (the copy: the int8 base and the adapters)."""
    run, params = _run_and_state(shared, num_devices=devices, **fields)
    sync_state, sync_ms, phases = _sync_steps(run, params, 2)
    pipe_state, pipe_ms, _ = _pipeline_steps(run, params, 2, phases)
    for a, b in zip(pipe_ms, sync_ms, strict=True):
        _same_metrics(a, b)
        assert a["rollout/staleness_max"] == 0 and a["rollout/fresh_tokens_frac"] == 1
    for x, y in zip(jax.tree.leaves(pipe_state), jax.tree.leaves(sync_state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_the_sync_sends_the_weights_in_the_rollout_dtype(shared):
    """Under a bf16 rollout (rollout.sync_dtype "rollout", the default) the copy holds every
    weight in bfloat16 except those the layers read in float32 (norm scales) and weighs about
    half the float32 parameters; the rollout from it samples the same tokens with log-probs
    within float rounding (XLA:CPU keeps the float32 weights' excess precision)."""
    import jax.numpy as jnp

    from gspo_jax.rl import build
    from gspo_jax.rl import step as ts

    run, params = _run_and_state(shared, num_devices=1, **{"rl.rollout_dtype": "bfloat16"})
    copy = pipeline.rollout_copy(run)(params)
    phases = ts.make_phases(run, build.initial_state(run, copy), with_ref=False)
    batch = next(_stream(run))
    args = [jnp.asarray(batch[f], jnp.int32) for f in ("prompt", "prompt_length")]
    key = jax.random.key_data(jax.random.key(3))
    want, got = phases.rollout(params, *args, key), phases.rollout(copy, *args, key)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_allclose(np.asarray(got.logp), np.asarray(want.logp), atol=1e-5)
    kept = {jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(copy)
            if x.dtype == jnp.float32}  # fmt: skip
    assert kept and all("scale" in k for k in kept)
    nbytes = lambda t: sum(x.nbytes for x in jax.tree.leaves(t))  # noqa: E731
    assert 0.5 <= nbytes(copy) / nbytes(params) < 0.52


def test_resharding_onto_the_rollout_mesh_is_exact(shared):
    run, params = _run_and_state(shared, num_devices=8, **{"rollout.devices": 4.0})
    assert len(run.mesh.devices.flat) == 4 and len(run.rollout_mesh.devices.flat) == 4
    assert not set(run.mesh.devices.flat) & set(run.rollout_mesh.devices.flat)
    on_rollout = jax.device_put(params, run.rollout_shardings)
    back = jax.device_put(on_rollout, run.state_shardings)
    for x, y, z in zip(*map(jax.tree.leaves, (params, on_rollout, back)), strict=True):
        assert set(y.sharding.device_set) <= set(run.rollout_mesh.devices.flat)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        np.testing.assert_array_equal(np.asarray(x), np.asarray(z))


def test_a_rollout_device_group_samples_what_the_shared_mesh_samples(shared):
    """k = 0 on a rollout group of 4 of 8 devices: the same tokens as the 8-device shared run,
    so the first step's metrics agree to float tolerance (sums in another order)."""
    run8, params = _run_and_state(shared, num_devices=8)
    _, sync_ms, _ = _sync_steps(run8, params, 1)
    run, params = _run_and_state(shared, num_devices=8, **{"rollout.devices": 4.0})
    _, ms, pipe = _pipeline_steps(run, params, 1)
    assert pipe.mesh is run.rollout_mesh
    _same_metrics(ms[0], sync_ms[0], rtol=1e-5, atol=1e-6)


# ---- the sync device to device; rollouts in flight across steps


@pytest.mark.parametrize(
    "rollout_mesh", [{"data": 4}, {"data": 2, "fsdp": 2}], ids=["data4", "data2_fsdp2"]
)
def test_a_sync_passes_no_parameter_through_host_memory(shared, rollout_mesh):
    """8 simulated devices: the trainer's 4 with fsdp=4, the rollout's 4 laid out otherwise (the
    layouts of docs/pods.md, where jax.device_put fetches leaves to the host). The pipeline's
    sync under transfer guards that refuse any host transfer lands the copy on the rollout's
    shardings, in the rollout's dtype, equal to the copy made on the trainer's devices."""
    import jax.numpy as jnp

    from gspo_jax.rl import step as ts

    mesh_fields = {f"rollout.mesh.{a}": v for a, v in rollout_mesh.items()}
    fields = {"rollout.devices": 4.0, "mesh.fsdp": 4, "rl.rollout_dtype": "bfloat16"}
    run, params = _run_and_state(shared, num_devices=8, **fields, **mesh_fields)
    assert dict(run.mesh.shape)["fsdp"] == 4 and run.rollout_mesh.size == 4
    state = _fresh_state(run, params)
    pipe = pipeline.Pipeline(run, ts.make_phases(run, state, with_ref=False), None)
    want = jax.device_get(pipeline.rollout_copy(run)(params))
    targets = pipeline.copy_shardings(run, run.rollout_mesh)
    src, shardings = jax.tree.leaves(state.params), jax.tree.leaves(targets)
    shard = lambda x, sh: sh.shard_shape(x.shape)  # noqa: E731
    assert any(shard(x, x.sharding) != shard(x, t) for x, t in zip(src, shardings, strict=True))
    with (
        jax.transfer_guard_device_to_host("disallow"),
        jax.transfer_guard_host_to_device("disallow"),
    ):
        pipe._sync(state, 0)
        jax.block_until_ready(pipe.params)
    got = jax.tree.leaves(pipe.params)
    for x, t, w in zip(got, shardings, jax.tree.leaves(want), strict=True):
        assert x.sharding == t, (x.sharding, t)
        assert x.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(x), w)
    assert {x.dtype for x in got} >= {jnp.dtype(jnp.bfloat16)}


def _host_copy(state):
    """The state as a checkpoint restores it: host arrays put back on their shardings."""
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), x.sharding), state)


def test_two_rollouts_in_flight_and_an_exact_resume_with_both(shared):
    """k = 2: after a step, the rollouts of the next two steps are in flight, still on the
    rollout's side (dispatched, not fetched: the step did not wait for them); a checkpoint
    taken then (the state and PipelineQueue.get_state, through JSON) resumes into a fresh
    pipeline that trains on both and ends bit for bit where the uninterrupted run does."""
    import json

    from gspo_jax.rl import step as ts

    run, params = _run_and_state(shared, num_devices=1, **{"rl.max_staleness": 2})
    state = _fresh_state(run, params)
    phases = ts.make_phases(run, state, with_ref=False)
    whole_state, whole_ms, _ = _pipeline_steps(run, params, 4, phases)

    state = _fresh_state(run, params)
    pipe = pipeline.Pipeline(run, phases, PipelineQueue(_stream(run)))
    ms = []
    for t in range(2):
        state, m = pipe.step(state)
        ms.append(m)
        flight = pipe.queue.in_flight
        assert [(b.step, b.version) for b in flight] == [(t + 1, 0), (t + 2, t)]
        for b in flight:  # both still the rollout's arrays: the step waited for neither
            assert b.sample is None and isinstance(b.running["sample"].tokens, jax.Array)
    saved = json.loads(json.dumps(pipe.queue.get_state()))  # what the checkpoint writes
    assert [m["step"] for m in saved["pipeline"]["in_flight"]] == [2, 3]
    state = _host_copy(state)
    del pipe
    queue = PipelineQueue(_stream(run))
    queue.set_state(saved)
    resumed = pipeline.Pipeline(run, phases, queue)
    for _ in range(2):
        state, m = resumed.step(state)
        ms.append(m)
    for a, b in zip(ms, whole_ms, strict=True):
        assert {k for k in a if not k.startswith("time/")} == {
            k for k in b if not k.startswith("time/")
        }
        for k in (k for k in b if not k.startswith("time/")):
            assert a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])), k
    assert [m["rollout/staleness_max"] for m in ms] == [0, 1, 2, 2]
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(whole_state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ---- whole runs (long: after the README's command)


@pytest.mark.long
def test_stale_run_keeps_the_bound_and_resumes_exactly_with_rollouts_in_flight(shared):
    from trainer_runs import STEPS, assert_records, assert_trees, final_params, make_config, records

    from gspo_jax.rl import trainer

    cfg = lambda: make_config(shared, num_devices=1, **{"rl.max_staleness": 2})  # noqa: E731
    whole = os.path.join(shared["root"], "stale_whole")
    trainer.train(cfg(), whole)
    recs = records(whole)
    steps = recs[1:]
    assert [r["rollout/version"] for r in steps] == [0, 0, 0, 1][:STEPS]
    assert [r["rollout/staleness_max"] for r in steps] == [0, 1, 2, 2][:STEPS]
    # killed after step 3: the step-2 checkpoint holds the rollouts of steps 3 and 4 in flight
    split = os.path.join(shared["root"], "stale_split")
    assert trainer.train(cfg(), split, stop_after=3) is None
    trainer.train(cfg(), split)
    assert_trees(final_params(split), final_params(whole))
    assert_records(records(split), recs)


@pytest.mark.long
def test_a_stale_run_on_a_rollout_device_group_keeps_the_bound(shared):
    from trainer_runs import make_config, records

    from gspo_jax.rl import trainer

    fields = {"num_devices": 8, "rollout.devices": 0.5, "rl.max_staleness": 1}
    wd = os.path.join(shared["root"], "stale_group")
    summary = trainer.train(make_config(shared, **fields), wd)
    steps = records(wd, drop_time=False)[1:]
    assert max(r["rollout/staleness_max"] for r in steps) == 1
    assert all(np.isfinite(r["train/loss"]) for r in steps)
    assert all(0 <= r["time/rollout_idle_frac"] <= 1 for r in steps)
    assert summary is not None


@pytest.mark.long
def test_a_stale_pod_run_equals_one_process(shared):
    """k = 2 as 2 processes x 4 simulated devices equals k = 2 on 8 devices of one process: each
    process keeps its own rows of the batches in flight (and saves them in its data-stream
    file)."""
    from trainer_runs import (
        assert_records,
        assert_trees,
        final_params,
        launch_pod,
        make_config,
        records,
    )

    from gspo_jax.rl import trainer

    one = os.path.join(shared["root"], "stale_one_process")
    trainer.train(make_config(shared, num_devices=8, **{"rl.max_staleness": 2}), one)
    pod = os.path.join(shared["root"], "stale_pod")
    outs, codes = launch_pod(shared, pod, timeout=600, **{"rl.max_staleness": 2})
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert_trees(final_params(pod), final_params(one), rtol=2e-5, atol=2e-6)
    assert_records(records(pod), records(one), rtol=1e-4, atol=1e-5)
