"""The config schema: every field of an experiment, its default, its type and what it means.

default_config() is the library's, and the default experiment's (configs/arith.py: GSPO on
multi-digit addition from a supervised warm start). A config file starts from it and changes
fields; it adds none (the config is locked, so a misspelt field is an error). Each field's type is
its default's (or, for a field whose default is None, its typed placeholder), which is what
``--config.x.y=`` overrides parse against; the checks of a field's value are in checks.py, named
by the field.

The objective's fields are the objective library's own override list
(objectives.OVERRIDABLE_FIELD_TYPES), all None: the preset's value.

Dimension legend: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections import config_dict

from gspo_jax import objectives

# Objective fields a config may override (None means "the preset's value"): the objective
# library's own list, so a field added there is overridable here too.
OBJECTIVE_FIELDS = objectives.OVERRIDABLE_FIELDS
# The fields a population may vary per member (config.population.vary): numbers that enter the
# step as arithmetic (traced under jax.vmap), never as a shape or a Python branch.
POPULATION_FIELDS = (
    "objective.eps_low",
    "objective.eps_high",
    "objective.kl_coef",
    "objective.delta",
    "optimizer.learning_rate",
    "rl.temperature",
)
# well under orbax's 1,200 s save barrier and the coordinator's 300 s
MULTIHOST_TIMEOUT_S = 120.0


def objective_placeholders() -> ml_collections.ConfigDict:
    """The override fields of an objective, all None (= preset value) but typed for the CLI.

    Derived from the Objective dataclass (objectives.OVERRIDABLE_FIELD_TYPES: each field's type
    besides None), so a field added there is ``--config.objective.<field>=...`` here too.
    """
    return ml_collections.ConfigDict(
        {
            name: config_dict.placeholder(typ)
            for name, typ in objectives.OVERRIDABLE_FIELD_TYPES.items()
        }
    )


def objective_overrides(objective_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of config.objective that are set (not None), minus the preset name."""
    return {
        k: objective_cfg[k]
        for k in OBJECTIVE_FIELDS
        if k in objective_cfg and objective_cfg[k] is not None
    }


def default_config() -> ml_collections.ConfigDict:
    """Every field with its default (unlocked: a config file changes fields, then locks it)."""
    c = ml_collections.ConfigDict()
    c.seed = 0

    c.task = ml_collections.ConfigDict()
    c.task.name = "arith"
    # Knobs of tasks.get_task(name, **kwargs); {} = the task's own defaults.
    c.task.kwargs = ml_collections.ConfigDict()

    c.data = ml_collections.ConfigDict()
    c.data.data_dir = ""  # "" = the TFDS default under the cache dir
    c.data.seed = -1  # -1 = config.seed
    # Multi-host: "slice" = every host reads the global batch and keeps its rows (results do not
    # depend on the process count); "records" = each host reads a disjoint shard of the records.
    c.data.process_sharding = "slice"

    c.model = ml_collections.ConfigDict()
    c.model.preset = "small"  # models.get_model_config preset; vocab comes from the tokenizer
    c.model.dtype = "float32"
    # MoE presets: how the experts run (models/config.py; None = the preset's: sparse, dropless,
    # the platform's grouped-matmul kernel). "dense" is the reference dispatch.
    c.model.moe_dispatch = config_dict.placeholder(str)
    c.model.moe_kernel = config_dict.placeholder(str)
    c.model.moe_capacity_factor = config_dict.placeholder(float)
    # What each scanned decoder layer keeps for the backward pass: "none", "full" or a
    # jax.checkpoint_policies name (models.config.REMAT_POLICIES); memory against recompute.
    c.model.remat = "none"
    # Attention kernel (models/attention.py): None = the ModelConfig default "auto" (splash on
    # TPU, cuDNN on GPU, else blockwise past one key block); "blockwise" or "reference" forces one.
    c.model.attention = config_dict.placeholder(str)
    # The continuous rollout engine's attention over its pages (kernels/paged_attention.py): None
    # = "plain" (plain JAX); "auto" (the Pallas kernel on a TPU or a GPU), "pallas",
    # "interpret" or "interpret_gpu" (kernels.paged_attention.PAGED_IMPLEMENTATIONS).
    c.model.paged_attention = config_dict.placeholder(str)
    # Fields of the preset a config may change (None = the preset's): the MoE volatility doses'
    # expert counts, a released checkpoint's padded vocabulary.
    c.model.num_experts = config_dict.placeholder(int)
    c.model.experts_per_token = config_dict.placeholder(int)
    c.model.vocab_size = config_dict.placeholder(int)

    c.init = ml_collections.ConfigDict()
    c.init.kind = "warmstart"  # or "random" (tests that need no good policy), or "hf"
    c.init.checkpoint = ""  # kind "hf": a Hugging Face checkpoint folder (configs/qwen3_gsm8k.py)
    c.init.cache_dir = ""  # "" = $GSPO_JAX_CACHE or ~/.cache/gspo_jax
    # The supervised warm start (rl/warmstart.py get_base_model's warm_cfg); every field keys its
    # cache. A config that depends on its base pins these (configs/arith.py does).
    c.init.warmstart = ml_collections.ConfigDict(
        dict(
            steps=2400,
            batch_size=16,
            learning_rate=1e-2,
            warmup_steps=50,
            end_lr_ratio=0.1,
            weight_decay=0.01,
            grad_clip=1.0,
            loss_norm="sequence",
            seed=0,
            # The stopping rule (rl/warmstart.py WarmStartConfig): off at 0, then every step
            # is trained; configs/arith.py turns it on.
            stop_every=0,
            stop_metric="worked_accuracy",
            stop_threshold=0.9,
            stop_patience=2,
            stop_problems=256,
            stop_samples=4,
            stop_ceiling=0.0,  # 0 = none; else the base is the latest check at or below it
            stop_lookback=0,  # with a ceiling: parameters kept every N steps between checks
            # A tool environment's warm start (config.env.name set; rl/warmstart_demos.py): the
            # share of demonstrations played as episodes that call the tool; 0 = the task's own
            # one-turn demonstrations only
            tool_fraction=0.0,
        )
    )

    c.rl = ml_collections.ConfigDict()
    c.rl.num_steps = 80  # the greedy policy switches to the worked format around step 40-50
    c.rl.prompts_per_step = 16  # P
    c.rl.group_size = 8  # G
    c.rl.max_new_tokens = 0  # T; 0 = task.max_response_len (fits the longest worked answer)
    c.rl.temperature = 1.0
    c.rl.top_k = 0
    c.rl.top_p = 1.0
    c.rl.num_epochs = 1  # μ
    c.rl.num_minibatches = 4  # K (GSPO paper): the ratio moves off 1 after the first update
    c.rl.num_microbatches = 1  # gradient accumulation inside a minibatch (global normalisation)
    c.rl.shuffle_minibatches = True
    c.rl.advantage_estimator = config_dict.placeholder(str)  # None = the objective's pairing
    c.rl.adv_eps = 1e-6
    c.rl.adv_std_ddof = 0
    # grpo's std: "group" (per group), "batch" (all B rewards, LitePPO), "none" (= dr_grpo)
    c.rl.scale_rewards = "group"
    # True: the objective's kl_coef · (old_logp − ref_logp) is subtracted from the token rewards
    # (verl's use_kl_in_reward) instead of entering the loss
    c.rl.kl_in_reward = False
    # True: log train/kl_ref, the policy's KL to the base policy, also when kl_coef is 0 (one more
    # forward pass per step and a copy of the parameters; the loss is unchanged)
    c.rl.log_kl_ref = False
    c.rl.recompute_old_logp = False  # True: old_logp from a trainer forward instead of the sampler
    c.rl.routing_replay = False  # MoE: replay the old policy's expert routes in the update
    # True: every token gets its response's advantage ([B, T] instead of [B]): the objective's
    # per-token path (for gspo_token: s_i,t rather than its [B] shortcut to GSPO's s_i)
    c.rl.token_advantages = False
    c.rl.log_route_change = False  # MoE: log train/route_change_frac (one extra forward per step)
    c.rl.aux_loss_coef = 0.0  # MoE load-balancing loss weight
    # Warn when every group's rewards have been equal (no learning signal) this many steps in a
    # row (0: never); stop_on_collapse=True then also saves and stops the run.
    c.rl.collapse_patience = 20
    c.rl.stop_on_collapse = False
    # The rollout's compute dtype ("" = the model's; "bfloat16" under a float32 trainer gives a
    # real training-inference mismatch). With recompute_old_logp=True the sampler's log-probs
    # become rollout_logp (objective.rollout_correction / off_policy_mask read them).
    c.rl.rollout_dtype = ""
    # The rollout's weights quantized through qwix, weight-only per output channel: "int8",
    # "fp8" (float8_e4m3fn) or "" (none). Quantized afresh from the trainer's parameters at
    # every rollout (rollout/quant.py); the trainer keeps its dtype, the mismatch is logged as
    # rollout/logp_diff_* and the rollout corrections apply as for rollout_dtype.
    c.rl.rollout_quant = ""
    # The rollout engine (rollout.ENGINES): "static" decodes the step's B rows as one batch until
    # the longest ends; "continuous" refills a fixed number of decode slots from the queue of rows
    # as rows end, over a paged KV cache (same tokens from the same logits: rollout/continuous.py).
    c.rl.rollout_engine = "static"
    c.rl.rollout_slots = config_dict.placeholder(int)  # continuous: decode slots (None = B)
    # static: each decode chunk after the first runs only the narrowest of B, B/2, ... B/2^shrink
    # rows that holds the live ones (the same tokens, fewer rows decoded on a long tail of lengths:
    # docs/benchmarks.md). 0 = all B rows every step: the program holds shrink + 1 decode loops
    # per chunk instead of one, so its compile time grows with T (the continuous engine's does not)
    c.rl.rollout_shrink = 0
    # continuous: KV-cache slots per page; rollout.continuous.DEFAULT_PAGE_SIZE, which says why 64
    # (config/ does not import rollout/; tests/test_rollout_options.py ties the two)
    c.rl.rollout_page_size = 64
    # Partial rollouts (continuous engine; 0 = off): k prompt batches stay in the engine's queue
    # between steps. Each step's engine works on (1 + k)·P groups (the carried ones first, their
    # unfinished rows continued), stops once P groups are complete (a fraction 1 / (1 + k) of
    # its queue), trains on those and carries the rest; each token records the policy version
    # (step) that sampled it (rl/partial.py).
    c.rl.partial_rollout = 0
    # The asynchronous pipeline (rl/pipeline.py, docs/pipeline.md): the rollout runs up to
    # max_staleness policy versions ahead of the update (0 = synchronous, today's step): while
    # step t updates, the rollouts of steps t+1..t+k are sampled, and a batch whose tokens were
    # sampled more than max_staleness versions before the update that uses it is never used.
    # The rollout's parameters are refreshed from the trainer's every sync_every updates
    # (sync_every <= max_staleness + 1: the lag of the refresh counts against the bound).
    c.rl.max_staleness = 0
    c.rl.sync_every = 1
    # Gaussian noise of this std added to each sampled token's reported log-prob (0 = none): a
    # dose of sampler-trainer mismatch for the rollout-log-probs claim
    c.rl.rollout_logp_noise = 0.0
    # DAPO dynamic sampling: drop groups whose rewards are all equal and draw more prompts, up to
    # max_gen_batches rollouts per step; overlong shaping (tokens; penalty 0 = off) and masking
    # truncated responses out of the loss.
    c.rl.dynamic_sampling = False
    c.rl.max_gen_batches = 3
    c.rl.overlong_buffer = 0
    c.rl.overlong_penalty = 0.0
    c.rl.mask_truncated = False

    # Multi-turn episodes (docs/tools.md "The trainer side"): name "" = one turn, the task's
    # prompt and one response (today's path); "python" = the task's problems with the sandboxed
    # Python tool offered (envs.TaskToolEnvironment): the rollout plays episodes through the
    # multi-turn engine, the loss sees only the policy's tokens (the action mask) and the rewards
    # are the environment's. Limits: policy turns per episode, tokens of each tool response; a
    # row holds the prompt and rl.max_new_tokens of turns and tool responses. Each tool run:
    # tool_timeout_s wall clock, tool_memory_mb of address space, tool_workers sandboxes at once.
    c.env = ml_collections.ConfigDict()
    c.env.name = ""
    c.env.max_turns = 4
    c.env.max_tool_response_tokens = 256
    c.env.tool_timeout_s = 5.0
    c.env.tool_memory_mb = 256
    c.env.tool_workers = 4

    # The rollout's own device group (rl/pipeline.py): devices = a count (>= 1) or a fraction
    # (in (0, 1)) of the devices, taken from the end of the device list; 0 = the rollout shares
    # the training mesh (today's). The trainer's mesh (config.mesh) then spans the other devices
    # and the rollout's mesh (rollout.mesh, the same axes; -1 fills) these. At each sync the
    # rollout's copy of the parameters is made in sync_dtype: "rollout" = the rollout's compute
    # dtype (half the bytes under a bf16 rollout; the same rollout where the compiler rounds
    # weights to bf16 as written, but XLA:CPU may keep a float32 weight's excess precision, so
    # there it differs from the synchronous rollout by float rounding), or "trainer" = the
    # parameters' own dtype (the synchronous rollout bit for bit on every backend).
    c.rollout = ml_collections.ConfigDict()
    c.rollout.devices = 0.0
    c.rollout.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))
    c.rollout.sync_dtype = "rollout"

    # LoRA (models/lora.py, through qwix): rank-r adapters on the weights of the modules whose
    # path ("layers/attn", "layers/mlp", ...) matches a target regex in full; only the adapters
    # train (the optimizer holds state for them alone), the reference policy is the base (the
    # adapters' B zeroed, no second copy of the weights) and checkpoints hold the adapters.
    # rank 0 = full fine-tuning. alpha: the adapters' output is scaled by alpha / rank. The
    # default targets cover attention (q, k, v, o) and the MLP (the SwiGLU; for MoE the router
    # and, under model.moe_dispatch="dense", the experts).
    c.lora = ml_collections.ConfigDict()
    c.lora.rank = 0
    c.lora.alpha = 16.0
    c.lora.targets = ("layers/attn", "layers/mlp")
    # QLoRA: the frozen base's projection weights held quantized under the adapters ("int8",
    # "fp8" or "" = the parameters' dtype; rollout/quant.py's weights and scheme). The trainer,
    # the reference and the rollout read the dequantized base; only the adapters train.
    c.lora.base_quant = ""

    c.objective = objective_placeholders()
    c.objective.name = "gspo"

    c.optimizer = ml_collections.ConfigDict()
    # A prototype collapsed at 3e-4 (responses fell to the short format with zero reward) and
    # trained well at a constant 1e-4: keep the schedule here, visible and overridable.
    c.optimizer.learning_rate = 1e-4
    c.optimizer.schedule = "constant"  # constant | cosine | linear (after warmup)
    c.optimizer.warmup_updates = 0  # in optimizer updates (RL steps x epochs x minibatches)
    c.optimizer.end_lr_ratio = 0.0
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-8
    c.optimizer.weight_decay = 0.0
    c.optimizer.grad_clip = 1.0
    # MoE: the routers' step size relative to the rest of the model's (1.0 = the same step), a
    # dose of route volatility (configs/arith_moe.py)
    c.optimizer.router_lr_scale = 1.0

    c.eval = ml_collections.ConfigDict()
    c.eval.every = 40  # RL steps; 0 = only at the start and the end
    c.eval.at_start = True  # evaluate the base policy before RL (the summary's "base")
    c.eval.split = "test"
    c.eval.num_problems = 200  # 0 = no evaluation at all
    c.eval.pass_k = 1  # samples per problem for pass@k / sample accuracy (costs k rollouts)
    c.eval.max_new_tokens = 0  # 0 = rl.max_new_tokens
    c.eval.batch_size = 64
    c.eval.seed = 0

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 40
    c.checkpoint.max_to_keep = 2
    c.checkpoint.async_save = True

    # A pod run (several processes): the longest any process waits for another at an agreement
    # (checkpoint restore/save, stop signals) before it stops with a one-line error naming the
    # peer; the watchdog's heartbeat timeout too (docs/resilience.md).
    c.multihost = ml_collections.ConfigDict()
    c.multihost.timeout_s = MULTIHOST_TIMEOUT_S  # seconds

    # Mesh axis sizes (-1 fills the remaining devices); a TPU pod slice might use data=-1, fsdp=4.
    # population: a population's member axis (members spread over its devices; 1 = none)
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1, population=1))
    c.num_devices = -1  # -1 = every device; n = the first n (single-process comparisons)
    # The TPU slice a --dry_run plans for (planning/memory_plan.py SLICES; None = no plan)
    c.slice = config_dict.placeholder(str)

    c.log = ml_collections.ConfigDict()
    c.log.tensorboard = True
    c.log.progress = True

    # A population (docs/population.md): many runs as one program, their parameters, optimizer
    # states and keys stacked on a leading member axis. seeds: each member's config.seed (empty =
    # one run, no population); vary: numeric fields per member, nested like the config
    # (c.population.vary = ConfigDict({"objective": {"eps_low": (1e-4, 3e-4)}})), only those in
    # POPULATION_FIELDS; mode: "product" of seeds and every vary list, or "zip" (equal lengths).
    c.population = ml_collections.ConfigDict()
    c.population.seeds = ()
    c.population.vary = ml_collections.ConfigDict()
    c.population.mode = "product"
    # How a device computes its members' rollout and update: "vmap" (one batched program), "map"
    # (one member after another inside one program), "auto" (= vmap; on a CPU the rollout runs
    # each member's single-run program: rl/population.py make_member_rollout)
    c.population.batching = "auto"

    return c
