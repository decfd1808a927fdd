"""Turn the INPUT arguments of `replay`, `check` and `whatif trace` into execution graphs.

An INPUT is an `.et` file, an `.et` prefix (PREFIX.<rank>.et), or raw PyTorch traces (Kineto and/or
Execution Trace files, `{rank}` patterns and wildcards allowed) that are converted on the fly.
"""
from __future__ import annotations

import glob
import gzip
import os
from typing import Callable, Sequence

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import ExecutionGraph

ProgressCallback = Callable[[int, int], None]


def _is_et_file(path: str) -> bool:
    return path.endswith(".et") or path.endswith(".et.gz")


def sniff_trace_kind(path: str) -> str:
    """'kineto' or 'et' by looking at the first bytes of a JSON trace (gzip-aware)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            head = f.read(1 << 16)
    except (OSError, EOFError) as e:
        raise TraceInputError(path, f"cannot read: {e}") from None
    if path.endswith((".tar.gz", ".tgz")):
        return "et"
    if b'"traceEvents"' in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head:
        return "kineto"
    if head.lstrip().startswith(b"[") and b'"ph"' in head:
        return "kineto"     # the 2020-era Kineto format: a bare list of trace events
    if b'"nodes"' in head or b'"schema"' in head:
        return "et"
    if not head.strip():
        raise TraceInputError(path, "empty file")
    raise TraceInputError(path, "not a Kineto or Execution Trace JSON (neither 'traceEvents' nor 'nodes' found)")


def _reject_duplicate_ids(graph: ExecutionGraph, path: str) -> None:
    """Dependencies name nodes by id: with two nodes of one id the graph is ambiguous, not replayable."""
    ids = np.sort(graph.node_id)
    dup = np.unique(ids[1:][ids[1:] == ids[:-1]])
    if len(dup):
        raise TraceInputError(path, f"{len(dup)} duplicate node ids (e.g. {dup[:5].tolist()}); dependencies "
                                    "on them are ambiguous (`lumos-sim inspect` lists the problems)")


def _pattern_matches(pattern: str) -> list[str]:
    return sorted(glob.glob(pattern.replace("{rank}", "*")))


def load_graphs(inputs: Sequence[str], et_pattern: str | None = None, kineto_pattern: str | None = None,
                progress: ProgressCallback | None = None) -> list[ExecutionGraph]:
    """Graphs of every rank named by `inputs` (plus explicit raw-trace patterns), sorted by rank."""
    from chakra_schema.graph_io import graph_paths, read_graph

    def read_et(path: str) -> ExecutionGraph:
        graph = read_graph(path)
        _reject_duplicate_ids(graph, path)
        return graph

    graphs: list[ExecutionGraph] = []
    raw: dict[str, list[str]] = {"kineto": [], "et": []}
    for item in inputs:
        if os.path.isdir(item):
            raise TraceInputError(item, "is a directory; give an .et file, an .et PREFIX (out/job for "
                                        "out/job.0.et ...) or trace files")
        if _is_et_file(item) and os.path.exists(item):
            graphs.append(read_et(item))
            continue
        if not any(ch in item for ch in "*?[{"):
            if os.path.isfile(item):
                raw[sniff_trace_kind(item)].append(item)
                continue
            paths = graph_paths(item)
            if paths:
                graphs.extend(read_et(p) for _, p in sorted(paths.items()))
                continue
            raise TraceInputError(item, "no such file, and no PREFIX.<rank>.et files with this prefix")
        matches = _pattern_matches(item)
        if not matches:
            raise TraceInputError(item, "pattern matches no file")
        if all(_is_et_file(m) for m in matches):
            graphs.extend(read_et(m) for m in matches)
            continue
        raw[sniff_trace_kind(matches[0])].append(item)
    for kind, explicit in (("et", et_pattern), ("kineto", kineto_pattern)):
        if explicit:
            raw[kind].append(explicit)
    if raw["kineto"] or raw["et"]:
        if len(raw["kineto"]) > 1 or len(raw["et"]) > 1:
            raise TraceInputError(" ".join(raw["kineto"] + raw["et"]),
                                  "give one Kineto pattern and/or one Execution Trace pattern, using {rank} "
                                  "for several ranks (e.g. 'device.{rank}.json.gz')")
        from chakra_schema.pytorch.converter import iter_converted

        # the same discovery and per-rank conversion as `convert` (ranks from {rank} positions included)
        for _, _, graph in iter_converted(raw["et"][0] if raw["et"] else None,
                                          raw["kineto"][0] if raw["kineto"] else None, progress):
            graphs.append(graph)
    if not graphs:
        raise TraceInputError(None, "no input graphs")
    ranks = [g.rank for g in graphs]
    if len(set(ranks)) != len(ranks):
        raise TraceInputError(" ".join(inputs), f"several inputs claim the same rank: {sorted(ranks)}")
    graphs = sorted(graphs, key=lambda g: g.rank)
    if not (raw["kineto"] or raw["et"]):   # the trace converter warns for the raw traces it reads
        from chakra_schema.graph_io import warn_missing_ranks
        warn_missing_ranks(" ".join(inputs), graphs)
    # A set PREFIX.0.et .. PREFIX.{n-1}.et is one job of n ranks even when its files do not say so
    # (ASTRA-sim microbenchmarks carry no world size): collectives without a group span all of them.
    if [g.rank for g in graphs] == list(range(len(graphs))):
        for g in graphs:
            if g.world_size < len(graphs):
                g.world_size = len(graphs)
    return graphs
