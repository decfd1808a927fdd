"""Trace what-ifs: a real (converted) trace replayed as recorded, translated to other hardware, or
edited (data-parallel degree, layer count) and replayed -- see `estimators.trace.evaluate`.

- `replay`: the trace under the scenario's timing (`trace`: recorded durations, translated when
  `hardware` is set; `model`: every node re-timed by the hardware models).
- `trace`: the Lumos-style edit: `trace.dp`, `trace.layers` and/or `hardware` (translation) changed,
  replayed against the unchanged recording (the prediction's `baseline_step_time_s`).
  `trace.balance` instead brings the slow ranks' compute to the median rank's (job-level step times).
"""
from __future__ import annotations

import os
from typing import Sequence

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import ExecutionGraph
from chakra_schema.inputs import load_graphs
from estimators.prediction import Prediction
from estimators.scenario import Scenario, TraceSpec
from estimators.trace.evaluate import whatif_trace
from estimators.registry import register_whatif
from replay.api import make_timing, replay
from replay.results import Breakdown, ReplayResult


def _fingerprint(spec: TraceSpec) -> tuple:
    """Inputs plus the size/mtime of every existing path they name, so an edited file is reloaded."""
    stamps = []
    for p in (*spec.inputs, spec.et or "", spec.kineto or ""):
        try:
            st = os.stat(p)
            stamps.append((p, st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append((p, None, None))
    return (spec.inputs, spec.et, spec.kineto, tuple(stamps))


_CACHE: dict[tuple, tuple[ExecutionGraph, ...]] = {}
_CACHE_SIZE = 4


def trace_graphs(spec: TraceSpec, progress=None) -> list[ExecutionGraph]:
    """The graphs of a scenario's trace inputs (cached per process: sweeps replay one trace many times;
    what-ifs copy graphs before editing them, so cached graphs stay as loaded)."""
    key = _fingerprint(spec)
    if key not in _CACHE:
        graphs = tuple(load_graphs(list(spec.inputs), et_pattern=spec.et, kineto_pattern=spec.kineto,
                                   progress=progress))
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = graphs
    return list(_CACHE[key])


def _measured_step_s(result: ReplayResult) -> float | None:
    by_name: dict[str, float] = {}
    for s in result.steps:
        if s.measured_us:
            by_name[s.name] = max(by_name.get(s.name, 0.0), s.measured_us)
    return sum(by_name.values()) / len(by_name) / 1e6 if by_name else None


def _mean_step_breakdown(result: ReplayResult) -> Breakdown:
    return Breakdown.mean([s.breakdown for s in result.steps])


def prediction_of_replay(result: ReplayResult, notes: Sequence[str] = ()) -> Prediction:
    errors = result.errors()
    metrics = {"num_nodes": result.num_nodes, "ranks": len(result.ranks), "timing": result.timing,
               "steps": len({s.name for s in result.steps})}
    measured = _measured_step_s(result)
    if errors:
        metrics["mean_abs_step_error"] = sum(errors) / len(errors)
        metrics["max_abs_step_error"] = max(errors)
    return Prediction(whatif="replay", scenario_key="", step_time_s=result.step_time_us / 1e6,
                      breakdown=_mean_step_breakdown(result), gpus=len(result.ranks),
                      baseline_step_time_s=None, metrics={**metrics, "measured_step_time_s": measured},
                      notes=list(notes), detail=result)


@register_whatif("replay", needs=("trace",))
def replay_trace(scenario: Scenario, progress=None) -> Prediction:
    """Replay a trace: recorded, translated to `hardware`, or re-timed by the hardware models."""
    spec = scenario.trace
    if spec.dp is not None or spec.layers is not None:
        raise TraceInputError(None, "what-if 'replay' does not edit the trace: use what-if 'trace' for "
                                    "trace.dp / trace.layers")
    graphs = trace_graphs(spec)
    hardware = scenario.hardware
    if scenario.timing == "model" and hardware is None:
        raise TraceInputError(None, "timing = model needs hardware")
    timing = make_timing(scenario.timing, hardware, spec.source_hardware, graphs)
    return prediction_of_replay(replay(graphs, timing, progress=progress))


@register_whatif("trace", needs=("trace",))
def edit_trace(scenario: Scenario, progress=None) -> Prediction:
    """Change a real trace's data-parallel degree, layer count and/or hardware, and replay it."""
    spec = scenario.trace
    if scenario.timing != "trace":
        raise TraceInputError(None, "what-if 'trace' replays recorded durations: it needs timing = trace")
    edits = spec.dp is not None or spec.layers is not None or scenario.hardware is not None
    if not edits and not spec.balance:
        raise TraceInputError(None, "give at least one change: trace.dp, trace.layers, hardware or trace.balance")
    if edits and spec.balance:
        raise TraceInputError(None, "trace.balance compares the job with its own balanced ranks: ask for it "
                                    "alone, not with trace.dp, trace.layers or hardware")
    graphs = trace_graphs(spec)
    if spec.balance:
        from estimators.trace.balance import balance_ranks
        res = balance_ranks(graphs, spec.balance_ranks or None, spec.balance_threshold, progress=progress)
    else:
        res = whatif_trace(graphs, dp=spec.dp, layers=spec.layers, hardware=scenario.hardware,
                           source_hardware=spec.source_hardware, progress=progress)
    p = prediction_of_replay(res.result, res.notes)
    p.step_time_s = res.step_us / 1e6
    p.baseline_step_time_s = res.baseline_step_us / 1e6
    p.metrics.update({f"change_{k}": str(v) for k, v in res.changes.items()})
    p.detail = res
    return p
