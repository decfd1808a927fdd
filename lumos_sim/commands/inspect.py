"""`lumos-sim inspect`: summarize Chakra `.et` graphs, one rank or a whole `PREFIX.<rank>.et` set.

Per rank: node counts by Chakra NodeType and by OpKind, resources, collectives (by comm type and
process group, with total bytes), steps, and the result of `ExecutionGraph.validate()`.
"""
from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import numpy as np
import orjson

from chakra_schema.graph import CommType, EdgeKind, ExecutionGraph, NodeType, OpKind
from chakra_schema.graph_io import read_graphs
from lumos_sim.progress import progress_bar


def register(sub) -> None:
    p = sub.add_parser("inspect", help="summarize .et graphs (counts, collectives, steps, validation)",
                       description="Summarize a Chakra .et file or every rank of PREFIX.<rank>.et.")
    p.add_argument("trace", metavar="FILE.et|PREFIX", help="one .et file, or the PREFIX of PREFIX.<rank>.et")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=main)


def _enum_name(enum, value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


def summarize(g: ExecutionGraph) -> dict[str, Any]:
    """A JSON-ready summary of one rank's graph."""
    types = Counter(g.node_type.tolist())
    kinds = Counter(g.kind.tolist())
    colls: dict[tuple[str, str], dict[str, Any]] = {}
    # by OpKind, not NodeType: Chakra also types the host-side c10d call COMM_COLL, but it moves no data
    comm = np.flatnonzero(np.isin(g.kind, (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)))
    for i in comm.tolist():
        ct = g.attr(i, "comm_type")
        if g.kind[i] == OpKind.SEND:
            label = "SEND"
        elif g.kind[i] == OpKind.RECV:
            label = "RECV"
        else:
            label = _enum_name(CommType, int(ct)) if ct is not None else "unknown"
        pg = str(g.attr(i, "pg_name", "") or "")
        entry = colls.setdefault((label, pg), {"comm_type": label, "pg_name": pg, "count": 0, "bytes": 0})
        entry["count"] += 1
        size = g.attr(i, "comm_size")
        if size is not None:
            entry["bytes"] += int(size)
    problems = g.validate()
    n_gpu = sum(1 for r in g.resources if r.is_gpu)
    span = float(np.max(g.start_us + g.duration_us) - np.min(g.start_us)) if len(g) else 0.0
    return {
        "rank": g.rank,
        "world_size": g.world_size,
        "source": g.metadata.get("source"),
        "nodes": len(g),
        "edges": g.num_edges,
        "edges_by_kind": {_enum_name(EdgeKind, k): c for k, c in sorted(Counter(g.dep_kind.tolist()).items())},
        # the dep ids as the file stores them (data deps include the thread/stream order deps written for
        # Chakra consumers; ctrl deps are the call-stack parents), not the graph's deduplicated edges
        "file_data_deps": g.metadata.get("file_data_deps"),
        "file_ctrl_deps": g.metadata.get("file_ctrl_deps"),
        "node_types": {_enum_name(NodeType, t): c for t, c in sorted(types.items())},
        "op_kinds": {_enum_name(OpKind, k): c for k, c in sorted(kinds.items())},
        "resources": {"cpu_threads": len(g.resources) - n_gpu, "gpu_streams": n_gpu},
        "collectives": sorted(colls.values(), key=lambda e: (e["comm_type"], e["pg_name"])),
        "steps": [{"name": s.name, "start_us": s.start_us, "duration_ms": s.duration_us / 1000.0}
                  for s in g.steps],
        "recorded_span_ms": span / 1000.0,
        "dropped_deps": int(g.metadata.get("dropped_deps", 0)),
        "dropped_ctrl_deps": int(g.metadata.get("dropped_ctrl_deps", 0)),
        "valid": not problems,
        "problems": problems,
    }


def _print_tables(summaries: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from lumos_sim.tables import console as make_console

    console = make_console()
    for s in summaries:
        head = Table(title=f"rank {s['rank']} / {s['world_size']}  ({s['source']})", show_header=False)
        head.add_column(style="bold")
        head.add_column()
        head.add_row("nodes", f"{s['nodes']:,}")
        if s["file_data_deps"] is not None:
            head.add_row("in the file", f"{s['file_data_deps']:,} data deps, {s['file_ctrl_deps']:,} ctrl deps")
        head.add_row("graph edges", f"{s['edges']:,}: " + ", ".join(f"{k} {v:,}" for k, v in s["edges_by_kind"].items()))
        head.add_row("node types", ", ".join(f"{k} {v:,}" for k, v in s["node_types"].items()))
        head.add_row("op kinds", ", ".join(f"{k} {v:,}" for k, v in s["op_kinds"].items()))
        head.add_row("resources", f"{s['resources']['cpu_threads']} CPU threads, "
                                  f"{s['resources']['gpu_streams']} GPU streams")
        head.add_row("recorded span", f"{s['recorded_span_ms']:.3f} ms")
        if s["dropped_deps"] or s["dropped_ctrl_deps"]:
            head.add_row("dropped", f"{s['dropped_deps']} data deps, {s['dropped_ctrl_deps']} ctrl deps "
                                    "(ids absent from the file)")
        head.add_row("validation", "ok" if s["valid"] else "[red]" + "; ".join(s["problems"]))
        console.print(head)
        if s["collectives"]:
            t = Table(title="collectives")
            for col in ("comm type", "process group", "count", "total bytes"):
                t.add_column(col, justify="right" if col in ("count", "total bytes") else "left")
            for c in s["collectives"]:
                t.add_row(c["comm_type"], c["pg_name"] or "-", f"{c['count']:,}", f"{c['bytes']:,}")
            console.print(t)
        if s["steps"]:
            t = Table(title="steps")
            t.add_column("step")
            t.add_column("duration (ms)", justify="right")
            for st in s["steps"]:
                t.add_row(st["name"], f"{st['duration_ms']:.3f}")
            console.print(t)


def main(args) -> int:
    with progress_bar("reading") as cb:
        graphs = read_graphs(args.trace, progress=cb)
    summaries = [summarize(g) for g in graphs]
    if args.json:
        sys.stdout.write(orjson.dumps({"ranks": summaries}).decode() + "\n")
    else:
        _print_tables(summaries)
    return 0
