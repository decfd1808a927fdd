"""Monte Carlo of a training job over a horizon: failures, detection, restart, checkpoints, rollbacks,
degraded replicas and hot spares -> ETTR per trial, its mean and 5-95% band.

Each trial draws its failure times (a Poisson process, or a Weibull renewal process with the same mean)
and each failure's class (by the classes' rates). The job state between failures is simple -- when the
queue of stalls ends, how long it has run since its last restore -- so the state changes only at
failures. Two engines walk the same draws:

- `vector` (default): trials in lockstep, one numpy step per failure index across all trials; 1,000
  trials of a 30-day 16K-GPU job take milliseconds.
- `simpy`: one SimPy process per trial, a timeout per failure: the readable reference implementation.
  Given the same draws both give the same ETTRs (a test checks it).

Semantics are the closed form's (see `estimators.failures.closed_form`): stalls queue; a failure that
rolls back keeps only the work of checkpoints durable by then; a degraded period starts when its stall
ends and costs its fraction of the throughput until it ends or the horizon does. Work not yet
checkpointed at the horizon counts (the job goes on).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from chakra_schema.errors import TraceInputError
from estimators.failures.checkpoint import CheckpointPlan
from estimators.failures.recovery import FailureClass, RecoveryTimes

ENGINES = ("vector", "simpy")


@dataclass(frozen=True)
class FailureDraws:
    times: np.ndarray        # [trials, max_failures] hours, sorted per row, padded with +inf
    classes: np.ndarray      # [trials, max_failures] class index
    spare_wait: np.ndarray   # [trials, max_failures] hours waited for a node (0 with a spare)


@dataclass(frozen=True)
class MonteCarloResult:
    ettr: np.ndarray         # per trial
    failures: np.ndarray     # per trial
    engine: str

    @property
    def mean(self) -> float:
        return float(self.ettr.mean())

    @property
    def p05(self) -> float:
        return float(np.percentile(self.ettr, 5))

    @property
    def p95(self) -> float:
        return float(np.percentile(self.ettr, 95))


# ---------------------------------------------------------------------- drawing failures
def draw_failures(classes: list[FailureClass], horizon_h: float, trials: int, rng: np.random.Generator,
                  distribution: str = "exponential", weibull_shape: float = 0.7,
                  times: RecoveryTimes | None = None) -> FailureDraws:
    rate = sum(c.rate_per_h for c in classes)
    if rate <= 0 or not classes:
        empty = np.empty((trials, 0))
        return FailureDraws(empty, empty.astype(np.int64), empty)
    if distribution == "exponential":
        t = _poisson_times(rate, horizon_h, trials, rng)
    elif distribution == "weibull":
        t = _weibull_times(rate, horizon_h, trials, rng, weibull_shape)
    else:
        raise TraceInputError(None, f"unknown failure distribution '{distribution}'")
    p = np.array([c.rate_per_h for c in classes]) / rate
    cls = rng.choice(len(classes), size=t.shape, p=p)
    return FailureDraws(t, cls, _spare_waits(t, times))


def _poisson_times(rate: float, horizon_h: float, trials: int, rng: np.random.Generator) -> np.ndarray:
    n = rng.poisson(rate * horizon_h, size=trials)
    width = int(n.max()) if trials else 0
    t = rng.uniform(0.0, horizon_h, size=(trials, width))
    t[np.arange(width)[None, :] >= n[:, None]] = np.inf   # row i keeps n[i] uniform times
    return np.sort(t, axis=1)


def _weibull_times(rate: float, horizon_h: float, trials: int, rng: np.random.Generator, shape: float) -> np.ndarray:
    """Renewal process with Weibull(shape) gaps of mean 1 / rate."""
    scale = 1.0 / (rate * math.gamma(1.0 + 1.0 / shape))
    width = max(8, int(rate * horizon_h * 1.5 + 10 * math.sqrt(rate * horizon_h + 1)))
    while True:
        t = np.cumsum(scale * rng.weibull(shape, size=(trials, width)), axis=1)
        if trials == 0 or (t[:, -1] > horizon_h).all():
            break
        width *= 2
    t[t >= horizon_h] = np.inf
    return t[:, : max(1, int(np.isfinite(t).sum(axis=1).max()))]


def _spare_waits(t: np.ndarray, times: RecoveryTimes | None) -> np.ndarray:
    """Wait per failure for a node: the pool of `spares` is empty when at least that many earlier failed
    nodes are still in repair (failed within the last `node_repair` hours)."""
    wait = np.zeros_like(t)
    if times is None or times.spares is None or t.size == 0:
        return wait
    rows, width = t.shape
    # one flat sorted array: row r's times offset by r * (span) so searchsorted works on every row at once
    finite = np.where(np.isfinite(t), t, 0.0)
    span = float(finite.max()) + times.node_repair + 1.0
    flat = (np.where(np.isfinite(t), t, span - 0.5) + np.arange(rows)[:, None] * span).ravel()
    first = np.searchsorted(flat, flat - times.node_repair, side="right").reshape(rows, width)
    first -= (np.arange(rows) * width)[:, None]
    in_repair = np.arange(width)[None, :] - np.maximum(first, 0)
    wait[(in_repair >= times.spares) & np.isfinite(t)] = times.replacement
    return wait


# ---------------------------------------------------------------------- engines
def simulate(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float, trials: int = 1000,
             seed: int = 0, distribution: str = "exponential", weibull_shape: float = 0.7,
             times: RecoveryTimes | None = None, engine: str = "vector",
             progress: Callable[[int, int], None] | None = None) -> MonteCarloResult:
    rng = np.random.default_rng(seed)
    draws = draw_failures(classes, horizon_h, trials, rng, distribution, weibull_shape, times)
    run = {"vector": run_vector, "simpy": run_simpy}.get(engine)
    if run is None:
        raise TraceInputError(None, f"unknown Monte Carlo engine '{engine}' (known: {', '.join(ENGINES)})")
    ettr = run(classes, ckpt, horizon_h, draws, progress)
    return MonteCarloResult(ettr=ettr, failures=np.isfinite(draws.times).sum(axis=1), engine=engine)


def _class_arrays(classes: list[FailureClass]):
    stall = np.array([c.stall_h for c in classes] or [0.0])
    rollback = np.array([c.rollback for c in classes] or [False])
    deg_h = np.array([c.degraded_h for c in classes] or [0.0])
    deg_f = np.array([c.degraded_fraction for c in classes] or [0.0])
    wait_stalls = np.array([c.spare_wait_stalls for c in classes] or [True])
    return stall, rollback, deg_h, deg_f, wait_stalls


def run_vector(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float, draws: FailureDraws,
               progress=None) -> np.ndarray:
    stall, rollback, deg_h, deg_f, wait_stalls = _class_arrays(classes)
    trials, width = draws.times.shape
    busy = np.zeros(trials)       # when the queue of stalls ends
    seg = np.zeros(trials)        # running hours since the last restore
    kept = np.zeros(trials)       # durable training hours
    deg_loss = np.zeros(trials)   # throughput-hours missing in degraded periods
    for j in range(width):
        t, c, w = draws.times[:, j], draws.classes[:, j], draws.spare_wait[:, j]
        valid = np.isfinite(t)
        if not valid.any():
            break
        t = np.where(valid, t, horizon_h)
        seg += np.where(valid, np.maximum(t - busy, 0.0), 0.0)
        rb = valid & rollback[c]
        kept += np.where(rb, ckpt.kept_after_rollback(seg), 0.0)
        seg = np.where(rb, 0.0, seg)
        end = np.maximum(busy, t) + stall[c] + np.where(wait_stalls[c], w, 0.0)
        busy = np.where(valid, end, busy)
        d = deg_h[c] + np.where(wait_stalls[c], 0.0, w)
        deg_loss += np.where(valid, deg_f[c] * np.clip(horizon_h - busy, 0.0, d), 0.0)
        if progress and j % 64 == 0:
            progress(j, width)
    seg += np.maximum(horizon_h - busy, 0.0)
    kept += ckpt.kept_at_end(seg)
    return np.maximum(kept - deg_loss, 0.0) / horizon_h


def run_simpy(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float, draws: FailureDraws,
              progress=None) -> np.ndarray:
    import simpy

    stall, rollback, deg_h, deg_f, wait_stalls = _class_arrays(classes)
    env = simpy.Environment()
    out = np.zeros(draws.times.shape[0])

    def trial(i: int):
        busy = seg = kept = deg_loss = 0.0
        for t, c, w in zip(draws.times[i], draws.classes[i], draws.spare_wait[i]):
            if not math.isfinite(t):
                break
            yield env.timeout(t - env.now)          # the next failure
            seg += max(env.now - busy, 0.0)
            if rollback[c]:                           # back to the last durable checkpoint
                kept += float(ckpt.kept_after_rollback(seg))
                seg = 0.0
            busy = max(busy, env.now) + stall[c] + (w if wait_stalls[c] else 0.0)
            d = deg_h[c] + (0.0 if wait_stalls[c] else w)
            deg_loss += deg_f[c] * min(max(horizon_h - busy, 0.0), d)
        yield env.timeout(horizon_h - env.now)
        seg += max(horizon_h - busy, 0.0)
        kept += float(ckpt.kept_at_end(seg))
        out[i] = max(kept - deg_loss, 0.0) / horizon_h

    procs = [env.process(trial(i)) for i in range(len(out))]
    env.run()
    assert all(p.processed for p in procs)
    if progress:
        progress(len(out), len(out))
    return out
