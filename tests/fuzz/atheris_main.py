"""The one entry point of every atheris target here: instrument the modules under test, then fuzz."""
from __future__ import annotations

import importlib
from typing import Callable, Sequence


def run_atheris(argv: list[str], fuzz_one: Callable[[bytes], None], modules: Sequence[str]) -> None:
    import atheris
    with atheris.instrument_imports():
        for name in modules:   # imported under instrumentation so coverage guides the fuzzer through them
            importlib.import_module(name)
    atheris.Setup(argv, fuzz_one)
    atheris.Fuzz()
