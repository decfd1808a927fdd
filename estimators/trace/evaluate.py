"""Trace-based what-if (the Lumos way): edit a converted real trace and replay it.

- `dp`: re-time the data-parallel collectives (all-reduce / reduce-scatter / all-gather over the largest
  group in the trace, the world when no group is recorded) for a new group of `dp` ranks laid out like
  the old one (same stride), with the network model: recorded duration x model(new) / model(old), so
  the trace's own calibration is kept (with `hardware`, the target's model time directly).
- `layers`: duplicate or drop layer subgraphs. Layers are found from module annotations whose names
  carry a layer index (`nn.Module: ...Layer.N`, `layers.N`, `h.N`, `blocks.N`...): a layer's forward is
  the annotation's CPU subtree and the GPU work it launched; its backward is the autograd ops whose
  sequence numbers match the forward ops' (plus their subtrees and kernels). The last layer is the
  template: copies are inserted right after each of its segments (forward, backward) and every later
  mark of the timeline is shifted by the inserted span (GPU nodes move with their launch call, so the
  recorded launch latencies are kept); dropped layers are cut out and the timeline closes up.
- `hardware`: replay with the recorded durations translated to another GPU (replay.model_timing).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType, EdgeKind, ExecutionGraph, GraphBuilder, NodeType

_DP_TYPES = (int(CommType.ALL_REDUCE), int(CommType.REDUCE_SCATTER), int(CommType.ALL_GATHER),
             int(CommType.REDUCE_SCATTER_BLOCK))
_LAYER_RE = re.compile(r"(?:^|[\s.:/_(\[])(?P<family>(?:[A-Za-z]*[Ll]ayers?|h|blocks?|[A-Za-z]*Block|decoder\.layers"
                       r"|encoder\.layers|[A-Za-z]*Layer))[._#\[]?(?P<idx>\d+)\b")


# ---------------------------------------------------------------------------------- result
@dataclass
class TraceWhatIf:
    baseline_step_us: float
    step_us: float
    changes: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    result: Any = None

    @property
    def speedup(self) -> float:
        return self.baseline_step_us / self.step_us if self.step_us > 0 else 0.0

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.changes.items())

    def to_json(self) -> dict[str, Any]:
        return {"baseline_step_time_s": self.baseline_step_us / 1e6, "step_time_s": self.step_us / 1e6,
                "baseline_step_time_us": self.baseline_step_us, "step_time_us": self.step_us,
                "change": self.changes, "speedup": self.speedup, "notes": self.notes}


# ---------------------------------------------------------------------------------- DP
def _group_of(g: ExecutionGraph, i: int) -> list[int]:
    a = g.attrs.get(i) or {}
    ranks = a.get("pg_ranks")
    if ranks:
        return [int(r) for r in ranks]
    return list(range(max(int(g.world_size or 1), 1)))


def dp_collectives(g: ExecutionGraph) -> tuple[np.ndarray, int]:
    """(indices of the data-parallel collectives, the old DP degree): reduce/gather collectives over the
    largest group in the trace."""
    idx = []
    size = 0
    for i in g.collectives().tolist():
        if int(g.node_type[i]) != NodeType.COMM_COLL_NODE:
            continue
        ct = g.attr(i, "comm_type")
        if ct is None or int(ct) not in _DP_TYPES:
            continue
        n = len(_group_of(g, i))
        if n > size:
            size, idx = n, [i]
        elif n == size:
            idx.append(i)
    return np.asarray(idx, np.int64), size


def _new_group(old: list[int], dp: int) -> list[int]:
    stride = (old[1] - old[0]) if len(old) >= 2 else 1
    start = old[0]
    return [start + k * max(stride, 1) for k in range(dp)]


class DPRetimed:
    """A TimingSource that wraps another and re-times the DP collectives for `dp` ranks."""

    def __init__(self, base, dp: int, network, absolute: bool):
        self.base, self.dp, self.net, self.absolute = base, dp, network, absolute
        self.name = f"{getattr(base, 'name', 'timing')}+dp{dp}"
        self._dp_nodes: dict[int, set[int]] = {}

    def _dp_set(self, g: ExecutionGraph) -> set[int]:
        key = id(g)
        s = self._dp_nodes.get(key)
        if s is None:
            s = self._dp_nodes[key] = set(dp_collectives(g)[0].tolist())
        return s

    def _retime(self, g: ExecutionGraph, i: int, recorded: float) -> float:
        a = g.attrs.get(i) or {}
        size = float(a.get("comm_size") or 0.0)
        old = _group_of(g, i)
        new = _new_group(old, self.dp)
        ct = int(a["comm_type"])
        t_new = self.net.collective_us(ct, size, new) if self.dp > 1 else 0.0
        if self.absolute or size <= 0:
            return t_new if size > 0 else recorded * (0.0 if self.dp <= 1 else 1.0)
        t_old = self.net.collective_us(ct, size, old)
        return recorded * (t_new / t_old) if t_old > 0 else t_new

    def node_durations(self, g: ExecutionGraph) -> np.ndarray:
        d = np.asarray(self.base.node_durations(g), np.float64).copy()
        for i in self._dp_set(g):
            d[i] = self._retime(g, i, float(d[i]))
        return d

    def collective_us(self, g: ExecutionGraph, node: int, group_ranks: Sequence[int],
                      member_durations: Sequence[float]) -> float:
        t = float(self.base.collective_us(g, node, group_ranks, member_durations))
        if node in self._dp_set(g):
            return self._retime(g, node, t)
        return t

    def launch_latency_us(self, g: ExecutionGraph):
        return self.base.launch_latency_us(g)


# ---------------------------------------------------------------------------------- layers
@dataclass
class LayerBlock:
    index: int
    segments: list[np.ndarray]          # node indices per segment (forward, backward), each a time window


def _children(g: ExecutionGraph) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(len(g))]
    for i, p in enumerate(g.parent.tolist()):
        if p >= 0:
            kids[p].append(i)
    return kids


def _subtree(kids: list[list[int]], roots: Sequence[int]) -> list[int]:
    out, stack = [], list(roots)
    while stack:
        u = stack.pop()
        out.append(u)
        stack.extend(kids[u])
    return out


def _launched(g: ExecutionGraph) -> dict[int, list[int]]:
    """launch call index -> GPU nodes it launched."""
    out: dict[int, list[int]] = {}
    dst = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
    sel = g.dep_kind == EdgeKind.LAUNCH
    for s, d in zip(g.dep_src[sel].tolist(), dst[sel].tolist()):
        out.setdefault(s, []).append(d)
    return out


def find_layers(g: ExecutionGraph) -> list[LayerBlock]:
    """Layer blocks from module annotations with a layer index (see the module docstring)."""
    gpu = g.is_gpu()
    families: dict[str, dict[int, list[int]]] = {}
    for i, name in enumerate(g.name):
        if gpu[i]:
            continue
        m = _LAYER_RE.search(name)
        if not m:
            continue
        fam = name[:m.start("idx")] + "#" + name[m.end("idx"):]
        families.setdefault(fam, {}).setdefault(int(m.group("idx")), []).append(i)
    if not families:
        return []
    # the repeated family with the most layer indices (outermost on ties: the earliest first node)
    fam = max(families, key=lambda f: (len(families[f]), -min(min(v) for v in families[f].values())))
    layers = families[fam]
    if len(layers) < 1:
        return []
    kids = _children(g)
    launched = _launched(g)
    seq_key = "seq_id"
    blocks = []
    all_fwd_seq: dict[int, int] = {}
    fwd_nodes: dict[int, list[int]] = {}
    for idx, roots in sorted(layers.items()):
        # the outermost annotation of this index only (a child with the same index is inside it)
        tops = [r for r in roots if not any(_is_ancestor(g, o, r) for o in roots if o != r)]
        cpu = _subtree(kids, tops)
        fwd_nodes[idx] = cpu
        for i in cpu:
            s = g.attr(i, seq_key)
            if s is None:
                s = g.attr(i, "Sequence number")
            if s is not None and int(s) >= 0:
                all_fwd_seq[int(s)] = idx
    bwd_roots: dict[int, list[int]] = {}
    if all_fwd_seq:
        for i, name in enumerate(g.name):
            if gpu[i] or g.parent[i] >= 0 and _has_seq(g, int(g.parent[i])):
                continue
            s = g.attr(i, seq_key)
            if s is None:
                s = g.attr(i, "Sequence number")
            if s is None or int(s) not in all_fwd_seq:
                continue
            if "backward" in name.lower() or "evaluate_function" in name:
                bwd_roots.setdefault(all_fwd_seq[int(s)], []).append(i)
    for idx in sorted(fwd_nodes):
        segs = []
        for cpu in (fwd_nodes[idx], _subtree(kids, bwd_roots.get(idx, []))):
            if not cpu:
                continue
            gpu_nodes = [k for c in cpu for k in launched.get(c, [])]
            segs.append(np.asarray(sorted(set(cpu) | set(gpu_nodes)), np.int64))
        blocks.append(LayerBlock(idx, segs))
    return blocks


def _has_seq(g: ExecutionGraph, i: int) -> bool:
    return g.attr(i, "seq_id") is not None or g.attr(i, "Sequence number") is not None


def _is_ancestor(g: ExecutionGraph, a: int, b: int) -> bool:
    p = int(g.parent[b])
    while p >= 0:
        if p == a:
            return True
        p = int(g.parent[p])
    return False


def change_layers(g: ExecutionGraph, layers: int) -> tuple[ExecutionGraph, str]:
    """A copy of `g` with `layers` layer blocks (duplicating the last layer or dropping the last ones)."""
    blocks = find_layers(g)
    if not blocks:
        raise TraceInputError(g.metadata.get("source_path") if g.metadata else None,
                              "no layer module annotations (e.g. 'nn.Module: ...Layer.N') found: cannot change "
                              "the number of layers")
    if layers < 1:
        raise TraceInputError(None, "--layers must be >= 1")
    n = len(blocks)
    if layers == n:
        return g, f"{n} layers found, unchanged"
    start, end = g.start_us, g.start_us + g.duration_us
    cpu = ~g.is_gpu()
    # Two timelines move: CPU marks by the CPU span of the inserted/removed segments, GPU nodes by the GPU
    # span of the segments' kernels (a GPU-bound trace queues kernels far behind their launches).
    cpu_ev: list[tuple[float, float]] = []
    gpu_ev: list[tuple[float, float]] = []
    copies: list[tuple[np.ndarray, float, float]] = []  # (segment nodes, CPU offset, GPU offset) per copy
    drop = np.zeros(len(g), bool)

    def windows(seg: np.ndarray) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        c, k = seg[cpu[seg]], seg[~cpu[seg]]
        cw = (float(start[c].min()), float(end[c].max())) if len(c) else None
        gw = (float(start[k].min()), float(end[k].max())) if len(k) else None
        return cw, gw

    if layers > n:
        k = layers - n
        tmpl = blocks[-1]
        for seg in tmpl.segments:
            cw, gw = windows(seg)
            cs = cw[1] - cw[0] if cw else 0.0
            gsp = gw[1] - gw[0] if gw else 0.0
            if cw:
                cpu_ev.append((cw[1], k * cs))
            if gw:
                gpu_ev.append((gw[1], k * gsp))
            for j in range(1, k + 1):
                copies.append((seg, j * cs, j * gsp))
        what = f"{n} -> {layers} layers (layer {tmpl.index} duplicated {k}x)"
    else:
        for blk in blocks[layers:]:
            for seg in blk.segments:
                cw, gw = windows(seg)
                if cw:
                    cpu_ev.append((cw[0], -(cw[1] - cw[0])))
                if gw:
                    gpu_ev.append((gw[0], -(gw[1] - gw[0])))
                drop[seg] = True
        what = f"{n} -> {layers} layers (last {n - layers} dropped)"

    def shifter(events: list[tuple[float, float]]):
        ev = sorted(events)
        t = np.asarray([e[0] for e in ev])
        cum = np.concatenate([[0.0], np.cumsum([e[1] for e in ev])])

        def shift(x: np.ndarray, strict: bool = False) -> np.ndarray:
            return cum[np.searchsorted(t, x, side="left" if strict else "right")]
        return shift

    shift_cpu_raw, shift_gpu = shifter(cpu_ev), shifter(gpu_ev)
    # After a synchronize (a CPU op ending on GPU work) the CPU timeline is aligned with the GPU's again:
    # from the end of each sync on, CPU marks move by the GPU shift there plus the CPU shifts after it.
    dst = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
    sync_ends = np.unique(end[dst[g.dep_kind == EdgeKind.SYNC]]) if len(g.dep_kind) else np.zeros(0)
    sync_ends = sync_ends[np.isfinite(sync_ends)]

    def shift_cpu(x: np.ndarray, strict: bool = False) -> np.ndarray:
        x = np.asarray(x, np.float64)
        out = shift_cpu_raw(x, strict)
        if len(sync_ends):
            pos = np.searchsorted(sync_ends, x, side="right") - 1
            has = pos >= 0
            ts = sync_ends[np.maximum(pos, 0)]
            aligned = shift_gpu(ts) + (out - shift_cpu_raw(ts, strict))
            out = np.where(has, aligned, out)
        return out
    # originals: a CPU parent spanning an insertion point grows; a GPU node moves as a whole
    new_start = np.where(cpu, start + shift_cpu(start), start + shift_gpu(start))
    new_end = np.where(cpu, end + shift_cpu(end, strict=True), end + shift_gpu(start))
    src = [np.flatnonzero(~drop)]
    cno = [np.zeros(len(src[0]), np.int64)]
    st = [new_start[~drop]]
    en = [new_end[~drop]]
    for c, (seg, coff, goff) in enumerate(copies, 1):
        src.append(seg)
        cno.append(np.full(len(seg), c, np.int64))
        on_cpu = cpu[seg]
        off = np.where(on_cpu, coff + shift_cpu(start[seg]), goff + shift_gpu(start[seg]))
        st.append(start[seg] + off)
        en.append(end[seg] + off)
    src_a, cno_a = np.concatenate(src), np.concatenate(cno)
    st_a, en_a = np.concatenate(st), np.concatenate(en)
    # serving order per resource: CPU by (start, -duration), GPU streams by start
    order = np.lexsort((np.arange(len(src_a)), -(en_a - st_a) * cpu[src_a], st_a))
    new_index: dict[tuple[int, int], int] = {}
    for pos, o in enumerate(order.tolist()):
        new_index[(int(src_a[o]), int(cno_a[o]))] = pos
    copy_of_seg = {c: set(seg.tolist()) for c, (seg, _, _) in enumerate(copies, 1)}

    def ref(node: int, c: int) -> int:
        """Where an edge/parent endpoint `node`, seen from copy `c`, points in the new graph."""
        if c and node in copy_of_seg[c]:
            return new_index[(node, c)]
        return new_index.get((node, 0), -1)

    b = GraphBuilder(g.rank, g.world_size)
    for r in g.resources:
        b.resource(r.kind, r.device, r.index, r.name)
    next_id = int(g.node_id.max()) + 1 if len(g) else 1
    for pos, o in enumerate(order.tolist()):
        i, c = int(src_a[o]), int(cno_a[o])
        nid = int(g.node_id[i]) if c == 0 else next_id
        if c:
            next_id += 1
        par = int(g.parent[i])
        b.add_node(g.name[i], int(g.node_type[i]), int(g.kind[i]), int(g.resource[i]), float(st_a[o]),
                   float(en_a[o] - st_a[o]), ref(par, c) if par >= 0 else -1, node_id=nid,
                   attrs=g.attrs.get(i))
    for pos, o in enumerate(order.tolist()):
        i, c = int(src_a[o]), int(cno_a[o])
        lo, hi = int(g.dep_ptr[i]), int(g.dep_ptr[i + 1])
        for s, k in zip(g.dep_src[lo:hi].tolist(), g.dep_kind[lo:hi].tolist()):
            t = ref(s, c)
            if t >= 0:
                b.add_dep(t, pos, k)
    for s in g.steps:
        if s.node >= 0 and (s.node, 0) in new_index:
            j = new_index[(s.node, 0)]
            o = int(order[j])
            b.add_step(s.name, j, float(st_a[o]), float(en_a[o] - st_a[o]))
        elif s.node < 0:
            b.add_step(s.name, -1, s.start_us, s.duration_us + float(sum(d for _, d in cpu_ev)))
    b.metadata = dict(g.metadata)
    b.metadata["whatif_layers"] = what
    return b.build(), what


# ---------------------------------------------------------------------------------- entry point
def whatif_trace(graphs: Sequence[ExecutionGraph], dp: int | None = None, layers: int | None = None,
                 hardware: Any = None, source_hardware: Any = None,
                 progress: Callable[[int, int], None] | None = None) -> TraceWhatIf:
    """Replay `graphs` as recorded (baseline) and with the changes; returns both step times."""
    from replay.api import replay
    from replay.trace_timing import TraceTiming

    graphs = list(graphs)
    if not graphs:
        raise TraceInputError(None, "no graphs to replay")
    baseline = replay(graphs, TraceTiming(), critical_path=False)
    changes: dict[str, Any] = {}
    notes: list[str] = []
    if layers is not None:
        edited = []
        for g in graphs:
            g2, what = change_layers(g, layers)
            edited.append(g2)
        graphs = edited
        changes["layers"] = what
    if hardware is not None:
        from replay.hardware.config import get_hardware
        from replay.model_timing import TranslatedTiming
        timing: Any = TranslatedTiming(get_hardware(source_hardware) if source_hardware else None, get_hardware(hardware))
        changes["hardware"] = get_hardware(hardware).name
    else:
        timing = TraceTiming()
    if dp is not None:
        if dp < 1:
            raise TraceInputError(None, "--dp must be >= 1")
        from replay.hardware.config import get_hardware, trace_hardware
        from replay.hardware.network import NetworkModel
        hw = hardware or source_hardware or trace_hardware(graphs[0].metadata)
        if hw is None:
            raise TraceInputError(None, "cannot tell which GPU the trace was recorded on: give --hardware or "
                                        "--source-hardware to time the new data-parallel group")
        idx, old = dp_collectives(graphs[0])
        if len(idx) == 0:
            notes.append("no data-parallel collectives found: the DP change has nothing to re-time")
        changes["dp"] = f"{old} -> {dp} ({len(idx)} collectives re-timed per rank)"
        timing = DPRetimed(timing, dp, NetworkModel(get_hardware(hw)), absolute=hardware is not None)
    result = replay(graphs, timing, progress=progress, critical_path=False)
    return TraceWhatIf(baseline.step_time_us, result.step_time_us, changes, notes, result)
