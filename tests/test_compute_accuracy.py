"""Accuracy suite of the compute model on the shared A100 / V100 traces (issue 13), cross-validated:
per-class GMAE of the calibrated kernel models on held-out ProfilerSteps (never the kernels they were
fitted on), and GPU-bound step accuracy (compute-busy time, CPU gaps removed) within 10%.
The issue's limit is 25% per class for gemm, elementwise, reduction, norm and copy; the bounds here are
that limit or, where the models do better, what they reach today (see benchmarks/model_accuracy.py), so a
regression fails. What is left is mostly run-to-run noise: identical kernels of other steps predict each
other to 3-15% (the trace_diff_control kernels share the GPU with NCCL, and a 1-CTA kernel takes 3 to 36 us
there; its timestamps have 1 us resolution), and the ResNet traces were recorded without shapes, so one
cuDNN batch-norm grid stands for layers of 4x different work."""
from __future__ import annotations

import dataclasses

import pytest

from lumos_sim.api import load
from replay.hardware.config import trace_hardware
from replay.hardware.kernel_models import (KernelSamples, cross_validate, fit_class_models, folds_by_step,
                                           kernel_samples)
from replay.kernel_accuracy import gpu_busy_steps
from replay.model_timing import ModelTiming

A100 = ["trace_diff_control_control.json.gz", "nccl_parser_config_nccl_data.json.gz",
        "critical_path_alexnet_trace.json.gz"]
V100 = ["ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]
BOUNDS = {"a100-sxm-40gb": {"gemm": 0.18, "conv": 0.09, "elementwise": 0.21, "reduction": 0.25, "norm": 0.25,
                            "copy": 0.24, "embedding": 0.08},
          "v100-sxm2": {"gemm": 0.21, "conv": 0.13, "elementwise": 0.10, "norm": 0.18, "copy": 0.10}}
# a shapeless kernel of a family with too few kernels to fit gets no model (replay keeps its recorded
# time): no class-wide launch-geometry regression stands in for one. Held out by step, A100 conv covers
# 279 of 288 kernels, every other class >= 99.4%
MIN_COVERAGE = 0.96


@pytest.fixture(scope="module")
def traces(request):
    from conftest import require_shared
    hta = require_shared("traces", "hta")
    out = {}
    for name in A100 + V100:
        g = load([str(hta / name)])[0]
        out[name] = (g, trace_hardware(g.metadata))
    return out


def _samples(traces, names):
    return KernelSamples.concat([kernel_samples(g, hw, n) for n, (g, hw) in traces.items() if n in names])


@pytest.mark.parametrize("names", [A100, V100], ids=["a100", "v100"])
def test_cross_validated_class_gmae_by_step_beats_the_uncalibrated_model(traces, names):
    s = _samples(traces, names)
    hw = traces[names[0]][1].name
    rows = {r.kernel_class: r for r in cross_validate(s, folds_by_step(s))}
    lines = [f"{c}: before {r.before_gmae:.3f} (n={r.before_kernels}) after {r.after_gmae:.3f} (n={r.after_kernels})"
             for c, r in rows.items()]
    for cls, bound in BOUNDS[hw].items():
        r = rows[cls]
        assert r.after_kernels >= MIN_COVERAGE * r.kernels, \
            f"{cls}: {r.kernels - r.after_kernels} held-out kernels got no prediction"
        assert r.after_gmae <= bound, "\n".join(lines)
        if r.before_kernels:
            assert r.after_gmae < r.before_gmae, "\n".join(lines)


@pytest.mark.parametrize("trace", A100[:2])
def test_gpu_bound_step_error_within_10_percent_calibrated_on_other_steps(traces, trace):
    s = _samples(traces, A100)
    g, hw = traces[trace]
    t = s.trace_names.index(trace)
    steps = [st for st in g.steps if st.node >= 0]
    for k, st in enumerate(steps):
        cal = dataclasses.replace(hw, kernel_models=fit_class_models(s.subset(~((s.trace == t) & (s.step == k)))))
        busy = {b.step: b for b in gpu_busy_steps(g, ModelTiming(cal), trace)}[st.name]
        assert abs(busy.error) <= 0.10, f"{trace} {st.name}: busy {busy.measured_us:.0f} us, predicted {busy.predicted_us:.0f} us"


H100 = ["kernels_gemm_bf16", "kernels_gemm_fp8", "kernels_sdpa", "kernels_norm", "kernels_elementwise",
        "llama_b4_s2048", "llama_b2_s4096", "llama_b8_s1024", "moe_t4096", "moe_t16384"]


@pytest.fixture(scope="module")
def h100():
    from pathlib import Path

    from lumos_sim.commands.calibrate import _load_one
    from replay.hardware import get_hardware

    data = Path(__file__).parent / "data" / "h100"
    hw = get_hardware("h100-sxm-roofline")  # the physics the fits start from (h100-sxm is calibrated)
    graphs = {n: _load_one(str(data / n))[0] for n in H100}
    return hw, graphs, {n: kernel_samples(g, hw, n) for n, g in graphs.items()}


def test_h100_model_steps_within_10_percent_calibrated_on_the_other_traces(h100):
    """Issue 15: model-mode step error <= 10% on the real H100 training steps, with the kernel models
    fitted on the other nine H100 traces (the uncalibrated preset is off by up to 17%)."""
    from replay.api import replay
    hw, graphs, samples = h100
    for name in H100[5:]:
        models = fit_class_models(KernelSamples.concat([samples[n] for n in H100 if n != name]))
        res = replay([graphs[name]], ModelTiming(dataclasses.replace(hw, kernel_models=models)), critical_path=False)
        errors = [s.error for s in res.steps if s.measured_us]
        assert errors and max(map(abs, errors)) <= 0.10, f"{name}: {errors}"


def test_h100_gemm_and_attention_within_15_percent_cross_validated_by_step(h100):
    """Issue 15: per-kernel GMAE of GEMM and attention <= 15% on the H100 sweeps and steps, each kernel
    predicted by models fitted on the other folds of ProfilerSteps (in a sweep a step is one shape)."""
    import numpy as np
    _, _, samples = h100
    s = KernelSamples.concat(list(samples.values()))
    s = s.subset(np.isin(s.cls, ["gemm", "attention"]))  # class models are fitted per class: fit only these
    rows = {r.kernel_class: r for r in cross_validate(s, folds_by_step(s))}
    for cls in ("gemm", "attention"):
        r = rows[cls]
        assert r.after_kernels == r.kernels and r.after_gmae <= 0.15 < r.before_gmae, (cls, r)


# Held out by shape and by workload (issue 25): folds by step let identical kernels of other steps predict
# each other (three of the Llama traces are one 1.7B model, the same GEMM shapes). These folds hold out
# every kernel of a shape, or whole workloads (the three Llama steps together, the two MoE steps together).
H100_WORKLOADS = {"llama_b4_s2048": "llama-1.7b", "llama_b2_s4096": "llama-1.7b", "llama_b8_s1024": "llama-1.7b",
                  "moe_t4096": "moe-layer", "moe_t16384": "moe-layer"}
# measured 2026-11-29 (gemm / attention GMAE, uncalibrated 20.8% / 53.1%: attention FLOPs over the causal
# half, as the traced is_causal says): by step 10.6% / 5.2%, by shape 13.2% / 9.3%, by workload 30.6% / 10.5%;
# the bounds are today's figures rounded up, so a regression fails
H100_BY_SHAPE = {"gemm": 0.14, "attention": 0.10}
# by workload the GEMM family models do NOT beat the uncalibrated roofline (30.6% vs 20.8%): a held-out
# sweep or model brings GEMM families the fit never saw with enough samples. Bounded, not claimed.
H100_BY_WORKLOAD = {"gemm": 0.32, "attention": 0.11}


def _gemm_attention(h100):
    import numpy as np
    _, _, samples = h100
    s = KernelSamples.concat(list(samples.values()))
    return s.subset(np.isin(s.cls, ["gemm", "attention"]))  # class models are fitted per class


def test_h100_gemm_and_attention_on_shapes_no_fit_has_seen(h100):
    """5 folds over the distinct kernel shapes: a held-out kernel's shape is in no fit, in any trace."""
    from replay.kernel_accuracy import folds_by_shape
    s = _gemm_attention(h100)
    rows = {r.kernel_class: r for r in cross_validate(s, folds_by_shape(s))}
    for cls, bound in H100_BY_SHAPE.items():
        r = rows[cls]
        assert r.after_kernels == r.kernels and r.after_gmae <= bound < r.before_gmae, (cls, r)


def test_h100_gemm_and_attention_on_workloads_no_fit_has_seen(h100):
    """One fold per workload (the three Llama 1.7B steps together, the two MoE steps together, each kernel
    sweep alone). Attention transfers (10.5% vs 53.1% uncalibrated); GEMM does not (30.6% vs 20.8%)."""
    from replay.kernel_accuracy import folds_by_workload
    s = _gemm_attention(h100)
    rows = {r.kernel_class: r for r in cross_validate(s, folds_by_workload(s, H100_WORKLOADS))}
    for cls, bound in H100_BY_WORKLOAD.items():
        assert rows[cls].after_kernels == rows[cls].kernels and rows[cls].after_gmae <= bound, (cls, rows[cls])
    assert rows["attention"].after_gmae < rows["attention"].before_gmae


def test_folds_by_shape_and_by_workload_never_share_a_shape_or_a_workload(h100):
    import numpy as np
    from replay.kernel_accuracy import folds_by_shape, folds_by_workload, shape_keys
    s = _gemm_attention(h100)
    keys = shape_keys(s)
    folds = folds_by_shape(s)
    assert np.array_equal(np.sum(folds, axis=0), np.ones(len(s)))         # every kernel in exactly one fold
    for a in range(len(folds)):
        for b in range(a + 1, len(folds)):
            assert not set(keys[folds[a]].tolist()) & set(keys[folds[b]].tolist())
    wl = folds_by_workload(s, H100_WORKLOADS)
    assert len(wl) == 5               # GEMM bf16 / fp8 and SDPA sweeps, Llama, MoE (norm / elementwise: none)
    llama = [f for f in wl if (s.trace_names.index("llama_b4_s2048") == s.trace[f]).any()][0]
    assert {s.trace_names[t] for t in np.unique(s.trace[llama])} == {"llama_b4_s2048", "llama_b2_s4096",
                                                                     "llama_b8_s1024"}
