"""A MoE layer's ops as the workload generator lays them out for one rank (router, permute, all-to-all
dispatch, the local experts' GEMMs, combine, shared experts), written out by hand (never the generator's
output).

References:
- Megatron-Core MoE (alltoall token dispatcher): tokens stay sequence-sharded (T/t per rank) into the
  router (one h x E linear layer, Fedus et al. 2022), each token is permuted top_k times, sent by an
  all-to-all over the EP group (top_k x h x 2 B per token: GShard, Lepikhin et al. 2020), runs its
  experts (E/ep local experts; balanced routing: T/t x top_k x ep / E tokens each), and comes back with
  the combine all-to-all. Transformer Engine's GroupedLinear launches one GEMM per local expert.
- Shared experts (DeepSeekMoE, Dai et al. 2024): every token runs them, a dense SwiGLU FFN of
  S x shared_ffn columns.
- Expert tensor parallelism (Megatron-Core ETP): the etp ranks of an expert split its FFN, all-gather
  their tokens after the dispatch and reduce-scatter them before the combine.
- The alltoall dispatcher receives tokens grouped by source rank; with more than one local expert it
  regroups them by expert before the grouped GEMM (Megatron-Core sort_chunks_by_idxs) and back before
  the combine: one read + write pass over the received [tokens, h] bf16 each way.
- Token drop with capacity factor cf (Fedus et al. 2022, Switch Transformer Eq. 4): each expert takes
  ceil(cf x mean) tokens, padded to that capacity (Megatron --moe-pad-expert-input-to-capacity), and the
  all-to-all carries the padding (cf x the balanced bytes).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import HOST_WAIT, MOE_SYNC_IDLE_US, MoELoads, _RankBuilder, dropless_imbalance

from tests.test_pinned_workload_layer import E, G, exp, table

C, TPS, EPS = 0, 1, 4        # stream slots: compute, TP, EP

MOE = model_from_dict(dict(name="m", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                           moe=dict(num_experts=8, top_k=2, expert_ffn=128, shared_experts=1,
                                    shared_expert_ffn=64)))


def _moe_rows(tpl):
    """The rows of a layer template from the router (forward) or from the shared experts (backward)
    to the end of the MoE block."""
    rows = table(tpl)
    names = [r[0] for r in rows]
    if "router" in names:
        return rows[names.index("router"):names.index("residual_add_mlp")]
    return rows[1:names.index("post_attn_norm_bwd")]


def test_moe_forward_with_ep4_tp2_balanced_routing():
    """TP2 SP DP4 EP4, s = 128: 64 tokens per rank into the router; 2 local experts of
    64 x 2 x 4 / 8 = 64 tokens each; expert FFN 128 (SwiGLU up 256); shared expert 64 (up 128).
    Each all-to-all: 64 x 2 x 256 x 2 B = 65,536 B over the EP group of ranks 0-3. Transformer Engine's fused
    permute reads each token once and writes its 2 copies; the unpermute reads the 2 and writes 1."""
    rb = _RankBuilder(MOE, ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4), 0, 8)
    tpl = rb.layer_template(0, "F")
    a2a = 64 * 2 * 256 * 2
    assert _moe_rows(tpl) == exp(
        ("router", C, G(64, 8, 256), ["post_attn_norm"]),
        ("router_topk", C, E(64 * 8, 1, 1, 5), ["router"]),
        # dropless: the host blocks on the token counts, the GPU waits for it (no GPU work)
        ("moe_host_sync_wait", HOST_WAIT, (0.0, 0.0), ["router_topk"]),
        ("moe_permute", C, E(64 * 2 * 256, 1 / 2, 1), ["moe_host_sync_wait"]),
        ("moe_dispatch_alltoall", EPS, a2a, ["moe_permute"]),
        ("moe_sort_chunks", C, E(64 * 2 * 256, 1, 1), ["moe_dispatch_alltoall"]),
        ("expert_up_gate_proj", C, G(64, 256, 256, batch=2), ["moe_sort_chunks"]),
        ("expert_act", C, E(64 * 2 * 128, 2, 1, 8), ["expert_up_gate_proj"]),
        ("expert_down_proj", C, G(64, 256, 128, batch=2), ["expert_act"]),
        ("moe_unsort_chunks", C, E(64 * 2 * 256, 1, 1), ["expert_down_proj"]),
        ("moe_combine_alltoall", EPS, a2a, ["moe_unsort_chunks"]),
        ("moe_unpermute", C, E(64 * 2 * 256, 1, 1 / 2), ["moe_combine_alltoall"]),
        ("shared_expert_up_gate_proj", C, G(64, 128, 256), ["moe_unpermute"]),
        ("shared_expert_act", C, E(64 * 64, 2, 1, 8), ["shared_expert_up_gate_proj"]),
        ("shared_expert_down_proj", C, G(64, 256, 64), ["shared_expert_act"]),
    )
    ops = {o[0]: o[2] for o in tpl.ops}
    assert ops["moe_host_sync_wait"]["host_wait_us"] == MOE_SYNC_IDLE_US
    assert ops["expert_up_gate_proj"]["launches"] == 2 and ops["expert_down_proj"]["launches"] == 2
    assert ops["moe_dispatch_alltoall"]["pg_ranks"] == [0, 1, 2, 3]
    assert ops["moe_dispatch_alltoall"]["pg_name"] == "ep:0"
    assert ops["router"]["dtype"] == "bf16"
    assert [o[0] for o in tpl.ops][-1] == "residual_add_mlp"


def test_moe_backward_with_ep4_tp2_balanced_routing():
    rb = _RankBuilder(MOE, ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4), 0, 8)
    tpl = rb.layer_template(0, "B")
    a2a = 64 * 2 * 256 * 2
    assert _moe_rows(tpl) == exp(
        # the GPU waits here while the layer's host work outlasts its GPU work (workload.apply_host_pacing)
        ("moe_host_pacing", HOST_WAIT, (0.0, 0.0), ["residual_add_mlp_bwd"]),
        ("shared_expert_down_proj_dgrad", C, G(64, 64, 256), ["moe_host_pacing"]),
        ("shared_expert_down_proj_wgrad", C, G(64, 256, 64), ["shared_expert_down_proj_dgrad"]),
        ("shared_expert_act_bwd", C, E(64 * 64, 3, 2, 12), ["shared_expert_down_proj_dgrad"]),
        ("shared_expert_up_gate_proj_dgrad", C, G(64, 256, 128), ["shared_expert_act_bwd"]),
        ("shared_expert_up_gate_proj_wgrad", C, G(256, 128, 64), ["shared_expert_up_gate_proj_dgrad"]),
        ("moe_unpermute_bwd", C, E(64 * 2 * 256, 1 / 2, 1), ["shared_expert_up_gate_proj_dgrad"]),
        ("moe_combine_alltoall_bwd", EPS, a2a, ["moe_unpermute_bwd"]),
        ("moe_unsort_chunks_bwd", C, E(64 * 2 * 256, 1, 1), ["moe_combine_alltoall_bwd"]),
        ("expert_down_proj_dgrad", C, G(64, 128, 256, batch=2), ["moe_unsort_chunks_bwd"]),
        ("expert_down_proj_wgrad", C, G(128, 256, 64, batch=2), ["expert_down_proj_dgrad"]),
        ("expert_act_bwd", C, E(64 * 2 * 128, 3, 2, 12), ["expert_down_proj_dgrad"]),
        ("expert_up_gate_proj_dgrad", C, G(64, 256, 256, batch=2), ["expert_act_bwd"]),
        ("expert_up_gate_proj_wgrad", C, G(256, 256, 64, batch=2), ["expert_up_gate_proj_dgrad"]),
        ("moe_sort_chunks_bwd", C, E(64 * 2 * 256, 1, 1), ["expert_up_gate_proj_dgrad"]),
        ("moe_dispatch_alltoall_bwd", EPS, a2a, ["moe_sort_chunks_bwd"]),
        ("moe_permute_bwd", C, E(64 * 2 * 256, 1, 1 / 2), ["moe_dispatch_alltoall_bwd"]),
        ("router_bwd", C, G(64, 256, 8), ["moe_permute_bwd"]),
        ("router_wgrad", C, G(256, 8, 64), ["router_bwd"]),
    )
    names = [o[0] for o in tpl.ops]
    assert tpl.ops[names.index("post_attn_norm_bwd")][3] == (names.index("router_bwd"),)
    ops = {o[0]: o[2] for o in tpl.ops}
    assert ops["expert_down_proj_wgrad"]["launches"] == 2 and ops["expert_up_gate_proj_wgrad"]["launches"] == 2


MOE2 = model_from_dict(dict(name="m2", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                            moe=dict(num_experts=8, top_k=2, expert_ffn=128)))


def _rows(rb, pas="F", layer=0, mb=0):
    return {r[0]: r for r in table(rb.layer_template(layer, pas, mb))}


def test_capacity_factor_pads_every_expert_and_etp_shares_the_tokens():
    """TP2 DP4 EP4 ETP2 (expert grid etp x ep = 2 x 4 over the 8 ranks: EP group of rank 0 is
    [0, 2, 4, 6], ETP group [0, 1]), cf 1.25: each of the 2 local experts sees the tokens of its 2 ETP
    ranks, mean 64 x 2 x 4 / 8 x 2 = 128, capacity ceil(1.25 x 128) = 160; expert FFN 128 / 2 = 64
    (SwiGLU up 128). The all-to-all carries the padding: 1.25 x 65,536 = 81,920 B; the ETP all-gather
    after the dispatch and the reduce-scatter before the combine move 2 x that."""
    plan = ParallelPlan(tp=2, dp=4, ep=4, etp=2, seq_len=128, global_batch=4, moe_capacity_factor=1.25)
    rb = _RankBuilder(MOE2, plan, 0, 8)
    r = _rows(rb)
    assert r["moe_dispatch_alltoall"][2] == 81_920 and r["moe_combine_alltoall"][2] == 81_920
    assert r["moe_dispatch_alltoall_etp_allgather"] == (
        "moe_dispatch_alltoall_etp_allgather", EPS, 163_840, None, ("moe_dispatch_alltoall",))
    assert r["moe_combine_alltoall_etp_reducescatter"] == (
        "moe_combine_alltoall_etp_reducescatter", EPS, 163_840, None, ("moe_combine_alltoall",))
    assert r["moe_sort_chunks"][2:5] == (*E(160 * 2 * 256, 1, 1), ("moe_dispatch_alltoall_etp_allgather",))
    assert r["expert_up_gate_proj"][2:5] == (*G(160, 128, 256, batch=2), ("moe_sort_chunks",))
    assert r["expert_act"][2:4] == E(160 * 2 * 64, 2, 1, 8)
    assert r["expert_down_proj"][2:4] == G(160, 256, 64, batch=2)
    assert r["moe_unpermute"][4] == ("moe_combine_alltoall_etp_reducescatter",)
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert ops["moe_dispatch_alltoall"]["pg_ranks"] == [0, 2, 4, 6]
    assert ops["moe_dispatch_alltoall_etp_allgather"]["pg_ranks"] == [0, 1]
    assert ops["moe_dispatch_alltoall_etp_allgather"]["pg_name"] == "etp:0"
    assert ops["moe_dispatch_alltoall_etp_allgather"]["comm_type"] == 2          # all-gather
    assert ops["moe_combine_alltoall_etp_reducescatter"]["comm_type"] == 7       # reduce-scatter
    assert ops["moe_dispatch_alltoall"]["comm_type"] == 6                        # all-to-all
    b = _rows(rb, "B")
    bops = {o[0]: o[2] for o in rb.layer_template(0, "B").ops}
    # weight grads reduce over the 160 tokens: [h, tokens] x [tokens, f_in] and [f, tokens] x [tokens, h]
    assert [bops["expert_up_gate_proj_wgrad"][x] for x in "mnk"] == [256, 128, 160]
    assert [bops["expert_down_proj_wgrad"][x] for x in "mnk"] == [64, 256, 160]
    assert [bops["expert_up_gate_proj_dgrad"][x] for x in "mnk"] == [160, 256, 128]
    assert b["moe_combine_alltoall_bwd"][2] == 81_920
    assert b["moe_combine_alltoall_bwd_etp_reducescatter"][2] == 163_840
    assert b["moe_dispatch_alltoall_bwd_etp_allgather"][2] == 163_840
    # capacity below one token rounds up to one
    tiny = plan.with_(moe_capacity_factor=0.001)
    assert _RankBuilder(MOE2, tiny, 0, 8)._moe_dims()[2] == 1


def test_dropless_routing_sizes_experts_for_the_busiest_ep_rank():
    """Dropless, not forced balanced (TP2 DP4 EP4): 64 tokens x top-2 x 4 ranks = 512 pairs over 4 EP
    ranks; the busiest rank's load is 1 + sqrt(128 x 3/4) x sqrt(2 ln 4) / 128 = 1.1275 x the mean
    64 -> round(72.16) = 72 tokens per local expert. Forced balance: exactly the mean, 64."""
    plan = ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4, moe_force_balance=False)
    rb = _RankBuilder(MOE2, plan, 0, 8)
    imb = dropless_imbalance(4, 512)
    assert 64 * imb == pytest.approx(72.16, abs=0.01)
    assert rb._moe_dims() == (64, 2, 72, 256, 128)
    assert _rows(rb)["expert_up_gate_proj"][2:4] == G(72, 256, 256, batch=2)
    assert _RankBuilder(MOE2, plan.with_(moe_force_balance=True), 0, 8)._moe_dims() == (64, 2, 64, 256, 128)
    # without SP the router sees the whole 128-token chunk (TP ranks duplicate it)
    nosp = _RankBuilder(MOE2, plan.with_(sequence_parallel=False, moe_force_balance=True), 0, 8)
    assert nosp._moe_dims() == (128, 2, 128, 256, 128)
    # one rank holding a fraction of an expert's mean still computes at least one token
    few = model_from_dict(dict(name="few", layers=1, hidden=256, heads=4, ffn=512, vocab=1000,
                               moe=dict(num_experts=64, top_k=1, expert_ffn=128)))
    assert _RankBuilder(few, ParallelPlan(seq_len=16, global_batch=1), 0, 8)._moe_dims()[2] == 1
    assert _RankBuilder(few, ParallelPlan(seq_len=16, global_batch=1, moe_force_balance=False), 0, 8)._moe_dims()[2] == 1


def test_deepep_sends_each_token_once_per_remote_node_and_forwards_over_nvlink():
    """DeepEP, EP4 over 2 nodes of 2 GPUs (EP group [0, 1, 2, 3], rail peers of rank 0: [0, 2], NVLink
    peers [0, 1]): with top-2 uniform routing a token reaches 2 x (1 - (1/2)^2) = 1.5 distinct nodes,
    1.5 x 1/2 = 0.75 of them remote; the RDMA send buffer (the all-to-all's whole buffer, of which
    (n-1)/n leaves the node) is 64 tokens x 0.75 x 256 x 2 B x 2/1 = 49,152 B; NVLink carries every
    (token, expert) pair: 64 x 2 x 256 x 2 = 65,536 B. Both start after the permute and the expert GEMM
    waits for both."""
    plan = ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4, moe_a2a="deepep", gpus_per_node=2)
    rb = _RankBuilder(MOE2, plan, 0, 2)
    r = _rows(rb)
    assert r["moe_dispatch_alltoall_rdma"] == ("moe_dispatch_alltoall_rdma", EPS, 49_152, None, ("moe_permute",))
    assert r["moe_dispatch_alltoall_nvlink"] == ("moe_dispatch_alltoall_nvlink", EPS, 65_536, None, ("moe_permute",))
    assert r["expert_up_gate_proj"][4] == ("moe_permute", "moe_dispatch_alltoall_rdma", "moe_dispatch_alltoall_nvlink")
    assert r["moe_combine_alltoall_rdma"][2:5] == (49_152, None, ("expert_down_proj",))
    assert r["moe_unpermute"][4] == ("expert_down_proj", "moe_combine_alltoall_rdma", "moe_combine_alltoall_nvlink")
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert ops["moe_dispatch_alltoall_rdma"]["pg_ranks"] == [0, 2]
    assert ops["moe_dispatch_alltoall_rdma"]["pg_name"] == "eprail:0"
    assert ops["moe_dispatch_alltoall_nvlink"]["pg_ranks"] == [0, 1]
    assert ops["moe_dispatch_alltoall_nvlink"]["pg_name"] == "epnode:0"
    assert ops["moe_dispatch_alltoall_rdma"]["comm_type"] == 6
    # rank 1 (second GPU of node 0): rail peers [1, 3], NVLink peers [0, 1]
    r1 = {o[0]: o[2] for o in _RankBuilder(MOE2, plan, 1, 2).layer_template(0, "F").ops}
    assert r1["moe_dispatch_alltoall_rdma"]["pg_ranks"] == [1, 3]
    assert r1["moe_dispatch_alltoall_nvlink"]["pg_ranks"] == [0, 1]
    # capacity padding travels through DeepEP too
    cf = _rows(_RankBuilder(MOE2, plan.with_(moe_capacity_factor=2.0), 0, 2))
    assert cf["moe_dispatch_alltoall_nvlink"][2] == 131_072 and cf["moe_dispatch_alltoall_rdma"][2] == 98_304


def test_deepep_node_limited_routing_caps_the_nodes_a_token_reaches():
    """DeepSeek-V3-style group-limited routing (8 experts in 4 groups, 1 group per token): a top-2 token
    reaches at most 1 node: 1 x 1/2 remote -> 64 x 0.5 x 256 x 2 x 2 = 32,768 B over RDMA. On one node
    (8 GPUs) there is no RDMA transfer, only NVLink among the 4 EP ranks."""
    grouped = model_from_dict(dict(name="g", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                                   moe=dict(num_experts=8, top_k=2, expert_ffn=128, groups=4, groups_per_token=1)))
    plan = ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4, moe_a2a="deepep", gpus_per_node=2)
    assert _rows(_RankBuilder(grouped, plan, 0, 2))["moe_dispatch_alltoall_rdma"][2] == 32_768
    two = model_from_dict(dict(name="g2", layers=2, hidden=256, heads=4, ffn=512, vocab=1000,
                               moe=dict(num_experts=8, top_k=2, expert_ffn=128, groups=2, groups_per_token=1)))
    assert _rows(_RankBuilder(two, plan, 0, 2))["moe_dispatch_alltoall_rdma"][2] == 32_768
    one = _rows(_RankBuilder(MOE2, plan.with_(gpus_per_node=8), 0, 8))
    assert "moe_dispatch_alltoall_rdma" not in one
    assert one["moe_dispatch_alltoall_nvlink"][2] == 65_536
    assert one["expert_up_gate_proj"][4] == ("moe_permute", "moe_dispatch_alltoall_nvlink")
    ops = {o[0]: o[2] for o in _RankBuilder(MOE2, plan.with_(gpus_per_node=8), 0, 8).layer_template(0, "F").ops}
    assert ops["moe_dispatch_alltoall_nvlink"]["pg_ranks"] == [0, 1, 2, 3]
    # EP over 4 nodes of 1 GPU each: every EP peer is remote, no NVLink leg
    four = _rows(_RankBuilder(MOE2, plan.with_(gpus_per_node=1), 0, 1))
    assert "moe_dispatch_alltoall_nvlink" not in four
    # 4 nodes: distinct = 4 x (1 - (3/4)^2) = 1.75, remote 1.75 x 3/4; buffer x 4/3
    assert four["moe_dispatch_alltoall_rdma"][2] == int(64 * 1.75 * 0.75 * 256 * 2 * 4 / 3)


def test_measured_routing_gives_each_layer_its_own_pair_bytes_and_expert_tokens():
    """EP2 (DP2), 2 MoE layers, 2 routing windows: pair_tokens[w, l] says how many (token, expert)
    pairs rank i sends to rank j; each pair is one 256 x 2 B row. Rank 0's dispatch in layer 1, window 1
    (micro-batch 3 -> window 3 % 2 = 1): sends [10, 30] pairs -> 40 x 512 = 20,480 B, per pair
    [[10, 30], [20, 40]] x 512; its combine is the transpose (it sends back what it received: 10 + 20
    = 30 pairs -> 15,360 B). Its 4 local expert slots hold [5, 0, 20, 15] tokens: one GEMM each; the
    straggler view (symmetric simulation) takes the rank with the most tokens (rank 1: 60 > 40)."""
    pairs = np.zeros((2, 2, 2, 2))
    pairs[1, 1] = [[10, 30], [20, 40]]
    slots = np.ones((2, 2, 2, 4))
    slots[1, 1] = [[5, 0, 20, 15], [30, 10, 10, 10]]
    loads = MoELoads(pairs, slots)
    plan = ParallelPlan(dp=2, ep=2, seq_len=128, global_batch=8)
    rb = _RankBuilder(MOE2, plan, 0, 8, moe_loads=loads)
    tpl = rb.layer_template(1, "F", mb=3)
    ops = {o[0]: o[2] for o in tpl.ops}
    d = ops["moe_dispatch_alltoall"]
    assert d["comm_size"] == 20_480
    assert np.array_equal(d["comm_pair_bytes"], np.array([[10, 30], [20, 40]]) * 512)
    c = ops["moe_combine_alltoall"]
    assert c["comm_size"] == 15_360
    assert np.array_equal(c["comm_pair_bytes"], np.array([[10, 20], [30, 40]]) * 512)
    up = ops["expert_up_gate_proj"]
    assert up["op"] == "grouped_gemm" and up["ms"] == (5, 0, 20, 15) and (up["n"], up["k"]) == (256, 256)
    assert ops["expert_act"]["flops"] == 40 * 128 * 8
    assert ops["expert_down_proj"]["ms"] == (5, 0, 20, 15) and (ops["expert_down_proj"]["n"], ops["expert_down_proj"]["k"]) == (256, 128)
    b = {o[0]: o[2] for o in rb.layer_template(1, "B", mb=3).ops}
    assert b["expert_down_proj_wgrad"]["wgrad"] is True and b["expert_down_proj_wgrad"]["ms"] == (5, 0, 20, 15)
    assert (b["expert_down_proj_wgrad"]["n"], b["expert_down_proj_wgrad"]["k"]) == (128, 256)
    assert b["expert_down_proj_dgrad"]["wgrad"] is False
    assert b["expert_act_bwd"]["flops"] == 40 * 128 * 12
    # backward: the combine's gradient goes the dispatch way, the dispatch's the combine way
    assert b["moe_combine_alltoall_bwd"]["comm_size"] == 20_480
    assert b["moe_dispatch_alltoall_bwd"]["comm_size"] == 15_360
    # rank 1 sends row 1: 60 pairs
    r1 = {o[0]: o[2] for o in _RankBuilder(MOE2, plan, 1, 8, moe_loads=loads).layer_template(1, "F", mb=3).ops}
    assert r1["moe_dispatch_alltoall"]["comm_size"] == 60 * 512
    assert r1["expert_up_gate_proj"]["ms"] == (30, 10, 10, 10)
    strag = {o[0]: o[2] for o in _RankBuilder(MOE2, plan, 0, 8, moe_loads=loads, straggler=True)
             .layer_template(1, "F", mb=3).ops}
    assert strag["expert_up_gate_proj"]["ms"] == (30, 10, 10, 10)
    # window 0 of layer 1 and window 1 of layer 0 are other templates (all-ones slots, no pairs)
    w0 = {o[0]: o[2] for o in rb.layer_template(1, "F", mb=2).ops}
    assert w0["expert_up_gate_proj"]["ms"] == (1, 1, 1, 1) and w0["moe_dispatch_alltoall"]["comm_size"] == 0
    assert rb.layer_template(1, "F", mb=1) is tpl and rb.layer_template(0, "F", mb=3) is not tpl
    # measured routing uses the NCCL all-to-all even when DeepEP is asked for
    dp = {o[0]: o[2] for o in _RankBuilder(MOE2, plan.with_(moe_a2a="deepep"), 0, 8, moe_loads=loads)
          .layer_template(1, "F", mb=3).ops}
    assert dp["moe_dispatch_alltoall"]["comm_size"] == 20_480


def test_moe_selective_recompute_modules():
    """--recompute-modules moe: the experts' up GEMM, activation (2 reads) and down GEMM again, plus
    the shared expert (TP2 DP4 EP4: 2 local experts of 64 tokens, f 128, shared f 64 on 64 tokens);
    moe_act: only the activation; shared_experts: only the shared expert."""
    plan = ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4, recompute="selective",
                        recompute_modules=("moe",))
    assert table(_RankBuilder(MOE, plan, 0, 8).layer_template(0, "S")) == exp(
        ("recompute_expert_fc1", C, G(64, 256, 256, batch=2), ["ENTRY"]),
        ("recompute_expert_act", C, E(64 * 2 * 128, 2, 1), ["recompute_expert_fc1"]),
        ("recompute_expert_fc2", C, G(64, 256, 128, batch=2), ["recompute_expert_act"]),
        ("recompute_shared_expert_fc1", C, G(64, 128, 256), ["recompute_expert_fc2"]),
        ("recompute_shared_expert_fc2", C, G(64, 256, 64), ["recompute_shared_expert_fc1"]),
    )
    assert table(_RankBuilder(MOE, plan.with_(recompute_modules=("moe_act",)), 0, 8).layer_template(0, "S")) == exp(
        ("recompute_expert_act", C, E(64 * 2 * 128, 2, 1), ["ENTRY"]))
    assert table(_RankBuilder(MOE, plan.with_(recompute_modules=("shared_experts",)), 0, 8).layer_template(0, "S")) == exp(
        ("recompute_shared_expert_fc1", C, G(64, 128, 256), ["ENTRY"]),
        ("recompute_shared_expert_fc2", C, G(64, 256, 64), ["recompute_shared_expert_fc1"]),
    )
    # no shared expert, or the dense MLP recompute on a MoE layer: nothing
    assert _RankBuilder(MOE2, plan.with_(recompute_modules=("shared_experts", "mlp")), 0, 8).layer_template(0, "S").ops == []
    gelu = model_from_dict(dict(name="gm", layers=2, hidden=256, heads=4, ffn=512, vocab=1000, activation="gelu",
                                moe=dict(num_experts=8, top_k=2, expert_ffn=128, shared_experts=2)))
    assert table(_RankBuilder(gelu, plan.with_(recompute_modules=("moe_act", "shared_experts")), 0, 8)
                 .layer_template(0, "S")) == exp(
        ("recompute_expert_act", C, E(64 * 2 * 128, 1, 1), ["ENTRY"]),
        ("recompute_shared_expert_fc1", C, G(64, 2 * 128, 256), ["recompute_expert_act"]),
        ("recompute_shared_expert_fc2", C, G(64, 256, 2 * 128), ["recompute_shared_expert_fc1"]),
    )


def test_gelu_moe_shared_experts_and_fp8_expert_casts():
    """GELU experts (no gate: up is f wide), 2 shared experts of 128 (S x f = 256 columns), FP8: delayed
    scaling casts both local experts' inputs in one multi-tensor launch (Transformer Engine's split_quantize
    -> nvte_multi_cast_transpose), current scaling expert by expert, 4 launches each (2 x 4 = 8)."""
    gelu = model_from_dict(dict(name="gm", layers=2, hidden=256, heads=4, ffn=512, vocab=1000, activation="gelu",
                                moe=dict(num_experts=8, top_k=2, expert_ffn=128, shared_experts=2)))
    plan = ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4, precision="fp8")
    rb = _RankBuilder(gelu, plan, 0, 8)
    r = _rows(rb)
    assert r["expert_up_gate_proj"][2:4] == G(64, 128, 256, eb=1, batch=2)
    assert r["shared_expert_up_gate_proj"][2:4] == G(64, 256, 256, eb=1)
    assert r["shared_expert_down_proj"][2:4] == G(64, 256, 256, eb=1)
    ops = {o[0]: o[2] for o in rb.layer_template(0, "F").ops}
    assert "launches" not in ops["expert_up_gate_proj_fp8_cast"]
    assert ops["expert_up_gate_proj_fp8_cast"]["flops"] == 64 * 256 * 2
    # the amax histories: 3 tensors per FP8 GEMM, each of the 2 local experts' GEMMs its own (qkv, proj,
    # 2 shared expert GEMMs, 2 x 2 expert GEMMs), 1024 entries each
    assert ops["fp8_amax_scale_update"]["flops"] == 3 * (4 + 2 * 2) * 1024
    current = {o[0]: o[2] for o in _RankBuilder(gelu, plan.with_(fp8_recipe="tensorwise"), 0, 8).layer_template(0, "F").ops}
    assert current["expert_up_gate_proj_fp8_cast"]["launches"] == 2 * 4
    assert "launches" not in ops["shared_expert_up_gate_proj_fp8_cast"]
    b = _rows(rb, "B")
    assert b["shared_expert_up_gate_proj_wgrad"][2:4] == G(256, 256, 64, eb=1)
    assert b["router_bwd"][2:4] == G(64, 256, 8)           # the router stays bf16

