"""The registry's gspo_token_equals_gspo v3 (gspo_jax.claims), decided without
training runs: GSPO-token with one advantage per response has GSPO's value and gradient.

For each batch seed (the entry's seeds: v3 100-119, v4 120-139) a random batch is drawn: B
responses of padded length T (B, T from a small set, row lengths uniform in 0..T, so empty and
full rows occur), old log-probs -Exp(1) per token, log-probs drifted from them by N(0, drift)
with drift log-uniform in the entry's range (DRIFT: v3 [3e-4, 3e-3], which clipped too few
responses for its precondition; v4 [1e-3, 1e-2]: GSPO's eps is 3e-4 / 4e-4 on the mean drift
per response, ~drift / sqrt(|y|), so some responses clip and some do not), and advantages
N(0, 1) per response. Both objectives (the
presets: gspo with [B] advantages; gspo_token with [B, T] advantages, each token its response's,
the per-token path that rl.token_advantages trains) give (loss, d loss / d logp); the statistic is

    ||v_gspo - v_token|| / ||v_gspo||,   v = (loss, every entry of d loss / d logp)

(the gradient with respect to any model's parameters is J^T of d loss / d logp, so equal here is
equal for every model). The precondition is GSPO's seq_clip_frac on the batch. Secondary: the
same in float64 (a subprocess with JAX_ENABLE_X64=1: rounding alone), and with group-normalised
advantages (groups of 4 responses, zero-sum: a loss of cancelling terms).

    PYTHONPATH=. python experiments/checks/gspo_token_identity.py            # the verdict
    PYTHONPATH=. python experiments/checks/gspo_token_identity.py --version 3  # v3's execution
    PYTHONPATH=. python experiments/checks/gspo_token_identity.py --dtype float64 --json

Prints one line per batch seed, the registry entry and one VERDICT line; exits 0 whatever the
outcome (the verdict is the output). This file holds check logic only; no library code.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys

import numpy as np

from gspo_jax import claims

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "gspo_token_equals_gspo"
SHAPES_B = (4, 8, 16)
SHAPES_T = (8, 16, 32)
GROUP = 4  # responses per group for the group-normalised secondary
DRIFT = {3: (3e-4, 3e-3), 4: (1e-3, 1e-2)}  # entry version -> the log-prob drift's range


def registry():
    """The claims registry (gspo_jax.claims)."""
    return claims


def make_batch(seed: int, dtype, group_normalised: bool = False, drift_range=DRIFT[4]):
    """(logp, old_logp, adv [B], mask) for one batch seed (see the module docstring)."""
    rng = np.random.default_rng(seed)
    b = int(rng.choice(SHAPES_B))
    t = int(rng.choice(SHAPES_T))
    lengths = rng.integers(0, t + 1, size=b)
    lengths[0] = t  # one full row
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(dtype)
    old_logp = -rng.exponential(1.0, size=(b, t))
    drift = float(np.exp(rng.uniform(*np.log(drift_range))))
    logp = old_logp + rng.normal(0.0, drift, size=(b, t))
    adv = rng.normal(size=b)
    if group_normalised:
        g = adv.reshape(-1, GROUP)
        adv = ((g - g.mean(-1, keepdims=True)) / (g.std(-1, keepdims=True) + 1e-6)).reshape(-1)
    return logp.astype(dtype), old_logp.astype(dtype), adv.astype(dtype), mask


@functools.cache
def _value_and_grad(name: str):
    import jax

    from gspo_jax import objectives

    obj = objectives.get_objective(name)

    def fn(lp, old, adv, mask):
        return obj(lp, old, adv, mask)

    return jax.jit(jax.value_and_grad(fn, has_aux=True))


def compare(seed: int, dtype=np.float32, group_normalised=False, drift_range=DRIFT[4]) -> dict:
    """The relative L2 difference of (loss, gradient) and GSPO's clip fraction on one batch."""
    logp, old_logp, adv, mask = make_batch(seed, dtype, group_normalised, drift_range)
    (loss_a, metrics), grad_a = _value_and_grad("gspo")(logp, old_logp, adv, mask)
    adv_bt = np.repeat(adv[:, None], logp.shape[1], 1)
    (loss_b, _), grad_b = _value_and_grad("gspo_token")(logp, old_logp, adv_bt, mask)
    va = np.concatenate([[float(loss_a)], np.asarray(grad_a, np.float64).ravel()])
    vb = np.concatenate([[float(loss_b)], np.asarray(grad_b, np.float64).ravel()])
    assert np.asarray(grad_a).dtype == dtype, (np.asarray(grad_a).dtype, dtype)
    return dict(
        seed=seed,
        shape=list(logp.shape),
        rel_l2=float(np.linalg.norm(va - vb) / np.linalg.norm(va)),
        seq_clip_frac=float(metrics["seq_clip_frac"]),
        loss=float(loss_a),
    )


def measure(seeds, dtype, group_normalised=False, drift_range=DRIFT[4]) -> list[dict]:
    return [compare(s, dtype, group_normalised, drift_range) for s in seeds]


def float64_in_subprocess(version: int) -> list[dict]:
    """measure() in float64 (JAX_ENABLE_X64 must be set before jax starts: a subprocess)."""
    env = {**os.environ, "JAX_ENABLE_X64": "1", "PYTHONPATH": REPO}
    out = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--dtype",
            "float64",
            "--json",
            "--version",
            str(version),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def verdict(reg, rows: list[dict], version: int | None = None) -> object:
    entry = reg.current(KEY) if version is None else reg.entries(KEY)[version - 1]
    arm = entry.primary.arms[0]
    values = {arm: {r["seed"]: r["rel_l2"] for r in rows}}
    pre = {entry.preconditions[0].name: {r["seed"]: r["seq_clip_frac"] for r in rows}}
    return reg.evaluate(entry, values, pre)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--json", action="store_true", help="print the rows as one JSON line only")
    p.add_argument("--version", type=int, default=0, help="the entry's version (default newest)")
    args = p.parse_args(argv)
    reg = registry()
    versions = reg.entries(KEY)
    entry = versions[args.version - 1] if args.version else versions[-1]
    if entry.check != "experiments/checks/gspo_token_identity.py" or entry.version not in DRIFT:
        raise SystemExit(f"{entry.name} is not decided by this check ({entry.check!r})")
    dtype = np.dtype(args.dtype).type
    drift = DRIFT[entry.version]
    rows = measure(entry.seeds, dtype, drift_range=drift)
    if args.json:
        print(json.dumps(rows))
        return 0
    for line in reg.describe(entry):
        print(line)
    for r in rows:
        print(
            f"batch seed {r['seed']}: shape {r['shape']}, seq_clip_frac {r['seq_clip_frac']:.3f}, "
            f"loss {r['loss']:.3g}, relative L2 {r['rel_l2']:.3g}"
        )
    f64 = float64_in_subprocess(entry.version)
    grouped = measure(entry.seeds, dtype, group_normalised=True, drift_range=drift)
    print(
        "secondary check (does not change the outcome): float64 relative L2, largest over "
        f"batches: {max(r['rel_l2'] for r in f64):.3g} (float32: "
        f"{max(r['rel_l2'] for r in rows):.3g})"
    )
    print(
        "secondary check (does not change the outcome): group-normalised advantages, largest "
        f"relative L2: {max(r['rel_l2'] for r in grouped):.3g}, losses down to "
        f"{min(abs(r['loss']) for r in grouped):.3g}"
    )
    result = verdict(reg, rows, entry.version)
    print(f"VERDICT: {result.outcome}: {result.numbers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
