r"""The MoE experiment: GRPO vs GSPO on the Mixture-of-Experts preset, with and without Routing
Replay.

The GSPO paper's strongest claim is about MoE stability: after each update a token may be routed
to different experts, so token-level ratios (GRPO, GSPO-token) fluctuate wildly unless the old
policy's routes are replayed (Routing Replay), while GSPO's sequence likelihood does not need it.

Launch (the warm start of the small_moe preset is cached like the dense one):

    python -m gspo_jax.main --config configs/arith_moe.py --workdir runs/moe_gspo
    python -m gspo_jax.main --config configs/arith_moe.py:objective=grpo,routing_replay \
        --workdir runs/moe_grpo_rr
    python experiments/sweep.py --config configs/arith_moe.py --sweep seeds=2 --workdir runs/moe
    python -m gspo_jax.main --config configs/arith_moe.py:runlocal --workdir /tmp/moe_local

Expected runtime (2-core CPU, from an empty cache, measured with light other load): 5 min 41 s for
the default GSPO run, of which warm start 254 s (1.6x the dense one: 8 experts, top-2) and RL 75 s
(1.3x); held-out greedy accuracy 0.395 -> 0.820 (measured before rl.log_route_change, which adds
one forward pass per step, was turned on here). runlocal: under a minute. Headline metrics:
eval/greedy_accuracy (base vs final) and, for the
stability story, train/clip_frac, train/ratio_max and rollout/logp_diff_absmax with and without
Routing Replay.

Pod scale (the GSPO paper's model: Qwen3-30B-A3B on GSM8K, configs/qwen3_gsm8k.py's layout for
v5p-16; every host runs each command, docs/pods.md "From a Qwen3 checkpoint to a pod run"):

    python -m gspo_jax.main --config configs/arith_moe.py:pod=/mnt/shared/Qwen3-30B-A3B,\
objective=grpo,routing_replay --workdir /mnt/shared/runs/moe_grpo_rr --multihost

Arguments: those of configs/arith.py, plus routing_replay (bool), aux_loss_coef (float) and pod
(str: a Qwen3-30B-A3B checkpoint folder; set, it selects the pod-scale variant).
With routing_replay the sampler records the rollout's expert routes and every update forward
replays them.

rl.log_route_change is on here: after each step's updates one forward pass of the new parameters
routes afresh, and train/route_change_frac is the fraction of (response token, layer) pairs whose
top-k expert set differs from the rollout's (the GSPO paper's case for Routing Replay; with
routing_replay it is the share of routes the replay overrode). Turn it off with
--config.rl.log_route_change=False to save that pass.
"""

from __future__ import annotations

import ml_collections

from gspo_jax import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arith = config_lib.sibling_config(__file__, "arith.py")
    a = config_lib.parse_arg(
        arg, **arith.common_args(), routing_replay=False, aux_loss_coef=1e-3, pod=""
    )
    if a.pod:  # the pod-scale variant: Qwen3-30B-A3B on GSM8K (configs/qwen3_gsm8k.py)
        qwen = config_lib.sibling_config(__file__, "qwen3_gsm8k.py")
        c = qwen.pod_variant("qwen3_30b_a3b", a.pod, a.objective, a.seed)
        arith.apply_common_args(c, a)  # eps, steps, lr when given
        c.rl.routing_replay = a.routing_replay
        c.rl.aux_loss_coef = a.aux_loss_coef
        c.rl.log_route_change = True
        c.lock()
        return c
    c = arith.base_config(a.runlocal)
    arith.apply_common_args(c, a)
    c.model.preset = "tiny_moe" if a.runlocal else "small_moe"
    c.rl.routing_replay = a.routing_replay
    c.rl.aux_loss_coef = a.aux_loss_coef
    c.rl.log_route_change = True  # train/route_change_frac: Routing Replay's case, measured
    c.lock()
    return c


# Route volatility (moe_routing_replay's dose-response): v0 is the config's own (aux loss 1e-3, 4
# minibatches x 1 epoch); without the load-balancing loss and with more updates per batch the
# routes drift further from the rollout's before each update; v3 adds more experts and more per
# token (16, top-4: narrower margins between the chosen experts and the next; its own warm start).
VOLATILITY_DOSES = {
    "_v1": {"rl.aux_loss_coef": 0.0, "rl.num_minibatches": 8, "rl.num_epochs": 2},
    "_v2": {"rl.aux_loss_coef": 0.0, "rl.num_minibatches": 16, "rl.num_epochs": 2},
    "_v3": {
        "rl.aux_loss_coef": 0.0,
        "rl.num_minibatches": 16,
        "rl.num_epochs": 2,
        "model.num_experts": 16,
        "model.experts_per_token": 4,
    },
    # the routers' steps x5 / x20 / x100 (optimizer.router_lr_scale) on v2: towards the ~10 % of
    # routes per step the GSPO paper reports for Qwen3-30B-A3B
    "_v4": {
        "rl.aux_loss_coef": 0.0,
        "rl.num_minibatches": 16,
        "rl.num_epochs": 2,
        "optimizer.router_lr_scale": 5.0,
    },
    "_v5": {
        "rl.aux_loss_coef": 0.0,
        "rl.num_minibatches": 16,
        "rl.num_epochs": 2,
        "optimizer.router_lr_scale": 20.0,
    },
    # x100: over 60 steps x20 moved 4.9 % per step on average (the probes' first 8 steps more)
    "_v6": {
        "rl.aux_loss_coef": 0.0,
        "rl.num_minibatches": 16,
        "rl.num_epochs": 2,
        "optimizer.router_lr_scale": 100.0,
    },
}


# Round 2 (issue 33): moe_routing_replay's v3 design frozen (dose v6, the routers' steps x100),
# with GSPO + Routing Replay added for the claim's other half, and GRPO with and without the
# replay at v2 and v5 for the dose-response of the replay's gain against the route change.
ROUND2_ARMS = tuple(
    (
        f"{name}{'_rr' if rr else ''}{dose}",
        {"objective.name": name, "rl.routing_replay": rr, **VOLATILITY_DOSES[dose]},
    )
    for dose, names in (("_v6", ("grpo", "gspo")), ("_v2", ("grpo",)), ("_v5", ("grpo",)))
    for name in names
    for rr in (False, True)
)


def get_sweep(arg: str | None = None) -> list[dict]:
    """Token-level objectives with and without Routing Replay, GSPO without, x seeds.

    Arguments: seeds (int); gspo_token (bool, default True): include GSPO-token with and
    without Routing Replay (notebooks/moe_routing_replay.ipynb leaves it out: grpo, grpo_rr and
    gspo); doses (bool, default False): every arm also at the volatility doses _v1 ... _v6
    (VOLATILITY_DOSES); study ("" or "r2": ROUND2_ARMS at the registry's fresh seeds 100, 101,
    ... with the warm start drawn per seed, round 2 of issue 33, configs/arith.py round2_sweep).
    """
    a = config_lib.parse_arg(arg, seeds=1, gspo_token=True, doses=False, study="")
    if a.study == "r2":
        arith = config_lib.sibling_config(__file__, "arith.py")
        return arith.round2_sweep(ROUND2_ARMS, a.seeds)
    if a.study:
        raise ValueError(f"study must be '' (this sweep) or 'r2', got {a.study!r}")
    arms = [("grpo", False), ("grpo", True)]
    if a.gspo_token:
        arms += [("gspo_token", False), ("gspo_token", True)]
    arms.append(("gspo", False))
    doses = {"": {}, **(VOLATILITY_DOSES if a.doses else {})}
    runs = []
    for seed in range(a.seeds):
        for suffix, dose in doses.items():
            for name, rr in arms:
                tag = f"{name}{'_rr' if rr else ''}{suffix}_s{seed}"
                overrides = {"objective.name": name, "rl.routing_replay": rr, **dose, "seed": seed}
                runs.append(dict(name=tag, overrides=overrides))
    return runs
