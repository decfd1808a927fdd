"""The Execution Trace parser reads every ET schema in the shared traces, and the ET-only graph keeps
collectives, process groups and data deps right."""
from __future__ import annotations

import gzip
import shutil
import tarfile
from collections import Counter

import numpy as np
import orjson
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType, EdgeKind, NodeType, OpKind
from chakra_schema.pytorch.et_graph import collective_kind, execution_trace_to_graph
from chakra_schema.pytorch.execution_trace import load_execution_trace
from conftest import require_shared

ET_FILES = {
    # file: (schema prefix, node count, flat layout)
    "param/linear_et.json.gz": ("1.0.1", 931),
    "hta/execution_trace_benchmark_simple_add_et.json.gz": ("1.0.1", 38),
    "chakra/1.0.2-chakra.0.0.4.tgz": ("1.0.2", 263),
    "param/resnet_et.json.gz": ("1.1.0", 14392),
    "param/1.1.0-chakra.0.0.4_resnet_2gpu_et.json.gz": ("1.1.0", 14392),
}


@pytest.mark.parametrize("name", sorted(ET_FILES))
def test_each_schema_parses_into_sorted_columns(name):
    schema, count = ET_FILES[name]
    et = load_execution_trace(require_shared("traces", *name.split("/")))
    assert et.schema.startswith(schema)
    assert len(et) == count
    assert np.all(np.diff(et.ids) > 0)  # sorted by id = start order
    # every non-root node's parent is in the trace and started before it
    pidx = et.parent_index()
    non_root = np.array([not n.startswith("[pytorch|profiler|execution_") for n in et.names])
    assert np.all(pidx[non_root] >= 0)
    assert np.all(pidx[non_root] < np.flatnonzero(non_root))
    # shapes and types line up with values for the operators
    ops = [i for i, n in enumerate(et.names) if n.startswith("aten::")]
    assert ops
    for i in ops[:200]:
        assert len(et.in_shapes[i]) == len(et.in_types[i]) == len(et.in_values[i])
    assert {int(t) for t in et.tid} >= {1}


def test_flat_schema_fields_are_columns():
    et = load_execution_trace(require_shared("traces", "param", "linear_et.json.gz"))
    i = et.names.index("aten::addmm")
    assert et.rf_id[i] >= 0 and et.op_schema[i].startswith("aten::addmm(")
    assert et.in_types[i][0].startswith("Tensor(")
    assert len(et.in_values[i][0]) == 6  # [tensor_id, storage_id, offset, numel, itemsize, device]


def test_tar_gz_is_streamed(tmp_path):
    """param/hf_GPT2_et.json.tar.gz holds one 24 MB JSON; a tar of ours must give the same nodes."""
    et = load_execution_trace(require_shared("traces", "param", "hf_GPT2_et.json.tar.gz"))
    assert len(et) == 27156 and et.schema.startswith("1.1.0")
    # plain (uncompressed) tar with an AppleDouble companion, as macOS tar writes
    src = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_et.json.gz")
    j = tmp_path / "trace.json"
    j.write_bytes(gzip.decompress(src.read_bytes()))
    (tmp_path / "._trace.json").write_bytes(b"\x00\x05\x16\x07junk")
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(tmp_path / "._trace.json", arcname="._trace.json")
        tar.add(j, arcname="trace.json")
    assert len(load_execution_trace(tmp_path / "t.tar")) == 38


def test_resnet_2gpu_comm_attrs_and_process_groups():
    et = load_execution_trace(require_shared("traces", "param", "1.1.0-chakra.0.0.4_resnet_2gpu_et.json.gz"))
    assert et.process_groups == [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                  "ranks": [], "group_size": 2, "group_count": 1}]
    assert et.world_size == 2
    assert et.rank == 1  # all-reduces record rank 1 (the broadcasts record their root, 0)
    names = Counter(c["collective_name"] for c in et.comm.values())
    assert names == {"allreduce": 15, "broadcast": 6, "wait": 6}
    first_ar = next(c for c in et.comm.values() if c["collective_name"] == "allreduce")
    assert first_ar["dtype"] == "Float" and first_ar["pg_size"] == 2 and first_ar["in_msg_nelems"] == 2049000

    g = execution_trace_to_graph(et)
    assert g.validate() == []
    assert (g.rank, g.world_size) == (1, 2)
    colls = g.collectives()
    types = Counter(int(g.attr(int(c), "comm_type")) for c in colls)
    assert types == {int(CommType.ALL_REDUCE): 15, int(CommType.BROADCAST): 6}
    for c in colls:
        a = g.attrs[int(c)]
        assert g.node_type[c] == NodeType.COMM_COLL_NODE and g.kind[c] == OpKind.COLLECTIVE
        assert a["pg_name"] == "0" and a["pg_ranks"] == [0, 1]
        assert g.resources[g.resource[c]].is_gpu  # the communication stream, device from the tensors
        assert g.resources[g.resource[c]].device == 1
    ar = next(int(c) for c in colls if g.attrs[int(c)]["comm_type"] == CommType.ALL_REDUCE)
    assert g.attrs[ar]["comm_size"] == 2049000 * 4
    # each transfer is issued by its record_param_comms (COLLECTIVE edge) and each wait syncs on one
    kinds = Counter(EdgeKind(k).name for k in g.dep_kind.tolist())
    assert kinds["COLLECTIVE"] == 21 and kinds["SYNC"] == 6
    for w in np.flatnonzero(g.kind == OpKind.COLL_WAIT):
        srcs = g.deps_of(int(w))
        assert len(srcs) == 1 and g.attrs[int(srcs[0])]["comm_type"] == CommType.BROADCAST
    assert [s.name for s in g.steps] == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]


def test_chakra_102_all_gather_from_positional_inputs():
    """Schema 1.0.2 has no comm attrs: type, size and group come from record_param_comms' inputs."""
    et = load_execution_trace(require_shared("traces", "chakra", "1.0.2-chakra.0.0.4.tgz"))
    assert len(et) == 263 and et.world_size == 2 and et.rank == 0
    g = execution_trace_to_graph(et)
    assert g.validate() == []
    colls = g.collectives()
    assert len(colls) == 10
    for c in colls:
        a = g.attrs[int(c)]
        assert a["comm_type"] == CommType.ALL_GATHER
        assert a["comm_size"] == 2 * 1 * 4  # output: 2 ranks x 1 float
        assert a["pg_ranks"] == [0, 1]
    assert len(g.steps) == 1 and g.steps[0].node == -1


@pytest.mark.parametrize("name", sorted(ET_FILES))
def test_et_only_graph_is_valid_and_ordered(name):
    et = load_execution_trace(require_shared("traces", *name.split("/")))
    g = execution_trace_to_graph(et)
    assert g.validate() == []
    assert len(g) >= len(et) - 4  # only roots and the process-group record are dropped
    src = g.dep_src.astype(np.int64)
    dst = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
    assert np.all(src < dst)  # every dep points back in ET (start) order
    assert np.all(g.parent < np.arange(len(g)))
    data = g.dep_kind == EdgeKind.DATA
    assert data.sum() > 0
    # a DATA edge joins two top-level ops: neither endpoint has an operator ancestor
    is_op = (g.kind == OpKind.CPU_OP) | (g.kind == OpKind.COLL_WAIT)
    for s, d in list(zip(src[data].tolist(), dst[data].tolist()))[:300]:
        for n in (s, d):
            p = int(g.parent[n])
            while p >= 0:
                assert not is_op[p], f"{g.name[n]} under op {g.name[p]}"
                p = int(g.parent[p])


def test_collective_name_table():
    assert collective_kind("allreduce") == (OpKind.COLLECTIVE, CommType.ALL_REDUCE)
    assert collective_kind("nccl:all_reduce") == (OpKind.COLLECTIVE, CommType.ALL_REDUCE)
    for n in ("_allgather_base", "all_gather_into_tensor", "allgather"):
        assert collective_kind(n)[1] == CommType.ALL_GATHER
    for n in ("reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter"):
        assert collective_kind(n)[1] == CommType.REDUCE_SCATTER
    for n in ("all_to_all_single", "alltoall_base", "all_to_all"):
        assert collective_kind(n)[1] == CommType.ALL_TO_ALL
    assert collective_kind("reduce")[1] == CommType.REDUCE
    assert collective_kind("barrier")[1] == CommType.BARRIER
    assert collective_kind("send") == (OpKind.SEND, None)
    assert collective_kind("recv") == (OpKind.RECV, None)
    assert collective_kind("wait") is None


# ------------------------------------------------------------------------------------ bad input
def _expect(path, fragment):
    with pytest.raises(TraceInputError) as ei:
        load_execution_trace(path)
    assert ei.value.path == str(path)
    assert fragment in ei.value.problem and "\n" not in str(ei.value)


def test_bad_inputs_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    _expect(empty, "empty")
    good = require_shared("traces", "param", "linear_et.json.gz").read_bytes()
    trunc = tmp_path / "trunc.json.gz"
    trunc.write_bytes(good[: len(good) // 2])
    _expect(trunc, "gzip")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"schema": "1.0.1", "nodes": [')
    _expect(bad, "invalid JSON")
    kin = tmp_path / "kineto.json.gz"
    shutil.copy(require_shared("traces", "hta", "execution_trace_benchmark_simple_add_trace.json.gz"), kin)
    _expect(kin, "looks like a Kineto trace, not an Execution Trace")
    nonodes = tmp_path / "nonodes.json"
    nonodes.write_bytes(orjson.dumps({"schema": "1.1.1", "nodes": []}))
    _expect(nonodes, "no nodes")
    noid = tmp_path / "noid.json"
    noid.write_bytes(orjson.dumps({"schema": "1.1.1", "nodes": [{"name": "x"}]}))
    _expect(noid, "malformed")
    _expect(tmp_path / "missing.json", "cannot read")


@pytest.mark.parametrize("name", ["param/linear_et.json.gz", "param/1.1.0-chakra.0.0.4_resnet_2gpu_et.json.gz"])
def test_node_by_node_parse_equals_whole_document_parse(name, monkeypatch):
    """Big files are parsed one node at a time (bounded memory); the result must not differ."""
    import chakra_schema.pytorch.execution_trace as et_mod

    path = require_shared("traces", *name.split("/"))
    whole = et_mod.load_execution_trace(path)
    monkeypatch.setattr(et_mod, "STREAM_THRESHOLD", 0)
    seen = []
    streamed = et_mod.load_execution_trace(path, progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1]
    assert np.array_equal(whole.ids, streamed.ids) and whole.names == streamed.names
    for col in ("parent_ids", "rf_id", "tid", "seq_id", "scope"):
        assert np.array_equal(getattr(whole, col), getattr(streamed, col))
    for col in ("op_schema", "in_values", "in_shapes", "in_types", "out_values", "out_shapes", "out_types"):
        assert getattr(whole, col) == getattr(streamed, col)
    assert whole.comm == streamed.comm and whole.extra == streamed.extra
    assert (whole.schema, whole.pid, whole.finish_ts, whole.rank, whole.world_size, whole.process_groups) == \
        (streamed.schema, streamed.pid, streamed.finish_ts, streamed.rank, streamed.world_size,
         streamed.process_groups)


def test_node_by_node_parse_rejects_bad_input(tmp_path, monkeypatch):
    import chakra_schema.pytorch.execution_trace as et_mod

    monkeypatch.setattr(et_mod, "STREAM_THRESHOLD", 0)
    text = gzip.decompress(require_shared("traces", "param", "linear_et.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) // 2])
    _expect(cut, "invalid JSON")
    junk = tmp_path / "junk.json"
    junk.write_bytes(text[:-2] + b"x}")
    _expect(junk, "invalid JSON")
    kin = tmp_path / "kineto.json"
    kin.write_bytes(gzip.decompress(
        require_shared("traces", "hta", "execution_trace_benchmark_simple_add_trace.json.gz").read_bytes()))
    _expect(kin, "looks like a Kineto trace")
    arr = tmp_path / "array.json"
    arr.write_bytes(b"[1, 2]")
    _expect(arr, "invalid JSON")
    nonodes = tmp_path / "nonodes.json"
    nonodes.write_bytes(b'{"schema": "1.1.1", "nodes": []}')
    _expect(nonodes, "no nodes")


def test_gloo_et_without_record_param_comms():
    """Schema 1.1.1 from a CPU DDP run (tests/data/cpu_ddp, gloo): the gloo:* nodes are the transfers,
    issued by the c10d op of the same collective; DDP's three gradient buckets give the sizes."""
    from conftest import DATA

    path = DATA / "cpu_ddp" / "host.0.json.gz"
    if not path.exists():
        pytest.skip("tests/data/cpu_ddp not present")
    et = load_execution_trace(path)
    assert et.schema.startswith("1.1.1") and et.world_size == 2
    g = execution_trace_to_graph(et)
    assert g.validate() == []
    colls = g.collectives()
    assert Counter(g.name[c] for c in colls) == {"gloo:all_reduce": 9, "gloo:broadcast": 3}
    for c in colls:
        res = g.resources[g.resource[c]]
        assert not res.is_gpu and res.index >= 1000  # a worker thread, not the main thread
        [issuer] = g.deps_of(int(c)).tolist()
        assert g.name[issuer].startswith("c10d::") and g.dep_kinds_of(int(c))[0] == EdgeKind.COLLECTIVE
        assert g.attrs[int(c)]["pg_ranks"] == [0, 1]
    sizes = sorted({g.attrs[int(c)]["comm_size"] for c in colls if g.name[c] == "gloo:all_reduce"})
    assert sizes == sorted(4 * n for n in (263040, 264576, 147712))
