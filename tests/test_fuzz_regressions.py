"""Inputs the fuzzers once broke a reader with, kept in tests/fuzz/crashes/ (first byte picks the reader,
as in tests/fuzz/readers_target.py): each must now end in a result or a one-line TraceInputError."""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT

CRASHES = sorted((ROOT / "tests" / "fuzz" / "crashes").iterdir())


@pytest.mark.parametrize("crash", CRASHES, ids=[p.name for p in CRASHES])
def test_an_input_that_once_crashed_a_reader_now_reads_or_fails_cleanly(crash):
    sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
    try:
        from readers_target import fuzz_one
    finally:
        sys.path.pop(0)
    fuzz_one(crash.read_bytes())
