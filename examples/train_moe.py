"""A tiny mixture-of-experts transformer trained on random tokens, on the CPU: the training script that
`lumos-sim collect` profiles (or, with --routing, whose router top-k it records).

    lumos-sim collect examples/train_moe.py --routing -o routing/   # router top-k -> routing/layer_*.parquet
    lumos-sim collect examples/train_moe.py -o traces/              # host + device traces of 3 steps

The model matches examples/moe/tiny-moe.toml (4 layers, hidden 256, 8 experts of FFN 512, top-2), so
`lumos-sim whatif moe --model examples/moe/tiny-moe.toml --routing routing/ --ep 4` reads what it
records. Each MoE block's router is a module named `gate` (what `collect --routing` hooks by default).
Needs PyTorch (CPU build is enough): pip install -e '.[collect]'. Runs in a few seconds on 2 cores.
"""
from __future__ import annotations

import sys
from pathlib import Path

try:
    import torch
    from torch import nn
except ImportError as e:  # one line, not a traceback
    print(f"{Path(__file__).name}: error: needs PyTorch ({e}); install torch, e.g. pip install -e '.[collect]'",
          file=sys.stderr)
    sys.exit(2)

VOCAB, HIDDEN, HEADS, FFN, EXPERT_FFN, EXPERTS, TOP_K, LAYERS = 1024, 256, 4, 1024, 512, 8, 2, 4
BATCH, SEQ = 4, 64


class MoE(nn.Module):
    """Top-k routed experts: `gate` scores the experts, each token goes through its top-k, weighted."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(HIDDEN, EXPERT_FFN), nn.GELU(),
                                                   nn.Linear(EXPERT_FFN, HIDDEN)) for _ in range(EXPERTS))

    def forward(self, x):
        flat = x.reshape(-1, HIDDEN)
        probs = self.gate(flat).softmax(dim=-1)
        weight, chosen = probs.topk(TOP_K, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if len(rows):
                out[rows] += weight[rows, slot, None] * expert(flat[rows])
        return out.reshape(x.shape)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.moe = MoE()

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.moe(self.norm2(x))


class TinyMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


model: TinyMoE | None = None
optimizer = None


def setup() -> None:
    global model, optimizer
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyMoE()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(step: int) -> None:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


if __name__ == "__main__":
    setup()
    for i in range(3):
        train_step(i)
    print("3 steps done; profile them with: lumos-sim collect examples/train_moe.py -o traces/")
