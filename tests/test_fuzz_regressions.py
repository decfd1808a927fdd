"""Inputs the fuzzers once broke a reader or loader with, kept in tests/fuzz/crashes/ (first byte picks the
reader, as in the target): `routing-*` belong to tests/fuzz/routing_target.py, `spec-*` to
specs_target.py, `config-*` to configs_target.py, the others to readers_target.py. Each must now end in a result or a one-line
TraceInputError."""
from __future__ import annotations

import importlib
import sys

import pytest

from conftest import ROOT

CRASHES = sorted((ROOT / "tests" / "fuzz" / "crashes").iterdir())
TARGET_MODULES = {"routing-": "routing_target", "spec-": "specs_target", "config-": "configs_target"}


def _target(name: str):
    module = next((m for prefix, m in TARGET_MODULES.items() if name.startswith(prefix)), "readers_target")
    sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.pop(0)


@pytest.mark.parametrize("crash", CRASHES, ids=[p.name for p in CRASHES])
def test_an_input_that_once_crashed_a_reader_now_reads_or_fails_cleanly(crash):
    _target(crash.name).fuzz_one(crash.read_bytes())
