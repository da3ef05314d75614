"""Where a population's step time goes: its rollout and update against the single run's, per member.

    PYTHONPATH=. python experiments/benchmarks/population_phases_bench.py --seeds 8 --repeats 3 \
        --out bench_out/population_phases.json

Times, in one process and alternating, the first step's rollout and update of N seeds of the
experiment (its cached warm start, one device): the single run's jitted phases once per member
(N calls, what N processes compute), and the population's phases for all N members with
config.population.batching "vmap" (one batched program) and "map" (the members one after another
inside one program). Prints the median seconds of each and, per phase, the population's time over
the N single calls (1 = batching gains nothing; below 1 it gains). The figures belong in
docs/population.md with the machine's load.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from machine import write_report  # this folder is on sys.path: the script runs from it

from gspo_jax import config as config_lib
from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import build, population
from gspo_jax.rl import step as ts
from gspo_jax.state import step_keys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(REPO, "configs", "arith.py"))
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="")
    args = p.parse_args()
    base = config_lib.load_config_file(args.config)
    with base.unlocked():
        base.population.seeds = tuple(range(args.seeds))
    pops = {}
    for batching in ("vmap", "map"):
        cfg = copy.deepcopy(base)
        with cfg.unlocked():
            cfg.population.batching = batching
        pops[batching] = population.build_population(cfg)
    pop = pops["vmap"]
    run, M = pop.run, pop.size
    params, _ = build.base_params(run)
    batches = [next(data_iterator.make_data_iterator(m.config, run.task)) for m in pop.members]
    prompts = np.stack([b["prompt"] for b in batches]).astype(np.int32)  # [M, P, Lp]
    lengths = np.stack([b["prompt_length"] for b in batches]).astype(np.int32)  # [M, P]
    state = population.initial_state(pop, params)
    keys = jax.jit(jax.vmap(step_keys))(state.rng, state.step)  # {name: [M, 2]}

    # the single run's phases (member 0's program; each member's inputs); the timed updates
    # start from a fresh state (they donate it), the population's too
    single = ts.make_phases(run, build.abstract_state(run, run.abs_params), with_ref=False)
    one = build.initial_state(run, params)
    sample = single.rollout(one.params, prompts[0], lengths[0], keys["rollout"][0])
    rewards = jnp.zeros(sample.mask.shape[:1], jnp.float32)  # the update's cost does not read them
    batch, _ = single.prepare(
        sample, rewards, prompts[0], lengths[0], jnp.zeros_like(rewards, bool)
    )
    phases = {b: population.make_phases(q, with_ref=False) for b, q in pops.items()}
    stacked = population.stack([batch] * M)
    active = jnp.ones((M,), bool)

    def single_rollouts():
        return [
            single.rollout(one.params, prompts[i], lengths[i], keys["rollout"][i]).tokens
            for i in range(M)
        ]

    def single_updates():
        out = []
        for i in range(M):
            s = build.initial_state(run, jax.tree.map(jnp.copy, params))  # it is donated
            out.append(single.update(s, batch, keys["shuffle"][i])[1]["loss"])
        return out

    def pop_rollout(b):
        return lambda: phases[b].rollout(state.params, prompts, lengths, keys["rollout"]).tokens

    def pop_update(b):
        def fn():
            s = population.initial_state(pops[b], params)
            return phases[b].update(s, stacked, keys["shuffle"], pops[b].hparams, active)[1]["loss"]

        return fn

    variants = {
        "rollout/single_x_n": single_rollouts,
        "rollout/vmap": pop_rollout("vmap"),
        "rollout/map": pop_rollout("map"),
        "update/single_x_n": single_updates,
        "update/vmap": pop_update("vmap"),
        "update/map": pop_update("map"),
    }
    for fn in variants.values():  # compile
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, fn in variants.items():
            times[k].append(_timed(fn))
    median = {k: float(np.median(v)) for k, v in times.items()}
    ratio = {
        k: median[k] / median[k.split("/")[0] + "/single_x_n"]
        for k in median
        if not k.endswith("single_x_n")
    }
    result = {
        "config": args.config,
        "members": M,
        "repeats": args.repeats,
        "median_s": median,
        "population_over_single_x_n": ratio,
        "times_s": times,
        "load_average": os.getloadavg(),
    }
    write_report(result, args.out)


if __name__ == "__main__":
    main()
