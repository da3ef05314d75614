r"""GSPO on GSM8K with a released Qwen3 model on a TPU pod slice: bf16 compute, float32 master
weights, the GSPO paper's settings (ε 3e-4 / 4e-4, 4 minibatches per rollout batch).

On this machine's CPU first (the whole loop, a few steps: the checkpoint's own shapes, its
tokenizer and chat template, GSM8K from the released files in DATA, an evaluation on the test
split, summary.json; any Qwen3-format checkpoint folder, e.g. Qwen3-0.6B):

    python -m gspo_jax.main --config configs/qwen3_gsm8k.py:runlocal,checkpoint=CKPT,data=DATA \
        --workdir /tmp/qwen3_local

Then check that the config fits the slice (simulated devices, compile only, no checkpoint
needed):

    python -m gspo_jax.main --config configs/qwen3_gsm8k.py:model=qwen3_0_6b,slice=v5p-8 \
        --workdir /tmp/plan --dry_run

then run it on every host of the slice (docs/pods.md "From a Qwen3 checkpoint to a pod run"):

    python -m gspo_jax.main --config configs/qwen3_gsm8k.py:model=qwen3_0_6b,slice=v5p-8,\
checkpoint=/mnt/shared/Qwen3-0.6B,data=/mnt/shared/gsm8k --workdir /mnt/shared/runs/qwen3_gsm8k \
        --multihost

Arguments: model (qwen3_0_6b, qwen3_1_7b, qwen3_30b_a3b), slice (v5p-8, v5p-32, v6e-8, ...: see
gspo_jax/planning/memory_plan.py), the mesh axes data_axis / fsdp / tensor / expert (0 = the model's
suggested layout on the slice, below), checkpoint (a Hugging Face checkpoint folder: config.json,
*.safetensors, tokenizer.json, tokenizer_config.json), data (a folder with GSM8K's released
train.jsonl / test.jsonl or Hugging Face parquet shards, docs/data.md; "" = the TFDS catalogue
under GSPO_JAX_DATA_DIR), objective, seed, steps, prompts (per step), group, max_new_tokens, micro
(micro-batches per minibatch; 0 = the suggested count below), runlocal (with a checkpoint: a few
float32 steps on one CPU device; without: the tiny preset on 8 simulated devices, the dry run in
seconds), tools (the sandboxed Python tool offered through the chat template: config.env.name
"python", multi-turn episodes, the loss on the policy's tokens; docs/tools.md).

Suggested slices and meshes (SUGGESTED below; the dry-run figures are in docs/pods.md and
docs/moe.md): qwen3_0_6b and qwen3_1_7b on v5p-8 (4 chips, fsdp=4, 4 micro-batches),
qwen3_30b_a3b on v5p-16 (8 chips, fsdp=4 x expert=2, 16 micro-batches), all with remat "full".
Expected runtime and accuracy: not measured here (no accelerator).
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from gspo_jax import config as config_lib

# model -> (suggested slice, mesh axes on it, micro-batches per minibatch): the fitting rows of the
# dry-run tables (docs/pods.md, docs/moe.md). A minibatch is 128 rows of 1,280 slots; each
# minibatch's gradient is accumulated over micro-batches (global normalisation keeps it the same
# gradient), and the layers are rematerialised (model.remat "full": each layer keeps only its
# input for the backward pass), so the activations of a micro-batch are about one layer's.
SUGGESTED = {
    "qwen3_0_6b": ("v5p-8", dict(data=1, fsdp=4, tensor=1, expert=1), 4),
    "qwen3_1_7b": ("v5p-8", dict(data=1, fsdp=4, tensor=1, expert=1), 4),
    # Sparse MoE dispatch with expert parallelism (docs/moe.md): 8 chips hold the 30B's float32
    # weights and Adam moments; fsdp 4 shards the dense weights further than fsdp 2 x expert 4.
    # Micro-batches of 8 rows (one per device).
    "qwen3_30b_a3b": ("v5p-16", dict(data=1, fsdp=4, tensor=1, expert=2), 16),
    "tiny": ("v6e-8", dict(data=2, fsdp=4, tensor=1, expert=1), 1),
}
# prompt slots the tools header adds (tools=True): Qwen3's header with the Python tool's schema
# takes about 250 tokens of its tokenizer; 512 leaves room for a longer description
TOOLS_HEADER_TOKENS = 512
VOCAB = 151_936  # Qwen3's embedding rows (its tokenizer has 151,669 ids; the rest is padding)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    a = config_lib.parse_arg(
        arg,
        runlocal=False,
        model="qwen3_0_6b",
        slice=config_dict.placeholder(str),
        data_axis=0,
        fsdp=0,
        tensor=0,
        expert=0,
        checkpoint="",
        data="",
        objective="gspo",
        seed=0,
        steps=200,
        prompts=64,
        group=8,
        max_new_tokens=1024,
        micro=0,
        tools=False,
    )
    model = "tiny" if a.runlocal else a.model
    if model not in SUGGESTED:
        raise ValueError(f"model={model!r}; valid: {sorted(set(SUGGESTED) - {'tiny'})}")
    suggested_slice, suggested_mesh, suggested_micro = SUGGESTED[model]
    c = config_lib.default_config()
    c.seed = a.seed
    c.slice = a.slice or suggested_slice
    axes = dict(data=a.data_axis, fsdp=a.fsdp, tensor=a.tensor, expert=a.expert)
    # the mesh's fields (the schema's, population included) set one by one, none replaced
    c.mesh.update({k: v or 1 for k, v in axes.items()} if any(axes.values()) else suggested_mesh)

    c.task.name = "gsm8k"
    c.task.kwargs = ml_collections.ConfigDict(
        dict(max_prompt_len=256, max_response_len=1024, data_path=a.data)
    )
    c.model.preset = model
    c.model.dtype = "bfloat16"  # compute; parameters (master weights) stay float32
    c.model.remat = "none" if model == "tiny" else "full"
    if model != "tiny":  # the tiny preset takes the tokenizer's vocabulary (the default)
        c.model.vocab_size = VOCAB
    c.init.kind = "hf" if a.checkpoint else "random"
    c.init.checkpoint = a.checkpoint
    if a.checkpoint:  # its tokenizer.json and chat template: prompts text -> template -> ids
        c.task.kwargs.tokenizer_path = a.checkpoint

    c.objective.name = a.objective
    if a.objective == "gspo":  # the GSPO paper's clipping range
        c.objective.eps_low, c.objective.eps_high = 3e-4, 4e-4
    c.rl.num_steps = a.steps
    c.rl.prompts_per_step = a.prompts
    c.rl.group_size = a.group
    c.rl.max_new_tokens = a.max_new_tokens
    c.rl.num_minibatches = 4
    c.rl.num_microbatches = a.micro or suggested_micro
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_updates = 20
    c.eval.every = 50
    c.eval.num_problems = 256
    c.eval.batch_size = 64
    c.checkpoint.every = 20
    if a.runlocal:
        c.task.kwargs.max_prompt_len, c.task.kwargs.max_response_len = 64, 32
        c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 8, 4, 32
        c.rl.num_steps = 2
    if a.tools:  # the sandboxed Python tool offered through the chat template's tools header
        c.env.name = "python"
        c.env.max_turns = 4
        c.env.max_tool_response_tokens = 256
        # the header lists the tool's JSON schema in the system turn (about 250 Qwen3 tokens)
        c.task.kwargs.max_prompt_len += TOOLS_HEADER_TOKENS
    if a.runlocal and a.checkpoint:  # the real loop on this machine: one CPU device, float32
        # GSM8K questions in a chat template fit whole (and the tools header, with tools)
        c.task.kwargs.max_prompt_len = 256 + TOOLS_HEADER_TOKENS * a.tools
        c.mesh.update(dict(data=1, fsdp=1, tensor=1, expert=1))
        c.num_devices = 1
        c.model.dtype = "float32"
        c.rl.num_microbatches = 1
        c.eval.every, c.eval.num_problems, c.eval.batch_size = 0, 8, 8
    c.lock()
    return c


def pod_variant(
    model: str, checkpoint: str, objective: str, seed: int
) -> ml_collections.ConfigDict:
    """This config for ``model`` from ``checkpoint`` with ``objective`` and ``seed``, unlocked:
    the pod-scale variant of a laptop claim config (configs/arith_moe.py, configs/luspo_length.py
    take ``pod=<checkpoint folder>``), whose sweep overrides then apply unchanged."""
    c = get_config(f"model={model},checkpoint={checkpoint},objective={objective},seed={seed}")
    c.unlock()
    # every arm at its own preset's ε (get_config pins GSPO's for objective=gspo, which a sweep
    # overriding objective.name would otherwise carry over to grpo)
    c.objective.eps_low = c.objective.eps_high = None
    return c
