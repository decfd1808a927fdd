"""Parse a PyTorch Execution Trace (ET, from `torch.profiler.ExecutionTraceObserver`) into columns.

    load_execution_trace(path, progress=None) -> ExecutionTrace

Accepted files: plain JSON, gzip'd JSON, or a tar (optionally gzip'd) holding one JSON (streamed from
the archive, never extracted to disk). Compression is detected from the bytes, not the file name.

Schemas (told apart by the node layout, not by the `schema` string, because producers bumped it
inconsistently):
- flat ("1.0.1"): `parent`, `rf_id`, `tid`, ... as node keys; `inputs` is the list of values, with
  `input_shapes` / `input_types` beside it (same for outputs).
- nested ("1.0.2-chakra.0.0.4", "1.0.3", "1.1.0", "1.1.1"): `ctrl_deps` is the parent; `inputs` /
  `outputs` are dicts of `values`, `shapes`, `types` (and `strides`); everything else is in `attrs`, a
  list of `{name, type, value}`.

The result is columnar: node i (sorted by ET id, which PyTorch assigns when an op starts, so id order is
execution order) has `ids[i]`, `names[i]`, `parent_ids[i]`, ... Comm attrs and other rare attrs are
sparse dicts keyed by node index. Bad input raises `TraceInputError(path, one line)`.

Memory: a whole-document parse holds a tree ~6x the JSON text at its peak, so texts above
STREAM_THRESHOLD are parsed node by node, and the strings and shape/type lists that repeat across nodes
are shared (hf_GPT2: 24 MB of JSON -> ~60 MB peak instead of ~250 MB).
"""
from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import orjson

from chakra_schema.errors import TraceInputError
from chakra_schema.op_names import keeps_values
from chakra_schema.safe_io import input_too_large, iter_json_input, max_input_bytes, read_json_input

ProgressFn = Callable[[int, int], None]
_WS = re.compile(r"[ \t\n\r]*")

# Communication attrs (record_param_comms and friends in schema >= 1.0.3).
COMM_ATTR_NAMES = frozenset((
    "collective_name", "dtype", "in_msg_nelems", "out_msg_nelems", "in_split_size", "out_split_size",
    "global_rank_start", "global_rank_stride", "pg_name", "pg_desc", "pg_size",
))

ROOT_PROCESS = "[pytorch|profiler|execution_trace|process]"
ROOT_THREAD = "[pytorch|profiler|execution_trace|thread]"
PG_INIT = "## process_group:init ##"
RECORD_FUNCTION_SCOPE_USER = 7  # at::RecordScope::USER_SCOPE: record_function / annotation ranges


def is_root_name(name: str) -> bool:
    """The per-process and per-thread root nodes ("execution_trace" or the older "execution_graph")."""
    return name.startswith("[pytorch|profiler|execution_")


@dataclass
class ExecutionTrace:
    """One rank's Execution Trace, columnar over node indices 0..N-1 in ascending ET id order."""

    path: str
    schema: str
    pid: int
    start_ts: float | None
    finish_ts: float | None
    ids: np.ndarray                 # int64 [N] ET node ids (ascending)
    names: list[str]
    parent_ids: np.ndarray          # int64 [N] ctrl_deps / parent id, 0 when none
    rf_id: np.ndarray               # int64 [N] record-function id, -1 when absent
    tid: np.ndarray                 # int64 [N] ET thread id (small logical numbers: 1 main, 2 autograd...)
    seq_id: np.ndarray              # int64 [N] autograd sequence number, -1 when none
    scope: np.ndarray               # int64 [N] RecordScope, -1 when absent
    op_schema: list[str]
    in_values: list[Any]
    in_shapes: list[Any]
    in_types: list[Any]
    out_values: list[Any]
    out_shapes: list[Any]
    out_types: list[Any]
    comm: dict[int, dict[str, Any]] = field(default_factory=dict)     # node index -> comm attrs
    extra: dict[int, dict[str, Any]] = field(default_factory=dict)    # node index -> other attrs
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    rank: int | None = None         # this process's global rank when the trace tells it
    world_size: int | None = None
    in_strides: list[Any] = field(default_factory=list)   # per node, strides per input (schema >= 1.0.2)
    out_strides: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def index_of_id(self) -> dict[int, int]:
        return {int(v): i for i, v in enumerate(self.ids.tolist())}

    def parent_index(self) -> np.ndarray:
        """int64 [N]: index of each node's parent, -1 when the parent id is absent from the trace."""
        pos = np.searchsorted(self.ids, self.parent_ids)
        pos_c = np.minimum(pos, max(len(self.ids) - 1, 0))
        ok = (len(self.ids) > 0) & (self.ids[pos_c] == self.parent_ids) if len(self.ids) else pos_c.astype(bool)
        return np.where(ok, pos_c, -1).astype(np.int64)

    def pg_ranks(self, pg_name: str | None) -> list[int] | None:
        """Global ranks of a process group (an empty `ranks` in the init record means all ranks)."""
        for pg in self.process_groups:
            if str(pg.get("pg_name")) == str(pg_name):
                ranks = pg.get("ranks") or []
                if ranks:
                    return [int(r) for r in ranks]
                size = pg.get("group_size")
                return list(range(int(size))) if size else None
        return None


# ------------------------------------------------------------------------------------------- reading
def op_attrs(et: ExecutionTrace, i: int) -> dict[str, Any]:
    """The graph attrs an ET node carries for the models downstream: schema, input/output shapes and types."""
    a: dict[str, Any] = {}
    if et.op_schema[i]:
        a["op_schema"] = et.op_schema[i]
    if et.in_shapes[i]:
        a["input_shapes"] = et.in_shapes[i]
        a["input_types"] = et.in_types[i]
        if isinstance(et.in_values[i], list) and keeps_values(et.names[i]):
            a["input_values"] = et.in_values[i]
    if et.out_shapes[i]:
        a["output_shapes"] = et.out_shapes[i]
        a["output_types"] = et.out_types[i]
    # strides tell a contiguous tensor from a view (transposed, sliced, broadcast): ET-only model mode
    # times the kernels of strided operands apart (replay/et_kernels.py)
    if i < len(et.in_strides) and et.in_strides[i]:
        a["input_strides"] = et.in_strides[i]
    if i < len(et.out_strides) and et.out_strides[i]:
        a["output_strides"] = et.out_strides[i]
    return a


def read_json_bytes(path: str | os.PathLike) -> bytes:
    """The JSON text of `path`: plain, gzip'd, or the single JSON member of a (gzip'd) tar."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError as exc:
        raise TraceInputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        if head == b"\x1f\x8b":
            with gzip.open(path, "rb") as gz:
                probe = gz.read(512)
            if _is_tar_header(probe):
                return _read_tar_member(path, "r:gz")
            data = read_json_input(path)
        else:
            with open(path, "rb") as fh:
                probe = fh.read(512)
            if _is_tar_header(probe):
                return _read_tar_member(path, "r:")
            data = read_json_input(path)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceInputError(path, f"truncated or corrupt gzip data ({exc})") from None
    except tarfile.TarError as exc:
        raise TraceInputError(path, f"corrupt tar archive ({exc})") from None
    except OSError as exc:
        raise TraceInputError(path, f"cannot read: {exc.strerror or exc}") from None
    return data   # blank content was refused by read_json_input ("empty file"): no .strip() copy of it here


def _is_tar_header(block: bytes) -> bool:
    return len(block) >= 262 and block[257:262] == b"ustar"


def _read_tar_member(path: str | os.PathLike, mode: str) -> bytes:
    """Stream the one JSON member out of a tar (AppleDouble `._*` companions are ignored)."""
    found: list[bytes] = []
    names: list[str] = []
    with tarfile.open(path, mode) as tar:
        for member in tar:
            base = os.path.basename(member.name)
            if not member.isfile() or base.startswith("._"):
                continue
            names.append(member.name)
            if base.endswith(".json") and not found:
                if member.size > max_input_bytes():
                    raise input_too_large(path, max_input_bytes())
                fh = tar.extractfile(member)
                if fh is not None:
                    found.append(fh.read())
    if not found:
        raise TraceInputError(path, f"tar archive holds no .json member (members: {names[:5]})")
    if not found[0].strip():
        raise TraceInputError(path, f"the JSON member {names[0]} of the tar archive is empty")
    return found[0]


def parse_json(path: str | os.PathLike, data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TraceInputError(path, f"invalid JSON ({exc})") from None


# ------------------------------------------------------------------------------------------- parsing
STREAM_THRESHOLD = 8 << 20  # bytes of JSON text above which nodes are parsed one at a time


def load_execution_trace(path: str | os.PathLike, progress: ProgressFn | None = None) -> ExecutionTrace:
    """Parse an Execution Trace file (see the module docstring). Raises TraceInputError on bad input.

    Small files go through orjson in one call. Big ones are parsed node by node (stdlib
    `JSONDecoder.raw_decode` at each node's offset), keeping only the columns: a whole-document parse
    holds a tree ~6x the text size (plus the parser's own document) at its peak."""
    blocks = _json_blocks(path)
    head, size = [], 0
    for block in blocks:
        head.append(block)
        size += len(block)
        if size > STREAM_THRESHOLD:
            break
    else:
        data = b"".join(head)
        del head
        root = parse_json(path, data)
        del data
        return execution_trace_from_json(root, path, progress)
    # big: parsed node by node from a window over the decompressed stream (never the whole text at once)
    header: dict[str, Any] = {}
    window = _TextWindow(itertools.chain(head, blocks), path, _size_hint(path))
    del head
    return _build(_stream_nodes(window, path, header, progress), header, path, None)


def _size_hint(path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _json_blocks(path):
    """The decompressed JSON text of `path` in blocks (bounded by the input size limit; a tar's JSON
    member as one block), with the same one-line errors as `read_json_bytes`."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        if head == b"\x1f\x8b":
            with gzip.open(path, "rb") as gz:
                probe = gz.read(512)
        else:
            with open(path, "rb") as fh:
                probe = fh.read(512)
        if _is_tar_header(probe):
            yield read_json_bytes(path)
            return
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceInputError(path, f"truncated or corrupt gzip data ({exc})") from None
    except OSError as exc:
        raise TraceInputError(path, f"cannot read: {exc.strerror or exc}") from None
    yield from iter_json_input(path)


def execution_trace_from_json(root: Any, path: str | os.PathLike,
                              progress: ProgressFn | None = None) -> ExecutionTrace:
    if not isinstance(root, dict):
        raise TraceInputError(path, f"not an Execution Trace: top-level JSON is a {type(root).__name__}")
    nodes = root.get("nodes")
    if not isinstance(nodes, list):
        if "traceEvents" in root:
            raise TraceInputError(path, "looks like a Kineto trace, not an Execution Trace (no 'nodes' list)")
        raise TraceInputError(path, "not an Execution Trace: no 'nodes' list at top level")
    return _build(nodes, root, path, progress)


def _stream_nodes(text: _TextWindow, path, header: dict, progress: ProgressFn | None):
    """Yield the elements of the top-level "nodes" array one by one; other top-level keys go to
    `header` (filled as they are met: the caller reads it after the iteration ends). `text` is a
    window over the decoded stream: positions are into `text.text`, and every `text.more` call may
    drop what was parsed (it returns the new position)."""
    dec = json.JSONDecoder()
    ws = _WS

    def skip(pos: int) -> int:
        while True:
            end = ws.match(text.text, pos).end()
            if end < len(text.text) or text.eof:
                return end
            pos = text.more(end)

    def expect(pos: int, ch: str) -> int:
        pos = skip(pos)
        if pos >= len(text.text) or text.text[pos] != ch:
            got = repr(text.text[pos]) if pos < len(text.text) else "end of file"
            raise TraceInputError(path, f"invalid JSON (expected {ch!r} at char {text.base + pos}, got {got})")
        return pos + 1

    def value(pos: int):
        """The JSON value at `pos` and the position after it; a value cut by the window's end is parsed
        again once the window has grown (to twice its size each time: a long value costs O(n) in all)."""
        while True:
            try:
                v, end = dec.raw_decode(text.text, pos)
                if end < len(text.text) or text.eof:   # a number may end where the window ends: look further
                    return v, end
            except json.JSONDecodeError as exc:
                if text.eof:
                    raise TraceInputError(path, f"invalid JSON ({exc.msg} at char {text.base + exc.pos})") from None
            pos = text.more(pos, max(len(text.text) - pos, _WINDOW))

    def char(pos: int) -> str:
        return text.text[pos] if pos < len(text.text) else ""

    pos = expect(0, "{")
    seen_nodes = False
    step, next_report = 1 << 24, 0
    while True:
        pos = skip(pos)
        if char(pos) == "}":
            break
        key, pos = value(pos)
        pos = expect(pos, ":")
        pos = skip(pos)
        if key == "nodes" and char(pos) == "[":
            seen_nodes = True
            pos = skip(pos + 1)
            if char(pos) == "]":
                pos += 1
            else:
                while True:
                    node, pos = value(pos)
                    yield node
                    if progress is not None and text.base + pos >= next_report:
                        progress(text.base + pos, max(text.size_hint, text.base + pos))
                        next_report = text.base + pos + step
                    pos = skip(pos)
                    if char(pos) == ",":
                        pos = skip(pos + 1)
                        continue
                    pos = expect(pos, "]")
                    break
        else:
            header[key], pos = value(pos)
        pos = skip(pos)
        if char(pos) == ",":
            pos += 1
            continue
        pos = expect(pos, "}")
        break
    if progress is not None:
        progress(text.base + pos, text.base + pos)
    if not seen_nodes:
        if "traceEvents" in header:
            raise TraceInputError(path, "looks like a Kineto trace, not an Execution Trace (no 'nodes' list)")
        raise TraceInputError(path, "not an Execution Trace: no 'nodes' list at top level")


_WINDOW = 4 << 20   # characters decoded at a time by the streamed parse


class _TextWindow:
    """The UTF-8 text of a stream of byte blocks, decoded a window at a time. `text` holds what is not
    parsed yet (from `base` characters into the document); `more(pos)` drops `text[:pos]` and appends
    at least `at_least` more characters (fewer at the end: then `eof`). Memory is the window, not the
    document: no whole-file bytes, no whole-file str."""

    def __init__(self, blocks, path, size_hint: int = 0):
        import codecs
        self.blocks = iter(blocks)
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.path, self.size_hint = path, size_hint
        self.text, self.base, self.eof = "", 0, False
        self.more(0)

    def more(self, pos: int, at_least: int = _WINDOW) -> int:
        parts = [self.text[pos:]]
        self.base += pos
        have = len(parts[0])
        while have < len(parts[0]) + at_least and not self.eof:
            block = next(self.blocks, None)
            try:
                piece = self.decoder.decode(block or b"", final=block is None)
            except UnicodeDecodeError as exc:
                raise TraceInputError(self.path, f"invalid JSON (not UTF-8: {exc.reason})") from None
            self.eof = block is None
            parts.append(piece)
            have += len(piece)
        self.text = "".join(parts)
        return 0


def _build(nodes, root: dict, path, progress: ProgressFn | None) -> ExecutionTrace:
    """Columns from an iterable of node dicts (any order), then sorted by id."""
    it = iter(nodes)
    first = next(it, None)
    if first is None:
        raise TraceInputError(path, "Execution Trace has no nodes")
    _check_node(first, 0, path)
    total = len(nodes) if isinstance(nodes, list) else 0
    chain = _prepend(first, it)
    try:
        if isinstance(first.get("inputs"), dict) or "ctrl_deps" in first:
            et = _parse_nested(chain, path, progress, total)
        else:
            et = _parse_flat(chain, path, progress, total)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        if isinstance(exc, TraceInputError):
            raise
        # the columnar parse reads fields after the nodes, so the node at fault is not known here
        raise TraceInputError(path, f"malformed Execution Trace node: {_plain_cause(exc)}") from None
    if len(np.unique(et.ids)) != len(et.ids):
        raise TraceInputError(path, "Execution Trace has duplicate node ids")
    et.schema = str(root.get("schema", ""))
    et.pid = _header_int(root, "pid", path)
    et.start_ts = _header_number(root, "start_ts", path)
    et.finish_ts = _header_number(root, "finish_ts", path)
    _process_groups(et)
    _infer_rank(et)
    return et


def _header_int(root: dict, key: str, path) -> int:
    v = root.get(key, 0) or 0
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TraceInputError(path, f"Execution Trace '{key}' must be an integer, got {v!r}")
    try:
        return int(v)
    except (ValueError, OverflowError):
        raise TraceInputError(path, f"Execution Trace '{key}' must be an integer, got {v!r}") from None


def _header_number(root: dict, key: str, path) -> float | None:
    v = root.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceInputError(path, f"Execution Trace '{key}' must be a number, got {v!r}")
    return v


def _prepend(first, it):
    yield first
    yield from it


def _plain_cause(exc: Exception) -> str:
    """What a parse error means for the trace, without Python's exception names."""
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}" if exc.args else "a missing field"
    if isinstance(exc, OverflowError):
        return "a number too large for the trace format"
    if isinstance(exc, (TypeError, AttributeError)):
        return "a field of the wrong type (a list, number or string where another is expected)"
    return f"a value out of range ({exc})"


def _check_node(n: Any, k: int, path) -> None:
    if not isinstance(n, dict) or not isinstance(n.get("id"), int) or not isinstance(n.get("name"), str):
        raise TraceInputError(path, f"malformed Execution Trace node #{k}: needs an integer 'id' and a 'name'")


def _empty_trace(path: str | os.PathLike) -> dict[str, list]:
    return {k: [] for k in ("ids", "names", "parent", "rf_id", "tid", "seq_id", "scope",
                            "op_schema", "in_values", "in_shapes", "in_types", "out_values", "out_shapes",
                            "out_types", "in_strides", "out_strides")}


def _finish(path, cols: dict[str, list], comm: dict, extra: dict) -> ExecutionTrace:
    """Freeze the columns, sorted by ET id (writers emit a node when it ends, children first)."""
    i64 = np.int64
    ids = np.asarray(cols["ids"], i64)
    if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
        order = np.argsort(ids, kind="stable")
        ol = order.tolist()
        for k, col in cols.items():
            cols[k] = [col[j] for j in ol]
        new_of = np.empty(len(ol), np.int64)
        new_of[order] = np.arange(len(ol))
        comm = {int(new_of[i]): v for i, v in comm.items()}
        extra = {int(new_of[i]): v for i, v in extra.items()}
    return ExecutionTrace(
        path=str(path), schema="", pid=0, start_ts=None, finish_ts=None,
        ids=np.asarray(cols["ids"], i64), names=cols["names"], parent_ids=np.asarray(cols["parent"], i64),
        rf_id=np.asarray(cols["rf_id"], i64), tid=np.asarray(cols["tid"], i64),
        seq_id=np.asarray(cols["seq_id"], i64), scope=np.asarray(cols["scope"], i64),
        op_schema=cols["op_schema"], in_values=cols["in_values"], in_shapes=cols["in_shapes"],
        in_types=cols["in_types"], out_values=cols["out_values"], out_shapes=cols["out_shapes"],
        out_types=cols["out_types"], comm=comm, extra=extra,
        in_strides=cols["in_strides"], out_strides=cols["out_strides"],
    )


def _interners():
    """Deduplicate what repeats across nodes (names, schemas, shape and type lists): a JSON parser makes a
    new object per occurrence, and these columns would otherwise be half the memory of a big trace.
    Shared lists are read-only by convention, like every column."""
    str_cache: dict[str, str] = {}
    list_cache: dict[bytes, Any] = {}

    def strings(x: str) -> str:
        return str_cache.setdefault(x, x)

    def shared(x: Any) -> Any:
        if not x:
            return x
        return list_cache.setdefault(orjson.dumps(x), x)

    return strings, shared


def _parse_nested(nodes, path, progress: ProgressFn | None, total: int) -> ExecutionTrace:
    """Schema >= 1.0.2: inputs/outputs dicts, attrs list."""
    cols = _empty_trace(path)
    ids, names, parent = cols["ids"], cols["names"], cols["parent"]
    rf, tid, seq, scope = cols["rf_id"], cols["tid"], cols["seq_id"], cols["scope"]
    schema_col = cols["op_schema"]
    iv, ish, ity = cols["in_values"], cols["in_shapes"], cols["in_types"]
    ov, osh, oty = cols["out_values"], cols["out_shapes"], cols["out_types"]
    ist, ost = cols["in_strides"], cols["out_strides"]
    comm: dict[int, dict] = {}
    extra: dict[int, dict] = {}
    empty: dict = {}
    chunk = max(total // 50, 5000)
    strings, shared = _interners()
    comm_names = COMM_ATTR_NAMES
    for i, n in enumerate(nodes):
        if progress is not None and total and i % chunk == 0:
            progress(i, total)
        if type(n) is not dict or type(n.get("id")) is not int or type(n.get("name")) is not str:
            _check_node(n, i, path)
        ids.append(n["id"])
        names.append(strings(n["name"]))
        p = n.get("ctrl_deps", 0)
        parent.append(p if isinstance(p, int) else (p[0] if p else 0))  # some writers emit a list
        inp = n.get("inputs") or empty
        out = n.get("outputs") or empty
        iv.append(inp.get("values", ()))
        ish.append(shared(inp.get("shapes", ())))
        ity.append(shared(inp.get("types", ())))
        ov.append(out.get("values", ()))
        osh.append(shared(out.get("shapes", ())))
        oty.append(shared(out.get("types", ())))
        ist.append(shared(inp.get("strides", ())))
        ost.append(shared(out.get("strides", ())))
        a_rf = a_tid = a_seq = a_scope = -1
        a_schema = ""
        for a in n.get("attrs", ()):
            an = a["name"]
            v = a.get("value")
            if an == "rf_id":
                a_rf = v
            elif an == "tid":
                a_tid = v
            elif an == "seq_id":
                a_seq = v
            elif an == "scope":
                a_scope = v
            elif an == "op_schema":
                a_schema = v or ""
            elif an in comm_names:
                comm.setdefault(i, {})[an] = v
            elif an in ("fw_parent", "fw_tid"):
                if v not in ("", None, 0):  # the forward op (and its thread) an autograd op belongs to
                    extra.setdefault(i, {})[an] = v
            elif v not in ("", None):
                extra.setdefault(i, {})[an] = v
        rf.append(a_rf)
        tid.append(a_tid)
        seq.append(a_seq)
        scope.append(a_scope)
        schema_col.append(strings(a_schema))
        # ETs merged with Kineto times (Chakra's trace linker) carry ts / durations as node keys
        if "inclusive_dur" in n or "dur" in n:
            e = extra.setdefault(i, {})
            e["ts"] = n.get("ts", 0)
            e["dur"] = n.get("inclusive_dur", n.get("dur", 0))
    if progress is not None and total:
        progress(total, total)
    return _finish(path, cols, comm, extra)


def _parse_flat(nodes, path, progress: ProgressFn | None, total: int) -> ExecutionTrace:
    """Schema 1.0.1: every field is a node key, inputs is the list of values."""
    cols = _empty_trace(path)
    comm: dict[int, dict] = {}
    extra: dict[int, dict] = {}
    chunk = max(total // 50, 5000)
    strings, shared = _interners()
    for i, n in enumerate(nodes):
        if progress is not None and total and i % chunk == 0:
            progress(i, total)
        if type(n) is not dict or type(n.get("id")) is not int or type(n.get("name")) is not str:
            _check_node(n, i, path)
        cols["ids"].append(n["id"])
        cols["names"].append(strings(n["name"]))
        cols["parent"].append(n.get("parent", 0) or 0)
        cols["rf_id"].append(n.get("rf_id", -1))
        cols["tid"].append(n.get("tid", -1))
        cols["seq_id"].append(n.get("seq_id", -1))
        cols["scope"].append(n.get("scope", -1))
        fw = {k: n[k] for k in ("fw_parent", "fw_tid") if n.get(k) not in (None, "", 0)}
        if fw:
            extra.setdefault(i, {}).update(fw)
        cols["op_schema"].append(strings(n.get("op_schema", "") or ""))
        cols["in_values"].append(n.get("inputs", ()))
        cols["in_shapes"].append(shared(n.get("input_shapes", ())))
        cols["in_types"].append(shared(n.get("input_types", ())))
        cols["out_values"].append(n.get("outputs", ()))
        cols["out_shapes"].append(shared(n.get("output_shapes", ())))
        cols["out_types"].append(shared(n.get("output_types", ())))
        cols["in_strides"].append(shared(n.get("input_strides", ())))
        cols["out_strides"].append(shared(n.get("output_strides", ())))
        for k in COMM_ATTR_NAMES:
            if k in n:
                comm.setdefault(i, {})[k] = n[k]
    if progress is not None and total:
        progress(total, total)
    return _finish(path, cols, comm, extra)


# --------------------------------------------------------------------------- process groups and rank
def _process_groups(et: ExecutionTrace) -> None:
    """`## process_group:init ##` holds a JSON string: a list of {pg_name, pg_desc, backend_config,
    ranks, group_size, group_count, [backend_id]}."""
    for i, name in enumerate(et.names):
        if name != PG_INIT:
            continue
        for v in et.in_values[i] or ():
            if not isinstance(v, str):
                continue
            try:
                pgs = orjson.loads(v)
            except orjson.JSONDecodeError:
                raise TraceInputError(et.path, f"{PG_INIT} node {int(et.ids[i])} holds invalid JSON") from None
            if isinstance(pgs, dict):
                pgs = [pgs]
            et.process_groups.extend(pg for pg in pgs if isinstance(pg, dict))
    for pg in et.process_groups:
        if str(pg.get("pg_name")) == "0" or pg.get("pg_desc") == "default_pg":
            size = pg.get("group_size")
            if size:
                et.world_size = int(size)
            break


def record_param_comms_args(et: ExecutionTrace, i: int) -> dict[str, Any]:
    """Positional inputs of a `record_param_comms` node (schema >= 1.0.2):
    [tensors, seq, pg (backend id, or (pg_name, pg_desc)), rank, collective_name, in_split, out_split,
     (global_rank_start, global_rank_stride,) world_size]. Empty dict when the layout differs."""
    v = et.in_values[i]
    t = et.in_types[i]
    if not isinstance(v, list) or not isinstance(t, list):
        return {}
    # the collective name is the first String input; everything else is positioned relative to it
    k = next((j for j, ty in enumerate(t) if ty == "String"), -1)
    if k < 3 or k >= len(v) or not isinstance(v[k], str):
        return {}
    out: dict[str, Any] = {"collective_name": v[k], "seq": v[k - 3], "pg": v[k - 2], "rank": v[k - 1]}
    if isinstance(v[k - 2], list) and len(v[k - 2]) >= 1:
        out["pg_name"] = str(v[k - 2][0])
        if len(v[k - 2]) > 1:
            out["pg_desc"] = str(v[k - 2][1])
    tail = v[k + 3:]
    if len(tail) >= 3:
        out["global_rank_start"], out["global_rank_stride"], out["pg_size"] = tail[0], tail[1], tail[2]
    elif len(tail) >= 1:
        out["pg_size"] = tail[-1]
    return out


_NO_RANK_COLLECTIVES = frozenset(("wait", "broadcast", "reduce", "gather", "scatter", "send", "recv", "barrier"))


def _infer_rank(et: ExecutionTrace) -> None:
    """An ET does not name its rank, but each `record_param_comms` records the caller's rank in its
    group; take it from one on the default group (whose rank is the global rank)."""
    for i, name in enumerate(et.names):
        if name != "record_param_comms":
            continue
        a = record_param_comms_args(et, i)
        # rooted collectives record the root in the rank slot; waits record no group
        if not a or str(a.get("collective_name")).lower().lstrip("_") in _NO_RANK_COLLECTIVES:
            continue
        pg = a.get("pg_name")
        default = pg in (None, "0") or a.get("pg_desc") == "default_pg"
        if isinstance(a.get("pg"), int):  # 1.0.2: a backend id; map it through the init record
            default = any(pg_.get("backend_id") == a["pg"] and str(pg_.get("pg_name")) == "0"
                          for pg_ in et.process_groups) or not et.process_groups
        if default and isinstance(a.get("rank"), int) and a["rank"] >= 0:
            et.rank = int(a["rank"])
            if et.world_size is None and isinstance(a.get("pg_size"), int):
                et.world_size = int(a["pg_size"])
            return


__all__ = ["ExecutionTrace", "load_execution_trace", "execution_trace_from_json", "read_json_bytes",
           "record_param_comms_args", "is_root_name", "ROOT_PROCESS", "ROOT_THREAD", "PG_INIT",
           "COMM_ATTR_NAMES", "RECORD_FUNCTION_SCOPE_USER"]
