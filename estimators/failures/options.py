"""`FailureOptions`: the scenario's `[failure]` section (`Scenario.failure`), owned by the `failures`
what-if. Every field has a default; None means "derived" (from the scenario's model and plan, the failure
model preset, or the documented recovery defaults in `estimators.failures.recovery.SOURCES`).

    --set failure.strategy=ft-hsdp --set failure.rate_per_1000_node_days=3 --set failure.gpus=16384
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from chakra_schema.errors import TraceInputError, check_choice
from estimators.failures.closed_form import SEMANTICS
from estimators.failures.recovery import DEFAULTS

STRATEGIES = ("sync", "ft-hsdp")   # mirrors estimators.failures.recovery's registry (checked there too)
MAX_GPUS = 1 << 20                 # the largest job any what-if accepts (1,048,576 GPUs)
MAX_MINUTES = 10 * 365 * 24 * 60.0  # any duration: ten years
MAX_HORIZON_DAYS = 10 * 365.0
MAX_RATE = 1e5                     # failures per 1,000 node-days: one per node every 15 minutes
MAX_TRIALS = 1_000_000


@dataclass(frozen=True)
class FailureOptions:
    gpus: int | None = None                        # job size (None: the plan's GPUs)
    gpus_per_node: int | None = None               # None: the plan's (8)
    failure_model: str = "llama3-405b"             # preset name or TOML path
    rate_per_1000_node_days: float | None = None   # None: the failure model's rate (its mix of causes kept)
    distribution: str | None = None                # exponential | weibull (None: the failure model's)
    weibull_shape: float = 0.7                     # Schroeder & Gibson (DSN 2006): 0.7-0.8 between HPC failures
    strategy: str = "sync"                         # sync | ft-hsdp
    restart_semantics: str = "restart-over"        # a failure inside a stall: restart-over | queue
    replicas: int | None = None                    # FT-HSDP replicas (None: plan DP / dp_shard, or 12 without a model)
    detection_min: float | None = None             # None: 1 min (all-reduce timeout)
    restart_min: float | None = None               # sync: whole-job restart; ft-hsdp: a replica's restart
    stall_min: float | None = None                 # total stall per failure (sync: detection + restart + load;
                                                   # ft-hsdp: timeout + reconfiguration + redo + rejoin)
    checkpoint_interval_min: float | None = None   # None: optimal (Daly)
    checkpoint_write_min: float | None = None      # None: size / storage bandwidth (model), else 5 min
    checkpoint_async: bool = False                 # background writes: only a snapshot blocks
    checkpoint_snapshot_min: float = 0.0           # blocking part of an asynchronous write
    checkpoint_load_min: float | None = None       # None: the write time
    # the documented defaults (with their sources) live in recovery.DEFAULTS: one value, not two copies
    storage_write_gbs: float = DEFAULTS.storage_write_gbs          # aggregate checkpoint bandwidth, GB/s
    checkpoint_bytes_per_param: float = DEFAULTS.checkpoint_bytes_per_param
    spares: int | None = None                      # hot-spare nodes (None: a replacement is always ready)
    node_repair_h: float = DEFAULTS.node_repair_h
    replacement_min: float = DEFAULTS.replacement_min  # wait for a node when no hot spare is free
    trials: int = 1000                             # Monte Carlo trials (0: closed form only)
    horizon_days: float = 30.0
    seed: int = 0
    engine: str = "vector"                         # Monte Carlo engine: vector | simpy

    def __post_init__(self) -> None:
        _positive_int(self, "gpus", allow_none=True, high=MAX_GPUS)
        _positive_int(self, "gpus_per_node", allow_none=True, high=1024)
        _positive_int(self, "replicas", allow_none=True, high=MAX_GPUS)
        for name in ("detection_min", "restart_min", "stall_min", "checkpoint_write_min", "checkpoint_load_min",
                     "checkpoint_snapshot_min", "replacement_min"):
            _non_negative(self, name, MAX_MINUTES)
        _non_negative(self, "rate_per_1000_node_days", MAX_RATE)
        _positive(self, "checkpoint_interval_min", MAX_MINUTES)
        _positive(self, "horizon_days", MAX_HORIZON_DAYS)
        _positive(self, "node_repair_h", MAX_MINUTES / 60.0)
        _positive(self, "weibull_shape", 100.0)
        _positive(self, "storage_write_gbs", 1e9)
        _positive(self, "checkpoint_bytes_per_param", 1e3)
        check_choice("failure.restart_semantics", self.restart_semantics, SEMANTICS)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63:
            raise TraceInputError(None, f"failure.seed must be an integer from 0 to 2^63-1, got {self.seed!r}")
        check_choice("failure.strategy", self.strategy, STRATEGIES)
        if self.distribution not in (None, "exponential", "weibull"):
            raise TraceInputError(None, f"failure.distribution must be exponential or weibull, got {self.distribution!r}")
        if self.engine not in ("vector", "simpy"):
            raise TraceInputError(None, f"failure.engine must be vector or simpy, got {self.engine!r}")
        if self.spares is not None and (isinstance(self.spares, bool) or self.spares < 0):
            raise TraceInputError(None, f"failure.spares must be an integer >= 0, got {self.spares!r}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or not 0 <= self.trials <= MAX_TRIALS:
            raise TraceInputError(None, f"failure.trials must be an integer from 0 to {MAX_TRIALS:,}, got {self.trials!r}")
        if self.gpus is not None and self.replicas is not None and self.replicas > self.gpus:
            raise TraceInputError(None, f"failure.replicas={self.replicas} exceeds the job's {self.gpus} GPUs")


def _value(opts: FailureOptions, name: str):
    v = getattr(opts, name)
    if isinstance(v, bool) or (v is not None and not isinstance(v, (int, float))):
        raise TraceInputError(None, f"failure.{name} must be a number, got {v!r}")
    return v


def _positive_int(opts: FailureOptions, name: str, allow_none: bool = False, high: int | None = None) -> None:
    v = getattr(opts, name)
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (high is not None and v > high):
        limit = f" and <= {high:,}" if high is not None else ""
        raise TraceInputError(None, f"failure.{name} must be an integer >= 1{limit}, got {v!r}")


def _non_negative(opts: FailureOptions, name: str, high: float) -> None:
    v = _value(opts, name)
    if v is not None and not 0 <= v <= high:
        raise TraceInputError(None, f"failure.{name} must be >= 0 and <= {high:g}, got {v!r}")


def _positive(opts: FailureOptions, name: str, high: float) -> None:
    v = _value(opts, name)
    if v is not None and not (0 < v <= high and math.isfinite(v)):
        raise TraceInputError(None, f"failure.{name} must be > 0 and <= {high:g}, got {v!r}")
