"""`.et` files carry the CPU-thread and GPU-stream order as explicit data deps, as Chakra's own converter
does, so a consumer that issues a node once its data deps are done (ASTRA-sim's ETFeeder) runs each
thread's and stream's ops in order. Checked with the independent wire decoder on every shared multi-rank
and ET+Kineto conversion and on the committed multi-rank sets; our own reader drops those deps again,
so the replay of a written file is the replay of the graph."""
from __future__ import annotations

from collections import defaultdict

import pytest

from chakra_schema.graph_io import read_graphs
from chakra_schema.pytorch.converter import convert
from conftest import DATA, require_shared
from replay.api import replay
from wire_decoder import decode_et

# (ET pattern, Kineto pattern) relative to the shared traces folder, or to tests/data with "data:"
CONVERSIONS = {
    "hta/trace_filter_sampled (2 ranks)": (None, "hta/trace_filter_sampled_rank-{rank}.json.gz"),
    "hta/simple_add (ET+Kineto)": ("hta/execution_trace_benchmark_simple_add_et.json.gz",
                                   "hta/execution_trace_benchmark_simple_add_trace.json.gz"),
    "param/linear (ET+Kineto)": ("param/linear_et.json.gz", "param/linear_kineto.json.gz"),
    "cpu_ddp (2 ranks, ET+Kineto)": ("data:cpu_ddp/host.{rank}.json.gz", "data:cpu_ddp/device.{rank}.json.gz"),
    "ddp4/late (4 ranks, ET+Kineto)": ("data:ddp4/late/host.{rank}.json.gz", "data:ddp4/late/device.{rank}.json.gz"),
}


def _path(rel: str | None) -> str | None:
    if rel is None:
        return None
    if rel.startswith("data:"):
        return str(DATA / rel[5:])
    folder, name = rel.split("/", 1)
    return str(require_shared("traces", folder) / name)


def _resource_of(node: dict) -> tuple:
    a = node["attrs"]
    if a.get("is_cpu_op", False):
        return ("cpu", a.get("pid", 0), a.get("tid", 0))
    return ("gpu", a.get("device", 0), a.get("stream", a.get("tid", 0)))


def _encloses(parent: dict, a: int, i: int) -> bool:
    j = parent.get(i)
    while j is not None:
        if j == a:
            return True
        j = parent.get(j)
    return False


def _unordered_pairs(nodes: list[dict]) -> list[tuple[int, int]]:
    """(previous, node) id pairs on one thread/stream where the node does not depend on the previous one
    (the previous one that does not enclose it) directly or transitively through data deps."""
    deps = {n["id"]: n["data_deps"] for n in nodes}
    parent = {n["id"]: (n["ctrl_deps"] or [None])[0] for n in nodes}
    by_res: dict[tuple, list[int]] = defaultdict(list)
    for n in nodes:
        by_res[_resource_of(n)].append(n["id"])
    bad = []
    for ids in by_res.values():
        for k, cur in enumerate(ids[1:], 1):
            prev = ids[k - 1]
            # an op nested in the one before it is ordered by its ctrl dep (the call stack); it must
            # follow what came before its enclosing ops, so check against the last op that does not
            # enclose it (a finish-based consumer would wait forever on a data dep to its own parent)
            j = k - 1
            while j >= 0 and _encloses(parent, ids[j], cur):
                j -= 1
            if j < 0:
                continue
            prev = ids[j]
            if prev in deps[cur]:
                continue
            seen, todo = {cur}, list(deps[cur])
            while todo and prev not in seen:
                d = todo.pop()
                if d not in seen:
                    seen.add(d)
                    todo.extend(deps.get(d, ()))
            if prev not in seen:
                bad.append((prev, cur))
    return bad


@pytest.fixture(scope="module", params=list(CONVERSIONS), ids=list(CONVERSIONS))
def converted(request, tmp_path_factory):
    et, kineto = CONVERSIONS[request.param]
    out = tmp_path_factory.mktemp("order") / "job"
    convert(_path(et), _path(kineto), out)
    files = sorted(out.parent.glob("job.*.et"))
    assert files
    return request.param, out, files, [decode_et(f) for f in files]


def test_every_thread_and_stream_op_depends_on_the_previous_one(converted):
    _, _, files, decoded = converted
    for f, (_, nodes) in zip(files, decoded):
        assert _unordered_pairs(nodes) == [], f.name
        # the added deps are counted, so Chakra's readers see plain data deps and ours can drop them
        assert any(n["attrs"].get("lumos_order_deps") for n in nodes)


def test_linked_host_ops_keep_the_execution_trace_ids(converted):
    name, _, _, decoded = converted
    if "ET+Kineto" not in name:
        pytest.skip("Kineto-only conversion: no Execution Trace to take ids from")
    metadata, nodes = decoded[0]
    linked = [n for n in nodes if "et_id" in n["attrs"]]
    assert linked and all("scope" in n["attrs"] for n in linked)
    if '"key": "rf_id"' in metadata["attrs"].get("link", ""):  # linked by record-function id: it stays
        assert all("rf_id" in n["attrs"] for n in linked)
    if name.startswith(("cpu_ddp", "ddp4")):  # DDP training: autograd ops name their forward op
        backward = [n for n in linked if "fw_parent" in n["attrs"]]
        assert backward and all("fw_tid" in n["attrs"] for n in backward)


def test_replay_of_the_written_file_is_the_replay_of_the_graph(converted):
    """Multi-rank sets: the replay of the `.et` files equals the replay of the graphs converted in memory."""
    from chakra_schema.inputs import load_graphs

    name, out, files, _ = converted
    if len(files) < 2:
        pytest.skip("one rank: covered by the round trips of tests/test_et_format.py")
    et, kineto = CONVERSIONS[name]
    in_memory = load_graphs([], et_pattern=_path(et), kineto_pattern=_path(kineto))
    from_file = read_graphs(str(out))
    for g, h in zip(in_memory, from_file):
        assert (g.dep_ptr == h.dep_ptr).all() and (g.dep_src == h.dep_src).all() and (g.dep_kind == h.dep_kind).all()
    a = replay(in_memory, critical_path=False)
    b = replay(from_file, critical_path=False)
    assert (a.run.start == b.run.start).all() and (a.run.end == b.run.end).all()
