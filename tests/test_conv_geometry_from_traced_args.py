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


def test_transposed_convolution_is_the_data_gradient_it_inverts():
    """A stride-2 4x4 transposed convolution, 256 -> 128 channels on 8 x 256 x 16 x 16 (weight [C_in, C_out,
    k, k]): 2 x (8*16*16) x 256 x 128 x 16 FLOPs, whether aten::convolution says transposed=True or the op is
    cudnn_convolution_transpose (16x too few were counted as a forward convolution)."""
    shapes = [[8, 256, 16, 16], [256, 128, 4, 4], [], [], [], [], [], [], []]
    values = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[0, 0]", "1"]
    flops = 2 * (8 * 16 * 16) * 256 * 128 * 16
    assert _flops(conv_geometry("aten::convolution", shapes, values)) == flops
    cudnn = conv_geometry("aten::cudnn_convolution_transpose", shapes[:2],
                          ["", "", "[1, 1]", "[0, 0]", "[2, 2]", "[1, 1]", "1"])
    assert _flops(cudnn) == flops


def test_string_padding_and_depthwise_ops():
    """_convolution_mode's padding='valid' is none: a 7x7 kernel on 224 gives 218 per side (224 - 7 + 1);
    _conv_depthwise2d (self, weight, kernel_size, bias, stride, padding, dilation) has one group per channel:
    stride 2, padding 1, 3x3 on 56 gives (56 + 2 - 2 - 1) // 2 + 1 = 28."""
    valid = conv_geometry("aten::_convolution_mode", [[1, 3, 224, 224], [64, 3, 7, 7]],
                          ["", "", "", "[1, 1]", "valid", "[1, 1]", "1"])
    assert valid.out_spatial == 218 * 218
    dw = conv_geometry("aten::_conv_depthwise2d", [[4, 96, 56, 56], [96, 1, 3, 3]],
                       ["", "", "[3, 3]", "", "[2, 2]", "[1, 1]", "[1, 1]"])
    assert (dw.groups, dw.out_spatial) == (96, 28 * 28)


def test_model_timing_times_same_shape_convolutions_by_their_own_stride():
    """Three convolutions of one shape with strides 1, 2, 1: the memo of kernel times keyed them by shapes
    alone, so the stride-2 one took the first's time."""
    from chakra_schema.graph import EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
    from replay.model_timing import ModelTiming
    b = GraphBuilder(0, 1)
    cpu = b.resource(ResourceKind.CPU_THREAD, 0, 1)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    shapes = [[32, 64, 56, 56], [64, 64, 3, 3], [], [], [], [], [], [], []]
    kernels = []
    for j, stride in enumerate((1, 2, 1)):
        values = ["", "", "", f"[{stride}, {stride}]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
        op = b.add_node("aten::convolution", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 100.0 * j, 10.0,
                        attrs={"input_shapes": shapes, "input_types": ["c10::BFloat16"] * 2, "input_values": values})
        launch = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, 100.0 * j + 1, 5.0,
                            parent=op)
        k = b.add_node("sm90_xmma_fprop_implicit_gemm_bf16", NodeType.COMP_NODE, OpKind.KERNEL, gpu,
                       100.0 * j + 20, 50.0)
        b.add_dep(launch, k, EdgeKind.LAUNCH)
        kernels.append(k)
    g = b.build()
    d = ModelTiming("h100-sxm").node_durations(g)
    t1, t2, t3 = (float(d[k]) for k in kernels)
    assert t1 == t3 and t2 < 0.5 * t1
