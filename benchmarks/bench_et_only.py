"""Speed of model-mode prediction from an Execution Trace alone, beside trace-mode replay of the same step.

For each H100 trace of tests/data/h100 (ET + Kineto): (a) ET only, model mode on h100-sxm: kernel
inference (replay/et_kernels.py) + model timing + replay, in ET nodes per second; (b) the same ET linked
with its Kineto trace, trace mode: replay of the recorded durations, in graph nodes per second. Parsing
the files is timed apart (it is the same work for every mode). Run:
`python benchmarks/bench_et_only.py [--json] [TRACE_DIR ...]`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chakra_schema.inputs import load_graphs  # noqa: E402
from replay.api import replay  # noqa: E402
from replay.et_kernels import infer_gpu_work  # noqa: E402
from replay.model_timing import ModelTiming  # noqa: E402

DEFAULT = ["llama_b4_s2048", "moe_t4096", "heldout/llama_d4096_l8_b4_s2048"]


def bench(folder: Path, hardware: str) -> dict:
    t0 = time.perf_counter()
    et = load_graphs([], et_pattern=str(folder / "host.0.json.gz"))[0]
    t_parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    inferred, report = infer_gpu_work(et)
    t_infer = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = replay([inferred], ModelTiming(hardware), critical_path=False)
    t_model = time.perf_counter() - t0
    linked = load_graphs([], et_pattern=str(folder / "host.0.json.gz"),
                         kineto_pattern=str(folder / "device.0.json.gz"))[0]
    t0 = time.perf_counter()
    replay([linked], critical_path=False)
    t_trace = time.perf_counter() - t0
    et_seconds = t_infer + t_model
    return {"trace": str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder),
            "et_nodes": len(et), "inferred_kernels": report.kernels, "graph_nodes": len(inferred),
            "parse_s": t_parse, "infer_s": t_infer, "model_replay_s": t_model,
            "et_only_nodes_per_s": len(et) / et_seconds,
            "trace_nodes": len(linked), "trace_replay_s": t_trace, "trace_nodes_per_s": len(linked) / t_trace,
            "predicted_ms": [round(s.predicted_us / 1e3, 3) for s in res.steps]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="*", help="trace folders holding host.0.json.gz + device.0.json.gz")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    folders = [Path(f) for f in args.folders] or [ROOT / "tests" / "data" / "h100" / d for d in DEFAULT]
    rows = [bench(f, args.hardware) for f in folders]
    if args.json:
        print(json.dumps({"rows": rows}))
        return
    for r in rows:
        print(f"{r['trace']:<42} ET only: {r['et_nodes']:>7,} ET nodes -> {r['inferred_kernels']:>6,} kernels, "
              f"infer {r['infer_s']:.2f} s + model replay {r['model_replay_s']:.2f} s = "
              f"{r['et_only_nodes_per_s']:>8,.0f} ET nodes/s | trace mode: {r['trace_nodes']:>7,} nodes "
              f"{r['trace_replay_s']:.2f} s = {r['trace_nodes_per_s']:>8,.0f} nodes/s | parse {r['parse_s']:.2f} s")


if __name__ == "__main__":
    main()
