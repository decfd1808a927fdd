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
from estimators.parallelism.workload import MoELoads, _RankBuilder, dropless_imbalance

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
    Each all-to-all: 64 x 2 x 256 x 2 B = 65,536 B over the EP group of ranks 0-3."""
    rb = _RankBuilder(MOE, ParallelPlan(tp=2, dp=4, ep=4, seq_len=128, global_batch=4), 0, 8)
    tpl = rb.layer_template(0, "F")
    a2a = 64 * 2 * 256 * 2
    assert _moe_rows(tpl) == exp(
        ("router", C, G(64, 8, 256), ["post_attn_norm"]),
        ("router_topk", C, E(64 * 8, 1, 1, 5), ["router"]),
        ("moe_permute", C, E(64 * 2 * 256, 1, 1), ["router_topk"]),
        ("moe_dispatch_alltoall", EPS, a2a, ["moe_permute"]),
        ("expert_up_gate_proj", C, G(64, 256, 256, batch=2), ["moe_dispatch_alltoall"]),
        ("expert_act", C, E(64 * 2 * 128, 2, 1, 8), ["expert_up_gate_proj"]),
        ("expert_down_proj", C, G(64, 256, 128, batch=2), ["expert_act"]),
        ("moe_combine_alltoall", EPS, a2a, ["expert_down_proj"]),
        ("moe_unpermute", C, E(64 * 2 * 256, 1, 1), ["moe_combine_alltoall"]),
        ("shared_expert_up_gate_proj", C, G(64, 128, 256), ["moe_unpermute"]),
        ("shared_expert_act", C, E(64 * 64, 2, 1, 8), ["shared_expert_up_gate_proj"]),
        ("shared_expert_down_proj", C, G(64, 256, 64), ["shared_expert_act"]),
    )
    ops = {o[0]: o[2] for o in tpl.ops}
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
        ("shared_expert_down_proj_dgrad", C, G(64, 64, 256), ["residual_add_mlp_bwd"]),
        ("shared_expert_down_proj_wgrad", C, G(64, 256, 64), ["shared_expert_down_proj_dgrad"]),
        ("shared_expert_act_bwd", C, E(64 * 64, 3, 2, 12), ["shared_expert_down_proj_dgrad"]),
        ("shared_expert_up_gate_proj_dgrad", C, G(64, 256, 128), ["shared_expert_act_bwd"]),
        ("shared_expert_up_gate_proj_wgrad", C, G(256, 128, 64), ["shared_expert_up_gate_proj_dgrad"]),
        ("moe_unpermute_bwd", C, E(64 * 2 * 256, 1, 1), ["shared_expert_up_gate_proj_dgrad"]),
        ("moe_combine_alltoall_bwd", EPS, a2a, ["moe_unpermute_bwd"]),
        ("expert_down_proj_dgrad", C, G(64, 128, 256, batch=2), ["moe_combine_alltoall_bwd"]),
        ("expert_down_proj_wgrad", C, G(128, 256, 64, batch=2), ["expert_down_proj_dgrad"]),
        ("expert_act_bwd", C, E(64 * 2 * 128, 3, 2, 12), ["expert_down_proj_dgrad"]),
        ("expert_up_gate_proj_dgrad", C, G(64, 256, 256, batch=2), ["expert_act_bwd"]),
        ("expert_up_gate_proj_wgrad", C, G(256, 256, 64, batch=2), ["expert_up_gate_proj_dgrad"]),
        ("moe_dispatch_alltoall_bwd", EPS, a2a, ["expert_up_gate_proj_dgrad"]),
        ("moe_permute_bwd", C, E(64 * 2 * 256, 1, 1), ["moe_dispatch_alltoall_bwd"]),
        ("router_bwd", C, G(64, 256, 8), ["moe_permute_bwd"]),
        ("router_wgrad", C, G(256, 8, 64), ["router_bwd"]),
    )
    names = [o[0] for o in tpl.ops]
    assert tpl.ops[names.index("post_attn_norm_bwd")][3] == (names.index("router_bwd"),)
    ops = {o[0]: o[2] for o in tpl.ops}
    assert ops["expert_down_proj_wgrad"]["launches"] == 2 and ops["expert_up_gate_proj_wgrad"]["launches"] == 2
