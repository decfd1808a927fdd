"""Serving memory of an expert-parallel deployment: expert slots, the other weights and the KV cache per GPU,
against figures counted from DeepSeek-V3's published architecture (arXiv:2412.19437: 61 layers, the first 3
dense, 256 routed experts of width 2048 on hidden 7168, MLA caching kv_lora_rank 512 + rope 64 per token and
layer, one MTP module; 671B main-model + 14B MTP parameters) and its decode deployment (EP144 with 32
redundant experts, two verified tokens per request with MTP, FP8 weights with one FP32 scale per 128x128
block)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from estimators.model_config import load_model
from estimators.moe.serving import ServingSpec, serving_memory

FP8_BYTES = 1 + 4 / (128 * 128)
EXPERT_PARAMS = 3 * 7168 * 2048            # gate, up, down of one routed expert


def test_deepseek_v3_decode_ep144_memory_per_gpu_is_counted_from_the_architecture():
    m = load_model("deepseek-v3")
    spec = ServingSpec("decode", tokens=256, context=4096, attention_tp=1, mtp_acceptance=0.85, dtype="fp8")
    mem = serving_memory(m, spec, slots_per_gpu=(256 + 32) // 144)
    # 2 slots x (58 MoE layers + the MoE MTP module)
    assert mem.expert_weights == pytest.approx(2 * 59 * EXPERT_PARAMS * FP8_BYTES, rel=1e-9)
    # 256 verified tokens / 2 per request = 128 requests, each a 4096-token latent cache in all 61 layers
    assert mem.kv_cache == pytest.approx(128 * 4096 * 61 * (512 + 64) * 2, rel=1e-9)
    # everything but the routed experts: 671B + 14B published, minus 59 x 256 routed experts
    other_published = (671e9 + 14e9 - 59 * 256 * EXPERT_PARAMS) * FP8_BYTES
    assert mem.other_weights == pytest.approx(other_published, rel=0.15)
    assert mem.total / 2 ** 30 == pytest.approx((2 * 59 * EXPERT_PARAMS * FP8_BYTES + other_published
                                                + 128 * 4096 * 61 * 576 * 2) / 2 ** 30, rel=0.05)


def test_attention_tensor_parallelism_splits_gqa_kv_heads_and_attention_weights():
    m = load_model("qwen3-235b-a22b")          # GQA: 4 KV heads of 128
    one = serving_memory(m, ServingSpec("decode", tokens=64, context=8192, attention_tp=1), slots_per_gpu=32)
    four = serving_memory(m, ServingSpec("decode", tokens=64, context=8192, attention_tp=4), slots_per_gpu=32)
    per_token = m.layers * 2 * 4 * 128 * 2     # K and V, 4 heads of 128, bf16
    assert one.kv_cache == pytest.approx(64 * 8192 * per_token)
    assert four.kv_cache == pytest.approx(64 * 8192 * per_token / 4)
    attention = m.layers * m.attn_params() * 2
    assert one.other_weights - four.other_weights == pytest.approx(attention * 3 / 4)


def test_a_deployment_beyond_gpu_memory_is_flagged_out_of_memory():
    deployment = ROOT / "examples" / "deployments" / "deepseek-v3-decode-ep144.toml"
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "moe", "--deployment", str(deployment),
                        "--set", "moe.context=32768", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import json
    d = json.loads(p.stdout)
    # 128 requests x 32768 tokens x 70,272 bytes = 295 GB of latent cache alone
    assert d["oom"] is True and d["memory_gib_per_gpu"] > 128 * 32768 * 61 * 576 * 2 / 2 ** 30
    assert any("OUT OF MEMORY" in n for n in d["notes"])


def test_an_fp8_kv_cache_holds_one_byte_per_element_and_halves_a_memory_bound_decode_attention():
    """`--kv-dtype fp8` (FP8 KV caches in FlashMLA / FlashInfer / TensorRT-LLM): DeepSeek-V3 at 64 sequences of
    32K tokens per GPU holds 64 x 32768 x 61 layers x 576 latent elements at one byte; Qwen3-235B's GQA decode
    (4 KV heads of 128, attention DP: every GPU reads its own sequences' cache) is bound by reading the cache,
    so its attention time halves."""
    import json

    def run(model, kv, ep):
        p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "moe", "--model", model, "--hardware",
                            "h200", "--phase", "decode", "--ep", str(ep), "--tokens", "32", "--context", "32768",
                            "--precision", "fp8", "--kv-dtype", kv, "--json"], capture_output=True, text=True,
                           cwd=ROOT, timeout=600)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    bf16, fp8 = run("deepseek-v3", "bf16", 16), run("deepseek-v3", "fp8", 16)
    assert fp8["serving_memory_gib"]["kv_cache"] == pytest.approx(32 * 32768 * 61 * 576 * 1 / 2 ** 30, rel=1e-9)
    assert bf16["serving_memory_gib"]["kv_cache"] == pytest.approx(2 * fp8["serving_memory_gib"]["kv_cache"])
    qb, qf = run("qwen3-235b-a22b", "bf16", 8), run("qwen3-235b-a22b", "fp8", 8)
    assert qf["serving_parts_us"]["attention"] == pytest.approx(qb["serving_parts_us"]["attention"] / 2, rel=0.1)
    assert "FP8 KV cache" in qf["notes"][-1]
