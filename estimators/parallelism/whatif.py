"""What-if `parallelism`: a model trained with a parallel plan on a hardware preset -> step time,
throughput, MFU, memory per GPU (a generated workload replayed with the hardware models; see
`estimators.parallelism.evaluate`)."""
from __future__ import annotations

import dataclasses

import numpy as np

from chakra_schema.errors import TraceInputError
from estimators.prediction import Prediction
from estimators.scenario import Scenario
from estimators.parallelism.evaluate import PlanPrediction, predict
from estimators.parallelism.plan import selective_modules
from estimators.parallelism.workload import EP_OVERLAP_HIDDEN, MOE_SYNC_IDLE_US
from estimators.registry import register_whatif


# The overlapped EP all-to-all hides only a measured share of its time (workload.EP_OVERLAP_HIDDEN): say so,
# and that the ideal (fully hidden) overlap reads above every published H100 run that overlapped.
OVERLAP_CAVEAT = ("moe_a2a_overlap hides {hidden:.0%} of the EP all-to-all time, the share a profiled H100 run "
                  "hid (hiding all of it reads 19-28% above the published runs with the overlap)")

# The dropless host wait is one profile's figure (workload.MOE_SYNC_IDLE_US): say so where it weighs.
HOST_WAIT_CAVEAT = ("dropless MoE: the GPU waits {us:.0f} us for the host per MoE layer forward ({share:.0%} of "
                    "this step), the idle time of one profiled H100 run (Qwen3-30B-A3B); token drop "
                    "(--moe-capacity-factor) has no such sync")
# ... and so is the host time of an MoE layer (workload.MOE_LAYER_HOST_US), which bounds small layers
HOST_BOUND_CAVEAT = ("host-bound MoE layers: the host takes {ms:.1f} ms per MoE layer forward + backward (eager "
                     "Megatron-Core, derived from one measured run per dispatcher family) and the GPU waits for it "
                     "{share:.0%} of this step; larger micro-batches, --cuda-graph-scope moe_router,moe_preprocess "
                     "or --cuda-graphs shorten the wait")

# Megatron's classic selective recompute checkpoints the softmax / dropout part of attention; flash attention
# keeps no score matrix and recomputes its scores inside its own backward, so there is nothing left to repeat
SELECTIVE_FLASH_NOTE = ("selective recompute of core_attn recomputes nothing beside flash attention (its backward "
                        "already recomputes the scores): the step and memory are those without recompute; "
                        "--recompute-modules names other modules")


def prediction_of_plan(r: PlanPrediction) -> Prediction:
    """The common `Prediction` of a parallelism estimate (the `PlanPrediction` kept as `detail`)."""
    mem = r.memory
    metrics = {"memory_weights_gib": mem.weights_gib, "memory_grads_gib": mem.grads_gib,
               "memory_optimizer_gib": mem.optimizer_gib, "memory_activations_gib": mem.activations_gib,
               "micro_batches": r.plan.micro_batches, "simulated_ranks": r.simulated_ranks,
               "simulated_nodes": r.num_nodes, "pipeline_bubble_fraction": r.breakdown.mean.idle_fraction}
    notes = []
    if r.plan.moe_a2a_overlap and r.plan.ep > 1:
        notes.append(OVERLAP_CAVEAT.format(hidden=EP_OVERLAP_HIDDEN))
    notes += _host_wait_notes(r)
    if selective_modules(r.plan) == {"core_attn"} and r.plan.attention != "unfused":
        notes.append(SELECTIVE_FLASH_NOTE)
    return Prediction(whatif="parallelism", scenario_key="", step_time_s=r.step_time_s,
                      breakdown=r.breakdown.mean, tokens_per_s=r.tokens_per_s, tflops_per_gpu=r.tflops_per_gpu,
                      hw_tflops_per_gpu=r.hw_tflops_per_gpu, mfu=r.mfu, memory_gib_per_gpu=mem.total_gib,
                      oom=mem.oom, gpus=r.plan.gpus, metrics=metrics, notes=notes, detail=r)


def _host_wait_notes(r: PlanPrediction) -> list[str]:
    """Caveats for a step whose GPU waits for the host a tenth of it or more: at the dropless syncs
    (`moe_sync_wait_us`, their expected share), and beyond them at host-bound MoE layers."""
    bd = r.breakdown.mean
    window, wait = bd.window_us, bd.host_wait_us
    if window <= 0 or wait <= 0.1 * window or "moe_layer_host_us" not in r.extra:
        return []
    syncs = r.extra["moe_sync_wait_us"]
    notes = [HOST_WAIT_CAVEAT.format(us=MOE_SYNC_IDLE_US, share=min(syncs, wait) / window)] if syncs else []
    if wait - syncs > 0.05 * window:
        notes.append(HOST_BOUND_CAVEAT.format(ms=r.extra["moe_layer_host_us"] / 1e3, share=(wait - syncs) / window))
    return notes


@register_whatif("parallelism", needs=("model", "hardware"))
def parallelism(scenario: Scenario, progress=None) -> Prediction:
    """Train `model` with `plan` on `hardware`: generated workload, model timing."""
    if scenario.timing != "model":
        raise TraceInputError(None, "what-if 'parallelism' generates its workload: it needs timing = model")
    r = predict(scenario.model, scenario.plan, scenario.hardware, mode=scenario.simulation, progress=progress)
    return prediction_of_plan(r)


def search_scenarios(base: Scenario, gpus: int, seq_len: int, global_batch: int, precision: str = "bf16",
                     max_plans: int = 24, progress=None) -> list[Prediction]:
    """Every valid plan of `gpus` for the base scenario's model, ranked by the analytic estimate
    (`estimators.parallelism.search`); the best `max_plans` that fit in memory are evaluated (through
    `evaluate`) and returned by simulated throughput."""
    from estimators.parallelism.search import SearchSpace, rank_plans

    ranked = rank_plans(base.model, base.hardware, gpus, seq_len, global_batch, precision,
                        SearchSpace.keeping(base.plan))
    return simulate_ranked(base, ranked, max_plans, progress)


def simulate_ranked(base: Scenario, ranked, top_k: int, progress=None) -> list[Prediction]:
    """Evaluate the best `top_k` distinct plans of a `search.RankedPlans` (see `RankedPlans.top`) as
    scenarios, fastest first. Each prediction keeps its analytic estimate and its rank among the plans
    that fit (`metrics.analytic_step_time_s`, `metrics.analytic_rank`)."""
    from estimators.registry import evaluate

    rows = ranked.top(top_k)
    out = []
    for n, row in enumerate(rows):
        p = evaluate(dataclasses.replace(base, whatif="parallelism", plan=ranked.plan(int(row))))
        extra = {"analytic_step_time_s": float(ranked.step_s[row]),
                 "analytic_rank": int(np.flatnonzero(ranked.order == row)[0]) + 1}
        p.metrics.update(extra)
        p.detail.extra.update(extra)
        out.append(p)
        if progress:
            progress(n + 1, len(rows))
    out.sort(key=lambda p: -(p.tokens_per_s or 0.0))
    return out
