"""One MoE layer's forward and backward on their own, the way Megatron-LM's MoE-layer benchmark times them
(tests/functional_tests/test_cases/common/moe_perf: one layer per rank, CUDA events around its forward and
around its backward, mean of 20 iterations after 5 warm-up ones).

The layer runs inside a generated one-layer step of the plan, replayed as the parallelism what-if replays
any step. Each pass is timed from its first MoE op to the end of its last one: the router to the combine
(and the shared experts) forward; the combine's gradient to the router's backward. As in the benchmark, one
micro-batch runs without recompute or EP overlap, and the host runs ahead of the GPU (the benchmark queues a
long GEMM before each pass): the host pacing of a training step (workload.apply_host_pacing) is left out,
the dropless token-count sync kept. `burst` times the short runs of a benchmark: the GEMMs at the full clock,
not the power-limited clock that a long training run settles at
(replay.hardware.compute.SUSTAINED_CLOCK_FRACTION)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from chakra_schema.errors import TraceInputError
from estimators.model_config import ModelConfig
from estimators.parallelism.plan import ParallelPlan


@dataclass(frozen=True)
class MoELayerTimes:
    forward_us: float
    backward_us: float


def _one_moe_layer(model: ModelConfig) -> ModelConfig:
    if model.moe is None:
        raise TraceInputError(None, f"model {model.name!r} has no MoE layer to time")
    moe = dataclasses.replace(model.moe, first_dense_layers=0, layer_freq=1, layer_offset=0)
    return dataclasses.replace(model, layers=1, mtp_layers=0, moe=moe)


def _span(names: list[str], start, end, prefix: str, after: str, before: str) -> float:
    """Start of the first to end of the last op of pass `prefix` that comes after op `after` and before op
    `before` in the rank's graph."""
    idx = [i for i, n in enumerate(names) if n.startswith(prefix)]
    ops = [n[len(prefix):] for n in (names[i] for i in idx)]
    if after not in ops or before not in ops:
        raise TraceInputError(None, f"the generated layer has no {after!r} / {before!r} around its MoE block")
    lo, hi = ops.index(after) + 1, ops.index(before)
    inside = idx[lo:hi]
    if not inside:
        raise TraceInputError(None, f"the generated layer has no MoE ops between {after!r} and {before!r}")
    return float(max(end[i] for i in inside) - min(start[i] for i in inside))


def moe_layer_times(model: ModelConfig, plan: ParallelPlan, hardware: Any = "h100-sxm",
                    burst: bool = True) -> MoELayerTimes:
    """Forward and backward time of one MoE layer of `model` on one rank of `plan` (its TP / EP / ETP
    layout, micro-batch, sequence, precision and dispatcher; one pipeline stage, one micro-batch)."""
    from estimators.parallelism.timing import default_timing, resolve_hardware
    from estimators.parallelism.workload import generate
    from replay.api import replay

    one = _one_moe_layer(model)
    dp = plan.gpus // (plan.tp * plan.cp)
    plan = plan.with_(pp=1, vp=1, first_stage_layers=0, last_stage_layers=0, pipeline_layout=(), dp=dp,
                      global_batch=dp * plan.micro_batch, recompute="none", recompute_layers=0,
                      recompute_modules=(), moe_a2a_overlap=False)
    hw = resolve_hardware(hardware)
    timing = default_timing(hw)
    if burst:
        timing.compute.sustained_clock_fraction = 1.0
    graphs = generate(one, plan, ranks="symmetric", gpus_per_node=hw.node.gpus_per_node)
    run = replay(graphs, timing, critical_path=False).run      # no host pacing (module doc)
    sl = run.rank_slice(0)
    names = list(graphs[0].name)
    start, end = run.start[sl], run.end[sl]
    return MoELayerTimes(
        forward_us=_span(names, start, end, "mb0.L0.F.", "post_attn_norm", "residual_add_mlp"),
        backward_us=_span(names, start, end, "mb0.L0.B.", "residual_add_mlp_bwd", "post_attn_norm_bwd"))
