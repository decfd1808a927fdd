"""How long a what-if parallelism prediction takes at scale (rank symmetry: one simulated rank per
pipeline stage). Targets: Llama 3 405B on 16,384 H100 (TP8 PP16 CP1 DP128, seq 8192, global batch
2048) <= 10 s; the same on ~100K GPUs (DP 784) <= 30 s.

    /tmp/venv/bin/python benchmarks/bench_whatif_scale.py
"""
from __future__ import annotations

import time

from estimators.model_config import load_model
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.evaluate import predict


def run(gpus_label: str, plan: ParallelPlan) -> None:
    model = load_model("llama3-405b")
    t0 = time.perf_counter()
    r = predict(model, plan, "h100-sxm")
    wall = time.perf_counter() - t0
    print(f"{gpus_label:>8} GPUs ({plan.gpus:,}): TP{plan.tp} PP{plan.pp} CP{plan.cp} DP{plan.dp}, "
          f"{plan.micro_batches} micro-batches -> step {r.step_time_s:.3f} s, {r.tflops_per_gpu:.0f} TFLOP/s/GPU, "
          f"MFU {100 * r.mfu:.1f}%, {r.num_nodes:,} nodes on {r.simulated_ranks} simulated ranks; "
          f"wall {wall:.2f} s", flush=True)


def main() -> None:
    base = ParallelPlan(tp=8, pp=16, cp=1, dp=128, seq_len=8192, global_batch=2048)
    run("16K", base)
    run("100K", base.with_(dp=784, global_batch=784 * 16))


if __name__ == "__main__":
    main()
