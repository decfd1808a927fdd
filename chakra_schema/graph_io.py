"""`ExecutionGraph` <-> Chakra `.et` files.

What goes where (the file stays a valid Chakra trace for ASTRA-sim and Chakra's tools):
- Node id / name / type are the graph's columns; `ctrl_deps` = [id of the call-stack parent];
  `data_deps` = ids of the node's deps (in the graph's CSR order).
- `start_time_micros` / `duration_micros` are the recorded times rounded to whole microseconds. When a
  time is not a whole microsecond, the exact value is added so our own round trip is lossless: int64
  attr `lumos_start_ns` / `lumos_dur_ns` when the time is a whole nanosecond (trace timestamps), else
  double attr `lumos_start_us` / `lumos_dur_us`.
- `lumos_kind` (int64, OpKind) on every node; `lumos_dep_kinds` (int64_list parallel to data_deps) when
  any dep is not a plain DATA dep.
- Resource order as explicit deps: Chakra consumers (ASTRA-sim's ETFeeder) issue a node once its data
  deps are done and know nothing of our per-thread / per-stream node order, so every node whose previous
  node on the same CPU thread (GPU stream) is not already one of its deps gets that node appended to its
  `data_deps` (kind THREAD_ORDER / STREAM_ORDER); a node nested in the op before it (its ctrl dep) takes
  the op before that one instead. Int64 attr `lumos_order_deps` counts these
  trailing deps. Our reader drops them again (the order is implicit in the graph), so the graph - and
  its replay - is the same as before the round trip.
- The resource in Chakra's convention: CPU nodes `is_cpu_op`=true, `tid`, `pid`; GPU nodes
  `is_cpu_op`=false, `stream`, `device` (int64). The metadata keeps the resource table (order, names)
  in `lumos_res_*` lists so resource indices survive.
- Sparse attrs with the oneof type the ASTRA-sim feeder expects for its names (`FEEDER_TYPES`), else by
  Python type: bool -> bool_val, int -> int64_val, float -> double_val, str -> string_val, lists ->
  *_list; anything else (dicts, nested lists) -> string_val holding JSON, marked doc_string="json".
- `input_shapes` / `input_types` / `input_values` (and output_*) go to Node.inputs / Node.outputs as
  Python `str()` of the lists, as Chakra does, and come back as lists (`ast.literal_eval` semantics;
  text that does not parse stays a string; `*_values`, Chakra's tensor tuples, stay text).
- GlobalMetadata: version "0.0.4", attrs `rank`, `world_size`, the steps (`lumos_step_*` lists) and the
  graph's other metadata entries.

Reading foreign files (Chakra's converter, ASTRA-sim microbenchmarks): the OpKind is inferred from the
node type and `is_cpu_op` (see `_infer_kind`; a node without `is_cpu_op`, as in ASTRA-sim's files, is GPU
work), the resource from `tid` / `stream` (defaults CPU thread 0, GPU stream 0); deps naming ids absent from the file are dropped and counted in
`graph.metadata['dropped_deps']` / `['dropped_ctrl_deps']` (Chakra's converter writes such deps); steps
come from `ProfilerStep#N` nodes when the file has no step table.

After a read, a node's attrs are the file's attrs minus the ones turned back into columns (`is_cpu_op`
and the `lumos_*` attrs above); the resource keys `tid`/`pid` or `stream`/`device` stay in attrs, so
every graph read from a file has them. The writer writes them from the node's resource (pid / device
only when nonzero), so a graph whose attrs lacked them gains them after one round trip; from then on
the round trip is exact.
"""
from __future__ import annotations

import ast
import json
import logging
import os
import re
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Union

import numpy as np
import orjson

from google.protobuf.message import DecodeError

from chakra_schema.errors import TraceInputError
from chakra_schema.et_def_pb2 import AttributeProto, GlobalMetadata, IOInfo, Node
from chakra_schema.et_io import EtWriter, encode_varint, iter_et
from chakra_schema.graph import EdgeKind, ExecutionGraph, GraphBuilder, NodeType, OpKind, ResourceKind

log = logging.getLogger(__name__)

__all__ = ["ET_VERSION", "FEEDER_TYPES", "RESOURCE_ATTRS", "attr_to_value", "graph_paths", "order_deps_written",
           "read_graph", "read_graphs", "value_to_attr", "write_graph", "write_graphs"]

PathLike = Union[str, os.PathLike]
Progress = Callable[[int, int], None]

ET_VERSION = "0.0.4"

# The oneof member ASTRA-sim's feeder reads for these names: writing another type would make it see 0.
FEEDER_TYPES = {
    "is_cpu_op": "bool_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_priority": "int32_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "pg_name": "string_val",
}

# Attrs that are columns of the graph, not entries of `graph.attrs`.
_KIND, _START_NS, _DUR_NS, _DEP_KINDS = "lumos_kind", "lumos_start_ns", "lumos_dur_ns", "lumos_dep_kinds"
_START_US, _DUR_US = "lumos_start_us", "lumos_dur_us"
_ORDER_DEPS = "lumos_order_deps"
_COLUMN_ATTRS = {_KIND, _START_NS, _DUR_NS, _START_US, _DUR_US, _DEP_KINDS, _ORDER_DEPS, "is_cpu_op"}
RESOURCE_ATTRS = ("tid", "pid", "stream", "device")  # encode a node's resource; kept in attrs on read
# attrs <-> IOInfo fields
_IO_ATTRS = {"input": ("inputs", {"values": "input_values", "shapes": "input_shapes", "types": "input_types"}),
             "output": ("outputs", {"values": "output_values", "shapes": "output_shapes",
                                    "types": "output_types"})}
_IO_KEYS = {key for _, fields in _IO_ATTRS.values() for key in fields.values()}
# GlobalMetadata attrs that are graph fields, not entries of `graph.metadata`
_STEP_ATTRS = ("lumos_step_names", "lumos_step_nodes", "lumos_step_start_us", "lumos_step_dur_us")
_RES_ATTRS = ("lumos_res_kind", "lumos_res_device", "lumos_res_index", "lumos_res_name")
_META_COLUMNS = {"rank", "world_size", *_STEP_ATTRS, *_RES_ATTRS}
# set by the reader, describe the file read (file_*_deps: the dep ids as stored, order deps included)
_META_NOT_WRITTEN = {"source", "et_version", "file_data_deps", "file_ctrl_deps"}

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+")


# ------------------------------------------------------------------ attribute values


def _plain(value: Any) -> Any:
    """numpy scalars/arrays -> Python values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def value_to_attr(attr: AttributeProto, name: str, value: Any) -> None:
    """Fill `attr` with `name` and `value` using the oneof member Chakra consumers expect."""
    attr.name = name
    value = _plain(value)
    typed = FEEDER_TYPES.get(name)
    if typed is not None and value is not None and not isinstance(value, (list, tuple, dict)):
        if typed == "bool_val":
            attr.bool_val = bool(value)
        elif typed == "string_val":
            attr.string_val = str(value)
        else:
            setattr(attr, typed, int(value))
        return
    if isinstance(value, bool):
        attr.bool_val = value
    elif isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            attr.int64_val = value
        elif 0 <= value < (1 << 64):
            attr.uint64_val = value
        else:
            _json_attr(attr, value)
    elif isinstance(value, float):
        attr.double_val = value
    elif isinstance(value, str):
        attr.string_val = value
    elif isinstance(value, bytes):
        attr.bytes_val = value
    elif isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        if all(isinstance(v, bool) for v in items) and items:
            attr.bool_list.values.extend(items)
        elif all(isinstance(v, int) and not isinstance(v, bool) and _INT64_MIN <= v <= _INT64_MAX
                 for v in items):
            attr.int64_list.values.extend(items)  # also the empty list
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            attr.double_list.values.extend(float(v) for v in items)
        elif all(isinstance(v, str) for v in items):
            attr.string_list.values.extend(items)
        elif all(isinstance(v, bytes) for v in items):
            attr.bytes_list.values.extend(items)
        else:
            _json_attr(attr, items)
    else:
        _json_attr(attr, value)


def _json_attr(attr: AttributeProto, value: Any) -> None:
    try:
        attr.string_val = json.dumps(value, default=_plain)
    except (TypeError, ValueError):
        attr.string_val = str(value)
        return
    attr.doc_string = "json"


def attr_to_value(attr: AttributeProto) -> Any:
    """The Python value of an AttributeProto (lists for *_list, None when no value is set)."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    value = getattr(attr, which)
    if which.endswith("_list"):
        return list(value.values)
    if which == "string_val" and attr.doc_string == "json":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _node_view_class():
    """A message wire-compatible with Node whose `attr`, `inputs` and `outputs` stay serialized bytes.

    Reading through it is the graph reader's fast path: upb hands back the attrs as one list of bytes,
    and identical attrs (is_cpu_op, lumos_kind, tid, stream, ... repeat on most nodes) are decoded once
    through a cache keyed by those bytes. Built in a private descriptor pool, so it never clashes with
    ChakraProtoMsg.Node and is never written."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="lumos_node_view.proto", package="lumos_private",
                                               syntax="proto3")
    msg = proto.message_type.add(name="NodeView")
    for name, number, ftype, repeated in (
            ("id", 1, F.TYPE_UINT64, False), ("name", 2, F.TYPE_STRING, False),
            ("type", 3, F.TYPE_INT32, False),  # an enum is an int32 varint on the wire
            ("ctrl_deps", 4, F.TYPE_UINT64, True), ("data_deps", 5, F.TYPE_UINT64, True),
            ("start_time_micros", 6, F.TYPE_UINT64, False), ("duration_micros", 7, F.TYPE_UINT64, False),
            ("inputs", 8, F.TYPE_BYTES, False), ("outputs", 9, F.TYPE_BYTES, False),
            ("attr", 10, F.TYPE_BYTES, True)):
        msg.field.add(name=name, number=number, type=ftype,
                      label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("lumos_private.NodeView"))


_NodeView = _node_view_class()
_CACHE_LIMIT = 1 << 16  # decoded attrs kept; unique ones (rf_id, correlation) would grow it without end


class _AttrDecoder:
    """Serialized AttributeProto -> (name, value), memoized for immutable values."""

    def __init__(self, path: PathLike | None = None) -> None:
        self.cache: dict[bytes, tuple[str, Any]] = {}
        self.path = path

    def __call__(self, raw: bytes) -> tuple[str, Any]:
        hit = self.cache.get(raw)
        if hit is not None:
            return hit
        try:
            attr = AttributeProto.FromString(raw)
        except DecodeError as e:   # attributes are decoded lazily, after the node itself parsed
            raise TraceInputError(self.path, f"corrupt node attribute: {e}") from None
        entry = (attr.name, attr_to_value(attr))
        if not isinstance(entry[1], (list, dict)):  # shared objects must be immutable
            if len(self.cache) >= _CACHE_LIMIT:
                self.cache.clear()
            self.cache[raw] = entry
        return entry


def _literal(text: str) -> Any:
    """Chakra's IOInfo strings are Python `str()` of lists; tolerate anything else by keeping the text.

    Most are also JSON once the quotes are swapped (shapes are nested int lists, types lists of plain
    strings), and orjson parses them ~20x faster than `ast.literal_eval`, which stays the fallback."""
    if '"' not in text:
        try:
            return orjson.loads(text.replace("'", '"') if "'" in text else text)
        except orjson.JSONDecodeError:
            pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


# ------------------------------------------------------------------ writing


def _metadata_message(graph: ExecutionGraph) -> GlobalMetadata:
    md = GlobalMetadata(version=ET_VERSION)
    entries: dict[str, Any] = {"rank": int(graph.rank), "world_size": int(graph.world_size)}
    if graph.steps:
        id_of = graph.node_id
        entries["lumos_step_names"] = [s.name for s in graph.steps]
        entries["lumos_step_nodes"] = [int(id_of[s.node]) if s.node >= 0 else -1 for s in graph.steps]
        entries["lumos_step_start_us"] = [float(s.start_us) for s in graph.steps]
        entries["lumos_step_dur_us"] = [float(s.duration_us) for s in graph.steps]
    if graph.resources:
        entries["lumos_res_kind"] = [int(r.kind) for r in graph.resources]
        entries["lumos_res_device"] = [int(r.device) for r in graph.resources]
        entries["lumos_res_index"] = [int(r.index) for r in graph.resources]
        entries["lumos_res_name"] = [r.name for r in graph.resources]
    for key, value in graph.metadata.items():
        if key not in _META_COLUMNS and key not in _META_NOT_WRITTEN and value is not None:
            entries[key] = value
    if graph.trace_origin is not None:   # "source" is not written (the reader sets it to the file read)
        entries["trace_origin"] = graph.trace_origin
    for key, value in entries.items():
        value_to_attr(md.attr.add(), key, value)
    return md


_ATTR_TAG = b"\x52"  # Node.attr: field 10, length-delimited


class _AttrEncoder:
    """(name, value) -> the bytes of one serialized `Node.attr` entry, memoized for hashable values.

    A node's serialization is its scalar fields followed by its attr entries (field 10 is the last
    field, so appending entries gives exactly protobuf's own output); most entries (is_cpu_op, tid,
    stream, lumos_kind, comm_type, ...) repeat across nodes and are encoded once."""

    def __init__(self) -> None:
        self.cache: dict[tuple, bytes] = {}

    def __call__(self, name: str, value: Any) -> bytes:
        key: tuple | None = (name, value.__class__, value)
        try:
            hit = self.cache.get(key)  # type: ignore[arg-type]
        except TypeError:  # lists, dicts
            key, hit = None, None
        if hit is not None:
            return hit
        cls = value.__class__
        if (cls is int and _INT64_MIN <= value <= _INT64_MAX and FEEDER_TYPES.get(name, "int64_val") == "int64_val") \
                or (cls is float and name not in FEEDER_TYPES):
            # unique per node (timestamps, rf_id, correlation): skip building a message. name = field 1,
            # int64_val = field 9 (two's complement varint), double_val = field 3 (little-endian fixed64)
            raw_name = name.encode()
            head = b"\x0a" + encode_varint(len(raw_name)) + raw_name
            body = head + (b"\x48" + encode_varint(value & 0xFFFFFFFFFFFFFFFF) if cls is int
                           else b"\x19" + struct.pack("<d", value))
        else:
            attr = AttributeProto()
            value_to_attr(attr, name, value)
            body = attr.SerializeToString()
        entry = _ATTR_TAG + encode_varint(len(body)) + body
        if key is not None:
            if len(self.cache) >= _CACHE_LIMIT:
                self.cache.clear()
            self.cache[key] = entry
        return entry


def _exact_time(enc: _AttrEncoder, us: float, ns_attr: str, us_attr: str) -> bytes:
    """A time that is not a whole microsecond: int64 nanoseconds when that is exact (trace timestamps
    are), else the double itself (model-timed durations)."""
    ns = round(us * 1000.0)
    if ns / 1000.0 == us:
        return enc(ns_attr, ns)
    return enc(us_attr, us)


def write_graph(graph: ExecutionGraph, path: PathLike, progress: Progress | None = None) -> None:
    """Write one rank's graph as a Chakra `.et` file (gzip when `path` ends in .gz), atomically."""
    n = len(graph)
    ids = graph.node_id.tolist()
    names = graph.name
    types = graph.node_type.tolist()
    kinds = graph.kind.tolist()
    res = graph.resource.tolist()
    starts = graph.start_us.tolist()
    durs = graph.duration_us.tolist()
    parents = graph.parent.tolist()
    ptr = graph.dep_ptr.tolist()
    dep_ids = graph.node_id[graph.dep_src].tolist() if graph.num_edges else []
    dep_kinds = graph.dep_kind.tolist()
    enc = _AttrEncoder()
    # resource -> its Chakra attrs, encoded once; device / pid 0 is the reader's default and left out,
    # as Chakra's own files do
    res_entries: list[tuple[bytes, frozenset]] = []
    for r in graph.resources:
        if r.is_gpu:
            pairs = [("is_cpu_op", False), ("stream", r.index)] + ([("device", r.device)] if r.device else [])
        else:
            pairs = [("is_cpu_op", True), ("tid", r.index)] + ([("pid", r.device)] if r.device else [])
        res_entries.append((b"".join(enc(k, v) for k, v in pairs), frozenset(k for k, _ in pairs)))
    attrs = graph.attrs
    data_kind = int(EdgeKind.DATA)
    skip = _COLUMN_ATTRS | _IO_KEYS
    order_prev = _resource_predecessors(graph).tolist()
    order_kind = [int(EdgeKind.STREAM_ORDER) if r.is_gpu else int(EdgeKind.THREAD_ORDER) for r in graph.resources]
    dep_src = graph.dep_src.tolist()

    with EtWriter(path, _metadata_message(graph)) as w:
        for i in range(n):
            start, dur = starts[i], durs[i]
            start_us, dur_us = max(0, round(start)), max(0, round(dur))
            node = Node(id=ids[i], name=names[i], type=types[i], start_time_micros=start_us,
                        duration_micros=dur_us)
            parts = [enc(_KIND, kinds[i])]
            p = parents[i]
            if p >= 0:
                node.ctrl_deps.append(ids[p])
            a, b = ptr[i], ptr[i + 1]
            ks = dep_kinds[a:b]
            q = order_prev[i]
            if q >= 0 and q not in dep_src[a:b]:  # the resource order, unless a dep already says it
                node.data_deps.extend(dep_ids[a:b])
                node.data_deps.append(ids[q])
                parts.append(enc(_DEP_KINDS, ks + [order_kind[res[i]]]))
                parts.append(enc(_ORDER_DEPS, 1))
            elif b > a:
                node.data_deps.extend(dep_ids[a:b])
                if any(k != data_kind for k in ks):
                    parts.append(enc(_DEP_KINDS, ks))
            if start != start_us:
                parts.append(_exact_time(enc, start, _START_NS, _START_US))
            if dur != dur_us:
                parts.append(_exact_time(enc, dur, _DUR_NS, _DUR_US))
            written: frozenset = frozenset()
            r = res[i]
            if 0 <= r < len(res_entries):
                entry, written = res_entries[r]
                parts.append(entry)
            extra = attrs.get(i)
            if extra:
                for key, value in extra.items():
                    # the resource's own keys win over stale copies in attrs (e.g. `tid` of a GPU op stays)
                    if key in skip or key in written or value is None:
                        continue
                    parts.append(enc(key, value))
                for field, keys in _IO_ATTRS.values():
                    io = None
                    for sub, key in keys.items():
                        v = extra.get(key)
                        if v is not None:
                            io = io or getattr(node, field)
                            setattr(io, sub, v if isinstance(v, str) else str(_plain(v)))
            w.write_node_bytes(node.SerializeToString() + b"".join(parts))
            if progress is not None and (i % 20000 == 0 or i == n - 1):
                progress(i + 1, n)


def _resource_predecessors(graph: ExecutionGraph) -> np.ndarray:
    """int64 [N]: for each node the last node before it on its resource (CPU thread or GPU stream, in
    graph order, the order the replay serves them in) that does not enclose it, -1 for none. A node
    nested in the op just before it (its call-stack parent) takes that op's own predecessor instead:
    the nesting is its ctrl dep, and a data dep on an enclosing op would make a consumer that issues a
    node once its data deps *finished* wait for the op it is part of (a cycle when the parent waits on
    work the child launched)."""
    n = len(graph)
    prev = np.full(n, -1, np.int64)
    if n == 0:
        return prev
    order = np.argsort(graph.resource, kind="stable")
    same = graph.resource[order[1:]] == graph.resource[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    parent = graph.parent
    out = prev.copy()
    for i in order.tolist():  # resource order: a parent is resolved before its children
        p = int(prev[i])
        if p >= 0 and _encloses(parent, p, i):
            out[i] = out[p]
    return out


def _encloses(parent: np.ndarray, a: int, i: int, depth: int = 256) -> bool:
    """Whether node `a` is a call-stack ancestor of node `i`."""
    j = int(parent[i])
    while j >= 0 and depth:
        if j == a:
            return True
        j = int(parent[j])
        depth -= 1
    return False


def order_deps_written(graph: ExecutionGraph) -> int:
    """How many resource-order deps `write_graph` adds to the graph's own (see the module doc): the file
    holds graph.num_edges + this many data deps."""
    prev = _resource_predecessors(graph)
    has = prev >= 0
    if graph.num_edges:
        dst = np.repeat(np.arange(len(graph)), np.diff(graph.dep_ptr))
        already = np.zeros(len(graph), bool)
        already[dst[graph.dep_src == prev[dst]]] = True
        has &= ~already
    return int(has.sum())


# ------------------------------------------------------------------ reading


_RANK_IN_NAME = re.compile(r"\.(\d+)\.et(?:\.gz)?$")


def _rank_from_name(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _infer_kind(node_type: int, is_cpu: bool, name: str) -> int:
    """OpKind of a node written by another tool (no `lumos_kind` attr)."""
    if node_type == NodeType.COMM_SEND_NODE:
        return OpKind.SEND
    if node_type == NodeType.COMM_RECV_NODE:
        return OpKind.RECV
    if node_type == NodeType.COMM_COLL_NODE:
        # Chakra's converter also types the host-side c10d call (is_cpu_op=true) as COMM_COLL; it runs on
        # a CPU thread and issues the collective, it is not the transfer itself.
        return OpKind.CPU_OP if is_cpu else OpKind.COLLECTIVE
    if is_cpu:
        return OpKind.ANNOTATION if _PROFILER_STEP.match(name) else OpKind.CPU_OP
    if node_type in (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE) or name.startswith("Memcpy"):
        return OpKind.MEMCPY
    if name.startswith("Memset"):
        return OpKind.MEMSET
    return OpKind.KERNEL


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _io_to_attrs(raw: bytes, keys: dict[str, str], a: dict[str, Any], path: Path, what: str) -> None:
    try:
        io = IOInfo.FromString(raw)
    except DecodeError as e:   # like attributes, a node's inputs / outputs are decoded lazily
        raise TraceInputError(path, f"corrupt node {what}: {e}") from None
    for sub, key in keys.items():
        text = getattr(io, sub)
        if text:
            # values hold Chakra's tensor tuples: keep the text, parsing it buys nothing
            a[key] = text if sub == "values" else _literal(text)


def _time(a: dict[str, Any], us_attr: str, ns_attr: str, micros: int) -> float:
    """The exact time of a node: lumos attrs when present (popped from `a`), else Chakra's field."""
    us, ns = a.pop(us_attr, None), a.pop(ns_attr, None)
    if isinstance(us, float):
        return us
    if isinstance(ns, int):
        return ns / 1000.0
    return float(micros)


_RESOURCE_KINDS = {int(k) for k in ResourceKind}
_NODE_TYPES = {int(t) for t in NodeType}
_OP_KINDS = {int(k) for k in OpKind}
_EDGE_KINDS = {int(k) for k in EdgeKind}


def _resource_key(path: Path, kind: Any, device: Any, index: Any) -> tuple[int, int, int]:
    """One entry of the stored resource table, checked: a corrupt table is a one-line error."""
    if not all(type(v) is int for v in (kind, device, index)) or kind not in _RESOURCE_KINDS:
        raise TraceInputError(path, f"corrupt resource table in the metadata: kind {kind!r}, device {device!r}, "
                                    f"index {index!r}")
    return kind, device, index


def read_graph(path: PathLike, rank: int | None = None, world_size: int | None = None,
               progress: Progress | None = None) -> ExecutionGraph:
    """Read one `.et` / `.et.gz` file into an ExecutionGraph (node order = file order).

    The rank and world size come from the metadata attrs; when the file does not say, from the `rank` /
    `world_size` arguments, then from the `<prefix>.<rank>.et` name (rank) and 1 (world size).
    """
    path = Path(path)
    messages = iter_et(path, node_class=_NodeView)
    md: GlobalMetadata = next(messages)  # type: ignore[assignment]
    meta: dict[str, Any] = {a.name: attr_to_value(a) for a in md.attr}

    # ---- pass 1: raw columns from the nodes (protobuf only here)
    ids: list[int] = []
    names: list[str] = []
    types: list[int] = []
    kinds: list[int] = []
    res_keys: list[tuple[int, int, int]] = []
    starts: list[float] = []
    durs: list[float] = []
    ctrl: list[list[int]] = []
    deps: list[list[int]] = []
    dep_kinds: list[list[int] | None] = []
    attrs: dict[int, dict[str, Any]] = {}
    decode = _AttrDecoder(path)
    file_data = file_ctrl = 0
    cpu_thread, gpu_stream = int(ResourceKind.CPU_THREAD), int(ResourceKind.GPU_STREAM)
    for i, node in enumerate(messages):
        a: dict[str, Any] = dict(map(decode, node.attr))  # type: ignore[union-attr]
        if node.inputs:  # type: ignore[union-attr]
            _io_to_attrs(node.inputs, _IO_ATTRS["input"][1], a, path, "inputs")  # type: ignore[union-attr]
        if node.outputs:  # type: ignore[union-attr]
            _io_to_attrs(node.outputs, _IO_ATTRS["output"][1], a, path, "outputs")  # type: ignore[union-attr]
        name = node.name  # type: ignore[union-attr]
        ntype = node.type  # type: ignore[union-attr]
        if ntype not in _NODE_TYPES:
            raise TraceInputError(path, f"node {node.id} ({name[:60]!r}): unknown node type {ntype}")  # type: ignore
        # ASTRA-sim microbenchmarks leave is_cpu_op out: their compute and comm nodes are GPU work
        is_cpu = bool(a.pop("is_cpu_op", False))
        kind = a.pop(_KIND, None)
        kinds.append(kind if type(kind) is int and kind in _OP_KINDS else _infer_kind(ntype, is_cpu, name))
        if is_cpu:
            res_keys.append((cpu_thread, _int(a.get("pid", 0)), _int(a.get("tid", 0))))
        else:
            stream = a.get("stream", a.get("tid", 0))  # older Chakra puts the stream in `tid` for GPU ops
            res_keys.append((gpu_stream, _int(a.get("device", 0)), _int(stream)))
        start = node.start_time_micros  # type: ignore[union-attr]
        dur = node.duration_micros  # type: ignore[union-attr]
        if _START_NS in a or _START_US in a or _DUR_NS in a or _DUR_US in a:
            start = _time(a, _START_US, _START_NS, start)
            dur = _time(a, _DUR_US, _DUR_NS, dur)
        starts.append(start)
        durs.append(dur)
        dk = a.pop(_DEP_KINDS, None)
        n_order = a.pop(_ORDER_DEPS, 0)
        ids.append(node.id)  # type: ignore[union-attr]
        names.append(name)
        types.append(ntype)
        # copies: holding upb containers would keep every parsed message alive
        ctrl.append(list(node.ctrl_deps))  # type: ignore[union-attr]
        data = list(node.data_deps)  # type: ignore[union-attr]
        file_ctrl += len(ctrl[-1])
        file_data += len(data)
        if type(n_order) is int and 0 < n_order <= len(data):
            # the resource order written out for Chakra consumers: implicit in our graph
            del data[len(data) - n_order:]
            if isinstance(dk, list):
                del dk[len(dk) - n_order:]
        deps.append(data)
        dep_kinds.append(dk if isinstance(dk, list) and len(dk) == len(data) and all(k in _EDGE_KINDS for k in dk)
                         else None)
        if a:
            attrs[i] = a
        if progress is not None and i % 20000 == 0:
            progress(i, 0)

    # ---- graph identity
    if "rank" in meta:
        rank = _int(meta["rank"])
    elif rank is None:
        rank = _rank_from_name(path)
    if "world_size" in meta:
        world_size = _int(meta["world_size"], 1)
    b = GraphBuilder(rank=rank or 0, world_size=max(1, world_size or 1))

    # ---- resources: the stored table first (keeps indices and names), then whatever nodes use
    res_index: dict[tuple[int, int, int], int] = {}
    table = [meta.get(k) for k in _RES_ATTRS]
    if all(isinstance(t, list) for t in table) and len({len(t) for t in table}) == 1:  # type: ignore[arg-type]
        for kind_, dev, idx, rname in zip(*table):  # type: ignore[misc]
            key = _resource_key(path, kind_, dev, idx)
            res_index.setdefault(key, b.resource(ResourceKind(key[0]), key[1], key[2], str(rname)))
    res_of = []
    for key in res_keys:
        r = res_index.get(key)
        if r is None:
            r = res_index[key] = b.resource(ResourceKind(key[0]), key[1], key[2])
        res_of.append(r)

    # ---- nodes and edges (ids -> indices; deps on ids absent from the file are dropped and counted)
    index_of = {nid: i for i, nid in enumerate(ids)}
    n = len(ids)
    dropped_deps = dropped_ctrl = extra_ctrl = 0
    for i in range(n):
        parent = -1
        for pid in ctrl[i]:
            j = index_of.get(pid)
            if j is None:
                dropped_ctrl += 1
            elif parent < 0:
                parent = j
            else:
                extra_ctrl += 1  # our graph has one call-stack parent
        b.add_node(names[i], types[i], kinds[i], res_of[i], starts[i], durs[i], parent=parent,
                   node_id=ids[i], attrs=attrs.get(i))
    add_dep = b.add_dep
    get = index_of.get
    for i in range(n):
        dk = dep_kinds[i]
        if dk is None:
            for did in deps[i]:
                j = get(did)
                if j is None:
                    dropped_deps += 1
                else:
                    add_dep(j, i)
        else:
            for did, k in zip(deps[i], dk):
                j = get(did)
                if j is None:
                    dropped_deps += 1
                else:
                    add_dep(j, i, k)

    # ---- steps: the stored table, else the ProfilerStep annotations
    step_table = [meta.get(k) for k in _STEP_ATTRS]
    if all(isinstance(t, list) for t in step_table) and len({len(t) for t in step_table}) == 1:  # type: ignore
        for sname, sid, sstart, sdur in zip(*step_table):  # type: ignore[misc]
            if type(sid) is not int or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in (sstart, sdur)):
                raise TraceInputError(path, f"corrupt step table in the metadata: step {sname!r} node {sid!r}, "
                                            f"start {sstart!r}, duration {sdur!r}")
            b.add_step(str(sname), index_of.get(sid, -1) if sid >= 0 else -1, sstart, sdur)
    else:
        found = [i for i, nm in enumerate(names) if _PROFILER_STEP.match(nm)]
        found.sort(key=lambda i: (starts[i], i))
        for i in found:
            b.add_step(names[i], i, starts[i], durs[i])

    # ---- metadata: everything else the file carries, plus what the reader saw
    for key, value in meta.items():
        if key not in _META_COLUMNS:
            b.metadata[key] = value
    b.metadata["source"] = str(path)
    b.metadata["et_version"] = md.version
    b.metadata["file_data_deps"] = file_data
    b.metadata["file_ctrl_deps"] = file_ctrl
    if dropped_deps:
        b.metadata["dropped_deps"] = dropped_deps
    if dropped_ctrl:
        b.metadata["dropped_ctrl_deps"] = dropped_ctrl
    if extra_ctrl:
        b.metadata["ignored_ctrl_deps"] = extra_ctrl
    graph = b.build()
    if progress is not None:
        progress(n, n)
    return graph


def graph_paths(prefix: PathLike) -> dict[int, Path]:
    """Files of a multi-rank set `PREFIX.<rank>.et` / `.et.gz`, by rank ({} when there are none); a single
    existing file maps to its rank from the name (0 when the name has none)."""
    p = Path(prefix)
    if p.is_file():
        rank = _rank_from_name(p)
        return {rank if rank is not None else 0: p}
    parent = p.parent if str(p.parent) else Path(".")
    pattern = re.compile(re.escape(p.name) + r"\.(\d+)\.et(\.gz)?$")
    found: dict[int, Path] = {}
    if parent.is_dir():
        for entry in parent.iterdir():
            m = pattern.match(entry.name)
            if m and not entry.is_file():
                raise TraceInputError(entry, "is not a file (a rank of the set PREFIX.<rank>.et must be one)")
            if m:
                rank = int(m.group(1))
                if rank in found:
                    raise TraceInputError(prefix, f"rank {rank} has two files: {found[rank].name} and {entry.name}")
                found[rank] = entry
    return dict(sorted(found.items()))


def read_graphs(prefix_or_file: PathLike, progress: Progress | None = None) -> list[ExecutionGraph]:
    """All ranks of a set (or the one file), sorted by rank. `world_size` defaults to the number of
    files when the metadata does not say."""
    paths = graph_paths(prefix_or_file)
    if not paths:
        if os.path.isdir(prefix_or_file):
            raise TraceInputError(prefix_or_file, "is a directory; give an .et file or a PREFIX (out/job for out/job.0.et ...)")
        raise TraceInputError(prefix_or_file, "no such file, and no PREFIX.<rank>.et / .et.gz files with this prefix")
    graphs = []
    for k, (rank, path) in enumerate(paths.items()):
        graphs.append(read_graph(path, rank=rank, world_size=len(paths)))
        if progress is not None:
            progress(k + 1, len(paths))
    graphs.sort(key=lambda g: g.rank)
    warn_missing_ranks(prefix_or_file, graphs)
    return graphs


def missing_ranks(size: int, present: Iterable[int], absent: str = "missing") -> str:
    """'N of them is/are <absent> (rank a, b, ...)' for the ranks below `size` not in `present`, the first
    eight named; '' when none is missing. The warnings of .et sets and of the trace converter say it."""
    missing = sorted(set(range(size)) - set(present))
    if not missing:
        return ""
    shown = ", ".join(str(m) for m in missing[:8]) + (", ..." if len(missing) > 8 else "")
    return f"{len(missing)} of them {'is' if len(missing) == 1 else 'are'} {absent} (rank {shown})"


def warn_missing_ranks(prefix: PathLike, graphs: list[ExecutionGraph]) -> None:
    """A set whose ranks have gaps below its world size replays without them (their share of every
    collective counts as arrived): a warning names them, as the trace converter's does."""
    if len(graphs) < 2:
        return
    size = max(max(int(g.world_size or 0) for g in graphs), max(g.rank for g in graphs) + 1)
    text = missing_ranks(size, (g.rank for g in graphs))
    if text:
        log.warning("%s: the set has %d ranks; %s", prefix, size, text)


def write_graphs(graphs: Iterable[ExecutionGraph], prefix: PathLike) -> list[Path]:
    """Write a multi-rank set as `PREFIX.<rank>.et` (ASTRA-sim's naming); returns the paths."""
    out = []
    for g in graphs:
        path = Path(f"{prefix}.{g.rank}.et")
        write_graph(g, path)
        out.append(path)
    return out
