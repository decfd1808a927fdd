"""Routing traces in one columnar form, read in bounded memory.

A routing trace says, for each routed token and each MoE layer, which `top_k` experts the router chose
(and optionally the gate scores), plus per-token metadata: the request's domain (code, math, chat...)
and phase (prefill or decode). Every loader yields a `RoutingSource`: small per-token metadata held in
memory, and the expert ids read in chunks of tokens (`chunks(start, stop)` -> int arrays
[n, layers, top_k]), so a 1M-token x 58-layer trace never has to be in memory at once.

Formats:
- `.npy` (vLLM `--enable-return-routed-experts`): int array [tokens, moe_layers, top_k], read in chunks.
- directory of `layer_*.parquet` (and `lumos-sim collect --routing`): one file per MoE layer with
  list columns `indices` (top-k ids) and `scores` (gate probabilities), rows aligned across layers;
  optional `domain` (string) and `phase` columns in the first file. Read by row groups.
- `.jsonl` Megatron-core `--moe-routing-trace-path`: `{step, layer, rank, num_tokens, topk,
  top_indices}`; tokens are the (step, rank) blocks in order, layers the sorted distinct layer ids.
- `.jsonl` token records: `{layer, token_idx, experts: [...], gating_probs: [...], domain?}`.
JSON lines (plain or `.gz`) are parsed whole (they are the small, human-readable form), through the
bounded reader of `chakra_schema.safe_io` (`iter_lines`: size limit, line-length limit).
Every reader refuses expert ids that are not integers in [0, 2^31) with the file, layer and row, so no
id is silently cast (4294967299 -> 3, 3.9 -> 3, "7" -> 7).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from chakra_schema.errors import TraceInputError

PHASES = ("prefill", "decode")
CHUNK_TOKENS = 65536
MAX_EXPERT_ID = np.iinfo(np.int32).max   # ids are held as int32: a larger one would wrap, not fail


class RoutingSource(Protocol):
    """Columnar routing: `tokens` x `layers` x `top_k` expert ids, read in chunks."""

    path: str
    tokens: int
    layers: int
    top_k: int
    domain: np.ndarray | None         # [tokens] int16 codes into domain_names, or None
    domain_names: tuple[str, ...]
    phase: np.ndarray | None          # [tokens] uint8 (0 prefill, 1 decode), or None

    def chunks(self, start: int = 0, stop: int | None = None,
               size: int = CHUNK_TOKENS) -> Iterator[tuple[int, np.ndarray]]:
        """(first token, expert ids [n, layers, top_k]) for tokens [start, stop)."""


@dataclass
class ArraySource:
    """A routing trace held as (or memory-mapped from) one array [tokens, layers, top_k]."""

    experts: np.ndarray
    path: str = "<memory>"
    scores: np.ndarray | None = None
    domain: np.ndarray | None = None
    domain_names: tuple[str, ...] = ()
    phase: np.ndarray | None = None
    tokens: int = field(init=False)
    layers: int = field(init=False)
    top_k: int = field(init=False)

    def __post_init__(self) -> None:
        if self.experts.ndim != 3:
            raise TraceInputError(self.path, f"routing array must be [tokens, layers, top_k], got shape "
                                             f"{tuple(self.experts.shape)}")
        if not np.issubdtype(self.experts.dtype, np.integer):
            raise TraceInputError(self.path, f"expert ids must be integers, got {self.experts.dtype}")
        self.tokens, self.layers, self.top_k = (int(x) for x in self.experts.shape)
        _check_meta(self)

    def chunks(self, start: int = 0, stop: int | None = None, size: int = CHUNK_TOKENS):
        stop = self.tokens if stop is None else stop
        for a in range(start, stop, size):
            yield a, np.asarray(self.experts[a:min(a + size, stop)])


def _check_meta(src) -> None:
    for name in ("domain", "phase"):
        v = getattr(src, name)
        if v is not None and len(v) != src.tokens:
            raise TraceInputError(src.path, f"{name} has {len(v)} entries for {src.tokens} tokens")


# ------------------------------------------------------------------------------------------ loading
def load_routing(path: str | Path) -> RoutingSource:
    """The routing trace at `path` (format from its suffix / contents), ready to stream."""
    p = Path(path)
    if p.is_dir():
        return ParquetSource(p)
    if not p.is_file():
        raise TraceInputError(p, "no such routing trace file or directory")
    suffix = "".join(p.suffixes[-2:]) if p.suffix == ".gz" else p.suffix
    if suffix == ".npy":
        return load_npy(p)
    if suffix == ".parquet":
        return ParquetSource(p.parent, files=[p])
    if suffix in (".jsonl", ".json", ".jsonl.gz", ".json.gz"):
        return load_jsonl(p)
    raise TraceInputError(p, f"unknown routing trace format '{suffix}' (expected .npy, .parquet, a "
                             f"directory of layer_*.parquet, or .jsonl)")


class NpySource:
    """A .npy routing array [tokens, layers, top_k] read chunk by chunk with plain file reads (not a
    memory map: mapped pages would stay resident, so memory would grow with the trace)."""

    def __init__(self, path: Path):
        self.path = str(path)
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
                self._offset = f.tell()
                size = os.fstat(f.fileno()).st_size
        except Exception as e:  # noqa: BLE001 -- numpy's header parser raises ValueError, SyntaxError, ...
            raise TraceInputError(path, f"not a readable .npy array: {' '.join(str(e).split())[:200]}") from None
        if len(shape) != 3:
            raise TraceInputError(path, f"routing array must be [tokens, layers, top_k], got shape {shape}")
        if fortran or not np.issubdtype(dtype, np.integer):
            raise TraceInputError(path, f"routing array must be C-ordered integers, got {dtype}"
                                        + (" (Fortran order)" if fortran else ""))
        self.tokens, self.layers, self.top_k = (int(x) for x in shape)
        if min(shape) < 1:
            raise TraceInputError(path, f"routing array has an empty dimension: shape {shape}")
        # the header's shape is checked against the file before any chunk is allocated from it
        expected = self.tokens * self.layers * self.top_k * dtype.itemsize
        if self._offset + expected > size:
            raise TraceInputError(path, f"the header says shape {shape} ({expected} bytes of {dtype}) but the file "
                                        f"holds {max(size - self._offset, 0)} bytes of data")
        self.dtype = dtype
        self.domain, self.domain_names, self.phase, self.scores = None, (), None, None

    def chunks(self, start: int = 0, stop: int | None = None, size: int = CHUNK_TOKENS):
        stop = self.tokens if stop is None else stop
        row = self.layers * self.top_k
        with open(self.path, "rb") as f:
            for a in range(start, stop, size):
                n = min(size, stop - a)
                f.seek(self._offset + a * row * self.dtype.itemsize)
                ids = np.fromfile(f, dtype=self.dtype, count=n * row)
                if len(ids) != n * row:
                    raise TraceInputError(self.path, "the array file is shorter than its header says")
                yield a, ids.reshape(n, self.layers, self.top_k)


def load_npy(path: Path) -> NpySource:
    return NpySource(path)


class ParquetSource:
    """A directory of per-layer parquet files (`layer_<i>.parquet`, ordered by i), streamed by row group."""

    def __init__(self, directory: Path, files: list[Path] | None = None):
        pq = _pyarrow_parquet(directory)
        self.path = str(directory)
        self.files = files or sorted(directory.glob("layer_*.parquet"), key=_layer_number)
        if not self.files:
            raise TraceInputError(directory, "no layer_*.parquet files in the routing directory")
        self._pq = pq
        metas = [_parquet_call(f, pq.ParquetFile, f) for f in self.files]
        rows = {m.metadata.num_rows for m in metas}
        if len(rows) != 1:
            raise TraceInputError(directory, f"layer files have different row counts {sorted(rows)}: "
                                             f"rows must align across layers")
        self.tokens, self.layers = rows.pop(), len(self.files)
        if self.tokens < 1:
            raise TraceInputError(self.files[0], "parquet routing file has no rows")
        for f, m in zip(self.files, metas):
            _check_indices_type(f, m.schema_arrow)
        first = _parquet_call(self.files[0], lambda: pq.read_table(self.files[0], columns=["indices"])
                              .column("indices").slice(0, 1).to_pylist())
        self.top_k = len(first[0]) if first and first[0] is not None else 0
        if self.top_k < 1:
            raise TraceInputError(self.files[0], "layer 0 row 0: 'indices' must hold the top-k expert ids (>= 1 of them)")
        self.domain, self.domain_names, self.phase = _parquet_call(self.files[0], _parquet_meta, pq, self.files[0], metas[0])
        _check_meta(self)

    def chunks(self, start: int = 0, stop: int | None = None, size: int = CHUNK_TOKENS):
        stop = self.tokens if stop is None else stop
        readers = [_parquet_call(f, self._pq.ParquetFile(f).iter_batches, batch_size=size, columns=["indices"])
                   for f in self.files]
        pos = 0
        while pos < stop:
            cols = []
            for layer, (f, r) in enumerate(zip(self.files, readers)):
                batch = _parquet_call(f, next, r, None)
                if batch is None:
                    raise TraceInputError(f, "ended before the other layer files")
                cols.append(_list_column(batch.column(0), self.top_k, f, pos, layer))
            n = len(cols[0])
            a, b = max(start, pos), min(stop, pos + n)
            if a < b:
                yield a, np.stack([c[a - pos:b - pos] for c in cols], axis=1)
            pos += n


def _parquet_call(path: Path, fn, *args, **kw):
    """`fn(*args)` with pyarrow's errors on a corrupt or foreign file (ArrowInvalid, OSError...) as a
    one-line TraceInputError naming the file."""
    import pyarrow as pa
    try:
        return fn(*args, **kw)
    except TraceInputError:
        raise
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError) as e:
        raise TraceInputError(path, f"not a readable parquet routing file ({type(e).__name__}: "
                                    f"{' '.join(str(e).split())[:200]})") from None


def _check_indices_type(path: Path, schema) -> None:
    """'indices' must be a list column of integers (strings, floats or structs are refused up front)."""
    import pyarrow as pa
    if "indices" not in schema.names:
        raise TraceInputError(path, "parquet routing file has no 'indices' column")
    t = schema.field("indices").type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if not is_list or not pa.types.is_integer(t.value_type):
        raise TraceInputError(path, f"'indices' must be a list of integer expert ids per row, got {t}")


def _layer_number(p: Path) -> int:
    digits = "".join(ch for ch in p.stem if ch.isdigit())
    return int(digits) if digits else 0


def _pyarrow_parquet(where):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceInputError(where, "reading parquet routing needs pyarrow: pip install pyarrow") from None
    return pq


def _list_column(col, top_k: int, path: Path, first_row: int, layer: int = 0) -> np.ndarray:
    """A list<int> arrow column as int32 [rows, top_k]; null, ragged or out-of-range rows are errors
    naming the file, layer and row."""
    import pyarrow.compute as pc
    lengths = pc.list_value_length(col).fill_null(-1).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(lengths != top_k)
    if len(bad):
        row, n = first_row + int(bad[0]), int(lengths[bad[0]])
        raise TraceInputError(path, f"layer {layer} row {row}: " + ("'indices' is null" if n < 0 else
                                    f"ragged top-k ({n} experts, expected {top_k})"))
    flat = pc.list_flatten(col)
    if flat.null_count:
        row = first_row + int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0]) // top_k
        raise TraceInputError(path, f"layer {layer} row {row}: a null expert id")
    ids = flat.to_numpy(zero_copy_only=False).reshape(-1, top_k)
    return _checked_ids(ids, path, f"layer {layer}", first_row)


def _checked_ids(ids: np.ndarray, path, where: str, first_row: int = 0) -> np.ndarray:
    """Integer expert ids [rows, top_k] as int32, refusing (not wrapping) any outside [0, 2^31)."""
    if ids.dtype.kind not in "iu":
        raise TraceInputError(path, f"{where}: expert ids must be integers, got {ids.dtype}")
    if ids.size:
        lo, hi = ids.min(), ids.max()
        if lo < 0 or hi > MAX_EXPERT_ID:
            bad = lo if lo < 0 else hi
            row = int(np.argwhere(ids == bad)[0][0])
            raise TraceInputError(path, f"{where} row {first_row + row}: expert id {int(bad)} is not a valid id "
                                        f"(0..{MAX_EXPERT_ID})")
    return ids.astype(np.int32, copy=False)


def _parquet_meta(pq, path: Path, meta) -> tuple[np.ndarray | None, tuple[str, ...], np.ndarray | None]:
    names = meta.schema_arrow.names
    domain, domain_names, phase = None, (), None
    if "domain" in names:
        values = pq.read_table(path, columns=["domain"]).column("domain").to_pylist()
        domain, domain_names = encode_domains(values)
    if "phase" in names:
        phase = encode_phases(pq.read_table(path, columns=["phase"]).column("phase").to_pylist(), path)
    return domain, domain_names, phase


def encode_domains(values) -> tuple[np.ndarray, tuple[str, ...]]:
    names = tuple(sorted({str(v) for v in values}))
    index = {n: i for i, n in enumerate(names)}
    return np.fromiter((index[str(v)] for v in values), np.int16, len(values)), names


def encode_phases(values, path) -> np.ndarray:
    try:
        return np.fromiter((PHASES.index(str(v)) for v in values), np.uint8, len(values))
    except ValueError:
        raise TraceInputError(path, f"phase must be one of {', '.join(PHASES)}") from None


# ------------------------------------------------------------------------------------------ JSON lines
def _read_json_lines(path: Path) -> list[dict]:
    """The records of a JSON-lines file (plain or gzip), read through the bounded reader of
    `chakra_schema.safe_io` (decompressed-size limit, line-length limit, blank runs skipped)."""
    import orjson

    from chakra_schema.safe_io import iter_lines
    out = []
    for n, line in iter_lines(path):
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise TraceInputError(path, f"line {n}: not JSON ({e})") from None
        if not isinstance(rec, dict):
            raise TraceInputError(path, f"line {n}: expected a JSON object")
        out.append(rec)
    if not out:
        raise TraceInputError(path, "empty routing trace")
    return out


def load_jsonl(path: Path) -> ArraySource:
    records = _read_json_lines(path)
    if "top_indices" in records[0]:
        return _megatron_records(records, path)
    if "experts" in records[0]:
        return _token_records(records, path)
    raise TraceInputError(path, "JSON lines need 'top_indices' (Megatron-core) or 'experts' (token records)")


def _int_field(record: dict, key: str, path: Path, where: str, default: int | None = None, low: int = 0) -> int:
    """An integer field of a record, strictly: "7", 3.9, true and null are refused, not coerced."""
    if key not in record and default is not None:
        return default
    if key not in record:
        raise TraceInputError(path, f"{where}: no '{key}'")
    v = record[key]
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_EXPERT_ID:
        raise TraceInputError(path, f"{where}: '{key}' must be an integer in [{low}, {MAX_EXPERT_ID}], got {v!r}"[:300])
    return v


def _id_array(value, path: Path, where: str) -> np.ndarray:
    """A JSON list (of lists) of expert ids as an int64 array; strings, floats, bools, nulls and ids past
    64 bits are refused (numpy would coerce some of them, or give an object array)."""
    if not isinstance(value, list):
        raise TraceInputError(path, f"{where}: expert ids must be a list, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError):
        raise TraceInputError(path, f"{where}: expert ids must be a list of integers (or of equal-length lists)") from None
    if arr.dtype.kind not in "iu" and arr.size:
        raise TraceInputError(path, f"{where}: expert ids must be integers, got {str(arr.dtype) if arr.dtype.kind != 'O' else 'mixed or >64-bit values'}")
    return arr if arr.size else arr.astype(np.int64)


def _rows(value, topk: int, path: Path, where: str) -> np.ndarray:
    """Top-k ids as int32 [n, topk] from a list of lists or a flat list; ragged rows are an error."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        lengths = {len(r) if isinstance(r, list) else -1 for r in value}
        if lengths != {topk}:
            raise TraceInputError(path, f"{where}: ragged top-k (rows of {sorted(lengths)} experts, expected {topk})")
    arr = _id_array(value, path, where)
    if arr.ndim > 2 or arr.size % topk:
        raise TraceInputError(path, f"{where}: ragged top-k ({arr.size} ids is not a multiple of topk={topk})")
    return _checked_ids(arr.reshape(-1, topk), path, where)


def _megatron_records(records: list[dict], path: Path) -> ArraySource:
    blocks: dict[tuple[int, int], dict[int, np.ndarray]] = {}
    topk = None
    for n, r in enumerate(records, 1):
        where = f"record {n}"
        if "top_indices" not in r:
            raise TraceInputError(path, f"{where}: no 'top_indices' (every record of a Megatron routing trace needs it)")
        k = _int_field(r, "topk", path, where, low=1)
        key = (_int_field(r, "step", path, where, 0), _int_field(r, "rank", path, where, 0))
        layer = _int_field(r, "layer", path, where)
        where = f"record {n} (layer {layer})"
        rows = _rows(r["top_indices"], k, path, where)
        if "num_tokens" in r and _int_field(r, "num_tokens", path, where) != len(rows):
            raise TraceInputError(path, f"{where}: num_tokens={r['num_tokens']} but {len(rows)} rows")
        if topk is not None and k != topk:
            raise TraceInputError(path, f"{where}: ragged top-k (topk={k}, earlier records {topk})")
        topk = k
        blocks.setdefault(key, {})[layer] = rows
    layers = sorted({l for b in blocks.values() for l in b})
    parts = []
    for key in sorted(blocks):
        b = blocks[key]
        if sorted(b) != layers:
            raise TraceInputError(path, f"step {key[0]} rank {key[1]} has layers {sorted(b)}, others {layers}")
        counts = {len(v) for v in b.values()}
        if len(counts) != 1:
            raise TraceInputError(path, f"step {key[0]} rank {key[1]}: token counts differ across layers {sorted(counts)}")
        parts.append(np.stack([b[l] for l in layers], axis=1))
    experts = np.concatenate(parts)
    if experts.shape[0] == 0:
        raise TraceInputError(path, "the routing trace has no tokens")
    return ArraySource(experts, path=str(path))


def _token_records(records: list[dict], path: Path) -> ArraySource:
    layer = np.fromiter((_int_field(r, "layer", path, f"record {n}") for n, r in enumerate(records, 1)),
                        np.int64, len(records))
    token = np.fromiter((_int_field(r, "token_idx", path, f"record {n}") for n, r in enumerate(records, 1)),
                        np.int64, len(records))
    rows = []
    k = None
    for n, r in enumerate(records, 1):
        where = f"record {n} (layer {layer[n - 1]}, token {token[n - 1]})"
        ids = _id_array(r.get("experts"), path, where)
        if ids.ndim != 1 or (k is not None and len(ids) != k) or len(ids) == 0:
            raise TraceInputError(path, f"{where}: ragged top-k ({len(ids) if ids.ndim == 1 else 'nested'} experts, "
                                        f"expected {k if k is not None else '>= 1'})")
        k = len(ids)
        rows.append(_checked_ids(ids.reshape(1, -1), path, where)[0])
    layers, li = np.unique(layer, return_inverse=True)
    tokens, ti = np.unique(token, return_inverse=True)
    experts = np.full((len(tokens), len(layers), k), -1, np.int32)
    experts[ti, li] = np.stack(rows)
    have = np.zeros((len(tokens), len(layers)), bool)
    have[ti, li] = True
    if not have.all():
        t, l = np.argwhere(~have)[0]
        raise TraceInputError(path, f"token {int(tokens[t])} has no record for layer {int(layers[l])}")
    scores = None
    if all("gating_probs" in r for r in records):
        scores = np.zeros(experts.shape, np.float32)
        scores[ti, li] = np.stack([_probs(r["gating_probs"], k, path, f"record {n}")
                                   for n, r in enumerate(records, 1)])
    domain, names = None, ()
    if any("domain" in r for r in records):
        per_token = [""] * len(tokens)
        for r, t in zip(records, ti):
            per_token[t] = str(r.get("domain", ""))
        domain, names = encode_domains(per_token)
    return ArraySource(experts, path=str(path), scores=scores, domain=domain, domain_names=names)


def _probs(value, k: int, path: Path, where: str) -> np.ndarray:
    """A record's `gating_probs`: k finite numbers."""
    if not isinstance(value, list) or len(value) != k or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise TraceInputError(path, f"{where}: 'gating_probs' must be a list of {k} numbers (one per expert)")
    probs = np.asarray(value, dtype=np.float64)
    if not np.isfinite(probs).all():
        raise TraceInputError(path, f"{where}: 'gating_probs' must be finite numbers")
    return probs.astype(np.float32)


# ------------------------------------------------------------------------------------------ checks
def check_against_model(src: RoutingSource, num_experts: int, moe_layers: int, top_k: int | None = None) -> None:
    """Layer count and top-k must match the model (ids are checked as they stream, `check_ids`)."""
    if src.layers != moe_layers:
        raise TraceInputError(src.path, f"routing has {src.layers} MoE layers, the model has {moe_layers}")
    if top_k is not None and src.top_k != top_k:
        raise TraceInputError(src.path, f"routing has top-{src.top_k}, the model routes top-{top_k}")


def check_ids(experts: np.ndarray, num_experts: int, path: str, first_token: int) -> None:
    """Expert ids must lie in [0, num_experts)."""
    lo, hi = int(experts.min()), int(experts.max())
    if lo < 0 or hi >= num_experts:
        bad = hi if hi >= num_experts else lo
        t, l, _ = np.argwhere(experts == bad)[0]
        raise TraceInputError(path, f"expert id {bad} at token {first_token + int(t)} layer {int(l)} is outside "
                                    f"[0, {num_experts}) for a model with {num_experts} experts")


class MaskedSource:
    """The tokens of `base` where `keep` is true (e.g. only prefill or only decode tokens), in order."""

    def __init__(self, base: RoutingSource, keep: np.ndarray, label: str = ""):
        self.base, self.keep = base, np.asarray(keep, bool)
        self.path = base.path + (f" ({label})" if label else "")
        self.layers, self.top_k, self.domain_names = base.layers, base.top_k, base.domain_names
        self.tokens = int(self.keep.sum())
        self.domain = base.domain[self.keep] if base.domain is not None else None
        self.phase = base.phase[self.keep] if base.phase is not None else None
        self._before = np.concatenate([[0], np.cumsum(self.keep)])   # kept tokens before each base token

    def chunks(self, start: int = 0, stop: int | None = None, size: int = CHUNK_TOKENS):
        stop = self.tokens if stop is None else stop
        lo = int(np.searchsorted(self._before, start, side="right")) - 1   # base token of kept token `start`
        hi = int(np.searchsorted(self._before, stop, side="left"))
        for first, ids in self.base.chunks(max(lo, 0), hi, size):
            sel = self.keep[first:first + len(ids)]
            out = ids[sel]
            pos = int(self._before[first])
            a, b = max(start - pos, 0), min(stop - pos, len(out))
            if a < b:
                yield pos + a, out[a:b]
