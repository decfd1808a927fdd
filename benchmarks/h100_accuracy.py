"""Model-mode accuracy against the H100 ground truth in tests/data/h100 (issue 15).

Three measurements, side by side in one run:
  1. step error of each training-step trace (Llama decoder at 3 shapes, MoE layer at 2 token counts)
     replayed with recorded durations (`--timing trace`, should be ~0) and with the hardware models
     (`--timing model --hardware h100-sxm`);
  2. per-kernel-class GMAE of the compute model against the recorded H100 kernel durations, on the kernel
     sweep (GEMM bf16 / fp8 separately, SDPA fwd+bwd, norms, elementwise) and on the training steps;
  3. what the H100 itself achieved per sweep group (from the Kineto kernel durations, not the model):
     TFLOP/s of GEMMs and SDPA, GB/s of memory-bound ops.

    python benchmarks/h100_accuracy.py [--hardware h100-sxm] [--json]
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lumos_sim.api import load  # noqa: E402
from replay.api import replay  # noqa: E402
from replay.kernel_accuracy import kernel_class_errors  # noqa: E402
from replay.model_timing import ModelTiming  # noqa: E402
from replay.trace_timing import TraceTiming  # noqa: E402

DATA = ROOT / "tests" / "data" / "h100"
STEP_TRACES = ["llama_b4_s2048", "llama_b2_s4096", "llama_b8_s1024", "moe_t4096", "moe_t16384"]
KERNEL_SWEEPS = ["kernels_gemm_bf16", "kernels_gemm_fp8", "kernels_sdpa", "kernels_norm", "kernels_elementwise"]
# Kernels that only make a group's inputs (torch.randn / casts of them), not the op being measured.
INPUT_KERNELS = ("normal", "distribution", "fill")


def load_dir(name: str):
    d = DATA / name
    return load([], et=str(d / "host.{rank}.json.gz"), kineto=str(d / "device.{rank}.json.gz"))


def step_errors(hardware: str) -> list[dict]:
    rows = []
    for name in STEP_TRACES:
        graphs = load_dir(name)
        for mode, timing in (("trace", TraceTiming()), ("model", ModelTiming(hardware))):
            for s in replay(graphs, timing, critical_path=False).steps:
                rows.append({"trace": name, "mode": mode, "step": s.name, "measured_ms": s.measured_us / 1e3,
                             "predicted_ms": s.predicted_us / 1e3, "error": s.error})
    return rows


def class_errors(hardware: str) -> dict[str, list[dict]]:
    timing = ModelTiming(hardware)
    out = {name: [c.to_json() for c in kernel_class_errors(load_dir(name), timing)] for name in KERNEL_SWEEPS}
    steps = [g for name in STEP_TRACES for g in load_dir(name)]
    out["training_steps"] = [c.to_json() for c in kernel_class_errors(steps, timing)]
    return out


def achieved(name: str) -> list[dict]:
    """Per sweep group: mean kernel time of one run from Kineto (kernels inside the group's ProfilerStep,
    input-making kernels excluded) and the TFLOP/s or GB/s that gives."""
    d = DATA / name
    meta = json.loads((d / "groups.json").read_text())
    groups = {g["name"]: g for g in meta["groups"] if "error" not in g}
    with gzip.open(d / "device.0.json.gz") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    kernels = sorted((e["ts"], e["dur"], e["name"]) for e in events if e.get("ph") == "X" and e.get("cat") == "kernel")
    rows, k = [], 0
    for start, end, step in steps:
        group = groups.get(meta["profiled_steps"].get(step, ""))
        busy = 0.0
        while k < len(kernels) and kernels[k][0] < end:
            ts, dur, kname = kernels[k]
            if ts >= start and not any(s in kname for s in INPUT_KERNELS):
                busy += dur
            k += 1
        if group is None or busy <= 0:
            continue
        sec = busy / 1e6 / meta["reps"]
        rows.append({"name": group["name"], "kernel_us": sec * 1e6,
                     "tflops": group["flops"] / sec / 1e12 if group["flops"] else None,
                     "gbps": group["bytes"] / sec / 1e9})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"steps": step_errors(args.hardware), "classes": class_errors(args.hardware),
           "achieved": {n: achieved(n) for n in KERNEL_SWEEPS}}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"step error, H100 traces replayed on {args.hardware}")
    for r in out["steps"]:
        print(f"  {r['trace']:<16} {r['mode']:<6} {r['step']:<16} measured {r['measured_ms']:9.2f} ms  "
              f"predicted {r['predicted_ms']:9.2f} ms  error {100 * r['error']:+8.1f}%")
    print("per kernel class, model vs recorded H100 kernels (>= 1 us; GMAE = exp(mean |ln(pred/meas)|) - 1)")
    for trace, classes in out["classes"].items():
        print(f"  {trace}")
        for c in classes:
            print(f"    {c['kernel_class']:<14} n={c['count']:>5}  measured {c['measured_us'] / 1e3:9.3f} ms  "
                  f"predicted {c['predicted_us'] / 1e3:9.3f} ms  GMAE {100 * c['gmae']:8.1f}%  "
                  f"share of |error| {100 * c['abs_error_share']:5.1f}%")
    print("achieved on the H100 (Kineto kernel time per run)")
    for trace, rows in out["achieved"].items():
        best = max(rows, key=lambda r: r["tflops"] or r["gbps"], default=None)
        if best:
            unit = f"{best['tflops']:.0f} TFLOP/s" if best["tflops"] else f"{best['gbps']:.0f} GB/s"
            print(f"  {trace:<22} {len(rows):>4} groups; best {best['name']} {unit}")
        for r in rows:
            if r["name"] in ("mm_8192x8192x8192", "scaled_mm_e4m3_8192x8192x8192", "mm_16384x16384x16384",
                             "scaled_mm_e4m3_16384x16384x16384") or trace == "kernels_sdpa":
                val = f"{r['tflops']:.0f} TFLOP/s" if r["tflops"] else f"{r['gbps']:.0f} GB/s"
                print(f"    {r['name']:<40} {r['kernel_us']:10.1f} us  {val}")


if __name__ == "__main__":
    main()
