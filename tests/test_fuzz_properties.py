"""Property tests (hypothesis): the `.et` writer/reader round trip, and the Kineto / Execution Trace /
`.et` readers on arbitrary input, which must end in a result or a one-line TraceInputError, never
another exception."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_schema.errors import TraceInputError
from chakra_schema.et_def_pb2 import AttributeProto, GlobalMetadata, Node
from chakra_schema.et_io import EtWriter, iter_et
from chakra_schema.graph import EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
from chakra_schema.graph_io import read_graph, write_graph
from chakra_schema.pytorch.converter import RankInputs, convert_rank

# The same examples every run, so CI is reproducible. A wider, random search (a fuzzing campaign):
# LUMOS_SIM_FUZZ_EXAMPLES=2000 LUMOS_SIM_FUZZ_RANDOM=1 pytest tests/test_fuzz_properties.py
FAST = settings(max_examples=int(os.environ.get("LUMOS_SIM_FUZZ_EXAMPLES", "60")), deadline=None,
                derandomize=os.environ.get("LUMOS_SIM_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
u64 = st.integers(0, 2**64 - 1)


# ------------------------------------------------------------------------------- .et round trip
@st.composite
def et_nodes(draw):
    n = draw(st.integers(1, 12))
    nodes = []
    for i in range(n):
        node = Node(id=draw(u64), name=draw(names), type=draw(st.integers(0, 9)),
                    start_time_micros=draw(u64), duration_micros=draw(u64))
        node.data_deps.extend(draw(st.lists(u64, max_size=4)))
        node.ctrl_deps.extend(draw(st.lists(u64, max_size=2)))
        for k in range(draw(st.integers(0, 3))):
            a = AttributeProto(name=f"a{k}")
            choice = draw(st.integers(0, 3))
            if choice == 0:
                a.int64_val = draw(st.integers(-2**63, 2**63 - 1))
            elif choice == 1:
                a.double_val = draw(st.floats(allow_nan=False))
            elif choice == 2:
                a.string_val = draw(names)
            else:
                a.int64_list.values.extend(draw(st.lists(st.integers(-2**63, 2**63 - 1), max_size=4)))
            node.attr.append(a)
        if node.ByteSize() == 0:   # an all-default node serializes to nothing: not writable by design
            node.id = i + 1
        nodes.append(node)
    return nodes


@FAST
@given(nodes=et_nodes(), gz=st.booleans())
def test_et_writer_reader_round_trip_keeps_every_message(tmp_path, nodes, gz):
    path = tmp_path / ("x.0.et.gz" if gz else "x.0.et")
    md = GlobalMetadata(version="0.0.4")
    with EtWriter(path, md) as w:
        w.write_nodes(nodes)
    read = list(iter_et(path))
    assert read[0] == md
    assert [m.SerializeToString() for m in read[1:]] == [m.SerializeToString() for m in nodes]


@st.composite
def graphs(draw):
    b = GraphBuilder(rank=0, world_size=1)
    cpu = b.resource(ResourceKind.CPU_THREAD, 1, 1)
    gpu = b.resource(ResourceKind.GPU_STREAM, 0, 7)
    n = draw(st.integers(1, 15))
    t = 0.0
    for i in range(n):
        on_gpu = draw(st.booleans())
        dur = draw(st.floats(0, 1e6, allow_nan=False))
        b.add_node(draw(names), NodeType.COMP_NODE, OpKind.KERNEL if on_gpu else OpKind.CPU_OP,
                   gpu if on_gpu else cpu, start_us=t, duration_us=dur, node_id=draw(st.integers(0, 2**40)) * 64 + i)
        t += dur
        for src in draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=3, unique=True)):
            if src < i:
                b.add_dep(src, i, EdgeKind.DATA)
    return b.build()


@FAST
@given(g=graphs())
def test_graph_write_read_round_trip(tmp_path, g):
    path = tmp_path / "g.0.et"
    write_graph(g, path)
    back = read_graph(path)
    assert back.node_id.tolist() == g.node_id.tolist()
    assert back.name == g.name
    assert np.allclose(back.duration_us, g.duration_us) and np.allclose(back.start_us, g.start_us)
    assert sorted(back.edges()) == sorted(g.edges())


# -------------------------------------------------------------------------- readers on bad input
def _ends_cleanly(fn, path):
    try:
        fn(path)
    except TraceInputError as e:
        assert "\n" not in str(e)


@FAST
@given(data=st.binary(max_size=2000), gz=st.booleans())
def test_et_reader_on_arbitrary_bytes_raises_only_trace_input_error(tmp_path, data, gz):
    path = tmp_path / ("x.et.gz" if gz else "x.et")
    path.write_bytes(gzip.compress(data) if gz else data)
    _ends_cleanly(read_graph, path)


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), names)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                  st.dictionaries(names, inner, max_size=3)),
                           max_leaves=8)
CATS = ["cpu_op", "user_annotation", "kernel", "gpu_memcpy", "cuda_runtime", "cuda_driver", "cuda_sync",
        "fwdbwd", "gpu_user_annotation", "Trace", "python_function"]


@st.composite
def kineto_events(draw):
    ev = {"ph": draw(st.sampled_from(["X", "X", "X", "s", "f", "M", "i", 5])),
          "cat": draw(st.one_of(st.sampled_from(CATS), json_scalars)),
          "name": draw(st.one_of(names, json_scalars)),
          "pid": draw(st.one_of(st.integers(0, 5), json_scalars)),
          "tid": draw(st.one_of(st.integers(0, 9), json_scalars)),
          "ts": draw(st.one_of(st.floats(0, 1e6), json_scalars)),
          "dur": draw(st.one_of(st.floats(-10, 1e6), st.just(1e308), json_scalars)),
          "args": draw(st.one_of(st.fixed_dictionaries(
              {}, optional={"correlation": st.integers(0, 20), "External id": st.integers(0, 20),
                            "stream": st.integers(0, 9), "device": st.integers(0, 2),
                            "Record function id": st.integers(0, 20), "name": names}), json_values))}
    drop = draw(st.lists(st.sampled_from(sorted(ev)), max_size=2))
    return {k: v for k, v in ev.items() if k not in drop}


@FAST
@given(events=st.lists(kineto_events(), max_size=25), extra=st.dictionaries(names, json_values, max_size=2))
def test_kineto_converter_on_random_events_raises_only_trace_input_error(tmp_path, events, extra):
    path = tmp_path / "k.json"
    path.write_text(json.dumps({**extra, "traceEvents": events}))
    _ends_cleanly(lambda p: convert_rank(RankInputs(None, str(p))), path)


@st.composite
def et_json_nodes(draw):
    node = {"id": draw(st.one_of(st.integers(0, 30), json_scalars)),
            "name": draw(st.one_of(st.sampled_from(["aten::mm", "[pytorch|profiler|execution_trace|thread]",
                                                    "record_param_comms", "ProfilerStep#1"]), json_scalars)),
            "ctrl_deps": draw(st.one_of(st.integers(0, 30), json_scalars)),
            "inputs": draw(st.one_of(st.fixed_dictionaries({"values": json_values, "shapes": json_values,
                                                            "types": json_values}), json_values)),
            "outputs": draw(json_values),
            "attrs": draw(st.one_of(st.lists(st.fixed_dictionaries(
                {"name": st.sampled_from(["rf_id", "tid", "fw_parent", "seq_id", "scope", "op_schema", "x"]),
                 "type": st.sampled_from(["uint64", "int64", "string", "bool"]), "value": json_values}),
                max_size=6), json_values))}
    drop = draw(st.lists(st.sampled_from(sorted(node)), max_size=2))
    return {k: v for k, v in node.items() if k not in drop}


@FAST
@given(nodes=st.lists(et_json_nodes(), max_size=12), header=st.dictionaries(
    st.sampled_from(["schema", "pid", "time", "start_ts", "finish_ts"]), json_scalars))
def test_execution_trace_converter_on_random_nodes_raises_only_trace_input_error(tmp_path, nodes, header):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({**header, "nodes": nodes}))
    _ends_cleanly(lambda p: convert_rank(RankInputs(str(p), None)), path)


@pytest.mark.parametrize("text", ["", "[]", "{}", "null", '{"traceEvents": 5}', '{"nodes": {}}', "\x00" * 100])
def test_degenerate_json_documents_are_one_line_errors(tmp_path, text):
    path = tmp_path / "t.json"
    path.write_text(text)
    for inputs in (RankInputs(None, str(path)), RankInputs(str(path), None)):
        with pytest.raises(TraceInputError):
            convert_rank(inputs)
