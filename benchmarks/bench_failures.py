"""Failure what-if: closed form vs Monte Carlo over the acceptance grid, and Monte Carlo speed.

    PYTHONPATH=. python benchmarks/bench_failures.py [--trials 1000] [--quick] [--csv grid.csv]

Grid (issue "Failure what-if at 100K GPUs"): GPUs 1K-131K x rates 1-10 per 1,000 node-days x checkpoint
intervals 5-180 min x checkpoint writes 0-5 min x restarts 5-30 min x {sync, ft-hsdp} x restart semantics
{restart-over, queue} (ft-hsdp: restart-over, the replica model), 30-day horizon, the llama3-405b failure
mix. Prints the largest |closed form - Monte Carlo mean| ETTR gap per strategy and semantics (acceptance:
<= 0.01), then the wall time of 1,000 trials of a 30-day 16K-GPU job for both engines.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import time

from estimators.failures import FailureOptions, estimate, resolve

GPUS = (1024, 8192, 32768, 131072)
RATES = (1.0, 3.8, 10.0)
INTERVALS_MIN = (5.0, 30.0, 180.0)
WRITES_MIN = (0.0, 5.0)
RESTARTS_MIN = (5.0, 30.0)
CASES = (("sync", "restart-over"), ("sync", "queue"), ("ft-hsdp", "restart-over"))
QUICK = dict(gpus=(1024, 131072), rates=(1.0, 10.0), intervals=(5.0, 180.0), writes=(0.0, 5.0), restarts=(5.0, 30.0))


def trials_for(gpus: int, rate: float, budget: float = 400_000.0, most: int = 1000) -> int:
    """Fewer trials where each trial holds thousands of failures (its ETTR already averages them)."""
    failures = gpus / 8 * rate / 1000 * 30
    return int(max(50, min(most, budget / max(failures, 1.0))))


def grid_points(gpus=GPUS, rates=RATES, intervals=INTERVALS_MIN, writes=WRITES_MIN, restarts=RESTARTS_MIN,
                cases=CASES):
    return list(itertools.product(gpus, rates, intervals, writes, restarts, cases))


def evaluate_point(point, trials: int | None = None, horizon_days: float = 30.0):
    """(gap, closed form, Monte Carlo mean) of one grid point; `restart` is the whole job's (sync) or the
    replica's (ft-hsdp) restart."""
    g, r, c, w, u, (strategy, semantics) = point
    o = FailureOptions(gpus=g, rate_per_1000_node_days=r, checkpoint_interval_min=c, checkpoint_write_min=w,
                       restart_min=u, strategy=strategy, restart_semantics=semantics,
                       trials=trials or trials_for(g, r), horizon_days=horizon_days,
                       seed=g + int(10 * r) + int(c) + int(10 * w) + int(u))
    e = estimate(resolve(o))
    return abs(e.closed.ettr - e.mc.mean), e.closed.ettr, e.mc.mean


def time_mc(engine: str, trials: int = 1000) -> tuple[float, float]:
    o = FailureOptions(gpus=16384, trials=trials, horizon_days=30.0, engine=engine)
    inputs = resolve(o)
    t0 = time.perf_counter()
    e = estimate(inputs)
    return time.perf_counter() - t0, e.mc.mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=None, help="trials per point (default: scaled to the failures)")
    ap.add_argument("--quick", action="store_true", help="the 2-value sub-grid")
    ap.add_argument("--csv", default=None, help="write every point to this CSV")
    args = ap.parse_args()
    points = grid_points(**QUICK) if args.quick else grid_points()
    t0 = time.perf_counter()
    rows = [(p, *evaluate_point(p, args.trials)) for p in points]
    print(f"grid: {len(rows)} points in {time.perf_counter() - t0:.1f} s")
    for case in CASES:
        sub = [r for r in rows if r[0][5] == case]
        p, gap, cf, mc = max(sub, key=lambda r: r[1])
        print(f"{case[0]:8s} {case[1]:13s} max gap {gap:.4f} (closed form {cf:.4f}, Monte Carlo {mc:.4f}) at "
              f"GPUs={p[0]} rate={p[1]} interval={p[2]} write={p[3]} restart={p[4]} min")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(["gpus", "rate", "interval_min", "write_min", "restart_min", "strategy", "semantics",
                          "closed_form", "monte_carlo", "gap"])
            for p, gap, cf, mc in rows:
                out.writerow([*p[:5], *p[5], f"{cf:.5f}", f"{mc:.5f}", f"{gap:.5f}"])
    for engine in ("vector", "simpy"):
        dt, mean = time_mc(engine)
        print(f"Monte Carlo {engine:6s}: 1,000 trials of a 30-day 16K-GPU job in {dt:.2f} s (ETTR {mean:.4f})")


if __name__ == "__main__":
    main()
