"""Model-based timing sources: `--timing model` (ModelTiming) and `--timing trace --hardware NAME`
(TranslatedTiming). Both implement replay.timing.TimingSource.

ModelTiming(hw) re-times every GPU node with the compute model (kernels by class and the shapes of
their launching host op, generated nodes by their `op` attrs) and every collective / send / recv with
the network model (collectives in flight together share its links: `fabric()`); CPU ops and launch
calls keep their recorded durations (host time does not depend on the GPU). Kernels whose shapes are
unknown keep their recorded duration scaled by the peak ratio of the trace's GPU to `hw` (1.0 when they
are the same GPU).

TranslatedTiming(source, target) keeps the trace's own timing and moves it to another GPU: each GPU
compute duration is multiplied by model(target)/model(source) for the same kernel (or the peak ratio
when the model cannot estimate it), collectives are re-timed by the target's network model.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Sequence

import numpy as np

from chakra_schema.errors import TraceInputError, printable
from chakra_schema.graph import CommType, EdgeKind, ExecutionGraph, OpKind

from .fabric import SharedLinkFabric
from .hardware.compute import (ComputeModel, OpEstimate, _dtype_of, arg_list, kernel_class,
                               launching_op, peak_ratio, traced_kernel_class)
from .hardware.config import HardwareConfig, get_hardware, recorded_device_names, trace_hardware
from .hardware.kernel_models import CONTENDED, STRIDED_KEY, apply_class_model, communication_contention
from .hardware.network import NetworkModel
from .trace_timing import recorded_gpu_latency

__all__ = ["ModelTiming", "TranslatedTiming", "kernel_class", "node_classes", "source_hardware"]

log = logging.getLogger(__name__)

_COMM_KINDS = (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)
_GPU_WORK = (OpKind.KERNEL, OpKind.MEMCPY, OpKind.MEMSET)


def source_hardware(graph: ExecutionGraph, explicit: HardwareConfig | str | None = None) -> HardwareConfig | None:
    """The GPU a trace was recorded on: `explicit` if given, else guessed from graph.metadata
    (Kineto deviceProperties name such as 'NVIDIA A100-SXM4-40GB')."""
    if explicit is not None:
        return get_hardware(explicit)
    return trace_hardware(graph.metadata)


def node_classes(graph: ExecutionGraph) -> list[str]:
    """Per node: 'cpu' for host nodes, else the kernel class (gemm, attention, elementwise, ...,
    communication) used to report per-class error."""
    gpu = graph.is_gpu()
    out = []
    for i in range(len(graph)):
        k = int(graph.kind[i])
        if k in _COMM_KINDS:
            out.append("communication")
        elif k == OpKind.MEMCPY:
            out.append("copy")
        elif k == OpKind.MEMSET:
            out.append("memset")
        elif gpu[i] or k == OpKind.KERNEL:
            op = graph.attr(i, "op")
            out.append(str(op) if op else traced_kernel_class(graph, i)[0])
        else:
            out.append("cpu")
    return out


def _is_gpu_work(graph: ExecutionGraph, i: int, kind: int, gpu: np.ndarray) -> bool:
    """Kernels, memcpys, memsets, and generated GPU nodes carrying `op` attrs."""
    return kind in _GPU_WORK or (bool(gpu[i]) and "op" in (graph.attrs.get(i) or {}))


def _comm_ranks(graph: ExecutionGraph, i: int) -> list[int]:
    a = graph.attrs.get(i) or {}
    ranks = a.get("pg_ranks")
    if ranks:
        return [int(r) for r in ranks]
    n = int(a.get("pg_size") or a.get("group_size") or graph.world_size or 1)
    return list(range(n))


def comm_node_time(net: NetworkModel, graph: ExecutionGraph, i: int,
                   group_ranks: Sequence[int] | None = None) -> float | None:
    """Network-model time of communication node `i`, or None when it lacks the attrs to say."""
    a = graph.attrs.get(i) or {}
    size = a.get("comm_size")
    if size is None:
        return None
    kind = int(graph.kind[i])
    if kind in (OpKind.SEND, OpKind.RECV):
        # a send goes from this rank to comm_dst, a recv comes from comm_src to this rank
        me = graph.rank
        src = me if kind == OpKind.SEND else int(a.get("comm_src", me))
        dst = int(a.get("comm_dst", me)) if kind == OpKind.SEND else me
        if src == dst:
            return None
        return net.p2p_us(float(size), src, dst)
    ctype = a.get("comm_type")
    if ctype is None:
        return None
    ranks = list(group_ranks) if group_ranks else _comm_ranks(graph, i)
    pair_bytes = a.get("comm_pair_bytes")
    if pair_bytes is not None and int(ctype) == CommType.ALL_TO_ALL:  # non-uniform (e.g. MoE routing)
        return net.all_to_all_v_us(pair_bytes, a.get("pg_ranks") or ranks)
    return net.collective_us(CommType(int(ctype)), float(size), ranks)


def _wave_quantized(est: OpEstimate, attrs: dict, sms: int) -> OpEstimate:
    """A memory-bound kernel of `blocks` equal CTAs (multi_tensor_apply: one 65536-element chunk each,
    at most 320 a launch) on `sms` SMs: the DRAM bandwidth is shared by the SMs at work, and the SMs
    given ceil(blocks / sms) chunks set the time, so the launch takes ceil(blocks / sms) * sms / blocks
    times its bandwidth time (320 chunks on H100's 132 SMs: 3 * 132 / 320 = 1.24x; Llama 1.7B's
    _foreach kernels measured 1.2-1.3x their bytes over the sustained bandwidth). With fewer chunks
    than SMs each SM's share grows instead, so no factor is applied."""
    blocks = int(attrs.get("blocks") or 0)
    if blocks < sms or est.bound == "compute":
        return est
    f = math.ceil(blocks / sms) * sms / blocks
    return dataclasses.replace(est, time_us=est.time_us * f, memory_us=est.memory_us * f)


class _ModelBase:
    """Shared machinery: per-node estimates on a hardware config, cached per (kernel, host op shapes)."""

    def __init__(self):
        self._memo: dict[tuple, OpEstimate | None] = {}

    def fabric(self) -> SharedLinkFabric:
        """Collectives are timed alone by the network model; in flight together they share its links."""
        return SharedLinkFabric(self.network)

    def collective_us(self, graph: ExecutionGraph, node: int, group_ranks: Sequence[int],
                      member_durations: Sequence[float]) -> float:
        """The target network model's time for the collective; the recorded transfer when the node
        lacks the attrs to model it."""
        t = comm_node_time(self.network, graph, node, group_ranks)
        if t is not None:
            return t
        return float(min(member_durations)) if len(member_durations) else float(graph.duration_us[node])

    def _estimate(self, model: ComputeModel, graph: ExecutionGraph, i: int,
                  contention: str = "") -> OpEstimate | None:
        a = graph.attrs.get(i)
        if a and "op" in a:
            strided = model.hw.kernel_models.get(STRIDED_KEY) if a.get("strided") else None
            if strided is not None:
                # an inferred kernel over strided operands: TensorIterator's generic kernel (see STRIDED_KEY)
                return apply_class_model(model.roofline_op_estimate(a), strided, getattr(model, "_min", 0.0))
            est = model.op_estimate(a)
            return _wave_quantized(est, a, model.hw.gpu.sm_count) if est is not None else est
        host = launching_op(graph, i)
        ha = graph.attrs.get(host) if host >= 0 else None
        key = (model.hw.name, int(graph.kind[i]), graph.name[i],
               graph.name[host] if host >= 0 else "",
               repr(ha.get("input_shapes")) if ha else "", repr(ha.get("input_types")) if ha else "",
               # a convolution's stride / padding / groups and output are values beside its shapes
               repr(ha.get("input_values")) + repr(ha.get("output_shapes")) if ha else "",
               repr(a.get("bytes")) if a else "",
               # a calibrated launch-geometry model times kernels without shapes by their grid
               repr(a.get("grid")) + repr(a.get("block")) + repr(a.get("shared_memory"))
               if a and model.hw.kernel_models else "", contention)
        if key in self._memo:
            return self._memo[key]
        est = model.kernel_estimate(graph, i, contention)
        self._memo[key] = est
        return est

    @staticmethod
    def _dtype(graph: ExecutionGraph, i: int) -> str:
        a = graph.attrs.get(i) or {}
        if "dtype" in a:
            return str(a["dtype"])
        host = launching_op(graph, i)
        types = arg_list(graph.attrs.get(host) or {}, "input_types") if host >= 0 else []
        return _dtype_of(types, graph.name[i])[0]


# Share of the recorded kernel time that unmodelled kernels may hold before model mode says so
KEPT_SHARE_WARNING = 0.25


class ModelTiming(_ModelBase):
    """`--timing model`: GPU work from the compute model, communication from the network model."""

    name = "model"

    def __init__(self, hw: HardwareConfig | str, source_hw: HardwareConfig | str | None = None):
        super().__init__()
        self._warned_gpus: set[str] = set()   # unknown source GPUs already named in a warning
        self.hw = get_hardware(hw)
        self.source_hw = get_hardware(source_hw) if source_hw is not None else None
        self.compute = ComputeModel(self.hw)
        self.network = NetworkModel(self.hw)

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        dur = graph.duration_us.astype(np.float64, copy=True)
        known_src = self.source_hw or source_hardware(graph)
        src = known_src or self.hw
        kept = []       # kernels the models cannot time: kept as recorded (scaled by peak ratio from a known GPU)
        gpu = graph.is_gpu()
        kinds = graph.kind
        # kernels that ran under communication in the recorded trace take the contended kernel models
        contention = (communication_contention(graph) if any(CONTENDED in k for k in self.hw.kernel_models)
                      else np.full(len(graph), "", object))
        for i in range(len(graph)):
            k = int(kinds[i])
            if k in _COMM_KINDS:
                t = comm_node_time(self.network, graph, i)
                if t is not None:
                    dur[i] = t
                continue
            if not _is_gpu_work(graph, i, k, gpu):
                continue  # CPU ops, launch calls, syncs: recorded host time
            est = self._estimate(self.compute, graph, i, contention[i])
            if est is not None:
                dur[i] = est.time_us
                continue
            kept.append(i)
            if src is not self.hw:
                cls = kernel_class(graph.name[i])
                dur[i] *= peak_ratio(src, self.hw, cls, self._dtype(graph, i))
        if kept:
            self._warn_kept_durations(graph, kept, gpu, known_src)
        return dur

    def _warn_kept_durations(self, graph: ExecutionGraph, kept: list[int], gpu: np.ndarray,
                             known_src: HardwareConfig | None) -> None:
        """Kernels whose work the models cannot tell (no input shapes, custom ops) keep their recorded
        durations, scaled by the peak ratio of the trace's GPU to the target. When that GPU is unknown they
        stay as recorded; when they are much of the kernel time (a trace recorded without shapes), model
        mode is mostly the trace's own timing. Either is told once per run and GPU name (the first rank's
        figures)."""
        names = recorded_device_names(graph.metadata)
        name = printable(names[0])[:80] if names else ""
        kernels = gpu & np.isin(graph.kind, [int(k) for k in _GPU_WORK])
        work = graph.duration_us[kernels].sum()
        share = graph.duration_us[kept].sum() / work if work > 0 else 0.0
        if name in self._warned_gpus or (known_src is not None and share < KEPT_SHARE_WARNING):
            return
        self._warned_gpus.add(name)
        from .api import graph_file
        where = graph_file(graph) or f"rank {graph.rank}"
        if known_src is None:
            trace_gpu = f"on '{name}', which no preset matches" if name else "on a GPU the trace does not name"
            log.warning("%s: %s GPU kernels (%.0f%% of the recorded kernel time) cannot be timed by the %s models "
                        "and keep their recorded durations unscaled: the trace ran %s; give that GPU's preset or "
                        "TOML with --source-hardware", where, f"{len(kept):,}", 100 * share, self.hw.name, trace_gpu)
            return
        how = "" if known_src is self.hw else f" (scaled by the {known_src.name} to {self.hw.name} peak ratio)"
        log.warning("%s: %s of %s GPU kernels (%.0f%% of the recorded kernel time) cannot be timed from their "
                    "ops' recorded shapes and arguments by the %s models (none recorded: record the trace with "
                    "record_shapes=True; or values no kernel has) and keep their recorded durations%s: model mode "
                    "is mostly the trace's own timing", where, f"{len(kept):,}",
                    f"{int(kernels.sum()):,}", 100 * share,
                    self.hw.name, how)

    def launch_latency_us(self, graph: ExecutionGraph) -> np.ndarray | None:
        """An idle GPU starts a kernel `kernel_start_after_call_us` after its launch call starts; the
        call's own (recorded) duration already elapses before the LAUNCH edge releases the kernel."""
        n = len(graph)
        lat = np.zeros(n)
        if n == 0:
            return lat
        after = self.hw.gpu.kernel_start_after_call_us
        counts = np.diff(graph.dep_ptr)
        dst = np.repeat(np.arange(n), counts)
        is_launch = graph.dep_kind == EdgeKind.LAUNCH
        d, s = dst[is_launch], graph.dep_src[is_launch]
        lat[d] = np.clip(after - graph.duration_us[s], 0.0, None)
        return lat


class TranslatedTiming(_ModelBase):
    """`--timing trace --hardware NAME`: recorded durations moved from `source_hw` to `target_hw`."""

    name = "translated"

    def __init__(self, source_hw: HardwareConfig | str | None, target_hw: HardwareConfig | str):
        super().__init__()
        self.target = get_hardware(target_hw)
        self.source = get_hardware(source_hw) if source_hw is not None else None
        self.target_compute = ComputeModel(self.target)
        self.network = NetworkModel(self.target)

    def _source_for(self, graph: ExecutionGraph) -> HardwareConfig:
        src = self.source or source_hardware(graph)
        if src is None:
            raise TraceInputError(graph.metadata.get("source_path") if graph.metadata else None,
                                  "cannot tell which GPU the trace was recorded on (no known device name in "
                                  "its metadata): name it explicitly as the source hardware")
        return src

    def scale_factors(self, graph: ExecutionGraph) -> np.ndarray:
        """Per node duration multiplier target/source (1.0 for host nodes and communication)."""
        src = self._source_for(graph)
        src_model = ComputeModel(src)
        f = np.ones(len(graph))
        gpu = graph.is_gpu()
        for i in range(len(graph)):
            k = int(graph.kind[i])
            if k in _COMM_KINDS or not _is_gpu_work(graph, i, k, gpu):
                continue
            a = self._estimate(src_model, graph, i)
            b = self._estimate(self.target_compute, graph, i)
            if a is not None and b is not None and a.time_us > 0:
                f[i] = b.time_us / a.time_us
            else:
                f[i] = peak_ratio(src, self.target, kernel_class(graph.name[i]), self._dtype(graph, i))
        return f

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        dur = graph.duration_us.astype(np.float64, copy=True) * self.scale_factors(graph)
        for i in np.flatnonzero(np.isin(graph.kind, [int(k) for k in _COMM_KINDS])):
            t = comm_node_time(self.network, graph, int(i))
            if t is not None:
                dur[i] = t
        return dur

    def launch_latency_us(self, graph: ExecutionGraph) -> np.ndarray | None:
        return recorded_gpu_latency(graph)
