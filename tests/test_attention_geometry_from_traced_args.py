"""Attention kernels are timed by the FLOPs of their op's geometry, read by the op's PyTorch signature: the
flash / memory-efficient entry points (`aten::_flash_attention_forward`, the op a trace links PyTorch's flash
kernels to) take [batch, seq, heads, head_dim], SDPA's own ops [batch, heads, seq, head_dim]; backward ops
take grad_out first; is_causal (or custom_mask_type) comes from the traced values. Reading every op as
[b, h, s, d] swapped heads and sequence: s / h too few FLOPs (an H100 trace's 7 ms flash kernel modelled
at 1 ms). The FLOPs pinned here are the textbook counts: forward 4 b h s_q s_kv d (QK^T and PV), causal
over the s (s + 1) / 2 pairs a query sees, backward 2.5x the forward (five matmuls for two)."""
from __future__ import annotations

import gzip
import json

import pytest

from replay.hardware.attention_args import attention_geometry
from replay.hardware.compute import ComputeModel, estimate_from_shapes

B, S, H, D = 8, 4096, 32, 128
FWD = 4.0 * B * H * S * S * D                      # non-causal forward FLOPs
CAUSAL_FWD = FWD * (S + 1) / 2 / S                 # each query sees the keys up to itself
BF16 = ["c10::BFloat16"] * 3
FLASH_KERNEL = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)"


@pytest.fixture(scope="module")
def model():
    return ComputeModel("h100-sxm-roofline")


def _flops(model, op, shapes, values=(), kernel=FLASH_KERNEL):
    est = estimate_from_shapes(model, kernel, op, shapes, BF16 + [""] * (len(shapes) - 3), values)
    assert est is not None, op
    return est.flops


def test_flash_entry_point_reads_batch_seq_heads_dim(model):
    bshd, bhsd = [B, S, H, D], [B, H, S, D]
    assert _flops(model, "aten::_flash_attention_forward", [bshd] * 3 + [[]] * 2) == pytest.approx(FWD)
    assert _flops(model, "aten::_scaled_dot_product_flash_attention", [bhsd] * 3) == pytest.approx(FWD)
    assert _flops(model, "aten::_efficient_attention_forward", [bshd] * 3) == pytest.approx(FWD)


def test_is_causal_comes_from_the_traced_values(model):
    """Kineto's Concrete Inputs: is_causal is argument 8 of _flash_attention_forward, 4 of SDPA-flash; the
    memory-efficient kernel's custom_mask_type (argument 9) is 1 for causal from the top left."""
    bshd, bhsd = [B, S, H, D], [B, H, S, D]
    flash = [""] * 8 + ["True", "False", ""]
    assert _flops(model, "aten::_flash_attention_forward", [bshd] * 3, flash) == pytest.approx(CAUSAL_FWD)
    assert _flops(model, "aten::_scaled_dot_product_flash_attention", [bhsd] * 3,
                  ["", "", "", "0.", "False", "False", ""]) == pytest.approx(FWD)
    assert _flops(model, "aten::_efficient_attention_forward", [bshd] * 3,
                  [""] * 9 + ["1"]) == pytest.approx(CAUSAL_FWD)
    assert _flops(model, "aten::_cudnn_attention_forward", [bhsd] * 3,          # an ET's values are typed
                  [None] * 10 + [True]) == pytest.approx(CAUSAL_FWD)


def test_backward_ops_read_query_and_key_after_grad_out(model):
    """(grad_out, query, key, value, out, logsumexp, ...): a GQA key of 8 heads must not be read as the query."""
    q, kv = [B, S, H, D], [B, S, 8, D]
    geo = attention_geometry("aten::_flash_attention_backward", [q, q, kv, kv, q, [B, H, S]])
    assert (geo.batch, geo.heads, geo.kv_heads, geo.seq_q, geo.seq_kv, geo.head_dim, geo.backward) == \
        (B, H, 8, S, S, D, True)
    assert _flops(model, "aten::_flash_attention_backward", [q, q, kv, kv, q, [B, H, S]],
                  kernel="flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == pytest.approx(2.5 * FWD)


def test_a_variable_length_batch_is_its_total_tokens_in_sequences_of_max_q(model):
    """Varlen flash: query [total tokens, heads, d] with max_q / max_k (arguments 5 and 6): 4 sequences of
    4,096 tokens packed as 16,384 rows."""
    q = [4 * S, H, D]
    geo = attention_geometry("aten::_flash_attention_forward", [q, q, q, [5], [5]],
                             ["", "", "", "", "", str(S), str(S), "0.", "False"])
    assert (geo.batch, geo.seq_q, geo.seq_kv, geo.heads) == (4, S, S, H)
    assert attention_geometry("aten::_flash_attention_forward", [q, q, q]) is None     # without max_q: unknown


def _kineto_trace(op: str, dims: list, concrete: list, kernel_us: float) -> dict:
    """One ProfilerStep, one attention op launching one flash kernel on an H100."""
    args = {"External id": 2, "Record function id": 0, "Input Dims": dims,
            "Input type": BF16 + [""] * (len(dims) - 3), "Concrete Inputs": concrete}
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9,
                                                      "computeMinor": 0, "numSms": 132}],
            "traceEvents": [
                {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000,
                 "dur": kernel_us + 200, "args": {"External id": 1}},
                {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": 1010, "dur": 60, "args": args},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1020,
                 "dur": 10, "args": {"External id": 2, "correlation": 10}},
                {"ph": "X", "cat": "kernel", "name": FLASH_KERNEL, "pid": 0, "tid": 7, "ts": 1040, "dur": kernel_us,
                 "args": {"External id": 2, "correlation": 10, "device": 0, "stream": 7, "grid": [32, 256, 1],
                          "block": [128, 1, 1]}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
                 "ts": 1080, "dur": kernel_us, "args": {"correlation": 11}}]}


def test_a_traced_flash_kernel_is_modelled_alike_under_either_layout(tmp_path):
    """The same causal 8 x 4096 x 32 x 128 forward linked to the flash entry point (BSHD) and to SDPA's op
    (BHSD) replays to the same model time, and the reader keeps the op's is_causal for it."""
    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    bshd, bhsd = [B, S, H, D], [B, H, S, D]
    cases = {"bshd": ("aten::_flash_attention_forward", [bshd] * 3 + [[]] * 8,
                      ["", "", "", "", "", "", "", "0.", "True", "False", ""]),
             "bhsd": ("aten::_scaled_dot_product_flash_attention", [bhsd] * 3 + [[]] * 4,
                      ["", "", "", "0.", "True", "False", ""])}
    predicted = {}
    for name, (op, dims, concrete) in cases.items():
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(_kineto_trace(op, dims, concrete, 3500.0)).encode()))
        graphs = load_graphs([str(path)])
        host = [i for i in range(len(graphs[0])) if graphs[0].name[i] == op][0]
        assert graphs[0].attr(host, "input_values")[8 if name == "bshd" else 4] == "True"
        predicted[name] = run_replay(graphs, mode="model", hardware="h100-sxm-roofline").steps[0].predicted_us
    assert predicted["bshd"] == pytest.approx(predicted["bhsd"], rel=1e-9)


def test_a_packed_memory_efficient_batch_is_its_sequences_not_one_long_one(model):
    """cu_seqlens batches of the memory-efficient kernel are [1, total tokens, h, d] with max_q / max_k
    (arguments 6 and 7): 8 sequences of 1,024 tokens packed are 8 x 1,024^2 pairs, not 8,192^2."""
    q = [1, 8 * 1024, H, D]
    values = [""] * 6 + ["1024", "1024", "0.", "1"]
    geo = attention_geometry("aten::_efficient_attention_forward", [q, q, q], values)
    assert (geo.batch, geo.seq_q, geo.seq_kv, geo.causal) == (8, 1024, 1024, True)
    assert _flops(model, "aten::_efficient_attention_forward", [q, q, q], values) == \
        pytest.approx(4.0 * 8 * H * 1024 * 1025 / 2 * D)


@pytest.mark.parametrize("max_q", ["-5", "0", str(10 ** 11)])
def test_max_lengths_no_batch_could_have_read_as_unpacked(max_q):
    """A negative max_q divided by zero (a traceback), 1e11 made a 23-minute kernel: a max outside
    (0, tokens] is no packing, and a variable-length query without one is not timed."""
    q4, q3 = [1, 4096, H, D], [4096, H, D]
    values = [""] * 6 + [max_q, "4096", "0.", "1"]
    geo = attention_geometry("aten::_efficient_attention_forward", [q4, q4, q4], values)
    assert (geo.batch, geo.seq_q) == (1, 4096)
    flash = ["", "", "", "", "", max_q, "4096", "0.", "False"]
    assert attention_geometry("aten::_flash_attention_forward", [q3, q3, q3], flash) is None


def test_every_op_whose_values_the_model_reads_keeps_them_in_the_readers():
    """The readers keep traced values only for chakra_schema.op_names.keeps_values ops: every attention
    signature that reads a value (is_causal, a mask type, max_q) must be one of them."""
    from chakra_schema.op_names import keeps_values
    from replay.hardware.attention_args import ATTENTION_SIGNATURES
    reads = [op for op, sig in ATTENTION_SIGNATURES.items()
             if (sig.is_causal, sig.mask_type, sig.max_q) != (None, None, None)]
    assert reads and all(keeps_values(f"aten::{op}") for op in reads)
    assert not keeps_values("aten::mm") and not keeps_values("aten::softmax")
