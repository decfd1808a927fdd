"""Collect host (Execution Trace) and device (Kineto) traces of a 2-rank CPU DDP training run.

Two processes, gloo backend, each training the same small decoder-only transformer wrapped in
DistributedDataParallel with AdamW on random tokens. `lumos_sim.collect.profile_steps` profiles a few
steps on every rank and writes host.<rank>.json.gz + device.<rank>.json.gz into OUT_DIR. Needs only the
CPU build of PyTorch (the optional 'collect' extra).

    python examples/collect_cpu_ddp.py OUT_DIR [--steps 3] [--warmup 2] [--world-size 2]

tests/data/cpu_ddp/ was produced by this script (see the README.md there).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lumos_sim.collect import profile_steps

# Sized so one step takes tens of milliseconds on one CPU core (timing noise stays small next to it)
# while the gzipped traces stay at a few hundred kB per rank.
VOCAB, D_MODEL, HEADS, D_FF, LAYERS = 1024, 128, 4, 512, 2
BATCH, SEQ = 4, 128
BUCKET_CAP_MB = 1.0  # small DDP buckets: several all_reduce calls per step instead of one


class TinyDecoder(nn.Module):
    """Token embedding + pre-norm causal self-attention blocks + tied-free LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x, src_mask=self.causal, is_causal=True)
        return self.head(self.norm(x))


def run_rank(rank: int, world_size: int, out_dir: str, warmup: int, steps: int) -> None:
    torch.set_num_threads(1)  # 2 ranks share a small machine: one compute thread each
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # identical initial weights (DDP would broadcast rank 0's anyway)
        model = DistributedDataParallel(TinyDecoder(), bucket_cap_mb=BUCKET_CAP_MB)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()
        data = torch.Generator().manual_seed(1000 + rank)  # each rank sees its own shard of random tokens

        def train_step(step: int) -> None:
            tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=data)
            logits = model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all_reduces gradient buckets here, overlapped with backward
            optimizer.step()

        result = profile_steps(train_step, out_dir, warmup=warmup, steps=steps)
        link = result.link
        durations = ", ".join(f"{d / 1000:.1f}" for d in link.step_durations_us)
        print(f"rank {rank}: {len(link.profiler_steps)} steps ({durations} ms), "
              f"ET rf_ids linked {link.linked}/{link.et_rf_ids} -> {result.host_path}, {result.device_path}",
              flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled warm-up steps first (default 2)")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(run_rank, args=(args.world_size, str(args.out_dir), args.warmup, args.steps),
             nprocs=args.world_size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
