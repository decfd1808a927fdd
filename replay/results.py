"""Results of a replay: per rank and step predicted vs measured time, breakdowns, critical path."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from chakra_schema.graph import ExecutionGraph, NodeType, OpKind, whole_trace_step
from replay.engine import SimulatedRun

_GPU_WORK = (int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET))
_COMM_KINDS = (int(OpKind.COLLECTIVE), int(OpKind.SEND), int(OpKind.RECV))
_COMM_TYPES = (int(NodeType.COMM_COLL_NODE), int(NodeType.COMM_SEND_NODE), int(NodeType.COMM_RECV_NODE))


@dataclass
class Breakdown:
    """Time in a window (us). On a GPU rank: compute = union of GPU kernel/copy time, comm = union of
    collective time, exposed_comm = comm not hidden under compute, idle = GPU doing nothing,
    launch_bound = GPU idle waiting for a launch the CPU had not issued yet (CPU/launch-bound time).
    On a CPU-only rank the same over host ops."""

    window_us: float = 0.0
    compute_us: float = 0.0
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0
    idle_us: float = 0.0
    launch_bound_us: float = 0.0

    def add(self, other: "Breakdown") -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


@dataclass
class StepResult:
    rank: int
    name: str
    predicted_us: float
    measured_us: float | None
    start_us: float
    breakdown: Breakdown
    critical_path: dict[str, float] = field(default_factory=dict)   # category -> share of the step
    critical_nodes: list[str] = field(default_factory=list)         # names of the longest path's top nodes

    @property
    def error(self) -> float | None:
        if not self.measured_us:
            return None
        return (self.predicted_us - self.measured_us) / self.measured_us


@dataclass
class ReplayResult:
    steps: list[StepResult]
    ranks: dict[int, Breakdown]
    timing: str
    num_nodes: int
    run: SimulatedRun | None = None

    @property
    def step_time_us(self) -> float:
        """Mean over step names of the slowest rank's predicted step time."""
        by_name: dict[str, float] = {}
        for s in self.steps:
            by_name[s.name] = max(by_name.get(s.name, 0.0), s.predicted_us)
        return float(np.mean(list(by_name.values()))) if by_name else 0.0

    def errors(self) -> list[float]:
        return [abs(s.error) for s in self.steps if s.error is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "timing": self.timing,
            "num_nodes": self.num_nodes,
            "step_time_us": self.step_time_us,
            "steps": [{"rank": s.rank, "name": s.name, "predicted_us": s.predicted_us,
                       "measured_us": s.measured_us, "error": s.error,
                       "breakdown": asdict(s.breakdown), "critical_path": s.critical_path,
                       "critical_nodes": s.critical_nodes} for s in self.steps],
            "ranks": {str(r): asdict(b) for r, b in self.ranks.items()},
        }


def _union_length(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> float:
    """Length of the union of intervals clipped to [lo, hi]."""
    if len(starts) == 0:
        return 0.0
    s = np.clip(starts, lo, hi)
    e = np.clip(ends, lo, hi)
    keep = e > s
    if not keep.any():
        return 0.0
    s, e = s[keep], e[keep]
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # a new block starts where an interval begins after everything before it ended
    new_block = np.empty(len(s), bool)
    new_block[0] = True
    new_block[1:] = s[1:] > run_end[:-1]
    block_ids = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.zeros(len(block_start))
    np.maximum.at(block_end, block_ids, e)
    return float(np.sum(block_end - block_start))


def _breakdown(g: ExecutionGraph, run: SimulatedRun, r: int, lo: float, hi: float) -> Breakdown:
    sl = run.rank_slice(r)
    start, end = run.start[sl], run.end[sl]
    gpu = g.is_gpu()
    kind = g.kind
    comm = np.isin(g.node_type, _COMM_TYPES)
    if gpu.any():
        work = gpu & ~comm
        comm_m = gpu & comm
    else:  # CPU-only rank (e.g. gloo): host ops are the work
        work = (kind == OpKind.CPU_OP) & (g.parent == -1) & ~comm
        comm_m = comm
    window = max(hi - lo, 0.0)
    compute = _union_length(start[work], end[work], lo, hi)
    comm_t = _union_length(start[comm_m], end[comm_m], lo, hi)
    busy = _union_length(start[work | comm_m], end[work | comm_m], lo, hi)
    b = Breakdown(window_us=window, compute_us=compute, comm_us=comm_t, exposed_comm_us=max(busy - compute, 0.0),
                  idle_us=max(window - busy, 0.0))
    if gpu.any():
        # GPU idle before an op whose start was set by its launch call: the CPU was the bottleneck
        code = run.bound_by[sl]
        bound = np.where(code >= 0, code // 2 - run.offsets[r], -1)
        idx = np.flatnonzero(gpu & (bound >= 0) & (bound < len(g)))
        if len(idx):
            launch_bound = kind[bound[idx]] == OpKind.LAUNCH
            idx = idx[launch_bound]
            res = g.resource[idx]
            prev_end = np.full(len(idx), lo)
            # idle = from the previous op on the stream (or window start) to this op's start
            for k, rs in enumerate(np.unique(res)):
                on = g.nodes_on(int(rs))
                pos = np.searchsorted(on, idx[res == rs])
                pe = np.where(pos > 0, end[on[np.maximum(pos - 1, 0)]], lo)
                prev_end[res == rs] = pe
            st = np.clip(start[idx], lo, hi)
            b.launch_bound_us = float(np.sum(np.clip(st - np.clip(prev_end, lo, hi), 0, None)))
    return b


def _category(kind: int, node_type: int) -> str:
    if node_type in _COMM_TYPES or kind in _COMM_KINDS:
        return "communication"
    if kind in _GPU_WORK:
        return "gpu_compute"
    if kind in (int(OpKind.LAUNCH), int(OpKind.RUNTIME), int(OpKind.EVENT_RECORD), int(OpKind.STREAM_WAIT)):
        return "cuda_runtime"
    if kind in (int(OpKind.SYNC), int(OpKind.COLL_WAIT)):
        return "sync_wait"
    return "cpu"


def critical_path(run: SimulatedRun, r: int, lo: float, hi: float, step_node: int = -1
                  ) -> tuple[dict[str, float], list[str]]:
    """Walk back from the end of the window along the marks that set each start and end (see
    SimulatedRun.bound_by). Each stretch of time is charged to the node whose start or end it led to.
    Returns the share of the window per category and the names of the five nodes charged the most."""
    sl = run.rank_slice(r)
    if step_node >= 0:
        code = 2 * (sl.start + step_node) + 1
    else:
        ends = run.end[sl]
        if len(ends) == 0:
            return {}, []
        code = 2 * (sl.start + int(np.argmax(ends))) + 1
    share: dict[str, float] = {}
    per_node: dict[str, float] = {}
    graphs, offsets = run.graphs, run.offsets
    guard = 0
    while code >= 0 and guard < 50_000_000:
        guard += 1
        node, is_end = divmod(code, 2)
        t = float(run.end[node] if is_end else run.start[node])
        prev = int(run.bound_end[node] if is_end else run.bound_by[node])
        if prev < 0:
            t_prev = lo
        else:
            pn, pe = divmod(prev, 2)
            t_prev = float(run.end[pn] if pe else run.start[pn])
        seg = min(t, hi) - max(t_prev, lo)
        if seg > 0:
            rr = int(np.searchsorted(offsets, node, side="right") - 1)
            g = graphs[rr]
            li = node - int(offsets[rr])
            cat = _category(int(g.kind[li]), int(g.node_type[li]))
            # time before a start mark is the gap the thread or stream spent getting there
            if not is_end:
                cat = "cpu" if not g.resources[int(g.resource[li])].is_gpu else "gpu_wait"
            share[cat] = share.get(cat, 0.0) + seg
            per_node[g.name[li]] = per_node.get(g.name[li], 0.0) + seg
        if t_prev <= lo or prev == code:
            break
        code = prev
    window = max(hi - lo, 1e-9)
    top = sorted(per_node.items(), key=lambda kv: -kv[1])[:5]
    return {k: v / window for k, v in share.items()}, [k for k, _ in top]


def summarize(run: SimulatedRun, with_critical_path: bool = True) -> ReplayResult:
    steps: list[StepResult] = []
    ranks: dict[int, Breakdown] = {}
    for r, g in enumerate(run.graphs):
        sl = run.rank_slice(r)
        total = Breakdown()
        g_steps = g.steps or [whole_trace_step(g)]
        for step in g_steps:
            if step.node >= 0:
                lo = float(run.start[sl.start + step.node])
                hi = float(run.end[sl.start + step.node])
            else:
                lo = float(run.start[sl].min()) if len(g) else 0.0
                hi = float(run.end[sl].max()) if len(g) else 0.0
            measured = step.duration_us if step.duration_us > 0 else None
            b = _breakdown(g, run, r, lo, hi)
            total.add(b)
            cp, nodes = critical_path(run, r, lo, hi, step.node) if with_critical_path else ({}, [])
            steps.append(StepResult(rank=g.rank, name=step.name, predicted_us=hi - lo, measured_us=measured,
                                    start_us=lo, breakdown=b, critical_path=cp, critical_nodes=nodes))
        ranks[g.rank] = total
    return ReplayResult(steps=steps, ranks=ranks, timing=run.timing_name, num_nodes=int(run.offsets[-1]), run=run)
