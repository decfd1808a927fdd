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
from estimators.moe.grouped import GroupLimitedSource
from estimators.moe.a2a import node_limit
from estimators.moe.evaluate import (LOW_LATENCY_CALL_US, ExpertShape, LayerTimer, Layout, NodeForwarding,
                                     PlacementCost, evaluate_expected, evaluate_placements, fit_stats,
                                     moe_layer_parts)
from estimators.moe.placement import (SLOTTED, PlacementOptions, RoutingStats, fit_placement, gpu_loads,
                                      max_over_mean)
from estimators.moe.serving import ServingSpec, draft_tokens, serve, serving_memory
from estimators.moe.routing import MaskedSource, RoutingSource, check_against_model, load_routing
from estimators.moe.options import MoEOptions
from estimators.moe.synthetic import LoadSampledSource, SyntheticSource, SyntheticSpec
from estimators.parallelism.memory import GIB, hbm_capacity_gib
from estimators.parallelism.plan import validate_plan
from estimators.parallelism.timing import check_precision_support
from estimators.prediction import Prediction
from estimators.scenario import Scenario
from estimators.registry import register_options, register_whatif

DEFAULT_TOKENS = {"prefill": 4096, "decode": 128}


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
        return _node_limited(LoadSampledSource(loads, mo.top_k, tokens, opts.seed, path=opts.expert_load),
                             model, opts)
    if opts.routing.split(":")[0] == "synthetic":
        spec = SyntheticSpec.parse(opts.routing, tokens=tokens, layers=model.moe_layers,
                                   experts=mo.num_experts, top_k=mo.top_k, seed=opts.seed)
        if spec.experts != mo.num_experts:
            raise TraceInputError(None, f"synthetic routing has {spec.experts} experts, {model.name} has {mo.num_experts}")
        src = _synthetic_source(spec)
    else:
        src = load_routing(opts.routing)
        check_against_model(src, mo.num_experts, model.moe_layers, mo.top_k)
        return src                       # a real trace routes as it was recorded
    check_against_model(src, mo.num_experts, model.moe_layers, mo.top_k)
    return _node_limited(src, model, opts)


def _node_limited(src: RoutingSource, model: ModelConfig, opts: MoEOptions) -> RoutingSource:
    """Generated routing obeys the model's node-limited routing (groups, groups per token; --groups and
    --groups-per-token override them)."""
    groups, per = expert_groups(model, opts), groups_per_token(model, opts)
    if per > groups:
        raise TraceInputError(None, f"groups_per_token ({per}) must be at most the {groups} expert groups")
    if groups <= 1 or per >= groups:
        return src
    if model.moe.top_k > per * (model.moe.num_experts // groups):
        raise TraceInputError(None, f"top-{model.moe.top_k} does not fit in {per} groups of "
                                    f"{model.moe.num_experts // groups} experts")
    return GroupLimitedSource(src, model.moe.num_experts, groups, per)


@functools.lru_cache(maxsize=2)
def _synthetic_source(spec: SyntheticSpec) -> SyntheticSource:
    """Sweeps evaluate one synthetic trace under many placements: generate it once."""
    return SyntheticSource(spec)


def load_expert_loads(path: Path, model: ModelConfig) -> np.ndarray:
    """`[layers][experts]` token counts from JSON (a nested list) or CSV (one row per layer)."""
    if path.is_dir():
        raise TraceInputError(path, "is a directory, not an expert-load file")
    if not path.is_file():
        raise TraceInputError(path, "no such expert-load file")
    try:
        if path.suffix == ".csv":
            with open(path, newline="") as f:
                rows = [[float(x) for x in r] for r in csv.reader(f) if r and not r[0].startswith("#")]
        else:
            import orjson
            rows = orjson.loads(path.read_bytes())
            if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
                raise ValueError("not a list of lists")
            for x in (x for r in rows for x in r):
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    raise ValueError(f"found {x!r}")
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
    if not np.isfinite(loads).all():
        raise TraceInputError(path, "expert loads must be finite numbers (found inf or nan)")
    if (loads < 0).any():
        raise TraceInputError(path, f"expert loads must be >= 0 (found {loads.min():g})")
    if (loads.max(1) <= 0).any():
        raise TraceInputError(path, f"expert loads are all zero in layer {int(np.argmax(loads.max(1) <= 0))}")
    return rescale_loads(loads)


def rescale_loads(loads: np.ndarray) -> np.ndarray:
    """Loads whose sums would overflow (or whose float32 copy, what EPLB balances, would be inf or 0):
    each such layer scaled by a power of two, which is exact, so ratios and ties are kept; layers within
    [2^-60, 2^60] are left as given."""
    peak = loads.max(1)
    out = loads.copy()
    far = (peak > 2.0 ** 60) | (peak < 2.0 ** -60)
    if far.any():
        exp = np.frexp(peak[far])[1]
        out[far] = np.ldexp(loads[far], -exp[:, None] + 20)
    return out


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
    if opts.tokens:
        return opts.tokens
    verified = 1 + (opts.mtp_draft_tokens or scenario.model.mtp_layers
                    if opts.phase == "decode" and (opts.mtp_acceptance or opts.mtp_acceptance_length) else 0)
    return max(1, DEFAULT_TOKENS[opts.phase] // verified) * verified   # whole sequences of 1 + drafts tokens


def ep_layout(scenario: Scenario, opts: MoEOptions) -> Layout:
    """EP ranks on nodes, checked: the physical expert slots (routed + redundant) divide over the EP
    GPUs, at most one slot per expert per GPU, whole nodes, groups that divide the experts."""
    ep = scenario.plan.ep
    gpn = min(scenario.hardware.node.gpus_per_node, ep)
    E = scenario.model.moe.num_experts
    if ep < 2:
        raise TraceInputError(None, "the MoE what-if needs expert parallelism: plan.ep >= 2 (--ep N)")
    if ep % gpn:
        raise TraceInputError(None, f"EP{ep} is not a whole number of {gpn}-GPU nodes")
    slots = E + opts.redundant_experts
    if slots % ep:
        extra = f" + {opts.redundant_experts} redundant = {slots} physical slots" if opts.redundant_experts else ""
        raise TraceInputError(None, f"{E} experts{extra} do not divide over EP{ep}"
                                    + (" (redundant experts need --placement eplb)" if E % ep == 0 and
                                       opts.placement not in SLOTTED else ""))
    if slots // ep > E:
        raise TraceInputError(None, f"{opts.redundant_experts} redundant experts give {slots // ep} slots per GPU, "
                                    f"more than the {E} experts (at most {E * ep - E} redundant on EP{ep})")
    groups = expert_groups(scenario.model, opts)
    if E % groups:
        raise TraceInputError(None, f"{groups} expert groups do not divide the {E} experts")
    tokens = tokens_per_gpu(opts, scenario)
    _check_tokens_fit(scenario, tokens)
    return Layout(ep, gpn, tokens, opts.group_by)


def _check_tokens_fit(scenario: Scenario, tokens: int) -> None:
    """A forward's routed tokens must at least fit in one GPU's memory at one byte per hidden unit (FP8
    dispatch, the smallest form a routed token's activation takes). A batch beyond that cannot run, and
    its counts overflow (--tokens 1e19 gave a different tokens/s than 1e15, silently)."""
    hidden, gb = scenario.model.hidden, scenario.hardware.gpu.memory_gb
    need = tokens * hidden / 1e9
    if need > gb:
        raise TraceInputError(None, f"{tokens:,} routed tokens per GPU per forward (--tokens; training: micro-batch x "
                                    f"seq-len) do not fit: their hidden states alone ({hidden} x 1 byte each) take "
                                    f"{need:,.0f} GB, more than the {gb:g} GB of a {scenario.hardware.name} GPU")


def expert_groups(model: ModelConfig, opts: MoEOptions) -> int:
    """Expert groups of node-limited routing: the option, else the model's (1 when it has none)."""
    return opts.groups or int(getattr(model.moe, "groups", 1) or 1)


def groups_per_token(model: ModelConfig, opts: MoEOptions) -> int:
    return opts.groups_per_token or int(getattr(model.moe, "groups_per_token", 1) or 1)


def expert_shape(model: ModelConfig, precision: str) -> ExpertShape:
    mo = model.moe
    return ExpertShape(model.hidden, mo.expert_ffn, model.activation == "swiglu", mo.shared_experts,
                       mo.num_experts, dtype=precision, dispatch_bytes=1 if precision == "fp8" else 2,
                       combine_bytes=2, shared_ffn=getattr(mo, "shared_ffn", mo.expert_ffn))


# ------------------------------------------------------------------------------------------ the what-if
@register_whatif("moe", needs=("model", "hardware"))
def moe(scenario: Scenario, progress=None) -> Prediction:
    """MoE routing, expert placement and micro-batch grouping -> all-to-all bytes, load, latency;
    inference: serving throughput of the deployment."""
    opts = scenario.moe if scenario.moe is not None else MoEOptions()
    model = scenario.model
    if model.moe is None:
        raise TraceInputError(None, f"model '{model.name}' has no MoE layers")
    check_precision_support(scenario.hardware, scenario.plan.precision, scenario.plan.fp8_recipe,
                            "training" if opts.phase == "train" else "serving")
    layout = ep_layout(scenario, opts)
    _check_serving(scenario, opts)
    if opts.phase == "train":  # one routing window per micro-batch (up to timed_windows)
        validate_plan(model, scenario.plan)     # a plan without a micro-batch fails here, not as timed_windows = 0
        opts = dataclasses.replace(opts, timed_windows=min(opts.timed_windows, scenario.plan.micro_batches))
    if opts.expert_load:
        loads = load_expert_loads(Path(opts.expert_load), model)
        split = Split(None, (0, 0), None, (0, 0), f"placement balanced on the loads of {opts.expert_load}; "
                                                   f"costed on their expected token counts")
        cost, baseline, timer = _load_costs(scenario, opts, layout, _stats_of_loads(loads, layout), loads)
    elif layout.window > opts.sampled_window:
        split, cost, baseline, timer = _large_batch_costs(scenario, opts, layout)
    else:
        src = open_routing(opts, model, layout.window)
        split = split_trace(src, opts)
        cost, baseline, timer = _placement_costs(scenario, opts, layout, split, progress)
    pred = _prediction(scenario, opts, layout, split, cost, baseline)
    pred.metrics.update(timer.comparison)
    if opts.phase == "train":
        _train_step(scenario, cost, pred)
    else:
        _inference(scenario, opts, layout, cost, timer, pred)
    return pred


def _check_serving(scenario: Scenario, opts: MoEOptions) -> None:
    model, ep, tp = scenario.model, scenario.plan.ep, opts.attention_tp
    if tp > 1 and (ep % tp or model.heads % tp):
        raise TraceInputError(None, f"attention TP{tp} must divide EP{ep} and the {model.heads} attention heads")
    mtp = opts.mtp_acceptance > 0 or opts.mtp_acceptance_length > 0
    if mtp and opts.phase != "decode":
        raise TraceInputError(None, f"MTP drafts tokens in decode, not in phase {opts.phase}: drop the mtp options")
    if mtp and not getattr(model, "mtp_layers", 0):
        raise TraceInputError(None, f"MTP needs a model with multi-token prediction layers "
                                    f"({model.name} has mtp_layers = 0)")
    drafts = opts.mtp_draft_tokens or getattr(model, "mtp_layers", 0)     # as serving.draft_tokens
    if mtp and opts.tokens % (1 + drafts):   # (0: the phase default, checked where it is filled in)
        raise TraceInputError(None, f"--tokens {opts.tokens} is not a whole number of sequences of 1 + {drafts} "
                                    f"verified tokens: give a multiple of {1 + drafts}")
    if opts.kv_dtype != "bf16" and opts.phase == "train":
        raise TraceInputError(None, "kv_dtype is the serving KV cache's type (phase prefill or decode); training "
                                    "keeps no KV cache")
    if opts.mtp_acceptance_length > 1 + drafts:
        raise TraceInputError(None, f"mtp_acceptance_length {opts.mtp_acceptance_length:g} is more than the "
                                    f"{1 + drafts} tokens a step verifies with {drafts} draft tokens")
    if opts.expert_load and opts.group_by != "none":
        raise TraceInputError(opts.expert_load, "--group-by domain needs routing with request domains, "
                                                "not expert loads")


def layer_timer(scenario: Scenario, opts: MoEOptions, layout: Layout) -> LayerTimer:
    """Expert and all-to-all timing of the deployment. Prefill sends a token once per destination node
    and forwards it over NVLink (DeepEP's normal mode, as DeepSeek and SGLang serve it); decode's
    low-latency mode and training's all-to-all send every (token, expert) pair, decode's kernels at a fixed
    cost a call (LOW_LATENCY_CALL_US)."""
    model = scenario.model
    forwarding, overhead = None, 0.0
    if opts.phase == "prefill":
        limit = node_limit(layout.nodes, expert_groups(model, opts), groups_per_token(model, opts))
        forwarding = NodeForwarding(model.moe.top_k, limit)
    elif opts.phase == "decode":
        overhead = LOW_LATENCY_CALL_US
    return LayerTimer(expert_shape(model, scenario.plan.precision), scenario.hardware, layout, forwarding, overhead)


def _placement_options(model: ModelConfig, opts: MoEOptions) -> PlacementOptions:
    return PlacementOptions(opts.redundant_experts, expert_groups(model, opts), opts.coactivation_weight)


def _eplb_side_by_side(stats: RoutingStats, popts: PlacementOptions, opts: MoEOptions) -> dict:
    """With an EPLB placement, both policies on the loads they were fitted on: exact EPLB's GPU load
    max/mean and eplb-fallback's, and on how many layers they differ."""
    if opts.placement not in SLOTTED:
        return {}
    exact = fit_placement("eplb", stats, popts)
    fallback = fit_placement("eplb-fallback", stats, popts)
    ratio = {p.name: max_over_mean(gpu_loads(p, stats.load)) for p in (exact, fallback)}
    return {"fit_max_over_mean_gpu_load_eplb": float(ratio["eplb"].mean()),
            "fit_max_over_mean_gpu_load_eplb_fallback": float(ratio["eplb-fallback"].mean()),
            "eplb_fallback_layers_changed": int((exact.slot_expert != fallback.slot_expert).any(1).sum())}


def _contiguous(stats: RoutingStats, popts: PlacementOptions):
    """Megatron's layout, the baseline; None where the experts do not divide over the GPUs (EP144)."""
    return fit_placement("contiguous", stats, popts) if stats.experts % stats.gpus == 0 else None


def _stats_of_loads(loads: np.ndarray, layout: Layout) -> RoutingStats:
    """What a placement is fitted on when only loads are known (tokens spread evenly over the nodes)."""
    nodes = layout.nodes
    return RoutingStats(loads, np.repeat(loads[:, None, :] / nodes, nodes, axis=1), None, 0,
                        layout.gpus, layout.gpus_per_node)


def _large_batch_costs(scenario: Scenario, opts: MoEOptions, layout: Layout):
    """Batches larger than `sampled_window` tokens (prefill, EP144+ decode): the routing is read in batches
    of `sampled_window` tokens, the placement fitted on the fit part, and the costs taken on the expected
    counts of the evaluated part's per-expert loads at the real batch (sampling noise of a batch that
    large is small; domain grouping, which needs token positions, is not modelled here)."""
    if opts.group_by != "none":
        raise TraceInputError(None, f"--group-by {opts.group_by} needs batches of at most {opts.sampled_window} "
                                    f"tokens (EP{layout.gpus} x {layout.tokens_per_gpu}): raise moe.sampled_window")
    model = scenario.model
    E = model.moe.num_experts
    small = dataclasses.replace(layout, tokens_per_gpu=max(1, opts.sampled_window // layout.gpus))
    # generated routing: just the tokens of one sampled batch in each part
    src = open_routing(dataclasses.replace(opts, synthetic_tokens=min(opts.synthetic_tokens, 2 * opts.sampled_window)),
                       model, small.window)     # (the same generated trace whatever the EP degree)
    split = split_trace(src, opts)
    stats = fit_stats(split.fit, *split.fit_range, small, E,
                      coactivation_tokens=32768 if opts.placement == "locality" else 0)
    seen = fit_stats(split.evaluate, *split.eval_range, small, E, coactivation_tokens=0).load.astype(float)
    if (seen.max(1) <= 0).any():
        raise TraceInputError(src.path, "the evaluated tokens route nothing in some MoE layer")
    split = dataclasses.replace(split, note=split.note + f"; costed on the expected counts of the evaluated "
                                                         f"tokens' expert loads (a batch of {layout.window} tokens "
                                                         f"> sampled_window {opts.sampled_window})")
    return (split, *_load_costs(scenario, opts, layout, stats, rescale_loads(seen)))


def _load_costs(scenario: Scenario, opts: MoEOptions, layout: Layout, stats: RoutingStats, loads: np.ndarray):
    """Placement fitted on `stats` (the given loads: what EPLB balances); costs on the expected counts of
    `loads`: each rank routes tokens x top-k pairs, shared over the experts in proportion to the loads."""
    model = scenario.model
    popts = _placement_options(model, opts)
    placement = fit_placement(opts.placement, stats, popts)
    contiguous = _contiguous(stats, popts)
    timer = layer_timer(scenario, opts, layout)
    timer.comparison = _eplb_side_by_side(stats, popts, opts)
    costs = evaluate_expected(loads, model.moe.top_k, layout, [placement] + ([contiguous] if contiguous else []),
                              timer)
    return costs[0], costs[-1], timer


def _placement_costs(scenario: Scenario, opts: MoEOptions, layout: Layout, split: Split, progress):
    """Fit the placement, then cost it and the contiguous / arrival-order baseline on the same tokens."""
    E = scenario.model.moe.num_experts
    stats = fit_stats(split.fit, *split.fit_range, layout, E,
                      coactivation_tokens=32768 if opts.placement == "locality" else 0)
    popts = _placement_options(scenario.model, opts)
    placement = fit_placement(opts.placement, stats, popts)
    timer = layer_timer(scenario, opts, layout)
    timer.comparison = _eplb_side_by_side(stats, popts, opts)
    base_layout = dataclasses.replace(layout, group_by="none")
    contiguous = _contiguous(stats, popts)
    if layout.group_by == "none" or contiguous is None:
        costs = evaluate_placements(split.evaluate, *split.eval_range, layout, E,
                                    [placement] + ([contiguous] if contiguous else []), timer,
                                    opts.timed_windows, progress)
        return costs[0], costs[-1], timer
    cost = evaluate_placements(split.evaluate, *split.eval_range, layout, E, [placement], timer,
                               opts.timed_windows, progress)[0]
    base = evaluate_placements(split.evaluate, *split.eval_range, base_layout, E, [contiguous], timer,
                               opts.timed_windows)[0]
    return cost, base, timer


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
        "routed_slots_per_gpu": cost.placement.slots_per_gpu,
        "shared_experts_per_gpu": scenario.model.moe.shared_experts,
        "redundant_experts": cost.placement.slots - cost.placement.experts,
        "expert_groups": expert_groups(scenario.model, opts),
    }
    baseline = ("contiguous placement, arrival-order batching" if base is not cost else
                f"none ({cost.placement.experts} experts do not divide over EP{layout.gpus}: the contiguous "
                f"columns repeat the placement)")
    notes = [split.note, f"a2a bytes per forward batch of {layout.window} tokens over all MoE layers; baseline: "
                         f"{baseline}"]
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
def serving_spec(scenario: Scenario, opts: MoEOptions, layout: Layout) -> ServingSpec:
    return ServingSpec(opts.phase, layout.tokens_per_gpu, opts.context, opts.attention_tp, opts.overlap,
                       opts.mtp_acceptance, scenario.plan.precision, kv_bytes=1 if opts.kv_dtype == "fp8" else 2,
                       draft_tokens=opts.mtp_draft_tokens, acceptance_length=opts.mtp_acceptance_length)


def _inference(scenario: Scenario, opts: MoEOptions, layout: Layout, cost: PlacementCost, timer: LayerTimer,
               pred: Prediction) -> None:
    """Serving figures of the deployment (`estimators.moe.serving`) from the placement's timed parts."""
    model = scenario.model
    spec = serving_spec(scenario, opts, layout)
    est = serve(model, scenario.hardware, spec,
                lambda scale: moe_layer_parts(cost, timer, scale))
    parts = est.parts_us
    moe_parts = parts["shared_experts"] + parts["routed_experts"] + parts["dispatch"] + parts["combine"]
    forward_us = est.forward_us
    pred.step_time_s = forward_us / 1e6
    pred.tokens_per_s = est.tokens_per_s_per_gpu * layout.gpus
    node_gpus = scenario.hardware.node.gpus_per_node         # a physical node (an EP4 group is half of one)
    per_node = est.tokens_per_s_per_gpu * node_gpus
    pred.metrics.update({
        "forward_latency_us": forward_us, f"{opts.phase}_latency_us": forward_us,
        "dense_forward_us": sum(v for k, v in parts.items() if k not in ("shared_experts", "routed_experts",
                                                                          "dispatch", "combine", "overlap_saved")),
        "moe_parts_us": moe_parts,
        f"{opts.phase}_tokens_per_s": pred.tokens_per_s,
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu, "tokens_per_s_per_node": per_node,
        "time_per_forward_ms": forward_us / 1e3,
        "time_per_output_token_ms": est.time_per_output_token_ms if opts.phase == "decode" else None,
        "sequences_per_gpu": est.sequences_per_gpu,
        "tokens_per_step_per_sequence": est.tokens_per_step_per_sequence if opts.phase == "decode" else None,
        "overlap": opts.overlap, "attention_tp": opts.attention_tp, "attention_dp": layout.gpus // opts.attention_tp,
        "mtp_acceptance": opts.mtp_acceptance, "mtp_acceptance_length": opts.mtp_acceptance_length,
        "mtp_draft_tokens": draft_tokens(model, spec),
    })
    pred.detail["serving_parts_us"] = {k: float(v) for k, v in parts.items()}
    mem = serving_memory(model, spec, cost.placement.slots_per_gpu)
    pred.memory_gib_per_gpu = mem.total / GIB
    capacity = hbm_capacity_gib(scenario.hardware)
    pred.oom = pred.memory_gib_per_gpu > capacity
    pred.detail["serving_memory_gib"] = {"expert_weights": mem.expert_weights / GIB,
                                         "other_weights": mem.other_weights / GIB, "kv_cache": mem.kv_cache / GIB,
                                         "total": mem.total / GIB, "capacity": capacity}
    if pred.oom:
        pred.notes.append(f"OUT OF MEMORY: {pred.memory_gib_per_gpu:.1f} GiB per GPU (experts "
                          f"{mem.expert_weights / GIB:.1f}, other weights {mem.other_weights / GIB:.1f}, KV cache "
                          f"{mem.kv_cache / GIB:.1f}) > {capacity:.0f} GiB: fewer tokens per GPU, a shorter context "
                          "or more GPUs")
    what = "input" if opts.phase == "prefill" else "output"
    pred.notes.append(f"{opts.phase}: {layout.tokens_per_gpu} routed tokens per GPU per forward on EP{layout.gpus}, "
                      f"{opts.context}-token {'prompts' if opts.phase == 'prefill' else opts.kv_dtype.upper() + ' KV cache'}"
                      f", attention "
                      f"{'TP' + str(opts.attention_tp) if opts.attention_tp > 1 else 'DP' + str(layout.gpus)}, "
                      f"overlap {opts.overlap}: {per_node:,.0f} {what} tokens/s per {node_gpus}-GPU node")


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
    # measured routing makes every micro-batch and MoE layer differ: the fast (composed) estimate does not
    # apply, so both steps run the full replay and compare like with like
    mode = "symmetric" if scenario.simulation == "fast" else scenario.simulation
    measured = predict(model, plan, hw, mode=mode, moe_loads=moe_loads(cost))
    balanced = predict(model, plan, hw, mode=mode)
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
