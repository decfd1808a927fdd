"""Collect traces of one Mixture-of-Experts layer (router, top-k dispatch, expert GEMMs, combine) trained
fwd+bwd in bf16 on one GPU (or, tiny, on the CPU), with its routing recorded.

    python examples/collect_moe_layer.py OUT_DIR [--small] [--device auto|cuda|cpu]
                                         [--tokens 4096,16384] [--steps 3]

Layer (full size, Mixtral-like): d_model 4096, 8 SwiGLU experts of FFN 14336, top-2 softmax router,
~1.4 B expert parameters in bf16. Dispatch is the usual "sort by expert" form: token copies are
ordered by expert id (argsort), gathered, run through each expert's three GEMMs on its contiguous
slice, weighted by the router probability and scattered back with index_add_.

Per token count, OUT_DIR/moe_t<T>/ holds {host,device}.0.json.gz (ProfilerStep#3.. recorded: wait=1,
warmup=2), routing.npz with `expert_ids` (recorded steps x tokens x k, int16), `weights` (float16) and
`tokens_per_expert` (steps x experts), and steps.json with step wall times.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_trace_util import pick_device, profile_loop, sync  # noqa: E402


@dataclass(frozen=True)
class MoEConfig:
    d_model: int = 4096
    ffn: int = 14336
    experts: int = 8
    top_k: int = 2


SMALL = MoEConfig(d_model=64, ffn=128, experts=4, top_k=2)


class MoELayer(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.d_model, cfg.experts, bias=False)
        scale = cfg.d_model ** -0.5
        self.w1 = nn.Parameter(torch.randn(cfg.experts, cfg.d_model, cfg.ffn) * scale)
        self.w3 = nn.Parameter(torch.randn(cfg.experts, cfg.d_model, cfg.ffn) * scale)
        self.w2 = nn.Parameter(torch.randn(cfg.experts, cfg.ffn, cfg.d_model) * cfg.ffn ** -0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (tokens, d_model). Returns (output, expert ids, routing weights, tokens per expert)."""
        cfg = self.cfg
        probs = F.softmax(self.router(x).float(), dim=-1)
        weights, ids = torch.topk(probs, cfg.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        flat_ids = ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)  # token copies grouped by expert
        token_of = order // cfg.top_k
        counts = torch.bincount(flat_ids, minlength=cfg.experts)
        dispatched = x.index_select(0, token_of)
        splits = counts.tolist()  # one host sync: expert slice sizes, as every eager MoE needs
        outs, start = [], 0
        for e, n in enumerate(splits):
            h = dispatched[start:start + n]
            outs.append((F.silu(h @ self.w1[e]) * (h @ self.w3[e])) @ self.w2[e])
            start += n
        expert_out = torch.cat(outs) * weights.reshape(-1)[order].unsqueeze(-1)
        combined = torch.zeros_like(x).index_add_(0, token_of, expert_out)
        return combined, ids, weights, counts


def collect_tokens(layer: MoELayer, optimizer, tokens: int, out_dir: Path, dev, dtype, steps: int) -> dict:
    cfg = layer.cfg
    gen = torch.Generator(device=dev).manual_seed(tokens)
    walls, routing = [], []

    def train_step(i: int) -> None:
        t0 = time.perf_counter()
        x = torch.randn(tokens, cfg.d_model, device=dev, dtype=dtype, generator=gen, requires_grad=True)
        out, ids, weights, counts = layer(x)
        loss = out.float().pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(dev)
        walls.append(time.perf_counter() - t0)
        if i >= 3:  # recorded steps only (wait=1, warmup=2)
            routing.append((ids.to(torch.int16).cpu().numpy(), weights.detach().float().cpu().numpy().astype(np.float16),
                            counts.cpu().numpy()))

    tok_dir = out_dir / f"moe_t{tokens}"
    summary = profile_loop(train_step, tok_dir, steps=steps, wait=1, warmup=2)
    np.savez_compressed(tok_dir / "routing.npz", expert_ids=np.stack([r[0] for r in routing]),
                        weights=np.stack([r[1] for r in routing]),
                        tokens_per_expert=np.stack([r[2] for r in routing]))
    record = {"tokens": tokens, "config": asdict(cfg), "step_wall_s": walls, "dtype": str(dtype),
              "recorded_steps": [f"ProfilerStep#{i}" for i in range(3, 3 + steps)], "device": str(dev),
              "tokens_per_expert": [r[2].tolist() for r in routing]}
    (tok_dir / "steps.json").write_text(json.dumps(record, indent=1))
    return {"tokens": tokens, "step_ms": [round(w * 1e3, 1) for w in walls],
            "tokens_per_expert_last": routing[-1][2].tolist(), **summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--small", action="store_true", help="tiny layer and token counts (implied on CPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts, e.g. 4096,16384")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    dev = pick_device(args.device)
    small = args.small or dev.type == "cpu"
    cfg = SMALL if small else MoEConfig()
    counts = [int(t) for t in (args.tokens or ("64,256" if small else "4096,16384")).split(",")]
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    layer = MoELayer(cfg).to(device=dev, dtype=dtype)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-4)
    results, failed = [], 0
    for tokens in counts:
        try:
            res = collect_tokens(layer, optimizer, tokens, args.out_dir, dev, dtype, args.steps)
        except Exception as e:  # noqa: BLE001 - keep the other token counts
            res, failed = {"tokens": tokens, "error": f"{type(e).__name__}: {e}"[:300]}, failed + 1
        print(json.dumps(res), flush=True)
        results.append(res)
    (args.out_dir / "moe_summary.json").write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
