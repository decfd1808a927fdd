"""One transformer layer's ops as the workload generator lays them out for one rank: every GEMM's shape,
every elementwise op's FLOPs and bytes, every collective's size, and the order and data dependencies
Megatron-LM runs them in, written out by hand from the published layer (never the generator's output).

References:
- Layer structure (Shoeybi et al. 2019, Megatron-LM Sec. 3, Fig. 3; Touvron et al. 2023 for the Llama
  layer): norm -> QKV projection -> (RoPE) -> attention -> output projection -> residual add -> norm ->
  MLP up(+gate) -> activation -> down -> residual add. Backward in reverse; each linear layer has a
  data-gradient GEMM [T, out] x [out, in] and a weight-gradient GEMM [in, T] x [T, out].
- Tensor parallelism (Shoeybi et al. 2019): QKV / up projections split their output columns t ways,
  output / down projections their input rows. Sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2):
  the norms and residual adds run on s/t tokens, an all-gather of the [s, b, h] bf16 activation before
  each column-parallel linear, a reduce-scatter after each row-parallel one; the backward re-gathers the
  saved input of each column-parallel linear for its weight gradient and overlaps the reduce-scatter of
  the input gradient with the weight-gradient GEMM (Megatron's async grad all-reduce / reduce-scatter).
- Elementwise traffic, 2 B per element: RMSNorm reads x, writes y (5 FLOPs per element: square,
  sum, rsqrt share, scale, weight), LayerNorm 8 FLOPs (mean and variance); their backward reads
  x, dy, y and writes dx and the weight-grad partial (2x the FLOPs). Residual add reads two tensors,
  writes one (GPT's fused bias-dropout-add also reads and writes the 1-byte mask: +0.5 each way).
  SwiGLU reads gate and up, writes one (8 FLOPs: sigmoid, two products); its backward reads 3 and
  writes 2 (12 FLOPs). RoPE: 3 FLOPs per rotated element (two products and a sum).
- Flash attention (Dao 2023): 4*s^2*d per head, halved by the causal mask; backward 2.5x.
- Eager launch cost (LAUNCH_US = 8 us per kernel from Python) on compute ops, none under CUDA graphs.
"""
from __future__ import annotations

import pytest

from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import _RankBuilder

C, TPS = 0, 1          # stream slots: compute, TP communication


def G(m, n, k, eb=2, batch=1):
    """FLOPs and bytes of a GEMM [m, k] x [k, n]: 2mnk, operands at eb bytes, 16-bit output."""
    return (2.0 * m * n * k * batch, float(batch * ((m * k + k * n) * eb + m * n * 2)))


def E(elems, reads, writes, flops_per=1.0, eb=2):
    return (float(flops_per * elems), float(elems * eb * (reads + writes)))


def table(tpl):
    """(name, slot, flops or comm size, bytes, dep names) of every op of a template."""
    names = [o[0] for o in tpl.ops]
    out = []
    for name, slot, a, deps in tpl.ops:
        dn = tuple("ENTRY" if d == -1 else names[d] for d in deps)
        if "comm_type" in a:
            out.append((name, slot, a["comm_size"], None, dn))
        else:
            out.append((name, slot, a["flops"], a["bytes"], dn))
    return out


def exp(*rows):
    """Rows (name, slot, (flops, bytes) or comm size, dep names) -> table rows."""
    out = []
    for name, slot, q, deps in rows:
        if isinstance(q, tuple):
            out.append((name, slot, q[0], q[1], tuple(deps)))
        else:
            out.append((name, slot, q, None, tuple(deps)))
    return out


# Llama-style GQA layer: h = 256, 4 heads of 64, 2 KV heads, SwiGLU f = 512, RMSNorm, RoPE
LLAMA = model_from_dict(dict(name="l", layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1000))
# GPT-style: GELU, LayerNorm (dropout), learned positions, MHA
GPT = model_from_dict(dict(name="g", layers=2, hidden=256, heads=4, ffn=1024, vocab=1000, activation="gelu",
                           norm="layernorm", position="learned", max_seq=256))


def test_llama_layer_forward_with_tp2_sequence_parallel():
    """TP2 + SP, b = 1, s = 128: T = 128 gathered tokens, 64 per rank outside the TP region.
    QKV out (256 + 2 x 128) / 2 = 256 columns, 2 heads and 1 KV head per rank; out projection 128 -> 256;
    SwiGLU 2 x 512 / 2 = 512 columns, down 256 -> 256. Every TP collective moves 128 x 256 x 2 = 65,536 B."""
    rb = _RankBuilder(LLAMA, ParallelPlan(tp=2, seq_len=128, global_batch=1), 0, 8)
    tpl = rb.layer_template(0, "F")
    T, Ts, h, full = 128, 64, 256, 128 * 256 * 2
    attn = (2.0 * 2 * 128 * 128 * 128 / 2, float((128 * 2 * 128 + 128 * 1 * 128) * 2))
    assert table(tpl) == exp(
        ("input_norm", C, E(Ts * h, 1, 1, 5), ["ENTRY"]),
        ("sp_allgather_attn", TPS, full, ["input_norm"]),
        ("qkv_proj", C, G(T, 256, h), ["sp_allgather_attn"]),
        ("rope", C, E(T * 3 * 64, 1, 1, 3), ["qkv_proj"]),
        ("attention", C, attn, ["rope"]),
        ("out_proj", C, G(T, h, 128), ["attention"]),
        ("sp_reducescatter_attn", TPS, full, ["out_proj"]),
        ("residual_add_attn", C, E(Ts * h, 2, 1), ["sp_reducescatter_attn"]),
        ("post_attn_norm", C, E(Ts * h, 1, 1, 5), ["residual_add_attn"]),
        ("sp_allgather_mlp", TPS, full, ["post_attn_norm"]),
        ("mlp_up_gate_proj", C, G(T, 512, h), ["sp_allgather_mlp"]),
        ("mlp_act", C, E(T * 256, 2, 1, 8), ["mlp_up_gate_proj"]),
        ("mlp_down_proj", C, G(T, h, 256), ["mlp_act"]),
        ("sp_reducescatter_mlp", TPS, full, ["mlp_down_proj"]),
        ("residual_add_mlp", C, E(Ts * h, 2, 1), ["sp_reducescatter_mlp"]),
    )
    assert tpl.ops[tpl.head][0] == "residual_add_mlp"
    compute = [a for _, s, a, _ in tpl.ops if s == C]
    assert all(a["launch_us"] == 8.0 for a in compute)
    assert all("launch_us" not in a for _, s, a, _ in tpl.ops if s != C)
    gemms = [a for a in compute if a["op"] == "gemm"]
    assert all(a["sustained"] is True for a in gemms) and len(gemms) == 4
    assert all(not a.get("sustained") for a in compute if a["op"] != "gemm")
    assert [(a["m"], a["n"], a["k"]) for a in gemms] == [(T, 256, h), (T, h, 128), (T, 512, h), (T, h, 256)]
    assert [a["dtype"] for a in gemms] == ["bf16"] * 4
    assert "kernel" not in tpl.ops[4][2]


def test_llama_layer_backward_with_tp2_sequence_parallel():
    """The backward of the layer above: weight-gradient GEMMs off the chain (they wait for the data-grad
    GEMM and the re-gathered input); the input-grad reduce-scatter follows the data-grad GEMM."""
    rb = _RankBuilder(LLAMA, ParallelPlan(tp=2, seq_len=128, global_batch=1), 0, 8)
    tpl = rb.layer_template(0, "B")
    T, Ts, h, full = 128, 64, 256, 128 * 256 * 2
    attn = (2.5 * 2.0 * 2 * 128 * 128 * 128 / 2, 2.0 * (128 * 2 * 128 + 128 * 1 * 128) * 2)
    assert table(tpl) == exp(
        ("residual_add_mlp_bwd", C, E(Ts * h, 1, 2), ["ENTRY"]),
        ("sp_allgather_mlp_grad", TPS, full, ["residual_add_mlp_bwd"]),
        ("mlp_down_proj_dgrad", C, G(T, 256, h), ["sp_allgather_mlp_grad"]),
        ("mlp_down_proj_wgrad", C, G(256, h, T), ["mlp_down_proj_dgrad"]),
        ("mlp_act_bwd", C, E(T * 256, 3, 2, 12), ["mlp_down_proj_dgrad"]),
        ("sp_allgather_mlp_input", TPS, full, ["mlp_act_bwd"]),
        ("mlp_up_gate_proj_dgrad", C, G(T, h, 512), ["mlp_act_bwd"]),
        ("sp_reducescatter_mlp_grad", TPS, full, ["mlp_up_gate_proj_dgrad"]),
        ("mlp_up_gate_proj_wgrad", C, G(h, 512, T), ["mlp_up_gate_proj_dgrad", "sp_allgather_mlp_input"]),
        ("post_attn_norm_bwd", C, E(Ts * h, 3, 2, 10), ["sp_reducescatter_mlp_grad"]),
        ("residual_add_attn_bwd", C, E(Ts * h, 1, 2), ["post_attn_norm_bwd"]),
        ("sp_allgather_attn_grad", TPS, full, ["residual_add_attn_bwd"]),
        ("out_proj_dgrad", C, G(T, 128, h), ["sp_allgather_attn_grad"]),
        ("out_proj_wgrad", C, G(128, h, T), ["out_proj_dgrad"]),
        ("attention_bwd", C, attn, ["out_proj_dgrad"]),
        ("rope_bwd", C, E(T * 3 * 64, 1, 1, 3), ["attention_bwd"]),
        ("sp_allgather_attn_input", TPS, full, ["rope_bwd"]),
        ("qkv_proj_dgrad", C, G(T, h, 256), ["rope_bwd"]),
        ("qkv_proj_wgrad", C, G(h, 256, T), ["qkv_proj_dgrad", "sp_allgather_attn_input"]),
        ("sp_reducescatter_attn_grad", TPS, full, ["qkv_proj_dgrad"]),
        ("input_norm_bwd", C, E(Ts * h, 3, 2, 10), ["sp_reducescatter_attn_grad"]),
    )
    assert tpl.ops[tpl.head][0] == "input_norm_bwd"


def test_gpt_layer_without_sp_all_reduces_and_counts_dropout_and_layernorm():
    """GPT (LayerNorm 8 FLOPs/elem, GELU, dropout mask in the residual adds), TP2 without SP, eager 2021
    Megatron: the input-grad all-reduce waits for the whole linear backward (weight grad included).
    MHA: 2 heads per rank, QKV out 3 x 256 / 2 = 384; FFN 1024 / 2 = 512 columns; no RoPE."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, sequence_parallel=False, async_tp_comm=False,
                        cuda_graphs=True)
    rb = _RankBuilder(GPT, plan, 0, 8)
    T, h, full = 128, 256, 128 * 256 * 2
    attn = (2.0 * 2 * 128 * 128 * 128 / 2, float((128 * 2 * 128 + 128 * 2 * 128) * 2))
    fwd = rb.layer_template(0, "F")
    assert table(fwd) == exp(
        ("input_norm", C, E(T * h, 1, 1, 8), ["ENTRY"]),
        ("qkv_proj", C, G(T, 384, h), ["input_norm"]),
        ("attention", C, attn, ["qkv_proj"]),
        ("out_proj", C, G(T, h, 128), ["attention"]),
        ("allreduce_attn", TPS, full, ["out_proj"]),
        ("residual_add_attn", C, E(T * h, 2.5, 1.5), ["allreduce_attn"]),
        ("post_attn_norm", C, E(T * h, 1, 1, 8), ["residual_add_attn"]),
        ("mlp_fc1", C, G(T, 512, h), ["post_attn_norm"]),
        ("mlp_act", C, E(T * 512, 1, 1, 8), ["mlp_fc1"]),
        ("mlp_down_proj", C, G(T, h, 512), ["mlp_act"]),
        ("allreduce_mlp", TPS, full, ["mlp_down_proj"]),
        ("residual_add_mlp", C, E(T * h, 2.5, 1.5), ["allreduce_mlp"]),
    )
    assert all("launch_us" not in a for _, _, a, _ in fwd.ops)     # CUDA graphs: no launch overhead
    bwd = rb.layer_template(0, "B")
    assert table(bwd) == exp(
        ("residual_add_mlp_bwd", C, E(T * h, 1, 2), ["ENTRY"]),
        ("mlp_down_proj_dgrad", C, G(T, 512, h), ["residual_add_mlp_bwd"]),
        ("mlp_down_proj_wgrad", C, G(512, h, T), ["mlp_down_proj_dgrad"]),
        ("mlp_act_bwd", C, E(T * 512, 2, 1, 12), ["mlp_down_proj_dgrad"]),
        ("mlp_up_gate_proj_dgrad", C, G(T, h, 512), ["mlp_act_bwd"]),
        ("mlp_up_gate_proj_wgrad", C, G(h, 512, T), ["mlp_up_gate_proj_dgrad"]),
        ("allreduce_mlp_grad", TPS, full, ["mlp_up_gate_proj_wgrad"]),
        ("post_attn_norm_bwd", C, E(T * h, 3, 2, 16), ["allreduce_mlp_grad"]),
        ("residual_add_attn_bwd", C, E(T * h, 1, 2), ["post_attn_norm_bwd"]),
        ("out_proj_dgrad", C, G(T, 128, h), ["residual_add_attn_bwd"]),
        ("out_proj_wgrad", C, G(128, h, T), ["out_proj_dgrad"]),
        ("attention_bwd", C, (2.5 * attn[0], 2 * attn[1]), ["out_proj_dgrad"]),
        ("qkv_proj_dgrad", C, G(T, h, 384), ["attention_bwd"]),
        ("qkv_proj_wgrad", C, G(h, 384, T), ["qkv_proj_dgrad"]),
        ("allreduce_attn_grad", TPS, full, ["qkv_proj_wgrad"]),
        ("input_norm_bwd", C, E(T * h, 3, 2, 16), ["allreduce_attn_grad"]),
    )


def test_async_tp_without_sp_overlaps_the_input_grad_all_reduce_with_the_weight_grad():
    """Megatron's async grad all-reduce (TP2, no SP): the all-reduce follows the data-grad GEMM, the
    weight-grad GEMM runs beside it, and the next op waits for the all-reduce."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, sequence_parallel=False)
    rows = {r[0]: r for r in table(_RankBuilder(GPT, plan, 0, 8).layer_template(0, "B"))}
    assert rows["allreduce_mlp_grad"][4] == ("mlp_up_gate_proj_dgrad",)
    assert rows["mlp_up_gate_proj_wgrad"][4] == ("mlp_up_gate_proj_dgrad",)
    assert rows["post_attn_norm_bwd"][4] == ("allreduce_mlp_grad",)
    assert rows["allreduce_attn_grad"][4] == ("qkv_proj_dgrad",)
    assert rows["input_norm_bwd"][4] == ("allreduce_attn_grad",)


def test_single_gpu_layer_has_no_tp_collectives():
    rb = _RankBuilder(LLAMA, ParallelPlan(seq_len=128, global_batch=1), 0, 8)
    for p in "FB":
        assert all(s == C for _, s, _, _ in rb.layer_template(0, p).ops)


def test_tp_comm_overlap_runs_gathers_beside_the_next_gemm_and_scatters_beside_the_previous():
    """Userbuffers TP overlap (TE tp_comm_overlap): the all-gather starts with the norm output and runs
    beside the QKV GEMM; the op after that GEMM waits for both. The reduce-scatter runs beside the out
    projection (same inputs), and the residual add waits for both."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, tp_comm_overlap=True)
    rows = {r[0]: r[4] for r in table(_RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "F"))}
    assert rows["sp_allgather_attn"] == ("input_norm",)
    assert rows["qkv_proj"] == ("input_norm",)
    assert rows["rope"] == ("qkv_proj", "sp_allgather_attn")
    assert rows["sp_reducescatter_attn"] == ("attention",)
    assert rows["out_proj"] == ("attention",)
    assert rows["residual_add_attn"] == ("out_proj", "sp_reducescatter_attn")
    assert rows["mlp_up_gate_proj"] == ("post_attn_norm",)
    assert rows["mlp_act"] == ("mlp_up_gate_proj", "sp_allgather_mlp")
    assert rows["residual_add_mlp"] == ("mlp_down_proj", "sp_reducescatter_mlp")
    bwd = {r[0]: r[4] for r in table(_RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "B"))}
    assert bwd["mlp_down_proj_dgrad"] == ("residual_add_mlp_bwd",)
    assert bwd["mlp_act_bwd"] == ("mlp_down_proj_dgrad", "sp_allgather_mlp_grad")
    # explicit deps (the re-gathered input) and the reduce-scatter after a non-GEMM op are not overlapped
    assert bwd["sp_allgather_mlp_input"] == ("mlp_act_bwd",)
    assert bwd["sp_reducescatter_attn_grad"] == ("qkv_proj_dgrad",)
