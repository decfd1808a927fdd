"""Replay engine semantics on small hand-built graphs (real traces are covered in test_replay_traces.py)."""
from __future__ import annotations

import time

import pytest

from chakra_schema.graph import EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
from replay.api import replay
from replay.engine import ReplayError, simulate
from replay.trace_timing import TraceTiming


def _rank_graph(rank: int, kernel_us: float, world: int = 2, collectives: int = 1, comm_us: float = 100.0):
    """A step: CPU launches a kernel then `collectives` all-reduces, then synchronizes the stream."""
    b = GraphBuilder(rank, world)
    cpu = b.resource(ResourceKind.CPU_THREAD, 10, 1)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    total = 10 + kernel_us + collectives * comm_us + 20
    step = b.add_node("ProfilerStep#1", NodeType.COMP_NODE, OpKind.ANNOTATION, cpu, 0, total)
    b.add_step("ProfilerStep#1", step, 0, total)
    launch = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, 1, 4, parent=step)
    prev = b.add_node("gemm", NodeType.COMP_NODE, OpKind.KERNEL, gpu, 6, kernel_us)
    b.add_dep(launch, prev, EdgeKind.LAUNCH)
    t_cpu = 6.0
    t_gpu = 6 + kernel_us
    for c in range(collectives):
        lc = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, t_cpu, 2, parent=step)
        coll = b.add_node("ncclDevKernel_AllReduce", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, gpu, t_gpu,
                          comm_us, attrs={"comm_type": 0, "comm_size": 1 << 20, "pg_name": "0",
                                          "pg_ranks": list(range(world))})
        b.add_dep(lc, coll, EdgeKind.LAUNCH)
        b.add_dep(prev, coll, EdgeKind.STREAM_ORDER)
        prev = coll
        t_cpu += 3
        t_gpu += comm_us
    sync = b.add_node("cudaStreamSynchronize", NodeType.COMP_NODE, OpKind.SYNC, cpu, t_cpu, t_gpu - t_cpu + 5,
                      parent=step)
    b.add_dep(prev, sync, EdgeKind.SYNC)
    return b.build()


def test_replay_reproduces_consistent_recorded_step():
    g = _rank_graph(0, 500.0, world=1)
    res = replay([g])
    (step,) = res.steps
    assert step.predicted_us == pytest.approx(step.measured_us, rel=1e-6)


def test_doubling_one_ranks_compute_delays_the_other_rank_by_its_wait_at_the_collective():
    base = replay([_rank_graph(0, 400.0), _rank_graph(1, 400.0)])
    slow = replay([_rank_graph(0, 800.0), _rank_graph(1, 400.0)])
    by = {(s.rank): s.predicted_us for s in base.steps}
    by_slow = {(s.rank): s.predicted_us for s in slow.steps}
    # rank 1 did not change, yet it now waits 400 us longer at the all-reduce
    assert by_slow[1] - by[1] == pytest.approx(400.0, abs=1e-6)
    assert by_slow[0] - by[0] == pytest.approx(400.0, abs=1e-6)


def test_shorter_kernel_shortens_the_synchronize_that_waits_for_it():
    g = _rank_graph(0, 500.0, world=1)

    class HalfGpu(TraceTiming):
        def node_durations(self, graph):
            d = super().node_durations(graph)
            d[graph.is_gpu()] *= 0.5
            return d

    full = replay([g]).steps[0].predicted_us
    half = replay([g], HalfGpu()).steps[0].predicted_us
    assert half == pytest.approx(full - 0.5 * (500 + 100), abs=1e-6)


def test_collective_a_member_never_reaches_fails_fast_naming_rank_and_group():
    graphs = [_rank_graph(0, 100.0, collectives=3), _rank_graph(1, 100.0, collectives=2)]
    t0 = time.perf_counter()
    with pytest.raises(ReplayError) as e:
        simulate(graphs, TraceTiming())
    assert time.perf_counter() - t0 < 1.0
    msg = str(e.value)
    assert "rank 1" in msg and "all_reduce #3" in msg and "'0'" in msg


def test_collective_of_different_types_in_the_same_slot_is_reported():
    g0 = _rank_graph(0, 100.0)
    g1 = _rank_graph(1, 100.0)
    coll = int(g1.collectives()[0])
    g1.attrs[coll]["comm_type"] = 2  # all_gather where rank 0 all-reduces
    with pytest.raises(ReplayError, match="differs across ranks"):
        simulate([g0, g1], TraceTiming())


def test_single_rank_of_larger_group_uses_recorded_collective_duration():
    g = _rank_graph(0, 100.0, world=8)
    g.attrs[int(g.collectives()[0])]["pg_ranks"] = list(range(8))
    res = replay([g])
    assert res.steps[0].predicted_us == pytest.approx(res.steps[0].measured_us)


def test_dependency_deadlock_is_an_error_not_a_hang():
    b = GraphBuilder(0, 1)
    s1 = b.resource(ResourceKind.GPU_STREAM, 0, 1)
    s2 = b.resource(ResourceKind.GPU_STREAM, 0, 2)
    a = b.add_node("a", NodeType.COMP_NODE, OpKind.KERNEL, s1, 0, 1)
    a2 = b.add_node("a2", NodeType.COMP_NODE, OpKind.KERNEL, s1, 1, 1)
    c = b.add_node("c", NodeType.COMP_NODE, OpKind.KERNEL, s2, 0, 1)
    c2 = b.add_node("c2", NodeType.COMP_NODE, OpKind.KERNEL, s2, 1, 1)
    # a waits for c2 while c2 (after c on its stream) waits... c waits for a2 (after a on s1): a deadlock
    b.add_dep(c2, a, EdgeKind.CROSS_STREAM)
    b.add_dep(a2, c, EdgeKind.CROSS_STREAM)
    with pytest.raises(ReplayError, match="deadlocked"):
        simulate([b.build()], TraceTiming())


def test_breakdown_and_critical_path_cover_the_step():
    res = replay([_rank_graph(0, 400.0, world=1)])
    s = res.steps[0]
    assert s.breakdown.compute_us == pytest.approx(400.0)
    assert s.breakdown.comm_us == pytest.approx(100.0)
    assert s.breakdown.exposed_comm_us == pytest.approx(100.0)
    assert sum(s.critical_path.values()) == pytest.approx(1.0, abs=1e-6)
    assert s.critical_path["gpu_compute"] == pytest.approx(400.0 / s.predicted_us, rel=1e-6)


def test_timeline_is_valid_chrome_trace(tmp_path):
    import json

    from replay.timeline import write_timeline

    res = replay([_rank_graph(0, 100.0), _rank_graph(1, 100.0)])
    out = tmp_path / "t.json"
    write_timeline(res.run, out)
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    assert {e["pid"] for e in ev if e["ph"] == "X"} == {0, 1}
    flows = [e for e in ev if e["ph"] in ("s", "f") and e["cat"] == "collective"]
    assert len(flows) == 2 and flows[0]["id"] == flows[1]["id"]


def test_transfer_time_excludes_the_wait_for_peers():
    """Recorded timing, two ranks on one stream each. Rank 0: a 100 us kernel, an eager send (50 us) to rank
    1, an all-reduce (30 us). Rank 1: the all-reduce first (arrives at 0, the peer at 150), then the receive.
    The all-reduce moves data for 30 us after its last member arrives, on both ranks, though rank 1's node
    spans 0-180; the receive is charged the send's 50 us (its data arrived at 150, before it was posted at
    180), not its own recorded 150."""
    from chakra_schema.graph import CommType
    ar = {"comm_type": int(CommType.ALL_REDUCE), "comm_size": 1 << 20, "pg_ranks": [0, 1], "pg_name": "0"}
    b0 = GraphBuilder(0, 2)
    s0 = b0.resource(ResourceKind.GPU_STREAM, 0, 7)
    b0.add_node("gemm", NodeType.COMP_NODE, OpKind.KERNEL, s0, 0.0, 100.0)
    b0.add_node("ncclKernel_SendRecv", NodeType.COMM_SEND_NODE, OpKind.SEND, s0, 100.0, 50.0,
                attrs={"comm_size": 1 << 20, "comm_dst": 1})
    b0.add_node("ncclKernel_AllReduce", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, s0, 150.0, 30.0, attrs=ar)
    b1 = GraphBuilder(1, 2)
    s1 = b1.resource(ResourceKind.GPU_STREAM, 0, 7)
    b1.add_node("ncclKernel_AllReduce", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, s1, 0.0, 180.0, attrs=ar)
    b1.add_node("ncclKernel_SendRecv", NodeType.COMM_RECV_NODE, OpKind.RECV, s1, 180.0, 1.0,
                attrs={"comm_size": 1 << 20, "comm_src": 0})
    run = replay([b0.build(), b1.build()], critical_path=False, align="start").run
    assert run.start.tolist() == pytest.approx([0, 100, 150, 0, 180])
    assert run.end.tolist() == pytest.approx([100, 150, 180, 180, 180])
    assert run.transfer_us.tolist() == pytest.approx([100, 50, 30, 30, 50])
