"""Layouts the published Megatron-Core / NeMo / Megatron-Bridge recipes use: the expert grid (ETP / MoE
parallel folding), uneven pipelines, MTP, token drop, selective recompute by module, LoRA, FP8 recipes,
and `--set` before validation. Figures are pinned from the recipes / papers / formulas written here."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from chakra_schema.errors import TraceInputError
from estimators.model_config import load_model, model_from_dict
from estimators.parallelism.memory import estimate_memory
from estimators.parallelism.plan import ParallelPlan, chunk_sizes, stage_layers, validate_plan
from estimators.parallelism.workload import generate

TINY = model_from_dict(dict(name="tiny", layers=4, hidden=256, heads=4, ffn=1024, vocab=1000))


def _graph_ops(g):
    return {g.name[i].split(".")[-1]: a for i, a in g.attrs.items() if "op" in a or "comm_type" in a}


def test_qwen3_235b_ep32_spans_tp2_dp16_with_etp1():
    """Megatron-Bridge's Qwen3-235B-A22B H100 recipe: 256 GPUs, TP2 PP8 EP32 ETP1 (DP16 < EP32): the
    expert grid folds EP32 over the 32 ranks of a pipeline stage (4 nodes of 8)."""
    m = load_model("qwen3-235b-a22b")
    plan = ParallelPlan(tp=2, pp=8, dp=16, ep=32, etp=1, vp=4, seq_len=4096, global_batch=2048)
    validate_plan(m, plan, 256)
    assert plan.ep_group(0) == list(range(32))
    assert plan.ep_group(32) == list(range(32, 64))          # the next pipeline stage
    assert plan.expert_dp_group(5) == [5]                    # 32 ranks / (32 x 1): no expert replicas
    assert plan.edp == 1
    # ETP2 on the same ranks: EP16 groups at stride 2, pairs of consecutive ranks share an expert
    p2 = plan.with_(ep=16, etp=2)
    validate_plan(m, p2, 256)
    assert p2.ep_group(0) == list(range(0, 32, 2)) and p2.etp_group(0) == [0, 1]


def test_expert_grid_must_fit_the_stage():
    m = load_model("qwen3-235b-a22b")
    with pytest.raises(TraceInputError, match="expert grid"):
        validate_plan(m, ParallelPlan(tp=2, pp=8, dp=16, ep=64, seq_len=4096, global_batch=2048))


def test_deepseek_v3_61_layers_on_pp8_vp4_follow_the_bridge_layout():
    """Megatron-Bridge's DeepSeek-V3 layout for PP8 x VP4 is "Et|(tt|)*30mL": the embedding with one
    layer, 30 chunks of two layers, the MTP layer with the loss."""
    m = load_model("deepseek-v3")
    assert m.mtp_layers == 1
    plan = ParallelPlan(tp=2, pp=8, vp=4, dp=64, ep=64, seq_len=4096, global_batch=8192)
    validate_plan(m, plan, 1024)
    assert [len(c) for c in stage_layers(m, plan)] == [1] + [2] * 30 + [0]


def test_llama3_405b_126_layers_on_16_stages():
    """Llama 3 405B: 126 layers on PP16, the first and last stage one layer short (embedding / loss)."""
    assert chunk_sizes(126, ParallelPlan(pp=16)) == [7] + [8] * 14 + [7]


def test_first_last_stage_layers_and_explicit_layout():
    assert chunk_sizes(30, ParallelPlan(pp=4, first_stage_layers=6, last_stage_layers=6)) == [6, 9, 9, 6]
    assert chunk_sizes(10, ParallelPlan(pp=2, pipeline_layout=(3, 7))) == [3, 7]
    with pytest.raises(TraceInputError, match="pipeline-layout"):
        chunk_sizes(10, ParallelPlan(pp=2, pipeline_layout=(3, 6)))
    with pytest.raises(TraceInputError, match="do not divide"):
        chunk_sizes(32, ParallelPlan(pp=5))


def test_mtp_layer_runs_on_the_last_stage_only():
    m = load_model("deepseek-v3")
    plan = ParallelPlan(tp=2, pp=8, vp=4, dp=64, ep=64, seq_len=4096, global_batch=1024)
    first, last = generate(m, plan, ranks=[plan.rank(0), plan.rank(7)])
    assert not any(".mtp0." in n for n in first.name)
    assert any(n.endswith("mtp0.mtp_proj") for n in last.name)


@pytest.mark.parametrize("recompute_layers,recomputed", [(0, True), (1, False)])
def test_mtp_module_is_recomputed_under_uniform_full_recompute_only(recompute_layers, recomputed):
    """Megatron-Core (since core 0.14) checkpoints an MTP module's projection and layer under full recompute by
    the uniform method and leaves it eager under the block method: its forward runs again before its backward,
    and it then keeps only its input for the backward."""
    import dataclasses

    from estimators.parallelism.memory import estimate_memory
    from estimators.parallelism.plan import mtp_recomputed
    m = load_model("deepseek-v3")
    plan = ParallelPlan(tp=2, pp=8, vp=4, dp=64, ep=64, seq_len=4096, global_batch=1024, recompute="full",
                        recompute_layers=recompute_layers)
    last = generate(m, plan, ranks=[plan.rank(7)])[0]
    assert mtp_recomputed(plan) is recomputed
    assert any(".mtp0.R.mtp_proj" in n for n in last.name) is recomputed
    assert any(".mtp0.L.R." in n for n in last.name) is recomputed
    # one stage, one micro-batch in flight: the MTP module adds its input (2 s h bytes, sequence-parallel over
    # TP2) when recomputed, and far more when it keeps its activations
    small = dataclasses.replace(m, layers=4)
    one = ParallelPlan(tp=2, dp=1, ep=2, seq_len=4096, global_batch=1, recompute="full",
                       recompute_layers=recompute_layers)
    with_mtp = estimate_memory(small, one).activations_gib * 2 ** 30
    without = estimate_memory(dataclasses.replace(small, mtp_layers=0), one).activations_gib * 2 ** 30
    assert (with_mtp - without == pytest.approx(2.0 * 4096 * m.hidden / 2)) is recomputed


def test_token_drop_pads_every_expert_to_capacity():
    """Capacity factor cf with padding: each local expert computes ceil(cf * tokens * top_k * ep / E)
    rows (Megatron --moe-expert-capacity-factor + --moe-pad-expert-input-to-capacity)."""
    m = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(pp=1, dp=8, ep=8, seq_len=4096, global_batch=8, micro_batch=1, moe_capacity_factor=1.25)
    g = generate(m, plan)[0]
    up = next(a for i, a in g.attrs.items() if g.name[i].endswith("L0.F.expert_up_gate_proj"))
    mo = m.moe
    assert up["m"] == math.ceil(1.25 * 4096 * mo.top_k * 8 / mo.num_experts)
    assert up["batch"] == mo.num_experts // 8


def test_selective_recompute_of_mla_up_projections():
    """recompute_modules = mla_up_proj repeats the q_b / kv_b up-projections before the backward
    (DeepSeek-V3: q_lora 1536 -> 128 x (128 + 64), kv_lora 512 -> 128 x (128 + 128), per TP rank)."""
    m = load_model("deepseek-v3")
    plan = ParallelPlan(tp=2, pp=8, vp=4, dp=64, ep=64, seq_len=4096, global_batch=1024, recompute="selective",
                        recompute_modules=("mla_up_proj", "mlp"))
    g = generate(m, plan, ranks=[plan.rank(1)])[0]
    q = [a for i, a in g.attrs.items() if g.name[i].endswith("R.recompute_q_b_proj")]
    kv = [a for i, a in g.attrs.items() if g.name[i].endswith("R.recompute_kv_b_proj")]
    assert q and kv
    assert (q[0]["n"], q[0]["k"]) == (128 * 192 // 2, 1536) and (kv[0]["n"], kv[0]["k"]) == (128 * 256 // 2, 512)


def test_full_recompute_of_n_layers_per_chunk():
    plan = ParallelPlan(pp=1, dp=1, seq_len=256, global_batch=1, recompute="full", recompute_layers=1)
    g = generate(TINY, plan)[0]
    recomputed = {n.split(".")[1] for n in g.name if ".R." in n}
    assert recomputed == {"L0"}


def test_lora_drops_base_weight_gradients_and_optimizer_states():
    """LoRA: the base GEMMs run forward + data-grad only (4 x params FLOPs per token instead of 6);
    no gradients or optimizer states for the frozen base (only its 2-byte weights): those of the rank-16
    qkv adapters alone, 16 x (4096 + 3 x 4096) x 32 layers (4-byte gradients, 12 bytes of states)."""
    m = load_model("llama2-7b")
    base = ParallelPlan(dp=1, seq_len=4096, global_batch=1, precision="bf16")
    lora = base.with_(finetune="lora", lora_rank=16)

    def gemm_flops(plan):
        g = generate(m, plan)[0]
        return sum(a["flops"] for i, a in g.attrs.items()
                   if a.get("op") == "gemm" and "lora" not in g.name[i] and "attn" not in g.name[i])
    assert gemm_flops(lora) / gemm_flops(base) == pytest.approx(4 / 6, rel=0.01)
    mem = estimate_memory(m, lora)
    adapters = 16 * (4096 + 3 * 4096) * 32
    assert mem.grads_gib * 2 ** 30 == pytest.approx(4 * adapters)
    assert mem.optimizer_gib * 2 ** 30 == pytest.approx(12 * adapters)
    assert mem.weights_gib == pytest.approx(2 * m.param_count() / 2 ** 30, rel=0.01)


def test_current_scaling_fp8_reads_the_input_twice():
    """FP8 current scaling (FP8-CS) reduces the amax of each GEMM input before casting it: 2 B more read
    per element than delayed scaling (read 2 B, write 1 B + 1 B transpose)."""
    def cast_bytes(recipe):
        g = generate(TINY, ParallelPlan(seq_len=256, global_batch=1, precision="fp8", fp8_recipe=recipe))[0]
        a = next(a for i, a in g.attrs.items() if g.name[i].endswith("L0.F.qkv_proj_fp8_cast"))
        return a["bytes"] / (256 * TINY.hidden)
    assert cast_bytes("delayed") == pytest.approx(4.0)
    assert cast_bytes("tensorwise") == pytest.approx(6.0)


def test_cuda_graphs_remove_the_per_kernel_launch_floor():
    from replay.hardware.compute import ComputeModel
    from estimators.parallelism.workload import LAUNCH_US
    cm = ComputeModel("h100-sxm")
    eager = generate(TINY, ParallelPlan(seq_len=256, global_batch=1))[0]
    graphs = generate(TINY, ParallelPlan(seq_len=256, global_batch=1, cuda_graphs=True))[0]
    t_e = min(cm.op_estimate(a).time_us for a in eager.attrs.values() if a.get("op") == "norm")
    t_g = min(cm.op_estimate(a).time_us for a in graphs.attrs.values() if a.get("op") == "norm")
    assert t_e == pytest.approx(LAUNCH_US) and t_g < LAUNCH_US


def test_set_applies_before_the_plan_is_validated():
    """32 layers do not split over 5 stages; --set model.layers=30 makes the same flags valid."""
    base = [sys.executable, "-m", "lumos_sim", "whatif", "parallelism", "--model", "llama3-8b", "--gpus", "10",
            "--pp", "5", "--dp", "2", "--seq-len", "1024", "--global-batch", "10", "--json"]
    bad = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "do not divide" in bad.stderr
    ok = subprocess.run(base + ["--set", "model.layers=30"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["plan"]["pp"] == 5


def test_cli_takes_the_deepseek_v3_recipe_flags():
    """The issue's acceptance line, checked for its layout (validation only: the simulation is the suite's)."""
    from lumos_sim.cli import build_parser
    from lumos_sim.commands.whatif import scenario_from_args
    args = build_parser().parse_args(
        ["whatif", "parallelism", "--model", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "8", "--vp", "4",
         "--ep", "64", "--etp", "1", "--seq-len", "4096", "--global-batch", "8192", "--precision", "fp8",
         "--fp8-recipe", "tensorwise", "--recompute", "selective", "--recompute-modules", "mla_up_proj,mlp"])
    s = scenario_from_args(args)
    assert s.plan.dp == 64 and s.plan.ep == 64 and s.plan.recompute_modules == ("mla_up_proj", "mlp")
