"""Collect CPU training-step traces of small models whose operators the other fixtures do not cover, for
model mode's kernel inference (replay/et_kernels.py) on a CPU run:

- transformer: two pre-norm blocks (LayerNorm, fused qkv Linear with bias, causal scaled_dot_product_attention,
  GELU MLP), AdamW with foreach (a CPU run loops the foreach ops per tensor);
- cnn: two conv / batch-norm / ReLU / max-pool stages and a Linear head, SGD with momentum (the CPU runs
  mkldnn convolutions, whose ATen kernels call helper ops of their own);
- compiled: a Linear-GELU-LayerNorm-Linear MLP under torch.compile (Inductor's fused kernels are not ATen ops;
  its GEMMs are `mm.out` / `addmm.out` extern calls);
- manual_et: an MLP whose Execution Trace is started before the profiler and stopped after it (the older way),
  which leaves an empty closing ProfilerStep in the ET.

Each writes OUT_DIR/<model>/host.0.json.gz and device.0.json.gz (the Kineto trace). One thread, fixed seeds.

    python examples/collect_cpu_models.py OUT_DIR [--models transformer,cnn,compiled,manual_et]

tests/data/cpu_models/ was produced by this script (see the README.md there).
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # one line, not a traceback: this example needs the optional PyTorch
    print(f"{Path(__file__).name}: error: needs PyTorch ({e}); install torch, e.g. pip install -e '.[collect]'",
          file=sys.stderr)
    sys.exit(2)

from lumos_sim.collect import profile_steps


class Block(nn.Module):
    def __init__(self, d: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def transformer():
    model = nn.Sequential(Block(), Block())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x, y = torch.randn(4, 64, 128), torch.randn(4, 64, 128)
    return lambda: F.mse_loss(model(x), y), opt


def cnn():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    return lambda: F.cross_entropy(model(x), y), opt


def mlp(norm: bool):
    layers = [nn.Linear(128, 256), nn.GELU()] + ([nn.LayerNorm(256)] if norm else []) + [nn.Linear(256, 128)]
    return nn.Sequential(*layers), torch.randn(32, 128), torch.randn(32, 128)


def compiled():
    model, x, y = mlp(norm=True)
    fast = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return lambda: F.mse_loss(fast(x), y), opt


def train_step(loss_fn, opt):
    def step(_: int) -> None:
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    return step


def collect_manual_et(out: Path) -> None:
    """The ET observer started before the profiler and stopped after it: the ET spans every iteration and
    ends with the profiler's last, empty ProfilerStep."""
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule
    model, x, y = mlp(norm=False)
    step = train_step(lambda: F.mse_loss(model(x), y), torch.optim.SGD(model.parameters(), lr=0.01))
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "host.0.json"
    et = ExecutionTraceObserver().register_callback(str(raw))
    et.start()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out / "device.0.json.gz"))) as prof:
        for i in range(6):
            step(i)
            prof.step()
    et.stop()
    et.unregister_callback()
    with open(raw, "rb") as src, gzip.open(out / "host.0.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


MODELS = {"transformer": transformer, "cnn": cnn, "compiled": compiled}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--models", default="transformer,cnn,compiled,manual_et")
    args = ap.parse_args(argv)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS and n != "manual_et"]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r} (choose from {', '.join([*MODELS, 'manual_et'])})")
    torch.set_num_threads(1)
    for name in names:
        torch.manual_seed(0)
        if name == "manual_et":
            collect_manual_et(args.out_dir / name)
            print(f"{name}: written to {args.out_dir / name}", file=sys.stderr)
            continue
        loss_fn, opt = MODELS[name]()
        res = profile_steps(train_step(loss_fn, opt), args.out_dir / name, rank=0, warmup=2, steps=3)
        print(f"{name}: {res.link.profiler_steps} {[round(d) for d in res.link.step_durations_us]} us",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
