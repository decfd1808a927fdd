"""Prefill's all-to-all as DeepEP's normal mode sends it: a token crosses to another node once, to its rail
peer there, which forwards it over NVLink to the GPUs holding its experts (estimators.moe.a2a); the compute
beside it runs on the SMs the communication kernels leave (estimators.moe.serving.PREFILL_COMM_SMS). The two
legs pipeline, as DeepEP's published bandwidths show."""
from __future__ import annotations

import numpy as np
import pytest

from estimators.moe.a2a import expected_distinct_nodes, node_forwarded_legs
from estimators.moe.evaluate import ExpertShape, LayerTimer, Layout, NodeForwarding
from estimators.moe.serving import PREFILL_COMM_SMS


def test_distinct_nodes_of_a_token_under_uniform_routing_and_node_limited_routing():
    # top-8 over 4 nodes: the chance a node gets none of the 8 experts is (3/4)^8
    assert expected_distinct_nodes(4, 8) == pytest.approx(4 * (1 - 0.75 ** 8))      # 3.5995
    assert expected_distinct_nodes(4, 8, limit=3) == 3.0                            # at most 3 nodes a token
    assert expected_distinct_nodes(1, 8) == 1.0
    assert expected_distinct_nodes(2, 1) == pytest.approx(1.0)


def test_a_remote_token_crosses_once_to_its_rail_peer_and_is_forwarded_over_nvlink():
    """EP16 on two nodes of 8, top-8 uniform: 10 pairs from every GPU to every GPU. Rank 0's 80 pairs to node
    1 are 80 / 4 = 20 tokens (4 of a token's 8 experts are there on average), of which 1 - 2^-8 have an
    expert there: 19.92 tokens go 0 -> 8 over the network, none to 9..15. Node 1's GPU 8 forwards to 9..15
    the 10 pairs each that every rank of node 0 with local index 0 sent, on top of its own 10."""
    pairs = np.full((16, 16), 10.0)
    rdma, nvlink = node_forwarded_legs(pairs, 8, top_k=8)
    assert rdma[0, 8] == pytest.approx(20 * (1 - 0.5 ** 8))
    assert rdma[0, 9:].sum() == 0 and rdma[0, :8].sum() == 0 and rdma[3, 11] == pytest.approx(rdma[0, 8])
    assert nvlink[8, 9] == pytest.approx(10 + 10) and nvlink[0, 1] == pytest.approx(20)
    assert nvlink[:8, 8:].sum() == 0 and np.trace(nvlink) == 0       # NVLink stays inside a node
    # every pair that changes GPU reaches it over NVLink except those landing on the rail peer itself
    assert nvlink.sum() == pytest.approx(16 * 7 * 10 + 16 * 7 * 10)


def test_the_prefill_timer_pipelines_the_two_legs_and_combine_comes_back_the_same_way():
    """One remote pair pattern: GPU 0 sends 4096 tokens to experts on GPU 9 (node 1, local 1), top-1, so
    every pair is a token: RDMA 0 -> 8 with all of them, NVLink 8 -> 9; combine the reverse paths. The NVLink
    leg forwards while the RDMA leg brings more: both latencies, the slower leg's drain."""
    layout = Layout(gpus=16, gpus_per_node=8, tokens_per_gpu=4096)
    shape = ExpertShape(hidden=7168, expert_ffn=2048, gated=True, shared_experts=0, experts=16,
                        dispatch_bytes=1, combine_bytes=2)
    t = LayerTimer(shape, "h100-sxm", layout, NodeForwarding(top_k=1))
    pairs = np.zeros((16, 16))
    pairs[0, 9] = 4096
    rdma, nvl = np.zeros((16, 16)), np.zeros((16, 16))
    rdma[0, 8] = nvl[8, 9] = 4096 * 7168
    net, ranks = t.network, list(range(16))
    alone = net.all_to_all_v_us(rdma, ranks), net.all_to_all_v_us(nvl, ranks)
    assert max(alone) < t.a2a_us(pairs, 1) < sum(alone)
    # the RDMA leg (one 400 Gb/s NIC) drains far slower than NVLink, so it sets the pace, plus NVLink's latency
    assert t.a2a_us(pairs, 1) == pytest.approx(alone[0], rel=0.05)
    back = net.all_to_all_v_us(2 * rdma.T, ranks), net.all_to_all_v_us(2 * nvl.T, ranks)
    assert max(back) < t.a2a_us(pairs, 2, combine=True) < sum(back)
    # without forwarding (decode's low-latency mode) the pair goes straight 0 -> 9, and combine 9 -> 0
    plain = LayerTimer(shape, "h100-sxm", layout)
    assert plain.a2a_us(pairs, 1) == pytest.approx(net.all_to_all_v_us(pairs * 7168, ranks), rel=1e-12)
    assert plain.a2a_us(pairs, 2, combine=True) == pytest.approx(net.all_to_all_v_us(pairs.T * 7168 * 2, ranks))


# DeepEP's normal kernels on H800 + CX7 400 Gb/s, DeepSeek-V3 settings (4096 tokens per rank, hidden 7168,
# top-8 experts from 4 of 8 groups, FP8 dispatch, BF16 combine): "bottleneck bandwidth" as DeepEP counts it,
# a token's bytes once per distinct destination node (its own included) over the kernel's time
# (deepseek-ai/DeepEP, docs/legacy.md, V1 table).
DEEPEP_NORMAL_H800 = {16: (43, 43), 32: (58, 57), 64: (51, 50)}


@pytest.mark.parametrize("ep", sorted(DEEPEP_NORMAL_H800))
def test_forwarded_all_to_all_reproduces_deepeps_published_normal_kernel_bandwidth(ep):
    T, k = 4096, 8
    shape = ExpertShape(hidden=7168, expert_ffn=2048, gated=True, shared_experts=0, experts=256,
                        dispatch_bytes=1, combine_bytes=2)
    t = LayerTimer(shape, "h800", Layout(gpus=ep, gpus_per_node=8, tokens_per_gpu=T), NodeForwarding(k, 4))
    pairs = np.full((ep, ep), T * k / ep)                         # uniform routing
    n = ep // 8
    distinct = min(n * (1 - (1 - 1 / n) ** k), 4)                 # distinct nodes a token, at most 4
    counted = T * distinct * 7168
    dispatch_gbps = counted / t.a2a_us(pairs, 1) / 1e3
    combine_gbps = 2 * counted / t.a2a_us(pairs, 2, combine=True) / 1e3
    want_d, want_c = DEEPEP_NORMAL_H800[ep]
    assert dispatch_gbps == pytest.approx(want_d, rel=0.05)
    assert combine_gbps == pytest.approx(want_c, rel=0.05)


def test_a_token_whose_experts_all_sit_on_one_remote_node_crosses_once():
    """GPU 0 (node 0 of 2) routes 100 tokens top-8, every pick on node 1: 800 pairs but 100 tokens on the
    wire, not 800 x (2 x (1 - 2^-8)) / 8 = 199 as a uniform share per pair would count."""
    pairs = np.zeros((16, 16))
    pairs[0, 8:] = 100.0                       # 800 pairs over node 1's eight GPUs
    rdma, nvlink = node_forwarded_legs(pairs, 8, top_k=8)
    assert rdma[0, 8] == pytest.approx(100.0) and rdma.sum() == pytest.approx(100.0)
    assert nvlink[8, 9:].sum() == pytest.approx(700.0)     # 8 forwards the pairs of the other seven GPUs


def test_tokens_on_the_wire_match_a_monte_carlo_of_top_k_routing_with_a_hot_node():
    """Independent of the formula: 20,000 tokens each pick 8 distinct experts of 32 (4 nodes x 8), node 1's
    experts 4x as likely as the others' (Gumbel top-k). Counting the distinct (token, remote node) pairs
    directly, the RDMA leg from the pair counts reads within 5% on every node."""
    rng = np.random.default_rng(0)
    weights = np.array([1.0] * 8 + [4.0] * 8 + [1.0] * 16)
    keys = np.log(weights) + rng.gumbel(size=(20000, 32))
    picks = np.argsort(-keys, axis=1)[:, :8]                       # 8 distinct experts a token
    pairs = np.zeros((32, 32))
    np.add.at(pairs[0], picks.ravel(), 1.0)                        # every token on GPU 0, expert e on GPU e
    node_of = picks // 8
    for node in (1, 2, 3):
        on_wire = float((node_of == node).any(axis=1).sum())       # tokens with an expert there
        rdma, _ = node_forwarded_legs(pairs, 8, top_k=8)
        assert rdma[0, 8 * node] == pytest.approx(on_wire, rel=0.05)


def test_a_hot_node_gets_fewer_tokens_per_pair_than_a_cold_one():
    """GPU 0 of four 8-GPU nodes routes 64 tokens top-8 (512 pairs): 256 to node 1, 128 to node 2, 64 to
    node 3, 64 stay home. A token reaches node b with 1 - (1 - p_b)^8 when its picks are independent:
    p = 1/2, 1/4, 1/8."""
    pairs = np.zeros((32, 32))
    pairs[0, 8:16], pairs[0, 16:24], pairs[0, 24:32], pairs[0, 0:8] = 32.0, 16.0, 8.0, 8.0
    rdma, _ = node_forwarded_legs(pairs, 8, top_k=8)
    for node, p in ((1, 0.5), (2, 0.25), (3, 0.125)):
        assert rdma[0, 8 * node] == pytest.approx(64 * (1 - (1 - p) ** 8))
    assert rdma[0, 8] / 256 < rdma[0, 24] / 64        # hot node: 0.25 tokens a pair; cold: 0.82


def test_node_limited_routing_caps_the_nodes_a_token_reaches_and_a_group_may_span_nodes():
    """DeepSeek-V3: 8 expert groups, a token's 8 experts from 4 of them. On 4 or 8 nodes that is at most 4
    nodes (on 2, both); at EP128 on 16 nodes each group spans 2 nodes, so up to 8; at EP256 up to 16. On 12
    nodes a group is 1.5 nodes' experts and touches 2: up to 8."""
    from estimators.moe.a2a import node_limit
    assert [node_limit(n, 8, 4) for n in (2, 4, 8, 12, 16, 32)] == [2, 4, 4, 8, 8, 16]
    assert node_limit(16, 1, 1) == 0                                   # ungrouped routing: no limit
    # uniform routing over 8 nodes, limit 4: every source's remote tokens shrink to 4/8 a node a token
    pairs = np.full((64, 64), 1.0)                                      # 64 pairs = 8 tokens a GPU
    rdma, _ = node_forwarded_legs(pairs, 8, top_k=8, limit=4)
    assert rdma[0, 8] == pytest.approx(8 * 4 / 8)
    assert rdma[0, 8] == pytest.approx(8 * expected_distinct_nodes(8, 8, 4) / 8)   # the parallelism model's


@pytest.mark.parametrize("ep,limit", [(32, 4), (128, 8)])
def test_prefill_forwards_over_nvlink_with_the_deployments_node_limit_and_decode_does_not(ep, limit):
    from types import SimpleNamespace
    from estimators.model_config import load_model
    from estimators.moe.options import MoEOptions
    from estimators.moe.whatif import layer_timer
    from replay.hardware.config import get_hardware
    sc = SimpleNamespace(model=load_model("deepseek-v3"), hardware=get_hardware("h100-sxm"),
                         plan=SimpleNamespace(precision="fp8"))
    layout = Layout(gpus=ep, gpus_per_node=8, tokens_per_gpu=4096)
    t = layer_timer(sc, MoEOptions(phase="prefill"), layout)
    assert t.forwarding == NodeForwarding(top_k=8, node_limit=limit)
    assert layer_timer(sc, MoEOptions(phase="decode"), layout).forwarding is None


def test_prefill_runs_its_compute_on_the_sms_the_all_to_all_leaves_and_decode_on_all(monkeypatch):
    """serve() hands the schedule 24 of the H100's 132 SMs in prefill (DeepSeek's prefill profile: 108 compute,
    24 communication), none in decode (low-latency kernels free the SMs once the RDMA is issued)."""
    from estimators.model_config import load_model
    from estimators.moe import overlap, serving
    from replay.hardware.config import get_hardware
    assert PREFILL_COMM_SMS == 24
    m, hw = load_model("deepseek-v3"), get_hardware("h100-sxm")
    L = m.moe_layers
    parts = lambda scale: (np.full(L, 100.0), np.full(L, 50.0), np.full(L, 50.0), np.full(L, 10.0))  # noqa: E731
    seen = []
    for sched in overlap.SCHEDULES.values():
        real = sched.forward_us
        monkeypatch.setattr(sched, "forward_us", lambda layers, share=0.0, _r=real, _s=sched:
                            seen.append((_s.name, share)) or _r(layers, share))
    for phase in ("prefill", "decode"):
        serving.serve(m, hw, serving.ServingSpec(phase, 4096, 4096), parts)
    assert seen == [("dual-batch-prefill", pytest.approx(24 / 132)), ("dual-batch-decode", 0.0)]


def test_beside_compute_the_normal_kernels_take_what_deepseeks_training_profile_measured():
    """DeepSeek's training profile (deepseek-ai/profile-data train.json; H800, EP64, 4096 tokens per rank,
    DeepSeek-V3 routing at most 4 nodes a token) times DeepEP's forward dispatch at 4604 / 4154 / 4437 /
    4188 us and its combine at 6549 / 6002 / 6543 / 6074 / 5889 / 5847 / 6492 / 6052 us beside DualPipe's
    compute: 10,527 us a layer. The unit-test model times PREFILL_A2A_BESIDE_COMPUTE gives the same."""
    from estimators.moe.serving import PREFILL_A2A_BESIDE_COMPUTE
    ep, T, k = 64, 4096, 8
    shape = ExpertShape(hidden=7168, expert_ffn=2048, gated=True, shared_experts=0, experts=256,
                        dispatch_bytes=1, combine_bytes=2)
    t = LayerTimer(shape, "h800", Layout(gpus=ep, gpus_per_node=8, tokens_per_gpu=T), NodeForwarding(k, 4))
    pairs = np.full((ep, ep), T * k / ep)
    measured = np.mean([4604, 4154, 4437, 4188]) + np.mean([6549, 6002, 6543, 6074, 5889, 5847, 6492, 6052])
    unit = t.a2a_us(pairs, 1) + t.a2a_us(pairs, 2, combine=True)
    assert unit * PREFILL_A2A_BESIDE_COMPUTE == pytest.approx(measured, rel=0.01)


@pytest.mark.parametrize("phase,overlap,slowed", [("prefill", "dual-batch", True), ("prefill", "dual-batch-ideal", True),
                                                  ("prefill", "none", False), ("decode", "dual-batch", False)])
def test_only_prefill_beside_compute_pays_the_slowdown(phase, overlap, slowed):
    from estimators.model_config import load_model
    from estimators.moe import serving
    from replay.hardware.config import get_hardware
    m, hw = load_model("deepseek-v3"), get_hardware("h100-sxm")
    L = m.moe_layers
    parts = lambda scale: (np.full(L, 100.0), np.full(L, 50.0), np.full(L, 70.0), np.full(L, 10.0))  # noqa: E731
    est = serving.serve(m, hw, serving.ServingSpec(phase, 4096, 4096, overlap=overlap), parts)
    mb = 2 if overlap != "none" else 1
    factor = serving.PREFILL_A2A_BESIDE_COMPUTE if slowed else 1.0
    assert est.parts_us["dispatch"] == pytest.approx(mb * L * 50.0 * factor)
    assert est.parts_us["combine"] == pytest.approx(mb * L * 70.0 * factor)


# DeepEP's low-latency kernels (decode) on H800 + CX7: 128 tokens per rank, hidden 7168, top-8, FP8 dispatch,
# BF16 combine (deepseek-ai/DeepEP, docs/legacy.md, V1 table), us: (dispatch, combine) by EP
DEEPEP_LOW_LATENCY_H800 = {16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369), 256: (194, 360)}


@pytest.mark.parametrize("ep", sorted(DEEPEP_LOW_LATENCY_H800))
def test_decode_all_to_all_reproduces_deepeps_published_low_latency_times(ep):
    from estimators.moe.evaluate import LOW_LATENCY_CALL_US
    T, k = 128, 8
    shape = ExpertShape(hidden=7168, expert_ffn=2048, gated=True, shared_experts=0, experts=256,
                        dispatch_bytes=1, combine_bytes=2)
    t = LayerTimer(shape, "h800", Layout(gpus=ep, gpus_per_node=8, tokens_per_gpu=T),
                   call_overhead_us=LOW_LATENCY_CALL_US)
    pairs = np.full((ep, ep), T * k / ep)                         # every (token, expert) pair on its own
    want_d, want_c = DEEPEP_LOW_LATENCY_H800[ep]
    assert t.a2a_us(pairs, 1) == pytest.approx(want_d, rel=0.07)
    assert t.a2a_us(pairs, 2, combine=True) == pytest.approx(want_c, rel=0.07)
    bare = LayerTimer(shape, "h800", Layout(gpus=ep, gpus_per_node=8, tokens_per_gpu=T))
    assert t.a2a_us(pairs, 1) == pytest.approx(bare.a2a_us(pairs, 1) + 15.0)


def test_decode_timer_pays_the_low_latency_call_cost_and_prefill_does_not():
    from types import SimpleNamespace
    from estimators.model_config import load_model
    from estimators.moe.options import MoEOptions
    from estimators.moe.whatif import layer_timer
    from replay.hardware.config import get_hardware
    sc = SimpleNamespace(model=load_model("deepseek-v3"), hardware=get_hardware("h100-sxm"),
                         plan=SimpleNamespace(precision="fp8"))
    layout = Layout(gpus=32, gpus_per_node=8, tokens_per_gpu=128)
    assert layer_timer(sc, MoEOptions(phase="decode"), layout).call_overhead_us == 15.0
    assert layer_timer(sc, MoEOptions(phase="prefill"), layout).call_overhead_us == 0.0
