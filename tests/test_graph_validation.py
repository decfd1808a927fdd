"""ExecutionGraph.validate / find_cycle / topological_order on hand-made defects, a big random DAG and
a real Chakra converter output."""
from __future__ import annotations

import tarfile
import time

import numpy as np
import pytest

from chakra_schema.graph import EdgeKind, GraphBuilder, GraphError, NodeType, OpKind, ResourceKind
from chakra_schema.graph_io import read_graph
from conftest import require_shared


def _chain(n: int, ids: list[int] | None = None) -> GraphBuilder:
    b = GraphBuilder()
    r = b.resource(ResourceKind.CPU_THREAD, 0, 0)
    for i in range(n):
        b.add_node(f"op{i}", NodeType.COMP_NODE, OpKind.CPU_OP, r, float(i), 1.0,
                   node_id=None if ids is None else ids[i])
        if i:
            b.add_dep(i - 1, i)
    return b


def test_valid_graph_has_no_problems():
    g = _chain(10).build()
    assert g.validate() == []
    assert g.find_cycle() == []
    assert g.topological_order().tolist() == list(range(10))
    g.check()


def test_duplicate_ids_are_reported():
    g = _chain(5, ids=[1, 2, 7, 7, 9]).build()
    problems = g.validate()
    assert len(problems) == 1 and "duplicate node ids" in problems[0] and "[7]" in problems[0]
    with pytest.raises(GraphError, match="duplicate"):
        g.check("t.et")


def test_dangling_deps_and_parents_are_reported():
    b = _chain(4)
    b.add_dep(42, 2)  # no node 42
    problems = b.build().validate()
    assert any("dangling data deps" in p and "42" in p for p in problems)

    b = _chain(4)
    b.add_node("orphan", NodeType.COMP_NODE, OpKind.CPU_OP, 0, parent=99, node_id=500)
    problems = b.build().validate()
    assert any("dangling ctrl deps" in p and "500" in p for p in problems)


def test_cycle_is_reported_with_its_node_ids():
    b = _chain(6, ids=[10, 20, 30, 40, 50, 60])
    # 20 -> 30 -> 40 are chained; closing 40 -> 20 makes the cycle 20, 30, 40
    b.add_dep(3, 1, EdgeKind.SYNC)
    g = b.build()
    assert g.topological_order() is None
    cyc = g.find_cycle()
    assert cyc[0] == cyc[-1] and sorted(cyc[:-1]) == [1, 2, 3]
    # consecutive entries are real edges in execution order (each depends on the one before)
    for a, c in zip(cyc, cyc[1:]):
        assert a in g.deps_of(c).tolist()
    problems = g.validate()
    msg = [p for p in problems if p.startswith("cycle")]
    assert len(msg) == 1
    assert {int(x) for x in msg[0].split("through node ids ")[1].split(" -> ")} == {20, 30, 40}
    with pytest.raises(GraphError, match="cycle"):
        g.check()


def _random_dag(n: int, edges_per_node: int, seed: int):
    """Random DAG over n nodes whose node indices are a random permutation of a hidden order."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)          # perm[k] = node index at hidden rank k
    b = GraphBuilder()
    r = b.resource(ResourceKind.GPU_STREAM, 0, 0)
    for i in range(n):
        b.add_node("k", NodeType.COMP_NODE, OpKind.KERNEL, r)
    dst_rank = rng.integers(1, n, size=n * edges_per_node)
    src_rank = (rng.random(dst_rank.size) * dst_rank).astype(np.int64)  # strictly earlier in hidden order
    for s, d in zip(perm[src_rank].tolist(), perm[dst_rank].tolist()):
        b.add_dep(s, d)
    return b


def test_topological_order_of_a_big_random_dag():
    n = 200_000
    g = _random_dag(n, 3, seed=1).build()
    assert g.num_edges > 500_000
    t = time.perf_counter()
    order = g.topological_order()
    elapsed = time.perf_counter() - t
    assert order is not None
    assert np.array_equal(np.sort(order), np.arange(n))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    dst = np.repeat(np.arange(n), np.diff(g.dep_ptr))
    assert (pos[g.dep_src] < pos[dst]).all()
    assert elapsed < 10.0, f"topological order of {n} nodes took {elapsed:.1f}s"
    assert g.validate() == []


def test_one_back_edge_in_a_big_dag_is_found():
    n = 50_000
    b = _random_dag(n, 2, seed=2)
    g0 = b.build()
    order = g0.topological_order()
    # an edge from the last node in topological order back to a node with a path to it closes a cycle
    last = int(order[-1])
    first_dep = int(g0.deps_of(last)[0])
    b.add_dep(last, first_dep)
    g = b.build()
    assert g.topological_order() is None
    cyc = g.find_cycle()
    assert cyc and cyc[0] == cyc[-1]
    for a, c in zip(cyc, cyc[1:]):
        assert a in g.deps_of(c).tolist()
    assert any(p.startswith("cycle") for p in g.validate())


def test_real_chakra_converter_output_is_valid(tmp_path):
    archive = require_shared("traces", "chakra", "feeder_tests_trace.tar.gz")
    with tarfile.open(archive) as tar:
        member = tar.getmember("tests/data/chakra.0.et")
        member.name = "chakra.0.et"
        tar.extract(member, tmp_path, filter="data")
    g = read_graph(tmp_path / "chakra.0.et")
    assert len(g) == 3664
    assert g.validate() == []  # dangling ctrl deps were dropped (and counted) by the reader
    assert g.metadata["dropped_ctrl_deps"] > 0
    order = g.topological_order()
    assert order is not None and len(order) == len(g)
