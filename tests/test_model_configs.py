"""Model architecture facts and the model-FLOPs conventions.

The published figures pinned here are independent of the code: parameter totals from the model cards /
papers named in each zoo file, closed-form FLOP formulas written out in the tests, and the published
"model TFLOP/s" and tokens/s per GPU of ../shared/reference/training-throughput.csv (their ratio is the
publisher's FLOPs per token)."""
from __future__ import annotations

import csv
import dataclasses

import pytest

from chakra_schema.errors import TraceInputError
from conftest import require_shared
from estimators.model_config import (FLOP_CONVENTIONS, MoEConfig, load_model, megatron_flops_per_token,
                                     megatron_padded_vocab, model_from_dict, nemo_2407_flops_per_token,
                                     release_flop_convention)

# zoo name -> (published total B, published active B, active counts the input embedding?, source)
PUBLISHED = {
    "gpt3-5b": (5.0, None, True, "NeMo GPTConfig5B, nominal 5B"),
    "gpt3-20b": (20.0, None, True, "NeMo GPTConfig20B, nominal 20B"),
    "llama2-13b": (13.0, None, True, "Llama 2 paper Table 1"),
    "nemotron4-15b": (15.7, None, True, "Nemotron-4 15B report Table 1: 12.5B + 3.2B embedding"),
    "nemotron4-340b": (340.0, None, True, "Nemotron-4 340B report"),
    "qwen3-30b-a3b": (30.5, 3.3, True, "Qwen3-30B-A3B model card"),
    "mixtral-8x7b": (46.7, 12.9, True, "Mixtral of Experts, Jiang et al. 2024"),
    "mixtral-8x22b": (141.0, 39.0, True, "Mistral AI Mixtral 8x22B announcement"),
    # the gpt-oss model card's Table 1 counts active parameters with the unembedding but not the embedding
    "gpt-oss-120b": (116.83, 5.13, False, "gpt-oss model card Table 1"),
    "gpt-oss-20b": (20.91, 3.61, False, "gpt-oss model card Table 1"),
    # "32B activated" is reached without the input embedding lookup (32.9B with it)
    "kimi-k2": (1040.0, 32.0, False, "Kimi K2 model card / technical report"),
    "deepseek-v3": (671.0, 37.0, True, "DeepSeek-V3 technical report"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_zoo_parameter_counts_within_2_percent_of_published(name):
    total, active, with_embedding, _ = PUBLISHED[name]
    m = load_model(name)
    assert m.param_count() / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:
        assert m.active_param_count(input_embedding=with_embedding) / 1e9 == pytest.approx(active, rel=0.02)


def test_deepseek_v3_routing_groups_mtp_and_sigmoid_router():
    m = load_model("deepseek-v3")
    assert (m.moe.groups, m.moe.groups_per_token, m.moe.experts_per_group) == (8, 4, 32)
    assert m.moe.router == "sigmoid" and m.mtp_layers == 1
    # the MTP module (one MoE layer + the 2h -> h projection) is not in the published 671B
    assert m.param_count() / 1e9 == pytest.approx(671.0, rel=0.01)
    assert 11e9 < m.mtp_params() < 12e9


def test_gpt_oss_alternates_128_token_windows_with_full_layers():
    m = load_model("gpt-oss-120b")
    assert [m.is_window_layer(i) for i in range(4)] == [True, False, True, False]
    assert m.window_layers == 18 and m.attention_span(0, 4096) == 128 and m.attention_span(1, 4096) == 4096
    # exact mean causal context of a windowed layer: query i (1-based) sees min(i, 128) keys
    seq = 4096
    brute = sum(min(i, 128) for i in range(1, seq + 1)) / seq
    assert m.mean_causal_context(0, seq) == pytest.approx(brute, rel=1e-12)
    # a full layer: seq / 2, Megatron's count (the diagonal's half pair per query is not counted)
    assert m.mean_causal_context(1, seq) == pytest.approx(seq / 2, rel=1e-12)


def test_squared_relu_ffn_has_two_matrices():
    m = load_model("nemotron4-340b")
    h, f, L = 18432, 73728, 96
    assert m.activation == "squared_relu" and not m.gated and m.ffn_mats == 2
    # per layer: q, o (h x 96*192) + k, v (h x 8*192) + 2-matrix FFN + two LayerNorms (weight and bias)
    per_layer = 2 * h * 96 * 192 + 2 * h * 8 * 192 + 2 * h * f + 4 * h
    assert m.param_count() == L * per_layer + 2 * 256000 * h + 2 * h


def test_shared_expert_width_can_differ_from_routed_experts():
    base = dict(name="x", layers=2, hidden=64, heads=4, ffn=0, vocab=100)
    same = model_from_dict({**base, "moe": {"num_experts": 4, "top_k": 1, "expert_ffn": 32, "shared_experts": 1}})
    wide = model_from_dict({**base, "moe": {"num_experts": 4, "top_k": 1, "expert_ffn": 32, "shared_experts": 1,
                                            "shared_expert_ffn": 128}})
    assert wide.param_count() - same.param_count() == 2 * 3 * 64 * (128 - 32)
    assert wide.moe.shared_ffn == 128 and same.moe.shared_ffn == 32


@pytest.mark.parametrize("moe,key", [
    ({"num_experts": 10, "top_k": 2, "expert_ffn": 8, "groups": 4}, "moe.groups"),
    ({"num_experts": 8, "top_k": 2, "expert_ffn": 8, "groups": 4, "groups_per_token": 5}, "moe.groups_per_token"),
    ({"num_experts": 8, "top_k": 6, "expert_ffn": 8, "groups": 4, "groups_per_token": 2}, "moe.top_k"),
    ({"num_experts": 8, "top_k": 2, "expert_ffn": 8, "router": "softplus"}, "moe.router"),
    ({"num_experts": 8, "top_k": 2, "expert_ffn": 8, "router": 1}, "moe.router"),
])
def test_bad_moe_routing_fields_are_one_line_errors(moe, key):
    with pytest.raises(TraceInputError) as e:
        model_from_dict({"name": "x", "layers": 2, "hidden": 64, "heads": 4, "ffn": 0, "vocab": 100, "moe": moe}, "m.toml")
    assert f"'{key}'" in str(e.value) and "\n" not in str(e.value) and "m.toml" in str(e.value)


@pytest.mark.parametrize("extra,key", [
    ({"activation": "relu"}, "activation"),
    ({"window_pattern": "SF"}, "window_pattern"),
    ({"sliding_window": 128, "window_pattern": "SX"}, "window_pattern"),
    ({"mtp_layers": -1}, "mtp_layers"),
    ({"aliases": "Nemotron-340B"}, "aliases"),
])
def test_bad_attention_fields_are_one_line_errors(extra, key):
    with pytest.raises(TraceInputError) as e:
        model_from_dict({"name": "x", "layers": 2, "hidden": 64, "heads": 4, "ffn": 32, "vocab": 100, **extra})
    assert f"'{key}'" in str(e.value) and "\n" not in str(e.value)


def test_existing_models_keep_their_defaults():
    m = MoEConfig(num_experts=8, top_k=2, expert_ffn=64)
    assert (m.groups, m.groups_per_token, m.router, m.shared_expert_ffn) == (1, 1, "softmax", 0)
    llama = load_model("llama3-8b")
    assert (llama.mtp_layers, llama.sliding_window, llama.attention_sinks, llama.window_layers) == (0, 0, False, 0)


# ------------------------------------------------------------------ FLOP conventions
def test_nemo_2407_convention_is_the_narayanan_full_square_formula_for_gpt3():
    """NeMo's gpt3 formula = Narayanan et al. 2021 without recomputation: (24 h^2 + 4 s h) 3 l + 6 h V."""
    m = load_model("gpt3-175b")
    h, s, l, V = 12288, 2048, 96, 51200
    assert nemo_2407_flops_per_token(m, s, vocab=V) == pytest.approx((24 * h * h + 4 * s * h) * 3 * l + 6 * h * V,
                                                                      rel=1e-12)


def test_megatron_convention_counts_the_causal_half_for_llama3_8b():
    """Megatron-Core, written out for a GQA SwiGLU model: 6 (h (q + 2 kv) + q h + 3 h f) per layer,
    6 q s / 2 x 2 for the causal scores and values, 6 h V for the output layer."""
    m = load_model("llama3-8b")
    h, q, kv, f, l, V, s = 4096, 4096, 1024, 14336, 32, 128256, 8192
    per_layer = 6 * (h * (q + 2 * kv) + q * h + 3 * h * f) + 6 * 2 * q * (s / 2)
    assert megatron_flops_per_token(m, s) == pytest.approx(l * per_layer + 6 * h * V, rel=1e-12)
    # the model FLOPs the project reports are this convention
    assert m.model_flops_per_token(s) == megatron_flops_per_token(m, s)


def test_megatron_convention_counts_mtp_as_one_more_layer_and_output_projection():
    m = load_model("deepseek-v3")
    no_mtp = dataclasses.replace(m, mtp_layers=0)
    h, V, s = 7168, 129280, 4096
    extra = megatron_flops_per_token(m, s) - megatron_flops_per_token(no_mtp, s)
    # one more MoE layer (MLA + 8 routed + 1 shared SwiGLU experts of 2048 + causal scores) + 2h->h + logits
    mla = m.attn_params()
    layer = 6 * (mla + 3 * h * 2048 * 9) + 6 * (s / 2) * 128 * (192 + 128)
    assert extra == pytest.approx(layer + 6 * 2 * h * h + 6 * h * V, rel=1e-12)


# NeMo 24.07's flops_formulas use LLM_VOCAB_SIZE_MAP["gpt3"] = 51200 for GPT-3 (the padded GPT-2 vocabulary)
_NEMO_VOCAB = {"gpt3": 51200}


def _csv_name(row) -> str:
    """The model name of a published row ("Qwen3_30B_a3B (tokendrop)" -> "Qwen3_30B_a3B")."""
    return row["model"].split(" (")[0].replace(" SFT", "").replace(" LoRA", "")


def test_every_published_model_loads_by_its_table_name():
    path = require_shared("reference", "training-throughput.csv")
    with open(path, newline="") as fh:
        names = {_csv_name(r) for r in csv.DictReader(fh)}
    assert len(names) >= 15
    for name in sorted(names):
        assert load_model(name).param_count() > 1e9, name


def _published_rows():
    path = require_shared("reference", "training-throughput.csv")
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["published_tokens_per_gpu"] and r["published_tflops"]]
    assert len(rows) >= 20
    return rows


def _convention_flops(row, convention: str, **kw) -> float:
    m = load_model(_csv_name(row))
    seq = int(row["seq"])
    if convention == "megatron":
        return megatron_flops_per_token(m, seq, megatron_padded_vocab(m.vocab, 128, int(row["tp"])), **kw)
    vocab = _NEMO_VOCAB["gpt3"] if m.name.startswith("gpt3") else None
    return nemo_2407_flops_per_token(m, seq, vocab, **kw)


def test_each_release_convention_reproduces_its_published_flops_per_token():
    """Published model TFLOP/s / tokens/s per GPU = the publisher's FLOPs per token: the release's convention
    reproduces it within 0.5% on every pre-training row, the other convention is 1.4-22% off."""
    checked = 0
    for row in _published_rows():
        if "SFT" in row["model"] or "LoRA" in row["model"] or row["model"] == "GPT OSS 120B":
            continue
        published = float(row["published_tflops"]) * 1e12 / float(row["published_tokens_per_gpu"])
        own = release_flop_convention(row["release"])
        other = next(c for c in FLOP_CONVENTIONS if c != own)
        assert _convention_flops(row, own) == pytest.approx(published, rel=0.005), row["model"]
        assert abs(_convention_flops(row, other) / published - 1) > 0.013, row["model"]
        checked += 1
    assert checked >= 15


def test_nemo_2407_sft_and_lora_rows_count_short_packed_attention_and_frozen_weights():
    """The 24.07 SFT / LoRA rows (packed SQuAD, 4096-token packs) come out within 1.5% when the attention
    term sees the short packed sub-sequences (~0 here) and LoRA's frozen weights get no weight gradient."""
    rows = [r for r in _published_rows() if "SFT" in r["model"] or "LoRA" in r["model"]]
    assert len(rows) == 6
    for row in rows:
        published = float(row["published_tflops"]) * 1e12 / float(row["published_tokens_per_gpu"])
        got = _convention_flops(row, "nemo-24.07", attention_seq=1e-9, frozen="LoRA" in row["model"])
        assert got == pytest.approx(published, rel=0.015), row["model"]


# NeMo Framework performance summaries (docs.nvidia.com/nemo-framework/user-guide/latest/performance/
# performance-summary.html for 25.07, archive/25.04-performance-summary.html, and the 25.02 summary), rows that
# print both tokens/s and model TFLOP/s per GPU: (release, zoo model, sequence, tokens/s/GPU, TFLOP/s/GPU)
NEMO2_TABLE_PAIRS = [
    ("NeMo 25.02", "llama3-8b", 8192, 26006, 1506),        # DGX-B200
    ("NeMo 25.02", "llama3-70b", 8192, 3062, 1474),
    ("NeMo 25.02", "nemotron4-15b", 4096, 14760, 1387),
    ("NeMo 25.02", "nemotron4-340b", 4096, 602, 1268),
    ("NeMo 25.02", "mixtral-8x7b", 4096, 15457, 1282),
    ("NeMo 25.04", "llama3-8b", 8192, 33099, 1917),        # DGX-GB200
    ("NeMo 25.04", "llama3-70b", 8192, 4035, 1943),
    ("NeMo 25.04", "nemotron4-15b", 4096, 17809, 1674),
    ("NeMo 25.04", "nemotron4-340b", 4096, 737, 1551),
    ("NeMo 25.04", "mixtral-8x7b", 4096, 19275, 1598),
    ("NeMo 25.04", "gpt3-175b", 2048, 1804, 1942),
    ("NeMo 25.07", "llama3-8b", 8192, 31737, 1838),        # DGX-GB200
    ("NeMo 25.07", "llama3-70b", 8192, 4066, 1957),
]


@pytest.mark.parametrize("release,name,seq,tokens,tflops", NEMO2_TABLE_PAIRS)
def test_nemo_tables_before_megatron_bridge_count_flops_with_nemos_formulas(release, name, seq, tokens, tflops):
    """NeMo 2.x's own tables (25.02 - 25.07) publish TFLOP/s / tokens/s = the full-square attention count of
    NeMo's flops_formulas (the 24.07 convention) within 0.2%; Megatron-Core's count is 1.4-11% lower."""
    assert release_flop_convention(release) == "nemo-24.07"
    m = load_model(name)
    published = tflops * 1e12 / tokens
    vocab = _NEMO_VOCAB["gpt3"] if name.startswith("gpt3") else None
    assert nemo_2407_flops_per_token(m, seq, vocab) == pytest.approx(published, rel=0.002)
    assert megatron_flops_per_token(m, seq) < 0.987 * published


def test_unknown_release_has_no_convention():
    for release in ("SomeFramework 1.0", "NeMo 2.0", "NeMo"):     # a framework version is not a container release
        with pytest.raises(TraceInputError):
            release_flop_convention(release)


def test_every_megatron_bridge_release_counts_flops_as_megatron_core():
    """Megatron-Bridge's tables name their releases 'NeMo 25.09' onwards, patch and fine-tuning tables
    included ('NeMo 26.04.01', 'NeMo 26.06 SFT'); NeMo 24.x ran NeMo 1.x and counts otherwise."""
    from estimators.model_config import megatron_bridge_release
    for r in ("NeMo 25.09", "NeMo 25.11", "NeMo 26.02.01", "NeMo 26.06 SFT", "Megatron-Bridge 25.11"):
        assert megatron_bridge_release(r) and release_flop_convention(r) == "megatron", r
    for r in ("NeMo 24.07 (rev 9c5c5e9709) SFT", "NeMo 24.03.01 (long-seq)", "NeMo 25.07", "SomeFramework 26.02"):
        assert not megatron_bridge_release(r), r
    assert release_flop_convention("NeMo 24.03.01 (long-seq)") == "nemo-24.07"
