"""Quirks of traces other tools wrote, found by replaying public traces (an early Chakra converter's output,
ASTRA-sim's hand-built workloads, rank sets mixed up from two runs):
- a ProfilerStep annotation that recorded no duration spans until the next step (the last: to the end);
- communication a trace records no duration for (a workload written for a network simulator) is timed by
  the network model, not as 0 us, with a warning;
- rank files of different runs (different recorded world sizes) are refused naming both files;
- a rank set with gaps is replayed with a warning naming the ranks not given."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from chakra_schema.graph import CommType, GraphBuilder, NodeType, OpKind, ResourceKind
from lumos_sim.cli import main
from replay.api import make_timing, replay
from replay.hardware.network import NetworkModel

DATA = Path(__file__).parent / "data"
MiB = 1 << 20


def _graph(rank: int, world: int, step_duration: float, comm_duration: float, with_step: bool = True):
    """A CPU op of 100 us, then a 1 MiB all-reduce over the world on a GPU stream, then 50 us of GPU work:
    under a ProfilerStep annotation of `step_duration` that parents the CPU op."""
    b = GraphBuilder(rank, world)
    cpu = b.resource(ResourceKind.CPU_THREAD, 0, 1)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    comm = b.resource(ResourceKind.GPU_STREAM, 0, 20)
    step = -1
    if with_step:
        step = b.add_node("ProfilerStep#1", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 0.0, step_duration)
        b.add_step("ProfilerStep#1", step, 0.0, step_duration)
    op = b.add_node("aten::work", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 0.0, 100.0, parent=step)
    ar = b.add_node("nccl:all_reduce", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, comm, 100.0, comm_duration,
                    attrs={"comm_type": int(CommType.ALL_REDUCE), "comm_size": MiB, "pg_name": "world",
                           "pg_ranks": list(range(world))})
    b.add_dep(op, ar)
    k = b.add_node("gemm_kernel", NodeType.COMP_NODE, OpKind.KERNEL, gpu, 100.0 + comm_duration, 50.0)
    b.add_dep(ar, k)
    return b.build()


def test_a_step_annotation_without_duration_spans_the_work_after_it(caplog):
    """Chakra's early converter wrote ProfilerStep nodes with duration 0: the step was reported as 0 ms.
    Here the step holds 100 us of CPU work, a 10 us all-reduce and 50 us of GPU work: 160 us."""
    with caplog.at_level(logging.WARNING):
        res = replay([_graph(0, 1, 0.0, 10.0)])
    assert [s.predicted_us for s in res.steps] == pytest.approx([160.0])
    assert "ProfilerStep#1 records no duration" in caplog.text
    recorded = replay([_graph(0, 1, 160.0, 10.0)])   # a recorded span is the step, as before
    assert [s.predicted_us for s in recorded.steps] == pytest.approx([160.0])
    assert recorded.steps[0].measured_us == 160.0


def test_communication_without_a_recorded_duration_is_timed_by_the_network_model(caplog):
    """Two ranks whose 1 MiB all-reduce records 0 us: trace timing takes the H100 preset's network time for
    it (not 0), between the recorded 100 us of CPU work and 50 us of GPU work."""
    graphs = [_graph(r, 2, 0.0, 0.0, with_step=False) for r in range(2)]
    with caplog.at_level(logging.WARNING):
        res = replay(graphs, make_timing("trace", None, None, graphs))
    net = NetworkModel("h100-sxm").collective_us(CommType.ALL_REDUCE, MiB, [0, 1])
    assert net > 5.0
    assert res.steps[0].predicted_us == pytest.approx(100.0 + net + 50.0, rel=1e-6)
    assert "2 communication nodes record no duration" not in caplog.text   # one per rank, named once
    assert "1 communication nodes record no duration (and 1 more ranks); timed by the h100-sxm network model" \
        in caplog.text


def test_rank_files_of_two_runs_are_refused_naming_both(tmp_path, capsys):
    """A 4-rank run's rank 0 beside a 2-rank run's rank 1 (both record their world size in distributedInfo)."""
    shutil.copy(DATA / "ddp4" / "balanced" / "device.0.json.gz", tmp_path / "t.0.json.gz")
    shutil.copy(DATA / "cpu_ddp" / "device.1.json.gz", tmp_path / "t.1.json.gz")
    rc = main(["convert", "--kineto", str(tmp_path / "t.{rank}.json.gz"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    line = [x for x in err.splitlines() if "error" in x]
    assert len(line) == 1 and "t.1.json.gz" in line[0] and "t.0.json.gz" in line[0]
    assert "a job of 2 ranks" in line[0] and "one of 4" in line[0]
    assert not list(tmp_path.glob("out*.1.et"))


def test_a_rank_set_with_a_gap_replays_with_a_warning_naming_the_missing_rank(tmp_path, capsys):
    for r in (0, 1, 3):
        shutil.copy(DATA / "ddp4" / "balanced" / f"device.{r}.json.gz", tmp_path / f"t.{r}.json.gz")
    rc = main(["replay", str(tmp_path / "t.{rank}.json.gz")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "the job has 4 ranks; 1 of them is not given (rank 2)" in err


def _kineto_with_nccl_kernels(path: Path, kernels: list[str]) -> None:
    """A Kineto trace whose only work is NCCL kernels launched outside any collective's annotation (kernels
    enqueued before profiling started, as in a TraceLens MI300 sample), each 1 ms."""
    import gzip
    import json
    ev = []
    for j, name in enumerate(kernels):
        t = 10.0 + 2000.0 * j
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t,
                   "dur": 5.0, "args": {"correlation": j + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 20, "ts": t + 10, "dur": 1000.0,
                   "args": {"correlation": j + 1, "device": 0, "stream": 20}})
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)


def test_nccl_generic_kernel_without_context_is_not_labelled_all_to_all(tmp_path):
    """NCCL >= 2.19 names most kernels ncclDevKernel_Generic: without a collective annotation above it its
    type is unknown (it was labelled ALL_TO_ALL with 0 bytes); a SendRecv kernel is still all_to_all's."""
    from chakra_schema.pytorch.kineto import load_kineto
    from chakra_schema.pytorch.kineto_graph import kineto_to_graph
    path = tmp_path / "t.json.gz"
    _kineto_with_nccl_kernels(path, ["ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
                                     "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"])
    g = kineto_to_graph(load_kineto(path))
    types = {g.name[i].split("(")[0]: (g.attrs.get(i) or {}).get("comm_type")
             for i in range(len(g)) if int(g.kind[i]) == OpKind.COLLECTIVE}
    assert types == {"ncclDevKernel_Generic": None, "ncclDevKernel_SendRecv": int(CommType.ALL_TO_ALL)}
