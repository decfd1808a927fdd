"""What-if `moe`: a routing trace (or synthetic routing), an expert placement and micro-batch grouping
-> all-to-all bytes (intra / inter node), per-GPU load, expert GEMM and all-to-all times, MoE layer
latency; prefill/decode latency and throughput, or the EP training step time.

The placement is fitted on one part of the trace and evaluated on another (`MoEOptions.fit`):
`first-half` (default: fit on the first `fit_fraction` of the tokens, evaluate on the rest, so drift
counts), `prefill` (fit on prefill tokens, evaluate on decode tokens: prefill routing predicts decode
routing), or `all` (in-sample). Inter-node savings are reported against `contiguous` placement with
arrival-order batching (Megatron's default) evaluated on the same tokens.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chakra_schema.errors import TraceInputError
from estimators.model_config import ModelConfig
from estimators.moe.evaluate import (ExpertShape, LayerTimer, Layout, PlacementCost, evaluate_placements,
                                     fit_stats)
from estimators.moe.placement import PLACEMENTS, PlacementOptions, fit_placement
from estimators.moe.routing import MaskedSource, RoutingSource, check_against_model, load_routing
from estimators.moe.synthetic import LoadSampledSource, SyntheticSource, SyntheticSpec
from estimators.prediction import Prediction
from estimators.scenario import Scenario
from estimators.registry import register_options, register_whatif

PHASES = ("prefill", "decode", "train")
FITS = ("first-half", "prefill", "all")
GROUP_BY = ("none", "domain")
DEFAULT_TOKENS = {"prefill": 4096, "decode": 128}


@dataclass(frozen=True)
class MoEOptions:
    routing: str = "synthetic"         # trace file / directory, or synthetic[:k=v,...]
    expert_load: str = ""              # [layers][experts] token counts (JSON or CSV) when only loads are known
    placement: str = "contiguous"
    redundant_experts: int = 0         # eplb: extra physical expert slots
    groups: int = 0                    # eplb: expert groups (0: one per node)
    group_by: str = "none"             # none | domain: batch requests of one domain together
    phase: str = "decode"              # prefill | decode | train
    tokens: int = 0                    # routed tokens per EP rank per forward (0: 4096 prefill, 128 decode)
    context: int = 4096                # inference: prompt / KV length for attention
    fit: str = "first-half"            # first-half | prefill | all
    fit_fraction: float = 0.5
    synthetic_tokens: int = 65536      # tokens of synthetic / load-sampled routing (at least 2 batches;
                                       # a tokens= in the synthetic spec wins)
    timed_windows: int = 4             # batches whose all-to-all and GEMMs are timed
    coactivation_weight: float = 0.1   # locality: weight of keeping co-activated experts on one node
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise TraceInputError(None, f"moe.{msg}")
        if self.placement not in PLACEMENTS:
            bad(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.phase not in PHASES:
            bad(f"phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        if self.fit not in FITS:
            bad(f"fit must be one of {', '.join(FITS)}, got {self.fit!r}")
        if self.group_by not in GROUP_BY:
            bad(f"group_by must be one of {', '.join(GROUP_BY)}, got {self.group_by!r}")
        for name in ("redundant_experts", "groups", "tokens"):
            if getattr(self, name) < 0:
                bad(f"{name} must be >= 0")
        for name in ("context", "synthetic_tokens", "timed_windows"):
            if getattr(self, name) < 1:
                bad(f"{name} must be >= 1")
        if not 0.0 < self.fit_fraction < 1.0:
            bad("fit_fraction must be in (0, 1)")
        if self.coactivation_weight < 0:
            bad("coactivation_weight must be >= 0")
        if self.redundant_experts and self.placement != "eplb":
            bad("redundant_experts needs placement = eplb")


register_options("moe", MoEOptions)


# ------------------------------------------------------------------------------------------ inputs
def open_routing(opts: MoEOptions, model: ModelConfig, window: int = 0) -> RoutingSource:
    """The routing source the options name, checked against the model's MoE layers and top-k. Generated
    routing (synthetic, or sampled from --expert-load) has at least enough tokens for one batch of
    `window` tokens in each of the fitted and the evaluated parts."""
    mo = model.moe
    f = opts.fit_fraction
    need = {"all": window, "prefill": 4 * window}.get(opts.fit, int(np.ceil(window / min(f, 1 - f))))
    tokens = max(opts.synthetic_tokens, need)
    if opts.expert_load:
        loads = load_expert_loads(Path(opts.expert_load), model)
        return LoadSampledSource(loads, mo.top_k, tokens, opts.seed, path=opts.expert_load)
    if opts.routing.split(":")[0] == "synthetic":
        spec = SyntheticSpec.parse(opts.routing, tokens=tokens, layers=model.moe_layers,
                                   experts=mo.num_experts, top_k=mo.top_k, seed=opts.seed)
        if spec.experts != mo.num_experts:
            raise TraceInputError(None, f"synthetic routing has {spec.experts} experts, {model.name} has {mo.num_experts}")
        src = _synthetic_source(spec)
    else:
        src = load_routing(opts.routing)
    check_against_model(src, mo.num_experts, model.moe_layers, mo.top_k)
    return src


@functools.lru_cache(maxsize=2)
def _synthetic_source(spec: SyntheticSpec) -> SyntheticSource:
    """Sweeps evaluate one synthetic trace under many placements: generate it once."""
    return SyntheticSource(spec)


def load_expert_loads(path: Path, model: ModelConfig) -> np.ndarray:
    """`[layers][experts]` token counts from JSON (a nested list) or CSV (one row per layer)."""
    if not path.is_file():
        raise TraceInputError(path, "no such expert-load file")
    try:
        if path.suffix == ".csv":
            with open(path, newline="") as f:
                rows = [[float(x) for x in r] for r in csv.reader(f) if r and not r[0].startswith("#")]
        else:
            import orjson
            rows = orjson.loads(path.read_bytes())
        widths = {len(r) for r in rows}
        if len(widths) != 1:
            raise TraceInputError(path, f"ragged expert loads: rows of {sorted(widths)} experts")
        loads = np.asarray(rows, dtype=float)
    except (ValueError, TypeError) as e:
        raise TraceInputError(path, f"expert loads must be a [layers][experts] array of numbers ({e})") from None
    if loads.ndim != 2:
        raise TraceInputError(path, "expert loads must be a [layers][experts] array")
    if loads.shape[0] != model.moe_layers:
        raise TraceInputError(path, f"expert loads have {loads.shape[0]} layers, the model has {model.moe_layers} MoE layers")
    if loads.shape[1] != model.moe.num_experts:
        raise TraceInputError(path, f"expert loads have {loads.shape[1]} experts, the model has {model.moe.num_experts}")
    if (loads < 0).any() or not np.isfinite(loads).all() or (loads.sum(1) <= 0).any():
        raise TraceInputError(path, "expert loads must be finite, >= 0, and not all zero in a layer")
    return loads


@dataclass(frozen=True)
class Split:
    fit: RoutingSource
    fit_range: tuple[int, int]
    evaluate: RoutingSource
    eval_range: tuple[int, int]
    note: str


def split_trace(src: RoutingSource, opts: MoEOptions) -> Split:
    """Which tokens the placement is fitted on, and which it is evaluated on."""
    n = src.tokens
    if opts.fit == "all" or n < 2:
        return Split(src, (0, n), src, (0, n), f"fit and evaluated on all {n} tokens (in-sample)")
    if opts.fit == "prefill":
        if src.phase is None or not (src.phase == 0).any() or not (src.phase == 1).any():
            raise TraceInputError(src.path, "fit = prefill needs a routing trace with both prefill and decode tokens")
        pre, dec = MaskedSource(src, src.phase == 0, "prefill"), MaskedSource(src, src.phase == 1, "decode")
        return Split(pre, (0, pre.tokens), dec, (0, dec.tokens),
                     f"fit on the {pre.tokens} prefill tokens, evaluated on the {dec.tokens} decode tokens")
    cut = int(round(n * opts.fit_fraction))
    return Split(src, (0, cut), src, (cut, n), f"fit on tokens [0, {cut}), evaluated on [{cut}, {n})")


# ------------------------------------------------------------------------------------------ layout
def tokens_per_gpu(opts: MoEOptions, scenario: Scenario) -> int:
    """Routed tokens per EP rank per forward: the option, or the phase default; training: one
    micro-batch's tokens of the rank (micro_batch x seq_len / (cp x tp))."""
    p = scenario.plan
    if opts.phase == "train":
        return max(1, p.micro_batch * p.seq_len // (p.cp * p.tp))
    return opts.tokens or DEFAULT_TOKENS[opts.phase]


def ep_layout(scenario: Scenario, opts: MoEOptions) -> Layout:
    ep = scenario.plan.ep
    gpn = min(scenario.hardware.node.gpus_per_node, ep)
    if ep < 2:
        raise TraceInputError(None, "the MoE what-if needs expert parallelism: plan.ep >= 2 (--ep N)")
    if ep % gpn:
        raise TraceInputError(None, f"EP{ep} is not a whole number of {gpn}-GPU nodes")
    if scenario.model.moe.num_experts % ep:
        raise TraceInputError(None, f"{scenario.model.moe.num_experts} experts do not divide over EP{ep}")
    return Layout(ep, gpn, tokens_per_gpu(opts, scenario), opts.group_by)


def expert_shape(model: ModelConfig, precision: str) -> ExpertShape:
    mo = model.moe
    return ExpertShape(model.hidden, mo.expert_ffn, model.activation == "swiglu", mo.shared_experts,
                       mo.num_experts, dtype=precision, dispatch_bytes=1 if precision == "fp8" else 2,
                       combine_bytes=2)


# ------------------------------------------------------------------------------------------ the what-if
@register_whatif("moe", needs=("model", "hardware"))
def moe(scenario: Scenario, progress=None) -> Prediction:
    """MoE routing, expert placement and micro-batch grouping -> all-to-all bytes, load, latency."""
    opts = scenario.moe if scenario.moe is not None else MoEOptions()
    model = scenario.model
    if model.moe is None:
        raise TraceInputError(None, f"model '{model.name}' has no MoE layers")
    layout = ep_layout(scenario, opts)
    src = open_routing(opts, model, layout.window)
    split = split_trace(src, opts)
    if opts.phase == "train":  # one routing window per micro-batch (up to timed_windows)
        opts = dataclasses.replace(opts, timed_windows=min(opts.timed_windows, scenario.plan.micro_batches))
    cost, baseline = _placement_costs(scenario, opts, layout, split, progress)
    pred = _prediction(scenario, opts, layout, split, cost, baseline)
    if opts.phase == "train":
        _train_step(scenario, cost, pred)
    else:
        _inference(scenario, opts, layout, cost, pred)
    return pred


def _placement_costs(scenario: Scenario, opts: MoEOptions, layout: Layout, split: Split,
                     progress) -> tuple[PlacementCost, PlacementCost]:
    """Fit the placement, then cost it and the contiguous / arrival-order baseline on the same tokens."""
    E = scenario.model.moe.num_experts
    stats = fit_stats(split.fit, *split.fit_range, layout, E,
                      coactivation_tokens=32768 if opts.placement == "locality" else 0)
    popts = PlacementOptions(opts.redundant_experts, opts.groups, opts.coactivation_weight)
    placement = fit_placement(opts.placement, stats, popts)
    timer = LayerTimer(expert_shape(scenario.model, scenario.plan.precision), scenario.hardware, layout)
    base_layout = dataclasses.replace(layout, group_by="none")
    contiguous = fit_placement("contiguous", stats, popts)
    if layout.group_by == "none":
        costs = evaluate_placements(split.evaluate, *split.eval_range, layout, E, [placement, contiguous], timer,
                                    opts.timed_windows, progress)
        return costs[0], costs[1]
    cost = evaluate_placements(split.evaluate, *split.eval_range, layout, E, [placement], timer,
                               opts.timed_windows, progress)[0]
    base = evaluate_placements(split.evaluate, *split.eval_range, base_layout, E, [contiguous], timer,
                               opts.timed_windows)[0]
    return cost, base


def _reduction(new: float, old: float) -> float:
    return float(1.0 - new / old) if old > 0 else 0.0


def _prediction(scenario: Scenario, opts: MoEOptions, layout: Layout, split: Split, cost: PlacementCost,
                base: PlacementCost) -> Prediction:
    load = cost.max_over_mean
    m = {
        "a2a_bytes": float(cost.a2a_bytes.sum()),
        "a2a_bytes_inter_node": float(cost.a2a_bytes_inter_node.sum()),
        "a2a_bytes_intra_node": float(cost.a2a_bytes.sum() - cost.a2a_bytes_inter_node.sum()),
        "a2a_reduction_vs_contiguous": _reduction(cost.a2a_bytes_inter_node.sum(), base.a2a_bytes_inter_node.sum()),
        "a2a_total_reduction_vs_contiguous": _reduction(cost.a2a_bytes.sum(), base.a2a_bytes.sum()),
        "contiguous_a2a_bytes_inter_node": float(base.a2a_bytes_inter_node.sum()),
        "max_over_mean_gpu_load": float(load.mean()),
        "max_over_mean_gpu_load_worst_layer": float(load.max()),
        "contiguous_max_over_mean_gpu_load": float(base.max_over_mean.mean()),
        "layer_latency_us_mean": float(cost.layer_us.mean()),
        "contiguous_layer_latency_us_mean": float(base.layer_us.mean()),
        "moe_latency_us": cost.moe_latency_us,
        "contiguous_moe_latency_us": base.moe_latency_us,
        "dispatch_us_mean": float(cost.dispatch_us.mean()),
        "combine_us_mean": float(cost.combine_us.mean()),
        "expert_gemm_us_mean": float(cost.expert_us.mean()),
        "tokens_per_gpu": layout.tokens_per_gpu,
        "ep": layout.gpus, "nodes": layout.nodes,
        "evaluated_tokens": cost.windows * layout.window,
        "fit_tokens": split.fit_range[1] - split.fit_range[0],
        "batches": cost.windows, "timed_batches": len(cost.pair_tokens),
        "physical_experts_per_gpu": cost.placement.slots_per_gpu,
    }
    notes = [split.note, f"a2a bytes per forward batch of {layout.window} tokens over all MoE layers; baseline: "
                         f"contiguous placement, arrival-order batching"]
    if cost.placement.note:
        notes.append(f"{cost.placement.name}: {cost.placement.note}")
    detail = {
        "placement": cost.placement.name, "group_by": layout.group_by, "phase": opts.phase,
        "layer_latency_us": {"per_layer": cost.layer_us.tolist(), "mean": float(cost.layer_us.mean())},
        "a2a_bytes_per_layer": cost.a2a_bytes.tolist(),
        "a2a_bytes_inter_node_per_layer": cost.a2a_bytes_inter_node.tolist(),
        "max_over_mean_gpu_load_per_layer": load.tolist(),
        "physical_to_logical": cost.placement.slot_expert.tolist(),
    }
    return Prediction(whatif="moe", scenario_key="", step_time_s=cost.moe_latency_us / 1e6, metrics=m,
                      notes=notes, gpus=layout.gpus, detail=detail)


# ------------------------------------------------------------------------------------------ inference
def dense_forward_us(model: ModelConfig, hardware, tokens: int, context: int, phase: str, dtype: str) -> float:
    """One rank's forward outside the routed experts (attention projections and core, dense FFN layers,
    norms, logits) on `tokens` tokens: prefill = tokens/context prompts of `context` tokens, decode =
    `tokens` requests each attending to `context` cached tokens. Weights are replicated per rank (data-
    parallel attention, as in DeepSeek-V3's deployment)."""
    from replay.hardware.compute import ComputeModel
    c = ComputeModel(hardware)
    h, T = model.hidden, tokens
    qk, vd = model.attn_score_dims
    attn_width = max(1, model.attn_params() // h)      # projections as one GEMM of the same weight bytes
    per_layer = c.gemm(T, attn_width, h, dtype=dtype).time_us + 2 * c.memory_op(T * h * 2 * 2).time_us
    if phase == "prefill":
        seqs = max(1, T // context)
        per_layer += c.attention(seqs, model.heads, min(T, context), min(T, context), max(qk, vd), causal=True,
                                 kv_heads=model.n_kv if model.mla is None else model.heads).time_us
    else:
        per_layer += c.attention(T, model.heads, 1, context, max(qk, vd),
                                 kv_heads=model.n_kv if model.mla is None else 1).time_us
    dense_ffn = 0.0
    f_in = 2 * model.ffn if model.activation == "swiglu" else model.ffn
    if model.ffn:
        dense_ffn = c.gemm(T, f_in, h, dtype=dtype).time_us + c.gemm(T, h, model.ffn, dtype=dtype).time_us
    dense_layers = model.layers - model.moe_layers
    return (model.layers * per_layer + dense_layers * dense_ffn
            + c.gemm(T, model.vocab, h, dtype="bf16").time_us)


def _inference(scenario: Scenario, opts: MoEOptions, layout: Layout, cost: PlacementCost, pred: Prediction) -> None:
    model, p = scenario.model, scenario.plan
    dense = dense_forward_us(model, scenario.hardware, layout.tokens_per_gpu, opts.context, opts.phase, p.precision)
    forward_us = dense + cost.moe_latency_us
    tokens = layout.tokens_per_gpu * layout.gpus
    pred.step_time_s = forward_us / 1e6
    pred.tokens_per_s = tokens / (forward_us / 1e6)
    pred.metrics.update({"forward_latency_us": forward_us, "dense_forward_us": dense,
                         f"{opts.phase}_latency_us": forward_us, f"{opts.phase}_tokens_per_s": pred.tokens_per_s})
    pred.notes.append(f"{opts.phase}: one forward of {layout.tokens_per_gpu} tokens per GPU on EP{layout.gpus}"
                      + (f", {opts.context}-token context" if opts.phase == "decode" else ""))


# ------------------------------------------------------------------------------------------ training
def moe_loads(cost: PlacementCost):
    from estimators.parallelism.workload import MoELoads
    return MoELoads(cost.pair_tokens.copy(), cost.slot_tokens.copy())


def _train_step(scenario: Scenario, cost: PlacementCost, pred: Prediction) -> None:
    """EP training step through the workload generator with the measured per-pair all-to-all sizes and
    per-expert loads of each micro-batch, next to the balanced-routing step of today's EP path."""
    from estimators.parallelism.evaluate import predict
    model, plan, hw = scenario.model, scenario.plan, scenario.hardware
    if plan.tp != 1:
        raise TraceInputError(None, "the MoE training what-if models EP groups of consecutive ranks: use tp = 1")
    measured = predict(model, plan, hw, mode=scenario.simulation, moe_loads=moe_loads(cost))
    balanced = predict(model, plan, hw, mode=scenario.simulation)
    pred.step_time_s = measured.step_time_s
    pred.baseline_step_time_s = balanced.step_time_s
    pred.breakdown = measured.breakdown.mean
    pred.tokens_per_s, pred.mfu = measured.tokens_per_s, measured.mfu
    pred.tflops_per_gpu, pred.hw_tflops_per_gpu = measured.tflops_per_gpu, measured.hw_tflops_per_gpu
    pred.memory_gib_per_gpu, pred.oom, pred.gpus = measured.memory.total_gib, measured.oom, plan.gpus
    pred.metrics.update({"step_time_s": measured.step_time_s, "balanced_step_time_s": balanced.step_time_s,
                         "step_time_vs_balanced": measured.step_time_s / balanced.step_time_s})
    pred.notes.append(f"train: micro-batch m uses routing batch m mod {len(cost.pair_tokens)}; "
                      f"baseline_step_time_s = balanced routing")
