"""`Scenario`: everything one what-if evaluation depends on, as one typed, frozen value.

A scenario names the what-if that evaluates it (`whatif`, a key of the registry in
`estimators.registry`) and carries its inputs: the model, the parallel plan (which also holds precision,
recomputation, ZeRO stage, micro-batch size...), the hardware, the timing mode, optional trace inputs,
and per-what-if option sections (`failure`, `moe`: frozen dataclasses owned by those what-ifs).

Dotted overrides change any nested field, from Python or from the CLI (`--set KEY=VALUE`):

    s = Scenario.build(model="llama3-70b", hardware="h100-sxm", plan=ParallelPlan(tp=8, dp=8, ...))
    s2 = s.override({"hardware.network.nic_gbps": 800, "plan.tp": 4})
    s3 = s.override_strings(["plan.gpus=128", "hardware=h200"])    # values parsed by the field's type

Special keys: `model=NAME|PATH` and `hardware=NAME|PATH` load a zoo model / preset; `plan.gpus=N` sets
the data-parallel degree to N / (tp*pp*cp). Every override builds new frozen dataclasses, so each
level re-runs its `__post_init__` validation: a value set here is checked like one read from TOML.

`flatten()` gives one scalar per leaf field (`plan.tp`, `hardware.network.nic_gbps`, ...): the input
columns of a sweep row. `key()` is a content hash of that (hardware and model by value, not by name),
so a sweep's cache notices an edited preset file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from chakra_schema.errors import TraceInputError, check_choice, reject_unknown_keys, within
from estimators.failures.options import FailureOptions
from estimators.model_config import ModelConfig, load_model
from estimators.moe.options import MoEOptions
from estimators.parallelism.plan import ParallelPlan
from replay.hardware.config import HardwareConfig, get_hardware

TIMING_MODES = ("model", "trace")
SIMULATION_MODES = ("fast", "symmetric", "all")
# bump when what a key means changes, so cached sweep points are recomputed
SCENARIO_FORMAT = 1


@dataclass(frozen=True)
class TraceSpec:
    """Real trace inputs of a trace what-if, and the edits to make to them before replaying.

    `inputs`: .et files / prefixes or raw traces (as `lumos-sim replay INPUT`); `et`/`kineto`: raw
    Execution Trace / Kineto patterns with `{rank}`. `dp`, `layers`: the new data-parallel degree and
    layer count (None: unchanged). `source_hardware`: the GPU it was recorded on, when the trace does not
    say. `balance`: bring slow ranks' compute to the median rank's (`estimators.trace.balance`): the
    ranks in `balance_ranks`, or (empty) every rank computing more than `balance_threshold` above it."""

    inputs: tuple[str, ...] = ()
    et: str | None = None
    kineto: str | None = None
    source_hardware: str | None = None
    dp: int | None = None
    layers: int | None = None
    balance: bool = False
    balance_ranks: tuple[int, ...] = ()
    balance_threshold: float = 0.05

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, bytes)):  # a lone path would be iterated per character
            object.__setattr__(self, "inputs", (str(self.inputs),))
        else:
            object.__setattr__(self, "inputs", tuple(str(p) for p in self.inputs))
        if not (self.inputs or self.et or self.kineto):
            raise TraceInputError(None, "trace: give at least one input (.et prefix, .et file or raw trace)")
        for name in ("dp", "layers"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise TraceInputError(None, f"trace.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.balance, bool):
            raise TraceInputError(None, f"trace.balance must be true or false, got {self.balance!r}")
        ranks = self.balance_ranks
        if isinstance(ranks, (int, str)) or not all(type(r) is int and r >= 0 for r in ranks):
            raise TraceInputError(None, f"trace.balance_ranks must be a list of ranks (integers >= 0), got {ranks!r}")
        object.__setattr__(self, "balance_ranks", tuple(ranks))
        t = self.balance_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < 10:
            raise TraceInputError(None, f"trace.balance_threshold must be a number in [0, 10), got {t!r}")


@dataclass(frozen=True)
class Scenario:
    """One what-if question. `model`/`hardware` hold loaded configs (use `Scenario.build` to pass names)."""

    whatif: str = "parallelism"
    model: ModelConfig | None = None
    plan: ParallelPlan = field(default_factory=ParallelPlan)
    hardware: HardwareConfig | None = None
    timing: str = "model"               # model: hardware models; trace: recorded (translated) durations
    simulation: str = "fast"            # fast: stage samples + pipeline schedule (estimators.parallelism.compose);
    #                                     symmetric: full replay, one rank per pipeline stage; all: every rank
    trace: TraceSpec | None = None
    failure: Any = None                 # estimators.failures options (failure what-if)
    moe: Any = None                     # estimators.moe options (MoE what-if)
    label: str = ""                     # free text carried into results (a sweep point's name)

    def __post_init__(self) -> None:
        if not isinstance(self.whatif, str) or not self.whatif:
            raise TraceInputError(None, f"scenario 'whatif' must be a what-if name, got {self.whatif!r}")
        check_choice("timing", self.timing, TIMING_MODES)
        check_choice("simulation", self.simulation, SIMULATION_MODES)
        if self.model is not None and not isinstance(self.model, ModelConfig):
            raise TraceInputError(None, "scenario 'model' must be a ModelConfig (Scenario.build loads names)")
        if self.hardware is not None and not isinstance(self.hardware, HardwareConfig):
            raise TraceInputError(None, "scenario 'hardware' must be a HardwareConfig (Scenario.build loads names)")
        if not isinstance(self.plan, ParallelPlan):
            raise TraceInputError(None, "scenario 'plan' must be a ParallelPlan")

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, model: str | ModelConfig | None = None, hardware: str | HardwareConfig | None = None,
              plan: ParallelPlan | Mapping[str, Any] | None = None, trace: TraceSpec | Mapping[str, Any] | None = None,
              **kw: Any) -> "Scenario":
        """A scenario from names or configs: zoo model names / TOML paths and preset names / TOML paths
        are loaded; plan and trace may be dicts of their fields."""
        if isinstance(model, str):
            model = load_model(model)
        if isinstance(hardware, str):
            hardware = get_hardware(hardware)
        if isinstance(plan, Mapping):
            plan = _from_mapping(ParallelPlan, plan, "plan")
        if isinstance(trace, Mapping):
            trace = _from_mapping(TraceSpec, trace, "trace")
        return cls(model=model, hardware=hardware, plan=plan or ParallelPlan(), trace=trace, **kw)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str | None = None) -> "Scenario":
        """A scenario from a TOML/JSON table: top-level scalars, `model`/`hardware` as names or paths,
        `[plan]` and `[trace]` tables, and any `"dotted.key" = value` overrides on top."""
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        dotted = {k: data.pop(k) for k in list(data) if "." in k}
        reject_unknown_keys(path, data, names, what="scenario key")
        section_types = _option_section_types()
        for key in ("plan", "trace", *section_types):
            if data.get(key) is not None and not isinstance(data[key], Mapping):
                raise TraceInputError(path, f"scenario '{key}' must be a table ([{key}] with its fields), "
                                            f"got {type(data[key]).__name__} {data[key]!r:.40}")
        try:   # a bad value in an option section names the file too
            for key, cls_ in section_types.items():
                if isinstance(data.get(key), Mapping):
                    data[key] = _from_mapping(cls_, data[key], key)
            s = cls.build(**data)
        except TraceInputError as e:
            raise within(path, e) from None
        except TypeError as e:
            raise TraceInputError(path, f"bad scenario: {e}") from None
        return s.override(dotted, path=path) if dotted else s

    # ------------------------------------------------------------------ overrides
    def override(self, changes: Mapping[str, Any], path: str | None = None) -> "Scenario":
        """A new scenario with each dotted key set to its value (strings are parsed by field type)."""
        s: Scenario = self
        for key, value in changes.items():
            try:
                s = _set_path(s, key.split("."), value, key)
            except TraceInputError as e:
                raise within(path, e) from None
        return s

    def override_strings(self, assignments: Iterable[str], path: str | None = None) -> "Scenario":
        """`["plan.tp=4", "hardware.network.nic_gbps=800"]` -> overridden scenario (the CLI's --set)."""
        return self.override(parse_assignments(assignments), path=path)

    # ------------------------------------------------------------------ identity
    def flatten(self) -> dict[str, Any]:
        """One scalar per leaf input field, dotted names, in a stable order (JSON strings for lists)."""
        out: dict[str, Any] = {}
        _flatten_into(out, "", self)
        return out

    def key(self) -> str:
        """Content hash of every input (hardware and model by value), for caching evaluations."""
        blob = json.dumps({"format": SCENARIO_FORMAT, **self.flatten()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def describe(self) -> str:
        """Short human label: what-if, model, plan, hardware."""
        if self.label:
            return self.label
        parts = [self.whatif]
        if self.model is not None:
            parts.append(self.model.name)
        if self.model is not None or self.whatif == "parallelism":
            parts.append(plan_label(self.plan))
        if self.hardware is not None:
            parts.append(self.hardware.name)
        return " ".join(parts)


def plan_label(p: ParallelPlan) -> str:
    """`TP8 PP4x2 CP1 DP8 EP1 mb1 recompute=none zero=1`: every layout choice, named."""
    s = f"TP{p.tp} PP{p.pp}" + (f"x{p.vp}" if p.vp > 1 else "") + f" CP{p.cp} DP{p.dp}"
    if p.ep > 1:
        s += f" EP{p.ep}"
    return s + f" mb{p.micro_batch} recompute={p.recompute} zero={p.zero}"


# ---------------------------------------------------------------------- option sections
# A what-if's own options, a frozen dataclass each, declared here beside their `Scenario` field (the spine
# imports the what-ifs' option types; the what-ifs import the spine: one way)
OPTION_SECTIONS: dict[str, type] = {"failure": FailureOptions, "moe": MoEOptions}


def _option_section_types() -> dict[str, type]:
    """Dataclass types of the option sections (`OPTION_SECTIONS`)."""
    return OPTION_SECTIONS


# ---------------------------------------------------------------------- parsing values
def parse_assignments(assignments: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in assignments:
        key, sep, value = str(a).partition("=")
        key = key.strip()
        if not sep or not key:
            raise TraceInputError(None, f"--set expects KEY=VALUE (e.g. plan.tp=4), got '{a}'")
        out[key] = value.strip()
    return out


def _type_of(cls: type, name: str) -> Any:
    hints = typing.get_type_hints(cls)
    return hints[name]


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def coerce(value: Any, tp: Any, key: str) -> Any:
    """`value` (often a CLI string) as type `tp`; one-line error naming `key` when it does not fit."""
    tp, optional = _strip_optional(tp)
    if optional and (value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", ""))):
        return None
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):   # a section (model.mla, hardware.protocols' entries): a table of its fields
        if isinstance(value, tp):
            return value
        if isinstance(value, str) and value.strip().startswith("{"):   # --set model.moe='{"top_k": 2, ...}'
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                raise TraceInputError(None, f"{key}: expected a JSON table of {_type_name(tp)} fields, got {value!r}") from None
        if isinstance(value, Mapping):
            return _from_mapping(tp, value, key)
        raise TraceInputError(None, f"{key}: expected a table of {_type_name(tp)} fields, got {value!r}")
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
                return True
            if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            return int(str(value).strip())
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
        origin = typing.get_origin(tp)
        if origin in (tuple, list):
            if isinstance(value, str):
                value = json.loads(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
            args = typing.get_args(tp)
            inner = args[0] if args else Any
            return tuple(coerce(v, inner, key) for v in value)
        if origin is dict:
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, Mapping):
                raise ValueError
            kt, vt = typing.get_args(tp) or (Any, Any)
            return {coerce(k, kt, key): coerce(v, vt, key) for k, v in value.items()}
    # RecursionError: nested too deeply; OverflowError: a TOML integer past the float range for a float field
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise TraceInputError(None, f"{key}: expected {_type_name(tp)}, got {value!r}") from None
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _from_mapping(cls: type, data: Mapping[str, Any], where: str) -> Any:
    allowed = {f.name for f in dataclasses.fields(cls) if f.init}
    reject_unknown_keys(None, data, allowed, prefix=f"{where}.")
    kw = {}
    for k, v in data.items():
        tp = _type_of(cls, k)
        if dataclasses.is_dataclass(_strip_optional(tp)[0]) and isinstance(v, Mapping):
            kw[k] = _from_mapping(_strip_optional(tp)[0], v, f"{where}.{k}")
        else:
            kw[k] = coerce(v, tp, f"{where}.{k}")
    try:
        return cls(**kw)
    except TypeError as e:
        raise TraceInputError(None, f"{where}: {e}") from None


# ---------------------------------------------------------------------- setting a path
def _set_path(obj: Any, parts: list[str], value: Any, key: str) -> Any:
    head, rest = parts[0], parts[1:]
    if isinstance(obj, dict):  # e.g. hardware.gpu.peak_tflops.bf16
        if rest:
            if head not in obj:
                raise TraceInputError(None, f"unknown key '{key}'")
            return {**obj, head: _set_path(obj[head], rest, value, key)}
        template = next(iter(obj.values()), None)
        return {**obj, head: coerce(value, type(template) if template is not None else Any, key)}
    if not dataclasses.is_dataclass(obj):
        raise TraceInputError(None, f"unknown key '{key}': '{head}' is inside a value that has no fields")
    if isinstance(obj, Scenario) and not rest:
        return _set_scenario_top(obj, head, value, key)
    if isinstance(obj, ParallelPlan) and head == "gpus" and not rest:
        return _set_plan_gpus(obj, value, key)
    names = [f.name for f in dataclasses.fields(obj) if f.init]
    if head not in names:
        reject_unknown_keys(None, [head], names, prefix=key[: len(key) - len(".".join(parts))])
    current = getattr(obj, head)
    tp = _type_of(type(obj), head)
    if rest:
        if current is None:
            current = _default_section(obj, head, tp, key)
        new = _set_path(current, rest, value, key)
    elif dataclasses.is_dataclass(_strip_optional(tp)[0]) and isinstance(value, Mapping):
        new = _from_mapping(_strip_optional(tp)[0], value, key)
    else:
        new = coerce(value, tp, key)
    return dataclasses.replace(obj, **{head: new})


def _default_section(obj: Any, head: str, tp: Any, key: str) -> Any:
    """An unset option section (e.g. `failure`) is created with its defaults before a field of it is set."""
    cls = _option_section_types().get(head) if isinstance(obj, Scenario) else None
    if cls is None:
        inner = _strip_optional(tp)[0]
        cls = inner if dataclasses.is_dataclass(inner) else None
    if cls is None:
        raise TraceInputError(None, f"cannot set '{key}': '{head}' is not set and has no default")
    try:
        return cls()
    except TypeError:
        raise TraceInputError(None, f"cannot set '{key}' alone: '{head}' needs its required fields first") from None


def _set_scenario_top(s: Scenario, head: str, value: Any, key: str) -> Scenario:
    if head == "model":
        return dataclasses.replace(s, model=value if isinstance(value, ModelConfig) else load_model(str(value)))
    if head == "hardware":
        return dataclasses.replace(s, hardware=value if isinstance(value, HardwareConfig) else get_hardware(str(value)))
    names = [f.name for f in dataclasses.fields(s)]
    reject_unknown_keys(None, [head], names, what="scenario key")
    tp = _type_of(Scenario, head)
    if head in _option_section_types():   # a table of the section's fields (a JSON one from --set), nothing else
        cls = _option_section_types()[head]
        return dataclasses.replace(s, **{head: value if isinstance(value, cls) else coerce(value, cls, key)})
    if head == "trace" and isinstance(value, Mapping):
        return dataclasses.replace(s, trace=_from_mapping(TraceSpec, value, head))
    if head == "trace" and isinstance(value, (str, list, tuple)):
        inputs = (value,) if isinstance(value, str) else tuple(value)
        return dataclasses.replace(s, trace=TraceSpec(inputs=inputs) if s.trace is None
                                   else dataclasses.replace(s.trace, inputs=inputs))
    return dataclasses.replace(s, **{head: coerce(value, tp, key)})


def _set_plan_gpus(plan: ParallelPlan, value: Any, key: str) -> ParallelPlan:
    gpus = coerce(value, int, key)
    denom = plan.tp * plan.pp * plan.cp
    if gpus < 1 or gpus % denom:
        raise TraceInputError(None, f"{key}={gpus} is not a positive multiple of tp*pp*cp = {denom}")
    return dataclasses.replace(plan, dp=gpus // denom)


# ---------------------------------------------------------------------- flattening
_SKIP_FIELDS = {"sources", "path", "description", "source", "aliases", "device_names", "display_name"}


def _flatten_into(out: dict[str, Any], prefix: str, obj: Any) -> None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            if f.name in _SKIP_FIELDS:
                continue
            name = f"{prefix}.{f.name}" if prefix else f.name
            _flatten_into(out, name, getattr(obj, f.name))
            if isinstance(obj, ParallelPlan) and f.name == "dp":
                out[f"{prefix}.gpus" if prefix else "gpus"] = obj.gpus
    elif isinstance(obj, dict):
        for k in sorted(obj):
            _flatten_into(out, f"{prefix}.{k}", obj[k])
    elif isinstance(obj, (tuple, list)):
        out[prefix] = json.dumps([dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in obj],
                                 default=str)
    else:
        out[prefix] = obj
