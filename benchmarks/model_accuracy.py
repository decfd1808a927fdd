"""Compute-model accuracy on the shared A100 / V100 traces (issue 13).

1. Per kernel class, cross-validated: the uncalibrated preset's GMAE next to the kernel models fitted by
   `lumos-sim calibrate` on *other* data -- folds by trace (fit on the other traces of the same GPU) and by
   step (fit on the other ProfilerSteps) and by shape (every kernel of a shape held out together, so the
   fit has not seen the held-out shapes; each A100 trace is a workload of its own, so by trace is also by
   workload); a kernel is never in the fit that predicts it.
2. GPU-bound step accuracy: per step the GPU-busy time (union of kernel / copy / collective intervals, so
   the recorded CPU gaps do not hide the GPU) recorded vs model-mode replay, uncalibrated and calibrated
   (calibrated on the trace's other steps + the other traces).
3. Model-mode step errors as `lumos-sim check tests/accuracy/model_a100.toml` sees them (CPU-bound).
Run: `python benchmarks/model_accuracy.py [--json]`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lumos_sim.api import load  # noqa: E402
from replay.api import replay  # noqa: E402
from replay.hardware.config import trace_hardware  # noqa: E402
from replay.hardware.kernel_models import (KernelSamples, cross_validate, fit_class_models, folds_by_step,  # noqa: E402
                                           folds_by_trace, gmae, kernel_samples, predict_all)
from replay.kernel_accuracy import folds_by_shape, gpu_busy_steps  # noqa: E402
from replay.model_timing import ModelTiming  # noqa: E402

TRACES = ["trace_diff_control_control.json.gz", "nccl_parser_config_nccl_data.json.gz",
          "critical_path_alexnet_trace.json.gz", "critical_path_cuda_event_sync_event_sync_trace.json.gz",
          "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]
GPU_BOUND = ["trace_diff_control_control.json.gz", "nccl_parser_config_nccl_data.json.gz"]
STEP_TRACES = ["trace_diff_control_control.json.gz", "nccl_parser_config_nccl_data.json.gz",
               "critical_path_cuda_event_sync_event_sync_trace.json.gz"]


def load_all(shared: Path):
    graphs, samples = {}, {}
    for name in TRACES:
        g = load([str(shared / name)])[0]
        hw = trace_hardware(g.metadata)
        graphs[name] = (g, hw)
        samples.setdefault(hw.name, []).append(kernel_samples(g, hw, name))
    return graphs, {k: KernelSamples.concat(v) for k, v in samples.items()}


def class_accuracy(samples: dict[str, KernelSamples]) -> list[dict]:
    out = []
    for hw_name, s in samples.items():
        for folds, rows in (("by trace", cross_validate(s, folds_by_trace(s))),
                            ("by step", cross_validate(s, folds_by_step(s))),
                            ("by shape", cross_validate(s, folds_by_shape(s)))):
            out += [{"hardware": hw_name, "folds": folds} | r.to_json() for r in rows]
    return out


def gpu_bound(graphs, samples) -> list[dict]:
    """Per step: fit on everything but that step of that trace, replay, compare GPU-busy time."""
    out = []
    for name in GPU_BOUND:
        g, hw = graphs[name]
        s = samples[hw.name]
        t = s.trace_names.index(name)
        base = {b.step: b for b in gpu_busy_steps(g, ModelTiming(hw), name)}
        for k, st in enumerate([x for x in g.steps if x.node >= 0]):
            held = (s.trace == t) & (s.step == k)
            models = fit_class_models(s.subset(~held))
            cal = dataclasses.replace(hw, kernel_models=models)
            got = {b.step: b for b in gpu_busy_steps(g, ModelTiming(cal), name)}
            b, c = base[st.name], got[st.name]
            # share of the step's kernel time each model estimates (the rest keeps its recorded duration)
            h = s.subset(held)
            covered = np.isfinite(predict_all(models, h)) | np.isfinite(h.base_us)
            out.append({"trace": name, "step": st.name, "measured_busy_ms": b.measured_us / 1e3,
                        "uncalibrated_modelled": float(h.measured_us[np.isfinite(h.base_us)].sum() / h.measured_us.sum()),
                        "calibrated_modelled": float(h.measured_us[covered].sum() / h.measured_us.sum()),
                        "uncalibrated_ms": b.predicted_us / 1e3, "uncalibrated_error": b.error,
                        "calibrated_ms": c.predicted_us / 1e3, "calibrated_error": c.error})
    return out


def communication(graphs) -> list[dict]:
    """Per trace: the network model's time of each collective / p2p kernel whose size the trace recorded
    vs its recorded duration (which also holds the wait for peers the trace does not show)."""
    from chakra_schema.graph import OpKind
    from replay.hardware.network import NetworkModel
    from replay.model_timing import comm_node_time

    out = []
    for name, (g, hw) in graphs.items():
        net = NetworkModel(hw)
        comm = np.flatnonzero(g.is_gpu() & np.isin(g.kind, [int(OpKind.COLLECTIVE), int(OpKind.SEND),
                                                               int(OpKind.RECV)]) & (g.duration_us > 0))
        if len(comm) == 0:
            continue
        times = [(comm_node_time(net, g, i), float(g.duration_us[i])) for i in comm.tolist()]
        got = np.asarray([(p, m) for p, m in times if p is not None and p > 0]).reshape(-1, 2)
        out.append({"trace": name, "kernels": len(comm), "modelled": len(got),
                    "gmae": gmae(got[:, 0], got[:, 1]) if len(got) else float("nan"),
                    "predicted_ms": float(got[:, 0].sum() / 1e3), "measured_ms": float(got[:, 1].sum() / 1e3)})
    return out


def model_steps(graphs) -> list[dict]:
    out = []
    for name in STEP_TRACES:
        g, hw = graphs[name]
        res = replay([g], ModelTiming("a100-sxm"), critical_path=False)
        out += [{"trace": name, "step": s.name, "measured_ms": s.measured_us / 1e3,
                 "predicted_ms": s.predicted_us / 1e3, "error": s.error} for s in res.steps if s.measured_us]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shared = Path(os.environ.get("LUMOS_SIM_SHARED", ROOT.parent / "shared")) / "traces" / "hta"
    graphs, samples = load_all(shared)
    out = {"classes": class_accuracy(samples), "communication": communication(graphs),
           "gpu_bound": gpu_bound(graphs, samples), "steps": model_steps(graphs)}
    if args.json:
        print(json.dumps(out, indent=1, default=float))
        return
    pct = lambda x: "      -" if x is None or not np.isfinite(x) else f"{100 * x:6.1f}%"  # noqa: E731
    print("per kernel class, cross-validated (kernels >= 1 us; GMAE = exp(mean |ln(pred/measured)|) - 1);"
          " repeat floor = identical kernels of the fit folds predicting each other (run-to-run noise)")
    print("  calibrated GMAE split: kernels that ran alone / under communication (contended: own models, per"
          " communication kernel kind where there are enough); calibrated n = kernels a fitted model times")
    print(f"  {'hardware':<14} {'folds':<9} {'class':<12} {'n':>5} | {'uncalibrated n':>14} {'GMAE':>7} | "
          f"{'calibrated n':>12} {'GMAE':>7} | {'alone':>7} {'contended n':>11} {'GMAE':>7} | {'repeat floor':>12}")
    for r in out["classes"]:
        print(f"  {r['hardware']:<14} {r['folds']:<9} {r['kernel_class']:<12} {r['kernels']:>5} | "
              f"{r['before_kernels']:>14} {pct(r['before_gmae'])} | {r['after_kernels']:>12} {pct(r['after_gmae'])} | "
              f"{pct(r['isolated_gmae'])} {r['contended_kernels']:>11} {pct(r['contended_gmae'])} | "
              f"{pct(r['floor_gmae']):>12}")
    print("communication kernels: network model (uncalibrated preset) vs recorded duration, where the trace"
          " records the size; the recorded time includes waiting for peers the trace does not show")
    for r in out["communication"]:
        print(f"  {r['trace'][:36]:<36} {r['modelled']:>4} of {r['kernels']:>4} modelled  GMAE {pct(r['gmae'])}  "
              f"predicted {r['predicted_ms']:9.3f} ms  recorded {r['measured_ms']:9.3f} ms")
    print("GPU-bound steps: compute-busy time recorded vs model-mode replay (calibrated on the other steps);"
          " 'modelled' = share of kernel time the model estimates, the rest keeps its recorded duration")
    for r in out["gpu_bound"]:
        print(f"  {r['trace'][:36]:<36} {r['step']:<18} busy {r['measured_busy_ms']:8.3f} ms | uncalibrated "
              f"{r['uncalibrated_ms']:8.3f} ms {pct(r['uncalibrated_error'])} (modelled {pct(r['uncalibrated_modelled'])}) | "
              f"calibrated {r['calibrated_ms']:8.3f} ms {pct(r['calibrated_error'])} (modelled {pct(r['calibrated_modelled'])})")
    print("model-mode step time (a100-sxm, uncalibrated; CPU time as recorded)")
    for r in out["steps"]:
        print(f"  {r['trace'][:36]:<36} {r['step']:<18} measured {r['measured_ms']:9.3f} ms  predicted "
              f"{r['predicted_ms']:9.3f} ms  error {pct(r['error'])}")


if __name__ == "__main__":
    main()
