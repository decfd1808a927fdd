"""What-if `failures`: failure rates, checkpointing and recovery strategy -> effective training time ratio
(ETTR) and, with a model, effective step time and goodput (tokens/s).

The scenario's `[failure]` section (`FailureOptions`) says the job size, the failure model, the recovery
strategy and the checkpoint policy; with a model and hardware the healthy step time and tokens/s come
from the `parallelism` what-if of the same scenario. Both estimators run: the closed form (`ettr`) and the
Monte Carlo (`ettr_mc`, `ettr_p05`, `ettr_p95`); see `estimators.failures`.
"""
from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

from estimators.failures import FailureEstimate, FailureOptions, HealthyJob, estimate, resolve
from estimators.failures.closed_form import LOST_KEYS
from estimators.prediction import Prediction
from estimators.scenario import Scenario
from estimators.registry import evaluate, register_options, register_whatif

register_options("failure", FailureOptions)

_HEALTHY_CACHE: OrderedDict[str, Prediction] = OrderedDict()   # a sweep re-uses one plan for many failure points


@register_whatif("failures")
def failures(scenario: Scenario, progress=None) -> Prediction:
    """Failures, checkpoints and recovery (sync / ft-hsdp) -> ETTR, effective step time and goodput."""
    opts = scenario.failure if scenario.failure is not None else FailureOptions()
    healthy_pred = _healthy_prediction(scenario)
    healthy = _healthy_job(scenario, healthy_pred)
    est = estimate(resolve(opts, healthy), healthy, progress=progress)
    return _prediction(est, healthy_pred)


def _healthy_prediction(scenario: Scenario) -> Prediction | None:
    """The parallelism what-if of the same scenario (None without a model)."""
    if scenario.model is None:
        return None
    base = dataclasses.replace(scenario, whatif="parallelism", failure=None)
    key = base.key()
    if key not in _HEALTHY_CACHE:
        _HEALTHY_CACHE[key] = evaluate(base)
        while len(_HEALTHY_CACHE) > 64:
            _HEALTHY_CACHE.popitem(last=False)
    return _HEALTHY_CACHE[key]


def _healthy_job(scenario: Scenario, p: Prediction | None) -> HealthyJob:
    plan = scenario.plan
    if p is None:   # no model: a plan of more than one GPU still gives the job size and DP degree
        if plan.gpus > 1:
            return HealthyJob(gpus=plan.gpus, gpus_per_node=plan.gpus_per_node, dp=plan.dp, dp_shard=plan.dp_shard)
        return HealthyJob()
    return HealthyJob(gpus=plan.gpus, gpus_per_node=plan.gpus_per_node, dp=plan.dp, dp_shard=plan.dp_shard,
                      step_time_s=p.step_time_s, tokens_per_s=p.tokens_per_s, params=scenario.model.param_count())


def failure_metrics(est: FailureEstimate) -> dict:
    """The flat metrics of a failure estimate (units in the names; `time_lost_<cause>_h` flattened)."""
    cf, ck, inp = est.closed, est.checkpoint, est.inputs
    m = {
        "strategy": inp.options.strategy, "restart_semantics": inp.options.restart_semantics,
        "failure_model": inp.failure_model.name,
        "failure_rate_per_1000_node_days": inp.failure_model.rate_per_1000_node_days,
        "gpus": inp.job.gpus, "nodes": inp.job.nodes, "replicas": inp.job.replicas,
        "mttf_h": cf.mttf_h, "ettr": cf.ettr,
        "ettr_mc": est.mc.mean if est.mc else None, "ettr_p05": est.mc.p05 if est.mc else None,
        "ettr_p95": est.mc.p95 if est.mc else None,
        "checkpoint_policy": ck.policy, "checkpoint_interval_min": ck.interval * 60.0,
        "optimal_checkpoint_interval_min": ck.optimal_interval * 60.0,
        "young_checkpoint_interval_min": est.young_interval_h * 60.0,
        "checkpoint_write_min": inp.checkpoint_write_h * 60.0, "checkpoint_async": inp.options.checkpoint_async,
        "stall_per_failure_min": _mean_stall_min(est),
        "expected_failures": cf.expected_failures,
        "failures_mc": float(est.mc.failures.mean()) if est.mc else None,
        "horizon_days": inp.horizon_h / 24.0, "trials": inp.options.trials,
    }
    for k in LOST_KEYS:
        m[f"time_lost_{k}_h"] = cf.time_lost_h[k]
    m["time_lost_total_h"] = sum(cf.time_lost_h.values())
    h = est.healthy
    if h.step_time_s:
        m["step_time_s"] = h.step_time_s
        m["effective_step_time_s"] = h.step_time_s / cf.ettr if cf.ettr > 0 else math.inf
        m["tokens_per_s"] = h.tokens_per_s
        m["goodput_tokens_per_s"] = (h.tokens_per_s or 0.0) * cf.ettr
    return m


def _mean_stall_min(est: FailureEstimate) -> float:
    rate = sum(c.rate_per_h for c in est.classes)
    return 60.0 * sum(c.rate_per_h * c.stall_h for c in est.classes) / rate if rate > 0 else 0.0


def _prediction(est: FailureEstimate, healthy: Prediction | None) -> Prediction:
    m = failure_metrics(est)
    ettr = est.closed.ettr
    notes = [f"default {k} = {v}" for k, v in est.inputs.defaults.items()] + list(est.inputs.warnings)
    given = est.inputs.options.checkpoint_interval_min
    if given is not None and est.checkpoint.interval * 60.0 > given:
        notes.append(f"warning: checkpoint interval {given:g} min is shorter than the asynchronous write "
                     f"({est.inputs.checkpoint_write_h * 60:g} min): a checkpoint starts only once the previous "
                     f"one has persisted, so one is taken every {est.checkpoint.interval * 60:g} min")
    p = Prediction(whatif="failures", scenario_key="", step_time_s=m.get("effective_step_time_s", math.nan),
                   gpus=est.inputs.job.gpus, metrics=m, notes=notes, detail=est)
    if healthy is not None:
        p.baseline_step_time_s = healthy.step_time_s
        p.breakdown = healthy.breakdown
        p.tokens_per_s = m["goodput_tokens_per_s"]
        # model FLOPs per GPU and MFU counted over wall-clock time, failures included
        p.tflops_per_gpu = healthy.tflops_per_gpu * ettr if healthy.tflops_per_gpu is not None else None
        p.mfu = healthy.mfu * ettr if healthy.mfu is not None else None
        p.hw_tflops_per_gpu = healthy.hw_tflops_per_gpu
        p.memory_gib_per_gpu, p.oom = healthy.memory_gib_per_gpu, healthy.oom
        if healthy.oom:
            p.notes.append("the plan does not fit in GPU memory (parallelism what-if)")
    return p
