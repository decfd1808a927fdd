"""`Prediction`: what every what-if returns for a `Scenario`.

Common figures have fixed names and units in their names (seconds `_s`, microseconds `_us`, bytes,
GiB); a what-if's own figures go in `metrics` (flat scalars, units in the names, e.g. `ettr`,
`a2a_bytes_inter_node`), so a sweep row is the scenario's input fields plus `to_row()`.
`detail` keeps the what-if's native result (a `PlanPrediction`, a `TraceWhatIf`, a `ReplayResult`...)
for the CLI's detailed tables; it is not part of the row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replay.results import Breakdown


@dataclass
class Prediction:
    whatif: str
    scenario_key: str
    step_time_s: float                                 # predicted time of one training step (or what-if unit)
    breakdown: Breakdown = field(default_factory=Breakdown)  # of one step, microseconds
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None                # model FLOPs (no recomputation) per GPU per second / 1e12
    hw_tflops_per_gpu: float | None = None             # FLOPs actually executed, recomputation included
    mfu: float | None = None
    memory_gib_per_gpu: float | None = None
    oom: bool | None = None
    gpus: int | None = None
    baseline_step_time_s: float | None = None          # the unchanged case, where the what-if has one
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    detail: Any = None

    @property
    def speedup(self) -> float | None:
        if self.baseline_step_time_s is None or self.step_time_s <= 0:
            return None
        return self.baseline_step_time_s / self.step_time_s

    def to_row(self) -> dict[str, Any]:
        """Flat prediction columns (scalars only), for sweep tables."""
        row: dict[str, Any] = {
            "whatif": self.whatif, "scenario_key": self.scenario_key, "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu,
            "hw_tflops_per_gpu": self.hw_tflops_per_gpu, "mfu": self.mfu,
            "memory_gib_per_gpu": self.memory_gib_per_gpu, "oom": self.oom, "gpus_used": self.gpus,
            "baseline_step_time_s": self.baseline_step_time_s, "speedup": self.speedup,
        }
        row.update({f"breakdown.{k}": v for k, v in self.breakdown.to_json().items()})
        row.update({f"metrics.{k}": v for k, v in self.metrics.items() if _scalar(v)})
        row["notes"] = "; ".join(self.notes)
        row["wall_s"] = self.wall_s
        return row

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.to_row().items() if not k.startswith(("breakdown.", "metrics."))}
        d["breakdown"] = self.breakdown.to_json()
        d["metrics"] = dict(self.metrics)
        d["notes"] = list(self.notes)
        return d


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))
