"""Model-mode accuracy on the shared A100 traces (issue "Hardware models").

For each A100 trace: replay with `--timing model --hardware a100-sxm` (GPU kernels, copies and collectives
re-timed by the hardware models, host time as recorded) and print every step's error, then the
per-kernel-class error of the compute model against the recorded kernel durations (GMAE and share of
the absolute error). Run: `python benchmarks/model_accuracy.py [--json]`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lumos_sim.api import load  # noqa: E402
from replay.api import replay  # noqa: E402
from replay.kernel_accuracy import kernel_class_errors  # noqa: E402
from replay.model_timing import ModelTiming  # noqa: E402

A100_TRACES = ["trace_diff_control_control.json.gz", "nccl_parser_config_nccl_data.json.gz",
               "critical_path_cuda_event_sync_event_sync_trace.json.gz"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="a100-sxm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shared = Path(os.environ.get("LUMOS_SIM_SHARED", ROOT.parent / "shared")) / "traces" / "hta"
    timing = ModelTiming(args.hardware)
    out = {"steps": [], "classes": []}
    graphs_all = []
    for name in A100_TRACES:
        graphs = load([str(shared / name)])
        graphs_all.extend(graphs)
        res = replay(graphs, timing, critical_path=False)
        for s in res.steps:
            out["steps"].append({"trace": name, "step": s.name, "measured_ms": s.measured_us / 1000,
                                 "predicted_ms": s.predicted_us / 1000, "error": s.error})
    out["classes"] = [c.to_json() for c in kernel_class_errors(graphs_all, timing)]
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"model-mode replay on {args.hardware}")
    for r in out["steps"]:
        print(f"  {r['trace'][:40]:<40} {r['step']:<18} measured {r['measured_ms']:9.3f} ms  "
              f"predicted {r['predicted_ms']:9.3f} ms  error {100 * r['error']:+6.2f}%")
    print("per kernel class (kernels >= 1 us; GMAE = exp(mean |ln(pred/measured)|) - 1)")
    for c in out["classes"]:
        print(f"  {c['kernel_class']:<14} n={c['count']:>5}  measured {c['measured_us'] / 1000:9.3f} ms  "
              f"predicted {c['predicted_us'] / 1000:9.3f} ms  GMAE {100 * c['gmae']:7.1f}%  "
              f"share of |error| {100 * c['abs_error_share']:5.1f}%")


if __name__ == "__main__":
    main()
