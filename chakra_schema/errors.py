"""One error type for bad input files, so the CLI can print one line and exit 2."""
from __future__ import annotations

import difflib
import os
from typing import Iterable


class TraceInputError(ValueError):
    """A file could not be used: `path` names it, `problem` says why, in one line."""

    def __init__(self, path: str | os.PathLike | None, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = " ".join(str(problem).split())  # always one line
        super().__init__(f"{self.path}: {self.problem}" if self.path else self.problem)


def reject_unknown_keys(path: str | os.PathLike | None, keys: Iterable[str], allowed: Iterable[str],
                        what: str = "key", prefix: str = "", where: str = "") -> None:
    """Raise a one-line TraceInputError for the first of `keys` not in `allowed`:
    "unknown {what} '{prefix}{key}'{where}", with the closest allowed name as a hint, so a typo in a
    user's TOML file names itself and its likely fix."""
    allowed = set(allowed)
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise TraceInputError(path, f"unknown {what} '{prefix}{key}'{where}{hint}")


def read_toml(path: str | os.PathLike, what: str = "file") -> dict:
    """A TOML file as a dict; a missing or malformed file is a one-line TraceInputError naming it."""
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise TraceInputError(path, f"{what} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, IsADirectoryError) as e:
        raise TraceInputError(path, f"not a valid TOML file: {e}") from None
