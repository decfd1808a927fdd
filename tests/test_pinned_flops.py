"""Absolute training FLOPs of generated steps, against published formulas written out here (never the
generator's or the estimator's own count).

References:
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Sec. 5.1 / Appendix: a GPT step of batch B, sequence s, l layers, hidden h, vocabulary V
  takes 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) FLOPs without recomputation and
  96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) with full activation recomputation (GEMMs only, full s x s
  attention scores, the logits GEMM).
- Causal flash attention: FlashAttention-2 (Dao 2023, Sec. 4.1): 4*s^2*d per head forward halved by the
  causal mask, backward 2.5x forward.
- A linear layer on T tokens with a k x n weight: 2*T*k*n FLOPs forward, the same for the data
  gradient and for the weight gradient (3x in training; Narayanan et al. 2021, Appendix).
- MoE (Fedus et al. 2022 / GShard): each token runs top_k experts; the router is one h x E linear layer.
"""
from __future__ import annotations

import pytest

from estimators.model_config import model_from_dict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import generate

GPT = model_from_dict(dict(name="gpt-small", layers=8, hidden=1024, heads=16, ffn=4096, vocab=51200,
                           activation="gelu", norm="layernorm", tied_embeddings=True, position="learned",
                           max_seq=2048, bias=True))


def _graph_flops(graphs, ops=("gemm", "grouped_gemm", "attention")) -> float:
    return sum(a.get("flops", 0.0) for g in graphs for a in g.attrs.values() if a.get("op") in ops)


def narayanan_flops(B: int, s: int, l: int, h: int, V: int, recompute: bool) -> float:
    """Narayanan et al. 2021, Sec. 5.1 (the paper's Eq. for F, with and without recomputation)."""
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (2, 2, 2)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_gpt_step_flops_are_narayanans_formula(tp, pp, dp, recompute):
    """Pins B=8, s=1024, l=8, h=1024, V=51200: 8,349,416,423,424 FLOPs (no recomputation) and
    10,273,561,772,032 (full recomputation), summed over every rank of the plan."""
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, seq_len=1024, global_batch=8, recompute=recompute,
                        attention="unfused", sequence_parallel=False)
    expected = narayanan_flops(8, 1024, 8, 1024, 51200, recompute == "full")
    assert expected == {"none": 8_349_416_423_424, "full": 10_273_561_772_032}[recompute]
    assert _graph_flops(generate(GPT, plan, "all")) == pytest.approx(expected, rel=1e-12)


def test_llama_gqa_flash_step_flops_are_3x_linear_plus_3_5x_causal_attention():
    """Llama-style GQA (h=512, 8 heads of 64, 2 KV heads, SwiGLU f=1536, V=1000, 4 layers), flash
    attention, B=2 x s=512, TP2 DP2: linear layers 6*T*(Q,K,V,O + gate, up, down weights), causal
    attention (1 + 2.5) x 4*B*s^2*d*heads / 2, logits 6*T*h*V."""
    h, heads, d, kvh, f, V, L, B, s = 512, 8, 64, 2, 1536, 1000, 4, 2, 512
    m = model_from_dict(dict(name="gqa", layers=L, hidden=h, heads=heads, kv_heads=kvh, ffn=f, vocab=V))
    T = B * s
    linear = h * heads * d + 2 * h * kvh * d + heads * d * h + 3 * h * f
    attention = 3.5 * 4 * B * s * s * d * heads / 2
    expected = L * (6 * T * linear + attention) + 6 * T * h * V
    graphs = generate(m, ParallelPlan(tp=2, dp=2, seq_len=s, global_batch=B), "all")
    assert _graph_flops(graphs) == pytest.approx(expected, rel=1e-12)


def test_moe_step_flops_run_top_k_experts_and_the_router_per_token():
    """4 MoE layers, 8 experts of f=256, top-2, router 512 x 8, EP4 DP4 (balanced routing: every expert
    gets T*top_k/E tokens): per token and layer 6 x (2 x 3 x h x f_e + h x E) linear FLOPs."""
    h, heads, d, f_e, E, k, V, L, B, s = 512, 8, 64, 256, 8, 2, 1000, 4, 4, 256
    m = model_from_dict(dict(name="moe", layers=L, hidden=h, heads=heads, ffn=2048, vocab=V,
                             moe=dict(num_experts=E, top_k=k, expert_ffn=f_e)))
    T = B * s
    linear = 4 * h * h + k * 3 * h * f_e + h * E
    attention = 3.5 * 4 * B * s * s * d * heads / 2
    expected = L * (6 * T * linear + attention) + 6 * T * h * V
    graphs = generate(m, ParallelPlan(dp=4, ep=4, seq_len=s, global_batch=B), "all")
    assert _graph_flops(graphs) == pytest.approx(expected, rel=1e-12)


def test_mla_layer_flops_count_the_low_rank_projections_and_both_head_widths():
    """MLA (DeepSeek-V2, Liu et al. 2024, Sec. 2.1): q = W_uq W_dq x (h -> q_lora -> H x 192), kv latent
    h -> kv_lora + 64 rope, up-projection kv_lora -> H x (128 + 128), out H x 128 -> h; attention QK^T
    at 192, PV at 128, causal. 2 layers, h=512, H=4, q_lora 256, kv_lora 128, f=1024, V=1000, B=1, s=256."""
    h, H, ql, kl, nope, rope, vd, f, V, L, s = 512, 4, 256, 128, 128, 64, 128, 1024, 1000, 2, 256
    m = model_from_dict(dict(name="mla", layers=L, hidden=h, heads=H, ffn=f, vocab=V,
                             mla=dict(q_lora_rank=ql, kv_lora_rank=kl, qk_rope_head_dim=rope,
                                      qk_nope_head_dim=nope, v_head_dim=vd)))
    linear = (h * ql + ql * H * (nope + rope) + h * (kl + rope) + kl * H * (nope + vd) + H * vd * h
              + 3 * h * f)
    attention = 3.5 * 2 * s * s * H * ((nope + rope) + vd) / 2
    expected = L * (6 * s * linear + attention) + 6 * s * h * V
    assert _graph_flops(generate(m, ParallelPlan(seq_len=s, global_batch=1), "all")) == pytest.approx(expected, rel=1e-12)
