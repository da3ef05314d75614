"""Tests of gspo_jax.advantages: the documented worked examples, exact zeros for flat groups, the
estimators' formulas, and bad arguments.

Dimension legend: P prompts, G group size, B = P·G rewards (group-contiguous).
"""

import jax
import numpy as np
import pytest

from gspo_jax import advantages


def adv_of(rewards, group_size, **kw):
    adv, metrics = advantages.group_advantages(np.asarray(rewards, np.float32), group_size, **kw)
    return np.asarray(adv), {k: float(v) for k, v in metrics.items()}


def test_std_normalisation_worked_examples():
    """[1]*7 + [0.9] → +0.38 (seven), −2.65; [1] + [0]*7 → +2.65, −0.38 (population std)."""
    adv, _ = adv_of([1, 1, 1, 1, 1, 1, 1, 0.9], 8)
    np.testing.assert_allclose(adv, [0.378] * 7 + [-2.646], atol=1e-3)
    adv, _ = adv_of([1, 0, 0, 0, 0, 0, 0, 0], 8)
    np.testing.assert_allclose(adv, [2.646] + [-0.378] * 7, atol=1e-3)
    assert round(float(adv[0]), 2) == 2.65 and round(float(adv[1]), 2) == -0.38


def test_grpo_is_invariant_to_affine_reward_changes():
    """(r − μ)/σ ignores r → a·r + b: a 0.1 gap gets the signal of the only correct answer."""
    small_gap, _ = adv_of([1, 1, 1, 1, 1, 1, 1, 0.9], 8)
    only_correct, _ = adv_of([0, 0, 0, 0, 0, 0, 0, 1], 8)
    np.testing.assert_allclose(small_gap, -only_correct, rtol=1e-4)
    dr_small, _ = adv_of([1, 1, 1, 1, 1, 1, 1, 0.9], 8, estimator="dr_grpo")
    dr_only, _ = adv_of([0, 0, 0, 0, 0, 0, 0, 1], 8, estimator="dr_grpo")
    np.testing.assert_allclose(dr_small * 10, -dr_only, rtol=1e-4)  # Dr. GRPO keeps the scale


@pytest.mark.parametrize("estimator", advantages.GROUP_ESTIMATORS)
def test_flat_groups_get_exactly_zero_and_are_counted(estimator):
    # 0.1 and 0.7 are not exact in float32: r − mean(r) would leave rounding residue.
    rewards = [0.1] * 4 + [0.7] * 4 + [0.0, 1.0, 0.0, 0.5] + [1.0] * 4
    adv, metrics = adv_of(rewards, 4, estimator=estimator)
    flat = np.r_[0:8, 12:16]
    assert (adv[flat] == 0.0).all()
    assert np.isfinite(adv).all() and (adv[8:12] != 0).any()
    assert metrics["frac_zero_std_groups"] == 0.75


def test_estimator_formulas():
    r = np.array([0.0, 1.0, 0.5, 0.5, 2.0, 0.0], np.float32)  # two groups of 3
    groups = r.reshape(2, 3)
    mean = groups.mean(1, keepdims=True)
    want_grpo = ((groups - mean) / (groups.std(1, keepdims=True) + 1e-6)).ravel()
    want_dr = (groups - mean).ravel()
    want_rloo = (groups - (groups.sum(1, keepdims=True) - groups) / 2).ravel()
    np.testing.assert_allclose(adv_of(r, 3)[0], want_grpo, rtol=1e-5)
    np.testing.assert_allclose(adv_of(r, 3, estimator="dr_grpo")[0], want_dr, rtol=1e-6)
    np.testing.assert_allclose(adv_of(r, 3, estimator="rloo")[0], want_rloo, rtol=1e-6)
    np.testing.assert_allclose(want_rloo, 1.5 * want_dr, rtol=1e-6)  # rloo = G/(G−1)·dr_grpo


def test_std_options_bessel_and_eps():
    r = np.array([0.0, 1.0, 1.0, 1.0], np.float32)
    want = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(adv_of(r, 4, std_ddof=1, eps=1e-4)[0], want, rtol=1e-5)
    assert not np.allclose(adv_of(r, 4, std_ddof=1)[0], adv_of(r, 4)[0])


def test_metrics_and_return_form():
    out = advantages.group_advantages(np.array([1.0, 0.0, 1.0, 1.0], np.float32), 2)
    adv, metrics = out  # unpacks as a pair
    assert out.adv is adv and out.metrics is metrics and adv.shape == (4,)
    assert set(metrics) == {"frac_zero_std_groups", "reward_mean", "reward_std"}
    assert float(metrics["frac_zero_std_groups"]) == 0.5
    assert float(metrics["reward_mean"]) == 0.75
    assert float(metrics["reward_std"]) == pytest.approx(0.25)  # (0.5 + 0) / 2


def test_jittable_with_static_options():
    fn = jax.jit(advantages.group_advantages, static_argnums=(1, 2))
    adv, metrics = fn(np.array([1.0, 0.0, 2.0, 2.0], np.float32), 2, "rloo")
    np.testing.assert_allclose(adv, [1.0, -1.0, 0.0, 0.0])
    assert float(metrics["frac_zero_std_groups"]) == 0.5


@pytest.mark.parametrize("estimator", advantages.ESTIMATORS)
def test_group_size_one_raises_naming_the_fix(estimator):
    with pytest.raises(ValueError, match=r"group_size=1.*G >= 2"):
        advantages.group_advantages(np.ones(4, np.float32), 1, estimator=estimator)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rewards=np.ones(10, np.float32), group_size=4), "not a multiple of group_size=4"),
        (dict(rewards=np.ones((2, 4), np.float32), group_size=4), r"reshape\(-1\)"),
        (
            dict(rewards=np.ones(8, np.float32), group_size=4, estimator="ppo"),
            "grpo.*dr_grpo.*rloo",
        ),
        (dict(rewards=np.ones(8, np.float32), group_size=0), "group_size"),
        (dict(rewards=np.ones(8, np.float32), group_size=4.0), "group_size"),
        (dict(rewards=np.ones(8, np.float32), group_size=4, eps=-1.0), "eps"),
        (dict(rewards=np.ones(8, np.float32), group_size=4, std_ddof=2), "std_ddof"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        advantages.group_advantages(**kwargs)


# ----------------------------------------------------------------------------- REINFORCE++, scale


def verl_reinforce_pp(token_level_rewards, response_mask, gamma=1.0):
    """verl's compute_reinforce_plus_plus_outcome_advantage, transcribed in numpy float64."""
    returns = np.zeros_like(token_level_rewards)
    running_return = 0.0
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]  # reset after EOS
    return verl_masked_whiten(returns, response_mask) * response_mask


def verl_reinforce_pp_baseline(token_level_rewards, response_mask, group_size):
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage (contiguous groups)."""
    scores = token_level_rewards.sum(-1)
    groups = scores.reshape(-1, group_size)
    scores = (groups - groups.mean(1, keepdims=True)).reshape(-1)
    scores = scores[:, None] * response_mask
    return verl_masked_whiten(scores, response_mask) * response_mask


def verl_masked_whiten(values, mask):
    """verl.utils.torch_functional.masked_whiten (masked mean, Bessel-corrected masked var)."""
    mean = (values * mask).sum() / (mask.sum() + 1e-8)
    var = ((values - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8)
    var = var * mask.sum() / (mask.sum() - 1)
    return (values - mean) / np.sqrt(var + 1e-8)


def token_batch(seed=0, P=3, G=4, T=6):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, P * G)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
    rewards = rng.integers(0, 2, P * G).astype(np.float64)
    rewards[:G] = 1.0  # one flat group
    last = np.zeros_like(mask)
    last[np.arange(P * G), lengths - 1] = 1.0
    return rewards, mask, rewards[:, None] * last, G


def test_reinforce_pp_matches_verl():
    rewards, mask, token_rewards, G = token_batch()
    kl = np.random.default_rng(1).normal(0, 0.1, mask.shape) * mask  # e.g. kl_in_reward
    for r, want in (
        (rewards, verl_reinforce_pp(token_rewards, mask)),  # outcome reward on the last token
        (token_rewards - kl, verl_reinforce_pp(token_rewards - kl, mask)),  # per-token rewards
    ):
        adv, _ = adv_of(r, G, estimator="reinforce_pp", mask=mask)
        np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
    adv, _ = adv_of(rewards, G, estimator="reinforce_pp_baseline", mask=mask)
    np.testing.assert_allclose(
        adv, verl_reinforce_pp_baseline(token_rewards, mask, G), rtol=1e-5, atol=1e-6
    )
    assert adv.shape == mask.shape


def test_reinforce_pp_flat_group_follows_verl_and_is_hand_checkable():
    # Two groups of 2, one token each: rewards (1, 1 | 1, 0). The baseline estimator subtracts the
    # group mean (0, 0 | 0.5, −0.5), then whitens over the 4 tokens (mean 0, Bessel var 1/6):
    # the flat group stays 0, the other gets ±0.5·√6. Plain REINFORCE++ whitens the rewards
    # themselves (mean 0.75, var 1/4): the flat group is not 0 but +0.5.
    r = np.array([1.0, 1.0, 1.0, 0.0])
    mask = np.ones((4, 1))
    adv, m = adv_of(r, 2, estimator="reinforce_pp_baseline", mask=mask)
    np.testing.assert_allclose(adv[:, 0], [0, 0, 0.5 * 6**0.5, -0.5 * 6**0.5], rtol=1e-5)
    adv, m = adv_of(r, 2, estimator="reinforce_pp", mask=mask)
    np.testing.assert_allclose(adv[:, 0], [0.5, 0.5, 0.5, -1.5], rtol=1e-5)
    assert m["frac_zero_std_groups"] == 0.5


def test_scale_rewards_batch_and_none_match_trl():
    """TRL: advantages = r − group mean, divided by the batch std ("batch"), the group std
    ("group") or nothing ("none"); a flat group is 0 in every mode."""
    r = np.array([0.0, 1.0, 0.5, 0.5, 2.0, 0.0, 1.0, 1.0, 1.0], np.float64)  # 3 groups of 3
    g = r.reshape(3, 3)
    centred = (g - g.mean(1, keepdims=True)).ravel()
    want_batch = centred / (r.std(ddof=1) + 1e-4)
    got, _ = adv_of(r, 3, scale_rewards="batch", std_ddof=1, eps=1e-4)
    np.testing.assert_allclose(got, want_batch, rtol=1e-5)
    np.testing.assert_allclose(adv_of(r, 3, scale_rewards="none")[0], centred, rtol=1e-6)
    np.testing.assert_allclose(
        adv_of(r, 3, scale_rewards="none")[0], adv_of(r, 3, estimator="dr_grpo")[0]
    )
    assert (got[6:] == 0).all()


def test_token_rewards_sum_over_the_response_for_group_estimators():
    rewards, mask, token_rewards, G = token_batch(seed=2)
    shaped = token_rewards - 0.05 * mask  # a per-token penalty: r_i − 0.05·|y_i|
    got, _ = adv_of(shaped, G, estimator="rloo", mask=mask)
    np.testing.assert_allclose(
        got, adv_of(rewards - 0.05 * mask.sum(-1), G, estimator="rloo")[0], rtol=1e-5
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(estimator="reinforce_pp"), r"mask=\[B, T\]"),
        (dict(scale_rewards="global"), "group.*batch.*none"),
        (dict(estimator="rloo", scale_rewards="batch"), "estimator 'grpo'"),
        (dict(mask=np.ones((4, 3))), "mask must be"),
    ],
)
def test_bad_reinforce_pp_and_scale_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        advantages.group_advantages(np.ones(8, np.float32), 4, **kwargs)
