"""`FailureOptions`: the scenario's `[failure]` section (`Scenario.failure`), owned by the `failures`
what-if. Every field has a default; None means "derived" (from the scenario's model and plan, the failure
model preset, or the documented recovery defaults in `estimators.failures.recovery.SOURCES`).

    --set failure.strategy=ft-hsdp --set failure.rate_per_1000_node_days=3 --set failure.gpus=16384
"""
from __future__ import annotations

from dataclasses import dataclass

from chakra_schema.errors import TraceInputError
from estimators.failures.recovery import DEFAULTS

STRATEGIES = ("sync", "ft-hsdp")   # mirrors estimators.failures.recovery's registry (checked there too)


@dataclass(frozen=True)
class FailureOptions:
    gpus: int | None = None                        # job size (None: the plan's GPUs)
    gpus_per_node: int | None = None               # None: the plan's (8)
    failure_model: str = "llama3-405b"             # preset name or TOML path
    rate_per_1000_node_days: float | None = None   # None: the failure model's rate (its mix of causes kept)
    distribution: str | None = None                # exponential | weibull (None: the failure model's)
    weibull_shape: float = 0.7                     # Schroeder & Gibson (DSN 2006): 0.7-0.8 between HPC failures
    strategy: str = "sync"                         # sync | ft-hsdp
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
        _positive_int(self, "gpus", allow_none=True)
        _positive_int(self, "gpus_per_node", allow_none=True)
        _positive_int(self, "replicas", allow_none=True)
        for name in ("rate_per_1000_node_days", "detection_min", "restart_min", "stall_min", "checkpoint_write_min",
                     "checkpoint_load_min", "checkpoint_snapshot_min", "replacement_min"):
            _non_negative(self, name)
        for name in ("checkpoint_interval_min", "weibull_shape", "storage_write_gbs", "checkpoint_bytes_per_param",
                     "horizon_days", "node_repair_h"):
            _positive(self, name)
        if self.strategy not in STRATEGIES:
            raise TraceInputError(None, f"failure.strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.distribution not in (None, "exponential", "weibull"):
            raise TraceInputError(None, f"failure.distribution must be exponential or weibull, got {self.distribution!r}")
        if self.engine not in ("vector", "simpy"):
            raise TraceInputError(None, f"failure.engine must be vector or simpy, got {self.engine!r}")
        if self.spares is not None and (isinstance(self.spares, bool) or self.spares < 0):
            raise TraceInputError(None, f"failure.spares must be an integer >= 0, got {self.spares!r}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 0:
            raise TraceInputError(None, f"failure.trials must be an integer >= 0, got {self.trials!r}")
        if self.gpus is not None and self.replicas is not None and self.replicas > self.gpus:
            raise TraceInputError(None, f"failure.replicas={self.replicas} exceeds the job's {self.gpus} GPUs")


def _value(opts: FailureOptions, name: str):
    v = getattr(opts, name)
    if isinstance(v, bool) or (v is not None and not isinstance(v, (int, float))):
        raise TraceInputError(None, f"failure.{name} must be a number, got {v!r}")
    return v


def _positive_int(opts: FailureOptions, name: str, allow_none: bool = False) -> None:
    v = getattr(opts, name)
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TraceInputError(None, f"failure.{name} must be an integer >= 1, got {v!r}")


def _non_negative(opts: FailureOptions, name: str) -> None:
    v = _value(opts, name)
    if v is not None and not v >= 0:
        raise TraceInputError(None, f"failure.{name} must be >= 0, got {v!r}")


def _positive(opts: FailureOptions, name: str) -> None:
    v = _value(opts, name)
    if v is not None and not v > 0:
        raise TraceInputError(None, f"failure.{name} must be > 0, got {v!r}")
