"""Sampler benchmark: gspo_jax.sampler.generate vs a no-KV-cache sampler and the peers.

Dimension legend: P prompts, G samples per prompt, B = P * G rows, Lp prompt length,
T new tokens, S = Lp + T, V vocab, D hidden.

Workload: P=16 prompts x G=8 samples, prompt 64, 128 new tokens, temperature 1, full
vocabulary (top_k 0, top_p 1), no early stop, random weights, at two Qwen3-style shapes:
  small: V 512, D 256, 4 layers, 8 / 4 heads, head_dim 32, SwiGLU 768, tied
  wide:  V 151,936, D 1,024, 4 layers, 16 / 8 heads, head_dim 128, SwiGLU 3,072, tied
Figures per shape: decode tokens/s (B * (T - 1) / (total - prefill)), prefill seconds, total
tokens/s (B * T / total). Baselines measured in the same process:
  (a) no_cache: static-shape JAX sampler that runs a full forward pass over the [B, S] buffer
      at every step (same model code and sampling function, no KV cache, no shared prefix).
      Every step costs the same (fixed buffer), so it is timed over --nocache-steps steps
      (8 at small, 2 at wide: the full 128 steps would take tens of minutes) and reported as
      tokens/s.
  (b) peers, when installed (pip install -e ".[peers]"; skipped with a message otherwise):
      Tunix's Sampler (prompts repeated G times: it has no samples-per-prompt option) and
      Hugging Face transformers' Qwen3ForCausalLM.generate (torch, on the GPU where JAX's
      backend is one, else the CPU; num_return_sequences=G, top_k=0), both with random weights
      of the same shape.
Shared-prefix prefill: prefill of P prompts (each once, cache repeated G times) vs P * G
repeated prompts, prompt 1,024, 32 new tokens of cache, at "small".

Decode layouts (--compare-decode, instead of the figures above): generate's decode="shared_prefix"
(prompt KV once per prompt, each step reads the filled generated chunks only) against
decode="repeated" (prompt KV repeated G times, every step attends over all Lp + T slots), both
timed in this process, interleaved; decode tokens/s = B * (T - 1) / (total - prefill), with the
prefill of each layout timed separately. The long shape of docs/benchmarks.md:
    python experiments/benchmarks/sampler_bench.py --compare-decode --shapes small --P 8 --G 8 \
        --prompt-len 256 --new-tokens 512

Engines (--compare-engines, instead of the figures above): the static engine against
engine="continuous" (gspo_jax/rollout/continuous.py), in the same process, interleaved; the
parts chosen with --parts (comma-separated):
  long_tail: P x G rows with long-tailed response lengths, N slots. Lengths are imposed by a
      benchmark-only logits hook, the same for both engines (EosRate below): the EOS token's
      logit is set so that its probability is exactly --eos-prob at every step (temperature 1,
      full vocabulary), so each row samples EOS like a coin of that bias and its length is
      geometric (mean 1 / eos_prob, capped at T) -- the rows' own sampled tokens end them, no
      length is forced from outside. Both engines must return the same tokens (checked).
      Figures: slot occupancy = useful decoded tokens (sum over rows of length - 1: the first
      token comes from the prefill) / decoded slot-steps (static: B x its decode steps, the
      longest row's length - 1; continuous: N x its decode steps), hardware-independent; useful
      tokens/s = sum of lengths / wall seconds; both refill strategies of the continuous engine
      (device loop, --chunk decode steps per call); and the static engine decoding only its
      live rows (static_live: generate's shrink=--static-shrink; its slot-steps are the widths
      it decodes, static_slot_steps).
  uniform: the default workload above (no early stop, every row T tokens) with slots = B:
      continuous total tokens/s / static's (target >= 0.9).
  compile: compile seconds of each engine (jit lower + compile, the "tiny" model) at
      --compile-tokens new tokens (static: one decode loop per decode_block chunk; continuous:
      one decode step whatever T).
--engine-shape (a SHAPES entry: "qwen3_0_6b" is Qwen3-0.6B's shape), --dtype (bfloat16: weights
and compute; the token check's log-prob tolerance widens to 0.1) and --paged-attention (the
continuous engine once per implementation, "pallas" being the backend's kernel: on a GPU
kernels/paged_kernel_gpu.py) apply to long_tail and uniform; --refills picks the continuous
engine's refill strategies.
The long-tailed shape of docs/benchmarks.md (the issue's 1,024-token limit scaled to 256):
    python experiments/benchmarks/sampler_bench.py --compare-engines --P 32 --G 8 \
        --prompt-len 32 --new-tokens 256 --slots 64 --eos-prob 0.015625

Quantized weights (--compare-quant, instead of the figures above): the static engine's decode
with the decoder's weights as they are in float32, stored and computed in bfloat16, and quantized
through qwix as config.rl.rollout_quant does it (rollout/quant.py: int8, fp8; dequantized to
float32 inside each layer's matmul), the arms chosen with --quants, interleaved repeats; decode
tokens/s = B * (T - 1) / (total - prefill), and the weight bytes a decode step reads (the
decoder layers' parameters, quantized ones as qvalue + scales, and the output matrix: the
roofline's bytes; the KV cache's are the same in every arm). At the default workload:
    python experiments/benchmarks/sampler_bench.py --compare-quant --shapes small,wide

Peers (--compare-peers, instead of the figures above): at a uniform shape (no early stop), the
static and continuous engines (slots = B) against transformers' generate with its static and its
dynamic cache and Tunix's sampler where installed, total tokens/s = B * T / wall; the ratio of
the faster engine to the best peer. The long uniform shape of docs/rollout.md:
    python experiments/benchmarks/sampler_bench.py --compare-peers --P 8 --G 8 \
        --prompt-len 256 --new-tokens 512

Each figure: warm-up call first (compile time reported separately), median of --repeats runs.
    python experiments/benchmarks/sampler_bench.py [--shapes small,wide] [--out PATH]
Expected runtime on 2 shared CPU cores: small ~2 min, wide (32 new tokens) ~5-10 min.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from flax import nnx
from machine import describe  # this folder is on sys.path: the script runs from it

from gspo_jax import models, rollout, sampler
from gspo_jax.rollout import continuous, static

SHAPES = {
    "small": dict(
        vocab_size=512,
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        mlp_dim=768,
        tie_embeddings=True,
    ),
    "wide": dict(
        vocab_size=151_936,
        hidden_size=1024,
        num_layers=4,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=3072,
        tie_embeddings=True,
    ),
}


# Qwen3-0.6B's shape (models.config's qwen3_0_6b preset, random weights): for the engines'
# comparison where a decode step is bound by the model's and the cache's bytes.
_QWEN3_0_6B = models.get_model_config("qwen3_0_6b")
SHAPES["qwen3_0_6b"] = {k: getattr(_QWEN3_0_6B, k) for k in SHAPES["small"]}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def timed(fn, repeats: int, label: str = ""):
    """(first-call seconds, median seconds of `repeats` further calls)."""
    if label:
        log(f"timing {label} (1 warm-up + {repeats} repeats)")
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def make_model(shape: str, max_seq_len: int, seed: int = 0, **overrides):
    cfg = models.get_model_config("small", **SHAPES[shape], max_seq_len=max_seq_len, **overrides)
    return models.Transformer(cfg, rngs=nnx.Rngs(seed))


def throughput(B: int, T: int, total_s: float, prefill_s: float, **extra) -> dict:
    """One sampler's figures (ours, a decode layout, a peer): B rows of T new tokens took total_s,
    prefill_s of it for the first token; decode tokens/s over the other T - 1 steps and total
    tokens/s, beside the sampler's own ``extra`` entries."""
    return {
        **extra,
        "total_s": total_s,
        "prefill_s": prefill_s,
        "decode_tps": B * (T - 1) / max(total_s - prefill_s, 1e-9),
        "total_tps": B * T / total_s,
    }


def bench_ours(model, prompts, lengths, G, T, repeats):
    kw = dict(num_samples=G, max_new_tokens=T, temperature=1.0, eos_id=-1)
    key = jax.random.key(0)
    graphdef, state = nnx.split(model)
    t0 = time.perf_counter()  # compile time, measured explicitly (first-call minus median is
    static._generate_jit.lower(  # unreliable on a shared machine)
        graphdef,
        state,
        prompts,
        lengths,
        key,
        jnp.int32(-1),
        jnp.int32(0),
        num_samples=G,
        max_new_tokens=T,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        return_routes=False,
        decode="shared_prefix",
    ).compile()
    compile_s = time.perf_counter() - t0
    first, total = timed(
        lambda: sampler.generate(model, prompts, lengths, rng=key, **kw).tokens, repeats, "ours"
    )
    pre = jax.jit(
        lambda st, p, n: sampler.prefill(
            nnx.merge(graphdef, st), p, n, num_samples=G, cache_len=prompts.shape[1] + T
        )
    )
    _, prefill_s = timed(lambda: pre(state, prompts, lengths), repeats, "ours prefill")
    B = prompts.shape[0] * G
    return throughput(B, T, total, prefill_s, compile_s=compile_s, first_call_s=first)


def bench_decode_layouts(model, prompts, lengths, G, T, repeats):
    """shared_prefix vs repeated decode: total, prefill and decode tokens/s of each, interleaved
    so that both see the same machine load."""
    graphdef, state = nnx.split(model)
    key = jax.random.key(0)
    B, S = prompts.shape[0] * G, prompts.shape[1] + T
    kw = dict(num_samples=G, max_new_tokens=T, temperature=1.0, eos_id=-1)
    fns, pres = {}, {}
    for layout in sampler.DECODE_LAYOUTS:
        fns[layout] = functools.partial(
            sampler.generate, model, prompts, lengths, rng=key, decode=layout, **kw
        )
        pre = jax.jit(
            functools.partial(
                lambda st, p, n, layout: sampler.prefill(
                    nnx.merge(graphdef, st), p, n, num_samples=G, cache_len=S, decode=layout
                ),
                layout=layout,
            )
        )
        pres[layout] = functools.partial(pre, state, prompts, lengths)
    res = {k: {"total": [], "prefill": []} for k in fns}
    for layout in fns:  # compile + warm up
        log(f"compiling decode={layout}")
        t0 = time.perf_counter()
        jax.block_until_ready(fns[layout]().tokens)
        res[layout]["first_call_s"] = time.perf_counter() - t0
        jax.block_until_ready(pres[layout]())
    for _ in tqdm.trange(repeats, desc="decode layouts (interleaved repeats)"):
        for layout in fns:
            for what, f in (("total", fns[layout]), ("prefill", pres[layout])):
                t0 = time.perf_counter()
                jax.block_until_ready(f())
                res[layout][what].append(time.perf_counter() - t0)
    out = {}
    for layout, r in res.items():
        total, prefill = statistics.median(r["total"]), statistics.median(r["prefill"])
        out[layout] = throughput(B, T, total, prefill, first_call_s=r["first_call_s"])
    out["decode_speedup"] = out["shared_prefix"]["decode_tps"] / out["repeated"]["decode_tps"]
    out["total_speedup"] = out["shared_prefix"]["total_tps"] / out["repeated"]["total_tps"]
    return out


def compare_decode(a):
    """--compare-decode: the decode-layout figures at each shape, printed with the target."""
    results = {}
    for shape in a.shapes.split(","):
        P, G, Lp, T = a.P, a.G, a.prompt_len, a.new_tokens
        log(f"shape {shape}: P={P} x G={G}, prompt {Lp}, {T} new tokens")
        kw = {} if a.decode_block is None else {"decode_block": a.decode_block}
        model = make_model(shape, max_seq_len=Lp + T, **kw)
        rng = np.random.default_rng(0)
        prompts = jnp.asarray(rng.integers(3, SHAPES[shape]["vocab_size"], (P, Lp)), jnp.int32)
        lengths = jnp.full((P,), Lp, jnp.int32)
        results[shape] = bench_decode_layouts(model, prompts, lengths, G, T, a.repeats)
    print(
        f"\ndecode layouts: P={a.P} x G={a.G}, prompt {a.prompt_len}, {a.new_tokens} new tokens, "
        f"temperature 1, full vocab, no early stop, float32, decode_block "
        f"{a.decode_block or models.ModelConfig.decode_block} "
        f"({jax.devices()[0].platform}, {len(jax.devices())} dev)"
    )
    hdr = f"{'shape':<7}{'decode':<15}{'decode tok/s':>14}{'prefill s':>11}{'total tok/s':>13}"
    print(hdr)
    print("-" * len(hdr))
    for shape, r in results.items():
        for layout in sampler.DECODE_LAYOUTS:
            v = r[layout]
            print(
                f"{shape:<7}{layout:<15}{v['decode_tps']:>14.0f}{v['prefill_s']:>11.3f}"
                f"{v['total_tps']:>13.0f}"
            )
        ok = "PASS" if r["decode_speedup"] >= 1.5 else "MISS"
        print(
            f"{shape:<7}shared_prefix / repeated: decode {r['decode_speedup']:.2f}x, total "
            f"{r['total_speedup']:.2f}x (target decode >= 1.5x: {ok})"
        )
    return results


QUANT_ARMS = ("float32", "bfloat16", "int8", "fp8")


def quant_arm(shape: str, arm: str, max_seq_len: int):
    """The model of one --compare-quant arm: float32; bfloat16 parameters and compute; or the
    float32 model with the rollout's quantized weights (rollout.quantize_weights)."""
    if arm == "bfloat16":
        return make_model(shape, max_seq_len, dtype="bfloat16", param_dtype="bfloat16")
    model = make_model(shape, max_seq_len)
    return model if arm == "float32" else rollout.quantize_weights(model, arm)


def weight_bytes_per_step(model) -> dict:
    """The weights one decode step reads: the decoder layers' (every parameter, quantized ones
    as qvalue + scales) and the output matrix (tied: the embedding)."""
    total = rollout.weight_bytes(model)
    out = model.embed if model.cfg.tie_embeddings else model.lm_head
    out_bytes = out.size * out.dtype.itemsize
    return {"weight_bytes": total, "layer_bytes": total - out_bytes, "output_bytes": out_bytes}


def bench_quant(shape, arms, prompts, lengths, G, T, repeats):
    """Each arm's decode figures, timed interleaved so that every arm sees the same load."""
    key = jax.random.key(0)
    B, S = prompts.shape[0] * G, prompts.shape[1] + T
    kw = dict(num_samples=G, max_new_tokens=T, temperature=1.0, eos_id=-1)
    fns, pres, res = {}, {}, {}
    for arm in arms:
        model = quant_arm(shape, arm, S)
        graphdef, state = nnx.split(model)
        fns[arm] = functools.partial(sampler.generate, model, prompts, lengths, rng=key, **kw)
        pre = jax.jit(
            lambda st, p, n, graphdef=graphdef: sampler.prefill(
                nnx.merge(graphdef, st), p, n, num_samples=G, cache_len=S
            )
        )
        pres[arm] = functools.partial(pre, state, prompts, lengths)
        log(f"compiling {shape} {arm}")
        t0 = time.perf_counter()
        jax.block_until_ready(fns[arm]().tokens)
        res[arm] = {"total": [], "prefill": [], "first_call_s": time.perf_counter() - t0}
        res[arm].update(weight_bytes_per_step(model))
        jax.block_until_ready(pres[arm]())
    for _ in tqdm.trange(repeats, desc=f"{shape}: quantized weights (interleaved repeats)"):
        for arm in arms:
            for what, f in (("total", fns[arm]), ("prefill", pres[arm])):
                t0 = time.perf_counter()
                jax.block_until_ready(f())
                res[arm][what].append(time.perf_counter() - t0)
    out = {}
    for arm, r in res.items():
        total, prefill = statistics.median(r.pop("total")), statistics.median(r.pop("prefill"))
        out[arm] = throughput(B, T, total, prefill, **r)
    return out


def compare_quant(a):
    """--compare-quant: decode tokens/s and weight bytes per decode step of each arm."""
    arms = a.quants.split(",")
    if unknown := set(arms) - set(QUANT_ARMS):
        raise SystemExit(f"--quants: {sorted(unknown)} unknown; valid: {QUANT_ARMS}")
    results = {}
    for shape in a.shapes.split(","):
        P, G, Lp = a.P, a.G, a.prompt_len
        T = a.wide_new_tokens if shape == "wide" else a.new_tokens
        log(f"shape {shape}: P={P} x G={G}, prompt {Lp}, {T} new tokens, arms {arms}")
        rng = np.random.default_rng(0)
        prompts = jnp.asarray(rng.integers(3, SHAPES[shape]["vocab_size"], (P, Lp)), jnp.int32)
        lengths = jnp.full((P,), Lp, jnp.int32)
        results[shape] = bench_quant(shape, arms, prompts, lengths, G, T, a.repeats)
        results[shape]["new_tokens"] = T
    print(
        f"\nquantized weights: P={a.P} x G={a.G}, prompt {a.prompt_len}, temperature 1, full "
        f"vocab, no early stop, static engine ({jax.devices()[0].platform}, "
        f"{len(jax.devices())} dev; load {os.getloadavg()[0]:.1f})"
    )
    hdr = (
        f"{'shape':<7}{'weights':<10}{'T':>5}{'decode tok/s':>14}{'vs f32':>8}{'prefill s':>11}"
        f"{'MB/step':>9}{'layers MB':>11}{'output MB':>11}"
    )
    print(hdr)
    print("-" * len(hdr))
    for shape, r in results.items():
        base = r[arms[0]]["decode_tps"]
        for arm in arms:
            v = r[arm]
            print(
                f"{shape:<7}{arm:<10}{r['new_tokens']:>5}{v['decode_tps']:>14.0f}"
                f"{v['decode_tps'] / base:>7.2f}x{v['prefill_s']:>11.3f}"
                f"{v['weight_bytes'] / 1e6:>9.1f}{v['layer_bytes'] / 1e6:>11.1f}"
                f"{v['output_bytes'] / 1e6:>11.1f}"
            )
    return results


class EosRate(models.Transformer):
    """Benchmark-only: the model with its EOS logit replaced so that softmax gives EOS exactly
    probability eos_prob at every step: logit[eos] = logsumexp(other logits) + log(p / (1 - p)).
    At temperature 1 over the full vocabulary every row then stops with probability p per token,
    its own sampled tokens deciding, so response lengths are geometric with mean 1 / p (capped at
    T). Both engines call model.logits for every sampled token, so the hook is the same for both
    and they sample the same tokens."""

    def __init__(self, cfg, *, rngs, eos_id: int, eos_prob: float):
        super().__init__(cfg, rngs=rngs)
        self.eos_id, self.eos_prob = int(eos_id), float(eos_prob)

    def logits(self, hidden):
        z = super().logits(hidden)  # [..., V] f32
        others = jax.nn.logsumexp(z.at[..., self.eos_id].set(-jnp.inf), axis=-1)
        odds = np.log(self.eos_prob / (1.0 - self.eos_prob))
        return z.at[..., self.eos_id].set(others + odds)


def _engine_fns(
    models_by_impl,
    prompts,
    lengths,
    G,
    T,
    eos_id,
    slots,
    chunk,
    refills,
    page_size=None,
    static_shrink=0,
):
    """{name: () -> (SampleOutput, decoded slot-steps)} for the static engine, the static engine
    decoding only its live rows ("static_live", shrink=static_shrink, when > 0) and the
    continuous engine with each refill strategy of `refills` ("device", "chunked") and each
    paged-attention implementation of models_by_impl ({implementation: model}, the same weights;
    the static engine runs the first), at temperature 1 over the full vocabulary; page_size: the
    continuous engine's (None: continuous.DEFAULT_PAGE_SIZE)."""
    key = jax.random.key(0)
    kw = dict(num_samples=G, max_new_tokens=T, temperature=1.0, top_k=0, top_p=1.0)
    B = prompts.shape[0] * G
    first = next(iter(models_by_impl.values()))

    def run_static():
        out = sampler.generate(first, prompts, lengths, rng=key, eos_id=eos_id, **kw)
        return out, B * (int(jnp.max(out.lengths)) - 1)  # its loop ran until the longest ended

    def run_static_live():
        out = sampler.generate(
            first, prompts, lengths, rng=key, eos_id=eos_id, shrink=static_shrink, **kw
        )
        C = first.cfg.decode_block
        return out, static_slot_steps(np.asarray(out.lengths), C, static_shrink)

    def run_continuous(model, refill):
        out, state = continuous.run(
            model,
            prompts,
            lengths,
            key,
            eos_id=eos_id,
            pad_id=0,
            return_routes=False,
            slots=slots,
            refill=refill,
            chunk=chunk,
            page_size=page_size or continuous.DEFAULT_PAGE_SIZE,
            **kw,
        )
        return out, int(state.decoded_slots)

    fns = {"static": run_static}
    if static_shrink:
        fns["static_live"] = run_static_live
    for impl, model in models_by_impl.items():
        for refill in refills:
            name = "continuous" + ("" if refill == "device" else f"_chunked{chunk}")
            name += "" if impl == "plain" else f"_{impl}"
            fns[name] = functools.partial(run_continuous, model, refill)
    return fns


def _check_same_tokens(name: str, ref, out, atol: float = 1e-4) -> None:
    """The engine's tokens are the static engine's, or a row diverges where the summation order
    flips a draw at a CDF boundary: its log-probs agree to ``atol`` up to its first other token
    (the engines sum attention in different orders; bfloat16 needs a wider atol than float32's
    1e-4). Anything else raises."""
    a, b = np.asarray(ref.tokens), np.asarray(out.tokens)
    if np.array_equal(a, b):
        return
    la, lb = np.asarray(ref.logp), np.asarray(out.logp)
    rows = sorted({int(r) for r in np.argwhere(a != b)[:, 0]})
    first = {r: int(np.argmax(a[r] != b[r])) for r in rows}
    worst = max(float(np.abs(la[r, : first[r]] - lb[r, : first[r]]).max(initial=0.0)) for r in rows)
    if worst > atol:
        raise AssertionError(f"{name} sampled other tokens than the static engine ({worst:.1e})")
    log(
        f"{name}: {len(rows)} of {a.shape[0]} rows diverge from the static engine's tokens (first "
        f"at token {min(first.values())}) where their log-probs agreed to {worst:.1e}: a draw "
        "at a CDF boundary flipped by summation order"
    )


def static_slot_steps(ell: np.ndarray, C: int, shrink: int) -> int:
    """Rows decoded summed over the static engine's steps with shrink (rollout/static.py): step
    t = 1 .. max(ell) - 1 of chunk p = (t - 1) // C decodes all B rows in the first chunk, then
    the narrowest of static.live_widths(B, shrink) holding the rows live at the chunk's first
    step (a row of length l is live at step t while l > t)."""
    widths = static.live_widths(len(ell), shrink)
    total = 0
    for t in range(1, int(ell.max())):
        p = (t - 1) // C
        live = int((ell > p * C + 1).sum())
        total += len(ell) if p == 0 else min(w for w in widths if w >= live)
    return total


def bench_engines(
    models_by_impl,
    prompts,
    lengths,
    G,
    T,
    eos_id,
    slots,
    chunk,
    repeats,
    refills=("device", "chunked"),
    atol=1e-4,
    page_size=None,
    static_shrink=0,
):
    """Per engine: occupancy, useful tokens/s (wall clock, and per second of this process's CPU
    time: the work, apart from how much of it ran on both cores at once), first-call seconds;
    interleaved repeats. Checks
    that every engine returned the static engine's tokens (_check_same_tokens, to atol).
    models_by_impl: {paged-attention implementation: model} (_engine_fns), or one model."""
    if not isinstance(models_by_impl, dict):
        models_by_impl = {"plain": models_by_impl}
    fns = _engine_fns(
        models_by_impl,
        prompts,
        lengths,
        G,
        T,
        eos_id,
        slots,
        chunk,
        refills,
        page_size,
        static_shrink,
    )
    res, ref = {}, None
    for name, fn in fns.items():  # compile + warm up
        log(f"first call (compile) of {name}")
        t0 = time.perf_counter()
        out, slot_steps = fn()
        jax.block_until_ready(out.tokens)
        lengths_np = np.asarray(out.lengths)
        if ref is None:
            ref = out
        else:
            _check_same_tokens(name, ref, out, atol)
        res[name] = {
            "first_call_s": time.perf_counter() - t0,
            "slot_steps": slot_steps,
            "useful_tokens": int(lengths_np.sum()),
            "occupancy": float((lengths_np - 1).sum() / slot_steps),
            "times": [],
            "cpu_times": [],
        }
    for _ in tqdm.trange(repeats, desc="engines (interleaved repeats)"):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn()[0].tokens)
            res[name]["times"].append(time.perf_counter() - t0)
            res[name]["cpu_times"].append(time.process_time() - c0)
    for r in res.values():
        r["total_s"] = statistics.median(r.pop("times"))
        r["cpu_s"] = statistics.median(r.pop("cpu_times"))
        r["useful_tps"] = r["useful_tokens"] / r["total_s"]
        r["useful_tps_cpu"] = r["useful_tokens"] / r["cpu_s"]
    lengths_np = np.asarray(lengths_np)
    res["lengths"] = {
        "mean": float(lengths_np.mean()),
        "median": float(np.median(lengths_np)),
        "max": int(lengths_np.max()),
        "at_limit": int((lengths_np == T).sum()),
        "rows": lengths_np.tolist(),  # every row's length (the same for every engine)
    }
    return res


def compile_seconds(T_values, P=2, G=4, Lp=16, slots=4):
    """Compile seconds (jit lower + compile) of each engine at each number of new tokens, the
    "tiny" model (decode_block 64, so the static program holds ceil((T - 1) / 64) loops)."""
    out = {}
    for T in T_values:
        cfg = models.get_model_config("tiny", max_seq_len=Lp + T)
        model = models.Transformer(cfg, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        prompts = jnp.ones((P, Lp), jnp.int32)
        lengths = jnp.full((P,), Lp, jnp.int32)
        kw = dict(temperature=1.0, top_k=0, top_p=1.0, return_routes=False)
        log(f"compiling both engines at T={T}")
        t0 = time.perf_counter()
        static._generate_jit.lower(
            graphdef,
            state,
            prompts,
            lengths,
            jax.random.key(0),
            jnp.int32(1),
            jnp.int32(0),
            num_samples=G,
            max_new_tokens=T,
            decode="shared_prefix",
            **kw,
        ).compile()
        static_s = time.perf_counter() - t0
        ecfg = continuous.engine_config((P, Lp), num_samples=G, max_new_tokens=T, slots=slots, **kw)
        inputs = continuous._Inputs(
            prompts=prompts,
            prompt_lengths=lengths,
            rng=jax.random.key(0),
            eos_id=jnp.int32(1),
            pad_id=jnp.int32(0),
            version=jnp.int32(0),
            carry=rollout.PartialRows.empty(P * G, T, 0),
        )
        t0 = time.perf_counter()
        continuous._run_jit.lower(
            graphdef, state, inputs, None, cfg=tuple(sorted(ecfg.items()))
        ).compile()
        out[T] = {"static_s": static_s, "continuous_s": time.perf_counter() - t0}
        log(f"T={T}: static {static_s:.1f} s, continuous {out[T]['continuous_s']:.1f} s")
    return out


def _engine_models(a, cls=None, max_seq_len=0, **kw):
    """{paged-attention implementation: model} for --paged-attention (the static engine runs
    the first; it has no paged attention), each with the same weights (seed 0), --engine-shape
    in --dtype (weights and compute); cls(cfg, rngs, **kw) builds each (default
    models.Transformer)."""
    impls = [i for i in a.paged_attention.split(",") if i]
    out = {}
    for impl in impls:
        cfg = models.get_model_config(
            "small",
            **SHAPES[a.engine_shape],
            max_seq_len=max_seq_len,
            decode_block=a.decode_block or 64,
            dtype=a.dtype,
            param_dtype=a.dtype,
            paged_attention=impl,
        )
        out[impl] = (cls or models.Transformer)(cfg, rngs=nnx.Rngs(0), **kw)
    return out


def _continuous_targets(r: dict, occupancy: bool, ratio: float) -> None:
    """One line per continuous engine that refills on the device (one per paged-attention
    implementation): its occupancy (occupancy=True) and its tokens/s against the static's."""
    for name, v in r.items():
        if not name.startswith("continuous") or "chunked" in name:
            continue
        x = v["useful_tps"] / r["static"]["useful_tps"]
        x_cpu = v["useful_tps_cpu"] / r["static"]["useful_tps_cpu"]
        occ = f"occupancy {v['occupancy']:.3f} >= 0.85 " if occupancy else ""
        if occupancy:
            occ += f"({'PASS' if v['occupancy'] >= 0.85 else 'MISS'}); "
        print(
            f"targets, {name}: {occ}tok/s {x:.2f}x >= {ratio}x static "
            f"({'PASS' if x >= ratio else 'MISS'}); per CPU second {x_cpu:.2f}x (reported)"
        )


def compare_engines(a):
    """--compare-engines: the parts of --parts, printed with their targets."""
    parts = a.parts.split(",")
    results = {"parts": parts}
    platform = f"{jax.devices()[0].platform}, {len(jax.devices())} dev"
    refills = a.refills.split(",")
    atol = a.token_atol or (1e-4 if a.dtype == "float32" else 0.1)
    if "long_tail" in parts:
        P, G, Lp, T, N = a.P, a.G, a.prompt_len, a.new_tokens, a.slots
        log(f"long-tailed: P={P} x G={G}, prompt {Lp}, limit {T}, eos_prob {a.eos_prob}, N={N}")
        eos_id = 1
        by_impl = _engine_models(a, EosRate, Lp + T, eos_id=eos_id, eos_prob=a.eos_prob)
        rng = np.random.default_rng(0)
        prompts = jnp.asarray(rng.integers(3, SHAPES[a.engine_shape]["vocab_size"], (P, Lp)))
        prompts = prompts.astype(jnp.int32)
        lengths = jnp.full((P,), Lp, jnp.int32)
        r = bench_engines(
            by_impl,
            prompts,
            lengths,
            G,
            T,
            eos_id,
            N,
            a.chunk,
            a.repeats,
            refills,
            atol,
            a.page_size,
            a.static_shrink,
        )
        results["long_tail"] = r
        print(
            f"\nlong-tailed lengths: P={P} x G={G} = {P * G} rows, prompt {Lp}, limit {T} new "
            f"tokens, EOS probability {a.eos_prob} per token (lengths: mean "
            f"{r['lengths']['mean']:.1f}, median {r['lengths']['median']:.0f}, max "
            f"{r['lengths']['max']}, {r['lengths']['at_limit']} at the limit), {N} slots, "
            f"shape {a.engine_shape}, {a.dtype} ({platform})"
        )
        hdr = (
            f"{'engine':<30}{'occupancy':>10}{'slot-steps':>12}{'useful tok/s':>14}{'x static':>10}"
        )
        print(hdr)
        print("-" * len(hdr))
        for name, v in r.items():
            if name == "lengths":
                continue
            print(
                f"{name:<30}{v['occupancy']:>10.3f}{v['slot_steps']:>12}{v['useful_tps']:>14.0f}"
                f"{v['useful_tps'] / r['static']['useful_tps']:>9.2f}x"
            )
        _continuous_targets(r, occupancy=True, ratio=2.5)
    if "uniform" in parts:
        P, G, Lp, T = a.uniform_P, a.G, 64, 128
        log(f"uniform: P={P} x G={G}, prompt {Lp}, {T} new tokens, no early stop, slots = B")
        by_impl = _engine_models(a, max_seq_len=Lp + T)
        rng = np.random.default_rng(0)
        prompts = jnp.asarray(rng.integers(3, SHAPES[a.engine_shape]["vocab_size"], (P, Lp)))
        prompts = prompts.astype(jnp.int32)
        lengths = jnp.full((P,), Lp, jnp.int32)
        r = bench_engines(
            by_impl,
            prompts,
            lengths,
            G,
            T,
            -1,
            P * G,
            a.chunk,
            a.repeats,
            refills,
            atol,
            a.page_size,
        )
        results["uniform"] = r
        print(
            f"\nuniform: P={P} x G={G}, prompt {Lp}, {T} new tokens, no early stop, slots = B, "
            f"shape {a.engine_shape}, {a.dtype} ({platform}): static "
            f"{r['static']['useful_tps']:.0f} tok/s"
            + "".join(
                f", {k} {v['useful_tps']:.0f}" for k, v in r.items() if k.startswith("continuous")
            )
        )
        _continuous_targets(r, occupancy=False, ratio=0.9)
    if "compile" in parts:
        Ts = [int(t) for t in a.compile_tokens.split(",")]
        r = results["compile"] = compile_seconds(Ts)
        print(f"\ncompile seconds, tiny model ({platform}):")
        for T, v in r.items():
            print(
                f"  T={T:>5}: static {v['static_s']:6.1f} s, continuous {v['continuous_s']:6.1f} s"
            )
    return results


def compare_peers(a):
    """--compare-peers: at a uniform shape (every row --new-tokens tokens, no early stop; the
    issue's long one is --P 8 --G 8 --prompt-len 256 --new-tokens 512, its short one the defaults),
    our engines (static, continuous with slots = B) against the peers installed, in this process:
    transformers' generate with its static and its dynamic cache, Tunix's sampler. Ours are timed
    before and after the peers (the load drifts over minutes); the ratio takes the slower pass."""
    P, G, Lp, T = a.P, a.G, a.prompt_len, a.new_tokens
    platform = f"{jax.devices()[0].platform}, {len(jax.devices())} dev"
    log(f"peers: P={P} x G={G}, prompt {Lp}, {T} new tokens, shape {a.engine_shape}")
    model = make_model(a.engine_shape, max_seq_len=Lp + T + 8)
    rng = np.random.default_rng(0)
    prompts_np = rng.integers(3, SHAPES[a.engine_shape]["vocab_size"], (P, Lp)).astype(np.int32)
    prompts, lengths = jnp.asarray(prompts_np), jnp.full((P,), Lp, jnp.int32)
    B = P * G

    def ours():
        r = bench_engines(model, prompts, lengths, G, T, -1, B, a.chunk, a.repeats)
        return {k: v["useful_tps"] for k, v in r.items() if k != "lengths"}

    before = ours()
    peers = {"hf_static_cache": bench_hf(a.engine_shape, prompts_np, G, T, a.repeats, "static")}
    peers["hf_dynamic_cache"] = bench_hf(a.engine_shape, prompts_np, G, T, a.repeats)
    peers["tunix"] = bench_tunix(a.engine_shape, prompts_np, G, T, a.repeats)
    after = ours()
    tps = {k: min(before[k], after[k]) for k in before}
    print(
        f"\nuniform shape: P={P} x G={G} = {B} rows, prompt {Lp}, {T} new tokens, no early "
        f"stop, shape {a.engine_shape}, float32 ({platform}); total tokens/s (B x T / wall)"
    )
    for k in before:
        print(
            f"  ours {k:<22}{tps[k]:>9.0f}  (before the peers {before[k]:.0f}, "
            f"after {after[k]:.0f})"
        )
    measured = {}
    for k, v in peers.items():
        if "skipped" in v:
            print(f"  {k:<27}skipped: {v['skipped']}")
        else:
            measured[k] = v["total_tps"]
            print(f"  {k:<27}{v['total_tps']:>9.0f}  (prefill {v['prefill_s']:.2f} s)")
    result = {"ours_before": before, "ours_after": after, "ours": tps, "peers": peers}
    if measured:
        best_ours = max(tps, key=tps.get)
        best_peer = max(measured, key=measured.get)
        ratio = tps[best_ours] / measured[best_peer]
        result["ratio"] = ratio
        print(
            f"target: the faster engine ({best_ours}) / the best peer ({best_peer}) = {ratio:.2f}x "
            f">= 1.5x ({'PASS' if ratio >= 1.5 else 'MISS'})"
        )
    return result


def make_nocache_sampler(model, P, Lp, G, steps):
    """Static-shape sampler without a KV cache: every step re-runs the whole [B, S] buffer."""
    graphdef, state = nnx.split(model)
    S = Lp + steps

    @jax.jit
    def run(state, prompts, rng):
        m = nnx.merge(graphdef, state)
        B = P * G
        buf = jnp.zeros((B, S), jnp.int32).at[:, :Lp].set(jnp.repeat(prompts, G, 0))
        mask = models.attention_mask(jnp.ones((B, S), bool), jnp.arange(S))
        pos = jnp.broadcast_to(jnp.arange(S), (B, S))

        def step(t, buf):
            h = m.forward(buf, pos, mask)["hidden"]  # [B, S, D]: the full recomputation
            h_t = jax.lax.dynamic_index_in_dim(h, Lp + t - 1, axis=1, keepdims=False)
            tok, _, _ = sampler.sample_token(
                m.logits(h_t), jax.random.fold_in(rng, t), temperature=1.0, top_k=0, top_p=1.0
            )
            return jax.lax.dynamic_update_slice_in_dim(buf, tok[:, None], Lp + t, axis=1)

        return jax.lax.fori_loop(0, steps, step, buf)

    return lambda prompts: run(state, prompts, jax.random.key(0))


def bench_nocache(model, prompts, G, steps, repeats):
    P, Lp = prompts.shape
    fn = make_nocache_sampler(model, P, Lp, G, steps)
    first, total = timed(lambda: fn(prompts), repeats, f"no-cache sampler ({steps} steps)")
    return {
        "compile_s": first - total,
        "steps": steps,
        "total_s": total,
        "total_tps": P * G * steps / total,
    }


def bench_prefill_sharing(model, P, G, Lp, T, repeats):
    """Prefill seconds of P prompts shared by G samples vs P * G separately prefilled prompts."""
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(1)
    prompts = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (P, Lp)), jnp.int32)
    lengths = jnp.full((P,), Lp, jnp.int32)

    def pre(p, n, g):
        f = jax.jit(
            lambda st, p, n: sampler.prefill(
                nnx.merge(graphdef, st), p, n, num_samples=g, cache_len=Lp + T
            )
        )
        return lambda: f(state, p, n)

    fns = {
        "shared": pre(prompts, lengths, G),
        "repeated": pre(jnp.repeat(prompts, G, 0), jnp.repeat(lengths, G), 1),
    }
    log(f"timing shared vs repeated prefill (prompt {Lp}), interleaved, {repeats} repeats")
    for f in fns.values():  # warm-up / compile
        jax.block_until_ready(f())
    times = {k: [] for k in fns}
    for _ in range(repeats):  # interleaved, so both see the same machine load
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t0)
    shared, repeated = (statistics.median(times[k]) for k in ("shared", "repeated"))
    return {"shared_s": shared, "repeated_s": repeated, "speedup": repeated / shared}


# ----------------------------------------------------------------------------- peers


def bench_hf(shape, prompts_np, G, T, repeats, cache: str | None = None):
    """transformers' Qwen3ForCausalLM.generate; ``cache`` its cache_implementation ("static":
    a KV cache preallocated to the full length; None: its default, grown each step)."""
    try:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError as e:  # optional extra
        return {"skipped": f"transformers/torch not installed ({e}); pip install -e '.[peers]'"}
    s = SHAPES[shape]
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=s["vocab_size"],
        hidden_size=s["hidden_size"],
        intermediate_size=s["mlp_dim"],
        num_hidden_layers=s["num_layers"],
        num_attention_heads=s["num_heads"],
        num_key_value_heads=s["num_kv_heads"],
        head_dim=s["head_dim"],
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    # on a GPU (JAX's backend too), the peer runs there at JAX's float32 matmul precision: TF32
    # under JAX's default, full float32 under JAX_DEFAULT_MATMUL_PRECISION=highest.
    device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
    if device == "cuda":
        exact = jax.config.jax_default_matmul_precision in ("highest", "float32")
        torch.backends.cuda.matmul.allow_tf32 = not exact
    model = Qwen3ForCausalLM(cfg).eval().to(device)
    ids = torch.as_tensor(prompts_np, dtype=torch.long, device=device)
    P = ids.shape[0]

    def run(max_new):
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                num_return_sequences=G,
                pad_token_id=0,
                eos_token_id=None,
                **({"cache_implementation": cache} if cache else {}),
            )
            if device == "cuda":
                torch.cuda.synchronize()  # the timer stops when the tokens exist
            return out

    first, total = timed(lambda: run(T), repeats, f"hf generate (cache {cache or 'dynamic'})")
    _, prefill_s = timed(lambda: run(1), repeats, "hf prefill (1 new token)")
    threads = torch.get_num_threads()
    return throughput(
        P * G, T, total, prefill_s, warmup_s=first, torch_threads=threads, torch_device=device
    )


def bench_tunix(shape, prompts_np, G, T, repeats):
    try:
        from tunix.generate import sampler as tunix_sampler
        from tunix.models.qwen3 import model as tunix_qwen3
    except ImportError as e:
        return {"skipped": f"google-tunix not installed ({e}); pip install -e '.[peers]'"}
    s = SHAPES[shape]
    P, Lp = prompts_np.shape
    cfg = tunix_qwen3.ModelConfig(
        num_layers=s["num_layers"],
        vocab_size=s["vocab_size"],
        embed_dim=s["hidden_size"],
        hidden_dim=s["mlp_dim"],
        num_heads=s["num_heads"],
        head_dim=s["head_dim"],
        num_kv_heads=s["num_kv_heads"],
        rope_theta=1_000_000,
        norm_eps=1e-6,
        use_tied_embedding=True,
    )
    model = tunix_qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
    tok = _IdTokenizer(s["vocab_size"])
    smp = tunix_sampler.Sampler(
        transformer=model,
        tokenizer=tok,
        cache_config=tunix_sampler.CacheConfig(
            cache_size=Lp + T + 8,
            num_layers=s["num_layers"],
            num_kv_heads=s["num_kv_heads"],
            head_dim=s["head_dim"],
        ),
    )
    texts = [tok.decode(list(r)) for r in np.repeat(prompts_np, G, 0)]

    def run(max_new):
        # top_p=1.0 selects Tunix's sampling mode (None would be greedy) over the full vocab;
        # eos -1 never matches, so no row stops early.
        return smp(
            texts,
            max_generation_steps=max_new,
            temperature=1.0,
            top_k=None,
            top_p=1.0,
            echo=False,
            max_prompt_length=Lp,
            seed=0,
            eos_tokens=[-1],
        ).tokens

    first, total = timed(lambda: run(T), repeats, "tunix sampler")
    _, prefill_s = timed(lambda: run(1), repeats, "tunix prefill (1 new token)")
    return throughput(P * G, T, total, prefill_s, warmup_s=first)


class _IdTokenizer:
    """Token ids as space-separated integers, so Tunix's string interface is a no-op mapping.
    Id 0 is pad; bos_id 0 makes Tunix add no BOS (the prompts keep exactly Lp tokens)."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    def encode(self, text, **kw):
        return [int(t) for t in text.split()]

    def decode(self, ids, **kw):
        return " ".join(str(int(i)) for i in ids)

    def pad_id(self):
        return 0

    def bos_id(self):
        return 0

    def eos_id(self):
        return 2


# ----------------------------------------------------------------------------- main


def run_shape(shape, a):
    T = a.new_tokens if shape == "small" else a.wide_new_tokens
    log(f"shape {shape}: building model")
    P, G, Lp = a.P, a.G, a.prompt_len
    model = make_model(shape, max_seq_len=max(Lp + T, a.prefill_prompt_len + 32) + 8)
    rng = np.random.default_rng(0)
    prompts_np = rng.integers(3, SHAPES[shape]["vocab_size"], (P, Lp)).astype(np.int32)
    prompts, lengths = jnp.asarray(prompts_np), jnp.full((P,), Lp, jnp.int32)
    res = {"new_tokens": T, "ours": bench_ours(model, prompts, lengths, G, T, a.repeats)}
    steps = min(T, a.nocache_steps if shape == "small" else a.nocache_steps_wide)
    res["no_cache"] = bench_nocache(model, prompts, G, steps, max(1, a.repeats - 1))
    if shape == "small" or a.prefill_wide:
        res["prefill_sharing"] = bench_prefill_sharing(
            model, P, G, a.prefill_prompt_len, 32, max(1, a.repeats - 1)
        )
    if a.peers:
        res["tunix"] = bench_tunix(shape, prompts_np, G, T, max(1, a.repeats - 1))
        res["hf"] = bench_hf(shape, prompts_np, G, T, max(1, a.repeats - 1))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="small,wide")
    ap.add_argument("--P", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--wide-new-tokens", type=int, default=32)
    ap.add_argument("--nocache-steps", type=int, default=8, help="no-cache steps timed (small)")
    ap.add_argument("--nocache-steps-wide", type=int, default=2, help="no-cache steps (wide)")
    ap.add_argument("--prefill-prompt-len", type=int, default=1024)
    ap.add_argument("--prefill-wide", action="store_true", help="also time prefill sharing at wide")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-peers", dest="peers", action="store_false")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--compare-decode",
        action="store_true",
        help="only time decode='shared_prefix' against decode='repeated' (module docstring)",
    )
    ap.add_argument(
        "--decode-block",
        type=int,
        default=None,
        help="--compare-decode: generated slots per chunk (default: ModelConfig's)",
    )
    ap.add_argument(
        "--compare-engines",
        action="store_true",
        help="only compare the static and continuous engines (module docstring)",
    )
    ap.add_argument("--parts", default="long_tail,uniform,compile")
    ap.add_argument("--slots", type=int, default=64, help="--compare-engines: continuous slots")
    ap.add_argument("--eos-prob", type=float, default=1 / 64, help="long_tail: EOS per token")
    ap.add_argument("--chunk", type=int, default=16, help="decode steps per call, chunked refill")
    ap.add_argument(
        "--static-shrink",
        type=int,
        default=3,
        help="--compare-engines long_tail: also the static engine decoding only its live rows "
        "(static_live, shrink=N; 0 = not)",
    )
    ap.add_argument(
        "--page-size",
        type=int,
        default=None,
        help="--compare-engines: the continuous engine's KV slots per page (default: the engine's)",
    )
    ap.add_argument("--engine-shape", default="small", help="--compare-engines: a SHAPES entry")
    ap.add_argument("--dtype", default="float32", help="--compare-engines: weights and compute")
    ap.add_argument(
        "--paged-attention",
        default="plain",
        help="--compare-engines: the continuous engine once per implementation (comma-separated "
        "kernels.paged_attention.PAGED_IMPLEMENTATIONS, e.g. plain,pallas)",
    )
    ap.add_argument("--refills", default="device,chunked", help="--compare-engines: refills")
    ap.add_argument(
        "--token-atol",
        type=float,
        default=None,
        help="--compare-engines: log-prob agreement before a diverging token (default 1e-4 in "
        "float32, 0.1 in bfloat16)",
    )
    ap.add_argument("--uniform-P", type=int, default=16, help="uniform: prompts")
    ap.add_argument("--compile-tokens", default="256,1024,4096")
    ap.add_argument(
        "--compare-quant",
        action="store_true",
        help="only compare float32, bfloat16 and quantized weights (module docstring)",
    )
    ap.add_argument("--quants", default=",".join(QUANT_ARMS), help="--compare-quant: arms")
    ap.add_argument(
        "--compare-peers",
        action="store_true",
        help="only compare our engines with the peers at a uniform shape (module docstring)",
    )
    a = ap.parse_args(argv)
    # the comparisons that replace the figures above: flag -> (function, its key in --out)
    comparisons = {
        "compare_peers": (compare_peers, "peers"),
        "compare_quant": (compare_quant, "quantized_weights"),
        "compare_engines": (compare_engines, "engines"),
        "compare_decode": (compare_decode, "decode_layouts"),
    }
    for flag, (compare, key) in comparisons.items():
        if getattr(a, flag):
            results = compare(a)
            if a.out:
                os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
                with open(a.out, "w") as f:
                    json.dump({"machine": describe(), key: results}, f, indent=2)
            return results

    figures, targets, results = {}, {}, {}
    for shape in a.shapes.split(","):
        r = results[shape] = run_shape(shape, a)
        o = r["ours"]
        figures[f"{shape}/decode_tps"] = o["decode_tps"]
        figures[f"{shape}/prefill_s"] = o["prefill_s"]
        figures[f"{shape}/total_tps"] = o["total_tps"]
        figures[f"{shape}/compile_s"] = o["compile_s"]
        figures[f"{shape}/no_cache_total_tps"] = r["no_cache"]["total_tps"]
        figures[f"{shape}/speedup_vs_no_cache"] = o["total_tps"] / r["no_cache"]["total_tps"]
        targets[f"{shape}/speedup_vs_no_cache"] = {"op": ">=", "threshold": 5.0}
        peers = {k: r[k] for k in ("tunix", "hf") if k in r and "skipped" not in r[k]}
        for k, v in peers.items():
            for f in ("decode_tps", "prefill_s", "total_tps"):
                figures[f"{shape}/{k}_{f}"] = v[f]
        if peers:
            best = max(v["total_tps"] for v in peers.values())
            figures[f"{shape}/total_tps_vs_best_peer"] = o["total_tps"] / best
            targets[f"{shape}/total_tps_vs_best_peer"] = {"op": ">=", "threshold": 1.5}
        if "prefill_sharing" in r:
            figures[f"{shape}/prefill_sharing_speedup"] = r["prefill_sharing"]["speedup"]
            targets[f"{shape}/prefill_sharing_speedup"] = {"op": ">=", "threshold": 0.6 * a.G}

    print(
        f"\nsampler benchmark: P={a.P} x G={a.G}, prompt {a.prompt_len}, temperature 1, "
        f"full vocab, no early stop ({jax.devices()[0].platform}, {len(jax.devices())} dev)"
    )
    hdr = (
        f"{'shape':<7}{'sampler':<10}{'T':>5}{'decode tok/s':>14}{'prefill s':>11}"
        f"{'total tok/s':>13}{'vs ours':>9}"
    )
    print(hdr)
    print("-" * len(hdr))
    for shape, r in results.items():
        o = r["ours"]
        rows = [("ours", o), ("no_cache", r["no_cache"])]
        rows += [(k, r[k]) for k in ("tunix", "hf") if k in r]
        for name, v in rows:
            if "skipped" in v:
                print(f"{shape:<7}{name:<10}  skipped: {v['skipped']}")
                continue
            steps = v.get("steps", r["new_tokens"])
            print(
                f"{shape:<7}{name:<10}{steps:>5}{v.get('decode_tps', float('nan')):>14.0f}"
                f"{v.get('prefill_s', float('nan')):>11.3f}{v['total_tps']:>13.0f}"
                f"{o['total_tps'] / v['total_tps']:>8.1f}x"
            )
        if "prefill_sharing" in r:
            ps = r["prefill_sharing"]
            print(
                f"{shape:<7}prefill sharing (prompt {a.prefill_prompt_len}): shared "
                f"{ps['shared_s']:.3f} s vs repeated {ps['repeated_s']:.3f} s = "
                f"{ps['speedup']:.1f}x (target >= {0.6 * a.G:.1f}x)"
            )
        print(f"{shape:<7}compile (ours): {o['compile_s']:.1f} s")
    print("\ntargets:")
    for name, t in targets.items():
        v = figures[name]
        ok = v >= t["threshold"] if t["op"] == ">=" else v <= t["threshold"]
        print(f"  {name:<36} {v:8.2f} {t['op']} {t['threshold']:<6} {'PASS' if ok else 'MISS'}")
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(
                {
                    "machine": describe(),
                    "figures": figures,
                    "targets": targets,
                    "details": results,
                },
                f,
                indent=2,
            )
    return figures


if __name__ == "__main__":
    main()
