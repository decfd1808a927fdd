"""Peak memory of reading one big input file (issue 21, defect 4): the 4 GiB input limit must also bound
memory. Blocks used to be joined (the list of blocks and the joined copy: ~2x the decompressed size, a
3 GiB input reached 6.3 GB); now `read_input_bytes` fills one buffer (~1x), and the Execution Trace
reader parses a big file node by node from a window over the decompressed stream (no whole-file bytes
and no whole-file text).

    python benchmarks/bench_input_memory.py [--gib 3] [--json]

Writes, in a temporary folder under /tmp, a gzip'd Execution Trace of a few thousand nodes padded with
whitespace to `--gib` GiB decompressed (a few MiB on disk), then in fresh subprocesses (so each peak is
that work's alone) reports the peak RSS above the RSS after imports of
- `read_input_bytes`: the whole decompressed content in one buffer (target: ~1x the content, < 4 GiB
  for 3 GiB), and
- `load_execution_trace`: the converter's reader (target: bounded by its window, not the input).
`--max-input-size` is raised past the input for the run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _node(i: int) -> bytes:
    return json.dumps({"id": i, "name": "aten::add" if i > 1 else "[pytorch|profiler|execution_trace|thread]",
                       "ctrl_deps": 1 if i > 1 else 0,
                       "inputs": {"values": [], "shapes": [], "types": []},
                       "outputs": {"values": [], "shapes": [], "types": []},
                       "attrs": [{"name": "rf_id", "type": "uint64", "value": i},
                                 {"name": "tid", "type": "uint64", "value": 1}]}).encode()


def write_padded_trace(path: Path, total_bytes: int, nodes: int = 4096) -> int:
    """A gzip'd Execution Trace whose nodes are separated by runs of spaces, `total_bytes` decompressed."""
    head = b'{"schema": "1.1.0-chakra.0.0.4", "pid": 1, "time": "x", "start_ts": 0, "finish_ts": 10, "nodes": ['
    tail = b"]}"
    bodies = [_node(i) for i in range(1, nodes + 1)]
    pad_total = max(total_bytes - len(head) - len(tail) - sum(len(b) + 1 for b in bodies), 0)
    pad = pad_total // nodes
    chunk = b" " * (1 << 24)
    comp = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    written = 0
    with open(path, "wb") as f:
        def put(data: bytes) -> None:
            nonlocal written
            f.write(comp.compress(data))
            written += len(data)
        put(head)
        for n, body in enumerate(bodies):
            put(body)
            left = pad if n < nodes - 1 else pad_total - pad * (nodes - 1)
            while left > 0:
                put(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
            if n < nodes - 1:
                put(b",")
        put(tail)
        f.write(comp.flush())
    return written


def reset_peak() -> int:
    """Reset this process's peak RSS (VmHWM) to its current RSS and return that, in KiB. (ru_maxrss
    cannot be used: Linux carries the parent's peak into a forked child.)"""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS")


def peak_kib() -> int:
    return _status_kib("VmHWM")


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


_MEASURE = r"""
import json, sys, time
sys.path.insert(0, {root!r})
sys.path.insert(0, {bench!r})
from bench_input_memory import peak_kib, reset_peak
from chakra_schema.safe_io import read_input_bytes, set_max_input_bytes
from chakra_schema.pytorch.execution_trace import load_execution_trace
set_max_input_bytes({limit})
base = reset_peak()
t0 = time.perf_counter()
if {what!r} == "read_input_bytes":
    n = len(read_input_bytes({path!r}))
else:
    n = len(load_execution_trace({path!r}).ids)
print(json.dumps({{"peak_above_imports_mib": (peak_kib() - base) / 1024, "seconds": time.perf_counter() - t0, "n": n}}))
"""


def measure(what: str, path: Path, limit: int) -> dict:
    code = _MEASURE.format(root=str(ROOT), bench=str(Path(__file__).resolve().parent), limit=limit, what=what,
                           path=str(path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=3.0, help="decompressed size of the input (default 3)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    total = int(args.gib * (1 << 30))
    with tempfile.TemporaryDirectory(prefix="lumos-bench-mem-", dir="/tmp") as d:
        path = Path(d) / "padded_et.json.gz"
        t0 = time.perf_counter()
        write_padded_trace(path, total)
        out = {"input_gib": total / (1 << 30), "on_disk_mib": os.path.getsize(path) / (1 << 20),
               "generate_s": time.perf_counter() - t0}
        limit = total + (64 << 20)
        for what in ("read_input_bytes", "load_execution_trace"):
            out[what] = measure(what, path, limit)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"input {out['input_gib']:.2f} GiB decompressed ({out['on_disk_mib']:.1f} MiB gzip, "
              f"generated in {out['generate_s']:.1f} s)")
        for what in ("read_input_bytes", "load_execution_trace"):
            r = out[what]
            print(f"{what:22s} peak RSS above imports {r['peak_above_imports_mib']:8.1f} MiB   {r['seconds']:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
