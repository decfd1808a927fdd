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
    from estimators.parallelism.plan import ParallelPlan
    from estimators.parallelism.workload import generate
    g = generate(load_model("deepseek-v3"), ParallelPlan(tp=8, dp=4, ep=4, seq_len=4096, global_batch=4),
                 "symmetric")[0]
    fwd = next(a for a in g.attrs.values() if a.get("op") == "attention" and not a["backward"])
    hand = 2.0 * 1 * 16 * 4096 * 4096 / 2 * (192 + 128)
    assert fwd["flops"] == hand == 85_899_345_920
    diag = 2.0 * 16 * (4096 * 4097 / 2) * (192 + 128)
    assert ComputeModel(H100).roofline_op_estimate(fwd).flops == pytest.approx(diag, rel=1e-12)


# ------------------------------------------------------------------------ streaming kernels and copies
# h100-sxm preset: HBM 3,350 GB/s x 0.90 achievable (STREAM triad) = 3,015,000 B/us; PCIe Gen5 x16 64 GB/s,
# pinned 80% (51,200 B/us), pageable 35% (22,400 B/us); every kernel at least 2 us.
HBM_B_PER_US = 3350 * 0.90 * 1e3
PCIE_PINNED_B_PER_US = 64 * 0.80 * 1e3
PCIE_PAGEABLE_B_PER_US = 64 * 0.35 * 1e3


def test_streaming_kernel_moves_its_bytes_at_achievable_hbm_bandwidth():
    """3,015,000,000 B at 3,015,000 B/us = 1,000 us, memory-bound, no FLOPs; 1 kB takes the 2 us floor."""
    est = ComputeModel(H100).memory_op(3.015e9)
    assert est.time_us == pytest.approx(1000.0, rel=1e-12) and est.bound == "memory"
    assert est.memory_us == pytest.approx(1000.0, rel=1e-12) and est.compute_us == 0.0
    assert est.bytes == 3.015e9 and est.flops == 0.0 and est.efficiency == 0.0
    tiny = ComputeModel(H100).memory_op(1000.0)
    assert tiny.time_us == 2.0 and tiny.bound == "latency" and tiny.memory_us == pytest.approx(1000 / HBM_B_PER_US)
    assert ComputeModel(H100).memory_op(-5.0).memory_us == 0.0


@pytest.mark.parametrize("direction,pageable,expected_us,moved", [
    ("htod", False, 512e6 / PCIE_PINNED_B_PER_US, 512e6),      # 10,000 us
    ("dtoh", False, 512e6 / PCIE_PINNED_B_PER_US, 512e6),
    ("h2d", True, 512e6 / PCIE_PAGEABLE_B_PER_US, 512e6),      # staged through a pinned bounce buffer
    ("HtoH", False, 512e6 / PCIE_PINNED_B_PER_US, 512e6),
    ("dtod", False, 2 * 512e6 / HBM_B_PER_US, 2 * 512e6),      # reads and writes HBM
    ("DtoD", True, 2 * 512e6 / HBM_B_PER_US, 2 * 512e6),       # pageable does not apply on the device
])
def test_memcpy_crosses_pcie_or_reads_and_writes_hbm(direction, pageable, expected_us, moved):
    est = ComputeModel(H100).memcpy(512e6, direction, pageable)
    assert est.time_us == pytest.approx(expected_us, rel=1e-12) and est.bound == "memory"
    assert est.bytes == moved and est.flops == 0.0
    assert est.detail == ("hbm" if direction.lower() == "dtod" else "pcie pageable" if pageable else "pcie")


def test_memset_writes_its_bytes_once():
    assert ComputeModel(H100).memset(3.015e9).time_us == pytest.approx(1000.0, rel=1e-12)


def test_compute_bound_estimate_reports_its_achieved_fraction_of_peak():
    """A large square bf16 GEMM is compute-bound; efficiency = FLOPs / time / 989.4 TFLOP/s."""
    est = ComputeModel(H100).gemm(8192, 8192, 8192)
    assert est.bound == "compute" and est.time_us == est.compute_us > est.memory_us
    assert est.efficiency == pytest.approx(2 * 8192 ** 3 / (est.time_us * 1e-6) / 989.4e12, rel=1e-12)


def test_grouped_gemm_is_one_batched_gemm_per_distinct_group_size():
    """Experts with 128, 128, 0, 256 tokens ([m, 512] x [512, 1024]): the two 128-token experts run as one
    batched GEMM, the 256-token one after it, the empty one costs nothing; FLOPs 2 m n k summed."""
    cm = ComputeModel(H100)
    est = cm.grouped_gemm([128, 128, 0, 256], 1024, 512)
    a, b = cm.gemm(128, 1024, 512, batch=2), cm.gemm(256, 1024, 512)
    assert est.flops == 2 * (128 + 128 + 256) * 1024 * 512
    assert est.time_us == pytest.approx(a.time_us + b.time_us, rel=1e-12)
    assert est.compute_us == pytest.approx(a.compute_us + b.compute_us, rel=1e-12)
    assert est.memory_us == pytest.approx(a.memory_us + b.memory_us, rel=1e-12)
    assert est.bytes == pytest.approx(a.bytes + b.bytes, rel=1e-12)
    assert est.bound == max((a, b), key=lambda p: p.time_us).bound
    assert est.efficiency == pytest.approx(est.flops / (est.time_us * 1e-6) / 989.4e12, rel=1e-12)
    assert est.detail == "2 group sizes"


def test_grouped_weight_gradient_reduces_over_the_tokens():
    """wgrad: per expert [n, m] x [m, k] -> dW [n, k] (the reduction runs over the m tokens): 3 experts of
    64 tokens are one batched GEMM of M = 1024, N = 512, K = 64."""
    cm = ComputeModel(H100)
    est = cm.grouped_gemm([64, 64, 64], 1024, 512, wgrad=True)
    ref = cm.gemm(1024, 512, 64, batch=3)
    assert est == ref and est.flops == 2 * 1024 * 512 * 64 * 3


def test_grouped_gemm_with_no_tokens_is_a_launch_without_work():
    """No expert got a token: no FLOPs, no bytes, the 2 us floor of a launched kernel."""
    est = ComputeModel(H100).grouped_gemm([0, 0], 1024, 512)
    assert (est.time_us, est.flops, est.bytes, est.detail, est.bound) == (2.0, 0.0, 0.0, "no tokens", "latency")
