"""Trace-based what-if: layer subgraphs duplicated / dropped from module annotations, DP collectives
re-timed for a new group size, hardware changed; on a synthetic annotated trace and on real traces."""
from __future__ import annotations

import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType, EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
from estimators.trace.evaluate import change_layers, dp_collectives, find_layers, whatif_trace
from conftest import require_shared

LAYERS = 4
FWD_K, BWD_K = 100.0, 200.0     # kernel durations (us)


def annotated_trace(layers: int = LAYERS):
    """One training step as PyTorch records it: ProfilerStep > nn.Module: Model > nn.Module: Layer.i >
    aten::linear > cudaLaunchKernel -> kernel; then the autograd backward ops (same sequence numbers)
    launching backward kernels; a gradient all-reduce; a cudaDeviceSynchronize at the end."""
    b = GraphBuilder(0, 8)
    th = b.resource(ResourceKind.CPU_THREAD, 1, 1, "main")
    bw = b.resource(ResourceKind.CPU_THREAD, 1, 2, "autograd")
    gs = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    cs = b.resource(ResourceKind.GPU_STREAM, 0, 20)
    t = 0.0
    cpu_op = lambda name, res, s, d, parent=-1, attrs=None: b.add_node(name, NodeType.COMP_NODE, OpKind.CPU_OP, res, s, d, parent, attrs=attrs)  # noqa: E731
    total = layers * 30.0 + 20
    step = b.add_node("ProfilerStep#1", NodeType.COMP_NODE, OpKind.ANNOTATION, th, 0.0, 0.0)
    model = b.add_node("nn.Module: Model", NodeType.COMP_NODE, OpKind.ANNOTATION, th, 5.0, total - 10, step)
    gpu_t = 20.0
    kernels = []
    t = 10.0
    for i in range(layers):
        lay = b.add_node(f"nn.Module: Layer.{i}", NodeType.COMP_NODE, OpKind.ANNOTATION, th, t, 25.0, model)
        op = cpu_op("aten::linear", th, t + 2, 20.0, lay, {"seq_id": 100 + i})
        ln = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, th, t + 5, 5.0, op)
        k = b.add_node("ampere_gemm_fwd", NodeType.COMP_NODE, OpKind.KERNEL, gs, gpu_t, FWD_K)
        b.add_dep(ln, k, EdgeKind.LAUNCH)
        if kernels:
            b.add_dep(kernels[-1], k, EdgeKind.STREAM_ORDER)
        kernels.append(k)
        gpu_t += FWD_K
        t += 30.0
    bt = t + 5
    for i in reversed(range(layers)):
        op = cpu_op("autograd::engine::evaluate_function: AddmmBackward0", bw, bt, 20.0, -1, {"seq_id": 100 + i})
        ln = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, bw, bt + 5, 5.0, op)
        k = b.add_node("ampere_gemm_bwd", NodeType.COMP_NODE, OpKind.KERNEL, gs, gpu_t, BWD_K)
        b.add_dep(ln, k, EdgeKind.LAUNCH)
        b.add_dep(kernels[-1], k, EdgeKind.STREAM_ORDER)
        kernels.append(k)
        gpu_t += BWD_K
        bt += 30.0
    ln = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, bw, bt, 5.0)
    ar = b.add_node("ncclKernel_AllReduce_RING_LL_Sum_float", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, cs,
                    gpu_t, 500.0, attrs={"comm_type": int(CommType.ALL_REDUCE), "comm_size": 64 << 20,
                                         "pg_ranks": list(range(8)), "pg_name": "0"})
    b.add_dep(ln, ar, EdgeKind.LAUNCH)
    b.add_dep(kernels[-1], ar, EdgeKind.DATA)
    sync = b.add_node("cudaDeviceSynchronize", NodeType.COMP_NODE, OpKind.SYNC, th, bt + 10, gpu_t + 500 - bt - 10 + 5)
    b.add_dep(ar, sync, EdgeKind.SYNC)
    end = bt + 10 + gpu_t + 500 - bt - 10 + 5 + 5
    b.graph_step_end = end
    g0 = b.build()
    # set the ProfilerStep duration to span everything (rebuild with the right duration)
    g0.duration_us[step] = end
    g0.steps.append(__import__("chakra_schema.graph", fromlist=["Step"]).Step("ProfilerStep#1", step, 0.0, end))
    return g0


def test_layers_are_found_with_their_backward():
    g = annotated_trace()
    blocks = find_layers(g)
    assert [b.index for b in blocks] == list(range(LAYERS))
    assert all(len(b.segments) == 2 for b in blocks)
    names = {g.name[i] for i in blocks[1].segments[1]}
    assert "ampere_gemm_bwd" in names and "autograd::engine::evaluate_function: AddmmBackward0" in names


@pytest.mark.parametrize("new", [6, 2, 1])
def test_changing_layers_adds_or_removes_exactly_their_gpu_time(new):
    g = annotated_trace()
    g2, what = change_layers(g, new)
    assert not g2.validate()
    assert len(find_layers(g2)) == new or new > LAYERS  # copies carry the template's annotation name
    res = whatif_trace([g], layers=new)
    delta = (new - LAYERS) * (FWD_K + BWD_K)
    assert res.step_us - res.baseline_step_us == pytest.approx(delta, rel=0.02, abs=5.0)


def test_layers_without_annotations_is_a_one_line_error():
    b = GraphBuilder(0, 1)
    r = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    b.add_node("k", NodeType.COMP_NODE, OpKind.KERNEL, r, 0, 10)
    with pytest.raises(TraceInputError) as e:
        change_layers(b.build(), 3)
    assert "layer" in str(e.value) and "\n" not in str(e.value)


def test_dp_change_retimes_the_allreduce_with_the_network_model():
    g = annotated_trace()
    idx, old = dp_collectives(g)
    assert old == 8 and len(idx) == 1
    same = whatif_trace([g], dp=8, source_hardware="a100-sxm")
    assert same.step_us == pytest.approx(same.baseline_step_us, rel=1e-6)
    big = whatif_trace([g], dp=64, source_hardware="a100-sxm")     # 8 nodes instead of one: slower
    small = whatif_trace([g], dp=2, source_hardware="a100-sxm")
    assert big.step_us > same.step_us > small.step_us


def test_dp_whatif_on_a_real_trace():
    from chakra_schema.inputs import load_graphs
    path = require_shared("traces", "hta", "nccl_parser_config_nccl_data.json.gz")
    g = load_graphs([str(path)])[0]
    idx, old = dp_collectives(g)
    assert old == 2 and len(idx) > 0
    res = whatif_trace([g], dp=32, source_hardware="a100-sxm-40gb")
    # 2 GPUs on one node -> 32 on 4 nodes over the NICs: every gradient all-reduce takes longer ...
    assert (res.result.run.durations[idx] > g.duration_us[idx] * 1.5).all()
    # ... but this trace is CPU-bound (its critical path is host code), so the step barely moves
    assert res.baseline_step_us <= res.step_us <= res.baseline_step_us * 1.05
    hw = whatif_trace([g], hardware="h100-sxm", source_hardware="a100-sxm-40gb")
    assert hw.step_us <= hw.baseline_step_us * 1.001


def test_cli_trace_without_layer_annotations_exits_2_with_one_line():
    import subprocess
    import sys
    path = require_shared("traces", "hta", "nccl_parser_config_nccl_data.json.gz")
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "trace", str(path), "--layers", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "layer" in p.stderr
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "trace", str(path), "--dp", "16",
                        "--source-hardware", "a100-sxm-40gb", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import json
    d = json.loads(p.stdout)
    assert d["step_time_s"] >= d["baseline_step_time_s"] and "dp" in d["change"]
