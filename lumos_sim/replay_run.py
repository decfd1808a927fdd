"""The replay job shared by `lumos-sim replay`, `lumos-sim check` and the public API: pick the timing
source, load the inputs, replay, and render the result."""
from __future__ import annotations

import sys
from typing import Sequence

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import ExecutionGraph
from replay.api import replay
from replay.engine import ALIGN_MODES
from replay.results import ReplayResult
from replay.timing import TimingSource
from replay.trace_timing import TraceTiming

TIMING_MODES = ("trace", "model")


def make_timing(mode: str, hardware: str | None = None, source_hardware: str | None = None,
                graphs: Sequence[ExecutionGraph] = ()) -> TimingSource:
    """`trace` without hardware: recorded durations. `trace` with hardware: the trace translated from the
    GPU it was recorded on to `hardware`. `model`: every node re-timed by the hardware models."""
    if mode not in TIMING_MODES:
        raise TraceInputError(None, f"unknown timing mode '{mode}' (choose from {', '.join(TIMING_MODES)})")
    if mode == "trace" and not hardware:
        return TraceTiming()
    if not hardware:
        raise TraceInputError(None, "--timing model needs --hardware NAME (see `lumos-sim bench --help`)")
    from replay.hardware.config import get_hardware
    from replay.model_timing import ModelTiming, TranslatedTiming, source_hardware as recorded_on

    target = get_hardware(hardware)
    source = get_hardware(source_hardware) if source_hardware else None
    if mode == "model":
        return ModelTiming(target, source)
    if source is None and graphs and any(recorded_on(g) is None for g in graphs):
        raise TraceInputError(None, "cannot tell which GPU the trace was recorded on: pass --source-hardware NAME")
    return TranslatedTiming(source, target)


def run_replay(graphs: Sequence[ExecutionGraph], mode: str = "trace", hardware: str | None = None,
               source_hardware: str | None = None, steps: int | None = None, progress=None,
               align: str = "recorded") -> ReplayResult:
    if align not in ALIGN_MODES:
        raise TraceInputError(None, f"unknown alignment '{align}' (choose from {', '.join(ALIGN_MODES)})")
    timing = make_timing(mode, hardware, source_hardware, graphs)
    result = replay(graphs, timing, progress=progress, align=align)
    if steps is not None:
        keep_names: list[str] = []
        for s in result.steps:
            if s.name not in keep_names:
                keep_names.append(s.name)
        keep = set(keep_names[:steps])
        result.steps = [s for s in result.steps if s.name in keep]
    return result


def _fmt_ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.3f}"


def print_result(result: ReplayResult, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    console = Console(file=out, width=None if out.isatty() else 160)
    t = Table(title=f"Replay ({result.timing} timing, {result.num_nodes:,} nodes)")
    for col in ("rank", "step", "measured ms", "predicted ms", "error", "compute ms", "comm ms",
                "exposed comm ms", "idle ms", "critical path"):
        t.add_column(col, justify="right" if col not in ("step", "critical path") else "left")
    for s in result.steps:
        b = s.breakdown
        err = "-" if s.error is None else f"{100 * s.error:+.2f}%"
        cp = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(s.critical_path.items(), key=lambda kv: -kv[1])[:3])
        t.add_row(str(s.rank), s.name, _fmt_ms(s.measured_us), _fmt_ms(s.predicted_us), err, _fmt_ms(b.compute_us),
                  _fmt_ms(b.comm_us), _fmt_ms(b.exposed_comm_us), _fmt_ms(b.idle_us), cp)
    console.print(t)
    _print_job_steps(console, result)
    errs = result.errors()
    tail = f"; mean |error| {100 * sum(errs) / len(errs):.2f}% over {len(errs)} steps" if errs else ""
    console.print(f"step time {result.step_time_us / 1000:.3f} ms (slowest rank, mean over steps){tail}")


def _print_job_steps(console, result: ReplayResult) -> None:
    """The job-level steps (first rank's step start to last rank's step end) when several ranks ran."""
    from rich.table import Table

    jobs = result.job_steps
    al = result.alignment
    if al is not None and al.note:
        console.print(f"note: {al.note}")
    if not jobs or max(j.ranks for j in jobs) < 2:
        return
    t = Table(title=f"Job steps (ranks aligned: {al.used if al else 'start'})")
    for col in ("step", "ranks", "measured ms", "predicted ms", "error"):
        t.add_column(col, justify="left" if col == "step" else "right")
    for j in jobs:
        t.add_row(j.name, str(j.ranks), _fmt_ms(j.measured_us), _fmt_ms(j.predicted_us),
                  "-" if j.error is None else f"{100 * j.error:+.2f}%")
    console.print(t)
    measured = result.measured_job_step_time_us
    console.print(f"job step time {result.job_step_time_us / 1000:.3f} ms (steady state)"
                  + ("" if measured is None else f", measured {measured / 1000:.3f} ms"))
