"""Host-device traffic of an RL step is explicit: a step runs under
jax.transfer_guard("disallow"), so an accidental hop (a NumPy array or a Python scalar handed to a
device computation, a device array read on the host) fails here instead of costing a sync per step.

The step's explicit transfers are distributed.to_global (prompts, rewards, scores),
distributed.to_local (the responses scored on the host) and the one jax.device_get of its metrics.
"""

import jax
import pytest
from trainer_runs import make_config

from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import build
from gspo_jax.rl import step as ts

# Every optional phase of a dense run: dynamic sampling (extra generation batches), overlong
# shaping, the old_logp recompute (with its mismatch metrics) and the reference pass.
OPTIONS = {
    "init.kind": "random",
    "num_devices": 2,
    "rl.prompts_per_step": 4,
    "rl.group_size": 2,
    "rl.num_minibatches": 2,
    "rl.max_new_tokens": 8,
    "rl.dynamic_sampling": True,
    "rl.max_gen_batches": 2,
    "rl.overlong_buffer": 2,
    "rl.overlong_penalty": 0.5,
    "rl.recompute_old_logp": True,
    "objective.name": "grpo",
    "objective.kl_coef": 0.01,
    "eval.num_problems": 0,
}


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_a_step_makes_no_implicit_transfer(shared, kl_in_reward):
    run = build.build_run(make_config(shared, **OPTIONS, **{"rl.kl_in_reward": kl_in_reward}))
    params, _ = build.base_params(run)
    state = build.initial_state(run, params)
    ref_params = jax.tree.map(lambda x: x.copy(), params)
    phases = ts.make_phases(run, state, with_ref=True)
    data = data_iterator.make_data_iterator(run.config, run.task)
    for _ in range(2):  # the first step compiles, the second runs what is compiled
        with jax.transfer_guard("disallow"):
            state, m = ts.rl_step(
                run,
                phases,
                state,
                next(data),
                ref_params=ref_params,
                more_batches=lambda: next(data),
            )
        assert all(isinstance(v, float) for v in m.values())
    assert int(jax.device_get(state.step)) == 2
    assert "rollout/mismatch_tok_abs_mean" in m and "rollout/overlong_shaping_mean" in m
    assert ("rollout/kl_reward_k1_mean" in m) == kl_in_reward
