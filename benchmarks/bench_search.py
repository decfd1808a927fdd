"""Speed and quality of the parallelism-plan search (`estimators.parallelism.search`): every valid plan ranked by
the analytic estimate, the top 10 simulated with the replay engine. Target: >= 100,000 candidate plans
of Llama 3 70B on 1,024 H100 ranked in <= 60 s on one core, top 10 simulated.

Per case it prints: candidate plans, plans that fit in memory, ranking wall time and plans/s (one
thread: the BLAS/OpenMP pools are pinned to one before numpy loads), the wall time of the top-10
simulations, and the ranking quality: for the top 10 plus 10 plans spread over the ranked order, the
Spearman rank correlation of estimate vs simulation and the largest estimate/simulation error.

    PYTHONPATH=. python benchmarks/bench_search.py [--quick]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from estimators.model_config import load_model  # noqa: E402
from estimators.parallelism.search import rank_plans  # noqa: E402
from estimators.scenario import Scenario  # noqa: E402
from estimators.parallelism.whatif import simulate_ranked  # noqa: E402

CASES = [  # model, GPUs, sequence length, global batch (sequences)
    ("llama3-70b", 1024, 8192, 2048),   # 16M tokens per step, the Llama 3 pre-training batch
    ("llama3-70b", 1024, 8192, 1024),
    ("llama3-8b", 64, 8192, 512),
    ("llama4-scout", 256, 8192, 1024),  # MoE: EP joins the space
]


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def run(model_name: str, gpus: int, seq: int, gb: int, top_k: int = 10, spread: int = 10) -> None:
    model = load_model(model_name)
    r = rank_plans(model, "h100-sxm", gpus, seq, gb)
    print(f"{model_name} on {gpus} x h100-sxm, seq {seq}, global batch {gb}: {r.candidates:,} candidate plans "
          f"({r.fitting:,} fit in memory) ranked in {r.wall_s:.2f} s = {r.plans_per_s:,.0f} plans/s "
          f"[{', '.join(f'{k} {v:.2f} s' for k, v in r.timings_s.items())}]", flush=True)
    base = Scenario.build(model=model, hardware=r.hardware)
    t0 = time.perf_counter()
    top = simulate_ranked(base, r, top_k)
    sim_wall = time.perf_counter() - t0
    best = top[0]
    print(f"  top {len(top)} simulated in {sim_wall:.1f} s; best: {best.detail.plan and _label(best.detail.plan)} "
          f"step {best.step_time_s:.3f} s (estimate {best.metrics['analytic_step_time_s']:.3f} s, "
          f"analytic rank {best.metrics['analytic_rank']}), MFU {100 * best.mfu:.1f}%", flush=True)
    # quality: the (distinct) top plans and plans spread over the whole ranked order
    rows = list(r.top(top_k)) + list(r.order[np.linspace(top_k, r.fitting - 1, spread).astype(int)])
    est = [float(r.step_s[i]) for i in rows]
    sim = [p.step_time_s for p in sorted(top, key=lambda p: p.metrics["analytic_rank"])]
    for i in rows[top_k:]:
        sim.append(simulate_ranked(base, _single(r, i), 1)[0].step_time_s)
    err = np.abs(np.array(est) / np.array(sim) - 1)
    print(f"  estimate vs simulation on {len(rows)} plans: Spearman {_spearman(est, sim):.3f}, "
          f"median error {100 * np.median(err):.1f}%, max error {100 * err.max():.1f}%", flush=True)


def _single(r, row):
    """A view of the ranking whose order holds one row (to simulate an arbitrary plan of it)."""
    import dataclasses
    return dataclasses.replace(r, order=np.array([row]))


def _label(p) -> str:
    from estimators.scenario import plan_label
    return plan_label(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the 1,024-GPU Llama 3 70B case")
    args = ap.parse_args()
    for case in CASES[:1] if args.quick else CASES:
        run(*case)


if __name__ == "__main__":
    main()
