"""Failures, checkpoints and recovery -> effective training time (the `failures` what-if's domain code).

- `model`: failure models as data (presets/*.toml with a source for every number).
- `recovery`: recovery strategies (registry: sync, ft-hsdp), hot spares, recovery defaults and sources.
- `checkpoint`: Young/Daly intervals, checkpoint plans (fixed/optimal, blocking/asynchronous).
- `closed_form`: expected ETTR; `montecarlo`: the same model simulated (vectorized numpy, or SimPy).
- `options`: the scenario's `[failure]` section; `estimate`: options -> both estimates.
"""
from estimators.failures.estimate import FailureEstimate, HealthyJob, estimate, resolve
from estimators.failures.options import FailureOptions

__all__ = ["FailureEstimate", "FailureOptions", "HealthyJob", "estimate", "resolve"]
