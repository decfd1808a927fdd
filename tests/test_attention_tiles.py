"""Flash attention's tile model (replay.hardware.compute.FLASH_QUERY_BLOCK_OVERHEAD, CUDNN_HEAD_DIM_RATE): a query
block visits whole key/value blocks and pays fixed work of its own, so short sequences, packed documents and
sliding windows run below the long-sequence rate. The constants are re-measured here from the H100 cuDNN sweep
(tests/data/h100/kernels_sdpa) with code of this test's own."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from replay.hardware.compute import (CUDNN_ATTENTION_EFFICIENCY, CUDNN_HEAD_DIM_RATE, FLASH_QUERY_BLOCK_OVERHEAD,
                                     ComputeModel, flash_kv_blocks)

SDPA = Path(__file__).resolve().parent / "data" / "h100" / "kernels_sdpa"
BLOCK = 128


def test_kv_blocks_a_query_block_visits_counted_by_hand():
    # 256 causal tokens in 128-row blocks: the first query block sees block 0, the second blocks 0-1
    assert flash_kv_blocks(256, 256, True, 0, 128) == (3, 2)
    # not causal: every query block visits every key block
    assert flash_kv_blocks(256, 1024, False, 0, 128) == (16, 2)
    # a 128-key window over 4,096 tokens: query block 0 sees block 0, each later one its own and the one before
    assert flash_kv_blocks(4096, 4096, True, 128, 128) == (1 + 31 * 2, 32)
    # 64 causal queries at the end of 256 keys (one query block): both key blocks; the first 128 keys alone: one
    assert flash_kv_blocks(64, 256, True, 0, 128) == (2, 1)
    assert flash_kv_blocks(64, 128, True, 0, 128) == (1, 1)


def _sweep() -> list[dict]:
    """Per shape of the sweep: its geometry and the measured forward (fprop kernels) and backward (every
    other attention kernel: bprop, dot(dO, O), dQ conversion) time, from the Kineto device trace."""
    meta = json.loads((SDPA / "groups.json").read_text())
    by_step = {int(k.split("#")[1]): v for k, v in meta["profiled_steps"].items()}
    shapes = {g["name"]: g for g in meta["groups"]}
    trace = json.loads(__import__("gzip").decompress((SDPA / "device.0.json.gz").read_bytes()))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    steps = sorted(((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
                    if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda x: x[0])
    times: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "kernel":
            continue
        name = str(e["name"])
        if "sdpa" not in name and "cudnn::fusion" not in name:
            continue
        for a, b, k in steps:
            if a <= e["ts"] < b:
                times[k][0 if "fprop" in name else 1] += float(e["dur"])
                break
    out = []
    for k, (fwd, bwd) in sorted(times.items()):
        g = shapes[by_step[k]]
        s, causal = g["seq"], g["causal"]
        pairs = s * (s + 1) / 2 if causal else float(s * s)
        flops = 2.0 * g["batch"] * g["q_heads"] * pairs * 2 * g["head_dim"] * meta["reps"]
        out.append(dict(g, fwd_tflops=flops / fwd / 1e6, bwd_tflops=2.5 * flops / bwd / 1e6, pairs=pairs))
    return out


def _blocks(s: int, causal: bool) -> tuple[int, int]:
    n = math.ceil(s / BLOCK)
    return (n * (n + 1) // 2 if causal else n * n), n


def _fit_overhead(rows: list[dict], key: str) -> float:
    """The per-query-block overhead (in KV-block iterations) that makes the head-dim-128 shapes' rates,
    corrected for their tiles, most nearly one rate (least spread of the log rates)."""
    best = None
    for c in np.arange(0.0, 8.0, 0.05):
        v = []
        for r in rows:
            if r["head_dim"] != 128:
                continue
            kv, nq = _blocks(r["seq"], r["causal"])
            v.append(math.log(r[key] * (kv + c * nq) * BLOCK * BLOCK / r["pairs"]))
        spread = float(np.std(v))
        if best is None or spread < best[0]:
            best = (spread, float(c))
    return best[1]


@pytest.fixture(scope="module")
def sweep():
    if not SDPA.exists():
        pytest.skip("tests/data/h100/kernels_sdpa is missing")
    return _sweep()


def test_query_block_overhead_is_what_the_h100_sweep_measures(sweep):
    assert len(sweep) == 12 and sum(r["head_dim"] == 128 for r in sweep) == 8
    assert _fit_overhead(sweep, "fwd_tflops") == pytest.approx(FLASH_QUERY_BLOCK_OVERHEAD[0], abs=0.15)
    assert _fit_overhead(sweep, "bwd_tflops") == pytest.approx(FLASH_QUERY_BLOCK_OVERHEAD[1], abs=0.15)


def test_cudnn_attention_predicts_every_shape_of_the_sweep_within_12_percent(sweep):
    """In-sample (the constants are fitted on this sweep): 1K-16K tokens, causal and not, MHA and GQA, head
    dims 64, 128 and 256, forward and backward."""
    cm = ComputeModel("h100-sxm")
    for r in sweep:
        for backward, key in ((False, "fwd_tflops"), (True, "bwd_tflops")):
            e = cm.attention(r["batch"], r["q_heads"], r["seq"], r["seq"], r["head_dim"], r["causal"], backward,
                             kv_heads=r["kv_heads"], kernel="cudnn")
            assert e.tflops == pytest.approx(r[key], rel=0.12), (r["name"], key, e.tflops, r[key])


def test_head_dim_rates_are_the_measured_ones(sweep):
    """Width 64 and 256 against 128 at the same tile correction: the sweep's ratios, within 6%."""
    c = FLASH_QUERY_BLOCK_OVERHEAD

    def corrected(r, j):
        kv, nq = _blocks(r["seq"], r["causal"])
        return r[("fwd_tflops", "bwd_tflops")[j]] * (kv + c[j] * nq) * BLOCK * BLOCK / r["pairs"]

    for j in (0, 1):
        ref = np.exp(np.mean([math.log(corrected(r, j)) for r in sweep if r["head_dim"] == 128 and r["kv_heads"] == r["q_heads"]]))
        for d in (64, 256):
            got = np.exp(np.mean([math.log(corrected(r, j)) for r in sweep if r["head_dim"] == d])) / ref
            assert CUDNN_HEAD_DIM_RATE["H100"][d][j] == pytest.approx(got, rel=0.06), (d, j, got)
    assert CUDNN_ATTENTION_EFFICIENCY["H100"][0] > CUDNN_ATTENTION_EFFICIENCY["H100"][1]


def test_packed_documents_cost_more_per_score_than_one_long_sequence():
    """16 documents of 256 tokens hold 1/16 of a 4,096-token sequence's causal scores (plus their diagonals)
    but their query blocks see 1.5 KV blocks each instead of 16.5: forward about 3x, backward about 4.5x the
    time per score."""
    cm = ComputeModel("h100-sxm")
    for backward, low, high in ((False, 2.5, 3.5), (True, 3.8, 5.2)):
        long = cm.attention(1, 32, 4096, 4096, 128, True, backward, kernel="cudnn")
        docs = cm.attention(16, 32, 256, 256, 128, True, backward, kernel="cudnn")
        per_score = (docs.time_us / docs.flops) / (long.time_us / long.flops)
        assert low <= per_score <= high, (backward, per_score)
    # traced kernels (no kernel named) keep the plain roofline their calibrated class models were fitted on
    plain = cm.attention(16, 32, 256, 256, 128, True)
    assert plain.time_us < cm.attention(16, 32, 256, 256, 128, True, kernel="fa2").time_us


def _kv_blocks_by_mask(sq: int, skv: int, causal: bool, window: int, block: int) -> int:
    """KV blocks holding at least one visible key, summed over query blocks, from the mask itself: query
    i (of sq, the last sq positions of skv when causal) sees key j when j <= i + skv - sq and, with a window,
    j > i + skv - sq - window."""
    total = 0
    for q0 in range(0, sq, block):
        for k0 in range(0, skv, block):
            seen = False
            for i in range(q0, min(q0 + block, sq)):
                pos = i + skv - sq
                lo = max(k0, pos - window + 1) if (causal and window > 0) else k0
                hi = min(k0 + block - 1, pos) if causal else k0 + block - 1
                if lo <= hi:
                    seen = True
                    break
            total += seen
    return total


@pytest.mark.parametrize("sq,skv,causal,window", [(300, 300, True, 0), (300, 300, True, 100), (64, 513, True, 0),
                                                   (513, 200, True, 0), (256, 256, True, 1000), (200, 300, False, 0),
                                                   (384, 384, True, 129)])
def test_kv_blocks_match_the_mask(sq, skv, causal, window):
    assert flash_kv_blocks(sq, skv, causal, window, 64)[0] == _kv_blocks_by_mask(sq, skv, causal, window, 64)


def test_the_reference_shape_keeps_the_long_sequence_rate_and_decode_has_no_tiles():
    from replay.hardware.compute import ATTENTION_REFERENCE_SEQ, flash_tile_factor
    s = ATTENTION_REFERENCE_SEQ
    for backward in (False, True):
        assert flash_tile_factor(s, s, True, 0, 128, backward, s * (s + 1) / 2) == pytest.approx(1.0, rel=1e-12)
    cm = ComputeModel("h100-sxm")
    # one query against 8K keys (a decode step): outside the sweep, timed without tiles -- with them the single
    # query would be billed a whole 128-row tile, about 127x its work
    named = cm.attention(8, 32, 1, 8192, 128, kernel="cudnn").compute_us
    plain = cm.attention(8, 32, 1, 8192, 128).compute_us
    assert named < 2 * plain


def test_unmeasured_head_widths_interpolate_between_measured_ones():
    """MLA's 192-wide query/key heads (DeepSeek-V3) sit between the measured 128 and 256: halfway in log2
    width from 1.0 towards 0.87 forward and 0.72 backward."""
    from replay.hardware.compute import cudnn_head_dim_rate
    f = (math.log2(192) - 7.0)
    assert cudnn_head_dim_rate(CUDNN_HEAD_DIM_RATE["H100"], 192, False) == pytest.approx(1.0 + f * (0.87 - 1.0))
    assert cudnn_head_dim_rate(CUDNN_HEAD_DIM_RATE["H100"], 192, True) == pytest.approx(1.0 + f * (0.72 - 1.0))
    assert cudnn_head_dim_rate(CUDNN_HEAD_DIM_RATE["H100"], 32, False) == 0.67      # clamped below 64
