"""The composed step estimate (simulation mode "fast"): replay a few passes of each distinct pipeline stage,
then compose the step with a pipeline-schedule simulation.

Every stage of a pipeline runs the same passes (one micro-batch's forward or backward of one model chunk)
over and over; only the first and last stage differ (embedding, output layer and loss), and with
interleaving each stage holds several chunks. So instead of replaying pp stages x m micro-batches x vp
chunks event by event (`evaluate.predict(mode="symmetric")`), this:

1. groups the stages by what they compute and where their sends go (`stage_signature`) and, for one stage
   of each group, replays with the event-level engine a short sample schedule - two micro-batches'
   forward and backward of each distinct local chunk, back to back (`sample_schedule`) - built by the
   workload generator
   (`workload.build_rank_graph(schedule=...)`), with its TP / CP / EP / ZeRO-3 collectives, overlap and
   link sharing as in the full replay. The pipeline receives of the sample take no time (their data is
   there); the schedule below decides when data arrives. From the sample (`StageSample`), per pass type
   (forward, backward, the last backward of a chunk, which also reduces gradients; per local chunk):
   - `body`: from the pass's first compute kernel to its last (what the pass costs once its input is
     there) when it follows the previous pass directly, that pass's send sharing its links; `iso_body`:
     the same with that send done (a second sample with blocking sends, only where a send shared links);
     `gap`: what the pass adds on top when it follows the previous one directly (a parameter all-gather
     that the previous pass did not hide);
   - its send's time under link sharing relative to the send alone (`send_stretch`), and the TP
     all-gather that follows a receive (Megatron's scatter/gather of activations without sequence
     parallelism);
   - the gradient reductions its last backward issues (ready offsets and times), and the step's tail
     (deferred reductions, optimizer, fp8 weight casts, ZeRO-1/2 parameter all-gathers);
2. simulates the pipeline schedule of all pp stages x m micro-batches x vp chunks as arrays
   (`simulate_schedule`): each stage serves its passes in Megatron's (interleaved) 1F1B order
   (`workload.pipeline_schedule`, vectorized in `schedule_arrays`); a pass starts when the previous pass
   on its stage is done (plus its gap) and its input has arrived (the producer's end, plus the
   point-to-point transfer between the two stages' ranks from the timing source, stretched as in the
   sample; blocking send/recv in batches when `overlap_p2p` is off, as the generator does). The
   recurrence end[k] = max(end[k-1] + gap[k] + body[k], ready[k] + iso_body[k]) of one stage is a max-plus
   scan (numpy cumulative max); the stages are solved by Gauss-Seidel sweeps, forward and backward over
   the stages, until nothing moves (the exact longest-path solution: sweeps only raise times, and never
   past it);
3. adds per stage the data-parallel gradient reductions as a queue in time order after each chunk's last
   backward, then the tail; the step is the slowest stage's end.

What it leaves out against the full replay: link sharing between transfers of different stages and
between one pass's traffic and a neighbour's (outside the sample's own back-to-back passes), and any
effect of a pass's position in the schedule other than when it starts. `tests/test_estimate_speed.py`
holds the agreement with the full replay (within 2% on a set of small plans).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chakra_schema.graph import ExecutionGraph, GraphBuilder, NodeType, OpKind, ResourceKind
from estimators.model_config import ModelConfig
from estimators.parallelism.plan import ParallelPlan, stage_layers
from estimators.parallelism.workload import (COMPUTE, DP_RS, PP_RECV_B, PP_RECV_F, PP_SEND_B, PP_SEND_F, STREAM_KIND,
                                             STREAMS, TP, apply_host_pacing, build_rank_graph)
from replay.results import COMM_KINDS, Breakdown

_SID = {slot: sid for slot, (sid, _) in STREAMS.items()}
_KIND_BY_SID = {sid: STREAM_KIND.get(slot, "compute") for slot, (sid, _) in STREAMS.items()}


def node_kinds(g: ExecutionGraph) -> np.ndarray:
    """Per node of a generated graph, what its stream does for the breakdowns: "compute", a communication
    kind (workload.STREAM_KIND) or "host" (the GPU waiting for the host)."""
    sids = np.array([r.index for r in g.resources])
    return np.array([_KIND_BY_SID.get(int(x), "compute") for x in sids])[g.resource]
_PP_RECV_SIDS = (_SID[PP_RECV_F], _SID[PP_RECV_B])
_PP_SEND_SIDS = (_SID[PP_SEND_F], _SID[PP_SEND_B])
NEG = -np.inf
# breakdown fields a pass / the tail contributes (Breakdown field names)
BREAKDOWN_FIELDS = ("compute_us", "comm_us") + tuple(f"exposed_{k}_comm_us" for k in COMM_KINDS) + ("host_wait_us",)


# ------------------------------------------------------------------------------------------ sampling
def layer_signature(model: ModelConfig, plan: ParallelPlan, layer: int, position: int) -> tuple:
    """What tells one layer's passes from another's: the parts of the generator's layer-template key
    (`workload._RankBuilder.layer_template`) that depend on the layer: MoE or dense, sliding-window
    attention or not, fully recomputed or not (`recompute_layers`: the first N layers of each chunk)."""
    window = bool(getattr(model, "is_window_layer", lambda i: False)(layer))
    n = getattr(plan, "recompute_layers", 0)
    recompute = plan.recompute == "full" and (not n or position < n)
    return bool(model.is_moe_layer(layer)), window, recompute


def stage_signature(model: ModelConfig, plan: ParallelPlan, stage: int, chunks: list[list[int]],
                    gpus_per_node: int) -> tuple:
    """What a stage computes: per local chunk, its layers' kinds (the generator builds one template per
    kind) and whether it holds the embedding / the output layer; and whether its sends to the next and
    the previous stage stay inside a node (they then share NVLink with its TP traffic, else the NIC).
    Stages with equal signatures run equal passes."""
    n = plan.pp * plan.vp
    sig = []
    for c in range(plan.vp):
        g = stage + c * plan.pp
        sig.append((tuple(layer_signature(model, plan, layer, j) for j, layer in enumerate(chunks[g])),
                    g == 0, g == n - 1))
    node = plan.rank(stage) // gpus_per_node
    local = tuple(plan.rank(peer) // gpus_per_node == node
                  for peer in ((stage + 1) % plan.pp, (stage - 1) % plan.pp)) if plan.pp > 1 else ()
    return tuple(sig), local


def sample_schedule(chunks: list[int]) -> list[tuple[bool, int, int]]:
    """The passes a stage sample replays for its local `chunks`: micro-batch 0's forwards of every chunk,
    micro-batch 1's, the backwards of micro-batch 0 (last chunk first, as the schedule runs them: the
    first right after forwards), then per chunk micro-batch 1's backward and micro-batch 2's, the chunk's
    last backward, which issues its gradient reductions. So a backward is measured after a forward or a
    backward with no reductions in flight, and a last backward after a backward of its chunk, as in the
    schedule's cool-down (a backward right after another chunk's last backward shares its links with that
    chunk's reductions, which the schedule spreads out)."""
    out = [(True, 0, c) for c in chunks] + [(True, 1, c) for c in chunks]
    out += [(False, 0, c) for c in reversed(chunks)]
    for c in reversed(chunks):
        out += [(False, 1, c), (False, 2, c)]
    return out


def sample_position(chunks: list[int], fwd: bool, chunk: int, last: bool) -> int:
    """Where the warm pass of a type sits in `sample_schedule(chunks)`."""
    n, i = len(chunks), chunks.index(chunk)
    if fwd:
        return n + i
    if not last:
        return 2 * n + (n - 1 - i)
    return 3 * n + 2 * (n - 1 - i) + 1


_KERNEL_OPS = (int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET))


def _distinct_node_durations(timing, graph: ExecutionGraph) -> np.ndarray:
    """`timing.node_durations(graph)`, asking it once per distinct node. The generator stamps every layer
    out of one template, whose ops share their attrs dict, so a sample repeats a few hundred distinct ops
    thousands of times. For the model timing source (`replay.model_timing.ModelTiming`) a node's time
    depends only on its kind, GPU or host resource, attrs and recorded duration, except for a kernel
    without an `op` (timed by its launching host op and neighbours) or a trace from known hardware: those
    graphs, and other timing sources, are asked whole."""
    from replay.model_timing import ModelTiming, source_hardware

    n = len(graph)
    if type(timing) is not ModelTiming or n < 64 or timing.source_hw is not None or source_hardware(graph):
        return timing.node_durations(graph)
    attrs = graph.attrs
    kinds = graph.kind.tolist()
    gpu = graph.is_gpu().tolist()
    recorded = graph.duration_us.tolist()
    index: dict[tuple, int] = {}
    inv = np.empty(n, np.int64)
    reps: list[int] = []
    for i in range(n):
        a = attrs.get(i)
        k = kinds[i]
        if k in _KERNEL_OPS and not (a and "op" in a):
            return timing.node_durations(graph)   # a kernel timed from its context
        key = (k, gpu[i], id(a), recorded[i])
        j = index.get(key)
        if j is None:
            j = index[key] = len(reps)
            reps.append(i)
        inv[i] = j
    if 2 * len(reps) > n:
        return timing.node_durations(graph)
    b = GraphBuilder(graph.rank, graph.world_size)
    b.resources = list(graph.resources)
    b.metadata = dict(graph.metadata or {})
    for i in reps:
        b.add_node(graph.name[i], int(graph.node_type[i]), kinds[i], int(graph.resource[i]),
                   float(graph.start_us[i]), recorded[i], attrs=attrs.get(i))
    return np.asarray(timing.node_durations(b.build()), np.float64)[inv]


class HostPacedTiming:
    """The timing source of a generated step: the wrapped one, asked once per distinct node
    (`_distinct_node_durations`), with the MoE layers' host pacing (workload.apply_host_pacing)."""

    def __init__(self, base):
        self.base = base
        self.name = getattr(base, "name", "timing")

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        return apply_host_pacing(graph, np.array(_distinct_node_durations(self.base, graph), dtype=np.float64))

    def collective_us(self, graph, node, group_ranks, member_durations):
        return self.base.collective_us(graph, node, group_ranks, member_durations)

    def launch_latency_us(self, graph):
        return self.base.launch_latency_us(graph)

    def fabric(self):
        from replay.fabric import fabric_for
        return fabric_for(self.base)


class _PipelineDataReady(HostPacedTiming):
    """The timing source of a sample: `HostPacedTiming`, except that pipeline receives take no time (the
    schedule simulation decides when their data arrives)."""

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        d = super().node_durations(graph)
        sids = np.array([r.index for r in graph.resources])
        recv = (graph.node_type == NodeType.COMM_RECV_NODE) & np.isin(sids[graph.resource], _PP_RECV_SIDS)
        d[recv] = 0.0
        return d


@dataclass
class StageSample:
    """Per-pass-type figures of one stage kind. Pass types are indexed t = chunk (forward),
    vp + chunk (backward), 2 vp + chunk (the chunk's last backward)."""

    body: np.ndarray            # [3vp] us from the pass's first compute kernel to its last, right after the
                                #   previous pass (its send in flight)
    iso_body: np.ndarray        # [3vp] the same when no send of the previous pass is in flight
    gap: np.ndarray             # [3vp] us the pass adds after the previous one beyond its body (>= 0)
    first_body: float           # body and gap of the step's first pass (forward of micro-batch 0, chunk 0:
    first_gap: float            # nothing prefetched yet, no earlier traffic)
    send_stretch: np.ndarray    # [3vp] contended / alone time of the pass's send (1 without a send)
    send_bytes: np.ndarray      # [3vp] bytes the pass sends to the next / previous stage (0: none)
    out_delay: np.ndarray       # [3vp] us from the pass's last compute kernel to its output (what it sends)
    recv_gather: np.ndarray     # [3vp] us of the TP all-gather after the pass's receive (scatter/gather)
    reductions: list            # [vp] per chunk: [(ready offset after the last backward's body start, us)]
    deferred_us: float          # reductions issued after the last pass (no overlap_grad_reduce)
    tail_us: float              # optimizer start -> the stage's last node
    parts: np.ndarray           # [3vp, len(BREAKDOWN_FIELDS)] breakdown of each pass type's window
    tail_parts: np.ndarray      # [len(BREAKDOWN_FIELDS)] breakdown of the tail window
    nodes: int = 0


def window_parts(kind: np.ndarray, start: np.ndarray, end: np.ndarray, xfer: np.ndarray,
                  lo: float, hi: float) -> np.ndarray:
    """Breakdown figures (`BREAKDOWN_FIELDS`) of the window [lo, hi] of a replayed rank (what each part
    counts: evaluate.rank_breakdown)."""
    from replay.results import add_uncovered, union_intervals

    s = np.clip(start, lo, hi)
    e = np.clip(end, lo, hi)
    xs = np.clip(xfer, lo, hi)
    comp = kind == "compute"
    host = kind == "host"
    cs, ce = union_intervals(s[comp], e[comp])
    out = np.zeros(len(BREAKDOWN_FIELDS))
    out[0] = float(np.sum(ce - cs))
    comm = ~comp & ~host
    ms, me = union_intervals(xs[comm], e[comm])
    out[1] = float(np.sum(me - ms))
    cover_s, cover_e = cs, ce
    for j, k in enumerate(COMM_KINDS):
        sel = kind == k
        if sel.any():
            cover_s, cover_e, out[2 + j] = add_uncovered(cover_s, cover_e, xs[sel], e[sel])
    if host.any():   # the GPU waiting for the host, where nothing else runs
        cover_s, cover_e, out[-1] = add_uncovered(cover_s, cover_e, s[host], e[host])
    return out


def _pass_bodies(g: ExecutionGraph, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pass of a sample: (the end of its last compute kernel, the start of its first, its output's end)."""
    sids = np.array([r.index for r in g.resources])
    is_comp = sids[g.resource] == _SID[COMPUTE]
    passes = g.metadata["passes"]
    firsts = [p[3] for p in passes] + [int(g.metadata["tail"])]
    K = len(passes)
    ends, firsts_start, outs = np.zeros(K), np.zeros(K), np.zeros(K)
    for k, p in enumerate(passes):
        comp = firsts[k] + np.flatnonzero(is_comp[firsts[k]:firsts[k + 1]])
        outs[k] = float(end[p[4]])
        ends[k] = float(end[comp].max()) if len(comp) else outs[k]
        firsts_start[k] = float(start[comp].min()) if len(comp) else outs[k]
    return ends, firsts_start, outs


def sample_stage(model: ModelConfig, plan: ParallelPlan, stage: int, timing, gpus_per_node: int) -> StageSample:
    """Replay `sample_schedule` on one rank of `stage` and read the pass figures off it."""
    from replay.engine import simulate

    vp = plan.vp
    # chunks that compute the same (most of a stage's chunks with interleaving) are sampled once; without
    # overlapped gradient reduction every chunk's reductions wait for the tail, so then all are sampled
    layer_chunks = stage_layers(model, plan)
    n_chunks = plan.pp * vp
    kinds: dict[tuple, int] = {}
    rep = []
    for c in range(vp):
        g = stage + c * plan.pp
        sig = (tuple(layer_signature(model, plan, layer, j) for j, layer in enumerate(layer_chunks[g])),
               g == 0, g == n_chunks - 1)
        rep.append(kinds.setdefault(sig, c) if plan.overlap_grad_reduce else c)
    chunks = sorted(set(rep))
    sched = sample_schedule(chunks)
    g = build_rank_graph(model, plan.with_(overlap_p2p=True), plan.rank(stage), gpus_per_node,
                         schedule=sched)
    run = simulate([g], _PipelineDataReady(timing), align="start")
    start, end, dur = run.start, run.end, run.durations
    n = len(g)
    sids = np.array([r.index for r in g.resources])
    node_sid = sids[g.resource]
    kind = node_kinds(g)
    # as evaluate.rank_breakdown: a transfer's data moves at the end of its node for its transfer_us; `dur`
    # stays the time alone, which the send stretch below divides by
    xfer = np.maximum(start, end - run.transfer_us)
    is_comp = node_sid == _SID[COMPUTE]
    passes = g.metadata["passes"]
    tail_first = int(g.metadata["tail"])
    firsts = [p[3] for p in passes] + [tail_first]
    K = len(passes)
    # a pass ends for its stage when its last compute kernel does; its output (what it sends) may end
    # later (e.g. the loss all-reduce on the TP stream)
    ends, first_start, outs = _pass_bodies(g, start, end)
    out_delay = np.maximum(outs - ends, 0.0)
    body = ends - first_start
    prev = np.concatenate([[0.0], ends[:-1]])
    send_stretch = np.ones(K)
    send_bytes = np.zeros(K)
    gather = np.zeros(K)
    parts = np.zeros((K, len(BREAKDOWN_FIELDS)))
    red_by_pass: list[list[tuple[float, float]]] = [[] for _ in range(K)]
    dp_end = NEG
    for k in range(K):
        lo_i, hi_i = firsts[k], firsts[k + 1]
        idx = np.arange(lo_i, hi_i)
        first = float(first_start[k])
        for i in idx[np.isin(node_sid[lo_i:hi_i], _PP_SEND_SIDS)].tolist():
            alone = float(dur[i])
            send_bytes[k] = float(g.attr(i, "comm_size", 0) or 0)
            send_stretch[k] = (end[i] - start[i]) / alone if alone > 0 else 1.0
        deps_ptr = g.dep_ptr
        for i in idx[node_sid[lo_i:hi_i] == _SID[TP]].tolist():
            srcs = g.dep_src[deps_ptr[i]:deps_ptr[i + 1]]
            if any(int(node_sid[s]) in _PP_RECV_SIDS for s in srcs.tolist()):
                gather[k] += float(end[i] - start[i])
        for i in idx[node_sid[lo_i:hi_i] == _SID[DP_RS]].tolist():
            srcs = [s for s in g.dep_src[deps_ptr[i]:deps_ptr[i + 1]].tolist() if node_sid[s] != _SID[DP_RS]]
            ready = max((float(end[s]) for s in srcs), default=NEG) - first
            red_by_pass[k].append((ready, float(end[i] - start[i])))
            dp_end = max(dp_end, float(end[i]))
        parts[k] = window_parts(kind, start, end, xfer, float(prev[k]), float(ends[k]))
    gap = np.maximum(ends - prev - body, 0.0)
    tail_idx = np.arange(tail_first, n)
    tail_comp = tail_idx[is_comp[tail_first:]]
    makespan = float(end.max())
    last_end = float(ends[-1])
    t_opt = float(start[tail_comp].min()) if len(tail_comp) else makespan
    deferred = max(0.0, t_opt - max(last_end, dp_end))
    tail_parts = window_parts(kind, start, end, xfer, last_end, makespan)

    # pass types in the sample: warm forward = mb 1's, backward = mb 0's, last backward = mb 1's
    pos = [sample_position(chunks, True, rep[c], False) for c in range(vp)] + \
          [sample_position(chunks, False, rep[c], False) for c in range(vp)] + \
          [sample_position(chunks, False, rep[c], True) for c in range(vp)]
    pos = np.array(pos)
    # The same passes with each send done before the next pass starts (blocking point-to-point): their
    # bodies without a neighbour's send sharing their links, for passes that waited for their input.
    iso = body
    if np.any(send_stretch > 1.0 + 1e-9):   # a send shared links with the passes' traffic
        gi = build_rank_graph(model, plan.with_(overlap_p2p=False), plan.rank(stage), gpus_per_node,
                              schedule=sched)
        ri = simulate([gi], _PipelineDataReady(timing), align="start")
        e_i, f_i, _ = _pass_bodies(gi, ri.start, ri.end)
        iso = e_i - f_i
        n += len(gi)
    reductions = [red_by_pass[sample_position(chunks, False, rep[c], True)] for c in range(vp)]
    return StageSample(body=body[pos], iso_body=iso[pos], gap=gap[pos], first_body=float(body[0]),
                       first_gap=float(gap[0]), send_stretch=send_stretch[pos], send_bytes=send_bytes[pos],
                       out_delay=out_delay[pos], recv_gather=gather[pos], reductions=reductions,
                       deferred_us=deferred, tail_us=makespan - t_opt, parts=parts[pos], tail_parts=tail_parts,
                       nodes=n)


# ------------------------------------------------------------------------------------------ schedule
@dataclass
class ScheduleArrays:
    """Megatron's (interleaved) 1F1B order on every stage at once, as [pp, 2 m vp] arrays by position."""

    fwd: np.ndarray        # bool
    mb: np.ndarray         # micro-batch
    chunk: np.ndarray      # local chunk
    src: np.ndarray        # flat index (stage * K + position) of the pass producing this pass's input, -1: none
    warmup: np.ndarray     # [pp] warm-up forwards per stage

    @property
    def K(self) -> int:
        return self.fwd.shape[1]


def schedule_arrays(pp: int, m: int, vp: int) -> ScheduleArrays:
    """`workload.pipeline_schedule` for every stage, vectorized, with each pass's producer."""
    total = m * vp
    K = 2 * total
    s = np.arange(pp)[:, None]
    if vp == 1:
        w = np.minimum(pp - s - 1, total)
    else:
        w = np.minimum((pp - s - 1) * 2 + (vp - 1) * pp, total)
    j = np.arange(total)[None, :]
    pos_f = np.where(j < w, j, w + 2 * (j - w))                       # [pp, total]
    pos_b = np.where(j < total - w, w + 2 * j + 1, total + j)
    mb = (j // (pp * vp)) * pp + j % pp
    chunk_f = (j % (pp * vp)) // pp
    chunk_b = vp - 1 - chunk_f
    rows = np.broadcast_to(s, (pp, total))
    fwd = np.zeros((pp, K), bool)
    mbs = np.zeros((pp, K), np.int64)
    chunk = np.zeros((pp, K), np.int64)
    src = np.full((pp, K), -1, np.int64)
    fwd[rows, pos_f] = True
    mbs[rows, pos_f] = mb
    mbs[rows, pos_b] = mb
    chunk[rows, pos_f] = chunk_f
    chunk[rows, pos_b] = chunk_b
    # forward j of stage s consumes forward j of stage s-1 (stage 0, chunk c > 0: forward j - pp of the last
    # stage, its chunk c - 1); backward j of stage s consumes backward j of stage s+1 (the last stage,
    # chunk c < vp-1: backward j - pp of stage 0)
    n_chunks = pp * vp
    g_f = chunk_f * pp + s
    has = np.broadcast_to(g_f > 0, (pp, total))
    src_stage = np.where(s > 0, s - 1, pp - 1)
    src_j = np.where(s > 0, j, j - pp)
    src_stage = np.broadcast_to(src_stage, (pp, total))
    src_j = np.broadcast_to(src_j, (pp, total))
    flat = src_stage * K + pos_f[src_stage, np.clip(src_j, 0, total - 1)]
    src[rows[has], pos_f[has]] = flat[has]
    g_b = chunk_b * pp + s
    has = np.broadcast_to(g_b < n_chunks - 1, (pp, total))
    src_stage = np.broadcast_to(np.where(s < pp - 1, s + 1, 0), (pp, total))
    src_j = np.broadcast_to(np.where(s < pp - 1, j, j - pp), (pp, total))
    flat = src_stage * K + pos_b[src_stage, np.clip(src_j, 0, total - 1)]
    src[rows[has], pos_b[has]] = flat[has]
    return ScheduleArrays(fwd=fwd, mb=mbs, chunk=chunk, src=src, warmup=w[:, 0].copy())


def p2p_boundaries(sa: ScheduleArrays, vp: int) -> np.ndarray:
    """[pp, K] True where a stage exchanges its batch of sends / receives after the pass, with blocking
    point-to-point communication (the generator's 2021 Megatron-LM batching: after every pass without
    interleaving; with it, after each warm-up forward, each steady-state forward+backward pair and each
    cool-down backward)."""
    pp, K = sa.fwd.shape
    if vp == 1:
        return np.ones((pp, K), bool)
    total = K // 2
    w = sa.warmup[:, None]
    n_warm = np.where(total > w, w + 1, total)          # position of the first backward
    k = np.arange(K)[None, :]
    first_steady = n_warm - (total > n_warm)
    steady_end = n_warm + 2 * (total - n_warm)
    return (k < first_steady) | (k >= steady_end) | (((k - first_steady) % 2) == 1)


@dataclass
class ScheduleResult:
    end: np.ndarray          # [pp, K] end of every pass
    start: np.ndarray        # [pp, K] start of every pass's body
    sweeps: int


def simulate_schedule(body: np.ndarray, gap: np.ndarray, src: np.ndarray, post: np.ndarray, wpos: np.ndarray,
                      latency: np.ndarray, iso: np.ndarray | None = None) -> ScheduleResult:
    """Pass ends of every stage: end[s, k] = max(end[s, k-1] + gap + body, ready[s, k] + iso), where
    `iso` (default `body`) is the body of a pass that waited for its input (no earlier send in flight: a
    wait of w leaves the pass max(iso, body - w) to run, as the previous send's share of the links fades), and
    ready[s, wpos[s, k]] >= end[producer stage, post of the producer src[s, k]] + latency[s, k] for every
    pass k with an input (src >= 0: flat index stage * K + position; wpos is non-decreasing along a stage).

    One stage is a max-plus scan: with A = cumsum(gap + body) and D = body - A,
    end[k] = A[k] + max(0, max over i <= k of ready[i] + D[i]). The stages are solved by Gauss-Seidel sweeps,
    forward then backward over the stages, recomputing a stage only when a stage it reads from moved,
    until nothing moves: times only rise, never past the longest-path solution, which they reach."""
    pp, K = body.shape
    iso = body if iso is None else iso
    A = np.cumsum(gap + body, axis=1)
    D = iso - A
    E = A.copy()   # no inputs: the lower bound the sweeps raise
    flat = E.ravel()
    post_flat = post.ravel()
    inputs = []
    readers: list[set[int]] = [set() for _ in range(pp)]
    for s in range(pp):
        k = np.flatnonzero(src[s] >= 0)
        sc = src[s, k]
        read = (sc // K) * K + post_flat[sc]            # flat index of the producer's post
        w = wpos[s, k]
        offset = latency[s, k] + D[s, w]
        groups = None
        if len(w) > 1 and np.any(w[1:] == w[:-1]):      # a batch of receives that one pass waits for
            groups = np.flatnonzero(np.r_[True, w[1:] != w[:-1]])
            w = w[groups]
        inputs.append((read, offset, groups, w))
        for r in np.unique(read // K).tolist():
            readers[r].add(s)
    X = np.zeros(K)
    dirty = np.ones(pp, bool)
    sweeps = 0
    order_f = list(range(pp))
    order_b = order_f[::-1]
    while dirty.any():
        sweeps += 1
        for s in (order_f if sweeps % 2 else order_b):
            if not dirty[s]:
                continue
            dirty[s] = False
            read, offset, groups, w = inputs[s]
            v = flat[read]
            v += offset
            if groups is not None:
                v = np.maximum.reduceat(v, groups)
            np.maximum(v, 0.0, out=v)
            X.fill(0.0)
            X[w] = v
            np.maximum.accumulate(X, out=X)
            X += A[s]
            if not np.array_equal(X, E[s]):
                E[s] = X
                for r in readers[s]:
                    dirty[r] = True
        if sweeps > 2 * pp * K + 8:  # cannot happen for an acyclic schedule; guard against a bad input
            raise RuntimeError("pipeline schedule simulation did not converge")
    # where a pass starts: after the previous one (plus its gap) when it ran back to back, else when its
    # input came (it then ran its isolated body)
    prev = np.concatenate([np.zeros((pp, 1)), E[:, :-1]], axis=1) + gap
    waited = E - prev > body * (1 + 1e-12) + 1e-9
    return ScheduleResult(end=E, start=np.where(waited, E - iso, prev), sweeps=sweeps)


# ------------------------------------------------------------------------------------------ the step
@dataclass
class ComposedStep:
    step_us: float
    stage_end_us: np.ndarray
    per_stage: list[Breakdown]
    sample_nodes: int
    stage_kinds: int
    sweeps: int
    extra: dict[str, Any] = field(default_factory=dict)


def _p2p_alone_us(plan: ParallelPlan, timing, sizes: dict[int, tuple[float, float]], gpus_per_node: int) -> np.ndarray:
    """[pp, 2] time of a send alone on the network from stage s's representative rank to the next stage's
    (column 0, forward) and to the previous stage's (column 1, backward), from the timing source.
    `sizes`: per stage, (forward, backward) bytes."""
    pp = plan.pp
    out = np.zeros((pp, 2))
    if pp == 1:
        return out
    cache: dict[tuple, float] = {}
    for s in range(pp):
        me = plan.rank(s)
        todo = []
        for col, peer in ((0, (s + 1) % pp), (1, (s - 1) % pp)):
            size = sizes[s][col]
            if size <= 0:
                continue
            dst = plan.rank(peer)
            key = (me, dst, size)
            if key in cache:
                out[s, col] = cache[key]
            else:
                todo.append((col, dst, size, key))
        if not todo:
            continue
        b = GraphBuilder(me, plan.gpus)
        res = b.resource(ResourceKind.GPU_STREAM, me % gpus_per_node, _SID[PP_SEND_F], "pp_send")
        for col, dst, size, _ in todo:
            b.add_node("send", NodeType.COMM_SEND_NODE, OpKind.SEND, res,
                       attrs={"comm_src": me, "comm_dst": dst, "comm_size": int(size), "pg_name": "pp"})
        d = np.asarray(timing.node_durations(b.build()), np.float64)
        for (col, dst, size, key), t in zip(todo, d.tolist()):
            out[s, col] = cache[key] = t
    return out


@dataclass
class StageSamples:
    """The samples of a plan's distinct stages and which one each stage runs."""

    samples: list[StageSample]
    stage_kind: np.ndarray      # [pp] index into samples
    alone: np.ndarray           # [pp, 2] a send alone: stage s -> s+1 (forward), s -> s-1 (backward), us


def sample_stages(model: ModelConfig, plan: ParallelPlan, timing, gpus_per_node: int) -> StageSamples:
    """Replay one stage of each distinct kind (`stage_signature`), and time the sends between stages."""
    pp, vp = plan.pp, plan.vp
    chunks = stage_layers(model, plan)
    sigs = [stage_signature(model, plan, s, chunks, gpus_per_node) for s in range(pp)]
    kind_of: dict[tuple, int] = {}
    stage_kind = np.array([kind_of.setdefault(sig, len(kind_of)) for sig in sigs])
    reps = [int(np.flatnonzero(stage_kind == k)[0]) for k in range(len(kind_of))]
    samples = [sample_stage(model, plan, s, timing, gpus_per_node) for s in reps]
    send_bytes = np.stack([x.send_bytes for x in samples])
    sizes = {s: (float(send_bytes[stage_kind[s], :vp].max(initial=0.0)),
                 float(send_bytes[stage_kind[s], vp:].max(initial=0.0))) for s in range(pp)}
    return StageSamples(samples, stage_kind, _p2p_alone_us(plan, timing, sizes, gpus_per_node))


def compose_step(model: ModelConfig, plan: ParallelPlan, timing, gpus_per_node: int,
                 micro_batches: int | None = None, samples: StageSamples | None = None) -> ComposedStep:
    """The step time of `plan` by stage samples + the pipeline schedule simulation (module docstring).
    `micro_batches`: simulate this many instead of the plan's (the samples do not depend on it)."""
    ss = samples if samples is not None else sample_stages(model, plan, timing, gpus_per_node)
    return schedule_step(plan, ss, plan.micro_batches if micro_batches is None else micro_batches)


def schedule_step(plan: ParallelPlan, ss: StageSamples, m: int) -> ComposedStep:
    """Compose the step of `plan` with `m` micro-batches from its stage samples."""
    pp, vp = plan.pp, plan.vp
    samples, stage_kind, alone = ss.samples, ss.stage_kind, ss.alone
    sa = schedule_arrays(pp, m, vp)
    K = sa.K
    ptype = np.where(sa.fwd, sa.chunk, np.where(sa.mb == m - 1, 2 * vp + sa.chunk, vp + sa.chunk))
    table = lambda name: np.stack([getattr(x, name) for x in samples])  # noqa: E731  [kinds, T]
    kk = stage_kind[:, None]
    body = table("body")[kk, ptype]
    gap = table("gap")[kk, ptype]
    iso = table("iso_body")[kk, ptype]
    body[:, 0] = iso[:, 0] = np.array([x.first_body for x in samples])[stage_kind]
    gap[:, 0] = np.array([x.first_gap for x in samples])[stage_kind]
    stretch = table("send_stretch")[kk, ptype]
    send_bytes = table("send_bytes")
    gather = table("recv_gather")[kk, ptype]
    out_delay = table("out_delay")[kk, ptype]

    has = sa.src >= 0
    src_c = np.clip(sa.src, 0, None)
    src_stage, src_pos = src_c // K, src_c % K
    src_fwd = sa.fwd[src_stage, src_pos]
    # the producer's send: its alone time between the two stages, stretched as in the producer's sample
    send_us = np.where(has, out_delay[src_stage, src_pos]
                       + alone[src_stage, np.where(src_fwd, 0, 1)] * stretch[src_stage, src_pos], 0.0)

    rows = np.arange(pp)[:, None]
    pos = np.broadcast_to(np.arange(K)[None, :], (pp, K))
    if plan.overlap_p2p:
        post = np.broadcast_to(pos, (pp, K)).copy()
        wpos = pos.copy()
        latency = send_us + gather
    else:
        bnd = p2p_boundaries(sa, vp)
        # a pass's send goes out with the batch after the next boundary; the receives of the passes up to
        # the next boundary are posted after the boundary and the first pass after it waits for all of them
        nxt = np.where(bnd, pos, K)
        post = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
        post = np.minimum(post, K - 1)
        prv = np.where(bnd, pos, -1)
        prv = np.maximum.accumulate(prv, axis=1)
        wpos = np.concatenate([np.zeros((pp, 1), np.int64), prv[:, :-1] + 1], axis=1)
        # receives of one batch, each followed by its TP all-gather on one stream
        batch_gather = np.zeros((pp, K))
        np.add.at(batch_gather, (np.broadcast_to(rows, (pp, K))[has], wpos[has]), gather[has])
        latency = send_us + batch_gather[rows, wpos]
        # the sender waits for its batch's sends before its next pass
        send_of = np.zeros((pp, K))
        own_send = send_bytes[kk, ptype] > 0
        send_here = np.where(own_send, out_delay + alone[rows, np.where(sa.fwd, 0, 1)] * stretch, 0.0)
        np.maximum.at(send_of, (np.broadcast_to(rows, (pp, K)), post), send_here)
        wait_after = np.concatenate([np.zeros((pp, 1)), send_of[:, :-1]], axis=1)
        gap = gap + np.maximum(wait_after, batch_gather)
    if not plan.overlap_p2p:
        body = iso           # every send is done before the stage's next pass
    res = simulate_schedule(body, gap, np.where(has, sa.src, -1), post, wpos, latency, iso)
    E = res.end

    stage_end = np.zeros(pp)
    per_stage: list[Breakdown] = []
    parts = table("parts")          # [kinds, T, F]
    for s in range(pp):
        smp = samples[stage_kind[s]]
        last_end = float(E[s, -1])
        q = NEG
        # the chunks' last backwards in the order the stage runs them (the cool-down goes from the last
        # chunk to the first); their reductions queue on one stream
        last_bwd = np.flatnonzero((~sa.fwd[s]) & (sa.mb[s] == m - 1))
        for k in last_bwd.tolist():
            b0 = float(res.start[s, k])
            for ready, d in smp.reductions[int(sa.chunk[s, k])]:
                q = max(q, b0 + ready) + d
        final = 0.0
        if not plan.overlap_p2p:
            final = float(send_of[s, -1])
        t_opt = max(last_end + final + smp.deferred_us, q)
        end = t_opt + smp.tail_us
        if plan.overlap_p2p and pp > 1:
            sends = send_bytes[stage_kind[s], ptype[s]] > 0
            if sends.any():
                arr = (E[s][sends] + out_delay[s][sends]
                       + alone[s, np.where(sa.fwd[s][sends], 0, 1)] * stretch[s][sends])
                end = max(end, float(arr.max()))
        stage_end[s] = end
        per_stage.append(_stage_breakdown(parts[stage_kind[s]][ptype[s]].sum(axis=0) + smp.tail_parts,
                                          res, s, body, gap, has, send_us, end))
    step = float(stage_end.max())
    for b in per_stage:
        b.idle_us += step - b.window_us
        b.window_us = step
    return ComposedStep(step_us=step, stage_end_us=stage_end, per_stage=per_stage,
                        sample_nodes=sum(x.nodes for x in samples), stage_kinds=len(samples), sweeps=res.sweeps,
                        extra={"stage_kinds": len(samples), "schedule_sweeps": res.sweeps})


def _stage_breakdown(fig: np.ndarray, res: ScheduleResult, s: int, body: np.ndarray, gap: np.ndarray,
                     has: np.ndarray, send_us: np.ndarray, end: float) -> Breakdown:
    """A stage's breakdown: its passes' and tail's figures from the samples, plus the pipeline transfer a
    pass waited for (the last `send` of the wait is transfer time, the rest idle, as in the replay)."""
    b = Breakdown(window_us=end)
    for name, v in zip(BREAKDOWN_FIELDS, fig.tolist()):
        setattr(b, name, v)
    prev = np.concatenate([[0.0], res.end[s, :-1]])
    wait = np.maximum(res.start[s] - (prev + gap[s]), 0.0)
    pp_exposed = float(np.sum(np.where(has[s], np.minimum(wait, send_us[s]), 0.0)))
    b.exposed_pp_comm_us += pp_exposed
    b.settle_by_kind()
    return b
