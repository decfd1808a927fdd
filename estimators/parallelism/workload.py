"""Workload generator: a model + a parallelism plan -> per-rank Chakra execution graphs that the replay
engine runs with model timing (replay/model_timing.py).

What one rank's graph holds (GPU streams only, no CPU thread: the graph stays small):
- compute stream: per micro-batch and layer the real GEMM shapes of this rank's TP shard (QKV, out
  projection, MLP up/gate/down; backward = data-grad + weight-grad GEMMs), attention (flash or the
  unfused bmm + softmax of 2021 Megatron), norms and elementwise ops, embedding, logits + cross-entropy,
  activation recomputation (full: the layer forward again before its backward; selective: the attention
  core), and the optimizer step. The order of nodes on this stream *is* the pipeline schedule
  (1F1B or interleaved 1F1B with virtual stages, as Megatron-LM orders them).
- TP stream: sequence-parallel all-gather / reduce-scatter per layer (all-reduce without SP), forward and
  backward, with data deps that make them block compute where Megatron blocks, and overlap the
  weight-gradient GEMMs in the backward.
- CP send/recv streams: ring attention, one KV block exchange per ring step overlapped with the
  attention of the previous block.
- EP stream: MoE all-to-all dispatch and combine around the expert GEMMs (tokens per expert = local
  tokens x top-k / experts, balanced routing). With `MoELoads` (measured routing, estimators.moe), each
  MoE layer and micro-batch gets its own per-pair all-to-all sizes (`comm_pair_bytes`, timed as a
  non-uniform all-to-all) and per-expert token counts (one grouped GEMM over the local experts).
- DP streams: gradient reduce-scatter (ZeRO >= 1) / all-reduce (ZeRO-0) per layer bucket issued as the
  last micro-batch's backward of the layer finishes (overlapped, like DDP/FSDP hooks); ZeRO-3/FSDP
  parameter all-gathers before each layer's forward and backward, prefetched one layer ahead on their
  own stream; HSDP: reduce-scatter in the shard group, then all-reduce across replicas.
- PP streams: send/recv of activations (forward) and gradients (backward) between stages, one stream per
  direction so a blocked send never holds up a receive.

Collectives carry comm_type / comm_size (bytes of the full buffer: the gathered output of an all-gather,
the input of a reduce-scatter, the buffer of an all-reduce, the send buffer of an all-to-all) / pg_name /
pg_ranks with the real global ranks of the group, so the network model sees group size and placement.

Speed: each (layer kind, pass) is a template of op specs built once per rank with shared attr dicts;
instantiating it appends plain list entries. Rank symmetry (`ranks="symmetric"`) builds one
representative rank per pipeline stage; the collectives of its TP/CP/DP/EP groups, whose other members
are not simulated, are then timed by the network model alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from chakra_schema.graph import (CommType, EdgeKind, ExecutionGraph, GraphBuilder, NodeType, OpKind,
                                 ResourceKind)
from estimators.model_config import GATED_ACTIVATIONS, ModelConfig, causal_pairs
from estimators.moe.a2a import expected_distinct_nodes, node_limit
from estimators.parallelism.plan import (FUSED_DISPATCH, ParallelPlan, mtp_layers, mtp_recomputed,
                                         selective_modules, stage_layers, validate_plan)

# stream slots -> (stream id, name). HOST_WAIT stands in for no GPU work: its node, on a stream of its own
# chained into the compute ops, holds the compute stream empty for as long as the host, blocked on a
# device-to-host sync, has not issued the next kernel -- a wait, which the breakdowns count apart from compute
COMPUTE, TP, CP_SEND, CP_RECV, EP, DP_RS, DP_AG, PP_SEND_F, PP_SEND_B, PP_RECV_F, PP_RECV_B, HOST_WAIT = range(12)
STREAMS = {
    COMPUTE: (7, "compute"), TP: (20, "tp_comm"), CP_SEND: (21, "cp_send"), CP_RECV: (22, "cp_recv"),
    EP: (23, "ep_comm"), DP_RS: (24, "dp_grad_comm"), DP_AG: (25, "dp_param_comm"),
    PP_SEND_F: (26, "pp_send_fwd"), PP_SEND_B: (27, "pp_send_bwd"), PP_RECV_F: (28, "pp_recv_fwd"),
    PP_RECV_B: (29, "pp_recv_bwd"), HOST_WAIT: (30, "host_wait"),
}
# comm kind of each stream, for breakdowns ("host": the GPU waiting for the host, Breakdown.host_wait_us)
STREAM_KIND = {TP: "tp", CP_SEND: "cp", CP_RECV: "cp", EP: "ep", DP_RS: "dp", DP_AG: "dp",
               PP_SEND_F: "pp", PP_SEND_B: "pp", PP_RECV_F: "pp", PP_RECV_B: "pp", HOST_WAIT: "host"}

ENTRY = -1          # template dep on the pass's entry nodes
ACT_BYTES = 2       # bf16 activations
GRAD_COMM_BYTES = 4  # Megatron reduces fp32 main grads (ZeRO 0-2)
# Adam step per parameter: read fp32 param, grad, m, v (16 B); write param, m, v (12 B) + bf16 copy (2 B)
OPTIM_BYTES_PER_PARAM = 30.0
OPTIM_FLOPS_PER_PARAM = 12.0
# FP8 training (Transformer Engine recipe, delayed scaling): every FP8 GEMM's input operand is cast from
# bf16 with a fused cast+transpose (read 2 B, write the fp8 copy and its transpose, 1 B each) whose amax is
# recorded on the way; weight-grad GEMMs reuse those transposes. Once per layer and pass the amax histories
# (1024 steps, Megatron's --fp8-amax-history-len default) and scales of its FP8 tensors are updated.
FP8_CAST_BYTES_PER_ELEM = 4.0
FP8_AMAX_HISTORY = 1024
# Bytes read per element by the cast of an FP8 GEMM input, by recipe: delayed scaling reads the bf16
# tensor once (the amax is recorded on the way); current (tensorwise) scaling first reduces the amax of
# the tensor (one more read), then casts; blockwise / mxfp8 compute each block's scale inside the cast.
FP8_CAST_READS = {"delayed": 2.0, "tensorwise": 4.0, "blockwise": 2.0, "mxfp8": 2.0}
# Kernels the host launches per FP8 cast, by recipe: current (tensorwise) scaling zeroes the amax, reduces
# it, computes the scale and casts, four operations (Transformer Engine 2.7-2.11
# Float8CurrentScalingQuantizer::quantize_impl: a memset (2.7) or zero_amax_kernel (2.8+), the amax kernel,
# nvte_compute_scale_from_amax, nvte_quantize_v2); the other recipes one fused cast (their scales come from
# the amax history or are computed inside the cast)
FP8_CAST_KERNELS = {"delayed": 1, "tensorwise": 4, "blockwise": 1, "mxfp8": 1}
# Recipes whose GroupedLinear casts every expert's input in one multi-tensor launch (TE's split_quantize
# takes nvte_multi_cast_transpose only for delayed-scaling quantizers); the others quantize expert by expert
# in a C++ loop, one cast per local expert
FP8_MULTI_TENSOR_CAST = ("delayed",)
# CPU time to issue one kernel from eager PyTorch (Python module code + ATen dispatch + cudaLaunchKernel),
# which bounds how fast a GPU can run a sequence of short kernels; CUDA graphs replay the captured layer
# without it. hardware.md: the launch call alone takes 3-6 us of CPU; Megatron-Core's Python around each
# op adds about as much again (see LAUNCH_US in the README's constants table).
LAUNCH_US = 8.0
# CPU time of one Transformer Engine GEMM call (nvte_cublas_gemm: cuBLASLt descriptors, algorithm lookup and
# the launch), which GroupedLinear pays once per local expert and per GEMM (forward, data grad, weight grad).
# Measured, not fitted: Megatron-MoE-ModelZoo issue #7 profiles Qwen3-30B-A3B training (Megatron-Core, EP8,
# 16 local experts, grouped GEMM on) with NVTX host ranges: 645,099 nvte_cublas_gemm calls took 13.07 s, 20.3 us
# each on average (median 13.7 us; the mean, because the host's total per call is what paces it). That run
# was host-bound (about 7% MFU, the dispatcher ops most of its time), so a full launch queue, which would
# stretch these host ranges, is unlikely to have inflated them; it ran on a DGX B200's Xeon host, the same
# CPU generation as a DGX H100's. TE's Python around each expert GEMM (output allocations, splits) is not in
# the range. Expert GEMMs shorter than it (many small local experts) run at the rate the host calls them.
TE_GEMM_HOST_US = 20.3
# EP all-to-all overlap (Megatron-Core overlap_moe_expert_parallel_comm): the share of the all-to-all time
# that the other micro-batch's compute actually hides. Ideally all of it; measured runs hide far less
# (communication kernels take SMs from the GEMMs they run beside -- DeepEP's 20 SMs cost about 20% of GEMM
# efficiency, Megatron-Core MoE report arXiv:2603.07685 -- the first forward and last backward of a
# pipeline chunk have no partner, and the merged schedule adds host work). Measured, not fitted: Megatron-
# Bridge PR #5094 profiles Qwen3-30B-A3B on 16 x H100 (BF16, EP16, HybridEP) with the overlap on, and 36.55%
# of its communication kernel time runs concurrently with GEMM or attention kernels
# (skills/nemo-mbridge-perf-moe-comm-overlap). The five published H100 runs with the overlap on are then
# held out (README gives their errors as of this build), within 7% each: Megatron-Bridge DeepSeek-V3 25.09 and
# Qwen3-235B 25.11, the Megatron-Core report's Table 11 DeepSeek-V3 and Qwen3-235B, and that Qwen3-30B run.
# (Fitted on the four others instead, the share comes out at 0.367.)
EP_OVERLAP_HIDDEN = 0.3655
# Dropless MoE: the host learns how many tokens go to each expert only from the GPU. Megatron-Core's
# dispatchers copy the counts to the host and block on them once per MoE layer forward (all-to-all:
# MoEAlltoAllTokenDispatcher's cuda_dtoh_point, `d2h_event.synchronize()`; DeepEP and HybridEP: the CPU waits
# for the dispatch kernel's counts), because NCCL's split sizes and Transformer Engine's GroupedLinear
# m_splits are host lists. The GPU's queue runs dry at that point and stays empty until the host has run
# the dispatcher's Python and issued the next kernel. Token drop padded to capacity has static sizes and no
# sync. The EP all-to-all overlap does not hide it: the counts come from the router, the last compute the
# host queued, so the compute stream is empty when they arrive whichever micro-batch's work came before.
# Per layer forward (a full recompute's re-run of it included: the dispatcher runs again) the GPU sits idle
# this long. Derived from one published profile, independent of the rows the check suite
# scores: Qwen3-30B-A3B, 16 x H100, BF16, EP16, HybridEP, no overlap (Megatron-Bridge PR #5094,
# skills/nemo-mbridge-perf-moe-comm-overlap): a 24.714 s step whose GPU was busy 22.821 s (the union of
# kernel intervals), 64 micro-batches x 48 MoE layers per step without recompute (as Megatron-Bridge's
# Qwen3 MoE performance recipes run it) -> (24.714 - 22.821) s / 3072 = 616 us. All of that run's idle time
# is put on the syncs (the profile does not split out the optimizer step's or logging's). One H100 run of
# one model: a faster or slower host, or much more or less host work per layer, would idle otherwise.
MOE_SYNC_IDLE_US = 616.0
# Host time of one MoE transformer layer, forward and backward of one micro-batch, in eager Megatron-Core: the
# Python of attention, router, dispatcher, experts and combine and the autograd backward of all of it. The
# dropless token-count sync (above) stops the host from running ahead of the GPU by more than about a layer
# (without it, token drop, a host slower than the GPU still sets the pace once the launch queue is full), so
# when a layer's GPU work is shorter than this, the GPU waits for the host (small MoE layers are host-bound).
# Counted apart and added per plan: Transformer Engine's per-expert GEMM calls (TE_GEMM_HOST_US, six per local
# expert: forward, data and weight gradient of both expert linears) and the kernels of FP8 casts
# (LAUNCH_US each). The rest, per token dispatcher family (the all-to-all dispatcher adds the token-count
# all-gather and the sort of received tokens by expert, and calls NCCL all-to-alls from Python; DeepEP /
# HybridEP fuse permutation into their dispatch kernels), is the value with which this model reproduces one
# measured Qwen3-30B-A3B run per family, neither of them a row of the published tables the check suite scores
# (as MOE_SYNC_IDLE_US is derived from one profile):
# - all-to-all: Megatron-MoE-ModelZoo issue #7 (8 x B200, BF16, EP8, 16 local experts, micro-batch 1, global
#   batch 64, no CUDA graphs), host-bound at about 150 model TFLOP/s (7% MFU). By hand: 23.0 GFLOP per token
#   gives 5.02 s per step for 8 micro-batches x 48 layers = 384 layer passes per GPU, 13.1 ms each, less
#   16 x 6 GEMM calls x 20.3 us = 11.1 ms; the model (b200 preset) reproduces 150 TFLOP/s with 10.9 ms, the
#   rest of the step (optimizer, embedding, loss) taking the difference. Its host is a DGX B200's Xeon, the
#   generation of a DGX H100's.
# - DeepEP / HybridEP: Megatron-LM PR #5728 (32 x H100, BF16, EP8, HybridEP, no CUDA graphs, micro-batch 1,
#   global batch 256): 240.5 model TFLOP/s, 3.134 s per step, 8.16 ms per layer pass; reproduced with 5.6 ms.
#   That run may not have been host-bound; then this overstates its host, never past what the run took.
# Whole-iteration CUDA graphs (plan.cuda_graphs) replay without the host: no floor.
MOE_LAYER_HOST_US = {"alltoall": 10900.0, "flex": 5600.0}
# Host time of the router and the dispatcher's preprocessing of one MoE layer forward, which CUDA graphs of
# the moe_router and moe_preprocess scopes replay without the host: the #MOE_ROUTER_AND_PRE NVTX range of
# Megatron-MoE-ModelZoo issue #7 (the run above), median 1.87 ms. The range covers both scopes together, so
# only the two together are credited; nothing is credited for their backward or for the attn scope, which
# no measurement splits out (the floor stays, conservatively, where it was).
MOE_ROUTER_PREPROCESS_HOST_US = 1870.0
# Share of that host time spent in the forward, which a full recompute runs again: about 0.55, from the host
# calls of one dropless all-to-all MoE layer read in Megatron-Core's source (core_r0.14.0, TE 2.7: about
# 120 + 20E forward and 78 + 20E backward for E local experts; 0.53-0.56 for 4-16 experts)
MOE_LAYER_HOST_FWD_SHARE = 0.55
# Host time of one eager PyTorch op call in a Megatron-Core MoE layer (Python, ATen dispatch, autograd
# bookkeeping, the kernel launch when it has one), on average: MOE_LAYER_HOST_US["alltoall"] spread over the
# layer's host calls other than the per-expert GEMMs, as counted in its source for the calibration run's
# E = 16 local experts (198 + 34E = 742): 14.7 us, about twice LAUNCH_US (the launch path alone). It prices
# the eager ops some architectures add to that layer (architecture_host_calls).
MOE_HOST_US_PER_CALL = MOE_LAYER_HOST_US["alltoall"] / (198 + 34 * 16)


@dataclass(frozen=True)
class EagerOps:
    """An unfused run of eager PyTorch ops over one tensor: elements read and written in units of the
    tensor's size, kernels launched, host op calls (the kernels and the calls that launch none: views,
    splits, autograd nodes that only route gradients)."""
    reads: float
    writes: float
    kernels: int
    calls: int


# RoPE of one rotated tensor (q or k) when Megatron-Core cannot use Transformer Engine's fused kernel
# (unfused_rope), read in _apply_rotary_pos_emb_bshd (rope_utils.py, core_dev_r0.15 as Megatron-Bridge 25.11
# pins it, unchanged through 2026-04). Forward: slices t / t_pass, then cos, x mscale, cast and sin, x mscale,
# cast over the [s, 1, 1, d] table (6 small kernels), t * cos, the chunk, negation and cat of rotate_half,
# * sin, the add, the cat with the empty t_pass (6 passes over the tensor: 6.5 reads, 5.5 writes).
# Backward (autograd): * cos, * sin, the negation, the chunk's cat, the add of t's two gradients, the
# empty t_pass slice's zero fill and the add of the slices' gradients (t[..., :d] is an alias: no copy).
# The fused kernel: one pass.
ROPE_UNFUSED_FWD = EagerOps(reads=6.5, writes=5.5, kernels=12, calls=16)
ROPE_UNFUSED_BWD = EagerOps(reads=7.5, writes=6.5, kernels=7, calls=12)


def unfused_rope(model: ModelConfig) -> bool:
    """Megatron-Core rotates q and k with eager ops: a YaRN temperature other than 1, which Transformer
    Engine's fused RoPE does not take (rope_utils.apply_rotary_pos_emb falls back). MLA's fused RoPE
    (fused_apply_mla_rope_for_q / _kv) reads cos / sin with the temperature in them, so MLA stays fused."""
    return model.position == "rope" and model.rope_mscale != 1.0 and model.mla is None


def expert_bias_ops(local_experts: int, backward: bool) -> EagerOps:
    """The bias of the second expert linear in a model with linear biases (GPT-OSS): Megatron-Core's
    TEGroupedMLP returns it unapplied (skip_bias_add) and adds it in Python, expert by expert
    (`_apply_bias`: split the output and the routing probabilities, t + b * p per expert, cat), per
    element of the routed output. Forward: 2E kernels (the product written, then read with t and the sum
    written) and the cat; backward: per expert the gradients of b (g * p summed over tokens) and of p
    (g * b summed over the hidden size), the main-grad accumulation of b, and the split's cat."""
    e = max(int(local_experts), 1)
    if backward:
        return EagerOps(reads=5.0, writes=3.0, kernels=5 * e + 2, calls=5 * e + 5)
    return EagerOps(reads=3.0, writes=3.0, kernels=2 * e + 1, calls=2 * e + 6)


# The clamped gated activation (ModelConfig.glu_clamp) as Megatron-Core runs it (fused_bias_geglu
# weighted_bias_quick_geglu_impl), per element of the FFN input: forward the chunk, the two clamps and the
# cat, then torch.tensor(offset, device=cuda) for the activation, a synchronous host-to-device copy (the
# stream drains; the GPU then waits for the host's next call), again in a recompute of the activation;
# backward the clamps' gradient masks (one-sided: fill, compare, where; two-sided: fill, two compares, and,
# where) and the chunk's cat: about 9 B read and 6 B written per element.
GLU_CLAMP_FWD = EagerOps(reads=2.0, writes=2.0, kernels=4, calls=5)
GLU_CLAMP_BWD = EagerOps(reads=4.5, writes=3.0, kernels=9, calls=10)


def architecture_host_calls(model: ModelConfig, plan: ParallelPlan) -> int:
    """Eager host calls per MoE layer forward + backward of one micro-batch beyond those of the layer
    MOE_LAYER_HOST_US prices (a Qwen3-style layer: fused RoPE, no biases, plain SwiGLU): unfused RoPE of q
    and k, the per-expert bias loop, the activation clamp (and its recompute)."""
    calls = 0
    if unfused_rope(model):
        calls += 2 * (ROPE_UNFUSED_FWD.calls - 1 + ROPE_UNFUSED_BWD.calls - 1)
    selective = selective_modules(plan) | ({"moe"} if plan.recompute == "op" else set())  # op: the routed experts
    if model.bias and model.moe:
        local = max(model.moe.num_experts // plan.ep, 1)
        forward = expert_bias_ops(local, False).calls
        calls += forward * (2 if "moe" in selective else 1) + expert_bias_ops(local, True).calls
    if model.glu_clamp:
        calls += GLU_CLAMP_FWD.calls * (2 if {"moe", "moe_act"} & selective else 1) + GLU_CLAMP_BWD.calls
    return calls


# Transformer Engine issues the chunk GEMMs of a userbuffers overlap round-robin over this many compute
# streams (NVTE_COMM_OVERLAP_MAX_STREAMS, comm_gemm_overlap.h), so up to three chunks share the SMs at once
UB_COMPUTE_STREAMS = 3


def dropless_imbalance(ep: int, assignments: float) -> float:
    """Expected busiest EP rank's (token, expert) pairs over the mean, dropless routing that is balanced
    only in expectation: each of `assignments` pairs lands on one of `ep` ranks, so a rank's load is
    binomial and the largest of ep such loads sits about sqrt(2 ln ep) standard deviations above the mean."""
    if ep <= 1 or assignments <= 0:
        return 1.0
    mean = assignments / ep
    sd = math.sqrt(mean * (1.0 - 1.0 / ep))
    return 1.0 + sd * math.sqrt(2.0 * math.log(ep)) / mean


def moe_layer_host_us(model: ModelConfig, plan: ParallelPlan) -> float:
    """Host time of one MoE layer's forward + backward of one micro-batch (MOE_LAYER_HOST_US); 0 when CUDA
    graphs replay the iteration."""
    if plan.cuda_graphs or not model.moe:
        return 0.0
    local = model.moe.num_experts // plan.ep
    gemm_calls = local * 6 * TE_GEMM_HOST_US
    casts = 0.0
    if plan.precision == "fp8":   # a cast of each GEMM input: fc1 and fc2 forward, their two data gradients
        casts = 4 * FP8_CAST_KERNELS[plan.fp8_recipe] * LAUNCH_US
        if plan.fp8_recipe not in FP8_MULTI_TENSOR_CAST:
            casts *= local        # expert by expert
    family = "flex" if plan.moe_a2a in FUSED_DISPATCH else "alltoall"
    graphed = MOE_ROUTER_PREPROCESS_HOST_US if {"moe_router", "moe_preprocess"} <= set(plan.cuda_graph_scope) else 0.0
    return (MOE_LAYER_HOST_US[family] + gemm_calls + casts - graphed
            + architecture_host_calls(model, plan) * MOE_HOST_US_PER_CALL)


def apply_host_pacing(graph: ExecutionGraph, durations: np.ndarray) -> np.ndarray:
    """Durations of a generated step with each MoE layer's host pacing node set: the time by which the
    layer's host work (`host_floor_us`) exceeds the GPU time of its forward, recompute and backward (the
    compute stream, host waits and the all-to-alls the compute waits for, alone), 0 when the GPU is the
    slower. graph.metadata["host_pacing"] lists [pacing node, (first, end) node ranges of those passes]; an
    all-to-all marked `beside_compute` (the share the EP overlap hides; DeepEP's NVLink leg across nodes,
    see _RankBuilder._deepep) is not counted."""
    pacing = (graph.metadata or {}).get("host_pacing")
    if not pacing:
        return durations
    sids = np.array([r.index for r in graph.resources])[graph.resource]
    busy = np.isin(sids, [STREAMS[COMPUTE][0], STREAMS[HOST_WAIT][0], STREAMS[EP][0]])
    for i in np.flatnonzero(sids == STREAMS[EP][0]).tolist():
        busy[i] = not graph.attr(i, "beside_compute", False)
    counted = np.where(busy, durations, 0.0)
    prefix = np.concatenate([[0.0], np.cumsum(counted)])
    out = np.array(durations, dtype=np.float64)
    for node, ranges in pacing:
        gpu = sum(prefix[b] - prefix[a] for a, b in ranges)
        out[node] = max(0.0, float(graph.attr(node, "host_floor_us", 0.0)) - gpu)
    return out


# ----------------------------------------------------------------------------- op attribute helpers
def permute_io(top_k: int, fan_out: bool) -> tuple[float, float]:
    """(reads, writes) of Transformer Engine's fused MoE permute, in tensors of the permuted (tokens x top-k)
    size (permutation.cu): fanning out (the permute, the unpermute's gradient) reads each token once and
    writes its top-k copies; fanning in (the unpermute, the permute's gradient) reads the k copies and
    writes their (weighted) sum."""
    return (1.0 / top_k, 1.0) if fan_out else (1.0, 1.0 / top_k)


def act_io(activation: str, backward: bool = False) -> tuple[int, int]:
    """(reads, writes) of an MLP activation, in tensors of the activation's output size: a gated unit
    (SwiGLU) reads gate and up (2) and writes 1, its backward reads both and the output grad (3) and
    writes both input grads (2); a plain one (GELU, squared ReLU) reads and writes 1, backward reads the
    input and the output grad (2) and writes 1."""
    gated = activation in GATED_ACTIVATIONS
    if backward:
        return (3, 2) if gated else (2, 1)
    return (2, 1) if gated else (1, 1)


def gemm(m: int, n: int, k: int, dtype: str, batch: int = 1) -> dict:
    m, n, k, batch = max(int(m), 1), max(int(n), 1), max(int(k), 1), max(int(batch), 1)
    eb = 1 if dtype == "fp8" else 2
    return {"op": "gemm", "m": m, "n": n, "k": k, "batch": batch, "dtype": dtype,
            "flops": 2.0 * m * n * k * batch, "bytes": float(batch * ((m * k + k * n) * eb + m * n * 2))}


def grouped_gemm(ms: Sequence[int], n: int, k: int, dtype: str, wgrad: bool = False) -> dict:
    """One GEMM per group (expert) with its own row count m: [m, k] x [k, n] (wgrad: [n, m] x [m, k]
    -> the weight gradient, reducing over the m tokens)."""
    eb = 1 if dtype == "fp8" else 2
    ms = tuple(max(int(m), 0) for m in ms)
    flops = sum(2.0 * m * n * k for m in ms)
    nbytes = sum((m * k + k * n) * eb + m * n * 2 for m in ms)
    return {"op": "grouped_gemm", "ms": ms, "n": int(n), "k": int(k), "wgrad": wgrad, "dtype": dtype,
            "flops": flops, "bytes": float(nbytes)}


def elementwise(elems: float, reads: float = 1, writes: float = 1, op: str = "elementwise",
                flops_per: float = 1.0, elem_bytes: int = ACT_BYTES) -> dict:
    return {"op": op, "dtype": "bf16", "flops": float(flops_per * elems),
            "bytes": float(elems * elem_bytes * (reads + writes))}


def attention(batch: int, heads: int, kv_heads: int, seq_q: int, seq_kv: int, head_dim: int, v_dim: int,
              causal: bool, backward: bool, window: int = 0) -> dict:
    """Flash attention. Forward FLOPs = 2*sq*skv*(d_qk + d_v) per head, halved for causal self-attention
    (a sliding window of W keys: W*(W+1)/2 + (s-W)*W score pairs instead of s^2/2);
    the backward recomputes the scores: 2.5x the forward (5 matmuls against 2)."""
    f = 2.0 * batch * heads * seq_q * seq_kv * (head_dim + v_dim)
    if causal and 0 < window < seq_q:
        f *= causal_pairs(seq_q, window) / (seq_q * seq_kv)
    elif causal:
        f *= 0.5
    if backward:
        f *= 2.5
    io = batch * (seq_q * heads * (head_dim + v_dim) + seq_kv * kv_heads * (head_dim + v_dim)) * ACT_BYTES
    out = {"op": "attention", "dtype": "bf16", "batch": batch, "heads": heads, "kv_heads": kv_heads,
           "seq_q": seq_q, "seq_kv": seq_kv, "head_dim": head_dim, "v_head_dim": v_dim, "causal": causal,
           "backward": backward, "flops": f, "bytes": float(io * (2 if backward else 1))}
    if window:
        out["window"] = int(window)
    return out


def host_wait(us: float) -> dict:
    """No GPU work: the GPU waits `us` for the host (see HOST_WAIT). The node is a sync, its time recorded,
    so that no timing source reads it as a kernel."""
    return {"host_wait_us": float(us), "flops": 0.0, "bytes": 0.0}


def coll(comm_type: CommType, size: float, group: Sequence[int], pg_name: str) -> dict:
    return {"comm_type": int(comm_type), "comm_size": int(size), "pg_ranks": group, "pg_name": pg_name,
            "coll_name": comm_type.name.lower()}


@dataclass(frozen=True)
class MoELoads:
    """Measured routing for the EP layers instead of balanced routing. Micro-batch m of the step uses
    window m % windows. `pair_tokens[w, l, i, j]`: (token, expert) pairs EP rank i sends to EP rank j in
    the dispatch of MoE layer l (the l-th MoE layer of the model); `slot_tokens[w, l, i, s]`: tokens of
    the s-th local expert slot of EP rank i (with redundant experts a rank may hold more slots)."""

    pair_tokens: np.ndarray            # [windows, moe layers, ep, ep]
    slot_tokens: np.ndarray            # [windows, moe layers, ep, slots per rank]

    @property
    def windows(self) -> int:
        return self.pair_tokens.shape[0]

    def check(self, model: ModelConfig, plan: ParallelPlan) -> None:
        w, layers, ep, ep2 = self.pair_tokens.shape
        if layers != model.moe_layers or ep != plan.ep or ep2 != plan.ep:
            raise ValueError(f"MoE loads are for {layers} MoE layers on EP{ep}; the model has "
                             f"{model.moe_layers} MoE layers and the plan EP{plan.ep}")
        if self.slot_tokens.shape[:3] != (w, layers, ep):
            raise ValueError(f"slot_tokens shape {self.slot_tokens.shape} does not match pair_tokens {self.pair_tokens.shape}")


class _Template:
    """Op specs of one pass: (name, stream slot, attrs, deps as template indices; ENTRY = pass entry).

    `fp8_recipe`: how an FP8 GEMM's input is cast (FP8_CAST_READS / _KERNELS, FP8_MULTI_TENSOR_CAST) and
    whether the GEMM scales by blocks (BLOCK_SCALED_FP8_GEMM_TIME);
    `frozen`: weight-gradient GEMMs of the base weights are not emitted (LoRA); `join`: collectives that
    run beside the next GEMM (TP communication overlap) and that the op after it waits for."""

    def __init__(self, fp8_recipe: str = "delayed", frozen: bool = False, launch_us: float = 0.0,
                 attention_kernel: str = "fa2") -> None:
        self.attention_kernel = attention_kernel
        self.fp8_block_scaled = fp8_recipe == "blockwise"
        self.fp8_cast_reads = FP8_CAST_READS[fp8_recipe]
        self.fp8_cast_kernels = FP8_CAST_KERNELS[fp8_recipe]
        self.fp8_cast_per_expert = fp8_recipe not in FP8_MULTI_TENSOR_CAST   # GroupedLinear's loop over experts
        self.ops: list[tuple[str, int, dict, tuple[int, ...]]] = []
        self.head = ENTRY
        self.frozen = frozen
        self.launch_us = launch_us
        self.join: list[int] = []          # collectives the next chained op must also wait for
        self.overlapped: list[int] = []    # EP all-to-alls that run under later compute (moe_a2a_overlap)
        self.join_after_gemm: list[int] = []  # ... once the next GEMM has been added
        self.host_pacing = -1              # index of the MoE layer's host pacing wait (apply_host_pacing)
        # Userbuffers TP overlap (ring exchange) runs a GEMM beside its all-gather / reduce-scatter as this
        # many GEMMs over row chunks, one per TP shard as it arrives or leaves (1: whole GEMMs)
        self.ub_chunks = 1

    def ub_split(self, attrs: dict) -> dict:
        """A GEMM's attrs as the userbuffers overlap runs it: ub_chunks row chunks, up to
        UB_COMPUTE_STREAMS at once."""
        return {**attrs, "chunks": self.ub_chunks, "chunk_streams": UB_COMPUTE_STREAMS}

    def add(self, name: str, slot: int, attrs: dict, deps: Sequence[int] | None = None, chain: bool = True,
            ub: bool = True) -> int:
        """`ub=False`: a GEMM that is not a userbuffers linear (MLA's replicated down-projections) stays whole
        even right after an overlapped all-gather."""
        if self.frozen and name.endswith("_wgrad") and not name.startswith("lora_"):
            return self.head        # frozen base weight (LoRA): no weight gradient
        if deps is None:
            d = (self.head,) + tuple(self.join) if chain else (self.head,)
            if chain:
                self.join = []
        else:
            d = tuple(deps)
        if self.launch_us and slot == COMPUTE:
            attrs = {"launch_us": self.launch_us, **attrs}   # an op that names its own host cost keeps it
        if attrs.get("op") == "attention":
            attrs = {**attrs, "kernel": self.attention_kernel}   # a named flash kernel: its tiles are modelled
        if attrs.get("op") in ("gemm", "grouped_gemm"):
            attrs = {**attrs, "sustained": True}   # GEMMs of a long training run (power-limited clock)
            if self.fp8_block_scaled and attrs.get("dtype") == "fp8":
                attrs["fp8_block_scaled"] = True   # compute.BLOCK_SCALED_FP8_GEMM_TIME
            if ub and self.ub_chunks > 1 and chain and self.join_after_gemm and attrs["op"] == "gemm":
                attrs = self.ub_split(attrs)     # consumes the overlapped all-gather shard by shard
        op = attrs.get("op")
        if op in ("gemm", "grouped_gemm") and attrs.get("dtype") == "fp8" and not name.endswith("_wgrad"):
            # the scaled GEMM reads an fp8 copy of its input: cast it first (weight grads reuse the transposes)
            rows = sum(attrs["ms"]) if op == "grouped_gemm" else attrs["m"] * attrs.get("batch", 1)
            elems = float(rows) * attrs["k"]
            cast = elementwise(elems, 1, 1, op="fp8_cast")
            cast["bytes"] = float(elems * (self.fp8_cast_reads + 2.0))   # read bf16 (+ amax pass), write fp8 + fp8^T
            if self.launch_us:
                cast["launch_us"] = self.launch_us
            experts = int(attrs.get("launches", 1)) if self.fp8_cast_per_expert else 1
            casts = experts * self.fp8_cast_kernels
            if casts > 1:
                cast["launches"] = casts
            self.ops.append((name + "_fp8_cast", slot, cast, d))
            d = (len(self.ops) - 1,)
        self.ops.append((name, slot, attrs, d))
        i = len(self.ops) - 1
        if chain:
            self.head = i
            if self.join_after_gemm and attrs.get("op") in ("gemm", "grouped_gemm"):
                self.join += self.join_after_gemm
                self.join_after_gemm = []
        return i


# ----------------------------------------------------------------------------- one rank
@dataclass
class _Shapes:
    b: int
    s: int          # full sequence
    c: int          # cp
    t: int          # tp
    sp: bool
    dtype: str

    @property
    def T(self) -> int:          # tokens of the local sequence chunk (gathered over TP)
        return self.b * self.s // self.c

    @property
    def Ts(self) -> int:         # tokens per rank outside the TP region
        return self.T // self.t if self.sp else self.T


class _RankBuilder:
    def __init__(self, model: ModelConfig, plan: ParallelPlan, rank: int, gpus_per_node: int,
                 moe_loads: MoELoads | None = None, straggler: bool = False):
        self.m, self.p, self.rank = model, plan, rank
        self.moe_loads, self.straggler = moe_loads, straggler
        self.moe_index = {layer: i for i, layer in enumerate(l for l in range(model.layers) if model.is_moe_layer(l))}
        self.routing: tuple[int, int] | None = None   # (MoE layer, window) of the template being built
        self.stage, self.dp_idx, self.cp_idx, self.tp_idx = plan.coords(rank)
        self.sh = _Shapes(plan.micro_batch, plan.seq_len, plan.cp, plan.tp,
                          plan.sequence_parallel and plan.tp > 1, plan.precision)
        self.g = GraphBuilder(rank, plan.gpus)
        self.device = rank % gpus_per_node
        self.res: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.overlapped: list[int] = []
        self.groups()
        self.templates: dict[tuple, _Template] = {}
        self.layer_local_params = {}
        for i in range(model.layers):
            d, e = layer_params_local(model, plan, i)
            self.layer_local_params.setdefault(model.is_moe_layer(i), d + e)
        self.chunk_pos = {l: j for c in stage_layers(model, plan) for j, l in enumerate(c)}
        self.frozen = plan.finetune == "lora"
        self.launch_us = 0.0 if plan.cuda_graphs else LAUNCH_US
        host_us = moe_layer_host_us(model, plan)
        # one attrs dict for every MoE layer's pacing wait (timed once per graph); a fully recomputed layer's
        # host runs its forward twice
        self.pacing_attrs = {**host_wait(0.0), "host_floor_us": host_us} if host_us > 0 else None
        self.pacing_attrs_recomputed = ({**host_wait(0.0), "host_floor_us": host_us * (1 + MOE_LAYER_HOST_FWD_SHARE)}
                                        if host_us > 0 else None)
        # SFT on packed sequences: attention runs per document (THD layout, no cross-document scores)
        self.doc_len = plan.packed_doc_len if plan.finetune != "none" and plan.packed_doc_len else 0
        self.layer_index = 0          # the layer whose template is being built (sliding windows)
        # Megatron overlaps the TP reduction of input grads with weight-grad GEMMs (always with SP)
        self.async_tp = plan.async_tp_comm or self.sh.sp

    # -------------------------------------------------------------- groups
    def groups(self) -> None:
        p, r = self.p, self.rank
        self.tp_g = p.tp_group(r)
        self.cp_g = p.cp_group(r)
        self.dp_g = p.dp_group(r)
        self.ep_g = p.ep_group(r)
        self.edp_g = p.expert_dp_group(r)
        self.etp_g = p.etp_group(r)
        self.shard_g = p.dp_shard_group(r) if p.dp_shard else self.dp_g
        self.replica_g = p.dp_replica_group(r) if p.dp_shard else []

    @staticmethod
    def _pg(kind: str, group: Sequence[int]) -> str:
        return f"{kind}:{group[0]}" if group else kind

    # -------------------------------------------------------------- emitting nodes
    def _resource(self, slot: int) -> int:
        r = self.res.get(slot)
        if r is None:
            sid, name = STREAMS[slot]
            r = self.res[slot] = self.g.resource(ResourceKind.GPU_STREAM, self.device, sid, name)
        return r

    def node(self, name: str, slot: int, attrs: dict, deps: Sequence[int] = ()) -> int:
        if "comm_type" in attrs:
            nt, kind = NodeType.COMM_COLL_NODE, OpKind.COLLECTIVE
        elif "comm_dst" in attrs:
            if attrs["comm_src"] == self.rank:
                nt, kind = NodeType.COMM_SEND_NODE, OpKind.SEND
            else:
                nt, kind = NodeType.COMM_RECV_NODE, OpKind.RECV
        elif "host_wait_us" in attrs:
            nt, kind = NodeType.COMP_NODE, OpKind.SYNC
        else:
            nt, kind = NodeType.COMP_NODE, OpKind.KERNEL
        g = self.g
        i = g.add_node(name, nt, kind, self._resource(slot), duration_us=attrs.get("host_wait_us", 0.0), attrs=attrs)
        prev = self.last.get(slot)
        if prev is not None:
            g.add_dep(prev, i, EdgeKind.STREAM_ORDER)
        for d in deps:
            g.add_dep(d, i, EdgeKind.DATA)
        self.last[slot] = i
        return i

    def run(self, tpl: _Template, prefix: str, entry: Sequence[int]) -> tuple[int, int]:
        """Instantiate a template; returns (first node, the pass's output node)."""
        idx: list[int] = []
        for name, slot, attrs, deps in tpl.ops:
            d = []
            for j in deps:
                if j == ENTRY:
                    d.extend(entry)
                else:
                    d.append(idx[j])
            idx.append(self.node(prefix + name, slot, attrs, d))
        out = idx[tpl.head]
        # overlapped all-to-alls (moe_a2a_overlap) of the previous template must be done by this one's end;
        # this template's own wait for the next one (or the end of the pass: `join_overlapped`)
        self.join_overlapped(out)
        self.overlapped = [idx[j] for j in tpl.overlapped]
        return idx[0], out

    def join_overlapped(self, node: int) -> None:
        """`node` waits for the all-to-alls left running under compute (moe_a2a_overlap)."""
        for a in self.overlapped:
            if a < node:
                self.g.add_dep(a, node, EdgeKind.DATA)
        self.overlapped = []

    # -------------------------------------------------------------- templates
    def _template(self) -> _Template:
        return _Template(self.p.fp8_recipe, self.frozen, self.launch_us, self.p.attention_kernel)

    def tp_coll(self, tpl: _Template, name: str, ctype: CommType, size: float, deps=None, chain=True,
                split_gemm: bool = True) -> int | None:
        """A TP collective. With userbuffers overlap (Megatron / TE tp_comm_overlap, sequence parallel) the
        all-gather streams shards into the GEMM after it and the reduce-scatter drains the GEMM before it:
        they run beside that GEMM, and the op after it waits for both. The forward's linears and the
        backward's proj / fc2 data grads are ring exchanges (Transformer Engine's userbuffers configs in
        NeMo 24.07 and Megatron-Bridge 25.x: qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad, and proj / fc2
        fprop in the FP8 ones; the BF16 ones pipeline those two in 4 chunks, taken here as TP chunks too),
        which run that GEMM as one GEMM per TP shard, up to UB_COMPUTE_STREAMS at once; `split_gemm=False`
        is the bulk overlap of the backward's reduce-scatter beside whole GEMMs. MLA's projections are not
        userbuffers linears and stay whole."""
        if self.p.tp == 1:
            return None
        attrs = coll(ctype, size, self.tp_g, self._pg("tp", self.tp_g))
        if self.p.tp_comm_overlap and self.sh.sp and deps is None and chain:
            if ctype == CommType.ALL_GATHER:
                i = tpl.add(name, TP, attrs, deps=(tpl.head,), chain=False)
                tpl.join_after_gemm.append(i)
                return i
            if ctype == CommType.REDUCE_SCATTER and tpl.head >= 0 and \
                    tpl.ops[tpl.head][2].get("op") in ("gemm", "grouped_gemm"):
                gname, slot, gemm_attrs, gdeps = tpl.ops[tpl.head]
                if split_gemm and tpl.ub_chunks > 1 and gemm_attrs.get("op") == "gemm":
                    tpl.ops[tpl.head] = (gname, slot, tpl.ub_split(gemm_attrs), gdeps)
                i = tpl.add(name, TP, attrs, deps=gdeps, chain=False)
                tpl.join.append(i)
                return i
        return tpl.add(name, TP, attrs, deps, chain)

    def _norm(self, tpl: _Template, name: str, tokens: int, backward: bool = False) -> int:
        h = self.m.hidden
        flops = 8.0 if self.m.norm == "layernorm" else 5.0
        return tpl.add(name, COMPUTE, elementwise(tokens * h, reads=3 if backward else 1, writes=2 if backward else 1,
                                                  op="norm", flops_per=flops * (2 if backward else 1)))

    def _attn_dims(self) -> tuple[int, int, int, int]:
        """(heads, kv_heads, qk head dim, v head dim) per TP rank."""
        m, t = self.m, self.p.tp
        qk, v = m.attn_score_dims
        heads = m.heads // t
        kv = heads if m.mla else max(m.n_kv // t, 1)
        return heads, kv, qk, v

    def _qkv_gemms(self, tpl: _Template, backward: bool, ag: int | None) -> None:
        """The projections into Q, K, V (forward) or their data/weight grads (backward)."""
        m, sh, t = self.m, self.sh, self.p.tp
        T, h, dt = sh.T, m.hidden, sh.dtype
        if m.mla:
            a = m.mla
            shapes = [("q_a_proj", h, a.q_lora_rank, False),
                      ("q_b_proj", a.q_lora_rank, m.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) // t, True),
                      ("kv_a_proj", h, a.kv_lora_rank + a.qk_rope_head_dim, False),
                      ("kv_b_proj", a.kv_lora_rank, m.heads * (a.qk_nope_head_dim + a.v_head_dim) // t, True)]
        else:
            shapes = [("qkv_proj", h, (m.q_dim + 2 * m.kv_dim) // t, True)]
        lora = self.p.finetune == "lora" and "qkv" in self.p.lora_modules and not m.mla
        r = self.p.lora_rank
        if not backward:
            for name, k_in, n_out, _ in shapes:
                tpl.add(name, COMPUTE, gemm(T, n_out, k_in, dt), ub=not m.mla)
            if lora:   # the adapter beside the frozen projection: x A^T, then B, added to the output
                n_out = shapes[0][2]
                tpl.add("lora_qkv_a", COMPUTE, gemm(T, r, h, "bf16"))
                tpl.add("lora_qkv_b", COMPUTE, gemm(T, n_out, r, "bf16"))
                tpl.add("lora_qkv_add", COMPUTE, elementwise(T * n_out, 2, 1))
            return
        if lora:
            n_out = shapes[0][2]
            tpl.add("lora_qkv_b_dgrad", COMPUTE, gemm(T, r, n_out, "bf16"))
            tpl.add("lora_qkv_b_wgrad", COMPUTE, gemm(r, n_out, T, "bf16"), chain=False)
            tpl.add("lora_qkv_a_dgrad", COMPUTE, gemm(T, h, r, "bf16"))
            tpl.add("lora_qkv_a_wgrad", COMPUTE, gemm(h, r, T, "bf16"), chain=False)
        for name, k_in, n_out, _ in reversed(shapes):
            tpl.add(name + "_dgrad", COMPUTE, gemm(T, k_in, n_out, dt))
            deps = [tpl.head] + ([ag] if ag is not None else [])
            tpl.add(name + "_wgrad", COMPUTE, gemm(k_in, n_out, T, dt), deps=deps, chain=False)

    def _attention_core(self, tpl: _Template, backward: bool, tag: str = "") -> None:
        m, sh, p = self.m, self.sh, self.p
        heads, kvh, qk, vd = self._attn_dims()
        b, s, c = sh.b, sh.s, sh.c
        if p.attention == "unfused":
            sq = s // c
            bh = b * heads
            if not backward:
                tpl.add(tag + "attn_scores_bmm", COMPUTE, gemm(sq, s, qk, "bf16", bh))
                tpl.add(tag + "attn_softmax", COMPUTE, elementwise(bh * sq * s, 1, 1, op="softmax", flops_per=5))
                if m.norm == "layernorm":  # GPT-style attention dropout
                    tpl.add(tag + "attn_dropout", COMPUTE, elementwise(bh * sq * s, 1, 1.5))
                tpl.add(tag + "attn_values_bmm", COMPUTE, gemm(sq, vd, s, "bf16", bh))
            else:
                tpl.add("attn_values_bmm_dgrad", COMPUTE, gemm(sq, s, vd, "bf16", bh))
                tpl.add("attn_values_bmm_wgrad", COMPUTE, gemm(s, vd, sq, "bf16", bh))
                if m.norm == "layernorm":
                    tpl.add("attn_dropout_bwd", COMPUTE, elementwise(bh * sq * s, 1.5, 1))
                tpl.add("attn_softmax_bwd", COMPUTE, elementwise(bh * sq * s, 2, 1, op="softmax", flops_per=4))
                tpl.add("attn_scores_bmm_dgrad", COMPUTE, gemm(sq, qk, s, "bf16", bh))
                tpl.add("attn_scores_bmm_wgrad", COMPUTE, gemm(s, qk, sq, "bf16", bh))
            return
        window = m.attention_span(self.layer_index, s) if hasattr(m, "attention_span") else s
        window = window if window < s else 0
        if c == 1:
            if self.doc_len and self.doc_len < s:
                # packed documents: one causal attention per document (cu_seqlens), no cross-document scores
                docs = max(1, s // self.doc_len)
                tpl.add(tag + ("attention_bwd" if backward else "attention"), COMPUTE,
                        attention(b * docs, heads, kvh, self.doc_len, self.doc_len, qk, vd, causal=True,
                                  backward=backward, window=window if window < self.doc_len else 0))
                return
            tpl.add(tag + ("attention_bwd" if backward else "attention"), COMPUTE,
                    attention(b, heads, kvh, s, s, qk, vd, causal=True, backward=backward, window=window))
            return
        # Ring attention over the CP group (load-balanced causal split: the diagonal block is causal, each
        # of the c-1 other steps does half a block). Step i's KV arrives over cp_recv while step i-1 computes.
        blk = s // c
        kv_bytes = b * blk * 2 * kvh * max(qk, vd) * ACT_BYTES * (2 if backward else 1)  # bwd: KV + dKV
        nxt = self.cp_g[(self.cp_idx + 1) % c]
        prv = self.cp_g[(self.cp_idx - 1) % c]
        send_a = {"comm_src": self.rank, "comm_dst": nxt, "comm_size": int(kv_bytes), "pg_name": self._pg("cp", self.cp_g)}
        recv_a = {"comm_src": prv, "comm_dst": self.rank, "comm_size": int(kv_bytes), "pg_name": self._pg("cp", self.cp_g)}
        have = tpl.head                                   # the local K, V are ready
        nm = "attention_bwd" if backward else "attention"
        doc = self.doc_len if self.doc_len and self.doc_len < s else 0
        if window or doc:
            # a sliding window or packed documents: the rank's share of the sequence's score pairs, the
            # diagonal block's own (causal within it) first, the rest over the ring steps that reach it
            diag = causal_pairs(blk, window, doc)
            off = max(0.0, causal_pairs(s, window, doc) / c - diag) / (c - 1)
            first = attention(b, heads, kvh, blk, max(1, round(diag / blk)), qk, vd, False, backward)
            step = attention(b, heads, kvh, blk, max(1, round(off / blk)), qk, vd, False, backward) if off else None
        else:
            first = attention(b, heads, kvh, blk, blk, qk, vd, True, backward)
            step = attention(b, heads, kvh, blk, blk // 2, qk, vd, False, backward)
        tpl.add(f"{tag}{nm}_ring0", COMPUTE, first)
        for i in range(1, c):
            tpl.add(f"{tag}cp_send{i}", CP_SEND, send_a, deps=[have], chain=False)
            rv = tpl.add(f"{tag}cp_recv{i}", CP_RECV, recv_a, deps=[], chain=False)
            if step is not None:
                tpl.add(f"{tag}{nm}_ring{i}", COMPUTE, step, deps=[tpl.head, rv])
            have = rv

    def layer_template(self, layer: int, pas: str, mb: int = 0) -> _Template:
        """pas: 'F' forward, 'R' recomputed forward, 'S' selective recompute, 'B' backward. With measured
        MoE loads every (MoE layer, routing window of micro-batch `mb`) has its own template."""
        moe = self.m.is_moe_layer(layer)
        window = bool(getattr(self.m, "is_window_layer", lambda i: False)(layer))
        recompute = self._full_recompute(layer)
        key = (moe, pas, window, recompute)
        if moe and self.moe_loads is not None:
            key = (moe, pas, window, recompute, self.moe_index[layer], mb % self.moe_loads.windows)
        tpl = self.templates.get(key)
        if tpl is None:
            self.routing = key[4:] or None
            self.layer_index = layer
            tpl = self.templates[key] = self._build_layer(moe, pas)
        return tpl

    def _full_recompute(self, layer: int) -> bool:
        """Full recompute of this layer: every layer, or (recompute_layers = N, Megatron's 'block' method)
        the first N layers of each pipeline chunk."""
        p = self.p
        if p.recompute != "full":
            return False
        if not p.recompute_layers:
            return True
        return self.chunk_pos.get(layer, 0) < p.recompute_layers

    def _build_layer(self, moe: bool, pas: str) -> _Template:
        tpl = self._template()
        if self.p.tp_comm_overlap and self.sh.sp:
            tpl.ub_chunks = self.p.tp      # userbuffers overlap the transformer layer's linears only
        if pas == "S":
            if self.p.recompute == "op":
                self._op_recompute(tpl, moe)
            else:
                self._selective_recompute(tpl, moe)
            return tpl
        if pas in ("F", "R"):
            self._layer_fwd(tpl, moe)
        else:
            self._layer_bwd(tpl, moe)
        if self.sh.dtype == "fp8" and self.p.fp8_recipe == "delayed":
            # delayed scaling: roll the amax history and recompute the scale of every FP8 tensor of the layer
            # (three per GEMM, each expert's GEMM its own; the other recipes keep no history)
            tensors = 3 * sum(int(a.get("launches", 1)) for _, _, a, _ in tpl.ops
                              if a.get("op") in ("gemm", "grouped_gemm") and a.get("dtype") == "fp8")
            tpl.add("fp8_amax_scale_update", COMPUTE,
                    elementwise(tensors * FP8_AMAX_HISTORY, 1, 1, op="fp8_scale", elem_bytes=4))
        return tpl

    def _selective_recompute(self, tpl: _Template, moe: bool) -> None:
        """The forward work Megatron-Core's selective recompute repeats before a layer's backward, by
        module (--recompute-modules; default core_attn, which flash attention already recomputes inside
        its backward, so it costs nothing there)."""
        m, sh, p = self.m, self.sh, self.p
        mods = selective_modules(p)
        T, Ts, h, dt = sh.T, sh.Ts, m.hidden, sh.dtype
        if "core_attn" in mods and p.attention == "unfused":
            self._attention_core(tpl, backward=False, tag="recompute_")
        if "layernorm" in mods:
            self._norm(tpl, "recompute_input_norm", Ts)
            self._norm(tpl, "recompute_post_attn_norm", Ts)
        if "mla_up_proj" in mods and m.mla:
            a, t = m.mla, p.tp
            tpl.add("recompute_q_b_proj", COMPUTE,
                    gemm(T, m.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) // t, a.q_lora_rank, dt))
            tpl.add("recompute_kv_b_proj", COMPUTE,
                    gemm(T, m.heads * (a.qk_nope_head_dim + a.v_head_dim) // t, a.kv_lora_rank, dt))
        if not moe and "mlp" in mods:
            f = m.ffn // p.tp
            f_in = 2 * f if m.activation == "swiglu" else f
            tpl.add("recompute_mlp_fc1", COMPUTE, gemm(T, f_in, h, dt))
            tpl.add("recompute_mlp_act", COMPUTE, elementwise(T * f, *act_io(m.activation)))
            tpl.add("recompute_mlp_fc2", COMPUTE, gemm(T, h, f, dt))
        if moe:
            tok, le, per, f_in, f = self._moe_dims()
            if "moe" in mods:
                self._recompute_routed_experts(tpl)
            elif "moe_act" in mods:
                self._glu_clamp(tpl, "recompute_expert_act_clamp", self._routed(per * le) * f_in)
                tpl.add("recompute_expert_act", COMPUTE,
                        elementwise(self._routed(per * le) * f, *act_io(m.activation)))
            if ("shared_experts" in mods or "moe" in mods) and m.moe.shared_experts:
                S, fs = m.moe.shared_experts, self._shared_ffn()
                fs_in = 2 * fs if m.activation == "swiglu" else fs
                tpl.add("recompute_shared_expert_fc1", COMPUTE, gemm(tok, fs_in * S, h, dt))
                tpl.add("recompute_shared_expert_fc2", COMPUTE, gemm(tok, h, fs * S, dt))

    def _recompute_routed_experts(self, tpl: _Template) -> None:
        """The routed experts' forward again from their dispatched input: fc1, activation, fc2."""
        m, h = self.m, self.m.hidden
        _, le, per, f_in, f = self._moe_dims()
        self._expert_gemm(tpl, "recompute_expert_fc1", per, f_in, h, le)
        self._glu_clamp(tpl, "recompute_expert_act_clamp", self._routed(per * le) * f_in)
        tpl.add("recompute_expert_act", COMPUTE, elementwise(self._routed(per * le) * f, *act_io(m.activation)))
        self._expert_gemm(tpl, "recompute_expert_fc2", per, h, f, le)
        self._expert_bias(tpl, "recompute_expert_bias_add", backward=False)

    def _op_recompute(self, tpl: _Template, moe: bool) -> None:
        """The forward work per-op selective checkpointing repeats before a block's backward
        (estimators.parallelism.op_checkpoint): the even-numbered matmuls, the norms, RoPE, the residual add
        between attention and MLP, the MLP or shared experts' activation and the routed experts' whole forward;
        attention and the saved matmuls' and all-to-alls' outputs are kept, so those do not run again."""
        from estimators.parallelism.op_checkpoint import recomputed_matmuls
        m, sh, t = self.m, self.sh, self.p.tp
        T, Ts, h, dt = sh.T, sh.Ts, m.hidden, sh.dtype
        tok = self._moe_dims()[0] if moe else T
        self._norm(tpl, "recompute_input_norm", Ts)
        self._rope(tpl, "recompute_rope", ROPE_UNFUSED_FWD)
        for mm in recomputed_matmuls(m, self.layer_index):
            n_out = max(mm.out // t, mm.min_out) if mm.tp_split == "out" else mm.out
            k_in = mm.inp // t if mm.tp_split == "inp" else mm.inp
            rows = tok if mm.name == "router" or mm.name.startswith("shared_expert_") else T
            tpl.add("recompute_" + mm.name, COMPUTE, gemm(rows, n_out, k_in, "bf16" if mm.name == "router" else dt))
        tpl.add("recompute_residual_add_attn", COMPUTE, elementwise(Ts * h, 2, 1))
        self._norm(tpl, "recompute_post_attn_norm", Ts)
        if moe:   # the routed experts' grouped GEMMs are not on the save list: their forward runs again
            self._recompute_routed_experts(tpl)
            if m.moe.shared_experts:
                fs = self._shared_ffn() * m.moe.shared_experts
                tpl.add("recompute_shared_expert_act", COMPUTE, elementwise(tok * fs, *act_io(m.activation)))
        else:
            tpl.add("recompute_mlp_act", COMPUTE, elementwise(T * (m.ffn // t), *act_io(m.activation)))

    def _shared_ffn(self) -> int:
        mo = self.m.moe
        return getattr(mo, "shared_ffn", mo.expert_ffn)

    def _layer_fwd(self, tpl: _Template, moe: bool) -> None:
        m, sh, t = self.m, self.sh, self.p.tp
        T, Ts, h, dt = sh.T, sh.Ts, m.hidden, sh.dtype
        full = T * h * ACT_BYTES
        drop = m.norm == "layernorm"
        self._norm(tpl, "input_norm", Ts)
        if sh.sp:
            self.tp_coll(tpl, "sp_allgather_attn", CommType.ALL_GATHER, full)
        self._qkv_gemms(tpl, backward=False, ag=None)
        self._rope(tpl, "rope", ROPE_UNFUSED_FWD)
        self._attention_core(tpl, backward=False)
        heads, _, _, vd = self._attn_dims()
        tpl.add("out_proj", COMPUTE, gemm(T, h, heads * vd, dt))
        self.tp_coll(tpl, "sp_reducescatter_attn" if sh.sp else "allreduce_attn",
                     CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE, full)
        tpl.add("residual_add_attn", COMPUTE, elementwise(Ts * h, 2 + drop * 0.5, 1 + drop * 0.5))
        self._norm(tpl, "post_attn_norm", Ts)
        if moe:
            self._moe_fwd(tpl)
        else:
            if sh.sp:
                self.tp_coll(tpl, "sp_allgather_mlp", CommType.ALL_GATHER, full)
            f = m.ffn // t
            f_in = 2 * f if m.activation == "swiglu" else f
            tpl.add("mlp_up_gate_proj" if m.activation == "swiglu" else "mlp_fc1", COMPUTE, gemm(T, f_in, h, dt))
            tpl.add("mlp_act", COMPUTE, elementwise(T * f, *act_io(m.activation), flops_per=8))
            tpl.add("mlp_down_proj", COMPUTE, gemm(T, h, f, dt))
            self.tp_coll(tpl, "sp_reducescatter_mlp" if sh.sp else "allreduce_mlp",
                         CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE, full)
        tpl.add("residual_add_mlp", COMPUTE, elementwise(Ts * h, 2 + drop * 0.5, 1 + drop * 0.5))

    def _layer_bwd(self, tpl: _Template, moe: bool) -> None:
        m, sh, t = self.m, self.sh, self.p.tp
        T, Ts, h, dt = sh.T, sh.Ts, m.hidden, sh.dtype
        full = T * h * ACT_BYTES
        tpl.add("residual_add_mlp_bwd", COMPUTE, elementwise(Ts * h, 1, 2))
        if moe:
            if self.pacing_attrs is not None:
                # the GPU waits for the host where the layer's host work outlasts its GPU work
                # (MOE_LAYER_HOST_US); inside the pass, after its first kernel, so every schedule counts it
                recomputed = self._full_recompute(self.layer_index)
                tpl.host_pacing = tpl.add("moe_host_pacing", HOST_WAIT,
                                          self.pacing_attrs_recomputed if recomputed else self.pacing_attrs)
            self._moe_bwd(tpl)
        else:
            f = m.ffn // t
            f_in = 2 * f if m.activation == "swiglu" else f
            if sh.sp:
                self.tp_coll(tpl, "sp_allgather_mlp_grad", CommType.ALL_GATHER, full)
            tpl.add("mlp_down_proj_dgrad", COMPUTE, gemm(T, f, h, dt))
            tpl.add("mlp_down_proj_wgrad", COMPUTE, gemm(f, h, T, dt), chain=False)
            tpl.add("mlp_act_bwd", COMPUTE, elementwise(T * f, *act_io(m.activation, backward=True), flops_per=12))
            # sequence parallelism re-gathers the norm output for the weight grad (Korthikanti et al. 2022)
            ag = self.tp_coll(tpl, "sp_allgather_mlp_input", CommType.ALL_GATHER, full, chain=False) if sh.sp else None
            tpl.add("mlp_up_gate_proj_dgrad", COMPUTE, gemm(T, h, f_in, dt))
            dg = tpl.head
            if not self.async_tp:  # the input-grad all-reduce runs after the whole linear backward
                tpl.add("mlp_up_gate_proj_wgrad", COMPUTE, gemm(h, f_in, T, dt))
            self.tp_coll(tpl, "sp_reducescatter_mlp_grad" if sh.sp else "allreduce_mlp_grad",
                         CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE, full, split_gemm=False)
            rs = tpl.head
            if self.async_tp:       # the weight-grad GEMM overlaps the reduction of the input grad
                tpl.add("mlp_up_gate_proj_wgrad", COMPUTE, gemm(h, f_in, T, dt),
                        deps=[dg] + ([ag] if ag is not None else []), chain=False)
            tpl.head = rs
        self._norm(tpl, "post_attn_norm_bwd", Ts, backward=True)
        tpl.add("residual_add_attn_bwd", COMPUTE, elementwise(Ts * h, 1, 2))
        heads, _, _, vd = self._attn_dims()
        if sh.sp:
            self.tp_coll(tpl, "sp_allgather_attn_grad", CommType.ALL_GATHER, full)
        tpl.add("out_proj_dgrad", COMPUTE, gemm(T, heads * vd, h, dt))
        tpl.add("out_proj_wgrad", COMPUTE, gemm(heads * vd, h, T, dt), chain=False)
        self._attention_core(tpl, backward=True)
        self._rope(tpl, "rope_bwd", ROPE_UNFUSED_BWD)
        ag = self.tp_coll(tpl, "sp_allgather_attn_input", CommType.ALL_GATHER, full, chain=False) if sh.sp else None
        self._qkv_gemms(tpl, backward=True, ag=ag)
        last = tpl.head if self.async_tp else len(tpl.ops) - 1  # last data-grad GEMM, or the last GEMM
        self.tp_coll(tpl, "sp_reducescatter_attn_grad" if sh.sp else "allreduce_attn_grad",
                     CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE, full, deps=[last])
        self._norm(tpl, "input_norm_bwd", Ts, backward=True)
        if not self.p.grad_accum_fusion:
            # Megatron-LM before gradient_accumulation_fusion: each weight grad is written in 16 bit and a
            # hook adds it into the fp32 main_grad buffer (read 2 B + read/write 8 B per parameter)
            tpl.add("main_grad_accumulate", COMPUTE, elementwise(self.layer_local_params[moe], 1, 1, elem_bytes=5))

    # MoE: tokens stay sequence-sharded (T/t per rank) into the router; the experts live on the expert
    # grid (etp x ep x edp, `ParallelPlan` doc): an EP rank holds E/ep experts, each sharded over etp ranks
    # that all-gather their tokens (Megatron-Core's ETP).
    def _moe_dims(self) -> tuple[int, int, int, int, int]:
        m, sh, p = self.m, self.sh, self.p
        mo = m.moe
        tok = sh.T // p.tp if sh.sp else sh.T
        local_experts = mo.num_experts // p.ep
        mean = tok * mo.top_k * p.ep / mo.num_experts * p.etp
        if p.moe_capacity_factor > 0:
            # token drop, padded to capacity (Megatron --moe-pad-expert-input-to-capacity): every expert
            # computes exactly capacity = cf x its mean tokens
            per_expert = max(1, math.ceil(p.moe_capacity_factor * mean))
        elif p.moe_force_balance:
            per_expert = max(1, round(mean))
        else:
            per_expert = max(1, round(mean * dropless_imbalance(p.ep, tok * mo.top_k * p.ep)))
        f = mo.expert_ffn // p.etp
        f_in = 2 * f if m.activation == "swiglu" else f
        return tok, local_experts, per_expert, f_in, f

    def _a2a(self, tpl: _Template, name: str, size: float, transpose: bool = False) -> None:
        if self.p.ep <= 1:
            return
        p = self.p
        if p.moe_capacity_factor > 0:
            size *= p.moe_capacity_factor       # padded to capacity, the padding travels too
        if self.routing is None and p.moe_a2a in FUSED_DISPATCH:
            if p.moe_a2a_overlap:
                self._deepep(tpl, name + "_exposed", size * (1.0 - EP_OVERLAP_HIDDEN), hidden=False)
                self._deepep(tpl, name, size * EP_OVERLAP_HIDDEN, hidden=True)
            else:
                self._deepep(tpl, name, size, hidden=False)
            return
        if not p.moe_a2a_overlap:
            self._a2a_share(tpl, name, size, 1.0, transpose, hidden=False)
            return
        # overlapped: the exposed share first (the compute waits for it), then the share the other
        # micro-batch's compute hides (done by the end of the next layer); one EP stream keeps them in order
        self._a2a_share(tpl, name + "_exposed", size, 1.0 - EP_OVERLAP_HIDDEN, transpose, hidden=False)
        self._a2a_share(tpl, name, size, EP_OVERLAP_HIDDEN, transpose, hidden=True)

    def _a2a_share(self, tpl: _Template, name: str, size: float, share: float, transpose: bool,
                   hidden: bool) -> None:
        """`share` of one all-to-all (and of its ETP collective), on the compute chain or, `hidden`, beside it."""
        p = self.p
        attrs = coll(CommType.ALL_TO_ALL, size * share, self.ep_g, self._pg("ep", self.ep_g))
        if self.routing is not None:  # measured routing: this layer's per-pair sizes (combine: reversed)
            pairs = self.moe_loads.pair_tokens[self.routing[1], self.routing[0]]
            pair_bytes = (pairs.T if transpose else pairs) * (self.m.hidden * ACT_BYTES * share)
            attrs["comm_pair_bytes"] = pair_bytes
            attrs["comm_size"] = int(pair_bytes[self.ep_g.index(self.rank)].sum())
        if hidden:
            attrs["beside_compute"] = True
            i = tpl.add(name, EP, attrs, deps=(tpl.head,), chain=False)
        else:
            i = tpl.add(name, EP, attrs)
        if p.etp > 1:   # the ETP group shares its tokens (all-gather after dispatch, reduce-scatter before combine)
            ag = "combine" in name
            etp = coll(CommType.REDUCE_SCATTER if ag else CommType.ALL_GATHER, size * share * p.etp,
                       self.etp_g, self._pg("etp", self.etp_g))
            if hidden:
                etp["beside_compute"] = True
            i = tpl.add(name + ("_etp_reducescatter" if ag else "_etp_allgather"), EP, etp,
                        deps=(i,) if hidden else None, chain=not hidden)
        if hidden:
            tpl.overlapped.append(i)

    def _deepep(self, tpl: _Template, name: str, size: float, hidden: bool) -> None:
        """DeepEP's fused dispatch / combine: a token bound for another node crosses the network once per
        destination node (to the GPU of the same local index there), then NVLink forwards it to the GPUs
        holding its experts. Two transfers: RDMA over the EP group's rail peers with each token counted
        once per distinct remote node, NVLink inside the node with every (token, expert) pair. Both go on
        the EP stream, one after the other. DeepEP pipelines the two legs in one kernel, but the measured
        dispatch across nodes is slower than its RDMA leg alone: Megatron-Bridge PR #5094's profile
        (Qwen3-30B-A3B, EP16 over two H100 nodes, HybridEP) spends about 8.3 s of communication on 3,072
        layer passes, 675 us per dispatch or combine, where the RDMA leg takes 400 us and the two legs
        756 us. DeepEP sends a token once per destination GPU, not per expert, which Megatron-LM's layer
        benchmark bears out inside a node; counted so, that profile's GPU-busy time reads -5.8% and PR
        #5728's FP8 run +12.7%, so the pair count stays until the cost it stands in for is found."""
        mo, gpn = self.m.moe, self.p.gpus_per_node
        ep_nodes = sorted({r // gpn for r in self.ep_g})
        n = len(ep_nodes)
        tok = size / (mo.top_k * self.m.hidden * ACT_BYTES)
        head = tpl.head
        local = [r for r in self.ep_g if r // gpn == self.rank // gpn]
        joins = []
        if n > 1:
            # expected distinct nodes among a token's top-k experts (uniform routing), at most the
            # groups a token may use (node-limited routing)
            limit = node_limit(n, getattr(mo, "groups", 1), getattr(mo, "groups_per_token", 1))
            distinct = expected_distinct_nodes(n, mo.top_k, limit)
            remote = distinct * (n - 1) / n
            rail = [r for r in self.ep_g if r % gpn == self.rank % gpn]
            # an all-to-all's size is its whole send buffer, (n-1)/n of which leaves the node
            rdma = tok * remote * self.m.hidden * ACT_BYTES * n / max(n - 1, 1)
            rdma_attrs = coll(CommType.ALL_TO_ALL, rdma, rail, self._pg("eprail", rail))
            if hidden:
                rdma_attrs["beside_compute"] = True
            joins.append(tpl.add(name + "_rdma", EP, rdma_attrs, deps=(head,), chain=False))
        if len(local) > 1:
            nvl = coll(CommType.ALL_TO_ALL, size, local, self._pg("epnode", local))
            if hidden or n > 1:
                # beside the compute; or, across nodes, left out of the GPU time host pacing compares the
                # host's with, as if it ran beside the RDMA leg as DeepEP's kernel runs it (counted, the
                # held-out Qwen3-30B-A3B EP16 rows read +17% instead of +5%: the same open cost as above)
                nvl["beside_compute"] = True
            joins.append(tpl.add(name + "_nvlink", EP, nvl, deps=(head,), chain=False))
        if hidden:
            tpl.overlapped += joins
        else:
            tpl.join += joins

    def _expert_tokens(self) -> tuple[int, ...] | None:
        """Tokens of each local expert slot under measured routing (symmetric simulation: the rank with
        the most tokens, whose experts finish last and hold up the combine); None when balanced."""
        if self.routing is None:
            return None
        slots = self.moe_loads.slot_tokens[self.routing[1], self.routing[0]]
        i = int(np.argmax(slots.sum(1))) if self.straggler else self.ep_g.index(self.rank)
        return tuple(int(t) for t in slots[i])

    def _expert_gemm(self, tpl: _Template, name: str, per: int, n: int, k: int, le: int, wgrad: bool = False,
                     **kw) -> int:
        """The local experts' GEMM: batched over `le` experts of `per` tokens (balanced), or one GEMM per
        expert slot with its measured token count."""
        dt = self.sh.dtype
        tokens = self._expert_tokens()
        # Transformer Engine's GroupedLinear issues one cuBLAS GEMM per local expert (on a few streams, so
        # the GPU runs them together like one batched GEMM) but the host calls each of them, at
        # TE_GEMM_HOST_US a call (eager; CUDA graphs replay them without the host)
        if tokens is None:
            attrs = gemm(n, k, per, dt, le) if wgrad else gemm(per, n, k, dt, le)
            attrs["launches"] = le
        else:
            attrs = grouped_gemm(tokens, n, k, dt, wgrad)
            attrs["launches"] = len(tokens)
        if tpl.launch_us:
            attrs["launch_us"] = TE_GEMM_HOST_US
        return tpl.add(name, COMPUTE, attrs, **kw)

    def _routed(self, balanced_tokens: int) -> int:
        """Tokens the local experts process: measured when routing is given, else balanced."""
        tokens = self._expert_tokens()
        return balanced_tokens if tokens is None else sum(tokens)

    def _rope(self, tpl: _Template, name: str, unfused: EagerOps) -> None:
        """RoPE of q and k: Transformer Engine's fused kernel, one pass over each; the eager ops of
        `unfused` when the YaRN mscale keeps Megatron-Core off the fused kernel (ModelConfig.rope_mscale)."""
        if self.m.position != "rope":
            return
        heads, kvh, qk, _ = self._attn_dims()
        elems = self.sh.T * (heads + kvh) * qk
        if not unfused_rope(self.m):
            tpl.add(name, COMPUTE, elementwise(elems, 1, 1, flops_per=3))
            return
        tpl.add(name, COMPUTE, {**elementwise(elems, unfused.reads, unfused.writes, flops_per=3),
                                "launches": 2 * unfused.kernels})

    def _expert_bias(self, tpl: _Template, name: str, backward: bool) -> None:
        """The second expert linear's bias, added expert by expert in Python (expert_bias_ops), in models
        with linear biases."""
        if not self.m.bias:
            return
        _, le, per, _, _ = self._moe_dims()
        ops = expert_bias_ops(le, backward)
        tpl.add(name, COMPUTE, {**elementwise(self._routed(per * le) * self.m.hidden, ops.reads, ops.writes),
                                "launches": ops.kernels})

    def _glu_clamp(self, tpl: _Template, name: str, elems: float, backward: bool = False) -> None:
        """Clamped gated activation (`ModelConfig.glu_clamp`, GPT-OSS): Megatron-Core clamps the gate and
        linear halves of the FFN input (two kernels, each reading and writing its half) and concatenates
        them (read and write the whole) before the fused activation; the backward masks the gradient
        where the clamps cut (GLU_CLAMP_FWD / _BWD)."""
        if not getattr(self.m, "glu_clamp", 0.0):
            return
        ops = GLU_CLAMP_BWD if backward else GLU_CLAMP_FWD
        tpl.add(name, COMPUTE, {**elementwise(elems, ops.reads, ops.writes), "launches": ops.kernels})
        if not backward:   # the offset's synchronous copy: the GPU waits for the host's next call
            tpl.add(name + "_offset_sync", HOST_WAIT, host_wait(MOE_HOST_US_PER_CALL))

    def _sort_chunks(self, tpl: _Template, name: str, per: int, le: int) -> None:
        """Megatron-Core's all-to-all dispatcher receives tokens grouped by source EP rank, then by
        expert; with more than one local expert it regroups them by expert for the grouped GEMM
        (`sort_chunks_by_idxs` after the dispatch, the inverse before the combine; each one more pass
        over the received tokens, read and written). DeepEP's fused dispatch delivers them grouped."""
        if self.p.ep <= 1 or le <= 1 or self.p.moe_a2a != "alltoall":
            return
        tpl.add(name, COMPUTE, elementwise(self._routed(per * le) * self.m.hidden, 1, 1))

    def _moe_fwd(self, tpl: _Template) -> None:
        m, dt = self.m, self.sh.dtype
        mo, h = m.moe, m.hidden
        tok, le, per, f_in, f = self._moe_dims()
        tpl.add("router", COMPUTE, gemm(tok, mo.num_experts, h, "bf16"))
        tpl.add("router_topk", COMPUTE, elementwise(tok * mo.num_experts, 1, 1, op="softmax", flops_per=5))
        if self.p.moe_capacity_factor <= 0:
            # dropless: the host blocks on the token counts before dispatching (MOE_SYNC_IDLE_US), in a
            # full recompute's re-run of the forward too
            tpl.add("moe_host_sync_wait", HOST_WAIT, host_wait(MOE_SYNC_IDLE_US))
        tpl.add("moe_permute", COMPUTE, elementwise(tok * mo.top_k * h, *permute_io(mo.top_k, fan_out=True)))
        self._a2a(tpl, "moe_dispatch_alltoall", tok * mo.top_k * h * ACT_BYTES)
        self._sort_chunks(tpl, "moe_sort_chunks", per, le)
        self._expert_gemm(tpl, "expert_up_gate_proj", per, f_in, h, le)
        self._glu_clamp(tpl, "expert_act_clamp", self._routed(per * le) * f_in)
        tpl.add("expert_act", COMPUTE, elementwise(self._routed(per * le) * f, *act_io(m.activation), flops_per=8))
        self._expert_gemm(tpl, "expert_down_proj", per, h, f, le)
        self._expert_bias(tpl, "expert_bias_add", backward=False)
        self._sort_chunks(tpl, "moe_unsort_chunks", per, le)
        self._a2a(tpl, "moe_combine_alltoall", tok * mo.top_k * h * ACT_BYTES, transpose=True)
        tpl.add("moe_unpermute", COMPUTE, elementwise(tok * mo.top_k * h, *permute_io(mo.top_k, fan_out=False)))
        if mo.shared_experts:
            S, fs = mo.shared_experts, self._shared_ffn()
            fs_in = 2 * fs if m.activation == "swiglu" else fs
            tpl.add("shared_expert_up_gate_proj", COMPUTE, gemm(tok, fs_in * S, h, dt))
            tpl.add("shared_expert_act", COMPUTE, elementwise(tok * fs * S, *act_io(m.activation), flops_per=8))
            tpl.add("shared_expert_down_proj", COMPUTE, gemm(tok, h, fs * S, dt))

    def _moe_bwd(self, tpl: _Template) -> None:
        m, dt = self.m, self.sh.dtype
        mo, h = m.moe, m.hidden
        tok, le, per, f_in, f = self._moe_dims()
        if mo.shared_experts:
            S, fs = mo.shared_experts, self._shared_ffn()
            fs_in = 2 * fs if m.activation == "swiglu" else fs
            tpl.add("shared_expert_down_proj_dgrad", COMPUTE, gemm(tok, fs * S, h, dt))
            tpl.add("shared_expert_down_proj_wgrad", COMPUTE, gemm(fs * S, h, tok, dt), chain=False)
            tpl.add("shared_expert_act_bwd", COMPUTE, elementwise(tok * fs * S, *act_io(m.activation, backward=True), flops_per=12))
            tpl.add("shared_expert_up_gate_proj_dgrad", COMPUTE, gemm(tok, h, fs_in * S, dt))
            tpl.add("shared_expert_up_gate_proj_wgrad", COMPUTE, gemm(h, fs_in * S, tok, dt), chain=False)
        tpl.add("moe_unpermute_bwd", COMPUTE, elementwise(tok * mo.top_k * h, *permute_io(mo.top_k, fan_out=True)))
        self._a2a(tpl, "moe_combine_alltoall_bwd", tok * mo.top_k * h * ACT_BYTES)
        self._sort_chunks(tpl, "moe_unsort_chunks_bwd", per, le)
        self._expert_bias(tpl, "expert_bias_add_bwd", backward=True)
        self._expert_gemm(tpl, "expert_down_proj_dgrad", per, f, h, le)
        self._expert_gemm(tpl, "expert_down_proj_wgrad", per, f, h, le, wgrad=True, chain=False)
        tpl.add("expert_act_bwd", COMPUTE, elementwise(self._routed(per * le) * f, *act_io(m.activation, backward=True),
                                                        flops_per=12))
        self._glu_clamp(tpl, "expert_act_clamp_bwd", self._routed(per * le) * f_in, backward=True)
        self._expert_gemm(tpl, "expert_up_gate_proj_dgrad", per, h, f_in, le)
        dg = tpl.head
        self._expert_gemm(tpl, "expert_up_gate_proj_wgrad", per, h, f_in, le, wgrad=True, chain=False)
        tpl.head = dg
        self._sort_chunks(tpl, "moe_sort_chunks_bwd", per, le)
        self._a2a(tpl, "moe_dispatch_alltoall_bwd", tok * mo.top_k * h * ACT_BYTES, transpose=True)
        tpl.add("moe_permute_bwd", COMPUTE, elementwise(tok * mo.top_k * h, *permute_io(mo.top_k, fan_out=False)))
        tpl.add("router_bwd", COMPUTE, gemm(tok, h, mo.num_experts, "bf16"))
        tpl.add("router_wgrad", COMPUTE, gemm(h, mo.num_experts, tok, "bf16"), chain=False)

    def mtp_template(self, backward: bool) -> _Template:
        """A multi-token-prediction module's own ops (DeepSeek-V3): RMSNorm of the hidden state and of
        the next token's embedding, their concatenation projected 2h -> h (its layer and the shared output
        head are run separately)."""
        key = ("mtp", backward)
        if key in self.templates:
            return self.templates[key]
        tpl = self._template()
        m, sh = self.m, self.sh
        T, Ts, h, dt = sh.T, sh.Ts, m.hidden, sh.dtype
        if not backward:
            tpl.add("mtp_embedding", COMPUTE, {"op": "embedding", "dtype": "bf16", "flops": 0.0,
                                               "bytes": float(T * h * ACT_BYTES)})
            self._norm(tpl, "mtp_norms", 2 * Ts)
            tpl.add("mtp_proj", COMPUTE, gemm(T, h // self.p.tp, 2 * h, dt))
        else:
            tpl.add("mtp_proj_dgrad", COMPUTE, gemm(T, 2 * h, h // self.p.tp, dt))
            tpl.add("mtp_proj_wgrad", COMPUTE, gemm(2 * h, h // self.p.tp, T, dt), chain=False)
            self._norm(tpl, "mtp_norms_bwd", 2 * Ts, backward=True)
        self.templates[key] = tpl
        return tpl

    def embedding_template(self, backward: bool) -> _Template:
        key = ("emb", backward)
        if key in self.templates:
            return self.templates[key]
        tpl = self._template()
        m, sh = self.m, self.sh
        T, h = sh.T, m.hidden
        full = T * h * ACT_BYTES
        if not backward:
            tpl.add("embedding", COMPUTE, {"op": "embedding", "dtype": "bf16", "flops": 0.0,
                                           "bytes": float(T * h * ACT_BYTES * (2 if m.position == "learned" else 1))})
            self.tp_coll(tpl, "embedding_reducescatter" if sh.sp else "embedding_allreduce",
                         CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE, full)
        else:
            if sh.sp:
                self.tp_coll(tpl, "embedding_allgather_grad", CommType.ALL_GATHER, full)
            # the dense weight grad of this rank's vocab shard is zero-filled, then the token rows added
            V = -(-m.vocab // self.p.tp)
            tpl.add("embedding_bwd", COMPUTE, {"op": "embedding", "dtype": "fp32", "flops": float(T * h),
                                               "bytes": float(T * h * (ACT_BYTES + 8) + V * h * ACT_BYTES)})
            if not self.p.grad_accum_fusion:  # the main_grad hook also runs for the embedding tables
                pos = m.max_seq * h if m.position == "learned" else 0
                tpl.add("embedding_main_grad_accumulate", COMPUTE, elementwise(V * h + pos, 1, 1, elem_bytes=5))
        self.templates[key] = tpl
        return tpl

    def output_template(self, backward: bool) -> _Template:
        key = ("out", backward)
        if key in self.templates:
            return self.templates[key]
        tpl = self._template()
        m, sh, t = self.m, self.sh, self.p.tp
        T, Ts, h, dt = sh.T, sh.Ts, m.hidden, sh.dtype
        V = -(-m.vocab // t)
        full = T * h * ACT_BYTES
        if not backward:
            self._norm(tpl, "final_norm", Ts)
            if sh.sp:
                self.tp_coll(tpl, "output_allgather", CommType.ALL_GATHER, full)
            # the output layer stays in bf16 under FP8 training (Megatron/TE keep first and last layers
            # in higher precision): part of the step's BF16 remainder with attention, norms, softmax
            dt = "bf16" if dt == "fp8" else dt
            tpl.add("logits", COMPUTE, gemm(T, V, h, dt))
            # Megatron's vocab-parallel cross entropy runs unfused in fp32 over the logits: cast fp16->fp32
            # (2+4 B), max (4), subtract max (4+4), exp (4+4), sum (4), divide by the sum -> softmax kept
            # for the backward (4+4): 22 B read + 16 B written per logit
            if self.p.fused_cross_entropy:
                # fused kernel: read the bf16 logits once (online max/sum), write the gradient in place
                tpl.add("cross_entropy", COMPUTE, elementwise(T * V, 1, 1, op="softmax", flops_per=5))
            else:
                tpl.add("cross_entropy", COMPUTE, elementwise(T * V, 11, 8, op="softmax", flops_per=5))
            self.tp_coll(tpl, "cross_entropy_allreduce", CommType.ALL_REDUCE, T * 4 * 2)
        else:
            # grad = softmax - one-hot, scaled in place (4+4 B), then cast back to 16 bit (4+2 B)
            if self.p.fused_cross_entropy:   # the stored gradient scaled by the loss gradient
                tpl.add("cross_entropy_bwd", COMPUTE, elementwise(T * V, 1, 1, op="softmax", flops_per=1))
            else:
                tpl.add("cross_entropy_bwd", COMPUTE, elementwise(T * V, 4, 3, op="softmax", flops_per=3))
            dt = "bf16" if dt == "fp8" else dt
            tpl.add("logits_dgrad", COMPUTE, gemm(T, h, V, dt))
            dg = tpl.head
            self.tp_coll(tpl, "output_reducescatter_grad" if sh.sp else "output_allreduce_grad",
                         CommType.REDUCE_SCATTER if sh.sp else CommType.ALL_REDUCE, full)
            rs = tpl.head
            wg = tpl.add("logits_wgrad", COMPUTE, gemm(h, V, T, dt), deps=[dg], chain=False)
            if not self.p.grad_accum_fusion and (not m.tied_embeddings or self.p.pp > 1):
                # the output layer's own weight (untied, or the last stage's copy of tied embeddings)
                tpl.add("output_main_grad_accumulate", COMPUTE, elementwise(V * h, 1, 1, elem_bytes=5),
                        deps=[wg], chain=False)
            tpl.head = rs
            self._norm(tpl, "final_norm_bwd", Ts, backward=True)
        self.templates[key] = tpl
        return tpl


# ----------------------------------------------------------------------------- schedules
def pipeline_schedule(pp: int, stage: int, micro_batches: int, vp: int = 1) -> list[tuple[bool, int, int]]:
    """Megatron-LM's (interleaved) 1F1B order on one stage: [(is_forward, micro_batch, local chunk)].
    Warm-up forwards, then alternate one forward / one backward, then cool-down backwards."""
    total = micro_batches * vp
    if vp == 1:
        warmup = min(pp - stage - 1, total)
    else:
        warmup = min((pp - stage - 1) * 2 + (vp - 1) * pp, total)

    def chunk(k: int, forward: bool) -> int:
        c = (k % (pp * vp)) // pp
        return c if forward else vp - 1 - c

    def mb(k: int) -> int:
        return (k // (pp * vp)) * pp + k % pp

    order: list[tuple[bool, int, int]] = []
    f = b = 0
    for _ in range(warmup):
        order.append((True, mb(f), chunk(f, True)))
        f += 1
    for _ in range(total - warmup):
        order.append((True, mb(f), chunk(f, True)))
        f += 1
        order.append((False, mb(b), chunk(b, False)))
        b += 1
    while b < total:
        order.append((False, mb(b), chunk(b, False)))
        b += 1
    return order


# ----------------------------------------------------------------------------- the generator
def representative_ranks(plan: ParallelPlan) -> list[int]:
    """One rank per distinct role: each pipeline stage at dp = cp = tp = 0."""
    return [plan.rank(s) for s in range(plan.pp)]


def layer_params_local(model: ModelConfig, plan: ParallelPlan, layer: int) -> tuple[float, float]:
    """(dense, expert) parameters of one layer held by one rank."""
    sharded, shared, routed = model.layer_param_split(layer)
    return sharded / plan.tp + shared, routed / (plan.ep * plan.etp)


def lora_layer_params(model: ModelConfig, plan: ParallelPlan) -> float:
    """LoRA adapter parameters of one layer on one rank: A (r x in) + B (out/tp x r) per adapted linear."""
    r, h, t = plan.lora_rank, model.hidden, plan.tp
    f = model.ffn or (model.moe.expert_ffn if model.moe else h)
    f_in = 2 * f if model.activation == "swiglu" else f
    dims = {"qkv": (h, (model.q_dim + 2 * model.kv_dim) / t), "proj": (model.q_dim / t, h),
            "fc1": (h, f_in / t), "fc2": (f / t, h)}
    return float(sum(r * (i + o) for name, (i, o) in dims.items() if name in plan.lora_modules))


def build_rank_graph(model: ModelConfig, plan: ParallelPlan, rank: int, gpus_per_node: int = 8,
                     moe_loads: MoELoads | None = None, straggler: bool = False,
                     schedule: Sequence[tuple[bool, int, int]] | None = None) -> ExecutionGraph:
    """One rank's step. `schedule`: this stage's passes [(is_forward, micro-batch, local chunk)] instead of
    the pipeline schedule (the composed estimate, estimators.parallelism.compose, replays a few passes
    per distinct stage). metadata["passes"] lists, per pass in order, [is_forward, micro-batch, local
    chunk, index of the pass's first node, index of its output node]: the nodes a pass created are
    those from its first node up to the next pass's first node (the last pass's: up to
    metadata["tail"], the first node of the step's tail)."""
    rb = _RankBuilder(model, plan, rank, gpus_per_node, moe_loads, straggler)
    p = plan
    stage = rb.stage
    chunks = stage_layers(model, plan)
    n_chunks = p.pp * p.vp
    local = [stage + c * p.pp for c in range(p.vp)]         # global chunk id of each local chunk
    sched = list(schedule) if schedule is not None else pipeline_schedule(p.pp, stage, p.micro_batches, p.vp)
    last_bwd: dict[int, int] = {}
    for pos, (fwd, mb, c) in enumerate(sched):
        if not fwd:
            last_bwd[c] = mb
    sh = rb.sh
    act_bytes = sh.b * (sh.s // sh.c) * model.hidden * ACT_BYTES // (p.tp if sh.sp else 1)

    def _tag(forward: bool, mb: int, from_chunk: int) -> int:
        """Unique per message: the sending chunk, the micro-batch and the direction."""
        return (mb * n_chunks + from_chunk) * 2 + (0 if forward else 1)

    def stage_of(gchunk: int) -> int:
        return gchunk % p.pp

    def peer(gchunk: int) -> int:
        return p.rank(stage_of(gchunk), rb.dp_idx, rb.cp_idx, rb.tp_idx)

    lora = p.finetune == "lora"
    n_mtp = mtp_layers(model)

    def trainable(layer: int) -> tuple[float, float]:
        """(dense, expert) parameters of a layer that get gradients on this rank: all of them, or with
        LoRA only the adapters (the base is frozen)."""
        if lora:
            return lora_layer_params(model, p), 0.0
        return layer_params_local(model, p, layer)

    dp_nodes: list[int] = []
    zero3 = p.zero >= 3
    hsdp = bool(p.dp_shard) and p.dp_shard < p.dp
    pg_dp = rb._pg("dp", rb.shard_g)
    pg_rep = rb._pg("dprep", rb.replica_g) if hsdp else ""
    pg_edp = rb._pg("edp", rb.edp_g)
    grad_b = p.fsdp_reduce_bytes if zero3 else min(GRAD_COMM_BYTES, p.grad_bytes)

    deferred: list[tuple[str, float, float]] = []

    def grad_reduce(name: str, dense: float, expert: float, after: int, deferrable: bool = True) -> None:
        """Gradient reduction of one bucket once its last backward is done (or, without
        overlap_grad_reduce, after the whole backward: 2021 Megatron-LM all-reduced after the pipeline)."""
        if not p.overlap_grad_reduce and deferrable and p.fsdp != "fsdp2":   # FSDP2 reduces as layers finish
            deferred.append((name, dense, expert))
            return
        if dense and len(rb.dp_g) > 1:
            size = dense * grad_b
            if p.zero == 0:
                dp_nodes.append(rb.node(name + ".grad_allreduce", DP_RS,
                                        coll(CommType.ALL_REDUCE, size, rb.dp_g, rb._pg("dp", rb.dp_g)), [after]))
            else:
                rs = rb.node(name + ".grad_reducescatter", DP_RS, coll(CommType.REDUCE_SCATTER, size, rb.shard_g, pg_dp), [after])
                if hsdp:
                    rs = rb.node(name + ".grad_allreduce_replicas", DP_RS,
                                 coll(CommType.ALL_REDUCE, size / len(rb.shard_g), rb.replica_g, pg_rep), [rs])
                dp_nodes.append(rs)
        if expert and len(rb.edp_g) > 1:
            dp_nodes.append(rb.node(name + ".expert_grad_reduce", DP_RS,
                                    coll(CommType.REDUCE_SCATTER if p.zero else CommType.ALL_REDUCE,
                                         expert * grad_b, rb.edp_g, pg_edp), [after]))

    def param_gather(name: str, layer: int, prev_first: int | None) -> list[int]:
        if not zero3 or len(rb.shard_g) <= 1:
            return []
        dense, expert = layer_params_local(model, p, layer)
        deps = [prev_first] if prev_first is not None else []
        return [rb.node(name + ".param_allgather", DP_AG,
                        coll(CommType.ALL_GATHER, (dense + expert) * p.fsdp_gather_bytes, rb.shard_g, pg_dp),
                        deps)]

    # Without sequence parallelism Megatron's scatter/gather optimization (Narayanan et al. 2021, Sec. 4.1)
    # sends 1/t of the activation between stages and all-gathers it over NVLink on the receiving side.
    scatter_gather = p.tp > 1 and not sh.sp
    p2p_bytes = act_bytes // p.tp if scatter_gather else act_bytes

    def p2p_attrs(src: int, dst: int, tag: int) -> dict:
        return {"comm_src": src, "comm_dst": dst, "comm_size": p2p_bytes, "pg_name": "pp", "comm_tag": tag}

    def needs_recv(k: int) -> tuple[str, int, int, int] | None:
        """(name, stream, peer, tag) of the receive pass k consumes, or None."""
        fwd, mb, c = sched[k]
        gch = local[c]
        if fwd and gch > 0:
            return f"mb{mb}.recv_act_c{gch}", PP_RECV_F, peer(gch - 1), _tag(True, mb, gch - 1)
        if not fwd and gch < n_chunks - 1:
            return f"mb{mb}.recv_grad_c{gch}", PP_RECV_B, peer(gch + 1), _tag(False, mb, gch + 1)
        return None

    def post_recv(k: int, deps: list[int]) -> list[int]:
        spec = needs_recv(k)
        if spec is None:
            return []
        name, slot, src, tag = spec
        r = rb.node(name, slot, p2p_attrs(src, rank, tag), deps)
        if scatter_gather:
            r = rb.node(name + "_allgather", TP, coll(CommType.ALL_GATHER, act_bytes, rb.tp_g, rb._pg("tp", rb.tp_g)), [r])
        return [r]

    # Communication points. Overlapped p2p: every send right after its pass, receives pre-posted.
    # Blocking p2p (2021 Megatron-LM): the schedule communicates in batches (after each warm-up forward,
    # after each steady-state forward+backward pair, after each cool-down backward); a batch posts the
    # sends of the passes just computed and the receives of the passes up to the next batch, and the
    # next pass waits for all of them.
    n_warm = next((k for k, (f, _, _) in enumerate(sched) if not f), len(sched))
    n_f = sum(1 for f, _, _ in sched if f)
    steady_end = n_warm + 2 * (n_f - n_warm)
    boundary = [p.vp == 1] * len(sched)  # non-interleaved 1F1B communicates after every pass
    for k in range(len(sched) if p.vp > 1 else 0):
        if k < n_warm - (1 if n_f > n_warm else 0) or k >= steady_end:
            boundary[k] = True
        elif (k - (n_warm - (1 if n_f > n_warm else 0))) % 2 == 1:
            boundary[k] = True
    posted: dict[int, list[int]] = {}
    pending_sends: list[tuple[str, int, int, int, int]] = []
    blockers: list[int] = []
    if not p.overlap_p2p:
        k = 0
        while k < len(sched):  # the receives before the first pass
            posted[k] = post_recv(k, [])
            if boundary[k]:
                break
            k += 1

    def finish_pass(k: int, send_spec: tuple[str, int, int, int] | None, out: int) -> None:
        nonlocal blockers
        if p.overlap_p2p:
            if send_spec is not None:
                name, slot, dst, tag = send_spec
                rb.node(name, slot, p2p_attrs(rank, dst, tag), [out])
            return
        if send_spec is not None:
            pending_sends.append((*send_spec, out))
        if not boundary[k]:
            return
        now = rb.last[COMPUTE]
        batch = []
        for name, slot, dst, tag, o in pending_sends:
            batch.append(rb.node(name, slot, p2p_attrs(rank, dst, tag), [o, now]))
        pending_sends.clear()
        j = k + 1
        while j < len(sched):
            posted[j] = post_recv(j, [now])
            batch += posted[j]
            if boundary[j]:
                break
            j += 1
        blockers = batch

    step_end = -1
    passes: list[list[int]] = []
    fwd_nodes: dict[int, tuple[int, int]] = {}     # layer -> node range of its first forward (host pacing)
    pacing: list[list] = []
    for k, (fwd, mb, c) in enumerate(sched):
        passes.append([int(fwd), mb, c, len(rb.g), -1])
        gch = local[c]
        layers = chunks[gch]
        pre = f"mb{mb}."
        entry: list[int] = blockers[:]
        blockers = []
        entry += posted.pop(k) if k in posted else post_recv(k, [])
        send_spec = None
        if fwd:
            if gch == 0:
                _, out = rb.run(rb.embedding_template(False), pre, entry)
                entry = [out]
            prev_first = None
            # FSDP2 under PP gathers a stage's parameters in its first forward and keeps them
            gather = not (p.fsdp2_keeps_params_gathered and mb > 0)
            for layer in layers:
                ag = param_gather(pre + f"L{layer}.F", layer, prev_first) if gather else []
                first, out = rb.run(rb.layer_template(layer, "F", mb), pre + f"L{layer}.F.", entry + ag)
                fwd_nodes.setdefault(layer, (first, len(rb.g)))
                prev_first, entry = first, [out]
            if gch == n_chunks - 1:
                _, out = rb.run(rb.output_template(False), pre, entry)
                entry = [out]
                for j in range(n_mtp):   # MTP module j: projection, one layer, the shared output head
                    _, out = rb.run(rb.mtp_template(False), pre + f"mtp{j}.", entry)
                    _, out = rb.run(rb.layer_template(model.layers - 1, "F", mb), pre + f"mtp{j}.L.F.", [out])
                    _, out = rb.run(rb.output_template(False), pre + f"mtp{j}.", [out])
                    entry = [out]
            else:
                send_spec = (pre + f"send_act_c{gch}", PP_SEND_F, peer(gch + 1), _tag(True, mb, gch))
        else:
            # this backward reduces its chunk's gradients: the chunk's last one, or every one under FSDP2
            reduces = mb == last_bwd[c] or p.reduces_every_micro_batch
            if gch == n_chunks - 1:
                for j in reversed(range(n_mtp)):
                    _, out = rb.run(rb.output_template(True), pre + f"mtp{j}.", entry)
                    if mtp_recomputed(p):   # its projection and layer run again before their backward
                        _, out = rb.run(rb.mtp_template(False), pre + f"mtp{j}.R.", [out])
                        _, out = rb.run(rb.layer_template(model.layers - 1, "R", mb), pre + f"mtp{j}.L.R.", [out])
                    _, out = rb.run(rb.layer_template(model.layers - 1, "B", mb), pre + f"mtp{j}.L.B.", [out])
                    _, out = rb.run(rb.mtp_template(True), pre + f"mtp{j}.", [out])
                    entry = [out]
                    if reduces:
                        d, e = trainable(model.layers - 1)
                        grad_reduce(pre + f"mtp{j}", d + 2 * model.hidden * model.hidden / p.tp, e, out)
                _, out = rb.run(rb.output_template(True), pre, entry)
                entry = [out]
                if reduces:
                    grad_reduce(pre + "output", model.vocab * model.hidden / p.tp
                                if (not model.tied_embeddings or p.pp > 1) and not lora else 0, 0, out)
            prev_first = None
            for layer in reversed(layers):
                ag = [] if p.fsdp2_keeps_params_gathered else param_gather(pre + f"L{layer}.B", layer, prev_first)
                recomputed = len(rb.g)
                if rb._full_recompute(layer):
                    first, out = rb.run(rb.layer_template(layer, "R", mb), pre + f"L{layer}.R.", entry + ag)
                    entry, ag = [out], []
                elif p.recompute in ("selective", "op"):
                    tpl_s = rb.layer_template(layer, "S", mb)
                    if tpl_s.ops:
                        first, out = rb.run(tpl_s, pre + f"L{layer}.R.", entry + ag)
                        entry, ag = [out], []
                tpl_b = rb.layer_template(layer, "B", mb)
                f_b, out = rb.run(tpl_b, pre + f"L{layer}.B.", entry + ag)
                if tpl_b.host_pacing >= 0 and layer in fwd_nodes:
                    # its wait: the layer's host work beyond the GPU work of its forward, recompute, backward
                    pacing.append([f_b + tpl_b.host_pacing, [fwd_nodes[layer], (recomputed, len(rb.g))]])
                prev_first = f_b
                entry = [out]
                if reduces:
                    dense, expert = trainable(layer)
                    grad_reduce(pre + f"L{layer}", dense, expert, out)
            if gch == 0:
                _, out = rb.run(rb.embedding_template(True), pre, entry)
                entry = [out]
                if reduces:
                    emb = model.vocab * model.hidden / p.tp + (model.max_seq * model.hidden if model.position == "learned" else 0)
                    grad_reduce(pre + "embedding", 0 if lora else emb, 0, out)
            else:
                send_spec = (pre + f"send_grad_c{gch}", PP_SEND_B, peer(gch - 1), _tag(False, mb, gch))
        step_end = entry[0]
        rb.join_overlapped(step_end)    # a pass's output waits for its overlapped all-to-alls
        passes[-1][4] = step_end
        finish_pass(k, send_spec, step_end)

    tail_first = len(rb.g)   # the step's tail (deferred reductions, optimizer, parameter gathers) starts here
    # optimizer step over this rank's (sharded) parameters, after every gradient reduction
    params = 0.0
    expert_params = 0.0
    for gch in local:
        for layer in chunks[gch]:
            d, e = trainable(layer)
            params += d
            expert_params += e
    if n_chunks - 1 in local:
        for _ in range(n_mtp):
            d, e = trainable(model.layers - 1)
            params += d + (0 if lora else 2 * model.hidden * model.hidden / p.tp)
            expert_params += e
    if 0 in local and not lora:
        params += model.vocab * model.hidden / p.tp
    if n_chunks - 1 in local and (not model.tied_embeddings or p.pp > 1) and not lora:
        params += model.vocab * model.hidden / p.tp
    shard = len(rb.shard_g) if p.zero >= 1 else 1
    eshard = len(rb.edp_g) if p.zero >= 1 else 1
    opt_params = params / shard + expert_params / eshard
    for name, dense, expert in deferred:
        grad_reduce(name, dense, expert, step_end, deferrable=False)
    if blockers:
        dp_nodes.extend(blockers)
    opt = rb.node("optimizer_step", COMPUTE,
                  {"op": "optimizer", "dtype": "fp32", "flops": OPTIM_FLOPS_PER_PARAM * opt_params,
                   "bytes": OPTIM_BYTES_PER_PARAM * opt_params}, dp_nodes + ([step_end] if step_end >= 0 else []))
    if p.precision == "fp8" and not lora:
        # the updated bf16 weights get their fp8 copies (+ transposes) once per step, before the next forward
        opt = rb.node("fp8_weight_cast", COMPUTE, elementwise(params + expert_params, 1, 1, op="fp8_cast"), [opt])
    if p.zero in (1, 2) and len(rb.shard_g) > 1:
        rb.node("param_allgather", DP_AG, coll(CommType.ALL_GATHER, params * 2, rb.shard_g, pg_dp), [opt])
        if expert_params and len(rb.edp_g) > 1:
            rb.node("expert_param_allgather", DP_AG, coll(CommType.ALL_GATHER, expert_params * 2, rb.edp_g, pg_edp), [opt])
    rb.g.metadata.update({"generator": "estimators.parallelism.workload", "model": model.name, "stage": stage,
                          "pp": p.pp, "tp": p.tp, "cp": p.cp, "dp": p.dp, "ep": p.ep, "vp": p.vp,
                          "micro_batches": p.micro_batches, "passes": passes,
                          "tail": tail_first})
    if pacing:
        rb.g.metadata["host_pacing"] = pacing
    return rb.g.build(dedupe_edges=False)


def generate(model: ModelConfig, plan: ParallelPlan, ranks: str | Sequence[int] = "symmetric",
             gpus_per_node: int = 8, progress: Callable[[int, int], None] | None = None,
             moe_loads: MoELoads | None = None) -> list[ExecutionGraph]:
    """Per-rank graphs. `ranks`: "symmetric" (one representative per pipeline stage), "all" (every rank,
    for the full simulation), or an explicit list of global ranks. `moe_loads`: measured routing for the
    EP layers (None: balanced routing)."""
    validate_plan(model, plan)
    if moe_loads is not None:
        moe_loads.check(model, plan)
    if ranks == "symmetric":
        todo = representative_ranks(plan)
    elif ranks == "all":
        todo = list(range(plan.gpus))
    else:
        todo = list(ranks)
    out = []
    for n, r in enumerate(todo):
        out.append(build_rank_graph(model, plan, r, gpus_per_node, moe_loads, straggler=ranks == "symmetric"))
        if progress:
            progress(n + 1, len(todo))
    return out
