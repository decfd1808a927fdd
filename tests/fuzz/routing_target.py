"""Coverage-guided fuzz target (atheris) for the MoE routing readers: `.npy` arrays, per-layer parquet,
JSON lines (Megatron-core records and token records), plain and gzip. Any input must end in a routing
source whose every chunk reads, or a one-line `TraceInputError`: any other exception is a bug.

    python tests/fuzz/routing_target.py -max_total_time=600 -rss_limit_mb=2048 [CORPUS_DIR]

`tests/test_fuzz_readers.py` runs it for a bounded time in CI; `fuzz_one(data)` is the target (its
first byte picks the format, the rest is the file).
"""
from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from atheris_main import run_atheris  # noqa: E402
from chakra_schema.errors import TraceInputError  # noqa: E402
from chakra_schema.safe_io import set_max_input_bytes  # noqa: E402

_DIR = tempfile.mkdtemp(prefix="lumos-fuzz-routing-")
FORMATS = ("npy", "parquet", "jsonl", "jsonl.gz", "json")


def _path(fmt: str) -> str:
    if fmt == "parquet":
        folder = os.path.join(_DIR, "layers")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        return os.path.join(folder, "layer_0.parquet")
    return os.path.join(_DIR, "routing." + fmt)


def fuzz_one(data: bytes) -> None:
    """First byte picks the format, the rest is the file (gzip'd for .jsonl.gz unless it already is)."""
    if not data:
        return
    from estimators.moe.routing import check_ids, load_routing
    fmt = FORMATS[data[0] % len(FORMATS)]
    body = data[1:]
    if fmt == "jsonl.gz" and body[:2] != b"\x1f\x8b":
        body = gzip.compress(body, compresslevel=1, mtime=0)
    path = _path(fmt)
    with open(path, "wb") as f:
        f.write(body)
    set_max_input_bytes(64 << 20)   # a fuzz input may claim anything: keep memory bounded
    try:
        src = load_routing(os.path.dirname(path) if fmt == "parquet" else path)
        for first, ids in src.chunks(0, None, 4096):
            check_ids(ids, 1 << 16, src.path, first)
    except TraceInputError:
        pass


def main(argv: list[str]) -> None:
    run_atheris(argv, fuzz_one, ["chakra_schema.safe_io", "estimators.moe.routing"])


if __name__ == "__main__":
    main(sys.argv)
