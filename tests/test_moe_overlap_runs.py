"""The four published H100 training runs that overlapped the EP all-to-all with another micro-batch's compute
(Megatron-Core overlap_moe_expert_parallel_comm), predicted with `moe_a2a_overlap`: each within 7%. The
overlap's hidden share (workload.EP_OVERLAP_HIDDEN) is measured in another run's profile (Megatron-Bridge
PR #5094, Qwen3-30B-A3B), not fitted on these, so they are held out (largest error 6.4% as built).
- Megatron-Bridge performance tables (shared/reference/training-throughput.csv): DeepSeek-V3 25.09 and
  Qwen3-235B-A22B 25.11, with their published layouts.
- Megatron-Core MoE report (Yan et al., arXiv:2603.07685, Table 11 with the Table 17 / 20 layouts and App.
  B.2 settings): DeepSeek-V3 on 1,024 H100, FP8 blockwise, TP2 PP8 VP4 EP64, micro-batch 1, batch 8,192,
  DeepEP, recompute mla_up_proj + mlp: 1,412 tokens/s/GPU; Qwen3-235B-A22B on 256 H100, BF16, TP2 PP8 VP4
  EP32, micro-batch 1, batch 2,048, DeepEP, recompute moe_act + layernorm: 2,132 tokens/s/GPU."""
from __future__ import annotations

import pytest

from estimators.model_config import load_model
from estimators.parallelism.evaluate import predict
from estimators.parallelism.plan import ParallelPlan
from lumos_sim.published_training import read_rows, row_scenario
from conftest import require_shared

REPORT = {"deepseek-v3": (1412, dict(tp=2, pp=8, vp=4, ep=64, dp=64, global_batch=8192, precision="fp8",
                                     fp8_recipe="blockwise", recompute="selective",
                                     recompute_modules=("mla_up_proj", "mlp"))),
          "qwen3-235b-a22b": (2132, dict(tp=2, pp=8, vp=4, ep=32, dp=16, global_batch=2048, precision="bf16",
                                         recompute="selective", recompute_modules=("moe_act", "layernorm")))}


def _tokens_per_gpu(model, plan) -> float:
    return predict(model, plan, "h100-sxm").tokens_per_s / plan.gpus


@pytest.mark.parametrize("name", sorted(REPORT))
def test_report_runs_with_the_overlap_are_within_seven_percent(name):
    published, layout = REPORT[name]
    plan = ParallelPlan(seq_len=4096, micro_batch=1, moe_a2a="deepep", moe_a2a_overlap=True, moe_force_balance=True,
                        attention_kernel="cudnn", grad_bytes=2, fused_cross_entropy=True, **layout)
    assert _tokens_per_gpu(load_model(name), plan) == pytest.approx(published, rel=0.07)


@pytest.mark.parametrize("release, model_name", [("NeMo 25.09", "DeepSeekV3 (dropless)"),
                                                 ("NeMo 25.11", "Qwen3_235B_a22B")])
def test_bridge_runs_with_the_overlap_run_with_it_and_are_within_seven_percent(release, model_name):
    rows = read_rows(require_shared("reference", "training-throughput.csv"))
    row = next(r for r in rows if r.release == release and r.model_name == model_name)
    model, plan = row_scenario(row)
    assert plan.moe_a2a_overlap
    assert _tokens_per_gpu(model, plan) == pytest.approx(row.tokens_per_gpu, rel=0.07)
