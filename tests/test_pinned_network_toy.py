"""Collective times on a small round-numbered cluster, every figure counted by hand in the test.

The toy cluster (the h100-sxm-roofline preset with these fields replaced) is chosen so link rates and
latencies are round numbers and every bottleneck can be found on paper:
- 4 GPUs per node on an NVSwitch: 100 GB/s per GPU and direction at efficiency 1.0 -> 100,000 B/us;
  NVLS at efficiency 0.5. PCIe 20 GB/s at efficiency 1.0 -> 20,000 B/us.
- 2 NICs per node (GPUs 0,1 on rail 0; 2,3 on rail 1), 80 Gb/s at efficiency 1.0 -> 10,000 B/us each.
- 2 nodes per leaf switch, spine oversubscribed 4:1: 2 x 10,000 / 4 = 5,000 B/us per leaf and rail;
  a spine hop adds 0.5 us. NCCL PXN on. Tree efficiency 0.5.
- Two NCCL protocols: LL (bandwidth x 0.5, base 1 us, NVLink hop 0.25 us, network hop 1 us) and Simple
  (x 1.0, base 10 us, NVLink hop 2 us, network hop 5 us); no LL128 (the algorithms skip it).

The cost model is NCCL's (Jeaugey, "NCCL 2.0", GTC 2017; NCCL's tuning.cc): time = base latency + the
hop latencies on the pipeline's critical chain + steps x (bytes per step / bottleneck rate); a ring does
n-1 steps (all-gather, reduce-scatter) or 2(n-1) (all-reduce) of size/n per rank; links are shared
max-min fairly between the flows that cross them.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chakra_schema.graph import CommType
from replay.hardware.config import ProtocolSpec, get_hardware
from replay.hardware.network import (NetworkModel, Topology, representative_nodes, whole_nodes,
                                     _spine_crossings, _by_node)

NVL, NIC, SPINE, PCIE = 100_000.0, 10_000.0, 5_000.0, 20_000.0   # B/us
LL = ProtocolSpec("LL", 0.5, 1.0, 0.25, 1.0)
SIMPLE = ProtocolSpec("Simple", 1.0, 10.0, 2.0, 5.0)


def toy(**network) -> object:
    base = get_hardware("h100-sxm-roofline")
    net = dict(nics_per_node=2, nic_gbps=80.0, nic_efficiency=1.0, nodes_per_leaf=2, oversubscription=4.0,
               switch_latency_us=0.5, pxn=True, tree_efficiency=0.5, alltoall_efficiency=1.0)
    net.update(network)
    return dataclasses.replace(
        base, name="toy", gpu=dataclasses.replace(base.gpu, pcie_bw_gbs=20.0),
        compute=dataclasses.replace(base.compute, pcie_efficiency=1.0),
        node=dataclasses.replace(base.node, gpus_per_node=4, nvlink_bw_gbs=100.0, nvlink_efficiency=1.0,
                                 nvls=True, nvls_efficiency=0.5),
        network=dataclasses.replace(base.network, **net), protocols=(LL, SIMPLE))


@pytest.fixture(scope="module")
def model():
    return NetworkModel(toy())


@pytest.fixture(scope="module")
def topo(model):
    return model.topology


# ------------------------------------------------------------------------------------ the topology
def test_link_capacities_are_the_line_rates_times_efficiency(topo):
    assert topo.capacity(("nvl_tx", 0, 0)) == topo.capacity(("nvl_rx", 3, 2)) == NVL
    assert topo.capacity(("nic_tx", 0, 1)) == topo.capacity(("nic_rx", 1, 0)) == NIC
    assert topo.capacity(("spine_up", 0, 0)) == topo.capacity(("spine_down", 1, 1)) == SPINE
    assert topo.capacity(("pcie_tx", 0, 0)) == topo.capacity(("pcie_rx", 0, 1)) == PCIE
    with pytest.raises(KeyError):
        topo.capacity(("ethernet", 0, 0))


def test_ranks_map_to_node_local_index_rail_and_leaf(topo):
    """Rank 9 = node 2, local 1; locals 0,1 use NIC 0 and 2,3 NIC 1; nodes 0-1 under leaf 0, 2-3 leaf 1."""
    assert (topo.node_of(9), topo.local_of(9)) == (2, 1)
    assert [topo.nic_of(g) for g in range(4)] == [0, 0, 1, 1]
    assert [topo.leaf_group(n) for n in range(5)] == [0, 0, 1, 1, 2]
    assert not topo.is_mesh and topo.adjacent(0, 3)


def test_paths_cross_nvlink_nic_and_spine_as_the_rail_fat_tree_routes_them(topo):
    assert topo.path(0, 0) == ()
    assert topo.path(0, 1) == (("nvl_tx", 0, 0), ("nvl_rx", 0, 1))
    assert topo.path(0, 4) == (("nic_tx", 0, 0), ("nic_rx", 1, 0))                    # same rail, same leaf
    assert topo.path(0, 8) == (("nic_tx", 0, 0), ("spine_up", 0, 0), ("spine_down", 1, 0), ("nic_rx", 2, 0))
    # PXN: to rail 1 of node 1 through GPU 2 of node 0 (the destination's twin), no spine
    assert topo.path(0, 6) == (("nvl_tx", 0, 0), ("nvl_rx", 0, 2), ("nic_tx", 0, 1), ("nic_rx", 1, 1))
    # PXN and another leaf: the NVLink hop, then the spine on the destination's rail
    assert topo.path(1, 11) == (("nvl_tx", 0, 1), ("nvl_rx", 0, 3), ("nic_tx", 0, 1), ("spine_up", 0, 1),
                                ("spine_down", 1, 1), ("nic_rx", 2, 1))
    no_pxn = Topology(toy(pxn=False))
    assert no_pxn.path(0, 6) == (("nic_tx", 0, 0), ("spine_up", 0, 0), ("spine_down", 0, 1), ("nic_rx", 1, 1))


def test_hop_classes_and_latencies_follow_the_path(topo):
    assert topo.hop_class(5, 5) == ("self", 0)
    assert topo.hop_class(4, 7) == ("nvlink", 0)
    assert topo.hop_class(0, 4) == ("net", 0)
    assert topo.hop_class(0, 6) == ("net", 0)        # PXN: the rail is switched inside the node
    assert topo.hop_class(0, 8) == ("net", 1)
    assert topo.hop_class(4, 0) == ("net", 0)
    assert Topology(toy(pxn=False)).hop_class(0, 6) == ("net", 1)
    assert topo.hop_latency(5, 5, SIMPLE) == 0.0
    assert topo.hop_latency(4, 7, SIMPLE) == 2.0 and topo.hop_latency(4, 7, LL) == 0.25
    assert topo.hop_latency(0, 4, SIMPLE) == 5.0 and topo.hop_latency(0, 4, LL) == 1.0
    assert topo.hop_latency(0, 8, SIMPLE) == 5.5 and topo.hop_latency(0, 8, LL) == 1.5


def test_max_latency_is_the_slowest_pair_without_building_paths(topo):
    assert topo.max_latency([], [], SIMPLE) == 0.0
    assert topo.max_latency([3, 3], [3, 3], SIMPLE) == 0.0
    assert topo.max_latency([0, 1], [1, 2], SIMPLE) == 2.0
    assert topo.max_latency([0, 1], [1, 5], SIMPLE) == 5.0           # a remote pair outweighs NVLink
    assert topo.max_latency([0, 1], [6, 2], SIMPLE) == 5.0           # PXN: no spine
    assert topo.max_latency([0, 1], [4, 8], SIMPLE) == 5.5           # one pair crosses the spine
    assert topo.max_latency([8], [0], LL) == 1.5
    assert Topology(toy(pxn=False)).max_latency([0], [6], SIMPLE) == 5.5
    assert Topology(toy(nodes_per_leaf=4)).max_latency([0], [8], SIMPLE) == 5.0


def test_pcie_pairs_of_a_hybrid_cube_mesh_take_two_nvlink_hops():
    """DGX-1 (v100-sxm2): GPUs 0 and 5 share no NVLink, their hop goes through the host bridge."""
    hw = get_hardware("v100-sxm2")
    topo = Topology(hw)
    simple = next(p for p in hw.protocols if p.name == "Simple")
    assert topo.is_mesh and not topo.adjacent(0, 5) and topo.adjacent(0, 4)
    assert topo.hop_class(0, 5) == ("pcie", 0) and topo.hop_class(0, 4) == ("nvlink", 0)
    assert topo.hop_latency(0, 5, simple) == 2 * simple.nvlink_hop_us
    assert topo.max_latency([0, 0], [4, 5], simple) == 2 * simple.nvlink_hop_us
    assert topo.max_latency([0], [4], simple) == simple.nvlink_hop_us
    node = hw.node
    links = dict(((a, b), n) for a, b, n in node.nvlink_mesh)
    nlinks = links.get((0, 4), links.get((4, 0)))
    assert topo.capacity(("nvl", 0, 0, 4)) == nlinks * node.nvlink_link_bw_gbs * node.nvlink_efficiency * 1e3
    assert topo.path(0, 5) == (("pcie_tx", 0, 0), ("pcie_rx", 0, 5))
    assert topo.path(0, 4) == (("nvl", 0, 0, 4),)


def test_bandwidth_time_is_bytes_over_the_bottleneck_share_over_the_protocol_fraction(topo):
    assert topo.bandwidth_time([(0, 1, 1e5)], SIMPLE) == pytest.approx(1.0)
    assert topo.bandwidth_time([(0, 1, 1e5)], LL) == pytest.approx(2.0)
    assert topo.bandwidth_time([(0, 1, 1e5)]) == pytest.approx(1.0)
    assert topo.bandwidth_time([(0, 4, 1e4)], SIMPLE) == pytest.approx(1.0)
    assert topo.bandwidth_time([(0, 8, 1e4)], SIMPLE) == pytest.approx(2.0)          # spine 5,000 B/us
    assert topo.bandwidth_time([(0, 4, 1e4), (1, 5, 1e4)], SIMPLE) == pytest.approx(2.0)   # one NIC
    assert topo.bandwidth_time([(0, 4, 1e4), (2, 6, 1e4)], SIMPLE) == pytest.approx(1.0)   # two rails
    # 1e4 and 3e4 on one NIC: 5,000 each until t=2, then 10,000 for the last 2e4 -> 4 us
    assert topo.bandwidth_time([(0, 4, 1e4), (1, 5, 3e4)], SIMPLE) == pytest.approx(4.0)
    assert topo.bandwidth_time([], SIMPLE) == 0.0 and topo.bandwidth_time([(0, 1, 0.0)]) == 0.0
    assert topo.bandwidth_time([(2, 2, 5e4)]) == 0.0                  # no link: nothing to drain
    # explicit paths: one link carrying 3e5 bytes next to a 1e5 flow on another
    assert topo.bandwidth_time([(0, 1, 1e5)], SIMPLE, [((("nvl_tx", 0, 2),), 3e5)]) == pytest.approx(3.0)
    assert topo.bandwidth_time([], LL, [((("nvl_tx", 0, 2),), 3e5)]) == pytest.approx(6.0)
    # the cached unit pattern scales with the bytes
    assert topo.bandwidth_time([(0, 4, 2e4), (1, 5, 6e4)], SIMPLE) == pytest.approx(8.0)


def test_link_drain_time_is_the_most_loaded_link(topo):
    assert topo.link_drain_time([]) == 0.0
    assert topo.link_drain_time([(0, 4, 1e4), (1, 5, 2e4)]) == pytest.approx(3.0)    # nic_tx(0, 0): 3e4
    assert topo.link_drain_time([(0, 8, 1e4)]) == pytest.approx(2.0)                  # the spine
    assert topo.link_drain_time([(0, 1, 1e5), (0, 2, 1e5), (0, 4, 1e4)]) == pytest.approx(2.0)  # nvl_tx 2e5


# ------------------------------------------------------------------------------ group layouts
def test_whole_consecutive_nodes_and_their_representative_sub_cluster(topo):
    assert whole_nodes(topo, list(range(4, 12))) == (1, 2)
    assert whole_nodes(topo, list(range(20))) == (0, 5)
    assert whole_nodes(topo, []) is None
    assert whole_nodes(topo, list(range(6))) is None                   # not whole nodes
    assert whole_nodes(topo, list(range(2, 10))) is None               # not starting at a node
    assert whole_nodes(topo, [0, 1, 2, 3, 8, 9, 10, 11]) is None      # not consecutive
    assert whole_nodes(topo, [0, 1, 2, 2, 4, 5, 6, 7]) is None        # same span, a rank repeated
    # more than 2 leaf groups (of 2 nodes) from a leaf border: 1 full leaf + one group of the last's size
    assert representative_nodes(topo, 0, 4) is None
    assert representative_nodes(topo, 0, 5) == 3
    assert representative_nodes(topo, 0, 6) == 4
    assert representative_nodes(topo, 0, 7) == 3
    assert representative_nodes(topo, 1, 7) is None
    assert representative_nodes(topo, 0, 9, leaves=4) == 7
    assert representative_nodes(topo, 0, 8, leaves=4) is None


def test_spine_crossings_of_a_chain_of_nodes(topo):
    """Leaves of 2 nodes: nodes 0..4 sit under leaves 0,0,1,1,2 -> 2 borders, a 3rd on the way back."""
    assert _spine_crossings(topo, 0, 5, wrap=False) == 2
    assert _spine_crossings(topo, 0, 5, wrap=True) == 3
    assert _spine_crossings(topo, 1, 2, wrap=True) == 2
    assert _spine_crossings(topo, 0, 2, wrap=True) == 0
    assert _spine_crossings(topo, 2, 2, wrap=False) == 0


def test_ranks_grouped_by_node_in_order(topo):
    assert _by_node(topo, [9, 1, 0, 8, 5]) == [[0, 1], [5], [8, 9]]
    assert _by_node(topo, (3,)) == [[3]]


# ---------------------------------------------------------------------------------------- ring
def test_ring_channels_leave_and_enter_every_node_on_one_rail(model):
    """Channel c runs node 0 from local c, and each next node from the local the previous one ended on."""
    from replay.hardware.network import Ring
    ch = Ring().channels(model.topology, list(range(8)))
    assert ch == [[0, 1, 2, 3, 7, 4, 5, 6], [1, 2, 3, 0, 4, 5, 6, 7],
                  [2, 3, 0, 1, 5, 6, 7, 4], [3, 0, 1, 2, 6, 7, 4, 5]]
    assert Ring().channels(model.topology, [2, 0, 1]) == [[0, 1, 2]]
    assert Ring().channels(model.topology, [0, 1, 4]) == [[0, 1, 4]]   # uneven nodes: one plain ring


def test_ring_all_gather_over_four_nodes_is_bound_by_the_oversubscribed_spine(model):
    """16 ranks = 4 nodes under 2 leaves, 4 channels. Per leaf and rail 2 channels cross the spine
    (5,000 B/us -> 2,500 each); a step moves size/(16 x 4) per channel: 6.4 MB -> 100,000 B -> 40 us.
    Latency per channel loop: 12 NVLink hops x 2 + 4 network hops x 5 + 2 spine crossings x 0.5 = 45 us,
    x 15/16 of the loop. Time = 10 + 45 x 15/16 + 15 x 40 = 652.1875 us (Simple)."""
    e = model.estimate(CommType.ALL_GATHER, 6.4e6, range(16), "ring")
    assert (e.time_us, e.protocol) == (pytest.approx(652.1875, rel=1e-9), "Simple")
    rs = model.estimate(CommType.REDUCE_SCATTER, 6.4e6, range(16), "ring")
    assert rs.time_us == pytest.approx(652.1875, rel=1e-9)
    # all-reduce: 2 x 15 steps -> 10 + 45 x 30/16 + 30 x 40 = 1,294.375 us
    ar = model.estimate(CommType.ALL_REDUCE, 6.4e6, range(16), "ring")
    assert ar.time_us == pytest.approx(1294.375, rel=1e-9)


def test_ring_over_five_nodes_takes_its_bandwidth_from_three_and_its_latency_in_closed_form(model):
    """20 ranks = 5 nodes (leaves 0,0,1,1,2): bandwidth as the 4-node case (2,500 B/us per channel at the
    spine), 8 MB -> 8e6/(20 x 4) = 100,000 B per step -> 40 us; loop = 15 x 2 + 5 x 5 + 3 x 0.5 = 56.5 us.
    Simple: 10 + 56.5 x 19/20 + 19 x 40 = 823.675 us. With 8 kB, LL wins: loop 15 x 0.25 + 5 x 1 + 3 x 0.5
    = 10.25; 1 + 10.25 x 19/20 + 19 x 0.04/0.5 = 12.2575 us."""
    e = model.estimate(CommType.ALL_GATHER, 8e6, range(20), "ring")
    assert (e.time_us, e.protocol) == (pytest.approx(823.675, rel=1e-9), "Simple")
    small = model.estimate(CommType.ALL_GATHER, 8e3, range(20), "ring")
    assert (small.time_us, small.protocol) == (pytest.approx(12.2575, rel=1e-9), "LL")
    # all-reduce: 38 steps: 10 + 56.5 x 38/20 + 38 x 40 = 1,637.35 us
    assert model.estimate(CommType.ALL_REDUCE, 8e6, range(20), "ring").time_us == pytest.approx(1637.35, rel=1e-9)


def test_ring_broadcast_is_a_pipelined_chain(model):
    """2 nodes (8 ranks), 4 channels of size/4: the inter-node hop of 2 channels shares each NIC (5,000
    B/us): 2 MB -> 500,000 B / 5,000 = 100 us; chain latency 6 NVLink hops x 2 + 1 network hop x 5 = 17.
    Simple: 10 + 17 + 100 = 127 us. 5 nodes: 1 MB -> 250,000 B at 2,500 B/us (spine) = 100 us; chain
    latency 15 x 2 + 4 x 5 + 2 spine crossings x 0.5 = 51 -> 161 us."""
    assert model.estimate(CommType.BROADCAST, 2e6, range(8)).time_us == pytest.approx(127.0, rel=1e-9)
    assert model.estimate(CommType.REDUCE, 2e6, range(8)).time_us == pytest.approx(127.0, rel=1e-9)
    e = model.estimate(CommType.BROADCAST, 1e6, range(20))
    assert (e.time_us, e.algorithm, e.protocol) == (pytest.approx(161.0, rel=1e-9), "ring", "Simple")


def test_ring_inside_one_node(model):
    """4 GPUs, one ring: all-reduce 4 MB = 6 steps of 1 MB at 100,000 B/us (10 us), latency 4 hops x 2 x 6/4.
    10 + 12 + 60 = 82 us (NVLS at 0.5 efficiency is slower here, see below). A 3-GPU broadcast chain of 3 MB:
    one channel, 2 hops of 3 MB each on their own links: 10 + 4 + 30 = 44 us."""
    e = model.estimate(CommType.ALL_REDUCE, 4e6, range(4))
    assert (e.time_us, e.algorithm) == (pytest.approx(82.0, rel=1e-9), "ring")
    assert model.estimate(CommType.BROADCAST, 3e6, [0, 1, 2]).time_us == pytest.approx(44.0, rel=1e-9)


def test_ring_over_unevenly_filled_nodes_is_one_plain_ring(model):
    """Ranks 0, 1, 4 (2 + 1 per node): one ring 0 -> 1 -> 4 -> 0, all-gather of 3 MB = 2 steps of 1 MB.
    The two network hops sit on different NICs (10,000 B/us): 100 us a step. Latency 2 + 5 + 5 = 12 x 2/3.
    10 + 8 + 200 = 218 us."""
    assert model.estimate(CommType.ALL_GATHER, 3e6, [0, 1, 4], "ring").time_us == pytest.approx(218.0, rel=1e-9)


# ---------------------------------------------------------------------------------------- tree
def test_double_binary_tree_parents():
    from replay.hardware.network import DoubleBinaryTree
    assert DoubleBinaryTree._trees(4) == [[-1, 0, 0, 1], [2, 3, 3, -1]]
    assert DoubleBinaryTree._trees(2) == [[-1, 0], [1, -1]]
    assert DoubleBinaryTree._trees(1) == [[-1], [-1]]


def test_tree_all_reduce_on_two_and_four_nodes(model):
    """2 nodes: the heads of 2 channels share each NIC, both trees send size/8 each way: 4 flows per NIC
    -> 2,500 B/us; 1 MB -> 125,000 B / 2,500 = 50 us / tree efficiency 0.5 = 100 us; latency
    2 x (depth 1 x 5 + 3 NVLink hops x 2) = 22; 10 + 22 + 100 = 132 us.
    4 nodes (depth 2): 8 flows of size/8 cross each leaf's spine uplink per rail (625 B/us): 1 MB -> 200 us
    / 0.5 = 400 us; latency 2 x (2 x 5 + 3 x 2) = 32; 10 + 32 + 400 = 442 us."""
    two = model.estimate(CommType.ALL_REDUCE, 1e6, range(8), "tree")
    assert (two.time_us, two.protocol) == (pytest.approx(132.0, rel=1e-9), "Simple")
    assert model.estimate(CommType.ALL_REDUCE, 1e6, range(16), "tree").time_us == pytest.approx(442.0, rel=1e-9)


def test_tree_supports_only_multi_node_all_reduce_on_equal_nodes(model):
    from replay.hardware.network import DoubleBinaryTree
    t = model.topology
    assert DoubleBinaryTree().supports(t, CommType.ALL_REDUCE, list(range(8)))
    assert not DoubleBinaryTree().supports(t, CommType.ALL_GATHER, list(range(8)))
    assert not DoubleBinaryTree().supports(t, CommType.ALL_REDUCE, list(range(4)))
    assert not DoubleBinaryTree().supports(t, CommType.ALL_REDUCE, [0, 1, 4])
    assert DoubleBinaryTree().supports(t, CommType.ALL_REDUCE, [0, 4])


# ---------------------------------------------------------------------------------------- NVLS
def test_nvls_pushes_the_buffer_and_its_share_through_the_switch_at_its_efficiency(model):
    """4 GPUs: S (1 + 1/4) per port and direction at 0.5 of the port = 2.5 S / 100,000 B/us: 4 MB -> 100 us,
    + 10 base + 2 NVLink hops x 2 = 114 us (Simple only)."""
    e = model.estimate(CommType.ALL_REDUCE, 4e6, range(4), "nvls")
    assert (e.time_us, e.protocol) == (pytest.approx(114.0, rel=1e-9), "Simple")
    from replay.hardware.network import NVLS
    t = model.topology
    assert NVLS().supports(t, CommType.ALL_REDUCE, [0, 1])
    assert not NVLS().supports(t, CommType.ALL_REDUCE, [0])
    assert not NVLS().supports(t, CommType.ALL_REDUCE, [0, 4])
    assert not NVLS().supports(t, CommType.ALL_GATHER, [0, 1])
    off = Topology(dataclasses.replace(toy(), node=dataclasses.replace(toy().node, nvls=False, nvls_efficiency=0.0)))
    assert not NVLS().supports(off, CommType.ALL_REDUCE, [0, 1])
    assert not NVLS().supports(Topology(get_hardware("v100-sxm2")), CommType.ALL_REDUCE, [0, 1])


# ---------------------------------------------------------------------------------- all-to-all
def test_direct_all_to_all_over_two_nodes_is_bound_by_the_nics(model):
    """8 ranks, 800 kB send buffers: 100 kB per pair. Each NIC carries the 8 flows from node 0 to the 2 GPUs
    of its rail on node 1 (PXN): 1,250 B/us each -> 80 us; 10 + 5 + 80 = 95 us."""
    e = model.estimate(CommType.ALL_TO_ALL, 8e5, range(8))
    assert (e.time_us, e.algorithm, e.protocol) == (pytest.approx(95.0, rel=1e-9), "direct", "Simple")


def test_all_to_all_efficiency_stretches_only_the_all_to_all_drain():
    """At alltoall_efficiency 0.5 the 80 us NIC drain of the exchange above takes 160 us: 10 + 5 + 160 =
    175 us; the uneven exchange's 400 us spine drain 800 us (10 + 5.5 + 800). Scatter (direct, not an
    all-to-all) keeps 42 us."""
    half = NetworkModel(toy(alltoall_efficiency=0.5))
    assert half.estimate(CommType.ALL_TO_ALL, 8e5, range(8)).time_us == pytest.approx(175.0, rel=1e-9)
    m = np.array([[7e6, 1e6, 2e6], [0, 0, 0], [5e5, 0, 0]])
    assert half.all_to_all_v_us(m, [0, 4, 8]) == pytest.approx(815.5, rel=1e-9)
    assert half.estimate(CommType.SCATTER, 4e6, range(4)).time_us == pytest.approx(42.0, rel=1e-9)


def test_scatter_and_gather_go_through_the_root(model):
    """4 GPUs, 4 MB: the root sends (receives) 1 MB to (from) each of 3 others over its one port:
    3 MB / 100,000 = 30 us; 10 + 2 + 30 = 42 us."""
    assert model.estimate(CommType.SCATTER, 4e6, range(4)).time_us == pytest.approx(42.0, rel=1e-9)
    assert model.estimate(CommType.GATHER, 4e6, range(4)).time_us == pytest.approx(42.0, rel=1e-9)
    from replay.hardware.network import DirectAllToAll
    assert DirectAllToAll().flows(CommType.SCATTER, 4.0, [2, 3]) == [(2, 3, 2.0)]
    assert DirectAllToAll().flows(CommType.GATHER, 4.0, [2, 3]) == [(3, 2, 2.0)]


def test_pairwise_all_to_all_runs_n_minus_1_rounds(model):
    """4 GPUs, 4 MB: 3 rounds of 1 MB per GPU (10 us) + one NVLink hop (2 us) each: 10 + 3 x 12 = 46 us."""
    e = model.estimate(CommType.ALL_TO_ALL, 4e6, range(4), "pairwise")
    assert (e.time_us, e.protocol) == (pytest.approx(46.0, rel=1e-9), "Simple")
    assert "pairwise" not in model.algorithms_for(CommType.ALL_TO_ALL, list(range(4)), auto_only=True)
    assert "pairwise" in model.algorithms_for(CommType.ALL_TO_ALL, list(range(4)))
    from replay.hardware.network import PairwiseAllToAll
    assert PairwiseAllToAll().rounds(6.0, [0, 1, 2]) == [([(0, 1, 2.0), (1, 2, 2.0), (2, 0, 2.0)], 1),
                                                         ([(0, 2, 2.0), (1, 0, 2.0), (2, 1, 2.0)], 1)]


def test_uneven_all_to_all_drains_its_most_loaded_link(model):
    """Ranks 0, 4, 8: 0->4 10 kB... x100: 0->4 1 MB, 0->8 2 MB, 8->0 0.5 MB. The spine uplink of leaf 0
    carries 2 MB at 5,000 B/us = 400 us; the slowest pair crosses the spine (5.5 us): 10 + 5.5 + 400 =
    415.5 us (LL: 1 + 1.5 + 800). The diagonal is not sent."""
    m = np.array([[7e6, 1e6, 2e6], [0, 0, 0], [5e5, 0, 0]])
    assert model.all_to_all_v_us(m, [0, 4, 8]) == pytest.approx(415.5, rel=1e-9)
    small = np.array([[0, 1e2, 2e2], [0, 0, 0], [5e1, 0, 0]])   # 200 B over the spine: 0.04 us
    assert model.all_to_all_v_us(small, [0, 4, 8]) == pytest.approx(1 + 1.5 + 0.08, rel=1e-9)
    assert model.all_to_all_v_us(np.zeros((3, 3)), [0, 4, 8]) == 0.0
    assert model.all_to_all_v_us(np.eye(3), [0, 4, 8]) == 0.0
    with pytest.raises(ValueError, match="2 x 2"):
        model.all_to_all_v_us(np.zeros((3, 3)), [0, 4])


# --------------------------------------------------------------------------------- hierarchical
def test_hierarchical_all_reduce_is_intra_reduce_scatter_inter_all_reduce_intra_all_gather(model):
    """2 nodes, 4 MB: intra reduce-scatter = 3 steps of 1 MB at 100,000 B/us + 4 hops x 2 x 3/4 + 10 = 46;
    inter all-reduce of 1 MB over pairs (i, 4+i): 2 steps of 500 kB on NICs shared by 2 pairs (5,000 B/us)
    + 2 hops x 5 x 2/2 + 10 = 220; intra all-gather 46. Total 312 us."""
    e = model.estimate(CommType.ALL_REDUCE, 4e6, range(8), "hierarchical")
    assert (e.time_us, e.protocol) == (pytest.approx(312.0, rel=1e-9), "Simple")
    # all-gather: inter all-gather of 1 MB (1 step of 500 kB, 100 us + 5 + 10) + intra all-gather 46
    assert model.estimate(CommType.ALL_GATHER, 4e6, range(8), "hierarchical").time_us == \
        pytest.approx(115.0 + 46.0, rel=1e-9)
    # reduce-scatter: intra reduce-scatter 46 + inter reduce-scatter 115
    assert model.estimate(CommType.REDUCE_SCATTER, 4e6, range(8), "hierarchical").time_us == \
        pytest.approx(161.0, rel=1e-9)


def test_hierarchical_over_five_nodes_runs_one_ring_per_rail(model):
    """20 ranks, 4 MB: the intra phases as on 2 nodes (46 us each); inter all-reduce of 1 MB over 5 nodes:
    8 steps of 200 kB; 2 rails' rings cross each leaf's spine uplink (2,500 B/us) -> 80 us a step;
    loop 5 x 5 + 3 spine crossings x 0.5 = 26.5 x 8/5. 10 + 42.4 + 640 = 692.4; total 784.4 us."""
    e = model.estimate(CommType.ALL_REDUCE, 4e6, range(20), "hierarchical")
    assert e.time_us == pytest.approx(784.4, rel=1e-9)


def test_hierarchical_needs_several_equal_nodes_of_several_gpus(model):
    from replay.hardware.network import Hierarchical
    t = model.topology
    assert Hierarchical().supports(t, CommType.ALL_REDUCE, list(range(8)))
    assert not Hierarchical().supports(t, CommType.ALL_REDUCE, list(range(4)))
    assert not Hierarchical().supports(t, CommType.ALL_REDUCE, [0, 4])
    assert not Hierarchical().supports(t, CommType.ALL_REDUCE, [0, 1, 4])
    assert not Hierarchical().supports(t, CommType.ALL_TO_ALL, list(range(8)))
    assert Hierarchical._phases(CommType.ALL_GATHER, 8.0, 4, 2) == [("inter", CommType.ALL_GATHER, 2.0),
                                                                     ("intra", CommType.ALL_GATHER, 8.0)]
    assert Hierarchical._phases(CommType.REDUCE_SCATTER, 8.0, 4, 2) == [
        ("intra", CommType.REDUCE_SCATTER, 8.0), ("inter", CommType.REDUCE_SCATTER, 2.0)]
    assert Hierarchical._phases(CommType.ALL_REDUCE, 8.0, 4, 2) == [
        ("intra", CommType.REDUCE_SCATTER, 8.0), ("inter", CommType.ALL_REDUCE, 2.0),
        ("intra", CommType.ALL_GATHER, 8.0)]


# ------------------------------------------------------------------------------ the model's entry
def test_point_to_point_takes_the_best_protocol(model):
    """0 -> 8 crosses the spine (5,000 B/us, 5.5 us hop): 10 kB: LL 1 + 1.5 + 4 = 6.5 us (Simple 17.5);
    1 MB: Simple 10 + 5.5 + 200 = 215.5 us (LL 401+)."""
    assert model.p2p_us(1e4, 0, 8) == pytest.approx(6.5, rel=1e-9)
    assert model.p2p_us(1e6, 0, 8) == pytest.approx(215.5, rel=1e-9)
    assert model.p2p_us(1e6, 3, 3) == 0.0 and model.p2p_us(0, 0, 8) == 0.0


def test_transfer_and_point_to_point_paths(model):
    t = model.topology
    assert model.transfer_paths([0]) == []
    assert model.transfer_paths([3, 1, 2, 0]) == [t.path(0, 1), t.path(1, 2), t.path(2, 3), t.path(3, 0)]
    assert model.transfer_paths([0, 1]) == [t.path(0, 1), t.path(1, 0)]
    two = model.transfer_paths(range(8))
    assert len(two) == 32 and two[3] == t.path(3, 7) and two[4] == t.path(7, 4) and two[7] == t.path(6, 0)
    assert model.transfer_paths(range(8)) is two                                      # cached
    assert model.p2p_paths(0, 8) == [t.path(0, 8)] and model.p2p_paths(0, 8) is model.p2p_paths(0, 8)
    assert model.p2p_paths(2, 2) == []


def test_estimate_reports_its_figures_as_nccl_tests_does(model):
    e = model.estimate(CommType.ALL_GATHER, 6.4e6, range(16), "ring")
    assert e.to_dict() == {"time_us": e.time_us, "algbw_gbps": 6.4e6 / e.time_us / 1e3,
                           "busbw_gbps": 6.4e6 / e.time_us / 1e3 * 15 / 16, "algorithm": "ring",
                           "protocol": "Simple", "op": "all_gather", "size_bytes": 6_400_000, "gpus": 16}
    assert model.collective_us(CommType.ALL_GATHER, 6.4e6, 16, "ring") == pytest.approx(652.1875, rel=1e-9)
    assert model.collective_us(int(CommType.ALL_GATHER), 6.4e6, list(range(16)), "ring") == \
        pytest.approx(652.1875, rel=1e-9)


def test_degenerate_and_special_operations(model):
    none = model.estimate(CommType.ALL_REDUCE, 1e6, [5])
    assert (none.time_us, none.algorithm, none.protocol, none.nranks, none.size_bytes) == (0.0, "none", "none", 1, 1e6)
    assert model.estimate(CommType.ALL_REDUCE, 0, range(4)).time_us == 0.0
    assert model.estimate(CommType.ALL_REDUCE, -1, range(4)).time_us == 0.0
    assert model.estimate(CommType.BARRIER, 0, [2]).time_us == 0.0
    # a barrier is an 8-byte all-reduce: 4 GPUs, LL ring: 1 + 4 x 0.25 x 6/4 + 6 x (2 B / 100,000 / 0.5)
    b = model.estimate(CommType.BARRIER, 123, range(4))
    assert (b.time_us, b.algorithm, b.protocol, b.comm, b.size_bytes, b.nranks) == \
        (pytest.approx(1 + 1.5 + 6 * 4e-5, rel=1e-9), "ring", "LL", CommType.BARRIER, 0.0, 4)
    # reduce_scatter_block is a reduce-scatter, reported under its own name
    rsb = model.estimate(CommType.REDUCE_SCATTER_BLOCK, 6.4e6, range(16), "ring")
    assert (rsb.time_us, rsb.comm) == (pytest.approx(652.1875, rel=1e-9), CommType.REDUCE_SCATTER_BLOCK)
    auto = model.estimate(CommType.REDUCE_SCATTER_BLOCK, 4e6, range(8))
    assert auto.time_us == min(model.estimate(CommType.REDUCE_SCATTER, 4e6, range(8), a).time_us
                               for a in ("ring", "hierarchical"))


def test_auto_selection_takes_the_fastest_pair(model):
    """2 nodes, 4 MB all-reduce: ring 4 channels (2 per NIC) 14 steps of 125 kB at 5,000 B/us = 350 us +
    ...; hierarchical 312 us; tree 10 + 22 + 4e6/1e4 = 432 us. The fastest is hierarchical."""
    e = model.estimate(CommType.ALL_REDUCE, 4e6, range(8))
    assert (e.algorithm, e.time_us) == ("hierarchical", pytest.approx(312.0, rel=1e-9))
    assert model.estimate(CommType.ALL_REDUCE, 4e6, range(8), "tree").time_us == pytest.approx(432.0, rel=1e-9)


def test_groups_past_the_documented_limits_are_refused(model):
    with pytest.raises(ValueError, match="at most 1,048,576 ranks per collective"):
        model.estimate(CommType.ALL_REDUCE, 1e6, (1 << 20) + 1)
    with pytest.raises(ValueError, match="all_to_all over 513 ranks.*limited to 512 ranks"):
        model.estimate(CommType.ALL_TO_ALL, 1e6, 513)
    assert "direct" in model.algorithms_for(CommType.ALL_TO_ALL, list(range(512)))
    assert "direct" not in model.algorithms_for(CommType.ALL_TO_ALL, list(range(513)))
    assert "pairwise" not in model.algorithms_for(CommType.ALL_TO_ALL, list(range(513)))
    assert "direct" in model.algorithms_for(CommType.GATHER, list(range(513)))


def test_a_forced_algorithm_that_cannot_run_names_the_ranks(model):
    with pytest.raises(ValueError, match=r"^algorithm 'tree' does not support all_reduce on ranks \[0, 1, 2\] of toy$"):
        model.estimate(CommType.ALL_REDUCE, 1e6, [0, 1, 2], "tree")
    with pytest.raises(ValueError, match=r"^algorithm 'nvls' does not support all_reduce on ranks \[0\.\.7\] \(8\) of toy$"):
        model.estimate(CommType.ALL_REDUCE, 1e6, range(8), "nvls")
    with pytest.raises(ValueError, match=r"^unknown collective algorithm 'x' \(known: ring, tree, nvls, direct, "
                                         r"pairwise, hierarchical\)$"):
        model.estimate(CommType.ALL_REDUCE, 1e6, range(8), "x")


def test_registering_an_algorithm_makes_it_selectable_by_name():
    from replay.hardware.network import ALGORITHMS, CollectiveAlgorithm, register_algorithm

    class Dummy(CollectiveAlgorithm):
        name = "dummy-for-test"

    try:
        assert register_algorithm(Dummy) is Dummy and ALGORITHMS["dummy-for-test"] is Dummy
    finally:
        ALGORITHMS.pop("dummy-for-test", None)


def test_bytes_sent_count_every_repeat_of_a_round():
    """A round of one 2-byte flow 0 -> 1 repeated 3 times: rank 0 sends 6 bytes, rank 1 none."""
    from replay.hardware.network import _sent_from_flows, Ring
    assert _sent_from_flows([0, 1], [([(0, 1, 2.0)], 3)]) == [6.0, 0.0]
    # a broadcast chain over 3 ranks: the first two forward the whole buffer, the last sends nothing
    assert Ring().bytes_sent_per_rank(CommType.BROADCAST, 5.0, [0, 1, 2]) == [5.0, 5.0, 0.0]


def test_tree_bytes_default_to_an_h100_node_of_eight():
    """No topology given: an 8 x H100 node, 8 channels x 2 trees, S/16 per chain edge and direction; over
    8 channels each GPU is 6 times mid-chain (2 sends), once head and once tail (1 send): 14 x 2 x S/16
    = 1.75 S. (On the toy 4-GPU nodes the same ranks are 2 nodes with tree edges between them.)"""
    from replay.hardware.network import DoubleBinaryTree
    assert DoubleBinaryTree().bytes_sent_per_rank(CommType.ALL_REDUCE, 16.0, list(range(8))) == [28.0] * 8


def test_nvls_time_scales_with_the_simple_protocols_bandwidth_fraction():
    """The toy with Simple at 0.8 of the link: the 4 MB NVLS all-reduce's 100 us of bytes take 125 us:
    10 + 4 + 125 = 139 us."""
    hw = dataclasses.replace(toy(), protocols=(LL, dataclasses.replace(SIMPLE, bw_fraction=0.8)))
    assert NetworkModel(hw).estimate(CommType.ALL_REDUCE, 4e6, range(4), "nvls").time_us == pytest.approx(139.0)


def test_pairwise_serves_only_all_to_all_up_to_512_ranks(model):
    from replay.hardware.network import PairwiseAllToAll
    t = model.topology
    assert not PairwiseAllToAll().supports(t, CommType.ALL_REDUCE, [0, 1])
    assert not PairwiseAllToAll().supports(t, CommType.ALL_TO_ALL, [0])
    assert PairwiseAllToAll().supports(t, CommType.ALL_TO_ALL, list(range(512)))
    assert not PairwiseAllToAll().supports(t, CommType.ALL_TO_ALL, list(range(513)))


def test_hierarchical_bytes_default_to_h100_nodes_of_eight():
    """No topology given: 16 ranks are 2 x H100 nodes of 8: all-reduce = intra reduce-scatter 7/8 S + inter
    all-reduce of S/8 over 2 nodes (2 x 1/2 x S/8) + intra all-gather 7/8 S = 1.875 S per rank."""
    from replay.hardware.network import Hierarchical
    assert Hierarchical().bytes_sent_per_rank(CommType.ALL_REDUCE, 16.0, list(range(16))) == [30.0] * 16


def test_uneven_all_to_all_of_integer_byte_counts(model):
    """An integer matrix (diagonal ignored): 10,000 B from 0 to 4 over one NIC (1 us): LL 1 + 1 + 2 = 4 us.
    A single byte still counts: LL 1 + 1 + 1e-4 x 2."""
    assert model.all_to_all_v_us(np.array([[7, 10_000], [0, 0]]), [0, 4]) == pytest.approx(4.0, rel=1e-12)
    assert model.all_to_all_v_us(np.array([[0, 1], [0, 0]]), [0, 4]) == pytest.approx(2.0002, rel=1e-12)


def test_error_messages_list_up_to_four_ranks_and_abbreviate_more(model):
    with pytest.raises(ValueError, match=r"on ranks \[0, 1, 2, 3\] of toy$"):
        model.estimate(CommType.ALL_REDUCE, 1e6, range(4), "tree")
    with pytest.raises(ValueError, match=r"on ranks \[0\.\.4\] \(5\) of toy$"):
        model.estimate(CommType.ALL_REDUCE, 1e6, range(5), "tree")


def test_without_pxn_the_rails_of_both_ends_decide_the_spine_hop():
    """No PXN: local 2 -> local 2 of the next node stays on rail 1 (no spine, 5 us); local 1 -> local 1 on
    rail 0 (5 us); local 1 -> local 2 changes rail (5.5 us)."""
    t = Topology(toy(pxn=False))
    assert t.max_latency([2], [6], SIMPLE) == 5.0
    assert t.max_latency([1], [5], SIMPLE) == 5.0
    assert t.max_latency([3], [7], SIMPLE) == 5.0
    assert t.max_latency([1], [6], SIMPLE) == 5.5
    assert t.hop_latency(2, 6, SIMPLE) == 5.0 and t.hop_latency(1, 6, SIMPLE) == 5.5


def test_mesh_pairs_away_from_gpu_0_are_looked_up_by_local_index():
    hw = get_hardware("v100-sxm2")
    topo = Topology(hw)
    simple = next(p for p in hw.protocols if p.name == "Simple")
    assert topo.adjacent(1, 2)
    assert topo.max_latency([1, 9], [2, 10], simple) == simple.nvlink_hop_us


def test_tree_rounds_chain_each_node_up_and_down_then_join_the_heads():
    """Channel 0 of 2 toy nodes, part = 16 / (2 x 4) = 2: tree A's chains 0-1-2-3 and 4-5-6-7 (each edge up
    then down), then child node 1's head 4 to its parent's head 0 and back; tree B the same chains, then
    node 0 (child) to node 1 (parent). Channel 1 chains start at local 1: 1-2-3-0."""
    from replay.hardware.network import DoubleBinaryTree
    f = DoubleBinaryTree().rounds(toy_topology(), 16.0, list(range(8)))
    chains = [(1, 0), (0, 1), (2, 1), (1, 2), (3, 2), (2, 3), (5, 4), (4, 5), (6, 5), (5, 6), (7, 6), (6, 7)]
    assert [x[:2] for x in f[:14]] == chains + [(4, 0), (0, 4)]
    assert [x[:2] for x in f[14:28]] == chains + [(0, 4), (4, 0)]
    assert [x[:2] for x in f[28:32]] == [(2, 1), (1, 2), (3, 2), (2, 3)]
    assert len(f) == 4 * 28 and all(x[2] == 2.0 for x in f)


def toy_topology():
    return Topology(toy())


def test_tree_over_three_nodes_has_depth_one_and_is_spine_bound(model):
    """3 nodes (leaves {0, 1}, {2}): trees A (1->0, 2->0) and B (0->2, 1->2). Per channel 3 flows leave
    leaf 0 for node 2 (A: 0->2 down; B: 0->2, 1->2 up): 6 per spine uplink and rail -> 833.3 B/us; 1 MB ->
    125,000 B / 833.3 = 150 us / 0.5 = 300; depth max(1, ceil(log2 4) - 1) = 1: latency 2 x (5 + 3 x 2) =
    22; 10 + 22 + 300 = 332 us."""
    assert model.estimate(CommType.ALL_REDUCE, 1e6, range(12), "tree").time_us == pytest.approx(332.0, rel=1e-9)


def test_tree_latency_takes_the_network_hop_between_the_first_gpus_of_two_nodes():
    """No PXN, 4 NICs (one per GPU): channel c's heads are local c on both nodes, on one rail: 2 flows per
    NIC (5,000 B/us): 1 MB -> 125,000 / 5,000 = 25 us / 0.5 = 50; latency 2 x (5 + 3 x 2) = 22 (GPU 0 to
    GPU 4: same rail, no spine): 82 us."""
    m = NetworkModel(toy(pxn=False, nics_per_node=4))
    assert m.estimate(CommType.ALL_REDUCE, 1e6, range(8), "tree").time_us == pytest.approx(82.0, rel=1e-9)


def test_tree_with_one_and_two_gpus_per_node(model):
    """One GPU per node (ranks 0, 4): 1 channel, S/2 per tree edge, both trees on one NIC: 50,000 B at
    5,000 B/us = 10 us / 0.5 = 20; latency 2 x 5 = 10: 40 us. Two per node (0, 1, 4, 5): 2 channels on
    rail 0, 4 flows of S/4 per NIC: 250,000 / 2,500 = 100 / 0.5 = 200; latency 2 x (5 + 2) = 14: 224 us."""
    assert model.estimate(CommType.ALL_REDUCE, 1e5, [0, 4], "tree").time_us == pytest.approx(40.0, rel=1e-9)
    assert model.estimate(CommType.ALL_REDUCE, 1e6, [0, 1, 4, 5], "tree").time_us == pytest.approx(224.0, rel=1e-9)


def test_tree_over_many_leaves_takes_its_bandwidth_from_four_of_them():
    """One node per leaf, 5 nodes: the bandwidth comes from the first 4 (TREE_REPRESENTATIVE_LEAVES):
    trees A (1->0, 2->0, 3->1), B (0->2, 1->3, 2->3): every node sends 3 flows a channel over the spine,
    2 channels a rail: 6 per 2,500 B/us uplink -> 416.7 B/us; 125,000 B -> 300 us / 0.5 = 600. Depth
    ceil(log2 6) - 1 = 2, hop 0 -> 4 crosses the spine (5.5): latency 2 x (2 x 5.5 + 6) = 34. 644 us.
    (The 5-node tree itself has a node sending 4 flows: 800 us of bandwidth.)"""
    m = NetworkModel(toy(nodes_per_leaf=1))
    assert m.estimate(CommType.ALL_REDUCE, 1e6, range(20), "tree").time_us == pytest.approx(644.0, rel=1e-9)


def test_ring_over_three_single_node_leaves():
    """One node per leaf (spine 2,500 B/us per leaf and rail), 3 nodes: every inter-node hop crosses the
    spine, 2 channels per uplink: 1,250 B/us; 4.8 MB -> 100,000 B a step -> 80 us; loop 3 x 6 (NVLink) +
    3 x 5 (network) + 3 x 0.5 (spine) = 34.5; 10 + 34.5 x 11/12 + 11 x 80 = 921.625 us."""
    m = NetworkModel(toy(nodes_per_leaf=1))
    assert m.estimate(CommType.ALL_GATHER, 4.8e6, range(12), "ring").time_us == pytest.approx(921.625, rel=1e-9)


def mesh_toy():
    """The toy with a 4-GPU NVLink chain 0-1-2-3 (100 GB/s links) and no 3-0 link: that hop uses PCIe."""
    base = toy()
    return dataclasses.replace(base, node=dataclasses.replace(
        base.node, intra_topology="hybrid_cube_mesh", nvlink_link_bw_gbs=100.0,
        nvlink_mesh=((0, 1, 1), (1, 2, 1), (2, 3, 1)), nvls=False, nvls_efficiency=0.0))


def test_ring_latency_on_a_mesh_depends_on_where_each_node_starts():
    """A node visited from local r crosses r, r+1, r+2, r+3 (mod 4): from 0 all 3 hops are NVLink (6 us),
    from any other start one is the PCIe 3-0 hop (2 + 2 + 4 = 8). Over 5 nodes channel c starts node i at
    (c - i) mod 4, so it meets each start once and its own twice: channel 0 36, channels 1-3 38 us; + 5
    network hops x 5 + 3 spine crossings x 0.5 = 64.5. All-gather 8 MB on 20 ranks: 10 + 64.5 x 19/20 +
    19 x 40 = 831.275 us (the spine still binds: PCIe carries 3 flows at 6,667 B/us). The same from node 2.
    Broadcast 1 MB: chain latency 38 + 4 x 5 + 2 x 0.5 = 59; 10 + 59 + 100 = 169 us."""
    m = NetworkModel(mesh_toy())
    assert m.estimate(CommType.ALL_GATHER, 8e6, range(20), "ring").time_us == pytest.approx(831.275, rel=1e-9)
    assert m.estimate(CommType.ALL_GATHER, 8e6, range(8, 28), "ring").time_us == pytest.approx(831.275, rel=1e-9)
    assert m.estimate(CommType.BROADCAST, 1e6, range(20), "ring").time_us == pytest.approx(169.0, rel=1e-9)


def test_hierarchical_over_part_of_each_node(model):
    """Ranks 0, 1, 4, 5 (2 per node, not whole nodes), 1 MB: intra reduce-scatter over the pair = 1 step of
    500 kB on NVLink (5 us) + 2 hops x 2 x 1/2 + 10 = 17; inter all-reduce of 500 kB over (0, 4) and (1, 5)
    = 2 steps of 250 kB on one shared NIC (5,000 B/us: 50 us) + 2 hops x 5 x 2/2 + 10 = 120; intra
    all-gather 17. 154 us."""
    assert model.estimate(CommType.ALL_REDUCE, 1e6, [0, 1, 4, 5], "hierarchical").time_us == \
        pytest.approx(154.0, rel=1e-9)


def test_hierarchical_intra_phases_on_a_mesh_cross_its_pcie_hop():
    """Mesh toy, 20 ranks, 4 MB: each node's ring 0-1-2-3-0 has the PCIe hop 3 -> 0 (20,000 B/us): 3 steps
    of 1 MB -> 150 us, loop 2 + 2 + 2 + 4 = 10 x 3/4, + 10 = 167.5 per intra phase; the inter all-reduce as
    on the NVSwitch toy (692.4). 167.5 x 2 + 692.4 = 1,027.4 us."""
    m = NetworkModel(mesh_toy())
    assert m.estimate(CommType.ALL_REDUCE, 4e6, range(20), "hierarchical").time_us == pytest.approx(1027.4, rel=1e-9)


def test_hierarchical_spine_crossings_count_leaf_borders_from_the_first_node():
    """3 nodes per leaf (spine 3 x 10,000 / 4 = 7,500 B/us), 8 nodes: leaves {0,1,2}, {3,4,5}, {6,7}: 2
    borders + the way back = 3 crossings. 4 MB: intra phases 46 us each; inter all-reduce of 1 MB over 8
    nodes: 14 steps of 125,000 B, 2 flows per spine uplink and rail (3,750 B/us) -> 33.33 us a step;
    loop 8 x 5 + 3 x 0.5 = 41.5 x 14/8. 46 + (10 + 72.625 + 466.667) + 46 = 641.2917 us."""
    m = NetworkModel(toy(nodes_per_leaf=3))
    assert m.estimate(CommType.ALL_REDUCE, 4e6, range(32), "hierarchical").time_us == \
        pytest.approx(92 + 10 + 41.5 * 14 / 8 + 14 * 125_000 / 3_750, rel=1e-9)


def test_broadcast_chain_ends_on_its_slowest_hop(model):
    """Ranks 0, 4, 8 (one per node): the chain 0 -> 4 (NIC, 100 us for 1 MB) -> 8 (across the spine,
    5,000 B/us: 200 us); latency 5 + 5.5: 10 + 10.5 + 200 = 220.5 us."""
    assert model.estimate(CommType.BROADCAST, 1e6, [0, 4, 8]).time_us == pytest.approx(220.5, rel=1e-9)
