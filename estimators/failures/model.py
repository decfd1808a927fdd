"""Failure models as data: how often a job's nodes fail, why, and how much each failure takes with it.

A preset (`estimators/failures/presets/*.toml`, or a user's TOML file of the same shape) records an
observation (GPUs, days, interruptions) and the interruptions by cause. The job-level rate is

    rate per 1,000 node-days = interruptions / (nodes x days) x 1,000

and each cause (component) gets its share of it. A job of N nodes then fails at N x rate / 1,000 per
day (mean time to failure falls as 1 / (nodes x rate)). A component's failure domain says what it takes
down: `scope = "node"` stops the `nodes` nodes of its domain (a top-of-rack switch takes its rack),
`scope = "job"` hits every replica at once (a software bug runs everywhere).

Every number has a provenance line in the [sources] table, like the hardware presets.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from chakra_schema.errors import TraceInputError, read_toml, reject_unknown_keys

PRESET_DIR = Path(__file__).resolve().parent / "presets"
DISTRIBUTIONS = ("exponential", "weibull")
SCOPES = ("node", "job")


@dataclass(frozen=True)
class FailureComponent:
    """One cause of failure: its share of the job's rate and its failure domain."""

    name: str
    rate_per_1000_node_days: float
    scope: str = "node"          # node: `nodes` nodes stop; job: every replica stops
    nodes: int = 1               # failure-domain size in nodes (scope = node)

    def __post_init__(self) -> None:
        if not self.rate_per_1000_node_days >= 0:
            raise TraceInputError(None, f"failure component '{self.name}': rate must be >= 0, "
                                        f"got {self.rate_per_1000_node_days}")
        if self.scope not in SCOPES:
            raise TraceInputError(None, f"failure component '{self.name}': scope must be one of "
                                        f"{', '.join(SCOPES)}, got {self.scope!r}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise TraceInputError(None, f"failure component '{self.name}': nodes must be an integer >= 1, "
                                        f"got {self.nodes!r}")


@dataclass(frozen=True)
class FailureModel:
    name: str
    components: tuple[FailureComponent, ...]
    distribution: str = "exponential"
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    path: str | None = None

    def __post_init__(self) -> None:
        if not self.components:
            raise TraceInputError(self.path, f"failure model '{self.name}' has no components")
        if self.distribution not in DISTRIBUTIONS:
            raise TraceInputError(self.path, f"distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                                             f"got {self.distribution!r}")

    @property
    def rate_per_1000_node_days(self) -> float:
        return sum(c.rate_per_1000_node_days for c in self.components)

    def with_rate(self, rate_per_1000_node_days: float) -> "FailureModel":
        """The same mix of causes scaled to a new total rate."""
        total = self.rate_per_1000_node_days
        if total <= 0:
            comps = tuple(replace(c, rate_per_1000_node_days=rate_per_1000_node_days / len(self.components))
                          for c in self.components)
        else:
            comps = tuple(replace(c, rate_per_1000_node_days=c.rate_per_1000_node_days * rate_per_1000_node_days / total)
                          for c in self.components)
        return replace(self, components=comps)


# ---------------------------------------------------------------------- loading
_TOP_KEYS = {"name", "description", "distribution", "observation", "rate_per_1000_node_days", "components", "sources"}
_OBS_KEYS = {"gpus", "gpus_per_node", "days", "interruptions"}
_COMPONENT_KEYS = {"count", "rate_per_1000_node_days", "scope", "nodes"}


def load_failure_model_file(path: str | os.PathLike) -> FailureModel:
    path = str(path)
    data = read_toml(path, "failure model file")
    try:
        return failure_model_from_dict(data, path)
    except TraceInputError as e:
        raise TraceInputError(path, e.problem) from None


def failure_model_from_dict(data: Mapping[str, Any], path: str | None = None) -> FailureModel:
    """A failure model from its TOML table: components by `count` (shares of the observation's rate)
    or by `rate_per_1000_node_days`."""
    reject_unknown_keys(path, data, _TOP_KEYS)
    comps_in = data.get("components")
    if not isinstance(comps_in, Mapping) or not comps_in:
        raise TraceInputError(path, "a failure model needs a [components] table (one sub-table per cause)")
    total = _total_rate(data, comps_in, path)
    # counts checked before they are summed (a string or a list count was a ValueError / TypeError here)
    counted = sum(_number(c["count"], f"components.{name}.count", path)
                  for name, c in comps_in.items() if isinstance(c, Mapping) and "count" in c)
    comps = []
    for name, c in comps_in.items():
        if not isinstance(c, Mapping):
            raise TraceInputError(path, f"components.{name} must be a table")
        reject_unknown_keys(path, c, _COMPONENT_KEYS, prefix=f"components.{name}.")
        if "rate_per_1000_node_days" in c:
            rate = _number(c["rate_per_1000_node_days"], f"components.{name}.rate_per_1000_node_days", path)
        elif "count" in c:
            count = _number(c["count"], f"components.{name}.count", path)
            rate = total * count / counted if counted > 0 else 0.0
        else:
            raise TraceInputError(path, f"components.{name} needs 'count' or 'rate_per_1000_node_days'")
        comps.append(FailureComponent(str(name), rate, str(c.get("scope", "node")), c.get("nodes", 1)))
    return FailureModel(name=str(data.get("name", Path(path).stem if path else "custom")), components=tuple(comps),
                        distribution=str(data.get("distribution", "exponential")),
                        description=str(data.get("description", "")), sources=dict(data.get("sources", {})),
                        path=path)


def _total_rate(data: Mapping[str, Any], comps: Mapping[str, Any], path: str | None) -> float:
    """The job-level rate: given, or the observation's interruptions over its node-days."""
    if "rate_per_1000_node_days" in data:
        return _number(data["rate_per_1000_node_days"], "rate_per_1000_node_days", path)
    obs = data.get("observation")
    if not isinstance(obs, Mapping):
        if all(isinstance(c, Mapping) and "rate_per_1000_node_days" in c for c in comps.values()):
            return 0.0
        raise TraceInputError(path, "give rate_per_1000_node_days or an [observation] table "
                                    "(gpus, gpus_per_node, days, interruptions)")
    reject_unknown_keys(path, obs, _OBS_KEYS, prefix="observation.")
    vals = {k: _number(obs.get(k), f"observation.{k}", path) for k in _OBS_KEYS}
    if vals["gpus"] <= 0 or vals["gpus_per_node"] <= 0 or vals["days"] <= 0:
        raise TraceInputError(path, "observation gpus, gpus_per_node and days must be > 0")
    nodes = vals["gpus"] / vals["gpus_per_node"]
    return vals["interruptions"] / (nodes * vals["days"]) * 1000.0


def _number(v: Any, key: str, path: str | None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise TraceInputError(path, f"{key} must be a number >= 0, got {v!r}")
    try:
        value = float(v)
    except OverflowError:   # a TOML integer past the float range
        value = math.inf
    if value == math.inf:
        raise TraceInputError(path, f"{key} must be a finite number >= 0, got {v!r}"[:300])
    return value


def list_failure_models() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def get_failure_model(name_or_path: str | os.PathLike) -> FailureModel:
    """A preset by name (see `list_failure_models`) or a TOML file by path."""
    key = str(name_or_path)
    preset = PRESET_DIR / f"{key}.toml"
    if preset.is_file():
        return load_failure_model_file(preset)
    if key.endswith(".toml") or os.sep in key or os.path.exists(key):
        return load_failure_model_file(key)
    raise TraceInputError(None, f"unknown failure model '{key}' (presets: {', '.join(list_failure_models())}; "
                                "or give a TOML path)")
