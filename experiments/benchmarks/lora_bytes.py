"""Optimizer-state and checkpoint bytes with LoRA (rank 1, 8, 64) against full fine-tuning.

    python experiments/benchmarks/lora_bytes.py                   # arith's model and qwen3_1_7b
    python experiments/benchmarks/lora_bytes.py --models qwen3_30b_a3b --ranks 16

Shapes only (nnx.eval_shape / jax.eval_shape: no weights are allocated). For each model and rank:
the trainable parameters, the optimizer state (the run's optax chain: clipping + AdamW, on the
adapters alone under LoRA), and what a checkpoint holds (rl/adapters.py saved_state: the whole
parameters and optimizer state for full fine-tuning; the adapters and their optimizer state with
LoRA, the base being loaded again from its source). Bytes as stored (float32 parameters and
moments, int32 counts), with the ratio to full fine-tuning of the same model.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
from flax import nnx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, REPO)

from gspo_jax import config as config_lib  # noqa: E402
from gspo_jax import models  # noqa: E402
from gspo_jax.rl import build, optimizer  # noqa: E402


def nbytes(tree) -> int:
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def model_config(name: str) -> models.ModelConfig:
    """A preset, or "arith": the default experiment's model (configs/arith.py, its task's vocab)."""
    if name != "arith":
        return models.get_model_config(name, vocab_size=151_936)
    config = config_lib.load_config_file(os.path.join(REPO, "configs", "arith.py"))
    return build.make_model_config(config, build.make_task(config))


def row(cfg: models.ModelConfig, rank: int, opt_cfg) -> dict:
    spec = models.lora.LoraSpec(rank=rank, alpha=2.0 * max(rank, 1))
    model = nnx.eval_shape(lambda: models.lora.add_adapters(models.create_model(cfg), spec))
    params = nnx.state(model, nnx.Param)
    tx, _ = optimizer.make_optimizer(opt_cfg, 100, adapters_only=rank > 0)
    opt = jax.eval_shape(tx.init, params)
    trainable = params.filter(nnx.LoRAParam) if rank > 0 else params
    return {
        "rank": rank,
        "params": nbytes(params),
        "trainable": nbytes(trainable),
        "optimizer": nbytes(opt),
        "checkpoint": nbytes(trainable) + nbytes(opt),
    }


def human(b: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="arith,qwen3_1_7b")
    ap.add_argument("--ranks", default="1,8,64")
    args = ap.parse_args()
    opt_cfg = config_lib.default_config().optimizer
    for name in args.models.split(","):
        cfg = model_config(name)
        rows = [row(cfg, r, opt_cfg) for r in [0, *map(int, args.ranks.split(","))]]
        full = rows[0]
        shape = f"{cfg.name}: L={cfg.num_layers} D={cfg.hidden_size} V={cfg.vocab_size}"
        targets = list(models.lora.DEFAULT_TARGETS)
        print(f"\n{name} ({shape}); parameters {human(full['params'])}; targets {targets}")
        print("| rank | trainable | optimizer state | checkpoint | optimizer / full |")
        print("|---|---|---|---|---|")
        for r in rows:
            label = "full" if r["rank"] == 0 else str(r["rank"])
            print(
                f"| {label} | {human(r['trainable'])} | {human(r['optimizer'])} | "
                f"{human(r['checkpoint'])} | {r['optimizer'] / full['optimizer']:.4%} |"
            )


if __name__ == "__main__":
    main()
