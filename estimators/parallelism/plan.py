"""A parallelism plan (`ParallelPlan`), its validation, and the rank layout it implies.

Rank order follows Megatron-LM's default "tp-cp-dp-pp": tensor-parallel ranks are consecutive (inside one
node, on NVLink), then context-parallel, then data-parallel, then pipeline stages:
    rank = ((pp_idx * dp + dp_idx) * cp + cp_idx) * tp + tp_idx
Expert parallelism is carved out of the data-parallel dimension (ep consecutive dp indices form an EP group).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from chakra_schema.errors import TraceInputError
from estimators.model_config import ModelConfig

PRECISIONS = ("bf16", "fp8")
MAX_GPUS = 1 << 20   # the largest cluster a plan may span (1,048,576 GPUs): collectives are modelled up to it
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "unfused")


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

    def __post_init__(self) -> None:
        # cheap field checks only (the search builds ~100K plans/s); rules between fields and the model
        # are `validate_plan`'s
        try:
            ok = (self.tp >= 1 and self.pp >= 1 and self.cp >= 1 and self.dp >= 1 and self.ep >= 1
                  and self.vp >= 1 and self.seq_len >= 1 and self.global_batch >= 1 and self.micro_batch >= 1
                  and self.gpus_per_node >= 1 and self.dp_shard >= 0 and self.zero in (0, 1, 2, 3)
                  and self.precision in PRECISIONS and self.recompute in RECOMPUTE and self.attention in ATTENTION)
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

    def ep_group(self, rank: int) -> list[int]:
        p, d, c, t = self.coords(rank)
        base = d - d % self.ep
        return [self.rank(p, base + j, c, t) for j in range(self.ep)]

    def expert_dp_group(self, rank: int) -> list[int]:
        """Ranks holding the same experts (gradient group of expert parameters)."""
        p, d, c, t = self.coords(rank)
        return sorted(self.rank(p, j, cc, t) for j in range(d % self.ep, self.dp, self.ep) for cc in range(self.cp))

    def with_(self, **kw) -> "ParallelPlan":
        return replace(self, **kw)


def _reject_fields(plan: ParallelPlan) -> None:
    """Name the first bad field of a plan (the slow path of `ParallelPlan.__post_init__`)."""
    def bad(msg: str) -> None:
        raise TraceInputError(None, msg)

    for key in ("tp", "pp", "cp", "dp", "ep", "vp", "seq_len", "global_batch", "micro_batch", "gpus_per_node"):
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
    bad(f"--zero must be 0, 1, 2 or 3, got {plan.zero!r}")


def stage_layers(model: ModelConfig, plan: ParallelPlan) -> list[list[int]]:
    """Layer indices of each model chunk, chunk = virtual stage, in pipeline order (chunk j lives on stage
    j % pp, as its (j // pp)-th local chunk). Even split when layers divide by pp*vp; otherwise, following
    the Llama 3 405B recipe (126 layers on 16 stages), the first and the last chunk get one layer less when
    layers + 2 divides by pp*vp (they also hold the embedding and the output layer)."""
    chunks = plan.pp * plan.vp
    L = model.layers
    if L % chunks == 0:
        sizes = [L // chunks] * chunks
    elif chunks > 1 and (L + 2) % chunks == 0 and (L + 2) // chunks >= 2:
        per = (L + 2) // chunks
        sizes = [per] * chunks
        sizes[0] -= 1
        sizes[-1] -= 1
    else:
        raise TraceInputError(None, f"{L} layers do not divide into pp*vp = {chunks} pipeline chunks")
    out, start = [], 0
    for n in sizes:
        out.append(list(range(start, start + n)))
        start += n
    return out


def validate_plan(model: ModelConfig, plan: ParallelPlan, gpus: int | None = None) -> None:
    """Raise TraceInputError (one line) for a plan that cannot run."""
    def bad(msg: str) -> None:
        raise TraceInputError(None, msg)

    # the single fields were checked by ParallelPlan.__post_init__ (`_reject_fields`)
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
    if plan.dp % plan.ep:
        bad(f"ep {plan.ep} must divide dp {plan.dp}")
    if model.moe is not None and model.moe.num_experts % plan.ep:
        bad(f"{model.moe.num_experts} experts are not divisible by ep {plan.ep}")
    if plan.dp_shard and (plan.zero != 3 or plan.dp % plan.dp_shard):
        bad("--dp-shard (HSDP) needs --zero 3 and must divide dp")
