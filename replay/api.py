"""Replay in one call."""
from __future__ import annotations

import logging
import os
from typing import Callable, Sequence

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import ExecutionGraph
from replay.engine import simulate
from replay.results import ReplayResult, summarize
from replay.timing import TimingSource
from replay.trace_timing import TraceTiming

TIMING_MODES = ("trace", "model")
# the preset whose network times communication a trace records no duration for, when the trace names no GPU
DEFAULT_NETWORK = "h100-sxm"
log = logging.getLogger(__name__)


def replay(graphs: Sequence[ExecutionGraph], timing: TimingSource | None = None,
           progress: Callable[[int, int], None] | None = None, critical_path: bool = True,
           align: str = "recorded") -> ReplayResult:
    """Replay the graphs of all given ranks together; `timing` defaults to the trace's own durations.
    `align`: "recorded" keeps the recorded offsets between ranks when their clocks agree (the default),
    "start" starts every rank at its own first event."""
    run = simulate(graphs, timing or TraceTiming(), progress=progress, align=align)
    return summarize(run, with_critical_path=critical_path)


def graph_file(graph: ExecutionGraph) -> str | None:
    """The file a graph was read from (an `.et` file), else the trace it was converted from."""
    meta = graph.metadata or {}
    src = meta.get("source")
    if isinstance(src, str) and (".et" in os.path.basename(src) or os.sep in src):
        return src
    return meta.get("source_path") or meta.get("source_kineto")


def _trace_timing(graphs: Sequence[ExecutionGraph]) -> TimingSource:
    """Recorded durations; communication that records none (a workload written for a network simulator) is
    timed by the network model of the GPU the trace names, else of the default H100 preset, with a warning."""
    from replay.trace_timing import TraceTimingWithModelledTransfers, unrecorded_transfers

    missing = [(g, len(unrecorded_transfers(g))) for g in graphs]
    missing = [(g, n) for g, n in missing if n]
    if not missing:
        return TraceTiming()
    from replay.hardware.config import get_hardware
    from replay.model_timing import ModelTiming, source_hardware as recorded_on

    hw = next((h for h in (recorded_on(g) for g in graphs) if h is not None), None) or get_hardware(DEFAULT_NETWORK)
    g, n = missing[0]
    more = f" (and {len(missing) - 1} more ranks)" if len(missing) > 1 else ""
    log.warning("%s: %d communication nodes record no duration%s; timed by the %s network model",
                graph_file(g) or "the trace", n, more, hw.name)
    return TraceTimingWithModelledTransfers(ModelTiming(hw))


def make_timing(mode: str, hardware: str | None = None, source_hardware: str | None = None,
                graphs: Sequence[ExecutionGraph] = ()) -> TimingSource:
    """`trace` without hardware: recorded durations. `trace` with hardware: the trace translated from the
    GPU it was recorded on to `hardware`. `model`: every node re-timed by the hardware models."""
    if mode not in TIMING_MODES:
        raise TraceInputError(None, f"unknown timing mode '{mode}' (choose from {', '.join(TIMING_MODES)})")
    if mode == "trace" and not hardware:
        return _trace_timing(graphs)
    if not hardware:
        raise TraceInputError(None, "--timing model needs --hardware NAME (see `lumos-sim bench --help`)")
    from replay.hardware.config import get_hardware
    from replay.model_timing import ModelTiming, TranslatedTiming, source_hardware as recorded_on

    target = get_hardware(hardware)
    source = get_hardware(source_hardware) if source_hardware else None
    if mode == "model":
        return ModelTiming(target, source)
    unknown = [g for g in graphs if recorded_on(g) is None] if source is None else []
    if unknown:
        from replay.hardware.config import recorded_device_names
        named = recorded_device_names(unknown[0].metadata)
        what = (f"it records {named[0]!r}, which no hardware preset matches" if named else
                "it names no GPU (no Kineto deviceProperties)")
        raise TraceInputError(graph_file(unknown[0]),
                              f"cannot tell which GPU the trace was recorded on: {what}; pass --source-hardware "
                              "NAME (see `lumos-sim list hardware`)")
    return TranslatedTiming(source, target)
