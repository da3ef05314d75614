"""Decode-slot occupancy of the multi-turn engines with a slow tool.

    PYTHONPATH=. python experiments/benchmarks/multi_turn_occupancy.py [--tool_s 0.1] [--slots 8]

A batch of multi-turn episodes (a fake environment: every turn of the policy calls a tool that
sleeps --tool_s seconds and answers with a few tokens; an episode ends after --turns turns) is
played by both engines of rollout/multi_turn.py, the tools on a thread pool. Printed per engine:
occupancy (the fraction of decode slot-steps that sample a playing row's token: the continuous
engine's N slots per step; the static engine's padded batch of B rows per step), the decode
steps and the wall time. The continuous engine's rows leave their slot while their tool runs, so
its occupancy is bounded by the rows ready to decode, not by the slowest tool; the static engine
waits for every row's tool between turns and decodes every turn until its longest row ends.
Both play the same episodes (the same tokens), checked here before the figures are printed.

Dimension legend: P problems, G episodes per problem, B = P * G rows, N slots, T the region.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time

import jax
import numpy as np
from flax import nnx

from gspo_jax import envs, models, rollout
from gspo_jax.rollout import multi_turn


def _eos(model, frequency: float) -> int:
    """The token the model samples closest to `frequency` of the time (drawn without an eos):
    the benchmark's eos, so that turns run about 1 / frequency tokens."""
    V = model.cfg.vocab_size
    prompts = np.random.default_rng(1).integers(2, V, (8, 8)).astype(np.int32)
    out = rollout.generate(
        model,
        prompts,
        np.full((8,), 8, np.int32),
        num_samples=4,
        max_new_tokens=32,
        rng=jax.random.key(1),
        eos_id=-1,
    )
    ids, counts = np.unique(np.asarray(out.tokens), return_counts=True)
    return int(ids[np.argmin(np.abs(counts / counts.sum() - frequency))])


class _SlowToolEpisode(envs.Episode):
    """--turns turns; each turn's tool sleeps, then answers with 4 tokens of the turn's ids."""

    def __init__(self, prompt, turns: int, tool_s: float, vocab: int):
        self.prompt_ids, self.length = list(prompt), len(prompt)
        self.turns, self.left, self.tool_s, self.vocab = 0, turns, tool_s, vocab

    def begin(self, ids):
        ids = [int(i) for i in ids]
        self.turns += 1
        self.length += len(ids)
        answer = [2 + (sum(ids) * (k + 7)) % (self.vocab - 2) for k in range(4)]

        def tool():
            time.sleep(self.tool_s)
            return answer

        return envs.PendingTurn("", True, (), (tool,))

    def finish(self, pending, responses):
        self.left -= 1
        if self.left == 0:
            return envs.Transition((), True, 1.0, 0.0, {"turns": float(self.turns)}, "answer")
        self.length += len(responses[0])
        return envs.Transition(tuple(responses[0]), False)


class _SlowToolEnv(envs.Environment):
    chat = None
    limits = envs.EpisodeLimits(max_turns=64, max_total_tokens=100_000)

    def __init__(self, turns, tool_s, vocab):
        self.args = (turns, tool_s, vocab)

    def start(self, record):
        return _SlowToolEpisode(record["prompt"], *self.args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tool_s", type=float, default=0.1)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--turn_tokens", type=int, default=16, help="about the policy's turn length")
    args = ap.parse_args()

    cfg = models.get_model_config(args.model, tie_embeddings=False)
    model = models.Transformer(cfg, rngs=nnx.Rngs(0))
    model.lm_head.value = model.lm_head[...] * 4.0  # peaked next-token distributions
    eos = _eos(model, 1 / args.turn_tokens)
    rng = np.random.default_rng(0)
    records = [
        {"prompt": rng.integers(2, cfg.vocab_size, 8).tolist()} for _ in range(args.problems)
    ]
    env = _SlowToolEnv(args.turns, args.tool_s, cfg.vocab_size)
    common = dict(
        num_samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        rng=jax.random.key(0),
        eos_id=eos,
        pad_id=0,
    )
    options = {"static": {}, "continuous": dict(slots=args.slots, chunk=args.chunk)}
    results = {}
    B = args.problems * args.samples
    with concurrent.futures.ThreadPoolExecutor(B) as pool:
        for engine in ("static", "continuous"):
            multi_turn.run_episodes(
                model, env, records, engine=engine, executor=pool, **common, **options[engine]
            )  # compile
            t0 = time.perf_counter()
            batch, stats = multi_turn.run_episodes(
                model, env, records, engine=engine, executor=pool, **common, **options[engine]
            )
            results[engine] = (batch, stats, time.perf_counter() - t0)
    ref, got = results["static"][0], results["continuous"][0]
    np.testing.assert_array_equal(ref.sample.tokens, got.sample.tokens)
    turns = np.mean([i["turns"] for i in ref.infos])
    tokens = float(np.asarray(ref.action_mask).sum())
    print(
        f"B={B} rows ({args.problems} problems x {args.samples}), {turns:.2f} turns per episode, "
        f"{tokens / B:.1f} policy tokens per row, tool {args.tool_s * 1000:.0f} ms, "
        f"T={args.max_new_tokens}, model {args.model} (eos {eos}), backend "
        f"{jax.default_backend()}"
    )
    for engine, (_, stats, wall) in results.items():
        width = "B" if engine == "static" else f"N={args.slots}"
        print(
            f"{engine:>10}: occupancy {stats['occupancy']:.3f} ({stats['live_slot_steps']} of "
            f"{stats['slot_steps']} slot-steps, {width} per step), {stats['decode_steps']} "
            f"decode steps, wall {wall:.2f} s"
        )


if __name__ == "__main__":
    main()
