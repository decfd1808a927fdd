"""Replay throughput (graph nodes per second, one core) and peak memory.

Inputs: a synthetic launch-heavy graph of N nodes (CPU thread launching kernels on two streams with
cross-stream waits and periodic synchronizes), and the largest shared trace (trace_diff_control, A100)
converted once before timing. Run: `python benchmarks/bench_replay.py [--nodes 400000] [--json]`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chakra_schema.graph import EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind  # noqa: E402
from replay.api import replay  # noqa: E402


def synthetic_graph(num_nodes: int):
    """CPU op -> launch -> kernel triples; every 50th kernel waits on the other stream; every 500 a sync."""
    b = GraphBuilder(0, 1)
    cpu = b.resource(ResourceKind.CPU_THREAD, 1, 1)
    streams = [b.resource(ResourceKind.GPU_STREAM, 0, 7), b.resource(ResourceKind.GPU_STREAM, 0, 13)]
    t = 0.0
    last = [-1, -1]
    gpu_t = [0.0, 0.0]
    k = 0
    while len(b) < num_nodes - 3:
        op = b.add_node("aten::op", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, t, 8)
        la = b.add_node("cudaLaunchKernel", NodeType.COMP_NODE, OpKind.LAUNCH, cpu, t + 2, 4, parent=op)
        s = k % 2
        st = max(t + 8, gpu_t[s])
        ke = b.add_node("kernel", NodeType.COMP_NODE, OpKind.KERNEL, streams[s], st, 10)
        b.add_dep(la, ke, EdgeKind.LAUNCH)
        if last[s] >= 0:
            b.add_dep(last[s], ke, EdgeKind.STREAM_ORDER)
        if k % 50 == 49 and last[1 - s] >= 0:
            b.add_dep(last[1 - s], ke, EdgeKind.CROSS_STREAM)
        last[s] = ke
        gpu_t[s] = st + 10
        t += 9
        if k % 500 == 499:
            end = max(gpu_t)
            sy = b.add_node("cudaDeviceSynchronize", NodeType.COMP_NODE, OpKind.SYNC, cpu, t, end - t + 3)
            b.add_deps([x for x in last if x >= 0], sy, EdgeKind.SYNC)
            t = end + 4
        k += 1
    return b.build()


def measure(graphs, label):
    t0 = time.perf_counter()
    res = replay(graphs, critical_path=False)
    dt = time.perf_counter() - t0
    n = sum(len(g) for g in graphs)
    return {"input": label, "nodes": n, "seconds": dt, "nodes_per_s": n / dt,
            "steps": len(res.steps)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=400_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g = synthetic_graph(args.nodes)
    rows.append(measure([g], f"synthetic {args.nodes:,}"))
    del g
    shared = Path(os.environ.get("LUMOS_SIM_SHARED", ROOT.parent / "shared"))
    trace = shared / "traces" / "hta" / "trace_diff_control_control.json.gz"
    if trace.exists():
        from chakra_schema.pytorch.converter import RankInputs, convert_rank
        graph = convert_rank(RankInputs(et_path=None, kineto_path=str(trace)))
        rows.append(measure([graph], "hta/trace_diff_control (A100, 1 rank)"))
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
    if args.json:
        print(json.dumps({"rows": rows, "peak_rss_growth_mib": peak_mib}))
        return
    for r in rows:
        print(f"{r['input']:<42} {r['nodes']:>9,} nodes  {r['seconds']:7.3f} s  {r['nodes_per_s']:>10,.0f} nodes/s")
    print(f"peak RSS growth over the run: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
