"""The what-if registry: every estimator is a function `Scenario -> Prediction` registered by name.

    from estimators.registry import evaluate
    from estimators.scenario import Scenario
    p = evaluate(Scenario.build(model="llama3-70b", hardware="h100-sxm", plan={"tp": 8, "dp": 8, ...}))

Adding a what-if is one module plus one decorator:

1. Create `estimators/<name>/whatif.py` with a function that reads what it needs from the scenario
   (`scenario.model`, `.plan`, `.hardware`, `.timing`, `.trace`, or an option section of its own) and
   returns a `estimators.prediction.Prediction` (its own figures in `metrics`, units in their names):

       from estimators.registry import register_whatif

       @register_whatif("my-whatif", needs=("model", "hardware"))
       def my_whatif(scenario: Scenario, progress=None) -> Prediction: ...

   `progress`, when given, is a callback `(done, total)` for long work (the CLI shows a bar).

2. If it has options, declare them as a frozen dataclass with defaults and validation in
   `__post_init__` in a module of its own (`estimators/<name>/options.py`), add the section as a field of
   `Scenario` and to `estimators.scenario.OPTION_SECTIONS` (`failure`, `moe` are), and check it with
   `register_options("my_section", MyOptions)`; dotted overrides such as `--set my_section.rate=3` then work
   with no further code.
3. Add the package name to `_MODULES` below (`estimators.<name>.whatif` is imported on first use, so a
   broken optional what-if cannot break the others).

Each what-if is one package of the same shape: its inputs (options, plans, routing), its model, `evaluate`
(inputs -> figures) and `whatif.py` (the registration that maps a `Scenario` onto `evaluate`).

`evaluate` checks `needs` (one clear line when the scenario lacks an input), times the call, and fills
`scenario_key`/`wall_s`. Sweeps (`lumos_sim.sweep`) and every CLI what-if go through it.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Callable

from chakra_schema.errors import TraceInputError
from estimators.prediction import Prediction
from estimators.scenario import Scenario

WhatIfFn = Callable[..., Prediction]   # (scenario, progress=None) -> Prediction

# packages whose `whatif` module registers a what-if, imported lazily by `_load_all`
_MODULES = ("parallelism", "trace", "failures", "moe")


@dataclass(frozen=True)
class WhatIf:
    name: str
    fn: WhatIfFn
    needs: tuple[str, ...]
    doc: str


_REGISTRY: dict[str, WhatIf] = {}
_OPTION_SECTIONS: dict[str, type] = {}
_loaded = False


def register_whatif(name: str, needs: tuple[str, ...] = ()) -> Callable[[WhatIfFn], WhatIfFn]:
    """Register `fn` as the what-if `name`. `needs`: scenario fields that must be set (e.g. "model")."""
    def deco(fn: WhatIfFn) -> WhatIfFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"what-if '{name}' is registered twice")
        _REGISTRY[name] = WhatIf(name, fn, tuple(needs), (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        return fn
    return deco


def register_options(section: str, cls: type) -> type:
    """Check that a what-if's options dataclass is the one `Scenario` declares for its section
    (`estimators.scenario.OPTION_SECTIONS`, beside the `Scenario.<section>` field)."""
    from estimators.scenario import OPTION_SECTIONS
    if section not in Scenario.__dataclass_fields__ or OPTION_SECTIONS.get(section) is not cls:
        raise ValueError(f"Scenario declares no option section '{section}' of type {cls.__name__}")
    _OPTION_SECTIONS[section] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in _MODULES:
        try:
            importlib.import_module(f"estimators.{mod}.whatif")
        except ModuleNotFoundError as e:  # a what-if not written yet must not break the others
            if e.name not in (f"estimators.{mod}", f"estimators.{mod}.whatif"):
                raise


def option_sections() -> dict[str, type]:
    _load_all()
    return dict(_OPTION_SECTIONS)


def whatifs() -> dict[str, WhatIf]:
    _load_all()
    return dict(_REGISTRY)


def get_whatif(name: str) -> WhatIf:
    _load_all()
    if name not in _REGISTRY:
        raise TraceInputError(None, f"unknown what-if '{name}' (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name]


def evaluate(scenario: Scenario, progress: Callable[[int, int], None] | None = None) -> Prediction:
    """Dispatch `scenario` to its what-if and return the prediction."""
    w = get_whatif(scenario.whatif)
    for need in w.needs:
        if getattr(scenario, need) is None:
            raise TraceInputError(None, f"what-if '{w.name}' needs '{need}' in the scenario")
    t0 = time.perf_counter()
    p = w.fn(scenario, progress=progress)
    p.whatif = w.name
    p.scenario_key = scenario.key()
    p.wall_s = time.perf_counter() - t0
    return p


__all__ = ["WhatIf", "evaluate", "get_whatif", "option_sections", "register_options", "register_whatif", "whatifs"]
