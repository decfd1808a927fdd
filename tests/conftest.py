"""Shared fixtures. Real traces live in ../shared beside the project root: tests that need them skip
with a reason when it is absent, unless LUMOS_SIM_REQUIRE_SHARED=1 (CI), where they fail instead."""
from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


# Variables of the user's shell that change what the commands print: rich writes ANSI colour codes into
# captured output under any of the *_FORCE / TTY_* ones, and lumos_sim.tables.output_width takes its width
# from COLUMNS. Tests run as piped output at 80 columns, as CI does.
_OUTPUT_ENV_UNSET = ("FORCE_COLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


@pytest.fixture(autouse=True)
def _pinned_output_env(monkeypatch):
    """Every test (and every subprocess it starts, which inherits os.environ) sees COLUMNS=80 and none of
    the variables that force colour or a terminal. A test that sets COLUMNS itself (monkeypatch.setenv)
    overrides this; the original values come back after the test."""
    monkeypatch.setenv("COLUMNS", "80")
    for name in _OUTPUT_ENV_UNSET:
        monkeypatch.delenv(name, raising=False)


_USER_HOME: list[tuple[str | None, str]] = []   # (the variable as it was, the folder made for the session)


def pytest_configure(config):
    """No test sees the user's own hardware presets (`lumos-sim calibrate --install NAME` puts them in
    $LUMOS_SIM_HOME/hardware, else ~/.config/lumos-sim/hardware, and `--hardware NAME` / `list hardware`
    find them): for the whole session LUMOS_SIM_HOME is an empty folder of its own, for every test and
    every subprocess. Set here rather than in a session fixture so that collection (module-level
    `get_hardware(...)`, parametrize lists) is isolated too. A test that installs presets sets its own
    LUMOS_SIM_HOME (monkeypatch.setenv) on top of this."""
    home = tempfile.mkdtemp(prefix="lumos-sim-home-")
    _USER_HOME.append((os.environ.get("LUMOS_SIM_HOME"), home))
    os.environ["LUMOS_SIM_HOME"] = home


def pytest_unconfigure(config):
    if not _USER_HOME:
        return
    saved, home = _USER_HOME.pop()
    if saved is None:
        os.environ.pop("LUMOS_SIM_HOME", None)
    else:
        os.environ["LUMOS_SIM_HOME"] = saved
    shutil.rmtree(home, ignore_errors=True)


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
