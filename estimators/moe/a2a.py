"""The non-uniform all-to-all cost of `NetworkModel.all_to_all_v_us`, for large EP groups.

Same model and same numbers (base latency + largest hop latency + most loaded link's drain time, best
protocol), but the link incidence of every (source, destination) pair of the group is built once, so a
call is one weighted bincount over the pairs' links instead of a Python loop over up to EP^2 flows
(EP320: 102,080 flows, about 2 s a call there; here about a millisecond).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class AllToAllTimer:
    def __init__(self, network, ranks: Sequence[int]):
        from replay.hardware.network import DirectAllToAll
        self.network = network
        topo = network.topology
        self.ranks = np.asarray([int(r) for r in ranks], np.int64)
        G = len(self.ranks)
        ids: dict = {}
        pair, link = [], []
        # where each pair sits, from its path: 2 other node over a spine, 1 other node on one leaf / rail,
        # 0 the same node (max_latency's answer depends only on which of these the exchange has)
        self._where = np.zeros((G, G), np.int8)
        for i, s in enumerate(self.ranks.tolist()):
            for j, d in enumerate(self.ranks.tolist()):
                if i != j:
                    path = topo.path(s, d)
                    kinds = {lk[0] for lk in path}
                    self._where[i, j] = 2 if "spine_up" in kinds else (1 if "nic_tx" in kinds else 0)
                    for lk in path:
                        pair.append(i * G + j)
                        link.append(ids.setdefault(lk, len(ids)))
        self._pair = np.asarray(pair, np.int64)
        self._link = np.asarray(link, np.int64)
        self._capacity = np.asarray([topo.capacity(lk) for lk in ids], float)
        self._protocols = [p for p in network.hw.protocols if p.name in DirectAllToAll.protocols]
        self.G = G

        self._full_latency: list[float] | None = None

    def parts(self, pair_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per protocol: (base + hop latency, drain time) of the exchange; the time is their sum, and
        x times the bytes takes latency + x drain."""
        m = np.array(pair_bytes, dtype=float)
        np.fill_diagonal(m, 0.0)
        nz = m > 0
        n = int(nz.sum())
        if n == 0:
            return np.zeros(len(self._protocols)), np.zeros(len(self._protocols))
        topo = self.network.topology
        if n == self.G * (self.G - 1):      # every pair exchanges: the latency is the group's, once
            if self._full_latency is None:
                src, dst = np.nonzero(~np.eye(self.G, dtype=bool))
                self._full_latency = [topo.max_latency(self.ranks[src], self.ranks[dst], p) for p in self._protocols]
            lat = self._full_latency
        else:
            src, dst = self._latency_pairs(nz)
            lat = [topo.max_latency(self.ranks[src], self.ranks[dst], p) for p in self._protocols]
        load = np.bincount(self._link, weights=m.ravel()[self._pair], minlength=len(self._capacity))
        drain = float((load / self._capacity).max()) / self.network.hw.network.alltoall_efficiency
        return (np.array([p.base_latency_us + x for p, x in zip(self._protocols, lat)]),
                np.array([drain / p.bw_fraction for p in self._protocols]))

    def _latency_pairs(self, nz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pairs that give max_latency the same answer as all nonzero pairs: with a remote pair its answer
        only asks whether any crosses a spine, so one remote pair of the farthest kind stands for all."""
        where = np.where(nz, self._where, -1)
        far = int(where.max())
        if far >= 1:
            i, j = np.unravel_index(int(np.argmax(where)), where.shape)
            return np.array([i]), np.array([j])
        return np.nonzero(nz)

    def __call__(self, pair_bytes: np.ndarray, scale: float = 1.0) -> float:
        lat, drain = self.parts(pair_bytes)
        return float((lat + scale * drain).min()) if drain.any() or lat.any() else 0.0


_TIMERS: dict = {}


def all_to_all_timer(network, ranks: Sequence[int]) -> AllToAllTimer:
    """One timer per (hardware, group): building the incidence is the slow part (EP320: seconds)."""
    key = (id(network.hw), network.hw.name, network.topology.gpn, tuple(int(r) for r in ranks))
    t = _TIMERS.get(key)
    if t is None:
        if len(_TIMERS) > 8:
            _TIMERS.clear()
        t = _TIMERS[key] = AllToAllTimer(network, ranks)
    return t


# ------------------------------------------------------------------ DeepEP's node forwarding (normal mode)
def expected_distinct_nodes(nodes: int, top_k: int, limit: int = 0) -> float:
    """Distinct nodes among a token's top-k experts when each expert is on any of `nodes` nodes alike:
    nodes x (1 - (1 - 1/nodes)^top_k); at most `limit` (node-limited routing: DeepSeek-V3 sends a token to
    at most 4 nodes) when given."""
    n, k = max(int(nodes), 1), max(int(top_k), 1)
    d = n * (1.0 - (1.0 - 1.0 / n) ** k)
    return min(d, float(limit)) if limit and limit > 0 else d


def node_limit(nodes: int, groups: int, groups_per_token: int) -> int:
    """Most nodes one token's experts can be on under group-limited routing (a token picks its experts from
    `groups_per_token` of `groups` expert groups, the groups laid out in order over the nodes), 0 when routing
    is not grouped. A group spans several nodes when there are more nodes than groups (DeepSeek-V3's 8 groups
    at EP128 on 16 nodes: 4 groups reach 8 nodes, not 4), or straddles two when they do not line up."""
    if groups <= 1 or groups_per_token <= 0:
        return 0
    n, g = int(nodes), int(groups)
    span = max(-(-((i + 1) * n) // g) - (i * n) // g for i in range(g))     # nodes group i touches
    return min(n, groups_per_token * span)


def node_forwarded_legs(pairs: np.ndarray, gpus_per_node: int, top_k: int, limit: int = 0
                        ) -> tuple[np.ndarray, np.ndarray]:
    """DeepEP's normal-mode dispatch of `pairs` [G, G] ((token, expert) pairs rank -> rank, a rank's own
    included) as its two legs: a token bound for another node crosses the network once per destination node,
    to the GPU of the same local index there (its rail peer), which forwards it over NVLink to the GPUs
    holding its experts. Returns (RDMA leg, NVLink leg) as [G, G] token counts; the NVLink leg carries the
    node's own pairs and the forwarded ones, pair by pair (the parallelism what-if's DeepEP model counts the
    same two legs).

    The RDMA leg counts tokens, not pairs. A source with T = pairs / top_k tokens that sends a share p of
    its pairs to node b reaches it with 1 - (1 - p)^top_k of its tokens when a token's picks are independent,
    so a hot node gets fewer tokens per pair than a cold one; with node-limited routing (`limit` nodes a
    token, `node_limit`) the counts of a source shrink alike until they average `limit` nodes a token. A cell
    never carries fewer tokens than pairs / top_k (a token brings at most top_k pairs) nor more than its
    pairs or the source's tokens."""
    G = pairs.shape[0]
    gpn = gpus_per_node
    n = G // gpn
    k = max(int(top_k), 1)
    B = np.asarray(pairs, float).reshape(n, gpn, n, gpn)
    same = np.eye(n, dtype=bool)[:, None, :, None]
    to_node = B.sum(3)                                                   # [i, a, b]: pairs (i,a) -> node b
    tokens = to_node.sum(2, keepdims=True) / k                           # [i, a, 1]: tokens of (i,a)
    p = np.divide(to_node, tokens * k, out=np.zeros_like(to_node), where=tokens > 0)
    reach = tokens * (1.0 - (1.0 - np.clip(p, 0.0, 1.0)) ** k)
    if limit and limit > 0:
        per_token = reach.sum(2, keepdims=True)
        reach *= np.minimum(1.0, np.divide(limit * tokens, per_token, out=np.ones_like(tokens),
                                           where=per_token > 0))
    reach = np.clip(reach, to_node / k, np.minimum(to_node, tokens))
    reach[np.arange(n), :, np.arange(n)] = 0.0                           # a node's own tokens stay on it
    rdma = np.zeros_like(B)
    idx = np.arange(gpn)
    rdma[:, idx, :, idx] = reach.transpose(1, 0, 2)                      # [i, a, b] -> (a,i) -> (b,i)
    nvl = np.where(same, B, 0.0)
    fwd = np.where(same, 0.0, B).sum(0)                                  # [i, b, j]: arriving at (b,i) for (b,j)
    nvl[np.arange(n), :, np.arange(n), :] += fwd.transpose(1, 0, 2)      # (b,i) -> (b,j)
    nvl = nvl.reshape(G, G)
    np.fill_diagonal(nvl, 0.0)               # a rank's own pairs, and those landing on the rail peer, stay
    return rdma.reshape(G, G), nvl
