"""Issue 27 items 1-3: model mode from an Execution Trace alone. The op -> kernel rules are pinned to
figures from independent sources: the GEMM / attention dimensions of the shapes, PyTorch's
multi_tensor_apply launch limits (aten/src/ATen/native/cuda/MultiTensorApply.cuh: 65536 elements per
block, 320 blocks and 110 / 64 / 48 / 36 / 30 tensors per launch for 1..5 lists), and the kernels Kineto
recorded for each op of the H100 traces (tests/data/h100)."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from chakra_schema.graph import OpKind
from chakra_schema.inputs import load_graphs
from lumos_sim.replay_run import run_replay
from replay.et_kernels import infer_gpu_work, op_kernels
from replay.hardware.compute import launching_op

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "tests" / "data" / "h100"
BF16 = "Tensor(c10::BFloat16)"


def test_mm_becomes_one_gemm_with_the_shapes_dimensions():
    ks = op_kernels("aten::mm", {"input_shapes": [[8192, 4096], [4096, 11008]], "input_types": [BF16, BF16],
                                 "output_shapes": [[8192, 11008]], "output_types": [BF16]})
    assert len(ks) == 1
    a = ks[0].attrs
    assert (a["op"], a["m"], a["n"], a["k"], a["batch"], a["dtype"]) == ("gemm", 8192, 11008, 4096, 1, "bf16")


def test_bmm_and_addmm_take_batch_and_bias_from_their_arguments():
    bmm = op_kernels("aten::bmm", {"input_shapes": [[12, 128, 64], [12, 64, 256]], "input_types": [BF16, BF16]})[0]
    assert (bmm.attrs["m"], bmm.attrs["n"], bmm.attrs["k"], bmm.attrs["batch"]) == (128, 256, 64, 12)
    addmm = op_kernels("aten::addmm", {"input_shapes": [[1024], [512, 768], [768, 1024]],
                                       "input_types": [BF16, BF16, BF16]})[0]
    assert (addmm.attrs["m"], addmm.attrs["n"], addmm.attrs["k"]) == (512, 1024, 768)


def test_views_and_allocations_launch_nothing():
    assert op_kernels("aten::view", {"input_shapes": [[4, 8]], "input_types": [BF16], "output_shapes": [[32]],
                                     "output_types": [BF16], "outputs_alias_inputs": True}) == []
    assert op_kernels("aten::empty", {"input_shapes": [[4, 8]], "input_types": ["GenericList[Int]"]}) == []
    assert op_kernels("AddBackward0", {"input_shapes": [[4, 8]], "input_types": [BF16]}) == []


def test_elementwise_op_streams_its_inputs_and_outputs():
    k = op_kernels("aten::mul", {"input_shapes": [[1024, 1024], [1024, 1024]], "input_types": [BF16, BF16],
                                 "output_shapes": [[1024, 1024]], "output_types": [BF16]})
    assert len(k) == 1 and k[0].attrs["op"] == "elementwise"
    assert k[0].attrs["bytes"] == 3 * 1024 * 1024 * 2


def test_transposed_or_broadcast_operands_take_the_strided_kernel():
    """TensorIterator vectorizes only over contiguous operands: a transposed view ([4, 2048, 32, 64]
    stored, seen as [4, 32, 2048, 64]: strides 8388608, 128, 4096, 1 as the Llama ET records RoPE's
    slice) or a broadcast operand ([2048, 128] against [4, 32, 2048, 128]) makes the kernel strided."""
    q = [4, 32, 2048, 64]
    view = op_kernels("aten::neg", {"input_shapes": [q], "input_types": [BF16], "input_strides": [[8388608, 128, 4096, 1]],
                                    "output_shapes": [q], "output_types": [BF16], "output_strides": [[4194304, 131072, 64, 1]]})
    assert view[0].attrs.get("strided") is True
    dense = op_kernels("aten::neg", {"input_shapes": [q], "input_types": [BF16], "input_strides": [[4194304, 131072, 64, 1]],
                                     "output_shapes": [q], "output_types": [BF16], "output_strides": [[4194304, 131072, 64, 1]]})
    assert not dense[0].attrs.get("strided")
    bcast = op_kernels("aten::mul", {"input_shapes": [[4, 32, 2048, 128], [2048, 128]], "input_types": [BF16, BF16],
                                     "output_shapes": [[4, 32, 2048, 128]], "output_types": [BF16]})
    assert bcast[0].attrs.get("strided") is True
    # a 0-dim scalar operand does not break vectorization
    scalar = op_kernels("aten::mul", {"input_shapes": [[1024, 1024], []], "input_types": [BF16, "Tensor(float)"],
                                      "output_shapes": [[1024, 1024]], "output_types": [BF16]})
    assert not scalar[0].attrs.get("strided")


def test_softmax_rows_longer_than_shared_memory_are_streamed_once_per_pass():
    """A 32000-wide fp32 row (128 KB) exceeds a block's 48 KiB: the forward reads it 3 times and writes it
    once; log_softmax's backward reads grad twice and the output once and writes once."""
    rows, vocab = 8192, 32000
    fwd = op_kernels("aten::_log_softmax", {"input_shapes": [[rows, vocab], [], []],
                                           "input_types": ["Tensor(float)", "Int", "Bool"],
                                           "output_shapes": [[rows, vocab]], "output_types": ["Tensor(float)"]})
    assert fwd[0].attrs["bytes"] == 4 * rows * vocab * 4
    bwd = op_kernels("aten::_log_softmax_backward_data", {
        "input_shapes": [[rows, vocab], [rows, vocab], [], []], "input_types": ["Tensor(float)"] * 2 + ["Int", "Int"],
        "output_shapes": [[rows, vocab]], "output_types": ["Tensor(float)"]})
    assert bwd[0].attrs["bytes"] == 4 * rows * vocab * 4
    # a 256-wide row fits: read once, written once
    small = op_kernels("aten::_softmax", {"input_shapes": [[rows, 256], [], []], "input_types": ["Tensor(float)", "Int", "Bool"],
                                          "output_shapes": [[rows, 256]], "output_types": ["Tensor(float)"]})
    assert small[0].attrs["bytes"] == 2 * rows * 256 * 4


def test_grouped_query_attention_backward_has_its_helper_passes():
    q, kv = [4, 32, 2048, 128], [4, 8, 2048, 128]
    fwd = op_kernels("aten::_scaled_dot_product_flash_attention", {"input_shapes": [q, kv, kv],
                                                                   "input_types": [BF16] * 3})
    assert len(fwd) == 1
    a = fwd[0].attrs
    assert (a["batch"], a["heads"], a["seq_q"], a["seq_kv"], a["head_dim"], a["kv_heads"]) == (4, 32, 2048, 2048, 128, 8)
    bwd = op_kernels("aten::_cudnn_attention_backward", {"input_shapes": [q, q, kv, kv, q],
                                                          "input_types": [BF16] * 5})
    # main kernel, rowsum(dO*O), dQ conversion, and a head reduction for each of dK and dV (GQA)
    assert len(bwd) == 5 and bwd[0].attrs["backward"] is True


def _foreach(n_tensors: int, numel: int, lists: int = 1):
    shapes = [[[numel]] * n_tensors for _ in range(lists)]
    types = ["GenericList[" + ",".join(["Tensor(float)"] * n_tensors) + "]"] * lists
    return op_kernels("aten::_foreach_mul_", {"input_shapes": shapes, "input_types": types,
                                              "op_schema": "aten::_foreach_mul_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()"})


def test_foreach_launches_follow_multi_tensor_apply_limits():
    # 3 tensors of 4 chunks each: 12 blocks, one launch
    assert len(_foreach(3, 4 * 65536)) == 1
    # 111 small tensors with one list: at most 110 tensors per launch -> 2 launches
    assert len(_foreach(111, 1000)) == 2
    # one tensor of 320 * 65536 + 1 elements: 321 blocks, at most 320 per launch -> 2 launches
    assert len(_foreach(1, 320 * 65536 + 1)) == 2
    # 37 tensors walked through 4 lists: at most 36 tensors per launch -> 2 launches
    assert len(_foreach(37, 1000, lists=4)) == 2
    # bytes: every element read once and written back (in-place), 4 bytes each
    ks = _foreach(3, 4 * 65536)
    assert sum(k.attrs["bytes"] for k in ks) == pytest.approx(3 * 4 * 65536 * 4 * 2)


def _kineto_kernels_per_op(folder: Path) -> tuple[Counter, int]:
    g = load_graphs([], et_pattern=str(folder / "host.0.json.gz"), kineto_pattern=str(folder / "device.0.json.gz"))[0]
    counts: Counter = Counter()
    for i in range(len(g)):
        if int(g.kind[i]) == OpKind.KERNEL and g.is_gpu()[i]:   # memsets apart: not inferred
            h = launching_op(g, i)
            counts[g.name[h] if h >= 0 else "?"] += 1
    return counts, len(g.steps)


@pytest.mark.parametrize("folder", ["llama_b4_s2048", "heldout/llama_d4096_l8_b4_s2048"])
def test_inferred_kernels_per_op_match_what_kineto_recorded(folder):
    """From the ET alone, the kernels of the ops that hold ~95% of the GPU time are those Kineto saw."""
    kineto, steps = _kineto_kernels_per_op(H100 / folder)
    et = load_graphs([], et_pattern=str(H100 / folder / "host.0.json.gz"))[0]
    g, report = infer_gpu_work(et)
    idx = g.index_of_id()
    inferred: Counter = Counter()
    for i in range(len(g)):
        a = g.attrs.get(i) or {}
        if a.get("inferred"):
            inferred[g.name[idx[a["launched_by"]]]] += 1
    et_steps = len(et.steps)
    for op in ("aten::_fused_rms_norm", "aten::_fused_rms_norm_backward", "aten::_cudnn_attention_forward",
               "aten::_cudnn_attention_backward", "aten::silu", "aten::silu_backward", "aten::_log_softmax",
               "aten::_fused_adamw_", "aten::_foreach_mul_", "aten::_foreach_addcdiv_", "aten::_foreach_sqrt",
               # ops whose CUDA implementation calls other ATen ops: index_select runs as its child gather;
               # embedding backward's children (arange, zeros, ...) launch beside its own sort / segment
               # kernels (19 in Kineto, timed here as one pass over the gradient: not counted)
               "aten::index_select", "aten::gather", "aten::zeros", "aten::arange"):
        if kineto[op] or inferred[op]:
            assert inferred[op] / et_steps == pytest.approx(kineto[op] / steps, abs=0.5), op
    # one GEMM kernel per aten::mm (Kineto: the GEMM kernels of aten::mm, split-K reductions aside)
    mm_ops = sum(1 for i in range(len(et)) if et.name[i] == "aten::mm")
    assert inferred["aten::mm"] == mm_ops
    assert not report.uninferred


def test_et_only_model_mode_predicts_a_held_out_step_within_15_percent():
    folder = H100 / "heldout" / "llama_d2048_l16_b2_s8192"
    graphs = load_graphs([], et_pattern=str(folder / "host.0.json.gz"))
    result = run_replay(graphs, "model", "h100-sxm")
    measured = [253.420, 280.217, 254.169]    # the Kineto trace's ProfilerStep spans (ms), withheld here
    assert len(result.steps) == 3 and result.inference
    for s, m in zip(result.steps, measured):
        assert abs(s.predicted_us / 1e3 - m) / m <= 0.15


def test_cpu_gloo_trace_predicts_a_gpu_step_and_says_what_it_inferred():
    pattern = str(ROOT / "tests" / "data" / "cpu_ddp" / "host.{rank}.json.gz")
    result = run_replay(load_graphs([], et_pattern=pattern), "model", "h100-sxm")
    assert [r for r, _ in result.inference] == [0, 1]
    rep = result.inference[0][1]
    assert rep.cpu_trace and rep.collectives_moved > 0 and rep.kernels > 0
    assert rep.kernels_by_class["gemm"] > 0 and rep.kernels_by_class["attention"] > 0
    text = "\n".join(rep.lines())
    assert "ran on the CPU" in text and "NCCL" in text
    assert all(s.predicted_us > 0 for s in result.steps)
    # on the GPU the step is shorter than on the CPU it was recorded on
    cpu = run_replay(load_graphs([], et_pattern=pattern,
                                 kineto_pattern=str(ROOT / "tests" / "data" / "cpu_ddp" / "device.{rank}.json.gz")))
    assert result.step_time_us < cpu.step_time_us


def test_multi_tensor_apply_launches_are_timed_in_whole_waves_of_ctas():
    """320 chunks (CTAs) on H100's 132 SMs: the SMs holding 3 chunks set the time, 3 * 132 / 320 = 1.2375x
    the bandwidth time; 64 chunks (fewer than the SMs) are not scaled."""
    from replay.hardware.compute import OpEstimate
    from replay.model_timing import _wave_quantized
    est = OpEstimate(time_us=100.0, compute_us=0.0, memory_us=100.0, bound="memory", flops=0.0, bytes=3e8)
    assert _wave_quantized(est, {"blocks": 320}, 132).time_us == pytest.approx(123.75)
    assert _wave_quantized(est, {"blocks": 64}, 132).time_us == pytest.approx(100.0)
    ks = _foreach(40, 4 * 65536)   # 160 chunks, under the 320-chunk and tensor limits: one launch
    assert [k.attrs["blocks"] for k in ks] == [160]


def test_convolutions_become_implicit_gemms_with_the_forward_multiply_adds():
    # ResNet-50's stem: 32 x 3 x 224 x 224 input, 64 filters of 3 x 7 x 7, stride 2 -> 32 x 64 x 112 x 112
    x, w, y = [32, 3, 224, 224], [64, 3, 7, 7], [32, 64, 112, 112]
    fwd = op_kernels("aten::cudnn_convolution", {
        "input_shapes": [x, w, [], [], [], [], [], [], []],
        "input_types": ["Tensor(float)", "Tensor(float)"] + ["GenericList[Int]"] * 3 + ["Int"] + ["Bool"] * 3,
        "output_shapes": [y], "output_types": ["Tensor(float)"]})
    macs = 32 * 112 * 112 * 64 * 3 * 7 * 7          # output pixels x filters x window
    [k] = fwd
    a = k.attrs
    assert a["op"] == "gemm" and a["m"] * a["n"] * a["k"] * a["batch"] == macs
    assert a["dtype"] == "tf32"                     # cudnn.allow_tf32 is on by default
    # the backward: input gradient not wanted for the stem (its input is data), weight and bias gradients are
    bwd = op_kernels("aten::convolution_backward", {
        "input_shapes": [y, x, w, [], [], [], [], [], [], [], []],
        "input_types": ["Tensor(float)"] * 3 + ["GenericList[Int]"] * 4 + ["Bool", "GenericList[Int]", "Int",
                                                                           "GenericList[Bool]"],
        "output_shapes": [[], w, [64]], "output_types": ["Tensor(float)"] * 3})
    assert [s.name for s in bwd] == ["conv_wgrad", "conv_bgrad"]
    wg = bwd[0].attrs
    assert wg["m"] * wg["n"] * wg["k"] == macs
    assert bwd[1].attrs["bytes"] == 32 * 64 * 112 * 112 * 4      # grad_output read once for the bias sum


def test_grouped_convolution_splits_the_gemm_per_group():
    # a depthwise 3 x 3 over 256 channels (groups = 256): one tiny GEMM per channel
    x, w, y = [8, 256, 56, 56], [256, 1, 3, 3], [8, 256, 56, 56]
    [k] = op_kernels("aten::cudnn_convolution", {"input_shapes": [x, w], "input_types": ["Tensor(c10::BFloat16)"] * 2,
                                                 "output_shapes": [y], "output_types": ["Tensor(c10::BFloat16)"]})
    assert (k.attrs["batch"], k.attrs["m"], k.attrs["n"], k.attrs["k"]) == (256, 8 * 56 * 56, 1, 9)


def test_a_converted_cpu_trace_pair_is_predicted_like_the_raw_pair(tmp_path):
    """A CPU run's ET + Kineto pair converted to .et and replayed in model mode infers the GPU kernels, as
    the raw pair does: the .et reader puts the file's path in metadata["source"], which used to hide that
    the graph came from a Kineto trace, so the CPU's own op times (the arithmetic done on the CPU) were
    replayed as if they were a GPU run's host times."""
    from chakra_schema.pytorch.converter import convert
    folder = ROOT / "tests" / "data" / "cpu_models" / "cnn"
    et, kin = str(folder / "host.{rank}.json.gz"), str(folder / "device.{rank}.json.gz")
    convert(et, kin, str(tmp_path / "cnn"))
    raw = run_replay(load_graphs([], et_pattern=et, kineto_pattern=kin), "model", "h100-sxm")
    converted = run_replay(load_graphs([str(tmp_path / "cnn")]), "model", "h100-sxm")
    assert raw.inference and converted.inference and converted.inference[0][1].cpu_trace
    assert converted.step_time_us == pytest.approx(raw.step_time_us, rel=1e-9)
    recorded = run_replay(load_graphs([str(tmp_path / "cnn")]))     # the CPU run's own step
    assert converted.step_time_us < recorded.step_time_us


def test_an_et_file_written_through_the_api_keeps_the_trace_origin(tmp_path):
    """kineto_to_graph -> graph_io.write_graphs -> read_graph: the .et keeps that the graph came from a
    Kineto trace (metadata["source"] becomes the file's path on reading, so the writer stores the origin)."""
    from chakra_schema.graph_io import read_graph, write_graphs
    from chakra_schema.pytorch.kineto import load_kineto
    from chakra_schema.pytorch.kineto_graph import kineto_to_graph
    g = kineto_to_graph(load_kineto(str(ROOT / "tests" / "data" / "cpu_models" / "cnn" / "device.0.json.gz")))
    paths = write_graphs([g], tmp_path / "cnn")
    back = read_graph(paths[0])
    assert g.trace_origin == back.trace_origin == "kineto" and back.metadata["source"] == str(paths[0])
