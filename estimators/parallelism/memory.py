"""Memory per GPU of a training plan: weights, gradients, optimizer states, activations.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (MLSys 2023), Sec. 4: per layer and micro-batch a GPT layer stores s*b*h*(34 + 5*a*s/h) bytes
(16-bit activations); with tensor + sequence parallelism everything divides by t; selective recomputation
drops the 5*a*s/h attention-score term; full recomputation keeps only the 2*s*b*h layer input. The first
pipeline stage holds the activations of `pp` micro-batches in flight (1F1B), i.e. of L layers in total; the
interleaved schedule multiplies this by (1 + (p-1)/(p*v)). We generalize the 34 to the model's real
widths (GQA, SwiGLU, MoE top-k) term by term as the paper derives it:
attention 2h (QKV input) + 2(q+kv) (Q, K) + 2kv (V) + 2q (out-proj input) + h (dropout mask),
MLP 2h (input) + 2*f_in (fc1 output) + 2f (activation output) + h (dropout mask), norms 4h;
dropout masks only for models trained with dropout (GPT style: LayerNorm + GELU).
Flash attention stores no s^2 scores, like selective recomputation.

States follow Megatron-LM's mixed precision (Korthikanti et al.; Megatron distributed optimizer docs):
bf16 weights 2 B, fp32 gradient accumulation buffer 4 B, Adam fp32 master weights + two moments 12 B
per parameter; ZeRO-1 shards the 12 B over the data-parallel group, ZeRO-2 also the gradients,
ZeRO-3/FSDP also the weights (plus two gathered layers, this rank's part of each, as working buffers).
PyTorch FSDP2 shards the fp32 parameters themselves (4 + 4 + 8 B with fp32 gradients and Adam's moments, no
16-bit shard) and holds one layer's unsharded gradients in the reduce dtype for its reduce-scatter (with
deferred gradient sync, every layer's until the last micro-batch). Per-op selective checkpointing
(`recompute = "op"`) keeps what `estimators.parallelism.op_checkpoint` says a block saves.
"""
from __future__ import annotations

from dataclasses import dataclass

from estimators.model_config import ModelConfig
from estimators.parallelism.plan import ParallelPlan, mtp_layers, mtp_recomputed, selective_modules, stage_layers

GIB = 1024 ** 3


def hbm_capacity_gib(hw) -> float:
    """Usable HBM per GPU in GiB. HBM capacities are binary: an "80 GB" H100 or A100 is five 16 GiB
    stacks (nvidia-smi reports 81559 MiB on H100 SXM, 81920 MiB on A100 80GB), so the preset's
    memory_gb is read as GiB -- reading it as 1e9 bytes would take 5.5 GiB away from every GPU."""
    return float(hw.gpu.memory_gb)
WEIGHT_BYTES = 2.0
GRAD_BYTES = 4.0
OPTIM_BYTES = 12.0


@dataclass
class MemoryEstimate:
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    stage: int                 # the pipeline stage with the largest total
    capacity_gib: float = 0.0

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.grads_gib + self.optimizer_gib + self.activations_gib

    @property
    def oom(self) -> bool:
        return self.capacity_gib > 0 and self.total_gib > self.capacity_gib

    def breakdown_gib(self) -> dict:
        """Per-GPU memory of the most loaded stage by term, GiB (what `whatif parallelism --json` reports)."""
        return {"weights": self.weights_gib, "gradients": self.grads_gib, "optimizer_states": self.optimizer_gib,
                "activations": self.activations_gib, "total": self.total_gib, "capacity": self.capacity_gib,
                "headroom": self.capacity_gib - self.total_gib if self.capacity_gib else None}

    def to_json(self) -> dict:
        return {"weights_gib": self.weights_gib, "grads_gib": self.grads_gib, "optimizer_gib": self.optimizer_gib,
                "activations_gib": self.activations_gib, "total_gib": self.total_gib, "stage": self.stage,
                "capacity_gib": self.capacity_gib, "oom": self.oom}


def _dropout(model: ModelConfig) -> bool:
    return model.norm == "layernorm" and model.activation == "gelu"


def layer_activation_bytes(model: ModelConfig, plan: ParallelPlan, layer: int, full: bool | None = None) -> float:
    """Bytes one layer keeps for its backward, per micro-batch, on one GPU (Korthikanti et al. 2022).
    `full`: this layer is fully recomputed (default: recompute = full for every layer). Selective
    recompute modules drop what they recompute: layernorm (the two norm outputs), mla_up_proj (Q, K, V of
    the up-projections), mlp / moe (everything inside the FFN but its input), moe_act (the experts'
    activation outputs)."""
    s = plan.seq_len / plan.cp
    b = plan.micro_batch
    t = plan.tp
    h = model.hidden
    sp = t if plan.sequence_parallel else 1
    if full is None:
        full = plan.recompute == "full"
    if full:
        return 2.0 * s * b * h / sp
    if plan.recompute == "op":
        return s * b * _op_checkpoint_bytes_per_token(model, plan, layer)
    mods = selective_modules(plan)
    mask = 1.0 if _dropout(model) else 0.0
    q, kv = model.q_dim, model.kv_dim
    if model.mla:
        a = model.mla
        q = model.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        kv = model.heads * a.v_head_dim
    # terms on the full (gathered) sequence are divided by t (head-sharded); norm/dropout terms by sp
    attn_sharded = 2 * (q + kv) + 2 * kv + 2 * q
    if "mla_up_proj" in mods and model.mla:
        attn_sharded -= 2 * (q + kv)
    attn_seq = 2 * h + mask * h
    if model.is_moe_layer(layer):
        m = model.moe
        f = m.expert_ffn
        f_in = 2 * f if model.activation == "swiglu" else f
        cf = plan.moe_capacity_factor if plan.moe_capacity_factor > 0 else 1.0
        act_out = 0 if "moe_act" in mods else 2 * f
        routed = m.top_k * cf * (2 * h + 2 * f_in + act_out)
        fs = getattr(m, "shared_ffn", f)
        fs_in = 2 * fs if model.activation == "swiglu" else fs
        shared = 0 if "shared_experts" in mods else m.shared_experts * (2 * h + 2 * fs_in + 2 * fs)
        if "moe" in mods:
            routed, shared = 0, 0
        mlp_sharded = 0.0
        mlp_seq = 2 * h + routed + shared + mask * h  # experts not tensor-parallel
    else:
        f = model.ffn
        f_in = 2 * f if model.activation == "swiglu" else f
        mlp_sharded = 0 if "mlp" in mods else 2 * f_in + 2 * f
        mlp_seq = 2 * h + mask * h
    norms = 4 * h
    if "layernorm" in mods:
        attn_seq -= 2 * h     # the norm outputs (QKV / FFN inputs) are recomputed from the norm inputs
        mlp_seq -= 2 * h
    per_token = (attn_sharded + mlp_sharded) / t + (attn_seq + mlp_seq + norms) / sp
    scores = 0.0
    if plan.attention == "unfused" and (plan.recompute == "none" or plan.recompute == "selective"
                                        and "core_attn" not in mods):
        # softmax output (2 B) + dropout mask (1 B) + dropout output (2 B) per score: 5*a*s per token
        scores = (2.0 + 3.0 * mask) * model.heads / t * (plan.seq_len / plan.cp)
    return s * b * (per_token + scores)


def _op_checkpoint_bytes_per_token(model: ModelConfig, plan: ParallelPlan, layer: int) -> float:
    """Bytes per token a block keeps under per-op selective checkpointing (`--recompute op`,
    estimators.parallelism.op_checkpoint), all bf16: its input, the outputs of its odd-numbered matmuls, the
    attention output (and its fp32 log-sum-exp per head); a MoE block also the outputs of its all-to-alls
    (torchtitan saves them), not its routed experts' grouped GEMMs, which are not on the save list."""
    from estimators.parallelism.op_checkpoint import local_width, saved_matmuls
    t = plan.tp
    sp = t if plan.sequence_parallel else 1
    h = model.hidden
    v_width = model.heads * (model.mla.v_head_dim if model.mla else model.d_head)
    per_token = 2.0 * h / sp + sum(2.0 * local_width(mm, t) for mm in saved_matmuls(model, layer))
    per_token += (2.0 * v_width + 4.0 * model.heads) / t
    if model.is_moe_layer(layer):   # the dispatched copies and the combined output, of this rank's tokens
        cf = plan.moe_capacity_factor if plan.moe_capacity_factor > 0 else 1.0
        per_token += (model.moe.top_k * cf * 2.0 * h + 2.0 * h) / sp
    return per_token


def lora_layer_params(model: ModelConfig, plan: ParallelPlan) -> float:
    from estimators.parallelism.workload import lora_layer_params as adapters
    return adapters(model, plan)


def layer_params_local(model: ModelConfig, plan: ParallelPlan, layer: int) -> tuple[float, float]:
    from estimators.parallelism.workload import layer_params_local as local
    return local(model, plan, layer)


def estimate_memory(model: ModelConfig, plan: ParallelPlan, hbm_gib: float = 0.0) -> MemoryEstimate:
    """Peak-state memory of the most loaded pipeline stage. Dense parameters shard their ZeRO states over
    the dp x cp ranks, expert parameters over their expert-data-parallel group (edp = tp*cp*dp/(ep*etp));
    LoRA keeps the frozen base weights only (no gradients, no optimizer states: the adapters' are
    negligible); MTP layers sit on the last stage (recomputed as `mtp_recomputed` says)."""
    chunks = stage_layers(model, plan)
    p, v, t = plan.pp, plan.vp, plan.tp
    m = plan.micro_batches
    mtp = mtp_layers(model)
    lora = plan.finetune == "lora"
    best: MemoryEstimate | None = None
    for stage in range(p):
        local = [chunks[j] for j in range(stage, p * v, p)]
        layers = [i for c in local for i in c]
        if stage == p - 1:
            layers = layers + [model.layers - 1] * mtp
        dense = expert = 0.0
        for i in layers:
            d, e = layer_params_local(model, plan, i)
            dense += d
            expert += e
        emb = model.vocab * model.hidden / t
        if stage == 0:
            dense += emb + (model.max_seq * model.hidden if model.position == "learned" else 0)
        if stage == p - 1 and (not model.tied_embeddings or p > 1):
            dense += emb
        shard = plan.shard_group * plan.cp  # Megatron shards the optimizer over the dp x cp group
        eshard = max(plan.edp, 1)
        w = (dense + expert) * WEIGHT_BYTES
        g = dense * plan.grad_bytes
        ge = expert * plan.grad_bytes
        optim = OPTIM_BYTES - 4 + plan.master_weight_bytes   # master weights + two fp32 Adam moments
        o = dense * optim
        oe = expert * optim
        if plan.zero >= 1:
            o /= shard
            oe /= eshard
        if plan.zero >= 2:
            g /= shard
            ge /= eshard
        g += ge
        o += oe
        if plan.zero >= 3:
            # two gathered layers (the one running, the one prefetched); a layer gathers what this rank
            # holds of it: its TP shard of the dense weights and its EP share of the experts, not all experts
            biggest = max((sum(layer_params_local(model, plan, i)) for i in layers), default=0.0)
            gathered = 2 * biggest * plan.fsdp_gather_bytes
            if plan.fsdp == "fsdp2":
                # FSDP2 shards the fp32 parameters themselves (the optimizer's master copy, in `o`): no
                # 16-bit shard (LoRA's frozen base stays a 16-bit shard); under PP the stage's parameters stay
                # gathered all step. A layer's unsharded gradients are cast to the reduce dtype for their
                # reduce-scatter, or, with deferred sync over several micro-batches, every layer's
                # accumulate unsharded in it until the last
                base = dense * WEIGHT_BYTES / shard + expert * WEIGHT_BYTES / eshard if lora else 0.0
                # what FSDP shards (a group of one rank gathers nothing and has its gradients unsharded already:
                # NeMo AutoModel leaves experts that EP fully splits out of FSDP)
                unsharded = dense * (shard > 1) + expert * (eshard > 1)
                kept = unsharded * plan.fsdp_gather_bytes if plan.fsdp2_keeps_params_gathered else gathered
                w = base + kept
                deferred = plan.fsdp2_defers_grad_sync and m > 1
                g += (unsharded if deferred else biggest) * plan.fsdp_reduce_bytes
            else:
                w = dense * WEIGHT_BYTES / shard + expert * WEIGHT_BYTES / eshard + gathered
        if lora:
            # the frozen base trains nothing; the adapters (r x (in + out) per adapted linear) are the
            # trainable weights: their bf16 copy (sharded under ZeRO-3), gradients (ZeRO-2) and optimizer
            # states (ZeRO-1) sharded as dense parameters are
            adapters = len(layers) * lora_layer_params(model, plan)
            w += adapters * WEIGHT_BYTES / (shard if plan.zero >= 3 else 1)
            g = adapters * plan.grad_bytes / (shard if plan.zero >= 2 else 1)
            o = adapters * optim / (shard if plan.zero >= 1 else 1)
        # activations: micro-batches in flight on this stage times its layers' bytes
        in_flight = min(m, p - stage) if v == 1 else min(m * v, (p - stage - 1) * 2 + (v - 1) * p + 1)

        def chunk_bytes(c: list[int]) -> float:
            return sum(layer_activation_bytes(model, plan, i, _full_recompute(plan, j)) for j, i in enumerate(c))
        per_mb_chunk = [chunk_bytes(c) for c in local]
        if stage == p - 1 and mtp:
            per_mb_chunk[-1] += mtp * layer_activation_bytes(model, plan, model.layers - 1, mtp_recomputed(plan))
        # each in-flight micro-batch (of one chunk) holds one chunk's activations
        act = in_flight * sum(per_mb_chunk) / v
        s_tok = plan.seq_len / plan.cp * plan.micro_batch
        if stage == 0:
            act += in_flight * 2 * s_tok * model.hidden / t  # embedding output
        if stage == p - 1:
            # logits for the cross entropy (one micro-batch at a time): an fp32 copy (Megatron's unfused
            # cross entropy), or the bf16 logits whose gradient the fused kernel writes in place
            act += (2.0 if plan.fused_cross_entropy else 4.0) * s_tok * model.vocab / t
        est = MemoryEstimate(weights_gib=w / GIB, grads_gib=g / GIB, optimizer_gib=o / GIB,
                             activations_gib=act / GIB, stage=stage, capacity_gib=hbm_gib)
        if best is None or est.total_gib > best.total_gib:
            best = est
    assert best is not None
    return best


def _full_recompute(plan: ParallelPlan, position: int) -> bool:
    """Whether the layer at `position` in its pipeline chunk is fully recomputed."""
    if plan.recompute != "full":
        return False
    return not plan.recompute_layers or position < plan.recompute_layers
