"""Absolute memory terms of a training plan, from published formulas written out here (never the
estimator's own output).

References:
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023),
  Sec. 4.1-4.3, for a GPT layer (MHA, 4h MLP, LayerNorm, dropout; 16-bit activations):
    no parallelism                       s*b*h*(34 + 5*a*s/h)            (Eq. 1)
    tensor parallel, no SP               s*b*h*(10 + 24/t + 5*a*s/(h*t)) (Eq. 2)
    tensor + sequence parallel           s*b*h/t*(34 + 5*a*s/h)          (Eq. 3)
    + selective recomputation            s*b*h/t*34                      (Eq. 4: the 5as/h term goes)
    full recomputation                   2*s*b*h/t (the layer input, with SP)   (Sec. 4.3)
  and the first pipeline stage of 1F1B holds p micro-batches of L/p layers: L layers' worth (Sec. 4.2.3).
- Model states (Rajbhandari et al. 2020, ZeRO, Sec. 3.1; Megatron distributed optimizer): 2 B 16-bit
  weights, 4 B fp32 gradient buffer, 12 B fp32 master weights + Adam moments per parameter; ZeRO-1
  shards the 12 B over the DP group, ZeRO-2 also the gradients, ZeRO-3 also the weights.
"""
from __future__ import annotations

import pytest

from estimators.parallelism.memory import GIB, estimate_memory, layer_activation_bytes
from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan

S, B, H, A, L = 2048, 2, 1024, 16, 8
GPT = model_from_dict(dict(name="gpt", layers=L, hidden=H, heads=A, ffn=4 * H, vocab=51200, activation="gelu",
                           norm="layernorm", position="learned", max_seq=S))


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=4, seq_len=S, micro_batch=B, global_batch=B, attention="unfused")
    return ParallelPlan(**{**base, **kw})


def test_activations_per_layer_with_tp_and_sp_are_korthikanti_eq3():
    """s=2048, b=2, h=1024, a=16, t=4: sbh/t (34 + 5as/h) = 1,048,576 x (34 + 160) = 203,423,744 B."""
    expected = S * B * H / 4 * (34 + 5 * A * S / H)
    assert expected == 203_423_744
    assert layer_activation_bytes(GPT, _plan(), 0) == expected


def test_activations_per_layer_with_tp_without_sp_are_korthikanti_eq2():
    """sbh (10 + 24/t + 5as/(ht)) = 4,194,304 x (10 + 6 + 40) = 234,881,024 B."""
    expected = S * B * H * (10 + 24 / 4 + 5 * A * S / (H * 4))
    assert expected == 234_881_024
    assert layer_activation_bytes(GPT, _plan(sequence_parallel=False), 0) == expected


def test_activations_without_parallelism_are_korthikanti_eq1():
    """sbh (34 + 5as/h) = 4,194,304 x 194 = 813,694,976 B."""
    assert layer_activation_bytes(GPT, _plan(tp=1), 0) == S * B * H * (34 + 5 * A * S / H) == 813_694_976


@pytest.mark.parametrize("kw", [dict(recompute="selective"), dict(attention="flash")])
def test_selective_recomputation_or_flash_attention_keep_34_sbh_over_t(kw):
    """Eq. 4: 34 sbh/t = 35,651,584 B (flash attention stores no s x s scores either)."""
    assert layer_activation_bytes(GPT, _plan(**kw), 0) == 34 * S * B * H / 4 == 35_651_584


def test_full_recomputation_keeps_the_layer_input_only():
    """2 sbh/t = 2,097,152 B with SP; 2 sbh = 8,388,608 B without (Sec. 4.3)."""
    assert layer_activation_bytes(GPT, _plan(recompute="full"), 0) == 2 * S * B * H / 4 == 2_097_152
    assert layer_activation_bytes(GPT, _plan(recompute="full", sequence_parallel=False), 0) == 8_388_608


def test_first_pipeline_stage_holds_l_layers_of_activations_under_1f1b():
    """PP4 (2 layers per stage), 8 micro-batches, selective: the first stage holds p = 4 micro-batches x 2
    layers = L layers of 34 sbh/t (Sec. 4.2.3), plus the 4 in-flight embedding outputs (2 sbh/t each)."""
    plan = _plan(pp=4, global_batch=8 * B, recompute="selective")
    est = estimate_memory(GPT, plan)
    assert est.stage == 0
    expected = L * 34 * S * B * H / 4 + 4 * 2 * S * B * H / 4
    assert est.activations_gib * GIB == pytest.approx(expected, rel=1e-12)


LLAMA = model_from_dict(dict(name="tiny", layers=8, hidden=512, heads=8, ffn=2048, vocab=1000))
# 8 layers x (4h^2 + 3hf + 2h) + input and output embeddings V x h (final norm not counted)
LLAMA_PARAMS = 8 * (4 * 512 * 512 + 3 * 512 * 2048 + 2 * 512) + 2 * 1000 * 512      # 34,586,624


@pytest.mark.parametrize("zero,weights,grads,optim", [
    (0, 2, 4, 12),
    (1, 2, 4, 12 / 8),
    (2, 2, 4 / 8, 12 / 8),
])
def test_model_states_are_2_4_12_bytes_per_parameter_sharded_per_zero_stage(zero, weights, grads, optim):
    """DP8, TP1 PP1: 34,586,624 parameters x (2 B weights, 4 B fp32 grads, 12 B Adam states), the
    optimizer states / 8 from ZeRO-1, the gradients / 8 from ZeRO-2 (Rajbhandari et al. 2020)."""
    est = estimate_memory(LLAMA, ParallelPlan(dp=8, zero=zero, seq_len=128, global_batch=8))
    assert LLAMA_PARAMS == 34_586_624
    assert est.weights_gib * GIB == pytest.approx(LLAMA_PARAMS * weights, rel=1e-12)
    assert est.grads_gib * GIB == pytest.approx(LLAMA_PARAMS * grads, rel=1e-12)
    assert est.optimizer_gib * GIB == pytest.approx(LLAMA_PARAMS * optim, rel=1e-12)


def test_zero3_shards_the_weights_and_keeps_two_gathered_layers():
    """ZeRO-3 DP8: weights 2 B / 8 per parameter + two gathered 16-bit layers (the one computing and the
    prefetched next, FSDP's default forward prefetch): 34,586,624 x 2 / 8 + 2 x 4,195,328 x 2 B."""
    est = estimate_memory(LLAMA, ParallelPlan(dp=8, zero=3, seq_len=128, global_batch=8))
    layer = 4 * 512 * 512 + 3 * 512 * 2048 + 2 * 512
    assert est.weights_gib * GIB == pytest.approx(LLAMA_PARAMS * 2 / 8 + 2 * layer * 2, rel=1e-12)
    assert est.grads_gib * GIB == pytest.approx(LLAMA_PARAMS * 4 / 8, rel=1e-12)


# ----------------------------------------------------------------------------------------- other layer kinds
# Korthikanti et al.'s terms carried to other widths, as they derive them (bytes per token of a layer):
# attention 2h (QKV input) + 2(q + kv) (Q, K) + 2kv (V) + 2q (out-proj input) [+ h dropout mask],
# MLP 2h (input) + 2 f_in (fc1 / gate+up output) + 2f (activation output) [+ h dropout mask], norms 4h;
# masks only for models trained with dropout (GPT: LayerNorm + GELU). q / kv: query / key-value widths.
def _per_token(h, q, kv, f, f_in, mask, t, sp):
    sharded = 2 * (q + kv) + 2 * kv + 2 * q + 2 * f_in + 2 * f
    seq = 2 * h + mask * h + 2 * h + mask * h + 4 * h
    return sharded / t + seq / (t if sp else 1)


GQA = model_from_dict(dict(name="gqa", layers=4, hidden=512, heads=8, kv_heads=2, ffn=1536, vocab=1000))


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True), (2, False)])
def test_llama_gqa_swiglu_layer_keeps_the_generalised_korthikanti_terms_without_dropout(tp, sp):
    """GQA 8 heads / 2 KV heads of 64 (q = 512, kv = 128), SwiGLU f = 1536 (f_in = 3072), no dropout,
    flash attention, 1 x 1024 tokens."""
    plan = ParallelPlan(tp=tp, seq_len=1024, global_batch=1, sequence_parallel=sp)
    expected = 1024 * _per_token(512, 512, 128, 1536, 3072, 0, tp, sp and tp > 1)
    assert layer_activation_bytes(GQA, plan, 0) == pytest.approx(expected, rel=1e-12)


def test_layernorm_with_swiglu_or_rmsnorm_with_gelu_keeps_no_dropout_masks():
    """Only GPT-style models (LayerNorm and GELU together) train with dropout here."""
    for norm, act in (("layernorm", "swiglu"), ("rmsnorm", "gelu")):
        m = model_from_dict(dict(name="x", layers=2, hidden=512, heads=8, ffn=1024, vocab=1000, norm=norm,
                                 activation=act))
        f_in = 2048 if act == "swiglu" else 1024
        plan = ParallelPlan(seq_len=256, global_batch=1)
        assert layer_activation_bytes(m, plan, 0) == pytest.approx(256 * _per_token(512, 512, 512, 1024, f_in, 0, 1, False))


def test_moe_layer_keeps_top_k_plus_shared_expert_copies_of_the_mlp_terms():
    """MoE layer (8 experts of f = 256, top-2, 1 shared, SwiGLU): the MLP terms (2h + 2 f_in + 2f) per
    routed copy (top_k + shared), experts not tensor-parallel, plus the 2h router input; TP2 + SP."""
    h, f, t = 512, 256, 2
    m = model_from_dict(dict(name="moe", layers=2, hidden=h, heads=8, ffn=1024, vocab=1000,
                             moe=dict(num_experts=8, top_k=2, expert_ffn=f, shared_experts=1)))
    plan = ParallelPlan(tp=t, dp=2, ep=2, seq_len=512, global_batch=2)
    attn = (2 * (h + h) + 2 * h + 2 * h) / t + (2 * h) / t
    mlp = (2 * h + 3 * (2 * h + 2 * 2 * f + 2 * f)) / t
    assert layer_activation_bytes(m, plan, 0) == pytest.approx(512 * (attn + mlp + 4 * h / t), rel=1e-12)


def test_mla_layer_counts_q_and_k_at_192_and_v_at_128_per_head():
    """MLA (4 heads, nope 128 + rope 64 = 192-wide Q/K, 128-wide V): q = 4 x 192, kv = 4 x 128."""
    h = 512
    m = model_from_dict(dict(name="mla", layers=2, hidden=h, heads=4, ffn=1024, vocab=1000,
                             mla=dict(q_lora_rank=256, kv_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                      v_head_dim=128)))
    plan = ParallelPlan(seq_len=256, global_batch=1)
    assert layer_activation_bytes(m, plan, 0) == pytest.approx(256 * _per_token(h, 768, 512, 1024, 2048, 0, 1, False))


def test_context_parallel_keeps_s_over_c_tokens_and_their_scores():
    """CP2 on the GPT layer: s/c = 1024 tokens, unfused scores over s/c keys: sbh/(ct) (34 + 5a(s/c)/h)."""
    plan = _plan(cp=2)
    s = S / 2
    assert layer_activation_bytes(GPT, plan, 0) == pytest.approx(s * B * H / 4 * (34 + 5 * A * s / H), rel=1e-12)


def test_interleaved_first_stage_holds_l_times_1_plus_p_minus_1_over_pv_layers():
    """Korthikanti Sec. 4.2.3: the interleaved schedule holds L (1 + (p-1)/(pv)) layers on the first stage:
    p=4, v=2, L=8 -> 11 layers of 34 sbh/t (+ the embedding outputs of 11 in-flight micro-batch chunks)."""
    plan = _plan(pp=4, vp=2, global_batch=8 * B, recompute="selective")
    est = estimate_memory(GPT, plan)
    layers = L * (1 + 3 / 8)
    assert layers == 11
    expected = layers * 34 * S * B * H / 4 + 11 * 2 * S * B * H / 4
    assert est.stage == 0 and est.activations_gib * GIB == pytest.approx(expected, rel=1e-12)


def test_single_stage_adds_the_embedding_output_and_fp32_logits():
    """PP1: L layers + 2sbh/t embedding output + 4 s b V / t fp32 logits for the cross entropy."""
    est = estimate_memory(GPT, _plan(recompute="selective"))
    expected = L * 34 * S * B * H / 4 + 2 * S * B * H / 4 + 4 * S * B * 51200 / 4
    assert est.activations_gib * GIB == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("pp,stage_params", [
    (1, [8 * (4 * 1024 ** 2 + 8 * 1024 ** 2 + 4 * 1024) / 4 + 51200 * 1024 / 4 + 2048 * 1024]),
    (2, [4 * (4 * 1024 ** 2 + 8 * 1024 ** 2 + 4 * 1024) / 4 + 51200 * 1024 / 4 + 2048 * 1024,
         4 * (4 * 1024 ** 2 + 8 * 1024 ** 2 + 4 * 1024) / 4 + 51200 * 1024 / 4]),
])
def test_tied_embeddings_are_held_once_on_one_stage_and_twice_across_stages(pp, stage_params):
    """GPT (tied embeddings, learned positions), TP4: one stage holds the V x h table once plus the 2048 x h
    positions; with PP2 the last stage keeps its own copy of the table for the output layer. Weights at
    2 B per parameter of the heavier stage."""
    tied = model_from_dict(dict(name="gpt-tied", layers=L, hidden=H, heads=A, ffn=4 * H, vocab=51200,
                                activation="gelu", norm="layernorm", position="learned", max_seq=S,
                                tied_embeddings=True))
    est = estimate_memory(tied, _plan(pp=pp, global_batch=4 * B))
    assert est.weights_gib * GIB == pytest.approx(2 * max(stage_params), rel=1e-12)


def test_zero1_shards_optimizer_states_over_dp_times_cp():
    """Megatron's distributed optimizer shards over the DP x CP group: DP2 x CP4 -> 12 B / 8."""
    est = estimate_memory(LLAMA, ParallelPlan(dp=2, cp=4, zero=1, seq_len=512, global_batch=2))
    assert est.optimizer_gib * GIB == pytest.approx(LLAMA_PARAMS * 12 / 8, rel=1e-12)


def test_moe_parameters_split_dense_over_tp_and_experts_over_ep():
    """8 experts of f = 256 (SwiGLU: 3 h f each), 1 shared expert, router h x 8: TP2 EP4 -> dense (attention,
    norms, router) / 2 + shared expert whole + 8 experts / 4, per MoE layer; embeddings / 2."""
    h, f = 512, 256
    m = model_from_dict(dict(name="moe", layers=2, hidden=h, heads=8, ffn=1024, vocab=1000,
                             moe=dict(num_experts=8, top_k=2, expert_ffn=f, shared_experts=1)))
    e = 3 * h * f
    dense = 4 * h * h + 2 * h + h * 8
    per_layer = dense / 2 + e + 8 * e / 4
    est = estimate_memory(m, ParallelPlan(tp=2, dp=4, ep=4, seq_len=256, global_batch=4, zero=0))
    assert est.weights_gib * GIB == pytest.approx(2 * (2 * per_layer + 2 * 1000 * h / 2), rel=1e-12)


def test_breakdown_json_and_out_of_memory_flag():
    """The breakdown the CLI prints: its terms, their total, the capacity and the headroom; OOM when the
    total exceeds the H100's 80 GiB (nvidia-smi: 81,559 MiB)."""
    from estimators.parallelism.memory import hbm_capacity_gib
    from replay.hardware import get_hardware
    cap = hbm_capacity_gib(get_hardware("h100-sxm"))
    assert cap == 80.0
    est = estimate_memory(LLAMA, ParallelPlan(dp=8, zero=1, seq_len=128, global_batch=8), cap)
    total = LLAMA_PARAMS * (2 + 4 + 12 / 8) / GIB + est.activations_gib
    b = est.breakdown_gib()
    assert b == {"weights": est.weights_gib, "gradients": est.grads_gib, "optimizer_states": est.optimizer_gib,
                 "activations": est.activations_gib, "total": pytest.approx(total), "capacity": 80.0,
                 "headroom": pytest.approx(80.0 - total)}
    j = est.to_json()
    assert j == {"weights_gib": est.weights_gib, "grads_gib": est.grads_gib, "optimizer_gib": est.optimizer_gib,
                 "activations_gib": est.activations_gib, "total_gib": pytest.approx(total), "stage": 0,
                 "capacity_gib": 80.0, "oom": False}
    assert not est.oom
    big = estimate_memory(LLAMA, ParallelPlan(dp=8, zero=1, seq_len=128, global_batch=8), total * 0.99)
    assert big.oom and big.breakdown_gib()["headroom"] < 0
    assert estimate_memory(LLAMA, ParallelPlan(seq_len=128, global_batch=1)).breakdown_gib()["headroom"] is None


def test_unfused_attention_without_dropout_keeps_2_bytes_per_score():
    """Llama-style (no dropout), unfused attention, no recompute: the softmax output only, 2 B per score:
    2 a s / t bytes per token on top of the layer terms (Korthikanti's 5as/h without the 3 B of dropout)."""
    plan = ParallelPlan(tp=2, seq_len=1024, global_batch=1, attention="unfused")
    expected = 1024 * (_per_token(512, 512, 128, 1536, 3072, 0, 2, True) + 2 * 8 / 2 * 1024)
    assert layer_activation_bytes(GQA, plan, 0) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("norm,act", [("layernorm", "gelu"), ("rmsnorm", "gelu")])
def test_moe_layer_of_a_gelu_model_keeps_f_wide_fc1_outputs_and_its_dropout_masks(norm, act):
    """GELU experts: f_in = f (one up projection); GPT-style (LayerNorm + GELU) layers add the h-byte
    dropout masks after attention and after the MoE block. 8 experts of 256, top-2, no shared, TP1."""
    h, f = 512, 256
    m = model_from_dict(dict(name="moe-gelu", layers=2, hidden=h, heads=8, ffn=1024, vocab=1000, norm=norm,
                             activation=act, moe=dict(num_experts=8, top_k=2, expert_ffn=f)))
    mask = 1 if norm == "layernorm" else 0
    plan = ParallelPlan(dp=2, ep=2, seq_len=256, global_batch=2)
    attn = 2 * (h + h) + 2 * h + 2 * h + 2 * h + mask * h
    mlp = 2 * h + 2 * (2 * h + 2 * f + 2 * f) + mask * h
    assert layer_activation_bytes(m, plan, 0) == pytest.approx(256 * (attn + mlp + 4 * h), rel=1e-12)


def test_context_parallel_step_holds_s_over_c_tokens_of_embedding_output_and_logits():
    """CP2, PP1 (selective): s/c = 1024 tokens per rank for the layers, the embedding output and the fp32
    logits (4 (s/c) b V / t)."""
    est = estimate_memory(GPT, _plan(cp=2, recompute="selective"))
    s = S / 2
    expected = L * 34 * s * B * H / 4 + 2 * s * B * H / 4 + 4 * s * B * 51200 / 4
    assert est.activations_gib * GIB == pytest.approx(expected, rel=1e-12)


def test_last_stage_keeps_its_copy_of_tied_embeddings_with_two_stages():
    """Tied embeddings (RoPE), PP2, one micro-batch: the last stage (fp32 logits) is the fuller one and
    holds its own V x h copy for the output layer: 4 layers / 2 (TP2) + V h / 2 parameters at 2 B."""
    m = model_from_dict(dict(name="tied", layers=8, hidden=512, heads=8, ffn=2048, vocab=32000,
                             tied_embeddings=True))
    est = estimate_memory(m, ParallelPlan(tp=2, pp=2, seq_len=2048, global_batch=1))
    layer = 4 * 512 * 512 + 3 * 512 * 2048 + 2 * 512
    assert est.stage == 1
    assert est.weights_gib * GIB == pytest.approx(2 * (4 * layer / 2 + 32000 * 512 / 2), rel=1e-12)


def test_rope_model_holds_no_position_table_even_with_max_seq_set():
    m = model_from_dict(dict(name="rope", layers=8, hidden=512, heads=8, ffn=2048, vocab=1000, max_seq=4096))
    est = estimate_memory(m, ParallelPlan(seq_len=128, global_batch=1, zero=0))
    assert est.weights_gib * GIB == pytest.approx(2 * LLAMA_PARAMS, rel=1e-12)


def test_zero3_moe_working_buffer_is_two_layers_as_one_rank_gathers_them():
    """ZeRO-3 with TP2 on a MoE model (first layer dense): the two gathered layers (running, prefetched) are
    what one rank gathers of the largest layer, 2 B each, on top of the sharded weights: its TP shard of the
    dense weights and its EP share of the experts (FSDP gathers expert weights over the expert-data-parallel
    group only, never another rank's experts). Megatron-Core's MoE parallel folding: the 8 ranks (TP2 x DP4)
    hold EP4 x ETP1 expert shards, each replicated over the expert-data-parallel group of 8 / 4 = 2 ranks, so
    ZeRO-3 shards expert weights over 2 ranks and the dense ones over DP 4."""
    h, f = 512, 256
    m = model_from_dict(dict(name="moe", layers=2, hidden=h, heads=8, ffn=1024, vocab=1000,
                             moe=dict(num_experts=8, top_k=2, expert_ffn=f, first_dense_layers=1)))
    est = estimate_memory(m, ParallelPlan(tp=2, dp=4, ep=4, zero=3, seq_len=256, global_batch=4))
    dense_layer = 4 * h * h + 3 * h * 1024 + 2 * h
    experts = 8 * 3 * h * f
    moe_layer = 4 * h * h + 2 * h + h * 8 + experts
    dense_held = dense_layer / 2 + (moe_layer - experts) / 2 + 2 * 1000 * h / 2     # TP-sharded, over DP 4
    expert_held = experts / 4                                                     # EP4 x ETP1, over EDP 2
    gathered = max(dense_layer / 2, (moe_layer - experts) / 2 + experts / 4)      # one layer, as one rank holds it
    expected = dense_held * 2 / 4 + expert_held * 2 / 2 + 2 * gathered * 2
    assert est.weights_gib * GIB == pytest.approx(expected, rel=1e-12)
