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

Columns are plain Python lists (numbers) and lists of the events' own `args` dicts (no copies): the
graph builder (kineto_graph.py) walks them once.
"""
from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from chakra_schema.errors import TraceInputError

HOST_CATS = frozenset(("cpu_op", "user_annotation"))
RUNTIME_CATS = frozenset(("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"))
GPU_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))


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
    rt_args: list[dict] = field(default_factory=list)
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

    @property
    def num_gpu_ops(self) -> int:
        return len(self.gpu_name)

    @property
    def num_runtime(self) -> int:
        return len(self.rt_name)


def load_kineto(path: str | os.PathLike,
                progress: Callable[[int, int], None] | None = None) -> KinetoTrace:
    """Parse a Kineto trace (`.json` or `.json.gz`). Raises TraceInputError on bad input.

    `progress(done, total)` is called while walking the events (total = number of events).
    """
    root = _read_json(path)
    if not isinstance(root, dict) or not isinstance(root.get("traceEvents"), list):
        what = "an Execution Trace" if isinstance(root, dict) and "nodes" in root else "not a Kineto trace"
        raise TraceInputError(path, f"{what}: no 'traceEvents' list at top level")
    events = root.pop("traceEvents")
    dist = root.get("distributedInfo") if isinstance(root.get("distributedInfo"), dict) else {}
    trace = KinetoTrace(
        path=str(path),
        rank=_int_or_none(dist.get("rank")),
        world_size=_int_or_none(dist.get("world_size")),
        pg_config=dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else None,
        host_ops=[],
        metadata=root,
    )
    try:
        _walk_events(trace, events, progress)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceInputError(path, f"malformed trace event: {type(exc).__name__}: {exc}") from None
    if not trace.host_ops and not trace.gpu_name and not trace.rt_name:
        raise TraceInputError(path, "Kineto trace has no host, runtime or GPU events")
    return trace


def _read_json(path: str | os.PathLike) -> Any:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise TraceInputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceInputError(path, f"bad gzip data: {exc}") from None
    if not raw.strip():
        raise TraceInputError(path, "empty file")
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
    empty: dict = {}
    total = len(events)
    chunk = max(total // 100, 10000)
    for n, ev in enumerate(events):
        if progress is not None and n % chunk == 0:
            progress(n, total)
        cat = ev.get("cat")
        ph = ev.get("ph")
        if ph == "X":
            if cat in HOST_CATS:
                args = ev.get("args") or empty
                host_ops.append(HostOp(len(host_ops), ev["name"], ev["pid"], ev["tid"], float(ev["ts"]),
                                       float(ev.get("dur", 0.0)), cat, args.get("Record function id"),
                                       args.get("External id"), args.get("Sequence number"), args))
            elif cat in GPU_CATS:
                args = ev.get("args") or empty
                gpu_name.append(ev["name"])
                gpu_cat.append(cat)
                gpu_device.append(int(args.get("device", ev["pid"])))
                gpu_stream.append(int(args.get("stream", ev["tid"])))
                gpu_ts.append(float(ev["ts"]))
                gpu_dur.append(float(ev.get("dur", 0.0)))
                gpu_corr.append(int(args.get("correlation", -1)))
                gpu_args.append(args)
            elif cat in RUNTIME_CATS:
                args = ev.get("args") or empty
                rt_name.append(ev["name"])
                rt_cat.append(cat)
                rt_pid.append(ev["pid"])
                rt_tid.append(ev["tid"])
                rt_ts.append(float(ev["ts"]))
                rt_dur.append(float(ev.get("dur", 0.0)))
                rt_corr.append(int(args.get("correlation", -1)))
                rt_ext.append(int(args.get("External id", -1)))
                rt_args.append(args)
            elif cat == "cuda_sync":
                args = ev.get("args") or empty
                t.sync_kind.append(args.get("cuda_sync_kind", ev.get("name", "")))
                t.sync_ts.append(float(ev["ts"]))
                t.sync_dur.append(float(ev.get("dur", 0.0)))
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
