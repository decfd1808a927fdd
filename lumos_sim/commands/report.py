"""`lumos-sim report RESULTS.parquet -o report.html`: the HTML report of a sweep's results table."""
from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("report", help="write the HTML report (plots, offline) of a sweep results table",
                       description="One self-contained HTML file: throughput vs GPUs, step-time breakdown per "
                                   "point, throughput vs memory Pareto front, best points.")
    p.add_argument("results", metavar="RESULTS.parquet", help="a table written by `lumos-sim sweep` (.parquet or .csv)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.html", help="the HTML file to write")
    p.add_argument("--title", help="report title (default: the file name)")
    p.set_defaults(func=main)


def main(args) -> int:
    from pathlib import Path

    from lumos_sim.report import write_sweep_report
    from lumos_sim.sweep_io import read_results

    from chakra_schema.safe_io import refuse_overwriting_inputs
    refuse_overwriting_inputs(args.output, [args.results])
    df = read_results(args.results)
    out = write_sweep_report(df, args.output, title=args.title or f"lumos-sim sweep: {Path(args.results).name}")
    from lumos_sim.tables import say
    say(f"report: {out}", sys.stdout)
    return 0
