"""Costs of a Megatron-Core MoE layer and of Megatron-Bridge 25.x recipe settings that the parallelism what-if
prices: the all-to-all dispatcher's regrouping of received tokens by local expert, FP8 current scaling's
four kernels per cast, and the fused (bf16, in-place) cross entropy. Figures are written from the
formulas in the tests, not read from the code."""
from __future__ import annotations

import pytest

from estimators.model_config import load_model
from estimators.parallelism.memory import estimate_memory
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import MOE_SYNC_IDLE_US, _RankBuilder


def _qwen30b_plan(**kw) -> ParallelPlan:
    # Qwen3-30B-A3B: hidden 2048, 128 experts top-8; EP8 on 8 GPUs, mb 2 x 4096 tokens
    base = dict(tp=1, pp=1, dp=8, ep=8, seq_len=4096, micro_batch=2, global_batch=16, precision="bf16")
    base.update(kw)
    return ParallelPlan(**base)


def _ops(model, plan, pas="F"):
    rb = _RankBuilder(model, plan, 0, 8)
    layer = next(i for i in range(model.layers) if model.is_moe_layer(i))
    return {name: attrs for name, _, attrs, _ in rb.layer_template(layer, pas).ops}


def test_alltoall_dispatcher_regroups_received_tokens_by_expert_both_ways():
    model = load_model("qwen3-30b-a3b")
    fwd = _ops(model, _qwen30b_plan())
    # tokens an EP rank receives: 8192 local tokens x top-8 x EP8 / 128 experts per expert, 16 experts
    received = 8192 * 8 * 8 // 128 * 16
    for name in ("moe_sort_chunks", "moe_unsort_chunks"):
        assert fwd[name]["bytes"] == received * 2048 * 2 * 2     # read + write, bf16
    bwd = _ops(model, _qwen30b_plan(), "B")
    assert "moe_sort_chunks_bwd" in bwd and "moe_unsort_chunks_bwd" in bwd


def test_no_regrouping_with_one_local_expert_or_deepep():
    model = load_model("qwen3-30b-a3b")
    assert "moe_sort_chunks" not in _ops(model, _qwen30b_plan(ep=128, dp=128, global_batch=256))  # 1 expert per rank
    assert "moe_sort_chunks" not in _ops(model, _qwen30b_plan(moe_a2a="deepep"))
    assert "moe_sort_chunks" not in _ops(model, _qwen30b_plan(ep=1))


def test_fp8_current_scaling_launches_four_kernels_per_expert_cast_and_delayed_one_for_all_experts():
    """Transformer Engine 2.7-2.11: a current-scaling quantize zeroes the amax, reduces it, computes the
    scale and casts (four launches), expert by expert in GroupedLinear's C++ loop; delayed scaling casts
    every expert's input in one multi-tensor cast-transpose (split_quantize -> nvte_multi_cast_transpose)."""
    model = load_model("qwen3-30b-a3b")
    cs = _ops(model, _qwen30b_plan(precision="fp8", fp8_recipe="tensorwise"))
    ds = _ops(model, _qwen30b_plan(precision="fp8", fp8_recipe="delayed"))
    bw = _ops(model, _qwen30b_plan(precision="fp8", fp8_recipe="blockwise"))
    assert cs["expert_up_gate_proj_fp8_cast"]["launches"] == 16 * 4       # 16 local experts
    assert ds["expert_up_gate_proj_fp8_cast"].get("launches", 1) == 1
    assert bw["expert_up_gate_proj_fp8_cast"]["launches"] == 16
    assert cs["qkv_proj_fp8_cast"].get("launches", 1) == 4


def test_fp8_casts_add_their_launches_to_the_moe_layer_host_time():
    """Four casts per expert and micro-batch (fc1 and fc2 inputs forward, their output gradients backward) at
    8 us a launch: current scaling 4 launches each, expert by expert; delayed scaling one launch for all
    experts at once."""
    from estimators.parallelism.workload import moe_layer_host_us
    model = load_model("qwen3-30b-a3b")
    bf16 = moe_layer_host_us(model, _qwen30b_plan())
    assert moe_layer_host_us(model, _qwen30b_plan(precision="fp8", fp8_recipe="tensorwise")) - bf16 == \
        pytest.approx(16 * 4 * 4 * 8.0)
    assert moe_layer_host_us(model, _qwen30b_plan(precision="fp8", fp8_recipe="blockwise")) - bf16 == \
        pytest.approx(16 * 4 * 1 * 8.0)
    assert moe_layer_host_us(model, _qwen30b_plan(precision="fp8", fp8_recipe="delayed")) - bf16 == \
        pytest.approx(4 * 1 * 8.0)


def test_fused_cross_entropy_keeps_bf16_logits_instead_of_an_fp32_copy():
    model = load_model("llama3-8b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, seq_len=8192, micro_batch=1, global_batch=128)
    unfused = estimate_memory(model, plan, 80.0)
    fused = estimate_memory(model, plan.with_(fused_cross_entropy=True), 80.0)
    # 8192 tokens x 128256 vocab logits: 4 B -> 2 B each
    assert abs((unfused.activations_gib - fused.activations_gib) * 1024 ** 3 - 2.0 * 8192 * 128256) < 1.0


def test_fused_cross_entropy_reads_and_writes_the_logits_once():
    model = load_model("llama3-8b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, seq_len=8192, micro_batch=1, global_batch=128, fused_cross_entropy=True)
    rb = _RankBuilder(model, plan, 0, 8)
    fwd = {n: a for n, _, a, _ in rb.output_template(False).ops}
    bwd = {n: a for n, _, a, _ in rb.output_template(True).ops}
    assert fwd["cross_entropy"]["bytes"] == 8192 * 128256 * 2 * 2
    assert bwd["cross_entropy_bwd"]["bytes"] == 8192 * 128256 * 2 * 2


def test_overlapped_all_to_all_hides_its_measured_share_of_the_exposed_time():
    """EP communication overlap hides 36.55% of the all-to-all time (EP_OVERLAP_HIDDEN, measured in a profiled
    H100 run): the step shortens by about that share of the exposed all-to-all time, never below the compute.
    Token drop padded to capacity, so that no dropless host sync (which the overlap also covers) mixes in, and
    whole-iteration CUDA graphs, so that no host-bound layer (whose floor the shorter overlapped step can
    reach) does."""
    from estimators.parallelism.evaluate import predict
    model = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(tp=1, pp=2, dp=8, ep=8, seq_len=4096, micro_batch=2, global_batch=64, precision="bf16",
                        moe_capacity_factor=1.0, cuda_graphs=True)
    exposed = predict(model, plan, "h100-sxm")
    hidden = predict(model, plan.with_(moe_a2a_overlap=True), "h100-sxm")
    bd = exposed.breakdown.mean
    assert bd.exposed_ep_comm_us > 0.05 * bd.window_us          # the all-to-alls matter here
    assert bd.host_wait_us == 0 and hidden.breakdown.mean.host_wait_us == 0
    saved = exposed.step_time_s - hidden.step_time_s
    assert 0.25 * bd.exposed_ep_comm_us / 1e6 < saved < 0.48 * bd.exposed_ep_comm_us / 1e6
    assert hidden.step_time_s >= bd.compute_us / 1e6 * 0.999


def test_dropless_moe_waits_for_the_host_once_per_layer_forward():
    """Dropless dispatch blocks the host on the token counts once per MoE layer forward; the GPU then waits
    MOE_SYNC_IDLE_US for it: per stage and step, layers per stage x micro-batches of it, with or without the
    all-to-all overlap (the counts come from the last compute queued). Token drop padded to capacity has
    static sizes: no wait. Micro-batches of 4 sequences keep each layer's GPU work above its host work, so
    no host-bound wait (MOE_LAYER_HOST_US) adds to the syncs'."""
    from estimators.parallelism.evaluate import predict
    model = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, seq_len=4096, micro_batch=4, global_batch=128, precision="bf16")
    dropless = predict(model, plan, "h100-sxm").breakdown.mean
    assert dropless.host_wait_us == pytest.approx(model.layers * plan.micro_batches * MOE_SYNC_IDLE_US, rel=1e-6)
    overlapped = predict(model, plan.with_(moe_a2a_overlap=True), "h100-sxm").breakdown.mean
    assert overlapped.host_wait_us == pytest.approx(dropless.host_wait_us, rel=1e-6)
    assert predict(model, plan.with_(moe_capacity_factor=1.0), "h100-sxm").breakdown.mean.host_wait_us == 0
    # a full recompute runs each layer's forward, dispatcher and its sync included, a second time
    recomputed = predict(model, plan.with_(recompute="full"), "h100-sxm").breakdown.mean
    # (the breakdown charges the wait where nothing else runs: a DP transfer may cover a little of it)
    assert recomputed.host_wait_us == pytest.approx(2 * dropless.host_wait_us, rel=0.01)


def test_an_overlapped_plan_splits_each_all_to_all_into_an_exposed_and_a_hidden_share():
    """63.45% of the dispatch bytes on the compute chain, 36.55% beside it (the same EP stream, exposed first):
    the share of its communication a profiled H100 run with the overlap hid (Megatron-Bridge PR #5094)."""
    plan = _qwen30b_plan(moe_a2a_overlap=True)
    fwd = _ops(load_model("qwen3-30b-a3b"), plan)
    whole = _ops(load_model("qwen3-30b-a3b"), _qwen30b_plan())["moe_dispatch_alltoall"]["comm_size"]
    assert fwd["moe_dispatch_alltoall_exposed"]["comm_size"] == pytest.approx(0.6345 * whole, rel=1e-6)
    assert fwd["moe_dispatch_alltoall"]["comm_size"] == pytest.approx(0.3655 * whole, rel=1e-6)


def test_clamped_glu_adds_the_clamp_and_concat_passes_over_the_expert_input():
    """GPT-OSS (swiglu_limit 7): Megatron-Core clamps both halves of fc1's output and concatenates them
    before the fused activation: read 2 + write 2 bytes-per-element passes over tokens x top-k x 2*ffn."""
    model = load_model("gpt-oss-120b")
    assert model.glu_clamp == 7.0
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, seq_len=4096, micro_batch=1, global_batch=8)
    fwd = _ops(model, plan)
    routed = 4096 * 4 * 8 // 128 * 16          # tokens x top-4 x EP8 / 128 experts, 16 local experts
    assert fwd["expert_act_clamp"]["bytes"] == routed * 2 * 2880 * 2 * (2 + 2)
    assert "expert_act_clamp_bwd" in _ops(model, plan, "B")
    assert "expert_act_clamp" not in _ops(load_model("qwen3-30b-a3b"), _qwen30b_plan())


def test_gpt_oss_config_json_swiglu_limit_is_the_clamp():
    from pathlib import Path
    from estimators.model_config import load_hf_config
    m = load_hf_config(Path(__file__).parent / "data" / "hf_configs" / "gpt-oss-120b.json")
    assert m.glu_clamp == 7.0 and m.glu_clamp == load_model("gpt-oss-120b").glu_clamp


def test_an_overlapped_all_to_all_estimate_says_it_reads_above_the_published_runs():
    """The prediction says what share of the all-to-all its overlap hides, and only when the plan overlaps
    an expert-parallel all-to-all."""
    from estimators.parallelism.evaluate import predict
    from estimators.parallelism.whatif import prediction_of_plan
    model = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, seq_len=4096, micro_batch=1, global_batch=8, precision="bf16")
    overlapped = prediction_of_plan(predict(model, plan.with_(moe_a2a_overlap=True), "h100-sxm"))
    assert any("hides 37% of the EP all-to-all time" in n for n in overlapped.notes)
    assert not any("hides" in n for n in prediction_of_plan(predict(model, plan, "h100-sxm")).notes)
    no_ep = plan.with_(ep=1, moe_a2a_overlap=True)
    assert not any("hides" in n for n in prediction_of_plan(predict(model, no_ep, "h100-sxm")).notes)


def test_a_step_that_waits_for_the_host_says_where_the_wait_comes_from():
    from estimators.parallelism.evaluate import predict
    from estimators.parallelism.whatif import prediction_of_plan
    model = load_model("qwen3-30b-a3b")
    # 1,024 tokens a micro-batch: little GPU work per layer, so the wait is more than a tenth of the step
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, seq_len=1024, micro_batch=1, global_batch=8, precision="bf16")
    dropless = prediction_of_plan(predict(model, plan, "h100-sxm"))
    assert dropless.breakdown.host_wait_us > 0.1 * dropless.breakdown.window_us
    assert any("waits 616 us for the host per MoE layer forward" in n for n in dropless.notes)
    # token drop has no sync; its layers are as host-bound (the host's work per layer is the same)
    drop = prediction_of_plan(predict(model, plan.with_(moe_capacity_factor=1.0), "h100-sxm"))
    assert not any("616 us" in n for n in drop.notes)
    assert any(n.startswith("host-bound MoE layers") for n in dropless.notes)
    assert any(n.startswith("host-bound MoE layers") for n in drop.notes)
    # 16,384 tokens a micro-batch: the GPU outlasts the host, and a wait of under a tenth is not noted
    big = prediction_of_plan(predict(model, plan.with_(seq_len=4096, micro_batch=4, global_batch=128), "h100-sxm"))
    assert not any("host" in n for n in big.notes)


def test_each_local_expert_gemm_costs_the_host_one_transformer_engine_call():
    """GroupedLinear calls one TE GEMM per local expert; each call costs the host what Megatron-MoE-ModelZoo
    issue #7 measured (645,099 nvte_cublas_gemm NVTX ranges, 13.07 s). Qwen3-30B-A3B at EP8, mb 1: 16
    experts of 4096 x 8 x 8 / 128 = 2,048 tokens; the down projection (2048 x 768 -> 2048 per expert) runs
    faster on the GPU than the host issues it, so it takes 16 calls; the wider up/gate projection does not."""
    from replay.hardware.compute import ComputeModel
    from estimators.parallelism.timing import resolve_hardware
    from estimators.parallelism.workload import LAUNCH_US
    host_per_call = 13.07e6 / 645_099                                   # us
    model = load_model("qwen3-30b-a3b")
    ops = _ops(model, _qwen30b_plan(micro_batch=1))
    cm = ComputeModel(resolve_hardware("h100-sxm"))
    down, up = ops["expert_down_proj"], ops["expert_up_gate_proj"]
    assert (down["m"], down["n"], down["k"], down["batch"]) == (2048, 2048, 768, 16)
    assert down["launches"] == 16 and down["launch_us"] == pytest.approx(host_per_call, abs=0.05)
    assert cm.op_time_us(down) == pytest.approx(16 * down["launch_us"], rel=1e-12)
    gpu_only = {k: v for k, v in up.items() if k not in ("launch_us", "launches")}
    assert cm.op_time_us(gpu_only) > 16 * down["launch_us"]
    assert cm.op_time_us(up) == pytest.approx(cm.op_time_us(gpu_only))
    bwd = _ops(model, _qwen30b_plan(micro_batch=1), "B")
    assert bwd["expert_down_proj_wgrad"]["launch_us"] == pytest.approx(host_per_call, abs=0.05)
    assert ops["router"]["launch_us"] == LAUNCH_US                     # a single-kernel op: one launch
    graphed = _ops(model, _qwen30b_plan(micro_batch=1, cuda_graphs=True))
    assert "launch_us" not in graphed["expert_down_proj"]             # CUDA graphs replay without the host


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_uniform_measured_routing_costs_what_balanced_routing_costs(precision):
    """Measured routing that happens to be uniform (every EP rank sends every other the same pairs, every
    local expert gets the balanced count) prices its experts like balanced routing: the same host call per
    expert GEMM and, in FP8, the same casts. Qwen3-30B-A3B cut to 2 layers, 8 GPUs EP8, micro-batch 1 of 4,096
    tokens: each rank sends each rank 4096 x 8 / 8 = 4,096 (token, expert) pairs, and each of its 16 local
    experts gets 4096 x 8 / 16 = 2,048 tokens."""
    import dataclasses

    import numpy as np

    from estimators.parallelism.evaluate import predict
    from estimators.parallelism.workload import MoELoads
    model = dataclasses.replace(load_model("qwen3-30b-a3b"), layers=2)
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, seq_len=4096, micro_batch=1, global_batch=8, precision=precision)
    moe_layers, ep, local = model.moe_layers, 8, 128 // 8
    pairs = np.full((1, moe_layers, ep, ep), 4096 * 8 / ep)
    slots = np.full((1, moe_layers, ep, local), 4096 * 8 * ep / 128)
    measured = predict(model, plan, "h100-sxm", mode="symmetric", moe_loads=MoELoads(pairs, slots))
    balanced = predict(model, plan, "h100-sxm", mode="symmetric")
    assert measured.step_time_s == pytest.approx(balanced.step_time_s, rel=0.01)


def _qwen30b_run(hardware: str, **kw):
    from estimators.parallelism.evaluate import predict
    base = dict(tp=1, pp=1, seq_len=4096, micro_batch=1, precision="bf16", attention_kernel="cudnn")
    return predict(load_model("qwen3-30b-a3b"), ParallelPlan(**{**base, **kw}), hardware)


def test_small_moe_layers_run_at_the_host_rate_of_measured_runs():
    """Qwen3-30B-A3B's layers are small: the GPU waits for eager Megatron-Core's host work per MoE layer
    (workload.MOE_LAYER_HOST_US), per dispatcher family the value with which the model reproduces one measured
    run -- Megatron-MoE-ModelZoo issue #7, about 150 TFLOP/s (8 x B200, all-to-all, EP8, global batch 64,
    host-bound at 7% MFU), and Megatron-LM PR #5728's BF16 run, 240.5 TFLOP/s (32 x H100, HybridEP, EP8,
    global batch 256, no CUDA graphs). Held out: that PR's FP8 blockwise run with TE graphs of attn,
    moe_router and moe_preprocess, 242.9 TFLOP/s; Megatron-Bridge's H100 all-to-all run without EP overlap
    or CUDA graphs (docs/training/communication-overlap.md: EP16 on 16 GPUs, 41.25 s a step)."""
    assert _qwen30b_run("b200", dp=8, ep=8, global_batch=64, moe_a2a="alltoall").tflops_per_gpu == \
        pytest.approx(150.0, rel=0.03)
    assert _qwen30b_run("h100-sxm", dp=32, ep=8, global_batch=256, moe_a2a="hybridep").tflops_per_gpu == \
        pytest.approx(240.5, rel=0.03)
    fp8 = _qwen30b_run("h100-sxm", dp=32, ep=8, global_batch=256, moe_a2a="hybridep", precision="fp8",
                       fp8_recipe="blockwise", cuda_graph_scope=("attn", "moe_router", "moe_preprocess"))
    assert fp8.tflops_per_gpu == pytest.approx(242.9, rel=0.10)
    alltoall = _qwen30b_run("h100-sxm", dp=16, ep=16, global_batch=1024, moe_a2a="alltoall")
    assert alltoall.step_time_s == pytest.approx(41.25, rel=0.10)


def test_cuda_graphs_of_the_router_and_preprocess_take_their_host_time_off_the_layer():
    """TE graphs of the moe_router and moe_preprocess scopes replay without the host: the 1.87 ms that
    ModelZoo issue #7's router-and-preprocess NVTX range measured per layer forward comes off a host-bound
    step, once per MoE layer and micro-batch; whole-iteration graphs remove the host wait altogether."""
    eager = _qwen30b_run("b200", dp=8, ep=8, global_batch=64, moe_a2a="alltoall")
    graphed = _qwen30b_run("b200", dp=8, ep=8, global_batch=64, moe_a2a="alltoall",
                           cuda_graph_scope=("moe_router", "moe_preprocess"))
    saved = eager.step_time_s - graphed.step_time_s
    assert saved == pytest.approx(48 * 8 * 1.87e-3, rel=0.05)     # 48 layers x 8 micro-batches per GPU
    full = _qwen30b_run("b200", dp=8, ep=8, global_batch=64, moe_a2a="alltoall", cuda_graphs=True)
    assert full.breakdown.mean.host_wait_us == pytest.approx(48 * 8 * MOE_SYNC_IDLE_US, rel=1e-6)


def test_an_unknown_cuda_graph_scope_is_a_one_line_error(capsys):
    from lumos_sim.cli import main
    code = main(["whatif", "parallelism", "--model", "qwen3-30b-a3b", "--gpus", "8", "--ep", "8", "--seq-len", "1024",
                 "--global-batch", "8", "--cuda-graph-scope", "moe_router,experts"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--cuda-graph-scope: unknown scope 'experts'" in err and "\n" not in err


def test_a_fully_recomputed_host_bound_layer_pays_its_forward_host_time_again():
    """Full recompute runs each layer's forward a second time, its Python included: a host-bound step grows
    by the forward's share of the layer's host time (about 0.55: Megatron-Core's 120 + 20E forward against
    78 + 20E backward host calls for E = 16 local experts, 440 / 838 = 0.525) per layer and micro-batch."""
    from estimators.parallelism.workload import moe_layer_host_us
    plain = _qwen30b_run("b200", dp=8, ep=8, global_batch=64, moe_a2a="alltoall")
    full = _qwen30b_run("b200", dp=8, ep=8, global_batch=64, moe_a2a="alltoall", recompute="full")
    host = moe_layer_host_us(load_model("qwen3-30b-a3b"), plain.plan)
    assert full.step_time_s - plain.step_time_s == pytest.approx(48 * 8 * (440 / 838) * host / 1e6, rel=0.06)


def test_the_search_ranking_prices_host_bound_moe_layers():
    """The analytic ranking's MoE backward takes at least the layer's host time less its forward, as the
    simulation's pacing wait does: for small Qwen3-30B-A3B plans the ranked step is within 15% of the
    simulated one (without the floor it was 28-75% optimistic)."""
    from estimators.parallelism.search import rank_plans
    from estimators.parallelism.evaluate import predict
    model = load_model("qwen3-30b-a3b")
    ranked = rank_plans(model, "h100-sxm", 16, 2048, 64, "bf16")
    for row in ranked.top(3):
        plan = ranked.plan(int(row))
        assert ranked.step_s[row] == pytest.approx(predict(model, plan, "h100-sxm").step_time_s, rel=0.15), plan


def _gpt_oss_plan(**kw) -> ParallelPlan:
    # GPT-OSS-120B as its Megatron-Bridge H100 recipes run it: EP8 (16 local experts), micro-batch 1 x 4096
    # tokens, BF16, selective recompute of layernorm and moe_act
    base = dict(tp=1, pp=1, dp=8, ep=8, seq_len=4096, micro_batch=1, global_batch=8, precision="bf16",
                recompute="selective", recompute_modules=("layernorm", "moe_act"))
    base.update(kw)
    return ParallelPlan(**base)


def test_yarn_rope_with_a_temperature_runs_as_eager_ops():
    """Megatron-Core's fused RoPE takes no YaRN mscale, so GPT-OSS (0.1 ln 32 + 1) rotates q and k with the
    unfused PyTorch ops of rope_utils._apply_rotary_pos_emb_bshd: 12 kernels each, 6 passes over the tensor
    forward (t*cos, neg, cat, *sin, add, cat: 6.5 reads + 5.5 writes); Qwen3's plain RoPE stays one pass."""
    model = load_model("gpt-oss-120b")
    fwd, bwd = _ops(model, _gpt_oss_plan()), _ops(model, _gpt_oss_plan(), "B")
    elems = 4096 * (64 + 8) * 64                          # tokens x (q heads + kv heads) x head width
    assert fwd["rope"]["bytes"] == elems * 2 * (6.5 + 5.5) and fwd["rope"]["launches"] == 24
    assert bwd["rope_bwd"]["launches"] == 14              # * cos, * sin, neg, cat, add, zero fill, add
    qwen = _ops(load_model("qwen3-30b-a3b"), _qwen30b_plan(micro_batch=1))
    assert qwen["rope"]["bytes"] == 4096 * (32 + 4) * 128 * 2 * 2 and "launches" not in qwen["rope"]
    # MLA's fused RoPE takes the temperature in its cos / sin tables: a DeepSeek-V3 mscale stays fused
    from dataclasses import replace
    ds = replace(load_model("deepseek-v3"), rope_mscale=1.2)
    ds_plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, seq_len=4096, micro_batch=1, global_batch=8, precision="bf16")
    assert "launches" not in _ops(ds, ds_plan)["rope"]


def test_expert_biases_are_added_expert_by_expert():
    """GPT-OSS's expert fc2 bias comes back unapplied from TEGroupedMLP and is added by a Python loop over
    the 16 local experts (t + b * p each, then a cat): 33 kernels, 3 reads + 3 writes per element of the
    routed output forward; models without linear biases have no such pass."""
    model = load_model("gpt-oss-120b")
    fwd, bwd = _ops(model, _gpt_oss_plan()), _ops(model, _gpt_oss_plan(), "B")
    routed = 4096 * 4 * 8 // 128 * 16                     # tokens x top-4 x EP8 / 128 experts, 16 experts
    assert fwd["expert_bias_add"]["bytes"] == routed * 2880 * 2 * 6 and fwd["expert_bias_add"]["launches"] == 33
    assert bwd["expert_bias_add_bwd"]["bytes"] == routed * 2880 * 2 * 8
    assert bwd["expert_bias_add_bwd"]["launches"] == 5 * 16 + 2
    assert "expert_bias_add" not in _ops(load_model("qwen3-30b-a3b"), _qwen30b_plan())


def test_gpt_oss_layers_pay_the_host_for_their_eager_ops():
    """A GPT-OSS MoE layer's host time is a Qwen3-style layer's plus its own eager calls, each at the mean
    host cost per call of the calibrated layer (10.9 ms over the 742 non-GEMM calls Megatron-Core makes
    with 16 local experts). Counted in the source: unfused RoPE 2 x (15 + 11) = 52 beyond the fused call,
    the bias loop (2E + 6) + (5E + 5) = 123, the clamp 5 forward, 5 recomputed (moe_act), 10 backward = 20;
    recomputing the whole "moe" module also re-runs the bias loop's forward (2E + 6 = 38)."""
    from dataclasses import replace
    from estimators.parallelism.workload import moe_layer_host_us
    per_call = 10900.0 / 742
    model = load_model("gpt-oss-120b")
    plain = replace(model, rope_mscale=1.0, bias=False, glu_clamp=0.0)
    extra = moe_layer_host_us(model, _gpt_oss_plan()) - moe_layer_host_us(plain, _gpt_oss_plan())
    assert extra == pytest.approx((52 + 123 + 20) * per_call)
    no_recompute = moe_layer_host_us(model, _gpt_oss_plan(recompute="none", recompute_modules=()))
    assert moe_layer_host_us(model, _gpt_oss_plan()) - no_recompute == pytest.approx(5 * per_call)
    whole = moe_layer_host_us(model, _gpt_oss_plan(recompute_modules=("moe",)))
    assert whole - no_recompute == pytest.approx((5 + 38) * per_call)
    assert "recompute_expert_bias_add" in _ops(model, _gpt_oss_plan(recompute_modules=("moe",)), "S")
