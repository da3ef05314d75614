"""The claims' statistics (gspo_jax/claims/stats.py) against values computed by hand: the
sign-flip test over warm-start draws (seeds averaged within their draw), the equivalence test
(TOST) with its margin, Holm's correction, the power of the sign-flip design and the bootstrap."""

import math

import numpy as np
import pytest

from gspo_jax.claims import stats


def test_sign_flip_counts_every_assignment():
    # all five above 0: only the observed assignment is as far: 1/32
    assert stats.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5], ">") == 1 / 32
    assert stats.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5], "<") == 1.0
    assert stats.sign_flip_p([0.3], ">") == 0.5 and stats.sign_flip_p([-0.3], ">") == 1.0
    assert math.isnan(stats.sign_flip_p([], ">"))


def test_seeds_are_averaged_within_their_draw_before_the_sign_flip():
    # draws' means 0.2, -0.1, 0.3 (|d| 0.2, 0.1, 0.3, sum 0.4): the sums >= 0.4 are +++ (0.6)
    # and the observed one: 2 of 8
    per_draw = {0: [0.4, 0.0], 1: [-0.1], 2: [0.3]}
    assert stats.draw_means(per_draw) == pytest.approx({0: 0.2, 1: -0.1, 2: 0.3})
    assert stats.draw_sign_flip_p(per_draw, ">") == pytest.approx(2 / 8)
    # three draws whose seeds agree on average: 1/8, however many seeds each has
    assert stats.draw_sign_flip_p({0: [0.1, 0.3], 1: [0.2], 2: [-0.1, 0.5, 0.2]}, ">") == 1 / 8
    # a draw with no finite value is left out
    assert stats.draw_means({0: [float("nan")], 1: [0.5]}) == {1: 0.5}


def test_by_draw_places_each_seed_in_its_draw():
    draws = stats.by_draw({100: 0.1, 101: 0.2, 103: 0.3}, {100: 0, 101: 1, 103: 0})
    assert draws == {0: [0.1, 0.3], 1: [0.2]}
    with pytest.raises(ValueError, match=r"seeds \[105\] have no warm-start draw"):
        stats.by_draw({105: 0.1}, {100: 0})


def test_tost_takes_the_larger_one_sided_p():
    x = [0.01, -0.01, 0.005, 0.0, 0.002]
    # margin 0.02: x + 0.02 all above 0 and x - 0.02 all below: 1/32 each
    assert stats.tost_p(x, 0.02) == pytest.approx(1 / 32)
    # margin 0.005: x + 0.005 = (0.015, -0.005, 0.01, 0.005, 0.007), sum 0.032 of 0.042: a
    # flipped set must weigh <= 0.005 ({}, either 0.005): 3/32. x - 0.005 = (0.005, -0.015, 0,
    # -0.005, -0.003), sum -0.018 of 0.028: the set made positive weighs <= 0.005 ({}, 0.005,
    # 0.005, 0.003), each with the zero's two signs: 8/32. TOST: the larger, 8/32
    assert stats.tost_p(x, 0.005) == pytest.approx(8 / 32)
    with pytest.raises(ValueError, match="margin"):
        stats.tost_p(x, 0.0)


def test_holm_adjusts_step_down_in_the_input_order():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> 0.06 (monotone)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert stats.holm([0.043]) == [0.043]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stats.holm([0.1, 1.5])


def test_power_of_the_sign_flip_design():
    # with 4 units the smallest p is 1/16 > 0.05: no effect can be shown
    assert stats.sign_flip_power(n=4, effect=10.0) == 0.0
    # with 5 units only "all five positive" reaches p = 1/32 < 0.05: power = P(d > 0)^5,
    # Phi(1)^5 = 0.4215 for effect 1 sd
    phi = 0.5 * (1 + math.erf(1 / math.sqrt(2)))
    assert stats.sign_flip_power(n=5, effect=1.0, simulations=3000) == pytest.approx(
        phi**5, abs=0.03
    )
    assert stats.sign_flip_power(n=5, effect=1.0, sd=1e-9, simulations=50) == 1.0


def test_many_rows_sign_flip_gives_each_rows_exact_p():
    """sign_flip_p_many (the power calculations' batch) is sign_flip_p row by row, ties and a
    single unit included: the hand example's 3/8 and 6/8, and random rows of 1-9 units."""
    rows = np.asarray([[0.3, -0.2, 0.1], [0.1, 0.1, 0.1], [0.5, -0.5, 0.0]])
    assert stats.sign_flip_p_many(rows, ">")[0] == pytest.approx(3 / 8)
    assert stats.sign_flip_p_many(rows, "<")[0] == pytest.approx(6 / 8)
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 9):
        x = np.concatenate([rows[:, :1].repeat(n, 1), rng.normal(0.1, 1.0, (40, n))])
        for direction in "><":
            want = [stats.sign_flip_p(r, direction, 0.05) for r in x]
            assert stats.sign_flip_p_many(x, direction, 0.05).tolist() == want, (n, direction)


def test_bootstrap_interval_of_two_values_and_of_one():
    # resampled means of (0, 1): 0, 0.5, 1 with chances 1/4, 1/2, 1/4: the 95 % interval [0, 1]
    assert stats.bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    assert stats.bootstrap_interval([0.25]) == (0.25, 0.25)
    assert all(math.isnan(v) for v in stats.bootstrap_interval([]))


def test_draw_level_sign_flip_over_three_draws_of_two_seeds_by_hand():
    # draws of two seeds each: (0.5, 0.1) -> 0.3, (-0.4, 0.0) -> -0.2, (0.2, 0.0) -> 0.1.
    # The 8 sign patterns of (0.3, 0.2, 0.1) and their sums: +++ 0.6, ++- 0.4, +-+ 0.2 (the
    # observed 0.3 - 0.2 + 0.1), +-- 0.0, -++ 0.0, -+- -0.2, --+ -0.4, --- -0.6.
    # ">": sums >= 0.2: +++, ++-, +-+ -> 3/8; "<": sums <= 0.2: +-+, +--, -++, -+-, --+,
    # --- -> 6/8
    per_draw = {7: [0.5, 0.1], 8: [-0.4, 0.0], 9: [0.2, 0.0]}
    assert stats.draw_sign_flip_p(per_draw, ">") == pytest.approx(3 / 8)
    assert stats.draw_sign_flip_p(per_draw, "<") == pytest.approx(6 / 8)
    # the same numbers with the seeds as units (6 of them) would be another test entirely
    assert stats.sign_flip_p([0.5, 0.1, -0.4, 0.0, 0.2, 0.0], ">") != pytest.approx(3 / 8)


def test_holm_textbook_example():
    # Holm (1979) as Wikipedia's "Holm-Bonferroni method" works it: four hypotheses with p
    # 0.01, 0.04, 0.03, 0.005 at alpha 0.05: the smallest, 0.005 < 0.05/4, is rejected; 0.01 <
    # 0.05/3 rejected; 0.03 > 0.05/2 stops: H1 and H4 rejected, H2 and H3 not. Adjusted:
    # 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, max(0.04 x 1, 0.06) = 0.06
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]


def test_tost_power_by_hand():
    # with 5 units TOST reaches p = 1/32 < 0.05 only when every unit lies inside +-margin (both
    # one-sided tests need all five on their side): power = P(|d| < margin)^5; at margin 1 sd
    # and a true difference of 0 that is 0.6827^5 = 0.148
    inside = math.erf(1 / math.sqrt(2))
    assert stats.tost_power(n=5, margin=1.0, simulations=3000) == pytest.approx(inside**5, abs=0.03)
    assert stats.tost_power(n=4, margin=10.0) == 0.0  # 1/16 > 0.05: never
    assert stats.tost_power(n=5, margin=1.0, sd=1e-9, simulations=50) == 1.0
