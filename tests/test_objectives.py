"""Tests of gspo_jax.objectives against docs/objectives.md: formulas, reference numbers,
numerics (padding, empty rows, wild ratios) and bad arguments.

Dimension legend: B response rows, T padded response length. Shapes stay small and fixed, and the
jitted loss-and-gradient functions are cached per objective, so each compiles once.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gspo_jax import objectives

B, T = 8, 12
PRESETS = tuple(objectives.PRESETS)
# Every preset with a KL term, shared by the tests that pass ref_logp (one compile each).
WITH_KL = {name: objectives.get_objective(name, kl_coef=0.1) for name in PRESETS}


# ----------------------------------------------------------------------------- helpers


@functools.cache
def value_and_grad(obj: objectives.Objective, with_ref: bool, with_rollout: bool = False):
    """Jitted ((loss, metrics), d loss / d logp) of obj; cached so each objective compiles once."""

    def fn(lp, old, adv, mask, *extra):
        ref = extra[0] if with_ref else None
        rollout = extra[-1] if with_rollout else None
        return obj(lp, old, adv, mask, ref, rollout_logp=rollout)

    return jax.jit(jax.value_and_grad(fn, has_aux=True))


def run(obj, logp, old_logp, adv, mask, ref_logp=None, rollout_logp=None):
    extra = tuple(x for x in (ref_logp, rollout_logp) if x is not None)
    fn = value_and_grad(obj, ref_logp is not None, rollout_logp is not None)
    (loss, metrics), grad = fn(logp, old_logp, adv, mask, *extra)
    return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad)


def make_batch(seed=0, drift=0.3, per_token_adv=False):
    """[B, T] float32 arrays; row lengths include an empty row (2) and a full row (0)."""
    rng = np.random.default_rng(seed)
    lengths = np.array([T, 5, 0, 1, 9, 3, T, 7])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    old_logp = -rng.exponential(1.0, size=(B, T)).astype(np.float32)
    logp = (old_logp + rng.normal(0.0, drift, size=(B, T))).astype(np.float32)
    ref_logp = (old_logp + rng.normal(0.0, 0.2, size=(B, T))).astype(np.float32)
    adv = rng.normal(size=(B, T) if per_token_adv else (B,)).astype(np.float32)
    adv[3] = 0.0  # a zero advantage
    return logp, old_logp, adv, mask, ref_logp


def make_rollout_logp(old_logp, seed=0, mismatch=0.5):
    """The rollout engine's log-probs: old_logp off by N(0, mismatch) per token (a bf16 sampler
    is ~1e-3; 0.5 makes every bound and mask of the corrections act in a [8, 12] batch)."""
    rng = np.random.default_rng(seed + 100)
    return (old_logp + rng.normal(0.0, mismatch, size=old_logp.shape)).astype(np.float32)


# ----------------------------------------------------------------------------- reference
# An independent, deliberately plain transcription of docs/objectives.md. It runs in numpy float64
# (values) and in jax float32 (gradients, with real stop-gradients).


def reference_loss(
    xp,
    sg,
    obj,
    logp,
    old_logp,
    adv,
    mask,
    ref_logp=None,
    rollout_logp=None,
    entropy=None,
    lp_value=None,
):
    valid = mask > 0
    ones = xp.ones_like(mask)
    n = mask.sum(-1)  # |y_i|
    delta = xp.where(valid, logp - old_logp, 0.0)
    lp = xp.where(valid, logp, 0.0)
    A = adv if adv.ndim == 2 else adv[:, None] * ones
    A_i = adv if adv.ndim == 1 else None
    lo, hi = 1 - obj.eps_low, 1 + obj.eps_high

    def clamped_exp(x):
        return xp.exp(xp.clip(x, -20.0, 20.0))

    def surrogate(rho, a):  # per token: rho and a [B, T]
        if obj.surrogate == "cispo":
            return -sg(xp.clip(rho, lo, hi)) * a * lp
        if obj.surrogate == "sapo":
            tau = xp.where(a > 0, obj.tau_pos, obj.tau_neg)
            return -(4 / tau) / (1 + xp.exp(-tau * (rho - 1))) * a
        unclipped = rho if obj.delta is None else xp.minimum(rho, obj.delta)  # TRL's delta
        loss = -xp.minimum(unclipped * a, xp.clip(rho, lo, hi) * a)
        if obj.dual_clip is not None:
            loss = xp.where(a < 0, xp.minimum(loss, -obj.dual_clip * a), loss)
        return loss

    log_s = delta.sum(-1) / xp.maximum(n, 1.0)
    rho_kl = None  # the ratio TRL's bias-corrected KL is weighted by, [B, T]
    if obj.surrogate in FAMILY_SURROGATES:
        per_token = verl_family_per_token(xp, sg, obj, logp, old_logp, A, mask, lp_value)
        rho_kl = clamped_exp(delta)
    elif obj.ratio_level == "token":
        per_token = surrogate(clamped_exp(delta), A)
        rho_kl = clamped_exp(delta)
    elif obj.ratio_level == "sequence":  # s_i on every token of response i
        per_token = surrogate(clamped_exp(log_s)[:, None] * ones, A)
        rho_kl = clamped_exp(log_s)[:, None] * ones
    elif obj.ratio_level == "sequence_token":
        log_s_it = logp - sg(logp) + sg(log_s)[:, None]
        per_token = surrogate(clamped_exp(log_s_it), A)
        rho_kl = clamped_exp(log_s_it)
    else:  # geometric
        sigma = xp.sign(A_i)[:, None]
        d_star = sigma * xp.minimum(
            sigma * delta, sigma * xp.clip(delta, -obj.eps_low, obj.eps_high)
        )
        ratio = clamped_exp(xp.where(valid, d_star, 0.0).sum(-1) / xp.maximum(n, 1.0))
        L = -A_i * ratio
        if obj.dual_clip is not None:
            L = xp.where(A_i < 0, xp.minimum(L, -obj.dual_clip * A_i), L)
        per_token = L[:, None] * ones
        rho_kl = clamped_exp(log_s)[:, None] * ones  # the unclipped geometric mean s_i
    if obj.top_entropy_quantile < 1:  # TRL: the policy term only, on the high-entropy tokens
        per_token = per_token * trl_high_entropy_mask(xp, sg(entropy), mask, obj)
    if rollout_logp is not None:  # the policy term only, not the KL term
        per_token = per_token * reference_weight(xp, sg, obj, logp, old_logp, A, mask, rollout_logp)
    if ref_logp is not None:
        x = xp.where(valid, ref_logp - logp, 0.0)
        kl = {"k1": -x, "k2": x**2 / 2, "k3": xp.exp(x) - x - 1}[obj.kl_estimator]
        if obj.kl_unbiased:  # TRL's use_bias_correction_kl: per_token_kl * coef_1
            kl = kl * rho_kl
        per_token = per_token + obj.kl_coef * kl
    loss = reference_aggregate(xp, obj, per_token, mask)
    if obj.entropy_coef > 0:  # verl: policy_loss -= entropy_coeff * agg_loss(entropy)
        loss = loss - obj.entropy_coef * reference_aggregate(xp, obj, entropy, mask)
    return loss


def reference_aggregate(xp, obj, per_token, mask):
    """The documented aggregation of per-token values [B, T] over the response tokens."""
    valid = mask > 0
    n = mask.sum(-1)
    rows = (n > 0).sum()
    per_token = xp.where(valid, per_token, 0.0)
    max_len = obj.max_len or mask.shape[1]
    if obj.aggregation == "seq-mean-token-mean":
        return (per_token.sum(-1) / xp.maximum(n, 1.0)).sum() / rows
    if obj.aggregation == "token-mean":
        return per_token.sum() / n.sum()
    if obj.aggregation == "seq-mean-token-sum":
        return per_token.sum() / rows
    return per_token.sum() / (rows * max_len)


FAMILY_SURROGATES = ("clip_cov", "kl_cov", "dppo_tv", "dppo_kl")


def reference_top_k(score, candidates, k):
    """[B, T] bool: the k candidates of largest score, ties to the lower flat index (by counting,
    for each entry, the candidates ranked before it); numpy."""
    f = np.where(candidates, score, -np.inf).reshape(-1)
    idx = np.arange(f.shape[0])
    before = (f[None, :] > f[:, None]) | (
        (f[None, :] == f[:, None]) & (idx[None, :] < idx[:, None])
    )
    return (before.sum(1) < k).reshape(score.shape) & candidates


def verl_family_per_token(xp, sg, obj, logp, old_logp, A, mask, lp_value=None):
    """verl's compute_policy_loss_{clip_cov, kl_cov, dppo_tv, dppo_kl} per-token losses before
    agg_loss (verl/trainer/ppo/core_algos.py), transcribed; A [B, T]. clip_cov takes the
    candidates of largest covariance where verl draws them at random (documented). The token
    selections (detached in verl) are computed in numpy float64 from lp_value, the value of logp
    (logp itself may be a jax tracer)."""
    valid = mask > 0
    lp, old = xp.where(valid, logp, 0.0), xp.where(valid, old_logp, 0.0)
    negative_approx_kl = lp - old
    ratio = xp.exp(xp.clip(negative_approx_kl, -20.0, 20.0))
    lo, hi = obj.eps_low, obj.eps_high
    # numpy float64 values for the selections
    m64, A64 = np.asarray(mask, np.float64), np.asarray(A, np.float64)
    lp64 = np.where(valid, np.asarray(logp if lp_value is None else lp_value, np.float64), 0.0)
    old64 = np.where(valid, np.asarray(old_logp, np.float64), 0.0)
    ratio64 = np.exp(np.clip(lp64 - old64, -20.0, 20.0))

    def masked_mean(x):
        return (x * m64).sum() / m64.sum()

    if obj.surrogate == "clip_cov":
        pg_losses1 = -A * (ratio if obj.delta is None else xp.minimum(ratio, obj.delta))
        pg_losses2 = -A * xp.clip(ratio, 1 - lo, 1 + hi)
        clip_by_origin = (-A64 * np.clip(ratio64, 1 - lo, 1 + hi) > -A64 * ratio64) & valid
        cov_all = (A64 - masked_mean(A64)) * (lp64 - masked_mean(lp64))
        candidates = (cov_all < obj.clip_cov_ub) & (cov_all > obj.clip_cov_lb) & valid
        candidates = candidates & ~clip_by_origin
        clip_num = max(int(obj.clip_cov_ratio * m64.sum()), 1)
        corr = 1.0 - reference_top_k(cov_all, candidates, clip_num)
        return xp.maximum(pg_losses1, pg_losses2) * corr
    if obj.surrogate == "kl_cov":
        pg_losses = -A * ratio
        pg_losses_kl = -A * ratio + obj.ppo_kl_coef * xp.abs(negative_approx_kl)
        cov = (A64 - masked_mean(A64)) * (lp64 - masked_mean(lp64))
        k = max(1, int(m64.sum() * obj.kl_cov_ratio))
        large_cov = reference_top_k(cov, valid, k)
        return xp.where(large_cov, pg_losses_kl, pg_losses)
    truncated_ratio = sg(xp.minimum(ratio, obj.clip_ratio_c))
    prob, old_prob = np.exp(lp64), np.exp(old64)
    if obj.surrogate == "dppo_tv":
        valid_positive_mask = (prob - old_prob) <= hi
        valid_negative_mask = (prob - old_prob) >= -lo
    else:
        with np.errstate(invalid="ignore"):  # logp > 0 in the random batches: NaN, not kept
            binary_kl = old_prob * (old64 - lp64) + (1 - old_prob) * np.log(
                (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
            )
        valid_positive_mask = (binary_kl <= hi) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= lo) | (prob >= old_prob)
    valid_mask = np.where(A64 > 0, valid_positive_mask, valid_negative_mask)
    return -A * truncated_ratio * lp * valid_mask


def trl_high_entropy_mask(xp, entropies, mask, obj):
    """TRL's get_high_entropy_mask(entropies, mask, 1 − top_entropy_quantile), one process: the
    linear-interpolated quantile of the valid entropies, then entropy·mask >= it, and mask."""
    valid = mask > 0
    threshold = xp.nanquantile(xp.where(valid, entropies, xp.nan), 1 - obj.top_entropy_quantile)
    return ((entropies * mask) >= threshold) & valid


def reference_is_ratio(xp, obj, old_logp, mask, rollout_logp):
    """exp(Δ) per token, or exp(Σ_t Δ) repeated on every token of the response [B, T]."""
    d = xp.where(mask > 0, old_logp - rollout_logp, 0.0)
    if obj.rollout_correction.startswith("seq"):
        return xp.exp(d.sum(-1))[:, None] * xp.ones_like(mask)
    return xp.exp(d)


def reference_weight(xp, sg, obj, logp, old_logp, A, mask, rollout_logp):
    """[B, T] rollout correction weight c times the off-policy mask m (A [B, T])."""
    weight = xp.ones_like(mask)
    if obj.rollout_correction == "geo_rs":  # verl's geometric rejection: keep inside the bounds
        log_ratio = xp.where(mask > 0, old_logp - rollout_logp, 0.0)
        geo = xp.exp((log_ratio * mask).sum(-1) / mask.sum(-1).clip(1.0))
        low = 0.0 if obj.rollout_is_min is None else obj.rollout_is_min
        keep = (geo >= low) & (geo <= obj.rollout_is_max)
        weight = weight * xp.where(keep, 1.0, 0.0)[:, None]
    elif obj.rollout_correction is not None:
        r = reference_is_ratio(xp, obj, old_logp, mask, rollout_logp)
        low = 0.0 if obj.rollout_is_min is None else obj.rollout_is_min
        if obj.rollout_correction.endswith("tis"):
            c = xp.minimum(xp.maximum(r, low), obj.rollout_is_max)
        else:
            c = xp.where((r >= low) & (r <= obj.rollout_is_max), r, 0.0)
        weight = weight * sg(c)
    if obj.off_policy_mask is not None:
        diff = xp.where(mask > 0, rollout_logp - sg(logp), 0.0)
        drift = diff.sum(-1) / xp.maximum(mask.sum(-1), 1.0)
        dropped = (A < 0) & (drift[:, None] > obj.off_policy_mask)
        weight = weight * xp.where(dropped, 0.0, 1.0)
    return weight


def reference_metrics(obj, logp, old_logp, adv, mask, rollout_logp=None):
    """Clip fractions, ratio and weight statistics, float64, per unit as the docs state them."""
    logp, old_logp, adv, mask = (np.asarray(x, np.float64) for x in (logp, old_logp, adv, mask))
    valid = mask > 0
    n = mask.sum(-1)
    nonempty = n > 0
    delta = np.where(valid, logp - old_logp, 0.0)
    A = adv if adv.ndim == 2 else np.repeat(adv[:, None], mask.shape[1], 1)
    s = np.exp(delta.sum(-1) / np.maximum(n, 1))
    lo, hi = 1 - obj.eps_low, 1 + obj.eps_high
    if obj.ratio_level == "token":
        rho_t = rho = np.exp(delta)
        units = valid
    else:
        rho_t = np.repeat(s[:, None], mask.shape[1], 1)
        rho, units = s, nonempty
    if obj.ratio_level == "geometric":
        low, high = (delta < -obj.eps_low) & (A < 0), (delta > obj.eps_high) & (A > 0)
    elif obj.surrogate in ("dppo_tv", "dppo_kl"):  # outside the trust region, by the sign of A
        kept = verl_family_per_token(np, lambda x: x, obj, logp, old_logp, A, mask) != 0
        low, high = ~kept & (A < 0), ~kept & (A > 0)
    elif obj.surrogate == "kl_cov":  # no clip
        low = high = np.zeros_like(valid)
    elif obj.surrogate in ("clip", "clip_cov"):
        low, high = (rho_t < lo) & (A < 0), (rho_t > hi) & (A > 0)
    elif obj.surrogate == "cispo":  # whatever the sign of A
        low, high = rho_t < lo, rho_t > hi
    else:  # sapo: no clip
        low = high = np.zeros_like(valid)
    low, high = low & valid, high & valid
    out = {
        "clip_frac_low": low.sum() / n.sum(),
        "clip_frac_high": high.sum() / n.sum(),
        "clip_frac": (low | high).sum() / n.sum(),
        "seq_clip_frac": ((low | high).sum(-1)[nonempty] / n[nonempty]).mean(),
        "ratio_mean": rho[units].mean(),
        "ratio_min": rho[units].min(),
        "ratio_max": rho[units].max(),
        "approx_kl": (np.exp(delta) - 1 - delta)[valid].mean(),
    }
    if rollout_logp is None:
        return out
    rollout_logp = np.asarray(rollout_logp, np.float64)
    if obj.rollout_correction is not None:
        c = reference_weight(
            np,
            lambda x: x,
            dataclasses.replace(obj, off_policy_mask=None),
            logp,
            old_logp,
            A,
            mask,
            rollout_logp,
        )
        c_units = c[valid] if obj.rollout_correction.startswith("token") else c[nonempty, 0]
        out.update(
            rollout_is_mean=c_units.mean(),
            rollout_is_min=c_units.min(),
            rollout_is_max=c_units.max(),
            rollout_is_masked_frac=(c[valid] == 0).sum() / n.sum(),
        )
    if obj.off_policy_mask is not None:
        m = reference_weight(
            np,
            lambda x: x,
            dataclasses.replace(obj, rollout_correction=None),
            logp,
            old_logp,
            A,
            mask,
            rollout_logp,
        )
        dropped = (m == 0) & valid
        out["opsm_drop_frac"] = (dropped.sum(-1)[nonempty] / n[nonempty]).mean()
    return out


def reference_value(obj, *arrays):
    arrays64 = [None if a is None else np.asarray(a, np.float64) for a in arrays]
    return float(reference_loss(np, lambda x: x, obj, *arrays64))


def reference_grad(obj, logp, old_logp, adv, mask, ref_logp=None, rollout_logp=None):
    fn = lambda lp: reference_loss(
        jnp,
        jax.lax.stop_gradient,
        obj,
        lp,
        old_logp,
        adv,
        mask,
        ref_logp,
        rollout_logp,
        lp_value=logp,
    )
    return np.asarray(jax.grad(fn)(jnp.asarray(logp)))


# ----------------------------------------------------------------------------- formulas


# drift 1e-4: nothing clips; 1e-3: some responses clip; 0.3: clipped tokens on both sides
@pytest.mark.parametrize("seed, drift", [(3, 1e-4), (6, 1e-3), (3, 0.3)])
@pytest.mark.parametrize("name", PRESETS)
def test_preset_matches_reference_formula(name, seed, drift):
    """Value (float64 reference, rtol 1e-5), gradient and metrics of every preset, with KL."""
    obj = WITH_KL[name]
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=seed, drift=drift)
    loss, metrics, grad = run(obj, logp, old_logp, adv, mask, ref_logp)
    np.testing.assert_allclose(
        loss, reference_value(obj, logp, old_logp, adv, mask, ref_logp), rtol=1e-5
    )
    np.testing.assert_allclose(
        grad, reference_grad(obj, logp, old_logp, adv, mask, ref_logp), rtol=1e-5, atol=1e-8
    )
    for key, want in reference_metrics(obj, logp, old_logp, adv, mask).items():
        np.testing.assert_allclose(metrics[key], want, rtol=1e-4, atol=1e-7, err_msg=key)
    x = np.where(mask > 0, ref_logp - logp, 0.0).astype(np.float64)
    np.testing.assert_allclose(metrics["kl_ref"], (np.exp(x) - x - 1).sum() / mask.sum(), rtol=1e-4)
    if obj.surrogate == "kl_cov":  # k = max(⌊2e-4·N⌋, 1) = 1 token of N = 49
        assert metrics["cov_frac"] * mask.sum() == pytest.approx(1.0)
    if obj.surrogate == "clip_cov":  # at most 1, and 1 when PPO leaves a candidate unclipped
        assert metrics["cov_frac"] * mask.sum() <= 1 + 1e-6
    np.testing.assert_allclose(loss, metrics["pg_loss"] + 0.1 * metrics["kl_loss"], rtol=1e-5)


def test_clipping_happens_in_the_tested_batches():
    """Guards the test above: its batches must exercise both sides of every clip."""
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=3, drift=0.3)
    for name in ("grpo", "gspo", "gspo_token", "gmpo"):
        _, m, _ = run(WITH_KL[name], logp, old_logp, adv, mask, ref_logp)
        assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0, name
        assert 0 < m["seq_clip_frac"] < 1, name


@pytest.mark.parametrize("aggregation", objectives.AGGREGATIONS)
@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_every_aggregation_matches_reference(name, aggregation):
    obj = objectives.get_objective(name, aggregation=aggregation, max_len=20, eps_low=0.1)
    logp, old_logp, adv, mask, _ = make_batch(seed=2, drift=0.1)
    loss, _, grad = run(obj, logp, old_logp, adv, mask)
    np.testing.assert_allclose(loss, reference_value(obj, logp, old_logp, adv, mask), rtol=1e-5)
    np.testing.assert_allclose(
        grad, reference_grad(obj, logp, old_logp, adv, mask), rtol=1e-5, atol=1e-8
    )


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo_token"])
def test_per_token_advantages_match_reference(name):
    obj = objectives.get_objective(name, dual_clip=2.0)
    logp, old_logp, adv, mask, _ = make_batch(seed=3, drift=0.5, per_token_adv=True)
    loss, metrics, grad = run(obj, logp, old_logp, adv, mask)
    np.testing.assert_allclose(loss, reference_value(obj, logp, old_logp, adv, mask), rtol=1e-5)
    np.testing.assert_allclose(
        grad, reference_grad(obj, logp, old_logp, adv, mask), rtol=1e-5, atol=1e-8
    )
    for key, want in reference_metrics(obj, logp, old_logp, adv, mask).items():
        np.testing.assert_allclose(metrics[key], want, rtol=1e-4, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("name", ["gspo", "gmpo"])
def test_dual_clip_on_response_level_ratios_matches_reference(name):
    obj = objectives.get_objective(name, dual_clip=1.05)
    logp, old_logp, adv, mask, _ = make_batch(seed=3, drift=0.5)
    loss, metrics, grad = run(obj, logp, old_logp, adv, mask)
    np.testing.assert_allclose(loss, reference_value(obj, logp, old_logp, adv, mask), rtol=1e-5)
    np.testing.assert_allclose(
        grad, reference_grad(obj, logp, old_logp, adv, mask), rtol=1e-5, atol=1e-8
    )
    assert metrics["dual_clip_frac"] > 0  # the dual clip is active in this batch


@pytest.mark.parametrize("estimator", objectives.KL_ESTIMATORS)
def test_kl_estimators_match_reference(estimator):
    obj = objectives.get_objective("dapo", kl_coef=0.3, kl_estimator=estimator)
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=4)
    loss, _, grad = run(obj, logp, old_logp, adv, mask, ref_logp)
    np.testing.assert_allclose(
        loss, reference_value(obj, logp, old_logp, adv, mask, ref_logp), rtol=1e-5
    )
    np.testing.assert_allclose(
        grad, reference_grad(obj, logp, old_logp, adv, mask, ref_logp), rtol=1e-5, atol=1e-8
    )


# Surrogates beyond PPO's clip, on every ratio level that takes them, with clipping on both sides
# (cispo at PPO-like eps) and per-token advantages; gspo and gspo_token with another surrogate are
# TRL's importance_sampling_level="sequence" with loss_type cispo / sapo.
SURROGATE_CASES = {
    "cispo_eps": (objectives.get_objective("cispo", eps_low=0.2, eps_high=0.28), False),
    "cispo_adv_bt": (objectives.get_objective("cispo", eps_low=0.2, eps_high=0.28), True),
    "sapo_adv_bt": (objectives.get_objective("sapo", tau_pos=2.0, tau_neg=0.5), True),
    "gspo_sapo": (
        dataclasses.replace(objectives.get_objective("gspo"), surrogate="sapo", tau_neg=3.0),
        False,
    ),
    "gspo_token_cispo_adv_bt": (
        dataclasses.replace(
            objectives.get_objective("gspo_token", eps_low=0.1, eps_high=0.1), surrogate="cispo"
        ),
        True,
    ),
}


@pytest.mark.parametrize("case", SURROGATE_CASES)
def test_surrogates_match_reference(case):
    obj, per_token_adv = SURROGATE_CASES[case]
    logp, old_logp, adv, mask, _ = make_batch(seed=3, drift=0.5, per_token_adv=per_token_adv)
    loss, metrics, grad = run(obj, logp, old_logp, adv, mask)
    np.testing.assert_allclose(loss, reference_value(obj, logp, old_logp, adv, mask), rtol=1e-5)
    np.testing.assert_allclose(
        grad, reference_grad(obj, logp, old_logp, adv, mask), rtol=1e-5, atol=1e-8
    )
    for key, want in reference_metrics(obj, logp, old_logp, adv, mask).items():
        np.testing.assert_allclose(metrics[key], want, rtol=1e-4, atol=1e-7, err_msg=key)
    if obj.surrogate == "cispo":  # the clip acts on both sides in these batches
        assert metrics["clip_frac_low"] > 0 and metrics["clip_frac_high"] > 0
    else:
        assert metrics["clip_frac"] == metrics["seq_clip_frac"] == 0.0


# Every rollout correction mode (with a lower bound, so that both bounds act), with a KL term (which
# the weight must not touch); off-policy masking alone and with a correction; on a token-level,
# a response-level and a cispo policy loss, and with per-token advantages.
ROLLOUT_CASES = {
    **{
        f"{name}_{mode}": (
            objectives.get_objective(
                name, kl_coef=0.1, rollout_correction=mode, rollout_is_min=0.5
            ),
            False,
        )
        for name in ("grpo", "gspo")
        for mode in objectives.ROLLOUT_CORRECTIONS
        if mode != "geo_rs"  # a rejection, no weight: in FAMILY_CASES (and the sharding tests)
    },
    "dapo_token_tis_no_min": (
        objectives.get_objective("dapo", rollout_correction="token_tis"),
        False,
    ),
    "grpo_opsm": (objectives.get_objective("grpo", kl_coef=0.1, off_policy_mask=0.1), False),
    "gspo_opsm": (objectives.get_objective("gspo", off_policy_mask=0.1), False),
    "grpo_opsm_adv_bt": (objectives.get_objective("grpo", off_policy_mask=0.1), True),
    "cispo_seq_mis_opsm": (
        objectives.get_objective("cispo", rollout_correction="seq_mis", off_policy_mask=0.1),
        False,
    ),
}


@pytest.mark.parametrize("case", ROLLOUT_CASES)
def test_rollout_correction_and_off_policy_mask_match_reference(case):
    """Value, gradient and metrics, with c and m from rollout_logp, against the float64 formula."""
    obj, per_token_adv = ROLLOUT_CASES[case]
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=7, drift=0.3, per_token_adv=per_token_adv)
    rollout_logp = make_rollout_logp(old_logp, seed=7)
    arrays = (logp, old_logp, adv, mask, ref_logp, rollout_logp)
    loss, metrics, grad = run(obj, *arrays)
    np.testing.assert_allclose(loss, reference_value(obj, *arrays), rtol=1e-5)
    np.testing.assert_allclose(grad, reference_grad(obj, *arrays), rtol=1e-5, atol=1e-8)
    want = reference_metrics(obj, logp, old_logp, adv, mask, rollout_logp)
    for key in want:
        np.testing.assert_allclose(metrics[key], want[key], rtol=1e-4, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(
        loss, metrics["pg_loss"] + obj.kl_coef * metrics["kl_loss"], rtol=1e-5
    )
    # Guards: every bound, mask and drop acts in this batch, and none acts everywhere.
    mode = obj.rollout_correction
    if mode is not None:
        if mode.endswith("mis") or mode == "geo_rs":  # masks (geo_rs: weights 0 or 1)
            assert 0 < metrics["rollout_is_masked_frac"] < 1
            assert metrics["rollout_is_min"] == 0.0
        else:
            assert metrics["rollout_is_masked_frac"] == 0.0
            assert metrics["rollout_is_max"] == pytest.approx(3.0)
            if obj.rollout_is_min is not None:
                assert metrics["rollout_is_min"] == pytest.approx(obj.rollout_is_min)
            else:  # no lower bound: the smallest weight is the smallest ratio
                assert 0 < metrics["rollout_is_min"] < 0.5
    if obj.off_policy_mask is not None:
        assert 0 < metrics["opsm_drop_frac"] < 1
    assert ("rollout_is_mean" in metrics) == (mode is not None)
    assert ("opsm_drop_frac" in metrics) == (obj.off_policy_mask is not None)


def test_rollout_logp_changes_nothing_when_nothing_reads_it():
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=5)
    obj = WITH_KL["grpo"]
    plain = run(obj, logp, old_logp, adv, mask, ref_logp)
    with_rollout = run(obj, logp, old_logp, adv, mask, ref_logp, make_rollout_logp(old_logp))
    assert with_rollout[0] == plain[0] and with_rollout[1] == plain[1]
    np.testing.assert_array_equal(with_rollout[2], plain[2])


def one_row(delta, adv, name, **overrides):
    """loss, metrics, grad of one response with the given per-token log-ratios."""
    logp = np.asarray(delta, np.float32)[None, :]
    obj = objectives.get_objective(name, **overrides)
    adv = np.full((1,), adv, np.float32)
    loss, metrics, grad = run(obj, logp, np.zeros_like(logp), adv, np.ones_like(logp))
    return loss, metrics, grad[0]


def test_hand_checked_grpo_clips_token_by_token():
    # ρ = (1.5, 0.5), A = +1, clip [0.8, 1.2]: L = (−min(1.5, 1.2), −min(0.5, 0.8)) = (−1.2, −0.5);
    # the first token is clipped (zero gradient), the second is not (gradient −ρ/|y| = −0.25).
    loss, m, grad = one_row([math.log(1.5), math.log(0.5)], 1.0, "grpo")
    assert loss == pytest.approx(-0.85, rel=1e-6)
    assert (m["clip_frac_high"], m["clip_frac_low"], m["seq_clip_frac"]) == (0.5, 0.0, 0.5)
    np.testing.assert_allclose(grad, [0.0, -0.25], rtol=1e-6)


def test_hand_checked_dual_clip_caps_negative_advantage_loss():
    # ρ = 5, A = −1: L = −min(−5, −1.2) = 5, dual clip c = 3 caps it at −c·A = 3.
    assert one_row([math.log(5.0)], -1.0, "grpo")[0] == pytest.approx(5.0, rel=1e-6)
    loss, m, grad = one_row([math.log(5.0)], -1.0, "grpo", dual_clip=3.0)
    assert loss == pytest.approx(3.0, rel=1e-6) and m["dual_clip_frac"] == 1.0
    assert grad[0] == 0.0


def test_hand_checked_gspo_sequence_ratio():
    # δ = (0.1, −0.3): s = exp(−0.1) = 0.904837, A = −1, inside [1 − 0.2, 1 + 0.2]: L = s.
    loss, m, grad = one_row([0.1, -0.3], -1.0, "gspo", eps_low=0.2, eps_high=0.2)
    assert loss == pytest.approx(math.exp(-0.1), rel=1e-6)
    np.testing.assert_allclose(grad, [math.exp(-0.1) / 2] * 2, rtol=1e-6)
    # with GSPO's own eps (3e-4) the same response is clipped on the low side
    loss, m, grad = one_row([0.1, -0.3], -1.0, "gspo")
    assert loss == pytest.approx(1 - 3e-4, rel=1e-6) and m["clip_frac_low"] == 1.0
    np.testing.assert_array_equal(grad, [0.0, 0.0])


def test_hand_checked_gspo_without_length_normalisation():
    # δ = (0.1, −0.3), length_norm False: s = exp(0.1 − 0.3) = exp(−0.2), A = −1, inside ±0.2
    # (0.8187 > 0.8): L = s, ∂L/∂δ_t = s for each token (not s / |y|).
    loss, _, grad = one_row([0.1, -0.3], -1.0, "gspo", eps_low=0.2, eps_high=0.2,
                            length_norm=False)  # fmt: skip
    assert loss == pytest.approx(math.exp(-0.2), rel=1e-6)
    np.testing.assert_allclose(grad, [math.exp(-0.2)] * 2, rtol=1e-6)
    # four tokens of δ = −0.1: the mean exp(−0.1) stays inside ±0.2, the product exp(−0.4)
    # leaves it (A = −1: L = max(s, 1 − 0.2) = 0.8, clipped, no gradient)
    kw = dict(eps_low=0.2, eps_high=0.2)
    assert np.abs(one_row([-0.1] * 4, -1.0, "gspo", **kw)[2]).sum() > 0
    loss, m, grad = one_row([-0.1] * 4, -1.0, "gspo", length_norm=False, **kw)
    assert loss == pytest.approx(0.8, rel=1e-6) and m["clip_frac_low"] == 1.0
    np.testing.assert_array_equal(grad, [0.0] * 4)
    with pytest.raises(ValueError, match="length_norm=False drops the 1/"):
        objectives.get_objective("grpo", length_norm=False)


def test_hand_checked_gmpo_sign_aware_log_clip():
    # δ = (0.5, −0.1), eps 0.4. A = +1: δ* = (min(0.5, 0.4), −0.1) → ratio exp(0.15), L = −ratio.
    loss, m, _ = one_row([0.5, -0.1], 1.0, "gmpo")
    assert loss == pytest.approx(-math.exp(0.15), rel=1e-6)
    assert m["clip_frac_high"] == 0.5 and m["ratio_mean"] == pytest.approx(math.exp(0.2), rel=1e-6)
    # A = −1: the high side is not clipped for negative advantages: δ* = δ, L = exp(0.2).
    loss, m, _ = one_row([0.5, -0.1], -1.0, "gmpo")
    assert loss == pytest.approx(math.exp(0.2), rel=1e-6) and m["clip_frac"] == 0.0


def test_hand_checked_dr_grpo_normalises_by_constant_max_len():
    # Two tokens with ρ = 1, A = 1: Σ L = −2, divided by B·max_len = 1·10 (not by |y| = 2).
    loss, _, grad = one_row([0.0, 0.0], 1.0, "dr_grpo", max_len=10)
    assert loss == pytest.approx(-0.2, rel=1e-6)
    np.testing.assert_allclose(grad, [-0.1, -0.1], rtol=1e-6)
    assert one_row([0.0, 0.0], 1.0, "dr_grpo")[0] == pytest.approx(-1.0)  # max_len None: T = 2


def test_hand_checked_cispo_keeps_the_gradient_ppo_clip_zeroes():
    # ρ = (6, 0.5), A = +1. cispo (ρ capped at 5, no lower clip): ℓ = −sg(clip(ρ))·A·logp with
    # logp = δ = (log 6, log 0.5), token-mean over 2 tokens: loss −(5·log 6 + 0.5·log 0.5)/2,
    # gradient −(5, 0.5)/2. PPO's clip (grpo) zeroes the first token's gradient.
    delta = [math.log(6.0), math.log(0.5)]
    loss, m, grad = one_row(delta, 1.0, "cispo")
    assert loss == pytest.approx(-(5 * math.log(6.0) + 0.5 * math.log(0.5)) / 2, rel=1e-6)
    np.testing.assert_allclose(grad, [-2.5, -0.25], rtol=1e-6)
    assert (m["clip_frac_high"], m["clip_frac_low"], m["clip_frac"]) == (0.5, 0.0, 0.5)
    _, _, grad_ppo = one_row(delta, 1.0, "grpo")
    np.testing.assert_allclose(grad_ppo, [0.0, -0.25], rtol=1e-6)
    # with A = −1 the cap still moves ρ = 6: cispo counts it whatever the sign of A
    loss, m, grad = one_row(delta, -1.0, "cispo")
    np.testing.assert_allclose(grad, [2.5, 0.25], rtol=1e-6)
    assert m["clip_frac_high"] == 0.5


def test_hand_checked_sapo_gate():
    # At ρ = 1 the gate (4/τ)·σ(τ(ρ − 1)) is 2/τ with slope 1: loss −2A/τ, gradient −A/|y| per
    # token (the plain policy gradient), with τ = 1 for A > 0 and 1.05 for A < 0.
    loss, m, grad = one_row([0.0, 0.0], 1.0, "sapo")
    assert loss == pytest.approx(-2.0, rel=1e-6) and m["clip_frac"] == 0.0
    np.testing.assert_allclose(grad, [-0.5, -0.5], rtol=1e-6)
    loss, _, grad = one_row([0.0, 0.0], -1.0, "sapo")
    assert loss == pytest.approx(2 / 1.05, rel=1e-6)
    np.testing.assert_allclose(grad, [0.5, 0.5], rtol=1e-6)
    # ρ = e, A = +1: loss −4σ(e − 1); d/dlogp = −4σ'(e − 1)·e, where PPO's clip gives 0.
    sig = 1 / (1 + math.exp(-(math.e - 1)))
    loss, _, grad = one_row([1.0], 1.0, "sapo")
    assert loss == pytest.approx(-4 * sig, rel=1e-6)
    assert grad[0] == pytest.approx(-4 * sig * (1 - sig) * math.e, rel=1e-5)
    assert one_row([1.0], 1.0, "grpo")[2][0] == 0.0


def rows_with_rollout(logp, rollout_logp, adv, name, **overrides):
    """loss, metrics, grad of on-policy responses (old_logp = logp) with the given rollout_logp."""
    logp = np.asarray(logp, np.float32)
    obj = objectives.get_objective(name, **overrides)
    adv = np.asarray(adv, np.float32)
    rollout_logp = np.asarray(rollout_logp, np.float32)
    return run(obj, logp, logp, adv, np.ones_like(logp), rollout_logp=rollout_logp)


def test_hand_checked_seq_mis_masks_a_sequence():
    # Two on-policy responses (ρ = 1, A = +1: ℓ = −1 per token). Response 0: Δ = old − rollout =
    # (log 2, log 2), product 4 > 3: masked (c = 0). Response 1: Δ = (log 2, 0), c = 2.
    # seq-mean-token-mean, R = 2 still: loss = (0 + (−2)) / 2 = −1; gradient −c/(|y|·R).
    logp = np.log(np.full((2, 2), 0.5))
    rollout_logp = logp - np.log([[2.0, 2.0], [2.0, 1.0]])
    loss, m, grad = rows_with_rollout(
        logp, rollout_logp, [1, 1], "grpo", rollout_correction="seq_mis"
    )
    assert loss == pytest.approx(-1.0, rel=1e-6)
    np.testing.assert_allclose(grad, [[0.0, 0.0], [-0.5, -0.5]], rtol=1e-6)
    assert m["rollout_is_masked_frac"] == 0.5
    assert (m["rollout_is_mean"], m["rollout_is_min"], m["rollout_is_max"]) == pytest.approx(
        (1.0, 0.0, 2.0), rel=1e-6
    )
    # seq_tis truncates the 4 to 3 instead: loss = (−3 − 2) / 2
    loss, m, _ = rows_with_rollout(logp, rollout_logp, [1, 1], "grpo", rollout_correction="seq_tis")
    assert loss == pytest.approx(-2.5, rel=1e-6) and m["rollout_is_masked_frac"] == 0.0


def test_hand_checked_opsm_drops_only_negative_advantage_drifted_responses():
    # δ = 0.5; drift_i = mean_t(rollout_logp − logp). Response 0: A < 0, drift (1.5 − 0.3)/2 = 0.6
    # > δ: dropped. Response 1: A < 0, drift (0.9 − 0.3)/2 = 0.3 (one token drifts 0.9, the mean
    # does not): kept. Response 2: A > 0, drift 0.6: kept. Response 3: A > 0, drift 0: kept.
    logp = np.log(np.full((4, 2), 0.5))
    drift = np.array([[1.5, -0.3], [0.9, -0.3], [1.5, -0.3], [0.0, 0.0]])
    adv = [-1.0, -1.0, 1.0, 1.0]
    loss, m, grad = rows_with_rollout(logp, logp + drift, adv, "grpo", off_policy_mask=0.5)
    # on-policy ℓ_i = −A_i: (0 + 1 − 1 − 1) / 4 (R = 4: a dropped response still counts)
    assert loss == pytest.approx(-0.25, rel=1e-6) and m["opsm_drop_frac"] == 0.25
    np.testing.assert_allclose(grad, [[0, 0], [1 / 8, 1 / 8], [-1 / 8, -1 / 8], [-1 / 8, -1 / 8]])
    # neither condition alone drops: without the drift, or with A > 0, nothing is dropped
    for a, d in ((adv, np.zeros_like(drift)), (np.abs(adv), drift)):
        _, m, _ = rows_with_rollout(logp, logp + d, a, "grpo", off_policy_mask=0.5)
        assert m["opsm_drop_frac"] == 0.0


# ----------------------------------------------------------------------------- reference numbers


def test_length_compounding_table():
    """Per-token ratio 1.001: product 1.105 / 1.668 / 7.374 / 148.0, geometric mean 1.0010.

    The quoted 7.374 is 0.1 % below 1.001^2000 = 7.3817 (a rounding slip in the source), so the
    product is checked against the exact powers and against the quoted figures to 0.2 %.
    """
    lengths = np.array([100, 512, 2000, 5000])
    mask = (np.arange(5000)[None, :] < lengths[:, None]).astype(np.float32)
    delta = np.full(mask.shape, math.log(1.001), np.float32)
    log_s = np.asarray(objectives.sequence_log_ratio(jnp.asarray(delta * mask), jnp.asarray(mask)))
    product = np.exp(log_s.astype(np.float64) * lengths)
    np.testing.assert_allclose(product, 1.001**lengths, rtol=1e-4)
    np.testing.assert_allclose(product, [1.105, 1.668, 7.374, 148.0], rtol=2e-3)
    gspo = jax.jit(objectives.get_objective("gspo"))
    _, metrics = gspo(delta, np.zeros_like(delta), np.ones(4, np.float32), mask)
    assert metrics["ratio_min"] == pytest.approx(1.0010, abs=5e-5)
    assert metrics["ratio_max"] == pytest.approx(1.0010, abs=5e-5)


def drifted_response(per_token_ratio, length=1000):
    delta = np.full((1, length), math.log(per_token_ratio), np.float32)
    return delta, np.zeros_like(delta), np.ones_like(delta)


def test_small_drift_compounds_to_49_percent_and_gspo_clip_depends_on_eps():
    """1.0004^1000 ≈ 1.4918; s_i = 1.0004 is clipped at eps 3e-4 and not at eps 0.2."""
    logp, old_logp, mask = drifted_response(1.0004)
    log_s = objectives.sequence_log_ratio(jnp.asarray(logp), jnp.asarray(mask))
    assert math.exp(1000 * float(log_s[0])) == pytest.approx(1.4918, rel=1e-4)
    pos, neg = np.ones(1, np.float32), -np.ones(1, np.float32)
    tight = objectives.get_objective("gspo", eps_low=3e-4, eps_high=3e-4)
    loss, m, grad = run(tight, logp, old_logp, pos, mask)
    assert m["clip_frac"] == 1.0 and m["clip_frac_high"] == 1.0 and m["seq_clip_frac"] == 1.0
    assert loss == pytest.approx(-(1 + 3e-4), rel=1e-6) and not grad.any()
    loose = objectives.get_objective("gspo", eps_low=0.2, eps_high=0.2)
    loss, m, grad = run(loose, logp, old_logp, pos, mask)
    assert m["clip_frac"] == 0.0 and loss == pytest.approx(-1.0004, rel=1e-6) and grad.all()
    # the low side, with the preset's own eps: ratio 0.9996 < 1 − 3e-4, A < 0
    logp, old_logp, mask = drifted_response(1 / 1.0004)
    _, m, _ = run(objectives.get_objective("gspo"), logp, old_logp, neg, mask)
    assert m["clip_frac_low"] == 1.0
    # GRPO with eps 0.2 never clips this drift token by token
    _, m, _ = run(objectives.get_objective("grpo"), logp, old_logp, neg, mask)
    assert m["clip_frac"] == 0.0


def test_k3_single_tokens():
    """π_θ = 0.5, π_ref = 0.4 → 0.023; π_θ = 0.2, π_ref = 0.3 → 0.095; k1: 0.223 and −0.405."""
    logp = np.log(np.array([[0.5], [0.2]], np.float32))
    ref_logp = np.log(np.array([[0.4], [0.3]], np.float32))
    x = jnp.asarray(ref_logp - logp)[:, 0]
    np.testing.assert_allclose(objectives.kl_estimate(x, "k3"), [0.0231, 0.0945], atol=1e-4)
    np.testing.assert_allclose(objectives.kl_estimate(x, "k1"), [0.223, -0.405], atol=1e-3)
    # and through the objective: GRPO adds β·k3, aggregated over the two one-token responses
    zeros, ones = np.zeros(2, np.float32), np.ones((2, 1), np.float32)
    loss, metrics, _ = run(WITH_KL["grpo"], logp, logp, zeros, ones, ref_logp)
    assert metrics["kl_ref"] == pytest.approx((0.0231 + 0.0945) / 2, abs=1e-4)
    assert loss == pytest.approx(0.1 * (0.0231 + 0.0945) / 2, abs=1e-5)


_k3 = jax.jit(functools.partial(objectives.kl_estimate, estimator="k3"))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, (64,), elements=st.floats(-1e9, 1e9, width=32)))
def test_k3_is_never_negative(x):
    assert (np.asarray(_k3(jnp.asarray(x))) >= 0).all()


def test_k3_is_never_negative_near_zero_and_past_the_clamp():
    x = np.concatenate([np.linspace(-1e-3, 1e-3, 2001), [-1e4, 1e4, 1e9, -1e9, 3e38, -3e38]])
    k3 = np.asarray(objectives.kl_estimate(jnp.asarray(x, jnp.float32), "k3"))
    assert (k3 >= 0).all() and np.isfinite(k3).all()


# ----------------------------------------------------------------------------- identities


def test_gspo_token_equals_gspo_when_advantage_is_constant_per_response():
    logp, old_logp, adv, mask, _ = make_batch(seed=6, drift=1e-3)  # some responses clip, some not
    gspo = run(objectives.get_objective("gspo"), logp, old_logp, adv, mask)
    adv_bt = np.repeat(adv[:, None], T, 1)
    for adv_in in (adv, adv_bt):
        tok = run(objectives.get_objective("gspo_token"), logp, old_logp, adv_in, mask)
        np.testing.assert_allclose(tok[0], gspo[0], rtol=1e-6)
        np.testing.assert_allclose(tok[2], gspo[2], rtol=1e-5, atol=1e-9)
    assert 0 < gspo[1]["seq_clip_frac"] < 1


def test_luspo_is_length_times_gspo_per_response():
    """LUSPO's per-response loss is |y_i| × GSPO's, in value and gradient (row by row)."""
    logp, old_logp, adv, mask, _ = make_batch(seed=6, drift=1e-3)
    gspo, luspo = objectives.get_objective("gspo"), objectives.get_objective("luspo")
    for i in np.flatnonzero(mask.sum(-1)):
        row = lambda x, i=i: x[i : i + 1]
        g = run(gspo, *map(row, (logp, old_logp, adv, mask)))
        lu = run(luspo, *map(row, (logp, old_logp, adv, mask)))
        np.testing.assert_allclose(lu[0], mask[i].sum() * g[0], rtol=1e-6)
        np.testing.assert_allclose(lu[2], mask[i].sum() * g[2], rtol=1e-5, atol=1e-9)


def test_on_policy_grpo_gradient_is_the_policy_gradient():
    """logp == old_logp: ∇ = −(1/R) Σ_i (A_i/|y_i|) Σ_t ∇logp_{i,t} (no clip is active)."""
    logp, _, adv, mask, _ = make_batch(seed=7)
    _, metrics, grad = run(objectives.get_objective("grpo"), logp, logp, adv, mask)
    n = mask.sum(-1)
    rows = (n > 0).sum()
    want = -(adv / np.maximum(n, 1))[:, None] * mask / rows
    np.testing.assert_allclose(grad, want, rtol=1e-6)
    assert metrics["clip_frac"] == 0.0 and metrics["ratio_mean"] == 1.0


def test_gmpo_unclipped_is_at_most_grpo_in_magnitude():
    """GMPO's bound: |J_GMPO| ≤ |J_GRPO| per response (geometric ≤ arithmetic mean of ρ·|A|)."""
    logp, old_logp, adv, mask, _ = make_batch(seed=8, drift=0.5)
    gmpo = objectives.get_objective("gmpo", eps_low=1e3, eps_high=1e3)
    grpo = objectives.get_objective("grpo", eps_low=0.999999, eps_high=1e3)
    gm_sum = gr_sum = 0.0
    for i in np.flatnonzero(mask.sum(-1)):
        row = lambda x, i=i: x[i : i + 1]
        gm = abs(run(gmpo, *map(row, (logp, old_logp, adv, mask)))[0])
        gr = abs(run(grpo, *map(row, (logp, old_logp, adv, mask)))[0])
        assert gm <= gr * (1 + 1e-6), i
        gm_sum, gr_sum = gm_sum + gm, gr_sum + gr
    assert gm_sum < gr_sum  # strict for a batch with any spread in the ratios


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("name", PRESETS)
def test_padding_values_change_nothing(name):
    """Huge finite values, inf and NaN under mask 0 (logp, old_logp, ref_logp, advantages)."""
    obj = WITH_KL[name]
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=9, drift=0.1)
    clean = run(obj, logp, old_logp, adv, mask, ref_logp)
    pad = mask == 0
    dirty = [x.copy() for x in (logp, old_logp, ref_logp)]
    for x, junk in zip(dirty, (3e38, -np.inf, np.nan), strict=True):
        x[pad] = junk
    dirty_adv = adv.copy()
    dirty_adv[2] = np.nan  # row 2 is empty
    noisy = run(obj, dirty[0], dirty[1], dirty_adv, mask, dirty[2])
    assert noisy[0] == clean[0]
    assert noisy[1] == clean[1]
    np.testing.assert_array_equal(noisy[2], clean[2])
    assert not noisy[2][pad].any()


def test_padding_values_change_nothing_with_per_token_advantages():
    obj = objectives.get_objective("gspo_token")
    logp, old_logp, adv, mask, _ = make_batch(seed=10, drift=1e-3, per_token_adv=True)
    clean = run(obj, logp, old_logp, adv, mask)
    adv_dirty = np.where(mask > 0, adv, np.nan).astype(np.float32)
    dirty = run(obj, np.where(mask > 0, logp, 1e30).astype(np.float32), old_logp, adv_dirty, mask)
    assert dirty[0] == clean[0]
    np.testing.assert_array_equal(dirty[2], clean[2])


@pytest.mark.parametrize("name", PRESETS)
def test_empty_row_contributes_nothing(name):
    """The batch with an empty row equals the plain formula over the other B − 1 rows."""
    obj = WITH_KL[name]
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=11, drift=0.1)
    assert mask[2].sum() == 0
    loss, metrics, grad = run(obj, logp, old_logp, adv, mask, ref_logp)
    keep = np.arange(B) != 2  # the same batch without the empty row: no empty row left
    sub = [x[keep] for x in (logp, old_logp, adv, mask, ref_logp)]
    np.testing.assert_allclose(loss, reference_value(obj, *sub), rtol=1e-5)
    for key, want in reference_metrics(obj, *sub[:4]).items():
        np.testing.assert_allclose(metrics[key], want, rtol=1e-4, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(grad[keep], reference_grad(obj, *sub), rtol=1e-5, atol=1e-8)
    assert not grad[2].any() and np.isfinite(grad).all()


@pytest.mark.parametrize("name", PRESETS)
def test_all_empty_batch_is_zero_not_nan(name):
    obj = WITH_KL[name]
    logp, old_logp, adv, _, ref_logp = make_batch(seed=12)
    loss, metrics, grad = run(obj, logp, old_logp, adv, np.zeros((B, T), np.float32), ref_logp)
    assert loss == 0.0 and not grad.any()
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert metrics["clip_frac"] == 0.0 and metrics["ratio_mean"] == 1.0


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_wild_log_ratios_give_finite_loss_and_gradient(name, sign):
    """Log-ratios of ±1e4 (and a KL log-ratio of ±1e4) stay finite through the exp clamp."""
    obj = WITH_KL[name]
    logp, old_logp, adv, mask, _ = make_batch(seed=13)
    wild = (old_logp + sign * 1e4 * np.sign(np.arange(B * T).reshape(B, T) % 3 - 1)).astype(
        np.float32
    )
    loss, metrics, grad = run(obj, wild, old_logp, adv, mask, old_logp)
    assert np.isfinite(loss) and np.isfinite(grad).all()
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert metrics["ratio_max"] <= math.exp(20) * (1 + 1e-6)


def test_bf16_inputs_are_upcast():
    logp, old_logp, adv, mask, _ = make_batch(seed=14)
    obj = jax.jit(objectives.get_objective("grpo"))
    loss16, _ = obj(jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old_logp, jnp.bfloat16), adv, mask)
    assert loss16.dtype == jnp.float32
    lp32 = np.asarray(jnp.asarray(logp, jnp.bfloat16).astype(jnp.float32))
    old32 = np.asarray(jnp.asarray(old_logp, jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(float(loss16), float(obj(lp32, old32, adv, mask)[0]), rtol=1e-6)


# ----------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "name, overrides, names_in_message",
    [
        ("ppo", {}, ["grpo", "gspo", "gmpo"]),
        ("gspo", {"epsilon": 0.2}, ["epsilon", "eps_low", "dual_clip"]),
        ("grpo", {"eps_low": 1.0}, ["eps_low", "< 1"]),
        ("grpo", {"eps_low": 1.5}, ["eps_low", "< 1"]),
        ("grpo", {"eps_low": -0.1}, ["eps_low", ">= 0"]),
        ("gspo", {"eps_high": -3e-4}, ["eps_high", ">= 0"]),
        ("grpo", {"eps_high": float("nan")}, ["eps_high"]),
        ("grpo", {"dual_clip": 1.0}, ["dual_clip", "> 1"]),
        ("grpo", {"dual_clip": 0.5}, ["dual_clip", "> 1"]),
        ("grpo", {"aggregation": "mean"}, ["token-mean", "seq-mean-token-sum-norm"]),
        ("grpo", {"kl_estimator": "k4"}, ["k1", "k2", "k3"]),
        ("grpo", {"kl_coef": -0.04}, ["kl_coef", ">= 0"]),
        ("dr_grpo", {"max_len": 0}, ["max_len", ">= 1"]),
        ("sapo", {"tau_pos": 0.0}, ["tau_pos", "> 0"]),
        ("sapo", {"tau_neg": -1.05}, ["tau_neg", "> 0"]),
        ("sapo", {"tau_neg": float("inf")}, ["tau_neg", "finite"]),
        ("cispo", {"eps_low": 1.5}, ["eps_low", "<= 1"]),
        ("cispo", {"dual_clip": 3.0}, ["dual_clip", "cispo", "dual_clip=None"]),
        ("grpo", {"rollout_correction": "tis"}, ["None", "token_tis", "token_mis", "seq_mis"]),
        (
            "grpo",
            {"rollout_correction": "seq_tis", "rollout_is_min": 4.0},
            ["rollout_is_min (4.0)", "rollout_is_max (3.0)", "raise"],
        ),
        ("grpo", {"rollout_is_min": -1.0}, ["rollout_is_min", ">= 0"]),
        ("grpo", {"rollout_is_max": 0.0}, ["rollout_is_max", "> 0"]),
        ("grpo", {"rollout_is_max": None}, ["rollout_is_max", "> 0"]),
        ("gspo", {"off_policy_mask": float("nan")}, ["off_policy_mask", "None"]),
        ("gspo", {"surrogate": "cispo"}, ["surrogate", "off_policy_mask", "tau_pos"]),
        ("grpo", {"clip_cov_ratio": 0.1}, ["clip_cov_ratio", "'clip_cov'", "None"]),
        ("gspo", {"clip_ratio_c": 3.0}, ["clip_ratio_c", "dppo_kl", "dppo_tv", "None"]),
        ("clip_cov", {"clip_cov_ratio": 0.0}, ["clip_cov_ratio", "(0, 1]"]),
        ("clip_cov", {"clip_cov_lb": 6.0}, ["clip_cov_lb", "clip_cov_ub", "(lb, ub)"]),
        ("kl_cov", {"kl_cov_ratio": 2.0}, ["kl_cov_ratio", "(0, 1]"]),
        ("kl_cov", {"ppo_kl_coef": -1.0}, ["ppo_kl_coef", ">= 0"]),
        ("dppo_tv", {"clip_ratio_c": 0.0}, ["clip_ratio_c", "> 0"]),
        ("dppo_kl", {"clip_ratio_c": None}, ["clip_ratio_c", "> 0"]),
        ("grpo", {"delta": 1.1}, ["delta", "1 + eps_high"]),
        ("cispo", {"delta": 4.0}, ["delta", "'cispo'", "delta=None"]),
        ("gmpo", {"delta": 4.0}, ["delta", "'geometric'", "delta=None"]),
        ("grpo", {"top_entropy_quantile": 0.0}, ["top_entropy_quantile", "(0, 1]"]),
        ("grpo", {"entropy_coef": -0.1}, ["entropy_coef", ">= 0"]),
        ("dapo", {"kl_unbiased": True}, ["kl_unbiased", "kl_coef"]),
        ("gmpo", {"log_w_percentiles": 1}, ["log_w_percentiles", "True or False"]),
        ("grpo", {"rollout_correction": "geo"}, ["geo_rs", "token_tis"]),
    ],
)
def test_bad_configuration_raises_naming_valid_choices(name, overrides, names_in_message):
    with pytest.raises(ValueError) as err:
        objectives.get_objective(name, **overrides)
    for word in names_in_message:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "base, change, names_in_message",
    [
        ("gmpo", {"surrogate": "cispo"}, ["geometric", "'clip'", "'token'"]),
        ("gmpo", {"surrogate": "sapo"}, ["geometric", "'clip'", "'sequence_token'"]),
        ("grpo", {"surrogate": "ppo"}, ["clip", "cispo", "sapo"]),
        ("grpo", {"ratio_level": "tokens"}, ["token", "sequence_token", "geometric"]),
        ("gspo", {"surrogate": "dppo_tv", "clip_ratio_c": 3.0}, ["dppo_tv", "'token'"]),
        (
            "gspo",
            {"surrogate": "kl_cov", "kl_cov_ratio": 0.1, "ppo_kl_coef": 1.0},
            ["kl_cov", "'token'", "'sequence'"],
        ),
    ],
)
def test_bad_structure_raises_naming_valid_choices(base, change, names_in_message):
    """The preset structure (ratio level x surrogate) is checked like the overridable fields."""
    with pytest.raises(ValueError) as err:
        dataclasses.replace(objectives.get_objective(base), **change)
    for word in names_in_message:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"rollout_correction": "seq_mis"}, "rollout_correction"),
        ({"rollout_correction": "token_tis"}, "rollout_correction"),
        ({"off_policy_mask": 0.5}, "off_policy_mask"),
    ],
)
def test_correction_or_masking_without_rollout_logp_raises(overrides, field):
    logp, old_logp, adv, mask, _ = make_batch()
    obj = objectives.get_objective("gspo", **overrides)
    for call in (obj, obj.sums):
        with pytest.raises(ValueError) as err:
            call(logp, old_logp, adv, mask)
        for word in ("rollout_logp=", f"{field}=None"):
            assert word in str(err.value)


def test_rollout_logp_of_the_wrong_shape_raises():
    logp, old_logp, adv, mask, _ = make_batch()
    obj = objectives.get_objective("grpo", rollout_correction="token_tis")
    with pytest.raises(ValueError, match=r"rollout_logp.*\(8, 12\)"):
        obj(logp, old_logp, adv, mask, rollout_logp=old_logp[:, :-1])


def test_preset_names_and_overridable_fields_are_derived():
    """One list each: preset names from PRESETS, fields from the Objective dataclass, and the
    config's typed placeholders from those (a new field is overridable with no other edit)."""
    from gspo_jax import config as config_lib

    assert objectives.PRESET_NAMES == tuple(objectives.PRESETS)
    assert {"cispo", "sapo"} <= set(objectives.PRESET_NAMES)
    fields = [f.name for f in dataclasses.fields(objectives.Objective)]
    assert objectives.OVERRIDABLE_FIELDS == tuple(
        f for f in fields if f not in ("name", "ratio_level", "surrogate")
    )
    design = "tau_pos tau_neg rollout_correction rollout_is_min rollout_is_max off_policy_mask"
    assert set(design.split()) <= set(objectives.OVERRIDABLE_FIELDS)
    want_types = {"eps_low": float, "max_len": int, "kl_estimator": str, "dual_clip": float}
    want_types |= {"tau_pos": float, "rollout_correction": str, "rollout_is_min": float}
    assert want_types.items() <= objectives.OVERRIDABLE_FIELD_TYPES.items()
    placeholders = config_lib.objective_placeholders()
    assert set(placeholders.keys()) == set(objectives.OVERRIDABLE_FIELDS)
    for name, typ in objectives.OVERRIDABLE_FIELD_TYPES.items():
        assert placeholders[name] is None
        assert placeholders.get_ref(name).get_type() is typ, name
    # every preset is a valid configuration, with each field at its preset value
    for name in objectives.PRESET_NAMES:
        obj = objectives.get_objective(name)
        assert obj == objectives.get_objective(
            name, **{f: getattr(obj, f) for f in objectives.OVERRIDABLE_FIELDS}
        )


def test_gmpo_eps_are_log_space_bounds():
    """gmpo's eps bound δ in log space, so eps_low >= 1 is valid there (e^−1.5 > 0)."""
    assert objectives.get_objective("gmpo", eps_low=1.5).eps_low == 1.5


@pytest.mark.parametrize(
    "change, names_in_message",
    [
        (lambda a: {**a, "old_logp": a["old_logp"][:, :-1]}, ["old_logp", "(8, 12)"]),
        (lambda a: {**a, "mask": a["mask"][:-1]}, ["mask", "(8, 12)"]),
        (lambda a: {**a, "ref_logp": a["old_logp"].T}, ["ref_logp", "(8, 12)"]),
        (lambda a: {**a, "adv": a["adv"][:-1]}, ["adv", "(8,)", "(8, 12)"]),
        (lambda a: {**a, "adv": a["adv"][:, None]}, ["adv", "(8,)", "(8, 12)"]),
        (lambda a: {**a, "logp": a["logp"][0]}, ["logp", "[B, T]"]),
    ],
)
def test_mismatched_shapes_raise_naming_valid_shapes(change, names_in_message):
    logp, old_logp, adv, mask, ref_logp = make_batch()
    args = change(dict(logp=logp, old_logp=old_logp, adv=adv, mask=mask, ref_logp=ref_logp))
    with pytest.raises(ValueError) as err:
        objectives.get_objective("grpo")(**args)
    for word in names_in_message:
        assert word in str(err.value)


@pytest.mark.parametrize("name", ["gspo", "luspo", "gmpo"])
def test_per_token_advantages_on_a_sequence_ratio_raise(name):
    logp, old_logp, adv, mask, _ = make_batch(per_token_adv=True)
    with pytest.raises(ValueError, match="gspo_token"):
        objectives.get_objective(name)(logp, old_logp, adv, mask)


def test_advantages_tuple_passed_as_adv_raises_with_a_hint():
    logp, old_logp, adv, mask, _ = make_batch()
    with pytest.raises(ValueError, match="group_advantages"):
        objectives.get_objective("grpo")(logp, old_logp, (adv, {}), mask)


def test_objective_is_hashable_and_overrides_compose():
    a = objectives.get_objective("gspo", eps_low=0.2, eps_high=0.2)
    assert a == objectives.get_objective("gspo", eps_high=0.2, eps_low=0.2) and hash(a)
    assert (a.ratio_level, a.aggregation, a.eps_low) == ("sequence", "seq-mean-token-mean", 0.2)
    assert objectives.get_objective("luspo").aggregation == "seq-mean-token-sum"


FLOAT64_CASES = {
    **{name: WITH_KL[name] for name in PRESETS},
    **{case: ROLLOUT_CASES[case][0] for case in ("gspo_seq_mis", "grpo_token_tis", "grpo_opsm")},
}


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_float64_inputs_compute_in_float64(case):
    """With jax_enable_x64, float64 inputs stay float64 end to end (a float64 comparison with
    another implementation must not meet float32 rounding): value to 1e-12, gradient to 1e-10."""
    obj = FLOAT64_CASES[case]
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=3, drift=0.3)
    rollout_logp = make_rollout_logp(old_logp, seed=3)
    arrays = [np.asarray(x, np.float64) for x in (logp, old_logp, adv, mask, ref_logp)]
    rollout = np.asarray(rollout_logp, np.float64)
    uses_rollout = obj.rollout_correction is not None or obj.off_policy_mask is not None
    extra = {"rollout_logp": rollout} if uses_rollout else {}
    with jax.enable_x64(True):

        def loss_of(lp):
            return obj(lp, *arrays[1:4], ref_logp=arrays[4], **extra)[0]

        loss, grad = jax.value_and_grad(loss_of)(jnp.asarray(arrays[0]))
        assert loss.dtype == jnp.float64 and grad.dtype == jnp.float64
        want_grad = reference_grad(obj, *arrays, rollout if uses_rollout else None)
    want = reference_value(obj, *arrays, rollout if uses_rollout else None)
    np.testing.assert_allclose(float(loss), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-10, atol=1e-14)


def test_token_ratio_range_under_a_per_response_ratio():
    """gspo / gmpo also report the token ratios' range (the like-for-like comparison with a
    token-level objective's ratio_min / ratio_max); grpo's ratio_* already are token ratios."""
    from gspo_jax import objectives as obj_lib

    rng = np.random.default_rng(0)
    logp = rng.normal(-1.0, 0.1, (4, 5)).astype(np.float32)
    old = (logp + rng.normal(0.0, 0.05, (4, 5))).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]], "f")
    adv = np.array([1.0, -0.5, 0.3, -1.0], np.float32)
    w = np.exp(logp - old)[mask > 0]
    for name in ("gspo", "gmpo", "luspo"):
        _, m = obj_lib.get_objective(name)(logp, old, adv, mask)
        np.testing.assert_allclose(m["token_ratio_min"], w.min(), rtol=1e-6)
        np.testing.assert_allclose(m["token_ratio_max"], w.max(), rtol=1e-6)
        np.testing.assert_allclose(m["token_ratio_mean"], w.mean(), rtol=1e-6)
    _, m = obj_lib.get_objective("grpo")(logp, old, adv, mask)
    assert "token_ratio_min" not in m
    np.testing.assert_allclose(m["ratio_max"], w.max(), rtol=1e-6)


# ------------------------------------------------------------------------ the rest of the family
# Clip-Cov / KL-Cov / DPPO (verl), two-sided clip δ, high-entropy tokens, entropy bonus, unbiased
# KL (TRL), Geo-RS (verl): each against the float64 transcriptions above (verl_family_per_token,
# trl_high_entropy_mask, reference_weight's geo_rs, reference_loss), value and gradient with
# respect to logp and, where the entropy enters the loss, to the entropy. Several fields share one
# objective (one compile each); the guards check that every one of them acts in the batch.


@functools.cache
def value_and_grads(obj: objectives.Objective, with_ref: bool, with_rollout: bool):
    """Jitted ((loss, metrics), (d/d logp, d/d entropy)) of obj called with entropy=."""

    def fn(lp, entropy, old, adv, mask, *extra):
        ref = extra[0] if with_ref else None
        rollout = extra[-1] if with_rollout else None
        return obj(lp, old, adv, mask, ref, rollout_logp=rollout, entropy=entropy)

    return jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))


def make_entropy(seed=0):
    """[B, T] per-token entropies >= 0, with ties (TRL's >= threshold keeps them all)."""
    rng = np.random.default_rng(seed + 200)
    entropy = rng.exponential(1.0, size=(B, T)).astype(np.float32)
    entropy[0, :3] = entropy[1, 0]  # ties
    return entropy


FAMILY_CASES = {
    # (objective, per-token advantages, guards: metric -> predicate)
    "grpo_delta_entropy_unbiased_kl_geo_rs": (
        objectives.get_objective(
            "grpo",
            kl_coef=0.1,
            kl_unbiased=True,
            delta=1.5,
            entropy_coef=0.05,
            top_entropy_quantile=0.5,
            rollout_correction="geo_rs",
            rollout_is_min=0.95,
            rollout_is_max=1.05,
        ),
        False,
        {
            "delta_clip_frac": lambda v: v > 0,
            "entropy_kept_frac": lambda v: 0.4 < v < 0.6,
            "rollout_is_masked_frac": lambda v: 0 < v < 1,
        },
    ),
    "gspo_entropy_unbiased_kl": (
        objectives.get_objective(
            "gspo",
            eps_low=0.1,
            eps_high=0.1,
            kl_coef=0.1,
            kl_unbiased=True,
            entropy_coef=0.05,
            top_entropy_quantile=0.3,
        ),
        False,
        {"entropy_kept_frac": lambda v: 0.2 < v < 0.4, "clip_frac": lambda v: v > 0},
    ),
    "clip_cov_wide_delta": (
        objectives.get_objective(
            "clip_cov", clip_cov_ratio=0.1, clip_cov_lb=0.05, clip_cov_ub=2.0, delta=2.0
        ),
        True,
        {"cov_frac": lambda v: v > 0, "clip_frac": lambda v: v > 0},
    ),
    "kl_cov_wide_adv_bt": (  # N = 49 response tokens: ⌊0.1·49⌋ = 4 selected
        objectives.get_objective("kl_cov", kl_cov_ratio=0.1, ppo_kl_coef=0.5),
        True,
        {"cov_frac": lambda v: v * 49 == pytest.approx(4)},
    ),
}


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_family_matches_verl_and_trl(case):
    obj, per_token_adv, guards = FAMILY_CASES[case]
    logp, old_logp, adv, mask, ref_logp = make_batch(seed=3, drift=0.5, per_token_adv=per_token_adv)
    rollout_logp = make_rollout_logp(old_logp, seed=3, mismatch=0.3)
    entropy = make_entropy(seed=3)
    with_ref, with_rollout = obj.kl_coef > 0, obj.rollout_correction is not None
    ref = ref_logp if with_ref else None
    rollout = rollout_logp if with_rollout else None
    extra = tuple(x for x in (ref, rollout) if x is not None)
    fn = value_and_grads(obj, with_ref, with_rollout)
    (loss, metrics), (grad, grad_entropy) = fn(logp, entropy, old_logp, adv, mask, *extra)
    metrics = {k: float(v) for k, v in metrics.items()}

    arrays64 = [None if x is None else np.asarray(x, np.float64) for x in (logp, old_logp, adv)]
    args64 = (*arrays64, np.asarray(mask, np.float64), ref, rollout)
    want = reference_loss(np, lambda x: x, obj, *args64, entropy=np.asarray(entropy, np.float64))
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)

    sg = jax.lax.stop_gradient
    fixed = (old_logp, adv, mask, ref, rollout)
    want_grad = jax.grad(
        lambda lp: reference_loss(jnp, sg, obj, lp, *fixed, entropy=entropy, lp_value=logp)
    )(jnp.asarray(logp))
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-8)
    want_grad_entropy = jax.grad(
        lambda h: reference_loss(jnp, sg, obj, jnp.asarray(logp), *fixed, entropy=h, lp_value=logp)
    )(jnp.asarray(entropy))
    np.testing.assert_allclose(np.asarray(grad_entropy), want_grad_entropy, rtol=1e-5, atol=1e-9)
    # the bonus reaches the entropy; without one the entropy has no gradient
    assert (np.abs(np.asarray(grad_entropy)).max() > 0) == (obj.entropy_coef > 0)
    for key, ok in guards.items():
        assert ok(metrics[key]), (key, metrics[key])
    for key, want_m in reference_metrics(obj, logp, old_logp, adv, mask).items():
        np.testing.assert_allclose(metrics[key], want_m, rtol=1e-4, atol=1e-7, err_msg=key)


def run_one_token(name, logp, old_logp, adv, **overrides):
    """loss, metrics, d loss / d logp of a single response token."""
    arrays = [np.full((1, 1), x, np.float32) for x in (logp, old_logp)]
    obj = objectives.get_objective(name, **overrides)
    loss, m, grad = run(obj, *arrays, np.full((1,), adv, np.float32), np.ones((1, 1), np.float32))
    return loss, m, float(grad[0, 0])


def test_hand_checked_dppo_one_token():
    # p_old = 0.5 → p = 0.6, A = +1: TV 0.1 <= 0.15, kept; ℓ = −A·min(ρ, 3)·logp = −1.2·log 0.6,
    # over R·max_len = 1 (seq-mean-token-sum-norm); the gradient is −1.2.
    log = math.log
    loss, m, grad = run_one_token("dppo_tv", log(0.6), log(0.5), 1.0)
    assert loss == pytest.approx(-1.2 * log(0.6), rel=1e-5) and m["clip_frac"] == 0.0
    assert grad == pytest.approx(-1.2, rel=1e-5)
    # p = 0.7: TV 0.2 > 0.15, masked (A > 0: the high side); p = 0.3 with A = −1: the low side
    loss, m, grad = run_one_token("dppo_tv", log(0.7), log(0.5), 1.0)
    assert (loss, grad, m["clip_frac_high"]) == (0.0, 0.0, 1.0)
    _, m, grad = run_one_token("dppo_tv", log(0.3), log(0.5), -1.0)
    assert (grad, m["clip_frac_low"]) == (0.0, 1.0)
    # p_old = 0.05 → p = 0.2: TV 0.15 kept, ρ = 4 truncated at clip_ratio_c = 3
    assert run_one_token("dppo_tv", log(0.2), log(0.05), 1.0)[2] == pytest.approx(-3.0, rel=1e-5)
    # binary KL, threshold 0.05: 0.5 → 0.6 is 0.0204 (kept), 0.5 → 0.7 is 0.0872 (masked); a
    # token whose probability fell is kept whatever its KL when A > 0
    assert run_one_token("dppo_kl", log(0.6), log(0.5), 1.0)[2] == pytest.approx(-1.2, rel=1e-5)
    assert run_one_token("dppo_kl", log(0.7), log(0.5), 1.0)[2] == 0.0
    assert run_one_token("dppo_kl", log(0.1), log(0.5), 1.0)[2] == pytest.approx(-0.2, rel=1e-5)


def test_hand_checked_kl_cov_one_token():
    # N = 1: the one token is the top-1 by covariance (0), ℓ = −ρ·A + 1.0·|δ|, ρ = 1.5, A = 1:
    # loss −1.5 + log 1.5, gradient −ρ + 1 = −0.5 (token-mean over one token).
    loss, m, grad = run_one_token("kl_cov", math.log(1.5), 0.0, 1.0)
    assert loss == pytest.approx(-1.5 + math.log(1.5), rel=1e-5) and m["cov_frac"] == 1.0
    assert grad == pytest.approx(-0.5, rel=1e-5)


def test_hand_checked_all_tokens_clipped_leave_clip_cov_nothing_to_detach():
    # every ρ = 1.5 with A > 0: PPO clips every token, so no token is a Clip-Cov candidate; the
    # loss is the clipped −1.2 and the gradient 0
    logp = np.full((2, 3), math.log(1.5), np.float32)
    obj = objectives.get_objective("clip_cov", clip_cov_lb=-10.0, clip_cov_ratio=0.5)
    adv = np.array([1.0, 2.0], np.float32)
    loss, m, grad = run(obj, logp, np.zeros_like(logp), adv, np.ones_like(logp))
    assert loss == pytest.approx(-1.2 * 1.5, rel=1e-6)
    assert (m["cov_frac"], m["clip_frac_high"]) == (0.0, 1.0) and not grad.any()


def test_hand_checked_delta_caps_the_unclipped_branch():
    # ρ = 5, A = −1: PPO's loss is ρ = 5 (unbounded); δ = 4 caps it at 4, with no gradient
    loss, m, grad = run_one_token("grpo", math.log(5.0), 0.0, -1.0, delta=4.0)
    assert (loss, grad, m["delta_clip_frac"]) == (pytest.approx(4.0, rel=1e-6), 0.0, 1.0)


def test_hand_checked_high_entropy_tokens_and_entropy_bonus():
    # 4 on-policy tokens, A = 1, entropies (0.1, 0.5, 0.9, 0.3): the 0.5-quantile is 0.4, so the
    # tokens with 0.5 and 0.9 train; the token-mean denominator stays 4: gradient −1/4 on them.
    entropy = np.array([[0.1, 0.5, 0.9, 0.3]], np.float32)
    lp = np.zeros((1, 4), np.float32)
    args = (lp, np.ones(1, np.float32), np.ones((1, 4), np.float32))
    obj = objectives.get_objective("dapo", top_entropy_quantile=0.5)
    (loss, m), grads = value_and_grads(obj, False, False)(lp, entropy, lp, *args[1:])
    np.testing.assert_allclose(grads[0], [[0, -0.25, -0.25, 0]])
    assert float(loss) == pytest.approx(-0.5) and float(m["entropy_kept_frac"]) == 0.5
    assert not np.asarray(grads[1]).any()  # the mask is not differentiable
    # the bonus: loss −= 0.1·mean H = 0.1·0.45 (every token, as verl), d/dH = −0.1/4
    obj = objectives.get_objective("dapo", entropy_coef=0.1)
    (loss, m), grads = value_and_grads(obj, False, False)(lp, entropy, lp, *args[1:])
    assert float(loss) == pytest.approx(-1.0 - 0.045, rel=1e-6)
    assert float(m["entropy_loss"]) == pytest.approx(0.45, rel=1e-6)
    np.testing.assert_allclose(grads[1], [[-0.025] * 4], rtol=1e-6)


def test_hand_checked_entropy_of_a_uniform_distribution():
    """The log-prob pass's entropy: log V for uniform logits (a maximum: zero gradient), computed
    chunked (2 chunks of 2 positions for T = 3) and differentiable; random logits give H < log V,
    and the passes that need no entropy skip it with the same log-probs."""
    from gspo_jax.models import logprobs

    V = 7
    tokens = jnp.zeros((1, 3), jnp.int32)
    _, entropy, _ = logprobs.token_logprob_entropy(jnp.zeros((1, 3, V)), tokens)
    np.testing.assert_allclose(entropy, np.full((1, 3), math.log(V)), rtol=1e-6)
    h = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 4)), jnp.float32)

    @jax.jit
    def pass_of(w):  # (Σ H, d Σ H / d w_out, logp, logp without the entropy)
        def total(w):
            return logprobs.chunked_logprobs(h, w, tokens, 1.0, chunk=2)[1].sum()

        logp, _ = logprobs.chunked_logprobs(h, w, tokens, 1.0, chunk=2)
        logp_only, none = logprobs.chunked_logprobs(h, w, tokens, 1.0, chunk=2, with_entropy=False)
        assert none is None
        return (*jax.value_and_grad(total)(w), logp, logp_only)

    total, grad, _, _ = pass_of(jnp.zeros((4, V)))  # w_out = 0: uniform logits
    assert float(total) == pytest.approx(3 * math.log(V), rel=1e-6)
    np.testing.assert_allclose(grad, 0.0, atol=1e-6)
    total, grad, logp, logp_only = pass_of(
        jnp.asarray(np.random.default_rng(1).normal(size=(4, V)), "f")
    )
    assert float(total) < 3 * math.log(V) and np.abs(np.asarray(grad)).max() > 0
    np.testing.assert_array_equal(logp_only, logp)


def test_entropy_missing_raises_naming_the_fix():
    logp, old_logp, adv, mask, _ = make_batch()
    for overrides in ({"entropy_coef": 0.01}, {"top_entropy_quantile": 0.2}):
        obj = objectives.get_objective("grpo", **overrides)
        with pytest.raises(ValueError, match=r"entropy=\[B, T\].*entropy_coef=0"):
            obj(logp, old_logp, adv, mask)
        with pytest.raises(ValueError, match=r"entropy has shape"):
            obj(logp, old_logp, adv, mask, entropy=logp[:, :-1])


def test_masked_quantile_matches_numpy():
    """The high-entropy threshold: numpy's linear quantile of the valid entries, exactly, with
    ties, negative values and ±0 (the float32 path bisects on the bits), and 0 with no entry."""
    fn = jax.jit(objectives.masked_quantile)
    rng = np.random.default_rng(0)
    for trial in range(4):
        x = rng.normal(size=(B, T)).astype(np.float32)
        if trial % 2:
            x = np.round(x, 1)  # ties
        x[0, :2] = (-0.0, 0.0)
        mask = (rng.random((B, T)) < 0.6).astype(np.float32)
        for q in (0.0, 0.37, 0.8, 1.0):
            want = np.quantile(x[mask > 0].astype(np.float64), q)
            assert float(fn(x, mask, q)) == pytest.approx(want, abs=1e-6), (trial, q)
    assert float(fn(x, np.zeros_like(mask), 0.5)) == 0.0


def test_two_stage_top_k_picks_what_one_top_k_picks():
    """The covariance rules' top-k (objectives.top_k_indices): the same indices, in the same order,
    as one lax.top_k over all entries, with ties (the lower index first), -inf entries (the
    non-candidates) and a size that is not a multiple of the block."""
    rng = np.random.default_rng(0)
    n, k = 40 * objectives.TOP_K_BLOCK + 37, 9  # 41 blocks: the two-stage path (4k <= blocks)
    fn = jax.jit(objectives.top_k_indices, static_argnums=1)
    for trial in range(4):
        x = rng.normal(size=n).astype(np.float32)
        if trial % 2:  # ties across blocks, some in blocks a larger entry picks first
            x = rng.integers(0, 4, size=n).astype(np.float32)
            x[rng.choice(np.arange(n // 2, n), size=3, replace=False)] = 10.0
        if trial >= 2:
            x[rng.random(n) < 0.999] = -np.inf  # fewer candidates than k in trial 3's draw
        want = np.asarray(jax.lax.top_k(x, k)[1])
        got = np.asarray(fn(x, k))
        finite = np.isfinite(x[want])
        np.testing.assert_array_equal(got[finite], want[finite], err_msg=str(trial))


def test_benchmark_minimal_transcriptions_equal_the_presets():
    """objectives_bench reads clip_cov's, kl_cov's and dppo_kl's ratios against hand-minimal
    forms of the same losses (experiments/benchmarks/minimal_objectives.py): that reading holds
    only if they compute the same loss and gradient."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "experiments/benchmarks/minimal_objectives.py"
    spec = importlib.util.spec_from_file_location("minimal_objectives", path)
    minimal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(minimal)
    logp, old_logp, adv, mask, _ = make_batch(seed=3)
    adv = np.where(np.arange(B) % 2 == 0, 1.0, -1.0).astype(np.float32)  # ±1: covariances > 1
    for name, fn in minimal.MINIMAL.items():
        loss, metrics, grad = run(objectives.get_objective(name), logp, old_logp, adv, mask)
        want_loss, want_grad = jax.value_and_grad(fn)(logp, old_logp, adv, mask)
        assert loss == pytest.approx(float(want_loss), rel=1e-5, abs=1e-7), name
        np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7, err_msg=name)
        if name != "dppo_kl":  # the covariance rule acted, so the comparison covers it
            assert metrics["cov_frac"] > 0, name


def test_log_w_percentiles_are_the_quarter_decade_edges_and_add_over_parts():
    """log_w_percentiles: each percentile of |δ| over the response tokens is the first edge of
    LOG_W_EDGES with that share of the tokens at or below it (computed here with numpy), the
    same from the Sums of two halves of the batch combined, and the loss is unchanged."""
    logp, old_logp, adv, mask, _ = make_batch(seed=5, drift=0.3)
    logp[0, :3] = old_logp[0, :3] + np.array([0.0, 2e-5, 80.0], np.float32)  # first / last bins
    plain = objectives.get_objective("gmpo")
    obj = dataclasses.replace(plain, log_w_percentiles=True)
    loss, metrics, grad = run(obj, logp, old_logp, adv, mask)
    want_loss, _, want_grad = run(plain, logp, old_logp, adv, mask)
    assert loss == want_loss
    np.testing.assert_array_equal(grad, want_grad)
    x = np.sort(np.abs(logp - old_logp)[mask > 0])
    edges = np.asarray(objectives.LOG_W_EDGES, np.float32)
    halves = [
        obj.sums(*[a[rows] for a in (logp, old_logp, adv, mask)])
        for rows in (slice(0, 4), slice(4, None))
    ]
    combined = halves[0].combine(halves[1]).finalize()[1]
    for q in objectives.LOG_W_PERCENTILES:
        want = edges[np.argmax([np.sum(x <= e) >= q * x.size for e in edges])]
        assert metrics[f"abs_log_w_p{round(q * 100)}"] == want, q
        assert float(combined[f"abs_log_w_p{round(q * 100)}"]) == want, q
    assert metrics["abs_log_w_p99"] == np.inf  # 80 is past the last finite edge (10^1.75)
    empty = obj(logp, old_logp, adv, np.zeros_like(mask))[1]
    assert float(empty["abs_log_w_p50"]) == 0.0
    # a NaN |δ| is below no edge: the percentiles it decides are NaN, not the first edge
    below = np.array([0.0] * (len(edges) - 1) + [1.0], np.float32)  # 1 of 2 tokens below inf
    got = objectives.log_w_percentiles_from_counts(below, np.float32(2.0))
    assert float(got["abs_log_w_p50"]) == np.inf and np.isnan(float(got["abs_log_w_p99"]))
