"""`lumos-sim whatif moe`: expert routing, expert placement and micro-batch grouping -> all-to-all bytes
(intra / inter node), per-GPU load, MoE layer latency, prefill/decode latency and throughput, or the
EP training step time (see `estimators.moe.whatif`)."""
from __future__ import annotations

import re

from chakra_schema.errors import TraceInputError
from estimators.moe.overlap import OVERLAP_CHOICES

MAX_GPUS_PER_NODE = 4096   # one NVLink domain of GPUs; larger is a typo

EPILOG = """\
--routing takes a trace (.npy [tokens, layers, top_k] from vLLM, a directory of layer_*.parquet with
indices/scores, Megatron-core routing .jsonl, or token-record .jsonl) or synthetic[:k=v,...] with any of
tokens, domains, skew, skew_jitter, domain_share, clusters, cluster_affinity, request_tokens,
prefill_fraction, decode_correlation, drift, seed, balanced. The placement is fitted on one part of the
trace and evaluated on another (--fit). Example:
  lumos-sim whatif moe --model deepseek-v3 --routing synthetic:domains=8 --ep 64 --placement locality \\
      --group-by domain --phase decode --json
A deployment as published (flags given on the command line win over the file):
  lumos-sim whatif moe --deployment examples/deployments/deepseek-v3-decode-ep144.toml
--placement eplb is DeepSeek's EPLB exactly; eplb-fallback adds a per-layer fallback to the global policy /
contiguous layout where EPLB's layout is less balanced (both are reported side by side).
"""


def register_moe(wsub) -> None:
    import argparse

    from estimators.moe.placement import PLACEMENTS
    from lumos_sim.commands.whatif_args import add_set_argument

    p = wsub.add_parser("moe", help="MoE routing + expert placement -> all-to-all bytes, load, latency",
                        description=__doc__.splitlines()[0], epilog=EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment", metavar="FILE", help="a deployment TOML (examples/deployments/): model, EP, "
                                                         "redundant experts, phase, batch...; flags given win")
    p.add_argument("--model", help="deepseek-v3 | llama4-maverick | qwen3-235b-a22b | model TOML")
    p.add_argument("--routing", help="routing trace path, or synthetic[:k=v,...] (default)")
    p.add_argument("--expert-load", metavar="FILE", help="[layers][experts] expert loads (JSON or CSV): the "
                                                         "placement balances them, costs use their expected counts")
    p.add_argument("--ep", type=int, help="expert-parallel degree (GPUs of the EP group)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the hardware preset's)")
    p.add_argument("--placement", choices=list(PLACEMENTS),
                   help="expert placement on the EP ranks (default contiguous)")
    p.add_argument("--redundant-experts", type=int, help="eplb: extra physical expert slots (routed + "
                                                         "redundant must divide over EP)")
    p.add_argument("--groups", type=int, help="expert groups of node-limited routing (default: the model's)")
    p.add_argument("--groups-per-token", type=int, help="groups a token's experts come from (default: the model's)")
    p.add_argument("--group-by", choices=["none", "domain"],
                   help="micro-batch grouping: batch requests of one domain together")
    p.add_argument("--phase", choices=["prefill", "decode", "train"],
                   help="inference prefill / decode, or an EP training step (default decode)")
    p.add_argument("--tokens", type=int, help="routed tokens per GPU per forward "
                                              "(default 4096 prefill, 128 decode; decode with MTP: "
                                              "sequences x (1 + draft tokens))")
    p.add_argument("--context", type=int, help="inference: prompt / KV-cache length (default 4096)")
    p.add_argument("--attention-tp", type=int, help="inference: GPUs per attention group (default 1: "
                                                    "attention data-parallel beside expert EP)")
    p.add_argument("--overlap", choices=list(OVERLAP_CHOICES),
                   help="inference: dual-batch: two micro-batches in the published stage schedule of the phase, "
                        "an all-to-all hidden behind the other's stages until it is received; dual-batch-ideal: "
                        "behind any compute (an upper bound); default none")
    p.add_argument("--mtp-acceptance", type=float, help="decode: acceptance rate of each MTP draft token")
    p.add_argument("--mtp-acceptance-length", type=float,
                   help="decode: tokens a step emits per sequence, as published (e.g. 2.44 at 3 drafts), "
                        "instead of --mtp-acceptance")
    p.add_argument("--mtp-draft-tokens", type=int,
                   help="decode: draft tokens per step (default: the model's MTP layers; more run its last "
                        "MTP module again per draft)")
    p.add_argument("--kv-dtype", choices=("bf16", "fp8"),
                   help="inference: KV-cache element type (fp8: an FP8 cache, half the bytes held and read; "
                        "default bf16)")
    p.add_argument("--fit", choices=["first-half", "prefill", "all"],
                   help="which tokens the placement is fitted on (evaluated on the others)")
    p.add_argument("--hardware", help="hardware preset name or TOML path (default h100-sxm)")
    p.add_argument("--precision", choices=("bf16", "fp8"),
                   help="fp8: FP8 GEMMs and dispatch, BF16 combine (default bf16)")
    train = p.add_argument_group("training (--phase train)")
    train.add_argument("--dp", type=int, help="data-parallel degree (default: --ep)")
    train.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (default 1)")
    train.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default 4096)")
    train.add_argument("--global-batch", type=int, help="sequences per step (default: 2 x dp)")
    train.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_set_argument(p)
    p.set_defaults(func=main_moe)


DEFAULTS = {"routing": "synthetic", "expert_load": "", "placement": "contiguous", "redundant_experts": 0,
            "groups": 0, "groups_per_token": 0, "group_by": "none", "phase": "decode", "tokens": 0,
            "context": 4096, "attention_tp": 1, "overlap": "none", "mtp_acceptance": 0.0,
            "mtp_acceptance_length": 0.0, "mtp_draft_tokens": 0, "kv_dtype": "bf16", "fit": "first-half",
            "hardware": "h100-sxm", "precision": "bf16", "gpus_per_node": None}


def settings_from_args(args) -> dict:
    """Flag values over the deployment file's over the defaults."""
    from estimators.moe.deployment import load_deployment
    out = dict(DEFAULTS)
    out["model"], out["ep"] = None, None
    stated = load_deployment(args.deployment) if args.deployment else {}
    out.update(stated)
    for key in [*DEFAULTS, "model", "ep"]:
        v = getattr(args, key, None)
        if v is not None:
            out[key] = v
    if not out["model"]:
        raise TraceInputError(None, "--model is required (or a --deployment file naming it)")
    if out["ep"] is None:
        raise TraceInputError(None, "--ep is required (or a --deployment file giving it)")
    out["_stated"] = stated
    return out


def scenario_from_args(args):
    """The `moe` scenario of the flags (over a --deployment file), with --set overrides on top."""
    from estimators.model_config import load_model
    from estimators.moe.deployment import check_stated_layout
    from estimators.parallelism.plan import ParallelPlan
    from estimators.scenario import Scenario
    from estimators.registry import option_sections
    from replay.hardware.config import get_hardware

    st = settings_from_args(args)
    if st["ep"] < 2:
        raise TraceInputError(args.deployment, "--ep must be >= 2")
    gpn = st["gpus_per_node"]
    if gpn is not None and gpn < 1:
        raise TraceInputError(args.deployment, f"--gpus-per-node must be >= 1, got {gpn}")
    if gpn is not None and gpn > MAX_GPUS_PER_NODE:
        raise TraceInputError(args.deployment, f"--gpus-per-node must be at most {MAX_GPUS_PER_NODE:,}, got {gpn}")
    model = load_model(st["model"])
    if model.moe is None:
        raise TraceInputError(st["model"], "is not a MoE model")
    hw = get_hardware(st["hardware"])
    ep = st["ep"]
    dp = args.dp or ep
    plan = ParallelPlan(pp=args.pp, dp=dp, ep=ep, seq_len=args.seq_len, micro_batch=args.micro_batch,
                        global_batch=args.global_batch or 2 * dp * args.micro_batch, precision=st["precision"])
    try:
        opts = option_sections()["moe"](
            routing=st["routing"], expert_load=st["expert_load"] or "", placement=st["placement"],
            redundant_experts=st["redundant_experts"], groups=st["groups"], groups_per_token=st["groups_per_token"],
            group_by=st["group_by"], phase=st["phase"], tokens=st["tokens"], context=st["context"], fit=st["fit"],
            attention_tp=st["attention_tp"], overlap=st["overlap"], mtp_acceptance=st["mtp_acceptance"],
            mtp_acceptance_length=st["mtp_acceptance_length"], mtp_draft_tokens=st["mtp_draft_tokens"],
            kv_dtype=st["kv_dtype"])
    except TraceInputError as e:
        raise _from_deployment_file(e, args, st) from None
    if st["_stated"]:
        check_stated_layout(args.deployment, st["_stated"], model, ep, opts.redundant_experts, opts.attention_tp)
    s = Scenario(whatif="moe", model=model, hardware=hw, plan=plan, moe=opts)
    if st["gpus_per_node"] is not None:
        s = s.override({"hardware.node.gpus_per_node": st["gpus_per_node"]})
    return s.override_strings(args.overrides)


def _from_deployment_file(e: TraceInputError, args, st: dict) -> TraceInputError:
    """An option error whose value came from the --deployment file (not a flag) names the file."""
    m = re.match(r"moe\.(\w+)", e.problem or "")
    key = m.group(1) if m else ""
    if e.path is None and args.deployment and key in st["_stated"] and getattr(args, key, None) is None:
        return TraceInputError(args.deployment, e.problem)
    return e


def result_json(pred) -> dict:
    """The prediction's JSON with the MoE figures at the top level."""
    out = pred.to_json()
    if not any(out.get("breakdown", {}).values()):   # inference what-ifs simulate no step: no breakdown
        out.pop("breakdown", None)
    out.update({k: v for k, v in pred.metrics.items()})
    out.update(pred.detail or {})
    return out


def main_moe(args) -> int:
    from lumos_sim.commands.whatif_args import print_json, evaluate_with_progress

    scenario = scenario_from_args(args)
    pred = evaluate_with_progress(scenario, "routing")
    if args.json:
        print_json(result_json(pred))
    else:
        _print_table(scenario, pred)
    return 0


def _print_table(scenario, pred) -> None:
    from lumos_sim.tables import console as make_console
    from rich.table import Table

    m, opts = pred.metrics, scenario.moe
    console = make_console()
    slots = (f" ({m['routed_slots_per_gpu']} routed" + (f" incl. {m['redundant_experts']} redundant over EP"
                                                         if m['redundant_experts'] else "")
             + f" + {m['shared_experts_per_gpu']} shared per GPU)")
    t = Table(title=f"{scenario.model.name} EP{m['ep']} on {m['nodes']} x {scenario.hardware.name} nodes: "
                    f"{opts.placement}" + (f" + group-by {opts.group_by}" if opts.group_by != "none" else "")
                    + f", {opts.phase}" + slots)
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
    if "fit_max_over_mean_gpu_load_eplb" in m:
        rows.append(("fitted GPU load max/mean: eplb | eplb-fallback",
                     f"{m['fit_max_over_mean_gpu_load_eplb']:.3f} | {m['fit_max_over_mean_gpu_load_eplb_fallback']:.3f}",
                     f"{m['eplb_fallback_layers_changed']} layers differ"))
    if opts.phase == "train":
        rows.append(("step time s", f"{pred.step_time_s:.4f}", f"{m['balanced_step_time_s']:.4f} (balanced routing)"))
    else:
        what = "input" if opts.phase == "prefill" else "output"
        rows.append((f"{opts.phase} time per forward ms", f"{m['time_per_forward_ms']:.2f}", ""))
        if m.get("time_per_output_token_ms") is not None:
            rows.append(("time per output token ms", f"{m['time_per_output_token_ms']:.2f}", ""))
        rows.append((f"{what} tokens/s per GPU", f"{m['tokens_per_s_per_gpu']:,.0f}", ""))
        rows.append((f"{what} tokens/s per node", f"{m['tokens_per_s_per_node']:,.0f}", ""))
        rows.append((f"{what} tokens/s (EP{m['ep']})", f"{pred.tokens_per_s:,.0f}", ""))
        mem = pred.detail.get("serving_memory_gib", {})
        if mem:
            rows.append(("memory GiB per GPU (experts / other weights / KV)",
                         f"{mem['total']:.1f}" + (" OUT OF MEMORY" if pred.oom else ""),
                         f"{mem['expert_weights']:.1f} / {mem['other_weights']:.1f} / {mem['kv_cache']:.1f} "
                         f"of {mem['capacity']:.0f}"))
    for r in rows:
        t.add_row(*r)
    console.print(t)
    for note in pred.notes:
        console.print(note)
