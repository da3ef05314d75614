"""A population's rollout against its members' single rollouts, and where the difference goes.

    PYTHONPATH=. python experiments/benchmarks/population_rollout_bench.py --seeds 8 --repeats 5 \
        --out bench_out/population_rollout.json

Times, in one process and alternating, the first step's rollout of N seeds of the experiment (its
cached warm start, one device): the single run's jitted rollout once per member (N calls, what N
processes compute), and the population's rollout three ways: "vmap" and "map"
(config.population.batching: the decode loop under jax.vmap, or the members one after another
under lax.map inside one program) and "member" (rl/population.py make_member_rollout, what the
step samples with on a CPU by default: the single run's program per member). Every variant must
give the same tokens. From each compiled program it also counts the copies of arrays as large
as the members' KV cache (one chunk of generated slots, keys or values, every layer) inside
while-loop bodies (the decode loop and its layer scan: a single rollout writes it in place),
and reports the loop trips: each member's longest response
against the population's (a vmapped loop runs until the last member ends). Prints median seconds
and the ratios to the N single calls; the figures belong in docs/population.md with the load.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
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


def loop_copies(hlo: str, min_elements: int) -> int:
    """How many copy ops of at least ``min_elements`` elements the computations that while loops
    run as bodies hold (each runs once per trip)."""
    bodies = set(re.findall(r"body=(%[\w.\-]+)", hlo))
    count = 0
    for block in re.split(r"\n(?=\S)", hlo):  # one computation per block
        if block.split(" ", 1)[0] not in bodies:
            continue
        for shape in re.findall(r"= \w+\[([\d,]*)\]\S* copy\(", block):
            count += int(np.prod([int(d) for d in shape.split(",") if d] or [1])) >= min_elements
    return count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(REPO, "configs", "arith.py"))
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="")
    args = p.parse_args()
    base = config_lib.load_config_file(args.config)
    pops = {}
    for batching in ("vmap", "map", "auto"):
        cfg = copy.deepcopy(base)
        with cfg.unlocked():
            cfg.population.seeds = tuple(range(args.seeds))
            cfg.population.batching = batching
        pops[batching] = population.build_population(cfg)
    pop = pops["vmap"]
    run, M = pop.run, pop.size
    params, _ = build.base_params(run)
    state = population.initial_state(pop, params)
    batches = [next(data_iterator.make_data_iterator(m.config, run.task)) for m in pop.members]
    prompts = jnp.asarray(np.stack([b["prompt"] for b in batches]), jnp.int32)  # [M, P, Lp]
    lengths = jnp.asarray(np.stack([b["prompt_length"] for b in batches]), jnp.int32)  # [M, P]
    keys = jax.jit(jax.vmap(step_keys))(state.rng, state.step)["rollout"]  # [M, 2]
    one = build.initial_state(run, params)
    args_pop = (state.params, prompts, lengths, keys)

    single = ts.make_rollout_fn(run).lower(one.params, prompts[0], lengths[0], keys[0]).compile()
    batched = {
        b: population.make_phases(pops[b], with_ref=False).rollout.lower(*args_pop).compile()
        for b in ("vmap", "map")
    }
    member = population.make_phases(pops["auto"], with_ref=False).member_rollout
    assert member is not None, "make_member_rollout is the CPU's default (batching auto)"
    # a single run's keys (or values) of one chunk of generated slots, every layer's stacked
    mc, spec = run.model_cfg, run.step
    chunk = min(mc.decode_block, spec.response_len)
    B = spec.prompts * spec.group_size
    cache_elements = mc.num_layers * B * mc.num_kv_heads * mc.head_dim * chunk
    copies = {"single": loop_copies(single.as_text(), cache_elements)}
    copies.update({b: loop_copies(c.as_text(), M * cache_elements) for b, c in batched.items()})

    def single_x_n():
        return [single(one.params, prompts[i], lengths[i], keys[i]).tokens for i in range(M)]

    variants = {
        "single_x_n": single_x_n,
        "vmap": lambda: batched["vmap"](*args_pop).tokens,
        "map": lambda: batched["map"](*args_pop).tokens,
        "member": lambda: member(*args_pop).tokens,
    }
    tokens = {k: np.asarray(jax.device_get(fn())) for k, fn in variants.items()}
    for k in ("vmap", "map", "member"):
        np.testing.assert_array_equal(tokens[k], np.stack(tokens["single_x_n"]))
    lengths_out = np.asarray(member(*args_pop).lengths)  # [M, B]
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[k].append(time.perf_counter() - t0)
    median = {k: float(np.median(v)) for k, v in times.items()}
    result = {
        "config": args.config,
        "members": M,
        "repeats": args.repeats,
        "median_s": median,
        "over_single_x_n": {k: median[k] / median["single_x_n"] for k in median},
        "loop_trips": {
            "members_longest": lengths_out.max(1).tolist(),
            "population": int(lengths_out.max()),
        },
        "cache_sized_copies_in_loop_bodies": copies,
        "times_s": times,
        "load_average": os.getloadavg(),
    }
    write_report(result, args.out)


if __name__ == "__main__":
    main()
