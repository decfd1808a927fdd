"""Kineto trace -> ExecutionGraph: every acceptance check on the real shared traces.

Expected values are computed here from the raw JSON (independently of chakra_schema.pytorch.kineto).
"""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType, EdgeKind, NodeType, OpKind
from chakra_schema.pytorch.kineto import load_kineto
from chakra_schema.pytorch.kineto_graph import TIME_TOL_US, kineto_to_graph
from chakra_schema.inputs import load_graphs
from conftest import DATA, require_shared

GPU_TRACES = [
    "hta/trace_diff_control_control.json.gz",
    "hta/nccl_parser_config_nccl_data.json.gz",
    "hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/trace_filter_sampled_rank-0.json.gz",
    "hta/trace_filter_sampled_rank-1.json.gz",
    "hta/critical_path_cuda_event_sync_event_sync_trace.json.gz",
    "hta/critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz",
    "hta/critical_path_alexnet_trace.json.gz",
    "hta/amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/execution_trace_benchmark_simple_add_trace.json.gz",
    "param/linear_kineto.json.gz",
    "param/resnet_kineto.json.gz",
]
CPU_TRACES = ["hta/cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"]
CPU_DDP = [DATA / "cpu_ddp" / "device.0.json.gz", DATA / "cpu_ddp" / "device.1.json.gz"]

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

_cache: dict[str, tuple] = {}


def _path(rel: str | Path) -> Path:
    if isinstance(rel, Path):
        if not rel.exists():
            pytest.skip(f"{rel} not present")
        return rel
    return require_shared("traces", *rel.split("/"))


def _raw(rel) -> dict:
    with gzip.open(_path(rel), "rb") as fh:
        return json.load(fh)


def _graph(rel):
    key = str(rel)
    if key not in _cache:
        _cache[key] = (load_kineto(_path(rel)), None)
        _cache[key] = (_cache[key][0], kineto_to_graph(_cache[key][0]))
    return _cache[key]


def _by_corr(g) -> dict[int, int]:
    """GPU node index by correlation id."""
    gpu = np.flatnonzero(g.is_gpu())
    return {g.attrs[i]["correlation"]: int(i) for i in gpu if "correlation" in g.attrs.get(i, {})}


def _edges(g, kind: EdgeKind) -> list[tuple[int, int]]:
    dst = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
    sel = np.flatnonzero(g.dep_kind == kind)
    return list(zip(g.dep_src[sel].tolist(), dst[sel].tolist()))


# ------------------------------------------------------------------------------------------ GPU ops
@pytest.mark.parametrize("rel", GPU_TRACES)
def test_every_gpu_event_is_one_gpu_node_with_its_duration(rel):
    raw = [e for e in _raw(rel)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    _, g = _graph(rel)
    gpu = np.flatnonzero(g.is_gpu())
    assert len(gpu) == len(raw) > 0
    # same multiset of (device, stream, duration) as the raw events
    want = Counter((int(e["args"].get("device", e["pid"])), int(e["args"].get("stream", e["tid"])),
                    round(float(e["dur"]), 3)) for e in raw)
    got = Counter()
    for i in gpu:
        res = g.resources[g.resource[i]]
        assert res.is_gpu
        got[(res.device, res.index, round(float(g.duration_us[i]), 3))] += 1
    assert got == want
    kinds = Counter(int(k) for k in g.kind[gpu])
    n_nccl = sum(1 for e in raw if e["cat"] == "kernel" and e["name"].startswith(("ncclKernel", "ncclDevKernel")))
    assert kinds[OpKind.MEMCPY] == sum(1 for e in raw if e["cat"] == "gpu_memcpy")
    assert kinds[OpKind.MEMSET] == sum(1 for e in raw if e["cat"] == "gpu_memset")
    assert kinds[OpKind.COLLECTIVE] + kinds[OpKind.SEND] + kinds[OpKind.RECV] == n_nccl


@pytest.mark.parametrize("rel", GPU_TRACES)
def test_gpu_ops_have_launch_and_stream_order_edges(rel):
    k, g = _graph(rel)
    gpu = np.flatnonzero(g.is_gpu())
    launch_dst = {d for _, d in _edges(g, EdgeKind.LAUNCH)}
    stream_dst = {d for _, d in _edges(g, EdgeKind.STREAM_ORDER)}
    rt_corr = set(k.rt_corr)
    launched = [i for i in gpu if g.attrs[i].get("correlation") in rt_corr]
    # every GPU op whose launch call is in the trace depends on the CPU (its launch, or, when the call
    # returned after the op started, on the thread's last node done by then); the only exceptions are
    # ops started before anything on the launching thread had ended (counted as dropped)
    missing = sum(1 for i in launched if i not in launch_dst)
    assert missing == g.metadata["dropped_edges"].get("LAUNCH", 0) <= max(1, len(gpu) // 1000)
    assert len(launched) >= 0.95 * len(gpu)
    # every op but the first of its stream follows its predecessor on the stream
    n_streams = len({int(g.resource[i]) for i in gpu})
    assert len(stream_dst & set(gpu.tolist())) == len(gpu) - n_streams
    for s, d in _edges(g, EdgeKind.STREAM_ORDER):
        assert g.resource[s] == g.resource[d] and s < d


def test_gpu_node_attrs():
    rel = "hta/critical_path_cuda_event_sync_event_sync_trace.json.gz"
    raw = [e for e in _raw(rel)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    _, g = _graph(rel)
    by_corr = _by_corr(g)
    for e in raw:
        a = g.attrs[by_corr[e["args"]["correlation"]]]
        assert a["stream"] == e["args"]["stream"] and a["device"] == e["args"]["device"]
        if e["cat"] == "kernel":
            assert a["grid"] == e["args"]["grid"] and a["block"] == e["args"]["block"]
            # shared memory per CTA: a launch feature of the calibrated kernel models (0 is not kept)
            assert a.get("shared_memory", 0) == e["args"]["shared memory"]
        else:
            assert a["bytes"] == e["args"]["bytes"]


# ------------------------------------------------------------------------------------- collectives
def test_nccl_kernels_have_comm_type_and_size_in_bytes():
    rel = "hta/nccl_parser_config_nccl_data.json.gz"
    raw = [e for e in _raw(rel)["traceEvents"]
           if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")]
    assert len(raw) == 21
    expected_type = {"allreduce": CommType.ALL_REDUCE, "broadcast": CommType.BROADCAST}
    elem = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Char": 1}
    _, g = _graph(rel)
    by_corr = _by_corr(g)
    for e in raw:
        a = e["args"]
        i = by_corr[a["correlation"]]
        assert g.node_type[i] == NodeType.COMM_COLL_NODE and g.kind[i] == OpKind.COLLECTIVE
        at = g.attrs[i]
        assert at["comm_type"] == expected_type[a["Collective name"]]
        assert at["comm_size"] == max(a["In msg nelems"], a["Out msg nelems"]) * elem[a["dtype"]]
        assert at["pg_name"] == a["Process Group Name"]
        assert at["pg_ranks"] == json.loads(a["Process Group Ranks"])


def test_collective_without_kineto_args_inherits_from_host_info_of_ancestor():
    rel = "hta/trace_diff_control_control.json.gz"
    k, g = _graph(rel)
    nccl = [i for i in np.flatnonzero(g.is_gpu()) if g.kind[i] == OpKind.COLLECTIVE]
    assert len(nccl) == 60 and all("comm_size" not in g.attrs[i] for i in nccl)
    # the SendRecv kernels run under nccl:all_to_all, the AllReduce ones under nccl:all_reduce
    types = Counter(g.attrs[i]["comm_type"] for i in nccl)
    assert set(types) == {CommType.ALL_TO_ALL, CommType.ALL_REDUCE}
    # give every `nccl:*` host op a size through host_info: the kernels below them must take it
    info = {h.index: {"comm_size": 1000 + h.index, "pg_name": "pg"} for h in k.host_ops
            if h.name.startswith("nccl:")}
    g2 = kineto_to_graph(k, host_info=info)
    for i in nccl:
        a = g2.attrs[i]
        assert a["comm_size"] >= 1000 and a["pg_name"] == "pg"
        # the size is that of an enclosing nccl:* op of the launch
        launch = [s for s, d in _edges(g2, EdgeKind.LAUNCH) if d == i]
        p, sizes = (int(g2.parent[launch[0]]) if launch else -1), []
        while p >= 0:
            sizes.append(g2.attrs.get(p, {}).get("comm_size"))
            p = int(g2.parent[p])
        assert a["comm_size"] in sizes


def test_host_info_is_merged_into_host_op_attrs():
    rel = "hta/execution_trace_benchmark_simple_add_trace.json.gz"
    k, _ = _graph(rel)
    info = {h.index: {"op_schema": f"schema-{h.index}", "input_shapes": [[h.index]]} for h in k.host_ops}
    g = kineto_to_graph(k, host_info=info)
    seen = {a["op_schema"] for a in g.attrs.values() if "op_schema" in a}
    assert seen == {f"schema-{h.index}" for h in k.host_ops}


@pytest.mark.parametrize("path", CPU_DDP)
def test_gloo_collectives_on_worker_threads(path):
    raw = _raw(path)["traceEvents"]
    gloo_raw = [e for e in raw if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")]
    assert len(gloo_raw) == 12
    k, g = _graph(path)
    gl = [i for i in range(len(g)) if g.name[i].startswith("gloo:")]
    assert len(gl) == 12
    issue_of = {d: s for s, d in _edges(g, EdgeKind.COLLECTIVE)}
    for i in gl:
        a = g.attrs[i]
        assert g.node_type[i] == NodeType.COMM_COLL_NODE and g.kind[i] == OpKind.COLLECTIVE
        assert a["comm_type"] == (CommType.ALL_REDUCE if g.name[i] == "gloo:all_reduce" else CommType.BROADCAST)
        assert a["comm_size"] == int(np.prod(a["input_shapes"][0])) * 4
        assert a["pg_ranks"] == [0, 1]
        # issued by the c10d op of the same collective on the main thread, with the same tensor: the
        # edge starts at that op, or (when the worker started before the op returned) at the last
        # node of the thread done by then: a descendant of the op or a node just before it
        s = issue_of[i]
        assert g.resource[s] != g.resource[i]
        want = {"gloo:all_reduce": "c10d::allreduce_", "gloo:broadcast": "c10d::broadcast_"}[g.name[i]]
        c10d = [n for n in g.nodes_on(int(g.resource[s])) if g.name[n] == want and g.start_us[n] <= g.start_us[i]]
        issuer = int(c10d[-1])
        ancestors, p = set(), s
        while p >= 0:
            ancestors.add(p)
            p = int(g.parent[p])
        assert issuer in ancestors or g.start_us[s] + g.duration_us[s] <= g.start_us[issuer] + TIME_TOL_US
        assert g.attrs[issuer]["input_shapes"][0] == [a["input_shapes"][0]]
    # the bucket sizes of the README: 263040, 264576, 147712 fp32 elements, 3 steps
    sizes = Counter(g.attrs[i]["comm_size"] for i in gl if g.name[i] == "gloo:all_reduce")
    assert sizes == {263040 * 4: 3, 264576 * 4: 3, 147712 * 4: 3}


def test_cpu_only_trace_gloo_annotations():
    _, g = _graph(CPU_TRACES[0])
    assert g.rank == 34 and g.world_size == 300
    assert not g.is_gpu().any()
    gl = [i for i in range(len(g)) if g.name[i] == "gloo:all_reduce"]
    assert len(gl) == 10
    assert {g.attrs[i]["comm_size"] for i in gl} == {321271 * 4, 2082411 * 4}
    assert [s.name for s in g.steps] == ["ProfilerStep#551"]
    assert g.steps[0].duration_us == pytest.approx(210109.162)


# ------------------------------------------------------------------------------ host ops, nesting
@pytest.mark.parametrize("rel", GPU_TRACES + CPU_TRACES)
def test_host_ops_nest_per_thread(rel):
    raw = _raw(rel)["traceEvents"]
    host_cats = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
    n_host = sum(1 for e in raw if e.get("ph") == "X" and e.get("cat") in host_cats)
    _, g = _graph(rel)
    cpu = np.flatnonzero(~g.is_gpu())
    assert len(cpu) == n_host
    assert not any(g.name[i].startswith("<built-in") for i in cpu)   # python_function skipped
    end = g.start_us + g.duration_us
    child = cpu[g.parent[cpu] >= 0]
    par = g.parent[child]
    assert np.all(par < child) and np.all(g.resource[par] == g.resource[child])
    assert np.all(g.start_us[par] <= g.start_us[child]) and np.all(g.start_us[child] < end[par])
    # a thread serves its nodes in recorded start order
    for r in {int(x) for x in g.resource[cpu]}:
        nodes = g.nodes_on(r)
        assert np.all(np.diff(g.start_us[nodes]) >= 0)


def test_kinds_of_runtime_calls():
    _, g = _graph("hta/critical_path_cuda_event_sync_event_sync_trace.json.gz")
    kind = {g.name[i]: int(g.kind[i]) for i in range(len(g))}
    assert kind["cudaLaunchKernel"] == OpKind.LAUNCH
    assert kind["cudaMemcpyAsync"] == OpKind.LAUNCH
    assert kind["cudaStreamSynchronize"] == OpKind.SYNC
    assert kind["cudaEventSynchronize"] == OpKind.SYNC
    assert kind["cudaDeviceSynchronize"] == OpKind.SYNC
    assert kind["cudaEventRecord"] == OpKind.EVENT_RECORD
    assert kind["ProfilerStep#100"] == OpKind.ANNOTATION
    assert kind["aten::sum"] == OpKind.CPU_OP
    _, g2 = _graph("hta/critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz")
    assert {int(g2.kind[i]) for i in range(len(g2)) if g2.name[i] == "cudaStreamWaitEvent"} == {OpKind.STREAM_WAIT}
    # AMD: HIP launches are launches (matched by correlation)
    _, g3 = _graph("hta/amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    hip = [i for i in range(len(g3)) if g3.name[i].startswith("hip") and "Launch" in g3.name[i]]
    assert hip and all(g3.kind[i] == OpKind.LAUNCH for i in hip)


def test_host_attrs_from_kineto_args():
    rel = "hta/trace_filter_sampled_rank-0.json.gz"
    raw = [e for e in _raw(rel)["traceEvents"] if e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {})]
    k, g = _graph(rel)
    by_ext = {g.attrs[i].get("external_id"): i for i in np.flatnonzero(g.kind == OpKind.CPU_OP)}
    for e in raw[:200]:
        a = g.attrs[by_ext[e["args"]["External id"]]]
        assert a["input_shapes"] == e["args"]["Input Dims"]
        assert a["input_types"] == e["args"]["Input type"]
        assert a["tid"] == e["tid"]


# ----------------------------------------------------------------------------- steps, rank, edges
def test_profiler_steps_and_rank():
    _, g = _graph("hta/nccl_parser_config_nccl_data.json.gz")
    assert g.rank == 0 and g.world_size == 2
    assert [s.name for s in g.steps] == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    assert [round(s.duration_us / 1000, 3) for s in g.steps] == [222.442, 219.727, 224.936]
    for s in g.steps:
        assert g.name[s.node] == s.name and g.kind[s.node] == OpKind.ANNOTATION
    _, g2 = _graph("hta/trace_diff_control_control.json.gz")
    assert g2.rank == 3 and g2.world_size == 8 and len(g2.steps) == 6


def test_trace_without_profiler_step_is_one_step():
    _, g = _graph("param/linear_kineto.json.gz")
    assert g.rank == 0
    assert len(g.steps) == 1 and g.steps[0].node == -1
    assert g.steps[0].duration_us == pytest.approx(float(np.max(g.start_us + g.duration_us) - np.min(g.start_us)))


@pytest.mark.parametrize("rel", GPU_TRACES + CPU_TRACES + CPU_DDP)
def test_graph_is_valid_and_consistent_with_recorded_times(rel):
    _, g = _graph(rel)
    assert g.validate() == []
    end = g.start_us + g.duration_us
    dst = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
    src, kind = g.dep_src, g.dep_kind
    limit = np.where(kind == EdgeKind.SYNC, end[dst], g.start_us[dst])
    bad = np.flatnonzero(end[src] > limit + TIME_TOL_US)
    assert [(g.name[src[j]], g.name[dst[j]], EdgeKind(int(kind[j])).name) for j in bad[:5]] == []


def test_cross_stream_edge_from_stream_wait_event():
    rel = "hta/critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz"
    ev = [e for e in _raw(rel)["traceEvents"] if e.get("ph") == "X"]
    rt = {e["args"]["correlation"]: e for e in ev if e["cat"] == "cuda_runtime"}
    gpu = [e for e in ev if e["cat"] in GPU_CATS]
    waits = [e for e in ev if e["cat"] == "cuda_sync" and e["args"]["cuda_sync_kind"] == "Stream Wait Event"]
    assert len(waits) == 1
    w = waits[0]["args"]
    record_ts = rt[w["wait_on_cuda_event_record_corr_id"]]["ts"]
    wait_ts = rt[w["correlation"]]["ts"]
    src = max((e for e in gpu if e["args"]["stream"] == w["wait_on_stream"]
               and rt[e["args"]["correlation"]]["ts"] < record_ts), key=lambda e: e["ts"])
    dst = min((e for e in gpu if e["args"]["stream"] == w["stream"]
               and rt[e["args"]["correlation"]]["ts"] > wait_ts), key=lambda e: e["ts"])
    assert (src["name"], src["args"]["correlation"]) == ("ampere_sgemm_128x64_nn", 27)
    assert (dst["name"], dst["args"]["correlation"]) == ("Memset (Device)", 1411)
    _, g = _graph(rel)
    by_corr = _by_corr(g)
    assert _edges(g, EdgeKind.CROSS_STREAM) == [(by_corr[27], by_corr[1411])]


def test_sync_edges_for_event_stream_and_device_synchronize():
    rel = "hta/critical_path_cuda_event_sync_event_sync_trace.json.gz"
    ev = [e for e in _raw(rel)["traceEvents"] if e.get("ph") == "X"]
    rt = {e["args"]["correlation"]: e for e in ev if e["cat"] == "cuda_runtime"}
    gpu = [e for e in ev if e["cat"] in GPU_CATS]
    ev_sync = next(e for e in ev if e["cat"] == "cuda_runtime" and e["name"] == "cudaEventSynchronize")
    sync_info = next(e for e in ev if e["cat"] == "cuda_sync" and e["args"]["correlation"] == ev_sync["args"]["correlation"])
    rec_ts = rt[sync_info["args"]["wait_on_cuda_event_record_corr_id"]]["ts"]
    waited = max((e for e in gpu if e["args"]["stream"] == sync_info["args"]["wait_on_stream"]
                  and rt[e["args"]["correlation"]]["ts"] < rec_ts), key=lambda e: e["ts"])
    assert waited["name"].startswith("at::cuda::(anonymous namespace)::spin_kernel")
    assert waited["args"]["correlation"] == 1526
    _, g = _graph(rel)
    by_corr = _by_corr(g)
    is_gpu = g.is_gpu()
    rt_node = {g.attrs[i]["correlation"]: i for i in range(len(g))
               if not is_gpu[i] and "correlation" in g.attrs.get(i, {})}
    sync = set(_edges(g, EdgeKind.SYNC))
    assert (by_corr[1526], rt_node[ev_sync["args"]["correlation"]]) in sync
    # cudaStreamSynchronize waits for the DtoH copy launched just before it
    ss = next(e for e in ev if e["name"] == "cudaStreamSynchronize")
    memcpy = next(e for e in gpu if e["cat"] == "gpu_memcpy")
    assert (by_corr[memcpy["args"]["correlation"]], rt_node[ss["args"]["correlation"]]) in sync
    # cudaDeviceSynchronize waits for the last op of the (single) stream
    ds = next(e for e in ev if e["name"] == "cudaDeviceSynchronize")
    last = max(gpu, key=lambda e: e["ts"])
    assert (by_corr[last["args"]["correlation"]], rt_node[ds["args"]["correlation"]]) in sync
    # the cudaMemcpyAsync of that copy (device -> pageable host memory: synchronous) returned 9 us after
    # its 2 us copy ended, so it waited for it
    mc = next(e for e in ev if e["name"] == "cudaMemcpyAsync")
    assert "Pageable" in memcpy["name"] and mc["ts"] < memcpy["ts"]
    assert memcpy["ts"] + memcpy["dur"] <= mc["ts"] + mc["dur"]
    assert (by_corr[memcpy["args"]["correlation"]], rt_node[mc["args"]["correlation"]]) in sync
    assert len(sync) == 4


def test_fwdbwd_flows_become_inter_thread_edges():
    rel = "hta/nccl_parser_config_nccl_data.json.gz"
    flows = [e for e in _raw(rel)["traceEvents"] if e.get("cat") == "fwdbwd"]
    ids = {e["id"] for e in flows if e["ph"] == "s"} & {e["id"] for e in flows if e["ph"] == "f"}
    _, g = _graph(rel)
    it = _edges(g, EdgeKind.INTER_THREAD)
    assert len(it) == len(ids) == 543
    fwd_tid = Counter(g.attrs[s]["tid"] for s, _ in it)
    bwd_tid = Counter(g.attrs[d]["tid"] for _, d in it)
    assert set(fwd_tid) == {2910249} and set(bwd_tid) == {2919752}   # main thread -> autograd thread
    # the blocking "## backward ##" annotation waits for the autograd thread
    bw = [i for i in range(len(g)) if g.name[i] == "## backward ##"]
    sync_dst = {d for _, d in _edges(g, EdgeKind.SYNC)}
    assert bw and all(i in sync_dst for i in bw)


def test_sampled_traces_convert():
    for rel in ("hta/trace_filter_sampled_rank-0.json.gz", "hta/trace_filter_sampled_rank-1.json.gz"):
        _, g = _graph(rel)
        assert g.world_size == 128 and len(g.steps) == 2
        send_recv = [i for i in range(len(g)) if g.name[i].startswith("ncclKernel_SendRecv")]
        assert len(send_recv) == 10
        # NCCL runs these collectives as SendRecv kernels: the type is that of the enclosing nccl:* op
        expected = {"nccl:all_to_all": CommType.ALL_TO_ALL, "nccl:all_reduce": CommType.ALL_REDUCE,
                    "nccl:_all_gather_base": CommType.ALL_GATHER}
        launch = dict((d, s) for s, d in _edges(g, EdgeKind.LAUNCH))
        for i in send_recv:
            p = launch[i]
            while not g.name[p].startswith("nccl:"):
                p = int(g.parent[p])
                assert p >= 0
            assert g.attrs[i]["comm_type"] == expected[g.name[p]]


# ---------------------------------------------------------------------------------------- bad input
def test_bad_input_raises_trace_input_error(tmp_path):
    cases = {
        "not_json.json": b"this is not json",
        "empty.json": b"",
        "list.json": b"[1, 2, 3]",
        "no_events.json": b'{"schemaVersion": 1}',
        "bad_event.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k"}]}',
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    good = gzip.compress(b'{"traceEvents": [' + b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},' * 200 + b"{}]}")
    (tmp_path / "truncated.json.gz").write_bytes(good[: len(good) // 2])
    for p in sorted(tmp_path.iterdir()):
        with pytest.raises(TraceInputError) as exc:
            load_kineto(p)
        assert "\n" not in str(exc.value) and str(p) in str(exc.value)
    with pytest.raises(TraceInputError, match="Execution Trace"):
        load_kineto(require_shared("traces", "hta", "execution_trace_benchmark_simple_add_et.json.gz"))
    with pytest.raises(TraceInputError):
        load_kineto(tmp_path / "missing.json")


def test_sliced_parse_equals_whole_parse(monkeypatch, tmp_path):
    """load_kineto parses traceEvents in slices cut at event boundaries; the result must not depend on
    where the cuts fall, including "}, {" inside strings and nested objects."""
    import chakra_schema.pytorch.kineto as kineto_mod

    ev = [{"ph": "X", "cat": "cpu_op", "name": f"op}}, {{{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
           "args": {"External id": i, "Input Dims": [[i], []], "nested": [{"a": "}, {"}, {"b": 1}]}}
          for i in range(3000)]
    ev += [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i * 10 + 1, "dur": 2,
            "args": {"stream": 7, "device": 0, "correlation": i}} for i in range(500)]
    doc = {"schemaVersion": 1, "traceEvents": ev, "distributedInfo": {"rank": 5, "world_size": 8},
           "deviceProperties": [{"id": 0, "name": "X]"}], "traceName": "t]"}
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps(doc, indent=1).encode())
    monkeypatch.setattr(kineto_mod, "_SLICE_BYTES", 4096)
    sliced = load_kineto(p)

    def whole(path, trace, progress):
        raise kineto_mod._NotStreamable

    monkeypatch.setattr(kineto_mod, "_stream_events", whole)
    full = load_kineto(p)
    assert [h.name for h in sliced.host_ops] == [h.name for h in full.host_ops] == [e["name"] for e in ev[:3000]]
    assert sliced.host_ops[17].args == ev[17]["args"]
    assert sliced.gpu_corr == full.gpu_corr == list(range(500))
    assert sliced.rank == full.rank == 5 and sliced.world_size == 8
    assert sliced.metadata["traceName"] == "t]" and sliced.metadata["deviceProperties"][0]["name"] == "X]"


def test_model_timing_says_when_kernels_keep_durations_from_an_unknown_gpu(caplog):
    """Kernels the models cannot time keep their recorded durations scaled from the trace's GPU to the
    target; PARAM's ResNet trace ran on an RTX 2080 Ti, which no preset matches, so they are kept unscaled
    -- which model mode now says, naming the GPU. Given a source preset, they are scaled: the GPU is not
    named, but as they are most of the kernel time (the trace has no input shapes for 9,538 of its 10,113
    kernels), model mode says that it is mostly the trace's own timing, scaled."""
    from replay.model_timing import ModelTiming
    path = require_shared("traces", "param", "resnet_kineto.json.gz")
    g = load_graphs([str(path)])[0]
    ModelTiming("h100-sxm").node_durations(g)
    said = [r.getMessage() for r in caplog.records if "keep their recorded durations" in r.getMessage()]
    assert len(said) == 1 and "NVIDIA GeForce RTX 2080 Ti" in said[0] and str(path) in said[0]
    caplog.clear()
    ModelTiming("h100-sxm", source_hw="a100-sxm-80gb").node_durations(g)
    said = [r.getMessage() for r in caplog.records if "keep their recorded durations" in r.getMessage()]
    assert len(said) == 1 and "RTX 2080 Ti" not in said[0] and "9,538 of 10,113 GPU kernels" in said[0]
    assert "scaled by the a100-sxm-80gb to h100-sxm peak ratio" in said[0]
