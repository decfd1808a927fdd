"""The workload generator: graph structure, the pipeline schedule as the compute-stream order, FLOP
accounting against the analytical count, and 1F1B bubbles from a pure-compute replay."""
from __future__ import annotations

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType, NodeType
from estimators.parallelism.memory import estimate_memory
from estimators.model_config import load_model, model_from_dict
from estimators.parallelism.plan import ParallelPlan, stage_layers, validate_plan
from estimators.parallelism.evaluate import hw_flops_per_step, predict
from estimators.parallelism.workload import STREAMS, COMPUTE, generate, pipeline_schedule

TINY = model_from_dict(dict(name="tiny", layers=8, hidden=512, heads=8, ffn=2048, vocab=1000))
GPT = model_from_dict(dict(name="gpt-small", layers=8, hidden=1024, heads=16, ffn=4096, vocab=51200,
                           activation="gelu", norm="layernorm", tied_embeddings=True, position="learned",
                           max_seq=2048, bias=True))


class LayerComputeOnly:
    """Pure-compute timing: every layer GEMM takes flops/1e9 us; everything else (embedding, loss,
    communication) takes no time, so stages are identical and the bubble is the schedule's alone."""
    name = "layer-compute-only"

    def node_durations(self, g):
        d = np.zeros(len(g))
        for i, a in g.attrs.items():
            if "comm_size" not in a and ".L" in g.name[i] and a.get("op") == "gemm":
                d[i] = a["flops"] / 1e9
        return d

    def collective_us(self, g, node, group, durs):
        return 0.0

    def launch_latency_us(self, g):
        return None


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (2, 6), (8, 8)])
def test_1f1b_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    plan = ParallelPlan(pp=p, dp=1, seq_len=256, global_batch=m)
    r = predict(TINY if 8 % p == 0 else TINY, plan, None, timing=LayerComputeOnly(), extrapolate=False)
    for stage in r.breakdown.per_stage:
        assert stage.idle_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-6)


def test_interleaved_bubble_shrinks_by_the_virtual_stage_count():
    p, m, v = 4, 8, 2
    plan = ParallelPlan(pp=p, vp=v, dp=1, seq_len=256, global_batch=m)
    r = predict(TINY, plan, None, timing=LayerComputeOnly(), extrapolate=False)
    for stage in r.breakdown.per_stage:
        assert stage.idle_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-6)


def test_schedule_is_megatron_1f1b_order():
    s = pipeline_schedule(4, 0, 6)
    assert [f for f, _, _ in s[:4]] == [True, True, True, True]   # 3 warm-up forwards + the first steady one
    assert s[4] == (False, 0, 0)
    assert sum(1 for f, _, _ in s if f) == sum(1 for f, _, _ in s if not f) == 6
    last = pipeline_schedule(4, 3, 6)
    assert [f for f, _, _ in last[:4]] == [True, False, True, False]
    inter = pipeline_schedule(2, 0, 4, vp=2)
    assert {c for _, _, c in inter} == {0, 1} and len(inter) == 16


def _graph_flops(graphs, ops=("gemm", "attention")):
    return sum(a.get("flops", 0.0) for g in graphs for a in g.attrs.values() if a.get("op") in ops)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_graph_flops_equal_analytical_count_gpt_unfused(recompute):
    plan = ParallelPlan(tp=2, pp=2, dp=2, seq_len=1024, global_batch=8, recompute=recompute,
                        attention="unfused", sequence_parallel=False)
    graphs = generate(GPT, plan, "all")
    analytical = hw_flops_per_step(GPT, plan)
    assert _graph_flops(graphs) == pytest.approx(analytical, rel=0.02)


def test_graph_flops_equal_analytical_count_llama_flash():
    """Flash attention executes the causal half of the scores and recomputes them in the backward
    (2.5x the forward): the analytical count says so explicitly."""
    m = load_model("llama3-8b")
    plan = ParallelPlan(tp=8, pp=4, dp=1, seq_len=4096, global_batch=4)
    graphs = generate(m, plan, "symmetric")
    tokens = plan.global_batch * plan.seq_len
    attn_fwd_full = m.attention_flops_fwd_per_token(plan.seq_len) * tokens
    analytical = 6.0 * m.matmul_params_active() * tokens + attn_fwd_full * 0.5 * (1 + 2.5)
    assert _graph_flops(graphs) * plan.tp == pytest.approx(analytical, rel=0.02)


def test_moe_graph_has_all_to_all_and_expert_gemms_by_tokens_per_expert():
    m = load_model("qwen3-235b-a22b")
    plan = ParallelPlan(tp=4, pp=2, ep=8, dp=8, seq_len=4096, global_batch=16)
    g = generate(m, plan, "symmetric")[0]
    a2a = [i for i, a in g.attrs.items() if a.get("comm_type") == int(CommType.ALL_TO_ALL)]
    assert a2a and all(len(g.attrs[i]["pg_ranks"]) == 8 for i in a2a)
    expert = [a for i, a in g.attrs.items() if g.name[i].endswith("expert_up_gate_proj")]
    tokens = plan.seq_len // plan.tp
    assert expert[0]["batch"] == 128 // 8
    assert expert[0]["m"] == round(tokens * 8 * 8 / 128)


def test_streams_and_collectives_follow_the_contract():
    m = load_model("llama3-8b")
    plan = ParallelPlan(tp=2, pp=2, cp=2, dp=2, seq_len=2048, global_batch=4, zero=3)
    graphs = generate(m, plan, "all")
    assert len(graphs) == 16
    g = graphs[0]
    assert not g.validate()
    names = {r.name for r in g.resources}
    assert {"compute", "tp_comm", "cp_send", "cp_recv", "dp_grad_comm", "dp_param_comm", "pp_send_fwd",
            "pp_recv_bwd"} <= names
    assert all(r.is_gpu for r in g.resources)
    for i in g.collectives().tolist():
        a = g.attrs[i]
        if g.node_type[i] == NodeType.COMM_COLL_NODE:
            assert {"comm_type", "comm_size", "pg_name", "pg_ranks"} <= set(a) and g.rank in a["pg_ranks"]
        else:
            assert {"comm_src", "comm_dst", "comm_size"} <= set(a)
    gemms = [a for a in g.attrs.values() if a.get("op") == "gemm"]
    assert all(k in gemms[0] for k in ("m", "n", "k", "flops", "bytes", "dtype"))


def test_compute_stream_order_is_the_pipeline_schedule():
    plan = ParallelPlan(pp=4, dp=1, seq_len=256, global_batch=6)
    g = generate(TINY, plan, "symmetric")[1]
    compute = [r for r, res in enumerate(g.resources) if res.index == STREAMS[COMPUTE][0]][0]
    order = []
    for i in g.nodes_on(compute).tolist():
        if "." not in g.name[i]:
            continue  # optimizer step
        mb = g.name[i].split(".", 1)[0]
        tag = ("F" if ".F." in g.name[i] else "B" if ".B." in g.name[i] else None)
        if tag and (not order or order[-1] != (tag, mb)):
            order.append((tag, mb))
    want = [("F" if f else "B", f"mb{m}") for f, m, _ in pipeline_schedule(4, 1, 6)]
    assert order == want


def test_invalid_plans_are_one_line_errors():
    m = load_model("llama3-8b")
    bad = [ParallelPlan(tp=3, dp=1, seq_len=1024, global_batch=4),                 # heads % tp
           ParallelPlan(pp=5, dp=1, seq_len=1024, global_batch=5),                 # layers % pp
           ParallelPlan(dp=3, seq_len=1024, global_batch=4),                       # batch % dp
           ParallelPlan(pp=2, vp=3, dp=1, seq_len=1024, global_batch=4)]           # layers % (pp*vp)
    for plan in bad:
        with pytest.raises(TraceInputError) as e:
            validate_plan(m, plan)
        assert "\n" not in str(e.value)
    with pytest.raises(TraceInputError):
        validate_plan(m, ParallelPlan(tp=2, dp=2, seq_len=1024, global_batch=4), gpus=8)


def test_llama3_405b_pipeline_split_follows_the_paper():
    m = load_model("llama3-405b")
    chunks = stage_layers(m, ParallelPlan(pp=16, dp=1, seq_len=8192, global_batch=16))
    assert [len(c) for c in chunks] == [7] + [8] * 14 + [7]


def test_memory_per_korthikanti_and_oom_flag():
    m = load_model("llama3-70b")
    base = ParallelPlan(tp=8, pp=4, dp=4, seq_len=8192, global_batch=64)
    full = estimate_memory(m, base.with_(recompute="full"), 80.0)
    none = estimate_memory(m, base, 80.0)
    assert full.activations_gib < none.activations_gib
    # Korthikanti et al. full recomputation: 2*s*b*h/t bytes per layer (SP), L layers in flight on stage 0
    expect = 2 * 8192 * 8192 / 8 * 80 / 1024 ** 3
    assert full.activations_gib == pytest.approx(expect, rel=0.1)
    tiny = estimate_memory(m, ParallelPlan(tp=1, pp=1, dp=32, seq_len=8192, global_batch=64), 80.0)
    assert tiny.oom and not estimate_memory(m, base.with_(recompute="full", zero=1), 80.0).oom


def test_hsdp_reduces_in_the_shard_group_then_across_replicas():
    m = load_model("llama3-8b")
    plan = ParallelPlan(tp=8, dp=16, dp_shard=8, zero=3, seq_len=4096, global_batch=16)
    g = generate(m, plan, "symmetric")[0]
    rs = [a for i, a in g.attrs.items() if g.name[i].endswith("grad_reducescatter")]
    ar = [a for i, a in g.attrs.items() if g.name[i].endswith("grad_allreduce_replicas")]
    ag = [a for i, a in g.attrs.items() if g.name[i].endswith("param_allgather")]
    assert rs and ar and ag
    assert len(rs[0]["pg_ranks"]) == 8 and len(ar[0]["pg_ranks"]) == 2 and len(ag[0]["pg_ranks"]) == 8
    assert ar[0]["comm_size"] == pytest.approx(rs[0]["comm_size"] / 8, rel=1e-6)
    # FSDP all-gathers every layer before its forward and its backward, once per micro-batch
    assert len(ag) == 2 * m.layers * plan.micro_batches
