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

Axes may be named instead (`[axes.nic]` + `grid = {...}`, in file order): `--set axes.nic.grid.KEY=[..]`
edits one by name, and `axes.N...` by position works for both forms. Relative routing / trace paths
(`moe.routing`, `moe.expert_load`, `trace.inputs`, `trace.et`, `trace.kineto`) and model / hardware files
(a `.json` / `.toml`, or a path with a folder; a zoo or preset name stays a name) in a spec file are
relative to its folder. Errors of the spec itself (an unknown what-if, a what-if missing its model)
fail the sweep before anything runs; a sweep of more than `MAX_POINTS` points is refused (its size is
counted from the axes, without expanding them); the results file is locked while a sweep writes it.

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
import math
import os
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from chakra_schema.errors import TraceInputError, reject_unknown_keys, within
from estimators.scenario import Scenario, plan_label

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SPEC_KEYS = ("sweep", "scenario", "axes")
from lumos_sim.sweep_executors import (STATUS_ERROR, STATUS_PENDING, check_executor,  # noqa: F401 (API)
                                       evaluate_point, get_executor)
META_COLUMNS = ("point", "status", "error")


# ============================================================================ axes
class Axis:
    """One axis of a sweep: `expand(scenario)` -> (label part, scenario) for each of its values, lazily;
    `count()` -> how many values, without expanding (None when it depends on the scenario: search)."""

    kind = ""

    def expand(self, s: Scenario, path: str | None) -> Iterator[tuple[str, Scenario]]:
        raise NotImplementedError

    def count(self) -> int | None:
        return None


def _label_part(key: str, value: Any) -> str:
    return f"{key.rsplit('.', 1)[-1]}={value}"


def _override(s: Scenario, changes: Mapping[str, Any], path: str | None, where: str) -> Scenario:
    try:
        return s.override(changes)
    except TraceInputError as e:
        raise within(path, e, f"{where}: ") from None


@dataclass(frozen=True)
class _KeyValuesAxis(Axis):
    """Keys with lists of values; subclasses say how the lists combine (`combos`)."""

    values: tuple[tuple[str, tuple], ...]

    def combos(self) -> Iterable[tuple]:
        raise NotImplementedError

    def expand(self, s, path):
        keys = [k for k, _ in self.values]
        for combo in self.combos():
            changes = dict(zip(keys, combo))
            label = " ".join(_label_part(k, v) for k, v in changes.items())
            yield label, _override(s, changes, path, f"{self.kind} point {label}")


@dataclass(frozen=True)
class GridAxis(_KeyValuesAxis):
    """Cartesian product of each key's values."""

    kind = "grid"

    def combos(self):
        return itertools.product(*(v for _, v in self.values))

    def count(self):
        return math.prod(len(v) for _, v in self.values)


@dataclass(frozen=True)
class ZipAxis(_KeyValuesAxis):
    """The i-th value of every key together (all lists the same length)."""

    kind = "zip"

    def combos(self):
        return zip(*(v for _, v in self.values))

    def count(self):
        return len(self.values[0][1])


@dataclass(frozen=True)
class ListAxis(Axis):
    """Explicit override sets; an entry's `label` names it (it is not an override)."""

    entries: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    kind = "list"

    def expand(self, s, path):
        for n, (label, changes) in enumerate(self.entries):
            label = label or " ".join(_label_part(k, v) for k, v in changes) or f"entry {n}"
            yield label, _override(s, dict(changes), path, f"list entry {n} ({label})")

    def count(self):
        return len(self.entries)


@dataclass(frozen=True)
class SearchAxis(Axis):
    """Every valid parallel plan of each GPU count that fits in memory, best-ranked first (the analytic
    ranking of `estimators.parallelism.evaluate.rank_candidate_plans`); `max_plans` keeps the top ones.
    Sequence length, global batch, precision, attention and the options a search takes as given (dispatcher,
    FP8 recipe, CUDA graphs, ...: `estimators.parallelism.search.carried_options`) come from the scenario's
    plan."""

    gpus: tuple[int, ...]
    max_plans: int | None = None
    kind = "search"

    def expand(self, s, path):
        from estimators.parallelism.evaluate import rank_candidate_plans

        from estimators.parallelism.search import unsearched_options
        if s.model is None or s.hardware is None:
            raise TraceInputError(path, "a search axis needs 'model' and 'hardware' in the scenario")
        unheld = unsearched_options(s.plan)
        if unheld:
            raise TraceInputError(path, f"a search axis ranks layouts without the scenario's {unheld[0]} (it does "
                                        "not hold its candidates to it): use a grid or list axis for that plan")
        for gpus in self.gpus:
            plans = rank_candidate_plans(s.model, s.hardware, gpus, s.plan.seq_len, s.plan.global_batch,
                                         s.plan.precision, self.max_plans, base=s.plan)
            yield from ((f"{gpus} GPUs {plan_label(p)}", dataclasses.replace(s, plan=p)) for p in plans)


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
    from estimators.parallelism.plan import MAX_GPUS
    if not isinstance(gpus, (list, tuple)) or not gpus or not all(
            isinstance(g, int) and not isinstance(g, bool) and 1 <= g <= MAX_GPUS for g in gpus):
        raise TraceInputError(path, f"{where}: search.gpus must be a list of GPU counts in [1, {MAX_GPUS:,}], "
                                    f"got {v.get('gpus')!r}"[:300])
    max_plans = v.get("max_plans")
    from estimators.parallelism.search import MAX_SIMULATED_PLANS
    if max_plans is not None and (isinstance(max_plans, bool) or not isinstance(max_plans, int)
                                  or not 1 <= max_plans <= MAX_SIMULATED_PLANS):
        raise TraceInputError(path, f"{where}: search.max_plans must be an integer in [1, {MAX_SIMULATED_PLANS:,}] "
                                    f"(each plan it names is simulated), got {max_plans!r}"[:300])
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


MAX_POINTS = 1_000_000   # one results table row per point, held in memory: split a bigger sweep


@dataclass(frozen=True)
class SweepSpec:
    base: Scenario
    axes: tuple[Axis, ...] = ()
    name: str = ""
    path: str | None = None

    def __post_init__(self) -> None:
        # a key on two axes: the later axis would overwrite the earlier's values (labels naming both)
        seen: dict[str, int] = {}
        for n, axis in enumerate(self.axes):
            keys = ({k for k, _ in axis.values} if isinstance(axis, _KeyValuesAxis) else
                    {k for _, changes in axis.entries for k, _ in changes} if isinstance(axis, ListAxis) else set())
            for k in sorted(keys):
                if k in seen:
                    raise TraceInputError(self.path, f"'{k}' is on axis {seen[k]} and axis {n}: the later would "
                                                     "overwrite the earlier's values (give it on one axis)")
                seen[k] = n
        # a search axis chooses the layout: a layout key on another axis would undo or mislabel its plans
        searches = [n for n, a in enumerate(self.axes) if isinstance(a, SearchAxis)]
        if len(searches) > 1:   # each would choose the layout: the later replaced the earlier's plans
            raise TraceInputError(self.path, f"axes {searches[0]} and {searches[1]} are both searches: give every "
                                             "GPU count on one (search.gpus = [..])")
        search = searches[0] if searches else None
        if search is not None:
            from estimators.parallelism.search import SEARCHED_COLUMNS
            layout = sorted(k for k in seen if k in {"plan.gpus", *(f"plan.{c}" for c in SEARCHED_COLUMNS)})
            if layout:
                raise TraceInputError(self.path, f"'{layout[0]}' is on axis {seen[layout[0]]} beside the search "
                                                 f"axis {search}, which chooses the layout: give the GPU counts "
                                                 "on the search axis (search.gpus) and leave the layout to it")

    def count(self) -> int | None:
        """The number of points, from the axes' sizes alone (None when a search axis makes it depend on
        the scenarios: then only expanding tells)."""
        counts = [a.count() for a in self.axes]
        return None if None in counts else math.prod(counts)

    def iter_points(self) -> Iterator[SweepPoint]:
        """Every point, streamed: the product of the axes, in order (the last axis varies fastest). Each
        point is checked for spec-level errors (an unknown what-if, a missing model) as it is made."""
        def expand(depth: int, labels: list[str], s: Scenario) -> Iterator[tuple[list[str], Scenario]]:
            if depth == len(self.axes):
                yield labels, s
                return
            for part, s2 in self.axes[depth].expand(s, self.path):
                yield from expand(depth + 1, labels + [part], s2)

        for n, (labels, s) in enumerate(expand(0, [], self.base)):
            label = ", ".join(p for p in labels if p) or self.base.label or s.describe()
            _check_runnable(s, self.path, label)
            yield SweepPoint(n, label, dataclasses.replace(s, label=label))

    def points(self, limit: int = MAX_POINTS) -> list[SweepPoint]:
        """Every point as a list, refusing (before expanding) a sweep of more than `limit` points."""
        n = self.count()
        if n is not None and n > limit:
            raise TraceInputError(self.path, f"the sweep has {n:,} points, more than the {limit:,} one results "
                                             "table holds: narrow the axes or split the sweep (--dry-run counts)")
        out = []
        for p in self.iter_points():
            if len(out) >= limit:
                raise TraceInputError(self.path, f"the sweep has more than {limit:,} points (one results table "
                                                 "row each): narrow the axes or split the sweep")
            out.append(p)
        return out


def _check_runnable(s: Scenario, path: str | None, label: str) -> None:
    """Errors of the spec itself (the same for every point that has them) fail the sweep up front, rather
    than fail every point quietly into its row: an unknown what-if, a what-if without what it needs."""
    from estimators.registry import get_whatif

    try:
        w = get_whatif(s.whatif)
    except TraceInputError as e:
        raise within(path, e, f"point '{label}': ") from None
    for need in w.needs:
        if getattr(s, need) is None:
            raise TraceInputError(path, f"point '{label}': what-if '{w.name}' needs '{need}' in the scenario")


def load_spec(spec: str | os.PathLike | Mapping[str, Any], overrides: Iterable[str] = ()) -> SweepSpec:
    """A spec from a TOML path or a dict; `overrides` are `KEY=VALUE` strings: `axes.N.<kind>...` (or
    `axes.NAME.<kind>...` for a named axis) and `sweep.*` keys edit the spec, every other key the base
    scenario (as `--set` everywhere). Relative routing / trace paths in a spec file are relative to the
    file's folder (as in `check` suites); those given with --set, to the current folder."""
    path = None
    if isinstance(spec, Mapping):
        data = copy.deepcopy(dict(spec))  # --set edits it: never the caller's dict
    else:
        path = str(spec)
        data = _read_toml(path)
        _resolve_spec_paths(data, Path(path).resolve().parent)
    scenario_sets = []
    for a in overrides:
        key, sep, value = str(a).partition("=")
        if sep and key.strip().split(".")[0] in ("axes", "sweep"):
            _set_spec_value(data, key.strip().split("."), _toml_value(value.strip(), path), path)
        else:
            scenario_sets.append(a)
    return _spec_from_dict(data, path, scenario_sets)


def _read_toml(path: str) -> dict[str, Any]:
    from chakra_schema.errors import read_toml
    return read_toml(path, "sweep spec")


# scenario fields that name input files: a spec file's relative ones are relative to its folder
PATH_KEYS = ("moe.routing", "moe.expert_load", "trace.inputs", "trace.et", "trace.kineto")


def _resolve_path_value(value: Any, folder: Path) -> Any:
    if isinstance(value, (list, tuple)):
        return [_resolve_path_value(v, folder) for v in value]
    if not isinstance(value, str) or not value or value.split(":")[0] == "synthetic" or os.path.isabs(value):
        return value
    return str(folder / value)


# scenario fields that name a zoo entry or a file: a relative file (a .json / .toml, or a path with a folder)
# is relative to the spec's folder, as the input files are; a name stays a name
NAMED_FILE_KEYS = ("model", "hardware")


def _resolve_named_file(value: Any, folder: Path) -> Any:
    if isinstance(value, (list, tuple)):
        return [_resolve_named_file(v, folder) for v in value]
    if isinstance(value, str) and (value.endswith((".json", ".toml")) or "/" in value):
        return _resolve_path_value(value, folder)
    return value


def _resolve_spec_paths(data: dict[str, Any], folder: Path) -> None:
    """Make the file paths of the spec's scenario and axes absolute from `folder` (in place)."""
    scenario = data.get("scenario")
    if isinstance(scenario, dict):
        for key in NAMED_FILE_KEYS:
            if key in scenario:
                scenario[key] = _resolve_named_file(scenario[key], folder)
        for key in PATH_KEYS:
            section, field = key.split(".")
            if key in scenario:
                scenario[key] = _resolve_path_value(scenario[key], folder)
            if isinstance(scenario.get(section), dict) and field in scenario[section]:
                scenario[section][field] = _resolve_path_value(scenario[section][field], folder)
    axes = data.get("axes")
    tables = axes.values() if isinstance(axes, dict) else axes if isinstance(axes, list) else ()
    for table in tables:
        if not isinstance(table, dict):
            continue
        for kind in ("grid", "zip"):
            if isinstance(table.get(kind), dict):
                table[kind] = {k: _resolve_axis_value(k, v, folder) for k, v in _dotted(table[kind]).items()}
        if isinstance(table.get("list"), list):
            table["list"] = [{k: _resolve_axis_value(k, v, folder, one=True) for k, v in _dotted(e).items()}
                             if isinstance(e, dict) else e for e in table["list"]]


def _resolve_axis_value(key: str, value: Any, folder: Path, one: bool = False) -> Any:
    """An axis's values of `key` (a list, or `one` value of a list axis entry), files made absolute."""
    if not (one or isinstance(value, list)):
        return value
    if key in NAMED_FILE_KEYS:
        return _resolve_named_file(value, folder)
    return _resolve_path_value(value, folder) if key in PATH_KEYS else value


def _axis_tables(axes_data: Any, path: str | None) -> list[tuple[str, Any]]:
    """(where, table) of each axis: `[[axes]]` (an array: axes[0], axes[1]...) or named axes
    (`[axes.nic]` tables, in file order: axes.nic)."""
    if isinstance(axes_data, list):
        return [(f"axes[{n}]", t) for n, t in enumerate(axes_data)]
    if isinstance(axes_data, Mapping) and not set(axes_data) & set(AXIS_KINDS):
        return [(f"axes.{name}", t) for name, t in axes_data.items()]
    # `[axes]` + `grid = ...` (one bracket pair short) lands here too: an axis may not be named like a kind
    raise TraceInputError(path, "'axes' must be an array of tables ([[axes]]) or named tables ([axes.NAME], "
                                f"NAME not one of {', '.join(AXIS_KINDS)})")


def _spec_from_dict(data: dict[str, Any], path: str | None, scenario_sets: Sequence[str]) -> SweepSpec:
    reject_unknown_keys(path, data, SPEC_KEYS, what="sweep spec key")
    if not isinstance(data.get("scenario"), Mapping):
        raise TraceInputError(path, "a sweep spec needs a [scenario] table (the base scenario)")
    meta = data.get("sweep", {})
    if not isinstance(meta, Mapping):
        raise TraceInputError(path, "[sweep] must be a table")
    reject_unknown_keys(path, meta, ("name", "description"), prefix="sweep.")
    base = Scenario.from_dict(data["scenario"], path=path).override_strings(scenario_sets, path=path)
    axes = tuple(parse_axis(t, where, path) for where, t in _axis_tables(data.get("axes", []), path))
    return SweepSpec(base=base, axes=axes, name=str(meta.get("name", "")), path=path)


def _toml_value(text: str, path: str | None = None) -> Any:
    """A `--set` value as TOML would read it (`[64, 128]`, `2`, `"x"`), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except ValueError:   # TOMLDecodeError, or an integer past Python's int-parsing digit limit
        return text
    except RecursionError:
        raise TraceInputError(path, f"--set value nested too deeply: {text[:40]}...") from None


def _set_spec_value(data: dict[str, Any], parts: list[str], value: Any, path: str | None) -> None:
    """Set `axes.0.search.gpus`, `axes.1.grid.hardware.network.nic_gbps` or `axes.nic.grid...` (the
    rest of a key inside a grid / zip table is one dotted key) in the spec dict. A named axis is also
    reachable by its position (axes.1 is the second [axes.NAME] table)."""
    key = ".".join(parts)
    node: Any = data
    for n, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise TraceInputError(path, f"--set {key}: '{part}' is not an axis index (0..{len(node) - 1}); "
                                            "the axes of this spec have no names")
            node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise TraceInputError(path, f"--set {key}: '{part}' is inside a value that has no fields")
        if n == 1 and parts[0] == "axes" and part.isdigit() and part not in node:
            names = list(node)
            if int(part) >= len(names):
                raise TraceInputError(path, f"--set {key}: '{part}' is not an axis index (0..{len(names) - 1})")
            part = names[int(part)]
        if part in ("grid", "zip") and isinstance(node.get(part), dict):
            node[part] = _dotted(node[part])
            node[part][".".join(parts[n + 1:])] = value
            return
        node = node.setdefault(part, {})
    if isinstance(node, list):
        raise TraceInputError(path, f"--set {key}: give an axis field, e.g. axes.0.search.gpus=[64,128]")
    node[parts[-1]] = value


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
    from lumos_sim.sweep_io import ResultsFile, rows_frame

    check_executor(executor, workers, ray_address)
    sweep_spec = spec if isinstance(spec, SweepSpec) else None
    if sweep_spec is not None and list(overrides):
        raise TraceInputError(spec.path, "overrides apply to a spec file or dict; this SweepSpec is already built")
    if sweep_spec is None and (isinstance(spec, (str, os.PathLike, Mapping))):
        sweep_spec = load_spec(spec, overrides)
    # the output is checked before the points are expanded (a search axis ranks plans: that takes a while)
    results = ResultsFile(Path(output), csv=csv, flush_every_s=flush_every_s) if output is not None else None
    if sweep_spec is not None:
        points = sweep_spec.points()
    else:
        points = [SweepPoint(n, s.label or s.describe(), s.override_strings(overrides)) for n, s in enumerate(spec)]
    if not points:
        raise TraceInputError(sweep_spec.path if sweep_spec else None, "the sweep has no points")
    with results.lock() if results is not None else nullcontext():
        rows, todo = _initial_rows(points, results, fresh)
        stats = {"points": len(points), "cached": len(points) - len(todo), "computed": 0, "failed": 0}
        state = {"started": not todo}     # nothing to run: the table is written as it is
        t0 = time.perf_counter()
        try:
            _run_points(todo, rows, results, stats, state, executor, workers, ray_address, progress)
        except KeyboardInterrupt as e:
            interrupted = e if isinstance(e, SweepInterrupted) else SweepInterrupted("SIGINT")
            interrupted.stats = {**stats, "wall_s": time.perf_counter() - t0, "output": str(output) if output else None}
            raise interrupted from None
        finally:
            # only once the executor runs: a sweep that could not start leaves the file as it was (a table
            # of pending rows would claim work that nothing is doing)
            if results is not None and state["started"]:
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
    return rows, todo


def _run_points(todo: list[SweepPoint], rows: list[dict[str, Any]], results, stats: dict[str, Any],
                state: dict[str, bool], executor: str, workers: int, ray_address: str | None, progress: bool) -> None:
    from lumos_sim.progress import progress_bar

    if not todo:
        return
    # a worker without a point to evaluate only costs its start (a local worker is a ~235 MB process)
    workers = max(1, min(workers, len(todo)))
    with get_executor(executor, workers, ray_address) as ex, _sigterm_as_interrupt(), \
            progress_bar(f"sweep ({len(todo)} points)", enabled=progress) as bar:
        state["started"] = True
        if results is not None:
            results.write(rows)  # complete from the start: every point has a row
        bar(0, len(todo))
        for index, result in ex.imap([(p.index, p.scenario) for p in todo]):
            rows[index].update(result)
            stats["computed"] += 1
            bar(stats["computed"], len(todo))
            if results is not None:
                results.maybe_write(rows)


__all__ = ["Axis", "AXIS_KINDS", "GridAxis", "ListAxis", "SearchAxis", "SweepInterrupted", "SweepPoint", "SweepSpec",
           "ZipAxis", "evaluate_point", "load_spec", "sweep"]
