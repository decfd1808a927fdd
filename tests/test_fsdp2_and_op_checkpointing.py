"""PyTorch FSDP2 and per-op selective activation checkpointing (torchtitan's recipes), pinned by hand.

References:
- FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters are sharded as the fp32 tensors the optimizer
  updates; MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) -- torchtitan's `mixed_precision_reduce`
  default and NeMo AutoModel's FSDP2Config default -- all-gathers bf16 weights and reduce-scatters fp32
  gradients; without `set_requires_gradient_sync(False)` every backward reduce-scatters (torchtitan's
  gradient accumulation loop), with it the unsharded gradients accumulate in the reduce dtype.
- Per-op SAC (torchtitan/models/llama3/parallelize_llama.py at e7c0cae): the outputs of `aten.mm`, SDPA,
  reduce-scatters and `max` are saved except every second `aten.mm` of a block; Llama's block runs wq, wk,
  wv, wo, w1, w3, w2 in that order, so wk, wo and w3 are recomputed.
- Llama 3 8B (Llama 3 paper, Table 3 / HF config): hidden 4096, 32 heads of 128, 8 KV heads, FFN 14,336,
  32 layers, vocab 128,256.
"""
from __future__ import annotations

import pytest

from estimators.model_config import load_model, model_from_dict
from estimators.parallelism.evaluate import hw_flops_per_step
from estimators.parallelism.memory import GIB, estimate_memory, layer_activation_bytes
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import _RankBuilder, generate

H, Q, KV, F, HEADS = 4096, 4096, 1024, 14_336, 32


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama3-8b")


def test_per_op_checkpointing_keeps_the_block_input_odd_matmul_outputs_and_attention(llama8b):
    """Per token of a block, bf16: input 4096 + wq 4096 + wv 1024 + w1 14,336 + w2 4096 + the attention output
    4096 = 31,744 elements, 63,488 B, plus the fp32 log-sum-exp of 32 heads (128 B): 63,616 B. Sequence 8192,
    micro-batch 2: 16,384 tokens -> 1,042,284,544 B a block. With TP2 + SP the column-parallel outputs and the
    sequence-sharded input halve; the row-parallel w2's partial sums stay 4096 wide: (2048 + 2048 + 512 +
    7168 + 4096 + 2048) x 2 + 64 = 35,904 B."""
    plan = ParallelPlan(dp=8, seq_len=8192, micro_batch=2, global_batch=16, recompute="op")
    assert layer_activation_bytes(llama8b, plan, 0) == 16_384 * ((H + Q + KV + F + H + Q) * 2 + HEADS * 4) \
        == 1_042_284_544
    tp2 = ParallelPlan(tp=2, dp=4, seq_len=8192, micro_batch=2, global_batch=8, recompute="op")
    assert layer_activation_bytes(llama8b, tp2, 0) == 16_384 * 35_904
    # between full recompute (the input alone) and none
    full = layer_activation_bytes(llama8b, plan.with_(recompute="full"), 0)
    none = layer_activation_bytes(llama8b, plan.with_(recompute="none"), 0)
    assert full == 16_384 * H * 2 < layer_activation_bytes(llama8b, plan, 0) < none


def test_per_op_checkpointing_recomputes_wk_wo_and_w3_before_each_backward(llama8b):
    """The recompute pass runs the k, output and up projections over the 16,384 tokens (no attention: its
    output is saved); their FLOPs, 2 x 16,384 x 4096 x (1024 + 4096 + 14,336) per block, are the step's
    hardware FLOPs above no recompute: x 32 blocks x 8 micro-batches' tokens over the 16 a step holds."""
    plan = ParallelPlan(dp=8, seq_len=8192, micro_batch=2, global_batch=16, recompute="op")
    tpl = _RankBuilder(llama8b, plan, 0, 8).layer_template(0, "S")
    gemms = {name: (a["m"], a["n"], a["k"]) for name, _, a, _ in tpl.ops if a.get("op") == "gemm"}
    assert gemms == {"recompute_k_proj": (16_384, KV, H), "recompute_o_proj": (16_384, H, Q),
                     "recompute_mlp_up_proj": (16_384, F, H)}
    assert not any(a.get("op") == "attention" for _, _, a, _ in tpl.ops)
    extra = hw_flops_per_step(llama8b, plan) - hw_flops_per_step(llama8b, plan.with_(recompute="none"))
    assert extra == pytest.approx(16 * 8192 * 32 * 2 * H * (KV + Q + F), rel=1e-12)


# hidden 512, 8 heads, FFN 2048, vocab 1000, 4 layers (Llama architecture: SwiGLU, RMSNorm, untied)
TINY = model_from_dict(dict(name="tiny", layers=4, hidden=512, heads=8, ffn=2048, vocab=1000))
LAYER = 4 * 512 * 512 + 3 * 512 * 2048 + 2 * 512      # 4,195,328 parameters


def _reductions(plan: ParallelPlan) -> list[tuple[str, float]]:
    g = generate(TINY, plan, "symmetric")[0]
    return [(g.name[i], a["comm_size"]) for i, a in g.attrs.items() if g.name[i].endswith(".grad_reducescatter")]


def test_fsdp2_reduce_scatters_fp32_gradients_after_every_micro_batch():
    """DP4, 4 micro-batches: FSDP2 reduce-scatters each layer's 4,195,328 gradients in fp32 (16,781,312 B)
    after every micro-batch's backward, 4 x (4 layers + embedding + output) reductions; Megatron-FSDP once
    after the last, in bf16; FSDP2 with deferred sync once, in fp32; reduce dtype bf16 on request."""
    base = ParallelPlan(dp=4, zero=3, seq_len=128, global_batch=16)
    every = _reductions(base.with_(fsdp="fsdp2"))
    layers = [size for name, size in every if ".L" in name]
    assert layers == [LAYER * 4] * (4 * 4)
    assert {name.split(".")[0] for name, _ in every} == {"mb0", "mb1", "mb2", "mb3"}
    assert len(every) == 4 * 6
    megatron = _reductions(base)
    assert len(megatron) == 6 and [s for n, s in megatron if ".L" in n] == [LAYER * 2] * 4
    deferred = _reductions(base.with_(fsdp="fsdp2", fsdp_defer_grad_sync=True))
    assert len(deferred) == 6 and [s for n, s in deferred if ".L" in n] == [LAYER * 4] * 4
    bf16 = _reductions(base.with_(fsdp="fsdp2", fsdp_reduce_dtype="bf16"))
    assert [s for n, s in bf16 if ".L" in n] == [LAYER * 2] * 16


def test_fsdp2_gathers_fp8_weights_as_fp8_when_asked():
    """FP8 all-gather (torchao's enable_fsdp_float8_all_gather): a layer's 4,195,328 parameters are 1 B each."""
    plan = ParallelPlan(dp=4, zero=3, fsdp="fsdp2", seq_len=128, global_batch=4, precision="fp8",
                        fp8_recipe="tensorwise")
    for fp8, size in ((False, LAYER * 2), (True, LAYER)):
        g = generate(TINY, plan.with_(fsdp_fp8_all_gather=fp8), "symmetric")[0]
        sizes = {a["comm_size"] for i, a in g.attrs.items() if g.name[i].endswith(".param_allgather")}
        assert sizes == {size}


def test_fsdp2_states_are_fp32_shards_and_deferred_sync_holds_unsharded_gradients(llama8b):
    """Llama 3 8B (8,030,261,248 parameters) over 32 ranks: FSDP2 holds the fp32 parameter shard, its fp32
    gradient and Adam's two moments, 16 B a parameter / 32 = 4,015,130,624 B, plus two gathered bf16 blocks
    (218,112,000 parameters each, norms included) and one block's fp32 gradients for its reduce-scatter;
    Megatron-FSDP also keeps a bf16 shard of the weights (2 B / 32). Deferred sync over 4 micro-batches
    accumulates every gradient unsharded in fp32: + 8,030,261,248 x 4 B. (The final RMSNorm's 4,096 weights
    are not counted: 2 KiB.)"""
    p = 8_030_261_248 - 4096
    block = 2 * H * Q + 2 * H * KV + 3 * H * F + 2 * H   # wq, wo 4096^2; wk, wv 4096 x 1024; norms
    assert block == 218_112_000
    plan = ParallelPlan(dp=32, zero=3, fsdp="fsdp2", seq_len=8192, global_batch=32, recompute="full")
    mem = estimate_memory(llama8b, plan)
    states = (mem.weights_gib + mem.grads_gib + mem.optimizer_gib) * GIB
    assert states == pytest.approx(p * 16 / 32 + 2 * block * 2 + block * 4, rel=1e-9)
    megatron = estimate_memory(llama8b, plan.with_(fsdp="megatron"))
    assert (megatron.weights_gib + megatron.grads_gib + megatron.optimizer_gib) * GIB == \
        pytest.approx(p * 18 / 32 + 2 * block * 2, rel=1e-9)
    deferred = estimate_memory(llama8b, plan.with_(global_batch=128, fsdp_defer_grad_sync=True))
    assert (deferred.grads_gib - mem.grads_gib) * GIB == pytest.approx(p * 4 - block * 4, rel=1e-9)


def test_fsdp2_under_pipeline_parallelism_gathers_once_and_reduces_once():
    """PyTorch's pipeline stages turn gradient sync and the reshard after backward off for every backward but the
    last (torch.distributed.pipelining `backward_maybe_with_nosync`; NeMo AutoModel's MoE models patch it the
    same way): PP2 with 4 micro-batches gathers each of a stage's 2 layers once, in the first forward, and
    reduce-scatters once, after the last backward. The stage keeps its 2 layers gathered (bf16) and accumulates
    their fp32 gradients unsharded: + 2 x 4,195,328 x (2 + 4) B over the per-micro-batch layout."""
    plan = ParallelPlan(pp=2, dp=4, zero=3, fsdp="fsdp2", seq_len=128, global_batch=16)
    g = generate(TINY, plan, "symmetric")[0]
    gathers = [g.name[i] for i in g.attrs if g.name[i].endswith(".param_allgather")]
    assert sorted(gathers) == ["mb0.L0.F.param_allgather", "mb0.L1.F.param_allgather"]
    layers = [(n, s) for n, s in _reductions(plan) if ".L" in n]
    assert layers == [("mb3.L1.grad_reducescatter", LAYER * 4), ("mb3.L0.grad_reducescatter", LAYER * 4)]
    pp1 = ParallelPlan(dp=8, zero=3, fsdp="fsdp2", seq_len=128, global_batch=32)
    for p in (plan, pp1):
        assert p.micro_batches == 4
    stage = estimate_memory(TINY, plan)
    # the same stage states with per-micro-batch sync: two gathered layers, one layer's reduce buffer
    per_mb = estimate_memory(TINY, plan.with_(pp=1, dp=4, global_batch=16))
    assert per_mb.weights_gib * GIB == 2 * LAYER * 2
    assert stage.weights_gib * GIB == pytest.approx((2 * LAYER + 1000 * 512) * 2, rel=1e-12)


def test_fsdp2_reduces_layer_by_layer_even_when_megatrons_grad_overlap_is_off():
    """overlap_grad_reduce is Megatron's bucket option; FSDP2 reduce-scatters each layer as its backward ends,
    so turning it off defers nothing (the replay had run every micro-batch's reductions after the last pass)."""
    plan = ParallelPlan(dp=4, zero=3, fsdp="fsdp2", seq_len=128, global_batch=16, overlap_grad_reduce=False)
    g = generate(TINY, plan, "symmetric")[0]
    deps = {g.name[i]: [g.name[j] for j in g.dep_src[g.dep_ptr[i]:g.dep_ptr[i + 1]].tolist()]
            for i in g.attrs if g.name[i] == "mb0.L3.grad_reducescatter"}
    assert "mb0.L3.B.input_norm_bwd" in deps["mb0.L3.grad_reducescatter"]
    assert len(_reductions(plan)) == 4 * 6


def test_per_op_checkpointing_of_a_moe_block_keeps_its_all_to_all_outputs_and_recomputes_the_experts():
    """Qwen3-30B-A3B (hidden 2048, 32 heads of 128, 4 KV heads, 128 experts of 768, top-8, no shared expert):
    per token the block input 2048, q 4096 (1st matmul), v 512 (3rd), the router's 128 logits (5th), the
    attention output 4096 and its 32 fp32 log-sum-exps, and the 8 dispatched copies plus the combined output,
    9 x 2048: (2048 + 4096 + 512 + 128 + 4096 + 18,432) x 2 + 128 = 58,752 B. TP2 with SP halves the
    sequence-split terms (input, dispatched and combined tokens) and the column-parallel q, v and attention
    output, not the replicated router: (1024 + 2048 + 256 + 128 + 2048 + 9216) x 2 + 64 = 29,504 B. The
    recompute pass runs the experts' fc1 and fc2 again. At TP8 each rank keeps one whole KV head of the 4
    (128 wide, not 512 / 8): (256 + 512 + 128 + 128 + 512 + 2304) x 2 + 16 = 7,696 B."""
    q3 = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(dp=8, ep=8, seq_len=4096, global_batch=8, recompute="op")
    assert layer_activation_bytes(q3, plan, 0) == 4096 * 58_752
    tp2 = ParallelPlan(tp=2, dp=4, ep=8, seq_len=4096, global_batch=4, recompute="op")
    assert layer_activation_bytes(q3, tp2, 0) == 4096 * 29_504
    tp8 = ParallelPlan(tp=8, ep=8, seq_len=4096, global_batch=1, recompute="op")
    assert layer_activation_bytes(q3, tp8, 0) == 4096 * 7_696
    assert layer_activation_bytes(q3, tp2.with_(recompute="full"), 0) < layer_activation_bytes(q3, tp2, 0) \
        < layer_activation_bytes(q3, tp2.with_(recompute="none"), 0)
    ops = [name for name, _, _, _ in _RankBuilder(q3, plan, 0, 8).layer_template(0, "S").ops]
    assert {"recompute_expert_fc1", "recompute_expert_fc2", "recompute_k_proj", "recompute_o_proj"} <= set(ops)


def test_fsdp2_with_lora_keeps_the_frozen_base_shard(llama8b):
    """LoRA under FSDP2: the frozen bf16 base stays sharded in memory (8,030,257,152 x 2 B / 8) beside the two
    gathered blocks; no gradients or optimizer states for it, only for the rank-16 qkv adapters
    (16 x (4096 + 6144) x 32 layers, sharded over the 8 ranks: bf16 weights, fp32 gradients, 12 B of states)."""
    plan = ParallelPlan(dp=8, zero=3, fsdp="fsdp2", finetune="lora", seq_len=4096, global_batch=8, recompute="full")
    mem = estimate_memory(llama8b, plan)
    adapters = 16 * (4096 + 6144) * 32
    assert mem.weights_gib * GIB == pytest.approx((8_030_261_248 - 4096) * 2 / 8 + 2 * 218_112_000 * 2
                                                  + adapters * 2 / 8, rel=1e-9)
    assert mem.grads_gib * GIB == pytest.approx(adapters * 4 / 8, rel=1e-9)
    assert mem.optimizer_gib * GIB == pytest.approx(adapters * 12 / 8, rel=1e-9)


@pytest.mark.parametrize("flags", [["--fsdp", "fsdp2"], ["--fsdp-reduce-dtype", "bf16"], ["--fsdp-fp8-all-gather"]])
def test_fsdp_options_without_zero_3_are_one_line_errors(flags, capsys):
    from lumos_sim.cli import main
    rc = main(["whatif", "parallelism", "--model", "llama3-8b", "--gpus", "16", "--seq-len", "4096",
               "--global-batch", "64", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and flags[0] in err and "--zero 3" in err, err


@pytest.mark.parametrize("flags,message", [
    (["--pp", "4", "--pipeline-layout", "8,0,16,8"], "only the first and the last pipeline chunk"),
    (["--recompute", "op", "--recompute-layers", "2"], "--recompute-layers needs --recompute full"),
    (["--search", "--zero", "1", "--fsdp", "fsdp2"], "--fsdp fsdp2 needs --zero 3"),
    (["--search", "--recompute", "op", "--recompute-modules", "mlp"],
     "--recompute-modules needs --recompute selective"),
])
def test_layouts_and_flags_that_would_be_ignored_or_crash_are_one_line_errors(flags, message, capsys):
    """Fuzzing finds: an empty pipeline chunk between two others crashed the generator (KeyError); the others
    were silently ignored (a search held to ZeRO-1 returned plans labelled FSDP2)."""
    from lumos_sim.cli import main
    rc = main(["whatif", "parallelism", "--model", "llama3-8b", "--gpus", "32", "--seq-len", "4096",
               "--global-batch", "256", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_search_prices_fsdp2_pipelines_gathering_once():
    """The search's estimate of an FSDP2 pipeline had charged every pass a gather and every backward a reduction
    (the pp 1 rule), ranking a 23 s plan above 4.6 s ones: the plan it ranks first now simulates within 25% of
    the best of the ten it ranks first."""
    from estimators.parallelism.search import SearchSpace, rank_plans
    from estimators.parallelism.plan import ParallelPlan
    from estimators.parallelism.whatif import simulate_ranked
    from estimators.scenario import Scenario
    from replay.hardware.config import get_hardware
    model, hw = load_model("deepseek-v3"), get_hardware("h200")
    carry = ParallelPlan(zero=3, fsdp="fsdp2")
    space = SearchSpace.constrained(SearchSpace.keeping(carry), pp=8, ep=8, recompute="op", zero=3)
    ranked = rank_plans(model, hw, 256, 4096, 256, "bf16", space)
    base = Scenario(whatif="parallelism", model=model, hardware=hw)
    first = simulate_ranked(base, ranked, 1)[0].detail.step_time_s
    best = min(p.detail.step_time_s for p in simulate_ranked(base, ranked, 10))
    assert first <= 1.25 * best
