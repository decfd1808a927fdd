"""Model mode on CPU runs of small models (tests/data/cpu_models, collected by examples/collect_cpu_models.py
with PyTorch 2.13 on the CPU): every GEMM, convolution, attention and norm of the run becomes its CUDA
kernel although the CPU kernels call helper ops of their own (addmm copies its bias, mkldnn convolutions
restride, attention and layer-norm backward zero their accumulators); torch.compile's out= GEMMs are
GEMMs, its fused kernels are said to be missing; an ET's empty closing ProfilerStep is no step; a CPU
run's Kineto trace adds nothing a GPU prediction could use, so model mode infers from its ops as from
the ET alone. The expected kernel counts follow from each model's layers (formulas below)."""
from __future__ import annotations

from pathlib import Path

import pytest

from chakra_schema.inputs import load_graphs
from lumos_sim.replay_run import run_replay
from replay.et_kernels import infer_gpu_work

DATA = Path(__file__).resolve().parent / "data" / "cpu_models"
STEPS = 3   # profiled steps in each trace


def _inferred(model: str):
    graph = load_graphs([], et_pattern=str(DATA / model / "host.0.json.gz"))[0]
    return infer_gpu_work(graph)


def test_transformer_keeps_every_linear_attention_and_norm_kernel():
    _, rep = _inferred("transformer")
    blocks, linears = 2, 4            # qkv, proj, fc1, fc2 per block
    # forward + data grad + weight grad of every Linear (each one's input needs a gradient: LayerNorm
    # weights or the residual stream sit before all of them)
    assert rep.kernels_by_class["gemm"] == STEPS * blocks * linears * 3
    # SDPA: one forward kernel; the backward kernel and its two passes over Q-sized tensors
    assert rep.kernels_by_class["attention"] == STEPS * blocks * (1 + 3)
    # LayerNorm: one forward kernel, two backward (input grad, weight grad); two norms per block
    assert rep.kernels_by_class["norm"] == STEPS * blocks * 2 * (1 + 2)
    assert not rep.uninferred


def test_cnn_keeps_its_convolutions_and_its_linear_head():
    _, rep = _inferred("cnn")
    # conv1 forward + weight grad (the image needs no gradient), conv2 forward + data + weight grad,
    # the Linear head forward + data + weight grad
    assert rep.kernels_by_class["gemm"] == STEPS * (2 + 3 + 3)


def test_foreach_optimizer_ops_replace_their_per_tensor_cpu_loops():
    """AdamW(foreach=True) on the CPU loops each _foreach_ op over the tensors (add_, mul_, ... children); a
    CUDA run launches multi_tensor_apply kernels instead, so no per-tensor elementwise kernel is left."""
    graph, _ = _inferred("transformer")
    names = {int(graph.node_id[i]): graph.name[i] for i in range(len(graph))}
    source = load_graphs([], et_pattern=str(DATA / "transformer" / "host.0.json.gz"))[0]
    parent_name = {int(source.node_id[i]): source.name[int(source.parent[i])] if source.parent[i] >= 0 else ""
                   for i in range(len(source))}
    launched_under_foreach = [a for a in graph.attrs.values() if a.get("inferred") and a.get("op") != "optimizer"
                              and parent_name.get(a.get("launched_by"), "").startswith("aten::_foreach_")]
    assert not launched_under_foreach
    assert any(n.startswith("aten::_foreach_") for n in names.values())


def test_compiled_graphs_keep_their_out_gemms_and_say_their_fused_kernels_are_unknown():
    _, rep = _inferred("compiled")
    # fc1, fc2 forward (addmm.out) and fc2 data + weight grad, fc1 weight grad (mm.out; the input needs none)
    assert rep.kernels_by_class["gemm"] == STEPS * (2 + 3)
    assert rep.compiled_regions == STEPS * 2          # one forward and one backward graph per step
    text = "\n".join(rep.lines())
    assert "torch.compile graph calls" in text and "every operator's kernels were inferred" not in text


def test_an_empty_profiler_step_is_not_a_step():
    graph = load_graphs([], et_pattern=str(DATA / "manual_et" / "host.0.json.gz"))[0]
    assert [s.name for s in graph.steps] == [f"ProfilerStep#{i}" for i in range(6)]
    assert graph.metadata["empty_steps_dropped"] == ["ProfilerStep#6"]
    result = run_replay([graph], "model", "h100-sxm")
    times = [s.predicted_us for s in result.steps]
    assert min(times) > 0 and max(times) == pytest.approx(min(times), rel=1e-6)
    assert result.inference[0][1].new_gemm_shapes == 0   # every step runs every GEMM shape


def test_model_mode_on_a_cpu_kineto_trace_predicts_from_its_ops():
    """The CPU run's Kineto trace records CPU op times, not what an H100 would take: model mode infers the
    kernels from the linked ops as from the ET alone, and reports no measured-vs-predicted error."""
    et = str(DATA / "cnn" / "host.0.json.gz")
    both = run_replay(load_graphs([str(DATA / "cnn" / "device.0.json.gz")], et_pattern=et), "model", "h100-sxm")
    alone = run_replay(load_graphs([], et_pattern=et), "model", "h100-sxm")
    assert both.inference and both.inference[0][1].kernels_by_class["gemm"] == STEPS * 8
    assert both.step_time_us == pytest.approx(alone.step_time_us, rel=1e-9)
    assert all(s.error is None for s in both.steps)


@pytest.mark.parametrize("model", ["transformer", "cnn"])
def test_cpu_helper_ops_under_a_gemm_conv_attention_or_norm_launch_nothing(model):
    """On the CPU, addmm copies its bias into the output, mkldnn convolutions restride, attention and
    layer-norm backward zero their accumulators: a CUDA run does that inside the op's own kernels (the
    cuBLAS epilogue, the backward's own passes), so in a CPU trace no kernel-launching op sits under
    another one."""
    graph = load_graphs([], et_pattern=str(DATA / model / "host.0.json.gz"))[0]
    inferred, _ = infer_gpu_work(graph)
    row = {int(graph.node_id[i]): i for i in range(len(graph))}
    launchers = {row[a["launched_by"]] for a in inferred.attrs.values() if a.get("inferred")}

    def launching_ancestor(i: int) -> str:
        p = int(graph.parent[i])
        while p >= 0 and p not in launchers:
            p = int(graph.parent[p])
        return graph.name[p] if p >= 0 else ""

    nested = [(graph.name[i], launching_ancestor(i)) for i in launchers if launching_ancestor(i)]
    assert launchers and not nested


def test_a_cpu_kineto_trace_without_its_et_is_refused_in_model_mode():
    from chakra_schema.errors import TraceInputError
    with pytest.raises(TraceInputError, match="add the ET"):
        run_replay(load_graphs([str(DATA / "cnn" / "device.0.json.gz")]), "model", "h100-sxm")
