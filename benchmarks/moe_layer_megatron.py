"""One MoE layer alone against Megatron-LM's MoE-layer benchmark on H100 (tests/published/
megatron_moe_layer_h100.csv; lumos_sim.published_moe_layer): forward and backward of the Mixtral and DeepSeek
proxy layers with each token dispatcher, in BF16 and FP8 blockwise, model against measured.

    python benchmarks/moe_layer_megatron.py          # the table
    python benchmarks/moe_layer_megatron.py --json   # the rows as JSON

The forward carries the dropless token-count sync at its whole-run value (MOE_SYNC_IDLE_US, 616 us from a
training step's idle time); in this benchmark, which queues a long GEMM ahead of each iteration, the GPU
idles for less than that, so the forward's error is the larger.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chakra_schema.errors import TraceInputError  # noqa: E402
from lumos_sim.published_moe_layer import DEFAULT_CSV, read_cases, run_cases  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--csv", default=str(DEFAULT_CSV), help="the benchmark's cases (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        results = run_cases(read_cases(args.csv))
    except TraceInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{"case": r.case.case, "measured_forward_ms": r.case.forward_ms,
                           "measured_backward_ms": r.case.backward_ms, "forward_ms": r.forward_ms,
                           "backward_ms": r.backward_ms} for r in results], indent=1))
        return 0
    print("| case | forward ms measured | model | error | backward ms measured | model | error |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.case.case} | {r.case.forward_ms:.2f} | {r.forward_ms:.2f} | {100 * r.forward_error:+.1f}% "
              f"| {r.case.backward_ms:.2f} | {r.backward_ms:.2f} | {100 * r.backward_error:+.1f}% |")
    for label, pick in (("all", lambda r: True), ("BF16", lambda r: r.case.precision == "bf16"),
                        ("FP8 blockwise", lambda r: r.case.precision == "fp8")):
        sel = [r for r in results if pick(r)]
        f = sum(abs(r.forward_error) for r in sel) / len(sel)
        b = sum(abs(r.backward_error) for r in sel) / len(sel)
        print(f"{label}: mean |error| forward {100 * f:.1f}%, backward {100 * b:.1f}% ({len(sel)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
