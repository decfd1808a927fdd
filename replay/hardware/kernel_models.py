"""Per-class kernel models fitted from traces (`lumos-sim calibrate`) and their honest evaluation.

The physics in compute.py gives each kernel a roofline time r = max(compute, memory) from its launching
op's shapes. Real kernels also pay a fixed cost per launch (grid launch-to-retire, the tail of the last
wave, tiny grids that cannot fill the GPU) and reach a class-specific fraction of the roofline rate. Per
kernel class we fit

    t = overhead_us + r / efficiency                 (kernels whose shapes are known)

which is a roofline whose achieved bandwidth / FLOP rate rises with size, r / (r + overhead*efficiency),
the efficiency curve over bytes or FLOPs. Kernels recorded without shapes (traces taken with
record_shapes=False) still carry their launch configuration, so each kernel family and variant also gets
a small regression on it (the seeds' GPU model does the same for embeddings, whose traffic no roofline
tells; a class gets none: its implementations do different work per CTA), whichever of two forms fits
its kernels better:

    t = a + b * CTAs * threads per CTA               (streaming kernels: fixed cost + work per thread)
    ln t = g0 + gx ln(grid.x) + gy ln(grid.y) + gz ln(grid.z) + gt ln(threads per CTA)
              + gs ln(1 + shared memory bytes per CTA)
                                                     (tiled kernels whose per-CTA work varies)

The grid's axes are kept apart because kernels give them different meanings (cuDNN's layout transforms
tile the spatial axis on x and the batch on z: a CTA along x costs more than one along z), and the
shared memory a CTA asks for tells how much data it stages (cuDNN's 'singleread' batch norms hold a
channel in shared memory: same grid, 3x the smem, twice the time). A feature that does not vary in the
fit data gets no slope, so the model never extrapolates along an axis it has not seen move.

Fits minimise the mean |ln(pred / measured)| -- the GMAE the accuracy reports use -- by a grid search
over (overhead, efficiency) and iteratively reweighted least squares for the regression.

Kernels that ran while a communication kernel was running on another stream of the same GPU are
slower and far noisier: NCCL kernels hold SMs and memory bandwidth (on the shared A100 traces a 1-block
elementwise kernel takes a median 7 us under an all-reduce and 3 us alone). How much slower depends on
which communication kernel it shares the GPU with: under the LL-protocol all-reduce of trace_diff_control
(24 CTAs polling flags in memory) kernels take 3.1x the time identical kernels take alone (geometric
mean), under its 24-channel SendRecv 1.9x, under the 8-channel one 1.1x. So each class, family and
variant gets a model fitted on all its kernels (plain key, 'elementwise') and, where there are enough,
one on the kernels that ran alone ('elementwise@alone'), one on those that ran under any communication
('elementwise@comm') and one per communication kernel kind that covered them
('elementwise@comm[ncclKernel_AllReduce_RING_LL_Sum_float x24]': the NCCL kernel's name and CTA count,
i.e. collective, algorithm, protocol and channels). A kernel
takes the most specific level that has a model (variant, family, class), and there the model of its
own communication kind, then of its state, then the plain one; a group that holds every kernel of the
group it refines gets none (it would repeat that model). Replay picks the contended model for a traced
kernel that overlapped communication in the recorded trace (the engine does not re-derive contention
from the simulated schedule).

Evaluation (`cross_validate`) is k-fold with folds by trace (fit on the other traces of the same GPU) and
by step (fit on the other ProfilerSteps): a kernel is never in the fit that predicts it.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from .config import HardwareConfig, KernelClassModel

if TYPE_CHECKING:  # pragma: no cover
    from chakra_schema.graph import ExecutionGraph

    from .compute import OpEstimate

MIN_US = 1.0            # kernels shorter than this are left out (1 us trace resolution makes them noise)
MIN_KERNELS = 8         # fewer kernels than this in a class: no fit
MIN_FAMILY_KERNELS = 4  # a kernel family (one implementation) varies less: fewer samples suffice
TENSOR_DTYPES = ("tf32", "bf16", "fp16", "fp8")
MIN_TENSOR_KERNELS = 5  # large tensor-core GEMMs needed to measure the sustained tensor fraction
CONTENDED = "@comm"     # model-key suffix of kernels that ran under communication
# One memory-streaming model for TensorIterator's generic (non-vectorized) kernels across the elementwise
# and copy classes: PyTorch takes them when an operand is not contiguous (a transposed / sliced view, a
# broadcast operand) and they load element by element through an offset calculator, reaching about half
# the DRAM bandwidth of the vectorized kernels (H100: 1.4-1.9 vs 3.1-3.3 TB/s on >= 8 MB). A Kineto-linked
# kernel is timed by its own family's model; the key serves kernels inferred from an ET alone, whose
# operands' strides say they take this path (replay/et_kernels.py).
STRIDED_KEY = "memory[strided]"
_STRIDED_KERNEL = re.compile(r"at::native::elementwise_kernel<|CatArrayBatchedCopy<")
ISOLATED = "@alone"     # model-key suffix of kernels that ran without communication on the GPU
CONTENDED_OVERLAP = 0.5 # a kernel is contended when communication covered at least this share of it
ROOFLINE_FAILS = math.log(1.25)  # mean |ln(pred / measured)| of a roofline fit that does not tell the work
_OVERHEADS = np.concatenate([[0.0], np.geomspace(0.25, 40.0, 48)])
_EFFICIENCIES = np.geomspace(0.01, 10.0, 150)


# ------------------------------------------------------------------------------------ applying a model
def class_model(hw: HardwareConfig, cls: str, dtype: str = "", kernel: str = "",
                contention: str = "", shaped: bool | None = None) -> KernelClassModel | None:
    """The fitted model for a kernel, most specific level first (variant, family, class; a dtype-specific
    class like 'gemm_tf32' before 'gemm'), at each level the model of the communication kind that ran
    beside it (`contention`, see `communication_kind`; '' = it ran alone), then of its state (alone /
    under communication), then the one fitted on all kernels. With `shaped` known (the kernel has a
    roofline), a model that cannot time such a kernel is passed over."""
    models = hw.kernel_models
    if not models:
        return None
    key = model_key(cls, dtype)
    chains = [model_keys(key + state, kernel) for state in reversed(contention_states(contention))]
    for level in reversed(range(len(chains[0]))):
        for keys in chains:
            got = models.get(keys[level])
            if got is not None and (shaped is None or can_time(got, shaped)):
                return got
    return models.get(cls)


def contention_states(contention: str) -> list[str]:
    """The model-key suffixes of a kernel's state, least specific first: '' (all kernels), then ISOLATED,
    or CONTENDED and CONTENDED[kind] for one that ran under communication kernel kind `contention`."""
    if not contention:
        return ["", ISOLATED]
    return ["", CONTENDED, f"{CONTENDED}[{contention}]"]


def can_time(model: KernelClassModel, shaped: bool) -> bool:
    """Whether `model` times a kernel with (`shaped`) or without a roofline, as `predict` does."""
    return (model.times_shaped or model.shaped_by_geometry) if shaped else bool(model.geometry)


def apply_class_model(est: "OpEstimate", model: KernelClassModel, min_us: float = 0.0) -> "OpEstimate":
    """A roofline estimate with the class's fixed cost and achieved efficiency applied."""
    if model.efficiency == 1.0 and model.overhead_us == 0.0:
        return est
    roof = max(est.compute_us, est.memory_us)
    t = max(model.overhead_us + roof / model.efficiency, min_us)
    scale = t / est.time_us if est.time_us > 0 else 1.0
    return dataclasses.replace(est, time_us=t, compute_us=est.compute_us / model.efficiency,
                               memory_us=est.memory_us / model.efficiency,
                               efficiency=est.efficiency / scale if scale > 0 else est.efficiency,
                               detail=(est.detail + " " if est.detail else "") + "calibrated")


@dataclass(frozen=True)
class LaunchGeometry:
    """A kernel's launch configuration as Kineto records it."""

    grid: tuple[float, float, float]   # CTAs along x, y, z
    threads: float                     # threads per CTA
    smem: float = 0.0                  # shared memory per CTA, bytes (0: none or not recorded)

    @property
    def ctas(self) -> float:
        return math.prod(self.grid)


def launch_geometry(attrs: Any) -> LaunchGeometry | None:
    """The launch configuration of a kernel from its attrs (Kineto's grid / block triples and shared
    memory), None when not recorded."""
    if not isinstance(attrs, dict):
        return None
    try:
        grid = tuple(float(int(x)) for x in attrs.get("grid") or ())
        block = [int(x) for x in attrs.get("block") or ()]
        smem = float(attrs.get("shared_memory") or 0)
    except (TypeError, ValueError):
        return None
    threads = math.prod(block)
    if not grid or len(grid) > 3 or min(grid) <= 0 or not block or threads <= 0 or not smem >= 0:
        return None
    return LaunchGeometry((grid + (1.0, 1.0))[:3], float(threads), smem)


def geometry_estimate(model: KernelClassModel, attrs: Any, min_us: float = 0.0) -> "OpEstimate | None":
    """The class's launch-geometry regression for a kernel recorded without shapes, no shorter than a
    kernel's least time (`min_us`: a fit over large grids extrapolates tiny ones to nanoseconds)."""
    from .compute import OpEstimate

    geo = launch_geometry(attrs)
    if not model.geometry or geo is None:
        return None
    t = float(geometry_time(model.geometry, np.asarray([geo.grid]), np.asarray([geo.threads]),
                            np.asarray([geo.smem]))[0])
    t = max(t, min_us)
    return OpEstimate(t, 0.0, 0.0, "latency", 0.0, 0.0, 0.0, "calibrated launch-geometry regression")


def communication_overlap(graph: "ExecutionGraph") -> np.ndarray:
    """float [N]: per GPU node, the share of its recorded interval during which a communication kernel
    ran on the same GPU (any stream; the node's own, if communication, is not counted). 0 elsewhere."""
    return _overlap(graph, _communication_by_device(graph))


def _overlap(graph: "ExecutionGraph", by_device: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    out = np.zeros(len(graph))
    for comm, work in by_device:
        lo, hi = _interval_union(graph.start_us[comm], graph.start_us[comm] + graph.duration_us[comm])
        covered_before = np.concatenate([[0.0], np.cumsum(hi - lo)])

        def covered(x: np.ndarray) -> np.ndarray:  # communication time in (-inf, x]
            k = np.searchsorted(lo, x, side="right")
            j = np.maximum(k - 1, 0)
            inside = np.where(k > 0, np.clip(np.minimum(x, hi[j]) - lo[j], 0.0, None), 0.0)
            return covered_before[j] * (k > 0) + inside

        a, b = graph.start_us[work], graph.start_us[work] + graph.duration_us[work]
        out[work] = (covered(b) - covered(a)) / (b - a)
    return out


def communication_contention(graph: "ExecutionGraph") -> np.ndarray:
    """object [N]: per GPU node that ran under communication (covered >= CONTENDED_OVERLAP of its
    interval), the kind of the communication kernel that covered most of it (`communication_kind`);
    '' elsewhere."""
    out = np.full(len(graph), "", object)
    by_device = _communication_by_device(graph)
    contended = _overlap(graph, by_device) >= CONTENDED_OVERLAP
    start, end = graph.start_us, graph.start_us + graph.duration_us
    for comm, work in by_device:
        work = work[contended[work]]
        if len(work) == 0:
            continue
        comm = comm[np.argsort(start[comm], kind="stable")]
        kinds = [communication_kind(graph.name[j], graph.attrs.get(j)) for j in comm.tolist()]
        c_start, c_end = start[comm], end[comm]
        longest = float((c_end - c_start).max())
        for i in work.tolist():  # the candidates: communication that starts before i ends, and not too early
            lo = int(np.searchsorted(c_start, start[i] - longest, side="left"))
            hi = int(np.searchsorted(c_start, end[i], side="left"))
            shared = np.minimum(c_end[lo:hi], end[i]) - np.maximum(c_start[lo:hi], start[i])
            out[i] = kinds[lo + int(np.argmax(shared))]
    return out


def communication_kind(name: str, attrs: Any) -> str:
    """What a communication kernel does to the kernels beside it: its name without the parameter list
    (collective, algorithm, protocol, dtype) and its CTA count (NCCL runs one CTA per channel)."""
    geo = launch_geometry(attrs)
    return kernel_variant(name) + (f" x{geo.ctas:g}" if geo is not None else "")


def _communication_by_device(graph: "ExecutionGraph") -> list[tuple[np.ndarray, np.ndarray]]:
    """Per GPU with communication kernels: (its communication nodes, its other GPU nodes), both with a
    recorded duration."""
    from chakra_schema.graph import OpKind

    from .compute import traced_kernel_class

    gpu = np.flatnonzero(graph.is_gpu() & (graph.duration_us > 0))
    if len(gpu) == 0:
        return []
    comm_kinds = np.isin(graph.kind[gpu], [int(OpKind.COLLECTIVE), int(OpKind.SEND), int(OpKind.RECV)])
    by_name: dict[str, bool] = {}   # a kernel name is communication or not wherever it appears

    def is_comm(i: int) -> bool:
        hit = by_name.get(graph.name[i])
        if hit is None:
            hit = by_name[graph.name[i]] = traced_kernel_class(graph, i)[0] == "communication"
        return hit

    comm = np.asarray([bool(c) or is_comm(i) for i, c in zip(gpu.tolist(), comm_kinds.tolist())], bool)
    device = np.asarray([graph.resources[r].device for r in graph.resource[gpu].tolist()])
    return [(gpu[comm & (device == d)], gpu[~comm & (device == d)]) for d in np.unique(device[comm]).tolist()]


def _interval_union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint intervals covering the union of [start, end)."""
    order = np.argsort(start, kind="stable")
    start, end = start[order], np.maximum.accumulate(end[order])
    new = np.concatenate([[True], start[1:] > end[:-1]])   # a gap before it: a new interval starts
    last = np.concatenate([np.flatnonzero(new)[1:] - 1, [len(start) - 1]])
    return start[new], end[last]


# ------------------------------------------------------------------------------------------- samples
@dataclass
class KernelSamples:
    """Columns over the GPU kernels of some traces: what the fits and the evaluation need."""

    trace: np.ndarray        # int   [n] index into `trace_names`
    step: np.ndarray         # int   [n] ProfilerStep index within its trace, -1 outside every step
    cls: np.ndarray          # object[n] kernel class ('gemm_tf32' style keys are built from dtype)
    dtype: np.ndarray        # object[n]
    measured_us: np.ndarray  # float [n]
    roofline_us: np.ndarray  # float [n] max(compute, memory) of the uncalibrated physics; nan: no shapes
    base_us: np.ndarray      # float [n] the uncalibrated model's prediction; nan: none
    grid: np.ndarray         # float [n, 3] CTAs along x, y, z; 0 when not recorded
    threads: np.ndarray      # float [n] threads per CTA, 0 when not recorded
    smem: np.ndarray         # float [n] shared memory per CTA in bytes, 0 when none or not recorded
    name: np.ndarray         # object[n] kernel name
    tensor_fraction: np.ndarray  # float [n] achieved fraction of the dense tensor peak (compute-bound
                                 # tensor-core GEMMs of >= 1 GFLOP), nan otherwise
    contention: np.ndarray   # object[n] the communication kernel kind it ran under ('' = ran alone;
                             # see communication_contention)
    trace_names: list[str]

    def __len__(self) -> int:
        return len(self.measured_us)

    @property
    def shaped(self) -> np.ndarray:
        """bool [n]: the kernel has a roofline (its launching op's shapes were recorded and understood)."""
        return np.isfinite(self.roofline_us) & (self.roofline_us > 0)

    @property
    def ctas(self) -> np.ndarray:
        """float [n]: CTAs in the grid, 0 when not recorded."""
        return self.grid.prod(axis=1)

    @property
    def has_geometry(self) -> np.ndarray:
        """bool [n]: the launch configuration was recorded."""
        return (self.ctas > 0) & (self.threads > 0)

    @property
    def contended(self) -> np.ndarray:
        """bool [n]: communication ran on the GPU for >= CONTENDED_OVERLAP of the kernel."""
        return self.contention != ""

    def subset(self, mask: np.ndarray) -> "KernelSamples":
        return KernelSamples(**{f.name: (getattr(self, f.name)[mask] if f.name != "trace_names" else self.trace_names)
                                for f in dataclasses.fields(self)})

    @staticmethod
    def concat(parts: Sequence["KernelSamples"]) -> "KernelSamples":
        names: list[str] = []
        cols: dict[str, list[np.ndarray]] = {f.name: [] for f in dataclasses.fields(KernelSamples)}
        for p in parts:
            for f in dataclasses.fields(KernelSamples):
                if f.name == "trace_names":
                    continue
                v = getattr(p, f.name)
                cols[f.name].append(v + len(names) if f.name == "trace" else v)
            names += p.trace_names
        empty = KernelSamples.from_rows([], [])
        return KernelSamples(**{k: np.concatenate(v) if v else getattr(empty, k) for k, v in cols.items()
                                if k != "trace_names"}, trace_names=names)

    @staticmethod
    def from_rows(rows: Sequence[tuple], trace_names: list[str]) -> "KernelSamples":
        """From one tuple per kernel, in field order (trace ... contention), trace_names apart."""
        fields = [f.name for f in dataclasses.fields(KernelSamples)][:-1]
        cols = list(zip(*rows)) if rows else [()] * len(fields)
        types = {"trace": np.int64, "step": np.int64, "cls": object, "dtype": object, "name": object,
                 "contention": object}
        out = {f: np.asarray(c, types.get(f, float)) for f, c in zip(fields, cols)}
        out["grid"] = out["grid"].reshape(-1, 3)
        return KernelSamples(**out, trace_names=trace_names)


def kernel_samples(graph: "ExecutionGraph", hw: HardwareConfig, trace_name: str) -> KernelSamples:
    """One sample per measured GPU kernel / copy / memset of `graph` (communication excluded: the
    network model times it), with the uncalibrated physics of `hw`."""
    from chakra_schema.graph import OpKind

    from .compute import ComputeModel, traced_kernel_class

    base = ComputeModel(dataclasses.replace(hw, kernel_models={}))
    kinds = (int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET))
    sel = np.flatnonzero(graph.is_gpu() & np.isin(graph.kind, kinds) & (graph.duration_us >= MIN_US))
    steps = [(s.start_us, s.start_us + s.duration_us) for s in graph.steps if s.node >= 0]
    rows: list[tuple] = []
    memo: dict[tuple, Any] = {}
    contention = communication_contention(graph)
    no_launch = LaunchGeometry((0.0, 0.0, 0.0), 0.0)
    for i in sel.tolist():
        cls, dtype = traced_kernel_class(graph, i)
        if cls == "communication":
            continue
        key = _shape_key(graph, i)
        if key not in memo:
            memo[key] = base.roofline_kernel_estimate(graph, i)
        est = memo[key]
        geo = launch_geometry(graph.attrs.get(i)) or no_launch
        t0 = float(graph.start_us[i])
        step = next((j for j, (lo, hi) in enumerate(steps) if lo <= t0 < hi), -1)
        dur = float(graph.duration_us[i])
        tensor = np.nan
        if (est is not None and cls in ("gemm", "conv") and dtype in TENSOR_DTYPES and est.flops >= 1e9
                and est.bound == "compute"):
            tensor = est.flops / (dur * 1e-6) / hw.peak_flops(dtype)
        rows.append((0, step, cls, dtype, dur,
                     max(est.compute_us, est.memory_us) if est is not None else np.nan,
                     est.time_us if est is not None else np.nan, geo.grid, geo.threads, geo.smem,
                     graph.name[i], tensor, contention[i]))
    return KernelSamples.from_rows(rows, [trace_name])


def _shape_key(graph: "ExecutionGraph", i: int) -> tuple:
    from .compute import launching_op

    host = launching_op(graph, i)
    ha = graph.attrs.get(host) or {} if host >= 0 else {}
    a = graph.attrs.get(i) or {}
    return (int(graph.kind[i]), graph.name[i], graph.name[host] if host >= 0 else "",
            repr(ha.get("input_shapes")), repr(ha.get("input_types")), repr(ha.get("input_values")),
            repr(ha.get("output_shapes")), repr(a.get("bytes")))


# ---------------------------------------------------------------------------------------------- fits
def gmae(pred: np.ndarray, measured: np.ndarray) -> float:
    """Geometric-mean absolute error exp(mean |ln(pred/measured)|) - 1 (nan when empty)."""
    if len(pred) == 0:
        return float("nan")
    return float(np.exp(np.mean(np.abs(np.log(pred / measured)))) - 1.0)


def fit_roofline(roofline_us: np.ndarray, measured_us: np.ndarray) -> tuple[float, float]:
    """(overhead_us, efficiency) minimising mean |ln((o + r/e) / t)|: a coarse grid, then a finer one
    around the best point (vectorised over e)."""
    log_t = np.log(measured_us)

    def search(overheads: np.ndarray, effs: np.ndarray) -> tuple[float, float, float]:
        best = (float("inf"), 0.0, 1.0)
        inv = 1.0 / effs
        for o in overheads:
            err = np.mean(np.abs(np.log(np.maximum(o + np.outer(inv, roofline_us), 1e-9)) - log_t), axis=1)
            j = int(np.argmin(err))
            if err[j] < best[0]:
                best = (float(err[j]), float(o), float(effs[j]))
        return best

    _, o, e = search(_OVERHEADS[::4], _EFFICIENCIES[::6])
    fine_o = np.unique(np.clip(np.concatenate([[0.0], o * np.geomspace(0.6, 1.6, 11)]), 0.0, None))
    _, o, e = search(fine_o, e * np.geomspace(0.7, 1.4, 25))
    return o, e


def geometry_time(geometry: Sequence[float], grid: np.ndarray, threads: np.ndarray,
                  smem: np.ndarray) -> np.ndarray:
    """Durations from a launch-geometry model: (a, b) linear in total threads; (g0, gx, gy, gz, gt, gs)
    log-linear in the grid's axes, threads per CTA and shared memory per CTA; (g0, g1, g2) log-linear in
    CTAs and threads per CTA (presets written before the grid's axes were kept apart)."""
    if len(geometry) == 2:
        return geometry[0] + geometry[1] * grid.prod(axis=1) * threads
    if len(geometry) == 3:
        ctas = grid.prod(axis=1)
        return np.exp(geometry[0] + geometry[1] * np.log(ctas) + geometry[2] * np.log(threads))
    return np.exp(_geometry_features(grid, threads, smem) @ np.asarray(geometry))


def fit_geometry_linear(ctas: np.ndarray, threads: np.ndarray, measured_us: np.ndarray) -> tuple[float, float]:
    """(a, b) of t = a + b * total threads, minimising mean |ln(pred/t)| (the roofline grid, rescaled)."""
    x = ctas * threads
    scale = float(np.percentile(x / measured_us, 95))  # the largest kernels run near the fitted rate
    a, eff = fit_roofline(x / scale, measured_us)
    return a, 1.0 / (scale * eff)


def fit_launch_model(grid: np.ndarray, threads: np.ndarray, smem: np.ndarray,
                     measured_us: np.ndarray) -> tuple[float, ...]:
    """The better-fitting (in sample) of the linear and the log-linear launch-geometry forms."""
    forms = [fit_geometry_linear(grid.prod(axis=1), threads, measured_us),
             fit_geometry(grid, threads, smem, measured_us)]
    errs = [_mean_log_error(geometry_time(f, grid, threads, smem), measured_us) for f in forms]
    return tuple(forms[int(np.argmin(errs))])


def _geometry_features(grid: np.ndarray, threads: np.ndarray, smem: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(threads)), np.log(grid), np.log(threads), np.log1p(smem)])


def fit_geometry(grid: np.ndarray, threads: np.ndarray, smem: np.ndarray,
                 measured_us: np.ndarray) -> tuple[float, ...]:
    """Least-absolute-deviation fit of ln t on (1, ln grid.x, ln grid.y, ln grid.z, ln threads/CTA,
    ln(1 + smem/CTA)) by reweighted least squares. Slopes are kept physical (a bigger launch never runs
    faster, nor more than proportionally slower); a feature that does not vary in the samples gets none,
    nor does any where the samples have fewer than three distinct launch configurations, so a fit
    extrapolates sanely."""
    x = _geometry_features(grid, threads, smem)
    y = np.log(measured_us)
    slopes = np.zeros(x.shape[1] - 1)
    vary = np.ptp(x[:, 1:], axis=0) > 1e-9
    if len(np.unique(x[:, 1:], axis=0)) < 3:
        return (float(np.median(y)),) + tuple(slopes.tolist())
    xv = x[:, np.concatenate([[True], vary])]
    w = np.linalg.lstsq(xv, y, rcond=None)[0]
    for _ in range(25):
        r = np.sqrt(1.0 / np.maximum(np.abs(y - xv @ w), 0.02))
        w = np.linalg.lstsq(xv * r[:, None], y * r, rcond=None)[0]
    slopes[vary] = np.clip(w[1:], 0.0, 1.0)
    return (float(np.median(y - x[:, 1:] @ slopes)),) + tuple(float(g) for g in slopes)


def model_key(cls: str, dtype: str, state: str = "") -> str:
    """GEMM efficiency depends on the dtype (BF16, FP8, TF32 tensor cores, FP32 SIMT): fit it per dtype.
    `state`: one of `contention_states` ('', ISOLATED, CONTENDED, CONTENDED[kind])."""
    key = f"{cls}_{dtype}" if cls in ("gemm", "conv") else cls
    return key + state


def key_class(key: str) -> str:
    """The kernel class a model key belongs to ('gemm_tf32@comm[nccl... x24]/cutlass...' -> 'gemm')."""
    return key.split("/")[0].split("@")[0].split("_")[0]


def model_keys(key: str, kernel: str = "") -> list[str]:
    """The model keys of a kernel, least specific first: its class key, its family ('key/family') and its
    variant ('key/variant': the family with its numbers, which name tile sizes and per-thread work: a
    cuDNN batch-norm kernel's template argument 32 / 128 / 512 says how many elements a channel has)."""
    if not kernel:
        return [key]
    fam, var = kernel_family(kernel), kernel_variant(kernel)
    return [key, f"{key}/{fam}"] + ([f"{key}/{var}"] if var != fam else [])


def kernel_family(name: str) -> str:
    """A kernel's implementation family: its function name with template arguments, without the
    parameter list, digits folded ('at::native::reduce_kernel<#, #, ...>', 'ampere_sgemm_#x#_nn'). Kernels
    of one family share a per-thread work pattern, so a class splits into families where the traces have
    enough of each."""
    return "".join("#" if ch.isdigit() else ch for ch in kernel_variant(name))


def kernel_variant(name: str) -> str:
    """The kernel's function name with template arguments, without the parameter list."""
    base = name[5:] if name.startswith("void ") else name
    base = base.replace("(anonymous namespace)::", "")
    depth = 0
    for j, ch in enumerate(base):  # the parameter list is the first '(' outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth <= 0:
            base = base[:j]
            break
    return base.strip()[:160] or "?"


STATE_DEPTHS = (0, 1, 2)  # sample_keys' `depth`: all kernels, alone / under communication, per communication kind


def sample_keys(s: KernelSamples, depth: int = 0) -> list[np.ndarray]:
    """Per sample its class, family and variant keys (`model_keys`; a kernel without a variant repeats its
    family) at state `depth`: 0 the plain keys, 1 those of its state (ISOLATED or CONTENDED), 2 those of
    the communication kind it ran under (an isolated kernel repeats its state)."""
    states = [_state_at(c, depth) for c in s.contention.tolist()]
    cls = [model_key(c, d, st) for c, d, st in zip(s.cls, s.dtype, states)]
    rows = [model_keys(c, n) for c, n in zip(cls, s.name)]
    return [np.asarray([r[min(level, len(r) - 1)] for r in rows], object) for level in range(3)]


def _state_at(contention: str, depth: int) -> str:
    states = contention_states(contention)
    return states[min(depth, len(states) - 1)]


def fit_class_models(s: KernelSamples) -> dict[str, KernelClassModel]:
    """One model per class key with at least MIN_KERNELS samples, one per kernel family and per kernel
    variant with at least MIN_FAMILY_KERNELS; each on all kernels, on those of each state and on those
    under each communication kind (a group that repeats the group it refines is not fitted)."""
    out: dict[str, KernelClassModel] = {}
    shaped = s.shaped
    by_depth = [sample_keys(s, d) for d in STATE_DEPTHS]
    for depth, keys in enumerate(by_depth):
        cls_keys, fam_keys, var_keys = (keys if depth == 0 else
                                        [_unless_all_kernels(k, c) for k, c in zip(keys, by_depth[depth - 1])])
        # no launch-geometry regression across a class: it would mix implementations whose work per CTA
        # differs (held out by trace it timed unseen families 2-30x off); a class model is a roofline
        out.update(_fit_groups(s, cls_keys, MIN_KERNELS, geometry=False))
        out.update(_fit_groups(s, fam_keys, MIN_FAMILY_KERNELS))
        # variants only for kernels timed by their launch geometry: with shapes, the family's roofline
        # efficiency carries to shapes it has not seen (H100 GEMM sweeps: 14% GMAE) and a variant's does
        # not (20%); without shapes, the variant's numbers are what tells per-thread work apart
        out.update(_fit_groups(s, np.where(shaped, None, var_keys), MIN_FAMILY_KERNELS))
    strided = np.asarray([c in ("elementwise", "copy") and bool(_STRIDED_KERNEL.search(str(n)))
                          for c, n in zip(s.cls.tolist(), s.name.tolist())], bool)
    out.update(_fit_groups(s, np.where(strided, STRIDED_KEY, None), MIN_KERNELS, geometry=False))
    return out


def _unless_all_kernels(keys: np.ndarray, coarser_keys: np.ndarray) -> np.ndarray:
    """`keys`, None where a group holds every kernel of the coarser group it refines (its model would
    repeat that one: traces without communication have only isolated kernels, and a family that ran
    under one communication kind only has its @comm group again per kind) or is that group."""
    coarse_size = Counter(coarser_keys.tolist())
    size = Counter(keys.tolist())
    same = [k == c or size[k] == coarse_size[c] for k, c in zip(keys.tolist(), coarser_keys.tolist())]
    return np.where(np.asarray(same, bool), None, keys)


def _fit_groups(s: KernelSamples, keys: np.ndarray, min_kernels: int,
                geometry: bool = True) -> dict[str, KernelClassModel]:
    out: dict[str, KernelClassModel] = {}
    for key in sorted(set(keys.tolist()) - {None}):
        m = keys == key
        model = _fit_group(s, m, min_kernels, geometry)
        if model is not None:
            pred = predict(model, s.subset(m))
            ok = np.isfinite(pred)
            out[key] = dataclasses.replace(model, fit_gmae=round(gmae(pred[ok], s.measured_us[m][ok]), 4))
    return out


def _mean_log_error(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(np.log(np.maximum(pred, 1e-9) / measured))))


def _fit_group(s: KernelSamples, m: np.ndarray, min_kernels: int, geometry_ok: bool = True) -> KernelClassModel | None:
    """Roofline form on the kernels with shapes, launch-geometry form (where `geometry_ok`) on those
    without; where the geometry explains even the kernels with shapes better (custom ops whose traffic
    the shapes do not tell, e.g. fbgemm embeddings), it times those too."""
    roof = m & s.shaped
    has_geo = m & s.has_geometry & geometry_ok
    shapeless = has_geo & ~roof
    overhead, eff, geometry, shaped_by_geometry = 0.0, 1.0, (), False
    if roof.sum() >= min_kernels:
        overhead, eff = fit_roofline(s.roofline_us[roof], s.measured_us[roof])
        both = roof & has_geo
        if both.sum() >= min_kernels and _geometry_times_shapes_better(s, both, overhead, eff):
            geometry, shaped_by_geometry = _fit_launch(s, has_geo), True
    if not geometry:
        fit_on = shapeless if shapeless.sum() >= min_kernels else has_geo
        if fit_on.sum() >= min_kernels:
            geometry = _fit_launch(s, fit_on)
    if roof.sum() < min_kernels and not geometry:
        return None
    return KernelClassModel(overhead_us=round(overhead, 4), efficiency=round(eff, 5),
                            geometry=tuple(float(f"{g:.6g}") for g in geometry), kernels=int(m.sum()),
                            shaped_by_geometry=shaped_by_geometry, times_shaped=bool(roof.sum() >= min_kernels))


def _geometry_times_shapes_better(s: KernelSamples, m: np.ndarray, overhead: float, eff: float) -> bool:
    """Whether, on the kernels `m` (all with shapes and a launch configuration), the launch-geometry form
    predicts their durations better than the roofline form (`overhead`, `eff` fitted on them). With four
    or more distinct shapes, on shapes it was not fitted on: 2-fold over the distinct shapes, alternating
    in roofline order. In sample the richer geometry form nearly always wins, also for GEMMs, whose work
    per CTA grows with K, which no grid shows (an H100 MoE GEMM family picked that way came out 4x too
    fast on a larger batch); fbgemm embeddings, whose shapes do not tell their traffic, still pick it.
    With fewer shapes there is nothing to extrapolate to, and two roofline parameters fit up to three
    shapes closely unless the shapes do not tell the kernel's work (sort / segment kernels whose work is
    in the data: identical shapes, 3x apart): there the roofline must fail in sample (off by over 25% on
    average; such kernels are off by 60-200%) and the geometry form halve its error. Any launch feature
    that differs between two shapes 'explains' them in sample, whatever it means."""
    idx = np.flatnonzero(m)
    # a shape is a roofline time to 0.1% (an MoE expert GEMM's M moves by a few tokens from step to step)
    shape = np.unique(np.round(np.log(s.roofline_us[idx]), 3), return_inverse=True)[1].ravel()
    if shape.max(initial=0) < 3:
        by_roof = _mean_log_error(overhead + s.roofline_us[m] / eff, s.measured_us[m])
        by_geo = _mean_log_error(_geometry_time(_fit_launch(s, m), s, m), s.measured_us[m])
        return by_roof > ROOFLINE_FAILS and 2 * by_geo < by_roof
    err = np.zeros(2)  # summed |ln(pred / measured)| of (roofline, geometry) on the held-out half
    for fold in (0, 1):
        fit, test = idx[shape % 2 != fold], idx[shape % 2 == fold]
        o, e = fit_roofline(s.roofline_us[fit], s.measured_us[fit])
        t = s.measured_us[test]
        err += len(test) * np.array([_mean_log_error(o + s.roofline_us[test] / e, t),
                                     _mean_log_error(_geometry_time(_fit_launch(s, fit), s, test), t)])
    return bool(err[1] < err[0])


def _fit_launch(s: KernelSamples, m: np.ndarray) -> tuple[float, ...]:
    return fit_launch_model(s.grid[m], s.threads[m], s.smem[m], s.measured_us[m])


def _geometry_time(geometry: Sequence[float], s: KernelSamples, m: np.ndarray) -> np.ndarray:
    return geometry_time(geometry, s.grid[m], s.threads[m], s.smem[m])


def predict(model: KernelClassModel | None, s: KernelSamples) -> np.ndarray:
    """Predicted durations of samples of one class key (nan where the model cannot say)."""
    out = np.full(len(s), np.nan)
    if model is None:
        return out
    roof = s.shaped
    if model.times_shaped:
        out[roof] = model.overhead_us + s.roofline_us[roof] / model.efficiency
    geo = s.has_geometry & (np.ones(len(s), bool) if model.shaped_by_geometry else ~roof)
    if model.geometry and geo.any():
        out[geo] = _geometry_time(model.geometry, s, geo)
    return out


def predict_all(models: dict[str, KernelClassModel], s: KernelSamples) -> np.ndarray:
    """Each sample by the most specific fitted model that can time it, as `class_model` picks one in
    replay: variant, family, class, at each level the model of the kernel's communication kind before
    its state's before the plain one."""
    out = np.full(len(s), np.nan)
    by_depth = [sample_keys(s, d) for d in STATE_DEPTHS]
    for level in range(3):  # least specific first: later ones override
        for keys in (k[level] for k in by_depth):
            for key in set(keys.tolist()):
                if key in models:
                    m = keys == key
                    got = predict(models[key], s.subset(m))
                    out[m] = np.where(np.isfinite(got), got, out[m])
    return out


def sustained_tensor_fraction(s: KernelSamples) -> float | None:
    """The tensor throughput the GPU sustained in the traces, as a fraction of the dense peak: the 99th
    percentile of the achieved fraction over large compute-bound tensor-core GEMMs (None: too few)."""
    f = s.tensor_fraction[np.isfinite(s.tensor_fraction)]
    if len(f) < MIN_TENSOR_KERNELS:
        return None
    return float(min(np.percentile(f, 99), 1.0))


# -------------------------------------------------------------------------------- cross-validation
@dataclass
class ClassAccuracy:
    """Held-out accuracy of one kernel class: the uncalibrated model vs the fitted one."""

    kernel_class: str
    kernels: int              # held-out kernels of the class
    before_kernels: int       # of them, those the uncalibrated model estimates (it has shapes)
    before_gmae: float
    after_kernels: int        # those the fitted model estimates (shapes or launch geometry)
    after_gmae: float
    floor_gmae: float = float("nan")  # repeat noise: each kernel predicted by the median of identical kernels
                                      # (name, shapes, grid) in the fit folds -- what no class model can beat
    contended_kernels: int = 0        # of the held-out kernels, those that ran under communication
    isolated_gmae: float = float("nan")   # after_gmae over the kernels that ran alone ...
    contended_gmae: float = float("nan")  # ... and over those that ran under communication

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _repeat_median(keys: np.ndarray, log_t: np.ndarray, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """ln-duration of each test kernel predicted by the median over identical training kernels (nan: none)."""
    groups: dict[str, list[float]] = {}
    for k, v in zip(keys[train].tolist(), log_t[train].tolist()):
        groups.setdefault(k, []).append(v)
    med = {k: float(np.median(v)) for k, v in groups.items()}
    return np.asarray([med.get(k, np.nan) for k in keys[test].tolist()])


def folds_by_trace(s: KernelSamples) -> list[np.ndarray]:
    return [s.trace == t for t in np.unique(s.trace)] if len(np.unique(s.trace)) > 1 else []


def folds_by_step(s: KernelSamples, k: int = 10) -> list[np.ndarray]:
    """k-fold by ProfilerStep within each trace (step i is in fold i mod k; a trace with a few steps gets one
    fold per step). Kernels outside any step are never tested; traces with one step are not folded."""
    folds = []
    for t in np.unique(s.trace).tolist():
        in_trace = (s.trace == t) & (s.step >= 0)
        steps = np.unique(s.step[in_trace])
        if len(steps) < 2:
            continue
        n = min(k, len(steps))
        fold_of = {int(st): j % n for j, st in enumerate(steps.tolist())}
        ids = np.full(len(s), -1)
        ids[in_trace] = [fold_of[int(x)] for x in s.step[in_trace].tolist()]
        folds += [ids == j for j in range(n)]
    return folds


def cross_validate(s: KernelSamples, folds: Iterable[np.ndarray],
                   fit: Callable[[KernelSamples], dict[str, KernelClassModel]] = fit_class_models) -> list[ClassAccuracy]:
    """Fit on everything but each fold, predict the fold; per-class GMAE over all held-out kernels."""
    pred = np.full(len(s), np.nan)
    repeat = np.full(len(s), np.nan)
    tested = np.zeros(len(s), bool)
    keys = np.asarray([f"{n}|{r:.6g}|{g}|{t:g}|{m:g}|{c}" for n, r, g, t, m, c in
                       zip(s.name, s.roofline_us, s.grid.tolist(), s.threads, s.smem, s.contention)], object)
    for test in folds:
        if not test.any() or test.all():
            continue
        models = fit(s.subset(~test))
        pred[test] = predict_all(models, s.subset(test))
        repeat[test] = _repeat_median(keys, np.log(s.measured_us), ~test, test)
        tested |= test
    # where no fitted model applies, replay keeps the uncalibrated estimate: so does the evaluation
    pred = np.where(np.isfinite(pred), pred, s.base_us)
    rows = []
    for cls in sorted(set(s.cls[tested].tolist())):
        m = tested & (s.cls == cls)
        b = m & np.isfinite(s.base_us) & (s.base_us > 0)
        a = m & np.isfinite(pred) & (pred > 0)
        r = m & np.isfinite(repeat)
        iso, con = a & ~s.contended, a & s.contended
        rows.append(ClassAccuracy(cls, int(m.sum()), int(b.sum()), gmae(s.base_us[b], s.measured_us[b]),
                                  int(a.sum()), gmae(pred[a], s.measured_us[a]),
                                  gmae(np.exp(repeat[r]), s.measured_us[r]), int(con.sum()),
                                  gmae(pred[iso], s.measured_us[iso]), gmae(pred[con], s.measured_us[con])))
    return rows
