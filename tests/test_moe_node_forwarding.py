"""Prefill's all-to-all as DeepEP's normal mode sends it: a token crosses to another node once, to its rail
peer there, which forwards it over NVLink to the GPUs holding its experts (estimators.moe.a2a); the compute
beside it runs on the SMs the communication kernels leave (estimators.moe.serving.PREFILL_COMM_SMS)."""
from __future__ import annotations

import numpy as np
import pytest

from estimators.moe.a2a import expected_distinct_nodes, node_forwarded_legs
from estimators.moe.evaluate import ExpertShape, LayerTimer, Layout, NodeForwarding
from estimators.moe.serving import PREFILL_COMM_SMS, _overlap


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


def test_the_prefill_timer_runs_the_two_legs_one_after_the_other_and_combine_comes_back_the_same_way():
    """One remote pair pattern: GPU 0 sends 4096 tokens to experts on GPU 9 (node 1, local 1), top-1, so
    every pair is a token: RDMA 0 -> 8 with all of them, NVLink 8 -> 9; combine the reverse paths."""
    layout = Layout(gpus=16, gpus_per_node=8, tokens_per_gpu=4096)
    shape = ExpertShape(hidden=7168, expert_ffn=2048, gated=True, shared_experts=0, experts=16,
                        dispatch_bytes=1, combine_bytes=2)
    t = LayerTimer(shape, "h100-sxm", layout, NodeForwarding(top_k=1))
    pairs = np.zeros((16, 16))
    pairs[0, 9] = 4096
    rdma, nvl = np.zeros((16, 16)), np.zeros((16, 16))
    rdma[0, 8] = nvl[8, 9] = 4096 * 7168
    net, ranks = t.network, list(range(16))
    legs = net.all_to_all_v_us(rdma, ranks) + net.all_to_all_v_us(nvl, ranks)
    assert t.a2a_us(pairs, 1) == pytest.approx(legs, rel=1e-6)
    back = net.all_to_all_v_us(2 * rdma.T, ranks) + net.all_to_all_v_us(2 * nvl.T, ranks)
    assert t.a2a_us(pairs, 2, combine=True) == pytest.approx(back, rel=1e-6)
    # without forwarding (decode's low-latency mode) the pair goes straight 0 -> 9, and combine 9 -> 0
    plain = LayerTimer(shape, "h100-sxm", layout)
    assert plain.a2a_us(pairs, 1) == pytest.approx(net.all_to_all_v_us(pairs * 7168, ranks), rel=1e-12)
    assert plain.a2a_us(pairs, 2, combine=True) == pytest.approx(net.all_to_all_v_us(pairs.T * 7168 * 2, ranks))


def test_compute_beside_the_prefill_all_to_all_runs_on_the_sms_it_leaves():
    """Two micro-batches of 10 us compute and 8 us communication each; the communication holds 20 of 132
    SMs while it runs (16 us), so the compute's 20 us lose 16 x 20/132 us: 22.42 us, not max(20, 16)."""
    share = PREFILL_COMM_SMS / 132
    assert PREFILL_COMM_SMS == 20
    assert _overlap(10.0, 8.0, "dual-batch", share) == pytest.approx(20 + 16 * 20 / 132)
    assert _overlap(10.0, 8.0, "dual-batch") == 20.0                       # decode: the SMs stay free
    assert _overlap(2.0, 8.0, "dual-batch", share) == 16.0                 # communication-bound
    assert _overlap(10.0, 8.0, "none", share) == 18.0


def test_a_token_whose_experts_all_sit_on_one_remote_node_crosses_once():
    """GPU 0 (node 0 of 2) routes 100 tokens top-8, every pick on node 1: 800 pairs but 100 tokens on the
    wire, not 800 x (2 x (1 - 2^-8)) / 8 = 199 as a uniform share per pair would count."""
    pairs = np.zeros((16, 16))
    pairs[0, 8:] = 100.0                       # 800 pairs over node 1's eight GPUs
    rdma, nvlink = node_forwarded_legs(pairs, 8, top_k=8)
    assert rdma[0, 8] == pytest.approx(100.0) and rdma.sum() == pytest.approx(100.0)
    assert nvlink[8, 9:].sum() == pytest.approx(700.0)     # 8 forwards the pairs of the other seven GPUs


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
    nodes; at EP128 on 16 nodes each group spans 2 nodes, so up to 8; at EP256 up to 16."""
    from estimators.moe.a2a import node_limit
    assert [node_limit(n, 8, 4) for n in (2, 4, 8, 16, 32)] == [4, 4, 4, 8, 16]
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


def test_prefill_charges_the_all_to_all_sms_to_the_compute_beside_it_and_decode_does_not(monkeypatch):
    """serve() hands _overlap 20/132 of the H100's SMs on MoE layers in prefill, none in decode."""
    from estimators.model_config import load_model
    from estimators.moe import serving
    from replay.hardware.config import get_hardware
    m, hw = load_model("deepseek-v3"), get_hardware("h100-sxm")
    L = m.moe_layers
    parts = lambda scale: (np.full(L, 100.0), np.full(L, 50.0), np.full(L, 50.0), np.full(L, 10.0))  # noqa: E731
    real = serving._overlap
    for phase, share in (("prefill", 20 / 132), ("decode", 0.0)):
        seen = []
        monkeypatch.setattr(serving, "_overlap", lambda c, m_, mode, s=0.0: seen.append(s) or real(c, m_, mode, s))
        serving.serve(m, hw, serving.ServingSpec(phase, 4096, 4096), parts)
        assert sorted(set(seen)) == sorted({0.0, share})
