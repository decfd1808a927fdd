"""Closed-form expected effective training time ratio (ETTR): the long-run expectation of the same model
the Monte Carlo simulates.

Failures arrive at a constant rate in wall-clock time. Every failure costs the job its whole stall, even
one that lands inside another recovery (its node must be swapped and the job restarted again), so stalls
queue: the job is stalled a fraction sum(rate_i x stall_i) of the time (the busy fraction of an M/G/1
queue) -- the accounting behind the published (MTBF - stall) / MTBF figures. Rollbacks form a Poisson
process in running time (rate lambda_r, see `effective_rollback_rate`), and the checkpoint plan keeps a
fraction `efficiency(lambda_r)` of the running time (see `CheckpointPlan.efficiency`). Degraded periods
(FT-HSDP) cost rate_i x degraded_h x degraded_fraction. So

    ETTR = max(0, (1 - sum rate_i stall_i) x efficiency(lambda_r) - sum rate_i degraded_i fraction_i)

Hot spares add P(no spare free) x replacement to each failure's stall (or to its degraded period).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from estimators.failures.checkpoint import CheckpointPlan
from estimators.failures.recovery import FailureClass, RecoveryTimes, spare_unavailable_probability

LOST_KEYS = ("detection", "restart", "checkpoint_load", "spare_wait", "recompute", "degraded", "checkpoint_writes")


@dataclass(frozen=True)
class ClosedForm:
    ettr: float
    mttf_h: float                      # mean time between failures of the job (any failure)
    rollback_mttf_h: float             # mean running time between rollbacks
    expected_failures: float           # over the horizon
    time_lost_h: dict[str, float]      # over the horizon, by cause (LOST_KEYS)
    stalled_fraction: float


def with_spare_waits(classes: list[FailureClass], times: RecoveryTimes) -> list[FailureClass]:
    """Each class with its expected hot-spare wait added (to the stall, or to the degraded period)."""
    total = sum(c.rate_per_h for c in classes)
    wait = spare_unavailable_probability(total, times.node_repair, times.spares) * times.replacement
    if wait <= 0:
        return classes
    out = []
    for c in classes:
        if c.spare_wait_stalls:
            out.append(FailureClass(c.name, c.rate_per_h, {**c.stall, "spare_wait": wait}, c.rollback,
                                    c.degraded_h, c.degraded_fraction, c.spare_wait_stalls))
        else:
            out.append(FailureClass(c.name, c.rate_per_h, c.stall, c.rollback, c.degraded_h + wait,
                                    c.degraded_fraction, c.spare_wait_stalls))
    return out


def closed_form(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float,
                times: RecoveryTimes | None = None) -> ClosedForm:
    if times is not None:
        classes = with_spare_waits(classes, times)
    rate = sum(c.rate_per_h for c in classes)
    rollback_rate = effective_rollback_rate(classes)
    stalled = sum(c.rate_per_h * c.stall_h for c in classes)
    running = max(0.0, 1.0 - stalled)
    eff = ckpt.efficiency(rollback_rate)
    degraded = sum(c.rate_per_h * c.degraded_h * c.degraded_fraction for c in classes)
    ettr = max(0.0, running * eff - degraded)
    return ClosedForm(ettr=ettr, mttf_h=_mean_time(rate), rollback_mttf_h=_mean_time(rollback_rate),
                      expected_failures=rate * horizon_h,
                      time_lost_h=_lost(classes, ckpt, horizon_h, stalled, running, eff, ettr),
                      stalled_fraction=min(1.0, stalled))


def effective_rollback_rate(classes: list[FailureClass]) -> float:
    """Rollbacks per running hour. Failures that roll back arrive at lambda_r; and a stall that does not
    roll back (an FT-HSDP replica's) still ends in a rollback when a whole-job failure lands inside it.
    Stall periods start as a Poisson process in running time, so rollbacks do too, at

        lambda_r + sum_i lambda_i (1 - G_i(lambda_r))

    where G_i(s) is the Laplace transform of the busy period (stalls queued behind stalls) that a
    non-rollback failure of class i starts, with only non-rollback failures arriving: the probability that
    no rollback failure lands in it. G_i solves Kendall's equation
    G_i(s) = exp(-(s + sum_j lambda_j (1 - G_j(s))) stall_i), iterated from 0 (the minimal root)."""
    lam_r = sum(c.rate_per_h for c in classes if c.rollback)
    others = [c for c in classes if not c.rollback and c.stall_h > 0]
    if lam_r <= 0 or not others:
        return lam_r
    g = [0.0] * len(others)
    for _ in range(500):
        arrivals = sum(c.rate_per_h * (1.0 - gi) for c, gi in zip(others, g))
        new = [math.exp(-(lam_r + arrivals) * c.stall_h) for c in others]
        if max(abs(a - b) for a, b in zip(new, g)) < 1e-12:
            g = new
            break
        g = new
    return lam_r + sum(c.rate_per_h * (1.0 - gi) for c, gi in zip(others, g))


def _mean_time(rate: float) -> float:
    return 1.0 / rate if rate > 0 else float("inf")


def _lost(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float, stalled: float, running: float,
          eff: float, ettr: float) -> dict[str, float]:
    """Expected hours lost over the horizon by cause; they add up to horizon x (1 - ETTR)."""
    lost = dict.fromkeys(LOST_KEYS, 0.0)
    scale = 1.0 / stalled if stalled > 1.0 else 1.0   # past saturation the stalls fill the whole horizon
    for c in classes:
        for part, h in c.stall.items():
            lost[part] += c.rate_per_h * h * scale * horizon_h
    writes = running * (ckpt.blocking / ckpt.cycle if 0 < ckpt.cycle < float("inf") else 0.0)
    lost["checkpoint_writes"] = writes * horizon_h
    lost["recompute"] += max(0.0, running * (1.0 - eff) - writes) * horizon_h
    lost["degraded"] = max(0.0, running * eff - ettr) * horizon_h
    return lost
