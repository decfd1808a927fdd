"""Replay of real traces: accuracy suites, synchronization semantics, cross-rank coupling."""
from __future__ import annotations


import numpy as np
import pytest

from chakra_schema.graph import EdgeKind, OpKind
from conftest import DATA, ROOT, require_shared
from replay.api import replay
from replay.trace_timing import TraceTiming


def _kineto_graph(path):
    from chakra_schema.pytorch.kineto import load_kineto
    from chakra_schema.pytorch.kineto_graph import kineto_to_graph

    return kineto_to_graph(load_kineto(str(path)))


def test_trace_replay_suite_meets_issue_tolerances():
    """Every case of tests/accuracy/trace_replay.toml: each step within 5%, mean <= 2%."""
    require_shared("traces", "hta")
    from lumos_sim.check import load_suite, run_case

    name, cases = load_suite(ROOT / "tests" / "accuracy" / "trace_replay.toml")
    assert len(cases) >= 9
    failures = []
    for case in cases:
        res = run_case(name, case)
        print(f"{case.name}: {len(res.steps)} steps, max {res.max_error}, mean {res.mean_error}, {res.error or ''}")
        assert case.tolerance <= 0.05 and case.mean_tolerance <= 0.02  # the issue's bounds, never loosened
        if not res.passed:
            failures.append((case.name, res.error, res.max_error))
    assert not failures


def test_removing_cross_stream_and_sync_edges_changes_the_multi_stream_prediction():
    path = require_shared("traces", "hta", "critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz")
    g = _kineto_graph(path)
    kinds = set(g.dep_kind.tolist())
    assert EdgeKind.CROSS_STREAM in kinds and EdgeKind.SYNC in kinds
    span = float((g.start_us + g.duration_us).max() - g.start_us.min())
    kept = replay([g], TraceTiming(), critical_path=False).steps[0].predicted_us
    assert kept == pytest.approx(span, rel=1e-3)  # with the sync edges the trace is reproduced

    slow = 200.0

    class SlowGpu(TraceTiming):
        # the same program on a GPU 200x slower: the streams now run long after the CPU issued the work
        def node_durations(self, graph):
            d = super().node_durations(graph)
            d[graph.is_gpu()] *= slow
            return d

    run_sync = replay([g], SlowGpu(), critical_path=False)
    run_free = replay([g.without_edges([EdgeKind.CROSS_STREAM, EdgeKind.SYNC])], SlowGpu(), critical_path=False)
    # the cudaStreamWaitEvent edge holds the waiting stream until the recording stream's kernel is done
    (src, dst) = [(s_, d_) for s_, d_, k in g.edges() if k == EdgeKind.CROSS_STREAM][0]
    held = run_sync.run.start[dst] - run_free.run.start[dst]
    # (plus the few microseconds of launch latency the trace recorded for that op)
    assert held == pytest.approx(run_sync.run.end[src] - run_free.run.start[dst], abs=10.0)
    assert held > 1000.0
    # and the final cudaDeviceSynchronize makes the CPU wait for all of it
    assert run_sync.steps[0].predicted_us > run_free.steps[0].predicted_us + 0.9 * held
    assert run_sync.steps[0].predicted_us > kept


def test_doubling_one_ranks_compute_lengthens_the_other_ranks_step_in_the_gloo_ddp_set():
    """Real 2-rank gloo DDP traces: rank 0's ops take twice as long; rank 1 did not change but waits for
    rank 0 at every all-reduce, so its steps lengthen by that wait."""
    from chakra_schema.pytorch.converter import RankInputs, convert_rank

    graphs = [convert_rank(RankInputs(et_path=str(DATA / "cpu_ddp" / f"host.{r}.json.gz"),
                                      kineto_path=str(DATA / "cpu_ddp" / f"device.{r}.json.gz")))
              for r in (0, 1)]
    base = replay(graphs, critical_path=False)

    class SlowRank0(TraceTiming):
        def node_durations(self, graph):
            d = super().node_durations(graph)
            if graph.rank == 0:
                d[graph.kind == OpKind.CPU_OP] *= 2.0
            return d

    slow = replay(graphs, SlowRank0(), critical_path=False)
    b1 = {s.name: s.predicted_us for s in base.steps if s.rank == 1}
    s1 = {s.name: s.predicted_us for s in slow.steps if s.rank == 1}
    grew = [s1[k] - b1[k] for k in b1]
    assert all(x > 0 for x in grew), grew
    # the wait is real: rank 1's own work did not change, so its growth is time spent waiting at a collective
    assert np.mean(grew) > 0.05 * np.mean(list(b1.values()))
