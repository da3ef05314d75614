"""Partial rollouts against whole-batch rollouts of the continuous engine, at long-tailed lengths:
per RL step, the time and the decoded slot-steps it takes to deliver P complete groups, and how
stale the delivered tokens are.

    python experiments/benchmarks/partial_bench.py --P 16 --G 8 --new-tokens 256 --slots 32 \
        --eos-prob 0.015625 --steps 8 --carried 1

Both arms decode with the same model (the "small" shape with sampler_bench's EosRate hook:
geometric response lengths with mean 1 / eos_prob, capped at the limit) and the same fresh
prompts each step. "whole" runs each step's P groups to the end (rl.partial_rollout = 0);
"partial" keeps `carried` prompt batches in the queue (rl.partial_rollout = carried): the
engine works on (1 + carried)·P groups, stops at P complete, and carries the rest, continued
the next step (rl/partial.py). The model does not change between steps (this times the rollout,
not learning), so a token's staleness is the number of steps between its sampling and the step
that delivers it. Steps alternate between the arms (the machine's load hits both alike); the
first step of each arm (compile, and for partial the queue filling up) is left out of the
medians. Useful slot-steps = delivered tokens - delivered rows (the first token of a row comes
from the prefill), occupancy = useful / decoded slot-steps; a partial step's decoded slot-steps
include the carried rows' tokens fed back again (their KV is recomputed by the continuing step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sampler_bench import SHAPES, EosRate  # noqa: E402

from gspo_jax import models  # noqa: E402
from gspo_jax.rollout import PartialRows, continuous  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--P", type=int, default=16, help="groups trained per step")
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--eos-prob", type=float, default=1 / 64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--carried", type=int, default=1, help="rl.partial_rollout (prompt batches)")
    a = p.parse_args(argv)
    P, G, Lp, T, N, k = a.P, a.G, a.prompt_len, a.new_tokens, a.slots, a.carried
    cfg = models.get_model_config("small", **SHAPES["small"], max_seq_len=Lp + T)
    model = EosRate(cfg, rngs=nnx.Rngs(0), eos_id=1, eos_prob=a.eos_prob)
    rng = np.random.default_rng(0)
    new_prompts = lambda n: jnp.asarray(rng.integers(3, cfg.vocab_size, (n, Lp)), jnp.int32)  # noqa: E731
    kw = dict(eos_id=1, pad_id=0, num_samples=G, max_new_tokens=T, temperature=1.0, top_k=0,
              top_p=1.0, return_routes=False, slots=N)  # fmt: skip

    def whole(step, prompts):
        out, s = continuous.run(model, prompts, jnp.full((P,), Lp), jax.random.key(step), **kw)
        return out, int(s.decoded_slots), np.zeros(1)

    queue = {"prompts": new_prompts(k * P), "rows": PartialRows.empty(k * P * G, T, 0)}

    def partial(step, prompts):
        q = jnp.concatenate([queue["prompts"], prompts])
        carry = jax.tree.map(
            lambda c, e: jnp.concatenate([c, e]), queue["rows"], PartialRows.empty(P * G, T, 0)
        )
        _, s = continuous.run(
            model, q, jnp.full((len(q),), Lp), jax.random.key(step), carry=carry, version=step,
            complete_groups=P, **kw,
        )  # fmt: skip
        out, _, carried, rows = continuous.split_partial(s, G, P)
        queue["prompts"], queue["rows"] = q[np.asarray(carried)], rows
        lag = step - np.asarray(out.versions)[np.asarray(out.mask) > 0]
        return out, int(s.decoded_slots), lag

    arms = {"whole": whole, "partial": partial}
    rec = {name: [] for name in arms}
    for step in range(a.steps):
        prompts = new_prompts(P)
        for name, fn in arms.items():
            t0 = time.perf_counter()
            out, slot_steps, lag = fn(step, prompts)
            jax.block_until_ready(out.tokens)
            dt = time.perf_counter() - t0
            lengths = np.asarray(out.lengths)
            useful = int(lengths.sum() - (lengths > 0).sum())
            rec[name].append(dict(s=dt, slot_steps=slot_steps, useful=useful, lag=lag,
                                  tokens=int(lengths.sum())))  # fmt: skip
            print(f"step {step} {name:<8} {dt:7.2f} s  {slot_steps:6d} slot-steps  "
                  f"{useful:6d} useful  staleness mean {lag.mean():.2f} max {lag.max():.0f}",
                  flush=True)  # fmt: skip
    print(
        f"\nP={P} x G={G}, prompt {Lp}, limit {T}, EOS probability {a.eos_prob}, {N} slots, "
        f"carried {k}; medians over steps 1..{a.steps - 1} ({jax.devices()[0].platform}, load "
        f"average {os.getloadavg()[0]:.1f})"
    )
    print(f"{'arm':<8}{'s/step':>9}{'slot-steps':>12}{'occupancy':>11}{'tok/s':>9}"
          f"{'stale mean':>12}{'stale max':>11}")  # fmt: skip
    base = None
    for name, rs in rec.items():
        rs = rs[1:]
        sec = statistics.median(r["s"] for r in rs)
        steps = statistics.median(r["slot_steps"] for r in rs)
        occ = sum(r["useful"] for r in rs) / sum(r["slot_steps"] for r in rs)
        tps = sum(r["tokens"] for r in rs) / sum(r["s"] for r in rs)
        lag = np.concatenate([r["lag"] for r in rs])
        base = base or sec
        print(f"{name:<8}{sec:>9.2f}{steps:>12.0f}{occ:>11.3f}{tps:>9.0f}{lag.mean():>12.2f}"
              f"{lag.max():>11.0f}   ({base / sec:.2f}x whole's steps/s)")  # fmt: skip


if __name__ == "__main__":
    main()
