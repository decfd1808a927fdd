"""Compute model: how long a GPU kernel or operator takes on a given GPU.

Physics, in three parts (all efficiency parameters are preset data, see presets/*.toml):
- GEMM-like work (matmul, bmm, linear, convolution as implicit GEMM): the library tiles the output
  into CTA tiles (tm x tn) over the SMs. Time = max(compute, memory) where
      compute = flops / (peak * mainloop_eff * tile_eff * fill * waves_eff * k_eff)
        tile_eff  = min(1, tm*tn/(tm+tn) / knee)      operand reuse of the tile shape
        fill      = M*N / (ceil(M/tm)*tm * ceil(N/tn)*tn)   padding of partial edge tiles
        waves_eff = tiles / (ceil(tiles/SMs) * SMs)   wave quantization over the SMs
        k_eff     = K_split / (K_split + k_overhead)  pipeline fill and epilogue per tile
      memory  = bytes(A, B, C, split-K partials) / achievable HBM bandwidth
  and the library's choice is the (tile, split-K) with the shortest time. Large well-shaped GEMMs are
  compute-bound near `gemm_efficiency`; small-M (skinny) shapes come out memory-bound. A board that
  reaches its power limit under sustained tensor work clocks down: no kernel's rate exceeds
  `sustained_tensor_fraction` x peak (1.0 where the limit does not bind).
- Attention (flash / SDPA): FLOPs of the two (forward) or five (backward) matmuls at the flash kernel's
  efficiency, with wave quantization over batch*heads*query blocks, against the bytes of Q, K, V, O; a named
  flash kernel also pays for its tiles: whole KV blocks per query block plus fixed work per query block
  (`flash_tile_factor`), which makes short, packed and windowed sequences slower per score.
- Everything else (elementwise, norm, softmax, reduction, embedding, optimizer, memcpy, memset):
  bytes over achievable HBM bandwidth (PCIe for host<->device copies).
Every kernel takes at least `min_kernel_us`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import EdgeKind, ExecutionGraph, OpKind
from chakra_schema.op_names import CONVOLUTION_OP

from .attention_args import attention_geometry, signature_of
from .config import HardwareConfig, get_hardware
from .conv_args import CONV_HELPER_KERNEL, CONV_SIGNATURES, conv_geometry
from .kernel_classes import COMPUTE_CLASSES, MEMORY_CLASSES, classify_kernel, kernel_class  # noqa: F401
from .kernel_models import apply_class_model, class_model, geometry_estimate

DTYPE_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp64": 8}

# PyTorch scalar type names (Execution Trace / Kineto "Input type") -> (our dtype, bytes per element)
_TORCH_TYPES = {
    "float": ("fp32", 4), "c10::half": ("fp16", 2), "c10::bfloat16": ("bf16", 2), "double": ("fp64", 8),
    "c10::float8_e4m3fn": ("fp8", 1), "c10::float8_e5m2": ("fp8", 1), "half": ("fp16", 2),
    "bfloat16": ("bf16", 2), "long int": ("fp64", 8), "int64_t": ("fp64", 8), "int": ("fp32", 4),
    "bool": ("fp8", 1), "unsigned char": ("fp8", 1), "signed char": ("fp8", 1), "short int": ("fp16", 2),
}


# Tensor-core clock a GPU sustains through a long training run, as a fraction of the clock its kernel
# benchmarks ran at (the presets' GEMM / attention efficiencies are measured on short bursts at full
# boost). A 700 W H100 SXM running back-to-back FP8/BF16 GEMMs for minutes reaches its power limit and
# clocks down from 1.98 GHz; only the GEMMs of generated training workloads (ops marked `sustained`) are
# derated: flash attention, bound by its softmax (exp) and shuffles rather than the tensor cores, draws
# less power and is left at its measured rate.
# One global constant per GPU type, fitted leave-one-model-out on the published H100 training runs
# (benchmarks/published_training.py --fit); the A100's equivalent is its measured
# sustained_tensor_fraction cap (0.711).
SUSTAINED_CLOCK_FRACTION = {"H100": 0.80}
# GPUs sold under another name on the same die at the same board power, which the tables above describe by
# their sibling's figures: the H200 SXM and the H800 SXM are the H100 SXM's GH100 at 700 W with other memory
# (141 GB HBM3e) or other NVLink (200 GB/s); the power limit, the tensor cores and their clock are the H100's.
# Matched as whole words: the GH200 superchip (another power budget) is not an H200.
SAME_SILICON = {"H200": "H100", "H800": "H100"}
# Time of an FP8 GEMM scaled by blocks (Transformer Engine's "blockwise" recipe: 1x128 activation and 128x128
# weight scales, DeepSeek-V3's) over the same GEMM with one scale per tensor, at the full clock. Hopper's tensor
# cores take one scale per operand, so the kernel applies each K block's scales to the partial sums itself.
# Set from a layer-level benchmark, not from any training run: Megatron-LM's MoE-layer benchmark (tests/published/
# megatron_moe_layer_h100.csv) runs the Mixtral proxy's layer, one expert of 8,192 x 4,096 x 28,672 GEMMs per
# GPU, in 6.57-6.83 ms backward with the blockwise recipe against 7.68-7.85 ms in BF16; this factor makes the
# model's backward (no host sync, GEMMs nearly all of it) match the three FP8 cases' mean. The DeepSeek proxy's
# FP8 cases (four smaller experts and a shared one) are held out: FP8 over BF16 time, measured 0.87-0.97
# backward, predicted 4-11% below (20-26% below without this factor; tests/test_moe_layer_benchmark.py).
# The power limit caps the tensor rate of a long run (SUSTAINED_CLOCK_FRACTION), and a block-scaled GEMM
# already runs below the capped rate, so a training run pays the larger of the two slowdowns, not both.
# Every Hopper part has the same tensor cores (one scale per operand); the clock derating above is H100's.
BLOCK_SCALED_FP8_GEMM_TIME = {"H100": 1.30, "H200": 1.30, "H800": 1.30, "H20": 1.30}


# cuDNN fused flash attention (Transformer Engine's FusedAttention backend), fraction of the BF16 dense
# peak, (forward, backward incl. its dot(dO, O) and dQ-conversion kernels), at the reference shape below (causal,
# 16K tokens, head dim 128): measured on an H100 SXM in tests/data/h100/kernels_sdpa (cudnn sm90 flash
# fprop/bprop; 653 and 567 TFLOP/s at 16K, whose 4,096 CTAs fill 97% of their last wave: the rate here is before
# wave quantization). Other lengths and widths follow FLASH_QUERY_BLOCK_OVERHEAD and
# CUDNN_HEAD_DIM_RATE.
CUDNN_ATTENTION_EFFICIENCY = {"H100": (0.68, 0.59)}
# Rate of cuDNN's flash kernels by query/key head width, relative to width 128, (forward, backward): narrower
# heads do half the matmul work per score but as much softmax and masking, wider ones run smaller tiles. Same
# H100 sweep, with the tile overhead below taken out: width 64 at 512-1024 tokens (three shapes) 0.62-0.70 /
# 0.74-0.82, width 256 at 4K 0.87 / 0.72. Other widths interpolate in log2(width).
CUDNN_HEAD_DIM_RATE = {"H100": {64: (0.67, 0.79), 128: (1.0, 1.0), 256: (0.87, 0.72)}}
# Flash attention runs in tiles: a CTA takes a block of `attention_block` query rows and loops over the
# key/value blocks its mask leaves it, a whole block at a time (the causal diagonal block is computed and
# masked), plus fixed work per query block worth this many KV-block iterations, (forward, backward): loading Q,
# the softmax epilogue, writing O and its log-sum-exp; in the backward also the dot(dO, O) and dQ-conversion
# passes over the block's rows. Short sequences, packed documents and sliding windows leave few KV blocks per
# query block, so they run well below the long-sequence rate (a 256-token document: forward 3.3x, backward 5.8x
# the time per score of a 16K sequence). Fitted on the same H100 cuDNN sweep (the eight head-dim-128 shapes, 1K-16K
# tokens, causal and not, MHA and GQA, then all within about 8% of one rate); tests/test_attention_tiles.py re-fits it
# from the traces. Applied to the flash kernels a generated workload names (`kernel` "cudnn" or "fa2", whose
# preset efficiencies are long-sequence figures too); traced kernels keep the plain roofline their calibrated
# class models were fitted against.
FLASH_QUERY_BLOCK_OVERHEAD = (1.9, 4.75)
ATTENTION_REFERENCE_SEQ = 16384
FLASH_KERNELS = ("cudnn", "fa2")


def flash_kv_blocks(sq: int, skv: int, causal: bool, window: int, block: int) -> tuple[int, int]:
    """(KV blocks the query blocks of one (sequence, head) visit in all, query blocks). Causal queries are the
    last `sq` positions of the `skv` keys; `window` > 0 lets each query see at most that many keys."""
    nq, nk = math.ceil(sq / block), math.ceil(skv / block)
    if not causal:
        return nq * nk, nq
    t = np.arange(nq, dtype=np.int64)
    offset = skv - sq
    last = np.minimum(nk - 1, (offset + (t + 1) * block - 1) // block)
    first = np.maximum(0, (offset + t * block - window + 1) // block) if window > 0 else np.zeros_like(t)
    return int(np.maximum(last - first + 1, 0).sum()), nq


def flash_tile_factor(sq: int, skv: int, causal: bool, window: int, block: int, backward: bool,
                      pairs: float) -> float:
    """Time per score pair of a flash kernel on this shape relative to the reference shape
    (FLASH_QUERY_BLOCK_OVERHEAD): (KV-block iterations + fixed work per query block) / exact score pairs."""
    c = FLASH_QUERY_BLOCK_OVERHEAD[1 if backward else 0]

    def per_pair(q: int, k: int, causal_: bool, w: int, p: float) -> float:
        kv, nq = flash_kv_blocks(q, k, causal_, w, block)
        return (kv + c * nq) * block * block / p

    ref = ATTENTION_REFERENCE_SEQ
    return per_pair(sq, skv, causal, window, pairs) / per_pair(ref, ref, True, 0, ref * (ref + 1) / 2.0)


def cudnn_head_dim_rate(table: dict, head_dim: int, backward: bool) -> float:
    """CUDNN_HEAD_DIM_RATE at `head_dim`, log2-interpolated between measured widths, clamped outside them."""
    dims = sorted(table)
    return float(np.interp(math.log2(head_dim), np.log2(dims), [table[d][1 if backward else 0] for d in dims]))


@dataclass(frozen=True)
class OpEstimate:
    """One op's modelled time and why: `bound` is 'compute', 'memory' or 'latency' (min kernel time)."""

    time_us: float
    compute_us: float
    memory_us: float
    bound: str
    flops: float
    bytes: float
    efficiency: float = 0.0      # achieved fraction of the dtype's peak (compute work only)
    detail: str = ""             # e.g. the tile chosen

    @property
    def tflops(self) -> float:
        return self.flops / self.time_us / 1e6 if self.time_us > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"time_us": self.time_us, "compute_us": self.compute_us, "memory_us": self.memory_us,
                "bound": self.bound, "flops": self.flops, "bytes": self.bytes, "tflops": self.tflops,
                "efficiency": self.efficiency, "detail": self.detail}


# --------------------------------------------------------------------------------------- the model
class ComputeModel:
    """Durations of compute work on one GPU type. Pure functions of their inputs (cached)."""

    def __init__(self, hw: HardwareConfig | str):
        self.hw = get_hardware(hw)
        c = self.hw.compute
        self._sms = self.hw.gpu.sm_count
        self._bw = self.hw.hbm_bytes_per_us                       # bytes per us
        self._pcie = self.hw.gpu.pcie_bw_gbs * c.pcie_efficiency * 1e3
        self._pageable = self.hw.gpu.pcie_bw_gbs * c.pageable_copy_efficiency * 1e3
        self._min = c.min_kernel_us
        names = [str(n).upper() for n in (self.hw.gpu.device_names or [self.hw.gpu.model])]
        names += [base for n in names for sibling, base in SAME_SILICON.items() if re.search(rf"\b{sibling}\b", n)]
        def for_this_gpu(table: dict[str, float]) -> float:   # keyed by a part of the device name
            return next((v for k, v in table.items() if any(k in n for n in names)), 1.0)
        self.sustained_clock_fraction = for_this_gpu(SUSTAINED_CLOCK_FRACTION)
        self.block_scaled_fp8_gemm_time = for_this_gpu(BLOCK_SCALED_FP8_GEMM_TIME)
        self._gpu_key = next((k for k in CUDNN_ATTENTION_EFFICIENCY if any(k == n for n in names)), "")

    # ------------------------------------------------------------------ primitives
    def _finish(self, compute_us: float, memory_us: float, flops: float, nbytes: float, dtype: str,
                detail: str = "") -> OpEstimate:
        t = max(compute_us, memory_us, self._min)
        bound = "compute" if t == compute_us and compute_us >= memory_us else (
            "memory" if t == memory_us else "latency")
        eff = flops / (t * 1e-6) / self.hw.peak_flops(dtype) if flops > 0 and t > 0 else 0.0
        return OpEstimate(t, compute_us, memory_us, bound, float(flops), float(nbytes), eff, detail)

    def memory_op(self, nbytes: float, dtype: str = "bf16") -> OpEstimate:
        """A streaming kernel moving `nbytes` through HBM (reads + writes)."""
        return self._finish(0.0, max(nbytes, 0.0) / self._bw, 0.0, nbytes, dtype)

    def memcpy(self, nbytes: float, direction: str = "dtod", pageable: bool = False) -> OpEstimate:
        """cudaMemcpy: host<->device over PCIe (pinned, or staged when the host memory is pageable);
        device-to-device reads and writes HBM."""
        d = direction.lower()
        if d in ("htod", "dtoh", "h2d", "d2h", "htoh", "h2h"):
            bw = self._pageable if pageable else self._pcie
            return self._finish(0.0, nbytes / bw, 0.0, nbytes, "fp32", "pcie pageable" if pageable else "pcie")
        return self._finish(0.0, 2.0 * nbytes / self._bw, 0.0, 2.0 * nbytes, "fp32", "hbm")

    def memset(self, nbytes: float) -> OpEstimate:
        return self._finish(0.0, nbytes / self._bw, 0.0, nbytes, "fp32")

    def gemm(self, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16",
             extra_bytes: float = 0.0) -> OpEstimate:
        """C[batch, m, n] = A[batch, m, k] @ B[batch, k, n] (FLOPs 2*b*m*n*k), best tile and split-K."""
        return self._gemm(int(m), int(n), int(k), int(max(batch, 1)), dtype, float(extra_bytes))

    @lru_cache(maxsize=65536)
    def _gemm(self, m: int, n: int, k: int, batch: int, dtype: str, extra_bytes: float) -> OpEstimate:
        m, n, k = max(m, 1), max(n, 1), max(k, 1)
        c = self.hw.compute
        e = DTYPE_BYTES.get(dtype, 2)
        flops = 2.0 * batch * m * n * k
        base_bytes = float(batch) * (m * k + k * n + m * n) * e + extra_bytes
        peak = self.hw.peak_flops(dtype) / 1e6 * c.gemm_efficiency_for(dtype)  # flops per us
        # a board at its power limit clocks down: no tile shape sustains more than this for long
        cap = self.hw.peak_flops(dtype) / 1e6 * c.sustained_tensor_fraction
        # The knee is the operand reuse a 16-bit tensor-core tile needs; a dtype needs reuse in
        # proportion to its FLOP rate per byte of operand (fp32 SIMT needs far less, tf32 the same).
        ref = self.hw.peak_flops("bf16") if self.hw.gpu.peak_tflops.get("bf16") else self.hw.peak_flops("fp16")
        knee = c.gemm_tile_intensity_knee * (self.hw.peak_flops(dtype) / ref) * (e / 2.0)
        best: tuple[float, float, float, str] | None = None
        for tm, tn in c.gemm_tiles:
            tile_eff = min(1.0, tm * tn / (tm + tn) / knee)
            mt, nt = math.ceil(m / tm), math.ceil(n / tn)
            fill = (m * n) / (mt * tm * nt * tn)
            for s in c.gemm_split_k:
                if s > 1 and (k // s < 128 or mt * nt * batch >= self._sms):
                    continue  # split-K only helps when the output tiles cannot fill the GPU
                tiles = mt * nt * batch * s
                waves = math.ceil(tiles / self._sms)
                waves_eff = tiles / (waves * self._sms)
                ks = k / s
                k_eff = ks / (ks + c.gemm_k_overhead)
                rate = min(peak * tile_eff * fill * waves_eff * k_eff, cap)
                compute_us = flops / rate
                nbytes = base_bytes + (2.0 * (s - 1) * batch * m * n * 4 if s > 1 else 0.0)  # fp32 partials
                memory_us = nbytes / self._bw
                t = max(compute_us, memory_us)
                if best is None or t < best[0] - 1e-12:
                    best = (t, compute_us, memory_us, f"tile {tm}x{tn} split-k {s}", nbytes)
        assert best is not None
        _, compute_us, memory_us, detail, nbytes = best
        return self._finish(compute_us, memory_us, flops, nbytes, dtype, detail)

    def chunked_gemm(self, m: int, n: int, k: int, chunks: int, streams: int = 1, batch: int = 1,
                     dtype: str = "bf16") -> OpEstimate:
        """One GEMM issued as `chunks` GEMMs over row blocks of ceil(m / chunks) rows (the way a
        communication-overlapped GEMM consumes its input shard by shard), round-robin over `streams` streams:
        up to `streams` blocks run together and share the SMs like one batched GEMM, the groups one after
        another. A group too small to fill the GPU pays its own wave quantization; every block re-reads B."""
        chunks = max(min(int(chunks), int(m)), 1)
        streams = max(min(int(streams), chunks), 1)
        rows = math.ceil(m / chunks)
        full, rest = divmod(chunks, streams)
        groups = [self.gemm(rows, n, k, batch * streams, dtype)] * full
        if rest:
            groups.append(self.gemm(rows, n, k, batch * rest, dtype))
        t = sum(g.time_us for g in groups)
        flops = 2.0 * batch * m * n * k
        peak = self.hw.peak_flops(dtype) / 1e6
        return OpEstimate(t, sum(g.compute_us for g in groups), sum(g.memory_us for g in groups),
                          max(groups, key=lambda g: g.time_us).bound, flops, sum(g.bytes for g in groups),
                          flops / t / peak if t > 0 and peak > 0 else 0.0,
                          f"{chunks} row chunks on {streams} streams, {groups[0].detail}")

    def grouped_gemm(self, ms: Sequence[int], n: int, k: int, dtype: str = "bf16", wgrad: bool = False) -> OpEstimate:
        """One GEMM per group with its own row count m ([m, k] x [k, n]; wgrad: [n, m] x [m, k], the
        weight gradient reducing over m), as a grouped/batched kernel: groups of equal m run as one
        batched GEMM, the distinct sizes one after another. Empty groups cost nothing."""
        sizes, counts = np.unique(np.asarray([int(m) for m in ms if int(m) > 0], dtype=np.int64), return_counts=True)
        if len(sizes) == 0:
            return self._finish(0.0, 0.0, 0.0, 0.0, dtype, "no tokens")
        parts = [self.gemm(n, k, int(m), int(c), dtype) if wgrad else self.gemm(int(m), n, k, int(c), dtype)
                 for m, c in zip(sizes, counts)]
        if len(parts) == 1:
            return parts[0]
        t = sum(p.time_us for p in parts)
        flops = sum(p.flops for p in parts)
        eff = flops / (t * 1e-6) / self.hw.peak_flops(dtype) if t > 0 else 0.0
        return OpEstimate(t, sum(p.compute_us for p in parts), sum(p.memory_us for p in parts),
                          max(parts, key=lambda p: p.time_us).bound, flops, sum(p.bytes for p in parts), eff,
                          f"{len(parts)} group sizes")

    def conv(self, n: int, c_in: int, h: int, w: int, c_out: int, kh: int, kw: int, stride: int = 1,
             groups: int = 1, dtype: str = "bf16", h_out: int | None = None, w_out: int | None = None) -> OpEstimate:
        """A convolution as the implicit GEMM cuDNN runs: M = N*Ho*Wo, N = C_out, K = C_in/g*kh*kw."""
        ho = h_out if h_out else max(1, math.ceil(h / max(stride, 1)))
        wo = w_out if w_out else max(1, math.ceil(w / max(stride, 1)))
        g = max(groups, 1)
        e = DTYPE_BYTES.get(dtype, 2)
        # activations are read once (not im2col-expanded): correct the GEMM's A-operand bytes
        act_bytes = n * c_in * h * w * e
        m_, n_, k_ = n * ho * wo, max(c_out // g, 1), max(c_in // g, 1) * kh * kw
        gemm_a_bytes = g * m_ * k_ * e
        return self.gemm(m_, n_, k_, batch=g, dtype=dtype, extra_bytes=act_bytes - gemm_a_bytes)

    def attention(self, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int,
                  causal: bool = False, backward: bool = False, dtype: str = "bf16",
                  kv_heads: int | None = None, window: int = 0, kernel: str = "",
                  v_head_dim: int | None = None) -> OpEstimate:
        """Flash attention; `head_dim` is the query/key width, `v_head_dim` the value (and output) width when
        it differs (MLA: 192 vs 128); `window` > 0: sliding-window (causal) attention over at most that many
        keys; `kernel` = "cudnn": cuDNN's fused flash attention at its measured rates (CUDNN_ATTENTION_EFFICIENCY,
        CUDNN_HEAD_DIM_RATE) where this GPU has them, else the preset's (FlashAttention-2) efficiencies; a named
        flash kernel ("cudnn", "fa2") also pays its tiles (FLASH_QUERY_BLOCK_OVERHEAD), an unnamed (traced) one
        does not."""
        return self._attention(int(batch), int(heads), int(seq_q), int(seq_kv), int(head_dim), bool(causal),
                               bool(backward), dtype, int(kv_heads or heads), int(window), kernel,
                               int(v_head_dim or head_dim))

    @lru_cache(maxsize=16384)
    def _attention(self, b: int, h: int, sq: int, skv: int, d: int, causal: bool, backward: bool,
                   dtype: str, kvh: int, window: int = 0, kernel: str = "", dv: int = 0) -> OpEstimate:
        c = self.hw.compute
        e = DTYPE_BYTES.get(dtype, 2)
        pairs = float(sq) * skv
        if causal and 0 < window < skv and sq == skv:
            # each query sees at most `window` keys: W(W+1)/2 pairs for the first W queries, W for the rest
            pairs = window * (window + 1) / 2.0 + (sq - window) * float(window)
        elif causal:
            # queries see only earlier keys: about half the score matrix when seq_q == seq_kv
            pairs = float(sq) * skv - sq * (sq - 1) / 2.0 if sq <= skv else pairs / 2.0
        fwd_flops = 2.0 * b * h * pairs * (d + dv)               # QK^T (width d) and PV (width dv)
        flops = fwd_flops * (2.5 if backward else 1.0)           # backward: 5 matmuls vs 2
        eff = c.attention_bwd_efficiency if backward else c.attention_fwd_efficiency
        measured = CUDNN_ATTENTION_EFFICIENCY.get(self._gpu_key) if kernel == "cudnn" else None
        if measured:
            eff = (measured[1] if backward else measured[0]) * cudnn_head_dim_rate(
                CUDNN_HEAD_DIM_RATE.get(self._gpu_key, {128: (1.0, 1.0)}), d, backward)
        blocks = b * h * math.ceil(sq / c.attention_block)
        waves = math.ceil(blocks / self._sms)
        waves_eff = blocks / (waves * self._sms)
        rate = self.hw.peak_flops(dtype) / 1e6 * min(eff * waves_eff, c.sustained_tensor_fraction)
        compute_us = flops / rate
        if kernel in FLASH_KERNELS and pairs > 0 and sq >= c.attention_block:
            # (fewer queries than one query block -- decode -- is outside the measured sweep: no tiles)
            compute_us *= flash_tile_factor(sq, skv, causal, window if causal else 0, c.attention_block,
                                            backward, pairs)
        q_o = 1.0 * b * h * sq * (d + dv) * e                   # Q (d) and O (dv)
        k_v = 1.0 * b * kvh * skv * (d + dv) * e                 # K (d) and V (dv)
        nbytes = (q_o + k_v) * (2.5 if backward else 1.0)        # backward also reads dO, writes dQ dK dV
        return self._finish(compute_us, nbytes / self._bw, flops, nbytes, dtype, f"waves {waves}")

    # ------------------------------------------------------------------ entry point (a): node attrs
    def op_estimate(self, attrs: Mapping[str, Any]) -> OpEstimate:
        """Estimate from the generated-node attrs contract (op, flops, bytes, dtype, m/n/k/batch,
        attention dims), with the preset's fitted class model (fixed cost, efficiency) when it has one."""
        est = self.roofline_op_estimate(attrs)
        model = class_model(self.hw, str(attrs.get("op", "elementwise")), str(attrs.get("dtype", "bf16")))
        if model is not None:
            est = apply_class_model(est, model, self._min)
        slower = self.block_scaled_fp8_gemm_time if attrs.get("fp8_block_scaled") else 1.0
        f = self.sustained_clock_fraction if attrs.get("sustained") else 1.0
        if est.compute_us > 0 and (slower > 1.0 or f < 1.0):
            # the power limit caps the rate of the tensor work: a kernel that block scaling already holds
            # below the capped rate runs at its own
            compute_us = est.compute_us * max(slower, 1.0 / f)
            t = max(compute_us, est.memory_us, self._min)
            est = OpEstimate(t, compute_us, est.memory_us, "compute" if t == compute_us else est.bound,
                             est.flops, est.bytes, est.efficiency * est.time_us / t, est.detail)
        launch = float(attrs.get("launch_us", 0.0) or 0.0) * max(int(attrs.get("launches", 1) or 1), 1)
        if launch > est.time_us:
            # a kernel issued from eager host code cannot run faster than the host issues kernels: a run of
            # short kernels is launch-bound (generated workloads say so with `launch_us`)
            est = OpEstimate(launch, est.compute_us, est.memory_us, "latency", est.flops, est.bytes,
                             est.efficiency * est.time_us / launch if launch > 0 else 0.0, "launch-bound")
        return est

    def roofline_op_estimate(self, attrs: Mapping[str, Any]) -> OpEstimate:
        """`op_estimate` from the physics alone (no fitted class model)."""
        op = str(attrs.get("op", "elementwise"))
        dtype = str(attrs.get("dtype", "bf16"))
        if op == "gemm" and all(k in attrs for k in ("m", "n", "k")):
            chunks = max(int(attrs.get("chunks", 1) or 1), 1)
            if chunks > 1:
                return self.chunked_gemm(int(attrs["m"]), int(attrs["n"]), int(attrs["k"]), chunks,
                                         int(attrs.get("chunk_streams", 1) or 1), int(attrs.get("batch", 1)), dtype)
            return self.gemm(int(attrs["m"]), int(attrs["n"]), int(attrs["k"]), int(attrs.get("batch", 1)), dtype)
        if op == "grouped_gemm" and "ms" in attrs:
            return self.grouped_gemm(attrs["ms"], int(attrs["n"]), int(attrs["k"]), dtype, bool(attrs.get("wgrad")))
        if op == "attention" and all(k in attrs for k in ("seq_q", "head_dim", "heads")):
            return self.attention(int(attrs.get("batch", 1)), int(attrs["heads"]), int(attrs["seq_q"]),
                                  int(attrs.get("seq_kv", attrs["seq_q"])), int(attrs["head_dim"]),
                                  bool(attrs.get("causal", False)), bool(attrs.get("backward", False)), dtype,
                                  attrs.get("kv_heads"), int(attrs.get("window", 0) or 0),
                                  str(attrs.get("kernel", "")), attrs.get("v_head_dim"))
        nbytes = float(attrs.get("bytes", 0.0))
        flops = float(attrs.get("flops", 0.0))
        if op == "memcpy":
            return self.memcpy(nbytes, str(attrs.get("direction", "dtod")), bool(attrs.get("pageable", False)))
        if op == "memset":
            return self.memset(nbytes)
        # generic roofline: FLOPs at the GEMM mainloop rate (gemm/attention without shapes) or nothing
        compute_us = 0.0
        if flops > 0:
            eff = (min(self.hw.compute.gemm_efficiency_for(dtype), self.hw.compute.sustained_tensor_fraction)
                   if op in ("gemm", "attention") else 1.0)
            peak = self.hw.peak_flops(dtype if op in ("gemm", "attention") else "fp32")
            compute_us = flops / (peak * eff) * 1e6
        return self._finish(compute_us, nbytes / self._bw, flops, nbytes, dtype)

    def op_time_us(self, attrs: Mapping[str, Any]) -> float:
        return self.op_estimate(attrs).time_us

    # ------------------------------------------------------------------ entry point (b): traced kernels
    def kernel_estimate(self, graph: ExecutionGraph, i: int, contention: str = "") -> OpEstimate | None:
        """Estimate a traced GPU node: the roofline from its launching op's shapes with the preset's fitted
        class model applied, or (no shapes) the class's launch-geometry regression; None when neither
        applies (callers then scale the recorded duration, see `peak_ratio`). `contention`: the kind of
        communication kernel the node ran under ('' = alone), whose fitted models are preferred (see
        kernel_models.communication_contention)."""
        if not self.hw.kernel_models:
            return self.roofline_kernel_estimate(graph, i)
        a = graph.attrs.get(i) or {}
        if "op" in a:
            return self.op_estimate(a)
        cls, dtype = traced_kernel_class(graph, i)
        est = self.roofline_kernel_estimate(graph, i)
        model = class_model(self.hw, cls, dtype, graph.name[i], contention,
                            shaped=est is not None and max(est.compute_us, est.memory_us) > 0)
        if model is None:
            return est
        if est is None or model.shaped_by_geometry:
            geo = geometry_estimate(model, a, self._min)
            if geo is not None or est is None:
                return geo
        return apply_class_model(est, model, self._min) if model.times_shaped else est

    def roofline_kernel_estimate(self, graph: ExecutionGraph, i: int) -> OpEstimate | None:
        """`kernel_estimate` from the physics alone: kernel name + the launching op's shapes."""
        kind = int(graph.kind[i])
        a = graph.attrs.get(i) or {}
        if kind == OpKind.MEMSET and a.get("bytes"):
            return self.memset(float(a["bytes"]))
        if kind == OpKind.MEMCPY and a.get("bytes"):
            return self.memcpy(float(a["bytes"]), _copy_direction(graph.name[i], a),
                               pageable="pageable" in graph.name[i].lower())
        if "op" in a:  # a generated node carrying the attrs contract
            return self.roofline_op_estimate(a)
        host = launching_op(graph, i)
        if host < 0:
            return None
        ha = graph.attrs.get(host) or {}
        check_tensor_shapes(graph, host, ha)
        shapes = arg_list(ha, "input_shapes")
        if not shapes:
            return None
        return estimate_from_shapes(self, graph.name[i], graph.name[host], shapes, arg_list(ha, "input_types"),
                                    ha.get("input_values") or (), arg_list(ha, "output_shapes"))


# More elements than any GPU holds (2^40: a terabyte at one byte each): a corrupt shape, refused rather than
# timed as a step of 1e70 us (and multi_tensor_apply's launch groups would take hours to count)
MAX_TENSOR_ELEMENTS = 1 << 40


def check_tensor_shapes(graph: ExecutionGraph, i: int, a: Mapping[str, Any]) -> None:
    """Refuse (TraceInputError) an op recording a tensor no GPU holds: its file is corrupt, and timing it
    from its shapes would give a step of years."""
    def numels(shapes):
        for sh in shapes if isinstance(shapes, (list, tuple)) else ():
            if isinstance(sh, (list, tuple)) and sh and all(isinstance(x, int) for x in sh):
                yield sh, math.prod(sh)
            elif isinstance(sh, (list, tuple)):
                yield from numels(sh)     # a tensor list
    for key in ("input_shapes", "output_shapes"):
        for sh, n in numels(a.get(key)):
            if n > MAX_TENSOR_ELEMENTS:
                raise TraceInputError((graph.metadata or {}).get("source_path"),
                                      f"node {int(graph.node_id[i])} ({graph.name[i]}): tensor shape "
                                      f"{sh[:8]}{'...' if len(sh) > 8 else ''} is not a tensor any GPU holds "
                                      f"({float(n):.3g} elements)")


def traced_kernel_class(graph: ExecutionGraph, i: int) -> tuple[str, str]:
    """(class, dtype) of a traced GPU node: copies and memsets by kind, kernels by name + launching op."""
    kind = int(graph.kind[i])
    if kind == OpKind.MEMCPY:
        return "copy", "fp32"
    if kind == OpKind.MEMSET:
        return "memset", "fp32"
    host = launching_op(graph, i)
    op = graph.name[host] if host >= 0 else ""
    types = arg_list(graph.attrs.get(host) or {}, "input_types") if host >= 0 else []
    return classify_kernel(graph.name[i], op).cls, _dtype_of(types, graph.name[i])[0]


def arg_list(attrs: Mapping[str, Any], key: str) -> Sequence[Any]:
    """A recorded argument column (input_shapes, input_types, ...): a list, else nothing to infer from (a
    writer's `"Input type": 5` is as uninformative as a missing one, and must not reach the per-argument
    loops)."""
    v = attrs.get(key)
    return v if isinstance(v, (list, tuple)) else []


def _copy_direction(name: str, attrs: Mapping[str, Any]) -> str:
    text = (name + " " + str(attrs.get("kind", "")) + " " + str(attrs.get("direction", ""))).lower()
    for key, d in (("htod", "htod"), ("h2d", "htod"), ("dtoh", "dtoh"), ("d2h", "dtoh"),
                   ("dtod", "dtod"), ("d2d", "dtod")):
        if key in text:
            return d
    return "dtod"


def launching_op(graph: ExecutionGraph, i: int) -> int:
    """Index of the host op that launched GPU node `i` (the LAUNCH dep's call-stack parent), or -1."""
    lo, hi = int(graph.dep_ptr[i]), int(graph.dep_ptr[i + 1])
    for j in range(lo, hi):
        if graph.dep_kind[j] == EdgeKind.LAUNCH:
            launch = int(graph.dep_src[j])
            return int(graph.parent[launch])
    return -1


def _type_key(t: Any) -> str:
    """Kineto writes a tensor's type as 'c10::BFloat16', the Execution Trace as 'Tensor(c10::BFloat16)':
    both must find the same _TORCH_TYPES entry (else every ET-linked bf16 op was costed as fp32)."""
    key = str(t).lower()
    if key.startswith("tensor(") and key.endswith(")"):
        key = key[len("tensor("):-1]
    return key


def _dtype_of(types: Sequence[str], kernel: str) -> tuple[str, int]:
    """Compute dtype and element size: kernel-name hints first (TF32 tensor cores run fp32 tensors)."""
    k = kernel.lower()
    if "tf32" in k or "s1688" in k or "s16816" in k:
        return "tf32", 4
    if "bf16" in k:
        return "bf16", 2
    if "e4m3" in k or "fp8" in k:
        return "fp8", 1
    for t in types:
        got = _TORCH_TYPES.get(_type_key(t))
        if got and got[0] in ("fp32", "bf16", "fp16", "fp64", "fp8") and _type_key(t) not in (
                "long int", "int64_t", "int", "bool", "unsigned char", "signed char", "short int"):
            return got
    if "h884" in k or "h1688" in k or "h16816" in k or "fp16" in k:
        return "fp16", 2
    return "fp32", 4


def _elem_bytes(t: str) -> int:
    got = _TORCH_TYPES.get(_type_key(t))
    return got[1] if got else 4


def _numel(shape: Any) -> int:
    if not isinstance(shape, (list, tuple)) or not shape:
        return 0
    if not all(isinstance(x, int) for x in shape):
        return 0  # nested (tensor list) shapes: not a plain tensor
    return math.prod(max(x, 0) for x in shape)


def _tensors(shapes: Sequence[Any]) -> list[list[int]]:
    return [list(s) for s in shapes if isinstance(s, (list, tuple)) and s and all(isinstance(x, int) for x in s)]


def _conv_estimate(model: ComputeModel, kernel: str, op: str, shapes: Sequence[Any], types: Sequence[str],
                   values: Sequence[Any], out_shapes: Sequence[Any], dtype: str) -> OpEstimate | None:
    """A kernel of a convolution op: a helper pass over the op's tensors, or the implicit GEMM of the op's
    geometry (`conv_args`; each of a backward's dgrad / wgrad GEMMs has the forward's FLOPs). Ops outside
    the known signatures: the first two equal-rank tensors as input and weight, stride 1."""
    if CONV_HELPER_KERNEL.search(kernel):
        nbytes = sum(_numel(s) * _elem_bytes(types[i] if i < len(types) else "float") for i, s in enumerate(shapes))
        return model.memory_op(float(nbytes), dtype) if nbytes else None
    geo = conv_geometry(op, shapes, values, out_shapes)
    if geo is None and op.lower().split("::")[-1] not in CONV_SIGNATURES:
        tens = _tensors(shapes)
        if len(tens) >= 2 and len(tens[0]) == len(tens[1]) >= 3:
            geo = conv_geometry("aten::conv2d", tens[:2])
    if geo is None:
        return None
    return model.conv(geo.batch, geo.c_in, geo.in_spatial, 1, geo.c_out, geo.kernel, 1, 1, geo.groups, dtype,
                      h_out=geo.out_spatial, w_out=1)


def estimate_from_shapes(model: ComputeModel, kernel: str, op: str, shapes: Sequence[Any],
                         types: Sequence[str], values: Sequence[Any] = (),
                         out_shapes: Sequence[Any] = ()) -> OpEstimate | None:
    """Map a kernel + its host op's input shapes (and, for convolutions and attention, its traced argument
    values; for convolutions its output shapes) to a model estimate (None if not understood)."""
    cls = kernel_class(kernel)
    op_l = op.lower()
    dtype, e = _dtype_of(types, kernel)
    tens = _tensors(shapes)
    if not tens:
        return None
    gemm_dims = _gemm_dims(op_l, tens)
    if gemm_dims is not None and cls in ("gemm", "other"):
        m, n, k, b = gemm_dims
        return model.gemm(m, n, k, b, dtype)
    if CONVOLUTION_OP.search(op_l) and cls in ("conv", "gemm", "other"):
        conv = _conv_estimate(model, kernel, op, shapes, types, values, out_shapes, dtype)
        if conv is not None or op_l.split("::")[-1] in CONV_SIGNATURES:
            return conv
    known_attention = signature_of(op) is not None
    if cls == "attention" or "attention" in op_l or known_attention:
        q = tens[0]
        if len(q) in (3, 4) and _ATTENTION_HELPER.search(kernel):
            # a pre/post pass of the flash backward (rowsum of dO*O, dQ fp32 -> 16 bit, GQA head
            # reduction): a stream over Q-sized tensors, not the attention FLOPs again
            return model.memory_op(3.0 * _numel(q) * e, dtype)
        if known_attention:       # its tensors' layout and its causal flag by the op's signature
            geo = attention_geometry(op, shapes, values)
            if geo is None:
                return None
            causal = geo.causal if geo.causal is not None else "causal" in kernel.lower()
            return model.attention(geo.batch, geo.heads, geo.seq_q, geo.seq_kv, geo.head_dim, causal,
                                   geo.backward or "bwd" in kernel.lower(), dtype, geo.kv_heads,
                                   v_head_dim=geo.v_head_dim)
        if len(q) == 4 and len(tens) >= 2:     # an op of unknown signature: [b, h, s, d] tensors
            b, h, sq, d = q
            kv = tens[1]
            skv = kv[2] if len(kv) == 4 else sq
            kvh = kv[1] if len(kv) == 4 else h
            backward = "backward" in op_l or "bwd" in kernel.lower()
            causal = "causal" in kernel.lower()
            return model.attention(b, h, sq, skv, d, causal, backward, dtype, kvh)
        return None
    if not op_l.startswith("aten::"):
        return None  # custom ops (fbgemm, apex, ...): their input shapes do not tell their traffic
    if gemm_dims is not None:
        # a non-GEMM kernel of a GEMM op (split-K reduce, epilogue): one pass over the output
        m, n, _, b = gemm_dims
        return model.memory_op(2.0 * b * m * n * 4, dtype)
    base = op_l.split("::")[-1]
    if base in INDEXED_OPS:
        moved = _indexed_bytes(base, shapes, types, out_shapes)
        return model.memory_op(moved, dtype) if moved else None
    # memory-bound classes: every input read once, the output as large as the largest input written
    sizes = [_numel(s) * _elem_bytes(types[i] if i < len(types) else "float")
             for i, s in enumerate(shapes) if isinstance(s, (list, tuple))]
    if not sizes or max(sizes) == 0:
        return None
    if cls == "reduction" or op_l.split("::")[-1] in ("sum", "mean", "norm", "amax", "max", "min", "prod",
                                                          "linalg_vector_norm", "argmax", "var", "std"):
        nbytes = sum(sizes)
    elif cls == "embedding" or "embedding" in op_l:
        # reads the selected rows (indices x dim) and writes them; the table is not streamed
        idx = _numel(tens[1]) if len(tens) > 1 else 0
        if idx == 0:
            return None
        dim = tens[0][-1] if tens else 1
        nbytes = _gathered_bytes(idx * dim * e, idx)
    else:
        nbytes = sum(sizes) + max(sizes)
    return model.memory_op(nbytes, dtype)


# Ops that read or write a few rows of a large tensor (a KV cache, an embedding-like table): the kernel moves
# the selected rows, not the tensor; "every input read once" charged a 672 MB table for a 16-row gather.
# Per op: the argument positions of (index, moved tensor). The moved tensor is what the selected rows
# amount to: index_put's values, scatter's src; None where the op's output is that (index, gather,
# index_select: taken from the traced output shape, else gather's index shape or index_select's index x
# the rest of the row). Argument positions: native_functions.yaml.
INDEXED_OPS: dict[str, tuple[int, int | None]] = {
    "index": (1, None), "index_select": (2, None), "gather": (2, None),
    "index_put": (1, 2), "index_put_": (1, 2), "_index_put_impl_": (1, 2), "_unsafe_index_put": (1, 2),
    "index_add": (2, 3), "index_add_": (2, 3), "index_copy": (2, 3), "index_copy_": (2, 3),
    "scatter": (2, 3), "scatter_": (2, 3), "scatter_add": (2, 3), "scatter_add_": (2, 3),
    "scatter_reduce": (2, 3), "scatter_reduce_": (2, 3),
}


def _indexed_bytes(base: str, shapes: Sequence[Any], types: Sequence[str], out_shapes: Sequence[Any]) -> float:
    """Bytes an indexed op moves: the selected rows read and written (the moved tensor, or the output),
    plus the index read; 0 when the trace does not say how many rows (aten::index's index list is not
    recorded as shapes): the kernel then keeps its recorded time."""
    index_pos, moved_pos = INDEXED_OPS[base]

    def arg(i: int | None) -> Any:
        return shapes[i] if i is not None and i < len(shapes) else None

    elem = _elem_bytes(types[0]) if types else 4
    index_n = _numel(arg(index_pos))
    if moved_pos is not None:
        rows = _numel(arg(moved_pos))
        rows_bytes = rows * (_elem_bytes(types[moved_pos]) if moved_pos < len(types) else elem)
    else:
        out = out_shapes[0] if out_shapes else None
        rows = _numel(out)
        if not rows and base == "gather":
            rows = index_n                               # gather's output has the index's shape
        elif not rows and base == "index_select" and _numel(arg(0)) and index_n:
            # dim is a value the readers do not keep: the leading one (embedding-like), at most the tensor
            self_shape = list(arg(0))
            rows = min(index_n * _numel(self_shape) // max(self_shape[0], 1), _numel(self_shape))
        rows_bytes = rows * elem
    return _gathered_bytes(rows_bytes, index_n) if rows_bytes else 0.0


def _gathered_bytes(rows_bytes: float, indices: int) -> float:
    """A gather's or scatter's traffic: its rows read and written once each, and its int64 indices read."""
    return 2.0 * rows_bytes + indices * 8


_ATTENTION_HELPER = re.compile(r"dot_do_o|convert_dq|convert_dkv|reduce_head|clear_dkv|dq_accum", re.I)


def _gemm_dims(op: str, tens: list[list[int]]) -> tuple[int, int, int, int] | None:
    """(m, n, k, batch) of aten matmul-family ops from their input shapes."""
    name = op.split("::")[-1]
    try:
        if name in ("addmm", "_addmm_activation") and len(tens) >= 3:
            (m, k), (_, n) = tens[1][-2:], tens[2][-2:]
            return m, n, k, 1
        if name in ("mm",) and len(tens) >= 2:
            (m, k), (_, n) = tens[0][-2:], tens[1][-2:]
            return m, n, k, 1
        if name in ("bmm", "baddbmm") and len(tens) >= 2:
            a, b = (tens[1], tens[2]) if name == "baddbmm" and len(tens) >= 3 else (tens[0], tens[1])
            return a[-2], b[-1], a[-1], math.prod(a[:-2]) or 1
        if name in ("linear",) and len(tens) >= 2:
            x, w = tens[0], tens[1]
            return math.prod(x[:-1]) or 1, w[0], x[-1], 1
        if name in ("matmul",) and len(tens) >= 2:
            x, w = tens[0], tens[1]
            if len(w) == 2:
                return math.prod(x[:-1]) or 1, w[-1], x[-1], 1
            return x[-2], w[-1], x[-1], math.prod(x[:-2]) or 1
        if name in ("_scaled_mm",) and len(tens) >= 2:
            (m, k), (_, n) = tens[0][-2:], tens[1][-2:]
            return m, n, k, 1
    except (ValueError, IndexError):
        return None
    return None


# ---------------------------------------------------------------------------------- peak ratios
def peak_ratio(source: HardwareConfig, target: HardwareConfig, cls: str, dtype: str = "bf16",
               intensity: float | None = None) -> float:
    """Duration multiplier for a kernel moved from `source` to `target` when only its class is known:
    compute peak ratio for compute classes, HBM bandwidth ratio for memory classes; with a known
    arithmetic intensity (FLOP/byte), whichever roof binds on the source decides."""
    compute = source.peak_flops(dtype) / target.peak_flops(dtype)
    memory = source.hbm_bytes_per_us / target.hbm_bytes_per_us
    if intensity is not None and intensity > 0:
        ridge = source.peak_flops(dtype) * source.compute.gemm_efficiency / (source.hbm_bytes_per_us * 1e6)
        return compute if intensity >= ridge else memory
    if cls in COMPUTE_CLASSES:
        return compute
    return memory
