"""Write a simulated run as a chrome trace that Perfetto and chrome://tracing open: one process per
rank, one track per CPU thread and GPU stream, flow arrows linking the members of each collective."""
from __future__ import annotations

import os

import orjson

from chakra_schema.safe_io import atomic_output

from replay.engine import SimulatedRun


def timeline_events(run: SimulatedRun) -> list[dict]:
    events: list[dict] = []
    for r, g in enumerate(run.graphs):
        sl = run.rank_slice(r)
        pid = int(g.rank)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {g.rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for k, res in enumerate(g.resources):
            # GPU tracks after CPU tracks: tid offset keeps them apart and ordered
            tid = (100000 + k) if res.is_gpu else k + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": res.label()}})
        tids = [(100000 + k) if res.is_gpu else k + 1 for k, res in enumerate(g.resources)]
        start = run.start[sl].tolist()
        end = run.end[sl].tolist()
        res_col = g.resource.tolist()
        kinds = g.kind.tolist()
        for i in range(len(g)):
            events.append({"ph": "X", "name": g.name[i], "pid": pid, "tid": tids[res_col[i]], "ts": start[i],
                           "dur": max(end[i] - start[i], 0.0), "args": {"id": int(g.node_id[i]), "kind": kinds[i]}})
    # flows: from each member of a collective to the next (Perfetto draws arrows between tracks)
    flow_id = 0
    for members in run.rendezvous:
        for a, b in zip(members, members[1:]):
            flow_id += 1
            for gi, ph in ((a, "s"), (b, "f")):
                r = int(run.offsets.searchsorted(gi, side="right") - 1)
                g = run.graphs[r]
                li = gi - int(run.offsets[r])
                res = g.resources[int(g.resource[li])]
                tid = (100000 + int(g.resource[li])) if res.is_gpu else int(g.resource[li]) + 1
                ev = {"ph": ph, "id": flow_id, "name": "collective", "cat": "collective", "pid": int(g.rank),
                      "tid": tid, "ts": float(run.start[gi])}
                if ph == "f":
                    ev["bp"] = "e"
                events.append(ev)
    return events


def write_timeline(run: SimulatedRun, path: str | os.PathLike) -> None:
    """Atomically write the chrome trace JSON (parent directories are created; errors are one line)."""
    doc = {"traceEvents": timeline_events(run), "displayTimeUnit": "ms",
           "otherData": {"generator": "lumos-sim", "timing": run.timing_name}}
    with atomic_output(path) as f:
        f.write(orjson.dumps(doc))
