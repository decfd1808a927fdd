"""One failure estimate: options (+ the healthy job's step time) -> failure classes, checkpoint plan,
closed-form ETTR and Monte Carlo ETTR.

`resolve` turns `FailureOptions` into concrete inputs, recording which ones took a default
(`FailureInputs.defaults`: name -> "value (why)") so the CLI can print them; `estimate` runs both
estimators on them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from chakra_schema.errors import TraceInputError
from estimators.failures.checkpoint import CheckpointPlan, plan_checkpoints, young_interval
from estimators.failures.closed_form import ClosedForm, closed_form, effective_rollback_rate
from estimators.failures.model import FailureModel, get_failure_model
from estimators.failures.montecarlo import MonteCarloResult, simulate
from estimators.failures.options import FailureOptions
from estimators.failures.recovery import (DEFAULTS, H_PER_S, FailureClass, Job, RecoveryTimes, cold_restart_s,
                                          failure_classes)

MAX_DRAWN_FAILURES = 10_000_000      # trials x failures per trial the Monte Carlo may hold (~400 MB)
PUBLISHED_RATE_RANGE = (2.3, 6.5)    # per 1,000 node-days: FT-HSDP paper (2.3 at 32K GPUs, ~6.5 at 98K), Llama 3 (3.8)
DEFAULT_REPLICAS_WITHOUT_MODEL = 12   # Salpekar et al. 2026, Training LLMs with Fault Tolerant HSDP on 100,000 GPUs (arXiv:2602.00277): ~12 data-parallel replicas at ~100K GPUs


@dataclass(frozen=True)
class HealthyJob:
    """What the parallelism what-if says about the job without failures (all optional)."""
    gpus: int | None = None
    gpus_per_node: int | None = None
    dp: int | None = None
    dp_shard: int = 0
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    params: int | None = None


@dataclass(frozen=True)
class FailureInputs:
    options: FailureOptions
    job: Job
    failure_model: FailureModel
    times: RecoveryTimes
    checkpoint_write_h: float
    horizon_h: float
    defaults: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)   # inputs outside their sources' measured range


@dataclass(frozen=True)
class FailureEstimate:
    inputs: FailureInputs
    classes: tuple[FailureClass, ...]
    checkpoint: CheckpointPlan
    closed: ClosedForm
    mc: MonteCarloResult | None
    young_interval_h: float
    healthy: HealthyJob


def resolve(opts: FailureOptions, healthy: HealthyJob = HealthyJob()) -> FailureInputs:
    defaults: dict[str, str] = {}
    job = _job(opts, healthy, defaults)
    model = get_failure_model(opts.failure_model)
    if opts.rate_per_1000_node_days is not None:
        model = model.with_rate(opts.rate_per_1000_node_days)
    else:
        defaults["rate_per_1000_node_days"] = f"{model.rate_per_1000_node_days:.3g} (failure model {model.name})"
    if opts.distribution is not None:
        model = FailureModel(**{**model.__dict__, "distribution": opts.distribution})
    write_h = _checkpoint_write_h(opts, healthy, defaults)
    times = _recovery_times(opts, job, healthy, write_h, defaults)
    inputs = FailureInputs(opts, job, model, times, write_h, opts.horizon_days * 24.0, defaults,
                           _warnings(opts, job, model, defaults))
    _check_simulation_size(inputs)
    return inputs


def _warnings(opts: FailureOptions, job: Job, model: FailureModel, defaults: dict[str, str]) -> list[str]:
    """Every default or input taken outside the range its source measured."""
    out = [f"failures are per node: {job.gpus:,} GPUs run on {job.nodes:,} nodes of {job.gpus_per_node} GPUs, "
           f"each failing at the model's per-node rate"]
    lo, hi = PUBLISHED_RATE_RANGE
    rate = model.rate_per_1000_node_days
    if not lo <= rate <= hi:
        out.append(f"warning: failure rate {rate:.3g} per 1,000 node-days is outside the published {lo}-{hi} "
                   f"(FT-HSDP paper, Llama 3 paper)")
    points = DEFAULTS.cold_restart_points
    if "restart_min" in defaults and not points[0][0] <= job.gpus <= points[-1][0]:
        out.append(f"warning: the cold restart at {job.gpus:,} GPUs is extrapolated beyond the published points "
                   f"({points[0][0]:,}-{points[-1][0]:,} GPUs, FT-HSDP paper); give --restart-min")
    if "replicas" in defaults and opts.strategy == "ft-hsdp" and "plan DP" not in defaults["replicas"] \
            and not 50_000 <= job.gpus <= 200_000:
        out.append(f"warning: {job.replicas} replicas is the FT-HSDP paper's count at ~100K GPUs; give --replicas "
                   f"or a model and plan for {job.gpus:,} GPUs")
    if defaults.get("checkpoint_write_min", "").endswith("(no model to size the checkpoint)"):
        out.append("warning: the checkpoint write time is an assumption (no model to size the checkpoint); give "
                   "--model and a plan, or --checkpoint-write-min")
    return out


def _check_simulation_size(inputs: FailureInputs) -> None:
    """The Monte Carlo holds every failure of every trial: refuse a run that would not fit in memory."""
    expected = inputs.job.rate_per_h(inputs.failure_model.rate_per_1000_node_days) * inputs.horizon_h
    drawn = inputs.options.trials * (expected + 6.0 * math.sqrt(expected) + 1.0)
    if drawn > MAX_DRAWN_FAILURES:
        raise TraceInputError(None, f"the Monte Carlo would draw ~{drawn:,.0f} failures ({inputs.options.trials:,} "
                                    f"trials x {expected:,.0f} expected): at most {MAX_DRAWN_FAILURES:,}; lower "
                                    f"--trials or --horizon-days, or use --trials 0 (closed form only)")


def estimate(inputs: FailureInputs, healthy: HealthyJob = HealthyJob(),
             progress: Callable[[int, int], None] | None = None) -> FailureEstimate:
    opts = inputs.options
    classes = failure_classes(opts.strategy, inputs.job, inputs.failure_model, inputs.times)
    rollback_rate = effective_rollback_rate(classes, opts.restart_semantics)
    rollback_mttf = 1.0 / rollback_rate if rollback_rate > 0 else math.inf
    interval = opts.checkpoint_interval_min / 60.0 if opts.checkpoint_interval_min is not None else None
    ckpt = plan_checkpoints(interval, inputs.checkpoint_write_h, opts.checkpoint_async, rollback_mttf,
                            snapshot=opts.checkpoint_snapshot_min / 60.0)
    closed = closed_form(classes, ckpt, inputs.horizon_h, inputs.times, semantics=opts.restart_semantics)
    mc = None
    if opts.trials > 0:
        mc = simulate(classes, ckpt, inputs.horizon_h, trials=opts.trials, seed=opts.seed,
                      distribution=inputs.failure_model.distribution, weibull_shape=opts.weibull_shape,
                      times=inputs.times, engine=opts.engine, progress=progress,
                      semantics=opts.restart_semantics, replicas=inputs.job.replicas)
    return FailureEstimate(inputs, tuple(classes), ckpt, closed, mc,
                           young_interval(ckpt.blocking, rollback_mttf), healthy)


# ---------------------------------------------------------------------- resolving inputs
def _job(opts: FailureOptions, healthy: HealthyJob, defaults: dict[str, str]) -> Job:
    gpus = opts.gpus or healthy.gpus
    if gpus is None:
        raise TraceInputError(None, "the failure what-if needs the job's GPU count: failure.gpus (--gpus) or a model and plan")
    if opts.gpus and healthy.gpus and opts.gpus != healthy.gpus:
        raise TraceInputError(None, f"failure.gpus={opts.gpus} differs from the plan's {healthy.gpus} GPUs")
    per_node = opts.gpus_per_node or healthy.gpus_per_node or 8
    if opts.gpus_per_node is None:
        defaults["gpus_per_node"] = f"{per_node}"
    replicas = _replicas(opts, healthy, gpus, per_node, defaults)
    return Job(gpus=gpus, gpus_per_node=per_node, replicas=replicas)


def _replicas(opts: FailureOptions, healthy: HealthyJob, gpus: int, per_node: int, defaults: dict[str, str]) -> int:
    """FT-HSDP replicas. One may be smaller than a node: a node failure then takes all of its replicas."""
    dp = healthy.dp
    if opts.replicas is not None:
        r = opts.replicas
        if dp is not None and r > dp:
            raise TraceInputError(None, f"failure.replicas={r} exceeds the plan's data-parallel degree DP={dp}")
        if dp is not None and dp % r:
            raise TraceInputError(None, f"failure.replicas={r} does not divide the plan's data-parallel degree DP={dp}")
    elif opts.strategy != "ft-hsdp":
        return 1    # sync: the whole job is one unit of recovery
    elif dp is not None:
        r = dp // healthy.dp_shard if healthy.dp_shard else dp
        defaults["replicas"] = f"{r} (plan DP {dp}" + (f" / dp_shard {healthy.dp_shard})" if healthy.dp_shard else ")")
    else:
        r = max(1, min(DEFAULT_REPLICAS_WITHOUT_MODEL, gpus // per_node))
        defaults["replicas"] = f"{r} (~12 replicas at ~100K GPUs, FT-HSDP paper)"
    if r > gpus:
        raise TraceInputError(None, f"failure.replicas={r} exceeds the job's {gpus} GPUs")
    return r


def _checkpoint_write_h(opts: FailureOptions, healthy: HealthyJob, defaults: dict[str, str]) -> float:
    if opts.checkpoint_write_min is not None:
        return opts.checkpoint_write_min / 60.0
    if healthy.params:
        gb = healthy.params * opts.checkpoint_bytes_per_param / 1e9
        s = gb / opts.storage_write_gbs
        defaults["checkpoint_write_min"] = (f"{s / 60:.3g} ({gb:,.0f} GB at {opts.storage_write_gbs:g} GB/s: "
                                            f"{opts.checkpoint_bytes_per_param:g} B/param)")
        return s * H_PER_S
    w = DEFAULTS.checkpoint_write_min_without_model
    defaults["checkpoint_write_min"] = f"{w:g} (no model to size the checkpoint)"
    return w / 60.0


def _recovery_times(opts: FailureOptions, job: Job, healthy: HealthyJob, write_h: float,
                    defaults: dict[str, str]) -> RecoveryTimes:
    def pick(name: str, given_min: float | None, default_s: float, why: str) -> float:
        if given_min is not None:
            return given_min / 60.0
        defaults[name] = f"{default_s / 60:.3g} ({why})"
        return default_s * H_PER_S

    sync_restart_s = cold_restart_s(job.gpus)
    if opts.strategy == "ft-hsdp":   # --restart-min is the failed replica's; whole-job failures restart cold
        restart = sync_restart_s * H_PER_S
        replica = pick("restart_min", opts.restart_min, min(DEFAULTS.replica_restart_s, sync_restart_s),
                       "replica restart: 7 min reported, at most the whole job's cold restart")
    else:
        restart = pick("restart_min", opts.restart_min, sync_restart_s, f"cold restart at {job.gpus:,} GPUs")
        replica = 0.0
    redo_s = healthy.step_time_s if healthy.step_time_s else DEFAULTS.ft_redo_step_s
    load = opts.checkpoint_load_min / 60.0 if opts.checkpoint_load_min is not None else write_h
    return RecoveryTimes(
        detection=pick("detection_min", opts.detection_min, DEFAULTS.detection_s, "collective timeout"),
        restart=restart, checkpoint_load=load, ft_reconfigure=DEFAULTS.ft_reconfigure_s * H_PER_S,
        ft_redo_step=redo_s * H_PER_S, ft_rejoin=DEFAULTS.ft_rejoin_s * H_PER_S, replica_restart=replica,
        stall_override=opts.stall_min / 60.0 if opts.stall_min is not None else None,
        spares=opts.spares, node_repair=opts.node_repair_h, replacement=opts.replacement_min / 60.0)
