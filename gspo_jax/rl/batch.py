"""The RL batch: one record of the arrays an update trains on, and the functions that make it.

    shaped, shaping, truncated, signal = make_shape_fn(run)(sample, rewards)
    batch, metrics = make_prepare_fn(run)(sample, shaped, prompts, lengths, truncated)
    plan_batch = RLBatch.abstract(run)           # the same fields and shapes, without arrays

Dimension legend: B = P*G response rows of one rollout batch (group-contiguous), P prompts, G
samples per prompt, Lp padded prompt length, T padded response length (= max_new_tokens), L
layers, S = Lp + T sequence slots, k experts per token.

Every field has a leading B axis and is sharded by rows over the mesh (sharding.rows_sharding).
The optional fields are None when the run does not use them, and RLBatch.abstract(run) states
when that is, so the dry run (memory_plan) plans the batch the run makes. Routes are batch-major
([B, L, S, k]) everywhere in the RL step; the model's layer-major [L, B, S, k] appears only at the
model seams (the rollout, logprob_passes.forward).

With config.rl.log_route_change (MoE) the rollout also returns its routes, but they enter the batch
(and so the update and the old_logp recomputation) only with config.rl.routing_replay; after the
update a forward pass with the new parameters routes afresh and ``route_change_frac`` compares its
experts with the rollout's (train/route_change_frac).
"""

from __future__ import annotations

import chex
import flax
import jax
import jax.numpy as jnp

from gspo_jax import advantages, rollout, sharding
from gspo_jax.state import Run


@flax.struct.dataclass
class RLBatch:
    """The arrays one RL step's update trains on (a pytree; None fields are absent leaves)."""

    prompts: jax.Array  # [B, Lp] int32: each prompt repeated G times
    prompt_lengths: jax.Array  # [B] int32
    responses: jax.Array  # [B, T] int32
    # [B, T] f32: the response's tokens, the policy's and (multi-turn) the environment's: 1 up to
    # and including the last EOS (0 where the row is masked out of the loss); what the model reads
    mask: jax.Array
    # The next two are None only in a forward-only pass's view (RLBatch.sequences).
    old_logp: jax.Array | None  # [B, T] f32: π_old, from the sampler (default) or recomputed
    adv: jax.Array | None  # [B] f32, or [B, T] under per_token_advantages(run)
    # [B, T] f32: the action mask, 1 on the policy's tokens (within mask), 0 on the tokens the
    # environment wrote into the response (tool responses, observations: context, never actions).
    # None: every response token is the policy's (one turn). Read it as `loss_mask`.
    action_mask: jax.Array | None = None
    # [B, T] f32: the sampler's log-probs when the objective weighs them
    # (StepSpec.keeps_rollout_logp)
    rollout_logp: jax.Array | None = None
    # [B, T] f32: the reference model's log-probs when the loss has a KL term (has_ref_logp)
    ref_logp: jax.Array | None = None
    routes: jax.Array | None = None  # [B, L, S, k] int32: the rollout's experts (Routing Replay)

    @property
    def loss_mask(self) -> jax.Array:
        """[B, T] the tokens the loss sees, the objectives' `mask`: the action mask (the policy's
        tokens), or `mask` when every response token is the policy's."""
        return self.mask if self.action_mask is None else self.action_mask

    @classmethod
    def abstract(cls, run: Run) -> RLBatch:
        """ShapeDtypeStructs of the run's batch (rows sharded as the run's): what the dry run
        compiles the update with."""
        spec, mesh, cfg = run.step, run.mesh, run.model_cfg
        B, Lp, T = spec.rows, spec.prompt_len, spec.response_len

        def rows(shape, dtype=jnp.float32):
            sh = sharding.rows_sharding(mesh, len(shape))
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

        return cls(
            prompts=rows((B, Lp), jnp.int32),
            prompt_lengths=rows((B,), jnp.int32),
            responses=rows((B, T), jnp.int32),
            mask=rows((B, T)),
            old_logp=rows((B, T)),
            adv=rows((B, T) if spec.per_token_advantages else (B,)),
            action_mask=rows((B, T)) if spec.multi_turn else None,  # None: one-turn rows
            rollout_logp=rows((B, T)) if spec.keeps_rollout_logp else None,
            ref_logp=rows((B, T)) if spec.ref_logp_in_batch else None,
            routes=rows((B, cfg.num_layers, Lp + T, cfg.experts_per_token), jnp.int32)
            if spec.replays_routes
            else None,
        )

    def sequences(self, with_routes: bool) -> RLBatch:
        """Only what the model reads (prompts, lengths, responses, mask, and the routes to replay
        if ``with_routes``); the rest None: what a forward-only pass carries through its chunks."""
        return RLBatch(
            prompts=self.prompts,
            prompt_lengths=self.prompt_lengths,
            responses=self.responses,
            mask=self.mask,
            old_logp=None,
            adv=None,
            routes=self.routes if with_routes else None,
        )


def per_token_advantages(run: Run) -> bool:
    """adv is [B, T] (StepSpec.per_token_advantages); else [B]."""
    return run.step.per_token_advantages


def uses_reference(run: Run) -> bool:
    """The run keeps the base policy as a reference and runs its forward pass each step
    (StepSpec.uses_reference)."""
    return run.step.uses_reference


def has_ref_logp(run: Run) -> bool:
    """The batch carries ref_logp (StepSpec.ref_logp_in_batch)."""
    return run.step.ref_logp_in_batch


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """mean of x over mask > 0 (0 when the mask is empty); x, mask of one shape."""
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


# ------------------------------------------------------------------------------ making a batch


def overlong_penalty(
    lengths: jax.Array, truncated: jax.Array, max_len: int, buffer: int, penalty: float
) -> jax.Array:
    """DAPO's overlong reward shaping (its eq. 13), in tokens: [B] lengths -> [B] reward terms.

        0                                          |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache * pen  inside the buffer
        -pen                                       truncated (no EOS within L_max tokens)

    with L_max = max_len (= max_new_tokens) and L_cache = buffer; buffer = 0 gives only the
    truncation term.
    """
    chex.assert_equal_shape([lengths, truncated])
    lengths = lengths.astype(jnp.float32)
    soft = max_len - buffer
    inside = jnp.where(lengths > soft, (soft - lengths) / max(buffer, 1) * penalty, 0.0)
    return jnp.where(truncated, -penalty, inside)


def make_shape_fn(run: Run):
    """(sample, rewards [B]) -> Rollout: the verifier's rewards plus overlong shaping, and which
    groups carry a learning signal (rewards not all equal)."""
    spec = run.step
    G, T, eos_id = spec.group_size, spec.response_len, spec.eos_id

    def fn(sample, rewards):
        B = rewards.shape[0]
        chex.assert_shape([sample.tokens, sample.mask], (B, T))
        lens = sample.mask.sum(-1)  # [B] tokens, EOS included
        has_eos = ((sample.tokens == eos_id) & (sample.mask > 0)).any(-1)
        truncated = (~has_eos) & (lens >= T)  # [B]
        shaping = jnp.zeros_like(rewards)
        if spec.overlong_penalty > 0:
            shaping = overlong_penalty(
                lens, truncated, T, spec.overlong_buffer, spec.overlong_penalty
            )
        shaped = rewards + shaping
        by_group = shaped.reshape(B // G, G)
        signal = by_group.max(-1) > by_group.min(-1)  # [P]
        return shaped, shaping, truncated, signal

    return jax.jit(fn)


def make_select_fn(run: Run):
    """Dynamic sampling: n generation batches -> one batch of the first P groups with signal.

    (samples, rewards, shaping, truncated, signal, prompts, lengths), each a tuple over the n
    batches, -> the same fields of P groups, and valid [P]: groups with signal come first, in the
    order they were generated; if fewer than P have signal, the rest are zero-signal groups whose
    response mask is zeroed (they change nothing, see docs/objectives.md on empty rows).
    """
    G, P = run.step.group_size, run.step.prompts

    def fn(samples, rewards, shaping, truncated, signal, prompts, lengths):
        cat = jnp.concatenate  # of the n batches' rows (routes too: batch-major)
        signal = cat(signal)  # [nP]
        groups = jnp.argsort(~signal, stable=True)[:P]  # [P] signal first, in generated order
        valid = signal[groups]  # [P]
        rows = (groups[:, None] * G + jnp.arange(G)[None, :]).reshape(-1)  # [B]
        row_valid = jnp.repeat(valid, G)  # [B]
        take = lambda xs, idx: jnp.take(cat(xs), idx, axis=0)  # noqa: E731
        sample = rollout.SampleOutput(
            tokens=take([s.tokens for s in samples], rows),
            mask=take([s.mask for s in samples], rows) * row_valid[:, None],
            logp=take([s.logp for s in samples], rows),
            sample_logp=take([s.sample_logp for s in samples], rows),
            lengths=take([s.lengths for s in samples], rows),
            routes=None if samples[0].routes is None else take([s.routes for s in samples], rows),
        )
        return (
            sample,
            take(rewards, rows),
            take(shaping, rows),
            take(truncated, rows),
            valid,
            take(prompts, groups),
            take(lengths, groups),
        )

    return jax.jit(fn)


def make_prepare_fn(run: Run):
    """(sample, rewards [B], prompts [P, Lp], lengths [P], truncated [B], action_mask=None) ->
    (RLBatch, rollout metrics). Jitted (the action mask's check runs before, on the host).

    Advantages from the (shaped) rewards; with config.rl.mask_truncated a truncated response is
    masked out of the loss. With config.rl.recompute_old_logp the sampler's log-probs are kept
    as ``rollout_logp`` when the objective reads them (its rollout correction / off-policy
    masking), and old_logp is later replaced by the trainer's recomputation.

    action_mask [B, T] (multi-turn rows): 1 on the policy's tokens, 0 on the environment's
    (check_action_mask: within sample.mask). The sampler's log-probs of the environment's tokens
    are not log-probs of a sample (it did not sample them): they are set to 0 in old_logp and
    rollout_logp, and the loss never reads them (batch.loss_mask is the objectives' mask).
    """
    spec = run.step
    G, T, eos_id = spec.group_size, spec.response_len, spec.eos_id

    def fn(sample, rewards, prompts, lengths, truncated, action_mask):
        B = prompts.shape[0] * G
        chex.assert_shape([sample.tokens, sample.mask, sample.logp], (B, T))
        chex.assert_shape([rewards, truncated], (B,))
        mask = sample.mask
        if spec.mask_truncated:
            mask = mask * (~truncated)[:, None]
        logp, actions, policy = sample.logp, mask, sample.mask  # one turn: every token is policy's
        if action_mask is not None:
            chex.assert_shape(action_mask, (B, T))
            logp = jnp.where(action_mask > 0, logp, 0.0)  # [B, T] 0 on the environment's tokens
            actions, policy = action_mask * mask, action_mask  # (mask: the truncated rows' zeros)
        adv, adv_metrics = run_advantages(run, rewards, actions)
        batch = RLBatch(
            prompts=jnp.repeat(prompts, G, axis=0),
            prompt_lengths=jnp.repeat(lengths, G, axis=0),
            responses=sample.tokens,
            mask=mask,
            old_logp=logp,
            adv=adv,
            action_mask=None if action_mask is None else actions,
            rollout_logp=logp if spec.keeps_rollout_logp else None,
            # the update replays the rollout's experts only with Routing Replay (with only
            # log_route_change the update routes afresh, and rl_step compares after it)
            routes=sample.routes if spec.replays_routes else None,
        )
        batch = jax.tree.map(lambda v: sharding.constrain_rows(v, run.mesh), batch)
        lens = sample.mask.sum(-1)  # [B]; 0 only for dynamic sampling's masked filler rows
        has_eos = ((sample.tokens == eos_id) & (sample.mask > 0)).any(-1)
        rows = jnp.maximum((lens > 0).sum(), 1)
        m = {
            "response_len_mean": lens.sum() / rows,
            "response_len_max": lens.max(),
            "truncated_frac": ((~has_eos) & (lens >= T)).sum() / rows,
            "frac_zero_std_groups": adv_metrics["frac_zero_std_groups"],
            "reward_std": adv_metrics["reward_std"],
            "adv_abs_mean": _adv_abs_mean(adv, actions),
            "sample_logp_mean": (logp * policy).sum() / jnp.maximum(policy.sum(), 1),
            "tokens": lens.sum(),
        }
        if action_mask is not None:
            m["policy_token_frac"] = policy.sum() / jnp.maximum(lens.sum(), 1)
        return batch, m

    jitted = jax.jit(fn)

    def prepare(sample, rewards, prompts, lengths, truncated, action_mask=None):
        if action_mask is not None:
            check_action_mask(sample.mask, action_mask)
        return jitted(sample, rewards, prompts, lengths, truncated, action_mask)

    return prepare


def check_action_mask(mask: jax.Array, action_mask: jax.Array) -> None:
    """One-line ValueError unless action_mask [B, T] is 0/1 and 1 only where the response mask
    [B, T] is (the policy's tokens are response tokens). On concrete arrays, before any work."""
    if action_mask.shape != mask.shape:
        raise ValueError(
            f"action_mask has shape {action_mask.shape}; it must match the response mask's "
            f"[B, T] = {mask.shape}"
        )
    bad = ((action_mask != 0) & (mask == 0)) | ((action_mask != 0) & (action_mask != 1))
    if bool(jnp.any(bad)):
        b, t = divmod(int(jnp.argmax(bad.reshape(-1))), mask.shape[1])
        raise ValueError(
            f"action_mask is {float(action_mask[b, t])} at row {b}, token {t}, where the response "
            f"mask is {float(mask[b, t])}: it must be 0/1 and 1 only on response tokens (the "
            "policy's); build it as policy_mask * mask"
        )


def run_advantages(run: Run, rewards: jax.Array, mask: jax.Array):
    """The run's advantages of rewards ([B] per response, or [B, T] per token) and their metrics:
    [B], or [B, T] for the REINFORCE++ estimators and with rl.token_advantages (each response's
    advantage on its tokens)."""
    spec = run.step
    adv, adv_metrics = advantages.group_advantages(
        rewards,
        spec.group_size,
        estimator=spec.estimator,
        eps=spec.adv_eps,
        std_ddof=spec.adv_std_ddof,
        scale_rewards=spec.scale_rewards,
        mask=mask,
    )
    if adv.ndim == 1 and spec.token_advantages:
        adv = jnp.broadcast_to(adv[:, None], mask.shape)
    return adv, adv_metrics


def _adv_abs_mean(adv: jax.Array, mask: jax.Array) -> jax.Array:
    """mean |A| over responses ([B]) or over response tokens ([B, T])."""
    if adv.ndim == 1:
        return jnp.abs(adv).mean()
    return masked_mean(jnp.abs(adv), mask)


def make_kl_reward_fn(run: Run):
    """rl.kl_in_reward (verl's use_kl_in_reward): (batch with ref_logp, rewards [B]) -> (batch,
    metrics). The token rewards become r_{i,t} = r_i·[t = last] − β·k1_{i,t}, k1 = old_logp −
    ref_logp (β = the objective's kl_coef), the advantages are recomputed from them (a group
    estimator sums them over the response), and ref_logp leaves the batch, so that the loss
    has no KL term of its own. Jitted."""
    beta = run.objective.kl_coef

    def fn(batch: RLBatch, rewards):
        mask = batch.loss_mask  # the policy's tokens: no KL on the environment's
        k1 = (batch.old_logp - batch.ref_logp) * mask  # [B, T]
        if run.step.estimator in advantages.TOKEN_ESTIMATORS:  # REINFORCE++: per token
            shaped = advantages.outcome_token_rewards(rewards, mask) - beta * k1  # [B, T]
        else:  # the same summed over the response (keeps a masked-out row's own reward)
            shaped = rewards - beta * k1.sum(-1)  # [B]
        adv, _ = run_advantages(run, shaped, mask)
        rows = jnp.maximum((mask.sum(-1) > 0).sum(), 1)
        m = {
            "kl_reward_k1_mean": masked_mean(k1, mask),  # per token
            "kl_reward_penalty_mean": beta * k1.sum() / rows,  # β·Σ_t k1 per response
            "kl_reward_adv_abs_mean": _adv_abs_mean(adv, mask),
        }
        return batch.replace(adv=adv, ref_logp=None), m

    return jax.jit(fn)


def recompute_metrics(new_logp: jax.Array, batch: RLBatch) -> dict:
    """The trainer's recomputed old_logp [B, T] against the batch's (the sampler's): the mean and
    max |difference| per token (recompute_logp_diff_*) and the mismatch_metrics, over the
    policy's tokens (the sampler has no log-prob of the environment's)."""
    mask = batch.loss_mask
    diff = (new_logp - batch.old_logp) * mask
    return {
        "recompute_logp_diff_mean": diff.sum() / jnp.maximum(mask.sum(), 1.0),
        "recompute_logp_diff_absmax": jnp.abs(diff).max(),
        **mismatch_metrics(new_logp, batch.old_logp, mask),
    }


def mismatch_metrics(old_logp: jax.Array, rollout_logp: jax.Array, mask: jax.Array) -> dict:
    """Training-inference mismatch Δ = old_logp − rollout_logp [B, T]: mean / max |Δ| per token,
    |Σ_t Δ| per sequence (the log of the sequence ratio the correction modes weigh) and
    |Σ_t Δ| / |y| per sequence (the log of the geometric-mean ratio GSPO's ε is compared with)."""
    delta = (old_logp - rollout_logp) * mask  # [B, T]
    seq = jnp.abs(delta.sum(-1))  # [B]
    lens = mask.sum(-1)  # [B]
    has = lens > 0  # [B]
    geo = seq / jnp.maximum(lens, 1.0)  # [B]
    rows = jnp.maximum(has.sum(), 1)
    return {
        "mismatch_tok_abs_mean": jnp.abs(delta).sum() / jnp.maximum(mask.sum(), 1.0),
        "mismatch_tok_abs_max": jnp.abs(delta).max(),
        "mismatch_seq_abs_mean": (seq * has).sum() / rows,
        "mismatch_seq_abs_max": seq.max(),
        "mismatch_geo_abs_mean": (geo * has).sum() / rows,
        "mismatch_geo_abs_max": geo.max(),
    }


def route_change_frac(
    old_routes: jax.Array, new_routes: jax.Array, prompt_lengths: jax.Array, mask: jax.Array
) -> jax.Array:
    """Fraction of (response token, layer) pairs whose set of top-k experts differs.

    old_routes, new_routes [B, L, S, k] (S = Lp + T slots), prompt_lengths [B], mask [B, T].
    The experts of response token t are those of the slot whose hidden state predicts it (as in
    models.response_logprobs): the last prompt slot n - 1 for t = 0, else slot Lp + t - 1, the
    previous response token. These are the routes that enter log p(y_t), and the sampler fed
    every one of them for every valid t (the slot of the last response token itself may never be
    fed, so the rollout's routes there are zeros). Only mask > 0 tokens count; the k indices are
    sorted before comparing (a set, not an order). 0 when no token is valid.
    """
    B, L, S, k = old_routes.shape
    T = mask.shape[1]
    chex.assert_shape(new_routes, (B, L, S, k))
    chex.assert_shape(prompt_lengths, (B,))
    t = jnp.arange(T, dtype=jnp.int32)[None, :]
    Lp = S - T
    src = jnp.where(t == 0, prompt_lengths.astype(jnp.int32)[:, None] - 1, Lp + t - 1)  # [B, T]
    idx = src[:, None, :, None]  # [B, 1, T, 1]

    def experts(r):  # [B, L, S, k] -> the sorted experts of each response token [B, L, T, k]
        return jnp.sort(jnp.take_along_axis(r, idx, axis=2), axis=-1)

    changed = jnp.any(experts(old_routes) != experts(new_routes), axis=-1)  # [B, L, T]
    weight = (mask > 0).astype(jnp.float32)[:, None, :]  # [B, 1, T]
    return (changed * weight).sum() / jnp.maximum(weight.sum() * L, 1.0)
