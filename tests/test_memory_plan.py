"""The dry run's memory plan: slice names, sharded optimizer state, and the compiled plan of
qwen3_0_6b on 8 simulated devices (compile only)."""

import math

import jax
import pytest

from gspo_jax import config as config_lib
from gspo_jax import experiment as exp
from gspo_jax import memory_plan

QWEN = "configs/qwen3_gsm8k.py"


def test_slice_names():
    assert memory_plan.get_slice("v5p-8") == memory_plan.Slice(4, 95.0)  # TensorCores: 2 a chip
    assert memory_plan.get_slice("v5p-32").devices == 16
    assert memory_plan.get_slice("v6e-8") == memory_plan.Slice(8, 32.0)  # chips
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
    text = memory_plan.format_plan(plan)
    assert "qwen3_0_6b on v6e-8 (8 devices" in text and "fits" in text
    small = dict(plan, hbm=plan["needed"] // 2, fits=False)
    with pytest.raises(config_lib.ConfigError, match="does not fit v6e-8") as e:
        memory_plan.check_fits(small)
    assert "GiB per device" in str(e.value) and "larger slice" in str(e.value)
