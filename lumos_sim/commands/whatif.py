"""`lumos-sim whatif`: what-if estimates.

- `whatif parallelism`: a model (zoo name or TOML) on a GPU count with a parallelism plan -> predicted
  step time, throughput, TFLOP/s per GPU, MFU, memory per GPU, breakdown; `--search` ranks every valid
  plan by predicted throughput within memory.
- `whatif trace INPUT`: a converted real trace with a changed data-parallel degree, layer count, or
  hardware (the Lumos way: edit the graph, replay it).
"""
from __future__ import annotations

import sys

import orjson

from chakra_schema.errors import TraceInputError
from lumos_sim.progress import progress_bar


def register(sub) -> None:
    p = sub.add_parser("whatif", help="what-if estimates: parallelism plans, or changes to a real trace",
                       description=__doc__.splitlines()[0] if __doc__ else None)
    wsub = p.add_subparsers(dest="whatif_command", metavar="KIND")

    par = wsub.add_parser("parallelism", help="predict a training plan (or --search all plans) for a model")
    par.add_argument("--model", required=True, help="zoo name (e.g. llama3-405b) or a model TOML path")
    par.add_argument("--hardware", default="h100-sxm", help="hardware preset name or TOML path")
    par.add_argument("--gpus", type=int, required=True, help="GPUs in the job (= tp*pp*cp*dp)")
    par.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (GPUs sharing each layer, in a node)")
    par.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages")
    par.add_argument("--cp", type=int, default=1, help="context-parallel degree (sequence split across GPUs)")
    par.add_argument("--dp", type=int, default=None, help="default: gpus / (tp*pp*cp)")
    par.add_argument("--ep", type=int, default=1, help="expert-parallel degree (MoE models; divides dp)")
    par.add_argument("--vp", type=int, default=1, help="virtual pipeline stages per rank (interleaved 1F1B)")
    par.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    par.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    par.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    par.add_argument("--precision", default="bf16", help="bf16 | fp8")
    par.add_argument("--recompute", default="none", help="none | selective | full")
    par.add_argument("--zero", type=int, default=1, help="0 DDP, 1 distributed optimizer, 2, 3 FSDP")
    par.add_argument("--dp-shard", type=int, default=0, help="HSDP: shard within groups of this many DP ranks")
    par.add_argument("--no-sequence-parallel", action="store_true", help="TP without sequence parallelism")
    par.add_argument("--full-simulation", action="store_true",
                     help="simulate every rank instead of one per pipeline stage (slow; for checking)")
    par.add_argument("--search", action="store_true", help="rank every valid plan for --gpus by throughput")
    par.add_argument("--max-plans", type=int, default=24, help="with --search: plans to simulate")
    par.add_argument("--json", action="store_true", help="print JSON instead of a table")
    par.set_defaults(func=main_parallelism)

    tr = wsub.add_parser("trace", help="change DP degree / layer count / hardware of a real trace and replay it")
    tr.add_argument("inputs", nargs="+", metavar="INPUT", help="trace or .et input(s), as for `lumos-sim replay`")
    tr.add_argument("--dp", type=int, help="new data-parallel degree")
    tr.add_argument("--layers", type=int, help="new number of transformer layers")
    tr.add_argument("--hardware", help="replay on this hardware preset (translated timing)")
    tr.add_argument("--source-hardware", help="GPU the trace was recorded on (when not in the trace)")
    tr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tr.set_defaults(func=main_trace)
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])


# ------------------------------------------------------------------------------ parallelism
def _plan_from_args(args, model):
    from estimators.plan import ParallelPlan, validate_plan

    if args.gpus < 1:
        raise TraceInputError(None, "--gpus must be >= 1")
    dp = args.dp
    if dp is None:
        denom = args.tp * args.pp * args.cp
        if denom < 1 or args.gpus % denom:
            raise TraceInputError(None, f"--gpus {args.gpus} is not divisible by tp*pp*cp = {denom}")
        dp = args.gpus // denom
    plan = ParallelPlan(tp=args.tp, pp=args.pp, cp=args.cp, dp=dp, ep=args.ep, vp=args.vp, seq_len=args.seq_len,
                        global_batch=args.global_batch, micro_batch=args.micro_batch, precision=args.precision,
                        recompute=args.recompute, zero=args.zero, dp_shard=args.dp_shard,
                        sequence_parallel=not args.no_sequence_parallel)
    validate_plan(model, plan, args.gpus)
    return plan


def _check_counts(**counts) -> None:
    """Counts checked before any work: a typo such as 10000000000 GPUs must not allocate first."""
    from estimators.plan import MAX_GPUS
    for name, v in counts.items():
        if v is not None and not 1 <= v <= MAX_GPUS:
            raise TraceInputError(None, f"--{name.replace('_', '-')} must be between 1 and {MAX_GPUS:,}, got {v}")


def main_parallelism(args) -> int:
    from estimators.model_config import load_model
    from estimators.whatif_parallel import predict, resolve_hardware, search

    _check_counts(gpus=args.gpus, dp=args.dp, max_plans=args.max_plans if args.search else None)
    model = load_model(args.model)
    hw = resolve_hardware(args.hardware)
    if args.search:
        with progress_bar("simulating plans") as cb:
            results = search(model, hw, args.gpus, args.seq_len, args.global_batch, args.precision,
                             max_plans=args.max_plans, progress=cb)
        if not results:
            raise TraceInputError(None, f"no valid plan of {args.gpus} GPUs fits {model.name} in memory on {hw.name}")
        if args.json:
            _print_json([r.to_json() | {"breakdown": _short(r.breakdown)} for r in results])
        else:
            _print_search(results)
        return 0
    plan = _plan_from_args(args, model)
    with progress_bar("simulating") as cb:
        result = predict(model, plan, hw, mode="all" if args.full_simulation else "symmetric", progress=cb)
    if args.json:
        d = result.to_json()
        d["breakdown"] = _short(result.breakdown)
        _print_json(d)
    else:
        _print_prediction(result)
    return 0


def _short(bd: dict) -> dict:
    keys = ("step_s", "compute_s", "exposed_comm_s", "exposed_tp_comm_s", "exposed_cp_comm_s",
            "exposed_ep_comm_s", "exposed_pp_comm_s", "exposed_dp_comm_s", "bubble_s", "bubble_fraction")
    out = {k: bd[k] for k in keys if k in bd}
    out["exposed_comm_by_kind_s"] = {k: bd.get(f"exposed_{k}_comm_s", 0.0) for k in ("tp", "cp", "ep", "pp", "dp")}
    out["pipeline_bubble_s"] = bd.get("bubble_s", 0.0)
    return out


def _print_json(obj) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")


def _plan_text(p) -> str:
    s = f"TP{p.tp} PP{p.pp}" + (f"x{p.vp}" if p.vp > 1 else "") + f" CP{p.cp} DP{p.dp}"
    if p.ep > 1:
        s += f" EP{p.ep}"
    recompute = "no recompute" if p.recompute == "none" else f"{p.recompute} recompute"
    return s + f", micro-batch {p.micro_batch}, {recompute}, ZeRO-{p.zero}"


def _print_prediction(r) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 80)
    p = r.plan
    t = Table(title=f"{r.model} on {p.gpus} x {r.hardware}: {_plan_text(p)}, seq {p.seq_len}, "
                    f"global batch {p.global_batch} ({p.micro_batches} micro-batches)")
    t.add_column("metric", overflow="fold")
    t.add_column("value", justify="right", overflow="fold")
    bd = r.breakdown
    rows = [("step time", f"{r.step_time_s:.3f} s"), ("tokens/s", f"{r.tokens_per_s:,.0f}"),
            ("model TFLOP/s per GPU", f"{r.tflops_per_gpu:.1f}"), ("hardware TFLOP/s per GPU", f"{r.hw_tflops_per_gpu:.1f}"),
            ("MFU", f"{100 * r.mfu:.1f}%"),
            ("memory per GPU", f"{r.memory.total_gib:.1f} GiB" + (" (OUT OF MEMORY, see below)" if r.oom else "")),
            ("  weights / grads / optimizer / activations",
             f"{r.memory.weights_gib:.1f} / {r.memory.grads_gib:.1f} / {r.memory.optimizer_gib:.1f} / {r.memory.activations_gib:.1f}"),
            ("compute", f"{bd['compute_s']:.3f} s")]
    for k in ("tp", "cp", "ep", "pp", "dp"):
        v = bd.get(f"exposed_{k}_comm_s", 0.0)
        if v > 0:
            rows.append((f"exposed {k.upper()} communication", f"{v:.3f} s"))
    rows.append(("pipeline bubble / idle", f"{bd['bubble_s']:.3f} s ({100 * bd['bubble_fraction']:.1f}%)"))
    rows.append(("simulated ranks / nodes / wall", f"{r.simulated_ranks} / {r.num_nodes:,} / {r.wall_s:.1f} s"))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if r.oom:
        console.print(f"OUT OF MEMORY: {r.memory.total_gib:.1f} GiB per GPU is more than the "
                      f"{r.memory.capacity_gib:.1f} GiB usable on {r.hardware}; the time assumes it fit. Try "
                      "--recompute full, a larger --pp or --tp, or --zero 3.")


def _print_search(results) -> None:
    from lumos_sim.tables import console as make_console, table

    console = make_console()
    r0 = results[0]
    cols = ("#", "plan", "step\ns", "tokens\n/s", "TFLOP/s\n/GPU", "MFU", "mem\nGiB", "bubble", "exposed\ncomm s")
    t = table(f"{r0.model} on {r0.plan.gpus} x {r0.hardware}: plans ranked by predicted throughput", cols,
              right=cols[:1] + cols[2:], whole=cols[:1] + cols[2:])
    for i, r in enumerate(results, 1):
        t.add_row(str(i), _short_plan_text(r.plan), f"{r.step_time_s:.3f}", f"{r.tokens_per_s:,.0f}",
                  f"{r.tflops_per_gpu:.1f}", f"{100 * r.mfu:.1f}%", f"{r.memory.total_gib:.1f}",
                  f"{100 * r.breakdown['bubble_fraction']:.1f}%", f"{r.breakdown['exposed_comm_s']:.3f}")
    console.print(t)
    console.print("plan: TP/PP/CP/DP/EP parallel degrees (PP2x2: 2 virtual stages per rank), mb = micro-batch "
                  "size, rc = activation recompute (none, selective, full), Z = ZeRO stage (0 DDP, 1 "
                  "distributed optimizer, 2, 3 FSDP)")


def _short_plan_text(p) -> str:
    """The compact label of the search table (its legend is printed below it)."""
    s = f"TP{p.tp} PP{p.pp}" + (f"x{p.vp}" if p.vp > 1 else "") + f" CP{p.cp} DP{p.dp}"
    if p.ep > 1:
        s += f" EP{p.ep}"
    return s + f" mb{p.micro_batch} rc={p.recompute} Z{p.zero}"


# ------------------------------------------------------------------------------ trace
def main_trace(args) -> int:
    from estimators.whatif_trace import whatif_trace
    from lumos_sim.inputs import load_graphs

    if args.dp is None and args.layers is None and args.hardware is None:
        raise TraceInputError(None, "give at least one change: --dp N, --layers L or --hardware NAME")
    _check_counts(dp=args.dp, layers=args.layers)
    from replay.hardware.config import get_hardware
    for name in (args.hardware, args.source_hardware):
        if name:
            get_hardware(name)   # an unknown name fails now, not after seconds of conversion
    with progress_bar("converting") as cb:
        graphs = load_graphs(args.inputs, progress=cb)
    with progress_bar("replaying") as cb:
        res = whatif_trace(graphs, dp=args.dp, layers=args.layers, hardware=args.hardware,
                           source_hardware=args.source_hardware, progress=cb)
    if args.json:
        _print_json(res.to_json())
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 80)
    t = Table(title="trace what-if")
    t.add_column("")
    t.add_column("baseline", justify="right")
    t.add_column("what-if", justify="right")
    t.add_row("step time ms", f"{res.baseline_step_us / 1000:.3f}", f"{res.step_us / 1000:.3f}")
    t.add_row("change", "", res.describe())
    console.print(t)
    for note in res.notes:
        console.print(note)
    return 0
