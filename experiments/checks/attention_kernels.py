"""Platform attention kernels against the dense reference, on whatever backend this runs on.

Dimension legend: B rows, Lp prompt slots, T response slots, S = Lp + T, H query heads, K kv
heads, Dh head dim.

Checks models/attention.py's kernels on the prompt+response layout's mask (right-padded prompts,
causal by slot, GQA) at a splash-sized shape (S and Dh multiples of 128):
- blockwise (every platform): values and gradients;
- splash (Pallas): natively on a TPU, else in Pallas interpret mode (slow, CPU-only semantics);
  compared at valid query slots, the only ones the layout reads (see splash_attention);
- cudnn (jax.nn.dot_product_attention): implementation "cudnn" on a GPU in bfloat16, else
  "xla" (the same call and layouts).
The test suite covers blockwise and the dot_product_attention adapter (tests/test_attention.py);
this script is the check to run on TPU / GPU hardware, and for splash in interpret mode.

    python experiments/checks/attention_kernels.py [--lengths 40,128] [--heads 4 --kv-heads 2]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from gspo_jax import models
from gspo_jax.models import attention


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=64)
    ap.add_argument("--lengths", default="40,64", help="prompt lengths, one per row")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args(argv)
    backend = jax.default_backend()
    lengths = jnp.asarray([int(x) for x in a.lengths.split(",")], jnp.int32)
    B, Lp, T, H, K, Dh = len(lengths), a.prompt_len, a.response_len, a.heads, a.kv_heads, a.head_dim
    S = Lp + T
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    q, kT, v = normal(B, S, H, Dh), normal(B, K, Dh, S), normal(B, K, S, Dh)
    _, key_valid = models.sequence_layout(lengths, Lp, T)
    mask = models.slot_mask(key_valid, jnp.arange(S))
    ref = jax.jit(attention.reference_attention)(q, kT, v, mask)
    valid = np.asarray(key_valid)  # [B, S]: query slots the layout reads
    print(f"backend {backend}; B={B}, S={S} (prompt {Lp}), H={H}, K={K}, Dh={Dh}")

    def report(name, out, atol):
        err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)[valid]))
        print(f"  {name:<34} max |out - reference| at valid slots {err:.2e} (tol {atol:g})")
        return err <= atol

    ok = []
    out = jax.jit(attention.blockwise_attention, static_argnums=4)(q, kT, v, mask, 32)
    ok.append(report("blockwise (block 32)", out, 1e-5))
    splash = jax.jit(attention.splash_attention, static_argnums=4)
    ok.append(
        report(
            f"splash ({backend if backend == 'tpu' else 'interpret'})",
            splash(q, kT, v, mask, backend != "tpu"),
            1e-3 if backend == "tpu" else 1e-5,
        )
    )
    if backend == "gpu":
        bf = lambda x: x.astype(jnp.bfloat16)  # noqa: E731
        out = jax.jit(attention.cudnn_attention)(bf(q), bf(kT), bf(v), mask)
        ok.append(report("cudnn (bfloat16)", out, 5e-2))
    else:
        out = jax.jit(attention.cudnn_attention, static_argnums=4)(q, kT, v, mask, "xla")
        ok.append(report("dot_product_attention (xla)", out, 1e-5))
    print("all kernels agree" if all(ok) else "MISMATCH")
    return all(ok)


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
