"""MoE ground truth: one mixture-of-experts layer (router, top-k dispatch, expert GEMMs, combine) trained
forward+backward under the profiler, with its routing recorded.

    python examples/collect_moe_layer.py OUT_DIR [--small] [--tokens 4096,16384] [--steps 3]

Per token count, OUT_DIR/moe_t<tokens>/ gets {host,device}.0.json.gz and routing.npy: the top-k expert
ids of every profiled step, int16 [steps, tokens, top_k] (the vLLM routed-experts layout with one layer).
The router's logits get a fixed per-expert bias drawn from a Zipf-like law, so the load is skewed the
way trained routers are (some experts hot) instead of uniform as a fresh random router would be.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lumos_sim.collect import profile_steps  # noqa: E402

D_MODEL, EXPERTS, TOP_K, EXPERT_FFN = 2048, 32, 4, 1408       # fine-grained experts (DeepSeek-MoE style)
SMALL = (32, 8, 2, 48)


class MoELayer(nn.Module):
    def __init__(self, d: int, experts: int, top_k: int, ffn: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(d, experts, bias=False)
        self.w13 = nn.Parameter(torch.randn(experts, d, 2 * ffn) / d ** 0.5)
        self.w2 = nn.Parameter(torch.randn(experts, ffn, d) / ffn ** 0.5)
        ranks = torch.arange(1, experts + 1, dtype=torch.float32)
        skew = torch.log(1.0 / ranks)[torch.randperm(experts)]   # log of a Zipf(1) popularity
        self.register_buffer("skew", skew)
        self.last_routing: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x).float() + self.skew
        weights, experts = torch.topk(logits.softmax(dim=-1), self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        self.last_routing = experts.detach()
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)                  # dispatch: group token copies by expert
        counts = torch.bincount(flat, minlength=self.w13.shape[0]).tolist()
        token_of = order // self.top_k
        xs = x.index_select(0, token_of)
        outs = []
        for e, chunk in enumerate(xs.split(counts)):
            if chunk.shape[0] == 0:
                continue
            gate, up = (chunk @ self.w13[e]).chunk(2, dim=-1)
            outs.append((F.silu(gate) * up) @ self.w2[e])
        ys = torch.cat(outs) * weights.flatten()[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, token_of, ys)   # combine


def collect_tokens(tokens: int, out: Path, device: str, small: bool, warmup: int, steps: int) -> dict:
    t0 = time.perf_counter()
    d, e, k, f = SMALL if small else (D_MODEL, EXPERTS, TOP_K, EXPERT_FFN)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    layer = MoELayer(d, e, k, f).to(device=device, dtype=dtype)
    layer.skew = layer.skew.float()
    x = torch.randn(tokens, d, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(tokens, d, device=device, dtype=dtype)
    routing: list[np.ndarray] = []

    def step(i: int) -> None:
        layer(x).backward(grad)
        if i >= warmup:
            routing.append(layer.last_routing.to(torch.int16).cpu().numpy())
        if device == "cuda":
            torch.cuda.synchronize()

    run_dir = out / f"moe_t{tokens}"
    res = profile_steps(step, run_dir, rank=0, warmup=warmup, steps=steps)
    r = np.stack(routing)
    np.save(run_dir / "routing.npy", r)
    load = np.bincount(r[-1].ravel(), minlength=e)
    return {"run": f"moe_t{tokens}", "experts": e, "top_k": k,
            "step_ms": [round(v / 1e3, 3) for v in res.link.step_durations_us],
            "max_over_mean_load": round(float(load.max() / load.mean()), 2),
            "linked": f"{res.link.linked}/{res.link.et_rf_ids}", "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = [64, 128] if args.small else [int(t) for t in args.tokens.split(",")]
    for t in sizes:
        try:
            print(collect_tokens(t, args.out, device, args.small, args.warmup, args.steps), flush=True)
        except Exception as e:
            print({"run": f"moe_t{t}", "error": f"{type(e).__name__}: {e}"}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
