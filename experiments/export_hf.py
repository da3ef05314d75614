"""Export a run's trained policy as a Hugging Face checkpoint folder (for the usual inference
engines, or to start another run from it with config.init.kind='hf').

    python experiments/export_hf.py --workdir runs/qwen3_gsm8k --out /mnt/shared/qwen3_gspo
    python experiments/export_hf.py --workdir runs/arith --step 40 --out /tmp/arith_hf

Reads <workdir>/config.json (the run's config), restores the parameters of the newest (or the
given) checkpoint, and writes config.json + model.safetensors (sharded with an index when large)
with the tensor names and shapes of the model family (models.save_hf_checkpoint). A run that
started from a checkpoint folder (init.kind='hf') also gets its tokenizer files copied, so the
export is a complete folder.

A LoRA run (config.lora.rank > 0) checkpoints its adapters alone: the export loads the base again
from its source (the warm start, or init.checkpoint), checks it is the adapters' base, and
writes the merged weights W + (α / r)·A·B; with --peft DIR it also writes the adapters alone in
PEFT's layout (adapter_model.safetensors + adapter_config.json, models/lora.py save_peft):

    python experiments/export_hf.py --workdir runs/arith_lora --out /tmp/merged --peft /tmp/peft
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from gspo_jax import models
from gspo_jax.rl import adapters, policies

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def export(workdir: str, out: str, step: int | None = None, peft: str | None = None) -> int:
    """Writes the policy of ``workdir``'s checkpoint ``step`` (newest: None) to ``out`` (and a
    LoRA run's adapters to ``peft``); returns the step exported."""
    if not policies.saved_steps(workdir):
        raise SystemExit(f"no checkpoint in {workdir}/checkpoints")
    run, model, step = policies.run_policy(workdir, step)
    config = run.config
    if peft and not run.step.lora_adapters:
        raise SystemExit(f"--peft: {workdir} is not a LoRA run (config.lora.rank = 0)")
    models.save_hf_checkpoint(adapters.exported(run, model, peft), out)
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
    p.add_argument("--peft", default=None, help="LoRA runs: also write the adapters (PEFT) here")
    args = p.parse_args(argv)
    step = export(args.workdir, args.out, args.step, args.peft)
    print(f"exported step {step} of {args.workdir} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
