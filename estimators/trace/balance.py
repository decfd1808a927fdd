"""Trace what-if: one rank (or several) made as fast as the others.

A data-parallel job runs at the pace of its slowest rank: a rank with more data, a slower CPU/GPU or a
noisy neighbour makes every other rank wait in the gradient collectives. `balance_ranks` answers "how
fast would the job be if the slow rank computed like the others?" on a converted trace:

1. each rank's compute is the recorded time of its compute ops (GPU kernels/copies on a GPU rank; on a
   CPU-only rank the self time of its host ops; communication, waits, syncs, runtime calls and
   annotations are not compute);
2. the target is the median compute of the ranks (the typical rank); a rank whose compute is more than
   `threshold` above it (or every rank named in `ranks`) gets its compute scaled by target / its
   compute: `scale_compute` warps a CPU rank's recorded timeline (compute intervals shrink, the rest
   keeps its length), `ScaledCompute` scales GPU kernels (a timing source over the trace's own timing);
3. both the recorded job and the edited one are replayed on the recorded clock; the result compares their
   job-level step times (first rank's step start to last rank's step end, steady state).

Overhead outside compute ops (Python, the framework's own gaps) does not shrink with the data, the
collectives keep their recorded transfer times; only the compute the rank did more than the others goes.
`scale_compute` and `ScaledCompute` take any factor, so other what-ifs (a 20% slower GPU on rank 7) reuse them.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import ExecutionGraph, NodeType, OpKind
from estimators.trace.evaluate import TraceWhatIf

_GPU_WORK = (int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET))
_COMM_TYPES = (int(NodeType.COMM_COLL_NODE), int(NodeType.COMM_SEND_NODE), int(NodeType.COMM_RECV_NODE))
_RECORDED_DURATIONS = "whatif_recorded_duration_us"


def compute_nodes(g: ExecutionGraph) -> np.ndarray:
    """bool [N]: the nodes whose time is the rank's compute: host ops (CPU_OP kind, not communication)
    on a CPU-only rank, GPU kernels/copies/memsets on a rank with GPU work."""
    comm = np.isin(g.node_type, _COMM_TYPES)
    gpu_work = np.isin(g.kind, _GPU_WORK) & ~comm
    if gpu_work.any():
        return gpu_work
    return (g.kind == OpKind.CPU_OP) & ~comm


def _has_gpu_work(g: ExecutionGraph) -> bool:
    return bool(np.isin(g.kind, _GPU_WORK).any())


def compute_intervals(g: ExecutionGraph) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals (starts, ends) of recorded time a CPU-only rank spent computing: where
    a thread's innermost open op is a compute op (its self time: a parent's time outside its children,
    a leaf's whole time). Annotations (ProfilerStep) and waits are not compute."""
    from replay.engine import _thread_marks
    from replay.results import union_intervals

    compute = compute_nodes(g)
    end = g.start_us + g.duration_us
    lo: list[float] = []
    hi: list[float] = []
    for r, res in enumerate(g.resources):
        if res.is_gpu:
            continue
        idx = g.nodes_on(r)
        if len(idx) == 0:
            continue
        idx = idx[np.argsort(g.start_us[idx], kind="stable")]
        stack: list[int] = []
        t_prev = None
        for code in _thread_marks(g.start_us[idx], end[idx], idx):
            i = code >> 1
            t = float(end[i] if code & 1 else g.start_us[i])
            if stack and compute[stack[-1]] and t_prev is not None and t > t_prev:
                lo.append(t_prev)
                hi.append(t)
            if code & 1:
                if stack and stack[-1] == i:
                    stack.pop()
            else:
                stack.append(i)
            t_prev = t
    return union_intervals(np.asarray(lo, float), np.asarray(hi, float))


def _step_window(g: ExecutionGraph) -> tuple[float, float]:
    if g.steps and all(s.node >= 0 for s in g.steps):
        return min(s.start_us for s in g.steps), max(s.start_us + s.duration_us for s in g.steps)
    return -np.inf, np.inf


def compute_us(g: ExecutionGraph) -> float:
    """The rank's recorded compute time (us) over its profiled steps (the whole trace without steps)."""
    lo, hi = _step_window(g)
    if _has_gpu_work(g):
        sel = compute_nodes(g) & (g.start_us >= lo) & (g.start_us < hi)
        return float(g.duration_us[sel].sum())
    s, e = compute_intervals(g)
    return float(np.sum(np.clip(e, lo, hi) - np.clip(s, lo, hi)))


def scale_compute(g: ExecutionGraph, factor: float) -> ExecutionGraph:
    """The rank with its CPU compute `factor` x as long: the recorded timeline of every thread is warped
    so that compute intervals (`compute_intervals`) shrink or stretch by `factor` and everything else
    (overhead, waits) keeps its length; marks keep their order. Communication nodes keep their recorded
    durations through `ScaledCompute`. A rank with GPU work is returned as is: `ScaledCompute` scales its
    kernels' durations, which the replay takes from the timing source."""
    if factor == 1.0 or _has_gpu_work(g) or not g.start_us.any():
        return g
    s, e = compute_intervals(g)
    if len(s) == 0:
        return g
    # compute time before t, piecewise linear over the interval edges
    xp = np.column_stack([s, e]).ravel()
    fp = np.column_stack([np.cumsum(e - s) - (e - s), np.cumsum(e - s)]).ravel()

    def warp(t: np.ndarray) -> np.ndarray:
        return t - (1.0 - factor) * np.interp(t, xp, fp, left=0.0, right=float(fp[-1]))

    start = warp(g.start_us)
    end = warp(g.start_us + g.duration_us)
    steps = []
    for st in g.steps:
        a = float(warp(np.array([st.start_us]))[0])
        b = float(warp(np.array([st.start_us + st.duration_us]))[0])
        steps.append(replace(st, start_us=a, duration_us=b - a))
    meta = dict(g.metadata)
    meta["whatif_compute_scale"] = factor
    meta[_RECORDED_DURATIONS] = g.duration_us
    return replace(g, start_us=start, duration_us=end - start, steps=steps, metadata=meta)


class ScaledCompute:
    """A timing source over `base`: on each listed rank with GPU work, the compute nodes' durations x its
    factor; on every rank edited by `scale_compute`, communication nodes keep their recorded durations
    (the warp moved their marks, not their transfers). Collectives and launch latencies are `base`'s."""

    def __init__(self, base, factors: Mapping[int, float]):
        self.base = base
        self.factors = {int(r): float(f) for r, f in factors.items()}
        self.name = f"{getattr(base, 'name', 'trace')}+scaled-compute"

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        dur = np.asarray(self.base.node_durations(graph), np.float64).copy()
        recorded = graph.metadata.get(_RECORDED_DURATIONS)
        if recorded is not None:
            comm = np.isin(graph.node_type, _COMM_TYPES)
            dur[comm] = np.asarray(recorded)[comm]
        f = self.factors.get(graph.rank)
        if f is not None and f != 1.0 and _has_gpu_work(graph):
            dur[compute_nodes(graph)] *= f
        return dur

    def collective_us(self, graph: ExecutionGraph, node: int, group_ranks: Sequence[int],
                      member_durations: Sequence[float]) -> float:
        return self.base.collective_us(graph, node, group_ranks, member_durations)

    def launch_latency_us(self, graph: ExecutionGraph):
        return self.base.launch_latency_us(graph)


def balance_factors(graphs: Sequence[ExecutionGraph], ranks: Sequence[int] | None = None,
                    threshold: float = 0.05) -> tuple[dict[int, float], dict[int, float]]:
    """(factor per rank to scale, compute us per rank). The target is the median compute over the ranks;
    `ranks` names the ranks to bring to it (default: every rank more than `threshold` above it)."""
    compute = {g.rank: compute_us(g) for g in graphs}
    target = float(np.median(list(compute.values())))
    if target <= 0:
        raise TraceInputError(None, "the traces hold no compute ops to balance")
    known = set(compute)
    if ranks is not None:
        missing = sorted(set(int(r) for r in ranks) - known)
        if missing:
            raise TraceInputError(None, f"rank {missing[0]} is not among the replayed ranks {sorted(known)}")
        chosen = [int(r) for r in ranks]
    else:
        chosen = [r for r, c in compute.items() if c > target * (1 + threshold)]
    return {r: target / compute[r] for r in chosen if compute[r] > 0}, compute


def balance_ranks(graphs: Sequence[ExecutionGraph], ranks: Sequence[int] | None = None, threshold: float = 0.05,
                  timing: Any = None, progress: Callable[[int, int], None] | None = None) -> TraceWhatIf:
    """Replay the job as recorded and with the slow ranks' compute brought to the median rank's; the
    step times compared are job-level (first rank's step start to last rank's step end, steady state)."""
    from replay.api import replay
    from replay.trace_timing import TraceTiming

    graphs = list(graphs)
    if len(graphs) < 2:
        raise TraceInputError(None, "balancing ranks needs the traces of at least two ranks")
    base = timing or TraceTiming()
    factors, compute = balance_factors(graphs, ranks, threshold)
    baseline = replay(graphs, base, critical_path=False)
    notes = [baseline.alignment.note] if baseline.alignment and baseline.alignment.note else []
    if not factors:
        notes.append(f"no rank computes more than {100 * threshold:.0f}% above the median: nothing to balance")
    edited = [scale_compute(g, factors[g.rank]) if g.rank in factors else g for g in graphs]
    result = replay(edited, ScaledCompute(base, factors), progress=progress, critical_path=False)
    changes = {"balanced_ranks": {str(r): f"compute x {f:.3f} ({compute[r] / 1000:.1f} -> "
                                          f"{compute[r] * f / 1000:.1f} ms)" for r, f in factors.items()}}
    return TraceWhatIf(baseline.job_step_time_us, result.job_step_time_us, changes, notes, result)
