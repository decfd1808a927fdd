"""Sweeps: a base scenario plus axes, expanded into points, evaluated in parallel into one table.

A spec is a TOML file (or the same dict in Python):

    [sweep]
    name = "llama3-70b scaling"                 # optional; the report's title

    [scenario]                                  # the base scenario, as `lumos-sim whatif scenario` reads it
    whatif = "parallelism"
    model = "llama3-70b"
    hardware = "h100-sxm"
    plan = { tp = 8, pp = 4, dp = 2, seq_len = 8192, global_batch = 512 }

    [[axes]]                                    # axes combine by cartesian product, in order
    grid = { "hardware.network.nic_gbps" = [200, 400, 800], "plan.micro_batch" = [1, 2] }  # product
    [[axes]]
    zip = { hardware = ["h100-sxm", "h200"], "plan.tp" = [8, 4] }       # lists advanced together
    [[axes]]
    list = [{ "plan.tp" = 8, label = "TP8" }, { "plan.tp" = 4, "plan.pp" = 8 }]   # explicit override sets
    [[axes]]
    search = { gpus = [64, 128], max_plans = 40 }   # valid plans of each GPU count, best-ranked first
                                                    # (max_plans absent: every valid plan that fits)

Keys are dotted scenario fields (see `estimators.scenario`). Every point is one `Scenario`; its row in
the result is the point index, its label, status (`ok`, `error`, `pending`) and error, every input field
(`Scenario.flatten()`) and every prediction field (`Prediction.to_row()`).

`sweep(spec, output="results.parquet")` keeps the results file complete at all times (every point has
a row; pending ones say so), rewritten atomically every few seconds and on Ctrl-C / SIGTERM, and reads
it back on the next run: points whose scenario key is already there are not evaluated again.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from chakra_schema.errors import TraceInputError, reject_unknown_keys
from estimators.scenario import Scenario, plan_label

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SPEC_KEYS = ("sweep", "scenario", "axes")
STATUS_OK, STATUS_ERROR, STATUS_PENDING = "ok", "error", "pending"
META_COLUMNS = ("point", "status", "error")


# ============================================================================ axes
class Axis:
    """One axis of a sweep: `expand(scenario)` -> [(label part, scenario)] for each of its values."""

    kind = ""

    def expand(self, s: Scenario, path: str | None) -> list[tuple[str, Scenario]]:
        raise NotImplementedError


def _label_part(key: str, value: Any) -> str:
    return f"{key.rsplit('.', 1)[-1]}={value}"


def _override(s: Scenario, changes: Mapping[str, Any], path: str | None, where: str) -> Scenario:
    try:
        return s.override(changes)
    except TraceInputError as e:
        raise TraceInputError(path, f"{where}: {e.problem}") from None


@dataclass(frozen=True)
class _KeyValuesAxis(Axis):
    """Keys with lists of values; subclasses say how the lists combine (`combos`)."""

    values: tuple[tuple[str, tuple], ...]

    def combos(self) -> Iterable[tuple]:
        raise NotImplementedError

    def expand(self, s, path):
        keys = [k for k, _ in self.values]
        out = []
        for combo in self.combos():
            changes = dict(zip(keys, combo))
            label = " ".join(_label_part(k, v) for k, v in changes.items())
            out.append((label, _override(s, changes, path, f"{self.kind} point {label}")))
        return out


@dataclass(frozen=True)
class GridAxis(_KeyValuesAxis):
    """Cartesian product of each key's values."""

    kind = "grid"

    def combos(self):
        return itertools.product(*(v for _, v in self.values))


@dataclass(frozen=True)
class ZipAxis(_KeyValuesAxis):
    """The i-th value of every key together (all lists the same length)."""

    kind = "zip"

    def combos(self):
        return zip(*(v for _, v in self.values))


@dataclass(frozen=True)
class ListAxis(Axis):
    """Explicit override sets; an entry's `label` names it (it is not an override)."""

    entries: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    kind = "list"

    def expand(self, s, path):
        out = []
        for n, (label, changes) in enumerate(self.entries):
            label = label or " ".join(_label_part(k, v) for k, v in changes) or f"entry {n}"
            out.append((label, _override(s, dict(changes), path, f"list entry {n} ({label})")))
        return out


@dataclass(frozen=True)
class SearchAxis(Axis):
    """Every valid parallel plan of each GPU count that fits in memory, best-ranked first (the analytic
    ranking of `estimators.parallelism.evaluate.rank_candidate_plans`); `max_plans` keeps the top ones.
    Sequence length, global batch and precision come from the scenario's plan."""

    gpus: tuple[int, ...]
    max_plans: int | None = None
    kind = "search"

    def expand(self, s, path):
        from estimators.parallelism.evaluate import rank_candidate_plans

        if s.model is None or s.hardware is None:
            raise TraceInputError(path, "a search axis needs 'model' and 'hardware' in the scenario")
        out = []
        for gpus in self.gpus:
            plans = rank_candidate_plans(s.model, s.hardware, gpus, s.plan.seq_len, s.plan.global_batch,
                                         s.plan.precision, self.max_plans)
            out.extend((f"{gpus} GPUs {plan_label(p)}", dataclasses.replace(s, plan=p)) for p in plans)
        return out


# ---------------------------------------------------------------------------- axis parsing
def _dotted(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{hardware = {network = {nic_gbps = [..]}}}` (TOML dotted keys) -> `{"hardware.network.nic_gbps": [..]}`."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_dotted(v, key + "."))
        else:
            out[key] = v
    return out


def _value_lists(table: Any, kind: str, where: str, path: str | None) -> tuple[tuple[str, tuple], ...]:
    if not isinstance(table, Mapping) or not table:
        raise TraceInputError(path, f"{where}: '{kind}' must be a table of KEY = [values]")
    out = []
    for key, values in _dotted(table).items():
        if not isinstance(values, (list, tuple)) or not values:
            raise TraceInputError(path, f"{where}: {kind} '{key}' must be a non-empty list of values, got {values!r}")
        out.append((key, tuple(values)))
    return tuple(out)


def _parse_grid(v, where, path):
    return GridAxis(_value_lists(v, "grid", where, path))


def _parse_zip(v, where, path):
    values = _value_lists(v, "zip", where, path)
    lengths = {k: len(vals) for k, vals in values}
    if len(set(lengths.values())) > 1:
        raise TraceInputError(path, f"{where}: zip lists differ in length: "
                                    + ", ".join(f"{k} has {n}" for k, n in lengths.items()))
    return ZipAxis(values)


def _parse_list(v, where, path):
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(e, Mapping) for e in v):
        raise TraceInputError(path, f"{where}: 'list' must be a non-empty array of override tables")
    entries = []
    for e in v:
        e = dict(e)
        label = e.pop("label", "")
        entries.append((str(label), tuple(_dotted(e).items())))
    return ListAxis(tuple(entries))


def _parse_search(v, where, path):
    if not isinstance(v, Mapping):
        raise TraceInputError(path, f"{where}: 'search' must be a table (gpus = [..], max_plans = N)")
    reject_unknown_keys(path, v, ("gpus", "max_plans"), prefix="search.", where=f" in {where}")
    gpus = v.get("gpus")
    gpus = [gpus] if isinstance(gpus, int) else gpus
    if not isinstance(gpus, (list, tuple)) or not gpus or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in gpus):
        raise TraceInputError(path, f"{where}: search.gpus must be a list of GPU counts >= 1, got {v.get('gpus')!r}")
    max_plans = v.get("max_plans")
    if max_plans is not None and (isinstance(max_plans, bool) or not isinstance(max_plans, int) or max_plans < 1):
        raise TraceInputError(path, f"{where}: search.max_plans must be an integer >= 1, got {max_plans!r}")
    return SearchAxis(tuple(gpus), max_plans)


# one parser per axis kind: a new kind is one Axis class and one entry here
AXIS_KINDS = {"grid": _parse_grid, "zip": _parse_zip, "list": _parse_list, "search": _parse_search}


def parse_axis(table: Any, where: str, path: str | None) -> Axis:
    if not isinstance(table, Mapping) or len(table) != 1:
        raise TraceInputError(path, f"{where}: an axis is a table with exactly one of "
                                    f"{', '.join(AXIS_KINDS)} (got {sorted(table) if isinstance(table, Mapping) else table!r})")
    (kind, value), = table.items()
    reject_unknown_keys(path, [kind], AXIS_KINDS, what="axis kind", where=f" in {where}")
    return AXIS_KINDS[kind](value, where, path)


# ============================================================================ spec
@dataclass(frozen=True)
class SweepPoint:
    index: int
    label: str
    scenario: Scenario

    @property
    def key(self) -> str:
        return self.scenario.key()


@dataclass(frozen=True)
class SweepSpec:
    base: Scenario
    axes: tuple[Axis, ...] = ()
    name: str = ""
    path: str | None = None

    def points(self) -> list[SweepPoint]:
        """Every point: the product of the axes, in order (the last axis varies fastest)."""
        partial: list[tuple[list[str], Scenario]] = [([], self.base)]
        for axis in self.axes:
            partial = [(labels + [part], s2) for labels, s in partial for part, s2 in axis.expand(s, self.path)]
        out = []
        for n, (labels, s) in enumerate(partial):
            label = ", ".join(p for p in labels if p) or self.base.label or s.describe()
            out.append(SweepPoint(n, label, dataclasses.replace(s, label=label)))
        return out


def load_spec(spec: str | os.PathLike | Mapping[str, Any], overrides: Iterable[str] = ()) -> SweepSpec:
    """A spec from a TOML path or a dict; `overrides` are `KEY=VALUE` strings: `axes.N.<kind>...` and
    `sweep.*` keys edit the spec, every other key the base scenario (as `--set` everywhere)."""
    path = None
    if isinstance(spec, Mapping):
        data = copy.deepcopy(dict(spec))  # --set edits it: never the caller's dict
    else:
        path = str(spec)
        data = _read_toml(path)
    scenario_sets = []
    for a in overrides:
        key, sep, value = str(a).partition("=")
        if sep and key.strip().split(".")[0] in ("axes", "sweep"):
            _set_spec_value(data, key.strip().split("."), _toml_value(value.strip()), path)
        else:
            scenario_sets.append(a)
    return _spec_from_dict(data, path, scenario_sets)


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise TraceInputError(path, "sweep spec not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, IsADirectoryError) as e:
        raise TraceInputError(path, f"not a valid TOML file: {e}") from None


def _spec_from_dict(data: dict[str, Any], path: str | None, scenario_sets: Sequence[str]) -> SweepSpec:
    reject_unknown_keys(path, data, SPEC_KEYS, what="sweep spec key")
    if not isinstance(data.get("scenario"), Mapping):
        raise TraceInputError(path, "a sweep spec needs a [scenario] table (the base scenario)")
    meta = data.get("sweep", {})
    if not isinstance(meta, Mapping):
        raise TraceInputError(path, "[sweep] must be a table")
    reject_unknown_keys(path, meta, ("name", "description"), prefix="sweep.")
    base = Scenario.from_dict(data["scenario"], path=path).override_strings(scenario_sets, path=path)
    axes_data = data.get("axes", [])
    if not isinstance(axes_data, list):
        raise TraceInputError(path, "'axes' must be an array of tables ([[axes]])")
    axes = tuple(parse_axis(t, f"axes[{n}]", path) for n, t in enumerate(axes_data))
    return SweepSpec(base=base, axes=axes, name=str(meta.get("name", "")), path=path)


def _toml_value(text: str) -> Any:
    """A `--set` value as TOML would read it (`[64, 128]`, `2`, `"x"`), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_spec_value(data: dict[str, Any], parts: list[str], value: Any, path: str | None) -> None:
    """Set `axes.0.search.gpus` or `axes.1.grid.hardware.network.nic_gbps` (the rest of a key inside a
    grid / zip table is one dotted key) in the spec dict."""
    key = ".".join(parts)
    node: Any = data
    for n, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise TraceInputError(path, f"--set {key}: '{part}' is not an axis index (0..{len(node) - 1})")
            node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise TraceInputError(path, f"--set {key}: '{part}' is inside a value that has no fields")
        if part in ("grid", "zip") and isinstance(node.get(part), dict):
            node[part] = _dotted(node[part])
            node[part][".".join(parts[n + 1:])] = value
            return
        node = node.setdefault(part, {})
    if isinstance(node, list):
        raise TraceInputError(path, f"--set {key}: give an axis field, e.g. axes.0.search.gpus=[64,128]")
    node[parts[-1]] = value


# ============================================================================ evaluation of one point
def evaluate_point(scenario: Scenario) -> dict[str, Any]:
    """Status plus prediction columns of one point; any failure is recorded, never raised (a sweep goes on)."""
    from estimators.registry import evaluate

    try:
        p = evaluate(scenario)
    except Exception as e:  # noqa: BLE001 -- a failing point records its error in its row
        msg = e.problem if isinstance(e, TraceInputError) else f"{type(e).__name__}: {e}"
        return {"status": STATUS_ERROR, "error": " ".join(str(msg).split())}
    return {"status": STATUS_OK, "error": "", **p.to_row()}


def _evaluate_task(task: tuple[int, Scenario]) -> tuple[int, dict[str, Any]]:
    index, scenario = task
    return index, evaluate_point(scenario)


# ============================================================================ running a sweep
class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a sweep; the results file holds every point finished so far."""

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.stats: dict[str, Any] = {}


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises SweepInterrupted in the main thread (like Ctrl-C), so results are saved."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SweepInterrupted("SIGTERM")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def sweep(spec: str | os.PathLike | Mapping[str, Any] | SweepSpec | Iterable[Scenario], output: str | os.PathLike | None = None,
          executor: str = "local", workers: int = 1, ray_address: str | None = None, overrides: Iterable[str] = (),
          csv: bool = False, fresh: bool = False, progress: bool = True, flush_every_s: float = 5.0):
    """Evaluate every point of `spec` (a spec path / dict / SweepSpec, or scenarios) and return the table
    (a pandas DataFrame, one row per point, in point order; `df.attrs["sweep"]` has the run's counts).

    `output` (.parquet or .csv; `csv=True` also writes a .csv beside a .parquet) is kept complete and
    readable throughout and is the cache: points already in it are not evaluated again (`fresh=True`
    ignores it). On Ctrl-C / SIGTERM the file is saved and `SweepInterrupted` is raised."""
    from lumos_sim.sweep_executors import check_executor
    from lumos_sim.sweep_io import ResultsFile, rows_frame

    check_executor(executor, workers, ray_address)
    sweep_spec = spec if isinstance(spec, SweepSpec) else None
    if sweep_spec is not None and list(overrides):
        raise TraceInputError(spec.path, "overrides apply to a spec file or dict; this SweepSpec is already built")
    if sweep_spec is None and (isinstance(spec, (str, os.PathLike, Mapping))):
        sweep_spec = load_spec(spec, overrides)
    if sweep_spec is not None:
        points = sweep_spec.points()
    else:
        points = [SweepPoint(n, s.label or s.describe(), s.override_strings(overrides)) for n, s in enumerate(spec)]
    if not points:
        raise TraceInputError(sweep_spec.path if sweep_spec else None, "the sweep has no points")
    results = ResultsFile(Path(output), csv=csv, flush_every_s=flush_every_s) if output is not None else None
    rows, todo = _initial_rows(points, results, fresh)
    stats = {"points": len(points), "cached": len(points) - len(todo), "computed": 0, "failed": 0}
    t0 = time.perf_counter()
    try:
        _run_points(todo, rows, results, stats, executor, workers, ray_address, progress)
    except KeyboardInterrupt as e:
        interrupted = e if isinstance(e, SweepInterrupted) else SweepInterrupted("SIGINT")
        interrupted.stats = {**stats, "wall_s": time.perf_counter() - t0, "output": str(output) if output else None}
        raise interrupted from None
    finally:
        if results is not None:
            results.write(rows)
    stats["failed"] = sum(r["status"] == STATUS_ERROR for r in rows)
    stats["wall_s"] = time.perf_counter() - t0
    df = rows_frame(rows)
    df.attrs["sweep"] = {**stats, "name": sweep_spec.name if sweep_spec else "", "output": str(output) if output else None}
    return df


def _initial_rows(points: list[SweepPoint], results, fresh: bool) -> tuple[list[dict[str, Any]], list[SweepPoint]]:
    """A row per point: from the cache where the point's key is there, else pending (and to do)."""
    cached = results.load_cached() if results is not None and not fresh else {}
    rows, todo = [], []
    for p in points:
        inputs = p.scenario.flatten()
        hit = cached.get(p.key)
        if hit is not None:
            rows.append({"point": p.index, **inputs, **hit})
        else:
            rows.append({"point": p.index, "status": STATUS_PENDING, "error": "", **inputs, "scenario_key": p.key})
            todo.append(p)
    if results is not None:
        results.write(rows)  # complete from the start: every point has a row
    return rows, todo


def _run_points(todo: list[SweepPoint], rows: list[dict[str, Any]], results, stats: dict[str, Any], executor: str,
                workers: int, ray_address: str | None, progress: bool) -> None:
    from lumos_sim.progress import progress_bar
    from lumos_sim.sweep_executors import get_executor

    if not todo:
        return
    with get_executor(executor, workers, ray_address) as ex, _sigterm_as_interrupt(), \
            progress_bar(f"sweep ({len(todo)} points)", enabled=progress) as bar:
        bar(0, len(todo))
        for index, result in ex.imap([(p.index, p.scenario) for p in todo]):
            rows[index].update(result)
            stats["computed"] += 1
            bar(stats["computed"], len(todo))
            if results is not None:
                results.maybe_write(rows)


__all__ = ["Axis", "AXIS_KINDS", "GridAxis", "ListAxis", "SearchAxis", "SweepInterrupted", "SweepPoint", "SweepSpec",
           "ZipAxis", "evaluate_point", "load_spec", "sweep"]
