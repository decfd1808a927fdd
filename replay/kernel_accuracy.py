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
    replayed. CPU gaps do not count, so a CPU-bound trace still measures the compute model."""

    trace: str
    step: str
    measured_us: float
    predicted_us: float

    @property
    def error(self) -> float:
        return (self.predicted_us - self.measured_us) / self.measured_us if self.measured_us else float("nan")

    def to_json(self) -> dict:
        return dict(self.__dict__) | {"error": self.error}


def gpu_busy_steps(graph: ExecutionGraph, timing: TimingSource, trace: str = "") -> list[BusyStep]:
    """Per ProfilerStep of `graph`: recorded GPU-busy time and the replay's under `timing`."""
    from replay.api import replay
    from replay.results import _union_length

    res = replay([graph], timing, critical_path=False)
    gpu = graph.is_gpu() & np.isin(graph.kind, [int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET)])
    start, end = graph.start_us[gpu], graph.start_us[gpu] + graph.duration_us[gpu]
    out = []
    by_name = {s.name: s for s in res.steps}
    for st in graph.steps:
        if st.node < 0 or st.name not in by_name:
            continue
        measured = _union_length(start, end, st.start_us, st.start_us + st.duration_us)
        b = by_name[st.name].breakdown
        out.append(BusyStep(trace, st.name, measured, b.compute_us))
    return out
