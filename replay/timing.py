"""Where durations come from. The engine asks a `TimingSource` for every node's service time and for
every collective's transfer time; `--timing trace` and `--timing model` are two implementations, and
hardware translation is a third. Keep engine code free of `if timing == ...`."""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from chakra_schema.graph import ExecutionGraph


class TimingSource(Protocol):
    name: str

    def node_durations(self, graph: ExecutionGraph) -> np.ndarray:
        """float64 [N] service time in us of every node of `graph` on its resource (for collectives:
        the time they would take when all members arrive together, i.e. the transfer time for a
        rank whose group is not simulated)."""
        ...

    def collective_us(self, graph: ExecutionGraph, node: int, group_ranks: Sequence[int],
                      member_durations: Sequence[float]) -> float:
        """Transfer time in us of collective `node` once its last member has arrived.
        `member_durations` are the recorded durations of the same collective on every simulated member
        (trace timing takes the shortest: it holds the least waiting)."""
        ...

    def launch_latency_us(self, graph: ExecutionGraph) -> np.ndarray | None:
        """float64 [N] extra delay between a GPU node's deps being met and its start (launch latency,
        queueing), or None for zero."""
        ...
