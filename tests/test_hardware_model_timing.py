"""Model-based timing sources: ModelTiming (`--timing model`) and TranslatedTiming (`--hardware`)."""
from __future__ import annotations

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType, EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
from replay.hardware import ComputeModel, NetworkModel, get_hardware, peak_ratio
from replay.model_timing import ModelTiming, TranslatedTiming, kernel_class, node_classes, source_hardware

GEMM_KERNEL = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x32_stage3_warpsize2x2x1_tensor16x8x16_kernel"
ADD_KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >()"


def _graph(device_name: str | None = "NVIDIA A100-SXM4-40GB"):
    b = GraphBuilder(rank=0, world_size=8)
    cpu = b.resource(ResourceKind.CPU_THREAD, 1, 1)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    op = b.add_node("aten::addmm", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 0, 30,
                    attrs={"input_shapes": [[4096], [4096, 4096], [4096, 4096], [], []],
                           "input_types": ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"]})
    launch = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, 5, 5, parent=op)
    k = b.add_node(GEMM_KERNEL, NodeType.COMP_NODE, OpKind.KERNEL, gpu, 40, 600.0)
    b.add_dep(launch, k, EdgeKind.LAUNCH)
    add = b.add_node(ADD_KERNEL, NodeType.COMP_NODE, OpKind.KERNEL, gpu, 700, 50.0)
    b.add_dep(k, add, EdgeKind.STREAM_ORDER)
    coll = b.add_node("ncclKernel_AllReduce_RING_LL_Sum_bfloat16", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, gpu,
                      800, 9000.0, attrs={"comm_type": int(CommType.ALL_REDUCE), "comm_size": 1 << 30,
                                          "pg_ranks": list(range(8)), "pg_name": "0"})
    send = b.add_node("ncclKernel_SendRecv", NodeType.COMM_SEND_NODE, OpKind.SEND, gpu, 20000, 300.0,
                      attrs={"comm_size": 1 << 20, "comm_dst": 8})
    gen = b.add_node("generated_gemm", NodeType.COMP_NODE, OpKind.KERNEL, gpu, 21000, 1.0,
                     attrs={"op": "gemm", "m": 2048, "n": 2048, "k": 2048, "dtype": "bf16", "flops": 2 * 2048**3})
    if device_name:
        b.metadata["deviceProperties"] = [{"name": device_name}]
    return b.build(), dict(op=op, launch=launch, k=k, add=add, coll=coll, send=send, gen=gen)


def test_model_timing_retimes_gpu_work_and_keeps_host_time():
    g, ix = _graph()
    mt = ModelTiming("h100-sxm-roofline")
    d = mt.node_durations(g)
    h100 = ComputeModel("h100-sxm-roofline")
    assert d[ix["op"]] == 30 and d[ix["launch"]] == 5          # CPU op and launch call keep theirs
    assert d[ix["k"]] == pytest.approx(h100.gemm(4096, 4096, 4096, dtype="bf16").time_us)
    # no host shapes for the add kernel: recorded x memory-bandwidth ratio of A100 -> H100
    a100 = get_hardware("a100-sxm-40gb")
    assert d[ix["add"]] == pytest.approx(50.0 * peak_ratio(a100, get_hardware("h100-sxm-roofline"), "elementwise"))
    net = NetworkModel("h100-sxm-roofline")
    assert d[ix["coll"]] == pytest.approx(net.collective_us(CommType.ALL_REDUCE, 1 << 30, range(8)))
    assert d[ix["send"]] == pytest.approx(net.p2p_us(1 << 20, 0, 8))
    assert d[ix["gen"]] == pytest.approx(h100.gemm(2048, 2048, 2048).time_us)


def test_model_timing_collective_uses_group_ranks():
    g, ix = _graph()
    mt = ModelTiming("h100-sxm-roofline")
    net = NetworkModel("h100-sxm-roofline")
    t = mt.collective_us(g, ix["coll"], list(range(16)), [9000.0, 8000.0])
    assert t == pytest.approx(net.collective_us(CommType.ALL_REDUCE, 1 << 30, range(16)))


def test_model_timing_launch_latency_from_preset():
    g, ix = _graph()
    lat = ModelTiming("h100-sxm-roofline").launch_latency_us(g)
    after = get_hardware("h100-sxm-roofline").gpu.kernel_start_after_call_us
    assert lat[ix["k"]] == pytest.approx(after - 5.0)  # the 5 us call already elapsed
    assert lat[ix["add"]] == 0 and lat[ix["op"]] == 0


def test_translated_timing_scales_by_model_ratio():
    g, ix = _graph()
    tt = TranslatedTiming("a100-sxm-40gb", "h100-sxm-roofline")
    d = tt.node_durations(g)
    a = ComputeModel("a100-sxm-40gb").gemm(4096, 4096, 4096).time_us
    h = ComputeModel("h100-sxm-roofline").gemm(4096, 4096, 4096).time_us
    assert d[ix["k"]] == pytest.approx(600.0 * h / a)
    assert d[ix["add"]] == pytest.approx(50.0 * peak_ratio(get_hardware("a100-sxm-40gb"), get_hardware("h100-sxm-roofline"),
                                                            "elementwise"))
    assert d[ix["op"]] == 30 and d[ix["launch"]] == 5
    assert d[ix["coll"]] == pytest.approx(NetworkModel("h100-sxm-roofline").collective_us(CommType.ALL_REDUCE, 1 << 30, range(8)))
    # translating to the same GPU keeps recorded compute durations
    same = TranslatedTiming("a100-sxm-40gb", "a100-sxm-40gb").node_durations(g)
    assert same[ix["k"]] == pytest.approx(600.0) and same[ix["add"]] == pytest.approx(50.0)


def test_translated_timing_guesses_source_from_metadata_or_refuses():
    g, _ = _graph("NVIDIA A100-SXM4-40GB")
    assert source_hardware(g).name == "a100-sxm-40gb"
    TranslatedTiming(None, "h100-sxm-roofline").node_durations(g)
    g2, _ = _graph(None)
    with pytest.raises(TraceInputError, match="cannot tell which GPU"):
        TranslatedTiming(None, "h100-sxm-roofline").node_durations(g2)


def test_replay_on_other_hardware_names_the_device_no_preset_matches():
    from replay.api import make_timing
    g, _ = _graph("AMD Instinct MI300X VF")
    with pytest.raises(TraceInputError, match="records 'AMD Instinct MI300X VF', which no hardware preset "
                                              "matches; pass --source-hardware NAME"):
        make_timing("trace", "h100-sxm", None, [g])
    g2, _ = _graph(None)
    with pytest.raises(TraceInputError, match="names no GPU"):
        make_timing("trace", "h100-sxm", None, [g2])


def test_node_classes_and_kernel_class():
    g, ix = _graph()
    cls = node_classes(g)
    assert cls[ix["op"]] == "cpu" and cls[ix["launch"]] == "cpu"
    assert cls[ix["k"]] == "gemm" and cls[ix["add"]] == "elementwise" and cls[ix["coll"]] == "communication"
    assert cls[ix["gen"]] == "gemm"
    assert kernel_class(GEMM_KERNEL) == "gemm"


def test_model_timing_on_real_a100_trace(shared_traces):
    from chakra_schema.pytorch.kineto import load_kineto
    from chakra_schema.pytorch.kineto_graph import kineto_to_graph
    g = kineto_to_graph(load_kineto(shared_traces / "hta" / "trace_diff_control_control.json.gz"))
    cls = node_classes(g)
    mt = ModelTiming("a100-sxm-40gb", source_hw="a100-sxm-40gb")
    d = mt.node_durations(g)
    assert np.all(np.isfinite(d)) and np.all(d >= 0)
    gemm = [i for i, c in enumerate(cls) if c == "gemm"]
    estimated = sum(mt._estimate(mt.compute, g, i) is not None for i in gemm)
    assert len(gemm) > 1000 and estimated / len(gemm) > 0.9       # shapes found through the launch edge
    cpu = np.array([c == "cpu" for c in cls])
    assert np.array_equal(d[cpu], g.duration_us[cpu])
    # the model's total GEMM time is the recorded one within a factor of 2 on this trace
    rec, mod = g.duration_us[gemm].sum(), d[gemm].sum()
    assert 0.5 < mod / rec < 2.0
    # moved to H100 the GPU work gets shorter, host work does not change
    t = TranslatedTiming("a100-sxm-40gb", "h100-sxm-roofline").node_durations(g)
    gpu = g.is_gpu() & ~np.isin(g.kind, [int(OpKind.COLLECTIVE), int(OpKind.SEND), int(OpKind.RECV)])
    assert t[gpu].sum() < 0.8 * g.duration_us[gpu].sum()
    assert np.array_equal(t[cpu], g.duration_us[cpu])
    assert np.array_equal(d, ModelTiming("a100-sxm-40gb", source_hw="a100-sxm-40gb").node_durations(g))
