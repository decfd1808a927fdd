"""Convolution kernels are timed from the op's geometry as PyTorch's signatures place it: stride / padding /
dilation / groups from the traced values (Kineto's Concrete Inputs, an Execution Trace's input values), the
backward ops' size lists, helper kernels as passes over the tensors. Figures come from the convolution
arithmetic (out = (in + 2p - d(k-1) - 1) // s + 1; FLOPs = 2 x N*out x C_out x C_in/g*k), not from the code."""
import pytest

from replay.hardware.compute import ComputeModel, estimate_from_shapes
from replay.hardware.conv_args import conv_geometry

# A ViT-style patch embedding as a Kineto trace of PyTorch 2.x records it (OWLv2: 14 x 14 patches, stride 14)
PATCH_SHAPES = [[1, 3, 1008, 1008], [1024, 3, 14, 14], [], [], [], [], [], [], []]
PATCH_VALUES = ["", "", "", "[14, 14]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]
WGRAD = "sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64"


def _flops(geo) -> float:
    return 2.0 * geo.batch * geo.out_spatial * geo.c_out * (geo.c_in // geo.groups) * geo.kernel


def test_strided_patch_embedding_has_the_strided_output():
    geo = conv_geometry("aten::convolution", PATCH_SHAPES, PATCH_VALUES)
    out = (1008 + 0 - 1 * (14 - 1) - 1) // 14 + 1
    assert out == 72 and geo.out_spatial == out * out
    assert _flops(geo) == pytest.approx(2 * 72 * 72 * 1024 * 3 * 14 * 14)


def test_cudnn_convolution_reads_padding_before_stride():
    # aten::cudnn_convolution(self, weight, padding, stride, dilation, groups, ...)
    geo = conv_geometry("aten::cudnn_convolution", PATCH_SHAPES, ["", "", "[0, 0]", "[14, 14]", "[1, 1]", "1"])
    assert geo.out_spatial == 72 * 72
    # a 3x3 stride-2 padding-1 convolution: (56 + 2 - 2 - 1) // 2 + 1 = 28
    geo = conv_geometry("aten::cudnn_convolution", [[8, 64, 56, 56], [128, 64, 3, 3]],
                        ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1"])
    assert geo.out_spatial == 28 * 28


def test_backward_weight_without_its_weight_size_is_not_guessed():
    """PyTorch < 1.11's cudnn_convolution_backward_weight(weight_size, grad_output, self, ...): a trace that
    leaves weight_size out gives no geometry (before, grad_output and the input were read as input and weight:
    a 224 x 224 'kernel', seconds for a 1 ms kernel)."""
    shapes = [[], [32, 64, 112, 112], [32, 3, 224, 224], [], [], [], [], [], [], []]
    assert conv_geometry("aten::cudnn_convolution_backward_weight", shapes) is None
    geo = conv_geometry("aten::cudnn_convolution_backward_weight", shapes,
                        [[64, 3, 7, 7], "", "", [3, 3], [2, 2], [1, 1], 1])
    assert (geo.c_in, geo.c_out, geo.kernel, geo.out_spatial) == (3, 64, 49, 112 * 112)   # grad_output's extent
    cm = ComputeModel("v100")
    est = estimate_from_shapes(cm, "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7>",
                               "aten::cudnn_convolution_backward_weight", shapes, ["GenericList", "float", "float"])
    assert est is None


def test_convolution_backward_takes_grad_output_input_weight_in_that_order():
    # aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    # output_padding, groups, output_mask): a depthwise 3x3 convolution
    shapes = [[16, 256, 28, 28], [16, 256, 28, 28], [256, 1, 3, 3]]
    values = ["", "", "", "[0]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "256", "[True, True, False]"]
    geo = conv_geometry("aten::convolution_backward", shapes, values)
    assert (geo.groups, geo.c_in // geo.groups, geo.kernel, geo.out_spatial) == (256, 1, 9, 28 * 28)


def test_values_as_a_et_file_keeps_them_read_back():
    text = str(PATCH_VALUES)     # graph_io writes input values as their Python text and reads the text back
    assert conv_geometry("aten::convolution", PATCH_SHAPES, text).out_spatial == 72 * 72
    assert conv_geometry("aten::convolution", PATCH_SHAPES, "not a literal [").out_spatial == 1008 * 1008


def test_conv_kernel_time_follows_the_stride():
    cm = ComputeModel("h100-sxm")
    types = ["c10::BFloat16", "c10::BFloat16"]
    strided = estimate_from_shapes(cm, WGRAD, "aten::convolution", PATCH_SHAPES, types, PATCH_VALUES)
    geo = conv_geometry("aten::convolution", PATCH_SHAPES, PATCH_VALUES)
    assert strided.flops == pytest.approx(_flops(geo))
    # ~6.2 GFLOP: tens of microseconds on an H100, not the 3.4 ms of the stride-1 reading
    assert strided.time_us < 100


def test_helper_kernels_of_a_convolution_are_passes_over_its_tensors():
    cm = ComputeModel("h100-sxm")
    types = ["c10::BFloat16", "c10::BFloat16"]
    for kernel in ("cask_cudnn::computeWgradSplitKOffsetsKernel(cask_cudnn::ComputeSplitKOffsetsParams)",
                   "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>"):
        est = estimate_from_shapes(cm, kernel, "aten::convolution", PATCH_SHAPES, types, PATCH_VALUES)
        assert est.flops == 0, kernel
        nbytes = (1 * 3 * 1008 * 1008 + 1024 * 3 * 14 * 14) * 2
        assert est.time_us == pytest.approx(cm.memory_op(float(nbytes), "bf16").time_us)
    layout = estimate_from_shapes(cm, "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>",
                                  "aten::convolution", PATCH_SHAPES, types, PATCH_VALUES)
    assert layout.flops == 0 and layout.time_us < 10


def test_execution_trace_carries_convolution_values():
    """The committed CPU CNN trace (tests/data/cpu_models/cnn, PyTorch ET): conv1 is 3 -> 16 channels, 3x3,
    stride 1, padding 1 on 8 x 3 x 32 x 32: (32 + 2 - 2 - 1) // 1 + 1 = 32 per side, for every op of its
    chain down to oneDNN's (self, weight, bias, padding, stride, ...)."""
    from pathlib import Path

    from chakra_schema.pytorch.execution_trace import load_execution_trace, op_attrs
    et = load_execution_trace(Path(__file__).parent / "data" / "cpu_models" / "cnn" / "host.0.json.gz")
    seen = set()
    for i, name in enumerate(et.names):
        a = op_attrs(et, i)
        if "conv" in name and a.get("input_shapes", [[]])[0] == [8, 3, 32, 32]:
            geo = conv_geometry(name, a["input_shapes"], a["input_values"])
            assert (geo.c_in, geo.c_out, geo.kernel, geo.out_spatial) == (3, 16, 9, 32 * 32), name
            seen.add(name)
    assert {"aten::conv2d", "aten::_convolution", "aten::mkldnn_convolution"} <= seen
