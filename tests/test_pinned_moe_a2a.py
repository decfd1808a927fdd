"""The fast non-uniform all-to-all of large EP groups (estimators/moe/a2a.py), pinned by hand on the
h100-sxm preset and against the per-flow model it replaces (`NetworkModel.all_to_all_v_us`).

Model (NCCL grouped send/recv, the replay network model): time = min over the LL / LL128 / Simple protocols
of base latency + the largest hop latency + (bytes on the most loaded link / its capacity) / the protocol's
bandwidth fraction. h100-sxm (its preset): 8 GPUs a node, one 400 Gb/s NIC per GPU at 94% = 47,000 B/us a
rail, rail-optimised with PXN (traffic to another rail hops over NVLink first), 32 nodes a leaf, 0.5 us a
spine switch; NVLink 369,000 B/us a GPU. Protocols (base, network hop, NVLink hop us; bandwidth fraction):
LL 6, 2.7, 0.6; 0.5 -- LL128 8, 3.5, 1.1; 0.9375 -- Simple 10, 5.0, 2.0; 1.0. A grouped all-to-all
drains at 92.5% of that link-bound rate (`alltoall_efficiency`, fitted to the Megatron-Core MoE report's
H100 measurements, tests/test_pinned_alltoall_h100.py): the flows below carry 0.925 x round byte counts
(4.7 MB x 0.925 drains in 100 us of NIC).
"""
from __future__ import annotations

import numpy as np
import pytest

from estimators.moe import a2a
from estimators.moe.a2a import AllToAllTimer, all_to_all_timer
from replay.hardware.config import get_hardware
from replay.hardware.network import NetworkModel

NET = NetworkModel(get_hardware("h100-sxm"))
NIC = 400 / 8 * 0.94 * 1e3           # B/us per rail
NVL = 369_000.0
A2A = 0.925
PROTOS = [(6.0, 2.7, 0.6, 0.5), (8.0, 3.5, 1.1, 0.9375), (10.0, 5.0, 2.0, 1.0)]   # base, net hop, nvl hop, bw


def _best(hop: str, drain_us: float, spine: bool = False) -> float:
    """min over protocols of base + hop latency (+ a spine switch) + drain / bandwidth fraction."""
    out = []
    for base, net, nvl, bw in PROTOS:
        lat = (net + (0.5 if spine else 0.0)) if hop == "net" else nvl
        out.append(base + lat + drain_us / bw)
    return min(out)


def _one(n: int, i: int, j: int, b: float) -> np.ndarray:
    m = np.zeros((n, n))
    m[i, j] = b
    return m


def test_the_preset_is_the_one_counted_here():
    t = NET.topology
    assert t.nic == pytest.approx(NIC, rel=1e-12) and t.nvl == pytest.approx(NVL, rel=1e-12) and t.gpn == 8
    assert NET.hw.network.alltoall_efficiency == A2A
    assert [(p.name, p.base_latency_us, p.net_hop_us, p.nvlink_hop_us, p.bw_fraction) for p in NET.hw.protocols] \
        == [("LL",) + PROTOS[0], ("LL128",) + PROTOS[1], ("Simple",) + PROTOS[2]]


def test_one_flow_between_nodes_drains_through_one_rail():
    """4.7 MB from rank 0 to rank 8 (next node, same rail): 100 us on the NIC; Simple: 10 + 5 + 100 = 115 us."""
    timer = AllToAllTimer(NET, [0, 8])
    m = _one(2, 0, 1, 4.7e6 * A2A)
    assert timer(m) == pytest.approx(115.0, rel=1e-12)
    lat, drain = timer.parts(m)
    assert lat.tolist() == pytest.approx([8.7, 11.5, 15.0], rel=1e-12)
    assert drain.tolist() == pytest.approx([200.0, 100 / 0.9375, 100.0], rel=1e-12)


def test_half_the_bytes_keep_the_latency_and_halve_the_drain():
    """scale 0.5: LL128 8 + 3.5 + 50 / 0.9375 = 64.83 us beats Simple's 10 + 5 + 50 = 65 us."""
    timer = AllToAllTimer(NET, [0, 8])
    assert timer(_one(2, 0, 1, 4.7e6 * A2A), 0.5) == pytest.approx(11.5 + 50 / 0.9375, rel=1e-12)


def test_a_flow_to_another_leaf_adds_a_spine_switch():
    """Rank 256 sits on node 32, the next leaf: Simple 10 + 5 + 0.5 + 100 us."""
    timer = AllToAllTimer(NET, [0, 256])
    assert timer(_one(2, 0, 1, 4.7e6 * A2A)) == pytest.approx(_best("net", 100.0, spine=True), rel=1e-12)
    assert timer(_one(2, 0, 1, 4.7e6 * A2A)) == pytest.approx(115.5, rel=1e-12)


def test_two_flows_into_one_rail_share_its_nic():
    """Ranks 0 and 1 both send 4.7 MB to rank 8: rank 1 hops over NVLink to rank 0's rail (PXN), so
    rail 0's NIC carries 9.4 MB: 200 us; Simple 215 us."""
    timer = AllToAllTimer(NET, [0, 1, 8])
    m = np.zeros((3, 3))
    m[0, 2] = m[1, 2] = 4.7e6 * A2A
    assert timer(m) == pytest.approx(_best("net", 200.0), rel=1e-12)
    assert timer(m) == pytest.approx(215.0, rel=1e-12)


def test_a_flow_inside_a_node_drains_over_nvlink():
    """3.69 MB from rank 0 to rank 1: 10 us of NVLink; LL128 8 + 1.1 + 10 / 0.9375 = 19.77 us."""
    timer = AllToAllTimer(NET, [0, 1])
    assert timer(_one(2, 0, 1, 3.69e6 * A2A)) == pytest.approx(_best("nvl", 10.0), rel=1e-12)
    assert timer(_one(2, 0, 1, 3.69e6 * A2A)) == pytest.approx(9.1 + 10 / 0.9375, rel=1e-12)


def test_nothing_sent_or_only_to_itself_takes_no_time():
    timer = AllToAllTimer(NET, [0, 1, 8])
    assert timer(np.zeros((3, 3))) == 0.0
    assert timer(np.eye(3) * 1e6) == 0.0
    lat, drain = timer.parts(np.eye(3) * 1e6)
    assert lat.tolist() == [0.0, 0.0, 0.0] and drain.tolist() == [0.0, 0.0, 0.0]


def test_the_largest_hop_latency_is_the_farthest_pair_sent():
    """Ranks 0, 1 (node 0), 8 (node 1), 256 (node 32, next leaf): 1 byte on a pair prices that pair's hop."""
    timer = AllToAllTimer(NET, [0, 1, 8, 256])
    intra = timer.parts(_one(4, 0, 1, 1.0))[0]
    assert intra.tolist() == pytest.approx([6.6, 9.1, 12.0], rel=1e-12)
    rail = np.zeros((4, 4))
    rail[0, 1] = rail[1, 2] = 1.0
    assert timer.parts(rail)[0].tolist() == pytest.approx([8.7, 11.5, 15.0], rel=1e-12)
    spine = rail.copy()
    spine[2, 3] = 1.0
    assert timer.parts(spine)[0].tolist() == pytest.approx([9.2, 12.0, 15.5], rel=1e-12)
    back = np.zeros((4, 4))
    back[3, 0] = back[1, 0] = 1.0
    assert timer.parts(back)[0].tolist() == pytest.approx([9.2, 12.0, 15.5], rel=1e-12)


@pytest.mark.parametrize("ranks", [[0, 1, 2, 3], [0, 1, 8, 9], [0, 1, 8, 256, 257, 520]])
def test_every_pair_exchanging_matches_the_per_flow_model(ranks):
    """A dense exchange (the cached group latency) against the per-flow reference, twice (cache hit)."""
    rng = np.random.default_rng(len(ranks))
    timer = AllToAllTimer(NET, ranks)
    for _ in range(2):
        m = rng.uniform(1e3, 1e6, size=(len(ranks), len(ranks)))
        assert timer(m) == pytest.approx(NET.all_to_all_v_us(m, ranks), rel=1e-12)
    full = timer.parts(m)
    assert full[0].tolist() == pytest.approx(timer.parts(m * 3)[0].tolist(), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_sparse_exchanges_match_the_per_flow_model(seed):
    rng = np.random.default_rng(seed)
    ranks = [0, 1, 5, 8, 12, 256, 300, 520]
    timer = AllToAllTimer(NET, ranks)
    m = rng.uniform(1e3, 1e7, size=(8, 8)) * (rng.random((8, 8)) < 0.3)
    if not (m * ~np.eye(8, dtype=bool)).any():
        m[0, 3] = 1e5
    assert timer(m) == pytest.approx(NET.all_to_all_v_us(m, ranks), rel=1e-12)
    assert timer(m, 0.25) == pytest.approx(NET.all_to_all_v_us(m * 0.25, ranks), rel=1e-9)


def test_timers_are_kept_per_hardware_and_group_and_the_cache_is_bounded():
    a2a._TIMERS.clear()
    first = all_to_all_timer(NET, [0, 1])
    assert all_to_all_timer(NET, (0, 1)) is first
    assert all_to_all_timer(NET, [0, 8]) is not first
    assert first.G == 2 and first.ranks.tolist() == [0, 1] and first.network is NET
    other = NetworkModel(get_hardware("h100-sxm-roofline"))
    assert all_to_all_timer(other, [0, 1]) is not first
    for r in range(2, 8):                     # 9 groups held: still cached
        all_to_all_timer(NET, [0, r + 8])
    assert len(a2a._TIMERS) == 9 and all_to_all_timer(NET, [0, 1]) is first
    all_to_all_timer(NET, [0, 100])           # a 10th: the cache starts over
    assert len(a2a._TIMERS) == 1
    assert all_to_all_timer(NET, [0, 1]) is not first


def test_a_changed_preset_of_the_same_name_gets_its_own_timer():
    """The same preset name with 200 Gb/s NICs: 4.7 MB between nodes drains in 200 us, not 100 us."""
    import dataclasses
    hw = get_hardware("h100-sxm")
    slow = dataclasses.replace(hw, network=dataclasses.replace(hw.network, nic_gbps=200.0))
    assert slow.name == hw.name
    a2a._TIMERS.clear()
    fast_t = all_to_all_timer(NET, [0, 8])
    slow_t = all_to_all_timer(NetworkModel(slow), [0, 8])
    assert slow_t is not fast_t
    assert slow_t(_one(2, 0, 1, 4.7e6 * A2A)) == pytest.approx(15.0 + 200.0, rel=1e-12)
    assert fast_t(_one(2, 0, 1, 4.7e6 * A2A)) == pytest.approx(115.0, rel=1e-12)
