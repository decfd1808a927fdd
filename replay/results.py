"""Results of a replay: per rank and step predicted vs measured time, breakdowns, critical path."""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from chakra_schema.graph import ExecutionGraph, NodeType, OpKind, whole_trace_step
from replay.engine import SimulatedRun

log = logging.getLogger(__name__)

_GPU_WORK = (int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET))
_COMM_KINDS = (int(OpKind.COLLECTIVE), int(OpKind.SEND), int(OpKind.RECV))
_COMM_TYPES = (int(NodeType.COMM_COLL_NODE), int(NodeType.COMM_SEND_NODE), int(NodeType.COMM_RECV_NODE))


COMM_KINDS = ("tp", "cp", "ep", "pp", "dp")


@dataclass
class Breakdown:
    """Time in a window, in microseconds: the one breakdown type of replays and every what-if estimate.

    On a GPU rank: compute = union of GPU kernel/copy time, comm = union of collective time,
    exposed_comm = comm not hidden under compute, idle = GPU doing nothing (in a generated training
    step: the pipeline bubble and waits), launch_bound = the part of idle where the GPU waits for a launch
    the CPU had not issued yet (CPU/launch-bound time; replays). host_wait = in a generated training step,
    the GPU waiting for a host blocked on a device-to-host sync (MoE token counts), apart from idle:
    compute + exposed_comm + host_wait + idle = window. On a CPU-only rank the same over host ops.
    `exposed_<kind>_comm_us` splits exposed_comm by parallelism (tensor, context, expert, pipeline, data) where the workload says
    which collective serves which (generated workloads); a replayed trace leaves them 0."""

    window_us: float = 0.0
    compute_us: float = 0.0
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0
    idle_us: float = 0.0
    launch_bound_us: float = 0.0
    host_wait_us: float = 0.0
    exposed_tp_comm_us: float = 0.0
    exposed_cp_comm_us: float = 0.0
    exposed_ep_comm_us: float = 0.0
    exposed_pp_comm_us: float = 0.0
    exposed_dp_comm_us: float = 0.0

    def add(self, other: "Breakdown") -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def scaled(self, factor: float) -> "Breakdown":
        return Breakdown(**{k: v * factor for k, v in asdict(self).items()})

    @staticmethod
    def mean(items: "list[Breakdown]") -> "Breakdown":
        total = Breakdown()
        for b in items:
            total.add(b)
        return total.scaled(1.0 / len(items)) if items else total

    @property
    def idle_fraction(self) -> float:
        return self.idle_us / self.window_us if self.window_us > 0 else 0.0

    def exposed_comm_by_kind_us(self) -> dict[str, float]:
        return {k: getattr(self, f"exposed_{k}_comm_us") for k in COMM_KINDS}

    def settle_by_kind(self) -> None:
        """For a breakdown filled in by parallelism kind (generated workloads): exposed_comm is the sum of
        the kinds, idle the rest of the window (compute + exposed_comm + host_wait + idle = window)."""
        self.exposed_comm_us = sum(self.exposed_comm_by_kind_us().values())
        self.idle_us = max(self.window_us - self.compute_us - self.exposed_comm_us - self.host_wait_us, 0.0)

    def to_json(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class StepResult:
    rank: int
    name: str
    predicted_us: float
    measured_us: float | None
    start_us: float
    breakdown: Breakdown
    measured_start_us: float | None = None  # recorded step start in the replay's time frame
    critical_path: dict[str, float] = field(default_factory=dict)   # category -> share of the step
    critical_nodes: list[str] = field(default_factory=list)         # names of the longest path's top nodes

    @property
    def error(self) -> float | None:
        if not self.measured_us:
            return None
        return (self.predicted_us - self.measured_us) / self.measured_us


@dataclass
class JobStep:
    """One step of the whole job: from the first rank's step start to the last rank's step end
    (predicted, and measured when the ranks were replayed on their recorded clock)."""

    name: str
    start_us: float
    predicted_us: float
    measured_us: float | None
    ranks: int

    @property
    def error(self) -> float | None:
        if not self.measured_us:
            return None
        return (self.predicted_us - self.measured_us) / self.measured_us


def steady_state(values: list[float]) -> float:
    """Mean over the steps after the first (the first often holds one-off work), or the only step."""
    tail = values[1:] if len(values) > 1 else values
    return float(np.mean(tail)) if tail else 0.0


def _pair_uneven(by_rank: dict, by_name: dict, names: dict) -> tuple[dict, str]:
    """Job steps of ranks holding different numbers of steps (a rank lost a marker, or profiled fewer): by
    name where same-named steps overlap in recorded time, else each step with the step of the rank holding
    the most that it overlaps most (when no two steps of a rank land on one); a note either way."""
    few, many = min(names, key=lambda r: len(names[r])), max(names, key=lambda r: len(names[r]))
    held = (f"rank {few}: {len(names[few])}, {names[few][0]}..{names[few][-1]}; rank {many}: {len(names[many])}, "
            f"{names[many][0]}..{names[many][-1]}")
    if not _share_time(by_name.values()):
        timed = _pair_by_time(by_rank, many)
        if timed is not None:
            return timed, (f"ranks hold different steps and steps of one name do not overlap in recorded time "
                           f"({held}): job steps pair the steps that overlap, named as on rank {many}")
    return by_name, f"ranks hold different steps ({held}): job steps pair them by name, so some hold only some ranks"


def _pair_by_time(by_rank: dict, anchor: int) -> dict | None:
    """Each step with the step of rank `anchor` it overlaps most on the recorded clock; None when a step has
    no recorded time, overlaps none, or shares its anchor step with another step of its rank."""
    if not all(_timed(steps) for steps in by_rank.values()):
        return None
    anchors = by_rank[anchor]
    lo = np.array([s.measured_start_us for s in anchors])
    hi = lo + np.array([s.measured_us for s in anchors])
    labels = _step_labels([s.name for s in anchors])
    groups = {labels[k]: [s] for k, s in enumerate(anchors)}
    for r, steps in by_rank.items():
        if r == anchor:
            continue
        taken = set()
        for s in steps:
            shared = np.minimum(hi, s.measured_start_us + s.measured_us) - np.maximum(lo, s.measured_start_us)
            k = int(np.argmax(shared))
            if shared[k] <= 0 or k in taken:
                return None
            taken.add(k)
            groups[labels[k]].append(s)
    return groups


def _timed(steps) -> bool:
    return all(s.measured_start_us is not None and s.measured_us for s in steps)


def _step_labels(names: list[str]) -> list[str]:
    """Job step names: a rank's step names, numbered where they repeat ("step 2 (ProfilerStep#2)")."""
    return names if len(set(names)) == len(names) else [f"step {k + 1} ({n})" for k, n in enumerate(names)]


def _share_time(groups) -> bool:
    """Every group's steps overlap on the recorded clock (False when a step has no recorded time)."""
    for steps in groups:
        if not _timed(steps):
            return False
        if max(s.measured_start_us for s in steps) >= min(s.measured_start_us + s.measured_us for s in steps):
            return False
    return True


@dataclass
class ReplayResult:
    steps: list[StepResult]
    ranks: dict[int, Breakdown]
    timing: str
    num_nodes: int
    run: SimulatedRun | None = None
    inference: list = field(default_factory=list)   # (rank, et_kernels.InferenceReport) per ET-only rank

    def job_step_groups(self) -> tuple[dict[str, list[StepResult]], str | None]:
        """The ranks' steps grouped into job steps, by name. When every rank holds as many steps but the names
        do not pair them - they share nothing (the profiler began at another iteration on some rank:
        ProfilerStep#12-14 beside #2-4), or, on the recorded clock, steps of one name do not overlap in time
        while each rank's k-th steps do (#3-5 beside #2-4 over the same iterations; one name for every step) -
        they pair by order, under the lowest rank's names, with a note saying so."""
        by_rank: dict[int, list[StepResult]] = {}
        for s in self.steps:
            by_rank.setdefault(s.rank, []).append(s)
        for steps in by_rank.values():
            steps.sort(key=lambda s: s.start_us)
        by_name: dict[str, list[StepResult]] = {}
        for s in self.steps:
            by_name.setdefault(s.name, []).append(s)
        names = {r: [s.name for s in v] for r, v in by_rank.items()}
        if len({len(v) for v in names.values()}) > 1:
            return _pair_uneven(by_rank, by_name, names)
        if not names:
            return by_name, None
        first = min(names)
        differ = [r for r in names if names[r] != names[first]]
        disjoint = all(not set(names[r]) & set(names[first]) for r in differ)
        labels = _step_labels(names[first])
        by_order: dict[str, list[StepResult]] = {}
        for steps in by_rank.values():
            for k, s in enumerate(steps):
                by_order.setdefault(labels[k], []).append(s)
        if differ and disjoint and all(len(set(v)) == len(v) for v in names.values()):
            why = "ranks name their steps differently"
        elif _share_time(by_order.values()) and not _share_time(by_name.values()):
            why = "steps of one name do not overlap in recorded time"
        else:
            return by_name, None
        shown = [differ[0], first] if differ else [first]
        seen = ", ".join(f"rank {r}: {names[r][0]}..{names[r][-1]}" for r in shown)
        return by_order, f"{why} ({seen}): job steps pair each rank's k-th step, named as on rank {first}"

    @property
    def step_pairing_note(self) -> str | None:
        """Why job steps pair the ranks' steps by order, or hold only some ranks (None when the names match)."""
        return self.job_step_groups()[1]

    @property
    def job_steps(self) -> list[JobStep]:
        """Job-level steps, one per step name (see `job_step_groups`), in order of their start."""
        out = []
        for name, steps in self.job_step_groups()[0].items():
            lo = min(s.start_us for s in steps)
            hi = max(s.start_us + s.predicted_us for s in steps)
            measured = None
            if _timed(steps):
                m_lo = min(s.measured_start_us for s in steps)
                measured = max(s.measured_start_us + s.measured_us for s in steps) - m_lo
            out.append(JobStep(name, lo, hi - lo, measured, len(steps)))
        return sorted(out, key=lambda j: j.start_us)

    @property
    def job_step_time_us(self) -> float:
        """Steady-state job step time (see `steady_state`), predicted."""
        return steady_state([j.predicted_us for j in self.job_steps])

    @property
    def measured_job_step_time_us(self) -> float | None:
        jobs = self.job_steps
        if not jobs or any(j.measured_us is None for j in jobs):
            return None
        return steady_state([j.measured_us for j in jobs])

    @property
    def alignment(self):
        return self.run.alignment if self.run is not None else None

    @property
    def step_time_us(self) -> float:
        """Mean over job steps (step names, `job_step_groups`) of the slowest rank's predicted step time."""
        slowest = [max(s.predicted_us for s in steps) for steps in self.job_step_groups()[0].values()]
        return float(np.mean(slowest)) if slowest else 0.0

    def errors(self) -> list[float]:
        return [abs(s.error) for s in self.steps if s.error is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "timing": self.timing,
            "num_nodes": self.num_nodes,
            **({"inferred_from_et": [{"rank": r, **rep.to_json()} for r, rep in self.inference]}
               if self.inference else {}),
            "step_time_us": self.step_time_us,
            "job_step_time_us": self.job_step_time_us,
            # two step times, two questions: what a rank's step costs, what the job's steady state does
            "definitions": {"step_time_us": "mean over step names of the slowest rank's predicted step time",
                            "job_step_time_us": "mean over the job's steps after the first (the first holds "
                                                "one-off work) of first rank start to last rank end"},
            "measured_job_step_time_us": self.measured_job_step_time_us,
            "alignment": asdict(self.alignment) if self.alignment is not None else None,
            "step_pairing_note": self.step_pairing_note,
            "job_steps": [{"name": j.name, "start_us": j.start_us, "predicted_us": j.predicted_us,
                           "measured_us": j.measured_us, "error": j.error, "ranks": j.ranks} for j in self.job_steps],
            "steps": [{"rank": s.rank, "name": s.name, "start_us": s.start_us, "predicted_us": s.predicted_us,
                       "measured_us": s.measured_us, "measured_start_us": s.measured_start_us, "error": s.error,
                       "breakdown": asdict(s.breakdown), "critical_path": s.critical_path,
                       "critical_nodes": s.critical_nodes} for s in self.steps],
            "ranks": {str(r): asdict(b) for r, b in self.ranks.items()},
        }


def add_uncovered(cover_s: np.ndarray, cover_e: np.ndarray, starts: np.ndarray,
                  ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Merge intervals into a cover (disjoint blocks, as `union_intervals` returns): the new cover and how
    much time the intervals added where the cover had none (us). Breakdowns charge each part this way, in
    order, so that time two parts share is counted once, for the first."""
    before = float(np.sum(cover_e - cover_s))
    us, ue = union_intervals(np.concatenate([cover_s, starts]), np.concatenate([cover_e, ends]))
    return us, ue, float(np.sum(ue - us)) - before


def union_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as disjoint sorted blocks (block starts, block ends)."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if len(s) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # a new block starts where an interval begins after everything before it ended
    new_block = np.empty(len(s), bool)
    new_block[0] = True
    new_block[1:] = s[1:] > run_end[:-1]
    block_ids = np.cumsum(new_block) - 1
    block_end = np.zeros(int(new_block.sum()))
    np.maximum.at(block_end, block_ids, e)
    return s[new_block], block_end


def _union_length(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> float:
    """Length of the union of intervals clipped to [lo, hi]."""
    bs, be = union_intervals(np.clip(starts, lo, hi), np.clip(ends, lo, hi))
    return float(np.sum(be - bs))


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
        work = (kind == OpKind.CPU_OP) & ~comm  # nested ops overlap their parents: the union counts once
        comm_m = comm
    window = max(hi - lo, 0.0)
    compute = _union_length(start[work], end[work], lo, hi)
    comm_t = _union_length(start[comm_m], end[comm_m], lo, hi)
    busy = _union_length(start[work | comm_m], end[work | comm_m], lo, hi)
    b = Breakdown(window_us=window, compute_us=compute, comm_us=comm_t, exposed_comm_us=max(busy - compute, 0.0),
                  idle_us=max(window - busy, 0.0))
    if gpu.any():
        b.launch_bound_us = _launch_bound(g, run, r, start, end, gpu, lo, hi)
    return b


def _launch_bound(g: ExecutionGraph, run: SimulatedRun, r: int, start: np.ndarray, end: np.ndarray,
                  gpu: np.ndarray, lo: float, hi: float) -> float:
    """GPU idle time (no stream busy) that ends with an op whose start was set by its launch call:
    the GPU waited for the CPU to issue work."""
    idx = np.flatnonzero(gpu & (end > lo) & (start < hi))
    if len(idx) == 0:
        return 0.0
    idx = idx[np.argsort(start[idx], kind="stable")]
    s, e = np.clip(start[idx], lo, hi), np.clip(end[idx], lo, hi)
    run_end = np.maximum.accumulate(e)
    prev_end = np.concatenate([[lo], run_end[:-1]])
    gap = s - prev_end
    starts_block = gap > 0
    if not starts_block.any():
        return 0.0
    code = run.bound_by[run.offsets[r] + idx[starts_block]]
    local = np.where(code >= 0, code // 2 - run.offsets[r], -1)
    ok = (local >= 0) & (local < len(g))
    by_launch = np.zeros(len(local), bool)
    by_launch[ok] = g.kind[local[ok]] == OpKind.LAUNCH
    return float(np.sum(gap[starts_block][by_launch]))


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


@dataclass
class _PathColumns:
    """Global per-node columns as Python lists, built once per run for the critical-path walks."""

    start: list[float]
    end: list[float]
    bound_by: list[int]
    bound_end: list[int]
    category: list[str]
    on_gpu: list[bool]
    name: list[str]

    @classmethod
    def of(cls, run: SimulatedRun) -> "_PathColumns":
        cats: list[str] = []
        gpu: list[bool] = []
        names: list[str] = []
        for g in run.graphs:
            cats.extend(_category(int(k), int(t)) for k, t in zip(g.kind.tolist(), g.node_type.tolist()))
            gpu.extend(g.is_gpu().tolist())
            names.extend(g.name)
        return cls(run.start.tolist(), run.end.tolist(), run.bound_by.tolist(), run.bound_end.tolist(), cats,
                   gpu, names)


def critical_path(run: SimulatedRun, r: int, lo: float, hi: float, step_node: int = -1,
                  cols: _PathColumns | None = None) -> tuple[dict[str, float], list[str]]:
    """Walk back from the end of the window along the marks that set each start and end (see
    SimulatedRun.bound_by). Each stretch of time is charged to the node whose start or end it led to;
    the stretch before a start is the thread's own work (cpu) or a GPU op's launch latency (gpu_wait).
    Returns the share of the window per category and the names of the five nodes charged the most."""
    cols = cols or _PathColumns.of(run)
    sl = run.rank_slice(r)
    if step_node >= 0:
        code = 2 * (sl.start + step_node) + 1
    else:
        if sl.stop == sl.start:
            return {}, []
        code = 2 * (sl.start + int(np.argmax(run.end[sl]))) + 1
    start, end, bound_by, bound_end = cols.start, cols.end, cols.bound_by, cols.bound_end
    share: dict[str, float] = {}
    per_node: dict[str, float] = {}
    for _ in range(4 * len(start) + 2):  # every mark is visited at most once per walk
        node = code >> 1
        if code & 1:
            t, prev = end[node], bound_end[node]
            cat = cols.category[node]
        else:
            t, prev = start[node], bound_by[node]
            cat = "gpu_wait" if cols.on_gpu[node] else "cpu"
        t_prev = lo if prev < 0 else (end[prev >> 1] if prev & 1 else start[prev >> 1])
        seg = min(t, hi) - max(t_prev, lo)
        if seg > 0:
            share[cat] = share.get(cat, 0.0) + seg
            nm = cols.name[node]
            per_node[nm] = per_node.get(nm, 0.0) + seg
        if t_prev <= lo or prev == code or prev < 0:
            break
        code = prev
    window = max(hi - lo, 1e-9)
    top = sorted(per_node.items(), key=lambda kv: -kv[1])[:5]
    return {k: v / window for k, v in share.items()}, [k for k, _ in top]


def summarize(run: SimulatedRun, with_critical_path: bool = True) -> ReplayResult:
    steps: list[StepResult] = []
    ranks: dict[int, Breakdown] = {}
    cols = _PathColumns.of(run) if with_critical_path else None
    for r, g in enumerate(run.graphs):
        sl = run.rank_slice(r)
        total = Breakdown()
        g_steps = g.steps or [whole_trace_step(g)]
        for k, step in enumerate(g_steps):
            if step.node >= 0 and g.duration_us[step.node] <= 0:
                # an annotation that recorded no span (Chakra's early converter wrote ProfilerStep nodes
                # with zero duration): its step runs until the next step starts, the last one to the end
                lo = float(run.start[sl.start + step.node])
                nxt = g_steps[k + 1].node if k + 1 < len(g_steps) else -1
                hi = float(run.start[sl.start + nxt]) if nxt >= 0 else float(run.end[sl].max())
                log.warning("%s: %s records no duration; its step spans until %s",
                            g.metadata.get("source", "the trace"), step.name,
                            g_steps[k + 1].name if nxt >= 0 else "the end of the trace")
            elif step.node >= 0:
                lo = float(run.start[sl.start + step.node])
                hi = float(run.end[sl.start + step.node])
            else:
                lo = float(run.start[sl].min()) if len(g) else 0.0
                hi = float(run.end[sl].max()) if len(g) else 0.0
            # a graph with no recorded timeline (a foreign or generated .et) has nothing measured
            recorded = step.node >= 0 or bool(g.start_us.any())
            measured = step.duration_us if step.duration_us > 0 and recorded else None
            # recorded start in the replay's frame: comparable across ranks when they kept their offsets
            comparable = recorded and (len(run.graphs) == 1 or run.alignment.used == "recorded")
            measured_start = step.start_us - float(run.origin_us[r]) if comparable else None
            b = _breakdown(g, run, r, lo, hi)
            total.add(b)
            cp, nodes = critical_path(run, r, lo, hi, step.node, cols) if with_critical_path else ({}, [])
            steps.append(StepResult(rank=g.rank, name=step.name, predicted_us=hi - lo, measured_us=measured,
                                    start_us=lo, breakdown=b, measured_start_us=measured_start,
                                    critical_path=cp, critical_nodes=nodes))
        ranks[g.rank] = total
    return ReplayResult(steps=steps, ranks=ranks, timing=run.timing_name, num_nodes=int(run.offsets[-1]), run=run)
