"""Shared fixtures. Real traces live in ../shared beside the project root: tests that need them skip
with a reason when it is absent, unless LUMOS_SIM_REQUIRE_SHARED=1 (CI), where they fail instead."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def _shared_dir() -> Path:
    env = os.environ.get("LUMOS_SIM_SHARED")
    return Path(env) if env else ROOT.parent / "shared"


SHARED = _shared_dir()


def require_shared(*parts: str) -> Path:
    """Path under ../shared; skip (or fail under LUMOS_SIM_REQUIRE_SHARED=1) when it is missing."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        msg = f"shared data not found: {path} (set LUMOS_SIM_SHARED or place shared/ beside the project)"
        if os.environ.get("LUMOS_SIM_REQUIRE_SHARED") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture
def shared_traces() -> Path:
    return require_shared("traces")


@pytest.fixture
def shared_reference() -> Path:
    return require_shared("reference")
