"""PyTorch traces -> Chakra `.et` files, one per rank: input discovery, per-rank conversion, writing.

    discover_inputs(et_pattern, kineto_pattern) -> {rank: RankInputs(et_path, kineto_path)}
    convert_rank(inputs, progress=None, rank=None) -> ExecutionGraph
    convert(et_pattern, kineto_pattern, out_prefix, progress=None) -> [summary dict per rank]

Patterns: a path that may hold `{rank}` (the rank is read from that position) and shell wildcards, e.g.
`'traces/worker{rank}_*.json.gz'`. Without `{rank}`: one file takes its rank from its content (Kineto
`distributedInfo.rank`, ET `record_param_comms`), 0 when unknown; several files must each name a
distinct rank in their content. With both patterns every rank needs both files.

Per rank: Kineto + ET -> `kineto_to_graph(kineto, link(et, kineto))`; Kineto only -> `kineto_to_graph`;
ET only -> `execution_trace_to_graph`. Every graph is validated (no dangling deps, acyclic) before any
file is written; files are written as `PREFIX.<rank>.et` under temporary names and renamed only when all
ranks succeeded, so an error leaves no output behind.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.safe_io import iter_decompressed
from chakra_schema.graph import EdgeKind, ExecutionGraph, OpKind
from chakra_schema.graph_io import missing_ranks
from chakra_schema.pytorch.et_graph import execution_trace_to_graph
from chakra_schema.pytorch.execution_trace import load_execution_trace
from chakra_schema.pytorch.linker import link_with_report

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class RankInputs:
    et_path: str | None
    kineto_path: str | None

    def describe(self) -> str:
        return " + ".join(p for p in (self.et_path, self.kineto_path) if p)


# ----------------------------------------------------------------------------------------- discovery
def _glob_regex(pattern: str) -> re.Pattern:
    """Regex for a glob pattern whose `{rank}` becomes the named group `rank` (digits)."""
    out = []
    i = 0
    seen_rank = False
    while i < len(pattern):
        if pattern.startswith("{rank}", i):
            out.append("(?P=rank)" if seen_rank else r"(?P<rank>\d+)")
            seen_rank = True
            i += len("{rank}")
            continue
        c = pattern[i]
        if c == "*":
            out.append(r"[^/]*")
        elif c == "?":
            out.append(r"[^/]")
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:j].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _expand(pattern: str, what: str) -> dict[int | None, list[str]]:
    """Files matching `pattern` grouped by the rank in their `{rank}` position (None without one)."""
    if "{rank}" in pattern:
        rx = _glob_regex(pattern)
        found: dict[int | None, list[str]] = {}
        for path in sorted(glob.glob(pattern.replace("{rank}", "*"))):
            m = rx.match(path)
            if m and os.path.isfile(path):
                found.setdefault(int(m.group("rank")), []).append(path)
        if not found:
            raise TraceInputError(pattern, f"no {what} file matches this pattern")
        for r, paths in found.items():
            if len(paths) > 1:
                raise TraceInputError(pattern, f"several {what} files for rank {r}: {paths[0]}, {paths[1]}")
        return found
    if glob.has_magic(pattern):
        paths = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    else:
        paths = [pattern] if os.path.isfile(pattern) else []
    if not paths:
        if os.path.isdir(pattern):
            raise TraceInputError(pattern, f"is a directory; give the {what} file(s), e.g. '{pattern}/x.{{rank}}.json.gz'")
        raise TraceInputError(pattern, f"no {what} file matches" if glob.has_magic(pattern) else "no such file")
    return {None: paths}


_ET_CACHE: dict[tuple, Any] = {}


def _file_key(path: str) -> tuple:
    st = os.stat(path)
    return (os.path.abspath(path), st.st_size, st.st_mtime_ns)


def _load_et(path: str, progress: ProgressFn | None):
    et = _ET_CACHE.pop(_file_key(path), None)
    return et if et is not None else load_execution_trace(path, progress)


_KINETO_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')


def _sniff_rank(path: str, what: str) -> int | None:
    """The rank a trace names: Kineto `distributedInfo.rank` (found in the text, no full parse), ET from
    its `record_param_comms` nodes."""
    if what == "ET":
        et = load_execution_trace(path)
        _ET_CACHE.clear()
        _ET_CACHE[_file_key(path)] = et  # convert_rank will need it next: parse once
        return et.rank
    # streamed: the rank sits near the top of the file, and the whole file need not be in memory
    tail = b""
    for block in iter_decompressed(path):
        m = _KINETO_RANK.search(tail + block)
        if m:
            return int(m.group(1))
        tail = block[-4096:]
    return None


def _by_rank(pattern: str, what: str) -> dict[int | None, str]:
    """{rank: file}; a single file without {rank} whose content names no rank is under None."""
    found = _expand(pattern, what)
    if None not in found:
        return {r: paths[0] for r, paths in found.items()}
    paths = found[None]
    if len(paths) == 1:
        return {_sniff_rank(paths[0], what): paths[0]}
    out: dict[int, str] = {}
    for p in paths:
        r = _sniff_rank(p, what)
        if r is None:
            raise TraceInputError(p, f"{len(paths)} {what} files match {pattern!r} and this one names no rank: "
                                     "put {rank} in the pattern")
        if r in out:
            raise TraceInputError(p, f"claims rank {r}, like {out[r]}: put {{rank}} in the pattern")
        out[r] = p
    return out


def discover_inputs(et_pattern: str | None, kineto_pattern: str | None) -> dict[int, RankInputs]:
    """{rank: RankInputs} for the given patterns (see the module docstring)."""
    if not et_pattern and not kineto_pattern:
        raise TraceInputError(None, "give an Execution Trace (--et) and/or a Kineto trace (--kineto)")
    ets = _by_rank(et_pattern, "ET") if et_pattern else {}
    kins = _by_rank(kineto_pattern, "Kineto") if kineto_pattern else {}
    if et_pattern and kineto_pattern:
        if len(ets) == 1 and len(kins) == 1 and "{rank}" not in et_pattern + kineto_pattern:
            # one pair of files: pair them even when one names a rank and the other cannot
            (re_, e), (rk, k) = next(iter(ets.items())), next(iter(kins.items()))
            if re_ is not None and rk is not None and re_ != rk:
                raise TraceInputError(e, f"the Execution Trace is rank {re_} but the Kineto trace {k} is rank "
                                         f"{rk}: not a pair")
            r = rk if rk is not None else re_
            return {r if r is not None else 0: RankInputs(e, k)}
    # a lone file that names no rank is rank 0
    ets = {0 if r is None else r: p for r, p in ets.items()}
    kins = {0 if r is None else r: p for r, p in kins.items()}
    if et_pattern and kineto_pattern:
        for r in sorted(set(ets) | set(kins)):
            if r not in kins:
                raise TraceInputError(kineto_pattern, f"no Kineto trace for rank {r} (ET {ets[r]})")
            if r not in ets:
                raise TraceInputError(et_pattern, f"no Execution Trace for rank {r} (Kineto {kins[r]})")
    ranks = sorted(set(ets) | set(kins))
    return {r: RankInputs(ets.get(r), kins.get(r)) for r in ranks}


# ----------------------------------------------------------------------------------------- conversion
def convert_rank(inputs: RankInputs, progress: ProgressFn | None = None, rank: int | None = None,
                 rank_from_name: bool = False) -> ExecutionGraph:
    """One rank's graph from its inputs; `graph.metadata["link"]` reports how ET and Kineto were linked.
    `rank_from_name`: `rank` was read from the file name ({rank} pattern); a Kineto trace that records
    another rank (distributedInfo) is then a misnamed or swapped file."""
    from chakra_schema.pytorch.kineto import load_kineto
    from chakra_schema.pytorch.kineto_graph import kineto_to_graph

    if inputs.kineto_path:
        kineto = load_kineto(inputs.kineto_path, progress)
        if rank_from_name and kineto.rank is not None and rank is not None and kineto.rank != rank:
            raise TraceInputError(inputs.kineto_path, f"is named rank {rank} but records rank {kineto.rank} "
                                                      "(distributedInfo): rank files swapped or misnamed")
        host_info = None
        report = None
        if inputs.et_path:
            et = _load_et(inputs.et_path, progress)
            host_info, report = link_with_report(et, kineto)
            del et
        graph = kineto_to_graph(kineto, host_info, rank=rank)
        graph.metadata["source_kineto"] = inputs.kineto_path
        if report is not None:
            graph.metadata["source_et"] = inputs.et_path
            graph.metadata["link"] = report.as_dict()
        return graph
    if inputs.et_path:
        et = _load_et(inputs.et_path, progress)
        return execution_trace_to_graph(et, rank=rank)
    raise TraceInputError(None, "no input file for this rank")


def summarize(graph: ExecutionGraph) -> dict[str, Any]:
    kinds = Counter(OpKind(k).name for k in graph.kind.tolist())
    edges = Counter(EdgeKind(k).name for k in graph.dep_kind.tolist())
    return {
        "rank": graph.rank, "world_size": graph.world_size, "nodes": len(graph),
        "nodes_by_kind": dict(sorted(kinds.items())), "gpu_ops": int(graph.is_gpu().sum()),
        "collectives": int(len(graph.collectives())), "steps": len(graph.steps), "edges": graph.num_edges,
        "ctrl_deps": int((graph.parent >= 0).sum()),
        "edges_by_kind": dict(sorted(edges.items())),
    }


def _validate(graph: ExecutionGraph, inputs: RankInputs) -> None:
    problems = graph.validate()
    if problems:
        raise TraceInputError(inputs.kineto_path or inputs.et_path,
                              f"converted graph is invalid: {problems[0]}")


def iter_converted(et_pattern: str | None, kineto_pattern: str | None, progress: ProgressFn | None = None):
    """(rank, RankInputs, validated graph) for every rank the patterns name, in rank order: the one code
    path of `convert` and of the `replay` / `check` inputs, so both number ranks the same way."""
    named = bool(kineto_pattern) and "{rank}" in str(kineto_pattern)
    inputs = discover_inputs(et_pattern, kineto_pattern)
    job_ranks = max(inputs) + 1
    job: tuple[int, str] | None = None     # the first world size a trace records, and that trace
    for r, inp in sorted(inputs.items()):
        graph = convert_rank(inp, progress, rank=r, rank_from_name=named)
        _validate(graph, inp)
        job = _check_same_job(graph, inp, inputs, job)
        graph.world_size = _world_size(graph, job_ranks)
        yield r, inp, graph


def _check_same_job(graph: ExecutionGraph, inp: RankInputs, inputs: dict[int, RankInputs],
                    job: tuple[int, str] | None) -> tuple[int, str] | None:
    """Rank files of one job record one world size: another is a trace of another job (an error naming
    both files). The first recorded size also tells which ranks of the job were not given (a warning: a
    replay without them treats their share of every collective as arrived)."""
    size = int(graph.metadata.get("recorded_world_size") or 0)
    if size <= 0:
        return job
    src = str(inp.kineto_path or inp.et_path)
    if job is not None:
        if job[0] != size:
            raise TraceInputError(src, f"records a job of {size} ranks but {job[1]} one of {job[0]}: "
                                       "traces of different runs")
        return job
    text = missing_ranks(size, inputs, "not given") if len(inputs) > 1 else ""
    if text:
        log.warning("%s: the job has %d ranks; %s", src, size, text)
    return size, src


def _world_size(graph: ExecutionGraph, job_ranks: int) -> int:
    """The job's size as far as anything shows it: the trace's own record (Kineto distributedInfo, the
    ET's pg config), the rank files given together, and the ranks its process groups name. A trace that
    records none (an Execution Trace alone) would otherwise say rank + 1."""
    named = [int(x) for i in graph.collectives().tolist() for x in (graph.attr(i, "pg_ranks", None) or ())
             if isinstance(x, (int, np.integer)) or (isinstance(x, str) and x.isdigit())]
    return max(int(graph.world_size or 1), job_ranks, max(named, default=-1) + 1, int(graph.rank) + 1)


def convert(et_pattern: str | None, kineto_pattern: str | None, out_prefix: str | os.PathLike,
            progress: ProgressFn | None = None) -> list[dict[str, Any]]:
    """Convert every rank and write `OUT_PREFIX.<rank>.et`; returns one summary dict per rank."""
    from chakra_schema.graph_io import order_deps_written, write_graph

    out_prefix = str(out_prefix)
    out_dir = os.path.dirname(out_prefix) or "."
    try:
        os.makedirs(out_dir, exist_ok=True)  # like `-o out/job` in any tool: make `out/` when needed
    except OSError as e:
        raise TraceInputError(out_prefix, f"cannot create output directory {out_dir}: {e.strerror}") from None
    summaries: list[dict[str, Any]] = []
    written: list[tuple[str, str]] = []   # (temporary, final)
    try:
        t0 = time.perf_counter()
        for r, inp, graph in iter_converted(et_pattern, kineto_pattern, progress):
            final = f"{out_prefix}.{r}.et"
            tmp = f"{final}.partial-{os.getpid()}"
            write_graph(graph, tmp)
            written.append((tmp, final))
            s = summarize(graph)
            s["order_deps"] = order_deps_written(graph)  # thread/stream order, written as data deps too
            s.update({"et": inp.et_path, "kineto": inp.kineto_path, "output": final,
                      "seconds": round(time.perf_counter() - t0, 3)})
            if "link" in graph.metadata:
                s["link"] = graph.metadata["link"]
            summaries.append(s)
            del graph
            t0 = time.perf_counter()
        for tmp, final in written:
            os.replace(tmp, final)
        written = []
    finally:
        for tmp, _ in written:  # an error before the renames: leave nothing behind
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return summaries


__all__ = ["RankInputs", "discover_inputs", "convert_rank", "convert", "iter_converted", "summarize"]
