"""The results file of a sweep: one table (parquet or CSV), always complete, written atomically, and
read back as the cache of finished points."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from chakra_schema.errors import TraceInputError

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


def _integer_columns(rows: list[dict[str, Any]], columns) -> list[str]:
    """Columns whose first present value is an integer (not a bool)."""
    out = []
    for col in columns:
        for r in rows:
            v = r.get(col)
            if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
                continue
            if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
                out.append(col)
            break
    return out


def _arrow_safe(df):
    """Columns mixing strings with other values (e.g. a field that is a number in one preset and a name
    in another) as strings, so parquet can store them."""
    for col in df.columns[df.dtypes == object]:
        kinds = {type(v) for v in df[col] if v is not None and not (isinstance(v, float) and math.isnan(v))}
        if len(kinds) > 1 and str in kinds:
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
        self.path = path
        self.csv_path = path.with_suffix(".csv") if csv and path.suffix.lower() != ".csv" else None
        self.flush_every_s = flush_every_s
        self._last_write = 0.0
        self._write_cost = 0.0

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
        self._write_cost = self._last_write - t0


def _atomic_write(df, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.suffix.lower() == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
