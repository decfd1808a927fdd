"""Kineto -> ExecutionGraph dependency passes on tiny hand-built traces (fast: the mutation target
`kineto-dependencies` runs this file for every mutant).

Every expected edge, parent, kind and attribute below is counted by hand from the few events of the
trace in the test, following the rules of chakra_schema/pytorch/kineto_graph.py's docstring (CUDA
semantics: a kernel follows its launch call and the previous kernel on its stream; a synchronize call
ends after the last kernel launched before it on the stream(s) it waits for; a stream wait orders the
first kernel launched after it on the waiting stream after the last kernel launched before the event
record on the recording stream). Recorded-time tolerance: 2 us (TIME_TOL_US).
"""
from __future__ import annotations

import pytest

from chakra_schema.graph import CommType, EdgeKind, NodeType, OpKind, Step
from chakra_schema.pytorch.kineto import HostOp, KinetoTrace
from chakra_schema.pytorch.kineto_graph import (_parse_ranks, comm_attrs_from_args, comm_type_of, dtype_bytes,
                                                is_nccl_kernel, kineto_to_graph, kineto_to_graph_with_map)

L, SO, CS, SY, IT, CO = "LAUNCH", "STREAM_ORDER", "CROSS_STREAM", "SYNC", "INTER_THREAD", "COLLECTIVE"


class Trace:
    """A KinetoTrace written event by event (pid 1, tid 1, device 0 unless named)."""

    def __init__(self, rank=None, world_size=None, pg_config=None):
        self.t = KinetoTrace(path="hand", rank=rank, world_size=world_size, pg_config=pg_config, host_ops=[])

    def host(self, name, ts, dur, tid=1, pid=1, cat="cpu_op", rf=None, ext=None, seq=None, args=None):
        self.t.host_ops.append(HostOp(len(self.t.host_ops), name, pid, tid, float(ts), float(dur), cat, rf, ext,
                                      seq, args or {}))
        return self

    def rt(self, name, ts, dur, corr=-1, tid=1, pid=1, args=None):
        t = self.t
        t.rt_name.append(name); t.rt_cat.append("cuda_runtime"); t.rt_pid.append(pid); t.rt_tid.append(tid)
        t.rt_ts.append(float(ts)); t.rt_dur.append(float(dur)); t.rt_corr.append(corr); t.rt_ext.append(-1)
        t.rt_args.append(args or {})
        return self

    def gpu(self, name, ts, dur, stream=7, corr=-1, device=0, cat="kernel", args=None):
        t = self.t
        t.gpu_name.append(name); t.gpu_cat.append(cat); t.gpu_device.append(device); t.gpu_stream.append(stream)
        t.gpu_ts.append(float(ts)); t.gpu_dur.append(float(dur)); t.gpu_corr.append(corr)
        t.gpu_args.append(args or {})
        return self

    def sync(self, kind, corr, stream=-1, wait_stream=-1, record_corr=-1):
        t = self.t
        t.sync_kind.append(kind); t.sync_ts.append(0.0); t.sync_dur.append(0.0); t.sync_corr.append(corr)
        t.sync_stream.append(stream); t.sync_wait_stream.append(wait_stream); t.sync_record_corr.append(record_corr)
        return self

    def graph(self, **kw):
        return kineto_to_graph(self.t, **kw)


def labels(g) -> list[str]:
    """Node names, with '@<absolute start>' where a name repeats."""
    origin = g.metadata["time_origin_us"]
    counts: dict[str, int] = {}
    for nm in g.name:
        counts[nm] = counts.get(nm, 0) + 1
    return [nm if counts[nm] == 1 else f"{nm}@{g.start_us[i] + origin:g}" for i, nm in enumerate(g.name)]


def edges(g) -> set[tuple[str, str, str]]:
    lab = labels(g)
    return {(lab[s], lab[d], EdgeKind(k).name) for s, d, k in g.edges()}


def node(g, label: str) -> int:
    return labels(g).index(label)


# ------------------------------------------------------------------ nodes, order, nesting
def test_launched_kernels_follow_their_launch_and_the_previous_kernel_on_their_stream():
    tr = (Trace()
          .host("ProfilerStep#1", 1000, 200, cat="user_annotation")
          .host("aten::mm", 1010, 40).rt("launch_a", 1020, 5, corr=1).rt("launch_b", 1030, 5, corr=2)
          .host("aten::add", 1060, 20).rt("launch_c", 1065, 5, corr=3)
          .gpu("k_a", 1040, 30, stream=7, corr=1).gpu("k_b", 1070, 10, stream=7, corr=2)
          .gpu("k_c", 1072, 10, stream=8, corr=3).gpu("k_d", 1090, 5, stream=8))
    g = tr.graph()
    # one order by start: the step, mm, its two launches, k_a, add, its launch, k_b, k_c, k_d
    assert g.name == ["ProfilerStep#1", "aten::mm", "launch_a", "launch_b", "k_a", "aten::add", "launch_c",
                      "k_b", "k_c", "k_d"]
    assert g.start_us.tolist() == [0, 10, 20, 30, 40, 60, 65, 70, 72, 90]
    assert g.duration_us.tolist() == [200, 40, 5, 5, 30, 20, 5, 10, 10, 5]
    assert edges(g) == {("launch_a", "k_a", L), ("launch_b", "k_b", L), ("launch_c", "k_c", L),
                        ("k_a", "k_b", SO), ("k_c", "k_d", SO)}
    assert g.parent.tolist() == [-1, 0, 1, 1, -1, 0, 5, -1, -1, -1]
    assert g.kind.tolist() == [OpKind.ANNOTATION, OpKind.CPU_OP, OpKind.LAUNCH, OpKind.LAUNCH, OpKind.KERNEL,
                               OpKind.CPU_OP, OpKind.LAUNCH, OpKind.KERNEL, OpKind.KERNEL, OpKind.KERNEL]
    assert all(t == NodeType.COMP_NODE for t in g.node_type.tolist())
    # resources in order of first use: the thread, stream 7, stream 8
    assert [(r.kind, r.device, r.index) for r in g.resources] == [(0, 1, 1), (1, 0, 7), (1, 0, 8)]
    assert g.resource.tolist() == [0, 0, 0, 0, 1, 0, 0, 1, 2, 2]
    assert g.steps == [Step("ProfilerStep#1", 0, 0.0, 200.0)]
    assert g.metadata["time_origin_us"] == 1000.0
    assert g.metadata["dropped_edges"] == {} and g.metadata["launch_proxies"] == 0
    assert g.metadata["nested_overlaps"] == 0 and g.metadata["source"] == "kineto"
    assert g.metadata["source_path"] == "hand" and g.metadata["collectives_without_size"] == 0
    assert g.attrs[node(g, "k_a")] == {"stream": 7, "device": 0, "correlation": 1}
    assert g.attrs[node(g, "k_d")] == {"stream": 7 + 1, "device": 0}
    assert g.attrs[node(g, "launch_a")] == {"tid": 1, "correlation": 1}
    assert (g.rank, g.world_size) == (0, 1)


def test_host_map_gives_each_host_op_its_node():
    tr = Trace().host("b", 20, 5).host("a", 10, 5).host("c", 30, 5, tid=2)
    g, host_node = kineto_to_graph_with_map(tr.t)
    assert [g.name[i] for i in host_node.tolist()] == ["b", "a", "c"]
    assert host_node.tolist() == [1, 0, 2]


def test_nesting_by_time_longest_first_host_before_runtime_and_overlaps_counted():
    tr = (Trace()
          .host("outer", 100, 50).host("inner", 100, 20).rt("cudaGetDevice", 100, 20)
          .host("after", 120, 5)            # starts as inner ends: a sibling, not a child
          .host("nearly", 126, 26)          # ends 152 = outer's end + 2 us: within tolerance
          .host("outer2", 200, 50).host("spill", 210, 42.5)   # ends 2.5 us past outer2: an overlap
          .host("outer3", 300, 50).host("spill3", 310, 45)     # a second overlap
          .host("t2op", 100, 50, tid=2))
    tr.t.thread_names[(1, 2)] = "worker"
    g = tr.graph()
    par = {labels(g)[i]: (labels(g)[p] if p >= 0 else None) for i, p in enumerate(g.parent.tolist())}
    assert par == {"outer": None, "inner": "outer", "cudaGetDevice": "inner", "after": "outer", "nearly": "outer",
                   "outer2": None, "spill": "outer2", "outer3": None, "spill3": "outer3",
                   "t2op": None}
    assert g.kind[node(g, "cudaGetDevice")] == OpKind.RUNTIME
    assert g.metadata["nested_overlaps"] == 2
    # same start and length: file order (outer before t2op); then the shorter host op, then the runtime call
    assert g.name[:4] == ["outer", "t2op", "inner", "cudaGetDevice"]
    assert g.resources[g.resource[node(g, "t2op")]].name == "worker"
    assert g.resources[g.resource[node(g, "outer")]].name == ""
    assert g.num_edges == 0
    # no ProfilerStep: one step spanning the whole trace (100 .. 252.5 us, origin 100)
    assert g.steps == [Step("step", -1, 0.0, 255.0)]


def test_runtime_call_kinds_by_name():
    tr = (Trace().rt("cudaLaunchKernel", 10, 1, corr=1).rt("cudaStreamSynchronize", 20, 1)
          .rt("cudaEventRecord", 30, 1).rt("cudaStreamWaitEvent", 40, 1).rt("cudaEventQuery", 50, 1, corr=9)
          .gpu("k", 12, 1, corr=1))
    g = tr.graph()
    kinds = {g.name[i]: OpKind(int(k)).name for i, k in enumerate(g.kind.tolist())}
    assert kinds == {"cudaLaunchKernel": "LAUNCH", "cudaStreamSynchronize": "SYNC", "cudaEventRecord": "EVENT_RECORD",
                     "cudaStreamWaitEvent": "STREAM_WAIT", "cudaEventQuery": "RUNTIME", "k": "KERNEL"}
    assert g.attrs[node(g, "cudaEventQuery")] == {"tid": 1, "correlation": 9}
    assert g.attrs[node(g, "cudaEventRecord")] == {"tid": 1}


def test_gpu_op_attrs_and_kinds():
    tr = (Trace()
          .gpu("k", 10, 1, args={"grid": [4, 1, 1], "block": [128, 1, 1], "shared memory": 4096, "other": 1})
          .gpu("k0", 20, 1, args={"shared memory": 0}).gpu("k1b", 25, 1, args={"shared memory": 1})
          .gpu("kbig", 30, 1, args={"shared memory": 2**31})
          .gpu("kmax", 40, 1, args={"shared memory": 2**31 - 1})
          .gpu("copy", 50, 1, cat="gpu_memcpy", args={"bytes": 4096.0})
          .gpu("set", 60, 1, cat="gpu_memset", stream=3))
    g = tr.graph()
    a = {g.name[i]: g.attrs.get(i, {}) for i in range(len(g))}
    assert a["k"] == {"stream": 7, "device": 0, "grid": [4, 1, 1], "block": [128, 1, 1], "shared_memory": 4096}
    assert a["k0"] == {"stream": 7, "device": 0} and a["k1b"]["shared_memory"] == 1
    assert a["kbig"] == {"stream": 7, "device": 0}
    assert a["kmax"]["shared_memory"] == 2**31 - 1
    assert a["copy"] == {"stream": 7, "device": 0, "bytes": 4096} and type(a["copy"]["bytes"]) is int
    kinds = [OpKind(int(k)).name for k in g.kind.tolist()]
    assert kinds == ["KERNEL"] * 5 + ["MEMCPY", "MEMSET"]


def test_rank_and_world_size():
    tr = Trace(rank=3, world_size=8).host("a", 0, 1)
    assert (tr.graph().rank, tr.graph().world_size) == (3, 8)
    assert tr.graph(rank=5).rank == 5
    tr = Trace(rank=3).host("a", 0, 1)
    assert (tr.graph().rank, tr.graph().world_size) == (3, 4)   # world size unknown: at least rank + 1
    tr = Trace().host("a", 0, 1)
    assert tr.graph(rank=2).world_size == 3


def test_device_properties_keep_the_hardware_fields():
    tr = Trace().host("a", 0, 1)
    tr.t.metadata["deviceProperties"] = [{"id": 0, "name": "H100", "totalGlobalMem": 80, "computeMajor": 9,
                                          "computeMinor": 0, "numSms": 132, "regsPerBlock": 65536}, "junk"]
    tr.t.pg_config = [{"pg_name": "0", "ranks": [0]}, {"pg_name": "1", "ranks": [0]}]
    g = tr.graph()
    assert g.metadata["deviceProperties"] == [{"id": 0, "name": "H100", "totalGlobalMem": 80, "computeMajor": 9,
                                               "computeMinor": 0, "numSms": 132}]
    assert g.metadata["pg_config"] == tr.t.pg_config
    tr.t.metadata["deviceProperties"] = []
    assert "deviceProperties" not in tr.graph().metadata
    assert "pg_config" not in Trace().host("a", 0, 1).graph().metadata


def test_profiler_steps_sorted_by_start():
    tr = (Trace().host("ProfilerStep#2", 200, 100, cat="user_annotation")
          .host("ProfilerStep#1", 100, 100, cat="user_annotation", tid=2)
          .host("ProfilerStep#3", 300, 100))     # a cpu_op beside step annotations: not a step
    g = tr.graph()
    assert [(s.name, s.start_us, s.duration_us) for s in g.steps] == [("ProfilerStep#1", 0.0, 100.0),
                                                                    ("ProfilerStep#2", 100.0, 100.0)]
    assert [g.name[s.node] for s in g.steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    # PyTorch 1.8/1.9 recorded every ProfilerStep as an operator: with no step annotation, those are the steps
    old = Trace().host("ProfilerStep#5", 500, 80).host("ProfilerStep#4", 400, 90, tid=2).graph()
    assert [(s.name, s.start_us, s.duration_us) for s in old.steps] == [("ProfilerStep#4", 0.0, 90.0),
                                                                      ("ProfilerStep#5", 100.0, 80.0)]


# ------------------------------------------------------------------ edge time checks
def test_stream_order_edges_dropped_when_the_recording_contradicts_them():
    tr = (Trace().gpu("k_x", 100, 50).gpu("k_y", 145, 10)     # k_x ends 150 > 145 + 2: dropped
          .gpu("k_z", 153, 5)                                 # k_y ends 155 = 153 + 2: kept
          .gpu("k_w", 155.5, 1))                              # k_z ends 158 > 157.5: dropped
    g = tr.graph()
    assert edges(g) == {("k_y", "k_z", SO)}
    assert g.metadata["dropped_edges"] == {"STREAM_ORDER": 2}


def test_launch_returning_after_its_kernel_started_hands_the_edge_to_the_previous_call():
    tr = (Trace().host("op", 0, 100).rt("cudaGetDevice", 10, 5).rt("launch", 20, 50, corr=1)
          .gpu("k", 30, 10, corr=1)
          .rt("launch2", 200, 50, corr=2, tid=2).gpu("k2", 210, 10, stream=8, corr=2)   # nothing before it
          .rt("launch3", 300, 12, corr=3, tid=3).gpu("k3", 310, 10, stream=9, corr=3)   # ends at k3 + 2: kept
          .rt("launch4", 400, 50, corr=4, tid=4).gpu("k4", 410, 10, stream=10, corr=4)   # nothing before it
          .rt("cudaGetDevice2", 500, 5, tid=5).rt("launch5", 510, 50, corr=5, tid=5)
          .gpu("k5", 520, 10, stream=11, corr=5))
    g = tr.graph()
    assert edges(g) == {("cudaGetDevice", "k", L), ("launch3", "k3", L), ("cudaGetDevice2", "k5", L)}
    assert g.metadata["launch_proxies"] == 2
    assert g.metadata["dropped_edges"] == {"LAUNCH": 2}


def test_launch_proxy_is_the_latest_call_ended_in_time():
    # before the late launch: a call that ends 2 us after k starts (within tolerance) and one 3 us after
    tr = (Trace().rt("early", 0, 5).rt("close", 6, 26).rt("launch", 33, 50, corr=1).gpu("k", 30, 10, corr=1))
    g = tr.graph()
    assert edges(g) == {("close", "k", L)}
    tr = (Trace().rt("early", 0, 5).rt("late", 6, 26.5).rt("launch", 33, 50, corr=1).gpu("k", 30, 10, corr=1))
    assert edges(tr.graph()) == {("early", "k", L)}


def test_launch_proxy_looks_back_at_most_63_nodes():
    tr = Trace().rt("first", 0, 1)
    for i in range(62):
        tr.rt(f"busy{i}", 10 + i, 100)       # all end after the kernel starts
    tr.rt("launch", 80, 100, corr=1).gpu("k", 50, 1, corr=1)
    assert edges(tr.graph()) == {("first", "k", L)}
    tr = Trace().rt("first", 0, 1)
    for i in range(63):
        tr.rt(f"busy{i}", 10 + i, 100)
    tr.rt("launch", 80, 100, corr=1).gpu("k", 50, 1, corr=1)
    g = tr.graph()
    assert edges(g) == set() and g.metadata["dropped_edges"] == {"LAUNCH": 1}


# ------------------------------------------------------------------ synchronization
def test_device_synchronize_waits_for_the_last_kernel_launched_before_it_on_every_stream():
    tr = (Trace().rt("launch_1", 100, 5, corr=1).rt("launch_2", 106, 5, corr=2)
          .rt("cudaDeviceSynchronize", 112, 100, corr=3).rt("launch_3", 220, 5, corr=4)
          .gpu("k1", 110, 100, stream=7, corr=1).gpu("k2", 120, 50, stream=8, corr=2)
          .gpu("k3", 230, 10, stream=7, corr=4)
          .rt("launch_4", 112, 1, corr=5, tid=2).gpu("k4", 115, 1, stream=9, corr=5))   # launched at the call
    g = tr.graph()
    assert edges(g) == {("launch_1", "k1", L), ("launch_2", "k2", L), ("launch_3", "k3", L), ("launch_4", "k4", L),
                        ("k1", "k3", SO), ("k1", "cudaDeviceSynchronize", SY), ("k2", "cudaDeviceSynchronize", SY)}
    assert g.metadata["dropped_edges"] == {}      # stream 9 has nothing before the call: no edge tried


def test_sync_edge_constrains_the_end_of_the_call():
    # k ends at 300; the synchronize call runs 250 .. 300: its end, not its start, follows k
    tr = Trace().rt("launch", 100, 5, corr=1).gpu("k", 110, 190, corr=1).rt("cudaDeviceSynchronize", 250, 48)
    assert edges(tr.graph()) == {("launch", "k", L), ("k", "cudaDeviceSynchronize", SY)}
    tr = Trace().rt("launch", 100, 5, corr=1).gpu("k", 110, 190, corr=1).rt("cudaDeviceSynchronize", 250, 47.5)
    g = tr.graph()
    assert edges(g) == {("launch", "k", L)} and g.metadata["dropped_edges"] == {"SYNC": 1}


def test_stream_synchronize_finds_its_stream():
    tr = (Trace()
          # thread 1: no cuda_sync record, no stream arg: the stream of the thread's latest launch (8)
          .rt("launch_a", 100, 5, corr=1).rt("launch_b", 106, 5, corr=2)
          .rt("cudaStreamSynchronize", 120, 20, corr=3)
          .gpu("k_a", 110, 20, stream=7, corr=1).gpu("k_b", 112, 30, stream=8, corr=2)
          # thread 3 launches on streams 9 of GPU 1 and of GPU 0
          .rt("launch_p", 150, 1, corr=12, tid=3).gpu("k_p", 160, 20, stream=9, device=1, corr=12)
          .rt("launch_q", 152, 1, corr=13, tid=3).gpu("k_q", 155, 5, stream=9, device=0, corr=13)
          # thread 2: cuda_sync names stream 9; the device is the one of the thread's next launch (GPU 1)
          .rt("cuStreamSynchronize", 200, 30, corr=10, tid=2)
          .rt("launch_c", 240, 5, corr=11, tid=2).gpu("k_c", 250, 5, stream=9, device=1, corr=11)
          # thread 4: the stream is in the call's args; no launch on the thread: GPU 0
          .rt("hipStreamSynchronize", 300, 10, corr=40, tid=4, args={"stream": 7})    # no cuda_sync row
          # thread 5: cuda_sync names stream 11, which only GPU 2 has
          .rt("launch_r", 390, 1, corr=21, tid=3).gpu("k_r", 392, 3, stream=11, device=2, corr=21)
          .rt("cudaStreamSynchronize", 400, 5, corr=20, tid=5)
          .sync("Stream Sync", 3, stream=-1).sync("Stream Sync", 10, stream=9).sync("Stream Sync", 20, stream=11))
    g = tr.graph()
    syncs = {e for e in edges(g) if e[2] == SY}
    assert syncs == {("k_b", "cudaStreamSynchronize@120", SY), ("k_p", "cuStreamSynchronize", SY),
                     ("k_a", "hipStreamSynchronize", SY), ("k_r", "cudaStreamSynchronize@400", SY)}


@pytest.mark.parametrize("stream, corr", [(0, 3), (3, 0)], ids=["stream-zero", "correlation-zero"])
def test_stream_synchronize_named_by_its_cuda_sync_row(stream, corr):
    # the sync row names the waited stream (stream 0 included) by the call's correlation, or 0 when the
    # call has none recorded: either way it waits for k_a, the last kernel on that stream
    tr = (Trace().rt("launch_a", 100, 5, corr=1).gpu("k_a", 110, 20, stream=stream, corr=1)
          .rt("launch_b", 106, 5, corr=2).gpu("k_b", 112, 10, stream=8, corr=2)
          .rt("cudaStreamSynchronize", 140, 20, corr=corr).sync("Stream Sync", corr, stream=stream))
    assert {e for e in edges(tr.graph()) if e[2] == SY} == {("k_a", "cudaStreamSynchronize", SY)}


def test_stream_synchronize_without_any_launch_adds_nothing():
    tr = Trace().rt("cudaStreamSynchronize", 140, 20).gpu("k", 100, 1)
    assert edges(tr.graph()) == set()


def test_event_synchronize_waits_for_the_last_kernel_before_the_record():
    # the record call comes first in the file (runtime call 0) though it ran after launch_a
    tr = (Trace().rt("cudaEventRecord", 110, 2).rt("launch_a", 100, 5, corr=1).rt("launch_b", 115, 2, corr=2)
          .rt("cudaEventSynchronize", 120, 40).rt("cudaDeviceSynchronize", 170, 10)
          .gpu("k_a", 105, 50, corr=1).gpu("k_b", 155, 10, corr=2))
    assert edges(tr.graph()) == {("launch_a", "k_a", L), ("launch_b", "k_b", L), ("k_a", "k_b", SO),
                                 ("k_a", "cudaEventSynchronize", SY), ("k_b", "cudaDeviceSynchronize", SY)}


def test_stream_wait_orders_the_waiting_stream_after_the_recording_stream():
    tr = (Trace()
          # thread 5: no record on its thread (the trace has records): the event is unknown, no edge
          .rt("launch_u", 400, 1, corr=8, tid=5).gpu("k_u", 401, 3, stream=60, corr=8)
          .rt("cudaStreamWaitEvent", 405, 1, tid=5)
          .rt("launch_v", 407, 1, corr=9, tid=5).gpu("k_v", 410, 3, stream=61, corr=9)
          # thread 3: recording and waiting stream are the same (30): no cross-stream edge, even from
          # k_s (before the record) to k_t (after the wait) with k_m between them
          .rt("launch_s", 300, 1, corr=6, tid=3).gpu("k_s", 302, 3, stream=30, corr=6)
          .rt("cudaEventRecord", 303, 1, tid=3)
          .rt("launch_m", 305, 1, corr=10, tid=3).gpu("k_m", 306, 1, stream=30, corr=10)
          .rt("cudaStreamWaitEvent", 307, 1, tid=3)
          .rt("launch_t", 309, 1, corr=7, tid=3).gpu("k_t", 310, 3, stream=30, corr=7)
          # thread 2: record after a launch on stream 20, wait, then launch on stream 21
          .rt("launch_e", 190, 2, corr=5, tid=2).gpu("k_e", 192, 3, stream=21, corr=5)
          .rt("launch_c", 200, 2, corr=3, tid=2).gpu("k_c", 205, 30, stream=20, corr=3)
          .rt("cudaEventRecord", 210, 2, tid=2).rt("cudaStreamWaitEvent", 215, 2, tid=2)
          .rt("launch_d", 220, 2, corr=4, tid=2).gpu("k_d", 240, 5, stream=21, corr=4))
    g = tr.graph()
    assert {e for e in edges(g) if e[2] not in (L, SO)} == {("k_c", "k_d", CS)}
    assert ("k_e", "k_d", SO) in edges(g) and ("k_s", "k_m", SO) in edges(g) and ("k_m", "k_t", SO) in edges(g)
    assert ("k_s", "k_t") not in {(a, b) for a, b, _ in edges(g)}


def test_stream_wait_from_cuda_sync_names_the_record_and_both_streams():
    # recording stream 0 and record correlation 0, both named by the cuda_sync row
    tr = (Trace(). rt("launch_f", 300, 1, corr=30, tid=4).gpu("k_f", 302, 10, stream=0, corr=30)
          .rt("launch_g", 305, 1, corr=31, tid=4).gpu("k_g", 306, 2, stream=41, corr=31)
          .rt("cudaEventRecord", 308, 0.5, corr=0, tid=4).rt("cudaStreamWaitEvent", 309, 0.5, corr=33, tid=4)
          .rt("launch_i", 310, 0.5, corr=35, tid=4).gpu("k_i", 316, 1, stream=41, corr=35)
          .rt("launch_h", 311, 1, corr=34, tid=4).gpu("k_h", 315, 3, stream=42, corr=34)
          .sync("Stream Wait Event", 33, stream=42, wait_stream=0, record_corr=0))
    assert {e for e in edges(tr.graph()) if e[2] == CS} == {("k_f", "k_h", CS)}


def test_stream_wait_with_a_cuda_sync_row_naming_unknown_calls_or_streams():
    def wait_trace(record_corr, wait_stream, stream):
        return (Trace().rt("launch_f", 300, 1, corr=30).gpu("k_f", 302, 10, stream=40, corr=30)
                .rt("cudaEventRecord", 308, 0.5, corr=32).rt("cudaStreamWaitEvent", 309, 0.5, corr=33)
                .rt("launch_h", 311, 1, corr=34).gpu("k_h", 315, 3, stream=42, corr=34)
                .sync("Stream Wait Event", 33, stream=stream, wait_stream=wait_stream, record_corr=record_corr))
    # the record call is not in the trace: the event is unknown, no edge (even with its stream named)
    assert {e for e in edges(wait_trace(999, 40, 42).graph()) if e[2] == CS} == set()
    # the recording stream is on no GPU op: it comes from the record call (the thread's latest launch)
    assert {e for e in edges(wait_trace(32, 555, 42).graph()) if e[2] == CS} == {("k_f", "k_h", CS)}
    # the waiting stream is on no GPU op: no edge
    assert {e for e in edges(wait_trace(32, 40, 556).graph()) if e[2] == CS} == set()


def test_stream_wait_on_a_stream_with_nothing_launched_after_it_adds_nothing():
    tr = (Trace().rt("launch_f", 300, 1, corr=30).gpu("k_f", 302, 10, stream=40, corr=30)
          .rt("launch_h", 301, 1, corr=34).gpu("k_h", 305, 3, stream=42, corr=34)
          .rt("cudaEventRecord", 308, 0.5, corr=32).rt("cudaStreamWaitEvent", 309, 0.5, corr=33)
          .rt("cudaGetDevice", 400, 1)
          .sync("Stream Wait Event", 33, stream=42, wait_stream=40, record_corr=32))
    g = tr.graph()
    assert edges(g) == {("launch_f", "k_f", L), ("launch_h", "k_h", L)}
    assert g.metadata["dropped_edges"] == {}


def test_stream_wait_from_cuda_sync_without_recording_stream_infers_it_from_the_record_call():
    tr = (Trace().rt("launch_f", 300, 1, corr=30).gpu("k_f", 302, 10, stream=40, corr=30)
          .rt("cudaEventRecord", 308, 0.5, corr=32).rt("cudaStreamWaitEvent", 309, 0.5, corr=33)
          .rt("launch_h", 311, 1, corr=34).gpu("k_h", 315, 3, stream=42, corr=34)
          .rt("launch_g", 312, 1, corr=31).gpu("k_g", 316, 2, stream=0, corr=31)
          .sync("Stream Wait Event", 33, stream=0, wait_stream=-1, record_corr=32))
    # waiting stream 0 from cuda_sync (not 42, the next launch); recording stream 40 from the record call
    assert {e for e in edges(tr.graph()) if e[2] == CS} == {("k_f", "k_g", CS)}


def test_event_sync_with_a_cuda_sync_record_but_no_record_correlation_adds_nothing():
    tr = (Trace().rt("launch_a", 100, 5, corr=1).rt("cudaEventRecord", 110, 2)
          .rt("cudaEventSynchronize", 120, 40, corr=3).gpu("k_a", 105, 50, corr=1)
          .sync("Event Sync", 3))
    assert edges(tr.graph()) == {("launch_a", "k_a", L)}


def test_stream_wait_in_a_trace_without_event_records_uses_the_wait_call_itself():
    tr = (Trace().rt("launch_a", 100, 1, corr=1).gpu("k_a", 102, 10, stream=50, corr=1)
          .rt("launch_b", 104, 1, corr=2).gpu("k_b", 106, 1, stream=51, corr=2)      # before the wait
          .rt("cudaStreamWaitEvent", 108, 1)
          .rt("launch_c", 110, 1, corr=3).gpu("k_c", 113, 5, stream=52, corr=3)
          .rt("launch_d", 111, 1, corr=4).gpu("k_d", 120, 5, stream=50, corr=4))
    # recording stream: the thread's latest launch before the wait (51, k_b); waiting: next launch (52)
    assert {e for e in edges(tr.graph()) if e[2] == CS} == {("k_b", "k_c", CS)}


# ------------------------------------------------------------------ CPU threads
def test_fwdbwd_flow_links_the_outermost_forward_op_to_the_backward_op():
    tr = (Trace().host("fwd_op", 100, 10).host("fwd_inner", 100, 5).host("bwd_op", 200, 10, tid=2)
          .host("other", 300, 10, tid=2))
    tr.t.flows += [(1, "s", 1, 1, 100.0), (1, "f", 1, 2, 200.0), (2, "s", 1, 1, 100.0), (3, "f", 1, 2, 300.0),
                   (4, "s", 1, 1, 150.0), (4, "f", 1, 2, 300.0)]
    g = tr.graph()
    assert edges(g) == {("fwd_op", "bwd_op", IT)} and g.metadata["dropped_edges"] == {}


def test_backward_call_waits_for_the_worker_threads_work_inside_its_window():
    tr = (Trace()
          .host("autograd::backward", 1000, 100)
          .host("w1", 1010, 20, tid=2).host("w2", 1040, 50, tid=2).host("w2c", 1045, 10, tid=2)
          .host("w3", 1095, 7.5, tid=2)                      # ends 2.5 us after the window: not inside
          .host("x_other_pid", 1050, 40, pid=2, tid=9)
          .host("gloo:all_reduce", 1060, 39, tid=3, cat="user_annotation")
          .host("## backward ##", 2000, 100, cat="user_annotation")
          .host("v1", 2000, 10, tid=2).host("v2", 2095, 7, tid=2)   # starts in, ends at window end + 2
          .host("v3", 2101, 0.5, tid=2)                     # starts after the window
          .host("MyBackwardThing", 3000, 100).host("u1", 3010, 10, tid=2))
    g = tr.graph()
    assert edges(g) == {("w2", "autograd::backward", SY), ("v2", "## backward ##", SY)}


def test_backward_window_counts_ops_starting_at_its_bounds():
    tr = Trace().host("aten::backward", 1000, 100).host("w_end", 1100, 1, tid=2)
    assert edges(tr.graph()) == {("w_end", "aten::backward", SY)}
    tr = Trace().host("aten::backward", 1000, 100).host("w_start", 1000, 1, tid=2)
    assert edges(tr.graph()) == {("w_start", "aten::backward", SY)}
    # two worker ops end together (the second lasts 0 us): the first found of the latest-ending ones
    tr = Trace().host("aten::backward", 1000, 100).host("w1", 1010, 20, tid=2).host("w0", 1030, 0, tid=2)
    assert edges(tr.graph()) == {("w1", "aten::backward", SY)}


# ------------------------------------------------------------------ gloo collectives
AR_ARGS = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Out msg nelems": 256,
           "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}


def test_a_collective_shorter_than_the_tolerance_does_not_make_its_own_issuer_wait():
    # the worker's gloo:all_reduce (100-103 us) ends while its issuer (101.5 us) has just started: the
    # issuer feeds the collective (COLLECTIVE) and is not the op resuming after it (was a 2-cycle)
    g = (Trace().host("other", 80, 1, tid=5).host("gloo:all_reduce", 100, 3, tid=2, cat="user_annotation")
         .host("c10d::allreduce_", 101.5, 0)).graph()
    assert g.find_cycle() == []
    assert edges(g) == {("c10d::allreduce_", "gloo:all_reduce", CO)}


def test_gloo_pairs_by_record_function_id_and_waits_in_issue_order():
    tr = (Trace()
          .host("c10d::allreduce_", 100, 10, rf=10, args=AR_ARGS)
          .host("c10d::allreduce_", 120, 10, rf=12).host("aten::copy_", 121, 2)
          .host("gloo:all_reduce", 125, 20, tid=2, cat="user_annotation", rf=13)
          .host("gloo:all_reduce", 150, 20, tid=2, cat="user_annotation", rf=11,
                args={"Input Dims": [[128]], "Input type": ["float"]})
          .host("c10d::wait", 200, 5).host("aten::wait", 210, 5).host("c10d::wait", 220, 5))
    g = tr.graph()
    # gloo@125 (rf 13) pairs with the issue of rf 12, which still ran when it started: the edge comes from
    # what that issue had done by then (aten::copy_); gloo@150 (rf 11) pairs with rf 10.
    assert edges(g) == {("aten::copy_", "gloo:all_reduce@125", CO),
                        ("c10d::allreduce_@100", "gloo:all_reduce@150", CO),
                        ("gloo:all_reduce@150", "c10d::wait@200", SY), ("gloo:all_reduce@125", "aten::wait", SY)}
    a = g.attrs[node(g, "gloo:all_reduce@150")]
    assert {k: a[k] for k in a if k.startswith(("comm_", "pg_")) or k in ("coll_name", "dtype")} == {
        "coll_name": "all_reduce", "comm_type": int(CommType.ALL_REDUCE), "comm_size": 128 * 4,
        "dtype": "Float", "pg_name": "0", "pg_ranks": [0, 1], "pg_size": 2}
    assert g.kind[node(g, "gloo:all_reduce@150")] == OpKind.COLLECTIVE
    assert g.node_type[node(g, "gloo:all_reduce@150")] == NodeType.COMM_COLL_NODE
    assert g.kind[node(g, "c10d::wait@200")] == OpKind.COLL_WAIT
    issuer = g.attrs[node(g, "c10d::allreduce_@100")]
    assert issuer["comm_size"] == 256 * 4 and issuer["rf_id"] == 10


def test_gloo_without_ids_pairs_in_time_order_and_waits_implicitly():
    tr = (Trace()
          .host("c10d::broadcast_", 100, 10).host("c10d::allreduce_", 112, 5)
          .host("c10d::barrier_x", 90, 1).host("c10d::frobnicate", 95, 1)
          .host("gloo:all_reduce", 108, 10, tid=2, cat="user_annotation")   # before its issue: unpaired
          .host("gloo:broadcast", 120, 10, tid=2, cat="user_annotation")
          .host("gloo:all_reduce", 130, 10, tid=2, cat="user_annotation")
          .host("ProfilerStep#1", 80, 200, cat="user_annotation")
          .host("aten::add", 145, 5))
    g = tr.graph()
    # broadcast ends 130: the thread was busy until 117 > 130 - 20 (not idle long enough): no wait;
    # all_reduce@130 ends 140, the thread idled from 117 and resumed 5 us later with aten::add.
    assert edges(g) == {("c10d::broadcast_", "gloo:broadcast", CO),
                        ("c10d::allreduce_", "gloo:all_reduce@130", CO),
                        ("gloo:all_reduce@130", "aten::add", IT)}


def test_gloo_time_pairing_accepts_an_issue_starting_within_tolerance():
    tr = (Trace().host("c10d::allreduce_", 110, 0)
          .host("gloo:all_reduce", 108, 10, tid=2, cat="user_annotation")
          .host("c10d::broadcast_", 210, 1)
          .host("gloo:broadcast", 207.5, 10, tid=2, cat="user_annotation"))
    g = tr.graph()
    assert {e for e in edges(g) if e[2] == CO} == {("c10d::allreduce_", "gloo:all_reduce", CO)}


def test_gloo_implicit_wait_needs_a_resume_within_10_ms_and_20_us_idle():
    tr = (Trace()
          .host("c10d::allreduce_", 100, 10).host("gloo:all_reduce", 120, 100, tid=2, cat="user_annotation")
          .host("busy", 150, 49.5)                  # ends 20.5 us before the collective's end (220): idle
          .host("resume", 218, 5)                    # starts 2 us before the end: counts as resuming
          .host("c10d::broadcast_", 1000, 10).host("gloo:broadcast", 1020, 100, tid=2, cat="user_annotation")
          .host("busy2", 1050, 50)                   # ends exactly 20 us before the collective's end: busy
          .host("resume2", 1121, 5)
          .host("c10d::barrier", 2000, 10).host("gloo:barrier", 2020, 100, tid=2, cat="user_annotation")
          .host("resume3", 12120, 5)                 # 10 ms after: still a resume
          .host("c10d::allgather", 20000, 10).host("gloo:allgather", 20020, 100, tid=2, cat="user_annotation")
          .host("resume4", 30120.5, 5)               # 10 ms + 0.5 us after: not
          .host("c10d::alltoall", 40000, 10).host("gloo:alltoall", 40020, 100, tid=2, cat="user_annotation")
          .host("resume5", 40125, 5))
    g = tr.graph()
    assert {e for e in edges(g) if e[2] == IT} == {("gloo:all_reduce", "resume", IT),
                                                   ("gloo:barrier", "resume3", IT), ("gloo:alltoall", "resume5", IT)}


def test_gloo_implicit_wait_on_a_thread_with_nothing_before_the_resume():
    tr = (Trace().host("gloo:all_reduce", 120, 100, tid=2, cat="user_annotation")
          .host("c10d::allreduce_", 100, 10, tid=3).host("resume", 225, 5, tid=3))
    g = tr.graph()
    assert edges(g) == {("c10d::allreduce_", "gloo:all_reduce", CO), ("gloo:all_reduce", "resume", IT)}


def test_gloo_explicit_wait_only_takes_a_collective_that_ended_by_its_end():
    tr = (Trace().host("c10d::allreduce_", 100, 10).host("gloo:all_reduce", 120, 100, tid=2, cat="user_annotation")
          .host("c10d::wait", 200, 17.5)              # ends 2.5 us before the collective: not this one
          .host("c10d::wait", 210, 8)                 # ends 218 = collective end - 2: this one
          .host("resume", 230, 1))
    g = tr.graph()
    assert edges(g) == {("c10d::allreduce_", "gloo:all_reduce", CO), ("gloo:all_reduce", "c10d::wait@210", SY)}


def test_gloo_issue_still_running_without_finished_work_falls_back_to_a_checked_edge():
    # the issue runs 100 .. 150 and the worker starts at 120: nothing on the issuing thread had ended by
    # then, so the edge is the issue itself, checked against the times (dropped: it ends after 120 + 2)
    tr = Trace().host("c10d::allreduce_", 100, 50).host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation")
    g = tr.graph()
    assert edges(g) == set() and g.metadata["dropped_edges"] == {"COLLECTIVE": 1}
    # a sibling ended before the issue: it is the stand-in
    tr = (Trace().host("prev", 90, 5).host("c10d::allreduce_", 100, 50)
          .host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation"))
    assert edges(tr.graph()) == {("prev", "gloo:all_reduce", CO)}


def test_gloo_stand_in_is_the_child_that_ended_last_by_the_worker_start():
    tr = (Trace().host("c10d::allreduce_", 100, 50).host("c1", 101, 5).host("c2", 107, 13)   # c2 ends 120
          .host("c3", 110, 2)
          .host("c4", 121, 1)                                   # ends 122 = 120 + 2, but starts after 120 + 2? no
          .host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation"))
    # children ended by 120 + 2: c1 (106), c2 (120), c3 (112), c4 (122): the latest is c4
    assert edges(tr.graph()) == {("c4", "gloo:all_reduce", CO)}
    tr = (Trace().host("c10d::allreduce_", 100, 50).host("c1", 101, 5).host("c2", 107, 13)
          .host("c5", 122.5, 0.1)                              # starts after 120 + 2: the scan stops
          .host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation"))
    assert edges(tr.graph()) == {("c2", "gloo:all_reduce", CO)}


def test_gloo_stand_in_ties_and_boundaries():
    # c2 and cx both end at 120: the first one found (c2) stays; c5 started before 122 but is still
    # running at 122: not a stand-in; c0 starts exactly at 120 + 2 with no duration: ended in time
    tr = (Trace().host("c10d::allreduce_", 100, 50).host("c2", 107, 13).host("cx", 115, 5)
          .host("c5", 121, 9).host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation"))
    assert edges(tr.graph()) == {("c2", "gloo:all_reduce", CO)}
    tr = (Trace().host("c10d::allreduce_", 100, 50).host("c2", 107, 13).host("c0", 122, 0)
          .host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation"))
    assert edges(tr.graph()) == {("c0", "gloo:all_reduce", CO)}
    # a child ending 0.5 us after the trace's first event is a stand-in
    tr = (Trace().host("c10d::allreduce_", 100, 50).host("c1", 100, 0.5)
          .host("gloo:all_reduce", 101, 10, tid=2, cat="user_annotation"))
    assert edges(tr.graph()) == {("c1", "gloo:all_reduce", CO)}


def test_gloo_stand_in_scans_at_most_4095_descendants():
    tr = Trace().host("prev", 90, 1).host("c10d::allreduce_", 100, 5000)
    for i in range(4094):
        tr.host(f"long{i}", 100 + i * 0.0001, 4000)      # still running when the worker starts
    tr.host("short", 101, 1)                              # the 4095th descendant: scanned
    tr.host("gloo:all_reduce", 103, 10, tid=2, cat="user_annotation")
    assert edges(tr.graph()) == {("short", "gloo:all_reduce", CO)}
    tr = Trace().host("prev", 90, 1).host("c10d::allreduce_", 100, 5000)
    for i in range(4095):
        tr.host(f"long{i}", 100 + i * 0.0001, 4000)
    tr.host("short", 101, 1)                              # the 4096th: past the scan, the sibling before
    tr.host("gloo:all_reduce", 103, 10, tid=2, cat="user_annotation")
    assert edges(tr.graph()) == {("prev", "gloo:all_reduce", CO)}
    # nothing before the issue either: no stand-in (the scan back must not wrap to the thread's last node)
    tr = Trace().host("c10d::allreduce_", 100, 5000)
    for i in range(4095):
        tr.host(f"long{i}", 100 + i * 0.0001, 4000)
    tr.host("short", 101, 1)
    tr.host("gloo:all_reduce", 103, 10, tid=2, cat="user_annotation")
    g = tr.graph()
    assert edges(g) == set() and g.metadata["dropped_edges"] == {"COLLECTIVE": 1}


def test_stream_order_keeps_file_order_between_kernels_with_the_same_start():
    tr = Trace()
    for i in range(30):
        tr.gpu(f"a{i}", 100, 0).gpu(f"b{i}", 200, 0)
    g = tr.graph()
    chain = [f"a{i}" for i in range(30)] + [f"b{i}" for i in range(30)]
    assert {e for e in edges(g)} == {(x, y, SO) for x, y in zip(chain, chain[1:])}


# ------------------------------------------------------------------ GPU collectives
def test_nccl_kernels_take_comm_attrs_from_their_own_args_or_their_launching_host_ops():
    tr = (Trace(pg_config=[{"pg_name": "default", "ranks": [0, 1]}]).gpu("plain", 50, 1, stream=26)
          .host("c10d::allreduce_", 100, 50, args={"Collective name": "allreduce", "dtype": "BFloat16",
                                                   "In msg nelems": 1000, "Out msg nelems": 1000,
                                                   "Process Group Name": "tp", "Process Group Ranks": "[0, 1, 2, 3]",
                                                   "Group size": 4})
          .host("record_param_comms", 101, 40).rt("launch_n", 110, 5, corr=1)
          .gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", 120, 10, corr=1)
          .host("nccl:send", 200, 50).rt("launch_s", 210, 5, corr=2)
          .gpu("ncclDevKernel_SendRecv(a)", 220, 10, corr=2, stream=20)
          .host("nccl:recv", 300, 50).rt("launch_r", 310, 5, corr=3)
          .gpu("ncclDevKernel_SendRecv(b)", 320, 10, corr=3, stream=21)
          .rt("launch_x", 400, 5, corr=4, tid=2).gpu("ncclDevKernel_SendRecv(c)", 420, 10, corr=4, stream=22)
          .gpu("ncclKernel_ReduceScatter_RING", 500, 10, stream=23,
               args={"Collective name": "reduce_scatter", "dtype": "Float", "In msg nelems": 400,
                     "Out msg nelems": 100, "Group size": 4, "Process Group Ranks": [4, 5, 6, 7]})
          .gpu("ncclDevKernel_Broadcast_RING(d)", 600, 10, stream=24)
          .host("my_wrapper", 700, 50).rt("launch_w", 710, 5, corr=9)
          .gpu("ncclDevKernel_SendRecv(e)", 720, 10, corr=9, stream=27)
          .gpu("notnccl_AllReduce", 700, 1, stream=25))
    g = tr.graph()
    a = {g.name[i]: g.attrs.get(i, {}) for i in range(len(g))}
    ar = a["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)"]
    assert ar == {"stream": 7, "device": 0, "correlation": 1, "comm_type": int(CommType.ALL_REDUCE),
                  "comm_size": 1000 * 2, "pg_name": "tp", "pg_ranks": [0, 1, 2, 3], "pg_size": 4,
                  "coll_name": "allreduce", "dtype": "BFloat16"}
    send = a["ncclDevKernel_SendRecv(a)"]
    assert send["coll_name"] == "send" and "comm_type" not in send
    assert (send["pg_name"], send["pg_ranks"]) == ("default", [0, 1])
    recv = a["ncclDevKernel_SendRecv(b)"]
    assert recv["coll_name"] == "recv" and "comm_type" not in recv
    assert a["ncclDevKernel_SendRecv(c)"]["comm_type"] == int(CommType.ALL_TO_ALL)
    assert "coll_name" not in a["ncclDevKernel_SendRecv(c)"]
    assert "coll_name" not in a["ncclDevKernel_SendRecv(e)"]     # under no nccl: / c10d:: op
    rs = a["ncclKernel_ReduceScatter_RING"]
    assert rs == {"stream": 23, "device": 0, "coll_name": "reduce_scatter", "comm_type": int(CommType.REDUCE_SCATTER),
                  "comm_size": 400 * 4, "dtype": "Float", "pg_ranks": [4, 5, 6, 7], "pg_size": 4,
                  "pg_name": "default"}
    assert a["ncclDevKernel_Broadcast_RING(d)"]["comm_type"] == int(CommType.BROADCAST)
    kinds = {g.name[i]: OpKind(int(g.kind[i])).name for i in range(len(g)) if g.is_gpu()[i]}
    assert kinds == {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)": "COLLECTIVE", "ncclDevKernel_SendRecv(a)": "SEND",
                     "ncclDevKernel_SendRecv(b)": "RECV", "ncclDevKernel_SendRecv(c)": "COLLECTIVE",
                     "ncclKernel_ReduceScatter_RING": "COLLECTIVE", "ncclDevKernel_Broadcast_RING(d)": "COLLECTIVE",
                     "notnccl_AllReduce": "KERNEL", "plain": "KERNEL", "ncclDevKernel_SendRecv(e)": "COLLECTIVE"}
    types = {g.name[i]: NodeType(int(g.node_type[i])).name for i in range(len(g)) if g.is_gpu()[i]}
    assert types["ncclDevKernel_SendRecv(a)"] == "COMM_SEND_NODE"
    assert types["ncclDevKernel_SendRecv(b)"] == "COMM_RECV_NODE"
    assert types["ncclDevKernel_SendRecv(c)"] == "COMM_COLL_NODE" and types["notnccl_AllReduce"] == "COMP_NODE"
    # without a size: send, recv, the two bare SendRecv, the broadcast
    assert g.metadata["collectives_without_size"] == 5
    assert "pg_name" not in a["notnccl_AllReduce"]


def test_collective_keeps_walking_up_until_it_has_type_and_size():
    tr = (Trace()
          .host("outer", 90, 100, args={"Collective name": "allgather", "dtype": "Float", "In msg nelems": 8,
                                        "Out msg nelems": 64, "Process Group Name": "dp"})
          .host("c10d::_allgather_base", 100, 50, args={"Process Group Name": "x"})
          .host("nccl:all_gather", 101, 40, args={"Collective name": "allgather", "Group size": 8})
          .rt("launch", 110, 5, corr=1).gpu("ncclDevKernel_AllGather_RING(x)", 120, 10, corr=1))
    g = tr.graph()
    a = g.attrs[node(g, "ncclDevKernel_AllGather_RING(x)")]
    # nccl:all_gather gives type, name and group size; its parent has no size; outer gives the size
    # (64 elements x 4 bytes) and the dtype; the nearer pg_name ("x"? no: only attrs the ops carry as comm
    # args) -- c10d::_allgather_base has no "Collective name", so its args give nothing.
    assert {k: a[k] for k in ("comm_type", "comm_size", "coll_name", "dtype", "pg_size", "pg_name")} == {
        "comm_type": int(CommType.ALL_GATHER), "comm_size": 64 * 4, "coll_name": "allgather", "dtype": "Float",
        "pg_size": 8, "pg_name": "dp"}


def test_collective_name_inherited_from_a_c10d_ancestor_names_its_type():
    tr = (Trace().host("c10d::reduce_scatter_", 100, 50).rt("launch", 110, 5, corr=1)
          .gpu("ncclDevKernel_SendRecv(x)", 120, 10, corr=1))
    g = tr.graph()
    a = g.attrs[node(g, "ncclDevKernel_SendRecv(x)")]
    assert a["coll_name"] == "reduce_scatter_" and a["comm_type"] == int(CommType.REDUCE_SCATTER)


def test_default_process_group_needs_exactly_one_group():
    base = (lambda pg: Trace(pg_config=pg).gpu("ncclDevKernel_AllReduce(x)", 10, 1)
            .gpu("ncclDevKernel_AllReduce(y)", 20, 1, args={"Collective name": "allreduce",
                                                             "Process Group Name": "mine"}))
    g = base([{"pg_name": "g0", "ranks": [2, 3]}]).graph()
    assert (g.attr(0, "pg_name"), g.attr(0, "pg_ranks")) == ("g0", [2, 3])
    assert (g.attr(1, "pg_name"), g.attr(1, "pg_ranks")) == ("mine", [2, 3])
    g = base([{"pg_name": "g0", "ranks": [2, 3]}, {"pg_name": "g1", "ranks": [0]}]).graph()
    assert g.attr(0, "pg_name") is None
    g = base(["g0"]).graph()
    assert g.attr(0, "pg_name") is None
    g = base([{"ranks": "bad"}]).graph()
    assert g.attr(0, "pg_name") is None and g.attr(0, "pg_ranks") is None


# ------------------------------------------------------------------ comm attr helpers
def test_comm_type_of_collective_names():
    assert comm_type_of("nccl:reduce_scatter") == CommType.REDUCE_SCATTER
    assert comm_type_of("Reduce Scatter") == CommType.REDUCE_SCATTER
    assert comm_type_of("_allgather_base") == CommType.ALL_GATHER
    assert comm_type_of("c10d::reduce_") == CommType.REDUCE
    assert comm_type_of("send") is None
    assert is_nccl_kernel("ncclKernel_x") and is_nccl_kernel("rcclKernel_x") and is_nccl_kernel("ncclDevFunc_x")
    assert not is_nccl_kernel("my_ncclKernel")


def test_dtype_bytes_and_ranks():
    assert dtype_bytes(" BFloat16 ") == 2 and dtype_bytes("c10::Half") == 2 and dtype_bytes(4) is None
    assert dtype_bytes("mystery") is None
    assert _parse_ranks([1, "2"]) == [1, 2]
    assert _parse_ranks("[0, 1, 2]") == [0, 1, 2] and _parse_ranks("[]") == [] and _parse_ranks("[a]") is None
    assert _parse_ranks("0,1") is None and _parse_ranks(None) is None
    assert _parse_ranks("[ 3 ,]") == [3]


def test_comm_attrs_from_record_param_comms_args():
    args = {"Collective name": "all_gather", "dtype": "Half", "In msg nelems": 100, "Out msg nelems": 800,
            "Process Group Name": 3, "Process Group Ranks": "[0, 1]", "Group size": "8", "Src Rank": -1,
            "Dst Rank": 0, "Seq": 17}
    assert comm_attrs_from_args(args) == {"coll_name": "all_gather", "comm_type": int(CommType.ALL_GATHER),
                                          "comm_size": 800 * 2, "dtype": "Half", "pg_name": "3",
                                          "pg_ranks": [0, 1], "pg_size": 8, "comm_dst": 0, "comm_tag": 17}
    assert comm_attrs_from_args({"Collective name": "send", "dtype": "Float", "In msg nelems": 10,
                                 "Src Rank": 2}) == {"coll_name": "send", "comm_size": 40, "dtype": "Float",
                                                     "comm_src": 2}
    assert comm_attrs_from_args({"Collective name": "broadcast", "dtype": "Float", "Out msg nelems": 10}) == {
        "coll_name": "broadcast", "comm_type": int(CommType.BROADCAST), "comm_size": 40, "dtype": "Float"}
    # no element counts, or an unknown dtype: no size
    assert comm_attrs_from_args({"Collective name": "barrier", "dtype": "Float"}) == {
        "coll_name": "barrier", "comm_type": int(CommType.BARRIER)}
    assert comm_attrs_from_args({"Collective name": "x", "dtype": "weird", "In msg nelems": 3}) == {"coll_name": "x"}
    assert comm_attrs_from_args({"Collective name": ""}) == {}
    assert comm_attrs_from_args({}) == {}


def test_gloo_size_sums_the_input_tensors():
    tr = (Trace().host("gloo:all_gather", 10, 5, cat="user_annotation",
                       args={"Input Dims": [[2, 3], [], [4], "x"], "Input type": ["float", "float", "double", "int"]})
          .host("gloo:broadcast", 20, 5, cat="user_annotation",
                args={"Input Dims": [[2, 3]], "Input type": ["unknown"]})
          .host("gloo:custom", 30, 5, cat="user_annotation", args={"Input Dims": [[5]], "Input type": "float"}))
    g = tr.graph()
    a = g.attrs[node(g, "gloo:all_gather")]
    assert a["comm_size"] == 2 * 3 * 4 + 4 * 8 and a["coll_name"] == "all_gather"
    assert a["comm_type"] == int(CommType.ALL_GATHER)
    b = g.attrs[node(g, "gloo:broadcast")]
    assert "comm_size" not in b and b["comm_type"] == int(CommType.BROADCAST)
    c = g.attrs[node(g, "gloo:custom")]
    assert "comm_size" not in c and "comm_type" not in c and c["coll_name"] == "custom"


def test_host_attrs_from_the_event_and_the_execution_trace():
    tr = (Trace().host("aten::mm", 10, 5, rf=7, ext=9, seq=3, args={"Input Dims": [[2, 2]], "Input type": ["float"]})
          .host("aten::t", 20, 5, seq=-1, args={"Input Dims": [[2]]})
          .host("aten::zero", 30, 5, rf=0, ext=0, seq=0))
    g = tr.graph(host_info={1: {"op_schema": "aten::t(Tensor) -> Tensor", "tid": 99}})
    assert g.attrs[0] == {"tid": 1, "rf_id": 7, "external_id": 9, "seq_id": 3, "input_shapes": [[2, 2]],
                          "input_types": ["float"]}
    assert g.attrs[1] == {"tid": 99, "input_shapes": [[2]], "op_schema": "aten::t(Tensor) -> Tensor"}
    assert g.attrs[2] == {"tid": 1, "rf_id": 0, "external_id": 0, "seq_id": 0}


def test_gloo_attrs_name_size_and_partial_tensor_lists():
    tr = (Trace()
          .host("gloo:all_reduce:v2", 10, 5, cat="user_annotation")
          .host("gloo:broadcast", 20, 5, cat="user_annotation",
                args={"Collective name": "broadcast", "dtype": "Float", "In msg nelems": 10,
                      "Input Dims": [[100]], "Input type": ["float"]})
          .host("gloo:allgather", 30, 5, cat="user_annotation", args={"Input type": ["float"]})
          .host("gloo:gather", 40, 5, cat="user_annotation", args={"Input Dims": [[3]]}))
    g = tr.graph()
    assert g.attrs[node(g, "gloo:all_reduce:v2")]["coll_name"] == "all_reduce:v2"
    # the record_param_comms size (10 floats) wins over the tensors (100 floats)
    assert g.attrs[node(g, "gloo:broadcast")]["comm_size"] == 40
    assert "comm_size" not in g.attrs[node(g, "gloo:allgather")]
    assert "comm_size" not in g.attrs[node(g, "gloo:gather")]


def test_parse_ranks_rejects_text_inside_the_brackets():
    assert _parse_ranks("[1X]") is None and _parse_ranks("[X]") is None


def test_empty_trace_is_an_empty_graph():
    g = Trace().graph()
    assert len(g) == 0 and g.steps == [] and g.metadata["time_origin_us"] == 0.0


def test_correlation_zero_is_a_correlation_and_an_unmatched_one_has_no_launch():
    tr = (Trace().gpu("k_orphan", 40, 5, corr=50)     # its launch was not recorded (sampled trace)
          .rt("launch0", 10, 2, corr=0).gpu("k0", 20, 5, corr=0)
          .rt("launch1", 12, 2, corr=1).gpu("k1", 30, 5, corr=1)
          .rt("cudaDeviceSynchronize", 36, 20))
    g = tr.graph()
    assert g.kind[node(g, "launch0")] == OpKind.LAUNCH and g.attrs[node(g, "launch0")]["correlation"] == 0
    assert g.attrs[node(g, "k0")]["correlation"] == 0
    # k_orphan counts as launched at its own start (40), after the synchronize call (36)
    assert edges(g) == {("launch0", "k0", L), ("launch1", "k1", L), ("k0", "k1", SO), ("k1", "k_orphan", SO),
                        ("k1", "cudaDeviceSynchronize", SY)}


def test_comm_size_with_a_zero_element_count():
    assert comm_attrs_from_args({"Collective name": "x", "dtype": "Float", "Out msg nelems": 0})["comm_size"] == 0
    assert comm_attrs_from_args({"Collective name": "x", "dtype": "Float", "In msg nelems": 0})["comm_size"] == 0


def test_launch_time_of_the_first_runtime_call_counts():
    # runtime call 0 launches k_a (at 100, the kernel starts at 150): the synchronize call at 105 waits for it
    tr = (Trace().rt("launch_a", 100, 1, corr=1).rt("cudaDeviceSynchronize", 105, 60).gpu("k_a", 150, 10, corr=1))
    assert edges(tr.graph()) == {("launch_a", "k_a", L), ("k_a", "cudaDeviceSynchronize", SY)}


def test_stream_synchronize_on_a_stream_without_kernels_adds_nothing():
    tr = (Trace().rt("launch_a", 100, 1, corr=1).gpu("k_a", 102, 10, corr=1)
          .rt("hipStreamSynchronize", 200, 10, args={"stream": 99})
          .rt("cudaStreamSynchronize", 300, 10, corr=5).sync("Stream Sync", 5, stream=77))
    g = tr.graph()
    assert edges(g) == {("launch_a", "k_a", L)} and g.metadata["dropped_edges"] == {}


def test_runtime_calls_with_the_same_start_keep_file_order_on_their_thread():
    # calls 1, 3, 5, 7 (cudaGetDevice) and 9 (the wait) start at 100; calls 2, 4, 6, 8, 10 are launches at
    # 200 on streams 62, 64, ...; call 0 launches on stream 50. No event record in the trace: the wait
    # orders the first launch after it in file order (stream 62) after stream 50's kernel.
    tr = Trace().rt("launch_a", 50, 0, corr=1).gpu("k_a", 60, 1, stream=50, corr=1)
    for i in range(1, 11):
        if i % 2:
            tr.rt("cudaStreamWaitEvent" if i == 9 else "cudaGetDevice", 100, 0)
        else:
            tr.rt(f"launch_{i}", 200, 0, corr=100 + i).gpu(f"k_{i}", 300, 1, stream=60 + i, corr=100 + i)
    assert {e for e in edges(tr.graph()) if e[2] == CS} == {("k_a", "k_2", CS)}


def test_collective_stops_inheriting_once_it_has_type_and_size():
    tr = (Trace()
          .host("outer", 90, 100, args={"Collective name": "x", "Process Group Name": "outer_pg", "Dst Rank": 5})
          .host("c10d::allreduce_", 100, 50, args={"Collective name": "allreduce", "dtype": "Float",
                                                   "In msg nelems": 4})
          .rt("launch", 110, 5, corr=1).gpu("ncclDevKernel_AllReduce(x)", 120, 10, corr=1))
    g = tr.graph()
    a = g.attrs[node(g, "ncclDevKernel_AllReduce(x)")]
    assert a["comm_size"] == 16 and "pg_name" not in a and "comm_dst" not in a


def test_collective_inherits_peer_and_tag_and_the_issuers_type():
    tr = (Trace().host("nccl:send", 100, 50, args={"Collective name": "send", "Dst Rank": 1, "Src Rank": 0,
                                                    "Seq": 3})
          .rt("launch", 110, 5, corr=1).gpu("ncclDevKernel_SendRecv(a)", 120, 10, corr=1)
          .host("my_coll_op", 200, 50).rt("launch2", 210, 5, corr=2)
          .gpu("ncclDevKernel_SendRecv(b)", 220, 10, corr=2, stream=8))
    # the ET gives the issuer a comm type its name does not tell
    g = tr.graph(host_info={1: {"comm_type": int(CommType.REDUCE_SCATTER), "coll_name": "my_coll"}})
    a = g.attrs[node(g, "ncclDevKernel_SendRecv(a)")]
    assert (a["comm_dst"], a["comm_src"], a["comm_tag"], a["coll_name"]) == (1, 0, 3, "send")
    b = g.attrs[node(g, "ncclDevKernel_SendRecv(b)")]
    assert b["comm_type"] == int(CommType.REDUCE_SCATTER) and b["coll_name"] == "my_coll"


def test_collective_name_comes_from_the_nearest_nccl_or_c10d_ancestor():
    tr = (Trace().host("ProfilerStep#1", 90, 100, cat="user_annotation")
          .host("c10d::reduce_scatter_", 100, 50).host("record_param_comms", 101, 40)
          .rt("launch", 110, 5, corr=1).gpu("ncclDevKernel_SendRecv(x)", 120, 10, corr=1)
          .host("c10d::all_to_all:v2", 200, 50).rt("launch2", 210, 5, corr=2)
          .gpu("ncclDevKernel_SendRecv(y)", 220, 10, corr=2, stream=8)
          .rt("launch3", 300, 5, corr=3, tid=2).gpu("ncclDevKernel_SendRecv(reduce)", 320, 10, corr=3, stream=9))
    g = tr.graph()
    a = g.attrs[node(g, "ncclDevKernel_SendRecv(x)")]
    assert a["coll_name"] == "reduce_scatter_" and a["comm_type"] == int(CommType.REDUCE_SCATTER)
    assert g.attrs[node(g, "ncclDevKernel_SendRecv(y)")]["coll_name"] == "all_to_all:v2"
    # the kernel's type comes from its name before the argument list: SendRecv, i.e. all-to-all
    assert g.attrs[node(g, "ncclDevKernel_SendRecv(reduce)")]["comm_type"] == int(CommType.ALL_TO_ALL)


def _co(g):
    return {e for e in edges(g) if e[2] == CO}


def test_gloo_worker_ops_are_user_annotations_only():
    tr = (Trace().host("c10d::allreduce_", 100, 10).host("gloo:all_reduce", 120, 10, tid=2)   # a cpu_op
          .host("ProfilerStep#1", 90, 100, cat="user_annotation"))
    assert _co(tr.graph()) == set()


def test_gloo_time_pairing_follows_start_times_not_file_order():
    # file order: the later issue first; one worker op after both: it takes the earliest issue
    tr = (Trace().host("c10d::allreduce_B", 200, 10).host("c10d::allreduce_A", 100, 10)
          .host("gloo:all_reduce", 250, 10, tid=2, cat="user_annotation"))
    assert _co(tr.graph()) == {("c10d::allreduce_A", "gloo:all_reduce", CO)}
    # file order: the later worker op first; the earlier one takes issue A, the later one issue B
    tr = (Trace().host("c10d::allreduce_A", 100, 10).host("c10d::allreduce_B", 200, 10)
          .host("gloo:all_reduce", 250, 10, tid=2, cat="user_annotation")
          .host("gloo:all_reduce", 150, 10, tid=2, cat="user_annotation"))
    assert _co(tr.graph()) == {("c10d::allreduce_A", "gloo:all_reduce@150", CO),
                               ("c10d::allreduce_B", "gloo:all_reduce@250", CO)}


def test_gloo_waits_take_collectives_in_issue_time_order():
    tr = (Trace().host("c10d::allreduce_", 200, 10).host("c10d::allreduce_", 100, 10)
          .host("gloo:all_reduce", 150, 10, tid=2, cat="user_annotation")
          .host("gloo:all_reduce", 250, 10, tid=2, cat="user_annotation")
          .host("c10d::wait", 300, 5))
    assert {e for e in edges(tr.graph()) if e[2] == SY} == {("gloo:all_reduce@150", "c10d::wait", SY)}


def test_gloo_record_function_id_pairing_details():
    # the largest id below the worker's wins, not the latest issue
    tr = (Trace().host("c10d::allreduce_A", 100, 10, rf=12).host("c10d::allreduce_B", 120, 3, rf=10)
          .host("gloo:all_reduce", 125, 10, tid=2, cat="user_annotation", rf=13))
    assert _co(tr.graph()) == {("c10d::allreduce_A", "gloo:all_reduce", CO)}
    # id 1 counts; an issue without an id is not a candidate for an id match
    tr = (Trace().host("c10d::allreduce_", 300, 10, rf=1)
          .host("gloo:all_reduce", 125, 10, tid=2, cat="user_annotation", rf=2)
          .host("prev", 90, 5))
    assert _co(tr.graph()) == {("prev", "gloo:all_reduce", CO)}
    tr = (Trace().host("c10d::allreduce_N", 100, 10).host("c10d::allreduce_R", 112, 3, rf=5)
          .host("gloo:all_reduce", 125, 10, tid=2, cat="user_annotation", rf=7))
    assert _co(tr.graph()) == {("c10d::allreduce_R", "gloo:all_reduce", CO)}
    # an issue with the worker's own id is not below it: time order decides (the issue starts too late)
    tr = (Trace().host("c10d::allreduce_", 300, 10, rf=7)
          .host("gloo:all_reduce", 125, 10, tid=2, cat="user_annotation", rf=7))
    g = tr.graph()
    assert _co(g) == set() and g.metadata["dropped_edges"] == {}
    # the first candidate by time, picked by id, even though it started after the worker op
    tr = (Trace().host("prev", 90, 5).host("c10d::allreduce_", 300, 10, rf=10)
          .host("gloo:all_reduce", 100, 10, tid=2, cat="user_annotation", rf=11))
    assert _co(tr.graph()) == {("prev", "gloo:all_reduce", CO)}


def test_gloo_issue_ending_within_tolerance_of_the_worker_start_is_the_source():
    for end in (122, 119):
        tr = (Trace().host("c10d::allreduce_", 100, end - 100).host("c", 101, 4)
              .host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation"))
        assert _co(tr.graph()) == {("c10d::allreduce_", "gloo:all_reduce", CO)}


def test_gloo_worker_takes_missing_comm_attrs_from_its_issuer():
    tr = (Trace().host("c10d::allreduce_", 100, 10, args=AR_ARGS)
          .host("gloo:all_reduce", 120, 10, tid=2, cat="user_annotation"))
    g = tr.graph()
    a = g.attrs[node(g, "gloo:all_reduce")]
    assert a["comm_size"] == 256 * 4 and a["pg_size"] == 2 and a["dtype"] == "Float"


def test_gloo_waits_are_taken_in_start_order():
    tr = (Trace().host("c10d::allreduce_", 100, 10).host("c10d::allreduce_", 110, 5)
          .host("gloo:all_reduce", 120, 50, tid=2, cat="user_annotation")
          .host("gloo:all_reduce", 171, 9, tid=2, cat="user_annotation")
          .host("c10d::wait", 300, 5).host("c10d::wait", 200, 5)      # file order: the later wait first
          .host("c10d::wait", 250, 1, tid=3))                         # a thread that issued nothing
    assert {e for e in edges(tr.graph()) if e[2] == SY} == {("gloo:all_reduce@120", "c10d::wait@200", SY),
                                                            ("gloo:all_reduce@171", "c10d::wait@300", SY)}


def test_gloo_wait_ending_as_a_short_collective_starts():
    tr = (Trace().host("c10d::allreduce_", 100, 1).host("gloo:all_reduce", 120, 1, tid=2, cat="user_annotation")
          .host("c10d::wait", 110, 10))
    assert {e for e in edges(tr.graph()) if e[2] == SY} == {("gloo:all_reduce", "c10d::wait", SY)}


def test_gloo_implicit_waits_per_issuing_thread():
    tr = (Trace().host("c10d::allreduce_", 100, 10).host("gloo:all_reduce", 120, 100, tid=2, cat="user_annotation")
          .host("resume1", 225, 5)
          .host("c10d::broadcast_", 1000, 10, tid=3)
          .host("gloo:broadcast", 1020, 100, tid=2, cat="user_annotation")
          .host("resume3", 1125, 5, tid=3))
    assert {e for e in edges(tr.graph()) if e[2] == IT} == {("gloo:all_reduce", "resume1", IT),
                                                            ("gloo:broadcast", "resume3", IT)}


def test_gloo_issue_busy_until_the_collective_end_is_no_implicit_wait():
    tr = (Trace().host("c10d::allreduce_", 100, 115).host("gloo:all_reduce", 120, 100, tid=2, cat="user_annotation")
          .host("resume", 225, 5))
    assert {e for e in edges(tr.graph()) if e[2] == IT} == set()
