"""Step ground truth: a Llama-style decoder trained for a few steps under the profiler (ET + Kineto).

    python examples/collect_llama_step.py OUT_DIR [--small] [--configs d2048_l16,d4096_l8] [--steps 3]

The model: token embedding, `layers` x (RMSNorm, GQA attention with RoPE through SDPA, RMSNorm, SwiGLU
MLP), final RMSNorm, untied LM head, cross-entropy; bf16 weights; fused AdamW. Every (config, batch, seq)
writes OUT_DIR/llama_<config>_b<batch>_s<seq>/{host,device}.0.json.gz with `--steps` ProfilerStep#N
annotations after `--warmup` unprofiled steps. `--small` shrinks the model so it runs on a CPU.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lumos_sim.collect import profile_steps  # noqa: E402


@dataclass(frozen=True)
class LlamaShape:
    name: str
    d_model: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    runs: tuple[tuple[int, int], ...]  # (batch, seq) pairs to profile


CONFIGS = {
    # ~0.9B: Llama 3.2 1B-like widths, 16 layers
    "d2048_l16": LlamaShape("d2048_l16", 2048, 16, 16, 4, 5632, 32000, ((8, 2048), (4, 4096), (2, 8192))),
    # ~1.9B: Llama 3 8B widths, 8 layers
    "d4096_l8": LlamaShape("d4096_l8", 4096, 8, 32, 8, 14336, 32000, ((4, 2048), (2, 4096))),
}
SMALL = LlamaShape("small", 64, 2, 4, 2, 128, 256, ((2, 32), (1, 64)))


def rope_tables(seq: int, head_dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c: LlamaShape) -> None:
        super().__init__()
        self.c = c
        hd = c.d_model // c.heads
        self.attn_norm = nn.RMSNorm(c.d_model)
        self.wqkv = nn.Linear(c.d_model, (c.heads + 2 * c.kv_heads) * hd, bias=False)
        self.wo = nn.Linear(c.heads * hd, c.d_model, bias=False)
        self.mlp_norm = nn.RMSNorm(c.d_model)
        self.w13 = nn.Linear(c.d_model, 2 * c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.c
        b, s, _ = x.shape
        hd = c.d_model // c.heads
        q, k, v = self.wqkv(self.attn_norm(x)).split([c.heads * hd, c.kv_heads * hd, c.kv_heads * hd], dim=-1)
        q = apply_rope(q.view(b, s, c.heads, hd).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(b, s, c.kv_heads, hd).transpose(1, 2), cos, sin)
        v = v.view(b, s, c.kv_heads, hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c.heads != c.kv_heads)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, c.heads * hd))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, c: LlamaShape) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[-1]))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = rope_tables(tokens.shape[1], self.c.d_model // self.c.heads, x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


def collect_run(c: LlamaShape, batch: int, seq: int, out: Path, device: str, warmup: int, steps: int) -> dict:
    t0 = time.perf_counter()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Llama(c).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    tokens = torch.randint(0, c.vocab, (batch, seq + 1), device=device)

    def step(i: int) -> None:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, c.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    params = sum(p.numel() for p in model.parameters())
    res = profile_steps(step, out / f"llama_{c.name}_b{batch}_s{seq}", rank=0, warmup=warmup, steps=steps)
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None
    del model, opt
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return {"run": f"{c.name}_b{batch}_s{seq}", "params_m": round(params / 1e6, 1),
            "step_ms": [round(d / 1e3, 2) for d in res.link.step_durations_us],
            "linked": f"{res.link.linked}/{res.link.et_rf_ids}", "peak_gib": peak and round(peak, 1),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = [SMALL] if args.small else [CONFIGS[n] for n in args.configs.split(",")]
    for c in shapes:
        for batch, seq in c.runs:
            try:
                print(collect_run(c, batch, seq, args.out, device, args.warmup, args.steps), flush=True)
            except Exception as e:  # one failing run must not lose the others
                print({"run": f"{c.name}_b{batch}_s{seq}", "error": f"{type(e).__name__}: {e}"}, flush=True)
                if device == "cuda":
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
