"""A whole rank's training step as the workload generator builds it (build_rank_graph): the optimizer
step over this rank's parameter shard, gradient reductions, parameter gathers, pipeline transfers and
the order of passes, counted by hand (never the generator's output).

References:
- Adam step (Kingma & Ba 2015) with fp32 master weights (Micikevicius et al. 2018): per parameter read
  param, grad, m, v (4 x 4 B), write param, m, v (3 x 4 B) and the bf16 copy (2 B) = 30 B, ~12 FLOPs.
- ZeRO (Rajbhandari et al. 2020): stage >= 1 shards the optimizer step over the DP group (expert
  parameters over the expert-DP group); stage 1/2 all-gathers the updated 16-bit parameters (2 B each).
- Parameters per rank: Megatron tensor parallelism splits each matmul weight t ways, each pipeline stage
  holds its layers, the first stage the input embedding (V x h / t), the last the output projection.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import build_rank_graph, generate

H, F, V = 256, 512, 1000
# Llama layer (MHA): Q, K, V, O 256 x 256, SwiGLU 3 x 256 x 512, 2 RMSNorms of 256
LAYER = 4 * H * H + 3 * H * F + 2 * H             # 262,144 + 393,216 + 512 = 655,872
TINY = model_from_dict(dict(name="tiny", layers=4, hidden=H, heads=4, ffn=F, vocab=V))


def _by_name(g):
    out = defaultdict(list)
    for i, a in g.attrs.items():
        out[g.name[i].split(".")[-1]].append(a)
    return out


def _deps(g, i):
    return sorted(g.name[j] for j in g.deps_of(i))


@pytest.mark.parametrize("zero,shard", [(0, 1), (1, 4), (3, 4)])
def test_optimizer_step_updates_this_ranks_parameter_shard_at_12_flops_and_30_bytes(zero, shard):
    """TP2 PP2 DP4: stage 0 holds 2 layers x 655,872 / 2 + 1000 x 256 / 2 = 783,872 parameters, the last
    stage the same with the output projection; ZeRO >= 1 shards them over the 4 DP ranks."""
    plan = ParallelPlan(tp=2, pp=2, dp=4, zero=zero, seq_len=128, global_batch=8)
    for g in generate(TINY, plan, "symmetric"):
        opt = _by_name(g)["optimizer_step"]
        params = (2 * LAYER / 2 + V * H / 2) / shard
        assert opt == [{"op": "optimizer", "dtype": "fp32", "flops": 12.0 * params, "bytes": 30.0 * params}]


SMALL = model_from_dict(dict(name="s", layers=2, hidden=64, heads=4, ffn=128, vocab=100))
S_LAYER = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64      # 16,384 + 24,576 + 128 = 41,088


def _index(g):
    return {n: i for i, n in enumerate(g.name)}


def _data_deps(g, name):
    """Names of the nodes `name` waits for by data (not the stream order)."""
    i = _index(g)[name]
    return sorted(g.name[j] for j, k in zip(g.deps_of(i), g.dep_kinds_of(i)) if k == 0)


def _stream_prev(g, name):
    i = _index(g)[name]
    prev = [g.name[j] for j, k in zip(g.deps_of(i), g.dep_kinds_of(i)) if k == 2]
    return prev[0] if prev else None


def test_pipeline_1f1b_sends_and_receives_with_unique_tags_between_adjacent_stages():
    """PP2 DP2, 2 micro-batches of 32 tokens, h = 64: each transfer is 32 x 64 x 2 B = 4,096 B. Stage 0
    (ranks 0 and 1) talks to stage 1 (ranks 2 and 3) at the same DP index. A message's tag is
    (micro-batch x chunks + sending chunk) x 2 + direction: activations of mb m from chunk 0 -> 4m,
    gradients of mb m from chunk 1 -> 4m + 3. Schedule: stage 0 F0 F1 B0 B1, stage 1 F0 B0 F1 B1."""
    plan = ParallelPlan(pp=2, dp=2, seq_len=32, global_batch=4)
    g0 = build_rank_graph(SMALL, plan, 0)
    a = {g0.name[i]: x for i, x in g0.attrs.items()}
    for m in (0, 1):
        assert a[f"mb{m}.send_act_c0"] == {"comm_src": 0, "comm_dst": 2, "comm_size": 4096, "pg_name": "pp", "comm_tag": 4 * m}
        assert a[f"mb{m}.recv_grad_c0"] == {"comm_src": 2, "comm_dst": 0, "comm_size": 4096, "pg_name": "pp",
                                            "comm_tag": 4 * m + 3}
        assert _data_deps(g0, f"mb{m}.send_act_c0") == [f"mb{m}.L0.F.residual_add_mlp"]
        assert _data_deps(g0, f"mb{m}.recv_grad_c0") == []
        assert _data_deps(g0, f"mb{m}.L0.B.residual_add_mlp_bwd") == [f"mb{m}.recv_grad_c0"]
    g1 = build_rank_graph(SMALL, plan, 3)          # stage 1, DP index 1
    a = {g1.name[i]: x for i, x in g1.attrs.items()}
    assert a["mb1.recv_act_c1"] == {"comm_src": 1, "comm_dst": 3, "comm_size": 4096, "pg_name": "pp", "comm_tag": 4}
    assert a["mb0.send_grad_c1"] == {"comm_src": 3, "comm_dst": 1, "comm_size": 4096, "pg_name": "pp", "comm_tag": 3}
    assert _data_deps(g1, "mb0.L1.F.input_norm") == ["mb0.recv_act_c1"]
    assert _data_deps(g1, "mb0.send_grad_c1") == ["mb0.L1.B.input_norm_bwd"]
    # send / receive nodes are typed by direction
    from chakra_schema.graph import NodeType
    i = _index(g1)
    assert g1.node_type[i["mb0.send_grad_c1"]] == NodeType.COMM_SEND_NODE
    assert g1.node_type[i["mb0.recv_act_c1"]] == NodeType.COMM_RECV_NODE
    # compute order is the 1F1B schedule
    fw_bw = [n.split(".")[0] + (".F" if ".F." in n else ".B") for n in g0.name if n.endswith((".F.input_norm", ".B.input_norm_bwd"))]
    assert fw_bw == ["mb0.F", "mb1.F", "mb0.B", "mb1.B"]
    fw_bw = [n.split(".")[0] + (".F" if ".F." in n else ".B") for n in g1.name if n.endswith((".F.input_norm", ".B.input_norm_bwd"))]
    assert fw_bw == ["mb0.F", "mb0.B", "mb1.F", "mb1.B"]


def test_step_metadata_lists_each_pass_first_and_output_node():
    """metadata["passes"]: [is_forward, micro-batch, local chunk, first node, output node] per pass;
    "tail": the first node after the passes (here the optimizer step: reductions overlap the backward)."""
    plan = ParallelPlan(pp=2, dp=2, seq_len=32, global_batch=4)
    g0 = build_rank_graph(SMALL, plan, 0)
    md = g0.metadata
    assert {k: md[k] for k in ("generator", "model", "stage", "pp", "tp", "cp", "dp", "ep", "vp", "micro_batches")} == {
        "generator": "estimators.parallelism.workload", "model": "s", "stage": 0, "pp": 2, "tp": 1, "cp": 1,
        "dp": 2, "ep": 1, "vp": 1, "micro_batches": 2}
    p = md["passes"]
    assert [x[:3] for x in p] == [[1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 1, 0]]
    assert [(g0.name[x[3]], g0.name[x[4]]) for x in p] == [
        ("mb0.embedding", "mb0.L0.F.residual_add_mlp"), ("mb1.embedding", "mb1.L0.F.residual_add_mlp"),
        ("mb0.recv_grad_c0", "mb0.embedding_bwd"), ("mb1.recv_grad_c0", "mb1.embedding_bwd")]
    assert g0.name[md["tail"]] == "optimizer_step"
    g1 = build_rank_graph(SMALL, plan, 2)
    p = g1.metadata["passes"]
    assert g1.metadata["stage"] == 1
    assert [(x[:3], g1.name[x[3]], g1.name[x[4]]) for x in p] == [
        ([1, 0, 0], "mb0.recv_act_c1", "mb0.cross_entropy"),
        ([0, 0, 0], "mb0.cross_entropy_bwd", "mb0.L1.B.input_norm_bwd"),
        ([1, 1, 0], "mb1.recv_act_c1", "mb1.cross_entropy"),
        ([0, 1, 0], "mb1.cross_entropy_bwd", "mb1.L1.B.input_norm_bwd")]
    assert g1.name[g1.metadata["tail"]] == "optimizer_step"
    assert g0.rank == 0 and g1.rank == 2 and g0.world_size == 4


def test_gradient_buckets_reduce_after_the_last_micro_batchs_backward_of_each_layer():
    """PP2 DP2 ZeRO-1, 2 micro-batches: only micro-batch 1 (the last backward) reduces. Stage 0
    reduce-scatters layer 0 (41,088 x 4 B = 164,352 B) and the embedding (100 x 64 x 4 = 25,600 B) over
    its DP group [0, 1]; stage 1 layer 1 and the output projection. Each waits for its bucket's last
    backward op; the optimizer waits for all of them and the pass."""
    plan = ParallelPlan(pp=2, dp=2, seq_len=32, global_batch=4)
    g0 = build_rank_graph(SMALL, plan, 0)
    red = {g0.name[i]: a for i, a in g0.attrs.items() if ".grad_" in g0.name[i]}
    assert sorted(red) == ["mb1.L0.grad_reducescatter", "mb1.embedding.grad_reducescatter"]
    assert red["mb1.L0.grad_reducescatter"] == {"comm_type": 7, "comm_size": S_LAYER * 4, "pg_ranks": [0, 1],
                                                "pg_name": "dp:0", "coll_name": "reduce_scatter"}
    assert red["mb1.embedding.grad_reducescatter"]["comm_size"] == 25_600
    assert _data_deps(g0, "mb1.L0.grad_reducescatter") == ["mb1.L0.B.input_norm_bwd"]
    assert _data_deps(g0, "mb1.embedding.grad_reducescatter") == ["mb1.embedding_bwd"]
    assert _data_deps(g0, "optimizer_step") == ["mb1.L0.grad_reducescatter", "mb1.embedding.grad_reducescatter",
                                                "mb1.embedding_bwd"]
    assert _data_deps(g0, "param_allgather") == ["optimizer_step"]
    g1 = build_rank_graph(SMALL, plan, 3)
    red = {g1.name[i]: a for i, a in g1.attrs.items() if ".grad_" in g1.name[i]}
    assert sorted(red) == ["mb1.L1.grad_reducescatter", "mb1.output.grad_reducescatter"]
    assert red["mb1.output.grad_reducescatter"]["comm_size"] == 25_600
    assert red["mb1.output.grad_reducescatter"]["pg_ranks"] == [2, 3]
    assert red["mb1.output.grad_reducescatter"]["pg_name"] == "dp:2"
    assert _data_deps(g1, "mb1.output.grad_reducescatter") == ["mb1.final_norm_bwd"]
    # the stage's 16-bit parameters after the step: (41,088 + 6,400) x 2 B
    a = {g1.name[i]: x for i, x in g1.attrs.items()}
    assert a["param_allgather"] == {"comm_type": 2, "comm_size": (S_LAYER + 6400) * 2, "pg_ranks": [2, 3],
                                    "pg_name": "dp:2", "coll_name": "all_gather"}


def test_ddp_all_reduces_and_2021_megatron_reduces_after_the_whole_backward():
    """ZeRO-0 (DDP): all-reduce of the fp32 grads, no parameter all-gather after the step. Without
    overlap_grad_reduce (2021 Megatron-LM) every bucket is reduced after the last pass, in bucket order."""
    plan = ParallelPlan(dp=2, zero=0, seq_len=32, global_batch=2, overlap_grad_reduce=False)
    g = build_rank_graph(SMALL, plan, 0)
    names = [n for n in g.name if ".grad_" in n]
    assert names == ["mb0.output.grad_allreduce", "mb0.L1.grad_allreduce", "mb0.L0.grad_allreduce",
                     "mb0.embedding.grad_allreduce"]
    last = g.name[g.metadata["passes"][-1][4]]
    assert last == "mb0.embedding_bwd"
    for n in names:
        assert _data_deps(g, n) == [last]
    assert g.name[g.metadata["tail"]] == "mb0.output.grad_allreduce"
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.L1.grad_allreduce"]["comm_type"] == 0 and a["mb0.L1.grad_allreduce"]["comm_size"] == S_LAYER * 4
    assert a["mb0.L1.grad_allreduce"]["pg_name"] == "dp:0" and a["mb0.L1.grad_allreduce"]["pg_ranks"] == [0, 1]
    assert "param_allgather" not in g.name
    assert sorted(_data_deps(g, "optimizer_step")) == sorted(names + [last])
    # tied embeddings on one stage: no separate output bucket
    tied = model_from_dict(dict(name="t", layers=2, hidden=64, heads=4, ffn=128, vocab=100, tied_embeddings=True))
    assert "mb0.output.grad_allreduce" not in build_rank_graph(tied, plan, 0).name
    # a single DP rank reduces nothing
    assert not [n for n in build_rank_graph(SMALL, plan.with_(dp=1), 0).name if "grad_" in n]


def _dset(g, name):
    return set(_data_deps(g, name))


def test_blocking_p2p_waits_for_each_batch_of_sends_and_receives():
    """2021 Megatron-LM (no p2p overlap), PP2, 2 micro-batches, stage 1 (F0 B0 F1 B1): the receive of the
    first pass is posted before it; after each pass the batch posts its send (after the pass output) and
    the receive of the next pass (after the compute so far), and the next pass waits for the whole
    batch; the optimizer waits for the last batch."""
    plan = ParallelPlan(pp=2, seq_len=32, global_batch=2, overlap_p2p=False)
    g = build_rank_graph(SMALL, plan, 1)
    assert _dset(g, "mb0.recv_act_c1") == set()
    assert _dset(g, "mb0.L1.F.input_norm") == {"mb0.recv_act_c1"}
    assert _dset(g, "mb0.send_grad_c1") == {"mb0.L1.B.input_norm_bwd"}
    assert _dset(g, "mb1.recv_act_c1") == {"mb0.L1.B.input_norm_bwd"}
    assert _dset(g, "mb1.L1.F.input_norm") == {"mb0.send_grad_c1", "mb1.recv_act_c1"}
    assert "mb1.send_grad_c1" in _dset(g, "optimizer_step")
    # stage 0 (F0 F1 B0 B1): B0's gradient receive is posted after F1's forward
    g0 = build_rank_graph(SMALL, plan, 0)
    assert _dset(g0, "mb0.recv_grad_c0") == {"mb1.L0.F.residual_add_mlp"}
    assert _dset(g0, "mb1.send_act_c0") == {"mb1.L0.F.residual_add_mlp"}
    assert _dset(g0, "mb0.L0.B.residual_add_mlp_bwd") == {"mb1.send_act_c0", "mb0.recv_grad_c0"}
    # overlapped p2p: receives are pre-posted without deps and the pass waits only for its own
    o = build_rank_graph(SMALL, plan.with_(overlap_p2p=True), 1)
    assert _dset(o, "mb1.recv_act_c1") == set()
    assert _dset(o, "mb1.L1.F.input_norm") == {"mb1.recv_act_c1"}
    assert "mb1.send_grad_c1" not in _dset(o, "optimizer_step")


def test_interleaved_blocking_p2p_pairs_forward_and_backward_communication():
    """Interleaved 1F1B (PP2 VP2, 4 micro-batches, 4 one-layer chunks; stage 0 holds chunks 0 and 2),
    blocking p2p as Megatron-LM's interleaved schedule communicates: each warm-up forward on its own,
    then one batch per steady-state (forward, backward) pair, then each cool-down backward on its own.
    Stage 0: warm-up F(mb0,c0) F(mb1,c0) F(mb0,c2) F(mb1,c2); steady [F(mb2,c0) B(mb0,c2)]
    [F(mb3,c0) B(mb1,c2)] [F(mb2,c2) B(mb0,c0)] [F(mb3,c2) B(mb1,c0)]; cool-down B(mb2,c2) ...
    A send waits for its pass and for the last compute of its batch."""
    m4 = model_from_dict(dict(name="m4", layers=4, hidden=64, heads=4, ffn=128, vocab=100))
    plan = ParallelPlan(pp=2, vp=2, seq_len=32, global_batch=4, overlap_p2p=False)
    g = build_rank_graph(m4, plan, 0)
    assert _dset(g, "mb0.send_act_c0") == {"mb0.L0.F.residual_add_mlp"}
    assert _dset(g, "mb1.send_act_c0") == {"mb1.L0.F.residual_add_mlp"}
    assert _dset(g, "mb0.send_act_c2") == {"mb0.L2.F.residual_add_mlp"}
    assert _dset(g, "mb1.send_act_c2") == {"mb1.L2.F.residual_add_mlp"}
    # steady pairs: the forward's send goes out with the backward's
    assert _dset(g, "mb2.send_act_c0") == {"mb2.L0.F.residual_add_mlp", "mb0.L2.B.input_norm_bwd"}
    assert _dset(g, "mb0.send_grad_c2") == {"mb0.L2.B.input_norm_bwd"}
    assert _dset(g, "mb3.send_act_c0") == {"mb3.L0.F.residual_add_mlp", "mb1.L2.B.input_norm_bwd"}
    assert _dset(g, "mb2.send_act_c2") == {"mb2.L2.F.residual_add_mlp", "mb0.embedding_bwd"}
    assert _dset(g, "mb3.send_act_c2") == {"mb3.L2.F.residual_add_mlp", "mb1.embedding_bwd"}
    # a batch posts the receives of the passes up to the next batch: B(mb0,c2)'s gradient receive goes
    # out with the last warm-up forward's batch; every transfer is posted once
    assert _dset(g, "mb0.recv_grad_c2") == {"mb1.L2.F.residual_add_mlp"}
    assert len(set(g.name)) == len(g.name)
    # cool-down: one by one
    assert _dset(g, "mb2.send_grad_c2") == {"mb2.L2.B.input_norm_bwd"}
    assert _dset(g, "mb3.send_grad_c2") == {"mb3.L2.B.input_norm_bwd"}
    # the first steady forward waits for the batch of the last warm-up forward
    assert _dset(g, "mb2.embedding") >= {"mb1.send_act_c2"}
    # tags: activations of mb1 from chunk 2 -> (1 x 4 + 2) x 2 = 12; gradients of mb0 from chunk 2 -> 5
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb1.send_act_c2"]["comm_tag"] == 12 and a["mb0.send_grad_c2"]["comm_tag"] == 5
    assert a["mb0.send_act_c2"]["comm_dst"] == 1 and a["mb0.recv_grad_c2"]["comm_src"] == 1
    # chunk 2's activation comes from chunk 1 on stage 1: tag (0 x 4 + 1) x 2 = 2
    assert a["mb0.recv_act_c2"]["comm_tag"] == 2 and a["mb0.recv_act_c2"]["comm_src"] == 1
    # chunk 0's gradient comes from chunk 1: tag (0 x 4 + 1) x 2 + 1 = 3
    assert a["mb0.recv_grad_c0"]["comm_tag"] == 3
    assert [x[:3] for x in g.metadata["passes"]][:6] == [[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1], [1, 2, 0], [0, 0, 1]]


def test_zero3_gathers_parameters_one_layer_ahead_and_hsdp_all_reduces_across_replicas():
    """FSDP (ZeRO-3) DP4 with HSDP shard groups of 2 (dp_shard = 2): each layer's bf16 parameters
    (41,088 x 2 B) are all-gathered in the shard group [0, 1] before its forward and backward, issued
    when the previous layer started (prefetch); gradients are reduce-scattered in bf16 in the shard
    group (41,088 x 2 B) and the shard (half) all-reduced across the replicas [0, 2]."""
    plan = ParallelPlan(dp=4, zero=3, dp_shard=2, seq_len=32, global_batch=4)
    g = build_rank_graph(SMALL, plan, 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.L0.F.param_allgather"] == {"comm_type": 2, "comm_size": S_LAYER * 2, "pg_ranks": [0, 1],
                                             "pg_name": "dp:0", "coll_name": "all_gather"}
    assert _dset(g, "mb0.L0.F.param_allgather") == set()
    assert _dset(g, "mb0.L1.F.param_allgather") == {"mb0.L0.F.input_norm"}
    assert "mb0.L1.F.param_allgather" in _dset(g, "mb0.L1.F.input_norm")
    assert _dset(g, "mb0.L1.B.param_allgather") == set()
    assert _dset(g, "mb0.L0.B.param_allgather") == {"mb0.L1.B.residual_add_mlp_bwd"}
    assert _dset(g, "mb0.L0.B.residual_add_mlp_bwd") == {"mb0.L1.B.input_norm_bwd", "mb0.L0.B.param_allgather"}
    assert a["mb0.L1.grad_reducescatter"] == {"comm_type": 7, "comm_size": S_LAYER * 2, "pg_ranks": [0, 1],
                                              "pg_name": "dp:0", "coll_name": "reduce_scatter"}
    assert a["mb0.L1.grad_allreduce_replicas"] == {"comm_type": 0, "comm_size": S_LAYER, "pg_ranks": [0, 2],
                                                   "pg_name": "dprep:0", "coll_name": "all_reduce"}
    assert _dset(g, "mb0.L1.grad_allreduce_replicas") == {"mb0.L1.grad_reducescatter"}
    assert "mb0.L1.grad_allreduce_replicas" in _dset(g, "optimizer_step")
    assert "mb0.L1.grad_reducescatter" not in _dset(g, "optimizer_step")
    assert "param_allgather" not in g.name                      # ZeRO-3 keeps no full copy after the step
    # rank 3 (dp index 3): shard group [2, 3], replicas [1, 3]
    g3 = build_rank_graph(SMALL, plan, 3)
    a3 = {g3.name[i]: x for i, x in g3.attrs.items()}
    assert a3["mb0.L1.grad_reducescatter"]["pg_ranks"] == [2, 3] and a3["mb0.L1.grad_reducescatter"]["pg_name"] == "dp:2"
    assert a3["mb0.L1.grad_allreduce_replicas"]["pg_ranks"] == [1, 3]
    assert a3["mb0.L1.grad_allreduce_replicas"]["pg_name"] == "dprep:1"
    # plain FSDP (one shard group of all 4): no replica all-reduce; optimizer over 1/4 of the parameters
    f = build_rank_graph(SMALL, plan.with_(dp_shard=0), 0)
    assert not [n for n in f.name if "replicas" in n]
    af = {f.name[i]: x for i, x in f.attrs.items()}
    assert af["mb0.L1.grad_reducescatter"]["pg_ranks"] == [0, 1, 2, 3]
    assert af["optimizer_step"]["flops"] == 12.0 * (2 * S_LAYER + 2 * 6400) / 4
    # ZeRO-3 on one rank gathers nothing
    assert not [n for n in build_rank_graph(SMALL, plan.with_(dp=1, dp_shard=0), 0).name if "param_allgather" in n]


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """MoE (8 experts of 128, top-2; h = 64) on DP4 EP2: expert parameters 8 x 3 x 64 x 128 / 2 = 98,304
    per rank, reduced in fp32 (x 4 B) over the 2 expert-DP ranks [0, 2]; ZeRO-1 reduce-scatters them and
    all-gathers 2 B each after the step, DDP all-reduces. Dense part of the layer: attention 16,384 +
    norms 128 + router 64 x 8 = 512 -> 17,024 x 4 B over DP [0, 1, 2, 3]."""
    moe = model_from_dict(dict(name="moe", layers=2, hidden=64, heads=4, ffn=128, vocab=100,
                               moe=dict(num_experts=8, top_k=2, expert_ffn=128)))
    plan = ParallelPlan(dp=4, ep=2, seq_len=32, global_batch=4)
    g = build_rank_graph(moe, plan, 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.L1.expert_grad_reduce"] == {"comm_type": 7, "comm_size": 98_304 * 4, "pg_ranks": [0, 2],
                                              "pg_name": "edp:0", "coll_name": "reduce_scatter"}
    assert _dset(g, "mb0.L1.expert_grad_reduce") == {"mb0.L1.B.input_norm_bwd"}
    assert a["mb0.L1.grad_reducescatter"]["comm_size"] == 17_024 * 4
    assert a["expert_param_allgather"] == {"comm_type": 2, "comm_size": 2 * 98_304 * 2, "pg_ranks": [0, 2],
                                           "pg_name": "edp:0", "coll_name": "all_gather"}
    assert _dset(g, "expert_param_allgather") == {"optimizer_step"}
    dense = 2 * 17_024 + 2 * 6400
    assert a["param_allgather"]["comm_size"] == dense * 2
    assert a["optimizer_step"]["flops"] == 12.0 * (dense / 4 + 2 * 98_304 / 2)
    d = build_rank_graph(moe, plan.with_(zero=0), 0)
    ad = {d.name[i]: x for i, x in d.attrs.items()}
    assert ad["mb0.L1.expert_grad_reduce"]["comm_type"] == 0
    assert "expert_param_allgather" not in d.name
    assert ad["optimizer_step"]["flops"] == 12.0 * (dense + 2 * 98_304)
    # EP over all of DP: no expert-DP group, no expert reduction
    e = build_rank_graph(moe, plan.with_(ep=4), 0)
    assert not [n for n in e.name if "expert_grad_reduce" in n or n == "expert_param_allgather"]


def test_mtp_modules_run_after_the_output_head_and_reduce_their_own_weights():
    """One MTP module (DeepSeek-V3) on the last stage: forward = projection, one more layer of the last
    layer's kind and the shared output head after the main head; backward in reverse before the main
    head's backward. Its gradient bucket: the layer (41,088) + the 2h x h projection (2 x 64 x 64 =
    8,192) -> 49,280 x 4 B; the optimizer also updates it."""
    mtp = model_from_dict(dict(name="mtp", layers=2, hidden=64, heads=4, ffn=128, vocab=100, mtp_layers=1))
    plan = ParallelPlan(dp=2, seq_len=32, global_batch=2)
    g = build_rank_graph(mtp, plan, 0)
    n = g.name
    order = [x for x in n if x.endswith(("mb0.cross_entropy", "mtp0.mtp_proj", "mtp0.L.F.residual_add_mlp",
                                         "mtp0.cross_entropy", "mtp0.cross_entropy_bwd", "mtp0.L.B.input_norm_bwd",
                                         "mtp0.mtp_norms_bwd", "mb0.cross_entropy_bwd"))]
    assert order == ["mb0.cross_entropy", "mb0.mtp0.mtp_proj", "mb0.mtp0.L.F.residual_add_mlp", "mb0.mtp0.cross_entropy",
                     "mb0.mtp0.cross_entropy_bwd", "mb0.mtp0.L.B.input_norm_bwd", "mb0.mtp0.mtp_norms_bwd",
                     "mb0.cross_entropy_bwd"]
    assert _dset(g, "mb0.mtp0.mtp_embedding") == {"mb0.cross_entropy"}
    assert _dset(g, "mb0.mtp0.L.F.input_norm") == {"mb0.mtp0.mtp_proj"}
    assert _dset(g, "mb0.mtp0.final_norm") == {"mb0.mtp0.L.F.residual_add_mlp"}
    assert _dset(g, "mb0.mtp0.L.B.residual_add_mlp_bwd") == {"mb0.mtp0.final_norm_bwd"}
    assert _dset(g, "mb0.mtp0.mtp_proj_dgrad") == {"mb0.mtp0.L.B.input_norm_bwd"}
    assert _dset(g, "mb0.cross_entropy_bwd") == {"mb0.mtp0.mtp_norms_bwd"}
    a = {n[i]: x for i, x in g.attrs.items()}
    assert a["mb0.mtp0.grad_reducescatter"]["comm_size"] == (S_LAYER + 8192) * 4
    assert _dset(g, "mb0.mtp0.grad_reducescatter") == {"mb0.mtp0.mtp_norms_bwd"}
    params = 2 * S_LAYER + S_LAYER + 8192 + 2 * 6400
    assert a["optimizer_step"]["flops"] == 12.0 * params / 2
    assert a["param_allgather"]["comm_size"] == params * 2
    # the MTP layer sits in the forward graph once per module and micro-batch
    assert sum(x.endswith("mtp0.L.F.input_norm") for x in n) == 1


def test_lora_step_reduces_and_updates_only_the_adapters():
    """LoRA r = 16 on QKV, DP2: per layer 16 x (64 + 192) = 4,096 trainable parameters, reduced in fp32
    (16,384 B); the frozen embedding and output head reduce nothing; the optimizer updates 2 x 4,096 / 2
    adapter parameters per rank (ZeRO-1); no FP8 weight cast under LoRA."""
    plan = ParallelPlan(dp=2, seq_len=32, global_batch=2, finetune="lora", precision="fp8")
    g = build_rank_graph(SMALL, plan, 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    red = sorted(x for x in g.name if ".grad_" in x)
    assert red == ["mb0.L0.grad_reducescatter", "mb0.L1.grad_reducescatter"]
    assert a["mb0.L0.grad_reducescatter"]["comm_size"] == 4096 * 4
    assert a["optimizer_step"]["flops"] == 12.0 * 2 * 4096 / 2
    assert a["param_allgather"]["comm_size"] == 2 * 4096 * 2
    assert "fp8_weight_cast" not in g.name
    mtp = model_from_dict(dict(name="mtp", layers=2, hidden=64, heads=4, ffn=128, vocab=100, mtp_layers=1))
    gm = build_rank_graph(mtp, plan, 0)
    am = {gm.name[i]: x for i, x in gm.attrs.items()}
    assert am["mb0.mtp0.grad_reducescatter"]["comm_size"] == (4096 + 8192) * 4
    assert am["optimizer_step"]["flops"] == 12.0 * 3 * 4096 / 2


def test_fp8_step_casts_the_updated_weights_once_after_the_optimizer():
    """FP8 training keeps bf16 weights and makes their fp8 copies once per step: 1 FLOP, 2 + 2 B per
    parameter of the rank (all of them, not the ZeRO shard: 2 x 41,088 + 2 x 6,400 = 94,976)."""
    plan = ParallelPlan(dp=2, seq_len=32, global_batch=2, precision="fp8")
    g = build_rank_graph(SMALL, plan, 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["fp8_weight_cast"] == {"op": "fp8_cast", "dtype": "bf16", "flops": 94_976.0, "bytes": 94_976.0 * 4}
    assert _dset(g, "fp8_weight_cast") == {"optimizer_step"}
    assert _dset(g, "param_allgather") == {"fp8_weight_cast"}


def test_learned_positions_and_tied_embeddings_in_the_step():
    """GPT-style, learned positions (max_seq 64 x h 64 = 4,096), tied embeddings, PP2 DP2: stage 0's
    embedding bucket = 6,400 + 4,096 = 10,496 x 4 B; stage 1 still holds and reduces its own copy of
    the tied output projection (6,400 x 4 B) since it is on another stage."""
    gpt = model_from_dict(dict(name="g", layers=2, hidden=64, heads=4, ffn=256, vocab=100, activation="gelu",
                               norm="layernorm", position="learned", max_seq=64, tied_embeddings=True))
    plan = ParallelPlan(pp=2, dp=2, seq_len=32, global_batch=4)
    g0 = build_rank_graph(gpt, plan, 0)
    a = {g0.name[i]: x for i, x in g0.attrs.items()}
    assert a["mb1.embedding.grad_reducescatter"]["comm_size"] == 10_496 * 4
    g1 = build_rank_graph(gpt, plan, 2)
    a = {g1.name[i]: x for i, x in g1.attrs.items()}
    assert a["mb1.output.grad_reducescatter"]["comm_size"] == 6400 * 4
    # GPT layer (no biases): attention 4 x 64^2, MLP 2 x 64 x 256, 2 LayerNorms of 2 x 64 (weight, bias)
    layer = 4 * 64 * 64 + 2 * 64 * 256 + 4 * 64
    assert a["optimizer_step"]["flops"] == 12.0 * (layer + 6400) / 2


def test_recomputation_passes_run_before_each_backward():
    """Full recompute: the layer's forward again (".R.") right before its backward, which waits for it;
    selective with the mlp module: the MLP forward again; selective core_attn with flash: nothing."""
    g = build_rank_graph(SMALL, ParallelPlan(seq_len=32, global_batch=1, recompute="full"), 0)
    assert _dset(g, "mb0.L1.B.residual_add_mlp_bwd") == {"mb0.L1.R.residual_add_mlp"}
    assert _dset(g, "mb0.L1.R.input_norm") == {"mb0.final_norm_bwd"}
    assert _dset(g, "mb0.L0.R.input_norm") == {"mb0.L1.B.input_norm_bwd"}
    s = build_rank_graph(SMALL, ParallelPlan(seq_len=32, global_batch=1, recompute="selective",
                                             recompute_modules=("mlp",)), 0)
    assert _dset(s, "mb0.L1.B.residual_add_mlp_bwd") == {"mb0.L1.R.recompute_mlp_fc2"}
    assert _dset(s, "mb0.L1.R.recompute_mlp_fc1") == {"mb0.final_norm_bwd"}
    f = build_rank_graph(SMALL, ParallelPlan(seq_len=32, global_batch=1, recompute="selective"), 0)
    assert not [x for x in f.name if ".R." in x]
    assert _dset(f, "mb0.L1.B.residual_add_mlp_bwd") == {"mb0.final_norm_bwd"}
    # ZeRO-3 gathers feed the recompute pass (it runs first)
    z = build_rank_graph(SMALL, ParallelPlan(dp=2, zero=3, seq_len=32, global_batch=2, recompute="full"), 0)
    assert "mb0.L1.B.param_allgather" in _dset(z, "mb0.L1.R.input_norm")
    assert _dset(z, "mb0.L1.B.residual_add_mlp_bwd") == {"mb0.L1.R.residual_add_mlp"}
    zs = build_rank_graph(SMALL, ParallelPlan(dp=2, zero=3, seq_len=32, global_batch=2, recompute="selective",
                                              recompute_modules=("mlp",)), 0)
    assert "mb0.L1.B.param_allgather" in _dset(zs, "mb0.L1.R.recompute_mlp_fc1")
    assert _dset(zs, "mb0.L1.B.residual_add_mlp_bwd") == {"mb0.L1.R.recompute_mlp_fc2"}


def test_streams_devices_and_rank_selection():
    """Each op runs on its stream of the rank's GPU (rank 1 of 8-GPU nodes: device 1): compute stream 7,
    TP 20, DP gradient 24, DP parameter 25, PP 26-29. generate(): "symmetric" = one rank per stage
    (progress reported per graph), "all", or an explicit list."""
    from chakra_schema.graph import ResourceKind
    plan = ParallelPlan(tp=2, pp=2, dp=4, seq_len=32, global_batch=8)
    g = build_rank_graph(SMALL, plan, 1)
    res = {(r.index, r.name) for r in g.resources}
    assert {(7, "compute"), (20, "tp_comm"), (24, "dp_grad_comm"), (25, "dp_param_comm"), (26, "pp_send_fwd"),
            (29, "pp_recv_bwd")} <= res
    assert {r.device for r in g.resources} == {1}
    assert {r.kind for r in g.resources} == {ResourceKind.GPU_STREAM}
    i = _index(g)
    assert g.resources[g.resource[i["mb0.embedding"]]].name == "compute"
    assert g.resources[g.resource[i["mb0.send_act_c0"]]].name == "pp_send_fwd"
    assert g.resources[g.resource[i["mb0.recv_grad_c0"]]].name == "pp_recv_bwd"
    assert g.resources[g.resource[i["mb0.L0.F.sp_allgather_attn"]]].name == "tp_comm"
    assert g.resources[g.resource[i["param_allgather"]]].name == "dp_param_comm"
    assert build_rank_graph(SMALL, plan, 9).resources[0].device == 1          # 8 GPUs per node by default
    assert generate(SMALL, plan, [9])[0].resources[0].device == 1
    assert build_rank_graph(SMALL, plan, 9, gpus_per_node=4).resources[0].device == 1
    assert build_rank_graph(SMALL, plan, 9, gpus_per_node=16).resources[0].device == 9
    assert [x.rank for x in generate(SMALL, plan)] == [0, 8]                 # symmetric by default
    seen = []
    gs = generate(SMALL, plan, "symmetric", progress=lambda n, t: seen.append((n, t)))
    assert [x.rank for x in gs] == [0, 8] and seen == [(1, 2), (2, 2)]
    assert [x.rank for x in generate(SMALL, plan, [3, 12])] == [3, 12]
    assert len(generate(SMALL, plan.with_(dp=1, global_batch=2), "all")) == 4
    # the stream order chains each stream's ops
    assert _stream_prev(g, "mb0.L0.F.qkv_proj") == "mb0.L0.F.input_norm"
    assert _stream_prev(g, "mb0.L0.F.sp_reducescatter_attn") == "mb0.L0.F.sp_allgather_attn"
    assert _stream_prev(g, "mb0.embedding") is None


def test_context_parallel_pipeline_sends_the_local_chunk_to_the_same_cp_and_tp_slot():
    """PP2 CP2 TP2 (SP), 64 tokens: a rank's pipeline message is its 32-token CP chunk's activation,
    sequence-split over TP: 32 x 64 x 2 B / 2 = 2,048 B. Rank 3 (stage 0, cp 1, tp 1) sends to rank
    4 x 1 + 3 = 7 (stage 1, same cp and tp)."""
    plan = ParallelPlan(pp=2, cp=2, tp=2, seq_len=64, global_batch=1)
    g = build_rank_graph(SMALL, plan, 3)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.send_act_c0"]["comm_size"] == 2048 and a["mb0.send_act_c0"]["comm_dst"] == 7
    assert a["mb0.recv_grad_c0"]["comm_src"] == 7
    # the DP gradient group spans dp x cp: ranks 1 and 3 (tp index 1) for CP2 DP1
    assert a["mb0.L0.grad_reducescatter"]["pg_ranks"] == [1, 3]


def test_generate_passes_measured_routing_and_takes_the_straggler_in_symmetric_mode():
    """generate(..., moe_loads): the symmetric representative computes the busiest EP rank's experts;
    "all" gives every rank its own."""
    import numpy as np
    from estimators.parallelism.workload import MoELoads
    moe = model_from_dict(dict(name="moe", layers=1, hidden=64, heads=4, ffn=128, vocab=100,
                               moe=dict(num_experts=4, top_k=1, expert_ffn=64)))
    plan = ParallelPlan(dp=2, ep=2, seq_len=32, global_batch=2)
    pairs = np.array([[[[10, 6], [2, 14]]]], dtype=float)
    slots = np.array([[[[9, 3], [20, 12]]]], dtype=float)
    loads = MoELoads(pairs, slots)
    (g,) = generate(moe, plan, "symmetric", moe_loads=loads)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.L0.F.expert_up_gate_proj"]["ms"] == (20, 12)
    assert a["mb0.L0.F.moe_dispatch_alltoall"]["comm_size"] == 16 * 64 * 2
    g0, g1 = generate(moe, plan, "all", moe_loads=loads)
    assert {g0.name[i]: x for i, x in g0.attrs.items()}["mb0.L0.F.expert_up_gate_proj"]["ms"] == (9, 3)
    assert {g1.name[i]: x for i, x in g1.attrs.items()}["mb0.L0.F.expert_up_gate_proj"]["ms"] == (20, 12)


def test_gradient_precision_options_and_zero_stage_variants():
    """NeMo 1.x bf16 main grads (grad_bytes 2): the reduce-scatter moves 2 B per parameter; ZeRO-2
    all-gathers the updated parameters like ZeRO-1; HSDP with one shard group of all DP ranks is plain
    FSDP (no replica all-reduce)."""
    plan = ParallelPlan(dp=2, seq_len=32, global_batch=2, grad_bytes=2)
    g = build_rank_graph(SMALL, plan, 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.L0.grad_reducescatter"]["comm_size"] == S_LAYER * 2
    z2 = build_rank_graph(SMALL, plan.with_(zero=2, grad_bytes=4), 0)
    a2 = {z2.name[i]: x for i, x in z2.attrs.items()}
    assert a2["mb0.L0.grad_reducescatter"]["comm_size"] == S_LAYER * 4
    assert a2["param_allgather"]["comm_size"] == (2 * S_LAYER + 2 * 6400) * 2
    h = build_rank_graph(SMALL, ParallelPlan(dp=4, zero=3, dp_shard=4, seq_len=32, global_batch=4), 0)
    assert not [n for n in h.name if "replicas" in n]
    ah = {h.name[i]: x for i, x in h.attrs.items()}
    assert ah["mb0.L0.grad_reducescatter"]["pg_ranks"] == [0, 1, 2, 3]


def test_zero3_gathers_expert_parameters_with_the_layer():
    """FSDP on a MoE layer (DP4 EP2): the layer's gather carries its dense part (17,024) and this rank's
    experts (98,304) in bf16: 115,328 x 2 B; FP8 casts every local weight once per step (dense and
    expert: 2 x (17,024 + 98,304) + 2 x 6,400)."""
    moe = model_from_dict(dict(name="moe", layers=2, hidden=64, heads=4, ffn=128, vocab=100,
                               moe=dict(num_experts=8, top_k=2, expert_ffn=128)))
    g = build_rank_graph(moe, ParallelPlan(dp=4, ep=2, zero=3, seq_len=32, global_batch=4, precision="fp8"), 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.L1.F.param_allgather"]["comm_size"] == (17_024 + 98_304) * 2
    assert a["fp8_weight_cast"]["flops"] == 2 * (17_024 + 98_304) + 2 * 6400


def test_mtp_projection_bucket_is_split_over_tensor_parallel_ranks():
    """MTP on TP2 DP2: layer 41,088 / 2 + projection 2 x 64 x 64 / 2 = 24,640 parameters x 4 B."""
    mtp = model_from_dict(dict(name="mtp", layers=2, hidden=64, heads=4, ffn=128, vocab=100, mtp_layers=1))
    g = build_rank_graph(mtp, ParallelPlan(tp=2, dp=2, seq_len=32, global_batch=2), 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.mtp0.grad_reducescatter"]["comm_size"] == (S_LAYER // 2 + 4096) * 4
    params = 3 * S_LAYER / 2 + 4096 + 2 * 6400 / 2
    assert a["optimizer_step"]["flops"] == 12.0 * params / 2


def test_scatter_gather_receive_is_all_gathered_after_it_arrives():
    """Narayanan et al. 2021 scatter/gather (TP2 without SP, PP2): the received 1/t shard is all-gathered
    over the TP group [2, 3] (the full 32 x 64 x 2 B = 4,096 B) before the stage's first layer."""
    plan = ParallelPlan(tp=2, pp=2, seq_len=32, global_batch=1, sequence_parallel=False)
    g = build_rank_graph(SMALL, plan, 2)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.recv_act_c1"]["comm_size"] == 2048
    assert a["mb0.recv_act_c1_allgather"] == {"comm_type": 2, "comm_size": 4096, "pg_ranks": [2, 3],
                                              "pg_name": "tp:2", "coll_name": "all_gather"}
    assert _dset(g, "mb0.recv_act_c1_allgather") == {"mb0.recv_act_c1"}
    assert _dset(g, "mb0.L1.F.input_norm") == {"mb0.recv_act_c1_allgather"}


def test_node_types_and_kinds_follow_the_op():
    """Chakra node types: compute kernels are COMP_NODE / KERNEL, collectives COMM_COLL_NODE / COLLECTIVE,
    point-to-point COMM_SEND_NODE / SEND and COMM_RECV_NODE / RECV."""
    from chakra_schema.graph import NodeType, OpKind
    g = build_rank_graph(SMALL, ParallelPlan(tp=2, pp=2, seq_len=32, global_batch=1), 0)
    i = _index(g)
    assert (g.node_type[i["mb0.L0.F.qkv_proj"]], g.kind[i["mb0.L0.F.qkv_proj"]]) == (NodeType.COMP_NODE, OpKind.KERNEL)
    c = i["mb0.L0.F.sp_allgather_attn"]
    assert (g.node_type[c], g.kind[c]) == (NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE)
    s = i["mb0.send_act_c0"]
    assert (g.node_type[s], g.kind[s]) == (NodeType.COMM_SEND_NODE, OpKind.SEND)
    r = i["mb0.recv_grad_c0"]
    assert (g.node_type[r], g.kind[r]) == (NodeType.COMM_RECV_NODE, OpKind.RECV)


def test_moe_without_expert_parallelism_has_no_all_to_all():
    moe = model_from_dict(dict(name="moe", layers=2, hidden=64, heads=4, ffn=128, vocab=100,
                               moe=dict(num_experts=8, top_k=2, expert_ffn=128)))
    g = build_rank_graph(moe, ParallelPlan(dp=2, seq_len=32, global_batch=2), 0)
    assert not [n for n in g.name if "alltoall" in n]
    a = {g.name[i]: x for i, x in g.attrs.items()}
    # all 8 experts local: 32 tokens x 2 / 8 = 8 tokens each
    assert (a["mb0.L0.F.expert_up_gate_proj"]["m"], a["mb0.L0.F.expert_up_gate_proj"]["batch"]) == (8, 8)


def test_an_explicit_schedule_builds_only_its_passes_then_the_step_tail():
    """The composed estimate replays a few passes per stage: a forward-only schedule has no backward
    (no gradient reduction), an empty one only the optimizer step."""
    plan = ParallelPlan(dp=2, seq_len=32, global_batch=2)
    g = build_rank_graph(SMALL, plan, 0, schedule=[(True, 0, 0)])
    assert [x[:3] for x in g.metadata["passes"]] == [[1, 0, 0]]
    assert not [n for n in g.name if ".B." in n or ".grad_" in n]
    assert _dset(g, "optimizer_step") == {"mb0.cross_entropy"}
    e = build_rank_graph(SMALL, plan, 0, schedule=[])
    assert e.metadata["passes"] == [] and e.name[:2] == ["optimizer_step", "param_allgather"]
    assert _dset(e, "optimizer_step") == set()


def test_mtp_module_on_a_moe_model_repeats_the_last_layers_kind_and_its_experts():
    """MTP reuses the last layer's kind (DeepSeek-V3: a MoE layer). Model: 3 layers, MoE every third
    layer starting at layer 2 (only the last layer is MoE), 8 experts of 3 x 64 x 128 on DP2 EP2: the
    MTP layer holds 4 x 24,576 = 98,304 expert parameters on this rank, like layer 2. The optimizer
    updates both expert sets whole (EP2 over DP2 leaves one expert-DP rank) and the dense parts over
    the 2 DP ranks (ZeRO-1)."""
    moe = model_from_dict(dict(name="mm", layers=3, hidden=64, heads=4, ffn=128, vocab=100, mtp_layers=1,
                               moe=dict(num_experts=8, top_k=2, expert_ffn=128, layer_freq=3, layer_offset=2)))
    g = build_rank_graph(moe, ParallelPlan(dp=2, ep=2, seq_len=32, global_batch=2), 0)
    n = set(g.name)
    assert "mb0.mtp0.L.F.expert_up_gate_proj" in n and "mb0.mtp0.L.B.expert_up_gate_proj_dgrad" in n
    assert "mb0.L1.F.mlp_up_gate_proj" in n and "mb0.L2.F.expert_up_gate_proj" in n
    a = {g.name[i]: x for i, x in g.attrs.items()}
    dense_moe = 16_384 + 128 + 64 * 8          # attention + norms + router
    dense = 2 * S_LAYER + dense_moe + (dense_moe + 8192) + 2 * 6400
    assert a["optimizer_step"]["flops"] == 12.0 * (dense / 2 + 2 * 98_304)


def test_each_micro_batch_backward_uses_its_own_routing_window():
    """Measured routing with 2 windows, 2 micro-batches: micro-batch 1's backward runs window 1's expert
    token counts, micro-batch 0's window 0's."""
    import numpy as np
    from estimators.parallelism.workload import MoELoads
    moe = model_from_dict(dict(name="moe", layers=1, hidden=64, heads=4, ffn=128, vocab=100,
                               moe=dict(num_experts=4, top_k=1, expert_ffn=64)))
    plan = ParallelPlan(dp=2, ep=2, seq_len=32, global_batch=4)
    pairs = np.ones((2, 1, 2, 2))
    slots = np.array([[[[1, 2], [3, 4]]], [[[5, 6], [7, 8]]]], dtype=float)
    (g,) = generate(moe, plan, [0], moe_loads=MoELoads(pairs, slots))
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.L0.B.expert_down_proj_dgrad"]["ms"] == (1, 2)
    assert a["mb1.L0.B.expert_down_proj_dgrad"]["ms"] == (5, 6)
    assert a["mb1.L0.F.expert_down_proj"]["ms"] == (5, 6)
    # the selective recompute of the experts replays the same micro-batch's routing
    (s,) = generate(moe, plan.with_(recompute="selective", recompute_modules=("moe",)), [0],
                    moe_loads=MoELoads(pairs, slots))
    a = {s.name[i]: x for i, x in s.attrs.items()}
    assert a["mb0.L0.R.recompute_expert_fc1"]["ms"] == (1, 2)
    assert a["mb1.L0.R.recompute_expert_fc1"]["ms"] == (5, 6)


def test_tp_comm_overlap_collectives_run_on_the_tp_stream_of_the_graph():
    """With userbuffers overlap the TP all-gathers / reduce-scatters still run on the TP stream (20)."""
    g = build_rank_graph(SMALL, ParallelPlan(tp=2, seq_len=32, global_batch=1, tp_comm_overlap=True), 0)
    i = _index(g)
    for n in ("mb0.L0.F.sp_allgather_attn", "mb0.L0.F.sp_reducescatter_attn", "mb0.L0.B.sp_allgather_mlp_grad"):
        r = g.resources[g.resource[i[n]]]
        assert (r.index, r.name) == (20, "tp_comm"), n
        assert "launch_us" not in g.attrs[i[n]]


def test_middle_pipeline_stage_receives_gradients_from_the_next_stage():
    """PP3 (one layer per stage), stage 1: activations come from stage 0, gradients from
    stage 2."""
    m3 = model_from_dict(dict(name="m3", layers=3, hidden=64, heads=4, ffn=128, vocab=100))
    g = build_rank_graph(m3, ParallelPlan(pp=3, seq_len=32, global_batch=1), 1)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.recv_act_c1"]["comm_src"] == 0 and a["mb0.recv_grad_c1"]["comm_src"] == 2
    assert a["mb0.send_act_c1"]["comm_dst"] == 2 and a["mb0.send_grad_c1"]["comm_dst"] == 0


def test_interleaved_blocking_p2p_with_all_forwards_first_communicates_pass_by_pass():
    """PP2 VP2 with 2 micro-batches: stage 0 runs its 4 forwards before any backward (no steady
    state), so every pass communicates on its own."""
    m4 = model_from_dict(dict(name="m4", layers=4, hidden=64, heads=4, ffn=128, vocab=100))
    g = build_rank_graph(m4, ParallelPlan(pp=2, vp=2, seq_len=32, global_batch=2, overlap_p2p=False), 0)
    assert _dset(g, "mb1.send_act_c2") == {"mb1.L2.F.residual_add_mlp"}
    assert _dset(g, "mb0.send_act_c2") == {"mb0.L2.F.residual_add_mlp"}


def test_pipeline_message_sizes_are_whole_bytes():
    """Chakra's comm_size is an integer byte count: a 32-token activation of h = 64 over CP2 without SP,
    with the TP2 scatter/gather shard: 16 x 64 x 2 / 2 = 1,024 B, an int."""
    g = build_rank_graph(SMALL, ParallelPlan(pp=2, cp=2, tp=2, seq_len=32, global_batch=1,
                                             sequence_parallel=False), 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["mb0.send_act_c0"]["comm_size"] == 1024 and type(a["mb0.send_act_c0"]["comm_size"]) is int
    assert type(a["mb0.recv_grad_c0"]["comm_size"]) is int
    gs = build_rank_graph(SMALL, ParallelPlan(pp=2, cp=2, seq_len=32, global_batch=1), 0)
    s = {gs.name[i]: x for i, x in gs.attrs.items()}["mb0.send_act_c0"]["comm_size"]
    assert s == 2048 and type(s) is int


def test_tied_embeddings_on_one_stage_are_updated_once():
    """Tied input / output embedding on a single stage (DP2, ZeRO-1): the optimizer updates the shared
    100 x 64 table once: (2 x 41,088 + 6,400) / 2 parameters."""
    tied = model_from_dict(dict(name="t", layers=2, hidden=64, heads=4, ffn=128, vocab=100, tied_embeddings=True))
    g = build_rank_graph(tied, ParallelPlan(dp=2, seq_len=32, global_batch=2), 0)
    a = {g.name[i]: x for i, x in g.attrs.items()}
    assert a["optimizer_step"]["flops"] == 12.0 * (2 * S_LAYER + 6400) / 2
