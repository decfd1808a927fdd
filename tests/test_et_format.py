"""The .et wire format: our reader/writer against real Chakra and ASTRA-sim files, an independent wire
decoder, the graph mapping, bad input and atomic writes."""
from __future__ import annotations

import gzip
import importlib.util
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.et_def_pb2 import AttributeProto, GlobalMetadata, Node
from chakra_schema.et_io import EtWriter, encode_varint, iter_et, read_et
from chakra_schema.graph import (CommType, EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind)
from chakra_schema.graph_io import (RESOURCE_ATTRS, graph_paths, read_graph, read_graphs, write_graph)
from conftest import ROOT, require_shared
from wire_decoder import decode_et

COMM_ATTRS = ("comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name")


# ------------------------------------------------------------------ real files


def astra_files() -> list[Path]:
    return sorted(require_shared("traces", "astra-sim").rglob("*.et"))


@pytest.fixture(scope="module")
def real_files(chakra_et) -> list[Path]:
    files = astra_files() + [chakra_et]
    assert len(files) == 4 + 8 + 16 + 8 + 1
    return files


def test_chakra_converter_file_has_the_documented_nodes(chakra_et):
    md, nodes = read_et(chakra_et)
    types = [n.type for n in nodes]
    assert len(nodes) == 3664
    assert types.count(NodeType.COMP_NODE) == 3643
    assert types.count(NodeType.COMM_COLL_NODE) == 21
    assert min(n.id for n in nodes) == 216 and max(n.id for n in nodes) == 7022
    assert {a.name: a.string_val for a in md.attr}["schema"] == "1.0.1"


def test_raw_rewrite_gives_the_same_messages(real_files, tmp_path):
    for path in real_files:
        md, nodes = read_et(path)
        for suffix in (".et", ".et.gz"):
            out = tmp_path / (path.stem + suffix)
            with EtWriter(out, md) as w:
                w.write_nodes(nodes)
            md2, nodes2 = read_et(out)
            assert md2 == md, path
            assert nodes2 == nodes, path
            if suffix == ".et.gz":
                assert out.read_bytes()[:2] == b"\x1f\x8b"
        # plain rewrite is byte-identical: same framing, same serialization
        if path.suffix == ".et":
            assert (tmp_path / (path.stem + ".et")).read_bytes() == path.read_bytes(), path


def test_independent_decoder_agrees_with_protobuf_reader(real_files):
    for path in real_files:
        md, nodes = read_et(path)
        dmd, dnodes = decode_et(path)
        assert dmd["version"] == md.version
        assert [a["name"] for a in dmd["attr"]] == [a.name for a in md.attr]
        assert [n["id"] for n in dnodes] == [n.id for n in nodes], path
        assert [n["name"] for n in dnodes] == [n.name for n in nodes]
        assert [n["type"] for n in dnodes] == [n.type for n in nodes]
        assert [n["data_deps"] for n in dnodes] == [list(n.data_deps) for n in nodes]
        assert [n["ctrl_deps"] for n in dnodes] == [list(n.ctrl_deps) for n in nodes]
        assert [n["duration_micros"] for n in dnodes] == [n.duration_micros for n in nodes]
        for dn, n in zip(dnodes, nodes):
            assert [(a["name"], a["field"]) for a in dn["attr"]] == [(a.name, a.WhichOneof("value")) for a in n.attr]
            for da, a in zip(dn["attr"], n.attr):
                v = getattr(a, a.WhichOneof("value"))
                assert da["value"] == (list(v.values) if da["field"].endswith("_list") else v)
            if n.HasField("inputs"):
                assert dn["inputs"]["shapes"] == n.inputs.shapes


def _dep_ids(g, i):
    return sorted(int(g.node_id[s]) for s in g.deps_of(i))


def test_foreign_files_round_trip_through_the_graph(real_files, tmp_path):
    for path in real_files:
        g = read_graph(path)
        assert not g.validate(), path
        _md, nodes = read_et(path)
        present = {n.id for n in nodes}
        # the graph keeps ids, names, types and every data dep whose source is in the file
        assert g.node_id.tolist() == [n.id for n in nodes]
        assert g.name == [n.name for n in nodes]
        assert g.node_type.tolist() == [n.type for n in nodes]
        for i, n in enumerate(nodes):
            assert _dep_ids(g, i) == sorted({d for d in n.data_deps if d in present and d != n.id})
        out = tmp_path / path.name
        write_graph(g, out)
        g2 = read_graph(out)
        for col in ("node_id", "node_type", "kind", "resource", "start_us", "duration_us", "parent", "dep_ptr",
                    "dep_src", "dep_kind"):
            assert np.array_equal(getattr(g, col), getattr(g2, col)), (path, col)
        assert g2.name == g.name
        assert g2.resources == g.resources
        assert g2.steps == g.steps
        for i in range(len(g)):
            a, a2 = g.attrs.get(i, {}), g2.attrs.get(i, {})
            assert {k: a.get(k) for k in COMM_ATTRS} == {k: a2.get(k) for k in COMM_ATTRS}
            strip = lambda d: {k: v for k, v in d.items() if k not in RESOURCE_ATTRS}  # noqa: E731
            assert strip(a2) == strip(a), (path, i)
        # second trip is exact, resource attrs included
        write_graph(g2, tmp_path / ("again." + path.name))
        assert read_graph(tmp_path / ("again." + path.name)).attrs == g2.attrs


def test_foreign_kinds_resources_and_dropped_deps(chakra_et):
    g = read_graph(chakra_et)
    _md, dnodes = decode_et(chakra_et)
    ids = {n["id"] for n in dnodes}
    absent_ctrl = sum(1 for n in dnodes for d in n["ctrl_deps"] if d not in ids)
    absent_data = sum(1 for n in dnodes for d in n["data_deps"] if d not in ids)
    assert absent_ctrl > 1000  # Chakra's converter points ctrl_deps at pruned nodes
    assert g.metadata.get("dropped_ctrl_deps", 0) == absent_ctrl
    assert g.metadata.get("dropped_deps", 0) == absent_data
    kinds = g.kind
    gpu_coll = sum(1 for n in dnodes if n["type"] == NodeType.COMM_COLL_NODE and not n["attrs"]["is_cpu_op"])
    assert int((kinds == OpKind.COLLECTIVE).sum()) == gpu_coll == 7
    host = np.array([n["attrs"]["is_cpu_op"] for n in dnodes])
    assert not g.is_gpu()[host].any() and g.is_gpu()[~host].all()
    # GPU ops of old Chakra files carry their stream in `tid`
    for i in np.flatnonzero(~host)[:50]:
        assert g.resources[g.resource[i]].index == dnodes[i]["attrs"]["tid"]
    coll = np.flatnonzero(kinds == OpKind.COLLECTIVE)
    assert sorted(CommType(g.attr(i, "comm_type")).name for i in coll) == ["ALL_REDUCE"] * 5 + ["BROADCAST"] * 2


def test_astra_sim_sets_read_by_prefix():
    root = require_shared("traces", "astra-sim")
    graphs = read_graphs(root / "custom_ring_allreduce_8npus" / "custom_allreduce")
    assert [g.rank for g in graphs] == list(range(8))
    assert all(g.world_size == 8 for g in graphs)
    for g in graphs:
        assert int((g.kind == OpKind.SEND).sum()) == 14 and int((g.kind == OpKind.RECV).sum()) == 14
        assert int((g.kind == OpKind.KERNEL).sum()) == 7
        send = int(np.flatnonzero(g.kind == OpKind.SEND)[0])
        assert g.attr(send, "comm_dst") == (g.rank + 1) % 8  # a ring: each rank sends to the next
    ag = read_graphs(root / "all_to_all_16npus_1MB" / "all_to_all")
    assert len(ag) == 16
    assert {g.attr(0, "comm_size") for g in ag} == {1 << 20}
    assert {CommType(g.attr(0, "comm_type")) for g in ag} == {CommType.ALL_TO_ALL}
    assert graph_paths(root / "all_gather_4npus_1MB" / "all_gather.2.et") == {
        2: root / "all_gather_4npus_1MB" / "all_gather.2.et"}


# ------------------------------------------------------------------ our own graphs


def _sample_graph():
    b = GraphBuilder(rank=3, world_size=8)
    cpu = b.resource(ResourceKind.CPU_THREAD, 4242, 17, "main thread")
    gpu = b.resource(ResourceKind.GPU_STREAM, 3, 7)
    step = b.add_node("ProfilerStep#12", NodeType.COMP_NODE, OpKind.ANNOTATION, cpu, 100.25, 900.5, node_id=1)
    mm = b.add_node("aten::mm", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 101.0, 20.0, parent=step,
                    attrs={"input_shapes": [[128, 256], [256, 64]], "input_types": ["c10::BFloat16"] * 2,
                           "op_schema": "aten::mm(Tensor self, Tensor mat2) -> Tensor", "rf_id": 9,
                           "flops": 4194304.0, "causal": True, "grid": [4, 1, 1]})
    launch = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, 110.5, 4.125, parent=mm)
    k = b.add_node("sm90_gemm", NodeType.COMP_NODE, OpKind.KERNEL, gpu, 118.0005, 33.3,
                   attrs={"stream": 7, "device": 3, "correlation": 77, "tensor_size": 65536, "num_ops": 12})
    coll = b.add_node("nccl:all_reduce", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, gpu, 160.0, 250.0,
                      attrs={"comm_type": int(CommType.ALL_REDUCE), "comm_size": 1 << 26, "pg_name": "dp",
                             "pg_ranks": [0, 1, 2, 3, 4, 5, 6, 7], "comm_priority": 1, "extra": {"a": [1, 2]}})
    send = b.add_node("send", NodeType.COMM_SEND_NODE, OpKind.SEND, gpu, 420.0, 10.0,
                      attrs={"comm_dst": 4, "comm_tag": 5, "comm_size": 4096})
    wait = b.add_node("cudaStreamSynchronize", NodeType.COMP_NODE, OpKind.SYNC, cpu, 430.0, 2.0, parent=step)
    b.add_dep(launch, k, EdgeKind.LAUNCH)
    b.add_dep(k, coll, EdgeKind.STREAM_ORDER)
    b.add_dep(mm, coll, EdgeKind.DATA)
    b.add_dep(coll, send, EdgeKind.STREAM_ORDER)
    b.add_dep(send, wait, EdgeKind.SYNC)
    b.add_step("ProfilerStep#12", step, 100.25, 900.5)
    b.metadata["model"] = "tiny"
    b.metadata["note"] = {"nested": True}
    return b.build()


def test_our_graph_decodes_with_the_independent_decoder(tmp_path):
    g = _sample_graph()
    path = tmp_path / "job.3.et"
    write_graph(g, path)
    md, nodes = decode_et(path)
    assert md["version"] == "0.0.4"
    assert md["attrs"]["rank"] == 3 and md["attrs"]["world_size"] == 8
    assert [n["id"] for n in nodes] == g.node_id.tolist()
    assert [n["type"] for n in nodes] == g.node_type.tolist()
    by_name = {n["name"]: n for n in nodes}
    # times: whole microseconds on the Chakra fields, exact nanoseconds in lumos attrs when needed
    step = by_name["ProfilerStep#12"]
    assert step["start_time_micros"] == 100 and step["duration_micros"] == 900  # round half to even
    assert step["attrs"]["lumos_start_ns"] == 100250 and step["attrs"]["lumos_dur_ns"] == 900500
    assert "lumos_start_ns" not in by_name["aten::mm"]["attrs"]
    # call stack and data deps by id
    assert by_name["aten::mm"]["ctrl_deps"] == [1]
    assert by_name["nccl:all_reduce"]["data_deps"] == sorted([by_name["sm90_gemm"]["id"], by_name["aten::mm"]["id"]])
    # the oneof members ASTRA-sim's feeder reads
    types = {(n["name"], a["name"]): a["field"] for n in nodes for a in n["attr"]}
    assert types[("nccl:all_reduce", "is_cpu_op")] == "bool_val"
    assert types[("nccl:all_reduce", "comm_type")] == "int64_val"
    assert types[("nccl:all_reduce", "comm_size")] == "int64_val"
    assert types[("nccl:all_reduce", "comm_priority")] == "int32_val"
    assert types[("nccl:all_reduce", "pg_name")] == "string_val"
    assert types[("nccl:all_reduce", "pg_ranks")] == "int64_list"
    assert types[("send", "comm_dst")] == "int32_val" and types[("send", "comm_tag")] == "int32_val"
    assert types[("sm90_gemm", "tensor_size")] == "uint64_val" and types[("sm90_gemm", "num_ops")] == "int64_val"
    assert types[("aten::mm", "flops")] == "double_val" and types[("aten::mm", "causal")] == "bool_val"
    assert types[("aten::mm", "lumos_kind")] == "int64_val"
    # resources in Chakra's convention
    assert by_name["aten::mm"]["attrs"]["is_cpu_op"] is True
    assert by_name["aten::mm"]["attrs"]["tid"] == 17 and by_name["aten::mm"]["attrs"]["pid"] == 4242
    assert by_name["sm90_gemm"]["attrs"]["is_cpu_op"] is False
    assert by_name["sm90_gemm"]["attrs"]["stream"] == 7 and by_name["sm90_gemm"]["attrs"]["device"] == 3
    # dep kinds parallel to data_deps, shapes as Chakra strings
    coll = by_name["nccl:all_reduce"]
    kinds = dict(zip(coll["data_deps"], coll["attrs"]["lumos_dep_kinds"]))
    assert kinds == {by_name["sm90_gemm"]["id"]: EdgeKind.STREAM_ORDER, by_name["aten::mm"]["id"]: EdgeKind.DATA}
    assert by_name["aten::mm"]["inputs"]["shapes"] == "[[128, 256], [256, 64]]"
    assert by_name["aten::mm"]["inputs"]["types"] == "['c10::BFloat16', 'c10::BFloat16']"


@pytest.mark.parametrize("name", ["job.3.et", "job.3.et.gz"])
def test_our_graph_round_trips_exactly(tmp_path, name):
    g = _sample_graph()
    path = tmp_path / name
    write_graph(g, path)
    g2 = read_graph(path)
    assert g2.rank == 3 and g2.world_size == 8
    for col in ("node_id", "node_type", "kind", "resource", "start_us", "duration_us", "parent", "dep_ptr",
                "dep_src", "dep_kind"):
        assert np.array_equal(getattr(g, col), getattr(g2, col)), col
    assert g2.name == g.name and g2.resources == g.resources and g2.steps == g.steps
    for i in range(len(g)):
        a2 = {k: v for k, v in g2.attrs.get(i, {}).items() if k not in RESOURCE_ATTRS or k in g.attrs.get(i, {})}
        assert a2 == g.attrs.get(i, {}), i
    assert g2.metadata["model"] == "tiny" and g2.metadata["note"] == {"nested": True}


def test_steps_come_from_profiler_step_nodes_when_not_stored(tmp_path):
    path = tmp_path / "foreign.et"
    with EtWriter(path, GlobalMetadata(version="0.0.4")) as w:
        w.write_node(Node(id=1, name="ProfilerStep#7", type=NodeType.COMP_NODE, start_time_micros=500,
                          duration_micros=300, attr=[AttributeProto(name="is_cpu_op", bool_val=True)]))
        w.write_node(Node(id=2, name="ProfilerStep#6", type=NodeType.COMP_NODE, start_time_micros=100,
                          duration_micros=350, attr=[AttributeProto(name="is_cpu_op", bool_val=True)]))
        w.write_node(Node(id=3, name="aten::add", type=NodeType.COMP_NODE, ctrl_deps=[2], data_deps=[99, 2],
                          start_time_micros=120, duration_micros=5,
                          attr=[AttributeProto(name="is_cpu_op", bool_val=True)]))
    g = read_graph(path)
    assert [(s.name, s.node, s.start_us, s.duration_us) for s in g.steps] == [
        ("ProfilerStep#6", 1, 100.0, 350.0), ("ProfilerStep#7", 0, 500.0, 300.0)]
    assert g.kind.tolist() == [OpKind.ANNOTATION, OpKind.ANNOTATION, OpKind.CPU_OP]
    assert g.parent.tolist() == [-1, -1, 1]
    assert g.metadata["dropped_deps"] == 1 and g.deps_of(2).tolist() == [1]


def test_unpacked_repeated_deps_are_read_by_both_decoders(tmp_path):
    # proto3 writers pack repeated varints, but parsers must accept the unpacked form too
    body = bytearray()
    body += b"\x08" + encode_varint(5)                    # id = 5
    body += b"\x12\x01x"                                  # name = "x"
    body += b"\x18\x04"                                   # type = COMP_NODE
    for dep in (3, 4):
        body += b"\x28" + encode_varint(dep)              # data_deps, field 5, wire type 0 (unpacked)
    body += b"\x2a\x02" + encode_varint(1) + encode_varint(2)  # and one packed run
    md = GlobalMetadata(version="0.0.4").SerializeToString()
    path = tmp_path / "unpacked.et"
    path.write_bytes(encode_varint(len(md)) + md + encode_varint(len(body)) + bytes(body))
    _md, nodes = read_et(path)
    _dmd, dnodes = decode_et(path)
    assert list(nodes[0].data_deps) == dnodes[0]["data_deps"] == [3, 4, 1, 2]


def test_zero_length_message_ends_the_file(tmp_path):
    md = GlobalMetadata(version="0.0.4").SerializeToString()
    node = Node(id=1, name="a").SerializeToString()
    path = tmp_path / "eof.et"
    path.write_bytes(encode_varint(len(md)) + md + encode_varint(len(node)) + node + b"\x00" + os.urandom(64))
    assert len(read_et(path)[1]) == 1
    assert len(decode_et(path)[1]) == 1


def test_reader_streams_without_loading_the_file(tmp_path):
    path = tmp_path / "big.et"
    payload = "x" * 400
    with EtWriter(path, GlobalMetadata(version="0.0.4")) as w:
        for i in range(1, 30001):
            w.write_node(Node(id=i, name=f"{payload}{i}", type=NodeType.COMP_NODE, data_deps=[i - 1] if i > 1 else []))
    size = path.stat().st_size
    assert size > 12_000_000
    tracemalloc.start()
    try:
        count = 0
        for msg in iter_et(path):
            count += 1
        _cur, peak = tracemalloc.get_traced_memory()
    finally:   # never left running for the tests after this one (it slows every allocation)
        tracemalloc.stop()
    assert count == 30001
    assert peak < 4_000_000, f"peak {peak} bytes while streaming a {size}-byte file"


# ------------------------------------------------------------------ bad input


def _valid_et(tmp_path: Path, name: str = "ok.et") -> Path:
    path = tmp_path / name
    with EtWriter(path, GlobalMetadata(version="0.0.4")) as w:
        for i in range(1, 200):
            w.write_node(Node(id=i, name=f"node{i}", type=NodeType.COMP_NODE, duration_micros=i))
    return path


def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    """Files every reader must reject with TraceInputError (shared with the CLI tests)."""
    good = _valid_et(tmp_path).read_bytes()
    md = GlobalMetadata(version="0.0.4").SerializeToString()
    node = Node(id=1, name="n").SerializeToString()
    cases = {
        "empty": b"",
        "truncated_gz": gzip.compress(good)[: len(gzip.compress(good)) // 2],
        "corrupt_gz": b"\x1f\x8b" + bytes(random.Random(1).randrange(256) for _ in range(300)),
        "prefix_past_end": good[:-5],
        "huge_prefix": encode_varint(len(md)) + md + encode_varint(3 << 30) + b"\x08\x01",
        "unterminated_prefix": encode_varint(len(md)) + md + b"\xff\xff\xff",
        "random_bytes": bytes(random.Random(7).randrange(256) for _ in range(4096)),
        "node_first_then_garbage": encode_varint(len(node)) + node + b"\x03\xff\xff\xff",
        "empty_first_message": b"\x00" + good,
        "garbage_node": encode_varint(len(md)) + md + b"\x03\xff\xff\xff",
        "text_file": b"hello, this is not a trace\n" * 10,
    }
    paths = {}
    for name, data in cases.items():
        p = tmp_path / f"{name}.et"
        p.write_bytes(data)
        paths[name] = p
    return paths


def test_bad_input_raises_trace_input_error_naming_the_file(tmp_path):
    for name, path in bad_inputs(tmp_path).items():
        with pytest.raises(TraceInputError) as err:
            list(iter_et(path))
        assert err.value.path == str(path), name
        assert str(path) in str(err.value) and "\n" not in str(err.value)
        with pytest.raises(TraceInputError):
            read_graph(path)
    with pytest.raises(TraceInputError, match="cannot open"):
        list(iter_et(tmp_path / "missing.et"))


def test_bad_input_messages_say_what_is_wrong(tmp_path):
    paths = bad_inputs(tmp_path)
    expect = {"empty": "empty file", "truncated_gz": "gzip", "prefix_past_end": "claims",
              "huge_prefix": "exceeds", "node_first_then_garbage": "does not parse", "garbage_node": "does not parse",
              "empty_first_message": "GlobalMetadata", "unterminated_prefix": "truncated length prefix",
              "text_file": "neither a Chakra GlobalMetadata nor a Node"}
    for name, needle in expect.items():
        with pytest.raises(TraceInputError, match=needle):
            list(iter_et(paths[name]))


def test_a_file_of_the_older_schema_without_global_metadata_reads_as_its_nodes(tmp_path):
    # ASTRA-sim's 2023 example workloads (runs/example/workload/resnet50_DataParallel.*.et) start with
    # their first Node: Chakra wrote no GlobalMetadata then
    path = tmp_path / "old.0.et"
    nodes = [Node(id=0, name="COMP_NODE_conv1_FWD", type=NodeType.COMP_NODE, duration_micros=13003),
             Node(id=1, name="COMM_COLL_NODE_fc1000_ALLREDUCE", type=NodeType.COMM_COLL_NODE, ctrl_deps=[0],
                  attr=[AttributeProto(name="comm_type", int64_val=0),
                        AttributeProto(name="comm_size", int64_val=8192000)])]
    path.write_bytes(b"".join(encode_varint(len(m)) + m for m in (n.SerializeToString() for n in nodes)))
    md, read = read_et(path)
    assert md == GlobalMetadata() and [n.name for n in read] == [n.name for n in nodes]
    g = read_graph(path)
    assert list(g.name) == [n.name for n in nodes] and list(g.duration_us) == [13003.0, 0.0]
    assert g.attr(1, "comm_size") == 8192000


def test_missing_prefix_and_ambiguous_ranks(tmp_path):
    assert graph_paths(tmp_path / "nothing") == {}
    with pytest.raises(TraceInputError):
        read_graphs(tmp_path / "nothing")
    g = _sample_graph()
    write_graph(g, tmp_path / "set.0.et")
    write_graph(g, tmp_path / "set.1.et.gz")
    assert sorted(graph_paths(tmp_path / "set")) == [0, 1]
    write_graph(g, tmp_path / "set.1.et")
    with pytest.raises(TraceInputError, match="rank 1"):
        graph_paths(tmp_path / "set")


# ------------------------------------------------------------------ writer


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_writer_exception_leaves_no_file(tmp_path):
    target = tmp_path / "out.et.gz"
    with pytest.raises(RuntimeError):
        with EtWriter(target, GlobalMetadata(version="0.0.4")) as w:
            for i in range(1, 100_000):
                w.write_node(Node(id=i, name="n" * 50))
                if i == 50_000:
                    raise RuntimeError("boom")
    assert _leftovers(tmp_path) == []
    # an existing file is left untouched by a failed rewrite
    target.write_bytes(b"previous")
    with pytest.raises(RuntimeError):
        with EtWriter(target, GlobalMetadata(version="0.0.4")) as w:
            w.write_node(Node(id=1, name="a"))
            raise RuntimeError("boom")
    assert target.read_bytes() == b"previous" and _leftovers(tmp_path) == ["out.et.gz"]


def test_writer_refuses_messages_that_would_read_as_end_of_file(tmp_path):
    target = tmp_path / "out.et"
    with pytest.raises(ValueError, match="zero bytes"):
        with EtWriter(target, GlobalMetadata(version="0.0.4")) as w:
            w.write_node(Node(id=1, name="fine"))
            w.write_node(Node())
    assert _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="zero bytes"):
        with EtWriter(target, GlobalMetadata()):
            pass
    with pytest.raises(ValueError, match="before any Node"):
        with EtWriter(target) as w:
            w.write_node(Node(id=1))
    with pytest.raises(ValueError, match="no GlobalMetadata"):
        with EtWriter(target):
            pass
    assert _leftovers(tmp_path) == []
    # the graph writer never emits an empty node: even an id-0 nameless node carries its lumos_kind
    # (ASTRA-sim's microbenchmarks do use id 0)
    b = GraphBuilder()
    b.add_node("", NodeType.INVALID_NODE, OpKind.CPU_OP, -1, node_id=0)
    write_graph(b.build(), target)
    assert read_graph(target).node_id.tolist() == [0]


def test_written_files_get_normal_permissions(tmp_path):
    path = _valid_et(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


# ------------------------------------------------------------------ generated code


def test_generated_protobuf_code_matches_the_proto():
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools not installed (pip install 'lumos-sim[dev]'): cannot regenerate et_def_pb2.py")
    proc = subprocess.run([sys.executable, "-m", "chakra_schema.regenerate_proto", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_proto_enums_match_the_graph_contract():
    from chakra_schema import et_def_pb2 as pb

    assert {v.name: v.number for v in pb.NodeType.DESCRIPTOR.values} == {t.name: int(t) for t in NodeType}
    assert {v.name: v.number for v in pb.CollectiveCommType.DESCRIPTOR.values} == {c.name: int(c) for c in CommType}
    oneof = AttributeProto.DESCRIPTOR.oneofs_by_name["value"]
    assert [f.number for f in oneof.fields] == list(range(3, 33))
