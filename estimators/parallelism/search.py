"""Fast parallelism-plan search: every candidate plan as a row of numpy columns, ranked by an analytic
step-time estimate and the memory model; only the best few are then simulated with the replay engine.

Passes, top-down:
1. Enumerate (`enumerate_candidates`): the layouts (tp within a node, cp, pp, vp, dp, ep) are a Python
   loop over divisors (a few hundred); every layout is crossed with the option grid (micro-batch size,
   recompute none/selective/full (op when asked for), ZeRO 0/1/2/3 and HSDP shard groups, sequence
   parallelism, and the overlap modes where they change anything: DP gradient overlap when there is a DP
   group, p2p overlap when there is a pipeline, async TP when TP runs without SP) as boolean masks over
   arrays. Equivalent
   plans are not repeated: selective recomputation with flash attention recomputes nothing (flash
   attention already drops the scores), ZeRO stages without a DP group shard nothing, SP without TP does
   nothing. The rules are those of `estimators.parallelism.plan.validate_plan`, vectorized.
2. Unit costs (`CostModel.pass_table`, `GroupComm`): the per-micro-batch time of one layer's forward / backward / recomputation,
   of the embedding and of the output layer, for each distinct (tp, cp, ep, micro-batch, SP, async TP)
   that occurs -- a few hundred -- by scheduling the generator's own op templates
   (`estimators.parallelism.workload`) on a compute stream and comm streams with the hardware's compute model (GEMM
   tiles, flash-attention efficiency) and network model (TP all-gather / reduce-scatter inside the node,
   CP ring exchange, EP all-to-all). Collectives of the DP and PP groups, whose sizes vary per plan, use
   the network model in closed form per group (intra-node NVLink or inter-node NIC paths, as the group's
   ranks sit): each (algorithm, protocol) pair is a line latency + bytes / bandwidth, and the time is
   the lowest line (`CollectiveLine`, `P2PLine`).
3. Memory (`memory_gib`): `estimators.parallelism.memory.estimate_memory` in closed form over the candidate arrays,
   stage by stage (weights, gradients, optimizer states under the ZeRO stage, activations in flight).
4. Step time (`estimate_step_s`): per pipeline stage the work of one micro-batch W_s (its layers, the
   embedding / output layer, exposed ZeRO-3 parameter gathers); the pipeline takes m * max W + the
   fill / drain (sum W - max W) / v, i.e. the bubble (p-1)/(v*m+p-1) for balanced stages; plus exposed
   p2p hops; then per stage the DP gradient reduction not hidden under the last micro-batch's backward,
   the optimizer step and the ZeRO-1/2 parameter all-gather (`StageTail`).
5. Rank (`rank_plans`): drop plans that do not fit in the GPU's memory, sort by estimated step time;
   `RankedPlans.plans(k)` / `top(k)` build `ParallelPlan` objects for the best k only
   (`estimators.parallelism.whatif.simulate_ranked` evaluates them as scenarios).

The estimate is no substitute for the replay (it does not see stage imbalance interplay, link sharing
or exact overlap); `tests/test_plan_search.py` checks that it ranks plans as the simulation does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType
from estimators.parallelism.memory import GIB, GRAD_BYTES, OPTIM_BYTES, WEIGHT_BYTES, layer_activation_bytes
from estimators.model_config import ModelConfig
from estimators.parallelism.plan import RECOMPUTE, ParallelPlan, mtp_layers, mtp_recomputed, stage_layers

RC_NONE, RC_SELECTIVE, RC_FULL, RC_OP = 0, 1, 2, 3
# The search holds plans as int64 numpy columns: a sequence length, batch or micro-batch past 2^31 (beyond any
# training run) would not fit them, and their products (tokens per step) stay exact below 2^62
MAX_SEARCH_SIZE = 1 << 31
# The most ranked plans a search simulates (--top-k, a sweep's search.max_plans): each is a full estimate
# (~0.1 s), so 1,000 is a couple of minutes; more would run for hours on a typo, not rank better.
MAX_SIMULATED_PLANS = 1000

SEARCHED_COLUMNS = ("tp", "pp", "cp", "dp", "ep", "vp", "micro_batch", "recompute", "zero", "dp_shard",
                    "sequence_parallel", "overlap_grad_reduce", "overlap_p2p", "async_tp_comm")
# Plan options the search does not enumerate but prices: a user's `--moe-capacity-factor 1` or
# `--moe-a2a deepep` holds for every candidate it ranks and simulates (SearchSpace.carry)
CARRIED_OPTIONS = ("moe_capacity_factor", "moe_a2a", "moe_force_balance", "moe_a2a_overlap", "fp8_recipe",
                   "cuda_graphs", "cuda_graph_scope", "attention_kernel", "fsdp", "fsdp_reduce_dtype",
                   "fsdp_defer_grad_sync", "fsdp_fp8_all_gather")
# Plan options the search neither holds its candidates to nor carries into them (by field, with their flag):
# a search given one would rank plans without it (a LoRA search ranking pre-training plans), so callers
# (the CLI's --search, a sweep's search axis) refuse them
UNSEARCHED_OPTIONS = {"finetune": "--finetune", "packed_doc_len": "--packed-doc-len", "lora_rank": "--lora-rank",
                      "recompute_modules": "--recompute-modules", "recompute_layers": "--recompute-layers",
                      "pipeline_layout": "--pipeline-layout", "first_stage_layers": "--first-stage-layers",
                      "last_stage_layers": "--last-stage-layers", "etp": "--etp", "dp_shard": "--dp-shard",
                      "tp_comm_overlap": "--tp-comm-overlap"}


def unsearched_options(plan: ParallelPlan) -> list[str]:
    """The flags of `UNSEARCHED_OPTIONS` that `plan` sets to other than their default."""
    default = ParallelPlan()
    return [flag for field, flag in UNSEARCHED_OPTIONS.items() if getattr(plan, field) != getattr(default, field)]


def zero3_options(carry: tuple[tuple[str, Any], ...], precision: str = "bf16") -> ParallelPlan:
    """A ZeRO-3 plan with the carried options: what the search's ZeRO-3 candidates reduce and gather (the
    FSDP implementation, its reduce dtype, FP8 gathers, deferred sync)."""
    return ParallelPlan(zero=3, precision=precision, **dict(carry))


def carried_options(plan: ParallelPlan) -> tuple[tuple[str, Any], ...]:
    """`plan`'s values of the options every searched candidate takes as given (SearchSpace.carry)."""
    return tuple((k, getattr(plan, k)) for k in CARRIED_OPTIONS)


# ============================================================================ 1. the candidate space
@dataclass(frozen=True)
class SearchSpace:
    """Which options the search enumerates (every valid combination of them)."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    # Megatron-Core's policies; PyTorch's per-op checkpointing ("op") only when asked for (--recompute op)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero: tuple[int, ...] = (0, 1, 2, 3)
    hsdp: bool = True                     # ZeRO-3 sharded within sub-groups of the DP ranks
    sequence_parallel: tuple[bool, ...] = (True, False)
    overlap_modes: bool = True            # also the non-overlapped DP / p2p / TP variants
    max_cp: int = 16
    min_cp_tokens: int = 1024             # no CP chunk shorter than this many tokens
    max_pp: int = 0                       # 0: up to the layer count
    attention: str = "flash"
    # plan options every candidate takes as given, not searched (`CARRIED_OPTIONS`: the MoE dispatcher,
    # capacity factor and overlap, the FP8 recipe, CUDA graphs, the attention kernel), as (name, value) pairs
    carry: tuple[tuple[str, Any], ...] = ()
    # layout constraints (e.g. `--tp 8` given with `--search`): only these degrees; empty: any
    tp: tuple[int, ...] = ()
    pp: tuple[int, ...] = ()
    cp: tuple[int, ...] = ()
    dp: tuple[int, ...] = ()
    ep: tuple[int, ...] = ()
    vp: tuple[int, ...] = ()

    @classmethod
    def keeping(cls, plan: ParallelPlan) -> "SearchSpace":
        """The whole space, every candidate keeping `plan`'s attention and its options a search takes as
        given (`carried_options`: the dispatcher, FP8 recipe, CUDA graphs, ...)."""
        return cls(attention=plan.attention, carry=carried_options(plan))

    @classmethod
    def constrained(cls, base: "SearchSpace | None" = None, **fixed: Any) -> "SearchSpace":
        """`base` with some plan fields fixed to one value each: tp, pp, cp, dp, ep, vp, micro_batch,
        recompute, zero, sequence_parallel (None: left free). A value the search cannot take is a one-line
        error naming the flag."""
        import dataclasses

        base = base or cls()
        kw: dict[str, Any] = {}
        for key, v in fixed.items():
            if v is None:
                continue
            flag = "--" + key.replace("_", "-")
            if key in ("tp", "pp", "cp", "dp", "ep", "vp", "micro_batch"):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise TraceInputError(None, f"{flag} must be an integer >= 1, got {v!r}")
                if v > MAX_SEARCH_SIZE:
                    raise TraceInputError(None, f"{flag} must be at most {MAX_SEARCH_SIZE:,} with --search, got {v}")
                kw["micro_batches" if key == "micro_batch" else key] = (v,)
            elif key == "zero":
                if v not in (0, 1, 2, 3):
                    raise TraceInputError(None, f"--zero must be 0, 1, 2 or 3, got {v!r}")
                kw["zero"] = (v,)
                if v != 3:
                    kw["hsdp"] = False
            elif key == "recompute":
                if v not in RECOMPUTE:
                    raise TraceInputError(None, f"--recompute must be one of {', '.join(RECOMPUTE)}, got {v!r}")
                kw["recompute"] = (v,)
            elif key == "sequence_parallel":
                kw["sequence_parallel"] = (bool(v),)
            else:
                raise ValueError(f"unknown search constraint {key!r}")
        return dataclasses.replace(base, **kw)

    def allows(self, key: str, value: int) -> bool:
        allowed = getattr(self, key)
        return not allowed or value in allowed


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _chunking_valid(model: ModelConfig, pp: int, vp: int) -> bool:
    try:
        stage_layers(model, ParallelPlan(pp=pp, vp=vp))
    except TraceInputError:
        return False
    return True


def enumerate_layouts(model: ModelConfig, gpus: int, seq_len: int, gpus_per_node: int,
                      space: SearchSpace) -> np.ndarray:
    """(n, 6) int array of valid (tp, pp, cp, dp, ep, vp) for `gpus`."""
    rows = []
    kv = model.n_kv
    max_pp = space.max_pp or model.layers
    for tp in _divisors(gpus):
        if tp > gpus_per_node or model.heads % tp or (model.mla is None and kv % tp and tp % kv):
            continue
        if not space.allows("tp", tp):
            continue
        for cp in _divisors(gpus // tp):
            if cp > space.max_cp or (cp > 1 and seq_len // cp < space.min_cp_tokens) or seq_len % cp:
                if not (space.cp and cp in space.cp and seq_len % cp == 0):   # a CP asked for is searched
                    continue
            if not space.allows("cp", cp):
                continue
            for pp in _divisors(gpus // (tp * cp)):
                if (pp > max_pp and not space.pp) or not space.allows("pp", pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if not space.allows("dp", dp):
                    continue
                eps = [1]
                if model.moe is not None:
                    eps = [e for e in _divisors(dp) if model.moe.num_experts % e == 0]
                eps = [e for e in eps if space.allows("ep", e)]
                vps = [1] + (list(range(2, (model.layers + 2) // pp + 1)) if pp > 1 else [])
                for vp in vps:
                    if not space.allows("vp", vp) or not _chunking_valid(model, pp, vp):
                        continue
                    rows.extend((tp, pp, cp, dp, ep, vp) for ep in eps)
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


def _option_grid(space: SearchSpace, max_dp: int) -> dict[str, np.ndarray]:
    """Every combination of the non-layout options (filtered per layout later)."""
    rc = [RECOMPUTE.index(r) for r in space.recompute]
    zero_shard = [(z, 0) for z in space.zero]
    if space.hsdp and 3 in space.zero:
        zero_shard += [(3, g) for g in (2 ** k for k in range(1, 32)) if g < max_dp]
    flags = (False, True) if space.overlap_modes else (True,)
    grid = np.array([(mb, r, z, g, sp, ogr, op2p, atp)
                     for mb in space.micro_batches for r in rc for z, g in zero_shard
                     for sp in space.sequence_parallel for ogr in flags for op2p in flags for atp in flags],
                    dtype=np.int64)
    names = ("micro_batch", "recompute", "zero", "dp_shard", "sequence_parallel", "overlap_grad_reduce",
             "overlap_p2p", "async_tp_comm")
    return {k: grid[:, i] for i, k in enumerate(names)}


def _option_mask(layout: tuple[int, ...], opt: dict[str, np.ndarray], seq_len: int, global_batch: int,
                 space: SearchSpace) -> np.ndarray:
    """Options valid for one layout (validate_plan's rules) and not equivalent to another kept one."""
    tp, pp, cp, dp, ep, vp = layout
    mb, sp, z, g = opt["micro_batch"], opt["sequence_parallel"].astype(bool), opt["zero"], opt["dp_shard"]
    ok = global_batch % (dp * mb) == 0
    m = global_batch // (dp * mb)
    if vp > 1:
        ok &= m % pp == 0
    ok &= seq_len % (cp * np.where(sp, tp, 1)) == 0
    ok &= (g == 0) | ((z == 3) & (dp % np.maximum(g, 1) == 0) & (g < dp))
    # equivalents: drop the duplicate
    if tp == 1:
        ok &= sp == space.sequence_parallel[0]
    if space.attention == "flash" and "none" in space.recompute:
        ok &= opt["recompute"] != RC_SELECTIVE
    if dp * cp == 1:
        ok &= (z == space.zero[0]) & (opt["overlap_grad_reduce"] == 1)
    if pp == 1:
        ok &= opt["overlap_p2p"] == 1
    ok &= (opt["async_tp_comm"] == 1) | ((tp > 1) & ~sp)
    return ok


def enumerate_candidates(model: ModelConfig, gpus: int, seq_len: int, global_batch: int,
                         gpus_per_node: int = 8, space: SearchSpace = SearchSpace()) -> dict[str, np.ndarray]:
    """Every valid plan of `gpus` as columns (see `SEARCHED_COLUMNS`), one row per plan."""
    layouts = enumerate_layouts(model, gpus, seq_len, gpus_per_node, space)
    opt = _option_grid(space, gpus)
    lay_idx, opt_idx = [], []
    for i, lay in enumerate(layouts):
        keep = np.flatnonzero(_option_mask(tuple(int(x) for x in lay), opt, seq_len, global_batch, space))
        lay_idx.append(np.full(len(keep), i, dtype=np.int64))
        opt_idx.append(keep)
    li = np.concatenate(lay_idx) if lay_idx else np.zeros(0, np.int64)
    oi = np.concatenate(opt_idx) if opt_idx else np.zeros(0, np.int64)
    cols = {k: layouts[li, j] for j, k in enumerate(("tp", "pp", "cp", "dp", "ep", "vp"))}
    cols.update({k: v[oi] for k, v in opt.items()})
    return cols


def plan_of_row(cols: dict[str, np.ndarray], i: int, seq_len: int, global_batch: int, precision: str,
                gpus_per_node: int, attention: str = "flash", carry: tuple[tuple[str, Any], ...] = ()) -> ParallelPlan:
    c = {k: int(v[i]) for k, v in cols.items() if k in SEARCHED_COLUMNS}
    if c["zero"] < 3:   # the FSDP options a user gave concern the ZeRO-3 candidates only
        carry = tuple((k, v) for k, v in carry if not k.startswith("fsdp"))
    return ParallelPlan(
        tp=c["tp"], pp=c["pp"], cp=c["cp"], dp=c["dp"], ep=c["ep"], vp=c["vp"], seq_len=seq_len,
        global_batch=global_batch, micro_batch=c["micro_batch"], precision=precision,
        recompute=RECOMPUTE[c["recompute"]], zero=c["zero"], dp_shard=c["dp_shard"],
        sequence_parallel=bool(c["sequence_parallel"]), attention=attention,
        overlap_grad_reduce=bool(c["overlap_grad_reduce"]), async_tp_comm=bool(c["async_tp_comm"]),
        overlap_p2p=bool(c["overlap_p2p"]), gpus_per_node=gpus_per_node, **dict(carry))


# ============================================================================ 2. unit costs
class _Lines:
    """A time that is the lowest of several lines latency + bytes x seconds-per-byte (us), zero for no
    bytes; evaluated over arrays of sizes."""

    lat: np.ndarray = np.zeros(1)
    per_byte: np.ndarray = np.zeros(1)

    def time_us(self, size_bytes: np.ndarray) -> np.ndarray:
        size = np.asarray(size_bytes, dtype=np.float64)
        t = np.min(self.lat[:, None] + self.per_byte[:, None] * size.ravel()[None, :], axis=0).reshape(size.shape)
        return np.where(size > 0, t, 0.0)


class CollectiveLine(_Lines):
    """A collective over one group in closed form: the network model's time for each (algorithm,
    protocol) is latency + bytes x seconds-per-byte (its flows scale linearly with the size); NCCL's
    tuner takes the fastest, so the time is the lowest of these lines."""

    def __init__(self, network, comm: CommType, ranks: tuple[int, ...]):
        from replay.hardware.network import ALGORITHMS, DirectAllToAll
        if len(ranks) < 2:
            return  # no communication: the zero line
        topo = network.topology
        names = network.algorithms_for(comm, ranks, auto_only=True) or (
            ["direct"] if comm in DirectAllToAll.ops else ["ring"])
        lat, slope = [], []
        s1, s2 = 1 << 20, 1 << 21
        for name in names:
            algo = ALGORITHMS[name]()
            for proto in network.hw.protocols:
                if proto.name not in algo.protocols:
                    continue
                t1 = algo.time_us(topo, comm, float(s1), ranks, proto)
                t2 = algo.time_us(topo, comm, float(s2), ranks, proto)
                slope.append((t2 - t1) / (s2 - s1))
                lat.append(t1 - slope[-1] * s1)
        self.lat, self.per_byte = np.array(lat), np.array(slope)


class P2PLine(_Lines):
    """A send/recv between two ranks: the lowest of the protocols' latency + bytes / path bandwidth."""

    def __init__(self, network, src: int, dst: int):
        topo = network.topology
        self.lat = np.array([p.base_latency_us + topo.hop_latency(src, dst, p) for p in network.hw.protocols])
        self.per_byte = np.array([topo.bandwidth_time([(src, dst, 1.0)], p) for p in network.hw.protocols])


def _template_span_us(tpl, rank: int, timing) -> float:
    """Schedule a generator template alone (entry at t=0) as the replay does: each op starts when its
    deps are done and its stream is free. An op with no deps at all (a CP ring receive) is posted ahead
    of the pass, during earlier ones: it only bounds the pass by its stream's total busy time.
    Returns the pass's span (us)."""
    from estimators.parallelism.workload import ENTRY
    ends: list[float] = []
    free: dict[int, float] = {}
    ahead: dict[int, float] = {}
    for _, slot, attrs, deps in tpl.ops:
        if not deps:
            ahead[slot] = ahead.get(slot, 0.0) + _op_us(attrs, rank, timing)
            ends.append(0.0)
            continue
        ready = max((ends[j] for j in deps if j != ENTRY), default=0.0)
        start = max(ready, free.get(slot, 0.0))
        ends.append(start + _op_us(attrs, rank, timing))
        free[slot] = ends[-1]
    return max(max(ends, default=0.0), max(ahead.values(), default=0.0))


def _op_us(attrs: dict, rank: int, timing) -> float:
    if "host_wait_us" in attrs:          # the GPU waiting for the host (workload.host_wait)
        return float(attrs["host_wait_us"])
    if "comm_type" in attrs:
        return timing.network.collective_us(CommType(attrs["comm_type"]), float(attrs["comm_size"]),
                                            attrs["pg_ranks"])
    if "comm_dst" in attrs:
        return timing.network.p2p_us(float(attrs["comm_size"]), attrs["comm_src"], attrs["comm_dst"])
    return timing.compute.op_estimate(attrs).time_us


@dataclass
class PassTimes:
    """Per micro-batch, us: one dense / MoE layer forward (F), backward (B), selective recompute (S);
    the embedding and the output layer (forward + backward)."""

    F: tuple[float, float]
    B: tuple[float, float]
    S: tuple[float, float]
    O: tuple[float, float]        # per-op selective checkpointing's recompute
    emb: float
    out: float
    emb_b: float
    out_b: float


def pass_times(model: ModelConfig, plan: ParallelPlan, timing, gpus_per_node: int) -> PassTimes:
    """The generator's per-pass templates for this plan's shapes, each scheduled alone."""
    from estimators.parallelism.workload import _RankBuilder, moe_layer_host_us
    rb = _RankBuilder(model, plan, 0, gpus_per_node)
    kinds = [next((i for i in range(model.layers) if model.is_moe_layer(i) == moe), None) for moe in (False, True)]

    def span(layer, pas):
        if layer is None:
            return 0.0
        if pas == "S" and plan.attention != "unfused":
            return 0.0
        return _template_span_us(rb.layer_template(layer, pas), 0, timing)

    def op_span(layer):   # per-op selective checkpointing's recompute (`--recompute op`)
        if layer is None:
            return 0.0
        return _template_span_us(rb_op.layer_template(layer, "S"), 0, timing)
    rb_op = _RankBuilder(model, plan.with_(recompute="op"), 0, gpus_per_node)

    F = tuple(span(i, "F") for i in kinds)
    B = tuple(span(i, "B") for i in kinds)
    # a host-bound MoE layer: its forward + backward take at least the host's time for them, the wait
    # falling in the backward, as the simulation's pacing wait does (workload.apply_host_pacing)
    B = (B[0], max(B[1], moe_layer_host_us(model, plan) - F[1]) if kinds[1] is not None else B[1])
    S = tuple(span(i, "S") for i in kinds)
    O = tuple(op_span(i) for i in kinds)
    ef = _template_span_us(rb.embedding_template(False), 0, timing)
    eb = _template_span_us(rb.embedding_template(True), 0, timing)
    of = _template_span_us(rb.output_template(False), 0, timing)
    ob = _template_span_us(rb.output_template(True), 0, timing)
    return PassTimes(F, B, S, O, ef + eb, of + ob, eb, ob)  # type: ignore[arg-type]


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys = np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)


# ============================================================================ 3. memory
@dataclass
class StageTable:
    """Per pipeline stage of one (pp, vp) chunking: parameter sums and layer counts (arrays over stages)."""

    shardable: np.ndarray     # parameters split by TP (dense layers; attention / router / norms of MoE layers)
    shared: np.ndarray        # shared-expert parameters (not tensor-parallel)
    experts: np.ndarray       # routed-expert parameters (split by EP)
    # largest layer's parameters by kind (ZeRO-3 working buffer: what a rank gathers of one layer), per stage:
    # dense layers' total (before /tp); MoE layers' TP-sharded, shared-expert and routed-expert parts
    biggest_dense: np.ndarray
    biggest_moe: np.ndarray   # [stage, (sharded, shared, routed)]
    dense_layers: np.ndarray  # layers of each kind, MTP modules (one more last layer each) included
    moe_layers: np.ndarray
    mtp_layers: np.ndarray    # of which MTP modules (on the last stage)


def stage_table(model: ModelConfig, pp: int, vp: int) -> StageTable:
    chunks = stage_layers(model, ParallelPlan(pp=pp, vp=vp))
    out = {k: np.zeros(pp) for k in ("shardable", "shared", "experts", "biggest_dense", "dense_layers", "moe_layers",
                                     "mtp_layers")}
    out["biggest_moe"] = np.zeros((pp, 3))
    for s in range(pp):
        layers = [i for j in range(s, pp * vp, pp) for i in chunks[j]]
        if s == pp - 1:   # MTP modules (one more last layer each) sit on the last stage, as estimate_memory has them
            layers = layers + [model.layers - 1] * mtp_layers(model)
            out["mtp_layers"][s] = mtp_layers(model)
        for i in layers:
            sharded, shared, experts = _layer_split(model, i)
            if model.is_moe_layer(i):
                out["biggest_moe"][s] = np.maximum(out["biggest_moe"][s], (sharded, shared, experts))
            else:
                out["biggest_dense"][s] = max(out["biggest_dense"][s], sharded)
            out["shardable"][s] += sharded
            out["shared"][s] += shared
            out["experts"][s] += experts
            out["moe_layers" if model.is_moe_layer(i) else "dense_layers"][s] += 1
    return StageTable(**out)


def _activation_bytes(model: ModelConfig, cols: dict[str, np.ndarray], seq_len: int,
                      attention: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate: bytes one dense / one MoE layer / one MTP module (recomputed with the rest: the search's
    full recompute is the uniform method, plan.mtp_recomputed) keeps per micro-batch
    (memory.layer_activation_bytes evaluated once per distinct (tp, cp, micro-batch, SP, recompute))."""
    uniq, inv = _unique_rows(cols["tp"], cols["cp"], cols["micro_batch"], cols["sequence_parallel"], cols["recompute"])
    dense_i = next((i for i in range(model.layers) if not model.is_moe_layer(i)), None)
    moe_i = next((i for i in range(model.layers) if model.is_moe_layer(i)), None)
    d, m, t = np.zeros(len(uniq)), np.zeros(len(uniq)), np.zeros(len(uniq))
    for u, (tp, cp, mb, sp, rc) in enumerate(uniq):
        p = ParallelPlan(tp=int(tp), cp=int(cp), micro_batch=int(mb), seq_len=seq_len, sequence_parallel=bool(sp),
                         recompute=RECOMPUTE[int(rc)], attention=attention)
        d[u] = layer_activation_bytes(model, p, dense_i) if dense_i is not None else 0.0
        m[u] = layer_activation_bytes(model, p, moe_i) if moe_i is not None else 0.0
        t[u] = layer_activation_bytes(model, p, model.layers - 1, mtp_recomputed(p)) if mtp_layers(model) else 0.0
    return d[inv], m[inv], t[inv]


def in_flight(m: np.ndarray, pp: int, vp: int, stage: int) -> np.ndarray:
    """Micro-batches (of one chunk) whose activations stage `stage` holds at its peak (1F1B / interleaved)."""
    if vp == 1:
        return np.minimum(m, pp - stage)
    return np.minimum(m * vp, (pp - stage - 1) * 2 + (vp - 1) * pp + 1)


def memory_gib(model: ModelConfig, cols: dict[str, np.ndarray], seq_len: int, global_batch: int,
               attention: str = "flash", tables: dict | None = None,
               zero3: ParallelPlan | None = None) -> np.ndarray:
    """Peak memory per GPU (GiB) of every candidate: `estimate_memory`'s most loaded stage, vectorized;
    `zero3`: the carried options (`zero3_options`), for FSDP2's states under ZeRO-3."""
    z3p = zero3 or zero3_options(())
    fsdp2 = z3p.fsdp == "fsdp2"
    n = len(cols["tp"])
    out = np.zeros(n)
    act_d, act_m, act_mtp = _activation_bytes(model, cols, seq_len, attention)
    last_is_moe = model.is_moe_layer(model.layers - 1)
    tp = cols["tp"].astype(np.float64)
    shard = np.where(cols["dp_shard"] > 0, cols["dp_shard"], cols["dp"]) * cols["cp"]
    z = cols["zero"]
    m = global_batch // (cols["dp"] * cols["micro_batch"])
    s_tok = seq_len / cols["cp"] * cols["micro_batch"]
    emb = model.vocab * model.hidden / tp
    pos = model.max_seq * model.hidden if model.position == "learned" else 0
    tables = {} if tables is None else tables
    for (pp, vp), idx in _groups(cols["pp"], cols["vp"]):
        st = tables.setdefault((pp, vp), stage_table(model, pp, vp))
        t, ep = tp[idx], cols["ep"][idx]
        # expert parameters shard their ZeRO states over the expert-data-parallel ranks (tp*cp*dp/ep; the search
        # enumerates ETP 1 only, so an expert grid is EP alone here)
        esh = np.maximum(cols["tp"][idx] * cols["cp"][idx] * cols["dp"][idx] // ep, 1)
        for s in range(pp):
            dense = st.shardable[s] / t + st.shared[s]
            expert = st.experts[s] / ep
            if s == 0:
                dense = dense + emb[idx] + pos
            if s == pp - 1 and (not model.tied_embeddings or pp > 1):
                dense = dense + emb[idx]
            sh, zz = shard[idx], z[idx]
            w = (dense + expert) * WEIGHT_BYTES
            g = np.where(zz >= 2, dense / sh + expert / esh, dense + expert) * GRAD_BYTES
            o = np.where(zz >= 1, dense / sh + expert / esh, dense + expert) * OPTIM_BYTES
            b_sharded, b_shared, b_routed = st.biggest_moe[s]
            biggest = np.maximum(st.biggest_dense[s] / t, b_sharded / t + b_shared + b_routed / ep)
            w = np.where(zz >= 3, (dense / sh + expert / esh + 2 * biggest) * WEIGHT_BYTES, w)
            if fsdp2:   # as estimate_memory: no 16-bit shard; PP keeps the stage gathered; deferred sync
                gb, rb = float(z3p.fsdp_gather_bytes), float(z3p.fsdp_reduce_bytes)
                unsharded = dense * (sh > 1) + expert * (esh > 1)   # a group of one rank: nothing to gather
                kept = unsharded * gb if pp > 1 else 2 * biggest * gb
                defer = (z3p.fsdp_defer_grad_sync or pp > 1) & (m[idx] > 1)
                w = np.where(zz >= 3, kept, w)
                g = np.where(zz >= 3, g + np.where(defer, unsharded * rb, biggest * rb), g)
            fl = in_flight(m[idx], pp, vp, s)
            # an MTP module is one more last layer (its activations as estimate_memory has them), counted apart
            nd = st.dense_layers[s] - (0 if last_is_moe else st.mtp_layers[s])
            nm = st.moe_layers[s] - (st.mtp_layers[s] if last_is_moe else 0)
            act = fl * (nd * act_d[idx] + nm * act_m[idx] + st.mtp_layers[s] * act_mtp[idx]) / vp
            if s == 0:
                act = act + fl * 2 * s_tok[idx] * model.hidden / t
            if s == pp - 1:
                act = act + 4.0 * s_tok[idx] * model.vocab / t
            out[idx] = np.maximum(out[idx], (w + g + o + act) / GIB)
    return out


def _groups(*cols: np.ndarray):
    """(key tuple, row indices) of each distinct combination of the columns."""
    uniq, inv = _unique_rows(*cols)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
    for u in range(len(uniq)):
        yield tuple(int(x) for x in uniq[u]), order[bounds[u]:bounds[u + 1]]


# ============================================================================ 4. step time
class CostModel:
    """The hardware's compute and network models, memoized for the search: pass times per distinct
    shape, collective lines per distinct group."""

    def __init__(self, model: ModelConfig, hardware, seq_len: int, precision: str, attention: str = "flash",
                 carry: tuple[tuple[str, Any], ...] = ()):
        from estimators.parallelism.timing import default_timing, resolve_hardware
        self.model, self.hw = model, resolve_hardware(hardware)
        self.seq_len, self.precision, self.attention = seq_len, precision, attention
        self.carry = carry          # SearchSpace.carry: options every candidate takes as given
        self.zero3 = zero3_options(carry, precision)
        self.gpn = self.hw.node.gpus_per_node
        self.timing = default_timing(self.hw)
        self._lines: dict[tuple, CollectiveLine] = {}
        self._p2p: dict[int, P2PLine] = {}

    def collective(self, comm: CommType, ranks) -> CollectiveLine:
        key = (comm, tuple(ranks))
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = CollectiveLine(self.timing.network, comm, key[1])
        return line

    def p2p(self, dst: int) -> P2PLine:
        line = self._p2p.get(dst)
        if line is None:
            line = self._p2p[dst] = P2PLine(self.timing.network, 0, dst)
        return line

    def pass_table(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per candidate, us per micro-batch: F/B/S of a dense (_d) and a MoE (_m) layer, emb, out
        (forward + backward), emb_b, out_b (backward only)."""
        uniq, inv = _unique_rows(cols["tp"], cols["cp"], cols["ep"], cols["micro_batch"],
                                 cols["sequence_parallel"], cols["async_tp_comm"])
        vals = np.zeros((len(uniq), 12))
        for u, (tp, cp, ep, mb, sp, atp) in enumerate(uniq):
            plan = ParallelPlan(tp=int(tp), cp=int(cp), dp=int(ep), ep=int(ep), seq_len=self.seq_len,
                                global_batch=int(ep * mb), micro_batch=int(mb), precision=self.precision,
                                sequence_parallel=bool(sp), async_tp_comm=bool(atp), attention=self.attention,
                                gpus_per_node=self.gpn, **dict(self.carry))
            t = pass_times(self.model, plan, self.timing, self.gpn)
            vals[u] = (*t.F, *t.B, *t.S, *t.O, t.emb, t.out, t.emb_b, t.out_b)
        names = ("F_d", "F_m", "B_d", "B_m", "S_d", "S_m", "O_d", "O_m", "emb", "out", "emb_b", "out_b")
        return {k: vals[inv, i] for i, k in enumerate(names)}


def _layer_split(model: ModelConfig, i: int) -> tuple[float, float, float]:
    """(TP-sharded, shared-expert, routed-expert) parameters of layer i (`ModelConfig.layer_param_split`)."""
    return tuple(float(x) for x in model.layer_param_split(i))


def _layer_params(model: ModelConfig, moe: bool) -> tuple[float, float, float]:
    """`_layer_split` of the first dense / MoE layer (zeros when the model has none)."""
    i = next((i for i in range(model.layers) if model.is_moe_layer(i) == moe), None)
    return (0.0, 0.0, 0.0) if i is None else _layer_split(model, i)


@dataclass
class _GroupLines:
    """The DP-side collectives of one group layout: gradient reduction (a reduce-scatter or all-reduce,
    HSDP adds an all-reduce across replicas of 1/shard of the bytes), expert gradients, ZeRO gathers."""

    grad: list[tuple[_Lines, float]]
    expert_grad: _Lines
    gather: _Lines
    expert_gather: _Lines


class GroupComm:
    """DP / expert-DP communication of every candidate: one `_GroupLines` per distinct group layout
    ((tp, cp, dp, ep, dp_shard, ZeRO or not) fixes every group's ranks), evaluated over arrays."""

    def __init__(self, cm: CostModel, cols: dict[str, np.ndarray]):
        uniq, self.inv = _unique_rows(cols["tp"], cols["cp"], cols["dp"], cols["ep"], cols["dp_shard"],
                                      np.minimum(cols["zero"], 1))
        self.lines = [self._layout(cm, *(int(x) for x in u)) for u in uniq]

    @staticmethod
    def _layout(cm: CostModel, tp: int, cp: int, dp: int, ep: int, shard: int, zero: int) -> _GroupLines:
        p = ParallelPlan(tp=tp, cp=cp, dp=dp, ep=ep, dp_shard=shard, zero=3 if shard else zero)
        dpg, edp = p.dp_group(0), p.expert_dp_group(0)
        shard_g = p.dp_shard_group(0) if shard else dpg
        if zero == 0:
            grad = [(cm.collective(CommType.ALL_REDUCE, dpg), 1.0)]
        else:
            grad = [(cm.collective(CommType.REDUCE_SCATTER, shard_g), 1.0)]
            if shard and shard < dp:
                grad.append((cm.collective(CommType.ALL_REDUCE, p.dp_replica_group(0)), 1.0 / len(shard_g)))
        return _GroupLines(grad, cm.collective(CommType.REDUCE_SCATTER if zero else CommType.ALL_REDUCE, edp),
                           cm.collective(CommType.ALL_GATHER, shard_g), cm.collective(CommType.ALL_GATHER, edp))

    def _eval(self, rows: np.ndarray, size: np.ndarray, which: str) -> np.ndarray:
        out = np.zeros(len(rows))
        g = self.inv[rows]
        for u in np.unique(g):
            sel = g == u
            lines = getattr(self.lines[u], which)
            if which == "grad":
                out[sel] = sum(line.time_us(size[sel] * frac) for line, frac in lines)
            else:
                out[sel] = lines.time_us(size[sel])
        return out

    def grad_us(self, rows: np.ndarray, size: np.ndarray) -> np.ndarray:
        return self._eval(rows, size, "grad")

    def expert_grad_us(self, rows: np.ndarray, size: np.ndarray) -> np.ndarray:
        return self._eval(rows, size, "expert_grad")

    def gather_us(self, rows: np.ndarray, size: np.ndarray) -> np.ndarray:
        return self._eval(rows, size, "gather")

    def expert_gather_us(self, rows: np.ndarray, size: np.ndarray) -> np.ndarray:
        return self._eval(rows, size, "expert_gather")


def pipeline_hop_us(cm: CostModel, cols: dict[str, np.ndarray]) -> np.ndarray:
    """One micro-batch's activations (or gradients) to the next stage: all of them with SP's sharding,
    or 1/tp of them and an NVLink all-gather on arrival without SP (Megatron's scatter/gather)."""
    tp = cols["tp"]
    sp = cols["sequence_parallel"].astype(bool) & (tp > 1)
    act = cols["micro_batch"] * (cm.seq_len // cols["cp"]) * cm.model.hidden * 2.0
    scatter_gather = (tp > 1) & ~sp
    nbytes = np.where(sp | scatter_gather, act / tp, act)
    hop = np.zeros(len(tp))
    stride = tp * cols["cp"] * cols["dp"]        # the next stage's rank
    for (dst, t), idx in _groups(np.where(cols["pp"] > 1, stride, 0), tp):
        if dst == 0:
            continue
        hop[idx] = cm.p2p(dst).time_us(nbytes[idx])
        if t > 1:
            gather = cm.collective(CommType.ALL_GATHER, tuple(range(t))).time_us(act[idx])
            hop[idx] += np.where(scatter_gather[idx], gather, 0.0)
    return hop


@dataclass
class LayerTimes:
    """Per candidate, us per micro-batch, of a dense (d) / MoE (m) layer: `layer` = forward + recompute +
    backward + exposed ZeRO-3 gathers, `back` = recompute + backward; `bucket` = its DP gradient reduction."""

    layer: dict[str, np.ndarray]
    back: dict[str, np.ndarray]
    bucket: dict[str, np.ndarray]


def layer_times(model: ModelConfig, pt: dict[str, np.ndarray], comm: GroupComm,
                cols: dict[str, np.ndarray], zero3: ParallelPlan | None = None) -> LayerTimes:
    rows = np.arange(len(cols["tp"]))
    tp = cols["tp"].astype(np.float64)
    z3 = cols["zero"] >= 3
    z3p = zero3 or zero3_options(())    # the carried FSDP options (reduce dtype, FP8 gathers)
    grad_b = np.where(z3, float(z3p.fsdp_reduce_bytes), 4.0)
    rc = cols["recompute"]
    layer, back, bucket = {}, {}, {}
    for k, moe in (("d", False), ("m", True)):
        sharded, shared, experts = _layer_params(model, moe)
        dense, expert = sharded / tp + shared, experts / cols["ep"]
        if not any(model.is_moe_layer(i) == moe for i in range(model.layers)):
            layer[k] = back[k] = bucket[k] = np.zeros(len(rows))
            continue
        bucket[k] = comm.grad_us(rows, dense * grad_b) + (comm.expert_grad_us(rows, expert * grad_b) if moe else 0.0)
        gather = np.where(z3, comm.gather_us(rows, (dense + expert) * float(z3p.fsdp_gather_bytes)), 0.0)
        every = 0.0
        if z3p.fsdp == "fsdp2":
            pp1 = cols["pp"] == 1
            # under PP FSDP2 keeps a stage gathered (one gather a step); without it, unless deferred, it
            # reduce-scatters every micro-batch's gradients beside the backward's gathers
            gather = np.where(pp1, gather, 0.0)
            if not z3p.fsdp_defer_grad_sync:
                every = np.where(z3 & pp1, bucket[k], 0.0)
        f, b = pt[f"F_{k}"], pt[f"B_{k}"]
        back[k] = b + np.where(rc == RC_FULL, f, np.where(rc == RC_SELECTIVE, pt[f"S_{k}"],
                                                          np.where(rc == RC_OP, pt[f"O_{k}"], 0.0)))
        # a ZeRO-3 layer gather is prefetched one layer ahead, from the start of the layer's forward or
        # backward (after its recomputation): only the part longer than that pass shows
        layer[k] = f + back[k] + np.maximum(gather - f, 0) + np.maximum(gather + every - b, 0)
    return LayerTimes(layer, back, bucket)


def _stage_work(st: StageTable, s: int, pp: int, lt: LayerTimes, pt: dict[str, np.ndarray],
                idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(all passes, backward passes) of one micro-batch on stage s, us."""
    nd, nm = st.dense_layers[s], st.moe_layers[s]
    w = nd * lt.layer["d"][idx] + nm * lt.layer["m"][idx]
    wb = nd * lt.back["d"][idx] + nm * lt.back["m"][idx]
    if s == 0:
        w, wb = w + pt["emb"][idx], wb + pt["emb_b"][idx]
    if s == pp - 1:
        w, wb = w + pt["out"][idx], wb + pt["out_b"][idx]
    return w, wb


def _pipeline_us(W: np.ndarray, m: np.ndarray, vp: int, hop: np.ndarray, overlap_p2p: np.ndarray) -> np.ndarray:
    """(Interleaved) 1F1B over stages with per-micro-batch work W[stage]: m times the slowest stage plus
    the fill and drain through the others, 1/vp of it with virtual stages; plus the exposed p2p: the
    fill/drain hops when overlapped, else (2021 Megatron) a wait at every communication point: after each
    pass (1F1B), or after each forward+backward pair in the steady state and each warm-up / cool-down
    pass (interleaved)."""
    pp = W.shape[0]
    pipe = m * W.max(axis=0) + (W.sum(axis=0) - W.max(axis=0)) / vp
    waits = 2 * m if vp == 1 else m * vp + 2 * (pp - 1) + (vp - 1) * pp
    return pipe + np.where(overlap_p2p == 1, 2 * (pp - 1) * hop, waits * hop)


class StageTail:
    """What follows a stage's last backward: DP gradient reduction not hidden under it, the optimizer
    step over the stage's (sharded) parameters, the ZeRO-1/2 parameter all-gather (us)."""

    def __init__(self, cm: CostModel, cols: dict[str, np.ndarray], comm: GroupComm, lt: LayerTimes):
        model, hw = cm.model, cm.hw
        self.model, self.cols, self.comm, self.lt = model, cols, comm, lt
        rows = np.arange(len(cols["tp"]))
        self.tp = cols["tp"].astype(np.float64)
        grad_b = np.where(cols["zero"] >= 3, float(cm.zero3.fsdp_reduce_bytes), 4.0)
        self.emb = model.vocab * model.hidden / self.tp
        pos = model.max_seq * model.hidden if model.position == "learned" else 0
        self.emb_grad = comm.grad_us(rows, (self.emb + pos) * grad_b)
        self.out_grad = comm.grad_us(rows, self.emb * grad_b)
        z = cols["zero"]
        self.shard = np.where(z >= 1, np.where(cols["dp_shard"] > 0, cols["dp_shard"], cols["dp"]) * cols["cp"], 1)
        self.eshard = np.where(z >= 1, cols["dp"] // cols["ep"] * cols["cp"], 1)
        # Adam over fp32 states: memory-bound (workload.OPTIM_BYTES_PER_PARAM / _FLOPS_PER_PARAM)
        self.opt_us_per_param = max(30.0 / hw.hbm_bytes_per_us, 12.0 / (hw.peak_flops("fp32") / 1e6))
        self.min_kernel_us = hw.compute.min_kernel_us

    def __call__(self, idx: np.ndarray, st: StageTable, s: int, pp: int, wb: np.ndarray) -> np.ndarray:
        cols, lt, model = self.cols, self.lt, self.model
        nd, nm = st.dense_layers[s], st.moe_layers[s]
        out_layer = s == pp - 1 and (not model.tied_embeddings or pp > 1)
        grads = nd * lt.bucket["d"][idx] + nm * lt.bucket["m"][idx]
        last = np.where(nd > 0, lt.bucket["d"][idx], lt.bucket["m"][idx])
        if s == 0:
            grads, last = grads + self.emb_grad[idx], self.emb_grad[idx]
        if out_layer:
            grads = grads + self.out_grad[idx]
        # buckets go out as the last micro-batch's backward of each layer ends
        window = np.maximum(wb - np.where(nd > 0, lt.back["d"][idx], lt.back["m"][idx]), 0.0)
        exposed = np.where(cols["overlap_grad_reduce"][idx] == 1, np.maximum(grads - window, last), grads)
        exposed = np.where(cols["dp"][idx] * cols["cp"][idx] > 1, exposed, 0.0)
        params = st.shardable[s] / self.tp[idx] + st.shared[s] + self.emb[idx] * ((s == 0) + out_layer)
        experts = st.experts[s] / cols["ep"][idx]
        opt = np.maximum((params / self.shard[idx] + experts / self.eshard[idx]) * self.opt_us_per_param,
                         self.min_kernel_us)
        z12 = (cols["zero"][idx] >= 1) & (cols["zero"][idx] <= 2) & (self.shard[idx] > 1)
        gather = np.where(z12, self.comm.gather_us(idx, params * 2.0), 0.0)
        if st.experts[s] > 0:
            gather += np.where(z12 & (self.eshard[idx] > 1), self.comm.expert_gather_us(idx, experts * 2.0), 0.0)
        return exposed + opt + gather


def estimate_step_s(cm: CostModel, cols: dict[str, np.ndarray], global_batch: int,
                    tables: dict | None = None) -> np.ndarray:
    """Estimated step time (s) of every candidate (see the module docstring, pass 4)."""
    model = cm.model
    pt = cm.pass_table(cols)
    comm = GroupComm(cm, cols)
    hop = pipeline_hop_us(cm, cols)
    lt = layer_times(model, pt, comm, cols, cm.zero3)
    tail = StageTail(cm, cols, comm, lt)
    m = (global_batch // (cols["dp"] * cols["micro_batch"])).astype(np.float64)
    step = np.zeros(len(m))
    tables = {} if tables is None else tables
    for (pp, vp), idx in _groups(cols["pp"], cols["vp"]):
        st = tables.setdefault((pp, vp), stage_table(model, pp, vp))
        work = [_stage_work(st, s, pp, lt, pt, idx) for s in range(pp)]
        pipe = _pipeline_us(np.array([w for w, _ in work]), m[idx], vp, hop[idx], cols["overlap_p2p"][idx])
        # the last backward reaches stage 0 last: stage s has finished earlier by the backward hops below it
        slack = np.zeros(len(idx))
        for s, (_, wb) in enumerate(work):
            step[idx] = np.maximum(step[idx], pipe - slack + tail(idx, st, s, pp, wb))
            slack += wb / vp + hop[idx]
    return step / 1e6


# ============================================================================ 5. ranking
@dataclass
class RankedPlans:
    """Every enumerated candidate with its estimate; `order` lists the fitting ones, fastest first."""

    model: ModelConfig
    hardware: Any
    gpus: int
    seq_len: int
    global_batch: int
    precision: str
    attention: str
    columns: dict[str, np.ndarray]
    step_s: np.ndarray              # estimated step time of every candidate
    memory_gib: np.ndarray
    capacity_gib: float
    order: np.ndarray               # indices of the candidates that fit, best first
    wall_s: float = 0.0
    timings_s: dict[str, float] = field(default_factory=dict)
    carry: tuple[tuple[str, Any], ...] = ()    # SearchSpace.carry

    @property
    def candidates(self) -> int:
        return len(self.step_s)

    @property
    def fitting(self) -> int:
        return len(self.order)

    @property
    def plans_per_s(self) -> float:
        return self.candidates / self.wall_s if self.wall_s > 0 else 0.0

    def plan(self, i: int) -> ParallelPlan:
        """The `ParallelPlan` of candidate row i."""
        return plan_of_row(self.columns, i, self.seq_len, self.global_batch, self.precision,
                           self.hardware.node.gpus_per_node, self.attention, self.carry)

    def plans(self, k: int | None = None) -> list[ParallelPlan]:
        """The best k fitting plans (all of them for None), best first."""
        rows = self.order if k is None else self.order[:k]
        return [self.plan(int(i)) for i in rows]

    def top(self, k: int, distinct: bool = True) -> np.ndarray:
        """Rows of the best k fitting plans. `distinct`: skip a plan whose estimated step time and memory
        both equal those of a better-ranked one (plans whose differences the estimate does not see), so the k
        simulations are spent on k different outcomes."""
        if not distinct:
            return self.order[:k]
        rows: list[int] = []
        seen: set[tuple[float, float]] = set()
        for i in self.order:
            key = (round(float(self.step_s[i]), 9), round(float(self.memory_gib[i]), 6))
            if key in seen:
                continue
            seen.add(key)
            rows.append(int(i))
            if len(rows) == k:
                break
        return np.array(rows, dtype=np.int64)

    def tokens_per_s(self) -> np.ndarray:
        return self.global_batch * self.seq_len / self.step_s


def rank_plans(model: ModelConfig, hardware, gpus: int, seq_len: int, global_batch: int,
               precision: str = "bf16", space: SearchSpace = SearchSpace()) -> RankedPlans:
    """Enumerate every valid plan of `gpus`, estimate its memory and step time, rank those that fit."""
    from estimators.parallelism.timing import check_precision_support, resolve_hardware
    if gpus < 1 or seq_len < 1 or global_batch < 1:
        raise TraceInputError(None, "the search needs gpus, seq_len and global_batch >= 1")
    for flag, v in (("--seq-len", seq_len), ("--global-batch", global_batch)):
        if v > MAX_SEARCH_SIZE:
            raise TraceInputError(None, f"{flag} must be at most {MAX_SEARCH_SIZE:,} with --search, got {v}")
    t0 = time.perf_counter()
    hw = resolve_hardware(hardware)
    check_precision_support(hw, precision, dict(space.carry).get("fp8_recipe", ParallelPlan.fp8_recipe))
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        timings[name] = now - since
        return now

    cols = enumerate_candidates(model, gpus, seq_len, global_batch, hw.node.gpus_per_node, space)
    t = lap("enumerate", t0)
    tables: dict = {}
    mem = memory_gib(model, cols, seq_len, global_batch, space.attention, tables, zero3_options(space.carry, precision))
    cap = hw.gpu.memory_gb * 1e9 / GIB
    t = lap("memory", t)
    fits = np.flatnonzero(mem <= cap)
    step = np.full(len(mem), np.inf)
    if len(fits):
        sub = {k: v[fits] for k, v in cols.items()}
        cm = CostModel(model, hw, seq_len, precision, space.attention, space.carry)
        step[fits] = estimate_step_s(cm, sub, global_batch, tables)
    t = lap("step_time", t)
    # ties (e.g. plans that differ only where the estimate is blind) keep enumeration order
    order = fits[np.argsort(step[fits], kind="stable")]
    lap("rank", t)
    return RankedPlans(model, hw, gpus, seq_len, global_batch, precision, space.attention, cols, step, mem, cap,
                       order, time.perf_counter() - t0, timings, space.carry)
