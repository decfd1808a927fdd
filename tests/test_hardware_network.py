"""Network model: nccl-tests bus bandwidths on H100, bytes per rank of every algorithm, link sharing,
algorithm selection, topologies."""
from __future__ import annotations

import numpy as np
import pytest

from chakra_schema.graph import CommType
from replay.hardware import (ALGORITHMS, NetworkModel, Topology, bus_factor, flow_completion_times, get_hardware,
                             max_min_fair_share)
from replay.hardware.network import DirectAllToAll, DoubleBinaryTree, Hierarchical, NVLS, PairwiseAllToAll, Ring

GiB = 1 << 30


@pytest.fixture(scope="module")
def h100():
    return NetworkModel("h100-sxm")


# ------------------------------------------------------------------ acceptance figures (hardware.md)
@pytest.mark.parametrize("op", [CommType.ALL_GATHER, CommType.REDUCE_SCATTER])
def test_h100_8gpu_allgather_reducescatter_busbw_370(h100, op):
    e = h100.estimate(op, GiB, range(8))
    assert e.busbw_gbps == pytest.approx(370, rel=0.10)
    assert e.algorithm == "ring"


def test_h100_8gpu_allreduce_busbw_480_with_nvls(h100):
    e = h100.estimate(CommType.ALL_REDUCE, GiB, range(8))
    assert e.algorithm == "nvls"
    assert e.busbw_gbps == pytest.approx(480, rel=0.10)
    ring = h100.estimate(CommType.ALL_REDUCE, GiB, range(8), algorithm="ring")
    assert ring.busbw_gbps == pytest.approx(370, rel=0.10)  # without SHARP: the ring figure


def test_h100_64gpu_allreduce_busbw_300_to_360(h100):
    e = h100.estimate(CommType.ALL_REDUCE, GiB, range(64))
    assert 300 <= e.busbw_gbps <= 360


def test_h100_8_byte_allreduce_is_latency_bound(h100):
    t = h100.collective_us(CommType.ALL_REDUCE, 8, range(8))
    assert 0 < t < 50
    # latency-bound: 1000x the bytes barely changes the time
    assert h100.collective_us(CommType.ALL_REDUCE, 8000, range(8)) < 1.5 * t


def test_h800_nvlink_limit_gives_about_215(h100):
    e = NetworkModel("h800").estimate(CommType.ALL_REDUCE, GiB, range(8))
    assert e.busbw_gbps == pytest.approx(215, rel=0.10)


def test_bus_factors_follow_nccl_tests():
    assert bus_factor(CommType.ALL_REDUCE, 8) == pytest.approx(14 / 8)
    for op in (CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.ALL_TO_ALL):
        assert bus_factor(op, 8) == pytest.approx(7 / 8)
    assert bus_factor(CommType.BROADCAST, 8) == 1.0 and bus_factor(CommType.REDUCE, 8) == 1.0


# ------------------------------------------------------------------ bytes each rank sends
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_ring_bytes_per_rank(n):
    S = 1_000_000.0
    r = list(range(n))
    assert Ring().bytes_sent_per_rank(CommType.ALL_REDUCE, S, r) == pytest.approx([2 * (n - 1) / n * S] * n)
    assert Ring().bytes_sent_per_rank(CommType.ALL_GATHER, S, r) == pytest.approx([(n - 1) / n * S] * n)
    assert Ring().bytes_sent_per_rank(CommType.REDUCE_SCATTER, S, r) == pytest.approx([(n - 1) / n * S] * n)
    assert sum(Ring().bytes_sent_per_rank(CommType.BROADCAST, S, r)) == pytest.approx((n - 1) * S)


@pytest.mark.parametrize("n", [2, 8, 64])
def test_direct_all_to_all_bytes_per_rank(n):
    S = 4096.0 * n
    sent = DirectAllToAll().bytes_sent_per_rank(CommType.ALL_TO_ALL, S, list(range(n)))
    assert sent == pytest.approx([(n - 1) / n * S] * n)
    assert PairwiseAllToAll().bytes_sent_per_rank(CommType.ALL_TO_ALL, S, list(range(n))) == pytest.approx(sent)


def test_nvls_bytes_per_rank():
    S = 8e6
    assert NVLS().bytes_sent_per_rank(CommType.ALL_REDUCE, S, list(range(8))) == pytest.approx([S * 9 / 8] * 8)


def test_tree_bytes_per_rank():
    topo = Topology(get_hardware("h100-sxm"))
    S = 16e6
    # one GPU per node (ranks 0, 8, 16, 24 are on nodes 0..3): each tree carries S/2, up and down each edge
    ranks = [0, 8, 16, 24]
    sent = DoubleBinaryTree().bytes_sent_per_rank(CommType.ALL_REDUCE, S, ranks, topo)
    edges = 2 * (len(ranks) - 1)              # (n-1) edges per tree, two trees
    assert sum(sent) == pytest.approx(edges * 2 * S / 2)   # each edge carries S/2 up and S/2 down
    assert max(sent) <= 2 * S and min(sent) >= S / 2
    # two nodes of 8: chain inside each node carries the data both ways too
    ranks = list(range(16))
    sent = DoubleBinaryTree().bytes_sent_per_rank(CommType.ALL_REDUCE, S, ranks, topo)
    assert sum(sent) == pytest.approx((2 * 7 * 2 + 2) * 2 * S / 2)   # per tree: 14 chain edges + 1 inter edge
    # per channel (8, one per rail) and tree (2), S/16 per edge and direction: a mid-chain GPU sends
    # up + down (S/4 over both trees), the chain's head down + across (S/4), its tail up only (S/8);
    # each GPU is head of one channel, tail of one, middle of six -> 6/4 + 1/4 + 1/8 = 1.875 S
    assert sent == pytest.approx([1.875 * S] * 16)


def test_hierarchical_bytes_per_rank():
    topo = Topology(get_hardware("h100-sxm"))
    S, k, nodes = 64e6, 8, 4
    ranks = list(range(k * nodes))
    ar = Hierarchical().bytes_sent_per_rank(CommType.ALL_REDUCE, S, ranks, topo)
    expect = (k - 1) / k * S + 2 * (nodes - 1) / nodes * S / k + (k - 1) / k * S
    assert ar == pytest.approx([expect] * len(ranks))
    ag = Hierarchical().bytes_sent_per_rank(CommType.ALL_GATHER, S, ranks, topo)
    assert ag == pytest.approx([(nodes - 1) / nodes * S / k + (k - 1) / k * S] * len(ranks))
    # a hierarchical all-gather sends the same total as a flat ring, over fewer network hops
    assert ag[0] == pytest.approx((len(ranks) - 1) / len(ranks) * S)


# ------------------------------------------------------------------ sharing of links
def test_max_min_fair_share_classic_example():
    cap = {"a": 10.0, "b": 4.0}
    # f0 crosses a and b, f1 only a, f2 only b: b is the bottleneck (4/2 = 2 each), f1 gets the rest of a
    rates = max_min_fair_share([("a", "b"), ("a",), ("b",)], cap)
    assert rates.tolist() == pytest.approx([2.0, 8.0, 2.0])


def test_flows_on_the_same_link_share_and_then_speed_up():
    cap = {"l": 10.0}
    done = flow_completion_times([("l",), ("l",)], [10.0, 30.0], cap)
    # both at 5 until the first finishes at t=2, then the second gets 10 for the remaining 20
    assert done.tolist() == pytest.approx([2.0, 4.0])


def test_eight_gpus_of_a_node_share_nics_per_rail():
    topo = Topology(get_hardware("v100-sxm2"))  # 4 NICs for 8 GPUs: two GPUs per NIC
    alone = topo.bandwidth_time([(0, 8, 1e9)])
    shared = topo.bandwidth_time([(0, 8, 1e9), (1, 9, 1e9)])
    assert shared == pytest.approx(2 * alone, rel=1e-6)
    other_rail = topo.bandwidth_time([(0, 8, 1e9), (2, 10, 1e9)])
    assert other_rail == pytest.approx(alone, rel=1e-6)


def test_concurrent_collectives_divide_bandwidth(h100):
    one = h100.concurrent_us([(CommType.ALL_GATHER, GiB, list(range(8)))])[0]
    two = h100.concurrent_us([(CommType.ALL_GATHER, GiB, list(range(8))),
                              (CommType.ALL_GATHER, GiB, list(range(8)))])
    assert two[0] == pytest.approx(2 * one, rel=0.02)
    disjoint = h100.concurrent_us([(CommType.ALL_GATHER, GiB, list(range(8))),
                                   (CommType.ALL_GATHER, GiB, list(range(8, 16)))])
    assert disjoint[0] == pytest.approx(one)


def test_oversubscribed_spine_slows_cross_leaf_traffic(tmp_path):
    f = tmp_path / "over.toml"
    f.write_text('name = "over"\nextends = "h100-sxm"\n[network]\noversubscription = 4.0\nnodes_per_leaf = 2\n')
    base = NetworkModel("h100-sxm")
    over = NetworkModel(str(f))
    ranks = list(range(32))  # 4 nodes: two leaves of 2 nodes with nodes_per_leaf = 2
    a = base.collective_us(CommType.ALL_TO_ALL, GiB, ranks)
    b = over.collective_us(CommType.ALL_TO_ALL, GiB, ranks)
    assert b > 1.3 * a


# ------------------------------------------------------------------ selection and topologies
def test_selection_like_nccl(h100):
    multi = list(range(64))
    assert h100.estimate(CommType.ALL_REDUCE, 64 * 1024, multi).algorithm == "tree"
    assert h100.estimate(CommType.ALL_REDUCE, GiB, multi).algorithm == "ring"
    assert h100.estimate(CommType.ALL_REDUCE, GiB, range(8)).algorithm == "nvls"
    assert h100.estimate(CommType.ALL_REDUCE, 8, range(8)).time_us < h100.estimate(
        CommType.ALL_REDUCE, 8, multi).time_us
    a100 = NetworkModel("a100-sxm")
    assert a100.estimate(CommType.ALL_REDUCE, GiB, range(8)).algorithm == "ring"   # no NVLS before Hopper
    assert "nvls" not in a100.algorithms_for(CommType.ALL_REDUCE, list(range(8)))
    assert "nvls" not in h100.algorithms_for(CommType.ALL_REDUCE, multi)
    assert "tree" not in h100.algorithms_for(CommType.ALL_REDUCE, list(range(8)))


def test_small_messages_pick_low_latency_protocol(h100):
    assert h100.estimate(CommType.ALL_GATHER, 1024, range(8)).protocol == "LL"
    assert h100.estimate(CommType.ALL_GATHER, GiB, range(8)).protocol == "Simple"


def test_every_algorithm_is_a_registered_class():
    assert {"ring", "tree", "nvls", "direct", "pairwise", "hierarchical"} <= set(ALGORITHMS)


def test_forced_algorithm_and_unsupported_one(h100):
    t_ring = h100.collective_us(CommType.ALL_REDUCE, GiB, range(16), algorithm="ring")
    t_hier = h100.collective_us(CommType.ALL_REDUCE, GiB, range(16), algorithm="hierarchical")
    assert t_ring > 0 and t_hier > 0 and t_ring != t_hier
    with pytest.raises(ValueError, match="does not support"):
        h100.collective_us(CommType.ALL_REDUCE, GiB, range(16), algorithm="nvls")
    with pytest.raises(ValueError, match="unknown collective algorithm"):
        h100.collective_us(CommType.ALL_REDUCE, GiB, range(8), algorithm="butterfly")


def test_v100_hybrid_cube_mesh():
    net = NetworkModel("v100-sxm2")
    topo = net.topology
    # GPU 0 and 5 share no NVLink on a DGX-1: the pair goes through PCIe and is slower than 0 <-> 4
    assert ("nvl", 0, 0, 4) in topo.path(0, 4)
    assert any(link[0] == "pcie_tx" for link in topo.path(0, 5))
    assert net.p2p_us(GiB, 0, 5) > 2 * net.p2p_us(GiB, 0, 4)
    # the 8-GPU ring uses several NVLink rings; bus bandwidth stays below the 6-link per-GPU total
    e = net.estimate(CommType.ALL_REDUCE, GiB, range(8))
    assert e.algorithm == "ring"
    hw = get_hardware("v100-sxm2")
    assert 3 * 25 * hw.node.nvlink_efficiency < e.busbw_gbps <= 150


def test_p2p_intra_node_faster_than_inter_node(h100):
    assert h100.p2p_us(GiB, 0, 1) < h100.p2p_us(GiB, 0, 8)
    assert h100.p2p_us(GiB, 0, 8) == pytest.approx(GiB / (get_hardware("h100-sxm").nic_gbs * 1e3) + 10.0, rel=0.01)
    # cross-rail with PXN: NVLink hop to the right rail first
    path = h100.topology.path(0, 9)
    assert path[0] == ("nvl_tx", 0, 0) and ("nic_tx", 0, 1) in path


def test_deterministic_and_cached():
    a = NetworkModel("h100-sxm").estimate(CommType.ALL_REDUCE, 123456789, range(32))
    b = NetworkModel("h100-sxm").estimate(CommType.ALL_REDUCE, 123456789, range(32))
    assert a == b


def test_degenerate_groups(h100):
    assert h100.collective_us(CommType.ALL_REDUCE, GiB, [3]) == 0.0
    assert h100.collective_us(CommType.ALL_REDUCE, 0, range(8)) == 0.0
    assert h100.collective_us(CommType.BARRIER, 0, range(8)) > 0.0


def test_transfers_of_one_stream_queue_behind_each_other_when_sharing_slows_them():
    """Ten 10 us sends back to back on one stream next to a long transfer on the same link: each gets
    half the link (20 us) and the next begins when it ends -- stream order -- instead of all piling up
    at the times an uncontended pass gave them (hundreds of CP sends stretched 278x each, hiding the GPU)."""
    from replay.hardware.network import shared_transfer_times
    link = ("nic_tx", 0, 0)
    paths = [[(link,)]] + [[(link,)] for _ in range(10)]
    starts = [0.0] + [10.0 * k for k in range(10)]
    alone = [1000.0] + [10.0] * 10
    after = [-1, -1] + list(range(1, 10))
    begin, end = shared_transfer_times(starts, alone, paths, {link: 1.0}, after)
    assert (end[1:] - begin[1:]).tolist() == pytest.approx([20.0] * 10)
    assert end[10] == pytest.approx(200.0) and begin[5] == pytest.approx(80.0)
    piled = shared_transfer_times(starts, alone, paths, {link: 1.0})[1]
    assert max(piled[1:] - np.asarray(starts[1:])) > 2 * 20.0   # without stream order they pile up
