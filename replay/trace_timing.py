"""`--timing trace`: every duration comes from the trace itself."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from chakra_schema.graph import EdgeKind, ExecutionGraph


class TraceTiming:
    """Recorded durations; a collective's transfer is the shortest recorded duration among its members
    (the member that arrived last waited least, so its recording is closest to the pure transfer)."""

    name = "trace"

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        return graph.duration_us.astype(np.float64, copy=True)

    def collective_us(self, graph: ExecutionGraph, node: int, group_ranks: Sequence[int],
                      member_durations: Sequence[float]) -> float:
        return float(min(member_durations)) if len(member_durations) else float(graph.duration_us[node])

    def launch_latency_us(self, graph: ExecutionGraph) -> np.ndarray | None:
        return recorded_gpu_latency(graph)


def unrecorded_transfers(graph: ExecutionGraph) -> np.ndarray:
    """Communication nodes that move data (comm_size > 0) but record no duration: the collectives of a
    workload written for a network simulator (ASTRA-sim's hand-built graphs time their compute, not their
    communication)."""
    idx = graph.collectives()
    if not len(idx):
        return idx
    sizes = np.array([float(graph.attr(int(i), "comm_size", 0) or 0) for i in idx.tolist()])
    return idx[(graph.duration_us[idx] <= 0) & (sizes > 0)]


class TraceTimingWithModelledTransfers(TraceTiming):
    """Recorded durations, except communication that records none (`unrecorded_transfers`): those are timed
    by a hardware preset's network model, as a network simulator would."""

    def __init__(self, network_timing) -> None:
        self.network = network_timing

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        from replay.model_timing import comm_node_time
        d = super().node_durations(graph)
        for i in unrecorded_transfers(graph).tolist():
            t = comm_node_time(self.network.network, graph, i)
            if t is not None:
                d[i] = t
        return d

    def collective_us(self, graph: ExecutionGraph, node: int, group_ranks: Sequence[int],
                      member_durations: Sequence[float]) -> float:
        if len(member_durations) and max(member_durations) <= 0:
            return self.network.collective_us(graph, node, group_ranks, member_durations)
        return super().collective_us(graph, node, group_ranks, member_durations)


def recorded_gpu_latency(graph: ExecutionGraph) -> np.ndarray:
    """For each GPU node, the recorded delay between its last start constraint (its deps and the previous
    op of its stream) and its start: launch latency and queueing the trace measured. CPU nodes get 0
    (their gaps are handled by the thread timeline)."""
    n = len(graph)
    lat = np.zeros(n)
    if n == 0:
        return lat
    gpu = graph.is_gpu()
    end = graph.start_us + graph.duration_us
    ready = np.full(n, -np.inf)
    # previous op on the same stream
    for r, res in enumerate(graph.resources):
        if not res.is_gpu:
            continue
        idx = graph.nodes_on(r)
        if len(idx) > 1:
            ready[idx[1:]] = np.maximum(ready[idx[1:]], end[idx[:-1]])
    # start-constraining deps
    counts = np.diff(graph.dep_ptr)
    dst = np.repeat(np.arange(n), counts)
    keep = graph.dep_kind != EdgeKind.SYNC
    np.maximum.at(ready, dst[keep], end[graph.dep_src[keep]])
    has = gpu & np.isfinite(ready)
    lat[has] = np.clip(graph.start_us[has] - ready[has], 0.0, None)
    return lat
