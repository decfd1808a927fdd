"""Absolute bytes of every collective and point-to-point transfer the workload generator puts into a
training step, per parallelism, counted by hand (never the generator's own output).

Conventions and references:
- A collective's size is nccl-tests' "size": the whole buffer (all-reduce: the buffer; all-gather:
  the gathered output; reduce-scatter: the input before scattering; all-to-all: a rank's whole send
  buffer). nccl-tests doc/PERFORMANCE.md.
- Tensor parallelism (Shoeybi et al. 2019, Megatron-LM Sec. 3): a transformer layer all-reduces its
  [s, b, h] 16-bit activation twice in the forward (after attention and after the MLP) and twice in
  the backward. With sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) each all-reduce
  becomes an all-gather + reduce-scatter of the same [s, b, h] tensor; Megatron-LM's backward also
  re-gathers the two linear inputs for the weight gradients (`gather_output` of the saved
  sequence-parallel input in `LinearWithGradAccumulationAndAsyncCommunication`).
- Pipeline parallelism (Narayanan et al. 2021, Sec. 2.2, 4.1): each micro-batch sends its [s, b, h]
  16-bit activation forward and its gradient backward between adjacent stages; with tensor
  parallelism the scatter/gather optimisation (without SP) or SP itself sends 1/t of it.
- Context parallelism (ring attention, Liu et al. 2023; Megatron-core CP): each of the c-1 ring steps
  passes the local block's K and V (s/c x b x kv_heads/t x head_dim each, 16 bit) to the next rank;
  the backward passes K, V and their gradients (2x).
- Expert parallelism (GShard, Lepikhin et al. 2020; Megatron-core alltoall dispatcher): every token on
  a rank is sent top_k times (h x 2 B each) in the dispatch, and the same bytes come back in the
  combine; the backward repeats both.
- ZeRO-1/2 (Rajbhandari et al. 2020): after the optimizer step the updated 16-bit parameters are
  all-gathered (2 B per parameter); ZeRO-3/FSDP gathers each layer's 16-bit parameters before its
  forward and again before its backward.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import generate

H, F, V, HEADS = 512, 2048, 1000, 8
TINY = model_from_dict(dict(name="tiny", layers=8, hidden=H, heads=HEADS, ffn=F, vocab=V))
LAYER_PARAMS = 4 * H * H + 3 * H * F + 2 * H          # Llama layer: attention, SwiGLU, two RMSNorms
MOE = model_from_dict(dict(name="tiny-moe", layers=4, hidden=H, heads=HEADS, ffn=F, vocab=V,
                           moe=dict(num_experts=8, top_k=2, expert_ffn=256)))


def _comms(graph) -> dict[str, list[int]]:
    """Sizes of the communication nodes of one rank, by their name within the layer / pass."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, a in graph.attrs.items():
        if "comm_size" in a:
            name = graph.name[i]
            short = name.split(".")[-1]
            if ".F." in name or ".B." in name:
                short = ("F." if ".F." in name else "B.") + short
            out[short].append(a["comm_size"])
    return out


def test_tensor_parallel_layer_moves_its_activation_as_allgather_and_reducescatter_with_sp():
    """TP2 + SP, micro-batch 1 x 256 tokens: every TP collective is the gathered [s, b, h] bf16 tensor,
    256 x 512 x 2 = 262,144 B; per layer and micro-batch 2 all-gathers + 2 reduce-scatters forward,
    4 all-gathers (2 output grads, 2 re-gathered inputs) + 2 reduce-scatters backward."""
    plan = ParallelPlan(tp=2, dp=1, seq_len=256, global_batch=2)
    c = _comms(generate(TINY, plan, "symmetric")[0])
    full = 256 * 1 * H * 2
    layer_passes = 8 * plan.micro_batches
    for name in ("F.sp_allgather_attn", "F.sp_allgather_mlp", "F.sp_reducescatter_attn", "F.sp_reducescatter_mlp",
                 "B.sp_allgather_attn_grad", "B.sp_allgather_mlp_grad", "B.sp_allgather_attn_input",
                 "B.sp_allgather_mlp_input", "B.sp_reducescatter_attn_grad", "B.sp_reducescatter_mlp_grad"):
        assert c[name] == [full] * layer_passes, name


def test_tensor_parallel_layer_without_sp_all_reduces_twice_forward_and_twice_backward():
    """Shoeybi et al. 2019: 2 all-reduces of [s, b, h] bf16 per layer forward, 2 backward (TP4, 512
    tokens: 512 x 512 x 2 = 524,288 B each)."""
    plan = ParallelPlan(tp=4, dp=1, seq_len=512, global_batch=1, sequence_parallel=False)
    c = _comms(generate(TINY, plan, "symmetric")[0])
    full = 512 * H * 2
    for name in ("F.allreduce_attn", "F.allreduce_mlp", "B.allreduce_attn_grad", "B.allreduce_mlp_grad"):
        assert c[name] == [full] * 8, name
    assert not any("allgather" in k or "reducescatter" in k for k in c if k.startswith(("F.", "B.")))


@pytest.mark.parametrize("sp", [True, False])
def test_pipeline_sends_one_tp_shard_of_the_activation_per_micro_batch(sp):
    """PP2 TP2, micro-batch 2 x 256 tokens, 4 micro-batches: stage 0 sends 4 activations and receives 4
    gradients of [s, b, h] bf16 / t = 256 x 2 x 512 x 2 / 2 = 262,144 B (SP shards the sequence; without
    SP Narayanan et al.'s scatter/gather sends 1/t and all-gathers the full 524,288 B on arrival)."""
    plan = ParallelPlan(tp=2, pp=2, dp=1, seq_len=256, micro_batch=2, global_batch=8, sequence_parallel=sp)
    first, last = generate(TINY, plan, "symmetric")
    shard = 256 * 2 * H * 2 // 2
    assert _comms(first)["send_act_c0"] == [shard] * 4
    assert _comms(first)["recv_grad_c0"] == [shard] * 4
    assert _comms(last)["recv_act_c1"] == [shard] * 4
    assert _comms(last)["send_grad_c1"] == [shard] * 4
    gathers = _comms(last).get("recv_act_c1_allgather", [])
    assert gathers == ([] if sp else [2 * shard] * 4)


def test_context_parallel_ring_passes_the_local_kv_block_c_minus_1_times():
    """CP4 TP2 (GQA: 8 heads, 4 KV heads -> 2 per TP rank, d = 64), 1024 tokens: each ring step sends
    K and V of a 256-token block: 256 x 2 x 2 x 64 x 2 B = 131,072 B, 3 steps per layer forward; the
    backward sends K, V and dK, dV: 262,144 B."""
    gqa = model_from_dict(dict(name="gqa", layers=2, hidden=H, heads=HEADS, kv_heads=4, ffn=F, vocab=V))
    plan = ParallelPlan(tp=2, cp=4, dp=1, seq_len=1024, global_batch=1)
    c = _comms(generate(gqa, plan, "symmetric")[0])
    kv = 256 * 1 * 2 * (4 // 2) * 64 * 2
    for step in (1, 2, 3):
        assert c[f"F.cp_send{step}"] == [kv] * 2 and c[f"F.cp_recv{step}"] == [kv] * 2
        assert c[f"B.cp_send{step}"] == [2 * kv] * 2 and c[f"B.cp_recv{step}"] == [2 * kv] * 2
    assert "F.cp_send4" not in c


def test_expert_parallel_dispatch_and_combine_send_top_k_copies_of_each_token():
    """EP4 TP2 + SP, 512 tokens per micro-batch: a rank holds 512 / 2 = 256 tokens and sends each top-2
    times: 256 x 2 x 512 x 2 B = 524,288 B in the dispatch and the combine, forward and backward."""
    plan = ParallelPlan(tp=2, dp=4, ep=4, seq_len=512, global_batch=4)
    c = _comms(generate(MOE, plan, "symmetric")[0])
    a2a = 256 * 2 * H * 2
    for name in ("F.moe_dispatch_alltoall", "F.moe_combine_alltoall", "B.moe_dispatch_alltoall_bwd",
                 "B.moe_combine_alltoall_bwd"):
        assert c[name] == [a2a] * 4, name


def test_zero1_all_gathers_the_updated_bf16_parameters_once_per_step():
    """ZeRO-1 DP4, TP1 PP1: the whole model's 16-bit parameters after the optimizer step:
    (8 x 4,195,328 + 2 x 1000 x 512) x 2 B = 69,173,248 B."""
    plan = ParallelPlan(dp=4, zero=1, seq_len=128, global_batch=4)
    c = _comms(generate(TINY, plan, "symmetric")[0])
    assert c["param_allgather"] == [(8 * LAYER_PARAMS + 2 * V * H) * 2] == [69_173_248]


def test_zero3_gathers_each_layers_bf16_parameters_before_its_forward_and_backward():
    """FSDP DP4 TP2: each layer's 16-bit parameters per TP shard, 4,195,328 / 2 x 2 B = 4,195,328 B,
    before every forward and every backward of every micro-batch (2 here)."""
    plan = ParallelPlan(tp=2, dp=4, zero=3, seq_len=128, global_batch=8)
    g = generate(TINY, plan, "symmetric")[0]
    sizes = [a["comm_size"] for i, a in g.attrs.items() if g.name[i].endswith(".param_allgather")]
    assert sizes == [LAYER_PARAMS // 2 * 2] * (8 * 2 * 2)
