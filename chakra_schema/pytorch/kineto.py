"""Kineto (Chrome trace JSON) parsing: one pass over `traceEvents` into compact per-category tables.

`load_kineto(path)` reads a plain or gzipped Kineto trace (the file `torch.profiler` exports) and returns
a `KinetoTrace`:

- `host_ops`: one `HostOp` per `cpu_op` / `user_annotation` event (the host operators and annotations
  that an Execution Trace can be linked to through `rf_id` == args["Record function id"]). `python_function`
  events are dropped: their time stays in the thread's gaps.
- runtime calls (`cuda_runtime`, `cuda_driver`, HIP runtime): columns `rt_*`, one row per call, file order.
- GPU ops (`kernel`, `gpu_memcpy`, `gpu_memset`): columns `gpu_*`, one row per op, file order.
- `cuda_sync` events (newer traces: which stream / event a synchronize or stream-wait was about):
  columns `sync_*`.
- `fwdbwd` flow events (forward op -> backward op across threads): `flows` rows (id, phase, pid, tid, ts).
- `distributedInfo` -> `rank`, `world_size`, `pg_config`; everything else at top level -> `metadata`.

Times are float microseconds as recorded (`ts`, `dur`). Bad input (not JSON, not a Kineto trace, empty,
truncated gzip) raises `TraceInputError(path, one line)`.

Columns are plain Python lists (numbers) and lists of the events' own `args` dicts (no copies; a
runtime call keeps its args only when they name a stream): the graph builder (kineto_graph.py) walks
them once. The file is gunzipped and parsed in ~4 MiB slices of `traceEvents` (orjson), so peak memory
is what the trace keeps plus one slice, about 2.6x the uncompressed JSON on
hta/trace_diff_control_control (benchmarks/bench_convert_kineto.py).
"""
from __future__ import annotations

import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import orjson

from chakra_schema.errors import TraceInputError
from chakra_schema.safe_io import input_too_large, max_input_bytes, read_json_input

HOST_CATS = frozenset(("cpu_op", "user_annotation"))
RUNTIME_CATS = frozenset(("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"))
GPU_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
KNOWN_CATS = HOST_CATS | RUNTIME_CATS | GPU_CATS | {"cuda_sync"}
# Older Kineto (PyTorch 1.x) names its categories "Operator", "Runtime", "Kernel", "Memcpy", "Memset":
# the current name of each, matched case-insensitively
_OLD_CATS = {"operator": "cpu_op", "runtime": "cuda_runtime", "driver": "cuda_driver", "memcpy": "gpu_memcpy",
             "memset": "gpu_memset", "user annotation": "user_annotation"}
# Complete events that are no work to replay: Python frames (their time stays in the thread's gaps),
# GPU-side annotations, the profiler's own spans and bookkeeping
IGNORED_CATS = frozenset(("python_function", "gpu_user_annotation", "trace", "cpu_instant_event", "overhead",
                          "external_correlation", "cuda_sync_event", "python", "kernel_annotation"))
# what a dropped category is, for the warning that counts them
_DROPPED_WHY = {
    "cuda_profiler_range": "CUPTI range-profiler measurements, kernels serialized to read counters: not a timeline",
    "mtia_ccp_events": "MTIA device events; lumos-sim replays CUDA/HIP GPUs",
    "mtia_runtime": "MTIA runtime calls; lumos-sim replays CUDA/HIP GPUs",
}


_MISSING = object()


def canonical_category(cat: Any) -> str | None:
    """The category an event is read as: the known name of an older or differently capitalised one,
    else the category itself lower-cased (None when it is not a string)."""
    if not isinstance(cat, str):
        return None
    low = cat.lower()
    return _OLD_CATS.get(low, low)


@dataclass(slots=True)
class HostOp:
    """One `cpu_op` / `user_annotation` event on a CPU thread (the unit H2b links to the Execution Trace)."""

    index: int                # position in KinetoTrace.host_ops
    name: str
    pid: int
    tid: int
    ts: float                 # us
    dur: float                # us, inclusive
    cat: str                  # "cpu_op" | "user_annotation"
    rf_id: int | None         # args["Record function id"] (None in old traces)
    external_id: int | None   # args["External id"]
    seq: int | None           # args["Sequence number"]
    args: dict                # the event's args, as recorded


@dataclass
class KinetoTrace:
    """A parsed Kineto trace: host ops as objects, everything else as columns (see module docstring)."""

    path: str
    rank: int | None
    world_size: int | None
    pg_config: list | None
    host_ops: list[HostOp]
    # runtime calls (cuda_runtime / cuda_driver): one row each
    rt_name: list[str] = field(default_factory=list)
    rt_cat: list[str] = field(default_factory=list)
    rt_pid: list[int] = field(default_factory=list)
    rt_tid: list[int] = field(default_factory=list)
    rt_ts: list[float] = field(default_factory=list)
    rt_dur: list[float] = field(default_factory=list)
    rt_corr: list[int] = field(default_factory=list)       # args.correlation, -1 when absent
    rt_ext: list[int] = field(default_factory=list)        # args["External id"], -1 when absent
    rt_args: list[dict] = field(default_factory=list)     # the call's args when they name a stream, else {}
    # GPU ops (kernel / gpu_memcpy / gpu_memset): one row each
    gpu_name: list[str] = field(default_factory=list)
    gpu_cat: list[str] = field(default_factory=list)
    gpu_device: list[int] = field(default_factory=list)
    gpu_stream: list[int] = field(default_factory=list)
    gpu_ts: list[float] = field(default_factory=list)
    gpu_dur: list[float] = field(default_factory=list)
    gpu_corr: list[int] = field(default_factory=list)      # -1 when absent
    gpu_args: list[dict] = field(default_factory=list)
    # cuda_sync events: what a synchronize / stream-wait call waited on
    sync_kind: list[str] = field(default_factory=list)     # "Stream Sync" | "Event Sync" | "Context Sync" | "Stream Wait Event"
    sync_ts: list[float] = field(default_factory=list)
    sync_dur: list[float] = field(default_factory=list)
    sync_corr: list[int] = field(default_factory=list)     # correlation of the runtime call
    sync_stream: list[int] = field(default_factory=list)   # waiting stream (-1: the host)
    sync_wait_stream: list[int] = field(default_factory=list)       # stream the event was recorded on (-1)
    sync_record_corr: list[int] = field(default_factory=list)       # correlation of the cudaEventRecord (-1)
    # fwdbwd flow events: (id, phase "s"/"f", pid, tid, ts)
    flows: list[tuple[int, str, int, int, float]] = field(default_factory=list)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # complete events of categories that are not replayed (not host, runtime or GPU work): count by category
    dropped: dict[str | None, int] = field(default_factory=dict)

    @property
    def num_gpu_ops(self) -> int:
        return len(self.gpu_name)

    @property
    def num_runtime(self) -> int:
        return len(self.rt_name)


def load_kineto(path: str | os.PathLike,
                progress: Callable[[int, int], None] | None = None) -> KinetoTrace:
    """Parse a Kineto trace (`.json` or `.json.gz`). Raises TraceInputError on bad input.

    The file is decompressed and parsed in slices of `traceEvents` (see `_stream_events`), so memory
    holds one slice of raw JSON at a time plus what the trace keeps, not the whole decoded document.
    Files the slicer cannot handle are parsed whole (same result, more memory).
    `progress(done, total)` reports bytes of the file read.
    """
    trace = _new_trace(path)
    try:
        root = _stream_events(path, trace, progress)
    except _NotStreamable:
        trace = _new_trace(path)
        root = _read_json(path)
        if isinstance(root, list) and root and all(isinstance(e, dict) and "ph" in e for e in root[:1000]):
            root = {"traceEvents": root}     # the Chrome trace format's other form: the bare event array
        if not isinstance(root, dict) or not isinstance(root.get("traceEvents"), list):
            what = "an Execution Trace" if isinstance(root, dict) and "nodes" in root else "not a Kineto trace"
            raise TraceInputError(path, f"{what}: no 'traceEvents' list at top level") from None
        events = root.pop("traceEvents")
        _walk_checked(path, trace, events)
        del events
    if not isinstance(root, dict):
        raise TraceInputError(path, "not a Kineto trace: top level is not an object")
    root.pop("traceEvents", None)
    dist = root.get("distributedInfo") if isinstance(root.get("distributedInfo"), dict) else {}
    trace.rank = _int_or_none(dist.get("rank"))
    trace.world_size = _int_or_none(dist.get("world_size"))
    trace.pg_config = dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else None
    trace.metadata = root
    if not trace.host_ops and not trace.gpu_name and not trace.rt_name:
        raise TraceInputError(path, "Kineto trace has no host, runtime or GPU events"
                              + ("; " + _dropped_text(trace) if trace.dropped else ""))
    if trace.dropped:
        log.warning("%s: not replayed: %s (the replay and its step times cover the host, runtime and GPU events)",
                    path, _dropped_text(trace))
    _check_thread_ids(path, trace)
    _repair_durations(path, trace)
    return trace


def _dropped_text(trace: KinetoTrace) -> str:
    """'1,313 events of category mtia_ccp_events (MTIA device events ...), ...' (largest first)."""
    return ", ".join(f"{n:,} event{'s' if n != 1 else ''} " + (f"of category {cat}" if cat else "without a category")
                     + (f" ({_DROPPED_WHY[cat]})" if cat in _DROPPED_WHY else "")
                     for cat, n in sorted(trace.dropped.items(), key=lambda kv: -kv[1]))


def _new_trace(path) -> KinetoTrace:
    return KinetoTrace(path=str(path), rank=None, world_size=None, pg_config=None, host_ops=[])


def _walk_checked(path, trace: KinetoTrace, events: Any) -> None:
    if not isinstance(events, list):
        raise TraceInputError(path, "not a Kineto trace: 'traceEvents' is not a list")
    try:
        _walk_events(trace, events, None)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise TraceInputError(path, f"malformed trace event: {type(exc).__name__}: {exc}") from None


_NO_DUR = float("nan")        # an "X" event without `dur`: repaired (or rejected) by `_repair_durations`
MAX_EVENT_US = 1e11           # ~28 hours: no single traced operation lasts longer
MAX_TS_US = 1e17              # ~3,000 years of microseconds since the epoch


def _thread_id(path, v: Any, what: str, name: Any) -> int:
    if type(v) is int:
        return v
    try:
        return int(v)            # "7" or 7.0 are fine
    except (TypeError, ValueError, OverflowError):
        raise TraceInputError(path, f"event {str(name)[:60]!r} has a {what} that is not an integer: {v!r}"[:200]) from None


def _check_thread_ids(path, t: KinetoTrace) -> None:
    """pid / tid name CPU threads: every later stage needs integers (and names strings)."""
    for col in (t.rt_name, t.gpu_name):
        for i, v in enumerate(col):
            if type(v) is not str:
                col[i] = "" if v is None else str(v)
    for h in t.host_ops:
        if type(h.name) is not str:
            h.name = "" if h.name is None else str(h.name)
        if type(h.pid) is not int or type(h.tid) is not int:
            h.pid, h.tid = _thread_id(path, h.pid, "pid", h.name), _thread_id(path, h.tid, "tid", h.name)
    for col, what in ((t.rt_pid, "pid"), (t.rt_tid, "tid")):
        for i, v in enumerate(col):
            if type(v) is not int:
                col[i] = _thread_id(path, v, what, t.rt_name[i])
    t.flows[:] = [(fid, ph, _thread_id(path, pid, "pid", "flow"), _thread_id(path, tid, "tid", "flow"), ts)
                  for fid, ph, pid, tid, ts in t.flows]


def _repair_durations(path, t: KinetoTrace) -> None:
    """Events with a missing, negative, non-finite or impossibly long duration are taken as 0 us with
    one warning that counts them; a trace where no event has a usable duration, or with an impossible
    timestamp, is rejected (it cannot be replayed into anything meaningful)."""
    cols = [t.rt_dur, t.gpu_dur, t.sync_dur]
    host = np.fromiter((h.dur for h in t.host_ops), np.float64, len(t.host_ops))
    arrays = [host] + [np.asarray(c, np.float64) for c in cols]
    total = sum(len(a) for a in arrays)
    bad = [~((a >= 0) & (a <= MAX_EVENT_US)) for a in arrays]
    nbad = int(sum(int(b.sum()) for b in bad))
    stamps = [np.fromiter((h.ts for h in t.host_ops), np.float64, len(t.host_ops)),
              np.asarray(t.rt_ts, np.float64), np.asarray(t.gpu_ts, np.float64), np.asarray(t.sync_ts, np.float64)]
    bad_ts = int(sum(int((~(np.abs(a) <= MAX_TS_US)).sum()) for a in stamps))
    if bad_ts:
        raise TraceInputError(path, f"{bad_ts} events have a missing, non-finite or impossible timestamp 'ts'")
    if not nbad:
        return
    if nbad == total:
        raise TraceInputError(path, f"none of the {total} complete events has a usable duration 'dur' "
                                    "(missing, negative or longer than 1e11 us)")
    for h in np.flatnonzero(bad[0]).tolist():
        t.host_ops[h].dur = 0.0
    for col, b in zip(cols, bad[1:]):
        for i in np.flatnonzero(b).tolist():
            col[i] = 0.0
    log.warning("%s: %d of %d events had a missing, negative or impossible duration 'dur'; taken as 0 us",
                path, nbad, total)


class _NotStreamable(Exception):
    """The slicing parser cannot handle this file: parse it whole instead."""


log = logging.getLogger(__name__)

_SLICE_BYTES = 4 << 20          # raw JSON parsed at a time
_MAX_PENDING = 64 << 20         # give up slicing when no event boundary is found within this much
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def _raw_blocks(path, progress: Callable[[int, int], None] | None) -> Iterator[bytes]:
    """The file's bytes, gunzipped on the fly when it is gzip, in blocks of about 1 MiB."""
    try:
        fh = open(path, "rb")
        total = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise TraceInputError(path, f"cannot read: {exc.strerror or exc}") from None
    with fh:
        first = fh.read(1 << 20)
        dec = zlib.decompressobj(16 + zlib.MAX_WBITS) if first[:2] == b"\x1f\x8b" else None
        done = produced = 0
        limit = max_input_bytes()
        block = first
        while block:
            done += len(block)
            pending = block
            while pending:
                if dec is None:
                    out, pending = pending, b""
                else:
                    try:   # bounded: a gzip bomb expands 4 MiB at a time
                        out = dec.decompress(pending, 1 << 22)
                    except zlib.error as exc:
                        raise TraceInputError(path, f"bad gzip data: {exc}") from None
                    pending = dec.unconsumed_tail
                    if dec.unused_data:      # a multi-member gzip: let the whole-file reader handle it
                        raise _NotStreamable
                produced += len(out)
                if produced > limit:
                    raise input_too_large(path, limit)
                if out:
                    yield out
            if progress is not None:
                progress(done, total)
            block = fh.read(1 << 20)
        if dec is not None:
            tail = dec.flush()
            if not dec.eof:
                raise TraceInputError(path, "bad gzip data: truncated (end of stream not found)")
            if tail:
                yield tail


def _stream_events(path, trace: KinetoTrace, progress) -> dict:
    """Parse `traceEvents` in slices cut at event boundaries ("}, {" between two top-level events),
    walking each slice into `trace`; return the top-level object without its events.

    A cut is accepted only when the slice parses as a JSON array on its own, so a "}, {" inside a
    string or a nested value is never taken for a boundary (the slice would not parse)."""
    head: bytes | None = None
    buf = bytearray()
    for block in _raw_blocks(path, progress):
        searched = max(0, len(buf) - 64)       # the key may straddle two blocks
        buf += block
        if head is None:
            m = _EVENTS_KEY.search(buf, searched)
            if m is None:
                if len(buf) > _MAX_PENDING or (buf.lstrip()[:1] not in (b"{", b"")):
                    raise _NotStreamable
                continue
            head = bytes(buf[:m.end() - 1])       # up to the key and its colon
            del buf[:m.end()]                      # events start right after "["
        if len(buf) >= _SLICE_BYTES:
            _cut_and_walk(path, trace, buf)
    if head is None:
        raise _NotStreamable
    _cut_and_walk(path, trace, buf)
    # buf: the last event(s), "]", and the rest of the top-level object
    tries = 0
    pos = len(buf)
    while tries < 10000:
        pos = buf.rfind(b"]", 0, pos)
        if pos < 0:
            break
        tries += 1
        try:
            root = orjson.loads(head + b"[]" + bytes(buf[pos + 1:]))
            events = orjson.loads(b"[" + bytes(buf[:pos]) + b"]")
        except orjson.JSONDecodeError:
            continue
        _walk_checked(path, trace, events)
        return root
    raise _NotStreamable


def _cut_and_walk(path, trace: KinetoTrace, buf: bytearray) -> None:
    """Walk every complete event of `buf` but the last one and drop them from `buf`."""
    start = max(0, len(buf) - (1 << 16))
    while True:
        cuts = [m for m in _BOUNDARY.finditer(buf, start)]
        for m in reversed(cuts):
            try:
                events = orjson.loads(b"[" + bytes(buf[:m.start() + 1]) + b"]")
            except orjson.JSONDecodeError:
                continue
            _walk_checked(path, trace, events)
            del buf[:m.end() - 1]                  # keep the "{" of the next event
            return
        if start == 0:
            if len(buf) > _MAX_PENDING:
                raise _NotStreamable
            return                                 # no boundary yet: read more
        start = 0


def _read_json(path: str | os.PathLike) -> Any:
    raw = read_json_input(path)   # one buffer; blank content is refused there ("empty file"), no copy here
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceInputError(path, f"not valid JSON: {exc}") from None


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _walk_events(t: KinetoTrace, events: list, progress: Callable[[int, int], None] | None) -> None:
    """One pass; dispatch on `cat` (X events), keep fwdbwd flows and thread names. Hot loop: locals only."""
    host_ops = t.host_ops
    rt = (t.rt_name, t.rt_cat, t.rt_pid, t.rt_tid, t.rt_ts, t.rt_dur, t.rt_corr, t.rt_ext, t.rt_args)
    rt_name, rt_cat, rt_pid, rt_tid, rt_ts, rt_dur, rt_corr, rt_ext, rt_args = rt
    gpu_name, gpu_cat, gpu_device, gpu_stream = t.gpu_name, t.gpu_cat, t.gpu_device, t.gpu_stream
    gpu_ts, gpu_dur, gpu_corr, gpu_args = t.gpu_ts, t.gpu_dur, t.gpu_corr, t.gpu_args
    flows = t.flows
    dropped = t.dropped
    canonical: dict = {}         # raw category -> the name it is read as (python_function: every other event)
    empty: dict = {}
    total = len(events)
    chunk = max(total // 100, 10000)
    for n, ev in enumerate(events):
        if progress is not None and n % chunk == 0:
            progress(n, total)
        cat = ev.get("cat")
        ph = ev.get("ph")
        if ph == "X":
            if cat not in KNOWN_CATS:
                canon = canonical.get(cat, _MISSING)
                if canon is _MISSING:
                    canon = canonical[cat] = canonical_category(cat)
                cat = canon
                if cat not in KNOWN_CATS:
                    if cat not in IGNORED_CATS:
                        dropped[cat] = dropped.get(cat, 0) + 1
                    continue
            if cat in HOST_CATS:
                args = ev.get("args") or empty
                host_ops.append(HostOp(len(host_ops), ev["name"], ev["pid"], ev["tid"], float(ev["ts"]),
                                       float(ev.get("dur", _NO_DUR)), cat, args.get("Record function id"),
                                       args.get("External id", args.get("external id")),
                                       args.get("Sequence number"), args))
            elif cat in GPU_CATS:
                args = ev.get("args") or empty
                gpu_name.append(ev["name"])
                gpu_cat.append(cat)
                gpu_device.append(int(args.get("device", ev["pid"])))
                gpu_stream.append(int(args.get("stream", ev["tid"])))
                gpu_ts.append(float(ev["ts"]))
                gpu_dur.append(float(ev.get("dur", _NO_DUR)))
                gpu_corr.append(int(args.get("correlation", -1)))
                gpu_args.append(args)
            elif cat in RUNTIME_CATS:
                args = ev.get("args") or empty
                rt_name.append(ev["name"])
                rt_cat.append(cat)
                rt_pid.append(ev["pid"])
                rt_tid.append(ev["tid"])
                rt_ts.append(float(ev["ts"]))
                rt_dur.append(float(ev.get("dur", _NO_DUR)))
                rt_corr.append(int(args.get("correlation", -1)))
                rt_ext.append(int(args.get("External id", args.get("external id", -1))))   # older: lower case
                rt_args.append(args if "stream" in args else empty)   # only a stream arg is used
            elif cat == "cuda_sync":
                args = ev.get("args") or empty
                t.sync_kind.append(args.get("cuda_sync_kind", ev.get("name", "")))
                t.sync_ts.append(float(ev["ts"]))
                t.sync_dur.append(float(ev.get("dur", _NO_DUR)))
                t.sync_corr.append(int(args.get("correlation", -1)))
                t.sync_stream.append(int(args.get("stream", -1)))
                t.sync_wait_stream.append(int(args.get("wait_on_stream", -1)))
                t.sync_record_corr.append(int(args.get("wait_on_cuda_event_record_corr_id", -1)))
            # python_function, gpu_user_annotation, Trace spans: not nodes
        elif cat == "fwdbwd" and (ph == "s" or ph == "f"):
            flows.append((int(ev["id"]), ph, ev["pid"], ev["tid"], float(ev["ts"])))
        elif ph == "M" and ev.get("name") == "thread_name":
            t.thread_names[(ev.get("pid"), ev.get("tid"))] = (ev.get("args") or empty).get("name", "")
    if progress is not None:
        progress(total, total)
