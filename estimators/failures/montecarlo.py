"""Monte Carlo of a training job over a horizon: failures, detection, restart, checkpoints, rollbacks,
degraded replicas and hot spares -> ETTR per trial, its mean and 5-95% band.

Each trial draws its failure times (a Poisson process, or a Weibull renewal process with the same mean),
each failure's class (by the classes' rates) and, for failures that take replicas out, the first replica
hit (a failure domain of k replicas takes k neighbours). The job state between failures is simple -- when
the current stall ends, how long it has run since its last restore -- so the state changes only at
failures. Two engines walk the same draws:

- `vector` (default): trials in lockstep, one numpy step per failure index across all trials; 1,000
  trials of a 30-day 16K-GPU job take milliseconds.
- `simpy`: one SimPy process per trial, a timeout per failure: the readable reference implementation.
  Given the same draws both give the same ETTRs (a test checks it).

Semantics are the closed form's (see `estimators.failures.closed_form`): a failure inside a stall starts
the restart over (the job is down until its own stall ends, if later) or queues its whole stall
(`queue`); a failure that rolls back keeps only the work of checkpoints durable by then; a replica is out
from its failure until its stall and restart have run out (a new failure of that replica restarts it),
and costs its share of the throughput only while the job runs (`degraded_loss`). Work not yet checkpointed
at the horizon counts (the job goes on).
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
    replica: np.ndarray | None = None   # [trials, max_failures] first replica a failure takes out
    replicas: int = 1


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
                  times: RecoveryTimes | None = None, replicas: int = 1) -> FailureDraws:
    rate = sum(c.rate_per_h for c in classes)
    if rate <= 0 or not classes:
        empty = np.empty((trials, 0))
        return FailureDraws(empty, empty.astype(np.int64), empty, empty.astype(np.int64), replicas)
    if distribution == "exponential":
        t = _poisson_times(rate, horizon_h, trials, rng)
    elif distribution == "weibull":
        t = _weibull_times(rate, horizon_h, trials, rng, weibull_shape)
    else:
        raise TraceInputError(None, f"unknown failure distribution '{distribution}'")
    p = np.array([c.rate_per_h for c in classes]) / rate
    cls = rng.choice(len(classes), size=t.shape, p=p)
    waits = _spare_waits(t, times)
    replica = rng.integers(0, max(1, replicas), size=t.shape)
    return FailureDraws(t, cls, waits, replica, max(1, replicas))


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
             progress: Callable[[int, int], None] | None = None, semantics: str = "restart-over",
             replicas: int = 1) -> MonteCarloResult:
    rng = np.random.default_rng(seed)
    draws = draw_failures(classes, horizon_h, trials, rng, distribution, weibull_shape, times, replicas)
    run = {"vector": run_vector, "simpy": run_simpy}.get(engine)
    if run is None:
        raise TraceInputError(None, f"unknown Monte Carlo engine '{engine}' (known: {', '.join(ENGINES)})")
    ettr = run(classes, ckpt, horizon_h, draws, progress, semantics)
    return MonteCarloResult(ettr=ettr, failures=np.isfinite(draws.times).sum(axis=1), engine=engine)


def _class_arrays(classes: list[FailureClass]):
    stall = np.array([c.stall_h for c in classes] or [0.0])
    rollback = np.array([c.rollback for c in classes] or [False])
    deg_h = np.array([c.degraded_h for c in classes] or [0.0])
    deg_f = np.array([c.degraded_fraction for c in classes] or [0.0])
    wait_stalls = np.array([c.spare_wait_stalls for c in classes] or [True])
    return stall, rollback, deg_h, deg_f, wait_stalls


def _stall_end(busy, t, stall, semantics: str):
    """When the job runs again after a failure at `t` with `stall` hours of recovery, `busy` being when the
    stall in progress (if any) ends: restart-over -> the later of the two; queue -> appended."""
    if semantics == "queue":
        return np.maximum(busy, t) + stall
    return np.maximum(busy, t + stall)


def run_vector(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float, draws: FailureDraws,
               progress=None, semantics: str = "restart-over") -> np.ndarray:
    stall, rollback, deg_h, deg_f, wait_stalls = _class_arrays(classes)
    trials, width = draws.times.shape
    busy = np.zeros(trials)       # when the current stall ends
    seg = np.zeros(trials)        # running hours since the last restore
    kept = np.zeros(trials)       # durable training hours
    ends = np.full((trials, width), np.inf)   # when the job ran again after each failure
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
        own = stall[c] + np.where(wait_stalls[c], w, 0.0)
        busy = np.where(valid, _stall_end(busy, t, own, semantics), busy)
        ends[:, j] = np.where(valid, busy, np.inf)
        if progress and j % 64 == 0:
            progress(j, width)
    seg += np.maximum(horizon_h - busy, 0.0)
    kept += ckpt.kept_at_end(seg)
    return np.maximum(kept - degraded_loss(classes, draws, ends, horizon_h, semantics), 0.0) / horizon_h


def run_simpy(classes: list[FailureClass], ckpt: CheckpointPlan, horizon_h: float, draws: FailureDraws,
              progress=None, semantics: str = "restart-over") -> np.ndarray:
    import simpy

    stall, rollback, deg_h, deg_f, wait_stalls = _class_arrays(classes)
    env = simpy.Environment()
    kept_h = np.zeros(draws.times.shape[0])
    ends = np.full(draws.times.shape, np.inf)

    def trial(i: int):
        busy = seg = kept = 0.0
        for j, (t, c, w) in enumerate(zip(draws.times[i], draws.classes[i], draws.spare_wait[i])):
            if not math.isfinite(t):
                break
            yield env.timeout(t - env.now)          # the next failure
            seg += max(env.now - busy, 0.0)
            if rollback[c]:                           # back to the last durable checkpoint
                kept += float(ckpt.kept_after_rollback(seg))
                seg = 0.0
            own = stall[c] + (w if wait_stalls[c] else 0.0)
            busy = max(busy, env.now) + own if semantics == "queue" else max(busy, env.now + own)
            ends[i, j] = busy
        yield env.timeout(horizon_h - env.now)
        seg += max(horizon_h - busy, 0.0)
        kept_h[i] = kept + float(ckpt.kept_at_end(seg))

    procs = [env.process(trial(i)) for i in range(len(kept_h))]
    env.run()
    assert all(p.processed for p in procs)
    if progress:
        progress(len(kept_h), len(kept_h))
    return np.maximum(kept_h - degraded_loss(classes, draws, ends, horizon_h, semantics), 0.0) / horizon_h


# ---------------------------------------------------------------------- degraded replicas
def degraded_loss(classes: list[FailureClass], draws: FailureDraws, ends: np.ndarray, horizon_h: float,
                  semantics: str) -> np.ndarray:
    """Throughput-hours missing per trial while replicas restart and the job runs.

    A failure of a class with degraded fraction k/R takes out k neighbouring replicas (from its drawn first
    replica) from its time for its own stall plus the class's restart period (+ a spare wait); the replica's
    recovery runs beside the job's other stalls. A replica's periods are merged (a failure of a restarting replica restarts it), and only the part
    outside the job's stalls counts, each replica weighing 1/R. Vectorized over trials: every trial (and
    every trial's replica) lives on its own stretch of one number line."""
    stall, rollback, deg_h, deg_f, wait_stalls = _class_arrays(classes)
    trials, width = draws.times.shape
    loss = np.zeros(trials)
    R = draws.replicas
    if width == 0 or not (deg_f > 0).any() or draws.replica is None:
        return loss
    t, c = draws.times, draws.classes
    valid = np.isfinite(t)
    span = 2.0 * horizon_h + 1.0
    # the job's stalls: [failure, when it ran again], merged per trial
    stall_start = np.where(valid, t, horizon_h)
    stall_end = np.where(valid, np.minimum(ends, horizon_h), horizon_h)
    s_starts, s_cum, s_ends = _merged((np.arange(trials)[:, None] * span + stall_start)[valid],
                                      (np.arange(trials)[:, None] * span + stall_end)[valid])
    # replica periods of the degrading failures, one row per replica taken out
    hit = valid & (deg_f[c] > 0)
    trial_of, col = np.nonzero(hit)
    cls = c[hit]
    k = np.maximum(1, np.rint(deg_f[cls] * R).astype(np.int64))
    start = t[hit]
    # the replica's own recovery: its stall, then its restart (a spare wait extends whichever it delays); it
    # runs beside any other stall of the job, so it ends on its own clock
    own = stall[cls] + deg_h[cls] + draws.spare_wait[hit]
    end = np.minimum(start + own, horizon_h)
    rep = np.repeat(np.arange(len(k)), k)
    offset = np.arange(len(rep)) - np.repeat(np.cumsum(k) - k, k)
    replica = (draws.replica[hit][rep] + offset) % R
    tr, start, end = trial_of[rep], start[rep], end[rep]
    group = tr * R + replica
    order = np.lexsort((start, group))
    g_starts, _, g_ends = _merged((group * span + start)[order], (group * span + end)[order], presorted=True)
    g_trial = (g_starts // span // R).astype(np.int64)
    local_s = g_starts - (g_starts // span) * span
    local_e = g_ends - (g_starts // span) * span
    base = g_trial * span
    stalled = _measure_below(s_starts, s_cum, s_ends, base + local_e) - _measure_below(s_starts, s_cum, s_ends,
                                                                                         base + local_s)
    np.add.at(loss, g_trial, (local_e - local_s - stalled) / R)
    return loss


def _merged(starts: np.ndarray, ends: np.ndarray, presorted: bool = False):
    """Union of intervals on a line: (segment starts, measure before each segment, segment ends)."""
    if starts.size == 0:
        return starts, starts, ends
    if not presorted:
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.ones(starts.size, dtype=bool)
    new[1:] = starts[1:] > reach[:-1]
    seg_start = starts[new]
    last = np.append(np.flatnonzero(new)[1:] - 1, starts.size - 1)
    seg_end = reach[last]
    cum = np.concatenate(([0.0], np.cumsum(seg_end - seg_start)[:-1]))
    return seg_start, cum, seg_end


def _measure_below(seg_start: np.ndarray, cum: np.ndarray, seg_end: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Measure of the union's part left of each x."""
    if seg_start.size == 0:
        return np.zeros_like(x)
    i = np.searchsorted(seg_start, x, side="right") - 1
    inside = np.clip(x - seg_start[np.maximum(i, 0)], 0.0, (seg_end - seg_start)[np.maximum(i, 0)])
    return np.where(i >= 0, cum[np.maximum(i, 0)] + inside, 0.0)
