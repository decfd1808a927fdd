"""Closed-form ETTR pinned by formulas written in the test (never the estimator's own output).

Model (estimators/failures/closed_form.py docstring): failures of class i arrive as a Poisson process of
rate lambda_i per wall-clock hour and stall the job u_i hours.
- restart-over: the job runs iff no class-i failure fell in the last u_i hours; independent Poisson
  processes give P(running) = prod_i exp(-lambda_i u_i) = exp(-sum_i lambda_i u_i).
- queue: the busy fraction of an M/G/1 queue is its load rho = sum_i lambda_i u_i (Kleinrock 1975, vol. 1,
  sec. 5.1), so P(running) = max(0, 1 - rho).
- a replica restarting d_c hours after a class-c failure (k_c of R replicas) is down with probability
  1 - exp(-sum_c lambda_c (k_c / R) d_c) (Poisson thinning), counted only while the job runs.
- kept work with rollbacks at rate lambda per running hour and A_t = min(t, X), X ~ Exp(lambda): a rollback
  at t loses A_t - g(A_t), so E[kept] = T - lambda integral_0^T E[A_t - g(A_t)] dt (Wald / Campbell), with
  P(A_t >= s) = e^(-lambda s) for s <= t.
- Busy-period Laplace transforms: restart-over, D = time from an arrival (rate lambda_n) to the first gap of
  u without arrivals: E[e^(-sD)] = e^(-(lambda_n+s)u) / (1 - lambda_n (1 - e^(-(lambda_n+s)u)) / (lambda_n+s))
  (the renewal argument on the first arrival in (0, u)); queue: Kendall's functional equation
  G(s) = exp(-(s + lambda (1 - G(s))) u) for an M/D/1 busy period (Kendall 1951), minimal root.
- Hot spares: failed nodes in repair ~ Poisson(lambda x repair); P(no spare free) = P(N >= spares).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from estimators.failures.checkpoint import CheckpointPlan
from estimators.failures.closed_form import (LOST_KEYS, closed_form, degraded_fraction, effective_rollback_rate,
                                             expected_kept_hours, running_fraction, with_spare_waits)
from estimators.failures.recovery import FailureClass, RecoveryTimes

# The estimator integrates the kept work on a grid of >= 64 points per 1 / rate (trapezoids): smooth
# integrands come out within ~(1/64)^2 / 12 ~ 2e-5 relative, so smooth cases are pinned to 1e-4.
QUAD = 1e-4
SYNC_STALL = {"detection": 0.02, "restart": 0.05, "checkpoint_load": 0.03}      # 0.1 h in all


def _sync(rate: float, stall: dict | None = None) -> FailureClass:
    return FailureClass("job restart", rate, dict(stall or SYNC_STALL), rollback=True)


def _replica(rate: float, k_over_r: float, degraded_h: float, stall_h: float = 0.05) -> FailureClass:
    return FailureClass("1 of 4 replicas", rate, {"detection": stall_h}, rollback=False, degraded_h=degraded_h,
                        degraded_fraction=k_over_r, spare_wait_stalls=False)


def _running_fraction(classes: list[FailureClass], horizon_h: float) -> float:
    """Restart-over from a healthy start: the job runs at t with probability exp(-sum_i lambda_i min(t, u_i))
    (only failures since 0 can stall it); its mean over the horizon by trapezoids on a fine grid that
    holds the kinks at the stalls (independent of the estimator's piecewise-exact integral)."""
    t = np.union1d(np.linspace(0.0, horizon_h, 2_000_001), [c.stall_h for c in classes if c.stall_h < horizon_h])
    p = np.exp(-sum(c.rate_per_h * np.minimum(t, c.stall_h) for c in classes))
    return float(np.trapezoid(p, t)) / horizon_h


def _plan(interval: float, blocking: float = 0.0, persist: float = 0.0) -> CheckpointPlan:
    return CheckpointPlan("fixed", interval, blocking, persist, optimal_interval=interval)


def _times(spares: int | None, repair_h: float = 24.0, replacement_h: float = 0.5) -> RecoveryTimes:
    return RecoveryTimes(detection=0.02, restart=0.05, checkpoint_load=0.03, ft_reconfigure=0.0, ft_redo_step=0.0,
                         ft_rejoin=0.0, replica_restart=0.1, spares=spares, node_repair=repair_h,
                         replacement=replacement_h)


# ---------------------------------------------------------------------- running and degraded fractions
def test_restart_over_runs_exp_of_minus_the_summed_rate_times_stall():
    classes = [_sync(0.5), _replica(2.0, 0.25, 0.1, stall_h=0.05)]      # load 0.05 + 0.1 = 0.15
    assert running_fraction(classes, "restart-over") == pytest.approx(math.exp(-0.15), rel=1e-14)


def test_queued_stalls_run_one_minus_the_load_and_never_below_zero():
    classes = [_sync(0.5), _replica(2.0, 0.25, 0.1, stall_h=0.05)]
    assert running_fraction(classes, "queue") == pytest.approx(0.85, rel=1e-14)
    assert running_fraction([_sync(12.0)], "queue") == 0.0            # load 1.2: saturated


def test_replicas_are_missing_with_the_poisson_probability_of_a_recent_failure_while_the_job_runs():
    """lambda k/R d summed: 2 x 0.25 x 0.1 + 1 x 0.5 x 0.2 = 0.15; missing = running (1 - e^-0.15)."""
    classes = [_replica(2.0, 0.25, 0.1), _replica(1.0, 0.5, 0.2), _sync(3.0)]
    assert degraded_fraction(classes, 0.8) == pytest.approx(0.8 * (1 - math.exp(-0.15)), rel=1e-13)
    assert degraded_fraction([_sync(3.0)], 0.8) == 0.0


# ---------------------------------------------------------------------- hot spares
def test_no_spare_pool_adds_no_wait():
    classes = [_sync(0.5)]
    assert with_spare_waits(classes, _times(None)) is classes


def test_an_empty_spare_pool_adds_the_whole_replacement_to_every_stall_or_degraded_period():
    """spares = 0: P(no spare free) = P(N >= 0) = 1, so the wait is the replacement, 0.5 h."""
    out = with_spare_waits([_sync(0.5), _replica(2.0, 0.25, 0.1)], _times(0))
    assert out[0].stall == {**SYNC_STALL, "spare_wait": 0.5}
    assert out[0].rollback is True and out[0].rate_per_h == 0.5 and out[0].name == "job restart"
    assert out[0].degraded_h == 0.0 and out[0].degraded_fraction == 0.0 and out[0].spare_wait_stalls is True
    assert out[1].stall == {"detection": 0.05}
    assert out[1].name == "1 of 4 replicas" and out[1].rate_per_h == 2.0
    assert out[1].degraded_h == pytest.approx(0.6, rel=1e-15)
    assert out[1].degraded_fraction == 0.25 and out[1].rollback is False and out[1].spare_wait_stalls is False


def test_the_spare_wait_is_the_poisson_tail_of_nodes_in_repair_times_the_replacement():
    """Total rate 0.05 / h, repair 24 h: a = 1.2 nodes in repair; 2 spares: P(N >= 2) = 1 - e^-1.2 (1 + 1.2)."""
    out = with_spare_waits([_sync(0.03), _sync(0.02)], _times(2, 24.0, 0.5))
    p = 1 - math.exp(-1.2) * (1 + 1.2)
    assert out[0].stall["spare_wait"] == pytest.approx(p * 0.5, rel=1e-12)
    assert out[1].stall["spare_wait"] == pytest.approx(p * 0.5, rel=1e-12)


# ---------------------------------------------------------------------- kept work
def _kept_periodic(lam: float, tau: float, b: float, p: float, T: float) -> float:
    """Exact E[kept] for a periodic schedule: rollbacks keep tau per n with n (tau + b) + p <= A_t
    (lambda tau sum_n e^(-lambda s_n) (T - s_n)); the end keeps the training parts of [0, A_T]
    (sum over training segments [n c, n c + tau] of integral e^(-lambda a) da)."""
    c = tau + b
    roll, n = 0.0, 1
    while n * c + p <= T:
        s = n * c + p
        roll += tau * math.exp(-lam * s) * (T - s)
        n += 1
    end, n = 0.0, 0
    while n * c < T:
        end += (math.exp(-lam * n * c) - math.exp(-lam * min(n * c + tau, T))) / lam
        n += 1
    return lam * roll + end


def test_no_running_time_keeps_nothing():
    assert expected_kept_hours(_plan(1.0, 0.25), 0.3, 0.0) == 0.0
    assert expected_kept_hours(_plan(1.0, 0.25), 0.3, -1.0) == 0.0


def test_without_rollbacks_the_horizon_keeps_every_trained_hour():
    """tau 1 h, write 0.25 h, 2.6 h of running: 2 cycles + 0.1 h = 2.1 h."""
    assert expected_kept_hours(_plan(1.0, 0.25), 0.0, 2.6) == pytest.approx(2.1, rel=1e-14)


@pytest.mark.parametrize("lam, T", [(0.3, 5.0), (0.3, 200.0), (2.0, 1.0)])
def test_never_checkpointing_keeps_the_mean_time_to_the_first_rollback(lam, T):
    """g = 0, h(a) = a: E[kept] = E[min(T, X)] = (1 - e^(-lambda T)) / lambda (200 h is past 40 / lambda)."""
    got = expected_kept_hours(_plan(math.inf, 0.25), lam, T)
    assert got == pytest.approx(-math.expm1(-lam * T) / lam, rel=QUAD)


@pytest.mark.parametrize("lam, p, T", [(0.3, 0.5, 5.0), (0.3, 0.5, 300.0), (1.0, 0.2, 0.1)])
def test_continuous_checkpoints_lose_the_unpersisted_part_at_each_rollback(lam, p, T):
    """interval 0, persist p: a rollback loses min(A_t, p); lambda integral_0^T E[min(A_t, p)] dt
    = integral_0^T (1 - e^(-lambda min(t, p))) dt."""
    q = min(T, p)
    lost = (q - (-math.expm1(-lam * q)) / lam) + max(0.0, T - p) * (-math.expm1(-lam * p))
    assert expected_kept_hours(_plan(0.0, 0.0, p), lam, T) == pytest.approx(T - lost, rel=QUAD)


def test_free_continuous_checkpoints_keep_the_whole_run():
    assert expected_kept_hours(_plan(0.0), 0.4, 7.0) == pytest.approx(7.0, rel=QUAD)
    assert expected_kept_hours(_plan(0.0), 0.4, 7.0) <= 7.0


@pytest.mark.parametrize("lam, tau, b, p, T", [(0.3, 1.0, 0.25, 0.5, 10.0), (0.05, 2.0, 0.1, 0.3, 30.0),
                                               (1.0, 0.3, 0.05, 0.1, 5.0), (0.3, 1.0, 0.25, 0.0, 200.0),
                                               (0.5, 3.0, 0.2, 0.0, 2.0)])
def test_periodic_checkpoints_keep_the_hand_summed_expectation(lam, tau, b, p, T):
    """Exact sums (_kept_periodic) against the estimator's quadrature: within its step-function error."""
    got = expected_kept_hours(_plan(tau, b, p), lam, T)
    assert got == pytest.approx(_kept_periodic(lam, tau, b, p, T), rel=4e-3)


# ---------------------------------------------------------------------- rollback rate
def _restart_over_g(lam_n: float, s: float, u: float) -> float:
    k = lam_n + s
    return math.exp(-k * u) / (1 - lam_n * (1 - math.exp(-k * u)) / k)


def _kendall_g(lam: float, s: float, u: float) -> float:
    """Minimal root of G = exp(-(s + lam (1 - G)) u), by bisection on [0, 1]."""
    f = lambda g: math.exp(-(s + lam * (1 - g)) * u) - g         # noqa: E731
    lo, hi = 0.0, 1.0
    if f(hi) >= 0:                                                  # s = 0 and lam u <= 1: G = 1
        hi = 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def test_without_stalls_that_do_not_roll_back_rollbacks_are_the_rollback_failures():
    assert effective_rollback_rate([_sync(0.4), _sync(0.1)]) == pytest.approx(0.5, rel=1e-15)
    assert effective_rollback_rate([_replica(2.0, 0.25, 0.1)]) == 0.0
    # a replica class without a stall is never hit inside a stall
    assert effective_rollback_rate([_sync(0.4), _replica(2.0, 0.25, 0.1, stall_h=0.0)]) == 0.4


def test_a_whole_job_failure_inside_a_replica_stall_adds_a_rollback_restart_over():
    """lambda_r 0.4; replica failures 2 / h with 0.3 h stalls: rate = 0.4 + 2 (1 - G(0.4))."""
    got = effective_rollback_rate([_sync(0.4), _replica(2.0, 0.25, 0.1, stall_h=0.3)], "restart-over")
    assert got == pytest.approx(0.4 + 2.0 * (1 - _restart_over_g(2.0, 0.4, 0.3)), rel=1e-13)


def test_replica_classes_merge_at_their_rate_weighted_stall_restart_over():
    """2 / h at 0.2 h and 1 / h at 0.5 h: one class of 3 / h at (0.4 + 0.5) / 3 = 0.3 h."""
    classes = [_sync(0.4), _replica(2.0, 0.25, 0.1, stall_h=0.2), _replica(1.0, 0.5, 0.1, stall_h=0.5)]
    got = effective_rollback_rate(classes, "restart-over")
    assert got == pytest.approx(0.4 + 3.0 * (1 - _restart_over_g(3.0, 0.4, 0.3)), rel=1e-13)


def test_a_whole_job_failure_inside_a_queued_busy_period_adds_a_rollback():
    """One replica class: rate = lambda_r + lambda (1 - G), G Kendall's root for s = lambda_r."""
    got = effective_rollback_rate([_sync(0.4), _replica(2.0, 0.25, 0.1, stall_h=0.3)], "queue")
    assert got == pytest.approx(0.4 + 2.0 * (1 - _kendall_g(2.0, 0.4, 0.3)), rel=1e-10)
    # a heavy load (lambda u = 1.5) still has its minimal root below 1
    heavy = effective_rollback_rate([_sync(0.1), _replica(3.0, 0.25, 0.1, stall_h=0.5)], "queue")
    assert heavy == pytest.approx(0.1 + 3.0 * (1 - _kendall_g(3.0, 0.1, 0.5)), rel=1e-9)


def test_two_queued_replica_classes_solve_kendalls_equations_together():
    """G_i = exp(-(s + sum_j lambda_j (1 - G_j)) u_i), by plain fixed-point iteration from 0 in the test."""
    lam_r, lams, us = 0.3, (2.0, 1.0), (0.2, 0.5)
    g = [0.0, 0.0]
    for _ in range(5000):
        arr = sum(lj * (1 - gj) for lj, gj in zip(lams, g))
        g = [math.exp(-(lam_r + arr) * u) for u in us]
    want = lam_r + sum(lj * (1 - gj) for lj, gj in zip(lams, g))
    classes = [_sync(lam_r), _replica(2.0, 0.25, 0.1, stall_h=0.2), _replica(1.0, 0.5, 0.1, stall_h=0.5)]
    assert effective_rollback_rate(classes, "queue") == pytest.approx(want, rel=1e-10)


# ---------------------------------------------------------------------- the closed form
def test_sync_job_with_free_checkpoints_runs_exp_minus_rate_times_stall_after_its_first_stall():
    """0.5 failures / h, 0.1 h stalls, every hour kept. From a healthy start the job is down at t iff a
    failure fell in [max(0, t - u), t]: it runs with probability e^(-lam t) for t < u, e^(-lam u) after, so
    ETTR = [(1 - e^(-lam u)) / lam + (H - u) e^(-lam u)] / H -> e^-0.05 over a long horizon."""
    lam, u, H = 0.5, 0.1, 100.0
    cf = closed_form([_sync(lam)], _plan(0.0), H)
    exact = ((1 - math.exp(-lam * u)) / lam + (H - u) * math.exp(-lam * u)) / H
    assert cf.ettr == pytest.approx(exact, rel=QUAD)
    assert cf.ettr == pytest.approx(math.exp(-0.05), rel=1e-4)
    assert cf.mttf_h == 2.0 and cf.rollback_mttf_h == 2.0
    assert cf.expected_failures == pytest.approx(50.0, rel=1e-15)
    assert cf.stalled_fraction == pytest.approx(1 - exact, rel=1e-12)
    assert cf.semantics == "restart-over"


def test_a_horizon_shorter_than_a_stall_is_mostly_running_time():
    """H = 0.01 h < u = 0.1 h: running with probability e^(-lam t) throughout, ETTR = (1 - e^(-lam H)) / (lam H)
    (the stationary e^(-lam u) would say 0.951)."""
    cf = closed_form([_sync(0.5)], _plan(0.0), 0.01)
    assert cf.ettr == pytest.approx(-math.expm1(-0.005) / 0.005, rel=QUAD)


def test_queued_sync_job_with_free_checkpoints_has_ettr_one_minus_the_load():
    """Queued stalls keep the published stationary accounting: ETTR = 1 - load over any horizon."""
    cf = closed_form([_sync(0.5)], _plan(0.0), 100.0, semantics="queue")
    assert cf.ettr == pytest.approx(0.95, rel=QUAD)
    assert cf.semantics == "queue"
    assert closed_form([_sync(12.0)], _plan(0.0), 100.0, semantics="queue").ettr == 0.0


def test_no_failures_gives_infinite_mttfs_and_the_checkpoint_writes_as_the_only_loss():
    """tau 1 h, write 0.25 h, horizon 2.5 h: 2 h kept, ETTR 0.8; 0.5 h of writes lost."""
    cf = closed_form([], _plan(1.0, 0.25), 2.5)
    assert cf.mttf_h == math.inf and cf.rollback_mttf_h == math.inf and cf.expected_failures == 0.0
    assert cf.ettr == pytest.approx(0.8, rel=1e-14)
    assert cf.time_lost_h["checkpoint_writes"] == pytest.approx(0.5, rel=1e-14)
    assert cf.time_lost_h["recompute"] == pytest.approx(0.0, abs=1e-14)


def test_writes_lost_are_capped_by_the_time_not_kept():
    """horizon 2.4 h: 1 cycle + 1 h trained = 2 h kept, 0.4 h lost; 2.4 x 0.25 / 1.25 = 0.48 h of writes
    would exceed it: 0.4 h of writes, nothing recomputed."""
    cf = closed_form([], _plan(1.0, 0.25), 2.4)
    assert cf.time_lost_h["checkpoint_writes"] == pytest.approx(0.4, rel=1e-13)
    assert cf.time_lost_h["recompute"] == pytest.approx(0.0, abs=1e-13)


def test_never_checkpointing_loses_the_unkept_running_time_to_recompute():
    """0.2 / h, 0.1 h stalls, horizon 10 h: running ~e^-0.02 (from a healthy start); kept (1 - e^(-0.2 T_run)) / 0.2."""
    cf = closed_form([_sync(0.2)], _plan(math.inf), 10.0)
    run = _running_fraction([_sync(0.2)], 10.0) * 10.0
    kept = -math.expm1(-0.2 * run) / 0.2
    assert cf.ettr == pytest.approx(kept / 10.0, rel=QUAD)
    lost = cf.time_lost_h
    assert lost["checkpoint_writes"] == 0.0
    assert lost["recompute"] == pytest.approx(run - kept, rel=1e-5)
    stalled = 10.0 - run
    assert lost["detection"] == pytest.approx(stalled * 0.2, rel=1e-9)
    assert lost["restart"] == pytest.approx(stalled * 0.5, rel=1e-9)
    assert lost["checkpoint_load"] == pytest.approx(stalled * 0.3, rel=1e-9)
    assert lost["degraded"] == 0.0 and lost["spare_wait"] == 0.0
    assert sum(lost.values()) == pytest.approx(10.0 * (1 - cf.ettr), rel=1e-9)


def test_stalled_time_is_shared_by_cause_in_proportion_to_rate_times_stall():
    """Class A 0.2 / h x {detection 0.1}, class B 0.1 / h x {detection 0.1, restart 0.3}:
    load 0.02 + 0.04 = 0.06; detection gets (0.02 + 0.01) / 0.06, restart 0.03 / 0.06 of the stalled time."""
    a = _sync(0.2, {"detection": 0.1})
    b = _sync(0.1, {"detection": 0.1, "restart": 0.3})
    cf = closed_form([a, b], _plan(0.0), 50.0)
    stalled = (1 - _running_fraction([a, b], 50.0)) * 50.0
    assert cf.time_lost_h["detection"] == pytest.approx(stalled * 0.5, rel=1e-9)
    assert cf.time_lost_h["restart"] == pytest.approx(stalled * 0.5, rel=1e-9)


def test_ft_hsdp_replicas_cost_their_degraded_throughput_while_the_job_runs():
    """sync 0.1 / h x 0.1 h; replica 2 / h, 0.05 h stall, 1 of 4 out for 0.2 h; free checkpoints:
    running ~e^-(0.01 + 0.1) (from a healthy start); degraded = running (1 - e^-(2 x 0.25 x 0.2));
    ETTR = running - degraded."""
    classes = [_sync(0.1), _replica(2.0, 0.25, 0.2)]
    cf = closed_form(classes, _plan(0.0), 100.0)
    running = _running_fraction(classes, 100.0)
    degraded = running * (1 - math.exp(-0.1))
    assert cf.ettr == pytest.approx(running - degraded, rel=QUAD)
    assert cf.mttf_h == pytest.approx(1 / 2.1, rel=1e-14)
    assert cf.time_lost_h["degraded"] == pytest.approx(degraded * 100.0, rel=1e-6)
    assert set(cf.time_lost_h) == set(LOST_KEYS) == {"detection", "restart", "checkpoint_load", "spare_wait",
                                                     "recompute", "degraded", "checkpoint_writes"}
    assert sum(cf.time_lost_h.values()) == pytest.approx(100.0 * (1 - cf.ettr), rel=1e-9)


def test_an_empty_spare_pool_stalls_every_sync_failure_for_the_replacement_too():
    """spares 0: stall 0.1 + 0.5 h at 0.2 / h: running ~e^-0.12, free checkpoints: ETTR = the running fraction."""
    cf = closed_form([_sync(0.2)], _plan(0.0), 100.0, times=_times(0))
    running = _running_fraction([_sync(0.2, {**SYNC_STALL, "spare_wait": 0.5})], 100.0)
    assert cf.ettr == pytest.approx(running, rel=QUAD)
    stalled = (1 - running) * 100.0
    assert cf.time_lost_h["spare_wait"] == pytest.approx(stalled * 0.5 / 0.6, rel=1e-9)
    cf_none = closed_form([_sync(0.2)], _plan(0.0), 100.0, times=_times(None))
    assert cf_none.ettr == pytest.approx(_running_fraction([_sync(0.2)], 100.0), rel=QUAD)


# ---------------------------------------------------------------------- edge cases of the loss breakdown
def test_a_failure_class_without_a_stall_loses_no_stalled_time():
    """0.5 / h failures that stall nothing (load 0): nothing stalled, nothing lost to any stall part."""
    cf = closed_form([FailureClass("free", 0.5, {"detection": 0.0, "restart": 0.0}, rollback=False)], _plan(0.0),
                     10.0)
    assert cf.stalled_fraction == 0.0
    assert cf.time_lost_h["detection"] == 0.0 and cf.time_lost_h["restart"] == 0.0
    assert cf.ettr == pytest.approx(1.0, rel=QUAD)


def test_checkpoint_writes_lose_their_share_of_the_running_time():
    """tau 0.5 h, write 0.1 h: writes take 0.1 / 0.6 of the running time; with rollbacks (0.2 / h) the
    time not kept exceeds it, so the writes are lost in full and the rest is recompute."""
    cf = closed_form([_sync(0.2)], _plan(0.5, 0.1), 100.0)
    run = _running_fraction([_sync(0.2)], 100.0) * 100.0
    writes = run * 0.1 / 0.6
    assert cf.time_lost_h["checkpoint_writes"] == pytest.approx(writes, rel=1e-9)
    assert cf.time_lost_h["recompute"] == pytest.approx(run - cf.ettr * 100.0 - writes, rel=1e-9)
    assert cf.ettr * 100.0 < run - writes


def test_recompute_adds_the_redone_step_of_a_stall_to_the_work_rolled_back():
    """A replica stall part named recompute (FT-HSDP's redone step) plus rollbacks' lost work."""
    replica = FailureClass("1 of 4 replicas", 1.0, {"detection": 0.02, "recompute": 0.03}, rollback=False)
    cf = closed_form([_sync(0.2), replica], _plan(math.inf), 10.0)
    load = 0.2 * 0.1 + 1.0 * 0.05
    run = _running_fraction([_sync(0.2), replica], 10.0) * 10.0
    stalled = 10.0 - run
    rate = 0.2 + 1.0 * (1 - _restart_over_g(1.0, 0.2, 0.05))
    kept = -math.expm1(-rate * run) / rate
    assert cf.time_lost_h["recompute"] == pytest.approx(stalled * 0.03 / load + run - kept, rel=1e-4)
    assert cf.rollback_mttf_h == pytest.approx(1 / rate, rel=1e-12)


def test_queued_closed_form_rolls_back_at_the_kendall_rate():
    """queue semantics: the rollback rate of a whole-job failure inside a replica's busy period comes from
    Kendall's equation, never the restart-over transform."""
    classes = [_sync(0.4), _replica(2.0, 0.25, 0.0, stall_h=0.3)]
    cf = closed_form(classes, _plan(math.inf), 10.0, semantics="queue")
    rate = 0.4 + 2.0 * (1 - _kendall_g(2.0, 0.4, 0.3))
    assert cf.rollback_mttf_h == pytest.approx(1 / rate, rel=1e-9)
    run = (1 - (0.4 * 0.1 + 2.0 * 0.3)) * 10.0
    assert cf.ettr == pytest.approx(-math.expm1(-rate * run) / rate / 10.0, rel=QUAD)


def test_without_whole_job_failures_nothing_rolls_back_even_under_a_heavy_queue():
    """lambda u = 1.5 > 1 has a Kendall root below 1, but with no rollback failure there is no rollback."""
    assert effective_rollback_rate([_replica(3.0, 0.25, 0.1, stall_h=0.5)], "queue") == 0.0
    assert effective_rollback_rate([_replica(3.0, 0.25, 0.1, stall_h=0.5)], "restart-over") == 0.0


def test_replica_classes_without_a_stall_are_left_out_of_the_merged_stall():
    """2 / h at 0.3 h and 1 / h at 0 h: the merged class is the first alone (a zero stall never ends in a
    rollback), not 3 / h at 0.2 h."""
    classes = [_sync(0.4), _replica(2.0, 0.25, 0.1, stall_h=0.3), _replica(1.0, 0.5, 0.1, stall_h=0.0)]
    assert effective_rollback_rate(classes) == pytest.approx(0.4 + 2.0 * (1 - _restart_over_g(2.0, 0.4, 0.3)),
                                                             rel=1e-13)


def test_long_horizons_with_short_checkpoint_cycles_are_integrated_finely():
    """1,000 h at 0.01 rollbacks / h with a checkpoint every 0.1 h (+ 0.01 h write): the exact sum."""
    got = expected_kept_hours(_plan(0.1, 0.01), 0.01, 1000.0)
    assert got == pytest.approx(_kept_periodic(0.01, 0.1, 0.01, 0.0, 1000.0), rel=4e-3)
    got = expected_kept_hours(_plan(0.3, 0.05, 0.2), 0.02, 300.0)
    assert got == pytest.approx(_kept_periodic(0.02, 0.3, 0.05, 0.2, 300.0), rel=4e-3)


def test_the_cumulative_trapezoid_starts_at_zero_even_in_recycled_memory():
    from estimators.failures.closed_form import _cumulative_trapezoid
    for n in (3, 5, 4001):
        junk = np.full(n, 7.5)          # freed just before: the next array of this size may reuse its memory
        del junk
        out = _cumulative_trapezoid(np.ones(n), np.arange(float(n)))
        assert out.tolist() == [float(i) for i in range(n)]


@pytest.mark.parametrize("lam, tau, b, T", [(0.01, 0.25, 0.0, 1000.0), (0.05, 0.2, 0.05, 800.0)])
def test_long_horizons_resolve_every_checkpoint_cycle(lam, tau, b, T):
    """Horizons of hundreds of cycles: with 64 grid points per checkpoint cycle the trapezoids' error on the
    kept-work staircase stays below 3e-4 relative (a grid of 4,001 points over the horizon, a quarter of a
    cycle or more per step, would be off by ~1e-3)."""
    got = expected_kept_hours(_plan(tau, b), lam, T)
    assert got == pytest.approx(_kept_periodic(lam, tau, b, 0.0, T), rel=3e-4)
