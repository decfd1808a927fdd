"""Network model: topology, links shared by concurrent flows, and collective algorithms.

Topology (from the preset): GPUs of a node talk over NVLink, either through an NVSwitch crossbar (each
GPU has one egress and one ingress port of `nvlink_bw_gbs`) or over the DGX-1 hybrid cube mesh (one
directed link per GPU pair with `links x nvlink_link_bw_gbs`; non-adjacent pairs go through PCIe).
Between nodes, each GPU reaches its rail's NIC (`nics_per_node` NICs shared evenly); a rail-optimized
fat tree connects the same rail of every node through a leaf switch (`nodes_per_leaf` nodes per leaf),
and leaves through spines whose capacity is the leaf's downlink capacity / `oversubscription`.
Cross-rail traffic either hops over NVLink to the GPU on the destination's rail first (NCCL PXN) or
crosses the spine.

A flow is a path of links; concurrent flows share links max-min fairly (`max_min_fair_share`;
`flow_completion_times` re-shares as flows finish). A transfer (a collective, a send) is a set of flows
that move at one rate, so transfers in flight together share links at those coupled rates
(`shared_transfer_times`). A collective algorithm
(a class in `ALGORITHMS`) turns (operation, size, ranks) into rounds of flows plus the hop latencies on
its critical chain; its time under an NCCL protocol (LL / LL128 / Simple: bandwidth fraction and
latencies) is base latency + hop latencies + the bandwidth time of its rounds. `NetworkModel` picks the
fastest applicable (algorithm, protocol) pair, as NCCL's tuner does from its own cost model.

Scale: a group of whole consecutive nodes is symmetric, so ring, hierarchical and tree algorithms on
more than a few leaf groups of nodes take their bandwidth term from a representative sub-cluster
(`representative_nodes`) and their latency term in closed form: memory and time do not grow with the
rank count. Groups may have up to `MAX_COLLECTIVE_RANKS` ranks; the direct and pairwise all-to-all
exchange every pair of ranks, so they are limited to `MAX_ALL_TO_ALL_RANKS`. Past a limit the model
raises ValueError with a one-line message.

Size conventions are those of nccl-tests: all_reduce/broadcast/reduce: the buffer; all_gather: the
gathered (output) buffer; reduce_scatter: the input buffer; all_to_all: each rank's send buffer.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from chakra_schema.graph import CommType

from .config import HardwareConfig, ProtocolSpec, get_hardware

MAX_COLLECTIVE_RANKS = 1 << 20      # ranks in one collective group (1,048,576 GPUs)
MAX_ALL_TO_ALL_RANKS = 512          # pairwise exchanges: n^2 flows (512 ranks: ~8 s, 0.3 GB)
TREE_REPRESENTATIVE_LEAVES = 4      # trees over more leaf groups take their bandwidth from this many

Link = tuple  # ("nvl_tx", node, gpu), ("nic_tx", node, nic), ("spine_up", leaf_group, rail) ...
Path = tuple  # tuple of links


# ------------------------------------------------------------------------------- sharing of links
def max_min_fair_share(paths: Sequence[Sequence[Link]], capacity: dict[Link, float] | callable,
                       weights: Sequence[float] | None = None) -> np.ndarray:
    """Rates (capacity units) of flows that each use every link of their path, shared max-min fairly
    (progressive filling: the most contended link fixes the rate of its flows, repeat). A flow with an
    empty path gets an infinite rate. `weights[f]` > 1 stands for that many identical copies of flow f
    (each copy gets the returned rate): exact, and far cheaper than listing the copies."""
    return fair_share_on(FlowIncidence.of(paths, capacity), weights)


@dataclass(frozen=True)
class FlowIncidence:
    """Which flow uses which link (one entry per pair) and the links' capacities: built once for a set
    of paths, then shared max-min fairly under any weights (`fair_share_on`)."""

    flows: int
    flow_of: np.ndarray      # int [entries]
    link_of: np.ndarray      # int [entries]
    capacity: np.ndarray     # float [links]
    crossings: np.ndarray | None = None   # float [entries] times the flow crosses the link (None: once)

    @staticmethod
    def of(paths: Sequence[Sequence[Link]], capacity: dict[Link, float] | callable) -> "FlowIncidence":
        cap_of = capacity.__getitem__ if isinstance(capacity, dict) else capacity
        index: dict[Link, int] = {}
        fl, lk = [], []
        for f, p in enumerate(paths):
            for link in p:
                li = index.get(link)
                if li is None:
                    li = index[link] = len(index)
                fl.append(f)
                lk.append(li)
        return FlowIncidence(len(paths), np.asarray(fl, np.int64), np.asarray(lk, np.int64),
                             np.array([float(cap_of(link)) for link in index]))

    @staticmethod
    def of_transfers(transfers: Sequence[Sequence[Path]], capacity: dict[Link, float] | callable) -> "FlowIncidence":
        """Transfers whose flows move at one rate, each as one flow over its flows' links: one entry per
        (transfer, link) crossing that link as many times as the transfer has flows on it."""
        cap_of = capacity.__getitem__ if isinstance(capacity, dict) else capacity
        index: dict[Link, int] = {}
        fl, lk, times = [], [], []
        for t, flows in enumerate(transfers):
            on: dict[int, int] = {}
            for p in flows:
                for link in p:
                    li = index.setdefault(link, len(index))
                    on[li] = on.get(li, 0) + 1
            fl.extend([t] * len(on))
            lk.extend(on)
            times.extend(on.values())
        return FlowIncidence(len(transfers), np.asarray(fl, np.int64), np.asarray(lk, np.int64),
                             np.array([float(cap_of(link)) for link in index]), np.asarray(times, float))


def fair_share_on(inc: FlowIncidence, weights: Sequence[float] | None = None) -> np.ndarray:
    """`max_min_fair_share` on a prebuilt incidence (progressive filling)."""
    nflows = inc.flows
    rates = np.full(nflows, np.inf)
    if nflows == 0 or len(inc.capacity) == 0:
        return rates
    fl_a, lk_a = inc.flow_of, inc.link_of
    w = np.ones(nflows) if weights is None else np.asarray(weights, float)
    load = w[fl_a] if inc.crossings is None else w[fl_a] * inc.crossings   # per entry, per unit of rate
    remaining = inc.capacity.copy()
    active = np.zeros(nflows, bool)
    active[fl_a] = True          # a flow without links keeps its infinite rate
    nlinks = len(remaining)
    while active.any():
        sel = active[fl_a]
        counts = np.bincount(lk_a[sel], weights=load[sel], minlength=nlinks)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, remaining / np.maximum(counts, 1), np.inf)
        best = share.min()
        if not np.isfinite(best):
            break
        tight = share <= best * (1 + 1e-12)
        fixed = np.zeros(nflows, bool)   # flows crossing a bottleneck link: their rate is set now
        fixed[fl_a[sel & tight[lk_a]]] = True
        rates[fixed] = best
        active &= ~fixed
        used = fixed[fl_a]
        remaining = np.maximum(remaining - np.bincount(lk_a[used], weights=best * load[used], minlength=nlinks),
                               0.0)
    return rates


def flow_completion_times(paths: Sequence[Sequence[Link]], sizes: Sequence[float],
                          capacity: dict[Link, float] | callable) -> np.ndarray:
    """Finish time of each flow (size / capacity units) when all start together and bandwidth is
    re-shared max-min fairly every time a flow finishes."""
    n = len(paths)
    left = np.asarray(sizes, dtype=float).copy()
    done = np.zeros(n)
    alive = left > 0
    now = 0.0
    while alive.any():
        idx = np.flatnonzero(alive)
        rates = max_min_fair_share([paths[i] for i in idx], capacity)
        with np.errstate(divide="ignore"):
            t = np.where(np.isfinite(rates), left[idx] / rates, 0.0)
        dt = float(t.min())
        now += dt
        finite = np.isfinite(rates)
        left[idx] = np.where(finite, left[idx] - np.where(finite, rates, 0.0) * dt, 0.0)
        finished = idx[left[idx] <= 1e-9 * np.maximum(1.0, np.asarray(sizes, float)[idx])]
        if len(finished) == 0:  # numerical guard: retire the flow that was closest
            finished = idx[[int(np.argmin(t))]]
        done[finished] = now
        alive[finished] = False
    return done


def shared_completion_times(starts: Sequence[float], alone_us: Sequence[float], paths: Sequence[Sequence[Path]],
                            capacity: dict[Link, float] | callable) -> np.ndarray:
    """End times of transfers that start at `starts` and would take `alone_us` on an idle network, when
    those in flight at the same time share links (see `shared_transfer_times`)."""
    return shared_transfer_times(starts, alone_us, paths, capacity)[1]


def shared_transfer_times(starts: Sequence[float], alone_us: Sequence[float], paths: Sequence[Sequence[Path]],
                          capacity: dict[Link, float] | callable,
                          after: Sequence[int] | None = None,
                          cache: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(begin, end) of transfers that start at `starts` and would take `alone_us` on an idle network, when
    those in flight at the same time share links. Each transfer is a set of flows (`paths[i]`, one path
    per flow, all moving at one rate: a ring runs at the pace of its slowest link); while it runs, its
    speed is its max-min fair rate among the transfers in flight over its rate alone (`_cluster_speeds`).
    Speeds are re-shared whenever a transfer starts or ends (a fluid model). A transfer with no
    path, or alone in flight, runs at full speed. `after[i]` >= 0: transfer i cannot begin before that
    transfer ends (the previous transfer of its GPU stream: stream order holds however long sharing
    makes the first), so it begins at max(its start, that end). `cache`: a dict to keep the speeds of
    each mix of path lists across calls on the same path list objects and capacity (the keys are the
    path lists' ids: the caller keeps them alive); a fresh one per call by default."""
    n = len(starts)
    start = np.asarray(starts, float).copy()
    left = np.asarray(alone_us, float).copy()
    end = start + left
    if n < 2:
        return start, end
    nxt = [-1] * n                      # the transfer waiting for each one's end
    waiting = [False] * n
    if after is not None:
        for i, a in enumerate(after):
            if a >= 0:
                nxt[a] = i
                waiting[i] = True
    eps = 1e-9 * np.maximum(1.0, np.asarray(alone_us, float))
    if cache is None:
        cache = {}  # the same mix of transfers recurs every layer and step
    pending = [(start[j], j) for j in range(n) if not waiting[j]]
    heapq.heapify(pending)
    active: list[int] = []
    now = -np.inf
    remaining = n

    def finish(j: int, t: float) -> None:
        """Transfer j ends at t; its stream successor may begin then (or at its own start, if later)."""
        nonlocal remaining
        end[j] = t
        remaining -= 1
        w = nxt[j]
        if w >= 0:
            start[w] = max(start[w], t)
            heapq.heappush(pending, (start[w], w))

    while remaining:
        speed = _speeds(active, paths, capacity, cache)
        # next event: the next start, or the first active transfer to finish at the current speeds
        t_next, fin = (pending[0][0] if pending else np.inf), -1
        for j, sp in zip(active, speed):
            t = now + left[j] / sp
            if t < t_next:
                t_next, fin = t, j
        if not np.isfinite(t_next):   # nothing can run: only transfers behind a cycle of waits remain
            break
        for j, sp in zip(active, speed):
            left[j] -= (t_next - now) * sp
        now = t_next
        if fin >= 0:
            left[fin] = 0.0
        for j in [j for j in active if left[j] <= eps[j]]:
            finish(j, now)
        active = [j for j in active if left[j] > eps[j]]
        while pending and pending[0][0] <= now:
            _, j = heapq.heappop(pending)
            if left[j] > 0.0:
                active.append(j)
            else:
                finish(j, start[j])
    return start, end


def _speeds(active: list[int], paths: Sequence[Sequence[Path]], capacity, cache: dict) -> list[float]:
    """Speed (fraction of its alone speed) of each active transfer under max-min fair sharing. Only
    transfers that share links (directly or through others) affect each other, so each such cluster is
    solved on its own; transfers on the same path list (the same group) get the same speed, so a
    cluster's answer depends only on its mix of path lists, which is the cache key."""
    with_paths = [j for j in active if paths[j]]
    if len(with_paths) < 2:
        return [1.0] * len(active)
    # The answer depends only on the multiset of path lists in flight, which recurs every layer and step:
    # cache it whole, so the union-find below runs once per distinct mix instead of once per event.
    mix = ("mix", tuple(sorted(id(paths[j]) for j in with_paths)))
    by_pid = cache.get(mix)
    if by_pid is None:
        by_pid = _mix_speeds(with_paths, paths, capacity, cache)
        cache[mix] = by_pid
    return [by_pid.get(id(paths[j]), 1.0) if paths[j] else 1.0 for j in active]


def _mix_speeds(with_paths: list[int], paths: Sequence[Sequence[Path]], capacity, cache: dict) -> dict[int, float]:
    speed: dict[int, float] = {}
    for cluster in _link_clusters(with_paths, paths, cache):
        if len(cluster) < 2:
            continue
        key = tuple(sorted(id(paths[j]) for j in cluster))
        by_path = cache.get(key)
        if by_path is None:
            by_path = cache[key] = _cluster_speeds(cluster, paths, capacity, cache)
        for j in cluster:
            speed[id(paths[j])] = by_path[id(paths[j])]
    return speed


def _link_clusters(transfers: list[int], paths: Sequence[Sequence[Path]], cache: dict) -> list[list[int]]:
    """Groups of transfers connected by shared links. Transfers on one path list share all its links, so
    the union-find runs over the distinct path lists in flight (a handful: the TP, CP, DP... groups),
    and its partition is cached per set of path lists."""
    by_pid: dict[int, list[int]] = {}
    for j in transfers:
        by_pid.setdefault(id(paths[j]), []).append(j)
    key = ("clusters", frozenset(by_pid))
    parts = cache.get(key)
    if parts is None:
        pids = list(by_pid)
        parent = list(range(len(pids)))

        def root(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        owner: dict[Link, int] = {}
        for pos, pid in enumerate(pids):
            j = by_pid[pid][0]
            links = cache.get(("links", pid))
            if links is None:
                links = cache[("links", pid)] = {link for p in paths[j] for link in p}
            for link in links:
                other = owner.setdefault(link, pos)
                if other != pos:
                    a, b = root(other), root(pos)
                    if a != b:
                        parent[b] = a
        groups: dict[int, list[int]] = {}
        for pos, pid in enumerate(pids):
            groups.setdefault(root(pos), []).append(pid)
        parts = cache[key] = list(groups.values())
    return [[j for pid in part for j in by_pid[pid]] for part in parts]


def _cluster_speeds(cluster: list[int], paths: Sequence[Sequence[Path]], capacity, cache: dict) -> dict[int, float]:
    """Speed of each path list's transfers in a cluster sharing links. A transfer's flows move at one rate
    (module docstring), so each transfer enters the max-min fair sharing as one flow over all its flows'
    links (`FlowIncidence.of_transfers`); transfers on the same path list are copies of it (weights). Its
    speed is that shared rate over its rate alone."""
    copies: dict[int, int] = {}
    first: dict[int, int] = {}
    for j in cluster:
        pid = id(paths[j])
        copies[pid] = copies.get(pid, 0) + 1
        first.setdefault(pid, j)
    # the same set of path lists recurs with other copy counts: build its incidence once
    order = sorted(first)
    inc_key = ("transfers", tuple(order))
    inc = cache.get(inc_key)
    if inc is None:
        inc = cache[inc_key] = FlowIncidence.of_transfers([paths[first[pid]] for pid in order], capacity)
    shared = fair_share_on(inc, [copies[pid] for pid in order])
    by_path: dict[int, float] = {}
    for c, pid in enumerate(order):
        alone = cache.get(("alone", pid))
        if alone is None:
            one = FlowIncidence.of_transfers([paths[first[pid]]], capacity)
            alone = cache[("alone", pid)] = float(fair_share_on(one)[0])
        # a transfer without links is never slowed (its rates are inf); one over a zero-capacity link, which
        # the presets rule out, is left at full speed rather than divided by zero
        by_path[pid] = min(1.0, shared[c] / alone) if np.isfinite(alone) and alone > 0 else 1.0
    return by_path


# --------------------------------------------------------------------------------------- topology
class Topology:
    """Links, capacities (bytes/us) and paths of a cluster of `hw` nodes."""

    def __init__(self, hw: HardwareConfig):
        self.hw = hw
        node, net = hw.node, hw.network
        self.gpn = node.gpus_per_node
        self.nvl = node.nvlink_bw_gbs * node.nvlink_efficiency * 1e3
        self.nic = hw.nic_gbs * 1e3
        self.pcie = hw.gpu.pcie_bw_gbs * hw.compute.pcie_efficiency * 1e3
        self.spine = net.nodes_per_leaf * self.nic / net.oversubscription
        self.mesh: dict[tuple[int, int], float] = {}
        self._bw_cache: dict[tuple, float] = {}
        if node.intra_topology == "hybrid_cube_mesh":
            for a, b, nlinks in node.nvlink_mesh:
                bw = nlinks * node.nvlink_link_bw_gbs * node.nvlink_efficiency * 1e3
                self.mesh[(a, b)] = self.mesh[(b, a)] = bw

    # ranks -> places
    def node_of(self, rank: int) -> int:
        return rank // self.gpn

    def local_of(self, rank: int) -> int:
        return rank % self.gpn

    def nic_of(self, local: int) -> int:
        return local * self.hw.network.nics_per_node // self.gpn

    def leaf_group(self, node: int) -> int:
        return node // self.hw.network.nodes_per_leaf

    def capacity(self, link: Link) -> float:
        kind = link[0]
        if kind in ("nvl_tx", "nvl_rx"):
            return self.nvl
        if kind == "nvl":
            return self.mesh[(link[2], link[3])]
        if kind in ("pcie_tx", "pcie_rx"):
            return self.pcie
        if kind in ("nic_tx", "nic_rx"):
            return self.nic
        if kind in ("spine_up", "spine_down"):
            return self.spine
        raise KeyError(link)

    @property
    def is_mesh(self) -> bool:
        return bool(self.mesh)

    def adjacent(self, a: int, b: int) -> bool:
        """Direct NVLink between local GPUs a and b."""
        return not self.is_mesh or (a, b) in self.mesh

    def _intra(self, node: int, a: int, b: int) -> Path:
        if a == b:
            return ()
        if not self.is_mesh:
            return (("nvl_tx", node, a), ("nvl_rx", node, b))
        if (a, b) in self.mesh:
            return (("nvl", node, a, b),)
        return (("pcie_tx", node, a), ("pcie_rx", node, b))

    @lru_cache(maxsize=1 << 18)
    def path(self, src: int, dst: int) -> Path:
        """Links a transfer from global rank `src` to `dst` crosses."""
        na, nb = self.node_of(src), self.node_of(dst)
        la, lb = self.local_of(src), self.local_of(dst)
        if na == nb:
            return self._intra(na, la, lb)
        ra, rb = self.nic_of(la), self.nic_of(lb)
        head: Path = ()
        if ra != rb and self.hw.network.pxn and not self.is_mesh:
            # PXN: move the data over NVLink to the GPU that owns the destination's rail, send from there
            # (the destination's local index owns rail rb, so its twin on the source node is the proxy)
            head = self._intra(na, la, lb)
            ra = rb
        links = list(head) + [("nic_tx", na, ra)]
        ga, gb = self.leaf_group(na), self.leaf_group(nb)
        if ga != gb or ra != rb:
            links += [("spine_up", ga, ra), ("spine_down", gb, rb)]
        links.append(("nic_rx", nb, rb))
        return tuple(links)

    def hop_class(self, src: int, dst: int) -> tuple[str, int]:
        """('self' | 'nvlink' | 'pcie' | 'net', spine hops) of a transfer from `src` to `dst`."""
        if src == dst:
            return "self", 0
        na, nb = src // self.gpn, dst // self.gpn
        la, lb = src % self.gpn, dst % self.gpn
        if na == nb:
            return ("nvlink", 0) if self.adjacent(la, lb) else ("pcie", 0)
        ra, rb = self.nic_of(la), self.nic_of(lb)
        if self.hw.network.pxn and not self.is_mesh:
            ra = rb
        leaf = self.hw.network.nodes_per_leaf
        return "net", int(na // leaf != nb // leaf or ra != rb)

    def hop_latency(self, src: int, dst: int, proto: ProtocolSpec) -> float:
        """Latency of one hop of an NCCL pipeline from `src` to `dst` under `proto`."""
        kind, spines = self.hop_class(src, dst)
        if kind == "net":
            return proto.net_hop_us + spines * self.hw.network.switch_latency_us
        if kind == "nvlink":
            return proto.nvlink_hop_us
        if kind == "pcie":
            return 2 * proto.nvlink_hop_us  # through the host bridge
        return 0.0

    def max_latency(self, srcs: Sequence[int], dsts: Sequence[int], proto: ProtocolSpec) -> float:
        """Largest hop latency among the pairs (srcs[i], dsts[i]), from where the pairs sit (same GPU,
        same node over NVLink or PCIe, other node on the same or another leaf/rail) without building
        their paths."""
        s = np.asarray(srcs, np.int64)
        d = np.asarray(dsts, np.int64)
        if len(s) == 0:
            return 0.0
        ns, nd = s // self.gpn, d // self.gpn
        remote = ns != nd
        if remote.any():
            ls, ld = s[remote] % self.gpn, d[remote] % self.gpn
            nics = self.hw.network.nics_per_node
            rail_s, rail_d = ls * nics // self.gpn, ld * nics // self.gpn
            if self.hw.network.pxn and not self.is_mesh:
                rail_s = rail_d
            leaf = self.hw.network.nodes_per_leaf
            spine = (ns[remote] // leaf != nd[remote] // leaf) | (rail_s != rail_d)
            return proto.net_hop_us + (self.hw.network.switch_latency_us if spine.any() else 0.0)
        local = s != d
        if not local.any():
            return 0.0
        if self.is_mesh:
            ls, ld = (s[local] % self.gpn).tolist(), (d[local] % self.gpn).tolist()
            if any((a, b) not in self.mesh for a, b in zip(ls, ld)):
                return 2 * proto.nvlink_hop_us  # through the host bridge (PCIe)
        return proto.nvlink_hop_us

    def bandwidth_time(self, flows: Sequence[tuple[int, int, float]], proto: ProtocolSpec | None = None,
                       extra: Sequence[tuple[Path, float]] = ()) -> float:
        """Time (us) for concurrent flows (src, dst, bytes) (+ flows on explicit paths) to drain. A
        protocol scales every capacity by its bandwidth fraction, hence the time by its inverse."""
        frac = proto.bw_fraction if proto else 1.0
        # Drain times scale linearly with the bytes: cache the pattern at unit scale, so the same
        # collective at another size costs nothing.
        scale = max([b for _, _, b in flows] + [b for _, b in extra] + [0.0])
        if scale <= 0:
            return 0.0
        key = (tuple((s, d, b / scale) for s, d, b in flows), tuple((p, b / scale) for p, b in extra))
        base = self._bw_cache.get(key)
        if base is None:
            paths = [self.path(s, d) for s, d, _ in flows] + [p for p, _ in extra]
            sizes = [b for _, _, b in key[0]] + [b for _, b in key[1]]
            done = flow_completion_times(paths, sizes, self.capacity)
            finite = done[np.isfinite(done)]
            base = float(finite.max()) if len(finite) else 0.0
            if len(self._bw_cache) > 4096:
                self._bw_cache.clear()
            self._bw_cache[key] = base
        return base * scale / frac


    def link_drain_time(self, flows: Sequence[tuple[int, int, float]]) -> float:
        """Time (us) for the most loaded link to carry the bytes of concurrent flows (src, dst, bytes)."""
        load: dict[Link, float] = {}
        for s, d, b in flows:
            for link in self.path(s, d):
                load[link] = load.get(link, 0.0) + b
        return max((v / self.capacity(link) for link, v in load.items()), default=0.0)


# ----------------------------------------------------------------------------- algorithm registry
ALGORITHMS: dict[str, type[CollectiveAlgorithm]] = {}


def register_algorithm(cls: type[CollectiveAlgorithm]) -> type[CollectiveAlgorithm]:
    ALGORITHMS[cls.name] = cls
    return cls




_BY_NODE_CACHE: dict = {}


def _by_node(topo: Topology, ranks: Sequence[int]) -> list[list[int]]:
    """Ranks grouped by node, nodes in order. Cached for the last group: every algorithm and protocol
    of one estimate asks for the same grouping, and a large group costs a pass over all its ranks."""
    key = (topo.gpn, ranks if isinstance(ranks, tuple) else tuple(ranks))   # all the grouping depends on
    hit = _BY_NODE_CACHE.get(key)
    if hit is not None:
        return hit
    gpn = topo.gpn
    nodes: dict[int, list[int]] = {}
    for r in sorted(ranks):
        nodes.setdefault(r // gpn, []).append(r)
    out = [nodes[k] for k in sorted(nodes)]
    if len(_BY_NODE_CACHE) >= 4:
        _BY_NODE_CACHE.clear()
    _BY_NODE_CACHE[key] = out
    return out


def whole_nodes(topo: Topology, ranks: Sequence[int]) -> tuple[int, int] | None:
    """(first node, number of nodes) when `ranks` (sorted) are every GPU of consecutive nodes, else None."""
    n, k = len(ranks), topo.gpn
    if n == 0 or n % k or ranks[0] % k or ranks[-1] - ranks[0] != n - 1:
        return None
    if n > 1 and not bool(np.all(np.diff(np.asarray(ranks, np.int64)) == 1)):
        return None
    return ranks[0] // k, n // k


def representative_nodes(topo: Topology, first_node: int, num_nodes: int, leaves: int = 2) -> int | None:
    """How many of a symmetric group's nodes reproduce its per-link loads, or None to use them all.

    Ring-like patterns over whole consecutive nodes load every leaf group alike: per channel one flow
    leaves and one enters each group, whatever the number of groups. So the first `leaves - 1` full
    leaf groups plus one group of the last group's size load each link as the whole group does."""
    per_leaf = topo.hw.network.nodes_per_leaf
    if first_node % per_leaf or num_nodes <= leaves * per_leaf:
        return None
    return (leaves - 1) * per_leaf + (num_nodes % per_leaf or per_leaf)


def _spine_crossings(topo: Topology, first_node: int, num_nodes: int, wrap: bool) -> int:
    """Consecutive node pairs (i, i+1) of a chain over `num_nodes` nodes (and the pair back to the
    first when `wrap`) that sit under different leaf switches."""
    per_leaf = topo.hw.network.nodes_per_leaf
    groups = (first_node + num_nodes - 1) // per_leaf - first_node // per_leaf + 1
    return (groups - 1) + (1 if wrap and groups > 1 else 0)


class CollectiveAlgorithm:
    """A collective algorithm: which operations/topologies it serves, the bytes each rank sends, and
    its time. Subclasses describe rounds of flows; the shared helpers do the link accounting."""

    name = ""
    ops: frozenset = frozenset()
    protocols: tuple[str, ...] = ("LL", "LL128", "Simple")
    auto = True  # considered when no algorithm is forced

    def supports(self, topo: Topology, comm: CommType, ranks: Sequence[int]) -> bool:
        return comm in self.ops and len(ranks) >= 2

    def bytes_sent_per_rank(self, comm: CommType, size: float, ranks: Sequence[int],
                            topo: Topology | None = None) -> list[float]:
        """Bytes each rank (in `ranks` order) puts on the wire."""
        raise NotImplementedError

    def time_us(self, topo: Topology, comm: CommType, size: float, ranks: Sequence[int],
                proto: ProtocolSpec) -> float:
        raise NotImplementedError


def _sent_from_flows(ranks: Sequence[int], rounds: Iterable[tuple[list[tuple[int, int, float]], int]]) -> list[float]:
    sent = {r: 0.0 for r in ranks}
    for flows, repeat in rounds:
        for s, _, b in flows:
            sent[s] += b * repeat
    return [sent[r] for r in ranks]


# ---------------------------------------------------------------------------------------- ring
@register_algorithm
class Ring(CollectiveAlgorithm):
    """NCCL ring: every rank sends to its successor; all-reduce = reduce-scatter + all-gather passes
    (2(n-1) steps of size/n), all-gather / reduce-scatter one pass (n-1 steps), broadcast / reduce a
    pipelined chain. Multi-node rings run one channel per local GPU, rotated so each channel leaves
    and enters every node on the same rail (NCCL's rail-aligned rings)."""

    name = "ring"
    ops = frozenset({CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER,
                     CommType.REDUCE_SCATTER_BLOCK, CommType.BROADCAST, CommType.REDUCE})

    def channels(self, topo: Topology, ranks: Sequence[int]) -> list[list[int]]:
        nodes = _by_node(topo, ranks)
        if len(nodes) == 1:
            if topo.is_mesh:
                rings = _mesh_rings(topo, tuple(sorted(ranks)))
                if rings:
                    return [list(r) for r in rings]
            return [sorted(ranks)]
        k = len(nodes[0])
        if any(len(n) != k for n in nodes):
            return [sorted(ranks)]
        out = []
        for c in range(k):
            ring, start = [], c
            for members in nodes:
                seq = [members[(start + t) % k] for t in range(k)]
                ring += seq
                start = (start + k - 1) % k  # next node starts on the GPU (rail) this one ended on
            out.append(ring)
        return out

    @staticmethod
    def steps(comm: CommType, n: int) -> int:
        return 2 * (n - 1) if comm == CommType.ALL_REDUCE else n - 1

    def bytes_sent_per_rank(self, comm, size, ranks, topo=None):
        n = len(ranks)
        if comm in (CommType.BROADCAST, CommType.REDUCE):
            # a pipelined chain: every rank but the last of the chain forwards the whole buffer
            return [float(size)] * (n - 1) + [0.0]
        return [self.steps(comm, n) * size / n] * n

    def time_us(self, topo, comm, size, ranks, proto):
        layout = whole_nodes(topo, ranks)
        if layout is not None:
            rep = representative_nodes(topo, *layout)
            if rep is not None:
                return self._time_symmetric(topo, comm, size, ranks, proto, layout, rep)
        n = len(ranks)
        chans = self.channels(topo, ranks)
        c = len(chans)
        if comm in (CommType.BROADCAST, CommType.REDUCE):
            flows = [(r[i], r[i + 1], size / c) for r in chans for i in range(n - 1)]
            lat = max(sum(topo.hop_latency(r[i], r[i + 1], proto) for i in range(n - 1)) for r in chans)
            return proto.base_latency_us + lat + topo.bandwidth_time(flows, proto)
        flows = [(r[i], r[(i + 1) % n], size / (n * c)) for r in chans for i in range(n)]
        steps = self.steps(comm, n)
        # pipelined: a chunk crosses `steps` hops; the latency is that of the hops it crosses
        loop = max(sum(topo.hop_latency(r[i], r[(i + 1) % n], proto) for i in range(n)) for r in chans)
        return proto.base_latency_us + loop * steps / n + steps * topo.bandwidth_time(flows, proto)


    def _time_symmetric(self, topo, comm, size, ranks, proto, layout: tuple[int, int], rep: int) -> float:
        """`time_us` of a ring over many whole nodes: bandwidth from the first `rep` nodes (the same
        per-link loads, see `representative_nodes`), hop latencies summed in closed form."""
        first, num_nodes = layout
        k, n = topo.gpn, len(ranks)
        chans = self.channels(topo, ranks[:rep * k])
        c, m = len(chans), rep * k
        chain = comm in (CommType.BROADCAST, CommType.REDUCE)
        lat = max(self._loop_latency(topo, proto, first, num_nodes, ch, wrap=not chain) for ch in range(c))
        if chain:
            flows = [(r[i], r[i + 1], size / c) for r in chans for i in range(m - 1)]
            return proto.base_latency_us + lat + topo.bandwidth_time(flows, proto)
        flows = [(r[i], r[(i + 1) % m], size / (n * c)) for r in chans for i in range(m)]
        steps = self.steps(comm, n)
        return proto.base_latency_us + lat * steps / n + steps * topo.bandwidth_time(flows, proto)

    @staticmethod
    def _loop_latency(topo, proto, first: int, num_nodes: int, channel: int, wrap: bool) -> float:
        """Sum of the hop latencies of channel `channel` (as `channels` lays it out) over `num_nodes`
        whole nodes: node i runs its GPUs from local index (channel + i(k-1)) mod k, and leaves for the
        next node on the rail it ends on (so inter-node hops stay on one rail)."""
        k = topo.gpn
        base = first * k
        intra = [sum(topo.hop_latency(base + (rot + t) % k, base + (rot + t + 1) % k, proto) for t in range(k - 1))
                 for rot in range(k)]
        rots = np.bincount((channel + np.arange(num_nodes, dtype=np.int64) * (k - 1)) % k, minlength=k)
        hops = num_nodes if wrap else num_nodes - 1
        return (float(np.dot(rots, intra)) + hops * proto.net_hop_us
                + _spine_crossings(topo, first, num_nodes, wrap) * topo.hw.network.switch_latency_us)


@lru_cache(maxsize=256)
def _mesh_rings(topo: Topology, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Directed Hamiltonian rings over NVLink edges of a mesh node, chosen greedily to spread load over
    the links (NCCL searches such rings on DGX-1). Empty when the group has no NVLink ring."""
    if len(ranks) > 8 or len(ranks) < 3:
        return ()
    first, rest = ranks[0], ranks[1:]
    cycles = []
    for perm in itertools.permutations(rest):
        ring = (first,) + perm
        if all(topo.adjacent(topo.local_of(ring[i]), topo.local_of(ring[(i + 1) % len(ring)]))
               for i in range(len(ring))):
            cycles.append(ring)
    if not cycles:
        return ()
    # Greedy: add the ring that least raises the most loaded link (normalised by capacity); keep the
    # prefix with the best throughput = rings / (max normalised load).
    chosen: list[tuple[int, ...]] = []
    load: dict[tuple[int, int], float] = {}
    cap = topo.mesh
    best_prefix, best_ratio = 1, math.inf

    def edges(ring):
        return [(topo.local_of(ring[i]), topo.local_of(ring[(i + 1) % len(ring)])) for i in range(len(ring))]

    for step in range(24):
        best, best_max = None, math.inf
        for ring in cycles:
            trial = dict(load)
            for e in edges(ring):
                trial[e] = trial.get(e, 0.0) + 1.0
            m = max(v / cap[e] for e, v in trial.items())
            if m < best_max - 1e-12:
                best, best_max = ring, m
        chosen.append(best)
        for e in edges(best):
            load[e] = load.get(e, 0.0) + 1.0
        ratio = best_max / len(chosen)
        if ratio < best_ratio - 1e-12:
            best_prefix, best_ratio = len(chosen), ratio
    chosen = chosen[:best_prefix]
    return tuple(chosen)


# ------------------------------------------------------------------------------ double binary tree
@register_algorithm
class DoubleBinaryTree(CollectiveAlgorithm):
    """NCCL tree (multi-node only): a chain through the GPUs of each node and two complementary binary
    trees across nodes, each carrying half the data; reduce flows up while broadcast flows down,
    pipelined, so the time is the latency of the tree depth plus the most loaded link's bytes."""

    name = "tree"
    ops = frozenset({CommType.ALL_REDUCE})

    def supports(self, topo, comm, ranks):
        nodes = _by_node(topo, ranks)
        return comm in self.ops and len(nodes) >= 2 and len({len(n) for n in nodes}) == 1

    @staticmethod
    def _trees(num_nodes: int) -> list[list[int]]:
        """Parent (node position) in each of the two trees, -1 for the root. Tree B mirrors tree A so
        interior nodes of one are (mostly) leaves of the other."""
        a = [(i - 1) // 2 if i > 0 else -1 for i in range(num_nodes)]
        b = [-1] * num_nodes
        for i in range(num_nodes):
            j = num_nodes - 1 - i          # position i in the mirrored order
            b[j] = num_nodes - 1 - a[i] if a[i] >= 0 else -1
        return [a, b]

    def rounds(self, topo: Topology, size: float, ranks: Sequence[int]) -> list[tuple[int, int, float]]:
        nodes = _by_node(topo, ranks)
        k = len(nodes[0])
        flows: list[tuple[int, int, float]] = []
        for c in range(k):                      # one channel per local GPU / rail
            part = size / (2 * k)
            chains = [[m[(c + t) % k] for t in range(k)] for m in nodes]
            for parent in self._trees(len(nodes)):
                for chain in chains:           # chain up (reduce) and down (broadcast)
                    for t in range(k - 1):
                        flows.append((chain[t + 1], chain[t], part))
                        flows.append((chain[t], chain[t + 1], part))
                for child, par in enumerate(parent):
                    if par >= 0:
                        flows.append((chains[child][0], chains[par][0], part))
                        flows.append((chains[par][0], chains[child][0], part))
        return flows

    def bytes_sent_per_rank(self, comm, size, ranks, topo=None):
        topo = topo or Topology(get_hardware("h100-sxm"))
        return _sent_from_flows(ranks, [(self.rounds(topo, size, ranks), 1)])

    def time_us(self, topo, comm, size, ranks, proto):
        nodes = _by_node(topo, ranks)
        k, depth = len(nodes[0]), max(1, math.ceil(math.log2(len(nodes) + 1)) - 1)
        a, b = nodes[0][0], nodes[1][0]
        hop_net = topo.hop_latency(a, b, proto)
        hop_nvl = topo.hop_latency(nodes[0][0], nodes[0][1], proto) if k > 1 else 0.0
        lat = 2 * (depth * hop_net + (k - 1) * hop_nvl)
        # Each node sends and receives a bounded number of tree edges whatever the tree's size, so the
        # most loaded link of a tree over many leaf groups is taken from a tree over a few of them (an
        # approximation: heap-ordered trees are not exactly periodic in the leaf groups).
        layout = whole_nodes(topo, ranks)
        rep = (representative_nodes(topo, *layout, leaves=TREE_REPRESENTATIVE_LEAVES)
               if layout is not None else None)
        bw_ranks = ranks if rep is None else ranks[:rep * topo.gpn]
        bw = topo.bandwidth_time(self.rounds(topo, size, bw_ranks), proto) / topo.hw.network.tree_efficiency
        return proto.base_latency_us + lat + bw


# --------------------------------------------------------------------------------------------- NVLS
@register_algorithm
class NVLS(CollectiveAlgorithm):
    """NVLink SHARP all-reduce inside one NVSwitch domain: each GPU pushes its buffer into the switch,
    which reduces it (multimem.ld_reduce) and multicasts the result (multimem.st). Per GPU and
    direction that is S (operands) + S/n (its reduced share), instead of 2(n-1)/n S for a ring."""

    name = "nvls"
    ops = frozenset({CommType.ALL_REDUCE})
    protocols = ("Simple",)

    def supports(self, topo, comm, ranks):
        return (comm in self.ops and topo.hw.node.nvls and topo.hw.node.nvls_efficiency > 0
                and not topo.is_mesh and len(ranks) >= 2 and len(_by_node(topo, ranks)) == 1)

    def bytes_sent_per_rank(self, comm, size, ranks, topo=None):
        n = len(ranks)
        return [size * (1 + 1 / n)] * n

    def time_us(self, topo, comm, size, ranks, proto):
        n = len(ranks)
        node = topo.node_of(ranks[0])
        # multimem operations reach nvls_efficiency of the port; express it as more bytes on the link
        scale = topo.hw.node.nvlink_efficiency / topo.hw.node.nvls_efficiency
        per = size * (1 + 1 / n) * scale
        extra = []
        for r in ranks:
            g = topo.local_of(r)
            extra += [((("nvl_tx", node, g),), per), ((("nvl_rx", node, g),), per)]
        bw = topo.bandwidth_time([], proto, extra)
        return proto.base_latency_us + 2 * proto.nvlink_hop_us + bw


# ------------------------------------------------------------------------------------- all-to-all
@register_algorithm
class DirectAllToAll(CollectiveAlgorithm):
    """All-to-all as NCCL runs it: every rank sends size/n to every other rank at once (grouped
    send/recv); links are shared max-min fairly, and the exchange reaches the preset's
    `alltoall_efficiency` of that link-bound rate (many concurrent peer flows per GPU)."""

    name = "direct"
    ops = frozenset({CommType.ALL_TO_ALL, CommType.GATHER, CommType.SCATTER})

    def supports(self, topo, comm, ranks):
        return super().supports(topo, comm, ranks) and (comm != CommType.ALL_TO_ALL
                                                        or len(ranks) <= MAX_ALL_TO_ALL_RANKS)

    def flows(self, comm, size, ranks):
        n = len(ranks)
        if comm == CommType.ALL_TO_ALL:
            return [(s, d, size / n) for s in ranks for d in ranks if s != d]
        root = ranks[0]
        if comm == CommType.SCATTER:
            return [(root, d, size / n) for d in ranks if d != root]
        return [(s, root, size / n) for s in ranks if s != root]

    def bytes_sent_per_rank(self, comm, size, ranks, topo=None):
        return _sent_from_flows(ranks, [(self.flows(comm, size, ranks), 1)])

    def time_us(self, topo, comm, size, ranks, proto):
        flows = self.flows(comm, size, ranks)
        lat = topo.max_latency([f[0] for f in flows], [f[1] for f in flows], proto)
        eff = topo.hw.network.alltoall_efficiency if comm == CommType.ALL_TO_ALL else 1.0
        return proto.base_latency_us + lat + topo.bandwidth_time(flows, proto) / eff


@register_algorithm
class PairwiseAllToAll(CollectiveAlgorithm):
    """Pairwise exchange: n-1 rounds; in round k rank i sends size/n to rank i+k (one peer at a time,
    as MPI's pairwise all-to-all and NCCL's send/recv loops without grouping)."""

    name = "pairwise"
    ops = frozenset({CommType.ALL_TO_ALL})
    auto = False  # NCCL's all-to-all is the grouped (direct) exchange; pairwise runs only when asked for

    def supports(self, topo, comm, ranks):
        return super().supports(topo, comm, ranks) and len(ranks) <= MAX_ALL_TO_ALL_RANKS

    def rounds(self, size, ranks):
        n = len(ranks)
        return [([(ranks[i], ranks[(i + k) % n], size / n) for i in range(n)], 1) for k in range(1, n)]

    def bytes_sent_per_rank(self, comm, size, ranks, topo=None):
        return _sent_from_flows(ranks, self.rounds(size, ranks))

    def time_us(self, topo, comm, size, ranks, proto):
        t = proto.base_latency_us
        for flows, _ in self.rounds(size, ranks):
            t += (topo.max_latency([f[0] for f in flows], [f[1] for f in flows], proto)
                  + topo.bandwidth_time(flows, proto))
        return t


# ----------------------------------------------------------------------------------- hierarchical
@register_algorithm
class Hierarchical(CollectiveAlgorithm):
    """Two-level: inside each node (NVLink) then across nodes between GPUs of the same local index (one
    rail each, all rails at once), then inside each node again. all_reduce = intra reduce-scatter +
    inter all-reduce of size/k + intra all-gather; all_gather = inter all-gather + intra all-gather;
    reduce_scatter = intra reduce-scatter + inter reduce-scatter."""

    name = "hierarchical"
    ops = frozenset({CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.REDUCE_SCATTER})

    def supports(self, topo, comm, ranks):
        nodes = _by_node(topo, ranks)
        return (comm in self.ops and len(nodes) >= 2 and len(nodes[0]) >= 2
                and len({len(n) for n in nodes}) == 1)

    @staticmethod
    def _phases(comm: CommType, size: float, k: int, num_nodes: int) -> list[tuple[str, CommType, float]]:
        """(level, op, size of the sub-collective) in order."""
        if comm == CommType.ALL_REDUCE:
            return [("intra", CommType.REDUCE_SCATTER, size), ("inter", CommType.ALL_REDUCE, size / k),
                    ("intra", CommType.ALL_GATHER, size)]
        if comm == CommType.ALL_GATHER:
            return [("inter", CommType.ALL_GATHER, size / k), ("intra", CommType.ALL_GATHER, size)]
        return [("intra", CommType.REDUCE_SCATTER, size), ("inter", CommType.REDUCE_SCATTER, size / k)]

    def bytes_sent_per_rank(self, comm, size, ranks, topo=None):
        topo = topo or Topology(get_hardware("h100-sxm"))
        nodes = _by_node(topo, ranks)
        k, nn = len(nodes[0]), len(nodes)
        ring = Ring()
        per = 0.0
        for level, op, sub in self._phases(comm, size, k, nn):
            m = k if level == "intra" else nn
            per += ring.steps(op, m) * sub / m
        return [per] * len(ranks)

    def time_us(self, topo, comm, size, ranks, proto):
        nodes = _by_node(topo, ranks)
        k, nn = len(nodes[0]), len(nodes)
        layout = whole_nodes(topo, ranks)
        rep = representative_nodes(topo, *layout) if layout is not None else None
        ring = Ring()
        t = 0.0
        for level, op, sub in self._phases(comm, size, k, nn):
            m = k if level == "intra" else nn
            if rep is None:
                groups = nodes if level == "intra" else [[n[i] for n in nodes] for i in range(k)]
                loop = max(sum(topo.hop_latency(g[i], g[(i + 1) % m], proto) for i in range(m)) for g in groups)
            elif level == "intra":   # symmetric: every node does the same on its own links
                groups = nodes[:1]
                loop = sum(topo.hop_latency(groups[0][i], groups[0][(i + 1) % m], proto) for i in range(m))
            else:                    # one ring per rail over all nodes: same rail, spine at leaf borders
                groups = [[n[i] for n in nodes[:rep]] for i in range(k)]
                loop = (nn * proto.net_hop_us
                        + _spine_crossings(topo, layout[0], nn, wrap=True) * topo.hw.network.switch_latency_us)
            # all groups of the level run at once: their step flows share links
            flows = [(g[i], g[(i + 1) % len(g)], sub / m) for g in groups for i in range(len(g))]
            steps = ring.steps(op, m)
            t += proto.base_latency_us + loop * steps / m + steps * topo.bandwidth_time(flows, proto)
        return t


# -------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class CollectiveEstimate:
    time_us: float
    algorithm: str
    protocol: str
    comm: CommType
    size_bytes: float
    nranks: int

    @property
    def algbw_gbps(self) -> float:
        return self.size_bytes / self.time_us / 1e3 if self.time_us > 0 else 0.0

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * bus_factor(self.comm, self.nranks)

    def to_dict(self) -> dict:
        return {"time_us": self.time_us, "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
                "algorithm": self.algorithm, "protocol": self.protocol, "op": self.comm.name.lower(),
                "size_bytes": int(self.size_bytes), "gpus": self.nranks}


def bus_factor(comm: CommType, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw x factor."""
    if n <= 1:
        return 1.0
    if comm == CommType.ALL_REDUCE:
        return 2 * (n - 1) / n
    if comm in (CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.REDUCE_SCATTER_BLOCK,
                CommType.ALL_TO_ALL, CommType.GATHER, CommType.SCATTER):
        return (n - 1) / n
    return 1.0


def check_group_size(comm: CommType, n: int) -> None:
    """ValueError (one line) for a group past the documented limits of the model (see the module doc)."""
    if n > MAX_COLLECTIVE_RANKS:
        raise ValueError(f"{n:,} ranks in one {comm.name.lower()} is more than the network model handles "
                         f"(at most {MAX_COLLECTIVE_RANKS:,} ranks per collective)")
    if comm == CommType.ALL_TO_ALL and n > MAX_ALL_TO_ALL_RANKS:
        raise ValueError(f"all_to_all over {n:,} ranks: the model simulates every pair of ranks, so it is "
                         f"limited to {MAX_ALL_TO_ALL_RANKS} ranks")


class NetworkModel:
    """Collective and point-to-point times on clusters of `hw` nodes (rank r lives on node
    r // gpus_per_node). Results are cached: the model is a pure function of its arguments."""

    def __init__(self, hw: HardwareConfig | str):
        self.hw = get_hardware(hw)
        self.topology = Topology(self.hw)
        self._protos = {p.name: p for p in self.hw.protocols}
        self._cache: dict[tuple, CollectiveEstimate] = {}
        self._paths_cache: dict[tuple, list] = {}
        self._p2p_cache: dict[tuple, float] = {}

    def algorithms_for(self, comm: CommType, ranks: Sequence[int], auto_only: bool = False) -> list[str]:
        """Registered algorithms that can run `comm` over `ranks` (`auto_only`: those the tuner
        considers when none is forced)."""
        return [name for name, cls in ALGORITHMS.items()
                if (cls.auto or not auto_only) and cls().supports(self.topology, comm, ranks)]

    def estimate(self, comm_type: CommType | int, size_bytes: float, ranks: Sequence[int] | int,
                 algorithm: str | None = None) -> CollectiveEstimate:
        comm = CommType(int(comm_type))
        if isinstance(ranks, int):
            ranks = range(ranks)
        check_group_size(comm, len(ranks))
        # cheap cache key for the common `range` groups; other sequences as given
        rkey = ("range", ranks.start, ranks.stop, ranks.step) if isinstance(ranks, range) else tuple(ranks)
        key = (comm, float(size_bytes), rkey, algorithm)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        ranks_t = tuple(sorted(int(r) for r in ranks))
        est = self._estimate(comm, float(size_bytes), ranks_t, algorithm)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[key] = est
        return est

    def _estimate(self, comm: CommType, size: float, ranks: tuple[int, ...], algorithm: str | None) -> CollectiveEstimate:
        n = len(ranks)
        if n <= 1 or size <= 0 or comm == CommType.BARRIER:
            if comm == CommType.BARRIER and n > 1:
                # a barrier is a tiny all-reduce
                e = self._estimate(CommType.ALL_REDUCE, 8.0, ranks, algorithm)
                return CollectiveEstimate(e.time_us, e.algorithm, e.protocol, comm, 0.0, n)
            return CollectiveEstimate(0.0, "none", "none", comm, size, n)
        if comm == CommType.REDUCE_SCATTER_BLOCK:
            comm_eff = CommType.REDUCE_SCATTER
        else:
            comm_eff = comm
        if algorithm is not None:
            if algorithm not in ALGORITHMS:
                raise ValueError(f"unknown collective algorithm '{algorithm}' (known: {', '.join(ALGORITHMS)})")
            names = [algorithm]
            if not ALGORITHMS[algorithm]().supports(self.topology, comm_eff, ranks):
                raise ValueError(f"algorithm '{algorithm}' does not support {comm.name.lower()} on ranks "
                                 f"{_ranks_text(ranks)} of {self.hw.name}")
        else:
            names = self.algorithms_for(comm_eff, ranks, auto_only=True)
            if not names:  # e.g. gather on one node: fall back to direct transfers
                names = ["direct"] if comm_eff in DirectAllToAll.ops else ["ring"]
        best: CollectiveEstimate | None = None
        for name in names:
            algo = ALGORITHMS[name]()
            for pname in algo.protocols:
                proto = self._protos.get(pname)
                if proto is None:
                    continue
                t = algo.time_us(self.topology, comm_eff, size, ranks, proto)
                if best is None or t < best.time_us - 1e-9:
                    best = CollectiveEstimate(t, name, pname, comm, size, n)
        if best is None:
            raise ValueError(f"no protocol of {self.hw.name} fits algorithm {names}")
        return best

    def collective_us(self, comm_type: CommType | int, size_bytes: int | float, ranks: Sequence[int] | int,
                      algorithm: str | None = None) -> float:
        """Time in us of one collective over global `ranks` (an int n means ranks 0..n-1)."""
        return self.estimate(comm_type, size_bytes, ranks, algorithm).time_us

    def p2p_us(self, size_bytes: float, src: int, dst: int) -> float:
        """A send/recv pair: protocol base latency + hop latency + size over the path's fair share."""
        if src == dst or size_bytes <= 0:
            return 0.0
        key = (float(size_bytes), src, dst)   # a ring of CP / pipeline sends repeats the same pair thousands of times
        hit = self._p2p_cache.get(key)
        if hit is not None:
            return hit
        best = math.inf
        for proto in self.hw.protocols:
            t = (proto.base_latency_us + self.topology.hop_latency(src, dst, proto)
                 + self.topology.bandwidth_time([(src, dst, float(size_bytes))], proto))
            best = min(best, t)
        if len(self._p2p_cache) > 100_000:
            self._p2p_cache.clear()
        self._p2p_cache[key] = best
        return best

    def all_to_all_v_us(self, pair_bytes: np.ndarray, ranks: Sequence[int]) -> float:
        """A non-uniform all-to-all (NCCL grouped send/recv, e.g. MoE dispatch): `pair_bytes[i, j]` bytes
        from ranks[i] to ranks[j]. Best protocol of: base latency + the largest hop latency + the time
        the most loaded link needs to drain its bytes (equal to the max-min fair drain time of the
        uniform exchange, a lower bound for skewed ones; the exact drain takes one re-share per finish
        time, too slow for thousands of distinct flows)."""
        m = np.asarray(pair_bytes, dtype=float)
        ranks = [int(r) for r in ranks]
        if m.shape != (len(ranks), len(ranks)):
            raise ValueError(f"pair_bytes is {m.shape}, expected {len(ranks)} x {len(ranks)}")
        np.fill_diagonal(m := m.copy(), 0.0)
        src, dst = np.nonzero(m > 0)
        if len(src) == 0:
            return 0.0
        rk = np.asarray(ranks)
        flows = list(zip(rk[src].tolist(), rk[dst].tolist(), m[src, dst].tolist()))
        drain = self.topology.link_drain_time(flows) / self.hw.network.alltoall_efficiency
        return min(p.base_latency_us + self.topology.max_latency(rk[src], rk[dst], p) + drain / p.bw_fraction
                   for p in self.hw.protocols if p.name in DirectAllToAll.protocols)

    def transfer_paths(self, ranks: Sequence[int]) -> list[Path]:
        """The links a collective over `ranks` keeps busy, as one path per flow of its ring channels
        (the flows that carry its bandwidth term); a 2-rank group is the pair's two directions."""
        ranks = sorted(int(x) for x in ranks)
        if len(ranks) < 2:
            return []
        key = tuple(ranks)
        hit = self._paths_cache.get(key)
        if hit is None:
            hit = []
            for ch in Ring().channels(self.topology, ranks):
                for j in range(len(ch)):
                    p = self.topology.path(ch[j], ch[(j + 1) % len(ch)])
                    if p:
                        hit.append(p)
            if len(self._paths_cache) > 4096:
                self._paths_cache.clear()
            self._paths_cache[key] = hit
        return hit

    def p2p_paths(self, src: int, dst: int) -> list[Path]:
        """The one path of a transfer from `src` to `dst` (the same list object for the same pair)."""
        key = ("p2p", int(src), int(dst))
        hit = self._paths_cache.get(key)
        if hit is None:
            p = self.topology.path(int(src), int(dst)) if src != dst else ()
            hit = self._paths_cache[key] = [p] if p else []
        return hit

    def concurrent_us(self, collectives: Sequence[tuple[CommType | int, float, Sequence[int]]],
                      starts: Sequence[float] | None = None) -> list[float]:
        """Times of collectives that run at the same time on shared links (all starting at 0, or at
        `starts`): each one's time alone, stretched while others share its links (max-min fair, re-shared
        as collectives start and end; see `shared_completion_times`). (A first-order model: the whole time
        is stretched, which slightly over-counts the latency part of small collectives.)"""
        alone = [self.estimate(c, s, r).time_us for c, s, r in collectives]
        paths = [self.transfer_paths(range(r) if isinstance(r, int) else r) for _, _, r in collectives]
        t0 = np.zeros(len(alone)) if starts is None else np.asarray(starts, float)
        ends = shared_completion_times(t0, alone, paths, self.topology.capacity)
        return (ends - t0).tolist()


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"[{ranks[0]}..{ranks[-1]}] ({len(ranks)})" if len(ranks) > 4 else str(list(ranks))
