"""Flags and helpers shared by the `whatif` sub-commands (parallelism, failures, moe) and `sweep`: the
model / plan flags and the plan they give, `--set`, evaluation with a progress bar, JSON output. The
sub-commands import from here; nothing here imports them."""
from __future__ import annotations

import argparse
import re
import sys

import orjson

from chakra_schema.errors import TraceInputError
from lumos_sim.progress import progress_bar


def add_plan_arguments(parser, required: bool = True) -> None:
    """The model / plan flags of `whatif parallelism`, shared by what-ifs that take a training plan
    (`required=False`: the model is optional, and so are --seq-len and --global-batch until one is given)."""
    parser.add_argument("--model", required=required, help="zoo name (e.g. llama3-405b) or a model TOML path")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware preset name or TOML path")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the job (= tp*pp*cp*dp)")
    # plan flags default to None so that `--search` can tell the ones given (its constraints) from the
    # defaults (PLAN_DEFAULTS, filled in by plan_from_args)
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (GPUs sharing each layer, in a node; default 1)")
    parser.add_argument("--pp", type=int, default=None, help="pipeline-parallel stages (default 1)")
    parser.add_argument("--cp", type=int, default=None, help="context-parallel degree (sequence split across GPUs; default 1)")
    parser.add_argument("--dp", type=int, default=None, help="default: gpus / (tp*pp*cp)")
    parser.add_argument("--ep", type=int, default=None,
                        help="expert-parallel degree (MoE models; ep*etp divides tp*cp*dp: the expert grid; default 1)")
    parser.add_argument("--etp", type=int, default=1,
                        help="expert-tensor-parallel degree: experts on their own etp x ep x edp grid over the "
                             "same ranks (Megatron MoE parallel folding; default 1)")
    parser.add_argument("--vp", type=int, default=None, help="virtual pipeline stages per rank (interleaved 1F1B; default 1)")
    parser.add_argument("--seq-len", type=int, required=required, help="tokens per sequence")
    parser.add_argument("--global-batch", type=int, required=required, help="sequences per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch (default 1)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp8"), help="GEMM precision (default bf16)")
    parser.add_argument("--recompute", default=None, choices=("none", "selective", "full", "op"),
                        help="activation recomputation (default none); op: PyTorch per-op selective "
                             "checkpointing (torchtitan's 'op' policy: every second matmul of a block recomputed)")
    parser.add_argument("--zero", type=int, default=None, choices=(0, 1, 2, 3),
                        help="ZeRO stage: 0 DDP, 1 distributed optimizer (default), 2, 3 FSDP")
    parser.add_argument("--dp-shard", type=int, default=0, help="HSDP: shard within groups of this many DP ranks")
    parser.add_argument("--no-sequence-parallel", action="store_true", help="TP without sequence parallelism")
    g = parser.add_argument_group("layout details (Megatron-Core / NeMo recipe options)")
    g.add_argument("--first-stage-layers", type=layer_count, default=0, help="layers of the first pipeline chunk (uneven PP)")
    g.add_argument("--last-stage-layers", type=layer_count, default=0, help="layers of the last pipeline chunk (uneven PP)")
    g.add_argument("--pipeline-layout", type=_int_list, default=(), metavar="N,N,...",
                   help="transformer layers of every pipeline chunk (pp*vp counts, in pipeline order)")
    g.add_argument("--recompute-layers", type=layer_count, default=0,
                   help="with --recompute full: only the first N layers of each chunk (0: all)")
    g.add_argument("--recompute-modules", type=_name_list, default=(), metavar="M,M",
                   help="with --recompute selective: core_attn, mla_up_proj, mlp, moe, moe_act, shared_experts, "
                        "layernorm")
    g.add_argument("--moe-capacity-factor", type=float, default=0.0,
                   help="token drop: each expert takes at most this x its mean tokens (padded); 0: dropless")
    g.add_argument("--moe-unbalanced", action="store_true",
                   help="dropless routing balanced only in expectation (default: force-balanced)")
    g.add_argument("--moe-a2a", default="alltoall",
                   help="alltoall (NCCL) | deepep | hybridep (fused NVLink+RDMA dispatch/combine)")
    g.add_argument("--fp8-recipe", default="delayed",
                   help="delayed | tensorwise (current scaling, FP8-CS) | blockwise | mxfp8")
    g.add_argument("--cuda-graphs", action="store_true", help="layers run as CUDA graphs: no per-kernel launch cost")
    g.add_argument("--cuda-graph-scope", type=_name_list, default=(), metavar="M,M",
                   help="only these modules of each layer run as CUDA graphs (Megatron-Core cuda_graph_scope): "
                        "attn, moe_router, moe_preprocess")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="pipeline TP all-gathers / reduce-scatters with the GEMMs (userbuffers)")
    g.add_argument("--fsdp", default="megatron", help="with --zero 3: megatron (Megatron-FSDP) | fsdp2")
    g.add_argument("--fsdp-reduce-dtype", default="", metavar="{bf16,fp32}",
                   help="with --zero 3: gradient reduce-scatter dtype (default: fp32 for fsdp2, bf16 for megatron)")
    g.add_argument("--fsdp-defer-grad-sync", action="store_true",
                   help="with --fsdp fsdp2: reduce gradients after the last micro-batch only (unsharded gradients "
                        "accumulate in memory; default: after every micro-batch's backward)")
    g.add_argument("--fsdp-fp8-all-gather", action="store_true",
                   help="with --zero 3 and --precision fp8: gather FP8 weights as FP8 (torchao / Megatron-FSDP)")
    g.add_argument("--finetune", default="none", help="none | sft (packed sequences) | lora (frozen base)")
    g.add_argument("--packed-doc-len", type=int, default=0, help="SFT: mean document length in a packed sequence")
    g.add_argument("--lora-rank", type=int, default=16, help="LoRA adapter rank")
    g.add_argument("--attention-kernel", default="fa2",
                   help="fa2 (FlashAttention-2) | cudnn (cuDNN fused flash attention, Transformer Engine 2.x)")


def add_set_argument(parser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override any scenario field by its dotted name, e.g. plan.tp=4, "
                             "hardware.network.nic_gbps=800, model.layers=40 (repeatable)")


def evaluate_with_progress(scenario, label: str = "simulating"):
    from estimators.registry import evaluate
    with progress_bar(label) as cb:
        return evaluate(scenario, progress=cb)


PLAN_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vp": 1, "micro_batch": 1, "recompute": "none", "zero": 1}


def _int_list(text: str) -> tuple[int, ...]:
    # every comma separates a plain number: '16,,16' is a typo, not 16,16, and int()'s '1_6' or '١٦' are not
    # how anyone writes a layer count
    items = [x.strip() for x in text.split(",")]
    if not all(_COUNT.fullmatch(x) for x in items):
        raise argparse.ArgumentTypeError(f"expected integers >= 0 like 4,8,8,4, got {text!r}")
    return tuple(int(x) for x in items)


def layer_count(text: str) -> int:
    """A count of layers: plain ASCII digits (see _int_list)."""
    if not _COUNT.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


_COUNT = re.compile(r"[0-9]+")


def _name_list(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(","))
    if not all(names) or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"expected distinct names like core_attn,mlp, got {text!r}")
    return names


def plan_option_flags(args) -> dict:
    """The plan fields of the layout-detail and option flags (--etp ... --attention-kernel, --moe-unbalanced),
    by ParallelPlan field name."""
    extra = {}
    for key in ("etp", "first_stage_layers", "last_stage_layers", "pipeline_layout", "recompute_layers",
                "recompute_modules", "moe_capacity_factor", "moe_a2a", "fp8_recipe", "cuda_graphs", "cuda_graph_scope",
                "tp_comm_overlap", "fsdp", "fsdp_reduce_dtype", "fsdp_defer_grad_sync", "fsdp_fp8_all_gather",
                "finetune", "packed_doc_len", "lora_rank", "attention_kernel"):
        if hasattr(args, key):
            extra[key] = getattr(args, key)
    if getattr(args, "moe_unbalanced", False):
        extra["moe_force_balance"] = False
    return extra


def check_search_flags(extra: dict, zero: int | None, recompute: str | None) -> None:
    """Option flags that do nothing in the search asked for (a single plan's are validate_plan's): the FSDP
    options when the search is held off ZeRO-3 (`zero` None: free to choose, they go to its ZeRO-3
    candidates), --recompute-modules when it is held to another recompute policy."""
    from estimators.parallelism.plan import ParallelPlan, fsdp_options_set
    fsdp_flags = fsdp_options_set(ParallelPlan(**{k: v for k, v in extra.items()
                                                  if k.startswith("fsdp") and v is not None}))
    if fsdp_flags and zero is not None and zero != 3:
        raise TraceInputError(None, f"{fsdp_flags[0]} needs --zero 3 (FSDP)")
    if extra.get("recompute_modules") and recompute != "selective":
        raise TraceInputError(None, "--recompute-modules needs --recompute selective")


def plan_from_args(args, model, validate: bool = True):
    from estimators.parallelism.plan import ParallelPlan, validate_plan

    if args.gpus < 1:
        raise TraceInputError(None, "--gpus must be >= 1")
    for key, default in PLAN_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, default)
    for key in ("tp", "pp", "cp"):
        if getattr(args, key) < 1:
            raise TraceInputError(None, f"--{key} must be >= 1, got {getattr(args, key)}")
    dp = args.dp
    if dp is None:
        denom = args.tp * args.pp * args.cp
        if denom < 1 or args.gpus % denom:
            raise TraceInputError(None, f"--gpus {args.gpus} is not divisible by tp*pp*cp = {denom}")
        dp = args.gpus // denom
    extra = plan_option_flags(args)
    plan = ParallelPlan(tp=args.tp, pp=args.pp, cp=args.cp, dp=dp, ep=args.ep, vp=args.vp, seq_len=args.seq_len,
                        global_batch=args.global_batch, micro_batch=args.micro_batch, precision=args.precision,
                        recompute=args.recompute, zero=args.zero, dp_shard=args.dp_shard,
                        sequence_parallel=not args.no_sequence_parallel, **extra)
    if validate:
        validate_plan(model, plan, args.gpus)
    return plan


def print_json(obj) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
