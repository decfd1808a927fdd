"""Collect host (Execution Trace) and device (Kineto) traces of a multi-rank CPU DDP training run.

N processes (2 by default), gloo backend, each training the same small decoder-only transformer wrapped in
DistributedDataParallel with AdamW on random tokens. `lumos_sim.collect.profile_steps` profiles a few
steps on every rank and writes host.<rank>.json.gz + device.<rank>.json.gz into OUT_DIR. Needs only the
CPU build of PyTorch (the optional 'collect' extra).

    python examples/collect_cpu_ddp.py OUT_DIR [--steps 3] [--warmup 2] [--world-size 2]
        [--layers 2] [--batch 4] [--late-rank R --late-ms MS] [--heavy-rank R --heavy-factor F]

Skewed and imbalanced jobs (ground truth for multi-rank replay):
- `--late-rank R --late-ms MS`: rank R sleeps MS ms after each step, so it enters every step late and
  the other ranks' first collective of the step (DDP's buffer broadcast) absorbs the wait;
- `--heavy-rank R --heavy-factor F`: rank R trains on F x the batch, so it computes F x more and the
  other ranks wait for it in the gradient all-reduces.

tests/data/cpu_ddp/ and tests/data/ddp4_*/ were produced by this script (see the README.md there).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
except ImportError as e:  # one line, not a traceback: this example needs the optional PyTorch
    print(f"{Path(__file__).name}: error: needs PyTorch ({e}); install torch, e.g. pip install -e '.[collect]'",
          file=sys.stderr)
    sys.exit(2)

from lumos_sim.collect import profile_steps

# Sized so one step takes tens of milliseconds on one CPU core (timing noise stays small next to it)
# while the gzipped traces stay at a few hundred kB per rank.
VOCAB, D_MODEL, HEADS, D_FF, LAYERS = 1024, 128, 4, 512, 2
BATCH, SEQ = 4, 128
BUCKET_CAP_MB = 1.0  # small DDP buckets: several all_reduce calls per step instead of one


@dataclass(frozen=True)
class JobShape:
    """What each rank runs: the model depth, the per-rank batch, and the injected skew/imbalance."""
    layers: int = LAYERS
    batch: int = BATCH
    late_rank: int = -1        # this rank sleeps `late_ms` after every step
    late_ms: float = 0.0
    heavy_rank: int = -1       # this rank's batch is `heavy_factor` x larger
    heavy_factor: int = 1
    foreach: bool = False      # AdamW's multi-tensor implementation: far fewer ops (smaller traces)
    model: str = "decoder"     # or "mlp": a few ops per step, so a many-rank set stays small on disk

    def batch_of(self, rank: int) -> int:
        return self.batch * (self.heavy_factor if rank == self.heavy_rank else 1)


class TinyDecoder(nn.Module):
    """Token embedding + pre-norm causal self-attention blocks + tied-free LM head."""

    def __init__(self, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x, src_mask=self.causal, is_causal=True)
        return self.head(self.norm(x))


class TinyMLP(nn.Module):
    """Token embedding + `layers` GELU MLP blocks + LM head: the same data and loss as TinyDecoder with
    a tenth of its ops per step (its traces are small; batch sets the compute)."""

    def __init__(self, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(D_MODEL, D_FF), nn.GELU(), nn.Linear(D_FF, D_MODEL))
                                      for _ in range(layers)))
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


MODELS = {"decoder": TinyDecoder, "mlp": TinyMLP}


def run_rank(rank: int, world_size: int, out_dir: str, warmup: int, steps: int, shape: JobShape) -> None:
    torch.set_num_threads(1)  # ranks share a small machine: one compute thread each
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # identical initial weights (DDP would broadcast rank 0's anyway)
        model = DistributedDataParallel(MODELS[shape.model](shape.layers), bucket_cap_mb=BUCKET_CAP_MB)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=shape.foreach)
        loss_fn = nn.CrossEntropyLoss()
        data = torch.Generator().manual_seed(1000 + rank)  # each rank sees its own shard of random tokens
        batch = shape.batch_of(rank)

        def train_step(step: int) -> None:
            tokens = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=data)
            logits = model(tokens[:, :-1])
            loss = loss_fn(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all_reduces gradient buckets here, overlapped with backward
            optimizer.step()
            if rank == shape.late_rank:
                time.sleep(shape.late_ms / 1000)  # enter the next step late

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
    parser.add_argument("--layers", type=int, default=LAYERS, help=f"transformer blocks (default {LAYERS})")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"sequences per rank and step (default {BATCH})")
    parser.add_argument("--model", choices=sorted(MODELS), default="decoder", help="decoder (default) or mlp")
    parser.add_argument("--foreach", action="store_true", help="multi-tensor AdamW (fewer ops, smaller traces)")
    parser.add_argument("--late-rank", type=int, default=-1, help="this rank enters every step late")
    parser.add_argument("--late-ms", type=float, default=0.0, help="how late (ms)")
    parser.add_argument("--heavy-rank", type=int, default=-1, help="this rank computes --heavy-factor x more")
    parser.add_argument("--heavy-factor", type=int, default=2)
    args = parser.parse_args(argv)
    shape = JobShape(layers=args.layers, batch=args.batch, late_rank=args.late_rank, late_ms=args.late_ms,
                     heavy_rank=args.heavy_rank, heavy_factor=args.heavy_factor, foreach=args.foreach,
                     model=args.model)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(run_rank, args=(args.world_size, str(args.out_dir), args.warmup, args.steps, shape),
             nprocs=args.world_size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
