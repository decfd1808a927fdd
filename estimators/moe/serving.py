"""Serving throughput of an expert-parallel deployment, built from timed parts (prefill or decode).

Layout (as DeepSeek, SGLang and vLLM serve large MoE models): the routed experts run expert-parallel over
EP GPUs (physical slots = routed + redundant experts, `slots / EP` per GPU); attention and the shared
experts run beside them on every GPU, data-parallel (attention DP = EP / attention TP), or tensor-parallel
in groups of `attention_tp` GPUs (heads split, one all-reduce per attention block). Each GPU routes
`tokens` tokens per forward.

Per MoE layer and GPU, the parts (all from `replay.hardware.compute.ComputeModel` and
`replay.hardware.network.NetworkModel`, the models the parallelism what-if uses):
- attention: projections as GEMMs, the attention core with the KV-cache length (`context`) and the batch;
  MLA (DeepSeek) decodes in the absorbed form over the compressed KV cache (kv_lora + rope per token,
  one latent head), prefills in the expanded form;
- shared experts and the router GEMM on the GPU's own tokens;
- routed experts: one grouped GEMM (up+gate, activation, down) over the GPU's expert slots with the
  per-slot token counts the placement gives (`PlacementCost.slot_tokens`); the slowest GPU sets the pace;
- dispatch (FP8 with fp8 precision) and combine (BF16) all-to-alls of the per-pair token counts
  (`PlacementCost.pair_tokens`); prefill sends a token once per destination node and forwards it there over
  NVLink (DeepEP's normal mode, `estimators.moe.evaluate.NodeForwarding`), decode every pair on its own.
Dense layers (DeepSeek's first 3, Maverick's interleaved ones) cost attention + the dense FFN; the logits
GEMM runs once per forward (prefill: one token per prompt).

Overlap (`overlap`, `estimators.moe.overlap`): "dual-batch" splits the batch into two micro-batches and runs
the published stage schedule of the phase (DeepSeek's design as SGLang implements it: each all-to-all hides
only behind the stages of the other micro-batch that run before it is received, and the stream waits for the
rest); in prefill the all-to-all kernels hold PREFILL_COMM_SMS SMs for the overlapped forward, so the compute
runs on the rest, and they run PREFILL_A2A_BESIDE_COMPUTE times as long as alone (measured on DeepSeek's
training profile). "dual-batch-ideal": every all-to-all hidden behind any compute (an upper bound).
"none": compute + communication.

Multi-token prediction (decode, `mtp_acceptance` a > 0 with d draft tokens: the model's `mtp_layers`, or
`draft_tokens`, more than its modules, drafting with the last one again as SGLang and TensorRT-LLM do): each
step verifies 1 + d tokens per sequence (so `tokens` = sequences x (1 + d)), runs d MTP module passes (one
transformer layer of the last layer's kind + the logits each), and emits 1 + a + a^2 + ... + a^d tokens
per sequence, or the published `acceptance_length`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chakra_schema.graph import CommType
from estimators.model_config import ModelConfig
from estimators.moe.overlap import LayerWork, schedule_for


@dataclass(frozen=True)
class ServingSpec:
    phase: str                        # prefill | decode
    tokens: int                       # routed tokens per GPU per forward
    context: int                      # prompt length (prefill) / KV-cache length (decode)
    attention_tp: int = 1             # GPUs per attention group (1: attention data-parallel)
    overlap: str = "dual-batch"       # none | dual-batch | dual-batch-ideal (estimators.moe.overlap)
    mtp_acceptance: float = 0.0       # decode: acceptance rate of each draft token (0: no MTP)
    dtype: str = "bf16"               # GEMM precision (fp8: FP8 GEMMs and dispatch, BF16 combine)
    kv_bytes: int = 2                 # bytes per cached KV element
    draft_tokens: int = 0             # decode with MTP: drafts per step (0: the model's MTP layers)
    acceptance_length: float = 0.0    # decode with MTP: tokens emitted per sequence per step, when published


@dataclass
class ServingEstimate:
    forward_us: float                 # one forward (one decode step / one prefill chunk) of the deployment
    tokens_per_s_per_gpu: float       # input tokens (prefill) / output tokens (decode)
    time_per_output_token_ms: float   # decode: per sequence; prefill: time of the forward
    parts_us: dict                    # per forward (every micro-batch), summed over layers; overlap_saved: the
                                      # overlap schedule's time minus their sum
    sequences_per_gpu: float
    tokens_per_step_per_sequence: float


def draft_tokens(model: ModelConfig, spec: ServingSpec) -> int:
    if spec.phase != "decode" or not (spec.mtp_acceptance > 0 or spec.acceptance_length > 0):
        return 0
    return spec.draft_tokens or model.mtp_layers


class AttentionTimer:
    """Attention block and dense FFN of one GPU (heads / attention_tp of them)."""

    def __init__(self, model: ModelConfig, hardware, spec: ServingSpec):
        from replay.hardware.compute import ComputeModel
        from replay.hardware.network import NetworkModel
        from replay.hardware.config import for_generated_ops   # generated ops: no recorded-kernel models
        hardware = for_generated_ops(hardware)
        self.m, self.spec = model, spec
        self.c = ComputeModel(hardware)
        self.net = NetworkModel(hardware) if spec.attention_tp > 1 else None

    def attention_us(self, tokens: float, layer: int, one_per_sequence: bool = False) -> float:
        """Attention block of `tokens` routed tokens per GPU (the attention group holds tokens x tp)."""
        return sum(self.attention_parts(tokens, layer, one_per_sequence))

    def attention_parts(self, tokens: float, layer: int, one_per_sequence: bool = False) -> tuple[float, float]:
        """(prepare, core) of the attention block: the norms and Q / KV projections (MLA decode: and the
        absorbed q_nope -> latent), then the attention kernel and output projection (MLA decode: latent ->
        v first), where a two-micro-batch schedule cuts it (`estimators.moe.overlap`). Decode reads each
        sequence's cache once: a sequence verifies 1 + d tokens with MTP, one in an MTP module's pass
        (`one_per_sequence`)."""
        m, s, c = self.m, self.spec, self.c
        tp = s.attention_tp
        T = max(1, int(round(tokens * tp)))
        H = max(1, m.heads // tp)
        h, dt = m.hidden, s.dtype
        ctx = m.attention_span(layer, s.context)
        # decode with MTP: each sequence's 1 + d verified tokens read its KV cache once, together
        seqs = max(1, int(round(T / (1 if one_per_sequence else 1 + draft_tokens(m, s)))))
        norm = c.memory_op(T * h * 2 * 2).time_us
        prep, core = norm, norm
        if m.mla is not None:
            a = m.mla
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            prep += (c.gemm(T, a.q_lora_rank, h, dtype=dt).time_us
                     + c.gemm(T, H * qk, a.q_lora_rank, dtype=dt).time_us
                     + c.gemm(T, a.kv_lora_rank + a.qk_rope_head_dim, h, dtype=dt).time_us)
            core += c.gemm(T, h, H * a.v_head_dim, dtype=dt).time_us
            if s.phase == "decode":
                # absorbed: q_nope -> latent, attention over the compressed cache, latent -> v
                latent = a.kv_lora_rank + a.qk_rope_head_dim
                prep += c.gemm(T, a.kv_lora_rank, a.qk_nope_head_dim, batch=H, dtype="bf16").time_us
                kernel = c.attention(T, H, 1, ctx, (latent + a.kv_lora_rank) // 2, kv_heads=1)
                cache = c.memory_op(seqs * ctx * latent * s.kv_bytes)   # the cache is read once per step
                core += (c.gemm(T, a.v_head_dim, a.kv_lora_rank, batch=H, dtype="bf16").time_us
                         + max(kernel.compute_us, cache.time_us))      # FlashMLA: compute- or bandwidth-bound
            else:
                prep += c.gemm(T, H * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, dtype=dt).time_us
                seqs = max(1, T // ctx)
                core += c.attention(seqs, H, min(T, ctx), min(T, ctx), max(qk, a.v_head_dim), causal=True).time_us
        else:
            d, K = m.d_head, max(1, m.n_kv // tp)
            prep += c.gemm(T, (H + 2 * K) * d, h, dtype=dt).time_us
            core += c.gemm(T, h, H * d, dtype=dt).time_us
            if s.phase == "decode":
                kernel = c.attention(T, H, 1, ctx, d, kv_heads=K)
                cache = c.memory_op(seqs * ctx * 2 * K * d * s.kv_bytes)
                core += max(kernel.compute_us, cache.time_us)
            else:
                seqs = max(1, T // ctx)
                core += c.attention(seqs, H, min(T, ctx), min(T, ctx), d, causal=True, kv_heads=K).time_us
        return prep, core

    def tp_allreduce_us(self, tokens: float) -> float:
        """The attention output all-reduce inside a tensor-parallel attention group."""
        tp = self.spec.attention_tp
        if tp <= 1:
            return 0.0
        T = max(1, int(round(tokens * tp)))
        return self.net.collective_us(CommType.ALL_REDUCE, T * self.m.hidden * 2, list(range(tp)))

    def dense_ffn_us(self, tokens: float) -> float:
        m, s, c = self.m, self.spec, self.c
        T = max(1, int(round(tokens)))
        f_in = 2 * m.ffn if m.gated else m.ffn
        return (c.gemm(T, f_in, m.hidden, dtype=s.dtype).time_us + c.memory_op(T * m.ffn * 2 * 3).time_us
                + c.gemm(T, m.hidden, m.ffn, dtype=s.dtype).time_us)

    def logits_us(self, tokens: float) -> float:
        T = max(1, int(round(tokens)))
        return self.c.gemm(T, self.m.vocab, self.m.hidden, dtype="bf16").time_us


# SMs the prefill all-to-all kernels hold for the overlapped forward (DeepEP's normal mode moves the tokens
# with its own SMs): DeepSeek's prefill profile runs computation on 108 of the H800's 132 SMs and
# communication on 24 (deepseek-ai/profile-data, assets/prefill.jpg). Decode's low-latency mode holds none:
# "after RDMA messages are issued, all GPU SMs are freed" (profile-data README; its decode figure: 132 / 0).
PREFILL_COMM_SMS = 24


def prefill_comm_sm_share(sm_count: int) -> float:
    """Share of the SMs prefill's all-to-all kernels hold: PREFILL_COMM_SMS, at most half of a small GPU's
    (DeepEP's SM count is a setting; nobody gives the communication most of the GPU)."""
    return min(PREFILL_COMM_SMS, sm_count / 2) / sm_count

# DeepEP's normal kernels beside compute take longer than in DeepEP's own unit test, which the forwarded
# all-to-all model reproduces (estimators.moe.evaluate.LayerTimer.a2a_parts). Measured on DeepSeek's
# training profile (deepseek-ai/profile-data train.json: H800, EP64, 4096 tokens per rank, DeepSeek-V3
# pretraining settings, balanced routing; the kernels run on 20 SMs beside DualPipe's compute): forward
# dispatch 4604 / 4154 / 4437 / 4188 us, combine 6549 / 6002 / 6543 / 6074 / 5889 / 5847 / 6492 / 6052 us,
# 10,527 us a layer, against 2,391 + 4,754 us for the unit-test model with node-limited routing (4 nodes a
# token, as DeepSeek-V3 routes): 1.47x. SGLang reports the same effect in prefill with two-batch overlap
# (LMSYS blog 2025-05-05: communication slower than its unit test, which it reaches without the overlap).
# Were the profile's balanced routing not node-limited, the factor would read 1.12.
PREFILL_A2A_BESIDE_COMPUTE = 1.47


def serve(model: ModelConfig, hardware, spec: ServingSpec, moe_layer_parts) -> ServingEstimate:
    """Forward time and throughput. `moe_layer_parts(scale)` -> per MoE layer arrays (experts_us,
    dispatch_us, combine_us, shared_us) for `scale` x the routed tokens (0.5: one of two micro-batches)."""
    at = AttentionTimer(model, hardware, spec)
    schedule = schedule_for(spec.overlap, spec.phase)
    scale = 1.0 / schedule.micro_batches
    T = spec.tokens * scale                                  # tokens of one micro-batch per GPU
    experts, dispatch, combine, shared = (np.asarray(x, float) for x in moe_layer_parts(scale))
    if spec.phase == "prefill" and schedule.micro_batches > 1:      # the all-to-all runs beside compute
        dispatch, combine = dispatch * PREFILL_A2A_BESIDE_COMPUTE, combine * PREFILL_A2A_BESIDE_COMPUTE
    moe_ids = [i for i in range(model.layers) if model.is_moe_layer(i)]
    ar = at.tp_allreduce_us(T)
    layers, k = [], 0
    for i in range(model.layers):
        prep, core = at.attention_parts(T, i)
        if model.is_moe_layer(i):
            layers.append(LayerWork(prep, core, ar, moe=True, shared=shared[k], experts=experts[k],
                                    dispatch=dispatch[k], combine=combine[k]))
            k += 1
        else:
            layers.append(LayerWork(prep, core, ar, ffn=at.dense_ffn_us(T)))
    sm_share = prefill_comm_sm_share(at.c.hw.gpu.sm_count) if spec.phase == "prefill" else 0.0
    total = schedule.forward_us(layers, sm_share)
    mb = schedule.micro_batches                              # parts per forward: every micro-batch's
    parts = {"attention": mb * sum(w.attn_prepare + w.attn_core for w in layers),
             "dense_ffn": mb * sum(w.ffn for w in layers), "shared_experts": mb * float(shared.sum()),
             "routed_experts": mb * float(experts.sum()), "dispatch": mb * float(dispatch.sum()),
             "combine": mb * float(combine.sum()), "attention_tp_allreduce": mb * ar * len(layers)}
    # negative: what the overlap hid, net of its waits; positive where the SMs the communication holds cost
    # the compute more than the overlap hid
    saved = total - sum(parts.values())
    parts["overlap_saved"] = 0.0 if abs(saved) <= 1e-9 * total else saved    # no overlap: 0, not round-off
    d = draft_tokens(model, spec)
    seqs = spec.tokens / (1 + d) if spec.phase == "decode" else max(1.0, spec.tokens / spec.context)
    # logits: every verified token in decode, one per prompt in prefill
    logit_tokens = spec.tokens if spec.phase == "decode" else seqs
    parts["logits"] = at.logits_us(logit_tokens)
    total += parts["logits"]
    if d:
        moe_us = float(np.mean(shared + experts + dispatch + combine)) * seqs / T if moe_ids else None
        parts["mtp"] = d * _mtp_module_us(at, seqs, moe_ids[-1] if moe_ids else model.layers - 1, moe_us)
        total += parts["mtp"]
    return _estimate(spec, total, parts, seqs, d)


@dataclass(frozen=True)
class ServingMemory:
    """Bytes one GPU holds to serve (weights + KV cache; activations of one forward are small beside them
    and left out). Weights: the GPU's expert slots (routed + redundant) in the GEMM precision (FP8: 1 byte,
    plus one FP32 scale per 128 x 128 block, DeepSeek-V3's recipe); everything else (attention, shared
    experts, dense layers, router, embeddings and head, MTP modules) is held by every attention group, its
    attention weights split over `attention_tp` GPUs. KV cache: every sequence the GPU decodes at the full
    `context` length (MLA caches kv_lora_rank + rope dims per token and layer; other models 2 x KV heads x
    head dim, split over attention TP while heads last; sliding-window layers keep at most the window)."""
    expert_weights: float
    other_weights: float
    kv_cache: float

    @property
    def total(self) -> float:
        return self.expert_weights + self.other_weights + self.kv_cache


def serving_memory(model: ModelConfig, spec: ServingSpec, slots_per_gpu: int) -> ServingMemory:
    m = model
    w = 1.0 + 4.0 / (128 * 128) if spec.dtype == "fp8" else 2.0       # bytes per weight (FP8 + block scales)
    mtp_moe = m.mtp_layers if m.moe and m.is_moe_layer(m.layers - 1) else 0
    expert_layers = (m.moe_layers + mtp_moe) if m.moe else 0           # MTP modules of a MoE last layer too
    expert = m.ffn_params(m.moe.expert_ffn) if m.moe else 0
    routed = expert_layers * m.moe.num_experts * expert if m.moe else 0
    attention = (m.layers + m.mtp_layers) * m.attn_params()
    other = m.param_count() + m.mtp_params() - routed - attention + attention / spec.attention_tp
    per_token = 0.0                                                    # cached elements per token, all layers
    for i in range(m.layers):
        width = (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim if m.mla is not None
                 else 2 * max(1, m.n_kv // spec.attention_tp) * m.d_head)
        per_token += width * m.attention_span(i, spec.context) / spec.context
    seqs = spec.tokens / (1 + draft_tokens(m, spec)) if spec.phase == "decode" else spec.tokens / spec.context
    kv = max(1.0, seqs) * spec.context * per_token * spec.kv_bytes
    return ServingMemory(w * expert * slots_per_gpu * expert_layers, w * other, kv)


def _mtp_module_us(at: AttentionTimer, seqs: float, last: int, moe_us: float | None) -> float:
    """One MTP module on the sequences: attention of the last layer's kind, its MoE parts (`moe_us`: the
    MoE layers' mean scaled from the micro-batch's tokens; None: a dense FFN), the logits and the 2h -> h
    projection."""
    m = at.m
    ffn = moe_us if moe_us is not None else at.dense_ffn_us(seqs)
    return (at.attention_us(seqs, last, one_per_sequence=True) + ffn + at.logits_us(seqs)
            + at.c.gemm(max(1, int(seqs)), m.hidden, 2 * m.hidden, dtype=at.spec.dtype).time_us)


def _estimate(spec: ServingSpec, total: float, parts: dict, seqs: float, d: int) -> ServingEstimate:
    """Throughput and time per output token of a forward of `total` us (decode: 1 + a + ... + a^d tokens
    per sequence per step)."""
    if spec.phase == "decode":
        a = spec.mtp_acceptance
        per_seq = spec.acceptance_length or 1.0 + sum(a ** j for j in range(1, d + 1))
        return ServingEstimate(total, seqs * per_seq / (total / 1e6), total / 1e3 / per_seq, parts, seqs, per_seq)
    return ServingEstimate(total, spec.tokens / (total / 1e6), total / 1e3, parts, seqs, 0.0)
