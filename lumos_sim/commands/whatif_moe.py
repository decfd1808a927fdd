"""`lumos-sim whatif moe`: expert routing, expert placement and micro-batch grouping -> all-to-all bytes
(intra / inter node), per-GPU load, MoE layer latency, prefill/decode latency and throughput, or the
EP training step time (see `estimators.moe.whatif`)."""
from __future__ import annotations

import sys

from chakra_schema.errors import TraceInputError

EPILOG = """\
--routing takes a trace (.npy [tokens, layers, top_k] from vLLM, a directory of layer_*.parquet with
indices/scores, Megatron-core routing .jsonl, or token-record .jsonl) or synthetic[:k=v,...] with any of
tokens, domains, skew, skew_jitter, domain_share, clusters, cluster_affinity, request_tokens,
prefill_fraction, decode_correlation, drift, seed, balanced. The placement is fitted on one part of the
trace and evaluated on another (--fit). Example:
  lumos-sim whatif moe --model deepseek-v3 --routing synthetic:domains=8 --ep 64 --placement locality \\
      --group-by domain --phase decode --json
"""


def register_moe(wsub) -> None:
    import argparse

    from estimators.moe.placement import PLACEMENTS
    from lumos_sim.commands.whatif import add_set_argument

    p = wsub.add_parser("moe", help="MoE routing + expert placement -> all-to-all bytes, load, latency",
                        description=__doc__.splitlines()[0], epilog=EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="deepseek-v3 | llama4-maverick | qwen3-235b-a22b | model TOML")
    p.add_argument("--routing", default="synthetic", help="routing trace path, or synthetic[:k=v,...] (default)")
    p.add_argument("--expert-load", metavar="FILE", help="[layers][experts] token counts (JSON or CSV) "
                                                         "when only loads are known")
    p.add_argument("--ep", type=int, required=True, help="expert-parallel degree (GPUs of the EP group)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the hardware preset's)")
    p.add_argument("--placement", default="contiguous", choices=list(PLACEMENTS),
                   help="expert placement on the EP ranks (default contiguous)")
    p.add_argument("--redundant-experts", type=int, default=0, help="eplb: extra physical expert slots")
    p.add_argument("--group-by", choices=["none", "domain"], default="none",
                   help="micro-batch grouping: batch requests of one domain together")
    p.add_argument("--phase", choices=["prefill", "decode", "train"], default="decode",
                   help="inference prefill / decode, or an EP training step (default decode)")
    p.add_argument("--tokens", type=int, default=0, help="routed tokens per GPU per forward "
                                                         "(default 4096 prefill, 128 decode)")
    p.add_argument("--context", type=int, default=4096, help="inference: prompt / KV-cache length")
    p.add_argument("--fit", choices=["first-half", "prefill", "all"], default="first-half",
                   help="which tokens the placement is fitted on (evaluated on the others)")
    p.add_argument("--hardware", default="h100-sxm", help="hardware preset name or TOML path")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp8"),
                   help="fp8: FP8 dispatch, BF16 combine (default bf16)")
    train = p.add_argument_group("training (--phase train)")
    train.add_argument("--dp", type=int, help="data-parallel degree (default: --ep)")
    train.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (default 1)")
    train.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default 4096)")
    train.add_argument("--global-batch", type=int, help="sequences per step (default: 2 x dp)")
    train.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_set_argument(p)
    p.set_defaults(func=main_moe)


def scenario_from_args(args):
    """The `moe` scenario of the flags, with --set overrides on top."""
    from estimators.model_config import load_model
    from estimators.parallelism.plan import ParallelPlan
    from estimators.scenario import Scenario
    from estimators.registry import option_sections
    from replay.hardware.config import get_hardware

    if args.ep < 2:
        raise TraceInputError(None, "--ep must be >= 2")
    model = load_model(args.model)
    if model.moe is None:
        raise TraceInputError(args.model, "is not a MoE model")
    hw = get_hardware(args.hardware)
    dp = args.dp or args.ep
    plan = ParallelPlan(pp=args.pp, dp=dp, ep=args.ep, seq_len=args.seq_len, micro_batch=args.micro_batch,
                        global_batch=args.global_batch or 2 * dp * args.micro_batch, precision=args.precision)
    opts = option_sections()["moe"](
        routing=args.routing, expert_load=args.expert_load or "", placement=args.placement,
        redundant_experts=args.redundant_experts, group_by=args.group_by, phase=args.phase, tokens=args.tokens,
        context=args.context, fit=args.fit)
    s = Scenario(whatif="moe", model=model, hardware=hw, plan=plan, moe=opts)
    if args.gpus_per_node:
        s = s.override({"hardware.node.gpus_per_node": args.gpus_per_node})
    return s.override_strings(args.overrides)


def result_json(pred) -> dict:
    """The prediction's JSON with the MoE figures at the top level."""
    out = pred.to_json()
    if not any(out.get("breakdown", {}).values()):   # inference what-ifs simulate no step: no breakdown
        out.pop("breakdown", None)
    out.update({k: v for k, v in pred.metrics.items()})
    out.update(pred.detail or {})
    return out


def main_moe(args) -> int:
    from lumos_sim.commands.whatif import _print_json, evaluate_with_progress

    scenario = scenario_from_args(args)
    pred = evaluate_with_progress(scenario, "routing")
    if args.json:
        _print_json(result_json(pred))
    else:
        _print_table(scenario, pred)
    return 0


def _print_table(scenario, pred) -> None:
    from lumos_sim.tables import console as make_console
    from rich.table import Table

    m, opts = pred.metrics, scenario.moe
    console = make_console()
    t = Table(title=f"{scenario.model.name} EP{m['ep']} on {m['nodes']} x {scenario.hardware.name} nodes: "
                    f"{opts.placement}" + (f" + group-by {opts.group_by}" if opts.group_by != "none" else "")
                    + f", {opts.phase}")
    t.add_column("metric")
    t.add_column("what-if", justify="right")
    t.add_column("contiguous", justify="right")
    gb = 1 / 2 ** 30
    rows = [
        ("all-to-all GiB per batch", f"{m['a2a_bytes'] * gb:.2f}", ""),
        ("  inter-node GiB", f"{m['a2a_bytes_inter_node'] * gb:.2f}", f"{m['contiguous_a2a_bytes_inter_node'] * gb:.2f}"),
        ("  inter-node reduction", f"{100 * m['a2a_reduction_vs_contiguous']:.1f}%", ""),
        ("GPU load max/mean (mean, worst layer)", f"{m['max_over_mean_gpu_load']:.3f}, "
                                                  f"{m['max_over_mean_gpu_load_worst_layer']:.3f}",
         f"{m['contiguous_max_over_mean_gpu_load']:.3f}"),
        ("MoE layer latency us (mean)", f"{m['layer_latency_us_mean']:.1f}", f"{m['contiguous_layer_latency_us_mean']:.1f}"),
        ("  dispatch / experts / combine us", f"{m['dispatch_us_mean']:.1f} / {m['expert_gemm_us_mean']:.1f} / "
                                             f"{m['combine_us_mean']:.1f}", ""),
        ("MoE latency us (all layers)", f"{m['moe_latency_us']:.1f}", f"{m['contiguous_moe_latency_us']:.1f}"),
    ]
    if opts.phase == "train":
        rows.append(("step time s", f"{pred.step_time_s:.4f}", f"{m['balanced_step_time_s']:.4f} (balanced routing)"))
    else:
        rows.append((f"{opts.phase} forward latency ms", f"{m['forward_latency_us'] / 1000:.2f}", ""))
        rows.append((f"{opts.phase} tokens/s", f"{pred.tokens_per_s:,.0f}", ""))
    for r in rows:
        t.add_row(*r)
    console.print(t)
    for note in pred.notes:
        console.print(note)
