"""What-if `parallelism`: a model trained with a parallel plan on a hardware preset -> step time,
throughput, MFU, memory per GPU (a generated workload replayed with the hardware models; see
`estimators.whatif_parallel`)."""
from __future__ import annotations

import dataclasses

from chakra_schema.errors import TraceInputError
from estimators.prediction import Prediction
from estimators.scenario import Scenario
from estimators.whatif_parallel import PlanPrediction, predict
from estimators.whatifs import register_whatif


def prediction_of_plan(r: PlanPrediction) -> Prediction:
    """The common `Prediction` of a parallelism estimate (the `PlanPrediction` kept as `detail`)."""
    mem = r.memory
    metrics = {"memory_weights_gib": mem.weights_gib, "memory_grads_gib": mem.grads_gib,
               "memory_optimizer_gib": mem.optimizer_gib, "memory_activations_gib": mem.activations_gib,
               "micro_batches": r.plan.micro_batches, "simulated_ranks": r.simulated_ranks,
               "simulated_nodes": r.num_nodes, "pipeline_bubble_fraction": r.breakdown.mean.idle_fraction}
    return Prediction(whatif="parallelism", scenario_key="", step_time_s=r.step_time_s,
                      breakdown=r.breakdown.mean, tokens_per_s=r.tokens_per_s, tflops_per_gpu=r.tflops_per_gpu,
                      hw_tflops_per_gpu=r.hw_tflops_per_gpu, mfu=r.mfu, memory_gib_per_gpu=mem.total_gib,
                      oom=mem.oom, gpus=r.plan.gpus, metrics=metrics, detail=r)


@register_whatif("parallelism", needs=("model", "hardware"))
def parallelism(scenario: Scenario, progress=None) -> Prediction:
    """Train `model` with `plan` on `hardware`: generated workload, model timing."""
    if scenario.timing != "model":
        raise TraceInputError(None, "what-if 'parallelism' generates its workload: it needs timing = model")
    r = predict(scenario.model, scenario.plan, scenario.hardware, mode=scenario.simulation, progress=progress)
    return prediction_of_plan(r)


def search_scenarios(base: Scenario, gpus: int, seq_len: int, global_batch: int, precision: str = "bf16",
                     max_plans: int = 24, progress=None) -> list[Prediction]:
    """Every valid plan of `gpus` for the base scenario's model, ranked; the best `max_plans` that fit in
    memory are evaluated (through `evaluate`) and returned by predicted throughput."""
    from estimators.whatif_parallel import rank_candidate_plans
    from estimators.whatifs import evaluate

    plans = rank_candidate_plans(base.model, base.hardware, gpus, seq_len, global_batch, precision, max_plans)
    out = []
    for n, plan in enumerate(plans):
        out.append(evaluate(dataclasses.replace(base, whatif="parallelism", plan=plan)))
        if progress:
            progress(n + 1, len(plans))
    out.sort(key=lambda p: -(p.tokens_per_s or 0.0))
    return out
