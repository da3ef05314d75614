"""One RL step of the default experiment, phase by phase; tokens/s; the update step's MFU.

    python experiments/benchmarks/train_bench.py --out bench_out/train.json
    python experiments/benchmarks/train_bench.py --config configs/arith.py:runlocal --repeats 3
    python experiments/benchmarks/train_bench.py --config configs/arith_moe.py \
        --compare model.moe_dispatch=dense     # and the same steps with another setting
    python experiments/benchmarks/train_bench.py --compare model.remat=full   # remat's cost

What it measures (all after a warm-up step; compile time is reported separately, as the first
step's phase time minus the steady median):
  rollout   sampler.generate of P prompts x G samples (prefill + KV-cache decode, early stop)
  reward    the task's verifier on the decoded responses (host Python)
  logp      advantages, plus the optional recompute / reference passes
  update    μ epochs x K minibatches of forward + backward + AdamW (one jit call, donated state)
Throughput: response tokens per second of the whole step and of the rollout; processed tokens
(prompt + response slots, every epoch) per second of the update.

MFU of the update: the model's matmul FLOPs (the standard 6·N·tokens count: 2 per parameter per
token forward, x3 with the backward, plus attention scores and the response-only unembedding)
divided by the update time, against this machine's practical peak: a jitted float32 matmul
(2048^3) measured in the same process, in the same run. XLA's own count of the compiled update's
FLOPs is reported next to it as a cross-check (it counts a scanned loop body once, so it reads
about 1/(μ·K) of the model count).

The policy is the config's (the warm start, when it is cached: realistic response lengths);
--random_init uses an untrained model instead (responses run to max_new_tokens).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from machine import describe  # noqa: E402 (this folder is on sys.path: the script runs from it)

from gspo_jax import config as config_lib  # noqa: E402
from gspo_jax import sharding  # noqa: E402
from gspo_jax.data import iterator as data_iterator  # noqa: E402
from gspo_jax.rl import batch as rl_batch  # noqa: E402
from gspo_jax.rl import build as exp  # noqa: E402
from gspo_jax.rl import step as ts  # noqa: E402
from gspo_jax.runtime import distributed  # noqa: E402

PHASES = ("rollout", "reward", "logp", "update", "step")


def model_flops_per_row(cfg, prompt_len: int, response_len: int) -> float:
    """Forward matmul FLOPs of one row through response_logprobs (S = Lp + T slots).

    Per layer and slot: 2 x (q, k, v, o projections + SwiGLU or the k active experts + router),
    plus 2 x 2 x S x H x Dh for the attention scores and the weighted sum (the implementation
    computes the full masked S x S matrix). The unembedding runs on the T response positions only.
    """
    D, H, K, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    S = prompt_len + response_len
    attn_proj = D * H * Dh * 2 + 2 * D * K * Dh
    if cfg.num_experts:
        mlp = cfg.experts_per_token * 3 * D * cfg.moe_mlp_dim + D * cfg.num_experts
    else:
        mlp = 3 * D * cfg.mlp_dim
    per_layer = 2 * (attn_proj + mlp) * S + 4 * S * S * H * Dh
    return cfg.num_layers * per_layer + 2 * D * cfg.vocab_size * response_len


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Practical float32 matmul FLOP/s of this process's default device."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST))
    f(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(REPO, "configs", "arith.py"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--random_init", action="store_true")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE config override")
    p.add_argument(
        "--compare",
        action="append",
        default=[],
        help="KEY=VALUE: also time the steps with this override, in the same process, and print "
        "the update and step time ratios (e.g. model.moe_dispatch=dense)",
    )
    args = p.parse_args(argv)

    config = ml_collections.ConfigDict(config_lib.load_config_file(args.config))
    config.unlock()
    config.log.progress = False
    if args.random_init:
        config.init.kind = "random"
    for item in args.set:
        _set(config, item)
    run, phases, state, batch, ref, first, steady, warm_s = steady_steps(config, args.repeats)
    med = {k: statistics.median(m[f"time/{k}_s"] for m in steady) for k in PHASES}
    compile_s = {k: max(first[f"time/{k}_s"] - med[k], 0.0) for k in PHASES}
    tokens = statistics.median(m["rollout/tokens"] for m in steady)

    rl = run.config.rl
    B, Lp, T = rl.prompts_per_step * rl.group_size, run.task.max_prompt_len, rl.max_new_tokens
    update_rows = B * rl.num_epochs
    model_flops = 3 * model_flops_per_row(run.model_cfg, Lp, T) * update_rows
    peak = matmul_peak()
    xla_flops = float("nan")
    try:  # XLA's count of the compiled update (the state is donated: lower on shapes only)
        shapes = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        with sharding.use_mesh(run.mesh):
            lowered = phases.update.lower(shapes, *_update_inputs(run, phases, state, batch))
        cost = lowered.compile()
        xla_flops = float(cost.cost_analysis().get("flops", float("nan")))
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        print(f"(XLA cost analysis unavailable: {e})")

    figures = {f"{k}_s": med[k] for k in PHASES}
    figures.update({f"compile_{k}_s": compile_s[k] for k in ("rollout", "update")})
    figures.update(
        rollout_share=med["rollout"] / med["step"],
        update_share=med["update"] / med["step"],
        response_tokens=tokens,
        step_tokens_per_s=tokens / med["step"],
        rollout_tokens_per_s=tokens / med["rollout"],
        update_tokens_per_s=update_rows * (Lp + T) / med["update"],
        update_model_gflop=model_flops / 1e9,
        update_xla_gflop=xla_flops / 1e9,
        update_gflop_per_s=model_flops / med["update"] / 1e9,
        matmul_peak_gflop_per_s=peak / 1e9,
        update_mfu=model_flops / med["update"] / peak,
        first_step_over_steady=first["time/step_s"] / med["step"],
        warmstart_s=warm_s,
    )
    targets = {
        # The update's matmuls are small (D = 128) but XLA keeps them busy: ~40 % of the f32
        # matmul peak measured here; below 10 % would mean something pathological.
        "update_mfu": {"op": ">=", "threshold": 0.1},
        # Steps after the first must not recompile: the first (compiling) step is far slower.
        "first_step_over_steady": {"op": ">=", "threshold": 3.0},
        "step_tokens_per_s": {"op": ">=", "threshold": 100.0},
    }

    print(
        f"\ntrain_bench: {run.config.model.preset} model (remat {run.model_cfg.remat}), "
        f"P={rl.prompts_per_step} x "
        f"G={rl.group_size}, T={T}, mu={rl.num_epochs} x K={rl.num_minibatches}, "
        f"{jax.device_count()} device(s), median of {args.repeats}"
    )
    print(f"{'phase':<10}{'median s':>10}{'share':>8}{'compile s':>11}")
    for k in PHASES:
        share = med[k] / med["step"]
        c = f"{compile_s[k]:.2f}" if k != "step" else ""
        print(f"{k:<10}{med[k]:>10.3f}{share:>8.1%}{c:>11}")
    print(
        f"\nresponse tokens/step {tokens:.0f}; tokens/s: step {figures['step_tokens_per_s']:.0f}, "
        f"rollout {figures['rollout_tokens_per_s']:.0f}, update (processed) "
        f"{figures['update_tokens_per_s']:.0f}"
    )
    print(
        f"update: {model_flops / 1e9:.2f} model GFLOP (XLA counts {xla_flops / 1e9:.2f}) in "
        f"{med['update']:.3f} s = {figures['update_gflop_per_s']:.1f} GFLOP/s; f32 matmul peak "
        f"{peak / 1e9:.1f} GFLOP/s; MFU {figures['update_mfu']:.1%}"
    )

    for item in args.compare:
        other = ml_collections.ConfigDict(config.to_dict())
        _set(other, item)
        o = steady_steps(other, args.repeats)[6]
        o_med = {k: statistics.median(m[f"time/{k}_s"] for m in o) for k in ("update", "step")}
        figures[f"update_s[{item}]"] = o_med["update"]
        print(
            f"with {item}: update {o_med['update']:.3f} s, step {o_med['step']:.3f} s; this "
            f"config's update is {o_med['update'] / med['update']:.2f}x as fast, its step "
            f"{o_med['step'] / med['step']:.2f}x"
        )

    if args.out:
        report = {
            "machine": describe(),
            "figures": figures,
            "targets": targets,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.out}")
    return 0


def _set(config, item: str) -> None:
    """Apply one KEY=VALUE override (dotted key, Python literal or string) to a ConfigDict."""
    key, _, text = item.partition("=")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    config_lib.set_field(config, key, value)


def steady_steps(config, repeats: int):
    """Build the run, take one (compiling) step, then ``repeats`` steady steps on the same batch:
    (run, phases, state, batch, ref, first metrics, steady metrics, warm-start seconds)."""
    run = exp.build_run(config)
    params, warm_s = exp.base_params(run)
    state = exp.initial_state(run, params)
    with_ref = rl_batch.uses_reference(run)
    phases = ts.make_phases(run, state, with_ref=with_ref)
    ref = jax.tree.map(jnp.copy, params) if with_ref else None
    batch = next(
        data_iterator.make_data_iterator(run.config, run.task)
    )  # the same prompts each time

    state, first = ts.rl_step(run, phases, state, batch, ref_params=ref)  # compiles
    steady = []
    for _ in range(repeats):
        state, m = ts.rl_step(run, phases, state, batch, ref_params=ref)
        steady.append(m)
    return run, phases, state, batch, ref, first, steady, warm_s


def _update_inputs(run, phases, state, batch_local):
    """Example (batch, shuffle_key) for lowering the update: one rollout through the phases."""
    prompts = distributed.to_global(batch_local["prompt"].astype(np.int32), run.mesh)
    lengths = distributed.to_global(batch_local["prompt_length"].astype(np.int32), run.mesh)
    key = jax.random.key_data(jax.random.key(0))
    with sharding.use_mesh(run.mesh):
        sample = phases.rollout(state.params, prompts, lengths, key)
        rewards = jnp.zeros(sample.tokens.shape[0], jnp.float32)
        truncated = jnp.zeros(sample.tokens.shape[0], bool)
        batch, _ = phases.prepare(sample, rewards, prompts, lengths, truncated)
    return batch, key


if __name__ == "__main__":
    sys.exit(main())
