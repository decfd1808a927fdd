"""Speed and memory of the Kineto -> ExecutionGraph conversion (load_kineto + kineto_to_graph).

    /tmp/venv/bin/python benchmarks/bench_convert_kineto.py [trace.json(.gz)] [--repeat N]

Default input: ../shared/traces/hta/trace_diff_control_control.json.gz. Reports nodes/s, the time ratio
to a bare stdlib `json.loads` of the same decompressed bytes (target <= 3x) and the peak memory of the
conversion relative to the uncompressed input size (target <= 3x). Each memory figure comes from a fresh
subprocess (ru_maxrss minus the interpreter's baseline), so the runs do not disturb each other.
"""
from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "traces" / "hta" / "trace_diff_control_control.json.gz"

_CHILD = r"""
import gc, json, resource, sys, time
sys.path.insert(0, sys.argv[3])
mode, path = sys.argv[1], sys.argv[2]
import numpy, orjson  # imports are baseline, not conversion memory
from chakra_schema.pytorch.kineto import load_kineto
from chakra_schema.pytorch.kineto_graph import kineto_to_graph
gc.collect()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if mode == "json":
    with open(path, "rb") as fh:
        obj = json.loads(fh.read())
    n = 0
else:
    g = kineto_to_graph(load_kineto(path))
    n = len(g)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(dt, (peak - base) * 1024, n)
"""


def run_child(mode: str, path: str) -> tuple[float, int, int]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, path, str(ROOT)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), int(out[1]), int(out[2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (best time is kept)")
    args = ap.parse_args(argv)
    raw = Path(args.trace).read_bytes()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, "trace.json")   # both sides read the same uncompressed bytes
        Path(plain).write_bytes(data)
        json_runs = [run_child("json", plain) for _ in range(args.repeat)]
        conv_runs = [run_child("convert", plain) for _ in range(args.repeat)]
    t_json = min(r[0] for r in json_runs)
    t_conv = min(r[0] for r in conv_runs)
    mem_json = min(r[1] for r in json_runs)
    mem_conv = min(r[1] for r in conv_runs)
    nodes = conv_runs[0][2]
    size = len(data)
    rows = [
        ("input (uncompressed)", f"{size / 2**20:.1f} MiB"),
        ("nodes", f"{nodes:,}"),
        ("json.loads (stdlib)", f"{t_json:.3f} s, peak +{mem_json / 2**20:.0f} MiB"),
        ("convert (load_kineto + kineto_to_graph)", f"{t_conv:.3f} s, peak +{mem_conv / 2**20:.0f} MiB"),
        ("nodes/s", f"{nodes / t_conv:,.0f}"),
        ("time ratio convert / json.loads (target <= 3)", f"{t_conv / t_json:.2f}"),
        ("peak memory / input size (target <= 3)", f"{mem_conv / size:.2f}"),
    ]
    try:
        from rich.console import Console
        from rich.table import Table
        table = Table(title=f"Kineto conversion: {Path(args.trace).name}")
        table.add_column("measure")
        table.add_column("value", justify="right")
        for r in rows:
            table.add_row(*r)
        Console().print(table)
    except ImportError:  # pragma: no cover - rich is a core dependency
        for r in rows:
            print(f"{r[0]:<48} {r[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
