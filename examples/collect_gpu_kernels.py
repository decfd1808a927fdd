"""Kernel ground truth: profile GEMMs (bf16, and fp8 through `torch._scaled_mm`), SDPA/flash attention
forward+backward, norms and elementwise ops, each group as its own ET + Kineto trace pair.

    python examples/collect_gpu_kernels.py OUT_DIR [--small] [--sections gemm_bf16,gemm_fp8,attention,norm,elementwise]

Each section writes OUT_DIR/kernels_<section>/{host,device}.0.json.gz via `lumos_sim.collect.profile_steps`
(record_shapes on, so every kernel's launching op carries its `Input Dims`). One profiled step runs every
shape of the section `--reps` times; `--steps` steps are profiled after one warm-up step.
`--small` shrinks every shape so the script runs on a CPU in seconds (used by the tests).
Inputs are random normal values (never zeros: MMA units are measurably faster on zeros).
"""
from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from lumos_sim.collect import profile_steps  # noqa: E402

SECTIONS = ("gemm_bf16", "gemm_fp8", "attention", "norm", "elementwise")


# ----------------------------------------------------------------------------- shapes
def gemm_shapes(small: bool, seed: int = 0) -> list[tuple[int, int, int]]:
    """(M, N, K): squares, transformer projections (Llama 3 8B/70B hidden/FFN sizes at 2K-16K tokens),
    decode-like skinny M, and a seeded sample of the 16..16384 cube."""
    if small:
        return [(16, 32, 64), (64, 64, 64), (128, 96, 32), (32, 128, 256)]
    sizes = (16, 64, 256, 1024, 2048, 4096, 8192, 16384)
    shapes = {(s, s, s) for s in sizes}
    for tokens in (2048, 8192, 16384):
        for h, f in ((4096, 14336), (8192, 28672)):
            shapes |= {(tokens, 3 * h // 2 if h == 4096 else h + 2048, h), (tokens, h, h), (tokens, 2 * f, h),
                       (tokens, h, f), (h, f, tokens)}
    for m in (1, 16, 64, 128):
        shapes |= {(m, 4096, 4096), (m, 14336, 4096), (m, 4096, 14336), (m, 8192, 8192)}
    rng = random.Random(seed)
    cube = list(itertools.product(sizes, repeat=3))
    rng.shuffle(cube)
    for m, n, k in cube:
        if len(shapes) >= 170:
            break
        if 2 * m * n * k <= 2 * 8192 * 16384 * 16384:  # at most ~6 ms each on an H100
            shapes.add((m, n, k))
    return sorted(shapes)


def attention_shapes(small: bool) -> list[tuple[int, int, int, int, int, bool]]:
    """(batch, q heads, kv heads, seq, head_dim, causal)."""
    if small:
        return [(1, 2, 2, 32, 16, True), (2, 4, 2, 16, 16, False)]
    return [(1, 32, 32, 2048, 128, True), (2, 32, 8, 4096, 128, True), (1, 64, 8, 8192, 128, True),
            (4, 16, 16, 1024, 64, False), (1, 32, 8, 16384, 128, True), (8, 32, 32, 512, 128, False),
            (16, 16, 16, 2048, 64, True), (1, 16, 16, 4096, 128, False)]


def norm_shapes(small: bool) -> list[tuple[int, int]]:
    if small:
        return [(64, 32), (16, 128)]
    return [(1024, 1024), (4096, 4096), (8192, 8192), (16384, 2048), (32768, 4096), (2048, 16384)]


def elementwise_sizes(small: bool) -> list[int]:
    return [1 << 10, 1 << 14] if small else [1 << p for p in (16, 20, 22, 24, 26, 28)]


# ----------------------------------------------------------------------------- sections
def _randn(*shape, device, dtype, requires_grad=False):
    return torch.randn(*shape, device=device, dtype=dtype, requires_grad=requires_grad)


def gemm_bf16(device: str, small: bool, reps: int):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ops = []
    for m, n, k in gemm_shapes(small):
        a, b = _randn(m, k, device=device, dtype=dtype), _randn(k, n, device=device, dtype=dtype)
        ops.append(lambda a=a, b=b: torch.mm(a, b))
    return ops, reps


def gemm_fp8(device: str, small: bool, reps: int):
    """fp8 e4m3 x e4m3 -> bf16 with per-tensor scales, the way Transformer Engine's recipe runs them.
    `_scaled_mm` wants the second operand column-major and N, K multiples of 16."""
    if device != "cuda":
        return [], reps
    ops = []
    one = torch.ones((), device=device, dtype=torch.float32)
    for m, n, k in gemm_shapes(small):
        if n % 16 or k % 16:
            continue
        a = _randn(m, k, device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        b = _randn(n, k, device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
        ops.append(lambda a=a, b=b: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return ops, reps


def attention(device: str, small: bool, reps: int):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ops = []
    for b, hq, hkv, s, d, causal in attention_shapes(small):
        q = _randn(b, hq, s, d, device=device, dtype=dtype, requires_grad=True)
        k = _randn(b, hkv, s, d, device=device, dtype=dtype, requires_grad=True)
        v = _randn(b, hkv, s, d, device=device, dtype=dtype, requires_grad=True)
        grad = _randn(b, hq, s, d, device=device, dtype=dtype)

        def fwd_bwd(q=q, k=k, v=v, grad=grad, causal=causal, gqa=hq != hkv):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            out.backward(grad)
        ops.append(fwd_bwd)
    return ops, reps


def norm(device: str, small: bool, reps: int):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ops = []
    for t, h in norm_shapes(small):
        x = _randn(t, h, device=device, dtype=dtype, requires_grad=True)
        w = torch.ones(h, device=device, dtype=dtype, requires_grad=True)
        bias = torch.zeros(h, device=device, dtype=dtype, requires_grad=True)
        g = _randn(t, h, device=device, dtype=dtype)
        ops.append(lambda x=x, w=w, bias=bias, g=g, h=h: F.layer_norm(x, (h,), w, bias).backward(g))
        ops.append(lambda x=x, w=w, g=g, h=h: F.rms_norm(x, (h,), w).backward(g))
    return ops, reps


def elementwise(device: str, small: bool, reps: int):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ops = []
    for n in elementwise_sizes(small):
        x, y = _randn(n, device=device, dtype=dtype), _randn(n, device=device, dtype=dtype)
        ops += [lambda x=x, y=y: x + y, lambda x=x, y=y: x * y, lambda x=x: F.gelu(x), lambda x=x: F.silu(x),
                lambda x=x: x.float(), lambda x=x, y=y: torch.add(x, y, alpha=0.5).mul_(2.0)]
    return ops, reps


BUILDERS = {"gemm_bf16": gemm_bf16, "gemm_fp8": gemm_fp8, "attention": attention, "norm": norm,
            "elementwise": elementwise}


def collect_section(name: str, out: Path, device: str, small: bool, reps: int, steps: int) -> dict:
    t0 = time.perf_counter()
    ops, reps = BUILDERS[name](device, small, reps)
    if not ops:
        return {"section": name, "skipped": f"needs cuda (device={device})"}

    def step(i: int) -> None:
        for op in ops:
            for _ in range(reps):
                op()
        if device == "cuda":
            torch.cuda.synchronize()

    n_ops = len(ops)
    res = profile_steps(step, out / f"kernels_{name}", rank=0, warmup=1, steps=steps)
    del ops
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"section": name, "ops": n_ops,
            "steps": res.link.profiler_steps, "step_ms": [round(d / 1e3, 3) for d in res.link.step_durations_us],
            "linked": f"{res.link.linked}/{res.link.et_rf_ids}", "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU tests)")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--reps", type=int, default=2, help="runs of each shape per profiled step")
    ap.add_argument("--steps", type=int, default=2, help="profiled steps per section")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    for name in args.sections.split(","):
        if name not in BUILDERS:
            ap.error(f"unknown section {name!r} (choose from {', '.join(SECTIONS)})")
        try:
            print(collect_section(name, args.out, device, args.small, args.reps, args.steps), flush=True)
        except Exception as e:  # one failing section must not lose the others
            print({"section": name, "error": f"{type(e).__name__}: {e}"}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
