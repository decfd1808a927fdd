"""Collect traces of a Llama-style decoder training step in bf16 on one GPU (or, tiny, on the CPU).

    python examples/collect_llama_step.py OUT_DIR [--small] [--device auto|cuda|cpu]
                                          [--shapes 4x2048,2x4096,8x1024] [--steps 3]

Model (full size): vocab 32000, d_model 4096, 8 layers, 32 query heads / 8 kv heads (GQA) of 128,
SwiGLU FFN 11008, RMSNorm, RoPE, untied LM head -- about 1.7 B parameters, held in bf16 with AdamW
(foreach) states in bf16: ~14 GB plus activations, comfortably inside 80 GB. Attention is
`F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)` (flash on Hopper).

For each (batch x seq) shape one trace pair is written to OUT_DIR/llama_b<B>_s<S>/{host,device}.0.json.gz
with a profiler schedule of wait=1, warmup=2, active=--steps, so ProfilerStep#3.. are recorded. Step wall
times (CUDA-synchronised) of every iteration go to OUT_DIR/llama_b<B>_s<S>/steps.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_trace_util import pick_device, profile_loop, sync  # noqa: E402


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 32000
    d_model: int = 4096
    layers: int = 8
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 11008
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


SMALL = LlamaConfig(vocab=512, d_model=128, layers=2, heads=4, kv_heads=2, ffn=344)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: LlamaConfig, seq: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device).float() / cfg.head_dim)
    freqs = torch.outer(torch.arange(seq, device=device).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        hd = self.cfg.head_dim
        q = self.wq(x).view(b, s, self.cfg.heads, hd).transpose(1, 2)
        k = self.wk(x).view(b, s, self.cfg.kv_heads, hd).transpose(1, 2)
        v = self.wv(x).view(b, s, self.cfg.kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(cfg.d_model, cfg.eps), RMSNorm(cfg.d_model, cfg.eps)
        self.attn, self.ffn = Attention(cfg), SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d_model, cfg.eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        cos, sin = rope_tables(self.cfg, tokens.shape[1], tokens.device, x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]


def collect_shape(model, optimizer, cfg: LlamaConfig, batch: int, seq: int, out_dir: Path, dev,
                  steps: int) -> dict:
    gen = torch.Generator(device=dev).manual_seed(batch * 100003 + seq)
    walls = []

    def train_step(i: int) -> None:
        t0 = time.perf_counter()
        tokens = torch.randint(0, cfg.vocab, (batch, seq + 1), device=dev, generator=gen)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab).float(), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(dev)
        walls.append(time.perf_counter() - t0)

    shape_dir = out_dir / f"llama_b{batch}_s{seq}"
    summary = profile_loop(train_step, shape_dir, steps=steps, wait=1, warmup=2)
    tokens = batch * seq
    n_params = sum(p.numel() for p in model.parameters())
    record = {"batch": batch, "seq": seq, "tokens": tokens, "params": n_params, "config": asdict(cfg),
              "step_wall_s": walls, "recorded_steps": [f"ProfilerStep#{i}" for i in range(3, 3 + steps)],
              "dtype": str(next(model.parameters()).dtype), "device": str(dev)}
    (shape_dir / "steps.json").write_text(json.dumps(record, indent=1))
    return {"shape": f"{batch}x{seq}", "params": n_params, "step_ms": [round(w * 1e3, 1) for w in walls],
            **summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--small", action="store_true", help="tiny model and shapes (implied on CPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--shapes", default=None, help="BxS list, e.g. 4x2048,2x4096,8x1024")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    dev = pick_device(args.device)
    small = args.small or dev.type == "cpu"
    cfg = SMALL if small else LlamaConfig()
    shapes = parse_shapes(args.shapes or ("2x64,1x128" if small else "4x2048,2x4096,8x1024"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Llama(cfg).to(device=dev, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    results, failed = [], 0
    for batch, seq in shapes:
        try:
            res = collect_shape(model, optimizer, cfg, batch, seq, args.out_dir, dev, args.steps)
        except Exception as e:  # noqa: BLE001 - keep the other shapes (e.g. one that runs out of memory)
            res, failed = {"shape": f"{batch}x{seq}", "error": f"{type(e).__name__}: {e}"[:300]}, failed + 1
        print(json.dumps(res), flush=True)
        results.append(res)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    (args.out_dir / "llama_summary.json").write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
