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
