"""Checkpoint intervals and the work a checkpoint schedule keeps, pinned by formulas written here.

References:
- Young (1974), "A first order approximation to the optimum checkpoint interval": tau = sqrt(2 W M).
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps", eq. 37:
  tau = sqrt(2 W M) [1 + (1/3) sqrt(W / 2M) + (1/9) (W / 2M)] - W for W < 2M, else tau = M.
- The kept work of a periodic schedule (interval tau, blocking write b, durable `persist` hours after the
  write starts) is counted by hand: a rollback after r hours of running keeps tau per checkpoint made
  durable, floor((r - persist) / (tau + b)); the horizon's end keeps every trained hour.
- Long-run efficiency with Poisson rollbacks (rate lambda): a running stretch X ~ Exp(lambda) keeps
  tau x #{n >= 1: n (tau + b) + persist <= X}, so E[kept] = tau e^(-lambda persist) sum_n e^(-lambda n (tau + b))
  = tau e^(-lambda persist) / (e^(lambda (tau + b)) - 1), over E[X] = 1 / lambda.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from estimators.failures import checkpoint as ck
from estimators.failures.checkpoint import (CheckpointPlan, daly_interval, optimal_interval, plan_checkpoints,
                                            register_interval_policy, young_interval)


def _daly(w: float, m: float) -> float:
    """Daly (2006) eq. 37, written out."""
    if w >= 2 * m:
        return m
    r = w / (2 * m)
    return math.sqrt(2 * w * m) * (1 + math.sqrt(r) / 3 + r / 9) - w


def _plan(interval: float, blocking: float = 0.0, persist: float = 0.0) -> CheckpointPlan:
    return CheckpointPlan("fixed", interval, blocking, persist, optimal_interval=interval)


# ---------------------------------------------------------------------- Young / Daly
def test_young_interval_of_a_5_minute_write_and_a_24_hour_mttf_is_2_hours():
    """sqrt(2 x (1/12 h) x 24 h) = sqrt(4) = 2 h exactly."""
    assert young_interval(1 / 12, 24.0) == pytest.approx(2.0, rel=1e-15)
    assert young_interval(0.5, 9.0) == pytest.approx(3.0, rel=1e-15)


def test_daly_interval_of_a_1_hour_write_and_an_8_hour_mttf_is_3_361_hours():
    """W / 2M = 1/16: 4 x (1 + 1/12 + 1/144) - 1 = 4 x 157/144 - 1 = 3.36111 h."""
    assert daly_interval(1.0, 8.0) == pytest.approx(4 * 157 / 144 - 1, rel=1e-14)
    assert daly_interval(1.0, 8.0) == pytest.approx(_daly(1.0, 8.0), rel=1e-14)
    assert daly_interval(0.3, 2.0) == pytest.approx(_daly(0.3, 2.0), rel=1e-14)


def test_daly_interval_is_the_mttf_from_a_write_of_exactly_twice_the_mttf():
    """At W = 2M the formula would give 2M (13/9) - 2M = 8M/9; Daly takes M from W >= 2M on."""
    assert daly_interval(2.0, 1.0) == 1.0
    assert daly_interval(5.0, 1.5) == 1.5
    assert daly_interval(1.999, 1.0) == pytest.approx(_daly(1.999, 1.0), rel=1e-14)


def test_no_failures_means_never_checkpoint():
    assert daly_interval(0.1, math.inf) == math.inf
    assert optimal_interval(0.1, 0.0, math.inf) == math.inf


def test_optimal_interval_is_dalys_for_the_blocking_part_but_never_shorter_than_the_persist_time():
    assert optimal_interval(1.0, 0.0, 8.0) == pytest.approx(4 * 157 / 144 - 1, rel=1e-14)
    # an asynchronous write: snapshot 0.01 h blocks, the write persists in 2 h
    assert optimal_interval(0.01, 2.0, 8.0) == 2.0
    assert optimal_interval(0.01, 0.1, 8.0) == pytest.approx(_daly(0.01, 8.0), rel=1e-14)


# ---------------------------------------------------------------------- the plan
def test_a_blocking_plan_writes_for_the_whole_write_and_is_durable_at_once():
    p = plan_checkpoints(1.5, 0.25, False, 8.0)
    assert (p.policy, p.interval, p.blocking, p.persist) == ("fixed", 1.5, 0.25, 0.0)
    assert p.cycle == 1.75
    assert p.optimal_interval == pytest.approx(_daly(0.25, 8.0), rel=1e-14)


def test_an_asynchronous_plan_blocks_for_the_snapshot_and_persists_after_the_write():
    p = plan_checkpoints(1.5, 0.25, True, 8.0, snapshot=0.02)
    assert (p.policy, p.interval, p.blocking, p.persist) == ("fixed", 1.5, 0.02, 0.25)
    assert p.cycle == pytest.approx(1.52, rel=1e-15)
    assert p.optimal_interval == pytest.approx(max(_daly(0.02, 8.0), 0.25), rel=1e-14)


def test_an_asynchronous_interval_shorter_than_the_write_waits_for_the_write():
    p = plan_checkpoints(0.1, 0.25, True, 8.0, snapshot=0.0)
    assert p.interval == 0.25
    q = plan_checkpoints(0.1, 0.25, False, 8.0)        # a blocking write: the interval is kept
    assert q.interval == 0.1


def test_no_interval_given_takes_the_optimal_policy():
    p = plan_checkpoints(None, 1.0, False, 8.0)
    assert p.policy == "optimal"
    assert p.interval == pytest.approx(4 * 157 / 144 - 1, rel=1e-14)
    a = plan_checkpoints(None, 2.0, True, 8.0, snapshot=0.01)
    assert a.policy == "optimal" and a.interval == 2.0 and a.blocking == 0.01 and a.persist == 2.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf])
def test_a_fixed_interval_must_be_finite_and_positive(bad):
    with pytest.raises(TraceInputError, match=r"^checkpoint interval must be a finite number > 0, got"):
        plan_checkpoints(bad, 0.1, False, 8.0)


def test_a_fixed_policy_without_an_interval_is_an_error():
    with pytest.raises(TraceInputError, match="got None"):
        ck._POLICIES["fixed"](None, 0.1, 0.0, 8.0)
    assert ck._POLICIES["fixed"](2.5, 0.1, 0.0, 8.0) == 2.5
    assert ck._POLICIES["optimal"](None, 1.0, 0.0, 8.0) == pytest.approx(4 * 157 / 144 - 1, rel=1e-14)


def test_a_registered_interval_policy_is_found_by_its_name():
    @register_interval_policy("test-half-hour")
    def _half(interval, blocking, persist, mttf):
        return 0.5
    try:
        assert ck._POLICIES["test-half-hour"] is _half
        assert _half(None, 0, 0, 1) == 0.5
    finally:
        del ck._POLICIES["test-half-hour"]


# ---------------------------------------------------------------------- kept work, counted by hand
def test_a_rollback_keeps_the_checkpoints_made_durable_before_it():
    """tau 1 h, write 0.25 h (cycle 1.25 h), durable 0.5 h after it starts:
    r = 0.3 -> 0 (none durable); 1.8 -> floor(1.3 / 1.25) = 1 -> 1 h; 3.0 -> floor(2.5 / 1.25) = 2 -> 2 h;
    4.0 -> floor(3.5 / 1.25) = 2 -> 2 h."""
    p = _plan(1.0, 0.25, 0.5)
    assert np.array_equal(p.kept_after_rollback([0.3, 1.8, 3.0, 4.0]), [0.0, 1.0, 2.0, 2.0])
    assert float(p.kept_after_rollback(0.0)) == 0.0
    b = _plan(1.0, 0.25)                                  # blocking write: durable when it ends
    assert np.array_equal(b.kept_after_rollback([1.2, 1.25, 2.6]), [0.0, 1.0, 2.0])


def test_never_checkpointing_loses_everything_at_a_rollback_and_keeps_everything_at_the_end():
    p = _plan(math.inf, 0.25, 0.0)
    assert np.array_equal(p.kept_after_rollback([0.0, 5.0, 100.0]), [0.0, 0.0, 0.0])
    assert np.array_equal(p.kept_at_end([0.0, 5.0, 100.0]), [0.0, 5.0, 100.0])


def test_continuous_free_checkpoints_keep_all_but_the_persist_time():
    p = _plan(0.0, 0.0, 0.5)
    assert np.allclose(p.kept_after_rollback([0.2, 0.5, 3.0]), [0.0, 0.0, 2.5], rtol=0, atol=1e-15)
    assert np.array_equal(p.kept_at_end([0.2, 3.0]), [0.2, 3.0])


def test_the_horizons_end_keeps_every_trained_hour_but_not_the_writes():
    """tau 1 h, write 0.25 h: r = 2.6 -> 2 cycles (2 h) + 0.1 h training = 2.1 h;
    r = 2.4 -> 1 cycle (1 h) + min(1.15, 1) = 2 h; r = 0.7 -> 0.7 h."""
    p = _plan(1.0, 0.25, 0.5)
    assert np.allclose(p.kept_at_end([2.6, 2.4, 0.7]), [2.1, 2.0, 0.7], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------- long-run efficiency
def _efficiency(lam: float, tau: float, b: float, persist: float) -> float:
    """tau e^(-lam persist) / (e^(lam (tau + b)) - 1) kept per E[X] = 1 / lam running hours."""
    return lam * tau * math.exp(-lam * persist) / (math.exp(lam * (tau + b)) - 1)


def test_efficiency_with_poisson_rollbacks_is_the_geometric_sum_over_checkpoints():
    assert _plan(1.0, 0.25, 0.5).efficiency(0.2) == pytest.approx(_efficiency(0.2, 1.0, 0.25, 0.5), rel=1e-13)
    assert _plan(2.0, 0.1).efficiency(0.05) == pytest.approx(_efficiency(0.05, 2.0, 0.1, 0.0), rel=1e-13)


def test_efficiency_without_rollbacks_is_the_share_of_the_cycle_spent_training():
    assert _plan(1.0, 0.25).efficiency(0.0) == pytest.approx(0.8, rel=1e-15)
    assert _plan(math.inf, 0.25).efficiency(0.0) == 1.0
    assert _plan(0.0, 0.25).efficiency(0.0) == 1.0


def test_efficiency_limits_never_checkpointing_and_free_continuous_checkpoints():
    assert _plan(math.inf, 0.25).efficiency(0.1) == 0.0
    assert _plan(0.0, 0.0, 2.0).efficiency(0.1) == pytest.approx(math.exp(-0.2), rel=1e-15)


def test_efficiency_is_computed_up_to_e_to_the_700_and_zero_beyond():
    """lam (tau + b) = 700: 700 e^-700 / (1 - e^-700) ~ 6.9e-302, still a float; past 700 e^x overflows."""
    assert _plan(700.0).efficiency(1.0) == pytest.approx(700.0 / math.expm1(700.0), rel=1e-12)
    assert _plan(700.0).efficiency(1.0) > 0.0
    assert _plan(700.5).efficiency(1.0) == 0.0


def test_an_asynchronous_plan_without_a_snapshot_time_blocks_for_nothing():
    p = plan_checkpoints(1.5, 0.25, True, 8.0)
    assert (p.blocking, p.persist, p.cycle) == (0.0, 0.25, 1.5)


def test_kept_hours_of_whole_hours_are_float_hours():
    """Integer running hours in, float hours out (the estimators add fractions to them in place)."""
    for plan in (_plan(math.inf), _plan(0.0), _plan(1.0, 0.25)):
        assert plan.kept_after_rollback(np.array([1, 2])).dtype == np.float64
        assert plan.kept_at_end(np.array([1, 2])).dtype == np.float64
