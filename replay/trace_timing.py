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
