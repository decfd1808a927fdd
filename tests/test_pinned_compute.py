"""Absolute FLOPs of the compute model's ops, pinned to published counting rules written out here
(never the code's own output).

References:
- GEMM: C[m, n] = A[m, k] B[k, n] is m*n*k multiply-adds = 2*m*n*k FLOPs (the convention of every FLOPs
  formula below, e.g. Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", Sec. 5.1 / Appendix).
- Attention: FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and
  Work Partitioning", Sec. 4.1 benchmark setting): forward FLOPs = 4 * seqlen^2 * head_dim * heads per
  sequence (the two matmuls QK^T and PV), halved with a causal mask; backward = 2.5 x forward
  (five matmuls, dQ, dK, dV, dP and the recomputed S, against two).
"""
from __future__ import annotations

import pytest

from replay.hardware.compute import ComputeModel

H100 = "h100-sxm"


def _flash2_forward_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """FlashAttention-2 Sec. 4.1: 4 * seqlen^2 * head_dim * heads FLOPs per sequence (two matmuls)."""
    return 4.0 * batch * heads * seq * seq * head_dim


def test_attention_forward_flops_are_flashattention2s_4_s2_d_h():
    """Pins FlashAttention-2's forward count: b=2, h=4, s=128, d=64 -> 4*128^2*64*4*2 = 33,554,432 FLOPs."""
    est = ComputeModel(H100).attention(2, 4, 128, 128, 64)
    assert _flash2_forward_flops(2, 4, 128, 64) == 33_554_432
    assert est.flops == 33_554_432


def test_attention_backward_flops_are_2_5x_forward_per_flashattention2():
    """Pins FlashAttention-2's backward count (Sec. 4.1: backward = 2.5 x forward FLOPs, 5 matmuls
    against 2): b=2, h=4, s=128, d=64 -> 2.5 * 33,554,432 = 83,886,080 FLOPs."""
    est = ComputeModel(H100).attention(2, 4, 128, 128, 64, backward=True)
    assert est.flops == 2.5 * _flash2_forward_flops(2, 4, 128, 64) == 83_886_080


def test_causal_attention_counts_only_the_unmasked_query_key_pairs():
    """A causal mask over s queries and s keys leaves s(s+1)/2 (query, key) pairs, each costing 2*d FLOPs
    in QK^T and 2*d in PV: b=1, h=2, s=8, d=16 -> 36 pairs * 4*16 * 2 heads = 4,608 FLOPs forward,
    2.5x that (11,520) backward (FlashAttention-2's causal count is the s^2/2 limit of this)."""
    cm = ComputeModel(H100)
    pairs = 8 * 9 // 2
    assert cm.attention(1, 2, 8, 8, 16, causal=True).flops == pairs * 4 * 16 * 2 == 4_608
    assert cm.attention(1, 2, 8, 8, 16, causal=True, backward=True).flops == 11_520


def test_gemm_flops_are_two_per_multiply_add():
    """2*m*n*k (Narayanan et al. 2021): 96 x 80 x 64, batch 3 -> 2,949,120 FLOPs."""
    assert ComputeModel(H100).gemm(96, 80, 64, batch=3).flops == 2 * 96 * 80 * 64 * 3 == 2_949_120


def test_mla_attention_counts_qk_at_the_key_width_and_pv_at_the_value_width():
    """MLA (DeepSeek-V2/V3, Liu et al. 2024): scores use 192-wide query/key heads (128 nope + 64 rope),
    the value product 128-wide heads: forward 2*s^2*(192 + 128) FLOPs per head (b=1, h=2, s=64:
    2 x 64^2 x 320 x 2 = 5,242,880), not 4*s^2*192 (6,291,456)."""
    est = ComputeModel(H100).attention(1, 2, 64, 64, 192, v_head_dim=128)
    assert est.flops == 2 * 64 * 64 * (192 + 128) * 2 == 5_242_880
    assert ComputeModel(H100).attention(1, 2, 64, 64, 192, v_head_dim=128, backward=True).flops == 2.5 * 5_242_880


def test_generated_mla_attention_node_is_timed_on_its_own_flop_count():
    """A DeepSeek-V3 attention node of the workload generator (qk 192, v 128, causal): the compute model
    times it on 2*b*h*(s^2/2)*(192+128) FLOPs (FlashAttention-2's causal half), within the s(s+1)/2
    diagonal: b=1, 16 heads per TP8 rank, s=4096 -> 85,899,345,920 FLOPs forward."""
    from estimators.model_config import load_model
    from estimators.plan import ParallelPlan
    from estimators.workload import generate
    g = generate(load_model("deepseek-v3"), ParallelPlan(tp=8, dp=4, ep=4, seq_len=4096, global_batch=4),
                 "symmetric")[0]
    fwd = next(a for a in g.attrs.values() if a.get("op") == "attention" and not a["backward"])
    hand = 2.0 * 1 * 16 * 4096 * 4096 / 2 * (192 + 128)
    assert fwd["flops"] == hand == 85_899_345_920
    diag = 2.0 * 16 * (4096 * 4097 / 2) * (192 + 128)
    assert ComputeModel(H100).roofline_op_estimate(fwd).flops == pytest.approx(diag, rel=1e-12)
