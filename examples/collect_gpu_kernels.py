"""Collect a kernel-level ground-truth sweep on one GPU: GEMMs (bf16 and fp8), SDPA fwd+bwd, norms,
elementwise ops and casts, each profiled with torch.profiler (record_shapes) + an Execution Trace.

    python examples/collect_gpu_kernels.py OUT_DIR [--small] [--device auto|cuda|cpu]
                                           [--families gemm_bf16,gemm_fp8,sdpa,norm,elementwise]
                                           [--reps 5] [--time-budget 240]

One trace pair per family, in OUT_DIR/kernels_<family>/{host,device}.0.json.gz (the layout
`lumos-sim convert` reads). Every shape ("group") is one ProfilerStep: its inputs are made, then the op
runs `--reps` times, then the GPU is synchronised. Before the profiler starts, every group is warmed
up once (cuBLAS heuristics, lazy module loading, allocator growth) and timed with CUDA events; those
timings go to OUT_DIR/kernels_<family>/groups.json with the achieved TFLOP/s or GB/s, so the sweep also
reads as a plain benchmark. fp8 GEMMs use `torch._scaled_mm` on float8_e4m3fn inputs with per-tensor
fp32 scales and a bf16 output (GPU only: skipped on CPU).

--small (implied on CPU) shrinks every shape so the whole sweep runs in seconds on a laptop core.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_trace_util import pick_device, profile_loop, sync  # noqa: E402

FAMILIES = ("gemm_bf16", "gemm_fp8", "sdpa", "norm", "elementwise")
POW2 = [16 << i for i in range(11)]  # 16 .. 16384
# (N, K) of the weight GEMMs of Llama-like layers (hidden 4096/8192, GQA kv 1024, SwiGLU 11008/14336)
WEIGHT_NK = [(4096, 4096), (6144, 4096), (4096, 11008), (11008, 4096), (14336, 4096), (8192, 8192)]


@dataclass(frozen=True)
class Group:
    """One profiled shape: `make()` allocates inputs and returns the op to run; work is for the report."""
    name: str
    params: dict
    flops: float  # useful floating-point operations of one run (0 when not compute-bound)
    bytes: float  # minimal bytes moved by one run
    make: Callable[[], Callable[[], None]]


# ------------------------------------------------------------------------------------------ shapes
def gemm_shapes(small: bool, n_random: int = 100, seed: int = 0) -> list[tuple[int, int, int]]:
    """Square, decode-like (tiny M), transformer fwd (big M x weight), wgrad-like (big K) and a seeded
    log-uniform sample of (M, N, K) in [16, 16384]^3, multiples of 16 (fp8 needs them)."""
    shapes = [(d, d, d) for d in POW2]
    shapes += [(m, n, k) for m in (16, 64, 128) for n, k in WEIGHT_NK[:5]]
    shapes += [(m, n, k) for m in (2048, 8192, 16384) for n, k in WEIGHT_NK]
    shapes += [(n, k, t) for t in (2048, 8192, 16384) for n, k in WEIGHT_NK[:3]]  # dW = dY^T X
    shapes += [(8192, 16, 8192), (8192, 128, 8192), (16, 16384, 16384), (16384, 16384, 16)]
    rng = random.Random(seed)
    drawn = 0
    while drawn < n_random:
        m, n, k = (16 * max(1, round(2 ** rng.uniform(4, 14) / 16)) for _ in range(3))
        if 2.0 * m * n * k <= 2.0 * 16384 ** 3:
            shapes.append((m, n, k))
            drawn += 1
    shapes = list(dict.fromkeys(shapes))  # de-duplicate, keep order
    if small:
        shrunk = [tuple(max(16, 16 * round(d / 64 / 16)) for d in s) for s in shapes]
        shapes = list(dict.fromkeys(shrunk))[:14]
    return shapes


def sdpa_configs(small: bool) -> list[tuple[int, int, int, int, int, bool]]:
    """(batch, q_heads, kv_heads, seq, head_dim, causal)."""
    if small:
        return [(2, 4, 4, 64, 32, True), (1, 4, 2, 128, 32, True), (2, 2, 2, 64, 16, False)]
    return [(4, 32, 32, 2048, 128, True), (4, 32, 32, 2048, 128, False), (2, 32, 32, 4096, 128, True),
            (1, 32, 32, 8192, 128, True), (1, 32, 32, 16384, 128, True), (8, 16, 16, 1024, 64, True),
            (16, 16, 16, 512, 64, False), (32, 12, 12, 512, 64, True), (8, 32, 32, 1024, 128, False),
            (4, 32, 8, 2048, 128, True), (2, 64, 8, 4096, 128, True), (1, 16, 16, 4096, 256, True)]


def norm_shapes(small: bool) -> list[tuple[int, int]]:
    if small:
        return [(64, 128), (256, 64)]
    return [(2048, 2048), (8192, 4096), (16384, 4096), (4096, 8192), (32768, 1024), (65536, 512),
            (16384, 8192)]


def elementwise_sizes(small: bool) -> list[int]:
    return [1 << 12, 1 << 16] if small else [1 << 16, 1 << 20, 1 << 23, 1 << 25, 1 << 27]


# ------------------------------------------------------------------------------------------ groups
def gemm_groups(dev, dtype, small: bool) -> list[Group]:
    groups = []
    for m, n, k in gemm_shapes(small):
        def make(m=m, n=n, k=k):
            a = torch.randn(m, k, device=dev, dtype=dtype)
            b = torch.randn(k, n, device=dev, dtype=dtype)
            return lambda: torch.mm(a, b)
        size = torch.tensor([], dtype=dtype).element_size()
        groups.append(Group(f"mm_{m}x{n}x{k}", {"m": m, "n": n, "k": k, "dtype": str(dtype)},
                            2.0 * m * n * k, size * (m * k + k * n + m * n), make))
    return groups


def gemm_fp8_groups(dev, small: bool) -> list[Group]:
    groups = []
    for m, n, k in gemm_shapes(small):
        def make(m=m, n=n, k=k):
            a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)  # b.t() is column-major, as cuBLASLt wants
            sa = torch.tensor(1.0, device=dev)
            sb = torch.tensor(1.0, device=dev)
            return lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        groups.append(Group(f"scaled_mm_e4m3_{m}x{n}x{k}", {"m": m, "n": n, "k": k, "dtype": "float8_e4m3fn",
                                                           "out_dtype": "bfloat16"},
                            2.0 * m * n * k, m * k + k * n + 2 * m * n, make))
    return groups


def sdpa_groups(dev, dtype, small: bool) -> list[Group]:
    groups = []
    for b, hq, hkv, s, d, causal in sdpa_configs(small):
        def make(b=b, hq=hq, hkv=hkv, s=s, d=d, causal=causal):
            q = torch.randn(b, hq, s, d, device=dev, dtype=dtype, requires_grad=True)
            k = torch.randn(b, hkv, s, d, device=dev, dtype=dtype, requires_grad=True)
            v = torch.randn(b, hkv, s, d, device=dev, dtype=dtype, requires_grad=True)
            g = torch.randn(b, hq, s, d, device=dev, dtype=dtype)

            def run():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
                out.backward(g)
            return run
        # fwd 4*b*h*s*s*d (QK^T and PV), bwd 2.5x fwd (5 matmuls incl. recompute of S); causal halves it
        fwd = 4.0 * b * hq * s * s * d * (0.5 if causal else 1.0)
        size = torch.tensor([], dtype=dtype).element_size()
        groups.append(Group(f"sdpa_b{b}_h{hq}_kv{hkv}_s{s}_d{d}{'_causal' if causal else ''}",
                            {"batch": b, "q_heads": hq, "kv_heads": hkv, "seq": s, "head_dim": d,
                             "causal": causal, "dtype": str(dtype), "passes": "fwd+bwd", "fwd_flops": fwd},
                            3.5 * fwd, size * b * s * d * (2 * hq + 2 * hkv) * 2, make))
    return groups


def rms_norm(x, w, eps=1e-6):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


def norm_groups(dev, dtype, small: bool) -> list[Group]:
    groups = []
    size = torch.tensor([], dtype=dtype).element_size()
    for kind in ("layer_norm", "rms_norm"):
        for t, h in norm_shapes(small):
            def make(t=t, h=h, kind=kind):
                x = torch.randn(t, h, device=dev, dtype=dtype, requires_grad=True)
                w = torch.ones(h, device=dev, dtype=dtype, requires_grad=True)
                bias = torch.zeros(h, device=dev, dtype=dtype, requires_grad=True)
                g = torch.randn(t, h, device=dev, dtype=dtype)

                def run():
                    y = F.layer_norm(x, (h,), w, bias) if kind == "layer_norm" else rms_norm(x, w)
                    y.backward(g)
                return run
            groups.append(Group(f"{kind}_{t}x{h}", {"op": kind, "tokens": t, "hidden": h, "dtype": str(dtype),
                                                    "passes": "fwd+bwd"}, 0.0, size * t * h * 5, make))
    return groups


def elementwise_groups(dev, dtype, small: bool) -> list[Group]:
    ops: dict[str, tuple[Callable, int]] = {  # name -> (make_op(x, y), bytes per element moved)
        "add": (lambda x, y: (lambda: torch.add(x, y)), 3),
        "mul": (lambda x, y: (lambda: torch.mul(x, y)), 3),
        "gelu": (lambda x, y: (lambda: F.gelu(x)), 2),
        "silu": (lambda x, y: (lambda: F.silu(x)), 2),
        "cast_to_fp32": (lambda x, y: (lambda: x.float()), 3),
        "cast_from_fp32": (lambda x, y: (lambda: y.float().to(dtype)), 0),  # cast measured below
    }
    groups = []
    size = torch.tensor([], dtype=dtype).element_size()
    for n in elementwise_sizes(small):
        for name, (op, per_elem) in ops.items():
            def make(n=n, op=op, name=name):
                x = torch.randn(n, device=dev, dtype=dtype)
                y = torch.randn(n, device=dev, dtype=dtype)
                if name == "cast_from_fp32":
                    x32 = x.float()
                    return lambda: x32.to(dtype)
                return op(x, y)
            moved = (size * 2 + 4) * n / 2 if name.startswith("cast") else per_elem * size * n
            groups.append(Group(f"{name}_{n}", {"op": name, "numel": n, "dtype": str(dtype)}, 0.0, moved, make))
        if dev.type == "cuda":
            def make_fp8(n=n):
                x = torch.randn(n, device=dev, dtype=dtype)
                return lambda: x.to(torch.float8_e4m3fn)
            groups.append(Group(f"cast_to_fp8_{n}", {"op": "cast_to_fp8", "numel": n, "dtype": str(dtype)},
                                0.0, (size + 1) * n, make_fp8))
    return groups


def build_groups(family: str, dev, small: bool) -> list[Group]:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if family == "gemm_bf16":
        return gemm_groups(dev, dtype, small)
    if family == "gemm_fp8":
        return gemm_fp8_groups(dev, small) if dev.type == "cuda" else []
    if family == "sdpa":
        return sdpa_groups(dev, dtype, small)
    if family == "norm":
        return norm_groups(dev, dtype, small)
    if family == "elementwise":
        return elementwise_groups(dev, dtype, small)
    raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")


# ------------------------------------------------------------------------------------------ running
def time_group(group: Group, dev, reps: int) -> float:
    """Warm the group up once, then time `reps` runs; returns mean seconds per run."""
    run = group.make()
    run()
    sync(dev)
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    return (time.perf_counter() - t0) / reps


def collect_family(family: str, out_dir: Path, dev, small: bool, reps: int, deadline: float) -> dict:
    groups = build_groups(family, dev, small)
    if not groups:
        return {"family": family, "skipped": f"no groups on {dev.type}"}
    ok, records = [], []
    for g in groups:  # warm-up + event timing; a shape the backend rejects is dropped, not fatal
        if time.monotonic() > deadline:
            print(f"  {family}: time budget reached after {len(ok)} groups", flush=True)
            break
        try:
            sec = time_group(g, dev, reps)
        except Exception as e:  # noqa: BLE001 - report and go on: one odd shape must not lose the sweep
            records.append({"name": g.name, **g.params, "error": f"{type(e).__name__}: {e}"[:300]})
            print(f"  {family}: {g.name} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        ok.append(g)
        records.append({"name": g.name, **g.params, "flops": g.flops, "bytes": g.bytes,
                        "mean_s": sec, "tflops": g.flops / sec / 1e12 if g.flops else None,
                        "gbps": g.bytes / sec / 1e9})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if not ok:
        raise RuntimeError(f"{family}: every group failed")

    def step(i: int) -> None:  # step 0 is the profiler's own warm-up (not recorded): it repeats group 0
        g = ok[max(0, i - 1)]
        with torch.profiler.record_function(f"group:{g.name}"):
            run = g.make()
            for _ in range(reps):
                run()
            sync(dev)

    fam_dir = out_dir / f"kernels_{family}"
    summary = profile_loop(step, fam_dir, steps=len(ok), warmup=1)
    (fam_dir / "groups.json").write_text(json.dumps({"family": family, "device": str(dev), "reps": reps,
                                                     "profiled_steps": {f"ProfilerStep#{i + 1}": g.name
                                                                       for i, g in enumerate(ok)},
                                                     "groups": records}, indent=1))
    return {"family": family, "groups": len(ok), "failed": len(records) - len(ok), **summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--small", action="store_true", help="tiny shapes (implied on CPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--time-budget", type=float, default=240.0, help="seconds for the whole sweep")
    args = ap.parse_args(argv)
    dev = pick_device(args.device)
    small = args.small or dev.type == "cpu"
    torch.manual_seed(0)
    deadline = time.monotonic() + args.time_budget
    results = []
    for family in args.families.split(","):
        t0 = time.perf_counter()
        try:
            res = collect_family(family, args.out_dir, dev, small, args.reps, deadline)
        except Exception as e:  # noqa: BLE001 - keep the other families
            res = {"family": family, "error": f"{type(e).__name__}: {e}"[:300]}
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
    (args.out_dir / "kernels_summary.json").write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
