"""What-if parallelism: model + plan + hardware -> predicted step time, throughput, MFU, memory.

The prediction is a replay: `estimators.parallelism.workload.generate` builds per-rank graphs (one representative
rank per pipeline stage by default), `replay.api.replay` runs them with the hardware's model timing
(`replay.model_timing.ModelTiming`), and the step time is the slowest simulated rank's makespan.
No per-configuration fitting: every efficiency comes from the hardware preset.

FLOP conventions (per step):
- model FLOPs = tokens x `megatron_flops_per_token` (the project's one convention, Megatron-Core's: causal
  attention as half the square, MTP counted; LoRA's frozen matmuls at 2/3, packed SFT's attention over its
  documents; estimators/model_config.py). Gives `tflops_per_gpu`, `mfu`.
- hardware FLOPs = tokens x (6 x active matmul parameters (4 x under LoRA: no weight gradients for the frozen
  base) + 3 x full-square attention forward, over the packed documents for SFT) + the
  recomputed forward (full: every layer's matmuls and attention; selective: the attention core; op: every
  second matmul of each block), i.e.
  Narayanan et al. 2021's 96*B*s*l*h^2*(1 + s/6h + V/16lh) for GPT with full recomputation. Gives
  `hw_tflops_per_gpu`.
"""
from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import ExecutionGraph
from estimators.parallelism.memory import MemoryEstimate, estimate_memory, hbm_capacity_gib
from replay.results import Breakdown
from estimators.model_config import ModelConfig, megatron_flops_per_token
from estimators.parallelism.plan import ParallelPlan, mtp_layers, mtp_recomputed, selective_modules, validate_plan
from estimators.parallelism.timing import check_precision_support, default_timing, resolve_hardware  # noqa: F401 (API)
from estimators.parallelism.workload import MOE_SYNC_IDLE_US, generate, moe_layer_host_us


@dataclass
class PlanPrediction:
    model: str
    hardware: str
    plan: ParallelPlan
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    mfu: float
    memory: MemoryEstimate
    breakdown: StepBreakdown
    num_nodes: int
    simulated_ranks: int
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def oom(self) -> bool:
        return self.memory.oom

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {
            "model": self.model, "hardware": self.hardware, "gpus": p.gpus,
            # every plan field (a JSON consumer tells HybridEP from all-to-all, ETP, FP8 recipe, ...), with
            # sequence parallelism as it runs (only with TP) and the micro-batches per step
            "plan": {**asdict(p), "micro_batches": p.micro_batches,
                     "sequence_parallel": p.sequence_parallel and p.tp > 1},
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu, "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
            "mfu": self.mfu, "memory_gib_per_gpu": self.memory.total_gib, "oom": self.oom,
            "memory": self.memory.to_json(), "memory_breakdown_gib": self.memory.breakdown_gib(),
            "breakdown": legacy_breakdown_json(self.breakdown),
            "simulated_ranks": self.simulated_ranks, "num_nodes": self.num_nodes, "wall_s": self.wall_s,
            **self.extra,
        }


# ------------------------------------------------------------------------------------ FLOPs
def _attention_seq(plan: ParallelPlan) -> int:
    """Keys per query attention runs over: packed fine-tuning sequences attend within their documents."""
    return plan.packed_doc_len if plan.finetune != "none" and plan.packed_doc_len else plan.seq_len


def model_flops_per_step(model: ModelConfig, plan: ParallelPlan) -> float:
    """Model FLOPs of a step in the project's convention (Megatron-Core's); fine-tuning as Megatron-Bridge
    counts it: LoRA's frozen matmuls without weight gradients (2/3), packed SFT's attention over its
    documents (sum s_i^2 / sum s_i = the document length)."""
    per_token = megatron_flops_per_token(model, plan.seq_len, attention_seq=_attention_seq(plan),
                                         frozen=plan.finetune == "lora")
    return per_token * plan.global_batch * plan.seq_len


def hw_flops_per_step(model: ModelConfig, plan: ParallelPlan) -> float:
    """FLOPs as executed: attention over the full square (of the packed documents), recomputation, LoRA's
    frozen weights without weight-gradient matmuls (the adapters' are negligible), the MTP modules (each a
    layer of the last layer's kind, its 2h -> h projection and another pass through the output head)."""
    tokens = plan.global_batch * plan.seq_len
    mtp, h = mtp_layers(model), model.hidden
    layer_attn = model.attention_flops_fwd_per_token(_attention_seq(plan)) / model.layers   # per layer, mean
    attn_fwd = layer_attn * (model.layers + mtp)
    mtp_body = model.mtp_module_matmul_params()
    matmul = model.matmul_params_active() + mtp * (mtp_body + model.vocab * h)
    f = tokens * ((4.0 if plan.finetune == "lora" else 6.0) * matmul + 3.0 * attn_fwd)
    if plan.recompute == "full":
        # the layers' forward again (the MTP modules' too where they are recomputed), not the output heads
        again = mtp if mtp_recomputed(plan) else 0
        layer_matmul = model.matmul_params_active() - model.vocab * h + again * mtp_body
        f += tokens * (2.0 * layer_matmul + layer_attn * (model.layers + again))
    elif plan.recompute == "selective":
        f += tokens * _selective_recompute_flops_per_token(model, plan, layer_attn * model.layers)
    elif plan.recompute == "op":   # the even-numbered matmuls of every block, the routed experts (op_checkpoint)
        from estimators.parallelism.op_checkpoint import recomputed_matmuls
        f += tokens * sum(2.0 * mm.out * mm.inp for i in range(model.layers) for mm in recomputed_matmuls(model, i))
        if model.moe is not None:
            mo = model.moe
            f += tokens * model.moe_layers * 2.0 * mo.top_k * mo.expert_ffn * model.hidden * model.ffn_mats
    return f


def _selective_recompute_flops_per_token(model: ModelConfig, plan: ParallelPlan, layers_attn: float) -> float:
    """The forward work selective recompute repeats, module by module as the generated step runs it
    (`workload._RankBuilder._selective_recompute`): core attention only where it is unfused (flash attention's
    backward recomputes its scores anyway, so checkpointing it adds no kernel), MLA's up-projections, the
    dense layers' MLP, the MoE layers' routed and shared experts (of the layers, not the MTP modules).
    `layers_attn`: the layers' attention score / value FLOPs per token."""
    mods = selective_modules(plan)
    f = layers_attn if "core_attn" in mods and plan.attention == "unfused" else 0.0
    if "mla_up_proj" in mods and model.mla:
        a, H = model.mla, model.heads
        f += 2.0 * model.layers * H * (a.q_lora_rank * (a.qk_nope_head_dim + a.qk_rope_head_dim)
                                       + a.kv_lora_rank * (a.qk_nope_head_dim + a.v_head_dim))
    per_mat = 2.0 * model.ffn_mats * model.hidden
    for i in range(model.layers):
        if not model.is_moe_layer(i):
            f += per_mat * model.ffn if "mlp" in mods else 0.0
            continue
        mo = model.moe
        f += per_mat * mo.top_k * mo.expert_ffn if "moe" in mods else 0.0
        f += per_mat * mo.shared_experts * mo.shared_ffn if mods & {"moe", "shared_experts"} else 0.0
    return f


def narayanan_hw_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 (SC21) eq. (3): FLOPs per iteration of a GPT model with full activation
    recomputation: 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    return 96.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6.0 * hidden) + vocab / (16.0 * layers * hidden))


# ------------------------------------------------------------------------------------ breakdown
def rank_breakdown(g: ExecutionGraph, start: np.ndarray, end: np.ndarray, moved: np.ndarray,
                   lo: float, hi: float) -> Breakdown:
    """One rank's step window [lo, hi] (us): compute (union of compute-stream work), communication
    (union of transfers), exposed communication per kind (transfer time with no compute running;
    overlapping kinds are charged in the order tp, cp, ep, pp, dp; a posted receive waiting for its
    sender is not transfer time), host wait: the GPU waiting for a host blocked on a device-to-host sync
    (`workload.MOE_SYNC_IDLE_US`) where nothing else runs, and idle: the rest of the step, where the
    compute stream waits (the pipeline bubble)."""
    from estimators.parallelism.compose import BREAKDOWN_FIELDS, node_kinds, window_parts
    # communication occupies only its transfer at the end of the node (`moved`: SimulatedRun.transfer_us,
    # as long as shared links made it), not the wait for peers
    xfer_start = np.maximum(start, end - moved)
    fig = window_parts(node_kinds(g), start, end, xfer_start, lo, hi)
    b = Breakdown(window_us=hi - lo, **dict(zip(BREAKDOWN_FIELDS, fig.tolist())))
    b.settle_by_kind()
    return b


@dataclass
class StepBreakdown:
    """Breakdown of a generated step: the mean over simulated ranks (one per pipeline stage) and each."""

    mean: Breakdown
    per_stage: list[Breakdown]

    def blend(self, other: "StepBreakdown", w: float) -> "StepBreakdown":
        """self + w * (other - self), field by field (linear extrapolation in micro-batches)."""
        def mix(a: Breakdown, b: Breakdown) -> Breakdown:
            da, db = a.to_json(), b.to_json()
            return Breakdown(**{k: da[k] + w * (db[k] - da[k]) for k in da})
        return StepBreakdown(mix(self.mean, other.mean), [mix(a, b) for a, b in zip(self.per_stage, other.per_stage)])


def _breakdown(graphs: Sequence[ExecutionGraph], run) -> StepBreakdown:
    per = []
    lo = float(run.start.min()) if len(run.start) else 0.0
    hi = float(run.end.max()) if len(run.end) else 0.0
    for r, g in enumerate(graphs):
        sl = run.rank_slice(r)
        per.append(rank_breakdown(g, run.start[sl], run.end[sl], run.transfer_us[sl], lo, hi))
    return StepBreakdown(Breakdown.mean(per), per)


def legacy_breakdown_json(bd: StepBreakdown) -> dict[str, Any]:
    """The seconds-keyed breakdown of `whatif parallelism --json` (kept for its users)."""
    m = bd.mean
    kinds = {k: v / 1e6 for k, v in m.exposed_comm_by_kind_us().items()}
    out: dict[str, Any] = {"step_s": m.window_us / 1e6, "compute_s": m.compute_us / 1e6,
                           "exposed_comm_s": m.exposed_comm_us / 1e6, "host_wait_s": m.host_wait_us / 1e6}
    out.update({f"exposed_{k}_comm_s": v for k, v in kinds.items()})
    idle = max(m.idle_us, 0.0)   # a difference of sums: rounding can leave -1e-10 us
    out.update({"bubble_s": idle / 1e6, "bubble_fraction": max(m.idle_fraction, 0.0),
                "exposed_comm_by_kind_s": kinds, "pipeline_bubble_s": idle / 1e6})
    return out


# ------------------------------------------------------------------------------------ prediction
def steady_state_micro_batches(plan: ParallelPlan) -> tuple[int, int] | None:
    """Two micro-batch counts to simulate instead of `plan.micro_batches`, or None to simulate them all.

    Every micro-batch is the same work, so once the pipeline has filled (1F1B: m >= pp; interleaved:
    also m a multiple of pp) each further micro-batch adds exactly one steady-state period to the
    step: the step time is linear in m. Simulating m1 = 2*pp and m2 = 3*pp and extrapolating is then
    exact up to the (m-independent) tails, which both runs contain. This is what keeps 100s of stages x
    1000s of micro-batches cheap."""
    m, p = plan.micro_batches, plan.pp
    if p == 1:
        m1, m2 = 2, 3
    else:
        m1, m2 = p, 2 * p
    if m <= m2 + p:
        return None
    return m1, m2


def _simulate(model, plan, hw, timing, mode, gpn, progress, moe_loads=None):
    from estimators.parallelism.compose import HostPacedTiming
    from replay.api import replay
    # Millions of small Python objects: the cyclic GC's full collections would make this quadratic.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        graphs = generate(model, plan, ranks=mode, gpus_per_node=gpn, moe_loads=moe_loads)
        result = replay(graphs, HostPacedTiming(timing), progress=progress, critical_path=False)
        bd = _breakdown(graphs, result.run)
        out = result.step_time_us / 1e6, bd, result.num_nodes, len(graphs)
        del graphs, result
    finally:
        if was_enabled:
            gc.enable()
    return out


SIMULATION_MODES = ("fast", "symmetric", "all")


def _compose(model, plan, timing, gpn, extrapolate: bool):
    """The "fast" mode: stage samples + the pipeline schedule simulation (estimators.parallelism.compose);
    with `extrapolate`, many micro-batches as the symmetric mode does (`steady_state_micro_batches`)."""
    from estimators.parallelism.compose import sample_stages, schedule_step

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        ss = sample_stages(model, plan, timing, gpn)
        ms = steady_state_micro_batches(plan) if extrapolate else None
        steps = [schedule_step(plan, ss, m) for m in (ms or (plan.micro_batches,))]
    finally:
        if was_enabled:
            gc.enable()
    bds = [StepBreakdown(Breakdown.mean(c.per_stage), c.per_stage) for c in steps]
    c = steps[0]
    extra = dict(c.extra)
    step_s, bd = c.step_us / 1e6, bds[0]
    if ms is not None:
        w = (plan.micro_batches - ms[0]) / (ms[1] - ms[0])
        step_s += w * (steps[1].step_us - c.step_us) / 1e6
        bd = bds[0].blend(bds[1], w)
        extra["extrapolated_from_micro_batches"] = list(ms)
    return step_s, bd, c.sample_nodes, c.stage_kinds, extra


def predict(model: ModelConfig, plan: ParallelPlan, hardware: Any = "h100-sxm", mode: str = "fast",
            timing: Any = None, progress: Callable[[int, int], None] | None = None,
            extrapolate: bool = True, moe_loads: Any = None) -> PlanPrediction:
    """Generate, replay, and summarize one plan. `mode`:
    - "fast" (default): replay a few passes of each distinct pipeline stage and compose the step with a
      pipeline-schedule simulation (`estimators.parallelism.compose`); agrees with "symmetric" within 2%
      (tests/test_estimate_speed.py) in a fraction of a second at any depth;
    - "symmetric": the full event-level replay of the whole step, one rank per pipeline stage;
    - "all": every rank (slow; checks rank symmetry).
    With `extrapolate`, "symmetric" and "all" simulate many micro-batches as two short runs and extrapolate
    linearly (see `steady_state_micro_batches`). `moe_loads`: measured routing
    (`estimators.parallelism.workload.MoELoads`) for the EP layers instead of balanced routing; every
    micro-batch and MoE layer then differs, so "fast" runs the symmetric replay; so it does for FSDP2 reducing
    gradients after every micro-batch (pp 1), whose reductions share the links with the next passes' gathers."""
    if mode not in SIMULATION_MODES:
        raise TraceInputError(None, f"simulation mode must be one of {', '.join(SIMULATION_MODES)}, got {mode!r}")
    validate_plan(model, plan)
    t0 = time.perf_counter()
    hw = resolve_hardware(hardware) if hardware is not None else None
    check_precision_support(hw, plan.precision, plan.fp8_recipe)
    gpn = hw.node.gpus_per_node if hw is not None else plan.gpus_per_node
    if timing is None:
        if hw is None:
            raise TraceInputError(None, "predict needs a hardware preset or a timing source")
        timing = default_timing(hw)
    extra: dict[str, Any] = {}
    if mode == "fast" and moe_loads is None and not plan.reduces_every_micro_batch:
        step_s, bd, nodes, nranks, more = _compose(model, plan, timing, gpn, extrapolate)
        extra.update(simulation="fast", **more)
        ms = None
    else:
        mode = "symmetric" if mode == "fast" else mode
        extra["simulation"] = mode
        ms = steady_state_micro_batches(plan) if extrapolate else None
    if extra["simulation"] == "fast":
        pass
    elif ms is None:
        step_s, bd, nodes, nranks = _simulate(model, plan, hw, timing, mode, gpn, progress, moe_loads)
    else:
        m = plan.micro_batches
        m1, m2 = ms
        gb = lambda k: k * plan.dp * plan.micro_batch  # noqa: E731
        s1, b1, n1, nranks = _simulate(model, plan.with_(global_batch=gb(m1)), hw, timing, mode, gpn, progress, moe_loads)
        s2, b2, n2, _ = _simulate(model, plan.with_(global_batch=gb(m2)), hw, timing, mode, gpn, progress, moe_loads)
        w = (m - m1) / (m2 - m1)
        step_s = s1 + w * (s2 - s1)
        bd = b1.blend(b2, w)
        nodes = n1 + n2
        extra["extrapolated_from_micro_batches"] = [m1, m2]
    if step_s <= 0:
        raise TraceInputError(None, "the replay produced an empty step")
    tokens = plan.global_batch * plan.seq_len
    gpus = plan.gpus
    # what was read of the model (a config.json import is checked against its model card by these):
    # active counts the input embedding, as Qwen and Mistral cards do; GPT-OSS's card leaves it out
    extra.update(model_params=model.param_count(), model_active_params=model.active_param_count(),
                 model_active_params_without_input_embedding=model.active_param_count(input_embedding=False),
                 model_flops_per_token=model_flops_per_step(model, plan) / tokens)
    if model.moe:   # what the GPU's waits for the host come from (whatif notes)
        extra.update(moe_layer_host_us=moe_layer_host_us(model, plan), moe_sync_wait_us=_sync_wait_us(model, plan))
    mflops = model_flops_per_step(model, plan)
    hflops = hw_flops_per_step(model, plan)
    peak = hw.peak_flops(plan.precision) if hw is not None else 0.0
    mem = estimate_memory(model, plan, hbm_capacity_gib(hw) if hw is not None else 0.0)
    tflops = mflops / step_s / gpus / 1e12
    return PlanPrediction(
        model=model.name, hardware=hw.name if hw is not None else getattr(timing, "name", "timing"), plan=plan,
        step_time_s=step_s, tokens_per_s=tokens / step_s, tflops_per_gpu=tflops,
        hw_tflops_per_gpu=hflops / step_s / gpus / 1e12,
        mfu=(tflops * 1e12 / peak) if peak else 0.0, memory=mem,
        breakdown=bd, num_nodes=nodes, simulated_ranks=nranks,
        wall_s=time.perf_counter() - t0, extra=extra)


def _sync_wait_us(model: ModelConfig, plan: ParallelPlan) -> float:
    """A stage's expected wait at dropless token-count syncs per step: its MoE layers x micro-batches x
    MOE_SYNC_IDLE_US (twice with full recompute, which runs the forward again); token drop has none."""
    if plan.moe_capacity_factor > 0:
        return 0.0
    return model.moe_layers / plan.pp * plan.micro_batches * MOE_SYNC_IDLE_US * (2 if plan.recompute == "full" else 1)


# ------------------------------------------------------------------------------------ search
def rank_candidate_plans(model: ModelConfig, hardware: Any, gpus: int, seq_len: int, global_batch: int,
                         precision: str = "bf16", max_plans: int | None = 24,
                         base: ParallelPlan | None = None) -> list[ParallelPlan]:
    """The `max_plans` most promising valid plans of `gpus` that fit in memory, best first (every one of
    them for `max_plans=None`): the whole plan space (TP, PP, VP, CP, DP, EP, micro-batch, recompute,
    ZeRO / HSDP, sequence parallelism, overlap modes) ranked by `estimators.parallelism.search`'s analytic
    step-time estimate. `base`: a plan whose attention and given options (dispatcher, FP8 recipe, CUDA graphs,
    ...: `search.SearchSpace.keeping`) every candidate keeps, as `--search` keeps the command line's."""
    from estimators.parallelism.search import SearchSpace, rank_plans
    space = SearchSpace() if base is None else SearchSpace.keeping(base)
    return rank_plans(model, hardware, gpus, seq_len, global_batch, precision, space).plans(max_plans)
