"""Sweep throughput: the same sweep with the local executor (1 and N workers) and Ray, side by side.

    python benchmarks/bench_sweep.py                       # example (a): 200 points, 1 / 2 workers, Ray on 2 CPUs
    python benchmarks/bench_sweep.py --workers 4 --set axes.0.search.max_plans=8

Prints wall time and points/s of each, the speed-up over one worker, and checks that every executor
gives the same table (all columns but `wall_s`, the time of each evaluation).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd

from lumos_sim.sweeps import load_spec, sweep

SPEC = Path(__file__).resolve().parent.parent / "examples" / "sweeps" / "llama3_70b_scaling.toml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    spec = load_spec(args.spec, args.set)
    n = len(spec.points())
    runs = [("local", 1), ("local", args.workers)] + ([] if args.no_ray else [("ray", args.workers)])
    frames, base_wall = {}, None
    print(f"{n} points of {Path(args.spec).name}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for executor, workers in runs:
        t0 = time.perf_counter()
        df = sweep(spec, executor=executor, workers=workers, progress=False)
        wall = time.perf_counter() - t0
        base_wall = base_wall or wall
        frames[(executor, workers)] = df.drop(columns=["wall_s"])
        print(f"{executor:5s} x{workers}: {wall:7.1f} s  {n / wall:6.2f} points/s  speed-up {base_wall / wall:4.2f}x  "
              f"(load {os.getloadavg()[0]:.1f})")
    ref = frames[runs[0]]
    for key, df in frames.items():
        pd.testing.assert_frame_equal(df, ref)
    print("every executor gave the same table")


if __name__ == "__main__":
    main()
