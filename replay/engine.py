"""The replay engine: SimPy processes serve each rank's CPU threads and GPU streams.

Model
- Every resource (CPU thread, GPU stream) is one SimPy process that serves its nodes in graph order.
- A GPU op starts when its stream is free and its deps have finished, plus its launch latency; it runs
  for the timing source's duration.
- A CPU thread replays its recorded timeline of op start/end marks: the recorded gap between two marks is
  CPU work (Python, framework overhead, the op's own time) that the replay keeps. A mark waits for its
  deps (start deps at an op's start, SYNC deps at its end); the part of a gap that the recording spent
  waiting for that dep is dropped, so a dep that finishes earlier in the replay lets the thread go on
  earlier (this is how a shorter kernel shortens a cudaStreamSynchronize).
- A collective whose process group is fully simulated is a rendezvous: it completes for every member
  once the last member arrives plus the transfer time. Otherwise it takes its timing duration.

Ranks start where the recording put them (`align="recorded"`): one rank's clock is compared to another's
through the collectives they share (the members of one collective finish together), and when they agree
every rank keeps its recorded offset from the earliest one, so a rank that entered the step late still
does and the early ranks' first collective absorbs the wait, as measured. When the clocks do not agree
(or `align="start"`) every rank starts at its own first timestamp.

Time travels on the events: a process computes its nodes' start/end times as far as their inputs are
known and blocks (yields a SimPy event) only on a dep or a rendezvous that is not complete yet. Because
each resource serves a fixed order and every constraint is a max over finished inputs, this gives the
same times as stepping a clock through every node, at a fraction of the events - which is what lets the
engine replay hundreds of thousands of nodes per second.
"""
from __future__ import annotations

import gc
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import simpy

from chakra_schema.graph import CommType, EdgeKind, ExecutionGraph, NodeType
from replay.fabric import IdealFabric, contention_summary, fabric_for
from replay.timing import TimingSource

_SYNC = int(EdgeKind.SYNC)
NEG_INF = float("-inf")
_COLL_TYPES = (int(NodeType.COMM_COLL_NODE), int(NodeType.COMM_SEND_NODE), int(NodeType.COMM_RECV_NODE))


ALIGN_MODES = ("recorded", "start")
# Members of one collective finish together; on one shared clock a rank's recorded ends differ from the
# others' by the wake-up jitter of the waiting threads (NCCL kernels: microseconds; gloo on CPU: up to
# about 1 ms, seen on 4-rank sets). Clocks of unsynchronized hosts differ by far more.
CLOCK_TOLERANCE_US = 2000.0


class ReplayError(RuntimeError):
    """The graphs cannot be replayed (a collective some member never reaches, a dependency deadlock)."""


@dataclass(frozen=True)
class Alignment:
    """How the ranks' timelines were placed relative to each other."""

    requested: str                    # "recorded" | "start"
    used: str                         # what the replay did ("start" when recorded offsets are unusable)
    note: str = ""                    # why `used` differs from `requested`, or what the clock check found
    clock_skew_us: float | None = None  # largest clock offset of a rank against the others (clock_offsets_us)


@dataclass
class SimulatedRun:
    """Raw output of `simulate`: simulated start/end of every node of every rank (us, relative to each
    rank's recorded origin), plus what bound each node's start (for the critical path)."""

    graphs: list[ExecutionGraph]
    offsets: np.ndarray            # int64 [R+1] global index of each rank's first node
    start: np.ndarray              # float64 [total]
    end: np.ndarray                # float64 [total]
    bound_by: np.ndarray           # int64 [total] mark code (2j start / 2j+1 end of node j) that set the start
    bound_end: np.ndarray          # int64 [total] mark code that set the end (2i: its own start + duration)
    origin_us: np.ndarray          # float64 [R] recorded time subtracted from each rank's times
    rendezvous: list[list[int]]    # global node indices of each completed multi-rank collective
    timing_name: str = ""
    durations: np.ndarray = field(default_factory=lambda: np.zeros(0))  # float64 [total] timing durations
    # float64 [total] how long each transfer moved data, links shared (its end minus this is when it began,
    # after any wait for peers); the timing duration for every other node
    transfer_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    alignment: Alignment = field(default_factory=lambda: Alignment("start", "start"))
    contention: dict = field(default_factory=dict)  # what the fabric did (replay.fabric.contention_summary)

    def rank_slice(self, r: int) -> slice:
        return slice(int(self.offsets[r]), int(self.offsets[r + 1]))


@dataclass
class _Rendezvous:
    members: int
    nodes: list[int] = field(default_factory=list)
    arrival: float = -np.inf
    last: int = -1                  # the member that arrived last (it sets everyone's end)
    event: simpy.Event | None = None
    label: str = ""
    sender: int = -1                # send/recv: the send, which does not wait for its receiver
    send_done: float | None = None

    def reset(self) -> None:
        """Forget a previous replay pass (the plan itself stays)."""
        self.nodes = []
        self.arrival, self.last, self.event, self.send_done = -np.inf, -1, None, None


def _collective_label(g: ExecutionGraph, i: int) -> str:
    ct = g.attr(i, "comm_type")
    t = int(g.node_type[i])
    if t == NodeType.COMM_SEND_NODE:
        return "send"
    if t == NodeType.COMM_RECV_NODE:
        return "recv"
    try:
        return CommType(int(ct)).name.lower() if ct is not None else g.name[i]
    except ValueError:
        return g.name[i]


def _group_of(g: ExecutionGraph, i: int, simulated: set[int]) -> tuple[object, list[int]] | None:
    """(group key, member ranks) of a collective when its whole group is simulated, else None."""
    t = int(g.node_type[i])
    if t in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
        src = g.attr(i, "comm_src")
        dst = g.attr(i, "comm_dst")
        if t == NodeType.COMM_SEND_NODE:
            src = g.rank if src is None else src
        else:
            dst = g.rank if dst is None else dst
        if src is None or dst is None or int(src) not in simulated or int(dst) not in simulated:
            return None
        # pair the k-th send a->b with the k-th recv a->b; a tag, when given, keeps messages apart
        tag = g.attr(i, "comm_tag")
        key = ("p2p", int(src), int(dst)) if tag is None else ("p2p", int(src), int(dst), int(tag))
        return key, sorted({int(src), int(dst)})
    ranks = g.attr(i, "pg_ranks")
    if ranks:
        ranks = sorted(int(r) for r in ranks)
        if len(ranks) < 2 or not set(ranks) <= simulated:
            return None
        name = g.attr(i, "pg_name")
        return (("pg", str(name)) if name not in (None, "") else ("ranks", tuple(ranks))), ranks
    # no group recorded: the collective spans the world, which we can rendezvous only when all of it is here
    world = g.world_size
    if world > 1 and len(simulated) == world and set(range(world)) == simulated:
        name = g.attr(i, "pg_name")
        return (("pg", str(name)) if name not in (None, "") else ("world",)), sorted(simulated)
    return None


def _plan_rendezvous(graphs: Sequence[ExecutionGraph], offsets: np.ndarray) -> dict[int, _Rendezvous]:
    """Match the collectives of all simulated ranks: the k-th collective of a process group on one rank
    meets the k-th of that group on every other member (send/recv: the k-th send a->b meets the k-th recv
    a->b). Raise ReplayError, before anything runs, when a member never reaches one."""
    simulated = {g.rank for g in graphs}
    # per (group key) -> per rank -> list of global node indices in issue order
    issued: dict[object, dict[int, list[int]]] = {}
    members_of: dict[object, list[int]] = {}
    for r, g in enumerate(graphs):
        # a node's group depends only on its type and attrs (shared by the nodes of a generated template op)
        groups: dict[tuple, tuple[object, list[int]] | None] = {}
        node_type = g.node_type
        for i in g.collectives().tolist():
            memo = (int(node_type[i]), id(g.attrs.get(i)))
            if memo in groups:
                grp = groups[memo]
            else:
                grp = groups[memo] = _group_of(g, i, simulated)
            if grp is None:
                continue
            key, ranks = grp
            if g.rank not in ranks:
                continue
            issued.setdefault(key, {}).setdefault(g.rank, []).append(int(offsets[r]) + i)
            members_of.setdefault(key, ranks)
    rank_pos = {g.rank: r for r, g in enumerate(graphs)}
    plan: dict[int, _Rendezvous] = {}
    for key, per_rank in issued.items():
        ranks = members_of[key]
        counts = {rk: len(per_rank.get(rk, [])) for rk in ranks}
        top = max(counts.values())
        for rk, c in counts.items():
            if c < top:
                # report the first collective this rank never reaches, as issued by a rank that does
                other = next(o for o in ranks if counts[o] == top)
                gi = per_rank[other][c]
                og = graphs[rank_pos[other]]
                li = gi - int(offsets[rank_pos[other]])
                raise ReplayError(
                    f"rank {rk} never reaches {_collective_label(og, li)} #{c + 1} of process group "
                    f"{_key_label(key)} (ranks {ranks}): rank {other} issues it ('{og.name[li]}') and "
                    f"rank {rk} has only {c} collectives in that group")
        for k in range(top):
            nodes = [per_rank[rk][k] for rk in ranks]
            labels = set()
            for gi in nodes:
                r = int(np.searchsorted(offsets, gi, side="right") - 1)
                labels.add(_collective_label(graphs[r], gi - int(offsets[r])))
            if len(labels) > 1 and not (isinstance(key, tuple) and key[0] == "p2p"):
                raise ReplayError(f"collective #{k + 1} of process group {_key_label(key)} differs across "
                                  f"ranks {ranks}: {sorted(labels)}")
            rv = _Rendezvous(members=len(nodes), label=f"{labels.pop()} #{k + 1} of {_key_label(key)}")
            if key[0] == "p2p":
                rv.sender = next((gi for gi in nodes if _node_type_at(graphs, offsets, gi) == NodeType.COMM_SEND_NODE),
                                 -1)
            for gi in nodes:
                plan[gi] = rv
    return plan


def _solo_transfers(graphs: Sequence[ExecutionGraph], offsets: np.ndarray,
                    plan: dict[int, _Rendezvous]) -> dict[int, tuple[tuple, list[int]]]:
    """GPU communication nodes that are no rendezvous (their other members are not simulated):
    global index -> (transfer key, group ranks). The k-th collective of one group is one transfer on
    every simulated member, so the key is (group, k)."""
    out: dict[int, tuple[tuple, list[int]]] = {}
    for r, g in enumerate(graphs):
        off = int(offsets[r])
        count: dict[tuple, int] = {}
        # a node's group depends only on its type and attrs, which generated graphs share between the
        # nodes of one template op: work it out once per attrs object
        seen: dict[tuple, tuple[tuple, list[int]]] = {}
        node_type = g.node_type
        for i in np.flatnonzero(np.isin(node_type, _COLL_TYPES) & g.is_gpu()).tolist():
            if off + i in plan:
                continue
            a = g.attrs.get(i)
            t = int(node_type[i])
            memo = (t, id(a))
            hit = seen.get(memo)
            if hit is None:
                if t == NodeType.COMM_COLL_NODE:
                    group = sorted(int(x) for x in (g.attr(i, "pg_ranks") or range(max(g.world_size, 1))))
                    name = g.attr(i, "pg_name")
                    gk: tuple = ("pg", str(name)) if name not in (None, "") else ("ranks", tuple(group))
                else:
                    src = int(g.attr(i, "comm_src", g.rank))
                    dst = int(g.attr(i, "comm_dst", g.rank))
                    group = sorted({src, dst})
                    gk = ("p2p", src, dst, g.attr(i, "comm_tag"))
                hit = seen[memo] = (gk, group)
            gk, group = hit
            k = count[gk] = count.get(gk, -1) + 1
            out[off + i] = (gk + (k,), group)
    return out


def _node_type_at(graphs: Sequence[ExecutionGraph], offsets: np.ndarray, gi: int) -> int:
    r = int(np.searchsorted(offsets, gi, side="right") - 1)
    return int(graphs[r].node_type[gi - int(offsets[r])])


def _key_label(key: object) -> str:
    if isinstance(key, tuple) and key and key[0] == "pg":
        return f"'{key[1]}'"
    if isinstance(key, tuple) and key and key[0] == "p2p":
        return f"p2p {key[1]}->{key[2]}"
    return str(key)


OVERLAP_TOL_US = 0.0     # any recorded overlap: trace timing keeps the recorded relation


def _recorded_overlaps(nodes: list[int], rec_start: np.ndarray, rec_end: np.ndarray) -> dict[int, float]:
    """GPU nodes that the recording shows starting before the previous node of their stream had ended, by how
    much (us). Blackwell's programmatic dependent launch lets a kernel's prologue run under the tail of the
    kernel before it on the same stream (CUDA graphs of sglang / vLLM decode: 674 of 692 kernels of one B300
    trace); serving the stream strictly in order added every overlap to the step (+4.9% and +9.3% on two
    such traces). The replay lets such a node start that much before its predecessor ends, never before the
    predecessor starts."""
    idx = np.asarray(nodes, np.int64)
    if len(idx) < 2:
        return {}
    over = rec_end[idx[:-1]] - rec_start[idx[1:]]
    hit = np.flatnonzero(over > OVERLAP_TOL_US)
    return dict(zip(idx[1:][hit].tolist(), over[hit].tolist()))


def _thread_marks(start: np.ndarray, end: np.ndarray, nodes: np.ndarray) -> list[int]:
    """The start/end marks of one thread's ops `nodes` (in recorded start order, with their recorded
    `start` and `end`) as codes 2*i (start of node i) and 2*i+1 (its end). An op ends just before the first later op that starts after its end;
    ops ending at the same place close innermost first, as a call stack unwinds. A thread with no
    recorded times (e.g. a foreign .et) runs its ops one after the other."""
    n = len(start)
    k = np.arange(n, dtype=np.int64)
    if n == 0:
        return []
    if not start.any():
        return np.column_stack([2 * nodes, 2 * nodes + 1]).ravel().tolist()
    close_at = np.maximum(np.searchsorted(start, end, side="left"), k + 1)
    position = np.concatenate([k, close_at])
    is_open = np.concatenate([np.ones(n, np.int64), np.zeros(n, np.int64)])
    inner_first = np.concatenate([np.zeros(n, np.int64), -k])
    order = np.lexsort((inner_first, is_open, position))
    codes = np.concatenate([2 * nodes, 2 * nodes + 1])
    return codes[order].tolist()


def _clock_origin(g: ExecutionGraph) -> float:
    """The rank's recorded clock reading at its time 0 (converted traces keep their times relative to
    their first event and the absolute origin in metadata["time_origin_us"])."""
    try:
        return float(g.metadata.get("time_origin_us") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def clock_offsets_us(graphs: Sequence[ExecutionGraph], plan: dict[int, _Rendezvous]) -> np.ndarray | None:
    """Each rank's clock offset (us) against the others, read from the collectives they share: members
    of one collective finish together, so a rank whose recorded end of a collective is consistently
    later than the collective's median end runs a later clock. The median over a rank's collectives
    keeps the wake-up jitter of single collectives out. None when no recorded collective spans two
    ranks. Point-to-point pairs are left out: an eager send does not end with its receive."""
    ends = np.concatenate([g.start_us + g.duration_us + _clock_origin(g) for g in graphs])
    offsets = np.cumsum([0] + [len(g) for g in graphs])
    members: dict[int, list[int]] = {}
    for gi, rv in plan.items():
        if rv.sender < 0:
            members.setdefault(id(rv), []).append(gi)
    lag: list[list[float]] = [[] for _ in graphs]
    for m in members.values():
        if len(m) < 2:
            continue
        e = ends[m]
        mid = float(np.median(e))
        for gi, t in zip(m, e.tolist()):
            lag[int(np.searchsorted(offsets, gi, side="right") - 1)].append(t - mid)
    if not any(lag):
        return None
    return np.array([float(np.median(x)) if x else 0.0 for x in lag])


def rank_origins(graphs: Sequence[ExecutionGraph], plan: dict[int, _Rendezvous],
                 align: str = "recorded") -> tuple[np.ndarray, Alignment]:
    """The recorded time each rank's replay starts from: one common origin (the earliest rank's first
    timestamp) when `align` is "recorded" and the ranks' clocks agree, else each rank's own first timestamp."""
    if align not in ALIGN_MODES:
        raise ValueError(f"unknown alignment '{align}' (choose from {', '.join(ALIGN_MODES)})")
    own = np.array([float(g.start_us.min()) if len(g) else 0.0 for g in graphs])
    if align == "start" or len(graphs) < 2 or not any(g.start_us.any() for g in graphs):
        return own, Alignment(align, align)  # one rank, or no recorded times (a generated graph): nothing to align
    lag = clock_offsets_us(graphs, plan)
    if lag is None:
        return own, Alignment(align, "start", "no recorded collective spans two of the replayed ranks, so their "
                                              "clocks cannot be compared: every rank starts at its first event")
    worst = int(np.argmax(np.abs(lag)))
    skew = float(np.abs(lag).max())
    if skew > CLOCK_TOLERANCE_US:
        return own, Alignment(align, "start", f"the ranks' clocks disagree (rank {graphs[worst].rank}'s collectives "
                                              f"end {lag[worst] / 1000:+.3f} ms from the other members', more than "
                                              f"{CLOCK_TOLERANCE_US / 1000:g} ms): every rank starts at its first "
                                              f"event", skew)
    clock = np.array([_clock_origin(g) for g in graphs])
    first = float((own + clock).min())  # the earliest rank's first event on the shared clock
    return first - clock, Alignment(align, "recorded", "", skew)


def simulate(graphs: Sequence[ExecutionGraph], timing: TimingSource,
             progress: Callable[[int, int], None] | None = None, align: str = "recorded") -> SimulatedRun:
    """Replay all ranks together. Returns per-node simulated times. `align`: "recorded" keeps the
    recorded offsets between ranks when their clocks agree (see `rank_origins`), "start" starts every rank
    at its own first event."""
    # The run allocates millions of small objects that all live until it ends: the cyclic garbage
    # collector would rescan them again and again for nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(graphs, timing, progress, align)
    finally:
        if was_enabled:
            gc.enable()


def _simulate(graphs: Sequence[ExecutionGraph], timing: TimingSource,
              progress: Callable[[int, int], None] | None, align: str) -> SimulatedRun:
    graphs = list(graphs)
    ranks = [g.rank for g in graphs]
    if len(set(ranks)) != len(ranks):
        raise ReplayError(f"two graphs claim the same rank: {sorted(ranks)}")
    sizes = [len(g) for g in graphs]
    offsets = np.zeros(len(graphs) + 1, np.int64)
    offsets[1:] = np.cumsum(sizes)
    total = int(offsets[-1])
    plan = _plan_rendezvous(graphs, offsets)
    origins, alignment = rank_origins(graphs, plan, align)

    # Flat per-node columns over all ranks (Python lists: the loop below indexes them one by one).
    dur: list[float] = []
    lat: list[float] = []
    rec_start: list[float] = []
    rec_end: list[float] = []
    dep_ptr: list[int] = [0]      # all deps (GPU streams wait for all of them at start)
    dep_src: list[int] = []
    sptr: list[int] = [0]         # start deps of CPU marks (everything but SYNC)
    ssrc: list[int] = []
    eptr: list[int] = [0]         # end deps of CPU marks (SYNC)
    esrc: list[int] = []
    for r, g in enumerate(graphs):
        off = int(offsets[r])
        origin = float(origins[r])
        d = np.asarray(timing.node_durations(g), np.float64)
        la = timing.launch_latency_us(g)
        dur.extend(d.tolist())
        lat.extend((np.zeros(len(g)) if la is None else np.asarray(la, np.float64)).tolist())
        rs = g.start_us - origin
        rec_start.extend(rs.tolist())
        rec_end.extend((rs + g.duration_us).tolist())
        src = g.dep_src.astype(np.int64) + off
        dst = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
        sync = g.dep_kind == _SYNC
        for ptr, out, keep in ((dep_ptr, dep_src, None), (sptr, ssrc, ~sync), (eptr, esrc, sync)):
            sel_src = src if keep is None else src[keep]
            sel_dst = dst if keep is None else dst[keep]
            counts = np.bincount(sel_dst, minlength=len(g)) if len(g) else np.zeros(0, np.int64)
            ptr.extend((np.cumsum(counts) + ptr[-1]).tolist())
            out.extend(sel_src.tolist())

    rec_start_np = np.asarray(rec_start)
    rec_end_np = np.asarray(rec_end)
    fabric = fabric_for(timing)
    solo = _solo_transfers(graphs, offsets, plan) if not isinstance(fabric, IdealFabric) else {}
    unique_rvs = {id(rv): rv for rv in plan.values()}
    rv_key = {i: ("rv", k) for k, i in enumerate(unique_rvs)}
    transfer_end = fabric.transfer_end
    offsets_list = offsets.tolist()
    # every pass serves the same nodes on each GPU stream / CPU thread, in graph order
    streams: list[tuple[int, object, list[int]]] = []
    early: dict[int, float] = {}     # GPU nodes recorded starting before their stream's previous node ended
    for r, g in enumerate(graphs):
        off = int(offsets[r])
        res_of = g.resource
        order = np.argsort(res_of, kind="stable")
        bounds = np.searchsorted(res_of[order], np.arange(len(g.resources) + 1))
        for k, res in enumerate(g.resources):
            nodes = (order[bounds[k]:bounds[k + 1]] + off).tolist()
            if nodes:
                streams.append((r, res, nodes))
                if res.is_gpu:
                    early.update(_recorded_overlaps(nodes, rec_start_np, rec_end_np))

    def run_pass():
        """One replay of every rank; the fabric may ask for another (contended transfer times)."""
        for rv in unique_rvs.values():
            rv.reset()
        env = simpy.Environment()
        finish: list[float | None] = [None] * total
        sstart: list[float] = [0.0] * total
        # What set each node's start and end, as a mark code: 2*j = the start of node j, 2*j+1 = its end,
        # -1 = nothing (the beginning of the run). The critical path walks these codes backwards.
        bound: list[int] = [-1] * total
        bound_end: list[int] = [-1] * total
        moved = list(dur)   # SimulatedRun.transfer_us of this pass
        waiters: dict[int, simpy.Event] = {}
        done_count = [0]

        def finished_nodes(n: int) -> None:
            done_count[0] += n
            if progress is not None:
                progress(done_count[0], total)

        def wait_for(i: int) -> simpy.Event:
            ev = waiters.get(i)
            if ev is None:
                ev = waiters[i] = env.event()
            return ev

        def locate(i: int) -> tuple[ExecutionGraph, int]:
            r = bisect_right(offsets_list, i) - 1
            return graphs[r], i - offsets_list[r]

        def rendezvous(i: int, arrival: float):
            """Generator: register arrival of node i at its rendezvous; returns the completion time.

            Collectives complete for all members once the last arrives, plus the transfer. Point-to-point
            messages are eager (buffered), as in MSCCL/ASTRA-sim send/recv graphs: the send completes after
            its own transfer whether or not the receiver is there yet, and the receive completes when both
            it has been posted and the data has arrived."""
            rv = plan[i]
            if rv.event is None:
                rv.event = env.event()
            if rv.sender >= 0:
                if i == rv.sender:
                    g, local = locate(i)
                    group = sorted({int(g.rank), int(g.attr(local, "comm_dst", g.rank))})
                    alone = float(timing.collective_us(g, local, group, [dur[i]]))
                    done = transfer_end(rv_key[id(rv)], arrival, alone, g, local, group)
                    moved[i] = done - arrival
                    rv.nodes.append(i)
                    rv.arrival, rv.last, rv.send_done = arrival, i, done
                    rv.event.succeed(done)
                    return done
                rv.nodes.append(i)
                sent = rv.send_done if rv.send_done is not None else (yield rv.event)
                moved[i] = sent - rv.arrival         # the data's transfer, from the send's start
                if sent > arrival:
                    rv.last = rv.sender
                    return sent
                rv.last = i
                return arrival
            rv.nodes.append(i)
            if arrival > rv.arrival:
                rv.arrival, rv.last = arrival, i
            if len(rv.nodes) == rv.members:
                member_durs = [dur[j] for j in rv.nodes]
                r0 = int(np.searchsorted(offsets, rv.nodes[0], side="right") - 1)
                g0 = graphs[r0]
                local = rv.nodes[0] - int(offsets[r0])
                group = sorted(ranks[int(np.searchsorted(offsets, j, side="right") - 1)] for j in rv.nodes)
                alone = float(timing.collective_us(g0, local, group, member_durs))
                done = transfer_end(rv_key[id(rv)], rv.arrival, alone, g0, local, group)
                for j in rv.nodes:
                    moved[j] = done - rv.arrival
                rv.event.succeed(done)
                return done
            done = yield rv.event
            return done

        def gpu_stream(nodes: list[int], dep_ptr=dep_ptr, dep_src=dep_src, finish=finish, sstart=sstart,
                       bound=bound, bound_end=bound_end, lat=lat, dur=dur, plan=plan, waiters=waiters,
                       solo=solo, early=early):
            t = 0.0
            prev = -1
            for i in nodes:
                ready = t
                overlap = early.get(i, 0.0) if prev >= 0 else 0.0
                if overlap:     # it ran under the previous kernel's tail (see _recorded_overlaps)
                    ready = max(sstart[prev], t - overlap)
                why = prev
                for e in range(dep_ptr[i], dep_ptr[i + 1]):
                    s = dep_src[e]
                    f = finish[s]
                    if f is None:
                        f = yield wait_for(s)
                    if overlap and s == prev:   # the stream-order edge to that kernel: the same early start
                        f = max(sstart[prev], f - overlap)
                    if f > ready:
                        ready, why = f, s
                st = ready + lat[i]
                sstart[i] = st
                bound[i] = 2 * why + 1 if why >= 0 else -1
                if i in plan:
                    en = yield from rendezvous(i, st)
                    bound_end[i] = 2 * plan[i].last
                elif i in solo:  # a transfer whose other members are not simulated: the fabric times it
                    key, group = solo[i]
                    g, local = locate(i)
                    en = transfer_end(key, st, dur[i], g, local, group)
                    moved[i] = en - st
                    bound_end[i] = 2 * i
                else:
                    en = st + dur[i]
                    bound_end[i] = 2 * i
                finish[i] = en
                if i in waiters:
                    waiters.pop(i).succeed(en)
                t = en
                prev = i
            finished_nodes(len(nodes))

        def cpu_thread(nodes: list[int], sptr=sptr, ssrc=ssrc, eptr=eptr, esrc=esrc, finish=finish, sstart=sstart,
                       bound=bound, bound_end=bound_end, dur=dur, plan=plan, waiters=waiters, rec_start=rec_start,
                       rec_end=rec_end):
            idx = np.asarray(nodes, np.int64)
            marks = _thread_marks(rec_start_np[idx], rec_end_np[idx], idx)
            t = 0.0
            prev_rec = 0.0
            prev_mark = -1
            last_open = -1
            for code in marks:
                i = code >> 1
                if code & 1:  # the end of node i
                    m = rec_end[i]
                    gap = dur[i] if last_open == i else m - prev_rec  # a leaf's own time comes from the timing source
                    lo, hi = eptr[i], eptr[i + 1]
                else:
                    m = rec_start[i]
                    gap = m - prev_rec
                    lo, hi = sptr[i], sptr[i + 1]
                if gap < 0.0:
                    gap = 0.0
                t_new = t + gap
                why = prev_mark
                if lo != hi:
                    # the recorded gap may hold a wait for these deps: keep only the work, then wait for them
                    d_rec = d_sim = NEG_INF
                    d_src = -1
                    for e in range(lo, hi):
                        s = esrc[e] if code & 1 else ssrc[e]
                        f = finish[s]
                        if f is None:
                            f = yield wait_for(s)
                        if f > d_sim:
                            d_sim, d_src = f, s
                        if rec_end[s] > d_rec:
                            d_rec = rec_end[s]
                    waited = d_rec - prev_rec
                    waited = 0.0 if waited < 0.0 else (gap if waited > gap else waited)
                    after = m - (d_rec if d_rec > prev_rec else prev_rec)
                    t_work = t + gap - waited
                    t_dep = d_sim + (after if after > 0.0 else 0.0)
                    if t_dep > t_work:
                        t_new, why = t_dep, 2 * d_src + 1
                    else:
                        t_new = t_work
                if code & 1:
                    if i in plan_end:
                        # the recorded length of a rendezvous collective holds its wait for peers: drop it
                        done = plan_end.pop(i)
                        if done > t:
                            t_new, why = done, 2 * plan[i].last
                        else:
                            t_new = t
                    bound_end[i] = why
                    finish[i] = t_new
                    if i in waiters:
                        waiters.pop(i).succeed(t_new)
                    last_open = -1
                else:
                    sstart[i] = t_new
                    bound[i] = why
                    last_open = i
                    if i in plan:
                        # a collective on a worker thread: its end is the rendezvous, not its recorded length
                        plan_end[i] = yield from rendezvous(i, t_new)
                t = t_new
                prev_rec = m
                prev_mark = code
            finished_nodes(len(nodes))

        plan_end: dict[int, float] = {}
        processes = []
        for r, res, nodes in streams:
            proc = env.process(gpu_stream(nodes) if res.is_gpu else cpu_thread(nodes))
            processes.append((r, res, nodes, proc))
        env.run()

        if done_count[0] != total:
            raise ReplayError(_stuck_message(graphs, offsets, processes, finish, plan))
        return sstart, finish, bound, bound_end, moved

    fabric.begin_pass()
    sstart, finish, bound, bound_end, moved = run_pass()
    while not fabric.settled():
        fabric.begin_pass()
        sstart, finish, bound, bound_end, moved = run_pass()
    if progress is not None:
        progress(total, total)
    rendezvous_groups = []
    seen = set()
    for rv in plan.values():
        if id(rv) not in seen:
            seen.add(id(rv))
            rendezvous_groups.append(sorted(rv.nodes))
    return SimulatedRun(graphs=graphs, offsets=offsets, start=np.asarray(sstart), end=np.asarray(finish, dtype=float),
                        bound_by=np.asarray(bound, np.int64),
                        bound_end=np.asarray(bound_end, np.int64), origin_us=origins, rendezvous=rendezvous_groups,
                        timing_name=getattr(timing, "name", type(timing).__name__), durations=np.asarray(dur),
                        transfer_us=np.asarray(moved, dtype=float), alignment=alignment, contention=contention_summary(fabric))


def _stuck_message(graphs, offsets, processes, finish, plan) -> str:
    for r, res, nodes, proc in processes:
        pending = [i for i in nodes if finish[i] is None]
        if not pending:
            continue
        i = pending[0]
        g = graphs[r]
        local = i - int(offsets[r])
        if i in plan:
            rv = plan[i]
            return (f"rank {g.rank}: {rv.label} never completes: {len(rv.nodes)} of {rv.members} members "
                    f"arrived ('{g.name[local]}' on {res.label()})")
        return (f"rank {g.rank}: replay deadlocked at node id {int(g.node_id[local])} '{g.name[local]}' on "
                f"{res.label()}: its dependencies never finish (inconsistent stream order and deps?)")
    return "replay stopped before all nodes finished"
