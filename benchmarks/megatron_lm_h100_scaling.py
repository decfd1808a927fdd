"""Megatron-LM's own H100 weak-scaling table as parallelism what-ifs: an outside source the check suites do not
score, printed with its errors.

Source: NVIDIA/Megatron-LM README, "Performance Benchmarking", images/model_table.png (commit f2e5db402c,
2024-07-15, Megatron-Core r0.8.0): nine GPT models of 1.7B-462B parameters on 48-6,144 H100s, BF16, sequence
4,096, vocabulary 131,072, with their TP / PP / DP, global batch and measured model TFLOP/s per GPU; the README
lists the overlaps used (--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap, PP overlap).

Published TFLOP/s are converted to tokens/s per GPU with Megatron-Core r0.8.0's FLOP count
(`num_floating_point_operations`: 12 L h^2 (2 + s/h + 4 + V/(2 L h)) per token for these GELU models with
full-square attention), so the comparison does not depend on either side's FLOP convention.

Not printed by the table, assumed here: micro-batch 1, Megatron's defaults (learned positions, LayerNorm,
biases, distributed optimizer, fp32 gradient reduction), TP communication overlap where TP > 1; untied input
and output embeddings, which the printed sizes imply (12 L h^2 + 2 V h + 4096 h: 1.75B, 7.11B, 16.1B, ...;
tied, the 1.7B model would have 1.48B parameters). The virtual pipeline size is not printed either; each row runs without interleaving and with
the largest VP <= 8 that divides its stage's layers, and both are printed.

    python benchmarks/megatron_lm_h100_scaling.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from estimators.model_config import ModelConfig  # noqa: E402
from estimators.parallelism.evaluate import predict  # noqa: E402
from estimators.parallelism.plan import ParallelPlan  # noqa: E402

SEQ, VOCAB = 4096, 131072


@dataclass(frozen=True)
class ScalingRow:
    size: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    dp: int
    gpus: int
    batch: int
    tflops: float          # published model TFLOP/s per GPU
    mfu_pct: int           # published MFU, % of the BF16 dense peak
    aggregate_pflops: float

    def tokens_per_gpu(self) -> float:
        """The published TFLOP/s as tokens/s per GPU, by Megatron-Core r0.8.0's FLOP count."""
        L, h = self.layers, self.hidden
        flops_per_token = 12 * L * h * h * (2 + SEQ / h + 4 + VOCAB / (2 * L * h))
        return self.tflops * 1e12 / flops_per_token


ROWS = (
    ScalingRow("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 41, 19.6),
    ScalingRow("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 47, 44.7),
    ScalingRow("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 49, 93.9),
    ScalingRow("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 46, 176.5),
    ScalingRow("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 42, 322.3),
    ScalingRow("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 43, 645.9),
    ScalingRow("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 44, 997.2),
    ScalingRow("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 48, 1457.4),
    ScalingRow("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 47, 2825.6),
)


def row_model(r: ScalingRow) -> ModelConfig:
    return ModelConfig(name=f"megatron-gpt-{r.size.lower()}", layers=r.layers, hidden=r.hidden, heads=r.heads,
                       ffn=4 * r.hidden, vocab=VOCAB, activation="gelu", norm="layernorm", tied_embeddings=False,
                       position="learned", max_seq=SEQ, bias=True)


def largest_vp(r: ScalingRow, most: int = 8) -> int:
    if r.pp == 1:
        return 1
    per_stage = r.layers // r.pp
    return max(v for v in range(1, most + 1) if per_stage % v == 0)


def row_plan(r: ScalingRow, vp: int) -> ParallelPlan:
    return ParallelPlan(tp=r.tp, pp=r.pp, dp=r.dp, vp=vp, seq_len=SEQ, global_batch=r.batch, micro_batch=1,
                        precision="bf16", tp_comm_overlap=r.tp > 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args()
    out, errs = [], {"vp1": [], "vp": []}
    print("| model | GPUs | layout | published tok/s/GPU | predicted VP1 | error | VP | predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, r in enumerate(ROWS):
        print(f"  {n + 1}/{len(ROWS)} {r.size}", file=sys.stderr)
        model, pub = row_model(r), r.tokens_per_gpu()
        vp = largest_vp(r)
        got = {v: predict(model, row_plan(r, v), args.hardware).tokens_per_s / r.gpus for v in {1, vp}}
        e1, ev = got[1] / pub - 1, got[vp] / pub - 1
        errs["vp1"].append(abs(e1))
        errs["vp"].append(abs(ev))
        print(f"| {r.size} | {r.gpus:,} | TP{r.tp} PP{r.pp} DP{r.dp} gb{r.batch} | {pub:,.0f} | {got[1]:,.0f} | "
              f"{e1:+.1%} | {vp} | {got[vp]:,.0f} | {ev:+.1%} |")
        out.append({**asdict(r), "published_tokens_per_gpu": pub, "vp": vp, "predicted_vp1": got[1],
                    "predicted_vp": got[vp], "error_vp1": e1, "error_vp": ev})
    for key, label in (("vp1", "without interleaving"), ("vp", "with the largest VP <= 8")):
        e = errs[key]
        print(f"{label}: mean |error| {sum(e) / len(e):.1%}, max {max(e):.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
