"""`lumos-sim bench`: what the hardware models predict for one collective or one GEMM.

    lumos-sim bench collective --hardware h100-sxm --op all_reduce --size 1GiB --gpus 8 [--algorithm ring]
        [--concurrent 2] [--json]
    lumos-sim bench gemm --hardware h100-sxm --m 8192 --n 8192 --k 8192 --dtype bf16 [--json]
    lumos-sim bench presets [--json]

Bandwidths follow nccl-tests: algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce,
x (n-1)/n for all_gather / reduce_scatter / all_to_all, x 1 for broadcast / reduce.
"""
from __future__ import annotations

import argparse
import json
import sys

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType

_OPS = {
    "all_reduce": CommType.ALL_REDUCE, "all_gather": CommType.ALL_GATHER,
    "reduce_scatter": CommType.REDUCE_SCATTER, "all_to_all": CommType.ALL_TO_ALL,
    "broadcast": CommType.BROADCAST, "reduce": CommType.REDUCE,
}


def _size(text: str) -> int:
    from replay.hardware.units import parse_size
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        v = int(float(text))
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not an integer: '{text}'") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: '{text}'")
    if v > _MAX_DIM:
        raise argparse.ArgumentTypeError(f"must be at most {_MAX_DIM:,}: '{text}'")
    return v


_MAX_DIM = 1 << 31   # GEMM dimensions and batch: beyond any real matrix


def _gpu_count(text: str) -> int:
    from replay.hardware.network import MAX_COLLECTIVE_RANKS
    v = _positive_int(text)
    if v > MAX_COLLECTIVE_RANKS:
        raise argparse.ArgumentTypeError(f"at most {MAX_COLLECTIVE_RANKS:,} GPUs per collective: '{text}'")
    return v


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="predict one collective or GEMM on a hardware preset",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="bench_what", metavar="WHAT")
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])

    c = sub.add_parser("collective", help="one collective: time, algbw, busbw, algorithm chosen")
    c.add_argument("--hardware", default="h100-sxm", help="preset name or path to a .toml (default h100-sxm)")
    c.add_argument("--op", choices=sorted(_OPS), default="all_reduce", help="collective (default all_reduce)")
    c.add_argument("--size", type=_size, default=_size("1GiB"), help="bytes: 8, 1e9, 64MB, 1GiB (below 1 PiB)")
    c.add_argument("--gpus", type=_gpu_count, default=8,
                   help="ranks 0..N-1 (rank // gpus_per_node = node); at most 1,048,576 (512 for all_to_all)")
    c.add_argument("--algorithm", default=None, help="force an algorithm (ring, tree, nvls, direct, pairwise, "
                                                   "hierarchical); default: the fastest, as NCCL's tuner")
    c.add_argument("--concurrent", type=_positive_int, default=1,
                   help="N identical collectives in flight together on the same ranks, sharing the links "
                        "max-min fairly (default 1: alone; at most 1,024, and N x GPUs at most 1,048,576)")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c.set_defaults(func=_collective)

    g = sub.add_parser("gemm", help="one GEMM: time, TFLOP/s, bound")
    g.add_argument("--hardware", default="h100-sxm", help="preset name or path to a .toml (default h100-sxm)")
    g.add_argument("--m", type=_positive_int, required=True, help="rows of A and C (e.g. tokens)")
    g.add_argument("--n", type=_positive_int, required=True, help="columns of B and C (e.g. output features)")
    g.add_argument("--k", type=_positive_int, required=True, help="the reduced dimension (e.g. input features)")
    g.add_argument("--batch", type=_positive_int, default=1, help="independent GEMMs of this shape (batched GEMM)")
    g.add_argument("--dtype", choices=["bf16", "fp16", "fp8", "tf32", "fp32"], default="bf16",
                   help="operand type (default bf16)")
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.set_defaults(func=_gemm)

    s = sub.add_parser("presets", help="list the hardware presets and their headline figures")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=_presets)


MAX_CONCURRENT = 1024              # collectives in flight together: each is simulated with all its flows
MAX_CONCURRENT_RANKS = 1 << 20     # concurrent x GPUs: the flows one sharing simulation holds


def _collective(args) -> int:
    from replay.hardware import NetworkModel, get_hardware
    if args.concurrent > MAX_CONCURRENT or args.concurrent * args.gpus > MAX_CONCURRENT_RANKS:
        raise TraceInputError(None, f"--concurrent {args.concurrent:,} x --gpus {args.gpus:,} is past what one link-sharing "
                                    f"simulation holds (--concurrent at most {MAX_CONCURRENT:,}, and --concurrent x "
                                    f"--gpus at most {MAX_CONCURRENT_RANKS:,})")
    hw = get_hardware(args.hardware)
    net = NetworkModel(hw)
    try:
        est = net.estimate(_OPS[args.op], args.size, range(args.gpus), args.algorithm)
    except ValueError as e:
        raise TraceInputError(None, str(e)) from None
    out = est.to_dict()
    out["hardware"] = hw.name
    out["nodes"] = (args.gpus + hw.node.gpus_per_node - 1) // hw.node.gpus_per_node
    rows = [("time_us", "time (us)"), ("algbw_gbps", "algbw (GB/s)"), ("busbw_gbps", "busbw (GB/s)"),
            ("algorithm", "algorithm"), ("protocol", "protocol"), ("gpus", "GPUs"), ("nodes", "nodes"),
            ("size_bytes", "size (bytes)")]
    if args.concurrent > 1:
        ranks = list(range(args.gpus))
        together = net.concurrent_us([(_OPS[args.op], args.size, ranks)] * args.concurrent)
        out["concurrent"] = args.concurrent
        out["concurrent_time_us"] = max(together)
        out["slowdown"] = out["concurrent_time_us"] / est.time_us if est.time_us > 0 else 1.0
        rows += [("concurrent", "collectives in flight"), ("concurrent_time_us", "time together (us)"),
                 ("slowdown", "slow-down")]
    _emit(out, args.json, f"{args.op} on {hw.name}", rows)
    return 0


def _gemm(args) -> int:
    from replay.hardware import ComputeModel, get_hardware
    hw = get_hardware(args.hardware)
    if args.dtype == "fp8" and hw.gpu.peak_tflops.get("fp8", 0.0) <= 0:
        # as the what-ifs refuse FP8 there (bf16 / tf32 on an older GPU fall back to the rate it has)
        from chakra_schema.errors import TraceInputError
        raise TraceInputError(None, f"--dtype fp8: {hw.name} ({hw.gpu.model}) has no fp8 tensor cores")
    from replay.hardware.compute import MAX_TENSOR_ELEMENTS
    for name, rows, cols in (("A", args.m, args.k), ("B", args.k, args.n), ("C", args.m, args.n)):
        if args.batch * rows * cols > MAX_TENSOR_ELEMENTS:
            from chakra_schema.errors import TraceInputError
            raise TraceInputError(None, f"operand {name} ({args.batch} x {rows:,} x {cols:,}) has "
                                        f"{float(args.batch * rows * cols):.3g} elements: more than any GPU holds")
    est = ComputeModel(hw).gemm(args.m, args.n, args.k, args.batch, args.dtype)
    out = {"time_us": est.time_us, "tflops": est.tflops, "bound": est.bound, "compute_us": est.compute_us,
           "memory_us": est.memory_us, "efficiency": est.efficiency, "kernel": est.detail,
           "hardware": hw.name, "m": args.m, "n": args.n, "k": args.k, "batch": args.batch, "dtype": args.dtype}
    _emit(out, args.json, f"GEMM {args.m}x{args.n}x{args.k} {args.dtype} on {hw.name}",
          [("time_us", "time (us)"), ("tflops", "TFLOP/s"), ("bound", "bound"), ("compute_us", "compute term (us)"),
           ("memory_us", "memory term (us)"), ("efficiency", "fraction of peak"), ("kernel", "tile")])
    return 0


def _presets(args) -> int:
    from replay.hardware import get_hardware, list_hardware
    rows = []
    for name in list_hardware():
        hw = get_hardware(name)
        rows.append({"name": name, "aliases": list(hw.aliases), "gpu": hw.gpu.model,
                     "bf16_tflops": hw.peak_flops("bf16") / 1e12, "hbm_gbs": hw.gpu.hbm_bw_gbs,
                     "nvlink_gbs": hw.node.nvlink_bw_gbs, "gpus_per_node": hw.node.gpus_per_node,
                     "intra": hw.node.intra_topology + (" + NVLS" if hw.node.nvls else ""),
                     "nics": f"{hw.network.nics_per_node}x{hw.network.nic_gbps:g}G"})
    if args.json:
        sys.stdout.write(json.dumps(rows, sort_keys=True) + "\n")
        return 0
    from lumos_sim.tables import console, table
    t = table("hardware presets (lumos-sim bench collective --hardware NAME)",
              ("name", "GPU", "BF16 TFLOP/s", "HBM GB/s", "NVLink GB/s", "node", "NICs"),
              right=("BF16 TFLOP/s", "HBM GB/s", "NVLink GB/s"), whole=("name",))
    for r in rows:
        t.add_row(r["name"], r["gpu"], f"{r['bf16_tflops']:g}", f"{r['hbm_gbs']:g}", f"{r['nvlink_gbs']:g}",
                  f"{r['gpus_per_node']} GPUs, {r['intra'].replace('_', ' ')}", r["nics"])
    out = console()
    out.print(t)
    out.print("aliases (also accepted by --hardware):")
    for r in rows:
        if r["aliases"]:
            out.print(f"  {r['name']}: {', '.join(r['aliases'])}")
    return 0


def _emit(out: dict, as_json: bool, title: str, rows: list[tuple[str, str]]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return
    from lumos_sim.tables import console, table
    t = table(title, ("metric", "value"), right=("value",))
    for key, label in rows:
        v = out[key]
        t.add_row(label, f"{v:,.2f}" if isinstance(v, float) else str(v))
    console().print(t)
