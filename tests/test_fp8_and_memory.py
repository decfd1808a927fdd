"""FP8 training costs in generated workloads (casts, amax/scale updates, scaled GEMMs, BF16 remainder),
per-dtype GEMM efficiency presets, and the memory model against Llama 3 405B as Meta trained it."""
from __future__ import annotations

import pytest

from estimators.parallelism.memory import GIB, estimate_memory, layer_activation_bytes
from estimators.model_config import load_model
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import build_rank_graph
from replay.hardware import ComputeModel, get_hardware


def test_fp8_and_bf16_gemm_efficiencies_are_separate_preset_values_with_sources():
    for name in ("h100-sxm", "h200", "b200"):
        c = get_hardware(name).compute
        assert c.gemm_efficiency_for("fp8") < c.gemm_efficiency_for("bf16")
        assert "compute.gemm_efficiency_by_dtype" in get_hardware(name).sources
    m = ComputeModel("h100-sxm")
    bf16, fp8 = m.gemm(8192, 8192, 8192, dtype="bf16"), m.gemm(8192, 8192, 8192, dtype="fp8")
    assert bf16.efficiency == pytest.approx(0.80, abs=0.04) and fp8.efficiency == pytest.approx(0.70, abs=0.04)
    assert fp8.efficiency < bf16.efficiency


def _terms(precision: str) -> dict[str, float]:
    model = load_model("llama3-8b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, seq_len=4096, global_batch=8, micro_batch=1, precision=precision)
    g = build_rank_graph(model, plan, 0)
    cm = ComputeModel("h100-sxm")
    terms = {"fp8 gemm": 0.0, "bf16 gemm": 0.0, "fp8 casts": 0.0, "amax/scale updates": 0.0, "other bf16": 0.0}
    for i, a in g.attrs.items():
        if "op" not in a or a["op"] in ("comm",) or "comm_type" in a or not g.is_gpu()[i]:
            continue
        t = cm.op_time_us(a)
        if a["op"] == "gemm":
            terms[f"{a['dtype']} gemm" if a["dtype"] in ("fp8", "bf16") else "bf16 gemm"] += t
        elif a["op"] == "fp8_cast":
            terms["fp8 casts"] += t
        elif a["op"] == "fp8_scale":
            terms["amax/scale updates"] += t
        else:
            terms["other bf16"] += t
    return terms


def test_fp8_step_costs_casts_and_scaling_and_keeps_a_bf16_remainder():
    fp8, bf16 = _terms("fp8"), _terms("bf16")
    print("\nFP8 step terms (ms):", {k: round(v / 1e3, 2) for k, v in fp8.items()})
    print("BF16 step terms (ms):", {k: round(v / 1e3, 2) for k, v in bf16.items()})
    assert fp8["fp8 gemm"] > 0 and fp8["fp8 casts"] > 0 and fp8["amax/scale updates"] > 0
    assert fp8["bf16 gemm"] > 0                      # the output layer stays bf16
    assert bf16["fp8 casts"] == 0 and bf16["fp8 gemm"] == 0
    # scaled GEMMs are faster than bf16 ones, but less than the 2x peak ratio (68% vs 80% of peak) ...
    gemm_speedup = bf16["bf16 gemm"] / (fp8["fp8 gemm"] + fp8["bf16 gemm"])
    assert 1.3 < gemm_speedup < 1.75
    # ... and the casts eat part of the gain: the whole step gains less than its GEMMs
    total = lambda d: sum(d.values())  # noqa: E731
    assert fp8["fp8 casts"] > 0.03 * fp8["fp8 gemm"]
    assert 1.0 < total(bf16) / total(fp8) < gemm_speedup


def _llama405b_plan(gpus: int) -> ParallelPlan:
    # Llama 3 paper (Dubey et al. 2024) Table 4: TP 8, CP 1, PP 16, DP 64 / 128, seq 8192, 16M tokens per batch
    return ParallelPlan(tp=8, pp=16, dp=gpus // 128, seq_len=8192, global_batch=2048, micro_batch=1,
                        recompute="none", zero=1)


@pytest.mark.parametrize("gpus", [8192, 16384])
def test_llama3_405b_as_meta_trained_it_fits_in_h100_memory(gpus):
    model, plan = load_model("llama3-405b"), _llama405b_plan(gpus)
    mem = estimate_memory(model, plan, get_hardware("h100-sxm").gpu.memory_gb)
    assert not mem.oom, mem.breakdown_gib()
    # hand derivation: 405.8B params / (tp 8 * pp 16) ~ 3.17B per GPU (stage 1: 8 layers, no embedding)
    params = 8 * model.layer_params(1)[0] / 8
    assert mem.weights_gib == pytest.approx(2 * params / GIB, rel=1e-6)
    assert mem.grads_gib == pytest.approx(4 * params / GIB, rel=1e-6)            # fp32 main grads
    assert mem.optimizer_gib == pytest.approx(12 * params / (gpus // 128) / GIB, rel=1e-6)  # ZeRO-1 shards
    # Korthikanti et al. with flash attention + SP, no dropout, SwiGLU + GQA: per token and layer
    h, f, q, kv = 16384, 53248, 16384, 1024
    per_token = (4 * q + 4 * kv + 6 * f) / 8 + (2 * h + 2 * h + 4 * h) / 8
    assert layer_activation_bytes(model, plan, 1) == pytest.approx(8192 * per_token)
    # 1F1B: stage 1 holds 15 micro-batches of its 8 layers
    assert mem.activations_gib == pytest.approx(15 * 8 * 8192 * per_token / GIB, rel=1e-6)
    assert 75 < mem.total_gib < 80


def test_whatif_json_has_memory_breakdown(capsys):
    import json

    from lumos_sim.cli import main
    assert main(["whatif", "parallelism", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--seq-len", "2048",
                 "--global-batch", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    b = d["memory_breakdown_gib"]
    assert set(b) >= {"weights", "gradients", "optimizer_states", "activations", "total", "capacity"}
    assert b["total"] == pytest.approx(b["weights"] + b["gradients"] + b["optimizer_states"] + b["activations"])


def test_interleaved_schedule_holds_korthikanti_in_flight_activations():
    """Korthikanti et al. Sec. 4.2.3: the first stage of the interleaved 1F1B schedule holds
    L * (1 + (p-1)/(p*v)) layers' activations of one micro-batch (L without interleaving)."""
    model = load_model("llama3-70b")
    p, v = 4, 2
    base = dict(tp=8, pp=p, dp=1, seq_len=4096, global_batch=64, micro_batch=1, recompute="none", zero=1)
    one = estimate_memory(model, ParallelPlan(**base, vp=1)).activations_gib
    inter = estimate_memory(model, ParallelPlan(**base, vp=v)).activations_gib
    assert inter / one == pytest.approx(1 + (p - 1) / (p * v), rel=0.03)
