"""How long one parallelism estimate takes as the pipeline deepens (`estimators.parallelism.evaluate.predict`).
Target: <= 0.5 s per estimate at any depth up to PP128, with and without interleaving (virtual stages).

Cases: Llama 3 405B (126 layers: the first and last stage hold one layer less) on TP8 x PP x DP (DP = 1024 / PP)
with 2,048 sequences of 8,192 tokens per step (2 x PP micro-batches); the interleaved cases, and PP128 (126 layers
do not split over 128 stages), use the same layer shape with 256 layers, so that PP128 x VP2 has one layer per
model chunk. Each case prints the wall time of one estimate (the model,
hardware and plan objects already built) and its CPU time (the machine may be shared: the CPU time is what
the estimate costs) per simulation mode, and the step time each mode predicts. A first estimate of a small
plan runs before the cases and is reported on its own: it loads what every process loads once (the
modules the replay imports lazily, the hardware preset), which the cases would otherwise charge to the
first one. Times are the best of `--repeat` estimates (default 1; the machine may be shared).

    PYTHONPATH=. python benchmarks/bench_estimate_depth.py [--modes fast,symmetric] [--depths 16,64,128]
                                                           [--repeat 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from estimators.model_config import load_model
from estimators.parallelism.evaluate import predict
from chakra_schema.errors import TraceInputError
from estimators.parallelism.plan import ParallelPlan, validate_plan


def cases(depths: list[int]):
    base = load_model("llama3-405b")
    deep = dataclasses.replace(base, name="llama3-405b-256L", layers=256)
    for pp in depths:
        dp = max(1, 1024 // pp)
        plan = ParallelPlan(tp=8, pp=pp, dp=dp, seq_len=8192, global_batch=2048)
        try:   # 126 layers do not split over 128 stages: the 256-layer model there
            validate_plan(base, plan)
            yield f"PP{pp}", base, plan
        except TraceInputError:
            yield f"PP{pp}", deep, plan
        yield f"PP{pp} VP2", deep, plan.with_(vp=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="fast", help="comma-separated simulation modes (fast, symmetric)")
    ap.add_argument("--depths", default="16,64,128", help="comma-separated pipeline depths")
    ap.add_argument("--repeat", type=int, default=1, help="estimates per case and mode; the fastest is shown")
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    predict(load_model("llama3-8b"), ParallelPlan(tp=2, pp=2, dp=2, seq_len=4096, global_batch=16), "h100-sxm")
    print(f"first estimate in this process (llama3-8b TP2 PP2 DP2, with the one-time loading): "
          f"{time.perf_counter() - t0:.3f} s wall, {time.process_time() - c0:.3f} s CPU", flush=True)
    modes = args.modes.split(",")
    depths = [int(d) for d in args.depths.split(",")]
    print(f"{'case':<10} {'model':<18} {'GPUs':>6} {'m':>4}  "
          + "  ".join(f"{m + ' wall s':>16} {'cpu s':>7} {'step s':>8}" for m in modes), flush=True)
    for label, model, plan in cases(depths):
        cells = []
        for mode in modes:
            wall = cpu = float("inf")
            for _ in range(max(1, args.repeat)):
                t0, c0 = time.perf_counter(), time.process_time()
                r = predict(model, plan, "h100-sxm", mode=mode)
                wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
            cells.append(f"{wall:>16.3f} {cpu:>7.3f} {r.step_time_s:>8.3f}")
        print(f"{label:<10} {model.name:<18} {plan.gpus:>6} {plan.micro_batches:>4}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
