"""The results file of a sweep: one table (parquet or CSV), always complete, written atomically, and
read back as the cache of finished points. One sweep at a time writes it: `ResultsFile.lock()` takes an
advisory lock (`flock`) on `<results>.lock` beside it, and a second sweep on the same file is refused
with a one-line error (both would rewrite the whole table, and the last one's rows would win)."""
from __future__ import annotations

import errno
import fcntl
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from chakra_schema.errors import TraceInputError
from chakra_schema.safe_io import atomic_output

FORMATS = (".parquet", ".csv")
_META = ("point", "status", "error")


def rows_frame(rows: list[dict[str, Any]]):
    """Rows as a DataFrame: point/status/error first, then columns in order of first appearance."""
    columns: dict[str, None] = dict.fromkeys(_META)
    for r in rows:
        columns.update(dict.fromkeys(r))
    df = pd.DataFrame.from_records(rows, columns=list(columns))
    for col in df.columns:
        if df[col].dtype == object or df[col].isna().all():  # missing is None (an all-missing column too),
            df[col] = df[col].astype(object).where(df[col].notna(), None)  # as parquet reads it back
    for col in _integer_columns(rows, df.columns):
        # nullable integers: a pending row must not turn a GPU count into a float (64.0), and the column
        # must read back from parquet as it was written, so a resumed table equals an uninterrupted one
        df[col] = df[col].astype("Int64")
    return df


def _past_int64(v: Any) -> bool:
    """A Python integer no int64 column holds (a swept value such as 10**400 is valid TOML)."""
    return isinstance(v, int) and not -(1 << 63) <= v < (1 << 63)


def _integer_columns(rows: list[dict[str, Any]], columns) -> list[str]:
    """Columns whose first present value is an integer (not a bool), every value within int64 (a larger
    one is kept as text by `_arrow_safe`: the cast raised OverflowError and the sweep lost its table)."""
    out = []
    for col in columns:
        for r in rows:
            v = r.get(col)
            if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
                continue
            if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
                if not any(_past_int64(r.get(col)) for r in rows):
                    out.append(col)
            break
    return out


def _arrow_safe(df):
    """Columns mixing strings with other values (e.g. a field that is a number in one preset and a name
    in another) as strings, so parquet can store them."""
    for col in df.columns[df.dtypes == object]:
        kinds = {type(v) for v in df[col] if v is not None and not (isinstance(v, float) and math.isnan(v))}
        if (len(kinds) > 1 and str in kinds) or any(_past_int64(v) for v in df[col]):
            df[col] = [None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in df[col]]
    return df


def read_results(path: str | os.PathLike):
    """A results table written by `lumos-sim sweep` (parquet or CSV); one-line error otherwise."""
    p = Path(path)
    if not p.is_file():
        raise TraceInputError(p, "results file not found")
    try:
        df = pd.read_csv(p) if p.suffix.lower() == ".csv" else pd.read_parquet(p)
    except Exception as e:  # noqa: BLE001 -- pyarrow raises many types for a foreign file
        raise TraceInputError(p, f"not a readable sweep results file ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    missing = [c for c in _META if c not in df.columns]
    if missing:
        raise TraceInputError(p, f"not a sweep results file: no column(s) {', '.join(missing)}")
    return df


class ResultsFile:
    """`path` (.parquet or .csv), plus a CSV copy beside a parquet file when `csv`. `write` replaces the
    file atomically (temp file + rename), so a reader or a kill never sees half a table."""

    def __init__(self, path: Path, csv: bool = False, flush_every_s: float = 5.0):
        if path.suffix.lower() not in FORMATS:
            raise TraceInputError(path, f"results file must end in {' or '.join(FORMATS)}")
        if not path.parent.is_dir():
            raise TraceInputError(path, f"output folder {path.parent} does not exist")
        if path.is_dir():
            raise TraceInputError(path, "is a directory; give a results file name")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise TraceInputError(path, f"cannot write: folder {path.parent} is not writable")
        self.path = path
        self.csv_path = path.with_suffix(".csv") if csv and path.suffix.lower() != ".csv" else None
        self.flush_every_s = flush_every_s
        self._last_write = 0.0
        self._write_cost = 0.0
        self._writes = 0

    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @contextmanager
    def lock(self):
        """Hold the advisory lock of this results file (and of its CSV copy) while the block runs."""
        with _flock(self.lock_path(), self.path):
            if self.csv_path is None:
                yield self
                return
            with _flock(self.csv_path.with_name(self.csv_path.name + ".lock"), self.csv_path):
                yield self

    def load_cached(self) -> dict[str, dict[str, Any]]:
        """Finished rows (status ok or error) of an earlier run, by scenario key."""
        if not self.path.exists():
            return {}
        df = read_results(self.path)
        if "scenario_key" not in df.columns:
            return {}
        done = df[df["status"].isin(("ok", "error"))]
        out: dict[str, dict[str, Any]] = {}
        for row in done.to_dict("records"):
            row.pop("point", None)
            if isinstance(row.get("error"), float):  # an empty CSV cell reads back as NaN
                row["error"] = ""
            out[str(row["scenario_key"])] = row
        return out

    def maybe_write(self, rows: list[dict[str, Any]]) -> None:
        """Write when the last write is `flush_every_s` old (and at least 5x the time a write takes, so a
        big sweep does not spend its time rewriting the file)."""
        if time.monotonic() - self._last_write >= max(self.flush_every_s, 5 * self._write_cost):
            self.write(rows)

    def write(self, rows: list[dict[str, Any]]) -> None:
        t0 = time.monotonic()
        df = _arrow_safe(rows_frame(rows))
        _atomic_write(df, self.path)
        if self.csv_path is not None:
            _atomic_write(df, self.csv_path)
        self._last_write = time.monotonic()
        # the first write also imports pyarrow (a second or more on a loaded machine): counting it would
        # space the next writes 5x that apart, so only later writes set the cost
        self._write_cost = self._last_write - t0 if self._writes else 0.0
        self._writes += 1


def _atomic_write(df, path: Path) -> None:
    """The table replaces `path` atomically (`chakra_schema.safe_io.atomic_output`: a private temp name in
    the same folder, the user's umask, one-line errors)."""
    if path.suffix.lower() == ".csv":
        with atomic_output(path, "w") as f:
            df.to_csv(f, index=False)
    else:
        with atomic_output(path) as f:
            df.to_parquet(f, index=False)


@contextmanager
def _flock(lock: Path, results: Path):
    """An exclusive, non-blocking flock on `lock`, removed when released. The file is re-checked after
    locking: another sweep may have removed it between our open and our lock (then we lock the new one)."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise TraceInputError(results, f"cannot create the lock file {lock}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise TraceInputError(results, f"another sweep is writing this results file (it holds {lock.name}); "
                                               "wait for it to finish, or write to another file") from None
            raise TraceInputError(results, f"cannot lock {lock}: {e.strerror or e}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)
