"""Compute model: GEMM tile/wave roofline, attention, memory-bound ops, kernel classification."""
from __future__ import annotations

import gzip
import collections

import pytest

from replay.hardware import ComputeModel, get_hardware, kernel_class, peak_ratio


@pytest.fixture(scope="module")
def h100():
    return ComputeModel("h100-sxm-roofline")


def test_h100_bf16_8192_cube_between_600_and_800_tflops(h100):
    e = h100.gemm(8192, 8192, 8192, dtype="bf16")
    assert 600 <= e.tflops <= 800
    assert e.bound == "compute"


def test_h100_bf16_best_measured_shape_within_10pct_of_792(h100):
    e = h100.gemm(6144, 17920, 2816, dtype="bf16")
    assert e.tflops == pytest.approx(792, rel=0.10)
    assert e.bound == "compute"


@pytest.mark.parametrize("n,k", [(4096, 4096), (8192, 8192), (14336, 4096), (4096, 14336), (28672, 8192)])
def test_m16_gemms_are_memory_bound(h100, n, k):
    e = h100.gemm(16, n, k, dtype="bf16")
    assert e.bound == "memory"
    assert e.time_us == pytest.approx(e.memory_us)
    assert e.memory_us > e.compute_us
    # the memory term is the operand bytes over achievable HBM bandwidth
    min_bytes = 2 * (16 * k + k * n + 16 * n)
    hw = get_hardware("h100-sxm-roofline")
    assert e.memory_us == pytest.approx(e.bytes / (hw.gpu.hbm_bw_gbs * hw.compute.hbm_efficiency * 1e3))
    assert e.bytes >= min_bytes


def test_wave_quantization_shows(h100):
    # 132 SMs: 132 tiles of 128x256 fill one wave exactly, 133 need two
    one = h100.gemm(128 * 12, 256 * 11, 8192)
    two = h100.gemm(128 * 12 + 1, 256 * 11, 8192)
    assert two.time_us > one.time_us * 1.05


def test_skinny_gemm_uses_split_k_to_fill_the_gpu(h100):
    # 15x50 output, K = 98304 (a shape from the A100 trace): one output tile, so split-K spreads K over SMs
    e = h100.gemm(15, 50, 98304, dtype="fp32")
    assert "split-k 1" not in e.detail


def test_dtype_peaks_order(h100):
    s = (8192, 8192, 8192)
    assert h100.gemm(*s, dtype="fp8").time_us < h100.gemm(*s, dtype="bf16").time_us < \
        h100.gemm(*s, dtype="tf32").time_us < h100.gemm(*s, dtype="fp32").time_us


def test_generations_order_for_the_same_gemm():
    times = [ComputeModel(n).gemm(8192, 8192, 8192, dtype="fp16").time_us
             for n in ("v100-sxm2", "a100-sxm-40gb", "h100-sxm-roofline", "b200")]
    assert times == sorted(times, reverse=True)


def test_attention_fwd_bwd_and_causal(h100):
    f = h100.attention(4, 32, 4096, 4096, 128, causal=False)
    c = h100.attention(4, 32, 4096, 4096, 128, causal=True)
    b = h100.attention(4, 32, 4096, 4096, 128, causal=True, backward=True)
    assert f.flops == pytest.approx(4 * 4 * 32 * 4096 * 4096 * 128)
    assert c.time_us < f.time_us and b.time_us > c.time_us * 2
    assert f.bound == "compute"
    hw = get_hardware("h100-sxm-roofline")
    assert f.tflops <= hw.gpu.peak_tflops["bf16"] * hw.compute.attention_fwd_efficiency + 1e-6


def test_op_time_from_generated_node_attrs(h100):
    g = {"op": "gemm", "m": 4096, "n": 4096, "k": 4096, "batch": 1, "dtype": "bf16"}
    assert h100.op_time_us(g) == pytest.approx(h100.gemm(4096, 4096, 4096).time_us)
    a = {"op": "attention", "batch": 2, "heads": 16, "kv_heads": 4, "seq_q": 2048, "seq_kv": 2048,
         "head_dim": 128, "causal": True, "backward": False, "dtype": "bf16"}
    assert h100.op_time_us(a) == pytest.approx(h100.attention(2, 16, 2048, 2048, 128, True, False, "bf16", 4).time_us)
    hw = get_hardware("h100-sxm-roofline")
    big = {"op": "elementwise", "bytes": 3e9, "dtype": "bf16"}
    assert h100.op_time_us(big) == pytest.approx(3e9 / (hw.gpu.hbm_bw_gbs * hw.compute.hbm_efficiency * 1e3))
    tiny = {"op": "norm", "bytes": 100.0}
    assert h100.op_time_us(tiny) == hw.compute.min_kernel_us
    h2d = h100.op_estimate({"op": "memcpy", "bytes": 1e9, "direction": "htod"})
    d2d = h100.op_estimate({"op": "memcpy", "bytes": 1e9})
    assert h2d.time_us > 5 * d2d.time_us  # PCIe vs HBM


def test_deterministic():
    a = ComputeModel("a100-sxm").gemm(3000, 5000, 700, dtype="tf32")
    b = ComputeModel("a100-sxm").gemm(3000, 5000, 700, dtype="tf32")
    assert a == b


@pytest.mark.parametrize("name,cls", [
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm"),
    ("ampere_sgemm_128x64_nn", "gemm"), ("volta_sgemm_64x64_nt", "gemm"), ("Kernel2", "gemm"),
    ("void splitKreduce_kernel<float, float, float, float, true, false, false>(cublasSplitKParams<float>, float const*)", "reduction"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", "elementwise"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)", "reduction"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)", "norm"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 32, true, 1, true>(cudnnTensorStruct, float const*)", "norm"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "softmax"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>)", "embedding"),
    ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(long const*, float const*, float*, int, long, int)", "embedding"),
    ("Memcpy HtoD (Pinned -> Device)", "copy"), ("Memset (Device)", "memset"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4> >()", "optimizer"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel", "conv"),
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "conv"),
])
def test_kernel_class_by_name(name, cls):
    assert kernel_class(name) == cls


def test_kernel_classes_cover_real_trace_kernels(shared_traces):
    import orjson
    counts = collections.Counter()
    for f in ("hta/trace_diff_control_control.json.gz", "hta/nccl_parser_config_nccl_data.json.gz",
              "hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"):
        d = orjson.loads(gzip.open(shared_traces / f).read())
        for e in d["traceEvents"]:
            if e.get("cat") == "kernel":
                c = kernel_class(e["name"])
                counts[c] += 1
                if "nccl" in e["name"].lower():
                    assert c == "communication"
                if "sgemm" in e["name"] or "s1688gemm" in e["name"]:
                    assert c in ("gemm", "conv")
    total = sum(counts.values())
    assert total > 10000
    assert counts["other"] / total < 0.02, counts.most_common()
    assert counts["gemm"] > 0 and counts["elementwise"] > 0 and counts["conv"] > 0 and counts["norm"] > 0


def test_peak_ratio_fallback():
    a100, h100 = get_hardware("a100-sxm-40gb"), get_hardware("h100-sxm-roofline")
    assert peak_ratio(a100, h100, "gemm", "bf16") == pytest.approx(312 / 989.4)
    mem = (1555 * a100.compute.hbm_efficiency) / (3350 * h100.compute.hbm_efficiency)
    assert peak_ratio(a100, h100, "elementwise") == pytest.approx(mem)
    assert peak_ratio(a100, h100, "other", "bf16", intensity=1000.0) == pytest.approx(312 / 989.4)
    assert peak_ratio(a100, h100, "other", "bf16", intensity=1.0) == pytest.approx(mem)
    assert peak_ratio(h100, h100, "gemm") == 1.0


# ------------------------------------------------------------------ traced kernels: shapes of the host op
from replay.hardware.compute import estimate_from_shapes  # noqa: E402


def test_shapes_of_matmul_family_host_ops(h100):
    bf = ["c10::BFloat16"] * 3
    gemm_k = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_kernel"
    ref = h100.gemm(512, 1024, 256, dtype="bf16")
    assert estimate_from_shapes(h100, gemm_k, "aten::addmm", [[1024], [512, 256], [256, 1024], [], []], bf) == ref
    assert estimate_from_shapes(h100, gemm_k, "aten::mm", [[512, 256], [256, 1024]], bf) == ref
    assert estimate_from_shapes(h100, gemm_k, "aten::linear", [[2, 256, 256], [1024, 256], [1024]], bf) == ref
    bmm = estimate_from_shapes(h100, gemm_k, "aten::bmm", [[8, 512, 256], [8, 256, 1024]], bf)
    assert bmm == h100.gemm(512, 1024, 256, batch=8, dtype="bf16")
    # a split-K reduce kernel of the same op is one pass over the fp32 partial output, not a GEMM
    red = estimate_from_shapes(h100, "void splitKreduce_kernel<float>(cublasSplitKParams<float>)", "aten::mm",
                               [[512, 256], [256, 1024]], bf)
    assert red.flops == 0 and red.bytes == 2 * 512 * 1024 * 4


def test_tf32_kernel_name_sets_the_rate():
    a100 = ComputeModel("a100-sxm-40gb")
    shapes = [[4096, 4096], [4096, 4096]]
    tf32 = estimate_from_shapes(a100, "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", "aten::mm", shapes,
                                ["float", "float"])
    sgemm = estimate_from_shapes(a100, "ampere_sgemm_128x64_nn", "aten::mm", shapes, ["float", "float"])
    assert tf32 == a100.gemm(4096, 4096, 4096, dtype="tf32")
    assert sgemm == a100.gemm(4096, 4096, 4096, dtype="fp32")
    assert sgemm.time_us > 4 * tf32.time_us


def test_shapes_of_conv_attention_and_memory_ops(h100):
    conv = estimate_from_shapes(h100, "sm90_xmma_fprop_implicit_gemm_bf16", "aten::cudnn_convolution",
                                [[32, 64, 56, 56], [128, 64, 3, 3], [], [], []], ["c10::BFloat16"] * 2)
    assert conv.flops == pytest.approx(2 * 32 * 56 * 56 * 128 * 64 * 9)
    sdpa = estimate_from_shapes(h100, "flash_fwd_kernel", "aten::_scaled_dot_product_flash_attention",
                                [[2, 16, 2048, 128]] * 3, ["c10::BFloat16"] * 3)
    assert sdpa == h100.attention(2, 16, 2048, 2048, 128, dtype="bf16")
    ln = estimate_from_shapes(h100, "vectorized_layer_norm_kernel", "aten::native_layer_norm",
                              [[8192, 4096], [], [4096], [4096], []], ["c10::BFloat16", "", "c10::BFloat16"])
    assert ln.bytes >= 2 * 8192 * 4096 * 2  # read and write the activations
    add = estimate_from_shapes(h100, "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", "aten::add",
                               [[4096, 4096], [4096, 4096], []], ["float", "float", "Scalar"])
    assert add.bytes == 3 * 4096 * 4096 * 4 and add.bound == "memory"
    # a custom op's input shapes do not tell its traffic: no estimate (the caller scales the recording)
    assert estimate_from_shapes(h100, "split_embedding_backward_codegen", "fbgemm::split_embedding",
                                [[8192, 8720]], ["float"]) is None


def test_pageable_copies_are_slower_than_pinned(h100):
    pinned = h100.memcpy(1e9, "htod")
    pageable = h100.memcpy(1e9, "htod", pageable=True)
    hw = get_hardware("h100-sxm-roofline")
    assert pageable.time_us == pytest.approx(1e9 / (hw.gpu.pcie_bw_gbs * hw.compute.pageable_copy_efficiency * 1e3))
    assert pageable.time_us > 2 * pinned.time_us


def test_execution_trace_tensor_types_give_the_same_dtype_as_kineto_types():
    # The ET writes 'Tensor(c10::BFloat16)' where Kineto writes 'c10::BFloat16'; a bf16 GEMM linked to its
    # ET op was costed as fp32 (16x too slow on the H100 traces in tests/data/h100) before both matched.
    from replay.hardware.compute import _dtype_of, _elem_bytes
    for et, kineto, want in (("Tensor(c10::BFloat16)", "c10::BFloat16", ("bf16", 2)),
                             ("Tensor(c10::Float8_e4m3fn)", "c10::Float8_e4m3fn", ("fp8", 1)),
                             ("Tensor(float)", "float", ("fp32", 4))):
        assert _dtype_of([et], "nvjet_sm90_tst_256x128") == _dtype_of([kineto], "nvjet_sm90_tst_256x128") == want
        assert _elem_bytes(et) == want[1]
