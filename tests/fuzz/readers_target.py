"""Coverage-guided fuzz target (atheris) for the trace readers: `.et` (plain and gzip), Kineto JSON and
Execution Trace JSON, each followed by the replay of what it produced. Any input must end in a result
or a one-line `TraceInputError` / `ReplayError`: any other exception is a bug, which atheris reports
with the input that caused it.

    python tests/fuzz/readers_target.py -max_total_time=30 -rss_limit_mb=2048 [CORPUS_DIR]

`tests/test_fuzz_readers.py` runs it for a bounded time in CI; `fuzz_one(data)` is the target.
"""
from __future__ import annotations

import gzip
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from atheris_main import run_atheris  # noqa: E402
from chakra_schema.errors import TraceInputError  # noqa: E402
from chakra_schema.graph import GraphError  # noqa: E402
from chakra_schema.safe_io import set_max_input_bytes  # noqa: E402

_DIR = tempfile.mkdtemp(prefix="lumos-fuzz-")
EXPECTED = (TraceInputError,)


def _replay(graphs) -> None:
    from replay.api import replay
    from replay.engine import ReplayError
    from replay.trace_timing import TraceTiming
    try:
        replay(graphs, TraceTiming())
    except ReplayError:
        pass


def _read_et(path: str) -> None:
    from chakra_schema.inputs import load_graphs
    _replay(load_graphs([path]))


def _read_kineto(path: str) -> None:
    from chakra_schema.pytorch.converter import RankInputs, convert_rank
    graph = convert_rank(RankInputs(None, path))
    try:
        graph.check(path)
    except GraphError:
        return
    _replay([graph])


def _read_execution_trace(path: str) -> None:
    from chakra_schema.pytorch.converter import RankInputs, convert_rank
    convert_rank(RankInputs(path, None))


READERS = [(".et", _read_et), (".et.gz", _read_et), (".json", _read_kineto), (".json.gz", _read_kineto),
           (".json", _read_execution_trace)]


def fuzz_one(data: bytes) -> None:
    """First byte picks the reader, the rest is the file."""
    if not data:
        return
    suffix, reader = READERS[data[0] % len(READERS)]
    body = data[1:]
    if suffix.endswith(".gz"):
        body = gzip.compress(body, compresslevel=1, mtime=0)
    path = os.path.join(_DIR, "input" + suffix)
    with open(path, "wb") as f:
        f.write(body)
    set_max_input_bytes(64 << 20)   # a fuzz input may claim anything: keep memory bounded
    try:
        reader(path)
    except EXPECTED:
        pass


def main(argv: list[str]) -> None:
    run_atheris(argv, fuzz_one, [
        "chakra_schema.et_io",
        "chakra_schema.graph_io",
        "chakra_schema.pytorch.converter",
        "chakra_schema.pytorch.execution_trace",
        "chakra_schema.pytorch.kineto",
        "chakra_schema.pytorch.kineto_graph",
        "chakra_schema.inputs",
    ])


if __name__ == "__main__":
    main(sys.argv)
