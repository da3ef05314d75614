"""The quantized sync (rl/pipeline.py rollout_copy with config.rl.rollout_quant): the pipeline's
copy of the parameters holds the projections already quantized (qvalues + scales), the rollout
reads them as they are and samples what the synchronous rollout samples; the pipeline's dry run
(planning/pipeline_plan.py) counts the quantized bytes (long). The depth-0 pipeline under int8
equals the synchronous int8 step bit for bit: tests/test_pipeline.py.

Dimension legend: P prompts, Lp prompt slots.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from trainer_runs import make_config

from gspo_jax import config as config_lib
from gspo_jax import rollout
from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import build, pipeline
from gspo_jax.rl import step as ts

SMALL = {"init.kind": "random", "num_devices": 1, "eval.num_problems": 0}


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("quant", ["int8", "fp8"])
def test_the_sync_sends_quantized_weights_the_rollout_reads_as_they_are(shared, quant):
    run = build.build_run(make_config(shared, **SMALL, **{"rl.rollout_quant": quant}))
    params, _ = build.base_params(run)
    copy = jax.jit(pipeline.rollout_copy(run))(params)
    held = nnx.state(ts.rollout_model(run, params), rollout.QuantizedParam)
    sent = copy.filter(rollout.QuantizedParam)
    # the seven projections, quantized as the synchronous rollout quantizes them (bit for bit)
    assert len(nnx.to_flat_state(sent)) == len(rollout.quant.CONTRACTED_AXES)
    for x, y in zip(jax.tree.leaves(sent), jax.tree.leaves(held), strict=True):
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    # the projections' bytes: qvalues (1 byte) + one float32 scale per output channel
    proj = params.filter(lambda p, _: p[-1] in rollout.quant.CONTRACTED_AXES)
    assert 0.25 < _nbytes(sent) / _nbytes(proj) < 0.3
    # rollout_model reads the copy as it is (the same QArrays, not quantized again)
    model = ts.rollout_model(run, copy)
    read, sent_q = model.layers.attn.q_proj.get_raw_value(), copy["layers"]["attn"]["q_proj"]
    assert read.qvalue is sent_q.get_raw_value().qvalue
    batch = next(data_iterator.make_data_iterator(run.config, run.task))
    args = [jnp.asarray(batch[f], jnp.int32) for f in ("prompt", "prompt_length")]  # [P, Lp], [P]
    key = jax.random.key_data(jax.random.key(3))
    fn = ts.make_rollout_fn(run)
    want, got = fn(params, *args, key), fn(copy, *args, key)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_array_equal(np.asarray(got.logp), np.asarray(want.logp))


def test_the_copy_is_sharded_like_the_weights(shared):
    run = build.build_run(
        make_config(shared, **{**SMALL, "num_devices": 2}, **{"rl.rollout_quant": "int8"})
    )
    shardings = pipeline.copy_shardings(run, run.mesh)
    sent = jax.eval_shape(pipeline.rollout_copy(run), run.abs_params)
    assert jax.tree.structure(shardings) == jax.tree.structure(sent)
    q = shardings["layers"]["mlp"]["up_proj"].get_raw_value()  # [L, D, F]
    w = run.state_shardings["layers"]["mlp"]["up_proj"].get_value()
    assert q.qvalue.spec == w.spec and q.scale.spec[1] is None  # D: contracted, one scale


@pytest.mark.long
def test_the_pipeline_dry_run_counts_the_quantized_sync():
    """The tiny preset on v6e-8, trainer 4 + rollout 4 devices, int8 rollout: the copy each
    rollout device receives is the quantized one (about a third of the float32 parameters on
    this tiny model, whose float32 embedding is a large share)."""
    from test_memory_plan import QWEN

    from gspo_jax.planning import pipeline_plan

    cfg = config_lib.load_config_file(QWEN + ":runlocal")
    with cfg.unlocked():
        cfg.rollout.devices, cfg.mesh.data, cfg.rl.max_staleness = 4.0, 1, 1
        cfg.rl.rollout_quant = "int8"
    p = pipeline_plan.plan(cfg)
    ro = p["groups"]["rollout"]
    run = build.build_run(cfg)
    assert ro["copy"] == p["params_total"] and p["sync_bytes"] == 4 * ro["copy"]
    assert p["params_total"] < 0.5 * _nbytes(run.abs_params)


@pytest.mark.long
def test_a_rollout_device_group_receives_the_quantized_copy(shared):
    """int8 on a rollout group of 4 of 8 devices: the sync puts the quantized copy on the
    rollout's devices, with copy_shardings's shardings, and the pipelined step samples what the
    shared 8-device int8 run samples (its metrics to float tolerance, as without quantization:
    tests/test_pipeline.py)."""
    from test_pipeline import _pipeline_steps, _run_and_state, _same_metrics, _sync_steps

    quant = {"rl.rollout_quant": "int8"}
    run8, params = _run_and_state(shared, num_devices=8, **quant)
    _, sync_ms, _ = _sync_steps(run8, params, 1)
    run, params = _run_and_state(shared, num_devices=8, **{"rollout.devices": 4.0}, **quant)
    _, ms, pipe = _pipeline_steps(run, params, 1)
    copy = pipe.params
    assert nnx.to_flat_state(copy.filter(rollout.QuantizedParam))
    want = pipeline.copy_shardings(run, run.rollout_mesh)
    for x, s in zip(jax.tree.leaves(copy), jax.tree.leaves(want), strict=True):
        assert x.sharding == s
    _same_metrics(ms[0], sync_ms[0], rtol=1e-5, atol=1e-6)
