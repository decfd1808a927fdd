"""Collectives in flight at the same time share links (replay.fabric.SharedLinkFabric): in model
timing, in trace translation to other hardware, and in generated workloads."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chakra_schema.graph import CommType, EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
from conftest import ROOT
from replay.api import replay
from replay.fabric import IdealFabric
from replay.hardware.network import NetworkModel
from replay.model_timing import ModelTiming

GiB = 1 << 30


def _collectives_graph(rank: int, world: int, colls: list[tuple[str, CommType, int, list[int]]]):
    """One rank: each collective (pg name, type, bytes, group) alone on its own GPU stream, all at t=0."""
    b = GraphBuilder(rank, world)
    for k, (pg, ctype, size, group) in enumerate(colls):
        s = b.resource(ResourceKind.GPU_STREAM, 0, 20 + k)
        b.add_node(f"nccl:{ctype.name.lower()}", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, s, 0.0, 1.0,
                   attrs={"comm_type": int(ctype), "comm_size": size, "pg_name": pg, "pg_ranks": group})
    return b.build()


class _Ideal(ModelTiming):
    def fabric(self):
        return IdealFabric()


def _ends(graphs, timing):
    res = replay(graphs, timing, critical_path=False)
    return res.run.end[: len(graphs[0])].tolist(), res


def test_two_overlapping_all_reduces_on_one_node_take_longer_than_one():
    world = list(range(8))
    one = [_collectives_graph(r, 8, [("a", CommType.ALL_REDUCE, GiB, world)]) for r in world]
    two = [_collectives_graph(r, 8, [("a", CommType.ALL_REDUCE, GiB, world), ("b", CommType.ALL_REDUCE, GiB, world)])
           for r in world]
    timing = ModelTiming("h100-sxm")
    (t1,), _ = _ends(one, timing)
    (a, b), res = _ends(two, timing)
    assert t1 == pytest.approx(NetworkModel("h100-sxm").collective_us(CommType.ALL_REDUCE, GiB, world))
    # the same NVLink ports carry both: each runs at half speed, both end at twice the time alone
    assert a == pytest.approx(2 * t1, rel=1e-3) and b == pytest.approx(2 * t1, rel=1e-3)
    assert res.run.contention["stretched"] == 2
    # without a shared fabric they would not see each other
    (a0, b0), _ = _ends(two, _Ideal("h100-sxm"))
    assert a0 == pytest.approx(t1) and b0 == pytest.approx(t1)


def _one_gpu_nodes(tmp_path) -> str:
    """H100 nodes of one GPU and one NIC: every group of ranks talks over the NICs."""
    f = tmp_path / "one_gpu_nodes.toml"
    f.write_text('name = "h100-1gpu"\nextends = "h100-sxm"\n[node]\ngpus_per_node = 1\nnvls = false\n'
                 '[network]\nnics_per_node = 1\n')
    return str(f)


def test_tp_and_dp_collectives_on_one_nic_share_it_by_half(tmp_path):
    """Rank 0's TP group {0,1} and DP group {0,2} both leave through node 0's only NIC: while both are
    in flight each gets half of it, so with alone times a < b they end at 2a and a + b."""
    hw = _one_gpu_nodes(tmp_path)
    colls = [("tp:0", CommType.ALL_GATHER, GiB // 4, [0, 1]), ("dp:0", CommType.ALL_REDUCE, GiB, [0, 2])]
    g = _collectives_graph(0, 4, colls)
    net = NetworkModel(hw)
    a = net.collective_us(CommType.ALL_GATHER, GiB // 4, [0, 1])
    b = net.collective_us(CommType.ALL_REDUCE, GiB, [0, 2])
    assert a < b
    (tp_end, dp_end), res = _ends([g], ModelTiming(hw))
    assert tp_end == pytest.approx(2 * a, rel=1e-3)
    assert dp_end == pytest.approx(a + b, rel=1e-3)
    assert set(res.run.contention["max_stretch_by_kind"]) == {"tp", "dp"}


def test_generated_tp_and_dp_traffic_slow_each_other_on_a_shared_nic(tmp_path):
    from estimators.model_config import model_from_dict
    from estimators.parallelism.plan import ParallelPlan
    from estimators.parallelism.workload import generate

    hw = _one_gpu_nodes(tmp_path)
    model = model_from_dict(dict(name="tiny", layers=2, hidden=1024, heads=8, ffn=4096, vocab=8000))
    plan = ParallelPlan(tp=2, dp=2, seq_len=1024, global_batch=4)
    graphs = generate(model, plan, ranks="symmetric", gpus_per_node=1)
    shared = replay(graphs, ModelTiming(hw), critical_path=False)
    alone = replay(graphs, _Ideal(hw), critical_path=False)
    c = shared.run.contention
    # the DP gradient all-reduces overlap the backward's TP collectives on the one NIC
    assert {"tp", "dp"} <= set(c["max_stretch_by_kind"])
    # three streams reach the NIC (TP, DP gradient reduce, DP parameter gather): a transfer never gets
    # less than a third of it
    assert all(1.0 < s <= 3.0 + 1e-6 for s in c["max_stretch_by_kind"].values())
    assert c["max_stretch"] > 1.2
    assert shared.step_time_us > alone.step_time_us


def test_translated_trace_timing_uses_the_shared_fabric():
    from replay.fabric import SharedLinkFabric
    from replay.model_timing import TranslatedTiming

    assert isinstance(TranslatedTiming("a100-sxm", "h100-sxm").fabric(), SharedLinkFabric)
    from replay.trace_timing import TraceTiming
    assert not hasattr(TraceTiming(), "fabric")  # recorded collectives already hold their contention


def test_bench_collective_concurrent_shows_the_slowdown():
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "bench", "collective", "--op", "all_reduce",
                        "--size", "1GiB", "--gpus", "8", "--concurrent", "2", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["concurrent"] == 2
    assert out["concurrent_time_us"] == pytest.approx(2 * out["time_us"], rel=0.01)
    assert out["slowdown"] == pytest.approx(2.0, rel=0.01)


def test_link_sharing_never_stretches_a_stream_of_sends_past_its_share():
    """Llama 3 8B, TP8 CP8 ZeRO-3 on 64 H100: the ring-attention sends of a layer run back to back on one
    stream next to the parameter all-gathers on the same NICs. Sharing may slow the step by what the
    links' shares allow; it once let the sends pile up at their uncontended start times (a 278x stretch,
    a 473 s step against 40 s without sharing)."""
    from estimators.model_config import load_model
    from estimators.parallelism.plan import ParallelPlan
    from estimators.parallelism.workload import generate

    hw = "h100-sxm"
    plan = ParallelPlan(tp=8, cp=8, dp=1, seq_len=8192, global_batch=8, recompute="full", zero=3)
    graphs = generate(load_model("llama3-8b"), plan, ranks="symmetric", gpus_per_node=8)
    shared = replay(graphs, ModelTiming(hw), critical_path=False)
    alone = replay(graphs, _Ideal(hw), critical_path=False)
    c = shared.run.contention
    assert c["max_stretch"] <= 4.0, c
    assert alone.step_time_us < shared.step_time_us < 1.5 * alone.step_time_us


def test_a_transfer_slowed_by_sharing_counts_as_communication_not_idle(tmp_path):
    """The TP all-gather (a alone) and DP all-reduce (b alone) of one rank share its only NIC: the TP one
    moves data from 0 to 2a, the DP one from 0 to a + b (SimulatedRun.transfer_us). The breakdown charges
    [0, 2a] to TP (first in the charging order), the rest of the DP transfer, b - a, to DP, and nothing to
    idle: the stretch is transfer time, not a wait for peers."""
    from estimators.parallelism.evaluate import rank_breakdown
    from estimators.parallelism.workload import DP_RS, STREAMS, TP
    hw = _one_gpu_nodes(tmp_path)
    b_ = GraphBuilder(0, 4)
    for slot, pg, ctype, size, group in ((TP, "tp:0", CommType.ALL_GATHER, GiB // 4, [0, 1]),
                                         (DP_RS, "dp:0", CommType.ALL_REDUCE, GiB, [0, 2])):
        s = b_.resource(ResourceKind.GPU_STREAM, 0, STREAMS[slot][0])   # the generator's TP / DP streams
        b_.add_node(f"nccl:{ctype.name.lower()}", NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE, s, 0.0, 1.0,
                    attrs={"comm_type": int(ctype), "comm_size": size, "pg_name": pg, "pg_ranks": group})
    g = b_.build()
    net = NetworkModel(hw)
    a = net.collective_us(CommType.ALL_GATHER, GiB // 4, [0, 1])
    b = net.collective_us(CommType.ALL_REDUCE, GiB, [0, 2])
    (tp_end, dp_end), res = _ends([g], ModelTiming(hw))
    run = res.run
    assert run.transfer_us[:2].tolist() == pytest.approx([2 * a, a + b], rel=1e-3)
    assert run.durations[:2].tolist() == pytest.approx([a, b], rel=1e-3)   # the time alone stays recorded
    bd = rank_breakdown(g, run.start[:2], run.end[:2], run.transfer_us[:2], 0.0, dp_end)
    assert bd.exposed_tp_comm_us == pytest.approx(2 * a, rel=1e-3)
    assert bd.exposed_dp_comm_us == pytest.approx(b - a, rel=1e-3)
    assert bd.idle_us == pytest.approx(0.0, abs=1e-6 * b)
