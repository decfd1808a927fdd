"""Accuracy-regression suites for `lumos-sim check`.

A suite is a TOML file:

    [suite]
    name = "hta-a100"
    description = "..."
    mean_tolerance = 0.08       # optional: max mean |error| over every counted step of the suite's cases

    [[case]]
    name = "trace_diff_control"
    inputs = ["{shared}/traces/hta/trace_diff_control_control.json.gz"]   # as `lumos-sim replay` takes them
    timing = "trace"            # or "model"
    hardware = "a100-sxm"       # optional (model timing, or translation of a trace); a .toml path (e.g. a
                                # `lumos-sim calibrate` preset) is resolved like the inputs
    tolerance = 0.05            # max |error| of any step
    mean_tolerance = 0.02       # max mean |error| over the case's steps (optional)
    measured_ms = {"ProfilerStep#5" = 219.7}   # optional: overrides the traces' ProfilerStep durations
    steps = ["ProfilerStep#4"]  # optional: only these steps
    ranks = [0]                 # optional: only these ranks
    in_sample = true            # optional: the case's traces fitted its preset: a regression check, shown
                                # as "in-sample" and not counted as accuracy

`{shared}` is the shared data folder (LUMOS_SIM_SHARED, else a `shared/` folder beside an ancestor of
the suite file); `{suite_dir}` is the suite's own folder; other relative paths are relative to it.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chakra_schema.errors import TraceInputError, brief, read_toml, reject_unknown_keys

CASE_KEYS = {"name", "inputs", "et", "kineto", "timing", "hardware", "source_hardware", "tolerance",
             "mean_tolerance", "measured_ms", "steps", "ranks", "description", "kind", "csv", "rows", "in_sample"}


@dataclass
class CaseSpec:
    name: str
    inputs: list[str]
    et: str | None = None
    kineto: str | None = None
    timing: str = "trace"
    hardware: str | None = None
    source_hardware: str | None = None
    tolerance: float = 0.05
    mean_tolerance: float | None = None
    measured_ms: dict[str, float] = field(default_factory=dict)
    steps: list[str] | None = None
    ranks: list[int] | None = None
    description: str = ""
    kind: str = "replay"          # "published_training": rows of a published-throughput CSV (`csv`)
    csv: str | None = None
    in_sample: bool = False
    suite_mean_tolerance: float | None = None   # the suite's bound on the mean over all its counted steps


@dataclass
class StepCheck:
    rank: int
    step: str
    measured_us: float
    predicted_us: float

    @property
    def error(self) -> float:
        return (self.predicted_us - self.measured_us) / self.measured_us


@dataclass
class CaseResult:
    suite: str
    case: CaseSpec
    steps: list[StepCheck]
    error: str | None = None       # why the case could not run
    seconds: float = 0.0

    @property
    def max_error(self) -> float | None:
        return max((abs(s.error) for s in self.steps), default=None)

    @property
    def mean_error(self) -> float | None:
        return sum(abs(s.error) for s in self.steps) / len(self.steps) if self.steps else None

    @property
    def passed(self) -> bool:
        if self.error or not self.steps:
            return False
        if self.max_error > self.case.tolerance:
            return False
        return self.case.mean_tolerance is None or self.mean_error <= self.case.mean_tolerance


def find_shared(start: Path) -> Path | None:
    env = os.environ.get("LUMOS_SIM_SHARED")
    if env:
        return Path(env)
    for parent in [start, *start.parents]:
        cand = parent / "shared"
        if cand.is_dir() and (cand / "traces").is_dir():
            return cand
    return None


def load_suite(path: str | os.PathLike) -> tuple[str, list[CaseSpec]]:
    path = Path(path)
    doc = read_toml(path, "suite file")
    unknown = set(doc) - {"suite", "case"}
    if unknown:
        raise TraceInputError(path, f"unknown table '{sorted(unknown)[0]}' (expected [suite] and [[case]])")
    suite = doc.get("suite", {})
    if not isinstance(suite, dict):
        raise TraceInputError(path, "[suite] must be a table (name = ..., description = ...)")
    reject_unknown_keys(path, suite, ("name", "description", "mean_tolerance"), where=" in [suite]")
    suite_name = _typed(path, "[suite] name", suite.get("name", path.stem), str)
    suite_mean = (_fraction(path, "[suite] mean_tolerance", suite["mean_tolerance"])
                  if "mean_tolerance" in suite else None)
    raw_cases = doc.get("case", [])
    if not isinstance(raw_cases, list) or not all(isinstance(c, dict) for c in raw_cases):
        raise TraceInputError(path, "'case' must be an array of tables: [[case]] blocks")
    if not raw_cases:
        raise TraceInputError(path, "the suite has no [[case]]: a check that checks nothing cannot pass")
    shared = find_shared(path.resolve().parent)
    cases = [_case_from_table(path, k, raw, shared) for k, raw in enumerate(raw_cases)]
    for c in cases:
        c.suite_mean_tolerance = suite_mean
    return suite_name, cases


def _typed(path: Path, what: str, value: Any, tp: type) -> Any:
    """`value` when it is a `tp` (bools are not numbers), else a one-line error naming `what`."""
    ok = isinstance(value, tp) and not (tp in (int, float) and isinstance(value, bool))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > _MAX_FLOAT:   # a TOML integer past the float range: float() would raise OverflowError
            raise TraceInputError(path, f"{what} must be a finite number, got {value}"[:300])
        return float(value)
    if not ok:
        raise TraceInputError(path, f"{what} must be {_TYPE_NAMES[tp]}, got {value!r}"[:300])
    return value


_MAX_FLOAT = sys.float_info.max
_TYPE_NAMES = {str: "a string", float: "a number", int: "an integer", list: "a list", dict: "a table",
               bool: "true or false"}


def _fraction(path: Path, what: str, value: Any) -> float:
    v = _typed(path, what, value, float)
    if not 0 < v < float("inf"):   # NaN fails this too
        raise TraceInputError(path, f"{what} must be a number > 0 (0.05 = 5%), got {value!r}")
    return v


def _case_from_table(path: Path, k: int, raw: dict, shared: Path | None) -> CaseSpec:
    where = f"case #{k + 1}"
    reject_unknown_keys(path, raw, CASE_KEYS, where=f" in {where}")
    if raw.get("kind", "replay") != "replay":
        from lumos_sim.published_training import case_from_table
        return case_from_table(path, where, raw, shared, CaseSpec, _fraction, _typed, _ranks)
    if "name" not in raw or ("inputs" not in raw and "et" not in raw and "kineto" not in raw):
        raise TraceInputError(path, f"{where} needs 'name' and 'inputs' (or 'et'/'kineto')")
    name = _typed(path, f"'name' of {where}", raw["name"], str)
    where = f"case '{name}'"

    def text(key: str) -> str | None:
        return _typed(path, f"'{key}' of {where}", raw[key], str) if key in raw else None

    def strings(key: str) -> list[str] | None:
        if key not in raw:
            return None
        # one path needs no brackets; steps are names to match, so a bare string there is refused
        value = [raw[key]] if isinstance(raw[key], str) and key != "steps" else raw[key]
        items = _typed(path, f"'{key}' of {where}", value, list)
        return [_typed(path, f"'{key}' of {where}", v, str) for v in items]

    def resolve(p: str) -> str:
        if "{shared}" in p:
            if shared is None:
                raise TraceInputError(path, f"{where} needs the shared data folder: set LUMOS_SIM_SHARED")
            p = p.replace("{shared}", str(shared))
        p = p.replace("{suite_dir}", str(path.resolve().parent))
        return p if os.path.isabs(p) else str(path.resolve().parent / p)

    from lumos_sim.replay_run import TIMING_MODES
    timing = text("timing") or "trace"
    if timing not in TIMING_MODES:
        raise TraceInputError(path, f"'timing' of {where} must be one of {', '.join(TIMING_MODES)}, got {timing!r}")
    measured = _typed(path, f"'measured_ms' of {where}", raw.get("measured_ms", {}), dict)
    ranks = _ranks(path, f"'ranks' of {where}", raw["ranks"]) if "ranks" in raw else None
    for key in ("steps", "ranks"):
        if key in raw and isinstance(raw[key], list) and not raw[key]:
            raise TraceInputError(path, f"'{key}' of {where} is empty: leave it out to check them all")
    et, kineto = text("et"), text("kineto")
    return CaseSpec(
        name=name, inputs=[resolve(p) for p in strings("inputs") or []],
        et=resolve(et) if et else None, kineto=resolve(kineto) if kineto else None,
        timing=timing, hardware=_hardware_ref(text("hardware"), resolve), source_hardware=text("source_hardware"),
        tolerance=_fraction(path, f"'tolerance' of {where}", raw.get("tolerance", 0.05)),
        mean_tolerance=(_fraction(path, f"'mean_tolerance' of {where}", raw["mean_tolerance"])
                        if "mean_tolerance" in raw else None),
        measured_ms={str(s): _milliseconds(path, f"'measured_ms.{s}' of {where}", v) for s, v in measured.items()},
        steps=strings("steps"), ranks=ranks, description=text("description") or "",
        in_sample=_typed(path, f"'in_sample' of {where}", raw.get("in_sample", False), bool))


def _milliseconds(path: Path, what: str, value: Any) -> float:
    """A measured step time: a finite number of milliseconds > 0."""
    try:
        v = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except OverflowError:
        v = None
    if v is None or not 0 < v < float("inf"):   # NaN fails this too
        raise TraceInputError(path, f"{what} must be a finite step time in milliseconds > 0, got {brief(value)}")
    return v


def _ranks(path: Path, what: str, value: Any) -> list[int]:
    """A list of ranks (integers >= 0)."""
    items = _typed(path, what, value, list)
    out = []
    for v in items:
        r = _typed(path, what, v, int)
        if r < 0:
            raise TraceInputError(path, f"{what} must hold ranks >= 0, got {r}")
        out.append(r)
    return out


def _hardware_ref(value: Any, resolve) -> Any:
    """A preset name stays a name; a .toml (e.g. a `lumos-sim calibrate` output) is a path like the inputs."""
    if isinstance(value, str) and value.endswith(".toml"):
        return resolve(value)
    return value


def run_case(suite: str, case: CaseSpec) -> CaseResult:
    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    from replay.engine import ReplayError

    t0 = time.perf_counter()
    if case.kind == "published_training":
        from lumos_sim.published_training import run_case as run_published
        return run_published(suite, case, CaseResult, StepCheck)
    try:
        graphs = load_graphs(case.inputs, et_pattern=case.et, kineto_pattern=case.kineto)
        result = run_replay(graphs, case.timing, case.hardware, case.source_hardware)
    except TraceInputError as e:
        # bad input (an unreadable trace, a bad hardware file) is exit 2, not a failed accuracy case
        raise TraceInputError(e.path, f"{e.problem} (case '{case.name}' of suite '{suite}')") from None
    except ReplayError as e:
        return CaseResult(suite, case, [], error=str(e), seconds=time.perf_counter() - t0)
    for key, named in (("steps", case.steps), ("measured_ms", list(case.measured_ms))):
        missing = sorted(set(named or ()) - {s.name for s in result.steps})
        if missing:
            known = ", ".join(dict.fromkeys(s.name for s in result.steps))
            raise TraceInputError(None, f"'{key}' of case '{case.name}' (suite '{suite}') names {missing[0]!r}, "
                                        f"which the trace does not have (its steps: {known[:200]})")
    if case.ranks is not None:
        missing_ranks = sorted(set(case.ranks) - {s.rank for s in result.steps})
        if missing_ranks:
            raise TraceInputError(None, f"'ranks' of case '{case.name}' (suite '{suite}') names rank "
                                        f"{missing_ranks[0]}, which the traces do not have")
    checks = []
    for s in result.steps:
        if case.steps is not None and s.name not in case.steps:
            continue
        if case.ranks is not None and s.rank not in case.ranks:
            continue
        measured = case.measured_ms[s.name] * 1000 if s.name in case.measured_ms else s.measured_us
        if not measured:
            continue
        checks.append(StepCheck(s.rank, s.name, measured, s.predicted_us))
    err = None if checks else "no step with a measured duration to compare"
    return CaseResult(suite, case, checks, error=err, seconds=time.perf_counter() - t0)


def collect_suites(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(path.glob("*.toml"))
            if not found:
                raise TraceInputError(path, "holds no suite files (*.toml): nothing to check")
            out.extend(found)
        else:
            out.append(path)
    return out


@dataclass
class SuiteMean:
    """A suite's bound on the mean |error| over the steps of all its counted (not in-sample) cases."""
    suite: str
    tolerance: float
    errors: list[float]

    @property
    def mean_error(self) -> float | None:
        return sum(self.errors) / len(self.errors) if self.errors else None

    @property
    def passed(self) -> bool:
        return self.mean_error is not None and self.mean_error <= self.tolerance


def suite_means(results: list[CaseResult]) -> list[SuiteMean]:
    out: dict[str, SuiteMean] = {}
    for r in results:
        if r.case.suite_mean_tolerance is None:
            continue
        sm = out.setdefault(r.suite, SuiteMean(r.suite, r.case.suite_mean_tolerance, []))
        if not r.case.in_sample:
            sm.errors.extend(abs(s.error) for s in r.steps)
    return list(out.values())


def _step_json(case: CaseSpec, s: StepCheck) -> dict[str, Any]:
    """A replay step's times in us; a published-training row's throughput in the unit its label names
    (tokens/s or TFLOP/s per GPU), under `published` / `predicted`, and the row index as `row`."""
    if case.kind == "published_training":
        return {"row": s.rank, "step": s.step, "published": s.measured_us, "predicted": s.predicted_us,
                "error": s.error}
    return {"rank": s.rank, "step": s.step, "measured_us": s.measured_us, "predicted_us": s.predicted_us,
            "error": s.error}


def _step_line(case: CaseSpec, s: StepCheck) -> str:
    if case.kind == "published_training":   # the label ends with its metric, e.g. "(tokens/s/GPU)"
        return f"  row {s.rank} {s.step}: published {s.measured_us:,.0f}, predicted {s.predicted_us:,.0f}"
    return f"  rank {s.rank} {s.step}: measured {s.measured_us / 1000:.3f} ms, predicted {s.predicted_us / 1000:.3f} ms"


def results_json(results: list[CaseResult]) -> dict[str, Any]:
    means = suite_means(results)
    return {
        "cases": [{"suite": r.suite, "case": r.case.name, "timing": r.case.timing, "hardware": r.case.hardware,
                   "passed": r.passed, "in_sample": r.case.in_sample, "error": r.error, "tolerance": r.case.tolerance,
                   "mean_tolerance": r.case.mean_tolerance, "max_error": r.max_error, "mean_error": r.mean_error,
                   "seconds": r.seconds,
                   "steps": [_step_json(r.case, s) for s in r.steps]}
                  for r in results],
        "suite_means": [{"suite": m.suite, "mean_error": m.mean_error, "mean_tolerance": m.tolerance,
                         "steps": len(m.errors), "passed": m.passed} for m in means],
        "passed": sum(r.passed for r in results) + sum(m.passed for m in means),
        "failed": sum(not r.passed for r in results) + sum(not m.passed for m in means),
        # accuracy = the cases whose traces did not fit their preset
        "accuracy_passed": sum(r.passed for r in results if not r.case.in_sample),
        "in_sample": sum(r.case.in_sample for r in results),
    }


def print_results(results: list[CaseResult], verbose: bool = False, file=None) -> None:
    """One table per suite. Numbers and verdicts never fold (80 columns when piped): the case and
    timing columns take what is left, and a failure's reason goes under its case name."""
    from lumos_sim.tables import console as make_console, table

    console = make_console(file)
    numbers = ("steps", "max |err|", "mean |err|", "tolerance")
    for suite in dict.fromkeys(r.suite for r in results):
        t = table(f"Accuracy check: {suite}", ("case",) + numbers + ("result",), right=numbers,
                  whole=numbers + ("result",))
        for r in (r for r in results if r.suite == suite):
            tol = f"{100 * r.case.tolerance:.1f}%" + (f" / mean {100 * r.case.mean_tolerance:.1f}%"
                                                       if r.case.mean_tolerance is not None else "")
            timing = r.case.timing + (f" {os.path.basename(r.case.hardware)}" if r.case.hardware else "")
            shown = r.case.name if timing in r.case.name else f"{r.case.name} [dim]({timing})[/dim]"
            case = shown + (
                f"\n[red]{r.error}[/red]" if not r.passed and r.error else "")
            if r.case.in_sample:
                case += "\n[yellow]in-sample: not accuracy[/yellow]"
            t.add_row(case, str(len(r.steps)), "-" if r.max_error is None else f"{100 * r.max_error:.2f}%",
                      "-" if r.mean_error is None else f"{100 * r.mean_error:.2f}%", tol,
                      ("[green]PASS[/green]" if r.passed else "[red]FAIL[/red]")
                      + (" [yellow]in-sample[/yellow]" if r.case.in_sample else ""))
            if verbose:
                for s in r.steps:
                    t.add_row(_step_line(r.case, s), "", f"{100 * s.error:+.2f}%", "", "", "")
        for m in (m for m in suite_means(results) if m.suite == suite):
            t.add_row("suite mean over every counted step", str(len(m.errors)), "",
                      "-" if m.mean_error is None else f"{100 * m.mean_error:.2f}%", f"mean {100 * m.tolerance:.1f}%",
                      "[green]PASS[/green]" if m.passed else "[red]FAIL[/red]")
        console.print(t)
