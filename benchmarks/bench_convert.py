"""Converter speed and memory on the big shared inputs.

    python benchmarks/bench_convert.py [--json] [--repeat N]

For each input (param/hf_GPT2_et.json.tar.gz: ET only; hta/trace_diff_control_control.json.gz: Kineto
only), each figure measured in a fresh subprocess so runs do not share caches or heap:
- convert_s: `convert_rank` (read + decompress + parse + graph build), best of --repeat runs;
  nodes/s = graph nodes / convert_s; write_s: writing the `.et` (graph_io.write_graph);
- json_load_s: a bare stdlib `json.loads` of the same, already decompressed, text (the floor any JSON
  converter pays); ratio = convert_s / json_load_s (target <= 3);
- peak_mem_mb: peak RSS (ru_maxrss) of a process that only converts, minus its RSS after imports;
  mem_ratio = peak_mem / uncompressed input size (target <= 3).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("LUMOS_SIM_SHARED", ROOT.parent / "shared"))
INPUTS = [("param/hf_GPT2_et.json.tar.gz", "et"), ("hta/trace_diff_control_control.json.gz", "kineto")]


def _child(mode: str, kind: str, path: str) -> dict:
    import resource
    sys.path.insert(0, str(ROOT))
    from chakra_schema.pytorch.converter import RankInputs, convert_rank
    from chakra_schema.pytorch.execution_trace import read_json_bytes

    if mode == "json":
        text = read_json_bytes(path)
        t0 = time.perf_counter()
        json.loads(text)
        return {"json_load_s": time.perf_counter() - t0, "input_bytes": len(text)}
    if mode == "mem":
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        inputs = RankInputs(path, None) if kind == "et" else RankInputs(None, path)
        g = convert_rank(inputs)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"peak_mem_bytes": (peak - base) * 1024, "nodes": len(g)}
    # mode == "time"
    from chakra_schema.graph_io import write_graph
    inputs = RankInputs(path, None) if kind == "et" else RankInputs(None, path)
    t0 = time.perf_counter()
    g = convert_rank(inputs)
    t1 = time.perf_counter()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_convert_{os.getpid()}.et"
    try:
        write_graph(g, out)
        t2 = time.perf_counter()
    finally:
        out.unlink(missing_ok=True)
    return {"convert_s": t1 - t0, "write_s": t2 - t1, "nodes": len(g), "edges": g.num_edges}


def _run_child(mode: str, kind: str, path: str) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", mode, kind, path], capture_output=True, text=True,
                       cwd=ROOT, check=False)
    if p.returncode != 0:
        raise SystemExit(f"child {mode} {path} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def bench(repeat: int) -> list[dict]:
    rows = []
    for rel, kind in INPUTS:
        path = str(SHARED / "traces" / rel)
        if not os.path.exists(path):
            print(f"skip {rel}: not found under {SHARED}", file=sys.stderr)
            continue
        times = [_run_child("time", kind, path) for _ in range(repeat)]
        best = min(times, key=lambda r: r["convert_s"])
        js = min((_run_child("json", kind, path) for _ in range(repeat)), key=lambda r: r["json_load_s"])
        mem = _run_child("mem", kind, path)
        rows.append({
            "input": rel, "kind": kind, "input_mb": js["input_bytes"] / 1e6, "nodes": best["nodes"],
            "edges": best["edges"], "convert_s": best["convert_s"], "write_s": best["write_s"],
            "nodes_per_s": best["nodes"] / best["convert_s"], "json_load_s": js["json_load_s"],
            "ratio_vs_json_load": best["convert_s"] / js["json_load_s"],
            "peak_mem_mb": mem["peak_mem_bytes"] / 1e6, "mem_ratio": mem["peak_mem_bytes"] / js["input_bytes"],
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "KIND", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    rows = bench(args.repeat)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table
    t = Table(title="converter speed and memory (targets: ratio <= 3, mem ratio <= 3)")
    cols = [("input", "input", "{}"), ("input MB", "input_mb", "{:.1f}"), ("nodes", "nodes", "{}"),
            ("convert s", "convert_s", "{:.2f}"), ("nodes/s", "nodes_per_s", "{:,.0f}"),
            ("json.load s", "json_load_s", "{:.2f}"), ("ratio", "ratio_vs_json_load", "{:.2f}"),
            ("write s", "write_s", "{:.2f}"), ("peak MB", "peak_mem_mb", "{:.0f}"),
            ("mem ratio", "mem_ratio", "{:.2f}")]
    for head, _, _ in cols:
        t.add_column(head)
    for r in rows:
        t.add_row(*[fmt.format(r[key]) for _, key, fmt in cols])
    Console(width=200).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
