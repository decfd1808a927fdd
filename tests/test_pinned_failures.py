"""Absolute checkpoint size and write time of the failure what-if, counted by hand.

References:
- Checkpoint bytes per parameter: ZeRO (Rajbhandari et al. 2020, Sec. 3.1) mixed-precision Adam keeps
  2 B fp16/bf16 weights + 4 B fp32 master weights + 4 B momentum + 4 B variance = 16 B per parameter
  with the 2 B gradients; a checkpoint holds everything but the gradients: 2 + 4 + 4 + 4 = 14 B.
- Llama 3 405B (Dubey et al. 2024, Table 3): 126 layers, model dim 16,384, FFN dim 53,248, 128 heads,
  8 KV heads, vocabulary 128,256, untied embeddings; 405B parameters.
- Checkpoint storage bandwidth: Llama 3 paper Sec. 3.3.1, Tectonic sustains 2 TB/s (the default).
"""
from __future__ import annotations

import pytest

from estimators.failures.estimate import HealthyJob, resolve
from estimators.failures.options import FailureOptions
from estimators.model_config import load_model

CHECKPOINT_BYTES_PER_PARAM = 2 + 4 + 4 + 4      # bf16 weights, fp32 master weights, Adam m and v


def _llama3_405b_params() -> int:
    """Dubey et al. 2024 Table 3, counted: GQA attention (Q, O: h x h; K, V: h x 8*128), SwiGLU FFN
    (3 x h x f), two RMSNorm vectors per layer; input + output embeddings and the final norm."""
    h, f, layers, vocab, kv = 16_384, 53_248, 126, 128_256, 8 * 128
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    return layers * layer + 2 * vocab * h + h


def test_llama3_405b_parameter_count_is_the_published_405b():
    """Pins 405,853,388,800 parameters (counted from the paper's Table 3 shape), i.e. "405B"."""
    assert _llama3_405b_params() == 405_853_388_800
    assert load_model("llama3-405b").param_count() == 405_853_388_800


def test_checkpoint_of_llama3_405b_is_14_bytes_per_parameter_written_at_2_tb_per_s():
    """Pins the checkpoint size 405,853,388,800 x 14 B = 5,681.9 GB (ZeRO's mixed-precision Adam state
    without gradients) and its write time 5,681.9 GB / 2,000 GB/s = 2.841 s."""
    params = _llama3_405b_params()
    size_gb = params * CHECKPOINT_BYTES_PER_PARAM / 1e9
    assert size_gb == pytest.approx(5681.947, abs=1e-3)
    inputs = resolve(FailureOptions(gpus=16384, trials=0), HealthyJob(params=params))
    assert inputs.checkpoint_write_h * 3600.0 == pytest.approx(size_gb / 2000.0, rel=1e-12)
    assert "5,682 GB" in inputs.defaults["checkpoint_write_min"]


def test_recovery_defaults_document_the_same_checkpoint_bytes_per_parameter():
    """The documented default (estimators.failures.recovery.DEFAULTS, with its source) is 14 B too."""
    from estimators.failures.recovery import DEFAULTS
    assert DEFAULTS.checkpoint_bytes_per_param == CHECKPOINT_BYTES_PER_PARAM
    assert FailureOptions().checkpoint_bytes_per_param == CHECKPOINT_BYTES_PER_PARAM
