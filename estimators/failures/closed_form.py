"""Closed-form expected effective training time ratio (ETTR): the expectation of the same model the Monte
Carlo simulates, over the same finite horizon.

Failures arrive at a constant rate in wall-clock time; a failure of class i stalls the whole job for u_i.
What a failure that lands inside another stall does is the *restart semantics* (`SEMANTICS`):

- `restart-over` (default, physical): the restart in progress starts over, so the job is down until the
  last failure's stall has run out. The job is stalled at time t iff some class-i failure fell in
  [t - u_i, t]: independent Poisson processes give a running fraction exp(-sum_i lambda_i u_i).
- `queue`: every failure adds its whole stall after the stalls already queued (the busy fraction of an M/G/1
  queue, sum_i lambda_i u_i, saturating at 1): the accounting behind the published (MTBF - stall) / MTBF
  figures.

Rollbacks form a Poisson process in running time (rate lambda_r, `effective_rollback_rate`). ETTR is the
expected training work kept over the horizon H divided by H (the finite-horizon definition both estimators
share, `expected_kept_hours`): work lost to a rollback counts as lost, work not yet checkpointed when the
horizon ends counts as kept (the job goes on and will checkpoint it). An interval longer than the horizon is
legal: no checkpoint completes, and only a rollback loses work.

FT-HSDP replicas (classes with a degraded fraction k/R): a replica hit by a failure is out from the failure
until its stall plus its restart `d` have run out, and a failure in a restarting replica restarts it (always
restart-over). A replica's missing throughput counts only while the job runs (a stalled job loses the time
already). Replica j is hit at rate Lambda = sum_c lambda_c k_c / R, so

    P(job running and replica j up) = exp(-sum_i lambda_i u_i) x exp(-sum_c lambda_c (k_c/R) d_c)

and the degraded loss is P(running) - that (restart-over; the queue form uses the queue's running fraction).

Hot spares add P(no spare free) x replacement to each failure's stall (or to its restart period).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from estimators.failures.checkpoint import CheckpointPlan
from estimators.failures.recovery import FailureClass, RecoveryTimes, spare_unavailable_probability

LOST_KEYS = ("detection", "restart", "checkpoint_load", "spare_wait", "recompute", "degraded", "checkpoint_writes")
SEMANTICS = ("restart-over", "queue")


@dataclass(frozen=True)
class ClosedForm:
    ettr: float
    mttf_h: float                      # mean time between failures of the job (any failure)
    rollback_mttf_h: float             # mean running time between rollbacks
    expected_failures: float           # over the horizon
    time_lost_h: dict[str, float]      # over the horizon, by cause (LOST_KEYS)
    stalled_fraction: float
    semantics: str = "restart-over"


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


def running_fraction(classes: list[FailureClass], semantics: str) -> float:
    """Long-run fraction of wall time the job is not stalled."""
    load = sum(c.rate_per_h * c.stall_h for c in classes)
    if semantics == "queue":
        return max(0.0, 1.0 - load)
    return math.exp(-load)


def running_hours(classes: list[FailureClass], horizon_h: float, semantics: str) -> float:
    """Expected hours the job runs in [0, horizon].
    - restart-over, from a healthy start: at time t only failures since 0 can stall it, so a class's
      exposure is lambda_i min(t, u_i), not the stationary lambda_i u_i: the difference is ~ u / horizon
      (negligible over days), but a horizon shorter than a stall is mostly running time, as the Monte Carlo
      finds.
      Running at t with probability exp(-sum_i lambda_i min(t, u_i)), integrated exactly piece by piece
      between the sorted stalls (the exponent is linear in t on each piece).
    - queue: the stationary busy fraction (`running_fraction`), the published accounting this semantics
      reproduces; a queue's warm-up from empty depends on how the stalls pile up, which it does not model."""
    H = horizon_h
    if H <= 0.0:
        return 0.0
    if semantics == "queue":
        return running_fraction(classes, semantics) * H
    parts = sorted((c.stall_h, c.rate_per_h) for c in classes if c.rate_per_h > 0 and c.stall_h > 0)
    total, t0 = 0.0, 0.0
    slope = sum(lam for _, lam in parts)     # rate of the classes whose stall is longer than t
    done = 0.0                               # sum of lambda_i u_i over the stalls shorter than t
    for u, lam in parts + [(math.inf, 0.0)]:
        t1 = min(u, H)
        if t1 > t0:
            # integral over [t0, t1] of exp(-slope t - done)
            total += math.exp(-done) * ((t1 - t0) if slope <= 0 else
                                        math.exp(-slope * t0) * -math.expm1(-slope * (t1 - t0)) / slope)
            t0 = t1
        if u >= H:
            break
        slope -= lam
        done += lam * u
    return total


def degraded_fraction(classes: list[FailureClass], running: float) -> float:
    """Throughput fraction missing while the job runs because replicas are restarting (see module doc)."""
    exposure = sum(c.rate_per_h * c.degraded_fraction * c.degraded_h for c in classes)
    return running * -math.expm1(-exposure)


def closed_form(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float,
                times: RecoveryTimes | None = None, semantics: str = "restart-over") -> ClosedForm:
    if times is not None:
        classes = with_spare_waits(classes, times)
    rate = sum(c.rate_per_h for c in classes)
    rollback_rate = effective_rollback_rate(classes, semantics)
    running = running_hours(classes, horizon_h, semantics) / horizon_h if horizon_h > 0 else 1.0
    kept = expected_kept_hours(ckpt, rollback_rate, running * horizon_h)
    degraded = degraded_fraction(classes, running)
    ettr = max(0.0, kept / horizon_h - degraded)
    return ClosedForm(ettr=ettr, mttf_h=_mean_time(rate), rollback_mttf_h=_mean_time(rollback_rate),
                      expected_failures=rate * horizon_h,
                      time_lost_h=_lost(classes, ckpt, horizon_h, running, kept, degraded, ettr),
                      stalled_fraction=1.0 - running, semantics=semantics)


def expected_kept_hours(ckpt: CheckpointPlan, rollback_rate: float, run_h: float) -> float:
    """Expected training hours kept out of `run_h` hours of running when rollbacks arrive as a Poisson process
    of `rollback_rate` per running hour. With A_t the running time since the last restore (A_t = min(t, X),
    X ~ Exp(rate)), a rollback at t keeps g(A_t) = `ckpt.kept_after_rollback` and the horizon's end keeps
    h(A_T) = `ckpt.kept_at_end`:

        E[kept] = rate x integral_0^T E[g(A_t)] dt + E[h(A_T)],
        E[f(A_t)] = integral_0^t rate e^(-rate a) f(a) da + e^(-rate t) f(t)

    integrated on a grid fine against both the checkpoint cycle and 1 / rate. Past 40 / rate the age
    distribution is stationary (e^-40 left), so the rest of the horizon adds its stationary rate."""
    lam, T = rollback_rate, run_h
    if T <= 0.0:
        return 0.0
    if lam <= 0.0:
        return float(ckpt.kept_at_end(T))
    span = min(T, 40.0 / lam)
    scale = min(ckpt.cycle if 0.0 < ckpt.cycle < math.inf else span, 1.0 / lam, span)
    n = int(min(2_000_000, max(4_001, 64 * span / scale)))
    a = np.linspace(0.0, span, n)
    w = lam * np.exp(-lam * a)
    g = ckpt.kept_after_rollback(a)
    h = ckpt.kept_at_end(a)
    F = _cumulative_trapezoid(w * g, a)
    survive = np.exp(-lam * a)
    inner = _cumulative_trapezoid(F + survive * g, a)[-1] + (T - span) * F[-1]
    end = _cumulative_trapezoid(w * h, a)[-1] + survive[-1] * (h[-1] if T == span else float(ckpt.kept_at_end(T)))
    return float(min(lam * inner + end, T))


def _cumulative_trapezoid(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(y)
    out[0] = 0.0
    np.cumsum((y[1:] + y[:-1]) * 0.5 * np.diff(x), out=out[1:])
    return out


def effective_rollback_rate(classes: list[FailureClass], semantics: str = "restart-over") -> float:
    """Rollbacks per running hour. Failures that roll back arrive at lambda_r; and a stall that does not
    roll back (an FT-HSDP replica's) still ends in a rollback when a whole-job failure lands inside it.
    Stall periods start as a Poisson process in running time, so rollbacks do too, at

        lambda_r + sum_i lambda_i (1 - G_i(lambda_r))

    where G_i(s) = E[exp(-s D_i)] over the down period D_i that a non-rollback failure of class i starts,
    with only non-rollback failures arriving: the probability that no rollback failure lands in it.
    - queue: D_i is an M/G/1 busy period; G_i solves Kendall's equation
      G_i(s) = exp(-(s + sum_j lambda_j (1 - G_j(s))) stall_i), iterated from 0 (the minimal root).
    - restart-over: D ends at the first gap of u without a failure; with rate lambda_n,
      G(s) = e^(-(lambda_n + s) u) / (1 - lambda_n (1 - e^(-(lambda_n + s) u)) / (lambda_n + s)).
      Non-rollback classes are merged into one at their rate-weighted stall (exact when the stalls are
      equal, as they are for FT-HSDP's replica classes)."""
    lam_r = sum(c.rate_per_h for c in classes if c.rollback)
    others = [c for c in classes if not c.rollback and c.stall_h > 0]
    if lam_r <= 0 or not others:
        return lam_r
    if semantics == "queue":
        return lam_r + _kendall_escape_rate(others, lam_r)
    lam_n = sum(c.rate_per_h for c in others)
    u = sum(c.rate_per_h * c.stall_h for c in others) / lam_n
    k = lam_n + lam_r
    g = math.exp(-k * u) / (1.0 - lam_n * -math.expm1(-k * u) / k)
    return lam_r + lam_n * (1.0 - g)


def _kendall_escape_rate(others: list[FailureClass], lam_r: float) -> float:
    g = [0.0] * len(others)
    for _ in range(500):
        arrivals = sum(c.rate_per_h * (1.0 - gi) for c, gi in zip(others, g))
        new = [math.exp(-(lam_r + arrivals) * c.stall_h) for c in others]
        if max(abs(a - b) for a, b in zip(new, g)) < 1e-12:
            g = new
            break
        g = new
    return sum(c.rate_per_h * (1.0 - gi) for c, gi in zip(others, g))


def _mean_time(rate: float) -> float:
    return 1.0 / rate if rate > 0 else float("inf")


def _lost(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float, running: float, kept: float,
          degraded: float, ettr: float) -> dict[str, float]:
    """Expected hours lost over the horizon by cause; they add up to horizon x (1 - ETTR)."""
    lost = dict.fromkeys(LOST_KEYS, 0.0)
    load = sum(c.rate_per_h * c.stall_h for c in classes)
    stalled_h = (1.0 - running) * horizon_h
    for c in classes:          # the stalled time, shared by cause in proportion to rate x stall
        for part, h in c.stall.items():
            lost[part] += stalled_h * c.rate_per_h * h / load if load > 0 else 0.0
    run_h = running * horizon_h
    wasted = max(0.0, run_h - kept)
    writes = run_h * (ckpt.blocking / ckpt.cycle if 0 < ckpt.cycle < math.inf else 0.0)
    lost["checkpoint_writes"] = min(writes, wasted)
    lost["recompute"] += wasted - lost["checkpoint_writes"]
    lost["degraded"] = max(0.0, kept / horizon_h - ettr) * horizon_h if degraded > 0 else 0.0
    return lost
