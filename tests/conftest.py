"""Shared fixtures. Real traces live in ../shared beside the project root: tests that need them skip
with a reason when it is absent, unless LUMOS_SIM_REQUIRE_SHARED=1 (CI), where they fail instead."""
from __future__ import annotations

import os
import tarfile
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


@pytest.fixture(scope="session")
def chakra_et(tmp_path_factory) -> Path:
    """The Chakra converter's sample output (3,664 nodes), extracted from its archive in shared/."""
    archive = require_shared("traces", "chakra", "feeder_tests_trace.tar.gz")
    out = tmp_path_factory.mktemp("chakra")
    with tarfile.open(archive) as tar:
        member = tar.getmember("tests/data/chakra.0.et")
        member.name = "chakra.0.et"
        tar.extract(member, out, filter="data")
    return out / "chakra.0.et"
