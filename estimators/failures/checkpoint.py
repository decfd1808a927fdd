"""Checkpoint policies: when to write, what a write costs, and how much work a rollback keeps.

Times are hours. A checkpoint cycle is `interval` of training plus `blocking` hours of write during
which training stops (a synchronous write: size / storage bandwidth). An asynchronous write copies the
state off the GPUs (`blocking`, a snapshot, often ~0) and persists it in the background: the checkpoint
can be restored only `persist` hours later.

Interval policies (a registry): `fixed` (the user's interval) and `optimal` (Young/Daly for the mean time
between failures that roll the job back).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from chakra_schema.errors import TraceInputError


def young_interval(write: float, mttf: float) -> float:
    """Young (1974): tau = sqrt(2 W M), first order in W / M."""
    return math.sqrt(2.0 * write * mttf)


def daly_interval(write: float, mttf: float) -> float:
    """Daly (2006), higher order: tau = sqrt(2WM) [1 + (1/3) sqrt(W/2M) + (1/9) (W/2M)] - W for W < 2M,
    else M. It is Young's interval corrected for the work lost in the write itself and for failures that
    land in the restart; the two agree to O(sqrt(W/M)) relatively for W << M."""
    if mttf == math.inf:
        return math.inf
    if write >= 2.0 * mttf:
        return mttf
    x = write / (2.0 * mttf)
    return math.sqrt(2.0 * write * mttf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - write


@dataclass(frozen=True)
class CheckpointPlan:
    """A checkpoint schedule, hours. interval = inf: never checkpoint (nothing rolls the job back);
    interval = 0: free checkpoints taken continuously (the limit of blocking = 0)."""

    policy: str
    interval: float
    blocking: float
    persist: float
    optimal_interval: float

    @property
    def cycle(self) -> float:
        return self.interval + self.blocking

    def kept_after_rollback(self, run):
        """Training hours kept (durable) out of `run` hours of running since the last restore, when a
        failure rolls the job back now. Works on floats and numpy arrays."""
        import numpy as np
        run = np.asarray(run, dtype=float)
        if self.interval == math.inf:
            return np.zeros_like(run)
        if self.interval == 0.0:
            return np.maximum(run - self.persist, 0.0)
        return self.interval * np.maximum(np.floor((run - self.persist) / self.cycle), 0.0)

    def kept_at_end(self, run):
        """Training hours in `run` hours of running when the horizon ends (nothing is rolled back)."""
        import numpy as np
        run = np.asarray(run, dtype=float)
        if self.interval in (0.0, math.inf):
            return run
        return self.interval * np.floor(run / self.cycle) + np.minimum(np.mod(run, self.cycle), self.interval)

    def efficiency(self, rollback_rate: float) -> float:
        """Long-run fraction of running time that becomes kept training, when failures that roll the job
        back arrive at `rollback_rate` per running hour (Poisson). A running stretch X ~ Exp(rate) starts
        at a restore and keeps `interval` per checkpoint made durable in it:
        E[kept] / E[X] = rate tau exp(-rate persist) / (exp(rate (tau + blocking)) - 1)."""
        lam, tau = rollback_rate, self.interval
        if lam <= 0.0:
            return 1.0 if tau in (0.0, math.inf) else tau / (tau + self.blocking)
        if tau == math.inf:
            return 0.0
        if tau == 0.0:
            return math.exp(-lam * self.persist)
        x = lam * (tau + self.blocking)
        if x > 700.0:      # e^x overflows a float: nothing survives that long between rollbacks
            return 0.0
        return lam * tau * math.exp(-lam * self.persist) / math.expm1(x)


# ---------------------------------------------------------------------- interval policies
IntervalPolicy = Callable[[float | None, float, float, float], float]
_POLICIES: dict[str, IntervalPolicy] = {}


def register_interval_policy(name: str) -> Callable[[IntervalPolicy], IntervalPolicy]:
    def deco(fn: IntervalPolicy) -> IntervalPolicy:
        _POLICIES[name] = fn
        return fn
    return deco


def optimal_interval(blocking: float, persist: float, rollback_mttf: float) -> float:
    """The interval that maximizes kept work: Daly's for a blocking write; an asynchronous write costs only
    its snapshot, so the next one starts as soon as the last has persisted (never sooner)."""
    return max(daly_interval(blocking, rollback_mttf), persist)


@register_interval_policy("fixed")
def _fixed(interval: float | None, blocking: float, persist: float, rollback_mttf: float) -> float:
    if interval is None or not 0 < interval < math.inf:
        raise TraceInputError(None, f"checkpoint interval must be a finite number > 0, got {interval!r}")
    return interval


@register_interval_policy("optimal")
def _optimal(interval: float | None, blocking: float, persist: float, rollback_mttf: float) -> float:
    return optimal_interval(blocking, persist, rollback_mttf)


def plan_checkpoints(interval: float | None, write: float, asynchronous: bool, rollback_mttf: float,
                     snapshot: float = 0.0) -> CheckpointPlan:
    """The checkpoint schedule: `interval` hours (None: optimal) with writes of `write` hours, blocking
    or asynchronous (then only `snapshot` hours block). An interval longer than the horizon is kept as
    given: no checkpoint completes within the horizon, and the finite-horizon ETTR prices that
    (`closed_form.expected_kept_hours`)."""
    blocking, persist = (snapshot, write) if asynchronous else (write, 0.0)
    policy = "optimal" if interval is None else "fixed"
    best = optimal_interval(blocking, persist, rollback_mttf)
    tau = _POLICIES[policy](interval, blocking, persist, rollback_mttf)
    if asynchronous and tau < persist:
        tau = persist  # a write cannot start before the previous one has persisted
    return CheckpointPlan(policy=policy, interval=tau, blocking=blocking, persist=persist, optimal_interval=best)
