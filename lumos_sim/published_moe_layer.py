"""Megatron-LM's MoE-layer benchmark on H100 (tests/published/megatron_moe_layer_h100.csv) against
`estimators.parallelism.moe_layer.moe_layer_times`: one MoE layer alone, forward and backward, for each
token dispatcher (all-to-all, DeepEP, HybridEP) and precision (BF16, FP8 blockwise) of the benchmark.

The benchmark holds everything but the case's setting equal, so it measures the dispatchers and the FP8
recipe apart from any training run. Its two proxy layers, from its test_cases.py (facts, not fitted):
- Mixtral proxy: hidden 4096, 8 experts of FFN 14336, top-2, softmax router (one expert per GPU at EP8);
- DeepSeek proxy: hidden 7168, 32 experts of FFN 2048, top-8 from 4 of 8 groups, sigmoid router, one
  shared expert of FFN 2048 (four experts per GPU at EP8).
Both run 4,096 tokens per GPU (sequence 4096, micro-batch 1) at TP1 EP8 on one node with forced balance.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from chakra_schema.errors import TraceInputError
from estimators.model_config import ModelConfig, MoEConfig
from estimators.parallelism.moe_layer import moe_layer_times
from estimators.parallelism.plan import MOE_A2A, PRECISIONS, ParallelPlan

DEFAULT_CSV = Path(__file__).resolve().parent.parent / "tests" / "published" / "megatron_moe_layer_h100.csv"

# the benchmark runs the MoE layer alone: the vocabulary is kept small so that the one-layer step's
# embedding and output layer (and their gradient traffic, which would share the links with the layer's)
# stay negligible
PROXIES = {
    "mixtral": ModelConfig(name="mixtral-proxy", layers=1, hidden=4096, heads=8, ffn=0, vocab=256,
                           moe=MoEConfig(num_experts=8, top_k=2, expert_ffn=14336)),
    "deepseek": ModelConfig(name="deepseek-proxy", layers=1, hidden=7168, heads=8, ffn=0, vocab=256,
                            moe=MoEConfig(num_experts=32, top_k=8, expert_ffn=2048, shared_experts=1,
                                          shared_expert_ffn=2048, groups=8, groups_per_token=4, router="sigmoid")),
}


@dataclass(frozen=True)
class LayerCase:
    case: str
    proxy: str
    dispatcher: str
    precision: str
    forward_ms: float
    backward_ms: float

    def plan(self) -> ParallelPlan:
        fp8 = dict(precision="fp8", fp8_recipe="blockwise") if self.precision == "fp8" else {}
        return ParallelPlan(tp=1, dp=8, ep=8, seq_len=4096, micro_batch=1, global_batch=8,
                            moe_a2a=self.dispatcher, moe_force_balance=True, **fp8)


@dataclass(frozen=True)
class LayerResult:
    case: LayerCase
    forward_ms: float
    backward_ms: float

    @property
    def forward_error(self) -> float:
        return self.forward_ms / self.case.forward_ms - 1.0

    @property
    def backward_error(self) -> float:
        return self.backward_ms / self.case.backward_ms - 1.0


COLUMNS = ("case", "proxy", "dispatcher", "precision", "forward_ms", "backward_ms")


def _case(path: str, line: int, row: dict) -> LayerCase:
    def bad(what: str) -> TraceInputError:
        return TraceInputError(path, f"line {line}: {what}")

    if None in row or any(row.get(k) is None for k in COLUMNS):
        raise bad(f"needs exactly the columns {', '.join(COLUMNS)}")
    if row["proxy"] not in PROXIES:
        raise bad(f"unknown proxy {row['proxy']!r} (known: {', '.join(PROXIES)})")
    if row["dispatcher"] not in MOE_A2A:
        raise bad(f"unknown dispatcher {row['dispatcher']!r} (known: {', '.join(MOE_A2A)})")
    if row["precision"] not in PRECISIONS:
        raise bad(f"unknown precision {row['precision']!r} (known: {', '.join(PRECISIONS)})")
    times = []
    for key in ("forward_ms", "backward_ms"):
        try:
            t = float(row[key])
        except ValueError:
            raise bad(f"{key} {row[key]!r} is not a number") from None
        if not (math.isfinite(t) and t > 0):
            raise bad(f"{key} must be a positive time, got {row[key]!r}")
        times.append(t)
    return LayerCase(row["case"], row["proxy"], row["dispatcher"], row["precision"], *times)


def read_cases(path: str | Path = DEFAULT_CSV) -> list[LayerCase]:
    """The benchmark's cases; a malformed table is a one-line TraceInputError naming the file and line."""
    path = str(path)
    try:
        with open(path, newline="") as f:
            lines = [(n, text) for n, text in enumerate(f, 1) if text.strip() and not text.startswith("#")]
    except (OSError, UnicodeDecodeError) as e:
        raise TraceInputError(path, f"cannot read the MoE-layer benchmark table ({e.__class__.__name__})") from None
    if not lines:
        raise TraceInputError(path, "no header and no cases")
    try:
        reader = csv.DictReader(text for _, text in lines)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise TraceInputError(path, f"line {lines[0][0]}: the header must be {','.join(COLUMNS)}")
        cases = [_case(path, n, row) for (n, _), row in zip(lines[1:], reader)]
    except csv.Error as e:
        raise TraceInputError(path, f"not a CSV table ({e})") from None
    if not cases:
        raise TraceInputError(path, "no cases below the header")
    return cases


def run_cases(cases: list[LayerCase], hardware: str = "h100-sxm") -> list[LayerResult]:
    """Each case's layer at the benchmark's full clock (`moe_layer_times(burst=True)`)."""
    out = []
    for c in cases:
        t = moe_layer_times(PROXIES[c.proxy], c.plan(), hardware, burst=True)
        out.append(LayerResult(c, t.forward_us / 1e3, t.backward_us / 1e3))
    return out
