"""Failure what-if: closed form vs Monte Carlo over the acceptance grid, and Monte Carlo speed.

    PYTHONPATH=. python benchmarks/bench_failures.py [--trials 1000] [--quick]

Grid: GPUs 1K-128K x rates 1-10 per 1,000 node-days x checkpoint intervals 5-120 min x {sync, ft-hsdp},
30-day horizon, the llama3-405b failure mix. Prints the largest |closed form - Monte Carlo mean| ETTR gap
(acceptance: <= 0.03), then the wall time of 1,000 trials of a 30-day 16K-GPU job for both engines
(acceptance: <= 10 s).
"""
from __future__ import annotations

import argparse
import itertools
import time

from estimators.failures import FailureOptions, estimate, resolve

GPUS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
RATES = (1.0, 2.0, 3.8, 5.0, 10.0)
INTERVALS_MIN = (5.0, 15.0, 30.0, 60.0, 120.0)
STRATEGIES = ("sync", "ft-hsdp")


def grid_gaps(gpus=GPUS, rates=RATES, intervals=INTERVALS_MIN, strategies=STRATEGIES, trials: int = 1000,
              horizon_days: float = 30.0):
    """(gap, closed form, Monte Carlo mean, point) for every grid point."""
    out = []
    for g, r, c, s in itertools.product(gpus, rates, intervals, strategies):
        o = FailureOptions(gpus=g, rate_per_1000_node_days=r, checkpoint_interval_min=c, strategy=s,
                           trials=trials, horizon_days=horizon_days, seed=g + int(10 * r) + int(c))
        e = estimate(resolve(o))
        out.append((abs(e.closed.ettr - e.mc.mean), e.closed.ettr, e.mc.mean, (g, r, c, s)))
    return out


def time_mc(engine: str, trials: int = 1000) -> tuple[float, float]:
    o = FailureOptions(gpus=16384, trials=trials, horizon_days=30.0, engine=engine)
    inputs = resolve(o)
    t0 = time.perf_counter()
    e = estimate(inputs)
    return time.perf_counter() - t0, e.mc.mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="a 2x2x2 sub-grid")
    args = ap.parse_args()
    grid = dict(gpus=(1024, 131072), rates=(1.0, 10.0), intervals=(5.0, 120.0)) if args.quick else {}
    t0 = time.perf_counter()
    gaps = grid_gaps(trials=args.trials, **grid)
    wall = time.perf_counter() - t0
    gap, cf, mc, point = max(gaps)
    print(f"grid: {len(gaps)} points x {args.trials} trials in {wall:.1f} s")
    print(f"max |closed form - Monte Carlo| ETTR gap: {gap:.4f} at GPUs={point[0]} rate={point[1]} "
          f"interval={point[2]} min strategy={point[3]} (closed form {cf:.4f}, Monte Carlo {mc:.4f})")
    live = [g for g in gaps if g[1] >= 0.1]
    if live:
        gap, cf, mc, point = max(live)
        print(f"  among the {len(live)} points with ETTR >= 0.1: {gap:.4f} at GPUs={point[0]} rate={point[1]} "
              f"interval={point[2]} min strategy={point[3]} (closed form {cf:.4f}, Monte Carlo {mc:.4f})")
    for engine in ("vector", "simpy"):
        dt, mean = time_mc(engine)
        print(f"Monte Carlo {engine:6s}: 1,000 trials of a 30-day 16K-GPU job in {dt:.2f} s (ETTR {mean:.4f})")


if __name__ == "__main__":
    main()
