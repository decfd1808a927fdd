"""`lumos-sim sweep SPEC.toml -o results.parquet`: evaluate every point of a sweep spec (see
`lumos_sim.sweeps` for the spec format), locally or on Ray, into one results table."""
from __future__ import annotations

import os
import sys

import orjson

from lumos_sim.commands.whatif_args import add_set_argument


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def register(sub) -> None:
    p = sub.add_parser("sweep", help="evaluate a sweep spec (base scenario + axes) into a parquet/CSV table",
                       description="Evaluate every point of SPEC.toml: a [scenario] table plus [[axes]] "
                                   "(grid, zip, list, search) combined by product. Points already in the "
                                   "output file are not evaluated again (resume after Ctrl-C by re-running).")
    p.add_argument("spec", metavar="SPEC.toml", help="the sweep spec: [scenario] + [[axes]]")
    p.add_argument("-o", "--output", required=True, metavar="RESULTS.parquet",
                   help="results table (.parquet or .csv); also the cache of finished points")
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local process pool (default) or Ray tasks")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="local: worker processes; ray: CPUs of a local Ray instance started for the sweep, at "
                        f"most 1,024 (default: the CPUs this process may use, {cpu_count()} here; never more than the "
                        "points to run)")
    p.add_argument("--ray-address", metavar="ADDR", help="connect to this Ray cluster (e.g. auto, ray://head:10001; "
                                                         "default: $RAY_ADDRESS, else a local instance)")
    p.add_argument("--csv", action="store_true", help="also write the table as CSV beside the parquet file")
    p.add_argument("--fresh", action="store_true", help="ignore points already in the output file")
    p.add_argument("--flush-every", type=float, default=5.0, metavar="SECONDS",
                   help="rewrite the results file at most this often while running (default 5)")
    p.add_argument("--report", metavar="OUT.html", help="also write the HTML report of the results")
    p.add_argument("--dry-run", action="store_true", help="count the points, list the first 100, and exit")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of a table")
    add_set_argument(p)
    p.epilog = ("--set also edits the spec: axes.N.<kind>.<key>=VALUE or, for named axes ([axes.NAME]), "
                "axes.NAME.<kind>.<key>=VALUE (e.g. axes.0.search.gpus=[64,128], "
                "axes.nic.grid.hardware.network.nic_gbps=[200,800]); every other key sets the base scenario. "
                "--dry-run prints the number of points (counted, not expanded) and lists the first 100.")
    p.set_defaults(func=main)


def main(args) -> int:
    from lumos_sim.sweeps import SweepInterrupted, load_spec, sweep

    from chakra_schema.safe_io import prepare_output, refuse_overwriting_inputs

    refuse_overwriting_inputs(args.output, [args.spec])
    if args.report:   # said before the sweep runs, not after
        prepare_output(args.report)
        refuse_overwriting_inputs(args.report, [args.output, args.spec], flag="--report")
    spec = load_spec(args.spec, args.overrides)
    if args.dry_run:
        return _dry_run(spec)
    try:
        df = sweep(spec, output=args.output, executor=args.executor,
                   workers=args.workers if args.workers is not None else cpu_count(),
                   ray_address=args.ray_address, csv=args.csv, fresh=args.fresh,
                   flush_every_s=args.flush_every)
    except SweepInterrupted as e:
        s = e.stats
        print(f"lumos-sim sweep: interrupted ({e.signal_name}) after {s['computed']} new points "
              f"({s['cached']} cached) of {s['points']}; {args.output} holds every finished point; "
              f"re-run the same command to compute the rest", file=sys.stderr)
        return 143 if e.signal_name == "SIGTERM" else 130
    stats = df.attrs["sweep"]
    if args.report:
        from lumos_sim.report import write_sweep_report
        write_sweep_report(df, args.report, title=spec.name or None)
    summary = {k: stats[k] for k in ("points", "computed", "cached", "failed", "wall_s", "output")}
    summary["points_per_s"] = stats["computed"] / stats["wall_s"] if stats["wall_s"] > 0 else None
    summary["report"] = args.report
    if args.json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        _print_summary(df, summary)
    if summary["points"] and summary["failed"] == summary["points"]:
        # every point an error is a spec that cannot run (the table still lists each point's error)
        first = df[df["status"] == "error"]["error"].iloc[0] if "error" in df.columns else ""
        print(f"lumos-sim sweep: error: {args.spec}: every one of the {summary['points']} points failed "
              f"(first: {first})", file=sys.stderr)
        return 2
    return 0


DRY_RUN_LISTED = 100


def _dry_run(spec) -> int:
    """The number of points (from the axes' sizes: a 10^9-point grid is counted, not expanded) and the
    first DRY_RUN_LISTED of them, streamed."""
    from lumos_sim.sweeps import MAX_POINTS

    total = spec.count()
    shown = 0
    for pt in spec.iter_points():
        if shown == DRY_RUN_LISTED:
            break
        print(f"{pt.index:6d}  {pt.key}  {pt.label}")
        shown += 1
    if total is None:   # a search axis: its size is known only by ranking the plans
        total = shown if shown < DRY_RUN_LISTED else sum(1 for _ in spec.iter_points())
    more = f" (the first {shown} listed)" if shown < total else ""
    print(f"{total:,} points{more}", file=sys.stderr)   # stdout stays the list
    if total > MAX_POINTS:
        print(f"lumos-sim sweep: error: {total:,} points is more than the {MAX_POINTS:,} one results table holds: "
              "narrow the axes or split the sweep", file=sys.stderr)
        return 2
    return 0


def _print_summary(df, summary) -> None:
    from lumos_sim.tables import console as make_console
    from rich.table import Table

    console = make_console()
    ok = df[df["status"] == "ok"]
    if "tokens_per_s" in ok.columns and len(ok):
        best = ok.sort_values("tokens_per_s", ascending=False).head(10)
        t = Table(title=f"best of {len(ok)} points by throughput")
        for col in ("#", "point", "label", "step s", "tokens/s", "MFU", "mem GiB"):
            t.add_column(col, justify="left" if col == "label" else "right")
        for rank, (_, r) in enumerate(best.iterrows(), 1):
            t.add_row(str(rank), str(r["point"]), str(r["label"]), _fmt(r.get("step_time_s"), ".3f"),
                      _fmt(r.get("tokens_per_s"), ",.0f"), _fmt(100 * (r.get("mfu") or float("nan")), ".1f") + "%",
                      _fmt(r.get("memory_gib_per_gpu"), ".1f"))
        console.print(t)
    for _, r in df[df["status"] == "error"].head(5).iterrows():
        console.print(f"point {r['point']} ({r['label']}): error: {r['error']}")
    rate = f", {summary['points_per_s']:.2f} points/s" if summary["points_per_s"] else ""
    console.print(f"{summary['points']} points: {summary['computed']} computed, {summary['cached']} cached, "
                  f"{summary['failed']} failed in {summary['wall_s']:.1f} s{rate} -> {summary['output']}"
                  + (f"; report {summary['report']}" if summary["report"] else ""))


def _fmt(v, spec: str) -> str:
    try:
        if v is None or v != v:
            return "-"
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)
