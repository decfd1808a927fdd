"""`lumos-sim convert`: PyTorch Execution Trace and/or Kineto traces -> Chakra `.et`, one file per rank.

    lumos-sim convert [--et PATTERN] [--kineto PATTERN] -o OUT_PREFIX [--json]

PATTERN may hold `{rank}` and shell wildcards (quote it): `--kineto 'run/worker{rank}_*.json.gz'`.
Writes OUT_PREFIX.<rank>.et and prints a per-rank summary.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from lumos_sim.progress import progress_bar
from lumos_sim.tables import say


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert", help="convert PyTorch traces (Execution Trace and/or Kineto) to Chakra .et files",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--et", metavar="PATTERN", help="Execution Trace file(s); may hold {rank} and wildcards")
    p.add_argument("--kineto", metavar="PATTERN", help="Kineto trace file(s); may hold {rank} and wildcards")
    p.add_argument("-o", "--output", metavar="OUT_PREFIX", required=True,
                   help="output prefix: writes OUT_PREFIX.<rank>.et")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chakra_schema.errors import TraceInputError
    from chakra_schema.pytorch.converter import convert

    if not args.et and not args.kineto:
        raise TraceInputError(None, "give --et and/or --kineto")
    if not os.path.basename(args.output) or os.path.isdir(args.output):
        what = "is a directory" if args.output else "-o is empty"
        raise TraceInputError(args.output or None, f"{what}; -o takes a prefix such as out/job "
                                                   "(writes out/job.0.et, out/job.1.et, ...)")
    with progress_bar("converting") as cb:
        summaries = convert(args.et, args.kineto, args.output, progress=cb)
    _remove_stale_ranks(args.output, {s["rank"] for s in summaries})
    for s in summaries:
        say(f"wrote {s['output']}")
    try:
        if args.json:
            json.dump(summaries, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_table(summaries)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the files are written, the reader just stopped listening
        sys.stderr.close()
    return 0


def _remove_stale_ranks(prefix: str, ranks: set[int]) -> None:
    """A prefix reused for a job with fewer ranks must not keep the old job's extra rank files: replay
    would read them as part of this job."""
    from chakra_schema.graph_io import graph_paths

    stale = [p for r, p in graph_paths(prefix).items() if r not in ranks]
    for path in stale:
        os.unlink(path)
    if stale:
        print(f"removed {len(stale)} rank file(s) of an earlier job with this prefix: "
              f"{', '.join(p.name for p in stale)}", file=sys.stderr)


def _data_deps(s: dict) -> int:
    """Data deps as written to the file: the graph's edges plus the thread/stream order deps the writer
    adds for Chakra consumers (see chakra_schema.graph_io)."""
    return int(s["edges"]) + int(s.get("order_deps", 0))


def _print_table(summaries: list[dict]) -> None:
    """One column per rank (a row per figure) for a few ranks; a compact row per rank for many."""
    from lumos_sim.tables import console, table as new_table

    if len(summaries) > 3:
        cols = ("rank", "nodes", "GPU ops", "collectives", "steps", "data deps", "ctrl deps", "output")
        table = new_table("lumos-sim convert", cols, right=cols[:-1])
        for s in summaries:
            table.add_row(str(s["rank"]), f"{s['nodes']:,}", f"{s['gpu_ops']:,}", f"{s['collectives']:,}",
                          str(s["steps"]), f"{_data_deps(s):,}", f"{s['ctrl_deps']:,}", s["output"])
        console().print(table)
        return

    table = new_table("lumos-sim convert", ["", *(f"rank {s['rank']}" for s in summaries)],
                      right=[f"rank {s['rank']}" for s in summaries])
    rows = {"inputs": [], "nodes": [], "by kind": [], "GPU ops": [], "collectives": [], "steps": [], "data deps": [], "ctrl deps": [],
            "ET link": [], "output": []}
    for s in summaries:
        link = s.get("link")
        rows["inputs"].append("\n".join(f"{k}: {os.path.basename(s[k])}" for k in ("et", "kineto") if s.get(k)))
        rows["nodes"].append(f"{s['nodes']:,}")
        rows["by kind"].append("\n".join(f"{k} {v:,}" for k, v in s["nodes_by_kind"].items()))
        rows["GPU ops"].append(f"{s['gpu_ops']:,}")
        rows["collectives"].append(f"{s['collectives']:,}")
        rows["steps"].append(str(s["steps"]))
        rows["data deps"].append(f"{_data_deps(s):,}")
        rows["ctrl deps"].append(f"{s['ctrl_deps']:,}")
        rows["ET link"].append(f"{link['key']}\n{100 * link['fraction']:.0f}% of {link['et_ops']} ET ops" if link else "-")
        rows["output"].append(s["output"])
    for label, values in rows.items():
        table.add_row(label, *values)
    console().print(table)
