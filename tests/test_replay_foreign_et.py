"""Replay of .et sets written by other tools (ASTRA-sim microbenchmarks): no recorded timeline, no
world size in the files, collectives and hand-built send/recv rings."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import require_shared
from lumos_sim.api import load
from lumos_sim.replay_run import run_replay
from replay.hardware.network import NetworkModel
from replay.hardware.config import get_hardware
from chakra_schema.graph import CommType


@pytest.mark.parametrize("prefix,op,ranks", [
    ("all_reduce_8npus_1MB/all_reduce", CommType.ALL_REDUCE, 8),
    ("all_gather_4npus_1MB/all_gather", CommType.ALL_GATHER, 4),
    ("all_to_all_16npus_1MB/all_to_all", CommType.ALL_TO_ALL, 16),
])
def test_astra_sim_collective_set_replays_as_one_collective_of_all_its_ranks(prefix, op, ranks):
    base = require_shared("traces", "astra-sim")
    graphs = load([str(base / prefix)])
    assert [g.rank for g in graphs] == list(range(ranks))
    res = run_replay(graphs, "model", "h100-sxm")
    coll = int(graphs[0].collectives()[0])
    size = int(graphs[0].attr(coll, "comm_size"))
    expected = NetworkModel(get_hardware("h100-sxm")).collective_us(op, size, list(range(ranks)))
    assert res.step_time_us == pytest.approx(expected, rel=1e-6)
    assert all(s.measured_us is None for s in res.steps)  # nothing was recorded: nothing to compare
    assert len(res.run.rendezvous) == 1 and len(res.run.rendezvous[0]) == ranks


def test_hand_built_send_recv_ring_completes_with_eager_sends():
    """Every rank of custom_allreduce sends before it receives: with rendezvous sends this would
    deadlock; buffered (eager) sends, as MSCCL and ASTRA-sim run them, let the ring go round."""
    base = require_shared("traces", "astra-sim", "custom_ring_allreduce_8npus")
    graphs = load([str(base / "custom_allreduce")])
    res = run_replay(graphs, "model", "h100-sxm")
    times = {s.rank: s.predicted_us for s in res.steps}
    assert len(times) == 8 and min(times.values()) > 0
    # a symmetric ring: every rank finishes together
    assert max(times.values()) == pytest.approx(min(times.values()), rel=1e-6)
    # the ring is a chain of dependent steps: it cannot beat one hop per step
    g = graphs[0]
    hops = int(((g.node_type == 5) | (g.node_type == 6)).sum()) // 2
    assert res.step_time_us > hops * 1.0


def test_replay_error_is_one_line_exit_2(tmp_path):
    """A collective one rank never reaches: the CLI prints one line and exits 2."""
    from chakra_schema.graph_io import write_graph

    base = require_shared("traces", "astra-sim", "all_reduce_8npus_1MB")
    graphs = load([str(base / "all_reduce")])
    for g in graphs[:2]:
        write_graph(g, tmp_path / f"job.{g.rank}.et")
    g1 = graphs[1].without_edges([])
    g1.node_type = g1.node_type.copy()
    g1.node_type[:] = 4  # rank 1 computes where rank 0 all-reduces
    g1.kind = g1.kind.copy()
    g1.kind[:] = 7
    write_graph(g1, tmp_path / "job.1.et")
    for g in graphs[2:]:
        write_graph(g, tmp_path / f"job.{g.rank}.et")
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "replay", str(tmp_path / "job"), "--timing", "model",
                        "--hardware", "h100-sxm"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 1 never reaches all_reduce #1" in lines[0]


def test_a_generated_workload_without_durations_is_refused_by_trace_timing_with_the_way_out(tmp_path):
    """ASTRA-sim's microbenchmarks record no durations: trace timing would print 0 ms steps."""
    base = require_shared("traces", "astra-sim", "all_reduce_8npus_1MB")
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "replay", str(base / "all_reduce")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert "all_reduce.0.et" in line and "records no node durations" in line and "--timing model --hardware" in line
