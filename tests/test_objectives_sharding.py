"""Global normalisation: a minibatch's loss, gradient and metrics are the same computed at once,
as k micro-batches with gradient accumulation, or sharded over the 8 simulated CPU devices
(plain jit with batch-sharded inputs, and shard_map combining per-shard Sums with psum).

Every preset is checked but the two whose covariance rule is a batch-level statistic (clip_cov,
kl_cov: per call, as docs/objectives.md says; test_covariance_rules_are_per_call), and objectives
with rollout correction and off-policy sequence masking (whose weight statistics combine by sum,
min and max), and with the two-sided clip, the unbiased KL and Geo-RS. Every case is passed
rollout_logp: it changes nothing where nothing reads it.

Dimension legend: B response rows, T padded response length. B = 16 puts 2 rows on each of the
8 devices; rows 2 and 3 are empty, so one whole shard (and one micro-batch) has no token at all.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gspo_jax import objectives

B, T = 16, 8
NUM_DEVICES = 8
# The presets whose token selection is a statistic of the call's rows (not combined by Sums).
BATCH_LEVEL = ("clip_cov", "kl_cov")
# name -> objective: every other preset with a KL term (and a dual clip where its surrogate has
# one), and rollout corrections and off-policy masking on a token-level, a response-level and a
# cispo loss.
CASES = {
    name: objectives.get_objective(
        name,
        kl_coef=0.1,
        dual_clip=3.0 if objectives.PRESETS[name]["surrogate"] == "clip" else None,
    )
    for name in objectives.PRESET_NAMES
    if name not in BATCH_LEVEL
}
CASES |= {
    "grpo_token_mis_opsm": objectives.get_objective(
        "grpo", kl_coef=0.1, rollout_correction="token_mis", rollout_is_min=0.5, off_policy_mask=0.1
    ),
    "gspo_seq_mis_opsm": objectives.get_objective(
        "gspo", rollout_correction="seq_mis", rollout_is_min=0.5, off_policy_mask=0.1
    ),
    "cispo_seq_tis": objectives.get_objective(
        "cispo", rollout_correction="seq_tis", rollout_is_min=0.5
    ),
    "grpo_delta_unbiased_kl_geo_rs": objectives.get_objective(
        "grpo",
        kl_coef=0.1,
        kl_unbiased=True,
        delta=1.5,
        rollout_correction="geo_rs",
        rollout_is_min=0.9,
        rollout_is_max=1.1,
    ),
}


def make_batch(seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.array([8, 5, 0, 0, 1, 8, 3, 7, 2, 6, 4, 8, 1, 5, 7, 3])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    old_logp = -rng.exponential(1.0, size=(B, T)).astype(np.float32)
    logp = (old_logp + rng.normal(0.0, 0.3, size=(B, T))).astype(np.float32)
    ref_logp = (old_logp + rng.normal(0.0, 0.2, size=(B, T))).astype(np.float32)
    adv = rng.normal(size=B).astype(np.float32)
    rollout_logp = (old_logp + rng.normal(0.0, 0.5, size=(B, T))).astype(np.float32)
    return logp, old_logp, adv, mask, ref_logp, rollout_logp


def objective(name):
    return CASES[name]


def call(obj, logp, old_logp, adv, mask, ref_logp, rollout_logp):
    return obj(logp, old_logp, adv, mask, ref_logp, rollout_logp=rollout_logp)


@functools.cache
def unsharded(name):
    obj = objective(name)
    return jax.jit(jax.value_and_grad(functools.partial(call, obj), has_aux=True))


def reference(name, batch):
    (loss, metrics), grad = unsharded(name)(*batch)
    return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad)


def assert_same(got, want):
    loss, metrics, grad = got
    np.testing.assert_allclose(loss, want[0], rtol=1e-5, atol=1e-7)
    assert metrics.keys() == want[1].keys()
    for key in metrics:
        np.testing.assert_allclose(metrics[key], want[1][key], rtol=1e-5, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(grad, want[2], rtol=1e-5, atol=1e-8)


@pytest.fixture(scope="module")
def mesh():
    assert len(jax.devices()) >= NUM_DEVICES, "tests/conftest.py provides 8 CPU devices"
    return jax.make_mesh((NUM_DEVICES,), ("data",))


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_seq_mis_opsm"])
def test_jit_with_batch_sharded_inputs_equals_unsharded(name, mesh):
    batch = make_batch(seed=1)
    rows = NamedSharding(mesh, P("data"))
    sharded = [jax.device_put(x, rows) for x in batch]
    (loss, metrics), grad = unsharded(name)(*sharded)
    assert grad.sharding.is_equivalent_to(rows, 2)
    got = (float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad))
    assert_same(got, reference(name, batch))


@functools.cache
def shard_mapped(name, mesh):
    """loss of the whole batch from per-shard Sums combined with Sums.psum, and its gradient."""
    obj = objective(name)

    def per_shard(logp, old_logp, adv, mask, ref_logp, rollout_logp):
        sums = obj.sums(logp, old_logp, adv, mask, ref_logp, rollout_logp=rollout_logp)
        return sums.psum("data").finalize()

    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("data"),) * 6, out_specs=P())
    return jax.jit(jax.value_and_grad(fn, has_aux=True))


@pytest.mark.parametrize("name", CASES)
def test_shard_map_with_psum_of_sums_equals_unsharded(name, mesh):
    batch = make_batch(seed=2)
    sharded = [jax.device_put(x, NamedSharding(mesh, P("data"))) for x in batch]
    (loss, metrics), grad = shard_mapped(name, mesh)(*sharded)
    got = (float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad))
    assert_same(got, reference(name, batch))


@functools.cache
def micro_step(name):
    """Sums of one micro-batch, and the gradient of its num / (the minibatch's den)."""
    obj = objective(name)

    def step(logp, old_logp, adv, mask, ref_logp, rollout_logp, total_den):
        def scaled_num(lp):
            sums = obj.sums(lp, old_logp, adv, mask, ref_logp, rollout_logp=rollout_logp)
            return sums.num / jnp.maximum(total_den, 1.0), sums

        return jax.grad(scaled_num, has_aux=True)(logp)[::-1]

    return jax.jit(step)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("num_micro", [4])
def test_micro_batches_with_gradient_accumulation_equal_the_minibatch(name, num_micro):
    obj = objective(name)
    batch = make_batch(seed=3)
    parts = [np.split(x, num_micro) for x in batch]  # micro-batch k: rows [4k, 4k + 4)
    micro = [tuple(p[k] for p in parts) for k in range(num_micro)]
    total_den = sum(obj.denominator(m[3]) for m in micro)  # from the masks, before any forward
    sums, grads = zip(*(micro_step(name)(*m, total_den) for m in micro), strict=True)
    loss, metrics = functools.reduce(objectives.Sums.combine, sums).finalize()
    got = (float(loss), {k: float(v) for k, v in metrics.items()}, np.concatenate(grads))
    assert_same(got, reference(name, batch))
    assert float(micro[0][3][2:4].sum()) == 0  # micro-batch 0 holds the two empty rows
    # a scanned loop returns stacked Sums: reduce_stacked gives the same combination
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *sums)
    loss2, metrics2 = stacked.reduce_stacked().finalize()
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)
    assert {k: float(v) for k, v in metrics2.items()} == pytest.approx(got[1], rel=1e-6)


def test_a_micro_batch_mean_of_means_would_differ():
    """Guard: the equality above is not trivial; averaging per-micro-batch losses is wrong."""
    batch = make_batch(seed=3)
    parts = [np.split(x, 4) for x in batch]
    sums = [micro_step("grpo")(*(p[k] for p in parts), 1.0)[0] for k in range(4)]
    losses = [float(s.num / jnp.maximum(s.den, 1.0)) for s in sums]  # each micro-batch's own mean
    assert abs(np.mean(losses) - reference("grpo", batch)[0]) > 1e-3


def test_denominator_matches_aggregation():
    mask = make_batch()[3]
    rows, tokens = (mask.sum(-1) > 0).sum(), mask.sum()
    want = {
        "grpo": rows,  # seq-mean-token-mean: non-empty responses
        "dapo": tokens,  # token-mean
        "luspo": rows,  # seq-mean-token-sum
        "dr_grpo": rows * T,  # seq-mean-token-sum-norm, max_len None -> padded T
    }
    for name, den in want.items():
        assert float(objectives.get_objective(name).denominator(mask)) == den, name
    assert float(objectives.get_objective("dr_grpo", max_len=100).denominator(mask)) == rows * 100


@pytest.mark.parametrize("name", ["grpo_token_mis_opsm", "gspo_seq_mis_opsm", "cispo_seq_tis"])
def test_rollout_cases_mask_and_drop_in_the_tested_batches(name):
    """Guards the tests above: weights, masks and drops vary across the shards' rows."""
    for seed in (1, 2, 3):
        metrics = reference(name, make_batch(seed=seed))[1]
        assert metrics["rollout_is_min"] < metrics["rollout_is_mean"] < metrics["rollout_is_max"]
        if name.endswith("opsm"):
            assert 0 < metrics["rollout_is_masked_frac"] < 1
            assert 0 < metrics["opsm_drop_frac"] < 1


def test_covariance_rules_are_per_call():
    """clip_cov / kl_cov pick their k = max(⌊ratio·N⌋, 1) tokens among the rows of one call (as
    verl per micro-batch): 4 micro-batches select Σ_u max(⌊0.1·N_u⌋, 1) tokens, not ⌊0.1·N⌋."""
    obj = objectives.get_objective("kl_cov", kl_cov_ratio=0.1)
    sums = jax.jit(lambda *a: obj.sums(*a))  # one compile per shape (whole, micro-batch)
    batch = make_batch(seed=3)
    micro = [tuple(p[k] for p in (np.split(x, 4) for x in batch)) for k in range(4)]
    whole = sums(*batch[:4])
    parts = [sums(*m[:4]) for m in micro]
    n_u = [float(m[3].sum()) for m in micro]
    want = sum(max(np.floor(0.1 * n), 1) for n in n_u)
    assert float(sum(p.metrics["cov_selected_tokens"] for p in parts)) == want
    assert float(whole.metrics["cov_selected_tokens"]) == np.floor(0.1 * sum(n_u)) != want
