"""The one entry point of every atheris target here: instrument the modules under test, then fuzz."""
from __future__ import annotations

import importlib
import os
from typing import Callable, Sequence


def run_atheris(argv: list[str], fuzz_one: Callable[[bytes], None], modules: Sequence[str]) -> None:
    import atheris
    with atheris.instrument_imports():
        for name in modules:   # imported under instrumentation so coverage guides the fuzzer through them
            importlib.import_module(name)
    atheris.Setup(argv, fuzz_one)
    atheris.Fuzz()


def load_as_file(data: bytes, loaders: Sequence[tuple[Callable[[str], None], str]], directory: str) -> None:
    """One fuzz input for file loaders: its first byte picks a (loader, file name), the rest is the file.
    The loader must load it or end in a one-line `TraceInputError`."""
    from chakra_schema.errors import TraceInputError
    if not data:
        return
    loader, name = loaders[data[0] % len(loaders)]
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data[1:])
    try:
        loader(path)
    except TraceInputError:
        pass
