"""Replay in one call."""
from __future__ import annotations

from typing import Callable, Sequence

from chakra_schema.graph import ExecutionGraph
from replay.engine import simulate
from replay.results import ReplayResult, summarize
from replay.timing import TimingSource
from replay.trace_timing import TraceTiming


def replay(graphs: Sequence[ExecutionGraph], timing: TimingSource | None = None,
           progress: Callable[[int, int], None] | None = None, critical_path: bool = True,
           align: str = "recorded") -> ReplayResult:
    """Replay the graphs of all given ranks together; `timing` defaults to the trace's own durations.
    `align`: "recorded" keeps the recorded offsets between ranks when their clocks agree (the default),
    "start" starts every rank at its own first event."""
    run = simulate(graphs, timing or TraceTiming(), progress=progress, align=align)
    return summarize(run, with_critical_path=critical_path)
