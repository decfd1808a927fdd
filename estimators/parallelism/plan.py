"""A parallelism plan (`ParallelPlan`), its validation, and the rank layout it implies.

Rank order follows Megatron-LM's default "tp-cp-dp-pp": tensor-parallel ranks are consecutive (inside one
node, on NVLink), then context-parallel, then data-parallel, then pipeline stages:
    rank = ((pp_idx * dp + dp_idx) * cp + cp_idx) * tp + tp_idx
Experts live on their own grid over the same ranks of a pipeline stage (Megatron-Core's "MoE parallel
folding", Liu et al. 2025): the tp*cp*dp ranks of a stage, in the order above, are re-read as
"etp-ep-edp": expert-tensor-parallel ranks consecutive, then expert-parallel, then expert-data-parallel:
    stage-local index r = (dp_idx * cp + cp_idx) * tp + tp_idx = (edp_idx * ep + ep_idx) * etp + etp_idx
so EP32 with ETP1 spans TP2 x DP16 (32 consecutive ranks, four nodes), and ep need not divide dp.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from chakra_schema.errors import TraceInputError, brief
from estimators.model_config import ModelConfig

PRECISIONS = ("bf16", "fp8")
# FP8 scaling recipes (Transformer Engine): delayed = amax history of earlier steps, cast fused with the
# amax record; tensorwise = per-tensor current scaling ("FP8-CS"): an amax pass before the cast;
# blockwise = 1x128 activation / 128x128 weight scales (DeepSeek-V3), scales computed in the cast, the
# GEMM promotes partial sums to fp32 every 128 of K; mxfp8 = 1x32 e8m0 block scales (Blackwell)
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
# token dispatch: NCCL all-to-all, or fused dispatch / combine kernels that send a token over the network
# once per destination node and fan it out over NVLink there: DeepEP, and NVIDIA's HybridEP (DeepEP's
# hybrid-ep branch, Megatron-Core flex dispatcher backend "hybridep"), timed alike (their SM budgets,
# 20 / 16-32 SMs, are not modelled)
MOE_A2A = ("alltoall", "deepep", "hybridep")
FUSED_DISPATCH = ("deepep", "hybridep")
FINETUNE = ("none", "sft", "lora")
LORA_MODULES = ("qkv", "proj", "fc1", "fc2")     # the linears LoRA adapters can sit on
FSDP_IMPLS = ("megatron", "fsdp2")
# modules Megatron-Core's selective recompute names (--recompute-modules); "core_attn" is the classic one
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts", "layernorm")
# Megatron-Core `cuda_graph_scope` (Transformer Engine graphs of parts of each layer) that the model prices
CUDA_GRAPH_SCOPES = ("attn", "moe_router", "moe_preprocess")
MAX_GPUS = 1 << 20   # the largest cluster a plan may span (1,048,576 GPUs): collectives are modelled up to it
MAX_SEQ_LEN = 1 << 24  # 16.7M tokens a sequence (the longest published run: 1M); per-token arrays stay bounded
MAX_BATCH = 1 << 30    # sequences a global batch (a typo such as 1e12 is refused, not overflowed)
# none | selective (Megatron-Core's modules, `recompute_modules`) | full (whole layers) | op (PyTorch per-op
# selective checkpointing, torchtitan's "op" policy: every second matmul of a block and the cheap ops between;
# estimators.parallelism.op_checkpoint)
RECOMPUTE = ("none", "selective", "full", "op")
# dtypes FSDP reduce-scatters gradients in ("": the implementation's own; ParallelPlan.fsdp_reduce_bytes)
FSDP_REDUCE_DTYPES = ("", "bf16", "fp32")
ATTENTION = ("flash", "unfused")
# which fused attention kernel: FlashAttention-2 (the presets' attention efficiencies) or cuDNN's fused
# flash attention (Transformer Engine's FusedAttention; measured rates in replay.hardware.compute)
ATTENTION_KERNELS = ("fa2", "cudnn")


@dataclass(frozen=True)
class ParallelPlan:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1                        # expert parallel (MoE), divides dp
    vp: int = 1                        # virtual pipeline stages (model chunks) per rank: interleaved 1F1B
    seq_len: int = 2048
    global_batch: int = 1              # sequences per optimizer step
    micro_batch: int = 1
    precision: str = "bf16"            # GEMM precision; weights/activations are bf16 either way
    recompute: str = "none"            # activation recomputation: none | selective | full
    zero: int = 1                      # 0 DDP, 1 distributed optimizer, 2 + sharded grads, 3 FSDP (params too)
    dp_shard: int = 0                  # HSDP: shard within groups of this many DP ranks (0 = all of dp)
    sequence_parallel: bool = True     # Megatron SP when tp > 1
    attention: str = "flash"           # flash (fused, causal work only) | unfused (bmm + softmax, 2021 Megatron)
    overlap_grad_reduce: bool = True   # DP gradient reduction per layer bucket during the last backward
    grad_accum_fusion: bool = True     # wgrad GEMMs accumulate into fp32 main grads (False: a separate pass)
    async_tp_comm: bool = True         # backward TP reduction overlaps weight-grad GEMMs (False: 2021 Megatron)
    overlap_p2p: bool = True           # pipeline send/recv overlap compute (False: 2021 Megatron waits)
    gpus_per_node: int = 8
    etp: int = 1                       # expert tensor parallel: the expert grid is etp x ep x edp (see module doc)
    # uneven pipelines: layers of the first / last pipeline chunk (0: automatic), or every chunk's layer count
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    pipeline_layout: tuple[int, ...] = ()
    recompute_layers: int = 0          # full recompute of only the first N layers of each chunk (0: all)
    recompute_modules: tuple[str, ...] = ()   # selective recompute: these modules (empty: core_attn)
    moe_capacity_factor: float = 0.0   # token drop: each expert takes at most cf x its mean tokens (0: dropless)
    moe_a2a: str = "alltoall"
    moe_force_balance: bool = True     # balanced routing (Megatron --moe-router-force-load-balancing)
    # EP communication overlap (Megatron-Core `overlap_moe_expert_parallel_comm`, Megatron-Bridge
    # `moe_a2a_overlap`): the 1F1B schedule interleaves one micro-batch's forward with another's backward
    # layer by layer, so each dispatch / combine all-to-all runs under the other micro-batch's compute; the
    # share of its time that this hides on H100 is measured, not all of it (workload.EP_OVERLAP_HIDDEN)
    moe_a2a_overlap: bool = False
    fp8_recipe: str = "delayed"
    cuda_graphs: bool = False          # layers captured in CUDA graphs: no per-kernel launch overhead
    cuda_graph_scope: tuple[str, ...] = ()   # only these modules of each layer in graphs (CUDA_GRAPH_SCOPES)
    tp_comm_overlap: bool = False      # TP all-gather / reduce-scatter pipelined with the GEMMs (userbuffers)
    fsdp: str = "megatron"             # zero=3 implementation: Megatron-FSDP or PyTorch FSDP2
    # ZeRO-3 gradient reduce-scatter dtype: "" the implementation's (FSDP2: fp32, the reduce_dtype of the
    # MixedPrecisionPolicy torchtitan and NeMo AutoModel build; Megatron-FSDP: bf16), or "bf16" / "fp32"
    fsdp_reduce_dtype: str = ""
    # FSDP2 reduce-scatters each micro-batch's gradients after its backward (its default, torchtitan's without
    # PP); with deferred sync (set_requires_gradient_sync(False) before all but the last micro-batch, NeMo
    # AutoModel's default defer_fsdp_grad_sync; always under PP) unsharded gradients accumulate in memory and
    # are reduced once
    fsdp_defer_grad_sync: bool = False
    # ZeRO-3 gathers FP8 weights as FP8 (torchao enable_fsdp_float8_all_gather, Megatron-FSDP fp8_param_gather)
    fsdp_fp8_all_gather: bool = False
    finetune: str = "none"             # sft: packed sequences of `packed_doc_len`; lora: frozen base weights
    packed_doc_len: int = 0            # SFT: mean length of the documents packed in a sequence (0: seq_len)
    lora_rank: int = 16
    lora_modules: tuple[str, ...] = ("qkv",)   # linears with adapters: some of LORA_MODULES
    # optimizer state layout: gradient buffer bytes per parameter (4: fp32 main grads, Megatron-Core;
    # 2: bf16 grads, NeMo 1.x megatron_amp_O2 + distributed Adam) and master-weight bytes (4: fp32;
    # 2: apex DistributedFusedAdam's 16-bit remainders of fp32 masters whose high half is the bf16 weight)
    attention_kernel: str = "fa2"
    grad_bytes: int = 4
    master_weight_bytes: int = 4
    # fused vocab-parallel cross entropy (Transformer Engine's, Megatron `cross_entropy_fusion_impl="te"`):
    # one kernel over the bf16 logits that writes the loss gradient in place; False: Megatron's unfused
    # fp32 cross entropy (an fp32 copy of the logits, several passes)
    fused_cross_entropy: bool = False

    def __post_init__(self) -> None:
        # cheap field checks only (the search builds ~100K plans/s); rules between fields and the model
        # are `validate_plan`'s
        try:
            ok = (self.tp >= 1 and self.pp >= 1 and self.cp >= 1 and self.dp >= 1 and self.ep >= 1
                  and self.vp >= 1 and self.seq_len >= 1 and self.global_batch >= 1 and self.micro_batch >= 1
                  and self.gpus_per_node >= 1 and self.dp_shard >= 0 and self.zero in (0, 1, 2, 3)
                  and self.precision in PRECISIONS and self.recompute in RECOMPUTE and self.attention in ATTENTION
                  and self.etp >= 1 and self.first_stage_layers >= 0 and self.last_stage_layers >= 0
                  and self.recompute_layers >= 0 and 0 <= self.moe_capacity_factor < math.inf and self.moe_a2a in MOE_A2A
                  and self.fp8_recipe in FP8_RECIPES and self.finetune in FINETUNE and self.fsdp in FSDP_IMPLS
                  and self.fsdp_reduce_dtype in FSDP_REDUCE_DTYPES
                  and self.packed_doc_len >= 0 and self.lora_rank >= 1
                  and self.grad_bytes in (2, 4) and self.master_weight_bytes in (2, 4)
                  and self.attention_kernel in ATTENTION_KERNELS
                  and all(isinstance(n, int) and n >= 0 for n in self.pipeline_layout)
                  and all(x in RECOMPUTE_MODULES for x in self.recompute_modules)
                  and all(x in CUDA_GRAPH_SCOPES for x in self.cuda_graph_scope))
        except TypeError:   # a string where a number belongs
            ok = False
        if not ok:
            _reject_fields(self)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def fsdp_reduce_bytes(self) -> int:
        """Bytes per gradient element a ZeRO-3 reduce-scatter moves (`fsdp_reduce_dtype`)."""
        dtype = self.fsdp_reduce_dtype or ("fp32" if self.fsdp == "fsdp2" else "bf16")
        return 4 if dtype == "fp32" else 2

    @property
    def fsdp_gather_bytes(self) -> int:
        """Bytes per weight a ZeRO-3 all-gather moves: bf16, or FP8 weights gathered as FP8."""
        return 1 if self.fsdp_fp8_all_gather and self.precision == "fp8" else 2

    @property
    def fsdp2_defers_grad_sync(self) -> bool:
        """FSDP2 reduce-scatters once per step, after the last micro-batch: when asked to, or under pipeline
        parallelism, where PyTorch's pipeline stages (torch.distributed.pipelining, `backward_maybe_with_nosync`)
        turn gradient sync off for every backward but the last; unsharded gradients accumulate meanwhile."""
        return self.zero >= 3 and self.fsdp == "fsdp2" and (self.fsdp_defer_grad_sync or self.pp > 1)

    @property
    def fsdp2_keeps_params_gathered(self) -> bool:
        """FSDP2 under pipeline parallelism keeps a stage's parameters gathered from the first forward to the
        last backward (torchtitan: no reshard after forward with PP; the pipeline stage: no reshard after any
        backward but the last), so it gathers once per step instead of before every pass."""
        return self.zero >= 3 and self.fsdp == "fsdp2" and self.pp > 1

    @property
    def reduces_every_micro_batch(self) -> bool:
        """PyTorch FSDP2 without deferred sync: every micro-batch's backward reduce-scatters its gradients
        (the other layouts reduce once, after the last micro-batch's backward)."""
        return self.zero >= 3 and self.fsdp == "fsdp2" and not self.fsdp2_defers_grad_sync

    @property
    def shard_group(self) -> int:
        """DP ranks over which ZeRO shards states (HSDP: a sub-group)."""
        return self.dp_shard if self.dp_shard else self.dp

    def rank(self, pp_idx: int, dp_idx: int = 0, cp_idx: int = 0, tp_idx: int = 0) -> int:
        return ((pp_idx * self.dp + dp_idx) * self.cp + cp_idx) * self.tp + tp_idx

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp_idx, dp_idx, cp_idx, tp_idx) of a global rank."""
        tp_idx = rank % self.tp
        r = rank // self.tp
        cp_idx = r % self.cp
        r //= self.cp
        dp_idx = r % self.dp
        return r // self.dp, dp_idx, cp_idx, tp_idx

    # groups, as sorted global rank lists
    def tp_group(self, rank: int) -> list[int]:
        p, d, c, _ = self.coords(rank)
        return [self.rank(p, d, c, t) for t in range(self.tp)]

    def cp_group(self, rank: int) -> list[int]:
        p, d, _, t = self.coords(rank)
        return [self.rank(p, d, c, t) for c in range(self.cp)]

    def dp_group(self, rank: int) -> list[int]:
        """Data-parallel gradient group of dense parameters: all dp x cp ranks of the stage and TP slot."""
        p, _, _, t = self.coords(rank)
        return sorted(self.rank(p, d, c, t) for d in range(self.dp) for c in range(self.cp))

    def dp_shard_group(self, rank: int) -> list[int]:
        """HSDP: the ranks that shard states together (consecutive dp indices)."""
        p, d, c, t = self.coords(rank)
        g = self.shard_group
        base = d - d % g
        return [self.rank(p, base + j, c, t) for j in range(g)]

    def dp_replica_group(self, rank: int) -> list[int]:
        """HSDP: the ranks holding the same shard in different replicas."""
        p, d, c, t = self.coords(rank)
        g = self.shard_group
        return [self.rank(p, j, c, t) for j in range(d % g, self.dp, g)]

    # expert grid (MoE parallel folding): stage-local index = (edp_idx * ep + ep_idx) * etp + etp_idx
    def _expert_coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp_idx, edp_idx, ep_idx, etp_idx) of a global rank."""
        per_stage = self.tp * self.cp * self.dp
        p, r = divmod(rank, per_stage)
        etp_idx = r % self.etp
        r //= self.etp
        return p, r // self.ep, r % self.ep, etp_idx

    def _expert_rank(self, p: int, edp_idx: int, ep_idx: int, etp_idx: int) -> int:
        return p * self.tp * self.cp * self.dp + (edp_idx * self.ep + ep_idx) * self.etp + etp_idx

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: ranks of a stage holding the same experts."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def ep_group(self, rank: int) -> list[int]:
        p, d, _, t = self._expert_coords(rank)
        return [self._expert_rank(p, d, j, t) for j in range(self.ep)]

    def etp_group(self, rank: int) -> list[int]:
        p, d, e, _ = self._expert_coords(rank)
        return [self._expert_rank(p, d, e, j) for j in range(self.etp)]

    def expert_dp_group(self, rank: int) -> list[int]:
        """Ranks holding the same experts (gradient group of expert parameters)."""
        p, _, e, t = self._expert_coords(rank)
        return [self._expert_rank(p, j, e, t) for j in range(self.edp)]

    def with_(self, **kw) -> "ParallelPlan":
        return replace(self, **kw)


def _reject_fields(plan: ParallelPlan) -> None:
    """Name the first bad field of a plan (the slow path of `ParallelPlan.__post_init__`)."""
    def bad(msg: str) -> None:
        raise TraceInputError(None, msg)

    for key in ("tp", "pp", "cp", "dp", "ep", "etp", "vp", "seq_len", "global_batch", "micro_batch", "gpus_per_node",
                "lora_rank"):
        v = getattr(plan, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            bad(f"--{key.replace('_', '-')} must be an integer >= 1, got {v!r}")
    if isinstance(plan.dp_shard, bool) or not isinstance(plan.dp_shard, int) or plan.dp_shard < 0:
        bad(f"--dp-shard must be an integer >= 0, got {plan.dp_shard!r}")
    if plan.precision not in PRECISIONS:
        bad(f"--precision must be one of {', '.join(PRECISIONS)}, got {plan.precision!r}")
    if plan.recompute not in RECOMPUTE:
        bad(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {plan.recompute!r}")
    if plan.attention not in ATTENTION:
        bad(f"attention must be one of {', '.join(ATTENTION)}, got {plan.attention!r}")
    for key in ("first_stage_layers", "last_stage_layers", "recompute_layers", "packed_doc_len"):
        v = getattr(plan, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            bad(f"--{key.replace('_', '-')} must be an integer >= 0, got {v!r}")
    for key, allowed in (("fp8_recipe", FP8_RECIPES), ("moe_a2a", MOE_A2A), ("finetune", FINETUNE),
                         ("fsdp", FSDP_IMPLS), ("attention_kernel", ATTENTION_KERNELS),
                         ("fsdp_reduce_dtype", FSDP_REDUCE_DTYPES)):
        if getattr(plan, key) not in allowed:
            names = ", ".join(x for x in allowed if x)
            bad(f"--{key.replace('_', '-')} must be one of {names}, got {getattr(plan, key)!r}")
    if not all(isinstance(n, int) and n >= 0 for n in plan.pipeline_layout):
        bad(f"--pipeline-layout must be layer counts >= 0 per pipeline chunk, got {plan.pipeline_layout!r}")
    bad_mod = [x for x in plan.recompute_modules if x not in RECOMPUTE_MODULES]
    if bad_mod:
        bad(f"--recompute-modules: unknown module {bad_mod[0]!r} (known: {', '.join(RECOMPUTE_MODULES)})")
    bad_scope = [x for x in plan.cuda_graph_scope if x not in CUDA_GRAPH_SCOPES]
    if bad_scope:
        bad(f"--cuda-graph-scope: unknown scope {bad_scope[0]!r} (known: {', '.join(CUDA_GRAPH_SCOPES)})")
    if not (isinstance(plan.moe_capacity_factor, (int, float)) and 0 <= plan.moe_capacity_factor < math.inf):
        bad(f"--moe-capacity-factor must be a finite number >= 0 (0: dropless), got {plan.moe_capacity_factor!r}")
    for key in ("grad_bytes", "master_weight_bytes"):
        if getattr(plan, key) not in (2, 4):
            bad(f"{key} must be 2 or 4, got {getattr(plan, key)!r}")
    bad(f"--zero must be 0, 1, 2 or 3, got {plan.zero!r}")


def chunk_sizes(layers: int, plan: ParallelPlan, mtp: int = 0) -> list[int]:
    """Transformer layers of each pipeline chunk (virtual stage), in pipeline order.

    - `pipeline_layout`: given per chunk (Megatron-Core's --pipeline-model-parallel-layout, counting
      transformer layers only; MTP layers and the loss always sit on the last chunk).
    - `first_stage_layers` / `last_stage_layers` (Megatron's --decoder-first/last-pipeline-num-layers):
      those chunks get that many, the others share the rest evenly.
    - otherwise an even split when the layers divide by pp*vp; else, as Megatron's
      --account-for-embedding/loss-in-pipeline-split do, the embedding and the loss (and MTP layers)
      count as one layer each and must then split evenly (Llama 3 405B: 126 layers + 2 over 16 stages =
      7, 8 x 14, 7; DeepSeek-V3: 61 layers + MTP + 2 over 32 chunks = 1, 2 x 30, 0 + MTP, the layout
      "Et|(tt|)*30mL" of its Megatron-Bridge recipe)."""
    chunks = plan.pp * plan.vp
    if plan.pipeline_layout:
        sizes = list(plan.pipeline_layout)
        if len(sizes) != chunks or sum(sizes) != layers:
            raise TraceInputError(None, f"--pipeline-layout has {len(sizes)} chunks of {sum(sizes)} layers; the plan "
                                        f"has pp*vp = {chunks} chunks and the model {layers} layers")
        return sizes
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if first or last:
        if chunks == 1:
            raise TraceInputError(None, "--first/--last-stage-layers need --pp > 1")
        fixed = (first > 0) + (last > 0)
        rest = layers - first - last
        inner = chunks - fixed
        if rest < 0 or (inner == 0 and rest) or (inner and rest % inner):
            raise TraceInputError(None, f"{layers} layers minus first {first} / last {last} do not divide evenly "
                                        f"into the other {inner} pipeline chunks")
        per = rest // inner if inner else 0
        sizes = [per] * chunks
        if first:
            sizes[0] = first
        if last:
            sizes[-1] = last
        return sizes
    if layers % chunks == 0:
        return [layers // chunks] * chunks
    # Megatron's --account-for-embedding/loss-in-pipeline-split: the embedding (first chunk), the loss
    # (last chunk) and the MTP layers (last chunk) count as one layer each, and the units split evenly
    units = layers + 2 + mtp
    per = units // chunks
    if chunks > 1 and units % chunks == 0 and per - 1 - mtp >= 0 and per >= 2:
        sizes = [per] * chunks
        sizes[0] -= 1
        sizes[-1] -= 1 + mtp
        return sizes
    raise TraceInputError(None, f"{layers} layers do not divide into pp*vp = {chunks} pipeline chunks (give "
                                "--first-stage-layers / --last-stage-layers or --pipeline-layout)")


def mtp_layers(model: ModelConfig) -> int:
    """Multi-token-prediction layers of the model (DeepSeek-V3: 1), on the last pipeline chunk."""
    return int(getattr(model, "mtp_layers", 0) or 0)


def mtp_recomputed(plan: ParallelPlan) -> bool:
    """Whether the MTP modules are fully recomputed: under full recompute by the uniform method (every layer,
    `recompute_layers` 0), as Megatron-Core does since core 0.14 (MultiTokenPredictionLayer checkpoints its
    projection and transformer layer, commit 08abeedbfe); the block method (the first N layers of each
    chunk) leaves them eager."""
    return plan.recompute == "full" and not plan.recompute_layers


def stage_layers(model: ModelConfig, plan: ParallelPlan) -> list[list[int]]:
    """Layer indices of each model chunk, chunk = virtual stage, in pipeline order (chunk j lives on stage
    j % pp, as its (j // pp)-th local chunk); sizes from `chunk_sizes`."""
    out, start = [], 0
    for n in chunk_sizes(model.layers, plan, mtp_layers(model)):
        out.append(list(range(start, start + n)))
        start += n
    return out


def selective_modules(plan: ParallelPlan) -> frozenset[str]:
    """The modules selective recompute repeats: --recompute-modules, or Megatron's default core_attn (which
    repeats work only where attention is unfused: flash attention recomputes its scores in its backward
    anyway); none under another recompute policy."""
    if plan.recompute != "selective":
        return frozenset()
    return frozenset(plan.recompute_modules or ("core_attn",))


def validate_plan(model: ModelConfig, plan: ParallelPlan, gpus: int | None = None) -> None:
    """Raise TraceInputError (one line) for a plan that cannot run."""
    def bad(msg: str) -> None:
        raise TraceInputError(None, msg)

    # the single fields were checked by ParallelPlan.__post_init__ (`_reject_fields`)
    for name, cap in (("seq_len", MAX_SEQ_LEN), ("micro_batch", MAX_BATCH), ("global_batch", MAX_BATCH)):
        if getattr(plan, name) > cap:
            bad(f"{name} = {brief(getattr(plan, name))} is more than the {cap:,} a plan may have")
    if plan.gpus > MAX_GPUS:
        bad(f"tp*pp*cp*dp = {plan.gpus:,} GPUs is more than the {MAX_GPUS:,} a plan may span")
    if gpus is not None and plan.gpus != gpus:
        bad(f"tp*pp*cp*dp = {plan.tp}*{plan.pp}*{plan.cp}*{plan.dp} = {plan.gpus} != --gpus {gpus}")
    if model.heads % plan.tp:
        bad(f"{model.heads} attention heads are not divisible by tp {plan.tp}")
    if model.mla is None and model.n_kv % plan.tp and plan.tp % model.n_kv:
        bad(f"{model.n_kv} kv heads and tp {plan.tp} do not divide one another")
    if plan.vp > 1 and plan.pp == 1:
        bad("--vp > 1 needs --pp > 1")
    stage_layers(model, plan)  # raises when layers do not divide
    if plan.global_batch % (plan.dp * plan.micro_batch):
        bad(f"global batch {plan.global_batch} is not divisible by dp*micro_batch = {plan.dp * plan.micro_batch}")
    if plan.vp > 1 and plan.micro_batches % plan.pp:
        bad(f"the interleaved schedule needs micro-batches ({plan.micro_batches}) divisible by pp {plan.pp}")
    if plan.seq_len % (plan.cp * (plan.tp if plan.sequence_parallel else 1)):
        bad(f"sequence length {plan.seq_len} is not divisible by cp*tp")
    if plan.ep > 1 and model.moe is None:
        bad("--ep > 1 needs a mixture-of-experts model")
    if (plan.tp * plan.cp * plan.dp) % (plan.ep * plan.etp):
        bad(f"ep*etp = {plan.ep}*{plan.etp} must divide the tp*cp*dp = {plan.tp * plan.cp * plan.dp} ranks "
            "of a pipeline stage (the expert grid)")
    if plan.etp > 1 and model.moe is None:
        bad("--etp > 1 needs a mixture-of-experts model")
    if model.moe is not None and (model.moe.expert_ffn % plan.etp):
        bad(f"expert FFN {model.moe.expert_ffn} is not divisible by etp {plan.etp}")
    if model.moe is not None and model.moe.num_experts % plan.ep:
        bad(f"{model.moe.num_experts} experts are not divisible by ep {plan.ep}")
    if plan.dp_shard and (plan.zero != 3 or plan.dp % plan.dp_shard):
        bad("--dp-shard (HSDP) needs --zero 3 and must divide dp")
    fsdp = fsdp_options_set(plan)
    if plan.zero != 3 and fsdp:   # before the options' own rules: off ZeRO-3 none of them applies
        bad(f"{fsdp[0]} needs --zero 3 (FSDP)")
    if plan.fsdp_defer_grad_sync and plan.fsdp != "fsdp2":
        bad("--fsdp-defer-grad-sync needs --fsdp fsdp2 (Megatron-FSDP reduces once per step already)")
    if plan.fsdp_fp8_all_gather and plan.precision != "fp8":
        bad("--fsdp-fp8-all-gather needs --precision fp8")
    if plan.recompute_modules and plan.recompute != "selective":
        bad("--recompute-modules needs --recompute selective")
    if plan.recompute_layers and plan.recompute != "full":
        bad("--recompute-layers needs --recompute full")
    if plan.pipeline_layout and (plan.first_stage_layers or plan.last_stage_layers):
        bad("--pipeline-layout gives every chunk's layers: --first/--last-stage-layers beside it would be ignored")
    _check_options_apply(model, plan, bad)
    uneven = plan.first_stage_layers or plan.last_stage_layers
    sizes = list(plan.pipeline_layout) or (chunk_sizes(model.layers, plan, mtp_layers(model)) if uneven else [])
    if 0 in sizes[1:-1]:
        what = "--pipeline-layout" if plan.pipeline_layout else "--first/--last-stage-layers"
        bad(f"{what}: only the first and the last pipeline chunk may hold no transformer layer "
            f"(chunk {sizes.index(0, 1)} of {sizes} is empty)")


def fsdp_options_set(plan: ParallelPlan) -> list[str]:
    """The flags of the FSDP options `plan` sets (each means something under ZeRO-3 only)."""
    return [f for f, on in (("--fsdp fsdp2", plan.fsdp != ParallelPlan.fsdp),
                            ("--fsdp-reduce-dtype", bool(plan.fsdp_reduce_dtype)),
                            ("--fsdp-defer-grad-sync", plan.fsdp_defer_grad_sync),
                            ("--fsdp-fp8-all-gather", plan.fsdp_fp8_all_gather)) if on]


def _check_options_apply(model: ModelConfig, plan: ParallelPlan, bad) -> None:
    """Options that would change nothing in this plan are refused (a figure that silently ignores a flag
    reads as its effect; FSDP options off ZeRO-3 are validate_plan's, before their own rules): MoE options on
    a dense model, fine-tuning options of another fine-tuning mode, recompute modules the model does not have."""
    defaults = ParallelPlan()
    moe = model.moe
    if moe is None:
        moe_opts = [f for f, on in (("--moe-capacity-factor", plan.moe_capacity_factor > 0),
                                    ("--moe-a2a", plan.moe_a2a != defaults.moe_a2a),
                                    ("--moe-unbalanced", not plan.moe_force_balance),
                                    ("moe_a2a_overlap", plan.moe_a2a_overlap)) if on]
        if moe_opts:
            bad(f"{moe_opts[0]} needs a mixture-of-experts model ({model.name} is dense)")
    elif plan.moe_capacity_factor > moe.num_experts / moe.top_k:
        bad(f"--moe-capacity-factor {plan.moe_capacity_factor:g} is more than experts / top-k = "
            f"{moe.num_experts / moe.top_k:g}: no token is dropped at that capacity, and padded to it each "
            "expert would compute more rows than there are tokens")
    if plan.lora_rank != defaults.lora_rank and plan.finetune != "lora":
        bad("--lora-rank needs --finetune lora")
    if plan.finetune == "lora" and plan.lora_rank > model.hidden:
        bad(f"--lora-rank {plan.lora_rank} is more than the hidden size {model.hidden}: a low-rank adapter "
            "of that rank is no lower rank than the weight it adapts")
    if plan.packed_doc_len and plan.finetune == "none":
        bad("--packed-doc-len needs --finetune sft or lora (packed fine-tuning sequences)")
    if plan.packed_doc_len > plan.seq_len:
        bad(f"--packed-doc-len {plan.packed_doc_len} is longer than --seq-len {plan.seq_len}: a packed sequence "
            "holds documents of at most its own length")
    unknown = [m for m in plan.lora_modules if m not in LORA_MODULES]
    if unknown or not plan.lora_modules:
        bad(f"lora_modules: {unknown[0] if unknown else 'none given'} (the adapted linears are some of "
            f"{', '.join(LORA_MODULES)})")
    if plan.lora_modules != defaults.lora_modules and plan.finetune != "lora":
        bad("lora_modules needs --finetune lora")
    if plan.tp_comm_overlap and plan.tp == 1:
        bad("--tp-comm-overlap needs --tp > 1 (there is no TP communication to overlap)")
    most = max(chunk_sizes(model.layers, plan, mtp_layers(model))) if plan.recompute_layers else 0
    if plan.recompute_layers > most:
        bad(f"--recompute-layers {plan.recompute_layers} is more than the {most} layers of the largest pipeline "
            "chunk: give at most that, or 0 to recompute every layer")
    has = {"moe": moe is not None, "moe_act": moe is not None, "mla_up_proj": model.mla is not None,
           "shared_experts": moe is not None and moe.shared_experts > 0,
           "mlp": not all(model.is_moe_layer(i) for i in range(model.layers))}   # a dense layer's MLP
    missing = [m for m in plan.recompute_modules if not has.get(m, True)]
    if missing:
        bad(f"--recompute-modules {missing[0]}: {model.name} has no such module"
            + (" (every layer's FFN is experts: moe or moe_act)" if missing[0] == "mlp" else ""))
