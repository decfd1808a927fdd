"""Speed of the hardware models (not a timed test): how long the network model takes per collective
estimate (cold and cached) at several scales, the compute model per GEMM, and ModelTiming over a real
trace when ../shared is present.

    /tmp/venv/bin/python benchmarks/bench_hardware.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chakra_schema.graph import CommType  # noqa: E402
from replay.hardware import ComputeModel, NetworkModel  # noqa: E402


def _timed(fn, repeat: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def main() -> int:
    from rich.console import Console
    from rich.table import Table
    table = Table(title="network model: one collective estimate")
    for col in ("op", "GPUs", "algorithm", "busbw GB/s", "cold ms", "cached us"):
        table.add_column(col, justify="right")
    for op in (CommType.ALL_REDUCE, CommType.ALL_GATHER, CommType.ALL_TO_ALL):
        for gpus in (8, 64, 256):
            net = NetworkModel("h100-sxm")
            cold = _timed(lambda: net.estimate(op, 1 << 30, range(gpus)))
            hot = _timed(lambda: net.estimate(op, 1 << 30, range(gpus)), 1000)
            e = net.estimate(op, 1 << 30, range(gpus))
            table.add_row(op.name.lower(), str(gpus), e.algorithm, f"{e.busbw_gbps:.1f}", f"{cold * 1e3:.1f}",
                          f"{hot * 1e6:.1f}")
    Console().print(table)

    cm = ComputeModel("h100-sxm")
    shapes = [(m, n, k) for m in (16, 1024, 8192) for n in (1024, 4096, 14336) for k in (1024, 4096, 8192)]
    cold = _timed(lambda: [cm.gemm(m + 1, n, k) for m, n, k in shapes]) / len(shapes)
    print(f"compute model: {cold * 1e6:.1f} us per uncached GEMM estimate")

    trace = ROOT.parent / "shared" / "traces" / "hta" / "trace_diff_control_control.json.gz"
    if trace.exists():
        from chakra_schema.pytorch.kineto import load_kineto
        from chakra_schema.pytorch.kineto_graph import kineto_to_graph
        from replay.model_timing import ModelTiming, TranslatedTiming
        g = kineto_to_graph(load_kineto(trace))
        t_model = _timed(lambda: ModelTiming("a100-sxm-40gb", source_hw="a100-sxm-40gb").node_durations(g))
        t_tr = _timed(lambda: TranslatedTiming("a100-sxm-40gb", "h100-sxm").node_durations(g))
        print(f"ModelTiming over {len(g):,} nodes: {t_model:.2f} s; TranslatedTiming A100->H100: {t_tr:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
