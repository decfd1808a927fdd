"""The compute model's cost formulas on a round-numbered toy GPU, every figure worked out by hand here.

Definitions written out (the module docstring of replay/hardware/compute.py states the same model):
- GEMM FLOPs 2*m*n*k per batch (Narayanan et al. 2021); bytes A + B + C (+ fp32 split-K partials written
  and read: 2 (s-1) m n 4); time = max(FLOPs / rate, bytes / HBM rate, the launch floor), with
  rate = peak x mainloop efficiency x tile_eff x fill x waves_eff x k_eff, capped at the sustained
  fraction of peak:  tile_eff = min(1, tm tn/(tm+tn) / knee), knee scaled by the dtype's peak over the
  16-bit peak and its element size over 2; fill = m n / (ceil(m/tm) tm ceil(n/tn) tn);
  waves_eff = tiles / (ceil(tiles/SMs) SMs); k_eff = K_split / (K_split + k_overhead); split-K only when
  K/s >= 128 and the output tiles do not fill the SMs; the library takes the fastest (tile, split).
- Attention (FlashAttention-2, Dao 2023, Sec. 4.1): forward 2 b h pairs (d_qk + d_v) FLOPs over the
  (query, key) pairs the mask keeps, backward 2.5x; a causal mask aligned bottom-right (FlashAttention
  2.1+) keeps sq skv - sq(sq-1)/2 pairs when sq <= skv; a sliding window W keeps W(W+1)/2 + (s-W) W.
  Rate = peak x min(efficiency x waves_eff over b h ceil(sq/block) CTAs, sustained fraction).
- Convolution as cuDNN's implicit GEMM: M = N Ho Wo, N = C_out/g, K = C_in/g kh kw, g groups batched;
  activations read once (not im2col-expanded).

The toy GPU (h100-sxm-roofline with these fields replaced): 4 SMs; dense peaks bf16 1, fp16 2 (unequal on
purpose: the tile knee is referred to the bf16 peak), fp8 2, tf32 0.5, fp32 0.25 TFLOP/s (bf16: 1e6 FLOP/us);
HBM 100 GB/s at efficiency 1.0 (1e5 B/us); PCIe 10 GB/s (pinned 1.0 -> 1e4 B/us, pageable 0.5);
one 64x64 tile, knee 64 (a 64x64 tile has reuse 32 -> tile_eff 0.5), k_overhead 64, split-K 1..16;
mainloop efficiency 0.8 (fp8 0.6); flash attention 0.5 forward, 0.25 backward, 64-row blocks; 1 us floor.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from chakra_schema.graph import EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
from replay.hardware.compute import (ComputeModel, OpEstimate, _copy_direction, _dtype_of, _elem_bytes, _gemm_dims,
                                     _numel, _tensors, _type_key, estimate_from_shapes, launching_op, peak_ratio,
                                     traced_kernel_class)
from replay.hardware.config import KernelClassModel, get_hardware

PEAK = 1e6          # bf16 FLOP/us
HBM = 1e5           # B/us


def toy_hw(devices=("H100",), **compute):
    base = get_hardware("h100-sxm-roofline")
    c = dict(gemm_efficiency=0.8, gemm_efficiency_by_dtype={"fp8": 0.6}, gemm_tiles=((64, 64),),
             gemm_tile_intensity_knee=64.0, gemm_k_overhead=64, gemm_split_k=(1, 2, 4, 8, 16), hbm_efficiency=1.0,
             pcie_efficiency=1.0, attention_fwd_efficiency=0.5, attention_bwd_efficiency=0.25, attention_block=64,
             min_kernel_us=1.0, pageable_copy_efficiency=0.5, sustained_tensor_fraction=1.0)
    c.update(compute)
    gpu = dataclasses.replace(base.gpu, sm_count=4, hbm_bw_gbs=100.0, pcie_bw_gbs=10.0, device_names=tuple(devices),
                              peak_tflops={"bf16": 1.0, "fp16": 2.0, "fp8": 2.0, "tf32": 0.5, "fp32": 0.25,
                                           "fp64": 0.25})
    return dataclasses.replace(base, name="toy", gpu=gpu, compute=dataclasses.replace(base.compute, **c),
                               kernel_models={})


@pytest.fixture(scope="module")
def cm():
    return ComputeModel(toy_hw())


# ---------------------------------------------------------------------------------------- GEMM
def test_gemm_rate_is_the_product_of_tile_fill_wave_and_k_efficiencies(cm):
    """100 x 128 x 192 bf16: 2 x 2 tiles of 64x64 (4 tiles fill the 4 SMs: no split-K), fill 12,800/16,384
    = 0.78125, tile_eff 0.5, k_eff 192/256 = 0.75 -> 1e6 x 0.8 x 0.5 x 0.78125 x 0.75 = 234,375 FLOP/us;
    2 x 100 x 128 x 192 = 4,915,200 FLOPs -> 20.97152 us. Bytes (100x192 + 192x128 + 100x128) x 2 = 113,152
    -> 1.13152 us."""
    e = cm.gemm(100, 128, 192)
    assert e.flops == 4_915_200 and e.bytes == 113_152
    assert e.time_us == e.compute_us == pytest.approx(20.97152, rel=1e-12)
    assert e.memory_us == pytest.approx(1.13152, rel=1e-12)
    assert (e.bound, e.detail) == ("compute", "tile 64x64 split-k 1")
    assert e.efficiency == pytest.approx(0.234375, rel=1e-12)
    assert e.tflops == pytest.approx(4_915_200 / 20.97152 / 1e6, rel=1e-12)


def test_gemm_splits_k_when_one_output_tile_leaves_sms_idle(cm):
    """64 x 64 x 1024: one output tile. s=1: 1 of 4 SMs, k_eff 1024/1088 -> 94,118 FLOP/us (89.1 us);
    s=2: 2 tiles (0.5), k_eff 512/576 -> 47.2 us; s=4: 4 tiles (1.0), k_eff 256/320 = 0.8 -> 0.4 x 0.8 =
    320,000 FLOP/us -> 8,388,608 / 320,000 = 26.2144 us; s=8: 2 full waves, k_eff 128/192 -> 31.5 us;
    s=16: K/16 = 64 < 128, not tried. Bytes: 270,336 + fp32 partials 2 x 3 x 64 x 64 x 4 = 368,640."""
    e = cm.gemm(64, 64, 1024)
    assert e.detail == "tile 64x64 split-k 4"
    assert e.time_us == pytest.approx(26.2144, rel=1e-12)
    assert e.bytes == 368_640 and e.memory_us == pytest.approx(3.6864, rel=1e-12)


def test_sustained_fraction_caps_every_tile_rate():
    """Capped at 0.3 of peak (300,000 FLOP/us): the 64x64x1024 split-4 rate 320,000 -> 300,000: 27.96203 us."""
    e = ComputeModel(toy_hw(sustained_tensor_fraction=0.3)).gemm(64, 64, 1024)
    assert e.time_us == pytest.approx(8_388_608 / 300_000, rel=1e-12) and e.detail == "tile 64x64 split-k 4"


def test_batched_gemm_fills_the_sms_without_split_k(cm):
    """Batch 4 of 64 x 64 x 1024: 4 tiles fill 4 SMs, no split; k_eff 1024/1088 -> 376,470.6 FLOP/us;
    4 x 8,388,608 FLOPs -> 89.1289 us; bytes 4 x (65,536 + 65,536 + 4,096) x 2 = 1,081,344."""
    e = cm.gemm(64, 64, 1024, batch=4)
    assert e.flops == 33_554_432 and e.bytes == 1_081_344
    assert e.time_us == pytest.approx(33_554_432 / (PEAK * 0.4 * 1024 / 1088), rel=1e-12)
    assert e.detail == "tile 64x64 split-k 1"
    assert cm.gemm(64, 64, 1024, batch=0) == cm.gemm(64, 64, 1024, batch=1)


def test_wave_quantization_over_the_sms(cm):
    """64 x 320 x 256: 5 tiles on 4 SMs -> 2 waves, waves_eff 5/8; k_eff 256/320 = 0.8:
    rate 1e6 x 0.8 x 0.5 x 0.625 x 0.8 = 200,000; 2 x 64 x 320 x 256 = 10,485,760 FLOPs -> 52.4288 us."""
    e = cm.gemm(64, 320, 256)
    assert e.time_us == pytest.approx(52.4288, rel=1e-12) and e.detail == "tile 64x64 split-k 1"


def test_a_gemm_issued_in_row_chunks_pays_each_chunk_groups_wave_quantization(cm):
    """256 x 320 x 256 bf16 whole: 4 x 5 = 20 tiles on 4 SMs, 5 full waves; rate 1e6 x 0.8 x 0.5 x 1 x 0.8 =
    320,000 FLOP/us; 41,943,040 FLOPs -> 131.072 us. As 4 row chunks of 64 rows (a communication-overlapped
    GEMM consuming one TP shard at a time) on 1 stream: each 64 x 320 x 256 is 5 tiles -> 2 waves, waves_eff
    5/8, rate 200,000 -> 52.4288 us, 4 of them 209.7152 us; each re-reads B: 4 x (64x256 + 256x320 + 64x320)
    x 2 = 950,272 bytes. On 3 streams, 3 chunks run together (15 tiles -> 4 waves, 15/16: rate 300,000 ->
    104.8576 us) and then the 4th alone (52.4288 us): 157.2864 us."""
    whole = cm.op_estimate({"op": "gemm", "m": 256, "n": 320, "k": 256, "dtype": "bf16"})
    assert whole.time_us == pytest.approx(131.072, rel=1e-12)
    one = cm.op_estimate({"op": "gemm", "m": 256, "n": 320, "k": 256, "dtype": "bf16", "chunks": 4})
    assert one.time_us == one.compute_us == pytest.approx(209.7152, rel=1e-12)
    assert one.flops == 41_943_040 and one.bytes == 950_272
    assert one.detail == "4 row chunks on 1 streams, tile 64x64 split-k 1"
    three = cm.op_estimate({"op": "gemm", "m": 256, "n": 320, "k": 256, "dtype": "bf16", "chunks": 4,
                            "chunk_streams": 3})
    assert three.time_us == pytest.approx(104.8576 + 52.4288, rel=1e-12) and three.flops == 41_943_040
    assert cm.op_estimate({"op": "gemm", "m": 256, "n": 320, "k": 256, "dtype": "bf16", "chunks": 1}) == whole


def test_row_chunks_never_outnumber_the_rows_and_count_the_real_flops(cm):
    """m = 3 in 8 chunks is 3 one-row chunks; m = 100 in 8 chunks is 8 chunks of 13 rows (the last one
    ragged), FLOPs 2 x 100 x 64 x 64 whatever the chunking."""
    e = cm.chunked_gemm(3, 64, 64, chunks=8)
    assert e.detail.startswith("3 row chunks") and e.flops == 2 * 3 * 64 * 64
    assert e.time_us == pytest.approx(3 * cm.gemm(1, 64, 64).time_us, rel=1e-12)
    e = cm.chunked_gemm(100, 64, 64, chunks=8)
    assert e.flops == 2 * 100 * 64 * 64 and e.time_us == pytest.approx(8 * cm.gemm(13, 64, 64).time_us, rel=1e-12)


def test_gemm_dtypes_scale_peak_efficiency_knee_and_bytes(cm):
    """The 100 x 128 x 192 shape. fp8: peak 2e6, mainloop 0.6, knee 64 x 2 x 1/2 = 64 (tile_eff 0.5), 1 B per
    element: rate 2e6 x 0.6 x 0.5 x 0.78125 x 0.75 = 351,562.5 -> 13.98101 us, 56,576 B.
    fp32: peak 0.25e6, mainloop 0.8, knee 64 x 0.25 x 2 = 32 (tile_eff 1): 117,187.5 -> 41.94304 us, 226,304 B.
    fp16: peak 2e6, knee 64 x 2 = 128 (tile_eff 0.25): 2e6 x 0.8 x 0.25 x 0.5859375 = 234,375 -> 20.97152 us."""
    fp8 = cm.gemm(100, 128, 192, dtype="fp8")
    assert fp8.time_us == pytest.approx(4_915_200 / 351_562.5, rel=1e-12) and fp8.bytes == 56_576
    fp32 = cm.gemm(100, 128, 192, dtype="fp32")
    assert fp32.time_us == pytest.approx(41.94304, rel=1e-12) and fp32.bytes == 226_304
    fp16 = cm.gemm(100, 128, 192, dtype="fp16")
    assert fp16.time_us == pytest.approx(20.97152, rel=1e-12)
    assert fp16.efficiency == pytest.approx(4_915_200 / 20.97152e-6 / 2e12, rel=1e-12)


def test_knee_is_referred_to_fp16_where_the_gpu_has_no_bf16():
    """bf16 peak 0 (a V100-like part): the reference is fp16's 2 TFLOP/s; an fp16 GEMM's knee is then 64
    (tile_eff 0.5): 100 x 128 x 192 at 2e6 x 0.8 x 0.5 x 0.78125 x 0.75 = 468,750 -> 10.48576 us."""
    hw = toy_hw()
    hw = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, peak_tflops={**hw.gpu.peak_tflops, "bf16": 0.0}))
    assert ComputeModel(hw).gemm(100, 128, 192, dtype="fp16").time_us == pytest.approx(10.48576, rel=1e-12)


def test_empty_dimensions_count_as_one(cm):
    assert cm.gemm(0, 128, 192) == cm.gemm(1, 128, 192)
    assert cm.gemm(100, -3, 192).flops == 2 * 100 * 1 * 192
    assert cm.gemm(100, 128, 0).flops == 2 * 100 * 128 * 1


def test_extra_bytes_can_make_a_gemm_memory_bound(cm):
    """100 x 128 x 192 plus 1e7 B: (113,152 + 1e7) / 1e5 = 101.13152 us > 20.97 us compute."""
    e = cm.gemm(100, 128, 192, extra_bytes=1e7)
    assert e.bound == "memory" and e.time_us == pytest.approx(101.13152, rel=1e-12)
    assert e.efficiency == pytest.approx(4_915_200 / 101.13152e-6 / 1e12, rel=1e-12)


def test_a_one_tile_gemm_pays_every_inefficiency_at_once(cm):
    """8 x 8 x 8: 1,024 FLOPs; fill 64/4,096, 1 tile of 4 SMs (0.25), K = 8 too short to split, k_eff 8/72:
    1e6 x 0.8 x 0.5 x 1/64 x 0.25 x 8/72 = 173.6 FLOP/us -> 5.89824 us (bytes 384 -> 0.00384 us)."""
    e = cm.gemm(8, 8, 8)
    assert (e.time_us, e.bound) == (pytest.approx(5.89824, rel=1e-12), "compute")
    assert e.memory_us == pytest.approx(0.00384, rel=1e-12)


# ---------------------------------------------------------------------------------- convolution
def test_convolution_is_the_implicit_gemm_with_activations_read_once(cm):
    """n=2, 16 -> 32 channels, 8x8, 3x3, stride 1: M = 2 x 8 x 8 = 128, N = 32, K = 16 x 9 = 144;
    FLOPs 2 x 128 x 32 x 144 = 1,179,648; bytes = A as read (2 x 16 x 64 x 2 = 4,096) + B (144 x 32 x 2
    = 9,216) + C (128 x 32 x 2 = 8,192) = 21,504."""
    e = cm.conv(2, 16, 8, 8, 32, 3, 3)
    assert e.flops == 1_179_648 and e.bytes == 21_504
    assert e == cm.gemm(128, 32, 144, extra_bytes=4096 - 128 * 144 * 2)


def test_strided_grouped_convolution(cm):
    """Stride 2: Ho = Wo = 4, M = 32; 2 groups: N = 16, K = 8 x 9 = 72, batch 2:
    FLOPs 2 x 2 x 32 x 16 x 72 = 147,456; bytes 4,096 + 2 x (72 x 16 + 32 x 16) x 2 = 10,752."""
    e = cm.conv(2, 16, 8, 8, 32, 3, 3, stride=2, groups=2)
    assert e.flops == 147_456 and e.bytes == 10_752
    # explicit output sizes win: 3 x 5 -> M = 30
    assert cm.conv(2, 16, 8, 8, 32, 3, 3, h_out=3, w_out=5).flops == 2 * 30 * 32 * 144
    assert cm.conv(1, 4, 7, 7, 4, 1, 1, stride=0).flops == 2 * 49 * 4 * 4      # stride 0 read as 1


# ----------------------------------------------------------------------------------- attention
def test_attention_forward_rate_waves_and_bytes(cm):
    """b=1, h=2, s=128, d=64: FLOPs 2 x 2 x 128^2 x 128 = 8,388,608; CTAs 1 x 2 x 2 = 4 (one wave) at 0.5 of
    1e6 -> 16.777216 us; bytes Q, K, V, O 4 x 128 x 64 x 2 x 2 heads = 131,072 -> 1.31072 us."""
    e = cm.attention(1, 2, 128, 128, 64)
    assert e.flops == 8_388_608 and e.bytes == 131_072
    assert e.time_us == pytest.approx(16.777216, rel=1e-12) and e.memory_us == pytest.approx(1.31072, rel=1e-12)
    assert (e.bound, e.detail) == ("compute", "waves 1")


def test_attention_wave_quantization(cm):
    """3 heads: 6 CTAs on 4 SMs -> 2 waves, 6/8 -> rate 375,000; 12,582,912 FLOPs -> 33.554432 us."""
    e = cm.attention(1, 3, 128, 128, 64)
    assert e.time_us == pytest.approx(33.554432, rel=1e-12) and e.detail == "waves 2"


def test_attention_backward_is_2_5x_the_flops_and_bytes_at_its_own_efficiency(cm):
    """20,971,520 FLOPs at 0.25 x 1e6 -> 83.88608 us; bytes 2.5 x 131,072 = 327,680."""
    e = cm.attention(1, 2, 128, 128, 64, backward=True)
    assert e.flops == 20_971_520 and e.bytes == 327_680
    assert e.time_us == pytest.approx(83.88608, rel=1e-12)


def test_grouped_query_attention_reads_fewer_key_value_heads(cm):
    """1 KV head for 2 query heads: Q + O 65,536 B, K + V 128 x 128 x 2 = 32,768 B."""
    assert cm.attention(1, 2, 128, 128, 64, kv_heads=1).bytes == 98_304


def test_mla_value_width_enters_bytes_and_flops(cm):
    """d_qk 64, d_v 32: FLOPs 2 x 2 x 128^2 x 96 = 6,291,456; bytes (2 + 2) heads... Q+O 2 x 128 x 96 x 2 =
    49,152 and K+V the same: 98,304."""
    e = cm.attention(1, 2, 128, 128, 64, v_head_dim=32)
    assert e.flops == 6_291_456 and e.bytes == 98_304


def test_causal_masks_count_the_pairs_they_keep(cm):
    """s=128, window 32: 32 x 33/2 + 96 x 32 = 3,600 pairs -> 2 x 2 x 3,600 x 128 = 1,843,200 FLOPs.
    A window as long as the keys is plain causal: 128 x 128 - 128 x 127/2 = 8,256 pairs.
    64 queries on 128 keys (bottom-right aligned): 64 x 128 - 64 x 63/2 = 6,176 pairs; 2 CTAs (0.5 wave)
    -> 3,162,112 FLOPs at 250,000 -> 12.648448 us. 128 queries on 64 keys: half of 8,192 = 4,096 pairs."""
    assert cm.attention(1, 2, 128, 128, 64, causal=True, window=32).flops == 1_843_200
    assert cm.attention(1, 2, 128, 128, 64, causal=True, window=128).flops == 2 * 2 * 8_256 * 128
    assert cm.attention(1, 2, 128, 128, 64, causal=True, window=0).flops == 2 * 2 * 8_256 * 128
    assert cm.attention(1, 2, 128, 128, 64, causal=False, window=32).flops == 8_388_608
    chunk = cm.attention(1, 2, 64, 128, 64, causal=True)
    assert chunk.flops == 3_162_112 and chunk.time_us == pytest.approx(12.648448, rel=1e-12)
    assert cm.attention(1, 2, 128, 64, 64, causal=True).flops == 2 * 2 * 4_096 * 128
    assert cm.attention(1, 2, 64, 128, 64, causal=True, window=32).flops == 3_162_112   # window needs sq == skv


def test_cudnn_attention_uses_its_measured_h100_rates():
    """kernel='cudnn' on an H100: 0.68 forward, 0.59 backward at the reference shape (CUDNN_ATTENTION_EFFICIENCY),
    x 0.67 / 0.79 at head dim 64 (CUDNN_HEAD_DIM_RATE), x the tile factor (FLASH_QUERY_BLOCK_OVERHEAD 1.9 / 4.75
    KV-block iterations per 64-row query block). s=128 not causal: 2 query blocks x 2 KV blocks, 16,384 pairs =
    4 blocks of 64 x 64 -> forward (4 + 2 x 1.9) / 4 = 1.95, backward (4 + 2 x 4.75) / 4 = 3.375 per pair, against
    the causal 16K reference: 256 query blocks, 32,896 KV blocks, 134,225,920 pairs = 32,769 blocks ->
    forward (32,896 + 486.4) / 32,769 = 1.018688, backward (32,896 + 1,216) / 32,769 = 1.040952.
    Forward 8,388,608 / (0.68 x 0.67 x 1e6) x 1.95 / 1.018688 = 35.24518 us; backward 20,971,520 /
    (0.59 x 0.79 x 1e6) x 3.375 / 1.040952 = 145.8794 us. Another GPU keeps the preset's 0.5 and the tiles."""
    h = ComputeModel(toy_hw())
    ref_f, ref_b = (32_896 + 256 * 1.9) / (134_225_920 / 4096), (32_896 + 256 * 4.75) / (134_225_920 / 4096)
    assert ref_f == pytest.approx(1.018688, rel=1e-6) and ref_b == pytest.approx(1.040952, rel=1e-6)
    fwd = 8_388_608 / (0.68 * 0.67 * 1e6) * 1.95 / ref_f
    bwd = 20_971_520 / (0.59 * 0.79 * 1e6) * 3.375 / ref_b
    assert fwd == pytest.approx(35.24518, rel=1e-6) and bwd == pytest.approx(145.8794, rel=1e-6)
    assert h.attention(1, 2, 128, 128, 64, kernel="cudnn").time_us == pytest.approx(fwd, rel=1e-9)
    assert h.attention(1, 2, 128, 128, 64, backward=True, kernel="cudnn").time_us == pytest.approx(bwd, rel=1e-9)
    other = ComputeModel(toy_hw(devices=("A100",)))
    assert other.attention(1, 2, 128, 128, 64, kernel="cudnn").time_us == pytest.approx(16.777216 * 1.95 / ref_f,
                                                                                         rel=1e-9)
    assert ComputeModel(toy_hw(devices=("H100 PCIe",))).attention(1, 2, 128, 128, 64, kernel="cudnn").time_us == \
        pytest.approx(16.777216 * 1.95 / ref_f, rel=1e-9)   # the measured rates are the SXM part's: the name must match
    # a traced kernel (no kernel named) keeps the plain roofline: 0.5 forward, no tiles
    assert h.attention(1, 2, 128, 128, 64).time_us == pytest.approx(16.777216, rel=1e-12)


def test_sustained_fraction_caps_attention():
    e = ComputeModel(toy_hw(sustained_tensor_fraction=0.3)).attention(1, 2, 128, 128, 64)
    assert e.time_us == pytest.approx(8_388_608 / 300_000, rel=1e-12)


# ------------------------------------------------------------------------------- memory ops
def test_copies_and_streams_on_the_toy(cm):
    """PCIe 10 GB/s pinned (1e4 B/us), pageable 0.5; HBM 1e5 B/us, a device copy reads and writes."""
    assert cm.memcpy(1e5, "HtoD").time_us == pytest.approx(10.0)
    assert cm.memcpy(1e5, "d2h", pageable=True).time_us == pytest.approx(20.0)
    assert cm.memcpy(1e5, "h2h").time_us == pytest.approx(10.0)
    assert cm.memcpy(1e5, "dtoh").detail == "pcie"
    d = cm.memcpy(1e5, "peer")
    assert d.time_us == pytest.approx(2.0) and d.bytes == 2e5 and d.detail == "hbm"
    assert cm.memset(3e5).time_us == pytest.approx(3.0)
    assert cm.memory_op(5e5).time_us == pytest.approx(5.0) and cm.memory_op(5e5).bound == "memory"
    assert cm.memory_op(5e4).time_us == 1.0 and cm.memory_op(5e4).bound == "latency"
    assert cm.memory_op(1e5).bound == "memory"      # exactly at the floor: memory-bound, not latency


def test_estimate_reports_its_figures():
    e = OpEstimate(4.0, 4.0, 1.0, "compute", 8e6, 1e5, 0.5, "x")
    assert e.tflops == 2.0
    assert OpEstimate(0.0, 0.0, 0.0, "latency", 8e6, 0.0).tflops == 0.0
    assert e.to_dict() == {"time_us": 4.0, "compute_us": 4.0, "memory_us": 1.0, "bound": "compute", "flops": 8e6,
                           "bytes": 1e5, "tflops": 2.0, "efficiency": 0.5, "detail": "x"}


# ----------------------------------------------------------------------------- node attrs contract
def test_generated_node_attrs_dispatch_to_the_cost_formulas(cm):
    assert cm.roofline_op_estimate({"op": "gemm", "m": 100, "n": 128, "k": 192}) == cm.gemm(100, 128, 192)
    assert cm.roofline_op_estimate({"op": "gemm", "m": 64, "n": 64, "k": 1024, "batch": 4, "dtype": "fp8"}) == \
        cm.gemm(64, 64, 1024, 4, "fp8")
    assert cm.roofline_op_estimate({"op": "grouped_gemm", "ms": [64, 0, 64], "n": 128, "k": 192, "wgrad": True}) == \
        cm.grouped_gemm([64, 64], 128, 192, "bf16", True)
    att = {"op": "attention", "batch": 1, "heads": 2, "seq_q": 64, "seq_kv": 128, "head_dim": 64, "causal": True,
           "backward": True, "kv_heads": 1, "window": 0, "kernel": "cudnn", "v_head_dim": 32, "dtype": "bf16"}
    assert cm.roofline_op_estimate(att) == cm.attention(1, 2, 64, 128, 64, True, True, "bf16", 1, 0, "cudnn", 32)
    assert cm.roofline_op_estimate({"op": "attention", "heads": 2, "seq_q": 128, "head_dim": 64}) == \
        cm.attention(1, 2, 128, 128, 64)
    assert cm.roofline_op_estimate({"op": "memcpy", "bytes": 1e5, "direction": "htod", "pageable": True}).time_us \
        == pytest.approx(20.0)
    assert cm.roofline_op_estimate({"op": "memcpy", "bytes": 1e5}).time_us == pytest.approx(2.0)
    assert cm.roofline_op_estimate({"op": "memset", "bytes": 3e5}).time_us == pytest.approx(3.0)


def test_generic_roofline_of_nodes_without_shapes(cm):
    """A GEMM given only its FLOPs runs at the mainloop rate: 1e6 FLOPs / (1e6 x 0.8) = 1.25 us; any other
    op with FLOPs at the fp32 peak (0.25e6 FLOP/us): 4 us; bytes over HBM: 5e5 -> 5 us."""
    g = cm.roofline_op_estimate({"op": "gemm", "flops": 1e6})
    assert (g.time_us, g.bound, g.flops) == (pytest.approx(1.25, rel=1e-12), "compute", 1e6)
    a = cm.roofline_op_estimate({"op": "attention", "flops": 2e6, "dtype": "fp8"})
    assert a.time_us == pytest.approx(2e6 / (2e6 * 0.6), rel=1e-12)
    assert cm.roofline_op_estimate({"op": "norm", "flops": 1e6}).time_us == pytest.approx(4.0, rel=1e-12)
    m = cm.roofline_op_estimate({"op": "elementwise", "bytes": 5e5, "flops": 1e5})
    assert (m.time_us, m.bound, m.compute_us) == (pytest.approx(5.0), "memory", pytest.approx(0.4))
    assert cm.roofline_op_estimate({}).time_us == 1.0
    capped = ComputeModel(toy_hw(sustained_tensor_fraction=0.5)).roofline_op_estimate({"op": "gemm", "flops": 1e6})
    assert capped.time_us == pytest.approx(2.0, rel=1e-12)


def test_sustained_gemms_of_a_long_run_clock_down_on_an_h100(cm):
    """H100 sustained clock 0.80: the 100 x 128 x 192 GEMM's 20.97152 us of compute take 26.2144 us; its
    achieved fraction of peak drops by the same 0.8 (0.234375 -> 0.1875). Not on another GPU."""
    attrs = {"op": "gemm", "m": 100, "n": 128, "k": 192, "sustained": True}
    e = cm.op_estimate(attrs)
    assert cm.sustained_clock_fraction == 0.80
    assert (e.time_us, e.compute_us, e.bound) == (pytest.approx(26.2144, rel=1e-12), pytest.approx(26.2144), "compute")
    assert e.efficiency == pytest.approx(0.1875, rel=1e-12) and e.memory_us == pytest.approx(1.13152)
    assert cm.op_estimate({**attrs, "sustained": False}) == cm.gemm(100, 128, 192)
    other = ComputeModel(toy_hw(devices=("A100",)))
    assert other.sustained_clock_fraction == 1.0 and other.op_estimate(attrs) == other.gemm(100, 128, 192)
    # a memory-bound node has no compute to derate
    mem = {"op": "elementwise", "bytes": 5e5, "sustained": True}
    assert cm.op_estimate(mem) == cm.memory_op(5e5)
    # a GEMM whose derated compute still sits under its memory time stays memory-bound
    big = cm.op_estimate({"op": "gemm", "flops": 1e6, "bytes": 1e7, "sustained": True})
    assert (big.time_us, big.bound, big.compute_us) == (pytest.approx(100.0), "memory", pytest.approx(1.5625))


def test_host_issue_rate_bounds_a_run_of_short_kernels(cm):
    """launch_us 3 x 2 launches = 6 us > the 1 us memory op: launch-bound at 6 us; 0.5 us x 1 launch does not
    bind; launches 0 counts as 1."""
    e = cm.op_estimate({"op": "elementwise", "bytes": 1e5, "launch_us": 3.0, "launches": 2})
    assert (e.time_us, e.bound, e.detail) == (6.0, "latency", "launch-bound")
    assert (e.memory_us, e.bytes) == (pytest.approx(1.0), 1e5)
    assert cm.op_estimate({"op": "elementwise", "bytes": 1e5, "launch_us": 0.5}) == cm.memory_op(1e5)
    assert cm.op_estimate({"op": "elementwise", "bytes": 1e5, "launch_us": 3.0, "launches": 0}).time_us == 3.0
    g = cm.op_estimate({"op": "gemm", "m": 100, "n": 128, "k": 192, "launch_us": 41.94304})
    assert g.efficiency == pytest.approx(0.234375 / 2, rel=1e-12) and g.flops == 4_915_200


def test_a_fitted_class_model_adds_its_fixed_cost_and_efficiency():
    """Model gemm: 5 us + roofline / 0.5: the 100 x 128 x 192 GEMM -> 5 + 41.94304 = 46.94304 us."""
    hw = dataclasses.replace(toy_hw(), kernel_models={"gemm": KernelClassModel(overhead_us=5.0, efficiency=0.5)})
    m = ComputeModel(hw)
    assert m.op_estimate({"op": "gemm", "m": 100, "n": 128, "k": 192}).time_us == pytest.approx(46.94304, rel=1e-12)
    assert m.op_time_us({"op": "gemm", "m": 100, "n": 128, "k": 192}) == pytest.approx(46.94304, rel=1e-12)
    assert m.roofline_op_estimate({"op": "gemm", "m": 100, "n": 128, "k": 192}) == m.gemm(100, 128, 192)
    assert m.op_estimate({"op": "elementwise", "bytes": 5e5}) == m.memory_op(5e5)


# ------------------------------------------------------------------------------- traced kernels
def test_gemm_dimensions_of_the_aten_matmul_family():
    assert _gemm_dims("aten::addmm", [[64], [16, 32], [32, 64]]) == (16, 64, 32, 1)
    assert _gemm_dims("aten::_addmm_activation", [[64], [16, 32], [32, 64]]) == (16, 64, 32, 1)
    assert _gemm_dims("aten::mm", [[16, 32], [32, 64]]) == (16, 64, 32, 1)
    assert _gemm_dims("aten::bmm", [[4, 16, 32], [4, 32, 64]]) == (16, 64, 32, 4)
    assert _gemm_dims("aten::bmm", [[16, 32], [32, 64]]) == (16, 64, 32, 1)
    assert _gemm_dims("aten::baddbmm", [[4, 16, 64], [4, 16, 32], [4, 32, 64]]) == (16, 64, 32, 4)
    assert _gemm_dims("aten::baddbmm", [[4, 16, 32], [4, 32, 64]]) == (16, 64, 32, 4)
    assert _gemm_dims("aten::linear", [[2, 3, 32], [64, 32]]) == (6, 64, 32, 1)
    assert _gemm_dims("aten::linear", [[32], [64, 32]]) == (1, 64, 32, 1)
    assert _gemm_dims("aten::matmul", [[2, 3, 32], [32, 64]]) == (6, 64, 32, 1)
    assert _gemm_dims("aten::matmul", [[5, 6, 32], [5, 32, 64]]) == (6, 64, 32, 5)
    assert _gemm_dims("aten::matmul", [[6, 32], [5, 32, 64]]) == (6, 64, 32, 1)
    assert _gemm_dims("aten::_scaled_mm", [[16, 32], [32, 64]]) == (16, 64, 32, 1)
    assert _gemm_dims("aten::mm", [[3], [32, 64]]) is None           # malformed: not a matrix
    assert _gemm_dims("aten::mm", [[16, 32]]) is None
    assert _gemm_dims("aten::addmm", [[16, 32], [32, 64]]) is None
    assert _gemm_dims("aten::linear", [[16, 32]]) is None
    assert _gemm_dims("aten::matmul", [[16, 32]]) is None
    assert _gemm_dims("aten::_scaled_mm", [[16, 32]]) is None
    assert _gemm_dims("aten::bmm", [[4, 16, 32]]) is None
    assert _gemm_dims("aten::add", [[16, 32], [16, 32]]) is None


def test_tensor_types_and_kernel_names_give_the_dtype():
    assert _dtype_of([], "cutlass_80_tensorop_s1688gemm") == ("tf32", 4)
    assert _dtype_of([], "sm80_xmma_gemm_tf32f32") == ("tf32", 4)
    assert _dtype_of([], "ampere_s16816gemm") == ("tf32", 4)
    assert _dtype_of(["float"], "sm90_gemm_bf16bf16") == ("bf16", 2)
    assert _dtype_of([], "sm90_gemm_e4m3") == ("fp8", 1) and _dtype_of([], "FP8_gemm") == ("fp8", 1)
    assert _dtype_of(["long int", "c10::Half"], "gemm") == ("fp16", 2)
    assert _dtype_of(["int", "bool", "double"], "k") == ("fp64", 8)
    assert _dtype_of(["unsigned char", "signed char", "short int", "int64_t"], "k") == ("fp32", 4)
    assert _dtype_of(["Scalar"], "volta_h884gemm") == ("fp16", 2)
    assert _dtype_of([], "turing_h1688gemm") == ("fp16", 2) and _dtype_of([], "ampere_h16816gemm") == ("fp16", 2)
    assert _dtype_of([], "kernel_fp16") == ("fp16", 2)
    assert _dtype_of([], "kernel") == ("fp32", 4)
    assert _dtype_of(["c10::Float8_e5m2"], "k") == ("fp8", 1)
    assert _type_key("Tensor(c10::BFloat16)") == "c10::bfloat16" and _type_key("Tensor(float") == "tensor(float"
    assert _type_key("FLOAT)") == "float)"
    assert _elem_bytes("c10::BFloat16") == 2 and _elem_bytes("Tensor(long int)") == 8 and _elem_bytes("?") == 4


def test_element_counts_of_plain_tensors_only():
    assert _numel([2, 3, 4]) == 24 and _numel([]) == 0 and _numel(5) == 0 and _numel([[2], [3]]) == 0
    assert _numel([2, -1]) == 0 and _numel((3,)) == 3
    assert _tensors([[2, 3], [], 7, [[1]], (4,), [2.5]]) == [[2, 3], [4]]


def test_copy_direction_from_the_name_or_attrs():
    assert _copy_direction("Memcpy HtoD (Pinned -> Device)", {}) == "htod"
    assert _copy_direction("Memcpy", {"kind": "H2D"}) == "htod"
    assert _copy_direction("Memcpy DtoH", {}) == "dtoh"
    assert _copy_direction("memcpy", {"direction": "d2h"}) == "dtoh"
    assert _copy_direction("Memcpy DtoD", {}) == "dtod" and _copy_direction("x", {"kind": "D2D"}) == "dtod"
    assert _copy_direction("Memcpy PtoP", {}) == "dtod"


BF = ["c10::BFloat16"] * 3


def test_traced_shapes_of_convolutions(cm):
    """Forward: input [2, 16, 8, 8], weight [32, 16, 3, 3] -> the 2x16x8x8 -> 32 conv above. Backward
    (grad_output, input, weight): the same GEMM; with the input not traced (an empty slot), the data gradient
    of grad_output by the weight, with the forward's FLOPs 2 x (2*8*8) x 32 x 16*3*3. A depthwise weight
    [16, 1, 3, 3] means 16 groups."""
    fwd = estimate_from_shapes(cm, "sm90_xmma_fprop_implicit_gemm", "aten::cudnn_convolution",
                               [[2, 16, 8, 8], [32, 16, 3, 3]], BF)
    assert fwd == cm.conv(2, 16, 8, 8, 32, 3, 3)
    bwd = estimate_from_shapes(cm, "sm90_xmma_dgrad_implicit_gemm", "aten::convolution_backward",
                               [[2, 32, 8, 8], [2, 16, 8, 8], [32, 16, 3, 3]], BF)
    assert bwd == cm.conv(2, 16, 8, 8, 32, 3, 3)
    dw = estimate_from_shapes(cm, "sm90_xmma_fprop_implicit_gemm", "aten::cudnn_convolution",
                              [[2, 16, 8, 8], [16, 1, 3, 3]], BF)
    assert dw == cm.conv(2, 16, 8, 8, 16, 3, 3, groups=16)
    two = estimate_from_shapes(cm, "sm90_xmma_dgrad_implicit_gemm", "aten::convolution_backward",
                               [[2, 32, 8, 8], [], [32, 16, 3, 3]], BF)
    assert two.flops == 2 * (2 * 8 * 8) * 32 * 16 * 3 * 3


def test_traced_shapes_of_attention(cm):
    q, kv = [1, 2, 128, 64], [1, 1, 64, 64]            # [b, h, s, d]: 2 query heads, 1 KV head
    assert estimate_from_shapes(cm, "flash_fwd_kernel", "aten::_scaled_dot_product_flash_attention", [q, kv, kv],
                                BF) == cm.attention(1, 2, 128, 64, 64, kv_heads=1)
    # the flash entry point SDPA calls takes [b, s, h, d]: the same attention
    assert estimate_from_shapes(cm, "flash_fwd_kernel", "aten::_flash_attention_forward",
                                [[1, 128, 2, 64], [1, 64, 1, 64], [1, 64, 1, 64]], BF) == \
        cm.attention(1, 2, 128, 64, 64, kv_heads=1)
    # a backward op takes grad_out first; causal from the kernel's name when the trace has no values
    assert estimate_from_shapes(cm, "flash_bwd_causal_kernel", "aten::_scaled_dot_product_flash_attention_backward",
                                [q, q, kv, kv, q], BF) == cm.attention(1, 2, 128, 64, 64, causal=True, backward=True,
                                                                      kv_heads=1)
    # an attention op of no known signature: [b, h, s, d] tensors, self-attention when the second is not 4-D
    assert estimate_from_shapes(cm, "flash_kernel", "aten::my_attention_backward", [q, [5, 5]], BF) == \
        cm.attention(1, 2, 128, 128, 64, backward=True)
    assert estimate_from_shapes(cm, "flash_kernel", "aten::_efficient_attention_backward", [q, [5, 5]], BF) is None
    # a helper pass of the flash backward streams Q-sized tensors 3 times: 3 x 16,384 x 2 B
    helper = estimate_from_shapes(cm, "cudnn::fusion::compute_dot_do_o", "aten::sdpa_backward", [q, kv], BF)
    assert helper == cm.memory_op(3 * 16_384 * 2) and helper.bytes == 98_304
    assert estimate_from_shapes(cm, "flash_fwd_kernel", "aten::sdpa", [[128, 64], [128, 64]], BF) is None
    assert estimate_from_shapes(cm, "flash_fwd_kernel", "aten::sdpa", [q], BF) is None


def test_traced_shapes_of_memory_bound_ops(cm):
    """sum of a [100, 50] fp32 tensor reads 20,000 B; embedding of 10 indices into a [1000, 64] bf16 table
    reads and writes 10 rows (2 x 10 x 64 x 2) plus the int64 indices (80): 2,640 B; an elementwise op reads
    its inputs and writes the largest."""
    assert estimate_from_shapes(cm, "reduce_kernel<sum>", "aten::sum", [[100, 50]], ["float"]).bytes == 20_000
    assert estimate_from_shapes(cm, "vectorized_elementwise", "aten::mean", [[100, 50]], ["float"]).bytes == 20_000
    emb = estimate_from_shapes(cm, "indexSelectLargeIndex", "aten::embedding", [[1000, 64], [10]],
                               ["c10::BFloat16", "long int"])
    assert emb.bytes == 2_640
    assert estimate_from_shapes(cm, "vectorized_elementwise", "aten::embedding", [[1000, 64], [0]], BF) is None
    assert estimate_from_shapes(cm, "vectorized_elementwise", "aten::embedding", [[1000, 64]], BF) is None
    add = estimate_from_shapes(cm, "vectorized_elementwise", "aten::add", [[100, 50], [50]], ["float", "c10::Half"])
    assert add.bytes == 20_000 + 100 + 20_000
    assert estimate_from_shapes(cm, "vectorized_elementwise", "aten::add", [[100, 50]], []).bytes == 40_000
    assert estimate_from_shapes(cm, "vectorized_elementwise", "aten::add", [[0, 50]], ["float"]) is None
    assert estimate_from_shapes(cm, "vectorized_elementwise", "aten::add", [[]], ["float"]) is None
    assert estimate_from_shapes(cm, "vectorized_elementwise", "custom::op", [[100, 50]], ["float"]) is None
    assert estimate_from_shapes(cm, "gemm_kernel", "aten::mm", [[16, 32], [32, 64]], BF) == cm.gemm(16, 64, 32)
    # a non-GEMM kernel of a GEMM op: one pass over the fp32 output (2 x 16 x 64 x 4)
    assert estimate_from_shapes(cm, "splitKreduce_kernel", "aten::mm", [[16, 32], [32, 64]], BF).bytes == 8_192


def _graph(kernel: str, kind: OpKind, host_attrs: dict | None, kernel_attrs: dict | None = None, launch=True):
    """host op -> runtime launch call (child of the op) -> GPU node (LAUNCH edge)."""
    b = GraphBuilder()
    cpu = b.resource(ResourceKind.CPU_THREAD, 0, 0)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    op = b.add_node(host_attrs.pop("name") if host_attrs else "aten::mm", NodeType.COMP_NODE, OpKind.CPU_OP, cpu,
                    0.0, 10.0, attrs=host_attrs or None)
    call = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, 1.0, 2.0, parent=op)
    k = b.add_node(kernel, NodeType.COMP_NODE, kind, gpu, 5.0, 3.0, attrs=kernel_attrs)
    if launch:
        b.add_dep(call, k, EdgeKind.LAUNCH)
    else:
        b.add_dep(call, k, EdgeKind.DATA)
    return b.build(), k


def test_a_traced_kernel_is_costed_from_its_launching_ops_shapes(cm):
    g, k = _graph("sm90_gemm_bf16_kernel", OpKind.KERNEL,
                  {"name": "aten::mm", "input_shapes": [[16, 32], [32, 64]], "input_types": BF})
    assert launching_op(g, k) == 0
    assert cm.roofline_kernel_estimate(g, k) == cm.gemm(16, 64, 32)
    assert cm.kernel_estimate(g, k) == cm.gemm(16, 64, 32)          # no fitted models: the physics
    assert traced_kernel_class(g, k) == ("gemm", "bf16")
    g2, k2 = _graph("sm90_gemm_kernel", OpKind.KERNEL, None, launch=False)
    assert launching_op(g2, k2) == -1 and cm.roofline_kernel_estimate(g2, k2) is None
    assert traced_kernel_class(g2, k2)[1] == "fp32"
    g3, k3 = _graph("sm90_gemm_kernel", OpKind.KERNEL, {"name": "aten::mm", "input_types": BF})
    assert cm.roofline_kernel_estimate(g3, k3) is None                 # no shapes recorded


def test_traced_copies_and_memsets_are_costed_from_their_bytes(cm):
    g, k = _graph("Memcpy HtoD (Pageable -> Device)", OpKind.MEMCPY, None, {"bytes": 1e5})
    assert cm.roofline_kernel_estimate(g, k).time_us == pytest.approx(20.0)      # pageable PCIe
    assert traced_kernel_class(g, k) == ("copy", "fp32")
    g, k = _graph("Memcpy DtoD", OpKind.MEMCPY, None, {"bytes": 1e5})
    assert cm.roofline_kernel_estimate(g, k).time_us == pytest.approx(2.0)
    g, k = _graph("Memset (Device)", OpKind.MEMSET, None, {"bytes": 3e5})
    assert cm.roofline_kernel_estimate(g, k).time_us == pytest.approx(3.0)
    assert traced_kernel_class(g, k) == ("memset", "fp32")
    g, k = _graph("generated", OpKind.KERNEL, None, {"op": "memset", "bytes": 3e5})
    assert cm.roofline_kernel_estimate(g, k).time_us == pytest.approx(3.0)
    assert cm.kernel_estimate(g, k).time_us == pytest.approx(3.0)


def test_fitted_models_time_traced_kernels():
    """A 'gemm_bf16' model of 5 us + roofline / 0.5 times a shaped GEMM kernel: the 16 x 64 x 32 GEMM's
    roofline doubled plus 5 us; a generated node with 'op' takes the op path."""
    hw = dataclasses.replace(toy_hw(), kernel_models={"gemm_bf16": KernelClassModel(overhead_us=5.0, efficiency=0.5)})
    m = ComputeModel(hw)
    g, k = _graph("sm90_gemm_bf16_kernel", OpKind.KERNEL,
                  {"name": "aten::mm", "input_shapes": [[64, 64], [64, 1024]], "input_types": BF})
    roof = m.gemm(64, 1024, 64)
    assert m.kernel_estimate(g, k).time_us == pytest.approx(5.0 + max(roof.compute_us, roof.memory_us) / 0.5)
    g2, k2 = _graph("generated", OpKind.KERNEL, None, {"op": "gemm", "m": 100, "n": 128, "k": 192})
    assert m.kernel_estimate(g2, k2) == m.op_estimate({"op": "gemm", "m": 100, "n": 128, "k": 192})
    # no model for the class: the physics
    g3, k3 = _graph("Memset (Device)", OpKind.MEMSET, None, {"bytes": 3e5})
    assert m.kernel_estimate(g3, k3) == m.memset(3e5)


def test_peak_ratio_by_class_and_by_intensity():
    """Moving a kernel from the toy to a copy with half the bf16 peak and a quarter of the HBM bandwidth:
    compute classes take 2x, memory classes 4x; with a known intensity the source's ridge decides
    (1e12 x 0.8 / 1e11 = 8 FLOP/B: at or above it compute-bound)."""
    a = toy_hw()
    slow = dataclasses.replace(a, gpu=dataclasses.replace(a.gpu, hbm_bw_gbs=25.0,
                                                          peak_tflops={**a.gpu.peak_tflops, "bf16": 0.5}))
    assert peak_ratio(a, slow, "gemm") == pytest.approx(2.0)
    assert peak_ratio(a, slow, "elementwise") == pytest.approx(4.0)
    assert peak_ratio(slow, a, "gemm") == pytest.approx(0.5)
    assert peak_ratio(slow, a, "attention", "bf16", intensity=0.0) == pytest.approx(0.5)   # 0: unknown
    assert peak_ratio(a, slow, "other", "bf16", intensity=8.0) == pytest.approx(2.0)      # at the ridge: compute
    assert peak_ratio(a, slow, "other", "bf16", intensity=7.9) == pytest.approx(4.0)
    assert peak_ratio(a, slow, "other", "bf16") == pytest.approx(4.0)
    assert peak_ratio(a, slow, "gemm", "fp8") == pytest.approx(1.0)


def test_gpu_identity_from_device_names_or_the_model_name():
    """Without device names the marketing name decides: 'H100 SXM5 80GB' contains H100 (sustained clock 0.80)
    but is not exactly 'H100', the name cuDNN's rates were measured under."""
    m = ComputeModel(toy_hw(devices=()))
    assert m.sustained_clock_fraction == 0.80
    tiles = 1.95 / ((32_896 + 256 * 1.9) / (134_225_920 / 4096))   # s=128 vs the 16K reference, 64-row blocks
    assert m.attention(1, 2, 128, 128, 64, kernel="cudnn").time_us == pytest.approx(16.777216 * tiles, rel=1e-9)
    assert ComputeModel(toy_hw(devices=("a100", "h100"))).sustained_clock_fraction == 0.80
    assert ComputeModel(toy_hw(devices=("a100", "h100"))).attention(1, 2, 128, 128, 64, kernel="cudnn").time_us == \
        pytest.approx(8_388_608 / (0.68 * 0.67 * 1e6) * tiles, rel=1e-9)


def test_h200_and_h800_clock_down_as_the_h100_they_share_a_die_with():
    """The H200 SXM and H800 SXM are GH100 at 700 W: a long training run's GEMMs sustain the H100's 0.80 of
    the clock (an H200 run had been priced at the full boost clock, 1/0.8 = 1.25x the H100's GEMM rate).
    Another GPU (an A100) and the GH200 superchip (its own power budget) keep 1.0."""
    for name in ("NVIDIA H200", "H800"):
        assert ComputeModel(toy_hw(devices=(name,))).sustained_clock_fraction == 0.80
    for name in ("A100", "NVIDIA GH200 480GB"):
        assert ComputeModel(toy_hw(devices=(name,))).sustained_clock_fraction == 1.0
    for preset in ("h200", "h800"):
        assert ComputeModel(preset).sustained_clock_fraction == 0.80


def test_a_tie_between_compute_and_memory_is_called_compute_bound(cm):
    """5e5 FLOPs at the fp32 peak (0.25e6 FLOP/us) = 2 us = 2e5 B at 1e5 B/us."""
    e = cm.roofline_op_estimate({"op": "norm", "flops": 5e5, "bytes": 2e5})
    assert e.compute_us == e.memory_us == 2.0 and (e.time_us, e.bound) == (2.0, "compute")
    assert e.efficiency == pytest.approx(5e5 / 2e-6 / 1e12, rel=1e-12)


def test_an_unknown_dtype_costs_two_bytes_at_the_fp32_peak(cm):
    """'int8' has no peak: fp32's 0.25e6 FLOP/us, 2-byte elements, knee 64 x 0.25 x 1 = 16 (tile_eff 1):
    100 x 128 x 192 at 0.25e6 x 0.8 x 0.78125 x 0.75 = 117,187.5 -> 41.94304 us; 113,152 B."""
    e = cm.gemm(100, 128, 192, dtype="int8")
    assert e.time_us == pytest.approx(41.94304, rel=1e-12) and e.bytes == 113_152


def test_split_k_is_allowed_down_to_128_deep_slices(cm):
    """64 x 64 x 512: s=4 leaves K/4 = 128 per slice (allowed): 4 tiles, k_eff 128/192 -> 266,667 FLOP/us,
    4,194,304 FLOPs -> 15.72864 us (s=2: 26.2 us)."""
    e = cm.gemm(64, 64, 512)
    assert (e.time_us, e.detail) == (pytest.approx(15.72864, rel=1e-12), "tile 64x64 split-k 4")


def test_equally_fast_tiles_keep_the_first_listed():
    """Tiles 64x32 and 32x64 on a 64 x 64 x 4096 GEMM: 2 tiles each, the same rate: the first listed wins."""
    m = ComputeModel(toy_hw(gemm_tiles=((64, 32), (32, 64)), gemm_split_k=(1,)))
    assert m.gemm(64, 64, 4096).detail == "tile 64x32 split-k 1"
    m2 = ComputeModel(toy_hw(gemm_tiles=((32, 64), (64, 32)), gemm_split_k=(1,)))
    assert m2.gemm(64, 64, 4096).detail == "tile 32x64 split-k 1"


def test_convolution_channel_counts_never_drop_below_one(cm):
    """groups 0 is 1; 1 output channel over 2 groups: N = 1 per group, K = 4/2 = 2: 2 x 2 x 16 x 1 x 2 = 128
    FLOPs; 1 input channel over 2 groups: K = 1 x 3 x 3."""
    assert cm.conv(1, 4, 4, 4, 4, 1, 1, groups=0) == cm.conv(1, 4, 4, 4, 4, 1, 1, groups=1)
    assert cm.conv(1, 4, 4, 4, 1, 1, 1, groups=2).flops == 128
    assert cm.conv(1, 1, 4, 4, 4, 3, 3, groups=2).flops == 2 * 2 * 16 * 2 * 9


def test_default_op_and_dtype_pick_the_class_model():
    """Models 'elementwise' (5 us + t/0.5) and 'gemm_bf16' (2 us + t/0.5): a node without 'op' is an
    elementwise one (5e5 B: 5 + 10 = 15 us), a GEMM without 'dtype' a bf16 one (2 + 2 x 20.97152 us). The
    sustained derating leaves a node without compute alone (15 us), and a GPU that does not clock down too."""
    models = {"elementwise": KernelClassModel(overhead_us=5.0, efficiency=0.5),
              "gemm_bf16": KernelClassModel(overhead_us=2.0, efficiency=0.5)}
    m = ComputeModel(dataclasses.replace(toy_hw(), kernel_models=models))
    assert m.op_estimate({"bytes": 5e5}).time_us == pytest.approx(15.0, rel=1e-12)
    assert m.op_estimate({"bytes": 5e5, "sustained": True}).time_us == pytest.approx(15.0, rel=1e-12)
    g = {"op": "gemm", "m": 100, "n": 128, "k": 192}
    assert m.op_estimate(g).time_us == pytest.approx(2 + 2 * 20.97152, rel=1e-12)
    a100 = ComputeModel(dataclasses.replace(toy_hw(devices=("A100",)), kernel_models=models))
    assert a100.op_estimate({**g, "sustained": True}).time_us == pytest.approx(2 + 2 * 20.97152, rel=1e-12)


def test_launch_bound_only_when_the_host_is_strictly_slower(cm):
    """A 1 us op: launch_us 0.75 once does not bind; exactly 1.0 does not either (it stays memory-bound)."""
    assert cm.op_estimate({"op": "elementwise", "bytes": 1e5, "launch_us": 0.75}) == cm.memory_op(1e5)
    e = cm.op_estimate({"op": "elementwise", "bytes": 1e5, "launch_us": 1.0})
    assert (e.bound, e.detail) == ("memory", "")
    empty = cm.roofline_op_estimate({})
    assert (empty.bytes, empty.flops, empty.memory_us) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("name", ["sum", "mean", "norm", "amax", "max", "min", "prod", "linalg_vector_norm",
                                  "argmax", "var", "std"])
def test_reductions_read_their_input_once_whatever_kernel_runs_them(cm, name):
    """A [100, 50] fp32 input: 20,000 B read, the (small) output not counted as another input-sized write."""
    assert estimate_from_shapes(cm, "vectorized_elementwise", f"aten::{name}", [[100, 50]], ["float"]).bytes == 20_000


def test_first_floating_tensor_type_decides(cm):
    assert _dtype_of(["float", "c10::Half"], "k") == ("fp32", 4)
    assert _dtype_of(["c10::BFloat16", "float"], "k") == ("bf16", 2)
    assert _dtype_of(["c10::Half", "float"], "k") == ("fp16", 2)
    assert _dtype_of(["c10::Float8_e4m3fn", "float"], "k") == ("fp8", 1)
    # an unnamed kernel of a GEMM op is costed as the GEMM
    assert estimate_from_shapes(cm, "mystery_kernel", "aten::mm", [[16, 32], [32, 64]], BF) == cm.gemm(16, 64, 32)
    assert estimate_from_shapes(cm, "mystery_kernel", "aten::cudnn_convolution",
                                [[2, 16, 8, 8], [32, 16, 3, 3]], BF) == cm.conv(2, 16, 8, 8, 32, 3, 3)
    assert estimate_from_shapes(cm, "sm90_gemm_bf16_kernel", "aten::cudnn_convolution",
                                [[2, 16, 8, 8], [32, 16, 3, 3]], BF) == cm.conv(2, 16, 8, 8, 32, 3, 3)
    assert estimate_from_shapes(cm, "vectorized_elementwise", "aten::cudnn_convolution",
                                [[2, 16, 8, 8], [32, 16, 3, 3]], BF).flops == 0


def _geometry_graph(host_attrs):
    kernel_attrs = {"grid": [4, 1, 1], "block": [256, 1, 1]}
    return _graph("mystery_kernel", OpKind.KERNEL, host_attrs, kernel_attrs)


def test_launch_geometry_models_time_kernels_without_shapes():
    """Model 'other' = 1 + 0.001 x CTAs x threads: 4 CTAs of 256 threads -> 2.024 us. With shapes (an
    aten::mm host op) the physics (times_shaped) or the fitted roofline applies; a model fitted only on
    unshaped kernels leaves shaped ones to the physics."""
    def with_model(model):   # unshaped 'mystery_kernel' under custom::op is 'other'; under aten::mm 'gemm_bf16'
        return ComputeModel(dataclasses.replace(toy_hw(), kernel_models={"other": model, "gemm_bf16": model}))

    geo = KernelClassModel(geometry=(1.0, 0.001))
    m = with_model(geo)
    g, k = _geometry_graph({"name": "custom::op"})
    assert m.kernel_estimate(g, k).time_us == pytest.approx(2.024, rel=1e-12)
    g, k = _geometry_graph({"name": "aten::mm", "input_shapes": [[16, 32], [32, 64]], "input_types": BF})
    assert m.kernel_estimate(g, k) == m.gemm(16, 64, 32)                 # geometry cannot time shaped kernels
    by_geo = KernelClassModel(geometry=(1.0, 0.001), shaped_by_geometry=True)
    m2 = with_model(by_geo)
    assert m2.kernel_estimate(g, k).time_us == pytest.approx(2.024, rel=1e-12)
    unshaped = KernelClassModel(overhead_us=5.0, efficiency=0.5, geometry=(1.0, 0.001), times_shaped=False)
    m3 = with_model(unshaped)
    assert m3.kernel_estimate(g, k) == m3.gemm(16, 64, 32)
    fitted = KernelClassModel(overhead_us=5.0, efficiency=0.5)
    m4 = with_model(fitted)
    roof = m4.gemm(16, 64, 32)
    assert m4.kernel_estimate(g, k).time_us == pytest.approx(5.0 + 2 * max(roof.compute_us, roof.memory_us))
    g0, k0 = _geometry_graph({"name": "custom::op"})
    assert m4.kernel_estimate(g0, k0) is None                             # no shapes, no geometry model


def test_peak_ratio_uses_the_ridge_for_any_positive_intensity():
    """Intensity 0.5 FLOP/B (below the ridge of 8): memory-bound -> the HBM ratio 4, whatever the class;
    just under the ridge (7.99999999) still memory-bound."""
    a = toy_hw()
    slow = dataclasses.replace(a, gpu=dataclasses.replace(a.gpu, hbm_bw_gbs=25.0,
                                                          peak_tflops={**a.gpu.peak_tflops, "bf16": 0.5}))
    assert peak_ratio(a, slow, "gemm", "bf16", intensity=0.5) == pytest.approx(4.0)
    assert peak_ratio(a, slow, "gemm", "bf16", intensity=7.99999999) == pytest.approx(4.0)


def test_memset_and_empty_grouped_gemm_report_no_compute(cm):
    s = cm.memset(5e4)
    assert (s.compute_us, s.flops, s.efficiency, s.time_us, s.bound) == (0.0, 0.0, 0.0, 1.0, "latency")
    g = cm.grouped_gemm([0], 128, 192)
    assert (g.compute_us, g.memory_us, g.flops, g.time_us) == (0.0, 0.0, 0.0, 1.0)


def test_grouped_gemm_keeps_single_token_groups_and_its_dtype(cm):
    """An expert with 1 token still runs: [1, 64] tokens = 2 x (1 + 64) x 128 x 192 FLOPs; an fp8 grouped
    GEMM is the sum of fp8 GEMMs (forward and weight gradient)."""
    assert cm.grouped_gemm([1, 64], 128, 192).flops == 2 * 65 * 128 * 192
    fp8 = cm.grouped_gemm([64, 64, 128], 128, 192, "fp8")
    assert fp8.time_us == pytest.approx(cm.gemm(64, 128, 192, 2, "fp8").time_us + cm.gemm(128, 128, 192, 1, "fp8").time_us)
    w = cm.grouped_gemm([64, 128], 128, 192, "fp8", wgrad=True)
    assert w.time_us == pytest.approx(cm.gemm(128, 192, 64, 1, "fp8").time_us + cm.gemm(128, 192, 128, 1, "fp8").time_us)


def test_grouped_gemm_efficiency_of_sub_microsecond_groups():
    """With no launch floor, two tiny H100 GEMMs take well under 1 us together; the achieved fraction is
    still FLOPs / time / peak."""
    base = get_hardware("h100-sxm-roofline")
    m = ComputeModel(dataclasses.replace(base, compute=dataclasses.replace(base.compute, min_kernel_us=0.0)))
    e = m.grouped_gemm([16, 32], 16, 16)
    assert e.time_us < 1.0
    assert e.efficiency == pytest.approx(e.flops / (e.time_us * 1e-6) / 989.4e12, rel=1e-12) and e.efficiency > 0


def test_copies_report_no_compute(cm):
    for d in ("htod", "dtod"):
        c = cm.memcpy(1e5, d)
        assert (c.compute_us, c.flops, c.efficiency) == (0.0, 0.0, 0.0)


def test_convolution_dims_on_tiny_images_other_dtypes_and_uneven_groups(cm):
    """A 1x1 image: Ho = Wo = 1 (M = 1): 2 x 1 x 4 x 4 = 32 FLOPs. fp32: A read once 2 x 16 x 64 x 4 =
    8,192 + B 144 x 32 x 4 = 18,432 + C 128 x 32 x 4 = 16,384 -> 43,008 B. An unknown dtype counts 2 bytes
    (21,504 B, as bf16). 5 input channels in 2 groups: K = 5 // 2 x 9 = 18, N = 4 // 2 = 2: 2 x 2 x 16 x 2 x
    18 = 2,304 FLOPs."""
    assert cm.conv(1, 4, 1, 1, 4, 1, 1).flops == 32
    f = cm.conv(2, 16, 8, 8, 32, 3, 3, dtype="fp32")
    assert f.bytes == 43_008 and f == cm.gemm(128, 32, 144, dtype="fp32", extra_bytes=8192 - 128 * 144 * 4)
    assert cm.conv(2, 16, 8, 8, 32, 3, 3, dtype="int8").bytes == 21_504
    assert cm.conv(1, 5, 4, 4, 4, 3, 3, groups=2).flops == 2_304


def _add_graph(shape):
    return _graph("mystery_kernel", OpKind.KERNEL, {"name": "aten::add", "input_shapes": [shape, shape],
                                                     "input_types": ["float", "float"]},
                  {"grid": [4, 1, 1], "block": [256, 1, 1]})


def test_fitted_model_choice_by_kernel_family_state_and_roofline():
    """A [10, 10] fp32 add: 1,200 B -> 0.012 us of roofline (shaped). 'elementwise' = 5 us + t/0.5; the
    family model 'elementwise/mystery_kernel' only has a launch geometry (times_shaped false): a shaped
    kernel passes it over for the class model (5.024 us); a kernel that ran alone prefers an '@alone'
    model; under NCCL the '@comm[nccl]' one."""
    cls_model = KernelClassModel(overhead_us=5.0, efficiency=0.5)
    fam = KernelClassModel(geometry=(1.0, 0.001), times_shaped=False)
    m = ComputeModel(dataclasses.replace(toy_hw(), kernel_models={"elementwise": cls_model,
                                                                  "elementwise/mystery_kernel": fam}))
    g, k = _add_graph([10, 10])
    assert m.kernel_estimate(g, k).time_us == pytest.approx(5.024, rel=1e-12)
    alone = KernelClassModel(overhead_us=7.0, efficiency=0.5)
    nccl = KernelClassModel(overhead_us=9.0, efficiency=0.5)
    m2 = ComputeModel(dataclasses.replace(toy_hw(), kernel_models={
        "elementwise": cls_model, "elementwise@alone": alone, "elementwise@comm[nccl]": nccl}))
    assert m2.kernel_estimate(g, k).time_us == pytest.approx(7.024, rel=1e-12)
    assert m2.kernel_estimate(g, k, "nccl").time_us == pytest.approx(9.024, rel=1e-12)


def test_a_model_fitted_without_shapes_leaves_shaped_kernels_to_the_physics_and_the_floor_holds():
    """'elementwise' fitted only on unshaped kernels (times_shaped false): the shaped add keeps its roofline
    (1 us floor). A model with efficiency 4 and no fixed cost: 0.012 / 4 us, raised to the 1 us floor."""
    g, k = _add_graph([10, 10])
    m = ComputeModel(dataclasses.replace(toy_hw(), kernel_models={
        "elementwise": KernelClassModel(overhead_us=5.0, efficiency=0.5, times_shaped=False)}))
    assert m.kernel_estimate(g, k) == m.roofline_kernel_estimate(g, k) and m.kernel_estimate(g, k).time_us == 1.0
    m2 = ComputeModel(dataclasses.replace(toy_hw(), kernel_models={"elementwise": KernelClassModel(efficiency=4.0)}))
    assert m2.kernel_estimate(g, k).time_us == 1.0


def test_each_kernel_finds_its_own_launching_op():
    b = GraphBuilder()
    cpu = b.resource(ResourceKind.CPU_THREAD, 0, 0)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    ops = []
    for n in range(2):
        op = b.add_node(f"aten::op{n}", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 10.0 * n, 5.0)
        call = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, 10.0 * n + 1, 1.0, parent=op)
        k = b.add_node(f"kernel{n}", NodeType.COMP_NODE, OpKind.KERNEL, gpu, 10.0 * n + 3, 1.0)
        b.add_dep(call, k, EdgeKind.LAUNCH)
        ops.append((op, k))
    g = b.build()
    assert [launching_op(g, k) for _, k in ops] == [op for op, _ in ops]


def test_copy_and_memset_nodes_are_classed_by_kind_not_name():
    g, k = _graph("xfer", OpKind.MEMCPY, None)
    assert traced_kernel_class(g, k) == ("copy", "fp32")
    g, k = _graph("fill", OpKind.MEMSET, None)
    assert traced_kernel_class(g, k) == ("memset", "fp32")


def test_node_dtype_picks_the_dtype_specific_gemm_model():
    """'gemm_fp8' = 3 us + t/0.5 applies to an fp8 GEMM node, 'gemm_bf16' (1 us + t) to a bf16 one."""
    models = {"gemm_fp8": KernelClassModel(overhead_us=3.0, efficiency=0.5),
              "gemm_bf16": KernelClassModel(overhead_us=1.0, efficiency=1.0)}
    m = ComputeModel(dataclasses.replace(toy_hw(), kernel_models=models))
    fp8 = m.gemm(100, 128, 192, dtype="fp8")
    e = m.op_estimate({"op": "gemm", "m": 100, "n": 128, "k": 192, "dtype": "fp8"})
    assert e.time_us == pytest.approx(3.0 + 2 * fp8.compute_us, rel=1e-12)


def test_class_model_results_keep_the_launch_floor():
    """Efficiency 4 on a 1,000 B elementwise node: 0.01 / 4 us, raised to the 1 us floor."""
    m = ComputeModel(dataclasses.replace(toy_hw(), kernel_models={"elementwise": KernelClassModel(efficiency=4.0)}))
    assert m.op_estimate({"op": "elementwise", "bytes": 1e3}).time_us == 1.0


def test_sustained_derating_of_a_short_gemm_and_the_fields_it_keeps(cm):
    """1e5 FLOPs at 0.8 x 1e6: 0.125 us of compute, derated to 0.15625 us; the node still takes the 1 us
    floor. The 100 x 128 x 192 GEMM keeps its FLOPs, bytes and tile after derating."""
    e = cm.op_estimate({"op": "gemm", "flops": 1e5, "sustained": True})
    assert (e.compute_us, e.time_us) == (pytest.approx(0.15625, rel=1e-12), 1.0)
    d = cm.op_estimate({"op": "gemm", "m": 100, "n": 128, "k": 192, "sustained": True})
    assert (d.flops, d.bytes, d.detail) == (4_915_200, 113_152, "tile 64x64 split-k 1")


def test_no_launch_cost_unless_the_node_gives_one():
    """Floor 0.5 us: a 0.5 us streaming node stays 0.5 us without launch_us (or with 0)."""
    m = ComputeModel(toy_hw(min_kernel_us=0.5))
    assert m.op_estimate({"op": "elementwise", "bytes": 5e4}).time_us == pytest.approx(0.5)
    assert m.op_estimate({"op": "elementwise", "bytes": 5e4, "launch_us": 0}).time_us == pytest.approx(0.5)


def test_kernel_class_comes_from_the_launching_op():
    """An unnamed kernel launched by aten::mm is a GEMM; not launched (last node an aten::mm op that did not
    launch it), it is 'other'."""
    g, k = _graph("mystery_kernel", OpKind.KERNEL, {"name": "aten::mm"})
    assert traced_kernel_class(g, k)[0] == "gemm"
    b = GraphBuilder()
    cpu = b.resource(ResourceKind.CPU_THREAD, 0, 0)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    k = b.add_node("mystery_kernel", NodeType.COMP_NODE, OpKind.KERNEL, gpu, 0.0, 1.0)
    b.add_node("aten::mm", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 0.0, 1.0,
               attrs={"input_types": ["c10::BFloat16"]})
    assert traced_kernel_class(b.build(), k) == ("other", "fp32")


def test_derating_can_make_a_memory_bound_node_compute_bound(cm):
    """1e6 FLOPs (1.25 us at the mainloop rate) and 1.4e5 B (1.4 us): memory-bound; derated by 0.8 the compute
    takes 1.5625 us and binds."""
    e = cm.op_estimate({"op": "gemm", "flops": 1e6, "bytes": 1.4e5})
    assert e.bound == "memory"
    d = cm.op_estimate({"op": "gemm", "flops": 1e6, "bytes": 1.4e5, "sustained": True})
    assert (d.time_us, d.bound) == (pytest.approx(1.5625, rel=1e-12), "compute")


def test_more_traced_shapes(cm):
    """Depthwise convolution backward (weight [16, 1, 3, 3]): 16 groups. fp32 tensors: an fp32 conv. A kernel
    of unknown class under an attention op is the attention. A split-K reduce of a batched GEMM: one pass
    over 4 fp32 outputs (2 x 4 x 16 x 64 x 4 = 32,768 B). A reduction kernel of any op reads its inputs
    once; an index_select kernel reads and writes the selected rows."""
    dw = estimate_from_shapes(cm, "sm90_xmma_dgrad_implicit_gemm", "aten::convolution_backward",
                              [[2, 16, 8, 8], [2, 16, 8, 8], [16, 1, 3, 3]], BF)
    assert dw == cm.conv(2, 16, 8, 8, 16, 3, 3, groups=16)
    f32 = estimate_from_shapes(cm, "sm90_xmma_fprop_implicit_gemm", "aten::cudnn_convolution",
                               [[2, 16, 8, 8], [32, 16, 3, 3]], ["float", "float"])
    assert f32 == cm.conv(2, 16, 8, 8, 32, 3, 3, dtype="fp32")
    q = [1, 2, 128, 64]
    assert estimate_from_shapes(cm, "mystery_kernel", "aten::_scaled_dot_product_attention", [q, q, q], BF) == \
        cm.attention(1, 2, 128, 128, 64)
    assert estimate_from_shapes(cm, "splitKreduce_kernel", "aten::bmm", [[4, 16, 32], [4, 32, 64]], BF).bytes == 32_768
    assert estimate_from_shapes(cm, "void at::native::reduce_kernel<512, 1>", "aten::cumsum", [[100, 50]],
                                ["float"]).bytes == 20_000
    assert estimate_from_shapes(cm, "indexSelectLargeIndex", "aten::index_select", [[1000, 64], [], [10]],
                                ["c10::BFloat16", "int", "long int"]).bytes == 2_640


def test_gemm_dims_of_unqualified_names_and_empty_batches():
    assert _gemm_dims("mm", [[16, 32], [32, 64]]) == (16, 64, 32, 1)
    assert _gemm_dims("aten::bmm", [[0, 16, 32], [0, 32, 64]]) == (16, 64, 32, 1)
    assert _gemm_dims("aten::linear", [[0, 32], [64, 32]]) == (1, 64, 32, 1)


def test_grouped_gemm_nodes_without_group_sizes_take_the_generic_roofline(cm):
    """No 'ms': 1e6 FLOPs of a non-GEMM op at the fp32 peak (0.25e6 FLOP/us): 4 us."""
    assert cm.roofline_op_estimate({"op": "grouped_gemm", "flops": 1e6}).time_us == pytest.approx(4.0, rel=1e-12)


def test_matmul_dims_with_empty_leading_dims():
    assert _gemm_dims("aten::matmul", [[0, 32], [32, 64]]) == (1, 64, 32, 1)
    assert _gemm_dims("aten::matmul", [[0, 6, 32], [0, 32, 64]]) == (6, 64, 32, 1)


def test_attention_node_window_reaches_the_cost_model(cm):
    """A causal node with a 32-key window over 128 tokens: 3,600 pairs -> 1,843,200 FLOPs (as above)."""
    att = {"op": "attention", "heads": 2, "seq_q": 128, "head_dim": 64, "causal": True, "window": 32}
    assert cm.roofline_op_estimate(att).flops == 1_843_200
