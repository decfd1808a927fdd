"""A copy call that waits for its copy (cudaMemcpy, or cudaMemcpyAsync to pageable host memory, which the
driver runs synchronously) holds the host until the GPU has run everything queued before the copy. Replayed
on a faster GPU, that wait shrinks: the host goes on when the copy is done, not after the recorded wait.

The synthetic trace: one Python op launches a 1,000 us kernel, then copies its 4-byte result to the host
(the `.item()` pattern); the copy call returns 3 us after the copy, so the host waited ~1,000 us in it;
then 50 us of host work follow. With kernels twice as fast the step is 500 us shorter; with the recorded
durations it is exactly as recorded."""
from __future__ import annotations

import json

import numpy as np
import pytest

from chakra_schema.graph import EdgeKind
from chakra_schema.pytorch.kineto import load_kineto
from chakra_schema.pytorch.kineto_graph import kineto_to_graph
from replay.engine import simulate
from replay.trace_timing import TraceTiming

KERNEL_US = 1000.0


def _events(copy_call: str = "cudaMemcpyAsync", returns_after_copy: bool = True,
            copy_name: str = "Memcpy DtoH (Device -> Pageable)"):
    t0 = 10_000
    copy_start = t0 + 12 + KERNEL_US
    call_end = copy_start + 2 + 3 if returns_after_copy else t0 + 20
    step_end = call_end + 50
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t0,
         "dur": step_end - t0, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": t0 + 1, "dur": 8, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 2,
         "dur": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "mul_kernel", "pid": 0, "tid": 7, "ts": t0 + 10, "dur": KERNEL_US,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "pid": 1, "tid": 1, "ts": t0 + 14,
         "dur": call_end + 1 - (t0 + 14), "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": copy_call, "pid": 1, "tid": 1, "ts": t0 + 15,
         "dur": call_end - (t0 + 15), "args": {"correlation": 2}},
        {"ph": "X", "cat": "gpu_memcpy", "name": copy_name, "pid": 0, "tid": 7,
         "ts": copy_start, "dur": 2, "args": {"device": 0, "stream": 7, "correlation": 2}},
    ]


class _FasterKernels(TraceTiming):
    """Recorded durations, except kernels (not copies) run `factor` times faster."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def node_durations(self, graph):
        d = super().node_durations(graph)
        kernel = np.array([n == "mul_kernel" for n in graph.name])
        d[kernel] /= self.factor
        return d


def _graph(tmp_path, **kw):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _events(**kw)}))
    return kineto_to_graph(load_kineto(path))


def _step(g, timing) -> float:
    run = simulate([g], timing)
    return float(run.end.max() - run.start.min())


def _host_resumes(g, timing) -> float:
    """When the host comes out of the `.item()` op, from the start of the replay."""
    run = simulate([g], timing)
    return float(run.end[list(g.name).index("aten::_local_scalar_dense")] - run.start.min())


def _sync_edges(g) -> list[tuple[int, int]]:
    dst = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
    return [(int(s), int(d)) for s, d, k in zip(g.dep_src, dst, g.dep_kind) if k == EdgeKind.SYNC]


@pytest.mark.parametrize("call,copy", [
    ("cudaMemcpyAsync", "Memcpy DtoH (Device -> Pageable)"),     # pageable host memory: run synchronously
    ("hipMemcpyAsync", "Memcpy HtoD (Pageable -> Device)"),
    ("cudaMemcpy", "Memcpy DtoH (Device -> Pinned)"),             # the synchronous API
    ("cuMemcpyDtoH_v2", "Memcpy DtoH (Device -> Pinned)"),
])
def test_a_blocking_copy_call_that_returned_after_its_copy_waits_for_it(tmp_path, call, copy):
    g = _graph(tmp_path, copy_call=call, copy_name=copy)
    assert _sync_edges(g) == [(list(g.name).index(copy), list(g.name).index(call))]


@pytest.mark.parametrize("copy", ["Memcpy DtoD (Device -> Device)", "Memcpy DtoH (Device -> Pinned)"])
def test_an_asynchronous_copy_that_finished_inside_its_call_is_no_wait(tmp_path, copy):
    # an idle GPU ran a short asynchronous copy before the call returned: the host never waited for it
    g = _graph(tmp_path, copy_call="cudaMemcpyAsync", copy_name=copy)
    assert _sync_edges(g) == []
    assert _host_resumes(g, _FasterKernels(0.5)) == pytest.approx(_host_resumes(g, TraceTiming()), abs=1e-6)


def test_a_faster_gpu_shortens_the_host_wait_in_a_blocking_copy(tmp_path):
    g = _graph(tmp_path)
    recorded = _step(g, TraceTiming())
    assert recorded == pytest.approx(KERNEL_US + 12 + 5 + 50, abs=1e-6)   # as recorded
    assert recorded - _step(g, _FasterKernels(2.0)) == pytest.approx(KERNEL_US / 2, abs=1.0)
    assert _host_resumes(g, TraceTiming()) - _host_resumes(g, _FasterKernels(2.0)) == pytest.approx(KERNEL_US / 2,
                                                                                                      abs=1.0)


def test_an_asynchronous_copy_that_returned_before_its_copy_adds_no_wait(tmp_path):
    g = _graph(tmp_path, returns_after_copy=False)
    assert not any(k == EdgeKind.SYNC for k in g.dep_kind)
    # the host never waited for the GPU: it comes out of the op when it did, whatever the kernel's speed
    assert _host_resumes(g, _FasterKernels(2.0)) == pytest.approx(_host_resumes(g, TraceTiming()), abs=1e-6)
