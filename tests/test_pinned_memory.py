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

from estimators.memory import GIB, estimate_memory, layer_activation_bytes
from estimators.model_config import model_from_dict
from estimators.plan import ParallelPlan

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
