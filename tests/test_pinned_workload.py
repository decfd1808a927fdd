"""Absolute bytes of the collectives the workload generator puts into a step, counted by hand from
parameter counts (never the generator's own output).

References:
- Data-parallel gradient reduction: Megatron-LM reduces the fp32 main-grad buffer (4 B per parameter;
  Megatron-LM `DistributedDataParallel` with `accumulate_allreduce_grads_in_fp32`, the default with
  the distributed optimizer), all-reduce for DDP (ZeRO-0), reduce-scatter of the whole buffer for the
  distributed optimizer (ZeRO-1/2, Rajbhandari et al. 2020); PyTorch FSDP mixed precision
  (`reduce_dtype=bf16`) reduce-scatters 2 B per parameter (ZeRO-3). The collective's size is the
  buffer each rank contributes (nccl-tests' "size" of the reduce-scatter/all-reduce input).
- Parameters of a Llama-style layer (Touvron et al. 2023): Q, K, V, O projections h x h each (MHA),
  SwiGLU gate, up and down h x f each, two RMSNorm weight vectors of h; embeddings V x h (input and
  output, untied). Megatron tensor parallelism splits every matmul weight t ways.
"""
from __future__ import annotations

import pytest

from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import generate

# hidden 512, 8 heads, FFN 2048, vocab 1000, 8 layers (Llama architecture: SwiGLU, RMSNorm, untied)
TINY = model_from_dict(dict(name="tiny", layers=8, hidden=512, heads=8, ffn=2048, vocab=1000))
H, F, V = 512, 2048, 1000
LAYER_MATMUL_PARAMS = 4 * H * H + 3 * H * F          # 1,048,576 + 3,145,728 = 4,194,304
LAYER_NORM_PARAMS = 2 * H                            # 1,024


def _dp_grad_bytes(graph) -> tuple[float, set[str]]:
    """Sum of the sizes of the data-parallel gradient reductions in one rank's step, and their kinds."""
    total, kinds = 0.0, set()
    for i, a in graph.attrs.items():
        name = graph.name[i]
        if name.endswith((".grad_allreduce", ".grad_reducescatter")):
            total += a["comm_size"]
            kinds.add(name.rsplit(".", 1)[1])
    return total, kinds


def _hand_params_per_stage(tp: int, stage: int, pp: int) -> float:
    """Parameters one TP rank of a pipeline stage reduces: its layers' matmul weights / tp, the norm
    weights (the generator shards them too; their share is 2.4e-4 of a layer), embedding / output / tp."""
    per_layer = (LAYER_MATMUL_PARAMS + LAYER_NORM_PARAMS) / tp
    p = 8 // pp * per_layer
    if stage == 0:
        p += V * H / tp                             # input embedding
    if stage == pp - 1:
        p += V * H / tp                             # output projection (untied)
    return p


@pytest.mark.parametrize("zero,bytes_per_param,kind", [
    (0, 4, "grad_allreduce"),          # DDP: all-reduce of the fp32 main grads
    (1, 4, "grad_reducescatter"),      # distributed optimizer: reduce-scatter of the fp32 main grads
    (2, 4, "grad_reducescatter"),
    (3, 2, "grad_reducescatter"),      # FSDP: bf16 reduce-scatter
])
def test_dp_gradient_bytes_are_params_per_tp_shard_times_grad_precision(zero, bytes_per_param, kind):
    """Pins the DP gradient bytes of TINY at TP2 PP2 DP4 per stage: stage 0 reduces
    4 layers x 4,195,328 / 2 + 1000 x 512 / 2 = 8,646,656 parameters, x 4 B (fp32 main grads, ZeRO 0-2)
    = 34,586,624 B or x 2 B (FSDP bf16, ZeRO-3) = 17,293,312 B; the last stage the same with the output
    projection in place of the embedding."""
    plan = ParallelPlan(tp=2, pp=2, dp=4, zero=zero, seq_len=256, global_batch=8)
    assert _hand_params_per_stage(2, 0, 2) == 8_646_656
    for stage, g in enumerate(generate(TINY, plan, "symmetric")):
        total, kinds = _dp_grad_bytes(g)
        assert kinds == {kind}
        # comm_size is an integer per bucket: within one byte per bucket (10 buckets)
        assert total == pytest.approx(_hand_params_per_stage(2, stage, 2) * bytes_per_param, abs=10)
