"""`lumos-sim whatif failures`: failure rate, checkpoint policy and recovery strategy -> effective training
time ratio (closed form and Monte Carlo), time lost by cause, and with a model, effective step time and
goodput.

    lumos-sim whatif failures --gpus 16384                                  # Llama 3 405B failure mix
    lumos-sim whatif failures --gpus 16384 --strategy ft-hsdp --replicas 16 --checkpoint-interval-min 30
    lumos-sim whatif failures --gpus 16384 --model llama3-405b --tp 8 --pp 16 --seq-len 8192 \\
        --global-batch 2048 --recompute full                               # + step time and goodput

The published FT-HSDP figures (100K GPUs, one failure per 18 min; 10-min synchronous stall -> ETTR 0.44,
3-min FT-HSDP stall -> 0.80):

    lumos-sim whatif failures --gpus 100000 --failure-model ft-hsdp-100k --failure-rate 6.4 \\
        --checkpoint-write-min 0 --strategy sync --stall-min 10          # 1 - 10/18 = 0.444
    ... --strategy ft-hsdp --stall-min 3                                 # 1 - (3 + 7/12)/18 = 0.801
"""
from __future__ import annotations

import math

from chakra_schema.errors import TraceInputError
from lumos_sim.progress import progress_bar


def register(wsub) -> None:
    from lumos_sim.commands.whatif_args import add_plan_arguments, add_set_argument

    f = wsub.add_parser("failures", help="failures, checkpoints and recovery (sync / ft-hsdp) -> effective "
                                         "training time and goodput",
                        description=__doc__.split("\n\n")[0], epilog="Flags left out take the defaults printed "
                        "with the result (sources: estimators/failures/recovery.py and the failure-model presets).")
    add_plan_arguments(f, required=False)
    f.add_argument("--gpus-per-node", type=int, default=None, help="default: 8")
    f.add_argument("--failure-rate", type=float, default=None, metavar="R",
                   help="failures per 1,000 node-days (default: the failure model's; its mix of causes is kept)")
    f.add_argument("--failure-model", default="llama3-405b", metavar="NAME|PATH",
                   help="failure-model preset (llama3-405b, ft-hsdp-100k) or TOML file (default: llama3-405b)")
    f.add_argument("--distribution", choices=("exponential", "weibull"), default=None,
                   help="time between failures (default: the failure model's, exponential)")
    f.add_argument("--strategy", default="sync", metavar="{sync,ft-hsdp}", help="recovery strategy (default: sync)")
    f.add_argument("--restart-semantics", default="restart-over", metavar="{restart-over,queue}",
                   help="a failure during a restart: restart-over starts the restart again (default, physical); "
                        "queue adds a whole restart after it (the published (MTBF - stall) / MTBF accounting)")
    f.add_argument("--replicas", type=int, default=None, metavar="K",
                   help="FT-HSDP replicas (default: plan DP / dp_shard with a model, else 12)")
    f.add_argument("--detection-min", type=float, default=None, help="failure detection / timeout (default: 1)")
    f.add_argument("--restart-min", type=float, default=None, metavar="U",
                   help="restart of the whole job (sync; default grows with GPUs) or of the failed replica "
                        "(ft-hsdp; default 7)")
    f.add_argument("--stall-min", type=float, default=None, metavar="S",
                   help="total stall per failure, replacing its parts (sync: detection + restart + load; "
                        "ft-hsdp: timeout + redo step + rejoin)")
    f.add_argument("--checkpoint-interval-min", default="auto", metavar="C|auto",
                   help="minutes between checkpoints, or auto: the optimal (Young/Daly) interval (default)")
    f.add_argument("--checkpoint-write-min", type=float, default=None, metavar="W",
                   help="checkpoint write time (default: size / storage bandwidth with a model, else 5)")
    f.add_argument("--checkpoint-async", action="store_true",
                   help="write checkpoints in the background (only a snapshot blocks)")
    f.add_argument("--spares", type=int, default=None, help="hot-spare nodes (default: a replacement is always ready)")
    f.add_argument("--trials", type=int, default=1000, metavar="T", help="Monte Carlo trials (default: 1000)")
    f.add_argument("--horizon-days", type=float, default=30.0, metavar="D", help="training horizon (default: 30)")
    f.add_argument("--seed", type=int, default=0, metavar="X", help="Monte Carlo seed (default: 0)")
    f.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_set_argument(f)
    f.set_defaults(func=main_failures)


def scenario_from_args(args):
    """The `failures` scenario of the flags (with a model: the plan too), --set overrides on top."""
    from estimators.failures import FailureOptions
    from estimators.scenario import Scenario

    opts = FailureOptions(
        gpus=None if args.model else args.gpus, gpus_per_node=args.gpus_per_node, failure_model=args.failure_model,
        rate_per_1000_node_days=args.failure_rate, distribution=args.distribution, strategy=args.strategy,
        restart_semantics=args.restart_semantics,
        replicas=args.replicas, detection_min=args.detection_min, restart_min=args.restart_min,
        stall_min=args.stall_min, checkpoint_interval_min=_interval(args.checkpoint_interval_min),
        checkpoint_write_min=args.checkpoint_write_min, checkpoint_async=args.checkpoint_async, spares=args.spares,
        trials=args.trials, horizon_days=args.horizon_days, seed=args.seed)
    if not args.model:
        return Scenario(whatif="failures", failure=opts).override_strings(args.overrides)
    from estimators.model_config import load_model
    from lumos_sim.commands.whatif_args import plan_from_args
    from replay.hardware.config import get_hardware

    if args.seq_len is None or args.global_batch is None:
        raise TraceInputError(None, "with --model, give --seq-len and --global-batch (the plan's step)")
    model = load_model(args.model)
    s = Scenario(whatif="failures", model=model, hardware=get_hardware(args.hardware),
                 plan=plan_from_args(args, model), failure=opts).override_strings(args.overrides)
    if args.overrides:
        from estimators.parallelism.plan import validate_plan
        validate_plan(s.model, s.plan)
    return s


def _interval(text: str) -> float | None:
    if str(text).strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise TraceInputError(None, f"--checkpoint-interval-min expects minutes or 'auto', got '{text}'") from None


def main_failures(args) -> int:
    from estimators.registry import evaluate

    scenario = scenario_from_args(args)
    with progress_bar("simulating failures") as cb:
        p = evaluate(scenario, progress=cb)
    if args.json:
        from lumos_sim.commands.whatif_args import print_json
        print_json(failures_json(p))
    else:
        _print_table(p)
    return 0


def failures_json(p) -> dict:
    """The CLI's JSON: the metrics, with `time_lost_h` as one object by cause, plus the inputs used and
    the defaults taken."""
    from estimators.failures.closed_form import LOST_KEYS

    m = dict(p.metrics)
    lost = {k: m.pop(f"time_lost_{k}_h") for k in LOST_KEYS}
    lost["total"] = m.pop("time_lost_total_h")
    m["time_lost_h"] = lost
    est = p.detail
    m["defaults"] = dict(est.inputs.defaults)
    m["recovery_inputs"] = _recovery_inputs(est)
    m["notes"] = [n for n in p.notes if not n.startswith("default ")]
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}


def _recovery_inputs(est) -> dict:
    t = est.inputs.times
    return {"detection_min": t.detection * 60, "restart_min": t.restart * 60,
            "checkpoint_load_min": t.checkpoint_load * 60, "replica_restart_min": t.replica_restart * 60,
            "stall_override_min": t.stall_override * 60 if t.stall_override is not None else None,
            "spares": t.spares, "distribution": est.inputs.failure_model.distribution}


def _interval_text(m: dict) -> str:
    """`115.8 min (optimal, Young 119.2 min)`, or for a fixed interval `30 min (fixed; optimal 100.2 min,
    Young 103.5 min)`: the optimum is named once."""
    young = f"Young {_minutes(m['young_checkpoint_interval_min'])}"
    if m["checkpoint_policy"] == "optimal":
        return f"{_minutes(m['checkpoint_interval_min'])} (optimal, Daly; {young})"
    return (f"{_minutes(m['checkpoint_interval_min'])} ({m['checkpoint_policy']}; optimal "
            f"{_minutes(m['optimal_checkpoint_interval_min'])}, {young})")


def _print_table(p) -> None:
    from lumos_sim.tables import console as make_console
    from rich.table import Table

    m, est = p.metrics, p.detail
    console = make_console()
    t = Table(title=f"failures what-if: {m['gpus']:,} GPUs, {m['strategy']}, failure model {m['failure_model']}")
    t.add_column("")
    t.add_column("value", justify="right")
    rows = [
        ("failure rate", f"{m['failure_rate_per_1000_node_days']:.3g} per 1,000 node-days"),
        ("job mean time to failure", f"{_minutes(m['mttf_h'] * 60)} ({_fixed(m['mttf_h'], 2)} h)"),
        ("expected failures", f"{_fixed(m['expected_failures'], 1)} in {m['horizon_days']:g} days"),
        ("stall per failure (mean)", f"{m['stall_per_failure_min']:.2f} min"),
        ("checkpoint interval", _interval_text(m)),
        ("checkpoint write", f"{m['checkpoint_write_min']:.3g} min" + (" (async)" if m["checkpoint_async"] else "")),
        ("ETTR (closed form)", f"{m['ettr']:.4f}"),
    ]
    if m["ettr_mc"] is not None:
        rows.append(("ETTR (Monte Carlo, 5-95%)", f"{m['ettr_mc']:.4f} ({m['ettr_p05']:.4f}-{m['ettr_p95']:.4f}), "
                                                   f"{m['trials']} trials"))
    if "step_time_s" in m:
        rows += [("step time healthy / effective", f"{m['step_time_s']:.3f} s / {m['effective_step_time_s']:.3f} s"),
                 ("tokens/s healthy / goodput", f"{m['tokens_per_s']:,.0f} / {m['goodput_tokens_per_s']:,.0f}")]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    lost = Table(title="time lost (closed form), hours over the horizon")
    for col in ("detection", "restart", "checkpoint_load", "spare_wait", "recompute", "degraded",
                "checkpoint_writes", "total"):
        lost.add_column(col.replace("_", " "), justify="right")
    lost.add_row(*[f"{m[f'time_lost_{k}_h']:.1f}" for k in ("detection", "restart", "checkpoint_load", "spare_wait",
                                                            "recompute", "degraded", "checkpoint_writes", "total")])
    console.print(lost)
    if est.inputs.defaults:
        console.print("defaults used: " + "; ".join(f"{k} = {v}" for k, v in est.inputs.defaults.items()))
    for n in p.notes:
        if not n.startswith("default "):
            console.print(n)


def _minutes(v: float) -> str:
    if not math.isfinite(v):
        return "never"
    return "continuous" if v == 0 else f"{_fixed(v, 1)} min"


def _fixed(v: float, digits: int) -> str:
    """`v` to `digits` decimals, or in 3 significant digits past 1e9 (a failure rate of 1e-300 gives a
    mean time to failure of 1e302 minutes, 300 digits in fixed point)."""
    return f"{v:.3g}" if abs(v) >= 1e9 else f"{v:.{digits}f}"
