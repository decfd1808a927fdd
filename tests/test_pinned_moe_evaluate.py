"""MoE placement costing (estimators/moe/evaluate.py) on routings small enough to count by hand.

Definitions (the module docstring; DeepSeek-V3 / Megatron-core token dispatcher):
- batches are consecutive windows of G x tokens_per_gpu tokens; a window's tokens go to the EP ranks in
  arrival order, ceil(window / G) per rank (a short trailing window too), or, grouped by domain, each
  domain owns a fixed range of every window in proportion to its share of the part.
- pairs[g, h] = (token, expert) pairs from rank g to the GPU h serving the expert; a replicated expert is
  served by its replica on the token's own node when there is one, else its replicas share evenly.
- all-to-all bytes = off-GPU pairs x hidden x (dispatch + combine bytes per element); inter-node = pairs
  between different nodes.
- the expert FFN of a GPU = one up(+gate) GEMM [m, hidden] x [hidden, up] and one down GEMM
  [m, ffn] x [ffn, hidden] per expert slot with m tokens (equal m batched), plus the activation's HBM
  traffic 3 x tokens x ffn x 2 B (read gate and up, write the product); the layer = dispatch + slowest GPU
  + combine + router GEMM [T, hidden] x [hidden, E] and shared experts on the rank's own T tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from estimators.moe import evaluate as ev
from estimators.moe.evaluate import (ExpertShape, Layout, LayerTimer, PlacementCost, aligned_chunks,
                                     evaluate_expected, evaluate_placements, fit_stats, hardware_models,
                                     moe_layer_parts, part_gpus, slowest_gpu_us, source_gpus)
from estimators.moe.placement import Placement
from estimators.moe.routing import ArraySource

HW = "h100-sxm"
HIDDEN, FFN = 16, 32
# EP4 on 2 nodes of 2 GPUs, 4 experts (expert e on GPU e), 2 tokens per GPU, top-2 (token t on GPU t // 2)
ROUTING = [[0, 1], [2, 3], [1, 2], [0, 3], [2, 0], [3, 1], [3, 2], [0, 2]]
# pairs rank -> rank counted from ROUTING: 16 pairs, 4 stay on their GPU, 7 cross nodes
PAIRS = np.array([[1, 1, 1, 1],
                  [1, 1, 1, 1],
                  [1, 1, 1, 1],
                  [1, 0, 2, 1]])
RECEIVED = [4, 3, 5, 4]            # column sums: tokens each GPU's expert serves
ALL_LOCAL = [[0, 0], [0, 0], [1, 1], [1, 1], [2, 2], [2, 2], [3, 3], [3, 3]]   # every pair on its own GPU


def _src(rows, layers: int = 1, domain=None) -> ArraySource:
    a = np.asarray(rows, dtype=np.int32)
    a = np.repeat(a[:, None, :], layers, axis=1) if a.ndim == 2 else a
    return ArraySource(a, domain=None if domain is None else np.asarray(domain, dtype=np.int32))


def _layout(gpus=4, gpn=2, tokens=2, group_by="none") -> Layout:
    return Layout(gpus=gpus, gpus_per_node=gpn, tokens_per_gpu=tokens, group_by=group_by)


def _shape(dispatch=2, combine=2, shared=0, shared_ffn=0, experts=4, gated=True) -> ExpertShape:
    return ExpertShape(hidden=HIDDEN, expert_ffn=FFN, gated=gated, shared_experts=shared, experts=experts,
                       dispatch_bytes=dispatch, combine_bytes=combine, shared_ffn=shared_ffn)


def _contiguous(gpus=4, gpn=2, experts=4, layers=1) -> Placement:
    per = experts // gpus
    return Placement("contiguous", np.tile(np.arange(experts), (layers, 1)), gpus=gpus, gpus_per_node=gpn,
                     experts=experts)


def _timer(shape=None, layout=None) -> LayerTimer:
    return LayerTimer(shape or _shape(), HW, layout or _layout())


def _ffn_us(c, m: int, ffn: int = FFN, batch: int = 1, gated: bool = True) -> float:
    """The two GEMMs of `batch` experts on m tokens each (no activation)."""
    up = 2 * ffn if gated else ffn
    return c.gemm(m, up, HIDDEN, batch=batch).time_us + c.gemm(m, HIDDEN, ffn, batch=batch).time_us


# ---------------------------------------------------------------------- layout and token -> rank
def test_a_window_is_gpus_times_tokens_per_gpu_and_nodes_are_gpus_over_gpus_per_node():
    lay = Layout(gpus=8, gpus_per_node=4, tokens_per_gpu=3)
    assert (lay.window, lay.nodes, lay.group_by) == (24, 2, "none")


def test_tokens_go_to_ranks_in_arrival_order_and_a_short_window_spreads_over_the_ranks():
    """Windows of 8 on 4 ranks: 2 each; a trailing window of 2 tokens: 1 each on ranks 0, 1;
    of 5 tokens: ceil(5 / 4) = 2 each -> 0, 0, 1, 1, 2."""
    assert source_gpus(_layout(), np.zeros(10)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 0, 1]
    assert source_gpus(_layout(), np.zeros(5)).tolist() == [0, 0, 1, 1, 2]
    assert source_gpus(_layout(), None).tolist() == []
    assert part_gpus(_src(ROUTING * 2), 3, 16, _layout()).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2]


def test_grouping_by_domain_gives_each_domain_a_fixed_range_of_the_window():
    """Domains 1, 0, 1, 0, ...: shares 1/2, 1/2, ranges [0, 4) and [4, 8): domain-0 tokens (1, 3, 5, 7)
    take positions 0-3 (ranks 0, 0, 1, 1), domain-1 tokens (0, 2, 4, 6) positions 4-7 (ranks 2, 2, 3, 3)."""
    dom = [1, 0, 1, 0, 1, 0, 1, 0]
    lay = _layout(group_by="domain")
    assert part_gpus(_src(ROUTING, domain=dom), 0, 8, lay).tolist() == [2, 0, 2, 0, 3, 1, 3, 1]
    assert source_gpus(lay, np.asarray(dom)).tolist() == [2, 0, 2, 0, 3, 1, 3, 1]


def test_grouping_by_domain_in_proportion_to_unequal_shares():
    """Domains 2, 2, 0, 1, 1, 1, 1, 2: shares 1/8, 4/8, 3/8 -> ranges start at 0, 1, 5. Positions: token 2 -> 0,
    tokens 3-6 -> 1-4, tokens 0, 1, 7 -> 5, 6, 7; ranks = position // 2."""
    dom = np.asarray([2, 2, 0, 1, 1, 1, 1, 2])
    assert source_gpus(_layout(group_by="domain"), dom).tolist() == [2, 3, 0, 0, 1, 1, 2, 3]


def test_a_domain_larger_than_its_range_spills_into_the_next_and_windows_are_grouped_apart():
    """Two windows, domain shares 1/2 each (ranges 0 and 4). Window 0: six domain-0 tokens want 0-5, two
    domain-1 tokens want 4, 5; ties go in arrival order: 0, 1, 2, 3, 4, 6 | 5, 7 -> ranks 0 0 1 1 2 3 2 3.
    Window 1: six domain-1 tokens want 4-9, two domain-0 tokens 0, 1 -> tokens 14, 15 first."""
    dom = np.asarray([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    assert source_gpus(_layout(group_by="domain"), dom).tolist() == [0, 0, 1, 1, 2, 3, 2, 3,
                                                                     1, 1, 2, 2, 3, 3, 0, 0]


def test_grouping_by_domain_needs_request_domains():
    with pytest.raises(TraceInputError, match=r"--group-by domain needs a routing trace with request domains"):
        part_gpus(_src(ROUTING), 0, 8, _layout(group_by="domain"))


class _Ragged:
    """A source that yields chunks of 3, 5, 2, 3, ... tokens whatever size is asked."""
    path = "<ragged>"

    def __init__(self, n):
        self.ids = np.arange(n)

    def chunks(self, start, stop, size):
        sizes, a, i = [3, 5, 2], start, 0
        while a < stop:
            b = min(a + sizes[i % 3], stop)
            yield a, self.ids[a:b]
            a, i = b, i + 1


def test_chunks_are_realigned_to_the_asked_size_with_a_short_last_one():
    got = list(aligned_chunks(_Ragged(20), 1, 20, 4))
    assert [f for f, _ in got] == [1, 5, 9, 13, 17]
    assert [ids.tolist() for _, ids in got] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16],
                                                [17, 18, 19]]
    assert [ids.tolist() for _, ids in aligned_chunks(_Ragged(8), 0, 8, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


# ---------------------------------------------------------------------- fitting statistics
def test_fit_stats_count_pairs_per_expert_per_source_node_and_coactivated_pairs():
    """ROUTING: expert 0 chosen by t0 t3 t4 t7, 1 by t0 t2 t5, 2 by t1 t2 t4 t6 t7, 3 by t1 t3 t5 t6.
    Node 0 holds t0-t3 (2, 2, 2, 2 pairs), node 1 t4-t7 (2, 1, 3, 2). Co-chosen: {0,1} 1, {2,3} 2, {1,2} 1,
    {0,3} 1, {0,2} 2, {1,3} 1. Layer 1 routes every token to its experts shifted by one (e -> e + 1 mod 4)."""
    a = np.asarray(ROUTING, dtype=np.int32)
    src = ArraySource(np.stack([a, (a + 1) % 4], axis=1))
    seen = []
    st = fit_stats(src, 0, 8, _layout(), 4, progress=lambda d, t: seen.append((d, t)))
    assert st.load.tolist() == [[4, 3, 5, 4], [4, 4, 3, 5]]
    assert st.node_load[0].tolist() == [[2, 2, 2, 2], [2, 1, 3, 2]]
    assert st.node_load[1].tolist() == [[2, 2, 2, 2], [2, 2, 1, 3]]
    co = np.zeros((4, 4), int)
    for (i, j), n in {(0, 1): 1, (2, 3): 2, (1, 2): 1, (0, 3): 1, (0, 2): 2, (1, 3): 1}.items():
        co[i, j] = co[j, i] = n
    assert st.coactivation[0].tolist() == co.tolist()
    shifted = co[np.ix_([3, 0, 1, 2], [3, 0, 1, 2])]
    assert st.coactivation[1].tolist() == shifted.tolist()
    assert (st.tokens, st.gpus, st.gpus_per_node) == (8, 4, 2)
    assert seen == [(8, 8)]


def test_fit_stats_sample_coactivation_from_the_first_tokens_only():
    """The first 3 tokens co-choose {0,1}, {2,3}, {1,2}; coactivation_tokens=0 keeps none."""
    st = fit_stats(_src(ROUTING), 0, 8, _layout(), 4, coactivation_tokens=3)
    co = np.zeros((4, 4), int)
    for i, j in ((0, 1), (2, 3), (1, 2)):
        co[i, j] = co[j, i] = 1
    assert st.coactivation[0].tolist() == co.tolist()
    assert st.load.tolist() == [[4, 3, 5, 4]]
    assert fit_stats(_src(ROUTING), 0, 8, _layout(), 4, coactivation_tokens=0).coactivation is None


def test_fit_stats_of_a_part_start_its_windows_at_the_part():
    """Tokens 2-7 (6 tokens, one short window: ranks 0 0 1 1 2 2 -> node 0 holds t2-t5, node 1 t6, t7):
    node 0 chooses 0: t3 t4, 1: t2 t5, 2: t2 t4, 3: t3 t5; node 1 0: t7, 2: t6 t7, 3: t6."""
    st = fit_stats(_src(ROUTING), 2, 8, _layout(), 4)
    assert st.tokens == 6
    assert st.node_load[0].tolist() == [[2, 2, 2, 2], [1, 0, 2, 1]]
    assert st.load.tolist() == [[3, 2, 4, 3]]


def test_fit_stats_sample_coactivation_across_chunks():
    """70,000 tokens (two 65,536-token chunks), sampled over the first 65,540: counted with numpy here."""
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(8)[:3] for _ in range(70_000)]).astype(np.int32)
    n = 65_540
    st = fit_stats(_src(ids), 0, 70_000, _layout(gpus=8, gpn=4, tokens=5), 8, coactivation_tokens=n)
    want = np.zeros((8, 8), np.int64)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        np.add.at(want, (ids[:n, i], ids[:n, j]), 1)
    assert np.array_equal(st.coactivation[0], want + want.T)
    assert st.load[0].tolist() == np.bincount(ids.ravel(), minlength=8).tolist()


# ---------------------------------------------------------------------- expert and shared FFN times
def test_expert_shape_up_width_is_twice_the_ffn_when_gated():
    assert _shape().up_width == 2 * FFN
    assert _shape(gated=False).up_width == FFN


def test_one_expert_is_an_up_gemm_the_activation_traffic_and_a_down_gemm():
    t = _timer()
    c = t.compute
    want = _ffn_us(c, 7) + c.memory_op(7 * FFN * 2 * 3).time_us
    assert t.expert_us(7) == pytest.approx(want, rel=1e-12)
    assert t.expert_us(7) == t.expert_us(7)
    want48 = _ffn_us(c, 7, ffn=48) + c.memory_op(7 * 48 * 2 * 3).time_us
    assert t.expert_us(7, 48) == pytest.approx(want48, rel=1e-12)
    assert t.expert_us(0) == 0.0
    ug = _timer(_shape(gated=False))
    assert ug.expert_us(7) == pytest.approx(_ffn_us(c, 7, gated=False) + c.memory_op(7 * FFN * 6).time_us,
                                            rel=1e-12)


def test_a_gpus_experts_batch_equal_token_counts_and_skip_empty_slots():
    """Slots with 3, 5, 0, 3 tokens: one batched pair of GEMMs for the two 3-token experts, one for the
    5-token expert, and the activation traffic of all 11 tokens."""
    t = _timer()
    c = t.compute
    want = _ffn_us(c, 3, batch=2) + _ffn_us(c, 5) + c.memory_op(11 * FFN * 2 * 3).time_us
    assert t.gpu_experts_us([3, 5, 0, 3]) == pytest.approx(want, rel=1e-12)
    assert t.gpu_experts_us(np.array([3, 3, 5])) == pytest.approx(want, rel=1e-12)
    assert t.gpu_experts_us([0, 0]) == 0.0
    assert _timer(_shape(gated=False)).gpu_experts_us([4]) == pytest.approx(
        _ffn_us(c, 4, gated=False) + c.memory_op(4 * FFN * 6).time_us, rel=1e-12)


def test_the_router_and_shared_experts_run_on_the_ranks_own_tokens():
    """Router [T, hidden] x [hidden, E]; two shared experts of width 64 on T tokens; T rounds, at least 1."""
    t = _timer(_shape(shared=2, shared_ffn=64))
    c = t.compute
    router = c.gemm(6, 4, HIDDEN).time_us
    shared = _ffn_us(c, 6, ffn=64) + c.memory_op(6 * 64 * 6).time_us
    assert t.shared_us(6) == pytest.approx(router + 2 * shared, rel=1e-12)
    assert t.shared_us(5.6) == pytest.approx(router + 2 * shared, rel=1e-12)
    assert t.shared_us(0.2) == pytest.approx(c.gemm(1, 4, HIDDEN).time_us + 2 * (
        _ffn_us(c, 1, ffn=64) + c.memory_op(64 * 6).time_us), rel=1e-12)
    assert _timer(_shape()).shared_us(6) == pytest.approx(router, rel=1e-12)
    lay = _layout(tokens=6)
    assert _timer(_shape(shared=1), lay).fixed_us() == pytest.approx(
        router + _ffn_us(c, 6) + c.memory_op(6 * FFN * 6).time_us, rel=1e-12)


def test_the_all_to_all_is_timed_on_pairs_times_hidden_times_bytes_per_element():
    t = _timer()
    net = t.network
    ranks = [0, 1, 2, 3]
    assert t.a2a_us(PAIRS, 2) == pytest.approx(net.all_to_all_v_us(PAIRS * HIDDEN * 2.0, ranks), rel=1e-12)
    assert t.a2a_us(PAIRS.T, 1) == pytest.approx(net.all_to_all_v_us(PAIRS.T * HIDDEN * 1.0, ranks), rel=1e-12)
    lat, drain = t.a2a_parts(PAIRS, 2)
    assert float((lat + drain).min()) == pytest.approx(t.a2a_us(PAIRS, 2), rel=1e-12)
    # half the bytes: the latency once, half the drain
    half = net.all_to_all_v_us(PAIRS * HIDDEN * 1.0, ranks)
    assert t.a2a_us(PAIRS, 2, 0.5) == pytest.approx(half, rel=1e-9)


def test_hardware_models_are_kept_per_preset():
    import dataclasses
    from replay.hardware.config import get_hardware
    hw = get_hardware(HW)
    ev._MODELS.clear()                      # a fresh cache, whatever ran before in this process
    c1, n1 = hardware_models(hw)
    c2, n2 = hardware_models(hw)
    assert c1 is c2 and n1 is n2
    assert c1.hw.name == hw.name and n1.hw.name == hw.name
    other = dataclasses.replace(hw)
    c3, _ = hardware_models(other)
    assert c3 is not c1


# ---------------------------------------------------------------------- slowest GPU
def test_the_slowest_gpu_is_the_one_whose_experts_take_longest():
    t = _timer()
    rows = np.array([[3, 0], [5, 1], [2, 2], [0, 4]])
    assert slowest_gpu_us(t, rows) == max(t.gpu_experts_us(r) for r in rows)


def test_a_large_group_times_only_the_candidates_for_the_slowest_gpu():
    """40 GPUs: one slot each -> the GPU with most tokens; 3 slots each -> the max over all GPUs (the busiest
    by total, by largest slot and by busy slots are among the candidates)."""
    lay = _layout(gpus=40, gpn=8, tokens=4)
    t = _timer(layout=lay)
    rng = np.random.default_rng(3)
    one = rng.integers(0, 50, size=(40, 1))
    assert slowest_gpu_us(t, one) == t.gpu_experts_us(one[int(np.argmax(one[:, 0]))])
    for _ in range(5):
        rows = rng.integers(0, 40, size=(40, 3)) * (rng.random((40, 3)) < 0.7)
        assert slowest_gpu_us(t, rows) == max(t.gpu_experts_us(r) for r in rows)
    rows = np.zeros((40, 3), np.int64)
    rows[17] = [1, 1, 1]                                    # most busy slots but tiny
    rows[:9, 0] = 2
    rows[30] = [200, 0, 0]                                  # one huge slot
    assert slowest_gpu_us(t, rows) == t.gpu_experts_us(rows[30])


# ---------------------------------------------------------------------- costing placements on batches
def test_one_batch_costs_its_hand_counted_pairs_loads_and_layer_time():
    """Received pairs per GPU 4, 3, 5, 4: max / mean = 5 / 4; layer = dispatch + slowest GPU + combine
    + router (no shared expert)."""
    t = _timer()
    [cost] = evaluate_placements(_src(ROUTING), 0, 8, _layout(), 4, [_contiguous()], t)
    assert cost.windows == 1 and cost.timed_windows == 1
    assert cost.a2a_bytes.tolist() == [12 * HIDDEN * 4]
    assert cost.a2a_bytes_inter_node.tolist() == [7 * HIDDEN * 4]
    assert cost.max_over_mean.tolist() == [1.25]
    assert cost.pair_tokens[0, 0].tolist() == PAIRS.tolist()
    assert cost.slot_tokens[0, 0].tolist() == [[4], [3], [5], [4]]
    slowest = t.gpu_experts_us([5])
    d = t.a2a_us(PAIRS, 2)
    c = t.a2a_us(PAIRS.T, 2)
    assert cost.expert_us[0] == pytest.approx(slowest, rel=1e-12)
    assert cost.dispatch_us[0] == pytest.approx(d, rel=1e-12)
    assert cost.combine_us[0] == pytest.approx(c, rel=1e-12)
    router = t.compute.gemm(2, 4, HIDDEN).time_us
    assert cost.layer_us[0] == pytest.approx(d + slowest + c + router, rel=1e-12)
    assert cost.moe_latency_us == pytest.approx(d + slowest + c + router, rel=1e-12)
    lat_d, drain_d, lat_c, drain_c = cost.a2a_parts[0][0]
    assert float((lat_d + drain_d).min()) == pytest.approx(d, rel=1e-12)
    assert float((lat_c + drain_c).min()) == pytest.approx(c, rel=1e-12)


def test_without_a_timer_only_bytes_and_loads_are_counted_at_4_bytes_a_pair():
    [cost] = evaluate_placements(_src(ROUTING), 0, 8, _layout(), 4, [_contiguous()], None)
    assert cost.a2a_bytes.tolist() == [12 * 4] and cost.a2a_bytes_inter_node.tolist() == [7 * 4]
    assert cost.timed_windows == 0 and cost.layer_us.tolist() == [0.0] and cost.a2a_parts is None
    assert cost.pair_tokens.shape == (0, 1, 4, 4)


def test_bytes_and_loads_average_over_every_window_and_times_over_the_timed_ones():
    """Window 0 = ROUTING, window 1 = every pair local (no bytes, loads 4 each): averages of the two."""
    t = _timer()
    [cost] = evaluate_placements(_src(ROUTING + ALL_LOCAL), 0, 16, _layout(), 4, [_contiguous()], t)
    assert cost.windows == 2 and cost.timed_windows == 2
    assert cost.a2a_bytes.tolist() == [12 * HIDDEN * 4 / 2]
    assert cost.a2a_bytes_inter_node.tolist() == [7 * HIDDEN * 4 / 2]
    assert cost.max_over_mean.tolist() == [(1.25 + 1.0) / 2]
    d = t.a2a_us(PAIRS, 2)
    assert cost.dispatch_us[0] == pytest.approx(d / 2, rel=1e-12)
    assert cost.expert_us[0] == pytest.approx((t.gpu_experts_us([5]) + t.gpu_experts_us([4])) / 2, rel=1e-12)
    assert cost.pair_tokens[1, 0].tolist() == (np.eye(4) * 4).tolist()     # 2 tokens x top-2 each


def test_a_trailing_partial_batch_is_left_out_and_timed_windows_spread_over_the_part():
    """3 whole windows (+ 3 tokens): one timed window -> window 0; two -> windows 0 and 2."""
    t = _timer()
    rows = ROUTING + ALL_LOCAL + ROUTING + ROUTING[:3]
    [one] = evaluate_placements(_src(rows), 0, len(rows), _layout(), 4, [_contiguous()], t, timed_windows=1)
    assert one.windows == 3 and one.timed_windows == 1
    assert one.a2a_bytes.tolist() == [2 * 12 * HIDDEN * 4 / 3]
    assert one.dispatch_us[0] == pytest.approx(t.a2a_us(PAIRS, 2), rel=1e-12)
    [two] = evaluate_placements(_src(rows), 0, len(rows), _layout(), 4, [_contiguous()], t, timed_windows=2)
    assert two.timed_windows == 2
    assert [p.tolist() for p in two.pair_tokens[:, 0]] == [PAIRS.tolist(), PAIRS.tolist()]
    [mid] = evaluate_placements(_src(rows), 8, 16, _layout(), 4, [_contiguous()], t)
    assert mid.a2a_bytes.tolist() == [0.0] and mid.dispatch_us.tolist() == [0.0]


def test_layer_times_are_averaged_per_layer():
    """Two MoE layers: layer 0 = ROUTING, layer 1 every pair local."""
    t = _timer()
    src = ArraySource(np.stack([np.asarray(ROUTING), np.asarray(ALL_LOCAL)], axis=1).astype(np.int32))
    [cost] = evaluate_placements(src, 0, 8, _layout(), 4, [_contiguous(layers=2)], t)
    assert cost.a2a_bytes.tolist() == [12 * HIDDEN * 4, 0.0]
    assert cost.dispatch_us[0] == pytest.approx(t.a2a_us(PAIRS, 2), rel=1e-12) and cost.dispatch_us[1] == 0.0
    assert cost.expert_us[1] == pytest.approx(t.gpu_experts_us([4]), rel=1e-12)
    assert cost.timed_windows == 2


def test_too_few_tokens_for_one_batch_is_a_one_line_error():
    with pytest.raises(TraceInputError, match=r"the evaluated part has 7 tokens, fewer than one batch \(EP4 x 2 "
                                              r"tokens per GPU\): give a longer trace or fewer tokens per GPU"):
        evaluate_placements(_src(ROUTING), 1, 8, _layout(), 4, [_contiguous()], None)


def test_an_expert_id_outside_the_model_is_an_error():
    with pytest.raises(TraceInputError, match="expert id 4 at token 1 layer 0"):
        evaluate_placements(_src([[0, 1], [4, 1]] + ROUTING[2:]), 0, 8, _layout(), 4, [_contiguous()], None)


def test_a_replicated_expert_serves_the_tokens_of_its_own_node():
    """Slots 0 1 2 0: expert 0 on GPU 0 (node 0) and GPU 3 (node 1). Routing (rank: experts):
    t0 g0: 0 1 -> g0 g1; t1 g0: 0 2 -> g0 g2; t2 g1: 0 1 -> g0 g1; t3 g1: 2 1 -> g2 g1;
    t4 g2: 0 2 -> g3 g2; t5 g2: 0 1 -> g3 g1; t6 g3: 0 2 -> g3 g2; t7 g3: 1 2 -> g1 g2.
    Pairs: 16, 6 on their GPU, 4 between nodes; GPUs serve 3, 5, 5, 3 tokens."""
    rows = [[0, 1], [0, 2], [0, 1], [2, 1], [0, 2], [0, 1], [0, 2], [1, 2]]
    pl = Placement("eplb", np.array([[0, 1, 2, 0]]), gpus=4, gpus_per_node=2, experts=3)
    t = _timer(_shape(experts=3))
    [cost] = evaluate_placements(_src(rows), 0, 8, _layout(), 3, [pl], t)
    pairs = [[2, 1, 1, 0], [1, 2, 1, 0], [0, 1, 1, 2], [0, 1, 2, 1]]
    assert cost.pair_tokens[0, 0].tolist() == pairs
    assert cost.a2a_bytes.tolist() == [10 * HIDDEN * 4]
    assert cost.a2a_bytes_inter_node.tolist() == [4 * HIDDEN * 4]
    assert cost.slot_tokens[0, 0].tolist() == [[3], [5], [5], [3]]
    assert cost.max_over_mean.tolist() == [1.25]


def test_replicas_on_one_node_share_its_tokens_and_other_nodes_spread_over_them():
    """Slots (2 per GPU) 0 1 | 0 2 | 3 1 | 3 2 on 2 nodes of 2 GPUs, 4 experts: expert 0 on GPUs 0, 1 (node 0),
    1 on GPUs 0, 2, 2 on GPUs 1, 3, 3 on GPUs 2, 3 (node 1). One token per GPU, top-1, all to expert 0:
    node 0's 2 tokens split 1 / 1 over GPUs 0, 1 (on node); node 1's 2 spread 1 / 1 over GPUs 0, 1.
    Pairs: g0 -> 0.5 g0 + 0.5 g1, ...; served: GPU 0 and 1 serve 2 tokens each."""
    pl = Placement("eplb", np.array([[0, 1, 0, 2, 3, 1, 3, 2]]), gpus=4, gpus_per_node=2, experts=4)
    t = _timer()
    [cost] = evaluate_placements(_src([[0], [0], [0], [0]]), 0, 4, _layout(tokens=1), 4, [pl], t)
    half = [[0.5, 0.5, 0, 0]] * 4
    assert cost.pair_tokens[0, 0].tolist() == half
    assert cost.a2a_bytes.tolist() == [(4 - 1) * HIDDEN * 4]       # 4 pairs, 0.5 + 0.5 on their own GPU
    assert cost.a2a_bytes_inter_node.tolist() == [2 * HIDDEN * 4]
    assert cost.slot_tokens[0, 0].tolist() == [[2, 0], [2, 0], [0, 0], [0, 0]]
    assert cost.max_over_mean.tolist() == [2.0]


def test_two_slots_of_one_expert_on_one_gpu_share_its_tokens():
    """Slots 0 0 | 1 2 on one node of 2 GPUs: GPU 0 holds expert 0 twice; 4 tokens to expert 0 -> 2 a slot."""
    pl = Placement("eplb", np.array([[0, 0, 1, 2]]), gpus=2, gpus_per_node=2, experts=3)
    t = _timer(_shape(experts=3), _layout(gpus=2, gpn=2, tokens=2))
    [cost] = evaluate_placements(_src([[0], [0], [0], [0]]), 0, 4, _layout(gpus=2, gpn=2, tokens=2), 3, [pl], t)
    assert cost.slot_tokens[0, 0].tolist() == [[2, 2], [0, 0]]
    assert cost.pair_tokens[0, 0].tolist() == [[2, 0], [2, 0]]


# ---------------------------------------------------------------------- expected counts
def test_expected_counts_share_every_ranks_pairs_by_the_layer_loads():
    """Loads 2 : 1 : 1 : 0, 2 tokens x top-2 = 4 pairs a rank -> 2, 1, 1, 0 to GPUs 0-3. Off-GPU:
    16 - (2 + 1 + 1 + 0) = 12 pairs; between nodes: node 0's ranks send 1 + 0, node 1's 2 + 1 -> 8.
    Received 8, 4, 4, 0: max / mean 2."""
    t = _timer()
    loads = np.array([[2.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    [cost] = evaluate_expected(loads, 2, _layout(), [_contiguous(layers=2)], t)
    assert cost.windows == 1 and cost.timed_windows == 2
    assert cost.a2a_bytes.tolist() == [12 * HIDDEN * 4, 12 * HIDDEN * 4]
    assert cost.a2a_bytes_inter_node.tolist() == [8 * HIDDEN * 4, 8 * HIDDEN * 4]
    assert cost.max_over_mean.tolist() == [2.0, 1.0]
    pairs = np.tile([2.0, 1.0, 1.0, 0.0], (4, 1))
    assert cost.pair_tokens[0, 0].tolist() == pairs.tolist()
    assert cost.dispatch_us[0] == pytest.approx(t.a2a_us(pairs, 2), rel=1e-12)
    assert cost.expert_us[0] == pytest.approx(t.gpu_experts_us([8]), rel=1e-12)
    assert cost.expert_us[1] == pytest.approx(t.gpu_experts_us([4]), rel=1e-12)
    router = t.compute.gemm(2, 4, HIDDEN).time_us
    ones = np.ones((4, 4))
    assert cost.layer_us[1] == pytest.approx(t.a2a_us(ones, 2) + t.gpu_experts_us([4]) + t.a2a_us(ones, 2) + router,
                                             rel=1e-12)


def test_expected_counts_without_a_timer_count_bytes_only():
    [cost] = evaluate_expected(np.array([[1.0, 1.0, 1.0, 1.0]]), 2, _layout(), [_contiguous()], None)
    assert cost.a2a_bytes.tolist() == [12 * 4] and cost.timed_windows == 0 and cost.layer_us.tolist() == [0.0]


def test_expected_counts_with_a_replicated_expert_stay_on_the_node():
    """Slots 0 1 2 0 (expert 0 on GPU 0 and GPU 3), loads 2 : 1 : 1, 2 tokens x top-2: each rank sends 2 pairs
    to expert 0 (its node's replica), 1 to GPU 1, 1 to GPU 2."""
    pl = Placement("eplb", np.array([[0, 1, 2, 0]]), gpus=4, gpus_per_node=2, experts=3)
    [cost] = evaluate_expected(np.array([[2.0, 1.0, 1.0]]), 2, _layout(), [pl], _timer(_shape(experts=3)))
    assert cost.pair_tokens[0, 0].tolist() == [[2, 1, 1, 0], [2, 1, 1, 0], [0, 1, 1, 2], [0, 1, 1, 2]]
    assert cost.slot_tokens[0, 0].tolist() == [[4], [4], [4], [4]]


# ---------------------------------------------------------------------- per-layer parts at a scale
def test_layer_parts_at_full_scale_are_the_costed_times():
    t = _timer(_shape(shared=1))
    [cost] = evaluate_placements(_src(ROUTING + ALL_LOCAL), 0, 16, _layout(), 4, [_contiguous()], t)
    experts, dispatch, combine, shared = moe_layer_parts(cost, t)
    assert experts[0] == pytest.approx(cost.expert_us[0], rel=1e-12)
    assert dispatch[0] == pytest.approx(cost.dispatch_us[0], rel=1e-12)
    assert combine[0] == pytest.approx(cost.combine_us[0], rel=1e-12)
    assert shared[0] == pytest.approx(t.shared_us(2), rel=1e-12)


def test_half_a_batch_halves_the_drain_and_the_expert_tokens():
    """scale 0.5: slots 4 3 5 4 -> 2 2 2 2 (round half to even), a2a latency + drain / 2, shared on 1 token."""
    t = _timer(_shape(shared=1))
    [cost] = evaluate_placements(_src(ROUTING), 0, 8, _layout(), 4, [_contiguous()], t)
    experts, dispatch, combine, shared = moe_layer_parts(cost, t, 0.5)
    assert experts[0] == pytest.approx(t.gpu_experts_us([2]), rel=1e-12)
    assert dispatch[0] == pytest.approx(t.a2a_us(PAIRS, 2, 0.5), rel=1e-12)
    assert combine[0] == pytest.approx(t.a2a_us(PAIRS.T, 2, 0.5), rel=1e-12)
    assert shared[0] == pytest.approx(t.shared_us(1), rel=1e-12)
    cost.a2a_parts = None                        # a cost without parts is timed from its pairs
    _, d2, c2, _ = moe_layer_parts(cost, t, 0.5)
    assert d2[0] == pytest.approx(dispatch[0], rel=1e-12) and c2[0] == pytest.approx(combine[0], rel=1e-12)
    fp8 = _timer(_shape(dispatch=1, combine=2, shared=1))
    [c8] = evaluate_placements(_src(ROUTING), 0, 8, _layout(), 4, [_contiguous()], fp8)
    c8.a2a_parts = None
    _, d8, cc8, _ = moe_layer_parts(c8, fp8)
    assert d8[0] == pytest.approx(fp8.a2a_us(PAIRS, 1), rel=1e-12)
    assert cc8[0] == pytest.approx(fp8.a2a_us(PAIRS.T, 2), rel=1e-12)


def test_a_placement_cost_without_timed_batches_has_no_layer_parts():
    cost = PlacementCost(_contiguous(), pair_tokens=np.zeros((0, 1, 4, 4)), slot_tokens=np.zeros((0, 1, 4, 1)))
    experts, dispatch, combine, shared = moe_layer_parts(cost, _timer())
    assert experts.tolist() == [0.0] and dispatch.tolist() == [0.0] and combine.tolist() == [0.0]


# ---------------------------------------------------------------------- shapes large enough to leave the launch floor
# A DeepSeek-V2-Lite-like expert (hidden 4,096, expert FFN 1,536, FP8 GEMMs) with 4,096 tokens: every GEMM and
# the activation traffic (4,096 x 1,536 x 6 B = 37.7 MB) take longer than the minimum kernel time, so each
# term of the sums below is visible.
BIG = ExpertShape(hidden=4096, expert_ffn=1536, gated=True, shared_experts=2, experts=64, dtype="fp8",
                  shared_ffn=3072)


def _big_timer(gpus=8, tokens=4096) -> LayerTimer:
    return LayerTimer(BIG, HW, _layout(gpus=gpus, gpn=8 if gpus % 8 == 0 else gpus, tokens=tokens))


def _big_ffn(c, m: int, f: int = 1536, batch: int = 1, dtype: str = "fp8") -> float:
    return (c.gemm(m, 2 * f, 4096, batch=batch, dtype=dtype).time_us
            + c.gemm(m, 4096, f, batch=batch, dtype=dtype).time_us)


def test_a_large_expert_is_its_fp8_gemms_plus_its_activation_traffic():
    t = _big_timer()
    c = t.compute
    assert c.memory_op(4096 * 1536 * 6).time_us > 2 * c.memory_op(1).time_us      # off the launch floor
    assert t.expert_us(4096) == pytest.approx(_big_ffn(c, 4096) + c.memory_op(4096 * 1536 * 6).time_us, rel=1e-12)
    assert t.expert_us(4096, 3072) == pytest.approx(_big_ffn(c, 4096, 3072) + c.memory_op(4096 * 3072 * 6).time_us,
                                                    rel=1e-12)
    assert t.expert_us(4096, 3072) > t.expert_us(4096)
    plain = LayerTimer(ExpertShape(hidden=4096, expert_ffn=1536, gated=False, shared_experts=0, experts=64,
                                   dtype="fp8"), HW, _layout(gpus=8, gpn=8, tokens=4096))
    assert plain.expert_us(4096) == pytest.approx(
        c.gemm(4096, 1536, 4096, dtype="fp8").time_us + c.gemm(4096, 4096, 1536, dtype="fp8").time_us
        + c.memory_op(4096 * 1536 * 6).time_us, rel=1e-12)


def test_a_large_gpus_experts_batch_equal_counts_in_fp8():
    """Slots 1, 1, 4,096, 0, 2,048: a batch of two 1-token experts, one 4,096 and one 2,048; activation traffic of
    6,146 tokens."""
    t = _big_timer()
    c = t.compute
    want = (_big_ffn(c, 1, batch=2) + _big_ffn(c, 4096) + _big_ffn(c, 2048)
            + c.memory_op(6146 * 1536 * 6).time_us)
    assert t.gpu_experts_us([1, 1, 4096, 0, 2048]) == pytest.approx(want, rel=1e-12)
    three = _big_ffn(c, 2048, batch=3) + c.memory_op(3 * 2048 * 1536 * 6).time_us
    assert t.gpu_experts_us([2048, 2048, 2048]) == pytest.approx(three, rel=1e-12)


def test_a_large_router_runs_in_bf16_and_shared_experts_at_their_own_width():
    """Router GEMM [4,096, 4,096] x [4,096, 64] in BF16; two shared experts of width 3,072 in FP8."""
    t = _big_timer()
    c = t.compute
    shared = _big_ffn(c, 4096, 3072) + c.memory_op(4096 * 3072 * 6).time_us
    assert t.shared_us(4096) == pytest.approx(c.gemm(4096, 64, 4096, dtype="bf16").time_us + 2 * shared, rel=1e-12)
    assert t.fixed_us() == pytest.approx(t.shared_us(4096), rel=1e-12)
    assert t.comparison == {}
    # a fraction of a token rounds to one token (the router and shared experts still load their weights)
    one = c.gemm(1, 64, 4096, dtype="bf16").time_us + 2 * (_big_ffn(c, 1, 3072) + c.memory_op(3072 * 6).time_us)
    assert t.shared_us(0.2) == pytest.approx(one, rel=1e-12)
    assert t.shared_us(0.2) != t.shared_us(2)


def test_layer_parts_of_half_a_large_batch_time_half_the_tokens():
    """scale 0.5 on 4,096 tokens a GPU: experts on the halved slots, shared experts on 2,048 tokens."""
    t = _big_timer(gpus=8, tokens=4096)
    P = np.full((8, 8), 1024.0)
    slots = np.zeros((8, 1), np.int64)
    slots[:, 0] = [4096, 3000, 5000, 4096, 4096, 4096, 4096, 4392]
    cost = PlacementCost(_contiguous(gpus=8, gpn=8, experts=8), pair_tokens=P[None, None],
                         slot_tokens=slots[None, None])
    experts, dispatch, combine, shared = moe_layer_parts(cost, t, 0.5)
    assert experts[0] == pytest.approx(t.gpu_experts_us([2500]), rel=1e-12)
    assert shared[0] == pytest.approx(t.shared_us(2048), rel=1e-12)
    assert dispatch[0] == pytest.approx(t.a2a_us(P, 2, 0.5), rel=1e-12)


def _brute(t, rows):
    return max(t.gpu_experts_us(r) for r in rows)


def test_a_large_group_finds_the_slowest_gpu_by_tokens_by_largest_slot_or_by_busy_slots():
    """40 GPUs. (a) one slot each: the most tokens; (b) 2 slots: the largest is in the second slot;
    (c) the slowest holds four 1-token experts (four weight loads) while 9 GPUs hold 60 tokens in one slot:
    only the busy-slot count finds it; (d) the slowest holds 600 + 600 tokens while 9 GPUs hold one
    650-token slot and two 1-token slots: only the token total finds it."""
    t = _big_timer(gpus=40, tokens=64)
    one = np.zeros((40, 1), np.int64)
    one[:, 0] = np.arange(40) * 10
    one[13, 0] = 5000
    assert slowest_gpu_us(t, one) == pytest.approx(t.gpu_experts_us([5000]), rel=1e-12)
    two = np.zeros((40, 2), np.int64)
    two[:, 0] = 100
    two[7, 1] = 8000
    assert slowest_gpu_us(t, two) == pytest.approx(t.gpu_experts_us([100, 8000]), rel=1e-12)
    busy = np.zeros((40, 4), np.int64)
    busy[:9, 0] = 60
    busy[20] = [1, 1, 1, 1]
    assert _brute(t, busy) == t.gpu_experts_us(busy[20])
    assert slowest_gpu_us(t, busy) == _brute(t, busy)
    total = np.zeros((40, 4), np.int64)
    total[:9] = [650, 1, 1, 0]
    total[30] = [600, 600, 0, 0]
    assert _brute(t, total) == t.gpu_experts_us(total[30])
    assert slowest_gpu_us(t, total) == _brute(t, total)
    biggest = np.zeros((40, 4), np.int64)
    biggest[:9] = [300, 300, 300, 300]
    biggest[25] = [3000, 0, 0, 0]
    assert slowest_gpu_us(t, biggest) == _brute(t, biggest)


# ---------------------------------------------------------------------- more windows, chunks and odd layouts
def test_every_measure_averages_over_windows_across_chunks():
    """65,544 tokens = 8,193 windows of 8: the first 65,536-token chunk holds 8,192, the second one. All but the
    last window route as ROUTING, the last keeps every pair local: bytes average 8,192 / 8,193 of ROUTING's."""
    rows = np.asarray(ROUTING * 8192 + ALL_LOCAL, dtype=np.int32)
    seen = []
    [cost] = evaluate_placements(_src(rows), 0, len(rows), _layout(), 4, [_contiguous()], None,
                                 progress=lambda d, n: seen.append((d, n)))
    assert cost.windows == 8193
    assert cost.a2a_bytes[0] == pytest.approx(12 * 4 * 8192 / 8193, rel=1e-12)
    assert cost.a2a_bytes_inter_node[0] == pytest.approx(7 * 4 * 8192 / 8193, rel=1e-12)
    assert cost.max_over_mean[0] == pytest.approx((1.25 * 8192 + 1.0) / 8193, rel=1e-12)
    assert seen == [(65536, 65544), (65544, 65544)]


def test_progress_counts_tokens_of_the_part():
    seen = []
    evaluate_placements(_src(ROUTING * 3), 8, 24, _layout(), 4, [_contiguous()], None,
                        progress=lambda d, n: seen.append((d, n)))
    assert seen == [(16, 16)]


def test_layer_time_averages_over_the_timed_windows():
    """Window 0 = ROUTING, window 1 all local: layer = mean of (d + slowest + c + router) over the two."""
    t = _timer()
    [cost] = evaluate_placements(_src(ROUTING + ALL_LOCAL), 0, 16, _layout(), 4, [_contiguous()], t)
    router = t.compute.gemm(2, 4, HIDDEN).time_us
    w0 = t.a2a_us(PAIRS, 2) + t.gpu_experts_us([5]) + t.a2a_us(PAIRS.T, 2) + router
    w1 = t.gpu_experts_us([4]) + router
    assert cost.layer_us[0] == pytest.approx((w0 + w1) / 2, rel=1e-12)
    assert cost.combine_us[0] == pytest.approx(t.a2a_us(PAIRS.T, 2) / 2, rel=1e-12)
    experts, dispatch, combine, _ = moe_layer_parts(cost, t)
    cost.a2a_parts = None
    _, d2, c2, _ = moe_layer_parts(cost, t)
    assert d2[0] == pytest.approx(dispatch[0], rel=1e-12) and d2[0] == pytest.approx(t.a2a_us(PAIRS, 2) / 2)
    assert c2[0] == pytest.approx(combine[0], rel=1e-12)


def test_four_windows_are_timed_by_default_and_more_windows_than_gpus_all_count():
    """5 windows: the default times 4 of them (0, 1, 2, 4 by linspace rounding); 2 GPUs and 4 windows:
    each of the 4 is timed."""
    t = _timer()
    [cost] = evaluate_placements(_src(ROUTING * 5), 0, 40, _layout(), 4, [_contiguous()], t)
    assert cost.timed_windows == 4
    lay = _layout(gpus=2, gpn=2, tokens=1)
    rows = [[0], [1], [1], [1], [0], [0], [1], [0]]
    pl = Placement("contiguous", np.array([[0, 1]]), gpus=2, gpus_per_node=2, experts=2)
    [two] = evaluate_placements(_src(rows), 0, 8, lay, 2, [pl], _timer(_shape(experts=2), lay), timed_windows=4)
    assert two.timed_windows == 4 and two.windows == 4
    assert [p.tolist() for p in two.pair_tokens[:, 0]] == [[[1, 0], [0, 1]], [[0, 1], [0, 1]], [[1, 0], [1, 0]],
                                                           [[0, 1], [1, 0]]]


def test_one_gpu_one_token_windows():
    """EP1 with one token a batch: three windows, nothing leaves the GPU."""
    lay = _layout(gpus=1, gpn=1, tokens=1)
    pl = Placement("contiguous", np.array([[0, 1]]), gpus=1, gpus_per_node=1, experts=2)
    t = _timer(_shape(experts=2), lay)
    [cost] = evaluate_placements(_src([[0, 1], [1, 0], [0, 0]]), 0, 3, lay, 2, [pl], t)
    assert cost.windows == 3 and cost.timed_windows == 3 and cost.a2a_bytes.tolist() == [0.0]
    assert cost.slot_tokens[:, 0].tolist() == [[[1, 1]], [[1, 1]], [[2, 0]]]


def test_more_layers_than_gpus_keep_their_all_to_all_parts():
    lay = _layout(gpus=2, gpn=2, tokens=1)
    pl = Placement("contiguous", np.tile([0, 1], (3, 1)), gpus=2, gpus_per_node=2, experts=2)
    t = _timer(_shape(experts=2), lay)
    src = ArraySource(np.array([[[0], [1], [1]], [[1], [1], [0]]], dtype=np.int32))
    [cost] = evaluate_placements(src, 0, 2, lay, 2, [pl], t)
    assert len(cost.a2a_parts[0]) == 3
    assert cost.pair_tokens[0].tolist() == [[[1, 0], [0, 1]], [[0, 1], [0, 1]], [[0, 1], [1, 0]]]
    _, dispatch, _, _ = moe_layer_parts(cost, t)
    assert dispatch[0] == 0.0 and dispatch[1] > 0.0 and dispatch[2] > 0.0


def test_a_replicated_expert_with_uneven_nodes_serves_each_node_its_own_tokens():
    """Slots 0 1 2 0, top-1, 2 tokens a GPU: g0 -> 0 0, g1 -> 0 1, g2 -> 0 2, g3 -> 1 2. Expert 0: node 0 sends
    3 (GPU 0 serves them), node 1 one (GPU 3). Pairs g0: 2 to g0; g1: 1 to g0, 1 to g1; g2: 1 to g3, 1 to g2;
    g3: 1 to g1, 1 to g2. Off-GPU 4 pairs, 1 between nodes (g3 -> g1); GPUs serve 3, 2, 2, 1. Two windows alike."""
    rows = [[0], [0], [0], [1], [0], [2], [1], [2]]
    pl = Placement("eplb", np.array([[0, 1, 2, 0]]), gpus=4, gpus_per_node=2, experts=3)
    t = _timer(_shape(experts=3))
    [cost] = evaluate_placements(_src(rows * 2), 0, 16, _layout(), 3, [pl], t)
    pairs = [[2, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 1, 1, 0]]
    assert [p.tolist() for p in cost.pair_tokens[:, 0]] == [pairs, pairs]
    assert cost.a2a_bytes.tolist() == [4 * HIDDEN * 4]
    assert cost.a2a_bytes_inter_node.tolist() == [1 * HIDDEN * 4]
    assert cost.slot_tokens[0, 0].tolist() == [[3], [2], [2], [1]]
    assert cost.slot_tokens.dtype == np.int64
    [exp] = evaluate_expected(np.array([[4.0, 2.0, 2.0]]), 1, _layout(), [pl], t)
    assert exp.pair_tokens.shape == (1, 1, 4, 4) and exp.slot_tokens.shape == (1, 1, 4, 1)
    assert exp.slot_tokens.dtype == np.int64


def test_layer_parts_of_an_expected_cost_are_its_one_batch():
    t = _timer()
    [cost] = evaluate_expected(np.array([[2.0, 1.0, 1.0, 0.0]]), 2, _layout(), [_contiguous()], t)
    experts, dispatch, combine, _ = moe_layer_parts(cost, t)
    assert experts[0] == pytest.approx(cost.expert_us[0], rel=1e-12)
    assert dispatch[0] == pytest.approx(cost.dispatch_us[0], rel=1e-12)


def test_bad_input_errors_name_the_routing_trace():
    src = _src([[0, 1], [4, 1]] + ROUTING[2:])
    for call in (lambda: evaluate_placements(src, 0, 8, _layout(), 4, [_contiguous()], None),
                 lambda: fit_stats(src, 0, 8, _layout(), 4)):
        with pytest.raises(TraceInputError, match=r"^<memory>: expert id 4 at token 1 layer 0 is outside \[0, 4\)"):
            call()
    with pytest.raises(TraceInputError) as e:
        evaluate_placements(_src(ROUTING), 1, 8, _layout(), 4, [_contiguous()], None)
    assert e.value.path == "<memory>"
    with pytest.raises(TraceInputError) as e:
        part_gpus(_src(ROUTING), 0, 8, _layout(group_by="domain"))
    assert e.value.path == "<memory>"
    assert e.value.problem == "--group-by domain needs a routing trace with request domains"


def test_without_grouping_request_domains_do_not_move_tokens():
    assert source_gpus(_layout(), np.asarray([1, 0, 1, 0, 1, 0, 1, 0])).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_grouping_by_domain_one_token_a_gpu_orders_spilled_tokens_by_arrival():
    """8 GPUs x 1 token, two windows (shares 1/2: ranges at 0 and 4). Window 0 = six domain-0 tokens then
    two domain-1: positions 0-3, then token 4 and token 6 (both want 4), tokens 5 and 7 (both want 5).
    Window 1 = six domain-1 then two domain-0: tokens 14, 15 first, then 8-13."""
    dom = np.asarray([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    assert source_gpus(_layout(gpus=8, gpn=4, tokens=1, group_by="domain"), dom).tolist() == [
        0, 1, 2, 3, 4, 6, 5, 7, 2, 3, 4, 5, 6, 7, 0, 1]


def test_grouping_by_domain_spills_in_a_later_window_too():
    """Shares 9/16 and 7/16 (ranges at 0 and 4.5). Window 1 = one domain-1 token then seven domain-0 tokens
    wanting 0-6: the domain-1 token (4.5) goes between the ones wanting 4 and 5."""
    dom = np.asarray([1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
    assert source_gpus(_layout(gpus=8, gpn=4, tokens=1, group_by="domain"), dom).tolist() == [
        2, 3, 4, 5, 6, 7, 0, 1, 5, 0, 1, 2, 3, 4, 6, 7]


def test_fit_stats_of_a_part_read_only_the_part_and_count_in_integers():
    """Tokens 8-15 of a 24-token trace; experts 0 and 1 only (2 and 3 never chosen on either node)."""
    rows = ROUTING + [[0, 1]] * 8 + ROUTING
    seen = []
    st = fit_stats(_src(rows), 8, 16, _layout(), 4, progress=lambda d, n: seen.append((d, n)))
    assert st.load.tolist() == [[8, 8, 0, 0]]
    assert st.node_load[0].tolist() == [[4, 4, 0, 0], [4, 4, 0, 0]]
    assert st.node_load.dtype == np.int64 and st.coactivation.dtype == np.int64
    assert st.coactivation[0, 0, 1] == 8 and seen == [(8, 8)]


def test_fit_stats_of_a_later_part_sample_its_own_first_tokens():
    """Tokens 8-15 = ROUTING; coactivation over its first 3 tokens: {0,1}, {2,3}, {1,2}."""
    st = fit_stats(_src([[3, 3]] * 8 + ROUTING), 8, 16, _layout(), 4, coactivation_tokens=3)
    co = np.zeros((4, 4), int)
    for i, j in ((0, 1), (2, 3), (1, 2)):
        co[i, j] = co[j, i] = 1
    assert st.coactivation[0].tolist() == co.tolist()


def test_fit_stats_sample_32768_tokens_by_default():
    rng = np.random.default_rng(1)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(32_800)]).astype(np.int32)
    st = fit_stats(_src(ids), 0, len(ids), _layout(), 4)
    want = np.zeros((4, 4), np.int64)
    np.add.at(want, (ids[:32768, 0], ids[:32768, 1]), 1)
    assert np.array_equal(st.coactivation[0], want + want.T)


def test_fit_stats_of_three_chunks_from_an_offset():
    """140,008 tokens from token 8 (three 65,536-token chunks): loads by node counted here (rank = position in
    the part's 8-token window // 2, node = rank // 2), coactivation over the first 100 tokens only."""
    rng = np.random.default_rng(2)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(140_016)]).astype(np.int32)
    st = fit_stats(_src(ids), 8, 140_016, _layout(), 4, coactivation_tokens=100)
    part = ids[8:]
    node = (np.arange(len(part)) % 8) // 2 // 2
    for n in (0, 1):
        assert st.node_load[0, n].tolist() == np.bincount(part[node == n].ravel(), minlength=4).tolist()
    want = np.zeros((4, 4), np.int64)
    np.add.at(want, (part[:100, 0], part[:100, 1]), 1)
    assert np.array_equal(st.coactivation[0], want + want.T)
