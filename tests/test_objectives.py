"""Tests of gspo_jax.objectives against docs/objectives.md: formulas, reference numbers,
numerics (padding, empty rows, wild ratios) and bad arguments.

Dimension legend: B response rows, T padded response length. Shapes stay small and fixed, and the
jitted loss-and-gradient functions are cached per objective, so each compiles once.
"""

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
def value_and_grad(obj: objectives.Objective, with_ref: bool):
    """Jitted ((loss, metrics), d loss / d logp) of obj; cached so each objective compiles once."""
    if with_ref:
        fn = lambda lp, old, adv, mask, ref: obj(lp, old, adv, mask, ref)
    else:
        fn = lambda lp, old, adv, mask: obj(lp, old, adv, mask)
    return jax.jit(jax.value_and_grad(fn, has_aux=True))


def run(obj, logp, old_logp, adv, mask, ref_logp=None):
    args = (logp, old_logp, adv, mask) + (() if ref_logp is None else (ref_logp,))
    (loss, metrics), grad = value_and_grad(obj, ref_logp is not None)(*args)
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


# ----------------------------------------------------------------------------- reference
# An independent, deliberately plain transcription of docs/objectives.md. It runs in numpy float64
# (values) and in jax float32 (gradients, with real stop-gradients).


def reference_loss(xp, sg, obj, logp, old_logp, adv, mask, ref_logp=None):
    valid = mask > 0
    n = mask.sum(-1)  # |y_i|
    rows = (n > 0).sum()
    delta = xp.where(valid, logp - old_logp, 0.0)
    A = adv if adv.ndim == 2 else adv[:, None] * xp.ones_like(mask)
    A_i = adv if adv.ndim == 1 else None
    lo, hi = 1 - obj.eps_low, 1 + obj.eps_high

    def clamped_exp(x):
        return xp.exp(xp.clip(x, -20.0, 20.0))

    def surrogate(rho, a):
        loss = -xp.minimum(rho * a, xp.clip(rho, lo, hi) * a)
        if obj.dual_clip is not None:
            loss = xp.where(a < 0, xp.minimum(loss, -obj.dual_clip * a), loss)
        return loss

    log_s = delta.sum(-1) / xp.maximum(n, 1.0)
    if obj.ratio_level == "token":
        per_token = surrogate(clamped_exp(delta), A)
    elif obj.ratio_level == "sequence":
        per_token = surrogate(clamped_exp(log_s), A_i)[:, None] * xp.ones_like(mask)
    elif obj.ratio_level == "sequence_token":
        log_s_it = logp - sg(logp) + sg(log_s)[:, None]
        per_token = surrogate(clamped_exp(log_s_it), A)
    else:  # geometric
        sigma = xp.sign(A_i)[:, None]
        d_star = sigma * xp.minimum(
            sigma * delta, sigma * xp.clip(delta, -obj.eps_low, obj.eps_high)
        )
        ratio = clamped_exp(xp.where(valid, d_star, 0.0).sum(-1) / xp.maximum(n, 1.0))
        L = -A_i * ratio
        if obj.dual_clip is not None:
            L = xp.where(A_i < 0, xp.minimum(L, -obj.dual_clip * A_i), L)
        per_token = L[:, None] * xp.ones_like(mask)
    if ref_logp is not None:
        x = xp.where(valid, ref_logp - logp, 0.0)
        kl = {"k1": -x, "k2": x**2 / 2, "k3": xp.exp(x) - x - 1}[obj.kl_estimator]
        per_token = per_token + obj.kl_coef * kl
    per_token = xp.where(valid, per_token, 0.0)
    max_len = obj.max_len or mask.shape[1]
    if obj.aggregation == "seq-mean-token-mean":
        return (per_token.sum(-1) / xp.maximum(n, 1.0)).sum() / rows
    if obj.aggregation == "token-mean":
        return per_token.sum() / n.sum()
    if obj.aggregation == "seq-mean-token-sum":
        return per_token.sum() / rows
    return per_token.sum() / (rows * max_len)


def reference_metrics(obj, logp, old_logp, adv, mask):
    """Clip fractions and ratio statistics, float64, written per unit as the docs state them."""
    logp, old_logp, adv, mask = (np.asarray(x, np.float64) for x in (logp, old_logp, adv, mask))
    valid = mask > 0
    n = mask.sum(-1)
    delta = np.where(valid, logp - old_logp, 0.0)
    A = adv if adv.ndim == 2 else np.repeat(adv[:, None], mask.shape[1], 1)
    s = np.exp(delta.sum(-1) / np.maximum(n, 1))
    if obj.ratio_level == "token":
        rho, units = np.exp(delta), valid
        low, high = (rho < 1 - obj.eps_low) & (A < 0), (rho > 1 + obj.eps_high) & (A > 0)
    elif obj.ratio_level == "geometric":
        rho, units = s, n > 0
        low, high = (delta < -obj.eps_low) & (A < 0), (delta > obj.eps_high) & (A > 0)
    else:
        rho, units = s, n > 0
        s_t = np.repeat(s[:, None], mask.shape[1], 1)
        low, high = (s_t < 1 - obj.eps_low) & (A < 0), (s_t > 1 + obj.eps_high) & (A > 0)
    low, high = low & valid, high & valid
    nonempty = n > 0
    return {
        "clip_frac_low": low.sum() / n.sum(),
        "clip_frac_high": high.sum() / n.sum(),
        "clip_frac": (low | high).sum() / n.sum(),
        "seq_clip_frac": ((low | high).sum(-1)[nonempty] / n[nonempty]).mean(),
        "ratio_mean": rho[units].mean(),
        "ratio_min": rho[units].min(),
        "ratio_max": rho[units].max(),
        "approx_kl": (np.exp(delta) - 1 - delta)[valid].mean(),
    }


def reference_value(obj, *arrays):
    arrays64 = [None if a is None else np.asarray(a, np.float64) for a in arrays]
    return float(reference_loss(np, lambda x: x, obj, *arrays64))


def reference_grad(obj, logp, old_logp, adv, mask, ref_logp=None):
    fn = lambda lp: reference_loss(
        jnp, jax.lax.stop_gradient, obj, lp, old_logp, adv, mask, ref_logp
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
    ],
)
def test_bad_configuration_raises_naming_valid_choices(name, overrides, names_in_message):
    with pytest.raises(ValueError) as err:
        objectives.get_objective(name, **overrides)
    for word in names_in_message:
        assert word in str(err.value)


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
