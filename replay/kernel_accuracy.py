"""Per-kernel-class accuracy of a timing source against the durations a trace recorded.

Error measure per class: the geometric-mean absolute error GMAE = exp(mean |ln(pred / measured)|) - 1,
which treats 2x too slow and 2x too fast alike and is not dominated by a few outliers; plus each class's
share of the total absolute error in microseconds, which says which classes dominate a step's error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from chakra_schema.graph import ExecutionGraph, OpKind
from replay.timing import TimingSource

_MEASURED = (int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET), int(OpKind.COLLECTIVE),
             int(OpKind.SEND), int(OpKind.RECV))


@dataclass
class ClassError:
    kernel_class: str
    count: int
    measured_us: float        # total recorded time of the class
    predicted_us: float       # total predicted time
    gmae: float               # geometric-mean absolute error of single kernels
    abs_error_share: float    # share of the summed |pred - measured| over all classes

    def to_json(self) -> dict:
        return dict(self.__dict__)


def kernel_class_errors(graphs: Sequence[ExecutionGraph], timing: TimingSource,
                        min_us: float = 1.0) -> list[ClassError]:
    """Compare `timing`'s GPU durations with the recorded ones, by kernel class, over all graphs.
    Kernels shorter than `min_us` are left out: the trace's 1 us resolution makes their ratio noise."""
    from replay.model_timing import node_classes

    rows: dict[str, list[np.ndarray]] = {}
    for g in graphs:
        pred = np.asarray(timing.node_durations(g), np.float64)
        meas = g.duration_us
        sel = np.flatnonzero(g.is_gpu() & np.isin(g.kind, _MEASURED) & (meas >= min_us) & (pred > 0))
        if len(sel) == 0:
            continue
        classes = np.asarray(node_classes(g), dtype=object)[sel]
        for cls in np.unique(classes):
            m = classes == cls
            rows.setdefault(str(cls), []).append(np.stack([meas[sel][m], pred[sel][m]]))
    total_abs = sum(float(np.abs(np.hstack(v)[1] - np.hstack(v)[0]).sum()) for v in rows.values()) or 1.0
    out = []
    for cls, parts in rows.items():
        meas, pred = np.hstack(parts)
        out.append(ClassError(cls, len(meas), float(meas.sum()), float(pred.sum()),
                              float(np.exp(np.mean(np.abs(np.log(pred / meas)))) - 1.0),
                              float(np.abs(pred - meas).sum()) / total_abs))
    return sorted(out, key=lambda c: -c.abs_error_share)


@dataclass
class BusyStep:
    """GPU compute-busy time of one step (union of GPU kernel, copy and memset intervals; collectives,
    whose recorded time includes waiting for peers that are not traced, are left out): recorded vs
    replayed, over the same GPU ops -- those the recording started inside the step. CPU gaps do not
    count, so a CPU-bound trace still measures the compute model; and an op that the replay moves across
    a step boundary (a host that waits less in a blocking copy ends its step earlier) still counts in the
    step it belongs to."""

    trace: str
    step: str
    measured_us: float
    predicted_us: float

    @property
    def error(self) -> float:
        return (self.predicted_us - self.measured_us) / self.measured_us if self.measured_us else float("nan")


def gpu_busy_steps(graph: ExecutionGraph, timing: TimingSource, trace: str = "") -> list[BusyStep]:
    """Per ProfilerStep of `graph`: recorded GPU-busy time and the replay's under `timing`, of the GPU ops
    that started inside the step's recorded window."""
    from replay.api import replay
    from replay.results import _union_length

    res = replay([graph], timing, critical_path=False)
    gpu = graph.is_gpu() & np.isin(graph.kind, [int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET)])
    rec_start = graph.start_us[gpu]
    rec_end = rec_start + graph.duration_us[gpu]
    sim_start, sim_end = res.run.start[gpu], res.run.end[gpu]
    out = []
    replayed = {s.name for s in res.steps}
    for st in graph.steps:
        if st.node < 0 or st.name not in replayed:
            continue
        mine = (rec_start >= st.start_us) & (rec_start < st.start_us + st.duration_us)
        measured = _union_length(rec_start[mine], rec_end[mine], -np.inf, np.inf)
        predicted = _union_length(sim_start[mine], sim_end[mine], -np.inf, np.inf)
        out.append(BusyStep(trace, st.name, measured, predicted))
    return out


# ------------------------------------------------------------------------------------- held-out folds
# Folds by step measure mostly run-to-run noise when the other steps ran the very same kernels. These hold
# out what a new model would bring: kernels of shapes no fit has seen, or whole workloads.
def shape_keys(s) -> np.ndarray:
    """object [n]: one key per distinct kernel shape: class + dtype + the uncalibrated roofline time to
    0.1% where the shapes were recorded (an MoE expert GEMM's M moves by a few tokens from step to step),
    else the kernel name + launch configuration (grid, threads, shared memory per CTA)."""
    shaped = s.shaped
    roof = np.where(shaped, np.round(np.log(np.where(shaped, s.roofline_us, 1.0)), 3), 0.0)
    return np.asarray([f"{c}|{d}|{r:.3f}" if ok else f"{c}|{n}|{g}|{t:g}|{m:g}"
                       for c, d, r, ok, n, g, t, m in zip(s.cls, s.dtype, roof, shaped, s.name, s.grid.tolist(),
                                                           s.threads, s.smem)], object)


def folds_by_shape(s, k: int = 5, seed: int = 0) -> list[np.ndarray]:
    """k folds over the distinct kernel shapes (`shape_keys`): every kernel of a shape, in whichever
    trace or step it ran, is in the same fold, so a held-out kernel's shape is never in the fit.
    Shapes go to folds in a seeded random order (not by size, which would hold out the largest)."""
    keys = shape_keys(s)
    uniq, inv = np.unique(keys, return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = np.empty(len(uniq), np.int64)
    fold_of[order] = np.arange(len(uniq)) % k
    ids = fold_of[inv.ravel()]
    return [ids == j for j in range(min(k, len(uniq)))]


def folds_by_workload(s, workload_of: dict[str, str]) -> list[np.ndarray]:
    """One fold per workload: traces of the same model (same shapes at another batch / sequence split,
    e.g. three Llama steps of one model) are held out together. `workload_of`: trace name -> workload;
    a trace it does not name is a workload of its own."""
    names = np.asarray([workload_of.get(n, n) for n in s.trace_names], object)
    per_kernel = names[s.trace]
    return [per_kernel == w for w in sorted(set(per_kernel.tolist()))] if len(set(per_kernel.tolist())) > 1 else []
