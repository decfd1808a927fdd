"""How long a what-if parallelism prediction takes at scale (rank symmetry: one simulated rank per
pipeline stage). Targets: Llama 3 405B on 16,384 H100 (TP8 PP16 CP1 DP128, seq 8192, global batch
2048) <= 10 s; the same on ~100K GPUs (DP 784) <= 30 s. The default (fast) estimate; `--mode symmetric` for
the full replay of the step.

    PYTHONPATH=. python benchmarks/bench_whatif_scale.py [--mode fast|symmetric]
"""
from __future__ import annotations

import argparse
import time

from estimators.model_config import load_model
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.evaluate import predict


def run(gpus_label: str, plan: ParallelPlan, mode: str = "fast") -> None:
    model = load_model("llama3-405b")
    t0, c0 = time.perf_counter(), time.process_time()
    r = predict(model, plan, "h100-sxm", mode=mode)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{gpus_label:>8} GPUs ({plan.gpus:,}): TP{plan.tp} PP{plan.pp} CP{plan.cp} DP{plan.dp}, "
          f"{plan.micro_batches} micro-batches -> step {r.step_time_s:.3f} s, {r.tflops_per_gpu:.0f} TFLOP/s/GPU, "
          f"MFU {100 * r.mfu:.1f}%, {r.num_nodes:,} nodes on {r.simulated_ranks} simulated ranks; "
          f"wall {wall:.2f} s (CPU {cpu:.2f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="fast", help="simulation mode: fast (default), symmetric")
    args = ap.parse_args()
    base = ParallelPlan(tp=8, pp=16, cp=1, dp=128, seq_len=8192, global_batch=2048)
    run("16K", base, args.mode)
    run("100K", base.with_(dp=784, global_batch=784 * 16), args.mode)


if __name__ == "__main__":
    main()
