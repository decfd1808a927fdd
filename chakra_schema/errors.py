"""One error type for bad input files, so the CLI can print one line and exit 2."""
from __future__ import annotations

import difflib
import os
import re
from typing import Iterable


class TraceInputError(ValueError):
    """A file could not be used: `path` names it, `problem` says why, in one line."""

    def __init__(self, path: str | os.PathLike | None, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = " ".join(str(problem).split())  # always one line
        super().__init__(f"{self.path}: {self.problem}" if self.path else self.problem)


def within(path: str | os.PathLike | None, e: TraceInputError, where: str = "") -> TraceInputError:
    """`e`, raised reading a file that `path` (a spec, a scenario) names, as an error of `path` that still
    names that file ('spec.toml: point 'a': l8b.json: config.json not found')."""
    inner = f"{e.path}: " if e.path and e.path != (str(path) if path is not None else None) else ""
    return TraceInputError(path, f"{where}{inner}{e.problem}")


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


# A configuration file (model, preset, suite, scenario, ...) is text a person writes or `calibrate` generates:
# the largest shipped, a calibrated preset, is 120 KB. Read at most this much, so `--hardware /dev/zero` or a
# trace given by mistake is a one-line error, not a MemoryError.
MAX_CONFIG_BYTES = 64 << 20


def read_config_bytes(f, path: str | os.PathLike, what: str) -> bytes:
    """The content of the open file `f`, refused past MAX_CONFIG_BYTES."""
    data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise TraceInputError(path, f"is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a {what}")
    return data


def read_toml(path: str | os.PathLike, what: str = "file") -> dict:
    """A TOML file as a dict; a missing, oversized or malformed file is a one-line TraceInputError naming it."""
    try:
        with open(path, "rb") as f:
            return loads_toml(read_config_bytes(f, path, what).decode("utf-8"), path)
    except FileNotFoundError:
        raise TraceInputError(path, f"{what} not found") from None
    except IsADirectoryError:
        raise TraceInputError(path, f"is a directory, not a {what}") from None
    except UnicodeDecodeError as e:
        raise TraceInputError(path, f"not a valid TOML file: {e}") from None
    except OSError as e:
        raise TraceInputError(path, f"cannot read: {e.strerror or e}") from None


def loads_toml(text: str, path: str | os.PathLike | None = None) -> dict:
    """TOML text as a dict; malformed or absurdly nested text (tomllib recurses once per level, so a
    few thousand brackets raise RecursionError) is a one-line TraceInputError naming `path`."""
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        json_like = re.match(r"\s*(\{|\[\s*[{\"])", text) is not None     # a JSON object / array where TOML goes
        raise TraceInputError(path, f"not a valid TOML file: {e}"
                                    + (" (this file looks like JSON; the format is TOML)" if json_like else "")) from None
    except RecursionError:
        raise TraceInputError(path, "not a valid TOML file: nested too deeply") from None
    except ValueError as e:  # an integer past Python's int-parsing digit limit (4300 digits) is not a TOMLDecodeError
        raise TraceInputError(path, f"not a valid TOML file: {e}") from None


def printable(text: str) -> str:
    """`text` without control characters (terminal escapes, newlines): a name read from an input file,
    fit for a one-line message or a table title."""
    return "".join(c for c in text if c.isprintable())


def brief(value: object, limit: int = 40) -> str:
    """`value` for a one-line message: a number with thousands separators ('a 401-digit number' past 10**24,
    so a typo of 400 digits is described, not printed), a string cut at `limit` characters with its length,
    anything else as its repr."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < float("inf"):
        return f"{value:,}" if abs(value) < 10 ** 24 else f"a {len(str(int(abs(value))))}-digit number"
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value):,} characters)"
    return repr(value)


def check_number(what: str, value: object, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, integer: bool = False) -> None:
    """Raise a one-line TraceInputError "{what} must be ..., got {value}" unless `value` is a finite
    number (an int when `integer`) in [low, high] ((low, high] when `low_open`). Used by the config
    dataclasses' `__post_init__`, so values set in code are checked like values read from a file."""
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok_type or isinstance(value, bool):
        raise TraceInputError(None, f"{what} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceInputError(None, f"{what} must be a finite number, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        rule = f"> {low:g}" if low_open else f">= {low:g}"
        if high is not None:
            rule = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise TraceInputError(None, f"{what} must be {rule}, got {value}")
    if high is not None and value > high:
        rule = f"<= {high:g}" if low is None else f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise TraceInputError(None, f"{what} must be {rule}, got {value}")


def check_choice(what: str, value: object, choices) -> None:
    """Raise a one-line TraceInputError "{what} must be one of a, b, c, got 'x'" unless `value` is one of
    `choices`."""
    if value not in choices:
        raise TraceInputError(None, f"{what} must be one of {', '.join(map(str, choices))}, got {value!r}")


def with_path(error: TraceInputError, path: str | os.PathLike | None) -> TraceInputError:
    """`error` naming `path` when it names no file yet (a dataclass check raised while loading `path`)."""
    if error.path is not None or path is None:
        return error
    return TraceInputError(path, error.problem)
