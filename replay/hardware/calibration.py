"""`lumos-sim calibrate`: fit the kernel class models on a user's traces and write a preset that extends
the base preset with them, with provenance (trace names, kernel counts, fit and cross-validated error)."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from chakra_schema.errors import TraceInputError

from .config import HardwareConfig, KernelClassModel, get_hardware
from .kernel_models import (ClassAccuracy, KernelSamples, cross_validate, fit_class_models, folds_by_step,
                            folds_by_trace, kernel_samples, key_class, sustained_tensor_fraction)

if TYPE_CHECKING:  # pragma: no cover
    from chakra_schema.graph import ExecutionGraph


@dataclass
class CalibrationResult:
    base: HardwareConfig
    samples: KernelSamples
    models: dict[str, KernelClassModel]
    by_trace: list[ClassAccuracy]      # empty with a single trace
    by_step: list[ClassAccuracy]       # empty without two ProfilerSteps in some trace
    sustained_tensor_fraction: float | None = None   # measured on the traces' large tensor-core GEMMs

    def to_json(self) -> dict:
        return {"base": self.base.name, "traces": self.samples.trace_names, "kernels": len(self.samples),
                "sustained_tensor_fraction": self.sustained_tensor_fraction,
                "models": {k: dict(m.__dict__) for k, m in self.models.items()},
                "cross_validation": {"by_trace": [r.to_json() for r in self.by_trace],
                                     "by_step": [r.to_json() for r in self.by_step]}}


def calibrate_traces(graphs: Sequence[tuple[str, "ExecutionGraph"]], base: HardwareConfig | str) -> CalibrationResult:
    """The whole calibration of (label, graph) pairs: measure the sustained tensor fraction on the large
    tensor-core GEMMs, put it into the base, then fit the kernel models on that roofline."""
    base = get_hardware(base)
    samples = KernelSamples.concat([kernel_samples(g, base, label) for label, g in graphs])
    measured = sustained_tensor_fraction(samples)
    if measured is not None and abs(measured - base.compute.sustained_tensor_fraction) > 1e-3:
        base = dataclasses.replace(base, compute=dataclasses.replace(base.compute,
                                                                     sustained_tensor_fraction=round(measured, 3)))
        samples = KernelSamples.concat([kernel_samples(g, base, label) for label, g in graphs])
    result = calibrate(samples, base)
    result.sustained_tensor_fraction = round(measured, 3) if measured is not None else None
    return result


def calibrate(samples: KernelSamples, base: HardwareConfig | str) -> CalibrationResult:
    """Fit on all samples; cross-validate by trace and by step."""
    base = get_hardware(base)
    if len(samples) == 0:
        raise TraceInputError(None, "no GPU kernels of at least 1 us in the traces: nothing to calibrate on")
    models = fit_class_models(samples)
    if not models:
        raise TraceInputError(None, f"too few kernels per class to fit ({len(samples)} kernels in all)")
    return CalibrationResult(base, samples, models, cross_validate(samples, folds_by_trace(samples)),
                             cross_validate(samples, folds_by_step(samples)))


def _toml_value(v) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v)) if np.isfinite(v) else "0.0"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(type(v))  # pragma: no cover


def preset_toml(result: CalibrationResult, name: str, tool: str) -> str:
    """The calibrated preset: `extends` the base, one [kernel_models."key"] table per fitted model."""
    base = result.base
    base_name = Path(base.path).stem if base.path else base.name
    if base.kernel_models and base.calibration is not None and base.calibration.base:
        # calibrating on top of a calibrated preset (h100-sxm): extend its roofline, so that the new fit
        # replaces the old one instead of merging with its per-family models
        base_name = base.calibration.base
    lines = [f"# Written by {tool}: kernel models fitted on {len(result.samples)} kernels of "
             f"{len(result.samples.trace_names)} trace(s). Re-run `lumos-sim calibrate` to refresh.",
             f"name = {_toml_value(name)}", f"extends = {_toml_value(base_name)}",
             f"description = {_toml_value(f'{base.description} -- calibrated on user traces')}", "",
             "[calibration]", f"base = {_toml_value(base_name)}",
             f"traces = {_toml_value(list(result.samples.trace_names))}",
             f"kernels = {len(result.samples)}", f"tool = {_toml_value(tool)}", ""]
    if result.sustained_tensor_fraction is not None:
        lines += ["[compute]", f"sustained_tensor_fraction = {_toml_value(result.sustained_tensor_fraction)}", ""]
    for key, m in sorted(result.models.items()):
        lines += [f"[kernel_models.{_toml_value(key)}]", f"overhead_us = {_toml_value(m.overhead_us)}",
                  f"efficiency = {_toml_value(m.efficiency)}", f"geometry = {_toml_value(list(m.geometry))}",
                  f"kernels = {m.kernels}", f"fit_gmae = {_toml_value(m.fit_gmae)}"]
        lines += ["shaped_by_geometry = true"] if m.shaped_by_geometry else []
        lines += ["times_shaped = false", ""] if not m.times_shaped else [""]
    cv = {r.kernel_class: r for r in (result.by_trace or result.by_step)}
    fold = "by trace" if result.by_trace else "by step"
    lines.append("[sources]")
    if result.sustained_tensor_fraction is not None:
        n = int(np.isfinite(result.samples.tensor_fraction).sum())
        lines.append(f"{_toml_value('compute.sustained_tensor_fraction')} = "
                     f"{_toml_value(f'measured by lumos-sim calibrate: 99th percentile of the achieved fraction of dense tensor peak over {n} compute-bound tensor-core GEMMs of >= 1 GFLOP in ' + ', '.join(result.samples.trace_names))}")
    for key, m in sorted(result.models.items()):
        cls = key_class(key)
        held = cv.get(cls)
        cv_txt = (f"; cross-validated ({fold}) class GMAE {100 * held.after_gmae:.1f}%"
                  if held is not None and np.isfinite(held.after_gmae) else "")
        lines.append(f"{_toml_value('kernel_models.' + key)} = "
                     f"{_toml_value(f'fitted by lumos-sim calibrate on {m.kernels} kernels of ' + ', '.join(result.samples.trace_names) + f'; fit GMAE {100 * m.fit_gmae:.1f}%' + cv_txt)}")
    return "\n".join(lines) + "\n"


def write_preset(result: CalibrationResult, out: str | os.PathLike, name: str | None = None,
                 tool: str = "lumos-sim calibrate") -> Path:
    """Write the calibrated preset atomically (temp file + rename) and check that it loads."""
    out = Path(out)
    tool = f"{tool}, {datetime.date.today().isoformat()}"
    text = preset_toml(result, name or out.stem, tool)
    from chakra_schema.safe_io import atomic_output

    from .config import load_hardware_file
    # never leave a preset behind that does not load; the file gets the user's umask, not mkstemp's 0600
    with atomic_output(out, "w", check=load_hardware_file) as fh:
        fh.write(text)
    return out
