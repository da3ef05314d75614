"""A population's rollout: its members decoding in step vs each with its own stop condition.

    python experiments/benchmarks/population_rollout_bench.py --seeds 8 --repeats 5 \
        --out bench_out/population_rollout.json

Under jax.vmap a per-member stop condition of the decode loop (a member stops when its rows have
ended) is a batched while_loop predicate: the loop runs until every member has ended and selects
every member's whole carry, its KV cache included, at each step, and its step counter is batched
(the cache writes become scatters). With the static engine's member_axis (rollout/static.py) the
members decode in step: one predicate for all (a psum over the member axis), no selects; a member
whose rows have ended steps on without changing its outputs. Both variants run the first step's
rollout of N seeds of the experiment (its cached warm start, one device), alternating, after one
compile each; the tokens must be the same. Prints the median seconds of each and the ratio.
The figures belong in docs/population.md with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from gspo_jax import config as config_lib
from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import build, population
from gspo_jax.rl import step as ts
from gspo_jax.state import step_keys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(REPO, "configs", "arith.py"))
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="")
    args = p.parse_args()
    config = config_lib.load_config_file(args.config)
    with config.unlocked():
        config.population.seeds = tuple(range(args.seeds))
    pop = population.build_population(config)
    M = pop.size
    params, _ = build.base_params(pop.run)
    state = population.initial_state(pop, params)
    batches = [next(data_iterator.make_data_iterator(m.config, pop.run.task)) for m in pop.members]
    prompts = np.stack([b["prompt"] for b in batches]).astype(np.int32)  # [M, P, Lp]
    lengths = np.stack([b["prompt_length"] for b in batches]).astype(np.int32)  # [M, P]
    keys = jax.jit(jax.vmap(step_keys))(state.rng, state.step)["rollout"]  # [M, 2]

    def members(member_axis):
        rollout = ts.make_rollout_fn(pop.run, member_axis=member_axis)
        return jax.jit(population.over_members(rollout, M, pop.axis, 1, "vmap"))

    variants = {"own_stop": members(None), "in_step": members(population.MEMBERS)}
    tokens = {}
    for name, fn in variants.items():  # compile and check
        tokens[name] = np.asarray(fn(state.params, prompts, lengths, keys).tokens)
    np.testing.assert_array_equal(tokens["own_stop"], tokens["in_step"])
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(state.params, prompts, lengths, keys).tokens)
            times[name].append(time.perf_counter() - t0)
    median = {name: float(np.median(ts_)) for name, ts_ in times.items()}
    result = {
        "config": args.config,
        "members": M,
        "repeats": args.repeats,
        "median_s": median,
        "speedup_in_step": median["own_stop"] / median["in_step"],
        "times_s": times,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
