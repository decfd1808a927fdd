"""Write a simulated run as a chrome trace that Perfetto and chrome://tracing open: one process per
rank, one track per CPU thread and GPU stream.

Like a Kineto trace, every slice has a category (`cat`: the OpKind in lower case, e.g. `kernel`,
`cpu_op`, `collective`) and readable args: the kind's name, the node id, shapes and dtypes, and for
communication the collective's name, bytes and process group. Flow arrows link each runtime launch
to the GPU op it launched (`cat` "launch", as Kineto's `ac2g` flows) and the members of each
collective across ranks (`cat` "collective")."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import orjson

from chakra_schema.graph import CommType, EdgeKind, ExecutionGraph, OpKind
from chakra_schema.safe_io import atomic_output

from replay.engine import SimulatedRun

_GPU_TID_BASE = 100000   # GPU tracks after CPU tracks: the tid offset keeps them apart and ordered
_KIND_NAMES = {int(k): k.name for k in OpKind}
_CATEGORIES = {int(k): k.name.lower() for k in OpKind}
_COMM_NAMES = {int(c): c.name for c in CommType}
# node attrs shown in a slice's args, under these names (anything else stays out: ids of the trace
# producer, schemas, call-stack bookkeeping)
_ARG_ATTRS = (("input_shapes", "input shapes"), ("input_types", "input dtypes"), ("output_shapes", "output shapes"),
              ("coll_name", "collective"), ("pg_name", "process group"), ("pg_size", "group size"),
              ("bytes", "bytes"), ("grid", "grid"), ("block", "block"), ("correlation", "correlation"))


def _tid(g: ExecutionGraph, resource: int) -> int:
    return _GPU_TID_BASE + resource if g.resources[resource].is_gpu else resource + 1


def node_args(g: ExecutionGraph, i: int) -> dict[str, Any]:
    """The readable args of node `i`: kind name, id, shapes, and bytes / collective for communication."""
    kind = int(g.kind[i])
    args: dict[str, Any] = {"kind": _KIND_NAMES.get(kind, str(kind)), "id": int(g.node_id[i])}
    attrs = g.attrs.get(i)
    if not attrs:
        return args
    for key, label in _ARG_ATTRS:
        v = attrs.get(key)
        if v is not None and v != "" and v != []:
            args[label] = v
    ct = attrs.get("comm_type")
    if ct is not None:
        args["comm type"] = _COMM_NAMES.get(int(ct), str(ct)) if isinstance(ct, int) else str(ct)
    size = attrs.get("comm_size")
    if size is not None:
        args["bytes"] = int(size)
    return args


def _flow(flow_id: int, ph: str, name: str, pid: int, tid: int, ts: float) -> dict:
    ev = {"ph": ph, "id": flow_id, "name": name, "cat": name, "pid": pid, "tid": tid, "ts": ts}
    if ph == "f":
        ev["bp"] = "e"   # bind to the enclosing slice at the arrow's end
    return ev


def timeline_events(run: SimulatedRun) -> list[dict]:
    events: list[dict] = []
    flow_id = 0
    for r, g in enumerate(run.graphs):
        sl = run.rank_slice(r)
        pid = int(g.rank)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {g.rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        tids = [_tid(g, k) for k in range(len(g.resources))]
        for k, res in enumerate(g.resources):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[k], "args": {"name": res.label()}})
        start = run.start[sl].tolist()
        end = run.end[sl].tolist()
        res_col = g.resource.tolist()
        kinds = g.kind.tolist()
        for i in range(len(g)):
            events.append({"ph": "X", "name": g.name[i], "cat": _CATEGORIES.get(kinds[i], "other"), "pid": pid,
                           "tid": tids[res_col[i]], "ts": start[i], "dur": max(end[i] - start[i], 0.0),
                           "args": node_args(g, i)})
        # launch -> GPU op flows: the LAUNCH edges of the graph (src = runtime call, dst = GPU op)
        dst = np.repeat(np.arange(len(g), dtype=np.int64), np.diff(g.dep_ptr))
        launch = np.flatnonzero(g.dep_kind == EdgeKind.LAUNCH)
        for e in launch.tolist():
            s, d = int(g.dep_src[e]), int(dst[e])
            flow_id += 1
            events.append(_flow(flow_id, "s", "launch", pid, tids[res_col[s]], start[s]))
            events.append(_flow(flow_id, "f", "launch", pid, tids[res_col[d]], start[d]))
    # collective flows: from each member of a collective to the next (arrows between ranks' tracks)
    for members in run.rendezvous:
        for a, b in zip(members, members[1:]):
            flow_id += 1
            for gi, ph in ((a, "s"), (b, "f")):
                r = int(run.offsets.searchsorted(gi, side="right") - 1)
                g = run.graphs[r]
                li = gi - int(run.offsets[r])
                events.append(_flow(flow_id, ph, "collective", int(g.rank), _tid(g, int(g.resource[li])),
                                    float(run.start[gi])))
    return events


def write_timeline(run: SimulatedRun, path: str | os.PathLike) -> None:
    """Atomically write the chrome trace JSON (parent directories are created; errors are one line)."""
    doc = {"traceEvents": timeline_events(run), "displayTimeUnit": "ms",
           "otherData": {"generator": "lumos-sim", "timing": run.timing_name}}
    with atomic_output(path) as f:
        f.write(orjson.dumps(doc))
