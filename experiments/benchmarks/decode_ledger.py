"""The decode ledger: what one decode step of each rollout engine should move and compute at a
real model's shape, against what its compiled program does.

Dimension legend: R rows decoded per step (the static engine's B; the continuous engine's N
slots), G samples per prompt, Lp prompt length, T new-token limit, W weight bytes, kv bytes of
one token's keys and values (every layer), V vocab, D hidden, C the static engine's
decode_block, ps the continuous engine's page size.

Per model (qwen3_0_6b, qwen3_1_7b, qwen3_30b_a3b: random weights, bfloat16, abstract: nothing is
allocated or run; ``--dtype float32`` for the same programs without XLA:CPU's bf16 -> f32
converts around every matmul and cache access, which a TPU or GPU does not emit: the engines' own
bytes, apart from the backend's), per R in {64, 256} and per length mix, per engine:
  ideal    bytes of one step: the weights once (an MoE's experts that R tokens route to, in
           expectation) + each live row's KV (its prompt's once per group with a live row, and
           its generated tokens) + the live rows' float32 logits once; FLOPs: 2 x active
           parameters x live rows + attention (4 x H x Dh x keys x L per live row) + logits.
  compiled the engine's step program lowered and compiled for this backend (jax
           .lower(...).compile(); abstract arguments): XLA's own cost_analysis (which counts a
           loop body once) and planning/hlo_cost's trip-counted bytes, FLOPs and ops (the
           instructions executed: fused kernels, gathers, scatters ...).
  ops/tok  the loop body's ops per decoded token: ops per step summed over the rollout's
           steps / the live rows' tokens decoded (dead rows' slots cost ops, not tokens).
Each figure is averaged over the rollout's decode steps, from a schedule simulated with numpy
(seed 0): the "uniform" mix runs every row to T, the "long_tail" mix draws each row's length
geometric with mean T / 8 (the EOS coin of sampler_bench --eos-prob), capped at T.
  static      R rows; step t reads the generated chunks filled so far (compiled at 1 and 2
              chunks: bytes are affine in the chunk count), whatever rows have ended.
  static_live the static engine with shrink = 3 (rollout/static.py): each chunk after the
              first decodes the narrowest of R, R / 2, R / 4, R / 8 rows holding the rows live
              at its first step (each width its own compiled step, affine in chunks as above),
              plus, at each chunk that narrows, the narrowing's gather and scatter of the cache
              once (compiled alone: static.narrowing_for_plan).
  continuous  N = R slots fed from a queue of 4 R rows (group-contiguous), refilled before every
              step (rollout/continuous.py); its attention's ragged loops run the trips
              paged_attention.trip_widths gives for the step's items (the live slots' generated
              pages, one at least per slot), so bytes and ops are affine in each loop's trips
              (hlo_cost with each loop at 0 and 1 trips; the ledger models the trip rule of the
              code it ships with: the first table's single loop ran ceil(items / N) trips, the
              second's 4 N wide then N wide ones); once the
              queue is empty and at most half the slots are live, the drain decodes in one step
              of the narrowest of N / 2, N / 4, N / 8 slots that holds the live rows (each its
              own compiled step). A prompt's
              prefill (once per group, a [1, Lp] forward) is not a decode step and not counted.

    PYTHONPATH=. python experiments/benchmarks/decode_ledger.py [--models qwen3_0_6b] \
        [--rows 64,256] [--out decode_ledger.json]
    PYTHONPATH=. python experiments/benchmarks/decode_ledger.py --quick   # tiny shapes, seconds
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe, write_report  # noqa: E402

from gspo_jax import models  # noqa: E402
from gspo_jax.kernels import paged_attention  # noqa: E402
from gspo_jax.planning import hlo_cost  # noqa: E402
from gspo_jax.rollout import continuous, paged, static  # noqa: E402

MODELS = ("qwen3_0_6b", "qwen3_1_7b", "qwen3_30b_a3b")
MIXES = ("uniform", "long_tail")
ENGINES = ("static", "static_live", "continuous")
SHRINK = 3  # static_live's and the continuous drain's narrowest width: R / 2^3
G = 8
TRIP_WIDTHS = (4, 2, 1)  # the ragged attention's trips, in C (paged_attention.trip_widths)
QUEUE = 4  # the continuous engine's queue: QUEUE x N rows
FULL = dict(prompt_len=256, new_tokens=1024)
QUICK = dict(prompt_len=16, new_tokens=64)


def abstract_model(name: str, max_seq_len: int, quick: bool = False, dtype: str = "bfloat16"):
    """The preset's model in `dtype` (weights and compute), abstract (nnx.eval_shape)."""
    over = dict(dtype=dtype, param_dtype=dtype, max_seq_len=max_seq_len)
    if quick:  # tiny stand-ins of the same kinds (dense / MoE) for tests and --quick
        name = "tiny_moe" if "a3b" in name else "tiny"
        over.update(decode_block=16)
    cfg = models.get_model_config(name, **over)
    return nnx.eval_shape(lambda: models.Transformer(cfg, rngs=nnx.Rngs(0)))


def model_sizes(model) -> dict:
    """Bytes and parameter counts an ideal step needs (module docstring)."""
    cfg = model.cfg
    params = nnx.state(model, nnx.Param)
    leaves = jax.tree.leaves(params)
    total = sum(math.prod(x.shape) for x in leaves)
    itemsize = jnp.dtype(cfg.params_dtype).itemsize
    expert = 0
    if cfg.is_moe:  # the routed experts' matrices: leaves with a leading [L, E] pair
        expert = sum(
            math.prod(x.shape)
            for x in leaves
            if len(x.shape) >= 3 and x.shape[:2] == (cfg.num_layers, cfg.num_experts)
        )
    embed = cfg.vocab_size * cfg.hidden_size
    # the embedding is looked up (R rows), not read whole, unless it is also the output matrix
    read = total - (0 if cfg.tie_embeddings else embed)
    return {
        "params": total,
        "expert_params": expert,
        "read_params": read,  # what a step reads if every expert is touched
        "itemsize": itemsize,
        "kv_bytes_per_token": 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize,
        "active_params_per_token": read
        - expert
        + (expert * cfg.experts_per_token // cfg.num_experts if cfg.is_moe else 0),
    }


def ideal_step(cfg, sizes: dict, live: int, live_groups: int, gen_keys: float, Lp: int) -> dict:
    """Ideal bytes and FLOPs of one step with `live` rows of `live_groups` prompts, whose
    generated keys (this step's own included) sum to gen_keys."""
    if live == 0:
        return {"bytes": 0.0, "flops": 0.0}
    weights = sizes["read_params"] - sizes["expert_params"]
    if cfg.is_moe:  # experts the live tokens route to, in expectation (uniform routing)
        touched = 1 - (1 - cfg.experts_per_token / cfg.num_experts) ** live
        weights += sizes["expert_params"] * touched
    kv = sizes["kv_bytes_per_token"] * (live_groups * Lp + gen_keys)
    logits = 4 * live * cfg.vocab_size
    keys = live * Lp + gen_keys
    flops = 2 * sizes["active_params_per_token"] * live
    flops += 4 * cfg.num_heads * cfg.head_dim * cfg.num_layers * keys
    return {"bytes": weights * sizes["itemsize"] + kv + logits, "flops": flops}


def lengths(mix: str, rows: int, T: int, seed: int = 0) -> np.ndarray:
    """Tokens each row samples: T (uniform) or geometric with mean T / 8, capped at T."""
    if mix == "uniform":
        return np.full(rows, T, np.int64)
    rng = np.random.default_rng(seed)
    return np.minimum(rng.geometric(8.0 / T, rows), T).astype(np.int64)


def static_schedule(ell: np.ndarray, C: int, group: int = G, shrink: int = 0) -> list[dict]:
    """The static engine's decode steps t = 1 .. max(ell) - 1: per step the live rows (ell > t),
    their groups, their generated keys (t each), its chunk (t - 1) // C and the rows it decodes
    (all B; with shrink, from the second chunk on, the narrowest of static.live_widths holding
    the rows live at the chunk's first step)."""
    widths = static.live_widths(len(ell), shrink)
    out = []
    for t in range(1, int(ell.max())):
        live = ell > t
        groups = len(np.unique(np.nonzero(live)[0] // group))
        chunk = (t - 1) // C
        at_start = int((ell > chunk * C + 1).sum())
        width = len(ell) if chunk == 0 else min(w for w in widths if w >= at_start)
        out.append(
            {
                "t": t,
                "live": int(live.sum()),
                "groups": groups,
                "gen": int(live.sum()) * t,
                "chunk": chunk,
                "width": width,
                "narrows": chunk > 0 and (t - 1) % C == 0 and width < len(ell),
            }
        )
    return out


def continuous_schedule(
    ell: np.ndarray, N: int, ps: int, shrink: int = 3, group: int = G
) -> list[dict]:
    """The continuous engine's decode steps: N slots refilled in queue order before each step;
    a row of length l decodes l - 1 steps (its token 0 is the prefill's). Per step: live slots,
    their groups, generated keys, the width it decodes (the drain's narrower ones once the queue
    is empty: rollout/continuous.py decode_draining) and the ragged attention's items."""
    B = len(ell)
    nxt, slots, out = 0, [], []  # slots: [row, fed] of live rows
    while nxt < B or slots:
        while len(slots) < N and nxt < B:
            if ell[nxt] > 1:
                slots.append([nxt, 0])
            nxt += 1
        if not slots:
            break
        rows = np.array([r for r, _ in slots])
        fed = np.array([f for _, f in slots])
        live = len(slots)
        width = continuous.drain_width_for(N, shrink, live) if nxt >= B else N
        items = int(np.sum(np.maximum(1, -(-(fed + 1) // ps))))
        out.append(
            {
                "live": live,
                "groups": len(np.unique(rows // group)),
                "gen": int(np.sum(fed + 1)),
                "width": width,
                "items": items + width - live,  # slots that decode nothing: one item each
            }
        )
        slots = [[r, f + 1] for r, f in slots if f + 2 < ell[r]]
    return out


def _width_trips(trips_by_width: dict, width: int):
    """unknown_trips for hlo_cost: a data-dependent loop whose body has arrays of k x width
    leading rows (the ragged attention's trips k x C wide, k in 4, 2, 1) runs
    trips_by_width[k] trips (the widest k found), any other loop once."""

    def trips(body) -> int:
        lead = {tuple(hlo_cost._dims(i.shape)[:1]) for i in body}
        k = next((k for k in TRIP_WIDTHS if (k * width,) in lead), None)
        return 1 if k is None else trips_by_width.get(k, 0)

    return trips


def compiled_cost(fn, args, width: int | None = None) -> dict:
    """Lowers and compiles fn at args (abstract), for this backend: XLA's cost_analysis and
    hlo_cost's trip-counted figures; with width (the continuous engine's step) the ragged
    attention's trips of each width apart (TRIP_WIDTHS): the cost with none of
    them ("base") and what one more trip of each width adds ("per_<k>")."""
    t0 = time.perf_counter()
    traced = fn.trace(*args)
    compiled = traced.lower().compile()
    seconds = time.perf_counter() - t0
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, list) else xla
    out = {
        "compile_s": seconds,
        "xla_bytes": float(xla.get("bytes accessed", 0.0)),
        "xla_flops": float(xla.get("flops", 0.0)),
    }
    if width is None:
        out["base"] = hlo_cost.program_cost(compiled, 1, traced.jaxpr)
        return out
    cost = lambda trips: hlo_cost.program_cost(compiled, _width_trips(trips, width), traced.jaxpr)  # noqa: E731
    base = cost({})
    out["base"] = base
    for k in TRIP_WIDTHS:  # what one more trip k x C wide adds
        out[f"per_{k}"] = cost({k: 1}) + base * -1.0
    return out


def _at(c: dict, items: int, width: int) -> hlo_cost.Cost:
    """The continuous step's cost at `items` ragged items with C = width: the trips the code
    runs (paged_attention.trip_widths: 4 C, 2 C and C wide)."""
    cost = c["base"]
    for k, n in zip(TRIP_WIDTHS, paged_attention.trip_widths(items, width), strict=True):
        cost = cost + c[f"per_{k}"] * n
    return cost


def ledger_case(model, R: int, mix: str, Lp: int, T: int, compiled: dict) -> list[dict]:
    """The ledger's two rows (static, continuous) for one (model, R, mix); compiled holds the
    engines' compiled steps (compile_steps)."""
    cfg = model.cfg
    sizes = model_sizes(model)
    rows = []
    # static: B = R rows; static_live: the narrowest width holding the live rows, by chunk
    ell = lengths(mix, R, T)
    C = cfg.decode_block

    def affine(name, chunk):  # compiled at 1 and 2 chunks: affine in the chunk count
        a, b = compiled[f"{name}_1"]["base"], compiled[f"{name}_2"]["base"]
        return a + (b + a * -1.0) * chunk

    for engine, shrink in (("static", 0), ("static_live", SHRINK)):
        steps = static_schedule(ell, C, shrink=shrink)
        costs = []
        for s in steps:
            c = affine(f"static_w{s['width']}", s["chunk"])
            costs.append(c + affine(f"narrowing_w{s['width']}", s["chunk"]) if s["narrows"] else c)
        rows.append(_row(engine, cfg, sizes, steps, costs, Lp, compiled[f"static_w{R}_1"]))
    # continuous: N = R slots, QUEUE * R rows
    ell = lengths(mix, QUEUE * R, T)
    ps = continuous.DEFAULT_PAGE_SIZE if Lp >= 64 else 16
    steps = continuous_schedule(ell, R, ps)
    costs = [_at(compiled[f"continuous_{s['width']}"], s["items"], s["width"]) for s in steps]
    rows.append(_row("continuous", cfg, sizes, steps, costs, Lp, compiled[f"continuous_{R}"]))
    return rows


def _row(engine, cfg, sizes, steps, costs, Lp, step_compiled) -> dict:
    ideal = [ideal_step(cfg, sizes, s["live"], s["groups"], s["gen"], Lp) for s in steps]
    n = len(steps)
    tokens = sum(s["live"] for s in steps)
    mean = lambda xs: sum(xs) / max(n, 1)  # noqa: E731
    ideal_b, ideal_f = mean([i["bytes"] for i in ideal]), mean([i["flops"] for i in ideal])
    comp_b = mean([c.bytes for c in costs])
    comp_f = mean([c.total_flops for c in costs])
    ops = sum(c.ops for c in costs)
    return {
        "engine": engine,
        "steps": n,
        "live_rows_per_step": tokens / max(n, 1),
        "ideal_bytes": ideal_b,
        "ideal_flops": ideal_f,
        "compiled_bytes": comp_b,
        "compiled_flops": comp_f,
        "bytes_ratio": comp_b / ideal_b if ideal_b else float("nan"),
        "flops_ratio": comp_f / ideal_f if ideal_f else float("nan"),
        "ops_per_step": ops / max(n, 1),
        "ops_per_token": ops / max(tokens, 1),
        "xla_step_bytes": step_compiled["xla_bytes"],
        "xla_step_flops": step_compiled["xla_flops"],
    }


def compile_steps(model, R: int, Lp: int, T: int) -> dict:
    """The engines' step programs at R rows, compiled (compiled_cost)."""
    cfg = model.cfg
    out = {}
    shape = dict(num_prompts=max(1, R // G), prompt_len=Lp, num_samples=G)
    for width in static.live_widths(R, SHRINK):
        for chunks in (1, 2):
            fn, args = static.loop_step_for_plan(
                model, max_new_tokens=T, chunks=chunks, width=width, **shape
            )
            out[f"static_w{width}_{chunks}"] = compiled_cost(fn, args)
            if width < R:
                fn, args = static.narrowing_for_plan(model, chunks=chunks, width=width, **shape)
                out[f"narrowing_w{width}_{chunks}"] = compiled_cost(fn, args)
    ps = continuous.DEFAULT_PAGE_SIZE if Lp >= 64 else 16
    for width in (R, *continuous.drain_widths(R, SHRINK)):
        fn, args = continuous.decode_step_for_plan(
            model,
            num_prompts=max(1, QUEUE * R // G),
            prompt_len=Lp,
            num_samples=G,
            max_new_tokens=T,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            return_routes=False,
            slots=width,
            page_size=ps,
            num_pages=paged.pages_needed(R, Lp, T, ps),
        )
        out[f"continuous_{width}"] = compiled_cost(fn, args, width)
    del cfg
    return out


def run(
    model_names, rows_list, quick: bool = False, log=print, dtype: str = "bfloat16"
) -> list[dict]:
    shape = QUICK if quick else FULL
    Lp, T = shape["prompt_len"], shape["new_tokens"]
    table = []
    for name in model_names:
        model = abstract_model(name, Lp + T, quick, dtype)
        for R in rows_list:
            t0 = time.perf_counter()
            compiled = compile_steps(model, R, Lp, T)
            log(f"{name} R={R}: compiled in {time.perf_counter() - t0:.0f} s")
            for mix in MIXES:
                for r in ledger_case(model, R, mix, Lp, T, compiled):
                    table.append({"model": name, "rows": R, "mix": mix, **r})
    return table


def format_table(table: list[dict]) -> str:
    head = (
        f"{'model':<14} {'R':>4} {'mix':<9} {'engine':<10} {'steps':>6} {'live':>6} "
        f"{'ideal GB':>9} {'comp GB':>9} {'bytes x':>8} {'ideal GF':>9} {'comp GF':>9} "
        f"{'ops/step':>9} {'ops/tok':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in table:
        lines.append(
            f"{r['model']:<14} {r['rows']:>4} {r['mix']:<9} {r['engine']:<10} {r['steps']:>6} "
            f"{r['live_rows_per_step']:>6.1f} {r['ideal_bytes'] / 1e9:>9.3f} "
            f"{r['compiled_bytes'] / 1e9:>9.3f} {r['bytes_ratio']:>8.2f} "
            f"{r['ideal_flops'] / 1e9:>9.1f} {r['compiled_flops'] / 1e9:>9.1f} "
            f"{r['ops_per_step']:>9.0f} {r['ops_per_token']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--quick", action="store_true", help="tiny stand-in shapes (seconds)")
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="weights, KV and compute (float32: no backend upcasts, module docstring)",
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    names = [m for m in a.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise SystemExit(f"--models {unknown} not among {MODELS}; pick from them.")
    rows = [int(r) for r in a.rows.split(",") if r]
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    table = run(names, rows, a.quick, log=log, dtype=a.dtype)
    print(format_table(table))
    shape = QUICK if a.quick else FULL
    if a.out:
        shape = {"G": G, "queue": QUEUE, "dtype": a.dtype, **shape}
        report = {"machine": describe(shape=shape), "ledger": table}
        write_report(report, a.out)
    return table


if __name__ == "__main__":
    main()
