"""A whole rank's training step as the workload generator builds it (build_rank_graph): the optimizer
step over this rank's parameter shard, gradient reductions, parameter gathers, pipeline transfers and
the order of passes, counted by hand (never the generator's output).

References:
- Adam step (Kingma & Ba 2015) with fp32 master weights (Micikevicius et al. 2018): per parameter read
  param, grad, m, v (4 x 4 B), write param, m, v (3 x 4 B) and the bf16 copy (2 B) = 30 B, ~12 FLOPs.
- ZeRO (Rajbhandari et al. 2020): stage >= 1 shards the optimizer step over the DP group (expert
  parameters over the expert-DP group); stage 1/2 all-gathers the updated 16-bit parameters (2 B each).
- Parameters per rank: Megatron tensor parallelism splits each matmul weight t ways, each pipeline stage
  holds its layers, the first stage the input embedding (V x h / t), the last the output projection.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import build_rank_graph, generate

H, F, V = 256, 512, 1000
# Llama layer (MHA): Q, K, V, O 256 x 256, SwiGLU 3 x 256 x 512, 2 RMSNorms of 256
LAYER = 4 * H * H + 3 * H * F + 2 * H             # 262,144 + 393,216 + 512 = 655,872
TINY = model_from_dict(dict(name="tiny", layers=4, hidden=H, heads=4, ffn=F, vocab=V))


def _by_name(g):
    out = defaultdict(list)
    for i, a in g.attrs.items():
        out[g.name[i].split(".")[-1]].append(a)
    return out


def _deps(g, i):
    return sorted(g.name[j] for j in g.deps_of(i))


@pytest.mark.parametrize("zero,shard", [(0, 1), (1, 4), (3, 4)])
def test_optimizer_step_updates_this_ranks_parameter_shard_at_12_flops_and_30_bytes(zero, shard):
    """TP2 PP2 DP4: stage 0 holds 2 layers x 655,872 / 2 + 1000 x 256 / 2 = 783,872 parameters, the last
    stage the same with the output projection; ZeRO >= 1 shards them over the 4 DP ranks."""
    plan = ParallelPlan(tp=2, pp=2, dp=4, zero=zero, seq_len=128, global_batch=8)
    for g in generate(TINY, plan, "symmetric"):
        opt = _by_name(g)["optimizer_step"]
        params = (2 * LAYER / 2 + V * H / 2) / shard
        assert opt == [{"op": "optimizer", "dtype": "fp32", "flops": 12.0 * params, "bytes": 30.0 * params}]
