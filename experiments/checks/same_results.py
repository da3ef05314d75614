"""Runs a fixed set of short trainer runs and writes what they computed, to compare two versions
of the code bit for bit (a restructuring must not change a number).

Each run is `python -m gspo_jax.main` (the CLI, which every version keeps) on configs/*.py at
runlocal size for 3 RL steps; what is kept: metrics.jsonl without its time/ keys, the final
checkpoint's train state (params, optimizer state, step, key) and summary.json without times
(a population's: its members' too).

    python experiments/checks/same_results.py run --out /tmp/before     # in the old checkout
    python experiments/checks/same_results.py run --out /tmp/after      # in the new one
    python experiments/checks/same_results.py compare /tmp/before /tmp/after

compare prints one line per run and exits 1 if any number differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3
COMMON = {
    "rl.num_steps": STEPS,
    "checkpoint.every": STEPS,
    "log.progress": False,
    "log.tensorboard": False,
}
# name -> (config file, devices, overrides)
RUNS = {
    "dense": ("configs/arith.py:runlocal", 1, {}),
    # every rollout option at once (bf16 rollout, recomputed old_logp, a correction, off-policy
    # masking, overlong shaping, truncation masking, a KL term and its log, log-prob noise)
    "rollout_options_2dev": (
        "configs/arith.py:runlocal",
        2,
        {
            "rl.rollout_dtype": "bfloat16",
            "rl.recompute_old_logp": True,
            "objective.rollout_correction": "seq_mis",
            "objective.off_policy_mask": 0.01,
            "rl.overlong_buffer": 2,
            "rl.overlong_penalty": 0.5,
            "rl.mask_truncated": True,
            "objective.kl_coef": 0.04,
            "rl.log_kl_ref": True,
            "rl.rollout_logp_noise": 0.01,
            "objective.log_w_percentiles": True,
        },
    ),
    "dapo_dynamic_2dev": (
        "configs/arith.py:runlocal",
        2,
        {"objective.name": "dapo", "rl.dynamic_sampling": True, "rl.num_microbatches": 2},
    ),
    "token_adv_kl_in_reward_2dev": (
        "configs/arith.py:runlocal",
        2,
        {
            "objective.name": "gspo_token",
            "rl.token_advantages": True,
            "objective.kl_coef": 0.01,
            "rl.kl_in_reward": True,
            "rl.advantage_estimator": "rloo",
        },
    ),
    "moe_replay": ("configs/arith_moe.py:runlocal,routing_replay", 1, {}),
    # the asynchronous pipeline on its own rollout device, one version of staleness
    "pipelined_2dev": (
        "configs/arith.py:runlocal",
        2,
        {"rl.max_staleness": 1, "rollout.devices": 1, "rollout.sync_dtype": "trainer"},
    ),
    # a population of 4 seeds (a KL term, so each member has a reference)
    "population4": (
        "configs/arith.py:runlocal",
        1,
        {"population.seeds": "(0,1,2,3)", "objective.kl_coef": 0.01},
    ),
    "lora": ("configs/arith.py:runlocal", 1, {"lora.rank": 4, "objective.kl_coef": 0.01}),
    "qlora": (
        "configs/arith.py:runlocal",
        1,
        {"lora.rank": 4, "lora.base_quant": "int8", "objective.kl_coef": 0.01},
    ),
}


def run_all(out: str, cache: str, only: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    for name, (cfg, devices, extra) in RUNS.items():
        if only and name not in only:
            continue
        wd = os.path.join(out, name)
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        fields = {
            **COMMON,
            "init.cache_dir": os.path.join(cache, "init"),
            "data.data_dir": os.path.join(cache, "data"),
            **extra,
        }
        cmd = [sys.executable, "-m", "gspo_jax.main", f"--config={cfg}", f"--workdir={wd}"]
        cmd += [f"--config.{k}={v}" for k, v in fields.items()]
        print(name, flush=True)
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        dump_state(wd, os.path.join(out, f"{name}.npz"))


def dump_state(workdir: str, path: str) -> None:
    """The final checkpoint's train state as flat host arrays (keys: the tree paths)."""
    import jax
    import orbax.checkpoint as ocp

    state_dir = os.path.join(workdir, "checkpoints", str(STEPS), "state")
    ckptr = ocp.PyTreeCheckpointer()
    meta = ckptr.metadata(state_dir)
    meta = getattr(meta, "item_metadata", meta)
    meta = getattr(meta, "tree", meta)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    is_leaf = lambda m: hasattr(m, "shape") and hasattr(m, "dtype")  # noqa: E731
    restore_args = jax.tree.map(
        lambda m: ocp.ArrayRestoreArgs(sharding=device, global_shape=m.shape, dtype=m.dtype),
        meta,
        is_leaf=is_leaf,
    )
    tree = ckptr.restore(state_dir, restore_args=restore_args)
    flat = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    np.savez(path, **flat)


def run_dirs(run_dir: str) -> list[str]:
    """The run's own directory, or a population's member directories (members/<name>/)."""
    members = os.path.join(run_dir, "members")
    if os.path.isdir(members):
        return [os.path.join(members, n) for n in sorted(os.listdir(members))]
    return [run_dir]


def records(run_dir: str) -> list[dict]:
    recs = []
    for d in run_dirs(run_dir):
        with open(os.path.join(d, "metrics.jsonl")) as f:
            rs = [json.loads(line) for line in f if line.strip()]
        member = os.path.basename(d) if d != run_dir else None
        recs += [dict(r, member=member) for r in rs]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in recs]


def summary(run_dir: str) -> dict:
    """summary.json without times; a population's members' too."""
    out = {}
    for d in dict.fromkeys([run_dir, *run_dirs(run_dir)]):
        path = os.path.join(d, "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                out[os.path.relpath(d, run_dir)] = json.load(f)

    def strip(x):
        if isinstance(x, dict):
            return {
                k: strip(v)
                for k, v in x.items()
                if "time" not in k and not k.endswith("_s") and k != "workdir"
            }
        return x

    return strip(out)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return a == b


def compare(before: str, after: str) -> int:
    bad = 0
    names = sorted(n[: -len(".npz")] for n in os.listdir(before) if n.endswith(".npz"))
    for name in names:
        if not os.path.exists(os.path.join(after, f"{name}.npz")):
            print(f"{name}: not run in {after} (run --only)")
            continue
        problems = []
        a = np.load(os.path.join(before, f"{name}.npz"))
        b = np.load(os.path.join(after, f"{name}.npz"))
        if sorted(a.files) != sorted(b.files):
            problems.append(f"state keys differ: {sorted(set(a.files) ^ set(b.files))[:5]}")
        else:
            for k in a.files:
                if a[k].dtype != b[k].dtype or not np.array_equal(a[k], b[k], equal_nan=True):
                    problems.append(f"state {k} differs")
        ra, rb = records(os.path.join(before, name)), records(os.path.join(after, name))
        if [r.get("step") for r in ra] != [r.get("step") for r in rb]:
            problems.append("metric steps differ")
        for x, y in zip(ra, rb, strict=False):
            for k in sorted(set(x) | set(y)):
                if not same(x.get(k), y.get(k)):
                    problems.append(f"{k} at step {x.get('step')}: {x.get(k)} != {y.get(k)}")
        sa, sb = summary(os.path.join(before, name)), summary(os.path.join(after, name))
        if sa != sb:
            problems.append(f"summary differs: {sa} != {sb}")
        n_metrics = sum(len(r) for r in ra)
        status = "same" if not problems else "DIFFERENT"
        print(f"{name}: {status} ({len(a.files)} state arrays, {n_metrics} metric values)")
        for p in problems[:10]:
            print("   ", p)
        bad += bool(problems)
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--cache", default="/tmp/gspo_jax_same_results_cache")
    r.add_argument("--only", nargs="*", default=[])
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    a = ap.parse_args()
    if a.cmd == "run":
        run_all(a.out, a.cache, a.only)
    else:
        sys.exit(compare(a.before, a.after))


if __name__ == "__main__":
    main()
