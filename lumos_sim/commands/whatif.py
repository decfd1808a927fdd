"""`lumos-sim whatif`: what-if estimates.

- `whatif parallelism`: a model (zoo name or TOML) on a GPU count with a parallelism plan -> predicted
  step time, throughput, TFLOP/s per GPU, MFU, memory per GPU, breakdown; `--search` ranks every valid
  plan by predicted throughput within memory.
- `whatif failures`: failure rate, checkpoint policy and recovery strategy (sync / ft-hsdp) -> effective
  training time ratio and goodput (`lumos_sim/commands/whatif_failures.py`).
- `whatif trace INPUT`: a converted real trace with a changed data-parallel degree, layer count, or
  hardware (the Lumos way: edit the graph, replay it).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from chakra_schema.errors import TraceInputError
from lumos_sim.commands.whatif_args import (PLAN_DEFAULTS, add_plan_arguments, add_set_argument,  # noqa: F401
                                            check_search_flags, evaluate_with_progress, plan_from_args,
                                            plan_option_flags, print_json)
from lumos_sim.progress import progress_bar


def register(sub) -> None:
    p = sub.add_parser("whatif", help="what-if estimates: parallelism plans, or changes to a real trace",
                       description=__doc__.splitlines()[0] if __doc__ else None)
    wsub = p.add_subparsers(dest="whatif_command", metavar="KIND")

    par = wsub.add_parser("parallelism", help="predict a training plan (or --search all plans) for a model")
    add_plan_arguments(par)
    par.add_argument("--simulation", choices=("fast", "symmetric", "all"),
                     help="fast (default): replay a few passes per distinct pipeline stage and simulate the "
                          "pipeline schedule; symmetric: replay the whole step, one rank per stage; all: every "
                          "rank (slow; for checking)")
    par.add_argument("--full-simulation", action="store_true", help="the same as --simulation all")
    par.add_argument("--search", action="store_true", help="rank every valid plan for --gpus by throughput")
    par.add_argument("--top-k", "--max-plans", type=int, default=10, dest="top_k", metavar="K",
                     help="with --search: simulate the K plans the analytic estimate ranks best (default 10)")
    par.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_set_argument(par)
    par.set_defaults(func=main_parallelism)

    tr = wsub.add_parser("trace", help="change DP degree / layer count / hardware of a real trace, or balance "
                                       "its slow ranks, and replay it")
    tr.add_argument("inputs", nargs="*", metavar="INPUT", help="trace or .et input(s), as for `lumos-sim replay`")
    tr.add_argument("--et", help="Execution Trace pattern (raw input, e.g. 'host.{rank}.json.gz')")
    tr.add_argument("--kineto", help="Kineto trace pattern (raw input)")
    tr.add_argument("--dp", type=int, help="new data-parallel degree")
    tr.add_argument("--layers", type=int, help="new number of transformer layers")
    tr.add_argument("--hardware", help="replay on this hardware preset (translated timing)")
    tr.add_argument("--source-hardware", help="GPU the trace was recorded on (when not in the trace)")
    tr.add_argument("--balance", action="store_true",
                    help="bring the slow ranks' compute to the median rank's (a multi-rank trace)")
    tr.add_argument("--balance-ranks", type=_rank_list, default=(), metavar="R,R",
                    help="with --balance: these ranks (default: every rank computing more than the threshold "
                         "above the median)")
    tr.add_argument("--balance-threshold", type=float, default=0.05, metavar="F",
                    help="with --balance: a slow rank computes more than F above the median (default 0.05)")
    tr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_set_argument(tr)
    tr.set_defaults(func=main_trace)

    sc = wsub.add_parser("scenario", help="evaluate a scenario TOML file with any registered what-if")
    sc.add_argument("file", metavar="SCENARIO.toml", help="a scenario table (see `lumos-sim sweep --help`)")
    sc.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_set_argument(sc)
    sc.set_defaults(func=main_scenario)

    from lumos_sim.commands.whatif_failures import register as register_failures
    register_failures(wsub)
    from lumos_sim.commands.whatif_moe import register_moe
    register_moe(wsub)

    ls = wsub.add_parser("list", help="list the registered what-ifs")
    ls.set_defaults(func=main_list)
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])


# ------------------------------------------------------------------------------ parallelism
def _simulation_mode(args) -> str:
    """--simulation, or --full-simulation's 'all' (both given, they must agree); fast by default."""
    if args.full_simulation and args.simulation not in (None, "all"):
        raise TraceInputError(None, f"--full-simulation is --simulation all: it contradicts --simulation "
                                    f"{args.simulation}")
    return "all" if args.full_simulation else args.simulation or "fast"


def scenario_from_args(args):
    """The `parallelism` scenario of `whatif parallelism`'s flags, with --set overrides on top."""
    from estimators.model_config import load_model
    from estimators.scenario import Scenario, parse_assignments
    from replay.hardware.config import get_hardware

    from estimators.parallelism.plan import validate_plan

    model = load_model(args.model)
    hw = get_hardware(args.hardware)
    plan = plan_from_args(args, model, validate=False)
    s = Scenario(whatif="parallelism", model=model, hardware=hw, plan=plan, simulation=_simulation_mode(args))
    # --set applies before the plan is checked: `--set model.layers=60` may make a layout valid
    s = s.override_strings(args.overrides)
    keys = parse_assignments(args.overrides)
    s = _fill_dp_after_overrides(s, args, keys)
    # `--set plan.gpus=N` resizes the job (dp = N / (tp*pp*cp)): the plan is held to that, not --gpus
    validate_plan(s.model, s.plan, None if "plan.gpus" in keys else args.gpus)
    return s


def _fill_dp_after_overrides(s, args, keys: dict):
    """`--set plan.tp=2` acts as `--tp 2` does: without --dp (or plan.dp) given, dp is what the GPUs leave
    (--gpus / (tp*pp*cp)); validate_plan then holds the plan to --gpus. `keys`: the --set assignments."""
    if args.dp is not None or "plan.dp" in keys or "plan.gpus" in keys \
            or not any(f"plan.{k}" in keys for k in ("tp", "pp", "cp")):
        return s
    p = s.plan
    denom = p.tp * p.pp * p.cp
    if args.gpus % denom:
        raise TraceInputError(None, f"--gpus {args.gpus} is not divisible by tp*pp*cp = {denom}")
    return dataclasses.replace(s, plan=p.with_(dp=args.gpus // denom))


def _check_counts(**counts) -> None:
    """Counts checked before any work: a typo such as 10000000000 GPUs must not allocate first."""
    from estimators.parallelism.plan import MAX_GPUS
    from estimators.parallelism.search import MAX_SIMULATED_PLANS
    for name, v in counts.items():
        most = MAX_SIMULATED_PLANS if name == "top_k" else MAX_GPUS
        if v is not None and not 1 <= v <= most:
            flag = "--top-k (--max-plans)" if name == "top_k" else f"--{name.replace('_', '-')}"
            why = " (each plan it names is simulated)" if name == "top_k" else ""
            raise TraceInputError(None, f"{flag} must be between 1 and {most:,}{why}, got {v}")


def main_parallelism(args) -> int:
    _check_counts(gpus=args.gpus, dp=args.dp, top_k=args.top_k if args.search else None)
    if args.search:
        return _main_search(args)
    scenario = scenario_from_args(args)
    pred = evaluate_with_progress(scenario)
    result = pred.detail
    if args.json:   # the caveats the prediction carries (host-bound MoE layers, a recompute that repeats nothing)
        print_json({**result.to_json(), "notes": list(pred.notes)})
    else:
        from lumos_sim.tables import console
        _print_prediction(result, moe=scenario.model is not None and scenario.model.moe is not None)
        for note in pred.notes:
            console().print(f"note: {note}")
    return 0


def _carried_flags(args) -> dict:
    """The carried plan options (search.CARRIED_OPTIONS) that the command line sets: flags left at their
    default (the plan's) leave a `--set plan.<option>=` override standing."""
    from estimators.parallelism.plan import ParallelPlan
    from estimators.parallelism.search import CARRIED_OPTIONS
    default = {f.name: f.default for f in dataclasses.fields(ParallelPlan)}
    return {k: v for k, v in plan_option_flags(args).items()
            if k in CARRIED_OPTIONS and v is not None and v != default[k]}


def _refuse_unsearched_options(args, plan) -> None:
    """A flag (or `--set plan.<field>`) the search cannot hold its candidates to is an error, not dropped."""
    from estimators.parallelism.search import UNSEARCHED_OPTIONS, unsearched_options
    default = type(plan)()
    given = {f: getattr(args, f) for f in UNSEARCHED_OPTIONS
             if getattr(args, f, None) not in (None, getattr(default, f))}
    flags = unsearched_options(dataclasses.replace(plan, **given))
    if flags:
        raise TraceInputError(None, f"--search ranks layouts without {flags[0]} (it does not hold its candidates "
                                    f"to it): give the layout's flags without --search to evaluate it with {flags[0]}")


def _main_search(args) -> int:
    from estimators.model_config import load_model
    from estimators.scenario import Scenario
    from estimators.parallelism.search import SearchSpace, rank_plans
    from estimators.parallelism.whatif import simulate_ranked
    from replay.hardware.config import get_hardware

    model = load_model(args.model)
    hw = get_hardware(args.hardware)
    base = Scenario(whatif="parallelism", model=model, hardware=hw,
                    simulation=_simulation_mode(args)).override_strings(args.overrides)
    # plan flags given on the command line constrain the search
    fixed = {k: getattr(args, k) for k in (*PLAN_DEFAULTS, "dp")}
    # `--set plan.zero=1` holds the search as `--zero 1` does (the flag wins where both are given)
    from estimators.scenario import parse_assignments
    set_keys = parse_assignments(args.overrides)
    for k in fixed:
        if fixed[k] is None and f"plan.{k}" in set_keys:
            fixed[k] = getattr(base.plan, k)
    check_search_flags(plan_option_flags(args), args.zero, args.recompute)
    _refuse_unsearched_options(args, base.plan)
    if args.no_sequence_parallel:
        fixed["sequence_parallel"] = False
    # options the search does not enumerate (--moe-a2a, --moe-capacity-factor, --set plan.moe_a2a_overlap=...)
    # hold for every candidate
    carry = dataclasses.replace(base.plan, **_carried_flags(args))
    space = SearchSpace.constrained(SearchSpace.keeping(carry), **fixed)
    # `--set plan.gpus=N` (seq_len, global_batch, precision) sets the job, as it does without --search
    gpus, seq_len, global_batch, precision = (getattr(base.plan if f"plan.{k}" in set_keys else args, k)
                                              for k in ("gpus", "seq_len", "global_batch", "precision"))
    ranked = rank_plans(base.model, base.hardware, gpus, seq_len, global_batch, precision, space)
    given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in fixed.items() if v is not None and k != "sequence_parallel")
    given += " --no-sequence-parallel" if args.no_sequence_parallel else ""
    if not ranked.candidates:
        raise TraceInputError(None, f"no valid plan of {gpus} GPUs for {model.name} with global batch "
                                    f"{global_batch} and sequence length {seq_len}"
                                    + (f" under {given}" if given else ""))
    if not ranked.fitting:
        raise TraceInputError(None, f"no valid plan of {gpus} GPUs fits {model.name} in memory on {hw.name} "
                                    f"({ranked.candidates:,} plans tried" + (f" under {given}" if given else "") + ")")
    with progress_bar("simulating plans") as cb:
        preds = simulate_ranked(base, ranked, args.top_k, progress=cb)
    sim_s = sum(p.wall_s for p in preds)
    summary = (f"ranked {ranked.candidates:,} candidate plans ({ranked.fitting:,} fit in memory) in "
               f"{ranked.wall_s:.2f} s ({ranked.plans_per_s:,.0f} plans/s); simulated the best {len(preds)} "
               f"in {sim_s:.1f} s")
    results = [p.detail for p in preds]
    if args.json:
        print_json([r.to_json() for r in results])
        print(summary, file=sys.stderr)
    else:
        _print_search(results, summary)
    return 0


def main_scenario(args) -> int:
    from chakra_schema.errors import read_toml
    from estimators.scenario import Scenario

    data = read_toml(args.file, "scenario file")   # the loaders' one reader: bounded, digit-limit integers
    if "axes" in data:   # evaluating its base alone would read as the sweep's answer
        raise TraceInputError(args.file, "is a sweep spec (it has axes): run it with `lumos-sim sweep`, or "
                                         "give its [scenario] table alone")
    scenario = Scenario.from_dict(data.get("scenario", data), path=args.file).override_strings(args.overrides)
    p = evaluate_with_progress(scenario, "evaluating")
    if args.json:
        print_json({**p.to_json(), "scenario": _scenario_inputs(scenario)})
        return 0
    from lumos_sim.tables import console as make_console
    from rich.table import Table

    t = Table(title=f"{scenario.describe()}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    row = p.to_row()
    no_step = not any(v for k, v in row.items() if k.startswith("breakdown."))
    for k, v in row.items():
        # nothing to show: unset figures, NaN (a what-if without a step), an all-zero breakdown
        if v is None or v == "" or k in ("scenario_key",) or (isinstance(v, float) and v != v) \
                or (no_step and k.startswith("breakdown.")):
            continue
        t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    make_console().print(t)
    return 0


def _scenario_inputs(scenario) -> dict:
    """What the scenario asked, for `whatif scenario --json`: the what-if, the model and hardware by name, and
    the option sections the what-if reads (the plan of a parallelism or MoE what-if, its trace, failure or MoE
    options), every field as the evaluation took it."""
    out = {"whatif": scenario.whatif, "model": scenario.model.name if scenario.model is not None else None,
           "hardware": scenario.hardware.name if scenario.hardware is not None else None}
    for name in ("plan", "trace", "failure", "moe"):
        value = getattr(scenario, name)
        if dataclasses.is_dataclass(value) and (name != "plan" or scenario.whatif in ("parallelism", "moe")):
            out[name] = dataclasses.asdict(value)
    return out


def _changes_text(changes: dict) -> str:
    """One line per change; a per-rank change as `rank 3: compute x 0.435 ...` (not a Python dict)."""
    lines = []
    for key, value in changes.items():
        name = key.replace("_", " ")
        if isinstance(value, dict):
            lines += [f"{name}: rank {k}: {v}" for k, v in value.items()]
        else:
            lines.append(f"{name}: {value}")
    return "\n".join(lines)


def main_list(args) -> int:
    from estimators.registry import whatifs
    from lumos_sim.tables import console, table
    t = table(None, ["what-if", "what it does"])
    for name, w in sorted(whatifs().items()):
        needs = f" (needs {', '.join(w.needs)})" if w.needs else ""
        t.add_row(name, f"{w.doc}{needs}")
    console().print(t)
    return 0


def _plan_text(p) -> str:
    from estimators.scenario import plan_label
    return plan_label(p)


def _print_prediction(r, moe: bool = False) -> None:
    from estimators.parallelism.evaluate import legacy_breakdown_json
    from lumos_sim.tables import console as make_console
    from rich.table import Table

    console = make_console()
    p = r.plan
    t = Table(title=f"{r.model} on {p.gpus} x {r.hardware}: {_plan_text(p)}, seq {p.seq_len}, "
                    f"global batch {p.global_batch} ({p.micro_batches} micro-batches)")
    t.add_column("metric", overflow="fold")
    t.add_column("value", justify="right", overflow="fold")
    bd = legacy_breakdown_json(r.breakdown)
    rows = [("step time", f"{r.step_time_s:.3f} s"), ("tokens/s", f"{r.tokens_per_s:,.0f}"),
            ("tokens/s per GPU", f"{r.tokens_per_s / p.gpus:,.0f}"),
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
    if bd.get("host_wait_s", 0.0) > 0:
        rows.append(("GPU waiting for the host (MoE syncs, host-bound layers)", f"{bd['host_wait_s']:.3f} s"))
    rows.append(("pipeline bubble / idle", f"{bd['bubble_s']:.3f} s ({100 * bd['bubble_fraction']:.1f}%)"))
    if "model_params" in r.extra:
        rows.append(("model parameters: total / active", f"{r.extra['model_params'] / 1e9:,.2f} B / "
                                                          f"{r.extra['model_active_params'] / 1e9:,.2f} B"))
        rows.append(("model FLOPs per token (fwd + bwd)", f"{r.extra['model_flops_per_token'] / 1e9:,.1f} G"))
    rows.append(("simulated ranks / nodes / wall", f"{r.simulated_ranks} / {r.num_nodes:,} / {r.wall_s:.1f} s"))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if r.oom:
        console.print(f"OUT OF MEMORY: {r.memory.total_gib:.1f} GiB per GPU is more than the "
                      f"{r.memory.capacity_gib:.1f} GiB usable on {r.hardware}; the time assumes it fit. Try "
                      f"{_oom_remedies(r.plan, moe)}.")


def _oom_remedies(plan, moe: bool = False) -> str:
    """The memory-saving options the plan does not already use, as a sentence's list ("A, B, or C")."""
    tips = []
    if plan.recompute != "full":
        tips.append("--recompute full")
    elif plan.recompute_layers:
        tips.append("--recompute-layers 0 (every layer)")
    if plan.micro_batch > 1:
        tips.append("a smaller --micro-batch")
    tips.append("a larger --pp / --tp" if plan.dp > 1 else "more --gpus for a larger --pp / --tp")
    if moe and plan.ep == 1 and plan.dp > 1:
        tips.append("--ep (experts spread over GPUs)")
    if plan.cp == 1 and plan.seq_len >= 16384:
        tips.append("--cp (long sequences)")
    if plan.zero < 3 and plan.dp > 1:
        tips.append("--zero 3")
    if len(tips) == 1:
        return tips[0]
    return ", ".join(tips[:-1]) + ("," if len(tips) > 2 else "") + " or " + tips[-1]


PLAN_MIN_WIDTH = 20  # search table: the plan column's floor at 80 columns


def _print_search(results, summary: str = "") -> None:
    from lumos_sim.tables import console as make_console, table

    console = make_console()
    r0 = results[0]
    # 80 columns (a pipe, a narrow terminal) cannot hold every figure and the plan: the analytic estimate
    # and TFLOP/s (MFU says the same) give way there, and the plan never shrinks below PLAN_MIN_WIDTH
    wide = console.width >= 110
    cols = ("#", "plan", "step\ns") + (("esti-\nmate s",) if wide else ()) + ("tokens\n/s",) + (
        ("TFLOP/s\n/GPU",) if wide else ()) + ("MFU", "mem\nGiB", "bubble", "exposed\ncomm s")
    numbers = tuple(c for c in cols if c != "plan")
    t = table(f"{r0.model} on {r0.plan.gpus} x {r0.hardware}: plans ranked by predicted throughput", cols,
              right=numbers, whole=numbers)
    t.columns[1].min_width = PLAN_MIN_WIDTH
    for i, r in enumerate(results, 1):
        est = r.extra.get("analytic_step_time_s")
        cells = {"#": str(i), "plan": _search_plan_text(r.plan), "step\ns": f"{r.step_time_s:.3f}",
                 "esti-\nmate s": f"{est:.3f}" if est else "", "tokens\n/s": f"{r.tokens_per_s:,.0f}",
                 "TFLOP/s\n/GPU": f"{r.tflops_per_gpu:.1f}", "MFU": f"{100 * r.mfu:.1f}%",
                 "mem\nGiB": f"{r.memory.total_gib:.1f}", "bubble": f"{100 * r.breakdown.mean.idle_fraction:.1f}%",
                 "exposed\ncomm s": f"{r.breakdown.mean.exposed_comm_us / 1e6:.3f}"}
        t.add_row(*(cells[c] for c in cols))
    console.print(t)
    console.print("plan: TP/PP/CP/DP/EP parallel degrees (PP2x2: 2 virtual stages per rank), mb = micro-batch "
                  "size, recompute = activation recomputation (none, selective, full, op), zero = ZeRO stage (0 DDP, "
                  "1 distributed optimizer, 2, 3 FSDP); hsdp=N shards within N DP ranks, no-sp = TP without "
                  "sequence parallelism, no-<overlap> = that overlap is off")
    if summary:
        console.print(summary)


def _search_plan_text(p) -> str:
    """The plan label plus the search's switches where they differ from the defaults."""
    s = _plan_text(p)
    if p.dp_shard and p.dp_shard < p.dp:
        s += f" hsdp={p.dp_shard}"
    if p.tp > 1 and not p.sequence_parallel:
        s += " no-sp"
    for flag, name in ((p.overlap_grad_reduce, "dp-overlap"), (p.overlap_p2p, "p2p-overlap"),
                       (p.async_tp_comm or p.sequence_parallel or p.tp == 1, "async-tp")):
        if not flag:
            s += f" no-{name}"
    return s


# ------------------------------------------------------------------------------ trace
def _rank_list(text: str) -> tuple[int, ...]:
    """'1,3' -> (1, 3), for argparse (a bad list is its usage error, exit 2)."""
    try:
        ranks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ranks like 1,3, got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"expected ranks like 1,3, got {text!r}")
    return ranks


def main_trace(args) -> int:
    from estimators.scenario import Scenario, TraceSpec
    from replay.hardware.config import get_hardware

    if args.dp is None and args.layers is None and args.hardware is None and not args.balance \
            and not args.overrides:
        raise TraceInputError(None, "give at least one change: --dp N, --layers L, --hardware NAME or --balance")
    _check_counts(dp=args.dp, layers=args.layers)
    if args.source_hardware:
        get_hardware(args.source_hardware)   # an unknown name fails now, not after the conversion
    spec = TraceSpec(inputs=tuple(args.inputs), et=args.et, kineto=args.kineto, source_hardware=args.source_hardware,
                     dp=args.dp, layers=args.layers,
                     balance=args.balance, balance_ranks=args.balance_ranks, balance_threshold=args.balance_threshold)
    scenario = Scenario(whatif="trace", timing="trace", trace=spec,
                        hardware=get_hardware(args.hardware) if args.hardware else None)
    scenario = scenario.override_strings(args.overrides)
    with progress_bar("converting") as cb:
        from estimators.trace.whatif import trace_graphs
        trace_graphs(scenario.trace, progress=cb)
    res = evaluate_with_progress(scenario, "replaying").detail
    if args.json:
        print_json(res.to_json())
        return 0
    from lumos_sim.tables import console as make_console
    from rich.table import Table

    console = make_console()
    t = Table(title="trace what-if")
    t.add_column("")
    t.add_column("baseline", justify="right")
    t.add_column("what-if", justify="right")
    t.add_row("step time ms", f"{res.baseline_step_us / 1000:.3f}", f"{res.step_us / 1000:.3f}")
    t.add_row("speed-up", "", f"{res.speedup:.3f}x")
    t.add_row("change", "", _changes_text(res.changes))
    console.print(t)
    for note in res.notes:
        console.print(note)
    return 0
