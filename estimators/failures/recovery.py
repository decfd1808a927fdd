"""Recovery strategies (a registry): what one failure costs the job.

A strategy turns the failure model's components into failure classes: a rate, the stall of the whole
job split into named parts (detection, restart, ...), whether the job rolls back to its last checkpoint,
and a degraded period during which a fraction of the job's throughput is missing. The closed form and the
Monte Carlo both read these classes, so a new strategy is one function here.

- `sync`: the whole job stops: detection/timeout, restart and re-initialisation (communicators included,
  growing with scale), checkpoint load, then the work since the last checkpoint is recomputed.
- `ft-hsdp`: the data-parallel replica is the unit of fault tolerance: only the replicas holding the
  failed nodes leave; the job stalls for the fault-tolerant all-reduce's timeout, the redone in-flight
  step and the rejoin, and runs at (R-k)/R throughput while those replicas restart. Failures that hit
  every replica (scope "job", or a domain as large as the job) fall back to `sync` recovery; checkpoints
  exist only for those.

Hot spares (either strategy): a pool of `spares` standby nodes; a failure that finds the pool empty
(every spare taken by nodes still in repair) waits `replacement` hours for a node.

Times are hours; rates are per hour of wall-clock time (hardware fails whether or not the job runs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from chakra_schema.errors import TraceInputError
from estimators.failures.model import FailureModel

H_PER_S = 1.0 / 3600.0


@dataclass(frozen=True)
class RecoveryTimes:
    """Resolved recovery inputs, hours."""

    detection: float                 # failure -> job notices (collective timeout / watchdog)
    restart: float                   # sync: stop, reschedule, restart processes, re-initialise communicators
    checkpoint_load: float           # sync: read the last checkpoint back
    ft_reconfigure: float            # ft-hsdp: fault-tolerant all-reduce changes its participants
    ft_redo_step: float              # ft-hsdp: the in-flight step is redone
    ft_rejoin: float                 # ft-hsdp: stall when the restarted replica rejoins
    replica_restart: float           # ft-hsdp: a replica's restart and catch-up (the degraded period)
    stall_override: float | None = None   # the user's total stall per failure (parts scaled to it)
    spares: int | None = None        # hot-spare nodes (None: a replacement is always ready)
    node_repair: float = 24.0        # hours a failed node is out (it returns to the spare pool)
    replacement: float = 0.5         # wait for a node when no spare is free


@dataclass(frozen=True)
class FailureClass:
    name: str
    rate_per_h: float
    stall: dict[str, float]          # named parts of the whole-job stall, hours
    rollback: bool                   # the job restarts from its last checkpoint
    degraded_h: float = 0.0          # hours at reduced throughput after the stall
    degraded_fraction: float = 0.0   # fraction of throughput missing meanwhile
    spare_wait_stalls: bool = True   # a missing spare stalls the job (True) or extends the degraded period

    @property
    def stall_h(self) -> float:
        return sum(self.stall.values())


@dataclass(frozen=True)
class Job:
    gpus: int
    gpus_per_node: int
    replicas: int = 1

    @property
    def nodes(self) -> int:
        """Failures are per node: a job on part of a node still runs on (and fails with) the whole node."""
        return math.ceil(self.gpus / self.gpus_per_node)

    def rate_per_h(self, rate_per_1000_node_days: float) -> float:
        return self.nodes * rate_per_1000_node_days / 1000.0 / 24.0


Strategy = Callable[[Job, FailureModel, RecoveryTimes], list[FailureClass]]
_STRATEGIES: dict[str, Strategy] = {}


def register_strategy(name: str) -> Callable[[Strategy], Strategy]:
    def deco(fn: Strategy) -> Strategy:
        _STRATEGIES[name] = fn
        return fn
    return deco


def strategies() -> list[str]:
    return sorted(_STRATEGIES)


def failure_classes(strategy: str, job: Job, model: FailureModel, times: RecoveryTimes) -> list[FailureClass]:
    if strategy not in _STRATEGIES:
        raise TraceInputError(None, f"unknown recovery strategy '{strategy}' (known: {', '.join(strategies())})")
    return [c for c in _STRATEGIES[strategy](job, model, times) if c.rate_per_h > 0]


def _sync_stall(times: RecoveryTimes) -> dict[str, float]:
    parts = {"detection": times.detection, "restart": times.restart, "checkpoint_load": times.checkpoint_load}
    return _scaled(parts, times.stall_override)


def _scaled(parts: dict[str, float], total: float | None) -> dict[str, float]:
    """Parts scaled to sum to `total` (the user's --stall-min), keeping their proportions."""
    if total is None:
        return parts
    s = sum(parts.values())
    if s <= 0:
        return {**{k: 0.0 for k in parts}, next(iter(parts)): total}
    return {k: v * total / s for k, v in parts.items()}


@register_strategy("sync")
def sync_strategy(job: Job, model: FailureModel, times: RecoveryTimes) -> list[FailureClass]:
    """Every failure stops the whole job and rolls it back to the last checkpoint."""
    rate = job.rate_per_h(model.rate_per_1000_node_days)
    return [FailureClass("job restart", rate, _sync_stall(times), rollback=True)]


@register_strategy("ft-hsdp")
def ft_hsdp_strategy(job: Job, model: FailureModel, times: RecoveryTimes) -> list[FailureClass]:
    """Failures confined to k < R replicas: a short stall then (R-k)/R throughput while they restart;
    failures of every replica: as `sync`."""
    nodes_per_replica = job.nodes / job.replicas
    by_k: dict[int, float] = {}
    whole_job = 0.0
    for c in model.components:
        rate = job.rate_per_h(c.rate_per_1000_node_days)
        k = job.replicas if c.scope == "job" else min(job.replicas, math.ceil(c.nodes / nodes_per_replica - 1e-9))
        if k >= job.replicas:
            whole_job += rate
        else:
            by_k[k] = by_k.get(k, 0.0) + rate
    stall = _scaled({"detection": times.detection, "restart": times.ft_reconfigure + times.ft_rejoin,
                     "recompute": times.ft_redo_step}, times.stall_override)
    out = [FailureClass(f"{k} of {job.replicas} replicas", rate, stall, rollback=False,
                        degraded_h=times.replica_restart, degraded_fraction=k / job.replicas,
                        spare_wait_stalls=False)
           for k, rate in sorted(by_k.items())]
    # --stall-min is the replica stall; a whole-job failure takes the full synchronous recovery
    out.append(FailureClass("whole job", whole_job, _sync_stall(replace(times, stall_override=None)), rollback=True))
    return out


# ---------------------------------------------------------------------- defaults with their sources
@dataclass(frozen=True)
class RecoveryDefaults:
    detection_s: float = 60.0
    cold_restart_points: tuple[tuple[float, float], ...] = ((16_000, 200.0), (22_000, 300.0), (64_000, 600.0),
                                                            (98_000, 900.0))
    ft_reconfigure_s: float = 0.0
    ft_redo_step_s: float = 20.0
    ft_rejoin_s: float = 100.0
    replica_restart_s: float = 420.0
    checkpoint_bytes_per_param: float = 14.0
    storage_write_gbs: float = 2000.0
    checkpoint_write_min_without_model: float = 5.0
    node_repair_h: float = 24.0
    replacement_min: float = 30.0
    sources: dict[str, str] = field(default_factory=lambda: dict(SOURCES))


SOURCES = {
    "detection_s": "Salpekar et al. 2026, Training LLMs with Fault Tolerant HSDP on 100,000 GPUs (arXiv:2602.00277): the fault-tolerant all-reduce times out after ~60 s; used for both strategies",
    "cold_restart_points": "Salpekar et al. 2026, Training LLMs with Fault Tolerant HSDP on 100,000 GPUs (arXiv:2602.00277): synchronous cold recovery ~200 s at 16K GPUs, ~300 s at 22K, ~600 s at "
                           "64K, ~900 s at 98K (communicator initialisation included); log-log interpolation, "
                           "power-law extrapolation outside",
    "ft_reconfigure_s": "Salpekar et al. 2026, Training LLMs with Fault Tolerant HSDP on 100,000 GPUs (arXiv:2602.00277): FT-HSDP stall ~3 min = timeout ~60 s + redo ~20 s + rejoin ~100 s, which "
                        "leaves ~0 s for the CPU-driven reconfiguration itself",
    "ft_redo_step_s": "Salpekar et al. 2026, Training LLMs with Fault Tolerant HSDP on 100,000 GPUs (arXiv:2602.00277): redoing the in-flight step ~20 s (the model's step time when a model is given)",
    "ft_rejoin_s": "Salpekar et al. 2026, Training LLMs with Fault Tolerant HSDP on 100,000 GPUs (arXiv:2602.00277): the job stalls ~100 s when the recovering replica rejoins",
    "replica_restart_s": "Salpekar et al. 2026, Training LLMs with Fault Tolerant HSDP on 100,000 GPUs (arXiv:2602.00277): the job runs at 11/12 throughput for ~7 min while the replica restarts "
                         "(capped at the whole job's restart)",
    "checkpoint_bytes_per_param": "ZeRO paper (Rajbhandari et al. 2020) mixed-precision Adam state: 2 B bf16 "
                                  "weights + 12 B fp32 master weights, momentum and variance per parameter",
    "storage_write_gbs": "Llama 3 paper (Dubey et al. 2024, sec. 3.3.1): Tectonic storage sustains 2 TB/s",
    "checkpoint_write_min_without_model": "assumption (no model to size the checkpoint): 5 min, the write time of Daly's and Young's worked examples",
    "node_repair_h": "assumption (no published figure): a failed node is out for a day",
    "replacement_min": "assumption (no published figure): 30 min to get a node when no hot spare is free",
}
DEFAULTS = RecoveryDefaults()


def cold_restart_s(gpus: float, points: tuple[tuple[float, float], ...] = DEFAULTS.cold_restart_points) -> float:
    """Synchronous restart + re-initialisation of a `gpus`-GPU job: piecewise power law through the
    published points, extended with the end segments' exponents."""
    xs = [math.log(p[0]) for p in points]
    ys = [math.log(p[1]) for p in points]
    x = math.log(max(gpus, 1.0))
    i = 0 if x <= xs[1] else len(xs) - 2 if x >= xs[-2] else max(j for j in range(len(xs) - 1) if xs[j] <= x)
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return math.exp(ys[i] + slope * (x - xs[i]))


def spare_unavailable_probability(failures_per_h: float, repair_h: float, spares: int | None) -> float:
    """P(a failure finds every hot spare taken): failed nodes in repair over the last `repair_h` hours are
    N ~ Poisson(a = rate x repair_h); the pool is empty when N >= `spares`. Only the terms within 12 standard
    deviations (+40) of the mean are summed, in log space: outside that window the Poisson mass is below
    1e-30, and the sum neither loops over a billion spares nor underflows e^-a at a > 745."""
    if spares is None:
        return 0.0
    a = failures_per_h * repair_h
    if a <= 0.0:
        return 0.0 if spares > 0 else 1.0
    width = 12.0 * math.sqrt(a) + 40.0
    lo, hi = max(0, int(a - width)), int(a + width) + 1
    if spares >= hi:
        return 0.0
    if spares <= lo:
        return 1.0
    n = np.arange(lo + 1, spares, dtype=float)
    first = -a + lo * math.log(a) - math.lgamma(lo + 1)          # log P(N = lo)
    log_terms = first + np.concatenate(([0.0], np.cumsum(np.log(a / n))))   # log P(N = lo .. spares-1)
    return max(0.0, 1.0 - float(np.exp(log_terms).sum()))
