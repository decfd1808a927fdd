"""Max-min fair sharing of links and the fluid model of transfers in flight, on link sets small enough to
solve by hand (every figure below is worked out in its docstring or comment).

Max-min fairness by progressive filling (Bertsekas & Gallager, "Data Networks", 2nd ed., Sec. 6.5.2): the
link with the smallest capacity per (weighted) flow fixes the rate of its flows, its capacity is taken off
the other links they cross, repeat. A transfer made of several flows moves them all at one rate (a ring at
the pace of its slowest link), so links are shared among transfers at those coupled rates; a transfer's speed
is that rate over its rate alone, re-shared whenever a transfer starts or ends.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from replay.hardware.network import (fair_share_on, FlowIncidence, flow_completion_times, max_min_fair_share,
                                     shared_completion_times, shared_transfer_times)


# ------------------------------------------------------------------------------- fair rates
def test_weighted_flows_count_as_that_many_copies():
    """Link b (2) carries flow 1 alone -> 2; link a (10) then has 8 left for 3 copies of flow 0 -> 8/3."""
    rates = max_min_fair_share([("a",), ("a", "b")], {"a": 10.0, "b": 2.0}, weights=[3, 1])
    assert rates.tolist() == pytest.approx([8 / 3, 2.0], rel=1e-12)
    # the same without weights: a's 10 over 2 flows would be 5, b fixes flow 1 at 2, flow 0 gets 8
    assert max_min_fair_share([("a",), ("a", "b")], {"a": 10.0, "b": 2.0}).tolist() == pytest.approx([8.0, 2.0])


def test_three_levels_of_bottleneck():
    """c (3) carries flows 0, 1, 2 -> 1 each; a then has 6 - 1 = 5 and b 5 - 1 = 4 left for flow 3 (on a
    and b): 4."""
    paths = [("a", "c"), ("c",), ("b", "c"), ("a", "b")]
    rates = max_min_fair_share(paths, {"a": 6.0, "b": 5.0, "c": 3.0})
    assert rates.tolist() == pytest.approx([1.0, 1.0, 1.0, 4.0], rel=1e-12)


def test_flows_without_links_are_unbounded():
    assert max_min_fair_share([(), ("a",)], {"a": 4.0}).tolist() == [math.inf, 4.0]
    assert max_min_fair_share([(), ()], {}).tolist() == [math.inf, math.inf]
    assert max_min_fair_share([], {}).tolist() == []
    assert max_min_fair_share([("a",), ("a",)], lambda link: 5.0).tolist() == [2.5, 2.5]


def test_incidence_lists_each_flow_link_pair_once_per_occurrence():
    inc = FlowIncidence.of([("a", "b"), ("b",)], {"a": 1.0, "b": 2.0})
    assert inc.flows == 2
    assert inc.flow_of.tolist() == [0, 0, 1] and inc.link_of.tolist() == [0, 1, 1]
    assert inc.capacity.tolist() == [1.0, 2.0]
    assert fair_share_on(inc).tolist() == [1.0, 1.0]
    assert fair_share_on(inc, [1.0, 3.0]).tolist() == pytest.approx([0.5, 0.5])   # b: 2 over 4 copies


def test_completion_times_re_share_as_flows_finish():
    """a (10), b (4); flows 0 on a+b, 1 on a, 2 on b with 4, 16, 8 bytes: rates 2, 8, 2 -> flows 0 and 1
    end at t=2; flow 2 (4 left) then gets b alone (4/us): t=3."""
    done = flow_completion_times([("a", "b"), ("a",), ("b",)], [4.0, 16.0, 8.0], {"a": 10.0, "b": 4.0})
    assert done.tolist() == pytest.approx([2.0, 2.0, 3.0], rel=1e-12)


def test_empty_flows_and_flows_without_links_finish_at_once():
    done = flow_completion_times([("a",), (), ("a",)], [0.0, 5.0, 10.0], {"a": 10.0})
    assert done.tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert flow_completion_times([], [], {}).tolist() == []


# ------------------------------------------------------------------------- transfers in flight
L = ("l",)


def test_a_later_transfer_slows_the_one_in_flight_from_its_start():
    """One link of 1: transfer 0 (3 us alone) runs alone from 0 to 0.5 (2.5 left), then both at half
    speed: 0 ends at 0.5 + 5 = 5.5, when 1 has 3 - 2.5 = 0.5 left, alone: 6.0. Integer inputs too."""
    paths = [[L], [L]]
    begin, end = shared_transfer_times([0.0, 0.5], [3, 3], paths, {"l": 1.0})
    assert begin.tolist() == [0.0, 0.5] and end.tolist() == pytest.approx([5.5, 6.0], rel=1e-12)
    assert shared_completion_times([0.0, 0.5], [3, 3], paths, {"l": 1.0}).tolist() == pytest.approx([5.5, 6.0])
    # starting at 5 when the other has 5 of 10 left: both at half speed, 0 ends at 15, 1 at 20
    assert shared_completion_times([0, 5], [10.0, 10.0], paths, {"l": 1.0}).tolist() == pytest.approx([15.0, 20.0])


def test_two_transfers_on_one_link_share_it_until_the_first_ends():
    """1 and 2 us alone, together from 0: both at half speed, the first ends at 2 (the second has 1 left),
    the second at 3. Listed the other way round, the same."""
    assert shared_completion_times([0.0, 0.0], [1.0, 2.0], [[L], [L]], {"l": 1.0}).tolist() == pytest.approx([2.0, 3.0])
    assert shared_completion_times([0.0, 0.0], [2.0, 1.0], [[L], [L]], {"l": 1.0}).tolist() == pytest.approx([3.0, 2.0])
    # a short one (0.5 us): half speed -> ends at 1.0; the long one has 3.5 left -> 4.5
    assert shared_completion_times([0.0, 0.0], [0.5, 4.0], [[L], [L]], {"l": 1.0}).tolist() == pytest.approx([1.0, 4.5])


def test_stream_order_makes_a_transfer_begin_when_its_predecessor_ends():
    """No links in common: transfer 1 waits for transfer 0 (ends at 1.5) and runs 1 us: [1.5, 2.5]; the
    other way round (0 waits for 1): 0 begins at 1.0 and ends at 2.5. Integer starts, fractional ends."""
    begin, end = shared_transfer_times([0, 0], [1.5, 1.0], [[], []], {}, after=[-1, 0])
    assert begin.tolist() == [0.0, 1.5] and end.tolist() == [1.5, 2.5]
    begin, end = shared_transfer_times([0, 0], [1.5, 1.0], [[], []], {}, after=[1, -1])
    assert begin.tolist() == [1.0, 0.0] and end.tolist() == [2.5, 1.0]
    # a later own start wins over the predecessor's end
    begin, end = shared_transfer_times([0, 4], [1.5, 1.0], [[], []], {}, after=[-1, 0])
    assert begin.tolist() == [0.0, 4.0] and end.tolist() == [1.5, 5.0]
    # a zero-length transfer behind another ends when it begins
    begin, end = shared_transfer_times([0.0, 0.0], [2.0, 0.0], [[L], [L]], {"l": 1.0}, after=[-1, 0])
    assert begin.tolist() == [0.0, 2.0] and end.tolist() == [2.0, 2.0]


def test_a_transfer_runs_at_the_pace_of_its_slowest_flow():
    """Transfer 0 has a flow on a and one on b; transfer 1 shares a, transfer 2 is alone on c (capacities 1).
    On a each flow gets 1/2: transfer 0 runs at 1/2 of its alone speed, as does 1; 2 at full speed.
    2 us alone each -> 4, 4, 2."""
    paths = [[("a",), ("b",)], [("a",)], [("c",)]]
    cap = {"a": 1.0, "b": 1.0, "c": 1.0}
    assert shared_completion_times([0.0] * 3, [2.0] * 3, paths, cap).tolist() == pytest.approx([4.0, 4.0, 2.0])
    # b twice as fast as a alone does not help: a is still shared 1/2 -> the same
    cap2 = {"a": 1.0, "b": 2.0, "c": 1.0}
    assert shared_completion_times([0.0] * 3, [2.0] * 3, paths, cap2).tolist() == pytest.approx([4.0, 4.0, 2.0])


def test_transfers_on_one_path_list_count_as_copies_of_it():
    """Two transfers on the same path list object P and one on an equal but distinct list Q, all on link a:
    three flows on a -> 1/3 speed each; 3 us alone -> all end at 9. Without the third: 2 each -> 6."""
    p, q = [("a",)], [("a",)]
    cap = {"a": 1.0}
    assert shared_completion_times([0.0] * 3, [3.0] * 3, [p, p, q], cap).tolist() == pytest.approx([9.0] * 3)
    assert shared_completion_times([0.0] * 2, [3.0] * 2, [p, p], cap).tolist() == pytest.approx([6.0] * 2)
    # P's two transfers and Q's: the recurring mix (P, P, Q) then (P, Q) after a re-start
    ends = shared_completion_times([0.0, 0.0, 0.0, 20.0, 20.0], [3.0, 3.0, 3.0, 3.0, 3.0], [p, p, q, p, q], cap)
    assert ends.tolist() == pytest.approx([9.0, 9.0, 9.0, 26.0, 26.0])


def test_transfers_without_links_or_alone_run_at_full_speed():
    assert shared_completion_times([1.0], [2.0], [[L]], {"l": 1.0}).tolist() == [3.0]
    assert shared_completion_times([0.0, 0.0], [2.0, 3.0], [[], [L]], {"l": 1.0}).tolist() == pytest.approx([2.0, 3.0])
    assert shared_completion_times([0.0, 0.0], [2.0, 3.0], [[("a",)], [("b",)]],
                                   {"a": 1.0, "b": 1.0}).tolist() == pytest.approx([2.0, 3.0])
    assert shared_completion_times([], [], [], {}).tolist() == []


def test_disjoint_clusters_are_solved_apart():
    """Transfers 0,1 share a; 2,3 share b; 4 is alone on c: 2 us alone -> 4, 4, 4, 4, 2. A bridge transfer
    5 on a and b joins both clusters: a and b each carry 3 flows -> 1/3 speed for 0..3 and 5: 6 us."""
    cap = {"a": 1.0, "b": 1.0, "c": 1.0}
    paths = [[("a",)], [("a",)], [("b",)], [("b",)], [("c",)]]
    assert shared_completion_times([0.0] * 5, [2.0] * 5, paths, cap).tolist() == pytest.approx([4, 4, 4, 4, 2])
    paths.append([("a", "b")])
    assert shared_completion_times([0.0] * 6, [2.0] * 6, paths, cap).tolist() == pytest.approx([6, 6, 6, 6, 2, 6])


def test_concurrent_collectives_stretch_by_the_time_they_overlap():
    """Two identical all-gathers on the same 8 H100s, the second starting halfway through the first (T):
    the first runs alone T/2, then at half speed for its last T/2 (T): 1.5 T; the second has done T/2 when
    the first ends and runs its last T/2 alone: 1.5 T as well."""
    from chakra_schema.graph import CommType
    from replay.hardware.network import NetworkModel
    m = NetworkModel("h100-sxm")
    t = m.estimate(CommType.ALL_GATHER, 1 << 28, range(8)).time_us
    got = m.concurrent_us([(CommType.ALL_GATHER, 1 << 28, range(8)), (CommType.ALL_GATHER, 1 << 28, 8)],
                          starts=[0.0, t / 2])
    assert got == pytest.approx([1.5 * t, 1.5 * t], rel=1e-9)
    assert m.concurrent_us([(CommType.ALL_GATHER, 1 << 28, 8)]) == pytest.approx([t], rel=1e-12)


def test_a_lone_transfer_listed_first_does_not_hide_the_shared_ones():
    """c carries transfer 0 alone; a carries 1 and 2 (half speed each); a path-less transfer 3 runs at full
    speed next to them: 2 us alone -> 2, 4, 4, 2."""
    cap = {"a": 1.0, "c": 1.0}
    paths = [[("c",)], [("a",)], [("a",)], []]
    assert shared_completion_times([0.0] * 4, [2.0] * 4, paths, cap).tolist() == pytest.approx([2, 4, 4, 2])


def test_a_transfer_slowed_by_less_than_half_keeps_its_share():
    """Link a (3) carries transfers 0 and 1; 1 also crosses b (1). Alone: 0 at 3, 1 at 1. Together b holds
    1 at 1 and 0 gets the 2 left on a: speed 2/3 for 0, 1 for 1. 2 us alone each: 1 ends at 2, when 0 has
    2 - 4/3 = 2/3 left, then alone: 8/3."""
    cap = {"a": 3.0, "b": 1.0}
    ends = shared_completion_times([0.0, 0.0], [2.0, 2.0], [[("a",)], [("a", "b")]], cap)
    assert ends.tolist() == pytest.approx([8 / 3, 2.0], rel=1e-12)


def test_a_flow_cannot_take_bandwidth_its_transfer_cannot_use():
    """Transfer 0 is a ring over links a (10) and b (1), one flow each: alone it runs at 1 per flow, paced by
    b. Transfer 1 crosses a only (alone 10). Together: raising both rates, b fills at 1 (transfer 0 keeps its
    full speed), a then has 10 - 1 = 9 for transfer 1: speed 0.9. 9 us alone each: transfer 0 ends at 9,
    when transfer 1 has 9 - 0.9 x 9 = 0.9 us left, then alone: 9.9. (Sharing flow by flow would give each 5
    on a: both at half speed, for bandwidth transfer 0's flow on a cannot use.)"""
    cap = {"a": 10.0, "b": 1.0}
    ends = shared_completion_times([0.0, 0.0], [9.0, 9.0], [[("a",), ("b",)], [("a",)]], cap)
    assert ends.tolist() == pytest.approx([9.0, 9.9], rel=1e-12)


def test_a_dp_ring_paced_by_its_nic_leaves_nvlink_to_the_tp_group():
    """On H100 nodes, a TP pair {0, 1} and a 16-node DP ring through GPU 0 (its NVLink hop to GPU 4, then
    NICs): the ring's per-flow rate alone is the NIC's (50 GB/s x efficiency), far below NVLink's, so
    sharing GPU 0's NVLink leaves the TP pair all but that rate: TP speed = 1 - nic / nvlink, the ring at
    full speed."""
    from replay.hardware.network import NetworkModel, _speeds
    net = NetworkModel("h100-sxm")
    hw = net.hw
    nvlink = hw.node.nvlink_bw_gbs * hw.node.nvlink_efficiency
    nic = hw.network.nic_gbps / 8 * hw.network.nic_efficiency
    tp, dp = net.transfer_paths([0, 1]), net.transfer_paths([4 * k for k in range(32)])
    cap = net.topology.capacity
    speeds = _speeds([0, 1], [tp, dp], cap, {})
    assert speeds == pytest.approx([1 - nic / nvlink, 1.0], rel=1e-6)


def test_a_transfer_with_two_flows_on_one_link_crosses_it_twice():
    """Transfer 0 has two flows over link a (4) and one over b (10); transfer 1 one flow over b. As transfers:
    0 crosses a twice (its rate per flow is at most 4 / 2 = 2) and b once; filling raises both rates: a fills
    at 2 (transfer 0 frozen at 2), b then has 10 - 2 = 8 for transfer 1."""
    from replay.hardware.network import FlowIncidence
    inc = FlowIncidence.of_transfers([[("a",), ("a",), ("b",)], [("b",)]], {"a": 4.0, "b": 10.0})
    assert sorted(zip(inc.flow_of.tolist(), inc.link_of.tolist(), inc.crossings.tolist())) == \
        [(0, 0, 2.0), (0, 1, 1.0), (1, 1, 1.0)]
    assert fair_share_on(inc).tolist() == pytest.approx([2.0, 8.0], rel=1e-12)
    # two copies of transfer 1: b has 10 - 2 = 8 for two flows -> 4 each
    assert fair_share_on(inc, [1, 2]).tolist() == pytest.approx([2.0, 4.0], rel=1e-12)
