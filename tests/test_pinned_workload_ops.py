"""Absolute FLOPs and bytes of the op specs the workload generator emits (GEMM, grouped GEMM, elementwise,
flash attention, collective attributes), the binomial imbalance of dropless MoE routing, the Megatron-LM
pipeline schedule and the per-rank parameter counts, each counted by hand here (never the code's output).

References:
- A GEMM [m, k] x [k, n] costs 2*m*n*k FLOPs (one multiply + one add per term; Narayanan et al. 2021,
  Appendix) and moves its two operands (1 B per element in FP8, 2 B in 16 bit) and writes the 16-bit
  output once (the roofline "compulsory traffic", Williams et al. 2009).
- Flash attention (Dao 2023, FlashAttention-2 Sec. 4.1): forward 4*s_q*s_kv*d per head for d_qk = d_v
  (2 matmuls, QK^T and PV), causal mask halves it, backward 2.5x the forward (5 matmuls against 2).
  Sliding window of W keys (Beltagy et al. 2020): W(W+1)/2 + (s-W)W score pairs instead of s^2/2.
- Dropless MoE load: the (token, expert) pairs of a step land on the ep ranks uniformly, so one rank's
  load is Binomial(n, 1/ep) with mean n/ep and variance n/ep (1 - 1/ep); the largest of ep such loads
  sits ~sqrt(2 ln ep) standard deviations above the mean (extreme value of ep Gaussians, Cramer 1946).
- Megatron-LM 1F1B schedule (Narayanan et al. 2021, Sec. 2.2, Fig. 4): stage i of p runs p - i - 1
  warm-up forwards, then alternates one forward / one backward, then the cool-down backwards. The
  interleaved schedule (Fig. 4 bottom) runs (p - i - 1) * 2 + (v - 1) * p warm-up forwards, and cycles
  model chunks every p micro-batches (forward chunks ascending, backward chunks descending).
- LoRA (Hu et al. 2021): each adapted linear [in, out] gets A (r x in) and B (out x r).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from chakra_schema.graph import CommType
from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import (MoELoads, attention, coll, dropless_imbalance, elementwise, gemm,
                                             generate, grouped_gemm, layer_params_local, lora_layer_params,
                                             pipeline_schedule, representative_ranks)


# ----------------------------------------------------------------------------- GEMM
def test_gemm_flops_are_2mnk_and_bytes_read_both_operands_write_the_16bit_output():
    """[3, 5] x [5, 7], batch 2: 2 x 3 x 7 x 5 x 2 = 420 FLOPs; bf16 reads (15 + 35) x 2 B, writes 21 x 2 B
    -> 2 x 142 = 284 B; FP8 reads 1 B per operand element -> 2 x (50 + 42) = 184 B."""
    g = gemm(3, 7, 5, "bf16", 2)
    assert g == {"op": "gemm", "m": 3, "n": 7, "k": 5, "batch": 2, "dtype": "bf16", "flops": 420.0, "bytes": 284.0}
    f = gemm(3, 7, 5, "fp8", 2)
    assert f["flops"] == 420.0 and f["bytes"] == 184.0 and f["dtype"] == "fp8"
    assert gemm(3, 7, 5, "bf16")["batch"] == 1 and gemm(3, 7, 5, "bf16")["flops"] == 210.0


def test_gemm_dimensions_below_one_count_as_one_row():
    """A shard smaller than one row (e.g. 4 KV heads over TP8) still launches a 1-wide GEMM: every
    dimension and the batch are at least 1 (0.5 -> 1): 2 x 1 x 1 x 1 = 2 FLOPs, (1 + 1) x 2 + 1 x 2 = 6 B."""
    g = gemm(0, 0.5, 0, "bf16", 0)
    assert (g["m"], g["n"], g["k"], g["batch"], g["flops"], g["bytes"]) == (1, 1, 1, 1, 2.0, 6.0)
    assert isinstance(g["m"], int) and isinstance(g["n"], int)
    assert gemm(2.9, 3, 4, "bf16")["m"] == 2          # truncated like int()


def test_grouped_gemm_sums_one_gemm_per_expert_and_skips_empty_experts():
    """Experts with 3, 0 and 5 tokens, [m, 4] x [4, 6]: 2 x (3 + 5) x 6 x 4 = 384 FLOPs; bf16 bytes:
    (12 + 24) x 2 + 18 x 2 = 108 and (20 + 24) x 2 + 30 x 2 = 148, the empty expert reads its weight:
    24 x 2 = 48 -> 304 B; FP8 operands: 36 + 36 + 24 + 44 + 60 = 200 B. A negative count is 0 tokens."""
    g = grouped_gemm([3, 0, 5], 6, 4, "bf16")
    assert g == {"op": "grouped_gemm", "ms": (3, 0, 5), "n": 6, "k": 4, "wgrad": False, "dtype": "bf16",
                 "flops": 384.0, "bytes": 304.0}
    f = grouped_gemm([3, -2, 5], 6, 4, "fp8", wgrad=True)
    assert f["ms"] == (3, 0, 5) and f["bytes"] == 200.0 and f["wgrad"] is True and f["flops"] == 384.0


def test_elementwise_defaults_read_and_write_each_16bit_element_once_at_one_flop():
    """1000 elements: 1000 FLOPs, 2 x 1000 x 2 B = 4000 B; with 3 reads, 2 writes, 4 FLOPs and 4-byte
    elements: 4000 FLOPs and 1000 x 4 x 5 = 20,000 B."""
    assert elementwise(1000) == {"op": "elementwise", "dtype": "bf16", "flops": 1000.0, "bytes": 4000.0}
    e = elementwise(1000, 3, 2, op="norm", flops_per=4, elem_bytes=4)
    assert e == {"op": "norm", "dtype": "bf16", "flops": 4000.0, "bytes": 20000.0}


# ----------------------------------------------------------------------------- attention
def test_causal_flash_attention_forward_is_half_of_4_sq_skv_d_per_head():
    """b=2, 4 heads (2 KV heads), s=128, d=64: 4 x 2 x 4 x 128 x 128 x 64 / 2 = 16,777,216 FLOPs; reads
    Q, O (2 x 128 x 4 x 128 values) and K, V (128 x 2 x 128) per sequence, 2 B each:
    2 x (65,536 + 32,768) x 2 = 393,216 B."""
    a = attention(2, 4, 2, 128, 128, 64, 64, causal=True, backward=False)
    assert a["flops"] == 16_777_216.0
    assert a["bytes"] == 393_216.0
    assert a == {"op": "attention", "dtype": "bf16", "batch": 2, "heads": 4, "kv_heads": 2, "seq_q": 128,
                 "seq_kv": 128, "head_dim": 64, "v_head_dim": 64, "causal": True, "backward": False,
                 "flops": 16_777_216.0, "bytes": 393_216.0}


def test_flash_attention_backward_is_2_5x_forward_and_moves_twice_the_bytes():
    a = attention(2, 4, 2, 128, 128, 64, 64, causal=True, backward=True)
    assert a["flops"] == 2.5 * 16_777_216.0 and a["bytes"] == 2 * 393_216.0 and a["backward"] is True


def test_non_causal_attention_counts_every_score_and_sliding_window_counts_the_band():
    """Non-causal (a CP ring step against another block): 4 x 1 x 1 x 8 x 16 x 32 = 16,384 FLOPs.
    Causal with window 4 over 16 tokens: (4 x 5 / 2 + 12 x 4) = 58 pairs of 256 -> 2 x 16 x 16 x 64 x 58/256
    = 7,424 FLOPs (head dim 32 + v dim 32); a window as long as the sequence is plain causal: 16,384."""
    assert attention(1, 1, 1, 8, 16, 32, 32, causal=False, backward=False)["flops"] == 16_384.0
    w = attention(1, 1, 1, 16, 16, 32, 32, causal=True, backward=False, window=4)
    assert w["flops"] == pytest.approx(2.0 * 16 * 16 * 64 * 58 / 256, rel=1e-12)
    assert w["window"] == 4
    full = attention(1, 1, 1, 16, 16, 32, 32, causal=True, backward=False, window=16)
    assert full["flops"] == 2.0 * 16 * 16 * 64 / 2


def test_attention_with_distinct_qk_and_v_head_dims_counts_both():
    """MLA-style d_qk = 192, d_v = 128, non-causal, 1 head, 4 x 4 tokens: 2 x 16 x (192 + 128) = 10,240
    FLOPs; bytes: (4 x 320 + 4 x 320) x 2 = 5,120."""
    a = attention(1, 1, 1, 4, 4, 192, 128, causal=False, backward=False)
    assert a["flops"] == 10_240.0 and a["bytes"] == 5_120.0
    assert "window" not in a


def test_collective_attrs_carry_type_integer_size_group_and_name():
    c = coll(CommType.REDUCE_SCATTER, 1000.7, [4, 5], "dp:4")
    assert c == {"comm_type": 7, "comm_size": 1000, "pg_ranks": [4, 5], "pg_name": "dp:4",
                 "coll_name": "reduce_scatter"}
    assert isinstance(c["comm_type"], int) and type(c["comm_type"]) is int


# ----------------------------------------------------------------------------- dropless MoE imbalance
def test_dropless_imbalance_is_the_expected_max_of_ep_binomial_loads():
    """n = 8192 pairs over ep = 8: mean 1024, sd = sqrt(1024 x 7/8) = 29.93; max ~ mean + sd x
    sqrt(2 ln 8) = 1024 + 29.93 x 2.0393 -> 1.0596."""
    n, ep = 8192, 8
    mean = n / ep
    sd = math.sqrt(mean * (1 - 1 / ep))
    expected = (mean + sd * math.sqrt(2 * math.log(ep))) / mean
    assert dropless_imbalance(ep, n) == pytest.approx(expected, rel=1e-12)
    assert dropless_imbalance(ep, n) == pytest.approx(1.0596, abs=1e-4)


def test_dropless_imbalance_is_one_without_expert_parallelism_or_tokens():
    assert dropless_imbalance(1, 1000) == 1.0
    assert dropless_imbalance(0, 1000) == 1.0
    assert dropless_imbalance(8, 0) == 1.0
    assert dropless_imbalance(8, -5) == 1.0
    # two ranks, one pair: mean 1/2, sd 1/2 -> 1 + sqrt(2 ln 2) = 2.1774
    assert dropless_imbalance(2, 1) == pytest.approx(1 + math.sqrt(2 * math.log(2)), rel=1e-12)
    # two ranks, 2 pairs: mean 1, sd sqrt(1/2), sqrt(2 ln 2) = 1.1774 -> 1.8326
    assert dropless_imbalance(2, 2) == pytest.approx(1 + math.sqrt(0.5) * math.sqrt(2 * math.log(2)), rel=1e-12)


# ----------------------------------------------------------------------------- MoE loads
def test_moe_loads_windows_and_shape_checks():
    moe = model_from_dict(dict(name="m", layers=2, hidden=64, heads=4, ffn=128, vocab=100,
                               moe=dict(num_experts=4, top_k=2, expert_ffn=32)))
    plan = ParallelPlan(dp=2, ep=2, seq_len=64, global_batch=2)
    ok = MoELoads(np.ones((3, 2, 2, 2)), np.ones((3, 2, 2, 2)))
    assert ok.windows == 3
    ok.check(moe, plan)
    with pytest.raises(ValueError, match="MoE loads are for 1 MoE layers on EP2; the model has 2 MoE layers and the plan EP2"):
        MoELoads(np.ones((3, 1, 2, 2)), np.ones((3, 1, 2, 2))).check(moe, plan)
    with pytest.raises(ValueError, match="EP4"):
        MoELoads(np.ones((3, 2, 4, 4)), np.ones((3, 2, 4, 2))).check(moe, plan)
    with pytest.raises(ValueError, match="MoE loads"):
        MoELoads(np.ones((3, 2, 2, 3)), np.ones((3, 2, 2, 2))).check(moe, plan)
    with pytest.raises(ValueError, match=r"slot_tokens shape \(2, 2, 2, 2\) does not match pair_tokens \(3, 2, 2, 2\)"):
        MoELoads(np.ones((3, 2, 2, 2)), np.ones((2, 2, 2, 2))).check(moe, plan)
    with pytest.raises(ValueError, match="slot_tokens"):
        MoELoads(np.ones((3, 2, 2, 2)), np.ones((3, 1, 2, 2))).check(moe, plan)
    with pytest.raises(ValueError, match="slot_tokens"):
        MoELoads(np.ones((3, 2, 2, 2)), np.ones((3, 2, 1, 2))).check(moe, plan)
    with pytest.raises(ValueError, match="MoE loads"):
        generate(moe, plan, "symmetric", moe_loads=MoELoads(np.ones((3, 1, 2, 2)), np.ones((3, 1, 2, 2))))


# ----------------------------------------------------------------------------- pipeline schedule
F, B = True, False


def test_1f1b_schedule_of_the_first_and_last_stage():
    """p = 2, 4 micro-batches: stage 0 warms up with 1 forward, stage 1 with none."""
    assert pipeline_schedule(2, 0, 4) == [(F, 0, 0), (F, 1, 0), (B, 0, 0), (F, 2, 0), (B, 1, 0), (F, 3, 0),
                                          (B, 2, 0), (B, 3, 0)]
    assert pipeline_schedule(2, 1, 4) == [(F, 0, 0), (B, 0, 0), (F, 1, 0), (B, 1, 0), (F, 2, 0), (B, 2, 0),
                                          (F, 3, 0), (B, 3, 0)]
    # p = 4, stage 0, 2 micro-batches: warm-up min(3, 2) = 2 -> both forwards, then both backwards
    assert pipeline_schedule(4, 0, 2) == [(F, 0, 0), (F, 1, 0), (B, 0, 0), (B, 1, 0)]
    assert pipeline_schedule(1, 0, 3) == [(F, 0, 0), (B, 0, 0), (F, 1, 0), (B, 1, 0), (F, 2, 0), (B, 2, 0)]


def test_interleaved_schedule_cycles_chunks_every_p_micro_batches():
    """p = 2, v = 2, 4 micro-batches, stage 0: warm-up (2 - 0 - 1) x 2 + (2 - 1) x 2 = 4 forwards;
    forwards go (mb0 c0, mb1 c0, mb0 c1, mb1 c1, mb2 c0, mb3 c0, mb2 c1, mb3 c1), backwards the same
    micro-batches with the chunks descending. Stage 1: warm-up 2."""
    fw = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    bw = [(0, 1), (1, 1), (0, 0), (1, 0), (2, 1), (3, 1), (2, 0), (3, 0)]
    f = [(F, m, c) for m, c in fw]
    b = [(B, m, c) for m, c in bw]
    assert pipeline_schedule(2, 0, 4, 2) == f[:4] + [x for k in range(4) for x in (f[4 + k], b[k])] + b[4:]
    assert pipeline_schedule(2, 1, 4, 2) == f[:2] + [x for k in range(6) for x in (f[2 + k], b[k])] + b[6:]
    # p = 2, v = 3, 2 micro-batches on stage 0: warm-up min(2 + 4, 6) = 6 -> all forwards first
    s = pipeline_schedule(2, 0, 2, 3)
    assert [x[0] for x in s] == [F] * 6 + [B] * 6
    assert [x[2] for x in s] == [0, 0, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0]


# ----------------------------------------------------------------------------- ranks and parameters
def test_representative_ranks_are_each_stages_first_rank():
    """Megatron rank order tp-cp-dp-pp: stage i starts at i x tp x cp x dp."""
    assert representative_ranks(ParallelPlan(tp=2, cp=2, dp=3, pp=3)) == [0, 12, 24]
    assert representative_ranks(ParallelPlan()) == [0]


LLAMA = model_from_dict(dict(name="l", layers=4, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1000))
MOE = model_from_dict(dict(name="m", layers=4, hidden=256, heads=4, ffn=512, vocab=1000,
                           moe=dict(num_experts=8, top_k=2, expert_ffn=128, shared_experts=1,
                                    shared_expert_ffn=64, first_dense_layers=1)))


def test_dense_layer_parameters_are_split_over_tensor_parallel_ranks():
    """Llama GQA layer h = 256, 4 heads of 64, 2 KV heads, f = 512: Q, O 256 x 256, K, V 256 x 128,
    SwiGLU 3 x 256 x 512, 2 RMSNorms of 256: 131,072 + 65,536 + 393,216 + 512 = 590,336; over TP4."""
    assert layer_params_local(LLAMA, ParallelPlan(tp=4), 0) == (590_336 / 4, 0.0)


def test_moe_layer_keeps_shared_experts_whole_and_splits_routed_experts_over_ep_x_etp():
    """MoE layer (layer 1; layer 0 is dense): attention 4 x 256^2 = 262,144, norms 512, router 256 x 8
    = 2,048, 8 routed experts of 3 x 256 x 128 = 98,304 each, 1 shared expert 3 x 256 x 64 = 49,152.
    TP2 EP2 ETP2: dense = (262,144 + 512 + 2,048) / 2 + 49,152 = 181,504; expert = 8 x 98,304 / 4 = 196,608."""
    plan = ParallelPlan(tp=2, dp=4, ep=2, etp=2)
    assert layer_params_local(MOE, plan, 1) == (181_504.0, 196_608.0)
    assert layer_params_local(MOE, plan, 0) == ((262_144 + 512 + 3 * 256 * 512) / 2, 0.0)


def test_lora_parameters_are_rank_times_in_plus_out_per_adapted_linear():
    """r = 8, h = 256, TP2; GQA qkv out = (256 + 2 x 128) / 2 = 256; proj in 256 / 2 = 128; SwiGLU fc1
    out 2 x 512 / 2 = 512; fc2 in 512 / 2 = 256. qkv: 8 x (256 + 256) = 4,096; proj 8 x 384 = 3,072;
    fc1 8 x 768 = 6,144; fc2 8 x 512 = 4,096."""
    p = ParallelPlan(tp=2, lora_rank=8, finetune="lora")
    assert lora_layer_params(LLAMA, p) == 4096.0
    assert lora_layer_params(LLAMA, p.with_(lora_modules=("qkv", "proj", "fc1", "fc2"))) == 4096 + 3072 + 6144 + 4096
    assert lora_layer_params(LLAMA, p.with_(lora_modules=("fc2",))) == 4096.0
    # a MoE-only model (ffn 0): fc1 / fc2 adapt the expert width 128: fc1 8 x (256 + 128) = 3,072
    moe_only = model_from_dict(dict(name="mo", layers=1, hidden=256, heads=4, ffn=0, vocab=1000,
                                    moe=dict(num_experts=4, top_k=1, expert_ffn=128)))
    assert lora_layer_params(moe_only, p.with_(lora_modules=("fc1",))) == 3072.0
    gelu = model_from_dict(dict(name="g", layers=1, hidden=256, heads=4, ffn=512, vocab=1000, activation="gelu"))
    assert lora_layer_params(gelu, p.with_(lora_modules=("fc1",))) == 8 * (256 + 256)


def test_activation_traffic_follows_gating():
    # SwiGLU forward: gate and up in, one out; backward: both inputs and the output grad in, two grads out.
    # GELU / squared ReLU: one in, one out; backward: the input and the output grad in, one grad out.
    from estimators.parallelism.workload import act_io
    assert act_io("swiglu") == (2, 1) and act_io("swiglu", backward=True) == (3, 2)
    for plain in ("gelu", "squared_relu"):
        assert act_io(plain) == (1, 1) and act_io(plain, backward=True) == (2, 1)
