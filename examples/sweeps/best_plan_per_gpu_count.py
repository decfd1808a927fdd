"""Example (a) as a sweep script: Llama 3 70B on 64 to 1,024 H100 GPUs, the best plan of each GPU count.

    python examples/sweeps/best_plan_per_gpu_count.py -o scaling.parquet --workers 2 --report scaling.html
    # quick look: two GPU counts, two plans each
    python examples/sweeps/best_plan_per_gpu_count.py -o quick.parquet \\
        --set axes.0.search.gpus=[64,128] --set axes.0.search.max_plans=2

Re-running with the same output file evaluates only the points not in it yet (resume after Ctrl-C).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import lumos_sim
from lumos_sim.report import write_sweep_report

SPEC = Path(__file__).with_name("llama3_70b_scaling.toml")


def best_per_gpu_count(df):
    """The row of the highest-throughput plan of each GPU count, with scaling efficiency against the
    smallest GPU count (tokens/s per GPU relative to it)."""
    ok = df[(df["status"] == "ok") & ~df["oom"].fillna(False).astype(bool)]
    best = ok.loc[ok.groupby("plan.gpus")["tokens_per_s"].idxmax()].sort_values("plan.gpus").copy()
    per_gpu = best["tokens_per_s"] / best["plan.gpus"]
    best["scaling_efficiency"] = per_gpu / per_gpu.iloc[0]
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default="scaling.parquet", help="results table (also the cache)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--executor", default="local", choices=("local", "ray"))
    ap.add_argument("--report", help="write the HTML report here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as `lumos-sim sweep --set`")
    args = ap.parse_args(argv)

    df = lumos_sim.sweep(SPEC, output=args.output, executor=args.executor, workers=args.workers, overrides=args.set)
    best = best_per_gpu_count(df)
    print(f"{'GPUs':>5}  {'best plan':44s} {'step s':>7} {'tokens/s':>11} {'MFU':>6} {'GiB':>5} {'scaling':>8}")
    for _, r in best.iterrows():
        print(f"{r['plan.gpus']:>5}  {r['label'].split(' GPUs ', 1)[-1]:44s} {r['step_time_s']:7.2f} "
              f"{r['tokens_per_s']:11,.0f} {100 * r['mfu']:5.1f}% {r['memory_gib_per_gpu']:5.1f} "
              f"{100 * r['scaling_efficiency']:7.1f}%")
    s = df.attrs["sweep"]
    print(f"{s['points']} points ({s['computed']} computed, {s['cached']} cached, {s['failed']} failed) "
          f"in {s['wall_s']:.1f} s -> {args.output}")
    if args.report:
        write_sweep_report(df, args.report, title="Llama 3 70B on H100: plans per GPU count")
        print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
