"""The replay job shared by `lumos-sim replay`, `lumos-sim check` and the public API: pick the timing
source, load the inputs, replay, and render the result."""
from __future__ import annotations

from typing import Sequence

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import ExecutionGraph
from replay.api import TIMING_MODES, make_timing, replay  # noqa: F401 (re-exported)
from replay.engine import ALIGN_MODES
from replay.results import ReplayResult


def check_replay_arguments(mode: str, hardware, source_hardware, steps: int | None) -> tuple:
    """The argument checks that need no trace: run before any conversion so mistakes show at once. Returns
    the hardware presets resolved (None where not given): the boundary resolves a name once and passes the
    typed `HardwareConfig` on."""
    if steps is not None and steps < 1:
        raise TraceInputError(None, f"--steps must be >= 1, got {steps}")
    if mode not in TIMING_MODES:
        raise TraceInputError(None, f"unknown timing mode '{mode}' (choose from {', '.join(TIMING_MODES)})")
    if mode == "model" and not hardware:
        raise TraceInputError(None, "--timing model needs --hardware NAME (see `lumos-sim list hardware`)")
    from replay.hardware.config import get_hardware
    return tuple(get_hardware(name) if name else None for name in (hardware, source_hardware))


def require_recorded_durations(graphs: Sequence[ExecutionGraph], mode: str) -> None:
    """Trace timing replays recorded durations: an Execution Trace alone has none, nor have the .et files
    other tools generate as workloads (ASTRA-sim's microbenchmarks): every step would be 0 ms, so it is an
    input error, not a result."""
    if mode != "trace":
        return
    from replay.api import graph_file
    for g in graphs:
        if (g.metadata or {}).get("durations_known") is False:
            raise TraceInputError(graph_file(g), "this Execution Trace records no durations: add its Kineto trace "
                                  "(--kineto) or predict them with --timing model --hardware NAME")
    if graphs and all(len(g) and not (g.duration_us > 0).any() for g in graphs):
        ranks = "" if len(graphs) == 1 else f" (nor do the other {len(graphs) - 1} ranks)"
        raise TraceInputError(graph_file(graphs[0]), f"records no node durations{ranks}: a generated workload, "
                              "not a recording; predict them with --timing model --hardware NAME")


def infer_missing_kernels(graphs: Sequence[ExecutionGraph]) -> tuple[list[ExecutionGraph], list]:
    """Model mode on Execution Traces without Kineto: each rank's kernels and host times are inferred
    from its ops (replay/et_kernels.py); returns the graphs to replay and one report per inferred rank."""
    from replay.api import graph_file
    from replay.et_kernels import can_infer, infer_gpu_work, needs_inference, records_gpu_work

    out: list[ExecutionGraph] = []
    reports: list = []
    for g in graphs:
        meta = g.metadata or {}
        src = graph_file(g)
        converted = src is not None and src != (meta.get("source_kineto") or meta.get("source_path"))
        if g.trace_origin == "kineto" and not records_gpu_work(g) and not can_infer(g):
            # a CPU run's (or a GPU run profiled without CUDA activity) Kineto trace: its op times are no
            # GPU times, and without linked ET ops there is nothing to infer the GPU kernels from
            if meta.get("source_et"):
                raise TraceInputError(src, f"records no GPU kernels and its operators could not be linked to the "
                                           f"Execution Trace {meta['source_et']}: model mode has nothing to infer "
                                           "the kernels from; replay the ET alone (--et without the Kineto trace)")
            fix = ("convert it again with its Execution Trace (lumos-sim convert --et ... --kineto ...)" if converted
                   else "add the ET (--et)")
            raise TraceInputError(src, "this trace records no GPU kernels (a CPU run, or a GPU run profiled "
                                       "without CUDA activity) and comes without its Execution Trace: " + fix +
                                       " for model mode to infer the kernels a GPU run would launch")
        if needs_inference(g):
            g, rep = infer_gpu_work(g)
            reports.append((g.rank, rep))
        out.append(g)
    return out, reports


def run_replay(graphs: Sequence[ExecutionGraph], mode: str = "trace", hardware=None, source_hardware=None,
               steps: int | None = None, progress=None, align: str = "recorded") -> ReplayResult:
    """`hardware` / `source_hardware`: a preset name, a TOML path or a resolved `HardwareConfig`."""
    hardware, source_hardware = check_replay_arguments(mode, hardware, source_hardware, steps)
    if align not in ALIGN_MODES:
        raise TraceInputError(None, f"unknown alignment '{align}' (choose from {', '.join(ALIGN_MODES)})")
    require_recorded_durations(graphs, mode)
    inferred: list = []
    if mode == "model":
        graphs, inferred = infer_missing_kernels(graphs)
    timing = make_timing(mode, hardware, source_hardware, graphs)
    result = replay(graphs, timing, progress=progress, align=align)
    result.inference = inferred
    if steps is not None:      # the job's first `steps` steps, on every rank (paired as the job steps are)
        groups = sorted(result.job_step_groups()[0].values(), key=lambda g: min(s.start_us for s in g))
        keep = {id(s) for g in groups[:steps] for s in g}
        result.steps = [s for s in result.steps if id(s) in keep]
    return result


def _fmt_ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.3f}"


_SHORT = {"communication": "comm"}  # keeps the critical-path column narrow


def print_result(result: ReplayResult, file=None) -> None:
    """Step times, then the breakdown: one table on a wide terminal, two that fit 80 columns otherwise."""
    from lumos_sim.tables import console as make_console, table

    console = make_console(file)
    title = f"Replay ({result.timing} timing, {result.num_nodes:,} nodes)"
    times = ("rank", "step", "measured ms", "predicted ms", "error")
    parts = ("compute ms", "comm ms", "exposed comm ms", "idle ms", "critical path")
    right = times[2:] + parts[:-1] + ("rank",)
    wide = console.width >= 150
    t1 = table(title, times + parts if wide else times, right=right, whole=("step",))
    t2 = None if wide else table("time breakdown", ("rank", "step") + parts, right=right, whole=("step",))
    for s in result.steps:
        b = s.breakdown
        err = "-" if s.error is None else f"{100 * s.error:+.2f}%"
        cp = ", ".join(f"{_SHORT.get(k, k)} {100 * v:.0f}%"
                       for k, v in sorted(s.critical_path.items(), key=lambda kv: -kv[1])[:3])
        head = (str(s.rank), s.name)
        row = (_fmt_ms(s.measured_us), _fmt_ms(s.predicted_us), err)
        breakdown = (_fmt_ms(b.compute_us), _fmt_ms(b.comm_us), _fmt_ms(b.exposed_comm_us), _fmt_ms(b.idle_us), cp)
        if wide:
            t1.add_row(*head, *row, *breakdown)
        else:
            t1.add_row(*head, *row)
            t2.add_row(*head, *breakdown)
    console.print(t1)
    if t2 is not None:
        console.print(t2)
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
    if result.step_pairing_note:
        console.print(f"note: {result.step_pairing_note}")
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
