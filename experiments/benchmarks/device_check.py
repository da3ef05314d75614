"""The device check: one command that measures an accelerator's own roofline and then what this
project reaches of it, every figure as a fraction of the roofline measured in the same run.

    PYTHONPATH=. python experiments/benchmarks/device_check.py --out device_check.json
    PYTHONPATH=. python experiments/benchmarks/device_check.py --quick   # tiny shapes, the CPU

Nothing is fetched and nothing beyond the project's install is needed (pytest, when installed,
adds the compiled-kernel tests). Parts (--skip names any to leave out), in order:
  bandwidth  copy bandwidth: a jitted x + 1 over a --copy-mib bfloat16 array (read + write),
             median of 5 after a warm-up: the memory roofline
  matmul     matmul peak: a jitted [n, n] x [n, n] bfloat16 matmul (n = 8,192; --quick 512 in
             float32), 2 n^3 FLOPs, median of 5: the compute roofline
  kernels    the compiled paged-attention kernel ("pallas": kernels/paged_kernel_gpu.py on a GPU,
             paged_kernel.py on a TPU) against the plain reference at a real head shape (max
             abs difference), and, with pytest installed, the compiled-kernel tests
             (tests/test_paged_attention.py, tests/test_attention.py on this backend)
  decode     both engines (static; continuous with the compiled kernel where one compiles, else
             plain pages) at qwen3_0_6b's shape in bfloat16 (random weights; --quick: a tiny
             shape in float32): the long tail (P 32 x G 8 = 256 rows, prompt 128, limit 1,024,
             EOS probability 1/128 per token: sampler_bench's EosRate; the continuous engine
             with 64 slots) and a uniform mix (the same rows, 128 new tokens, no early stop,
             slots = B); per engine the rollout's seconds (median of --repeats after a warm-up),
             its decode steps, useful tokens/s, and the fraction of the memory roofline: the
             ideal bytes of its decode steps (decode_ledger.ideal_step over its schedule: weights
             once, the live rows' KV, logits) / bandwidth / the rollout's seconds
  update     the update of configs/qwen3_gsm8k.py at model=qwen3_0_6b on one device (16
             prompts x 8, 4 minibatches, 4 micro-batches, remat full; --quick: configs/arith.py
             runlocal), executed on zero-filled state (update_ledger.ledger): MFU = 6 N tokens
             (+ attention) / time / the measured matmul peak
  population population_bench.py: 8 seeds of the default experiment (configs/arith.py, --steps
             RL steps each) as one population against the same 8 runs one after another; runs
             per hour of each and the ratio (--quick: 2 seeds, runlocal, 1 step)
Each part that fails is reported as its error and the others still run. The table has one line
per figure: its value, the roofline it is measured against, and the fraction.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

PARTS = ("bandwidth", "matmul", "kernels", "decode", "update", "population")


def _median_seconds(fn, repeats: int = 5) -> float:
    jax.block_until_ready(fn())  # warm-up (compile)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(mib: int) -> dict:
    """Bytes/s of a jitted x + 1 over a bfloat16 array of `mib` MiB (it reads and writes it)."""
    n = mib * 2**20 // 2
    x = jnp.zeros((n,), jnp.bfloat16)
    f = jax.jit(lambda x: x + 1)
    s = _median_seconds(lambda: f(x))
    return {"bytes": 2 * 2 * n, "seconds": s, "bytes_per_s": 2 * 2 * n / s}


def matmul_peak(n: int, dtype) -> dict:
    """FLOP/s of a jitted [n, n] x [n, n] matmul in dtype."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(lambda a, b: a @ b)
    s = _median_seconds(lambda: f(a, b))
    return {"n": n, "dtype": jnp.dtype(dtype).name, "seconds": s, "flops_per_s": 2 * n**3 / s}


def kernels(quick: bool, run_tests: bool = True) -> dict:
    """The compiled paged-attention kernel against the plain pages, and the kernel tests."""
    from gspo_jax.kernels import paged_attention as pa
    from gspo_jax.kernels import paged_kernel, paged_kernel_gpu

    out = {}
    compiled = paged_kernel.paged_attention_kernel_supported() or (
        paged_kernel_gpu.paged_attention_gpu_supported()
    )
    impl = "pallas" if compiled else "interpret_gpu"
    N, H, K, Dh, ps, Pt = (4, 4, 2, 16, 16, 4) if quick else (64, 16, 8, 128, 64, 8)
    NP = 1 + N * Pt
    rng = np.random.default_rng(0)
    cache = {
        "k_pages": jnp.asarray(rng.normal(size=(1, NP, K, Dh, ps)), jnp.float32),
        "v_pages": jnp.asarray(rng.normal(size=(1, NP, K, ps, Dh)), jnp.float32),
        "page_table": jnp.asarray(1 + np.arange(N * Pt).reshape(N, Pt), jnp.int32),
    }
    ends = rng.integers(1, Pt * ps + 1, N)
    valid = jnp.asarray(np.arange(Pt * ps)[None, :] < ends[:, None])
    q = jnp.asarray(rng.normal(size=(N, 1, H, Dh)), jnp.float32)
    kv_end = jnp.asarray(ends, jnp.int32)
    ref = pa.paged_attention(q, cache, valid, 0, kv_end)
    got = pa.attend_pages(q, cache, valid, 0, kv_end, impl)
    out["paged_kernel"] = impl
    out["paged_kernel_max_abs_diff"] = float(jnp.max(jnp.abs(got - ref)))
    if not run_tests:
        out["tests"] = "not run (--no-kernel-tests)"
        return out
    if importlib.util.find_spec("pytest") is None:
        out["tests"] = "pytest not installed: skipped"
        return out
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", ""))
    if quick:  # the CPU: the kernels' interpret-mode tests stand in
        env["JAX_PLATFORMS"] = "cpu"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "tests/test_paged_attention.py",
        "-k",
        "gpu or pallas or kernel",
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out["tests"] = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    out["tests_rc"] = r.returncode
    out["tests_s"] = time.perf_counter() - t0
    return out


def _decode_shapes(quick: bool) -> dict:
    if quick:
        return dict(shape="small", dtype="float32", P=4, G=4, Lp=16, T=32, slots=8, eos=1 / 8)
    return dict(
        shape="qwen3_0_6b", dtype="bfloat16", P=32, G=8, Lp=128, T=1024, slots=64, eos=1 / 128
    )


def decode(quick: bool, bandwidth: float, repeats: int) -> dict:
    """Both engines on the long tail and a uniform mix (module docstring)."""
    import decode_ledger as dl
    import sampler_bench as sb
    from flax import nnx

    from gspo_jax import models
    from gspo_jax.kernels import paged_kernel, paged_kernel_gpu
    from gspo_jax.rollout import continuous

    s = _decode_shapes(quick)
    P, G, Lp, T = s["P"], s["G"], s["Lp"], s["T"]
    compiled = paged_kernel.paged_attention_kernel_supported() or (
        paged_kernel_gpu.paged_attention_gpu_supported()
    )
    impl = "pallas" if compiled else "plain"
    prompts = jax.random.randint(jax.random.key(1), (P, Lp), 1, 200).astype(jnp.int32)
    lengths = jnp.full((P,), Lp, jnp.int32)
    result = {"shape": s, "paged_attention": impl}
    for mix, T_mix, eos_prob, slots in (
        ("long_tail", T, s["eos"], s["slots"]),
        ("uniform", min(T, 128), None, P * G),
    ):
        cfg = models.get_model_config(
            "small",
            **sb.SHAPES[s["shape"]],
            max_seq_len=Lp + T_mix,
            dtype=s["dtype"],
            param_dtype=s["dtype"],
            paged_attention=impl,
        )
        eos_id = 2
        if eos_prob:
            model = sb.EosRate(cfg, rngs=nnx.Rngs(0), eos_id=eos_id, eos_prob=eos_prob)
        else:
            model, eos_id = models.Transformer(cfg, rngs=nnx.Rngs(0)), -1
        atol = 0.1 if s["dtype"] == "bfloat16" else 1e-4
        r = sb.bench_engines(
            model,
            prompts,
            lengths,
            G,
            T_mix,
            eos_id,
            slots,
            16,
            repeats,
            ("device",),
            atol,
            static_shrink=dl.SHRINK if eos_prob else 0,  # static_live where rows end early
        )
        sizes = dl.model_sizes(model)
        out = {"lengths": r.pop("lengths")}
        ell = np.asarray(out["lengths"].pop("rows"))
        for name, v in r.items():
            if name.startswith("static"):  # the same live rows: the ideal does not narrow
                steps = dl.static_schedule(ell, model.cfg.decode_block, group=G)
            else:
                ps = continuous.DEFAULT_PAGE_SIZE
                steps = dl.continuous_schedule(ell, slots, ps, group=G)
            ideal = sum(
                dl.ideal_step(model.cfg, sizes, x["live"], x["groups"], x["gen"], Lp)["bytes"]
                for x in steps
            )
            v["decode_steps"] = len(steps)
            v["ideal_bytes"] = ideal
            v["roofline_fraction"] = ideal / bandwidth / v["total_s"] if bandwidth else None
            v["step_ms"] = 1e3 * v["total_s"] / max(len(steps), 1)
            out[name] = v
        for name in ("continuous", "static_live"):
            if "static" in out and name in out:
                out[f"{name}_vs_static"] = out[name]["useful_tps"] / out["static"]["useful_tps"]
        result[mix] = out
    return result


def update(quick: bool, peak: float, repeats: int) -> dict:
    import update_ledger as ul

    spec = (
        "configs/arith.py:runlocal"
        if quick
        else "configs/qwen3_gsm8k.py:model=qwen3_0_6b,fsdp=1,prompts=16,micro=4"
    )
    return ul.ledger(os.path.join(REPO, spec), execute=True, repeats=repeats, peak=peak)


def population(quick: bool, steps: int, timeout: int) -> dict:
    seeds = 2 if quick else 8
    config = os.path.join(REPO, "configs", "arith.py") + (":runlocal" if quick else "")
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "population.json")
        cmd = [
            sys.executable,
            os.path.join(HERE, "population_bench.py"),
            f"--config={config}",
            f"--workdir={work}",
            f"--seeds={seeds}",
            f"--steps={1 if quick else steps}",
            "--parallel=1",
            f"--out={out}",
        ]
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode:
            raise RuntimeError(f"population_bench exited {r.returncode}: {r.stderr[-2000:]}")
        with open(out) as f:
            rep = json.load(f)
    return {"seeds": seeds, "runs_per_hour": rep["runs_per_hour"], "ratio": rep["ratio"]}


def table(res: dict) -> str:
    """One line per figure: value, roofline, fraction."""
    rows = []
    bw = res.get("bandwidth", {}).get("bytes_per_s")
    pk = res.get("matmul", {}).get("flops_per_s")
    if bw:
        rows.append(("copy bandwidth", f"{bw / 1e9:,.0f} GB/s", "(the memory roofline)", ""))
    if pk:
        rows.append(("matmul peak", f"{pk / 1e12:,.1f} TFLOP/s", "(the compute roofline)", ""))
    k = res.get("kernels", {})
    if "paged_kernel_max_abs_diff" in k:
        rows.append(
            (
                f"paged kernel ({k['paged_kernel']}) vs plain",
                f"{k['paged_kernel_max_abs_diff']:.1e}",
                "max abs diff",
                "",
            )
        )
        rows.append(("compiled-kernel tests", k.get("tests", ""), "", ""))
    d = res.get("decode", {})
    for mix in ("long_tail", "uniform"):
        for name, v in d.get(mix, {}).items():
            if not isinstance(v, dict) or "total_s" not in v:
                continue
            frac = v.get("roofline_fraction")
            rows.append(
                (
                    f"decode {mix} {name}",
                    f"{v['step_ms']:.2f} ms/step, {v['useful_tps']:,.0f} tok/s",
                    f"{v['ideal_bytes'] / max(v['decode_steps'], 1) / 1e9:.2f} GB/step ideal",
                    f"{frac:.3f}" if frac is not None else "",
                )
            )
        for name in ("continuous", "static_live"):
            if f"{name}_vs_static" in d.get(mix, {}):
                ratio = d[mix][f"{name}_vs_static"]
                rows.append((f"decode {mix} {name} / static", f"{ratio:.2f}x", "", ""))
    u = res.get("update", {})
    if "update_s" in u:
        rows.append(
            (
                "update",
                f"{u['update_s']:.3f} s, {u['model_flops_per_s_per_device'] / 1e12:.2f} TFLOP/s",
                "matmul peak",
                f"{u.get('mfu', float('nan')):.3f}",
            )
        )
    p = res.get("population", {})
    if "ratio" in p:
        rph = p["runs_per_hour"]
        rows.append(
            (
                f"population of {p['seeds']} vs sequential",
                f"{rph['population']:.1f} vs {rph['processes']:.1f} runs/h",
                "",
                f"{p['ratio']:.2f}x",
            )
        )
    for part, err in res.get("errors", {}).items():
        rows.append((f"{part}: FAILED", err.splitlines()[-1][:60], "", ""))
    w = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0] * 4
    head = ("figure".ljust(w[0]), "value".ljust(w[1]), "roofline".ljust(w[2]), "fraction")
    lines = ["  ".join(head), "-" * (sum(w) + 6)]
    lines += ["  ".join(r[i].ljust(w[i]) for i in range(4)) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU; tests)")
    ap.add_argument("--skip", default="", help=f"comma-separated parts of {PARTS} to leave out")
    ap.add_argument("--copy-mib", type=int, default=0, help="default 2048, --quick 32")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="population: RL steps per run")
    ap.add_argument("--population-timeout", type=int, default=300)
    ap.add_argument("--no-kernel-tests", action="store_true", help="skip the pytest run")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    skip = {s for s in a.skip.split(",") if s}
    if skip - set(PARTS):
        raise SystemExit(f"--skip {sorted(skip - set(PARTS))}: not parts; valid: {PARTS}")
    from machine import describe

    t_start = time.perf_counter()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    res: dict = {"machine": describe(load=load, quick=a.quick), "errors": {}}

    def part(name, fn):
        if name in skip:
            return
        t0 = time.perf_counter()
        print(f"[device_check] {name} ...", file=sys.stderr, flush=True)
        try:
            res[name] = fn()
            res[name]["part_s"] = time.perf_counter() - t0
        except Exception:  # noqa: BLE001  (reported, the other parts still run)
            res["errors"][name] = traceback.format_exc()
            print(res["errors"][name], file=sys.stderr, flush=True)

    part("bandwidth", lambda: copy_bandwidth(a.copy_mib or (32 if a.quick else 2048)))
    n, dt = (512, jnp.float32) if a.quick else (8192, jnp.bfloat16)
    part("matmul", lambda: matmul_peak(n, dt))
    bw = res.get("bandwidth", {}).get("bytes_per_s", 0.0)
    pk = res.get("matmul", {}).get("flops_per_s", 0.0)
    part("kernels", lambda: kernels(a.quick, not a.no_kernel_tests))
    part("decode", lambda: decode(a.quick, bw, a.repeats))
    part("update", lambda: update(a.quick, pk, max(a.repeats, 2)))
    part("population", lambda: population(a.quick, a.steps, a.population_timeout))
    res["total_s"] = time.perf_counter() - t_start
    print(table(res))
    print(f"device check: {res['total_s']:.0f} s on {res['machine']['devices']}")
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res


if __name__ == "__main__":
    main()
