"""Verify steps' costs learned from the decode steps' own timings (step_costs.py)."""

from __future__ import annotations

import pytest

from completion_engine.step_costs import CLIP, SCALE_RANGE, StepCosts


def timed(
    costs: StepCosts, u: float, v: float, rounds: int, extras: tuple[float, ...] = (0.0, 0.3, 1.0, 2.0)
) -> None:
    """Steps whose seconds are exactly u + v * f, for load-priced extra rows f."""
    for _ in range(rounds):
        for f in extras:
            costs.observe_step(f, u + v * f)


def test_nothing_observed_keeps_the_load_time_prices():
    costs = StepCosts()
    assert costs.fit() == (0.0, 0.0)
    assert costs.row_scale() == 1.0 and costs.draft_cost(0.3) == 0.3


def test_rows_dearer_than_the_load_priced_them_scale_the_price_up():
    costs = StepCosts()
    timed(costs, u=0.010, v=0.020, rounds=100)  # a row costs twice what the load-time probe said
    u, v = costs.fit()
    assert u == pytest.approx(0.010, rel=0.1) and v == pytest.approx(0.020, rel=0.1)
    assert costs.row_scale() == pytest.approx(2.0, rel=0.15)
    cheaper = StepCosts()
    timed(cheaper, u=0.010, v=0.005, rounds=100)
    assert cheaper.row_scale() == pytest.approx(0.5, rel=0.15)


def test_plain_steps_say_nothing_of_rows_so_the_load_price_stays():
    costs = StepCosts()
    timed(costs, u=0.012, v=0.0, rounds=200, extras=(0.0,))
    assert costs.row_scale() == pytest.approx(1.0)
    assert costs.fit()[0] == pytest.approx(0.012)


def test_the_prior_holds_while_there_are_few_steps():
    costs = StepCosts()
    timed(costs, u=0.010, v=0.040, rounds=1, extras=(0.0, 1.0))  # two steps against PRIOR_WEIGHT
    assert 1.0 < costs.row_scale() < 2.0


def test_a_slope_from_tiny_rows_only_stays_near_the_load_price():
    """Plain steps, and now and then an exploring token of f = 0.02 timed 3% off: the prior holds."""
    scales = []
    for seed in range(6):
        costs = StepCosts()
        for step in range(400):
            extra = 0.02 if step % 8 == 0 else 0.0
            noise = 1.0 + 0.03 * ((step * 7919 + seed * 104729) % 21 - 10) / 10  # +-3%, no randomness
            costs.observe_step(extra, 0.010 * (1.0 + extra) * noise)
        scales.append(costs.row_scale())
    assert all(0.5 < scale < 2.0 for scale in scales), scales


def test_a_fit_with_no_time_left_for_a_1_row_step_prices_rows_at_the_most():
    costs = StepCosts()
    for _ in range(100):
        costs.observe_step(0.5, 0.005)
        costs.observe_step(1.0, 0.030)  # a straight line through these meets f = 0 below 0 seconds
    assert costs.fit()[0] <= 0.0 and costs.row_scale() == SCALE_RANGE[1]


def test_old_steps_fade_and_new_ones_count():
    costs = StepCosts()
    timed(costs, u=0.010, v=0.020, rounds=100)
    timed(costs, u=0.010, v=0.005, rounds=100)  # the host got faster at rows (or the context shorter)
    assert costs.row_scale() == pytest.approx(0.5, rel=0.15)


def test_a_step_spoilt_by_other_load_counts_as_at_most_clip_times_the_fit():
    costs = StepCosts()
    timed(costs, u=0.010, v=0.020, rounds=30)
    before = costs.row_scale()
    costs.observe_step(1.0, 3.0)  # 100 times the ~30 ms the fit predicts
    assert costs.row_scale() < before * 1.5
    spoilt = StepCosts()
    timed(spoilt, u=0.010, v=0.020, rounds=30)
    u, v = spoilt.fit()
    spoilt.observe_step(1.0, (u + v) * CLIP)  # exactly at the clip: the same as the 100-times step
    assert spoilt.row_scale() == pytest.approx(costs.row_scale())
    assert SCALE_RANGE[0] <= costs.row_scale() <= SCALE_RANGE[1]


def test_a_draft_token_is_priced_from_its_seconds_over_a_1_row_step():
    costs = StepCosts()
    timed(costs, u=0.010, v=0.010, rounds=50)
    costs.observe_drafting(2, 0.010)  # 5 ms a token: 0.5 of a 10 ms step, the load said 0.2
    assert 0.2 < costs.draft_cost(0.2) < 0.5  # two tokens against PRIOR_WEIGHT pseudo-tokens
    for _ in range(200):
        costs.observe_drafting(3, 0.015)
    assert costs.draft_cost(0.2) == pytest.approx(0.5, rel=0.05)
    costs.observe_drafting(0, 0.001)  # nothing drafted: nothing learned
    assert costs.draft_cost(0.2) == pytest.approx(0.5, rel=0.05)
    costs.observe_drafting(3, 1.5)  # a window jump re-read the draft's context: counts as 3 x 15 ms
    assert costs.draft_cost(0.2) < 0.6
