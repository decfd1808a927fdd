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
        if "comm_type" in a or "comm_dst" in a:
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
    assert tpl.ops[4][2]["kernel"] == "fa2"     # the plan's flash kernel, named so its tiles are priced
    assert tpl.ops[4][2]["backward"] is False and tpl.ops[4][2]["causal"] is True


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


def test_userbuffers_ring_exchange_runs_the_overlapped_gemms_one_tp_shard_at_a_time():
    """Transformer Engine's userbuffers configs (NeMo-Framework-Launcher 24.07 tp_overlap/ub_cfg_h100_*,
    Megatron-Bridge comm_overlap.py): qkv_fprop, fc1_fprop, proj_dgrad and fc2_dgrad are ring exchanges
    (one GEMM per TP shard received), proj / fc2 fprop drain one chunk per shard into the reduce-scatter;
    qkv / fc1 dgrad and every weight grad overlap their collective in bulk, as whole GEMMs."""
    chunked = {"qkv_proj", "out_proj", "mlp_up_gate_proj", "mlp_down_proj", "out_proj_dgrad", "mlp_down_proj_dgrad"}
    for tp in (2, 4):
        plan = ParallelPlan(tp=tp, seq_len=128, global_batch=1, tp_comm_overlap=True)
        rb = _RankBuilder(LLAMA, plan, 0, 8)
        for p in "FRB":       # the recomputed forward is a forward
            for name, _, a, _ in rb.layer_template(0, p).ops:
                if a.get("op") == "gemm":
                    # TE issues the chunks round-robin over 3 compute streams (NVTE_COMM_OVERLAP_MAX_STREAMS)
                    want = (tp, 3) if name in chunked else (1, None)
                    assert (a.get("chunks", 1), a.get("chunk_streams")) == want, (tp, p, name)
    for plan in (ParallelPlan(tp=2, seq_len=128, global_batch=1),                       # no overlap
                 ParallelPlan(tp=2, seq_len=128, global_batch=1, tp_comm_overlap=True,
                              sequence_parallel=False)):                                 # overlap needs SP
        rb = _RankBuilder(LLAMA, plan, 0, 8)
        assert not any("chunks" in a for p in "FB" for _, _, a, _ in rb.layer_template(0, p).ops)


def test_mla_projections_are_not_userbuffers_linears():
    """DeepSeek's MLA projects the gathered input through replicated down-projections (q_a, kv_a) that
    userbuffers do not overlap: no chunked GEMM before the attention; the output projection still is."""
    mla = model_from_dict(dict(name="m", layers=2, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=1000,
                               mla=dict(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
                                        qk_rope_head_dim=16, v_head_dim=32)))
    rb = _RankBuilder(mla, ParallelPlan(tp=2, seq_len=128, global_batch=1, tp_comm_overlap=True), 0, 8)
    chunked = [n for n, _, a, _ in rb.layer_template(0, "F").ops if a.get("chunks")]
    assert chunked == ["out_proj", "mlp_up_gate_proj", "mlp_down_proj"]


# ----------------------------------------------------------------------------- attention variants
def _attn_rows(tpl, start="rope", stop="out_proj"):
    rows = table(tpl)
    names = [r[0] for r in rows]
    return rows[names.index(start) + 1:names.index(stop)]


def test_context_parallel_ring_attention_exchanges_kv_blocks_while_computing_the_previous_block():
    """CP4 TP2, s = 512 -> 128-token blocks, rank 2 (cp index 1 of the CP group [0, 2, 4, 6]) sends to 4
    and receives from 0. Each step moves K and V of the block: 128 x 2 x 1 KV head x 64 x 2 B = 32,768 B
    (backward K, V, dK, dV: 65,536 B). The diagonal block is causal (2 x 2 heads x 128^2 x 128 / 2);
    each of the 3 other steps computes half a block against the local queries, unmasked:
    2 x 2 x 128 x 64 x 128 FLOPs. Step i waits for the previous step and its own receive; send i
    forwards the block received at step i - 1 (the local K, V for the first)."""
    plan = ParallelPlan(tp=2, cp=4, seq_len=512, global_batch=1)
    rb = _RankBuilder(LLAMA, plan, 2, 8)
    kv = 128 * 2 * 1 * 64 * 2
    diag = (2.0 * 2 * 128 * 128 * 128 / 2, float((128 * 2 * 128 + 128 * 128) * 2))
    half = (2.0 * 2 * 128 * 64 * 128, float((128 * 2 * 128 + 64 * 128) * 2))
    CS, CR = 2, 3
    assert _attn_rows(rb.layer_template(0, "F")) == exp(
        ("attention_ring0", C, diag, ["rope"]),
        ("cp_send1", CS, kv, ["rope"]), ("cp_recv1", CR, kv, []),
        ("attention_ring1", C, half, ["attention_ring0", "cp_recv1"]),
        ("cp_send2", CS, kv, ["cp_recv1"]), ("cp_recv2", CR, kv, []),
        ("attention_ring2", C, half, ["attention_ring1", "cp_recv2"]),
        ("cp_send3", CS, kv, ["cp_recv2"]), ("cp_recv3", CR, kv, []),
        ("attention_ring3", C, half, ["attention_ring2", "cp_recv3"]),
    )
    bwd = _attn_rows(rb.layer_template(0, "B"), "out_proj_wgrad", "rope_bwd")
    assert bwd == exp(
        ("attention_bwd_ring0", C, (2.5 * diag[0], 2 * diag[1]), ["out_proj_dgrad"]),
        ("cp_send1", CS, 2 * kv, ["out_proj_dgrad"]), ("cp_recv1", CR, 2 * kv, []),
        ("attention_bwd_ring1", C, (2.5 * half[0], 2 * half[1]), ["attention_bwd_ring0", "cp_recv1"]),
        ("cp_send2", CS, 2 * kv, ["cp_recv1"]), ("cp_recv2", CR, 2 * kv, []),
        ("attention_bwd_ring2", C, (2.5 * half[0], 2 * half[1]), ["attention_bwd_ring1", "cp_recv2"]),
        ("cp_send3", CS, 2 * kv, ["cp_recv2"]), ("cp_recv3", CR, 2 * kv, []),
        ("attention_bwd_ring3", C, (2.5 * half[0], 2 * half[1]), ["attention_bwd_ring2", "cp_recv3"]),
    )
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert ops["cp_send2"] == {"comm_src": 2, "comm_dst": 4, "comm_size": kv, "pg_name": "cp:0"}
    assert ops["cp_recv2"] == {"comm_src": 0, "comm_dst": 2, "comm_size": kv, "pg_name": "cp:0"}
    assert ops["attention_ring0"]["causal"] is True and ops["attention_ring1"]["causal"] is False
    # the last CP rank (index 3, rank 6) wraps around: sends to rank 0, receives from rank 4
    last = {o[0]: o[2] for o in _RankBuilder(LLAMA, plan, 6, 8).layer_template(0, "F").ops}
    assert (last["cp_send1"]["comm_dst"], last["cp_recv1"]["comm_src"]) == (0, 4)


def test_ring_kv_block_uses_the_wider_of_the_qk_and_v_head_dims():
    """MLA: K is 192 wide (128 nope + 64 rope), V 128: each ring step moves 2 x 192-wide tensors; MLA
    keeps a K per query head (4 heads, TP1): 128 tokens x 2 x 4 x 192 x 2 B = 393,216 B."""
    mla = model_from_dict(dict(name="mla", layers=1, hidden=256, heads=4, ffn=512, vocab=1000,
                               mla=dict(q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=64,
                                        qk_nope_head_dim=128, v_head_dim=128)))
    rb = _RankBuilder(mla, ParallelPlan(cp=2, seq_len=256, global_batch=1), 0, 8)
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert ops["cp_send1"]["comm_size"] == 128 * 2 * 4 * 192 * 2
    assert ops["attention_ring0"]["heads"] == 4 and ops["attention_ring0"]["kv_heads"] == 4


def test_unfused_attention_is_two_batched_gemms_softmax_and_dropout():
    """2021 Megatron (GPT, TP2, s = 128, 2 heads of 64 per rank): scores [128, 64] x [64, 128] and values
    [128, 128] x [128, 64] batched over b x heads = 2; softmax 5 FLOPs per score, the dropout reads the
    scores and writes them with a 1-byte mask; the backward: data and weight grads of both bmms
    (dropout, softmax backward between them)."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, attention="unfused")
    rb = _RankBuilder(GPT, plan, 0, 8)
    sc = 2 * 128 * 128
    assert _attn_rows(rb.layer_template(0, "F"), "qkv_proj") == exp(
        ("attn_scores_bmm", C, G(128, 128, 64, batch=2), ["qkv_proj"]),
        ("attn_softmax", C, E(sc, 1, 1, 5), ["attn_scores_bmm"]),
        ("attn_dropout", C, E(sc, 1, 1.5), ["attn_softmax"]),
        ("attn_values_bmm", C, G(128, 64, 128, batch=2), ["attn_dropout"]),
    )
    assert _attn_rows(rb.layer_template(0, "B"), "out_proj_wgrad", "sp_allgather_attn_input") == exp(
        ("attn_values_bmm_dgrad", C, G(128, 128, 64, batch=2), ["out_proj_dgrad"]),
        ("attn_values_bmm_wgrad", C, G(128, 64, 128, batch=2), ["attn_values_bmm_dgrad"]),
        ("attn_dropout_bwd", C, E(sc, 1.5, 1), ["attn_values_bmm_wgrad"]),
        ("attn_softmax_bwd", C, E(sc, 2, 1, 4), ["attn_dropout_bwd"]),
        ("attn_scores_bmm_dgrad", C, G(128, 64, 128, batch=2), ["attn_softmax_bwd"]),
        ("attn_scores_bmm_wgrad", C, G(128, 64, 128, batch=2), ["attn_scores_bmm_dgrad"]),
    )
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert ops["attn_softmax"]["op"] == "softmax" and ops["attn_scores_bmm"]["dtype"] == "bf16"


def test_unfused_attention_with_cp_scores_local_queries_against_the_whole_sequence_without_dropout():
    """Llama (RMSNorm: no attention dropout), CP2, s = 256: 128 local queries x 256 keys per head, 4 heads."""
    rb = _RankBuilder(LLAMA, ParallelPlan(cp=2, seq_len=256, global_batch=1, attention="unfused"), 0, 8)
    sc = 4 * 128 * 256
    assert _attn_rows(rb.layer_template(0, "F")) == exp(
        ("attn_scores_bmm", C, G(128, 256, 64, batch=4), ["rope"]),
        ("attn_softmax", C, E(sc, 1, 1, 5), ["attn_scores_bmm"]),
        ("attn_values_bmm", C, G(128, 64, 256, batch=4), ["attn_softmax"]),
    )
    bwd = [r[0] for r in _attn_rows(rb.layer_template(0, "B"), "out_proj_wgrad", "rope_bwd")]
    assert bwd == ["attn_values_bmm_dgrad", "attn_values_bmm_wgrad", "attn_softmax_bwd", "attn_scores_bmm_dgrad",
                   "attn_scores_bmm_wgrad"]


def test_packed_sft_sequences_attend_within_each_document():
    """SFT on 128-token sequences packed with 32-token documents: 4 causal attentions of 32 tokens
    (cu_seqlens), 2 x 4 x 4 heads x 32^2 x 64 / 2 FLOPs, not one of 128."""
    plan = ParallelPlan(seq_len=128, global_batch=1, finetune="sft", packed_doc_len=32)
    rows = _attn_rows(_RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "F"))
    f = 2.0 * 4 * 4 * 32 * 32 * 128 / 2
    io = float(4 * (32 * 4 * 128 + 32 * 2 * 128) * 2)
    assert rows == exp(("attention", C, (f, io), ["rope"]))
    brows = _attn_rows(_RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "B"), "out_proj_wgrad", "rope_bwd")
    assert brows == exp(("attention_bwd", C, (2.5 * f, 2 * io), ["out_proj_dgrad"]))
    # pretraining ignores the document length; documents as long as the sequence are one attention
    for p in (plan.with_(finetune="none"), plan.with_(packed_doc_len=128), plan.with_(packed_doc_len=0)):
        rows = _attn_rows(_RankBuilder(LLAMA, p, 0, 8).layer_template(0, "F"))
        assert rows[0][2] == 2.0 * 4 * 128 * 128 * 128 / 2


def test_sliding_window_layers_count_the_band_and_full_layers_the_triangle():
    """Window 32 on every other layer ("SF"), s = 128: band pairs 32 x 33 / 2 + 96 x 32 = 3,600 of the
    128^2 square (4 heads of 64, d_qk + d_v = 128); the full layer 128^2 / 2. Packed 64-token documents
    keep the window (32 < 64); 16-token documents are shorter than it (plain causal)."""
    sw = model_from_dict(dict(name="sw", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                              sliding_window=32, window_pattern="SF"))
    rb = _RankBuilder(sw, ParallelPlan(seq_len=128, global_batch=1), 0, 8)
    w0 = rb.layer_template(0, "F")
    w1 = rb.layer_template(1, "F")
    a0 = _attn_rows(w0)[0]
    assert a0[2] == pytest.approx(2.0 * 4 * 128 * 128 * 128 * 3600 / 128 ** 2, rel=1e-12)
    assert {o[0]: o[2] for o in w0.ops}["attention"]["window"] == 32
    assert _attn_rows(w1)[0][2] == 2.0 * 4 * 128 * 128 * 128 / 2
    assert "window" not in {o[0]: o[2] for o in w1.ops}["attention"]
    assert _attn_rows(rb.layer_template(0, "B"), "out_proj_wgrad", "rope_bwd")[0][2] == pytest.approx(2.5 * a0[2])
    p64 = ParallelPlan(seq_len=128, global_batch=1, finetune="sft", packed_doc_len=64)
    a = {o[0]: o[2] for o in _RankBuilder(sw, p64, 0, 8).layer_template(0, "F").ops}["attention"]
    assert (a["batch"], a["seq_q"], a["window"]) == (2, 64, 32)
    assert a["flops"] == pytest.approx(2.0 * 2 * 4 * 64 * 64 * 128 * (528 + 32 * 32) / 64 ** 2, rel=1e-12)
    p16 = p64.with_(packed_doc_len=16)
    a = {o[0]: o[2] for o in _RankBuilder(sw, p16, 0, 8).layer_template(0, "F").ops}["attention"]
    assert (a["batch"], a["seq_q"], "window" in a) == (8, 16, False)
    # a window as long as the sequence is no window
    rb = _RankBuilder(sw, ParallelPlan(seq_len=32, global_batch=1), 0, 8)
    assert "window" not in {o[0]: o[2] for o in rb.layer_template(0, "F").ops}["attention"]


def test_cudnn_attention_kernel_is_tagged_on_the_attention_ops_only():
    rb = _RankBuilder(LLAMA, ParallelPlan(seq_len=128, global_batch=1, attention_kernel="cudnn"), 0, 8)
    for p, name in (("F", "attention"), ("B", "attention_bwd")):
        ops = {o[0]: o[2] for o in rb.layer_template(0, p).ops}
        assert ops[name]["kernel"] == "cudnn"
        assert all("kernel" not in a for n, a in ops.items() if n != name)


# ----------------------------------------------------------------------------- embedding, output head, MTP
# vocab 1001 over TP2: Megatron pads the vocab-parallel shard to ceil(1001 / 2) = 501 rows
ODD = model_from_dict(dict(name="odd", layers=2, hidden=256, heads=4, ffn=512, vocab=1001))


def test_output_head_logits_and_vocab_parallel_cross_entropy():
    """TP2 + SP, 128 tokens: final RMSNorm on 64 tokens, all-gather, logits [128, 256] x [256, 501] in
    bf16, fp32 cross entropy (22 B read + 16 B written per logit, 5 FLOPs), all-reduce of the 128
    per-token max and sum in fp32 (128 x 4 x 2 = 1,024 B). Backward: softmax - one-hot (4 + 3 elements
    of 2 B, 3 FLOPs), data grad, reduce-scatter of the input grad beside the weight grad."""
    T, Ts, h, Vs, full = 128, 64, 256, 501, 128 * 256 * 2
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, precision="fp8")
    rb = _RankBuilder(ODD, plan, 0, 8)
    assert table(rb.output_template(False)) == exp(
        ("final_norm", C, E(Ts * h, 1, 1, 5), ["ENTRY"]),
        ("output_allgather", TPS, full, ["final_norm"]),
        ("logits", C, G(T, Vs, h), ["output_allgather"]),
        ("cross_entropy", C, E(T * Vs, 11, 8, 5), ["logits"]),
        ("cross_entropy_allreduce", TPS, 1024, ["cross_entropy"]),
    )
    bwd = rb.output_template(True)
    assert table(bwd) == exp(
        ("cross_entropy_bwd", C, E(T * Vs, 4, 3, 3), ["ENTRY"]),
        ("logits_dgrad", C, G(T, h, Vs), ["cross_entropy_bwd"]),
        ("output_reducescatter_grad", TPS, full, ["logits_dgrad"]),
        ("logits_wgrad", C, G(h, Vs, T), ["logits_dgrad"]),
        ("final_norm_bwd", C, E(Ts * h, 3, 2, 10), ["output_reducescatter_grad"]),
    )
    ops = {o[0]: o[2] for o in bwd.ops}
    assert ops["logits_dgrad"]["dtype"] == "bf16" and ops["logits_wgrad"]["dtype"] == "bf16"
    assert ops["cross_entropy_bwd"]["op"] == "softmax"
    assert {o[0]: o[2] for o in rb.output_template(False).ops}["logits"]["dtype"] == "bf16"
    assert rb.output_template(True) is bwd          # built once per rank


def test_output_head_without_sp_all_reduces_and_accumulates_main_grads_without_fusion():
    """TP2 without SP, no gradient-accumulation fusion: the output weight's 501 x 256 grad is added into
    the fp32 main grad: read the 2 B grad and read/write the 4 B main grad, 10 B per element."""
    T, h, Vs, full = 128, 256, 501, 128 * 256 * 2
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, sequence_parallel=False, grad_accum_fusion=False)
    rb = _RankBuilder(ODD, plan, 0, 8)
    assert [r[0] for r in table(rb.output_template(False))] == ["final_norm", "logits", "cross_entropy",
                                                                "cross_entropy_allreduce"]
    assert table(rb.output_template(False))[0][2:4] == E(T * h, 1, 1, 5)
    assert table(rb.output_template(True)) == exp(
        ("cross_entropy_bwd", C, E(T * Vs, 4, 3, 3), ["ENTRY"]),
        ("logits_dgrad", C, G(T, h, Vs), ["cross_entropy_bwd"]),
        ("output_allreduce_grad", TPS, full, ["logits_dgrad"]),
        ("logits_wgrad", C, G(h, Vs, T), ["logits_dgrad"]),
        ("output_main_grad_accumulate", C, E(Vs * h, 1, 1, eb=5), ["logits_wgrad"]),
        ("final_norm_bwd", C, E(T * h, 3, 2, 10), ["output_allreduce_grad"]),
    )


def test_tied_output_head_on_one_stage_accumulates_its_grad_with_the_embedding():
    """Tied embeddings on a single stage: the output projection is the embedding table, whose main-grad
    hook runs once (in the embedding backward); with PP2 the last stage keeps its own copy."""
    tied = model_from_dict(dict(name="t", layers=2, hidden=256, heads=4, ffn=512, vocab=1000, tied_embeddings=True))
    plan = ParallelPlan(seq_len=128, global_batch=1, grad_accum_fusion=False)
    names = [r[0] for r in table(_RankBuilder(tied, plan, 0, 8).output_template(True))]
    assert "output_main_grad_accumulate" not in names
    names = [r[0] for r in table(_RankBuilder(tied, plan.with_(pp=2), 1, 8).output_template(True))]
    assert "output_main_grad_accumulate" in names


def test_embedding_lookup_and_its_backward():
    """TP2 + SP, 128 tokens, vocab shard 501 rows: the lookup writes 128 x 256 bf16 (learned positions:
    read and add the position rows, 2x), reduce-scattered over TP. Backward: all-gather the output grad,
    zero-fill the 501 x 256 shard's bf16 grad and add the token rows in fp32 (2 + 8 B per element);
    without fusion the main-grad hook also runs over the table (+ the 128 x 256 position table)."""
    T, h, Vs, full = 128, 256, 501, 128 * 256 * 2
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, grad_accum_fusion=False)
    rb = _RankBuilder(ODD, plan, 0, 8)
    assert table(rb.embedding_template(False)) == exp(
        ("embedding", C, (0.0, float(T * h * 2)), ["ENTRY"]),
        ("embedding_reducescatter", TPS, full, ["embedding"]),
    )
    assert table(rb.embedding_template(True)) == exp(
        ("embedding_allgather_grad", TPS, full, ["ENTRY"]),
        ("embedding_bwd", C, (float(T * h), float(T * h * 10 + Vs * h * 2)), ["embedding_allgather_grad"]),
        ("embedding_main_grad_accumulate", C, E(Vs * h, 1, 1, eb=5), ["embedding_bwd"]),
    )
    assert rb.embedding_template(True) is rb.embedding_template(True)
    ops = {o[0]: o[2] for o in rb.embedding_template(True).ops}
    assert ops["embedding_bwd"] == {"op": "embedding", "dtype": "fp32", "flops": float(T * h),
                                    "bytes": float(T * h * 10 + Vs * h * 2), "launch_us": 8.0}
    assert {o[0]: o[2] for o in rb.embedding_template(False).ops}["embedding"] == {
        "op": "embedding", "dtype": "bf16", "flops": 0.0, "bytes": float(T * h * 2), "launch_us": 8.0}
    gpt = _RankBuilder(GPT, plan.with_(sequence_parallel=False), 0, 8)
    assert table(gpt.embedding_template(False)) == exp(
        ("embedding", C, (0.0, float(T * h * 2 * 2)), ["ENTRY"]),
        ("embedding_allreduce", TPS, full, ["embedding"]),
    )
    assert table(gpt.embedding_template(True)) == exp(
        ("embedding_bwd", C, (float(T * h), float(T * h * 10 + 500 * h * 2)), ["ENTRY"]),
        ("embedding_main_grad_accumulate", C, E(500 * h + 256 * h, 1, 1, eb=5), ["embedding_bwd"]),
    )
    fused = _RankBuilder(GPT, ParallelPlan(seq_len=128, global_batch=1), 0, 8)
    assert [r[0] for r in table(fused.embedding_template(True))] == ["embedding_bwd"]


def test_mtp_module_projects_the_concatenated_2h_state_back_to_h():
    """DeepSeek-V3 MTP (TP2 + SP, 128 tokens): the next token's embedding (128 x 256 bf16), RMSNorm of
    both inputs (2 x 64 tokens), projection [128, 512] x [512, 128]; backward: data grad, weight grad
    beside it, the norms' backward."""
    T, Ts, h = 128, 64, 256
    rb = _RankBuilder(LLAMA, ParallelPlan(tp=2, seq_len=128, global_batch=1), 0, 8)
    assert table(rb.mtp_template(False)) == exp(
        ("mtp_embedding", C, (0.0, float(T * h * 2)), ["ENTRY"]),
        ("mtp_norms", C, E(2 * Ts * h, 1, 1, 5), ["mtp_embedding"]),
        ("mtp_proj", C, G(T, h // 2, 2 * h), ["mtp_norms"]),
    )
    bwd = rb.mtp_template(True)
    assert table(bwd) == exp(
        ("mtp_proj_dgrad", C, G(T, 2 * h, h // 2), ["ENTRY"]),
        ("mtp_proj_wgrad", C, G(2 * h, h // 2, T), ["mtp_proj_dgrad"]),
        ("mtp_norms_bwd", C, E(2 * Ts * h, 3, 2, 10), ["mtp_proj_dgrad"]),
    )
    assert rb.mtp_template(True) is bwd and rb.mtp_template(False) is rb.mtp_template(False)
    assert {o[0]: o[2]["dtype"] for o in rb.mtp_template(False).ops}["mtp_proj"] == "bf16"
    fp8 = _RankBuilder(LLAMA, ParallelPlan(tp=2, seq_len=128, global_batch=1, precision="fp8"), 0, 8)
    assert {o[0]: o[2]["dtype"] for o in fp8.mtp_template(False).ops}["mtp_proj"] == "fp8"
    assert {o[0]: o[2]["dtype"] for o in fp8.mtp_template(True).ops}["mtp_proj_dgrad"] == "fp8"
    assert {o[0]: o[2]["dtype"] for o in fp8.mtp_template(True).ops}["mtp_proj_wgrad"] == "fp8"
    assert {o[0]: o[2] for o in rb.mtp_template(False).ops}["mtp_embedding"] == {
        "op": "embedding", "dtype": "bf16", "flops": 0.0, "bytes": float(T * h * 2), "launch_us": 8.0}


# ----------------------------------------------------------------------------- recomputation
def test_selective_recompute_repeats_the_named_modules_forward():
    """Megatron-Core --recompute-modules (TP2 + SP, 128 tokens): layernorm -> both norms on 64 tokens;
    mlp -> the SwiGLU up (512 columns), activation (2 reads), down; core_attn with flash attention costs
    nothing extra (flash recomputes inside its backward), with unfused attention the scores, softmax and
    values again."""
    T, Ts, h = 128, 64, 256
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, recompute="selective",
                        recompute_modules=("core_attn", "layernorm", "mlp"))
    assert table(_RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "S")) == exp(
        ("recompute_input_norm", C, E(Ts * h, 1, 1, 5), ["ENTRY"]),
        ("recompute_post_attn_norm", C, E(Ts * h, 1, 1, 5), ["recompute_input_norm"]),
        ("recompute_mlp_fc1", C, G(T, 512, h), ["recompute_post_attn_norm"]),
        ("recompute_mlp_act", C, E(T * 256, 2, 1), ["recompute_mlp_fc1"]),
        ("recompute_mlp_fc2", C, G(T, h, 256), ["recompute_mlp_act"]),
    )
    # default modules (core_attn) with flash attention: nothing to recompute
    assert _RankBuilder(LLAMA, plan.with_(recompute_modules=()), 0, 8).layer_template(0, "S").ops == []
    un = plan.with_(recompute_modules=(), attention="unfused", sequence_parallel=False)
    assert table(_RankBuilder(GPT, un, 0, 8).layer_template(0, "S")) == exp(
        ("recompute_attn_scores_bmm", C, G(128, 128, 64, batch=2), ["ENTRY"]),
        ("recompute_attn_softmax", C, E(2 * 128 * 128, 1, 1, 5), ["recompute_attn_scores_bmm"]),
        ("recompute_attn_dropout", C, E(2 * 128 * 128, 1, 1.5), ["recompute_attn_softmax"]),
        ("recompute_attn_values_bmm", C, G(128, 64, 128, batch=2), ["recompute_attn_dropout"]),
    )
    gelu = table(_RankBuilder(GPT, plan.with_(recompute_modules=("mlp",)), 0, 8).layer_template(0, "S"))
    assert gelu == exp(
        ("recompute_mlp_fc1", C, G(T, 512, h), ["ENTRY"]),
        ("recompute_mlp_act", C, E(T * 512, 1, 1), ["recompute_mlp_fc1"]),
        ("recompute_mlp_fc2", C, G(T, h, 512), ["recompute_mlp_act"]),
    )


MLA = model_from_dict(dict(name="mla", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                           mla=dict(q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16,
                                    qk_nope_head_dim=48, v_head_dim=32)))


def test_mla_projections_and_their_recompute():
    """MLA (DeepSeek-V2 Sec. 2.1), TP2, 128 tokens: q down h -> 64, q up 64 -> 4 x (48 + 16) / 2 = 128,
    kv down h -> 32 + 16 = 48 (not split), kv up 32 -> 4 x (48 + 32) / 2 = 160; backward in reverse, each
    data grad then its weight grad beside the chain (waiting on the re-gathered input); the
    mla_up_proj recompute repeats both up-projections. RoPE rotates 2 heads x 64-wide q and k per rank."""
    T, h = 128, 256
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, recompute="selective", recompute_modules=("mla_up_proj",))
    rb = _RankBuilder(MLA, plan, 0, 8)
    rows = table(rb.layer_template(0, "F"))
    names = [r[0] for r in rows]
    assert rows[names.index("q_a_proj"):names.index("rope") + 1] == exp(
        ("q_a_proj", C, G(T, 64, h), ["sp_allgather_attn"]),
        ("q_b_proj", C, G(T, 128, 64), ["q_a_proj"]),
        ("kv_a_proj", C, G(T, 48, h), ["q_b_proj"]),
        ("kv_b_proj", C, G(T, 160, 32), ["kv_a_proj"]),
        ("rope", C, E(T * (2 + 2) * 64, 1, 1, 3), ["kv_b_proj"]),
    )
    brows = table(rb.layer_template(0, "B"))
    names = [r[0] for r in brows]
    assert brows[names.index("kv_b_proj_dgrad"):names.index("sp_reducescatter_attn_grad")] == exp(
        ("kv_b_proj_dgrad", C, G(T, 32, 160), ["rope_bwd"]),
        ("kv_b_proj_wgrad", C, G(32, 160, T), ["kv_b_proj_dgrad", "sp_allgather_attn_input"]),
        ("kv_a_proj_dgrad", C, G(T, h, 48), ["kv_b_proj_dgrad"]),
        ("kv_a_proj_wgrad", C, G(h, 48, T), ["kv_a_proj_dgrad", "sp_allgather_attn_input"]),
        ("q_b_proj_dgrad", C, G(T, 64, 128), ["kv_a_proj_dgrad"]),
        ("q_b_proj_wgrad", C, G(64, 128, T), ["q_b_proj_dgrad", "sp_allgather_attn_input"]),
        ("q_a_proj_dgrad", C, G(T, h, 64), ["q_b_proj_dgrad"]),
        ("q_a_proj_wgrad", C, G(h, 64, T), ["q_a_proj_dgrad", "sp_allgather_attn_input"]),
    )
    assert table(rb.layer_template(0, "S")) == exp(
        ("recompute_q_b_proj", C, G(T, 128, 64), ["ENTRY"]),
        ("recompute_kv_b_proj", C, G(T, 160, 32), ["recompute_q_b_proj"]),
    )
    # out projection: 2 heads x 32 value dims per rank -> h
    assert {r[0]: r for r in rows}["out_proj"][2:4] == G(T, h, 2 * 32)
    # a dense model has no MLA up-projections to recompute
    assert _RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "S").ops == []


def test_full_recompute_of_the_first_n_layers_of_each_chunk():
    """Megatron's 'block' method, recompute_layers = 1, PP2 VP2 over 8 layers (chunks of 2): the first
    layer of each chunk is recomputed, the second is not; recompute_layers = 0 means every layer."""
    m = model_from_dict(dict(name="l8", layers=8, hidden=256, heads=4, ffn=512, vocab=1000))
    plan = ParallelPlan(pp=2, vp=2, seq_len=128, global_batch=4, recompute="full", recompute_layers=1)
    rb = _RankBuilder(m, plan, 0, 8)
    # stage 0 holds chunks 0 (layers 0, 1) and 2 (layers 4, 5)
    assert [rb._full_recompute(i) for i in (0, 1, 4, 5)] == [True, False, True, False]
    assert rb._full_recompute(3) is False         # layer 3 is the second of chunk 1 (stage 1)
    assert all(_RankBuilder(m, plan.with_(recompute_layers=0), 0, 8)._full_recompute(i) for i in range(8))
    assert not any(_RankBuilder(m, plan.with_(recompute="selective"), 0, 8)._full_recompute(i) for i in range(8))
    assert _RankBuilder(m, plan.with_(recompute_layers=2), 0, 8)._full_recompute(5) is True
    # the recomputed forward is the forward again
    assert table(rb.layer_template(0, "R")) == table(rb.layer_template(0, "F"))
    assert rb.layer_template(0, "R") is not rb.layer_template(0, "F")
    assert rb.layer_template(0, "R") is rb.layer_template(4, "R")


def test_layer_backward_without_fusion_adds_its_weight_grads_into_the_fp32_main_grads():
    """Without gradient-accumulation fusion a hook reads each 16-bit weight grad and reads/writes the
    fp32 main grad: 10 B per parameter of the layer shard (655,872 / 2 for a MHA Llama layer at TP2,
    here GQA: 590,336 / 2 = 295,168), 1 FLOP each; it is the last op of the backward."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, grad_accum_fusion=False)
    tpl = _RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "B")
    assert table(tpl)[-1] == exp(("main_grad_accumulate", C, E(295_168, 1, 1, eb=5), ["input_norm_bwd"]))[0]


# ----------------------------------------------------------------------------- LoRA, FP8
def test_lora_adds_the_low_rank_adapter_and_drops_the_frozen_weight_grads():
    """LoRA r = 16 on QKV (Hu et al. 2021), TP1, 128 tokens, GQA QKV out 256 + 2 x 128 = 512: forward
    x A^T [128, 256] x [256, 16], then B [128, 16] x [16, 512], added to the projection (2 reads, 1 write);
    backward: B's data and weight grads, A's data and weight grads; the frozen base weights get no
    weight-gradient GEMM at all (their data grads still flow)."""
    T, h = 128, 256
    rb = _RankBuilder(LLAMA, ParallelPlan(seq_len=128, global_batch=1, finetune="lora"), 0, 8)
    rows = table(rb.layer_template(0, "F"))
    assert rows[1:5] == exp(
        ("qkv_proj", C, G(T, 512, h), ["input_norm"]),
        ("lora_qkv_a", C, G(T, 16, h), ["qkv_proj"]),
        ("lora_qkv_b", C, G(T, 512, 16), ["lora_qkv_a"]),
        ("lora_qkv_add", C, E(T * 512, 2, 1), ["lora_qkv_b"]),
    )
    assert rows[5][4] == ("lora_qkv_add",)
    brows = table(rb.layer_template(0, "B"))
    names = [r[0] for r in brows]
    assert not [n for n in names if n.endswith("_wgrad") and not n.startswith("lora_")]
    assert brows[names.index("lora_qkv_b_dgrad"):] == exp(
        ("lora_qkv_b_dgrad", C, G(T, 16, 512), ["rope_bwd"]),
        ("lora_qkv_b_wgrad", C, G(16, 512, T), ["lora_qkv_b_dgrad"]),
        ("lora_qkv_a_dgrad", C, G(T, h, 16), ["lora_qkv_b_dgrad"]),
        ("lora_qkv_a_wgrad", C, G(h, 16, T), ["lora_qkv_a_dgrad"]),
        ("qkv_proj_dgrad", C, G(T, h, 512), ["lora_qkv_a_dgrad"]),
        ("input_norm_bwd", C, E(T * h, 3, 2, 10), ["qkv_proj_dgrad"]),
    )
    assert names[:4] == ["residual_add_mlp_bwd", "mlp_down_proj_dgrad", "mlp_act_bwd", "mlp_up_gate_proj_dgrad"]
    assert brows[2][4] == ("mlp_down_proj_dgrad",)
    # adapters elsewhere than QKV leave the QKV projection alone; MLA has no fused QKV to adapt
    plain = _RankBuilder(LLAMA, ParallelPlan(seq_len=128, global_batch=1, finetune="lora", lora_modules=("fc1",)), 0, 8)
    assert not any(n.startswith("lora_") for n, *_ in plain.layer_template(0, "F").ops)
    mla = _RankBuilder(MLA, ParallelPlan(seq_len=128, global_batch=1, finetune="lora"), 0, 8)
    assert not any(n.startswith("lora_") for n, *_ in mla.layer_template(0, "F").ops)


def test_fp8_gemms_cast_their_input_and_update_the_amax_history_per_layer():
    """FP8 delayed scaling (TE), TP1, 128 tokens: before each forward / data-grad FP8 GEMM a fused
    cast+transpose of its [m, k] input reads 2 B and writes 1 + 1 B per element (weight grads reuse the
    transposes); after the layer, the amax history (1024 steps, 4 B) of 3 tensors per FP8 GEMM is rolled:
    forward 4 GEMMs -> 12 x 1024 values, backward 8 GEMMs -> 24 x 1024, read + written.
    Tensorwise current scaling reads the input once more (amax pass): 6 B per element."""
    T, h = 128, 256
    plan = ParallelPlan(seq_len=128, global_batch=1, precision="fp8")
    rb = _RankBuilder(LLAMA, plan, 0, 8)
    rows = table(rb.layer_template(0, "F"))
    assert rows[1:4] == exp(
        ("qkv_proj_fp8_cast", C, (float(T * h), float(T * h * 4)), ["input_norm"]),
        ("qkv_proj", C, G(T, 512, h, eb=1), ["qkv_proj_fp8_cast"]),
        ("rope", C, E(T * 6 * 64, 1, 1, 3), ["qkv_proj"]),
    )
    assert rows[-1] == exp(("fp8_amax_scale_update", C, (12.0 * 1024, 12.0 * 1024 * 8), ["residual_add_mlp"]))[0]
    names = [r[0] for r in rows]
    assert names.count("qkv_proj_fp8_cast") == 1 and sum(n.endswith("_fp8_cast") for n in names) == 4
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert ops["qkv_proj_fp8_cast"]["op"] == "fp8_cast" and ops["qkv_proj_fp8_cast"]["launch_us"] == 8.0
    assert "launches" not in ops["qkv_proj_fp8_cast"]
    assert ops["fp8_amax_scale_update"]["op"] == "fp8_scale"
    assert ops["mlp_down_proj_fp8_cast"]["flops"] == T * 512
    brows = table(rb.layer_template(0, "B"))
    bn = [r[0] for r in brows]
    assert sum(n.endswith("_fp8_cast") for n in bn) == 4
    assert "mlp_down_proj_wgrad_fp8_cast" not in bn
    assert brows[-1][2:4] == (24.0 * 1024, 24.0 * 1024 * 8)
    i = bn.index("mlp_down_proj_dgrad")
    assert brows[i - 1] == exp(("mlp_down_proj_dgrad_fp8_cast", C, (float(T * h), float(T * h * 4)),
                                ["residual_add_mlp_bwd"]))[0]
    assert brows[i + 1][4] == ("mlp_down_proj_dgrad",)      # the weight grad waits for the data grad
    cs = _RankBuilder(LLAMA, plan.with_(fp8_recipe="tensorwise", cuda_graphs=True), 0, 8)
    ops = {o[0]: o[2] for o in cs.layer_template(0, "F").ops}
    # TE 2.7-2.11 current scaling: zeroing the amax, its reduction, the scale and the quantize are 4 launches
    assert ops["qkv_proj_fp8_cast"] == {"op": "fp8_cast", "dtype": "bf16", "flops": float(T * h),
                                        "bytes": float(T * h * 6), "launches": 4}
    # current scaling and bf16 layers roll no amax history
    assert "fp8_amax_scale_update" not in ops
    assert "fp8_amax_scale_update" not in [o[0] for o in _RankBuilder(LLAMA, plan.with_(precision="bf16"), 0, 8).layer_template(0, "F").ops]


def test_gqa_heads_per_rank_never_drop_below_one_kv_head():
    """8 heads of 32 with 2 KV heads over TP4: 2 query heads and max(2 / 4, 1) = 1 KV head per rank
    (Megatron replicates KV heads when tp > kv heads); QKV columns (256 + 2 x 64) / 4 = 96."""
    m = model_from_dict(dict(name="gqa", layers=1, hidden=256, heads=8, kv_heads=2, ffn=512, vocab=1000))
    rb = _RankBuilder(m, ParallelPlan(tp=4, seq_len=64, global_batch=1), 0, 8)
    assert rb._attn_dims() == (2, 1, 32, 32)
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert (ops["qkv_proj"]["n"], ops["attention"]["heads"], ops["attention"]["kv_heads"]) == (96, 2, 1)
    assert ops["rope"]["flops"] == 3.0 * 64 * (2 + 1) * 32


def test_tp_comm_overlap_leaves_a_reduce_scatter_after_a_non_gemm_op_on_the_chain():
    """The embedding's reduce-scatter follows a lookup, not a GEMM: nothing to overlap with, so it stays
    on the chain and the next pass waits for it."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, tp_comm_overlap=True)
    tpl = _RankBuilder(LLAMA, plan, 0, 8).embedding_template(False)
    assert table(tpl)[1][4] == ("embedding",) and tpl.ops[tpl.head][0] == "embedding_reducescatter"
    out = _RankBuilder(LLAMA, plan, 0, 8).output_template(True)
    rows = {r[0]: r[4] for r in table(out)}
    # the input-grad reduce-scatter runs beside the logits data-grad GEMM (same inputs)
    assert rows["output_reducescatter_grad"] == ("cross_entropy_bwd",)
    # TP1: no TP collective at all
    one = _RankBuilder(LLAMA, ParallelPlan(seq_len=128, global_batch=1), 0, 8)
    assert [r[0] for r in table(one.embedding_template(False))] == ["embedding"]
    assert [r[0] for r in table(one.output_template(False))] == ["final_norm", "logits", "cross_entropy"]


def _all_templates(rb, layers=(0,)):
    tpls = []
    for layer in layers:
        for p in "FBS":
            tpls.append(rb.layer_template(layer, p))
    tpls += [rb.embedding_template(False), rb.embedding_template(True), rb.output_template(False),
             rb.output_template(True), rb.mtp_template(False), rb.mtp_template(True)]
    return [o for t in tpls for o in t.ops]


BF16_IN_FP8 = ("router", "lora_", "attn_", "recompute_attn_", "logits")


@pytest.mark.parametrize("model", ["llama", "moe", "mla", "gpt"])
def test_gemm_precision_is_fp8_except_router_adapters_attention_bmms_and_logits(model):
    """Transformer Engine FP8 recipe as Megatron uses it: the linear layers of the transformer (QKV,
    projections, MLP / experts, MTP projection) run in FP8; the router, LoRA adapters, unfused attention
    bmms and the output layer stay in bf16. In a bf16 plan every GEMM is bf16."""
    m = {"llama": LLAMA, "gpt": GPT, "mla": MLA,
         "moe": model_from_dict(dict(name="m", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                                     moe=dict(num_experts=8, top_k=2, expert_ffn=128, shared_experts=1)))}[model]
    base = dict(tp=2, dp=2, seq_len=128, global_batch=2, recompute="selective", attention="unfused",
                recompute_modules=("core_attn", "mlp", "moe", "mla_up_proj"), finetune="lora")
    if model == "moe":
        base["ep"] = 2
    for prec in ("bf16", "fp8"):
        rb = _RankBuilder(m, ParallelPlan(precision=prec, **base), 0, 8)
        gemms = [(n, a) for n, _, a, _ in _all_templates(rb) if a.get("op") in ("gemm", "grouped_gemm")]
        assert len(gemms) > 10
        for n, a in gemms:
            want = "fp8" if prec == "fp8" and not n.startswith(BF16_IN_FP8) else "bf16"
            assert a["dtype"] == want, n


def test_sequence_parallel_always_overlaps_the_input_grad_reduction():
    """Megatron overlaps the input-grad reduce-scatter with the weight-grad GEMM whenever SP is on,
    whatever async_tp_comm says; the MoE layer's main-grad hook covers its local experts too."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, async_tp_comm=False)
    assert table(_RankBuilder(LLAMA, plan, 0, 8).layer_template(0, "B")) == \
        table(_RankBuilder(LLAMA, plan.with_(async_tp_comm=True), 0, 8).layer_template(0, "B"))
    moe = model_from_dict(dict(name="m", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                               moe=dict(num_experts=8, top_k=2, expert_ffn=128, first_dense_layers=1)))
    rb = _RankBuilder(moe, ParallelPlan(tp=2, dp=2, ep=2, seq_len=128, global_batch=2, grad_accum_fusion=False), 0, 8)
    # MoE layer 1: attention 262,144 + norms 512 + router 2,048 over TP2 = 132,352; experts 8 x 98,304 / 2
    assert table(rb.layer_template(1, "B"))[-1][2] == 132_352 + 4 * 98_304
    # dense layer 0: (262,144 + 512 + 393,216) / 2
    assert table(rb.layer_template(0, "B"))[-1][2] == (262_144 + 512 + 393_216) / 2


def test_ffn_not_divisible_by_tp_keeps_whole_columns_per_rank():
    """FFN 514 over TP4: each rank holds floor(514 / 4) = 128 columns (SwiGLU up 256); the activation
    runs on 128 x 128 elements (8 FLOPs each, 2 reads, 1 write), its backward 12 FLOPs."""
    m = model_from_dict(dict(name="odd-ffn", layers=1, hidden=256, heads=4, ffn=514, vocab=1000))
    rb = _RankBuilder(m, ParallelPlan(tp=4, seq_len=128, global_batch=1, recompute="selective",
                                      recompute_modules=("mlp",)), 0, 8)
    f = {r[0]: r for r in table(rb.layer_template(0, "F"))}
    assert f["mlp_act"][2:4] == E(128 * 128, 2, 1, 8)
    assert f["mlp_up_gate_proj"][2:4] == G(128, 256, 256)
    b = {r[0]: r for r in table(rb.layer_template(0, "B"))}
    assert b["mlp_act_bwd"][2:4] == E(128 * 128, 3, 2, 12)
    s = {r[0]: r for r in table(rb.layer_template(0, "S"))}
    assert s["recompute_mlp_act"][2:4] == E(128 * 128, 2, 1)


def test_lora_adapter_width_is_whole_qkv_columns_per_rank():
    """Head dim 5 (h = 40, 8 heads), 1 KV head replicated over TP8: QKV columns per rank
    floor((40 + 2 x 5) / 8) = 6; the adapter's add runs on 64 tokens x 6 columns."""
    m = model_from_dict(dict(name="tinyhead", layers=1, hidden=40, heads=8, kv_heads=1, ffn=64, vocab=100))
    rb = _RankBuilder(m, ParallelPlan(tp=8, seq_len=64, global_batch=1, finetune="lora"), 0, 8)
    r = {x[0]: x for x in table(rb.layer_template(0, "F"))}
    assert r["lora_qkv_add"][2:4] == E(64 * 6, 2, 1)
    assert r["qkv_proj"][2:4] == G(64, 6, 40)


@pytest.mark.parametrize("sp", [True, False])
def test_every_tp_collective_has_the_type_its_name_says(sp):
    """Megatron TP: all-reduce without SP, all-gather / reduce-scatter with it (Korthikanti et al. 2022);
    the Chakra comm type of each collective matches (ALL_REDUCE 0, ALL_GATHER 2, REDUCE_SCATTER 7)."""
    plan = ParallelPlan(tp=2, seq_len=128, global_batch=1, sequence_parallel=sp)
    rb = _RankBuilder(GPT, plan, 0, 8)
    kinds = {"allreduce": 0, "allgather": 2, "reducescatter": 7}
    seen = set()
    for n, slot, a, _ in _all_templates(rb):
        if slot != TPS:
            continue
        kind = next(k for k in kinds if k in n.replace("_", ""))
        assert a["comm_type"] == kinds[kind], n
        assert a["coll_name"] == {0: "all_reduce", 2: "all_gather", 7: "reduce_scatter"}[kinds[kind]], n
        assert a["pg_name"] == "tp:0" and a["pg_ranks"] == [0, 1], n
        seen.add(kind)
    assert seen == ({"allgather", "reducescatter", "allreduce"} if sp else {"allreduce"})


def test_ring_step_half_block_is_a_whole_number_of_keys_and_norms_are_norm_ops():
    """CP2 over 6 tokens: 3-token blocks, the off-diagonal ring step attends to floor(3 / 2) = 1 key
    per query: 2 x 4 heads x 3 x 1 x 128 FLOPs. Norm ops carry the 'norm' op kind (the compute model's
    memory-bound norm kernel)."""
    rb = _RankBuilder(LLAMA, ParallelPlan(cp=2, seq_len=6, global_batch=1), 0, 8)
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert ops["attention_ring1"]["seq_kv"] == 1 and type(ops["attention_ring1"]["seq_kv"]) is int
    assert ops["attention_ring1"]["flops"] == 2.0 * 4 * 3 * 1 * 128
    assert ops["input_norm"]["op"] == "norm" and ops["post_attn_norm"]["op"] == "norm"
    bops = {o[0]: o[2] for o in rb.layer_template(0, "B").ops}
    assert bops["input_norm_bwd"]["op"] == "norm"
