"""Export a run's trained policy as a Hugging Face checkpoint folder (for the usual inference
engines, or to start another run from it with config.init.kind='hf').

    python experiments/export_hf.py --workdir runs/qwen3_gsm8k --out /mnt/shared/qwen3_gspo
    python experiments/export_hf.py --workdir runs/arith --step 40 --out /tmp/arith_hf

Reads <workdir>/config.json (the run's config), restores the parameters of the newest (or the
given) checkpoint, and writes config.json + model.safetensors (sharded with an index when large)
with the tensor names and shapes of the model family (models.save_hf_checkpoint). A run that
started from a checkpoint folder (init.kind='hf') also gets its tokenizer files copied, so the
export is a complete folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import ml_collections
from flax import nnx

from gspo_jax import models
from gspo_jax.rl import build as exp
from gspo_jax.runtime import checkpoint as checkpoint_lib

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


class _NoData:
    """The export reads parameters only; the data position in the checkpoint is ignored."""

    def set_state(self, state) -> None:
        del state


def export(workdir: str, out: str, step: int | None = None) -> int:
    """Writes the policy of ``workdir``'s checkpoint ``step`` (newest: None) to ``out``; returns
    the step exported."""
    with open(os.path.join(workdir, "config.json")) as f:
        config = ml_collections.ConfigDict(json.load(f))
    run = exp.build_run(config)
    ckpt = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=1)
    target = exp.abstract_state(run, run.abs_params)
    if step is None:
        restored = ckpt.restore_latest(target, _NoData())
        if restored is None:
            raise SystemExit(f"no checkpoint in {workdir}/checkpoints")
        step, state, _ = restored
    else:
        state, _ = ckpt.restore(step, target, _NoData())
    ckpt.close()
    model = nnx.merge(run.graphdef, state.params, run.rest)
    models.save_hf_checkpoint(model, out)
    source = config.init.get("checkpoint", "")
    for name in TOKENIZER_FILES:
        if source and os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), os.path.join(out, name))
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="the run directory (config.json, checkpoints)")
    p.add_argument("--out", required=True, help="the checkpoint folder to write")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    args = p.parse_args(argv)
    step = export(args.workdir, args.out, args.step)
    print(f"exported step {step} of {args.workdir} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
