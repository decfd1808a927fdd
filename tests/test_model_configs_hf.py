"""`--model path/to/config.json`: Hugging Face configs of every supported architecture family load, their
parameter counts match the published totals, and a malformed config.json is a one-line error (exit 2)."""
from __future__ import annotations

import json
import shutil

import pytest

from chakra_schema.errors import TraceInputError
from conftest import DATA
from estimators.hf_config import FAMILIES
from estimators.model_config import load_hf_config, model_from_hf
from estimators.model_config import load_model
from lumos_sim.cli import main

HF = DATA / "hf_configs"

# file -> (published total B, published active B or None, active counts the input embedding?, source)
PUBLISHED = {
    "llama3-8b.json": (8.03, None, True, "Llama 3 Herd of Models, Table 3"),
    "qwen2.5-7b.json": (7.61, None, True, "Qwen2.5-7B model card: 7.61B (6.53B non-embedding)"),
    "qwen3-8b.json": (8.2, None, True, "Qwen3-8B model card: 8.2B (6.95B non-embedding)"),
    "qwen3-30b-a3b.json": (30.5, 3.3, True, "Qwen3-30B-A3B model card"),
    "qwen1.5-moe-a2.7b.json": (14.3, 2.7, True, "Qwen1.5-MoE-A2.7B model card"),
    "mixtral-8x7b.json": (46.7, 12.9, True, "Jiang et al. 2024, Mixtral of Experts"),
    "deepseek-v3.json": (671.0, 37.0, True, "DeepSeek-V3 technical report (MTP module excluded)"),
    "kimi-k2.json": (1040.0, 32.0, False, "Kimi K2 model card / technical report: 1.04T / 32B activated"),
    "gpt-oss-120b.json": (116.83, 5.13, False, "gpt-oss model card Table 1 (active: unembedding, no embedding)"),
    "nemotron-4-340b.json": (340.0, None, True, "Nemotron-4 340B technical report"),
}


def test_every_architecture_family_has_a_bundled_sample():
    families = {json.loads(p.read_text())["model_type"] for p in HF.glob("*.json")}
    assert {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "kimi_k2", "gpt_oss",
            "nemotron"} <= families <= set(FAMILIES)


@pytest.mark.parametrize("fname", sorted(p.name for p in HF.glob("*.json")))
def test_bundled_config_loads_through_the_model_loader(fname):
    m = load_model(str(HF / fname))
    assert m.layers > 0 and m.param_count() > 1e9 and "config.json" in m.source


@pytest.mark.parametrize("fname", sorted(PUBLISHED))
def test_parameter_counts_within_2_percent_of_published(fname):
    total, active, with_embedding, _ = PUBLISHED[fname]
    m = load_hf_config(HF / fname)
    assert m.param_count() / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:
        assert m.active_param_count(input_embedding=with_embedding) / 1e9 == pytest.approx(active, rel=0.02)


def test_deepseek_v3_reads_mla_groups_router_and_mtp():
    m = load_hf_config(HF / "deepseek-v3.json")
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_rope_head_dim) == (1536, 512, 64)
    assert (m.moe.first_dense_layers, m.moe.num_experts, m.moe.shared_experts, m.moe.top_k) == (3, 256, 1, 8)
    assert (m.moe.groups, m.moe.groups_per_token, m.moe.router, m.mtp_layers) == (8, 4, "sigmoid", 1)
    assert m.moe_layers == 58 and m.ffn == 18432
    zoo = load_model("deepseek-v3")
    assert m.param_count() == zoo.param_count() and m.model_flops_per_token(4096) == zoo.model_flops_per_token(4096)


def test_kimi_k2_is_read_as_the_deepseek_v3_architecture():
    m = load_hf_config(HF / "kimi-k2.json")
    assert (m.heads, m.moe.num_experts, m.moe.first_dense_layers, m.moe.groups, m.mtp_layers) == (64, 384, 1, 1, 0)
    assert m.param_count() == load_model("kimi-k2").param_count()


def test_gpt_oss_reads_windows_sinks_and_biases():
    m = load_hf_config(HF / "gpt-oss-120b.json")
    assert (m.sliding_window, m.window_pattern, m.attention_sinks, m.bias) == (128, "SF", True, True)
    assert (m.head_dim, m.kv_heads, m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn) == (64, 8, 128, 4, 2880)
    assert m.param_count() == load_model("gpt-oss-120b").param_count()


def test_yarn_rope_scaling_gives_megatrons_attention_temperature():
    """YaRN scales RoPE's cos / sin by 0.1 ln(factor) + 1 when mscale / mscale_all_dim are not both given
    (GPT-OSS: factor 32, neither), else by their ratio (DeepSeek-V3: 1.0 / 1.0 -> 1), as Megatron-Core's
    _yarn_get_concentration_factor computes it from what Megatron-Bridge maps; attention_factor is not
    mapped; transformers v5 spells the block rope_parameters; other scalings give 1."""
    import math
    assert load_hf_config(HF / "gpt-oss-120b.json").rope_mscale == pytest.approx(0.1 * math.log(32) + 1)
    assert load_hf_config(HF / "gpt-oss-120b.json").rope_mscale == pytest.approx(load_model("gpt-oss-120b").rope_mscale)
    assert load_hf_config(HF / "deepseek-v3.json").rope_mscale == 1.0
    ds = _ds(rope_scaling={"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 1.0})
    assert model_from_hf(ds).rope_mscale == pytest.approx((0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))
    only_mscale = {"rope_type": "yarn", "factor": 4.0, "mscale": 0.5, "attention_factor": 1.2}
    assert model_from_hf(_llama(rope_scaling=only_mscale)).rope_mscale == pytest.approx(0.1 * math.log(4) + 1)
    v5 = {"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0}
    assert model_from_hf(_llama(rope_parameters=v5)).rope_mscale == pytest.approx(0.1 * math.log(8) + 1)
    assert model_from_hf(_llama(rope_scaling={"rope_type": "yarn", "factor": 1.0})).rope_mscale == 1.0
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert model_from_hf(_llama(rope_scaling=llama31)).rope_mscale == 1.0


@pytest.mark.parametrize("scaling,expect", [
    ("yarn", "field 'rope_scaling' must be an object"),
    ({"rope_type": "yarn", "factor": -2}, "field 'rope_scaling.factor' must be in [0, 1e+06]"),
    ({"rope_type": "yarn", "factor": 4, "mscale": "1", "mscale_all_dim": 1}, "field 'rope_scaling.mscale' must be a number"),
])
def test_a_malformed_rope_scaling_is_a_one_line_error(tmp_path, capsys, scaling, expect):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(_llama(rope_scaling=scaling)))
    code = main(["whatif", "parallelism", "--model", str(p), "--gpus", "8", "--seq-len", "1024", "--global-batch", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expect in err and str(p) in err and "\n" not in err


def test_nemotron_relu2_is_a_two_matrix_ffn():
    m = load_hf_config(HF / "minitron-8b.json")
    h, f, q, kv, L, V = 4096, 16384, 48 * 128, 8 * 128, 32, 256000
    assert m.activation == "squared_relu" and m.norm == "layernorm"
    per_layer = 2 * h * q + 2 * h * kv + 2 * h * f + 4 * h
    assert m.param_count() == L * per_layer + 2 * V * h + 2 * h


def test_qwen2_moe_shared_expert_of_its_own_width():
    m = load_hf_config(HF / "qwen1.5-moe-a2.7b.json")
    assert (m.moe.shared_experts, m.moe.shared_ffn, m.moe.expert_ffn, m.ffn) == (1, 5632, 1408, 0)


def _llama(**extra):
    return {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
            "intermediate_size": 512, "vocab_size": 1000, **extra}


def test_window_layers_from_each_spelling():
    mistral = model_from_hf({**_llama(), "model_type": "mistral", "sliding_window": 4096})
    assert mistral.window_layers == 4 and mistral.sliding_window == 4096
    assert model_from_hf({**_llama(), "model_type": "mistral", "sliding_window": None}).window_layers == 0
    qwen = model_from_hf({**_llama(), "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 1024,
                          "max_window_layers": 3})
    assert [qwen.is_window_layer(i) for i in range(4)] == [False, False, False, True]
    listed = model_from_hf({**_llama(), "sliding_window": 64,
                            "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]})
    assert [listed.is_window_layer(i) for i in range(4)] == [False, True, True, False]


def test_qwen_moe_sparse_step_and_leading_dense_layers():
    base = {**_llama(), "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 64}
    every_other = model_from_hf({**base, "decoder_sparse_step": 2})
    # transformers: layer i is MoE when (i + 1) % decoder_sparse_step == 0
    assert [every_other.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    prefix = model_from_hf({**base, "mlp_only_layers": [0, 1]})
    assert [prefix.is_moe_layer(i) for i in range(4)] == [False, False, True, True] and prefix.ffn == 512


def test_multimodal_wrapper_reads_text_config():
    m = model_from_hf({"model_type": "llava", "text_config": _llama()})
    assert m.hidden == 256 and m.layers == 4


def test_directory_holding_config_json_loads(tmp_path):
    d = tmp_path / "Mixtral-8x7B-v0.1"
    d.mkdir()
    shutil.copy(HF / "mixtral-8x7b.json", d / "config.json")
    assert load_model(str(d)).moe.num_experts == 8


@pytest.mark.parametrize("text,expect", [
    ('{"model_type": "llama", "hidden_size": 4096,', "not valid JSON"),
    ('[1, 2]', "must be a JSON object"),
    (json.dumps({k: v for k, v in _llama().items() if k != "num_attention_heads"}), "'num_attention_heads'"),
    (json.dumps(_llama(hidden_size="4096")), "'hidden_size' must be an integer"),
    (json.dumps(_llama(tie_word_embeddings="no")), "'tie_word_embeddings'"),
    (json.dumps(_llama(model_type="rwkv")), "unknown model_type 'rwkv'"),
    (json.dumps({k: v for k, v in _llama().items() if k != "model_type"}), "'model_type'"),
    (json.dumps({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "vocab_size": 10, "intermediate_size": 8}), "'q_lora_rank'"),
    (json.dumps({**_llama(), "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8}), "'moe.top_k'"),
])
def test_malformed_config_json_is_a_one_line_error_with_exit_2(tmp_path, capsys, text, expect):
    p = tmp_path / "config.json"
    p.write_text(text)
    code = main(["whatif", "parallelism", "--model", str(p), "--gpus", "8", "--seq-len", "1024", "--global-batch", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert expect in err and str(p) in err and "\n" not in err and "Traceback" not in err


def test_missing_config_json_is_an_error():
    with pytest.raises(TraceInputError, match="not found"):
        load_hf_config(HF / "no-such.json")


def test_hf_config_reader_does_not_import_model_config():
    """estimators.hf_config reads config.json fields into a model table; it must not import model_config
    (model_config imports it to build the ModelConfig: one way, no loop)."""
    import ast
    import estimators.hf_config as hf
    tree = ast.parse(open(hf.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith("estimators") for m in imported), imported


def test_hf_config_goes_through_the_model_table_checks():
    """A config.json is checked like a zoo TOML: the same one-line error for a bad MoE table."""
    with pytest.raises(TraceInputError, match="moe.top_k"):
        model_from_hf({**_llama(), "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8},
                      "x/config.json")


def test_deeply_nested_config_json_is_a_one_line_error(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text("[" * 200000 + "]" * 200000)
    code = main(["whatif", "parallelism", "--model", str(p), "--gpus", "8", "--seq-len", "1024", "--global-batch", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "not valid JSON" in err and "\n" not in err


def _ds(**kw):
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    cfg.update(kw)
    return cfg


@pytest.mark.parametrize("cfg,expect", [
    # a required field set to null (Qwen3 / Llama 3.2 configs also carry head_dim: this used to divide None)
    ({**_llama(head_dim=64), "num_attention_heads": None}, "required field is null: 'num_attention_heads'"),
    ({**_llama(head_dim=64), "hidden_size": None}, "required field is null: 'hidden_size'"),
    (_ds(kv_lora_rank=None), "required field is null: 'kv_lora_rank'"),
    # node-limited routing and MoE layouts, named by their config.json fields
    (_ds(n_group=8, topk_group=16), "'topk_group' (16) must not exceed 'n_group' (8)"),
    (_ds(n_group=7, topk_group=4), "'n_group' (7) must divide 'n_routed_experts' (256)"),
    (_ds(first_k_dense_replace=61), "first_k_dense_replace / moe_layer_freq leave no MoE layer among the 61 layers"),
    ({**json.loads((HF / "qwen1.5-moe-a2.7b.json").read_text()), "decoder_sparse_step": 100},
     "field decoder_sparse_step (100) leaves no MoE layer among the 24 layers"),
    ({**json.loads((HF / "qwen1.5-moe-a2.7b.json").read_text()), "mlp_only_layers": list(range(24))},
     "field mlp_only_layers leaves no MoE layer among the 24 layers"),
    # an unknown architecture is named, with the known ones
    ({k: v for k, v in _llama(architectures=["FooBarForCausalLM"]).items() if k != "model_type"},
     "FooBarForCausalLM is not one of: DeepseekV2ForCausalLM"),
    # a multimodal wrapper's error says it comes from the text_config
    ({"model_type": "llava", "text_config": _llama(model_type="llama4_text")},
     "its text_config: unknown model_type 'llama4_text'"),
])
def test_config_json_mistakes_are_named_by_their_config_json_fields(tmp_path, capsys, cfg, expect):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    code = main(["whatif", "parallelism", "--model", str(p), "--gpus", "8", "--seq-len", "1024", "--global-batch", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expect in err and str(p) in err and "\n" not in err


@pytest.mark.parametrize("name", ["config.json.gz", "config.JSON", "config"])
def test_a_config_json_gzipped_or_named_otherwise_loads_the_same(tmp_path, name):
    import gzip
    raw = (HF / "mixtral-8x7b.json").read_bytes()
    p = tmp_path / name
    p.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    assert load_model(str(p)).param_count() == load_model(str(HF / "mixtral-8x7b.json")).param_count()


def test_a_gzipped_config_json_is_capped_at_the_config_limit_not_the_trace_limit(tmp_path, capsys):
    """config.json is read through the bounded gunzip of the trace readers, with the config cap (64 MiB,
    chakra_schema.errors.MAX_CONFIG_BYTES): a gzip that expands past it is one line naming the file, and
    the message does not send the user to --max-input-size, which does not govern config files."""
    import gzip
    p = tmp_path / "config.json.gz"
    p.write_bytes(gzip.compress(b'{"model_type": "llama", "pad": "' + b"x" * (65 << 20) + b'"}', compresslevel=1))
    code = main(["whatif", "parallelism", "--model", str(p), "--gpus", "8", "--seq-len", "1024", "--global-batch", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and str(p) in err and "holds more than 64 MiB: too large for a config.json" in err
    assert "--max-input-size" not in err and "\n" not in err
    plain = tmp_path / "config.json"
    plain.write_bytes(b'{"model_type": "llama", "pad": "' + b"x" * (65 << 20) + b'"}')
    with pytest.raises(TraceInputError, match="holds more than 64 MiB: too large for a config.json"):
        load_model(str(plain))
    bom = tmp_path / "bom" / "config.json"        # a UTF-8 byte-order mark, as Windows editors write
    bom.parent.mkdir()
    bom.write_bytes(b"\xef\xbb\xbf" + (HF / "mixtral-8x7b.json").read_bytes())
    assert load_model(str(bom)).param_count() == load_model(str(HF / "mixtral-8x7b.json")).param_count()
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(gzip.compress(b'{"model_type": "llama"}')[:-12])
    with pytest.raises(TraceInputError, match="truncated or corrupt gzip data"):
        load_model(str(corrupt))


def test_a_directory_without_config_json_says_so(tmp_path):
    with pytest.raises(TraceInputError, match="is a directory without a config.json"):
        load_model(str(tmp_path))


def test_a_name_with_terminal_escapes_is_printed_clean():
    m = model_from_hf(_llama(_name_or_path="org/evil\x1b[31mRED\nname"))
    assert m.name == "evil[31mREDname" and all(c.isprintable() for c in m.display_name)


def test_whatif_reports_the_model_it_read(tmp_path, capsys):
    # Mixtral 8x7B: 46.7 B parameters, 12.9 B active (Jiang et al. 2024); Megatron-Core FLOPs per token of a
    # 32-layer MoE model at 1024 tokens, from the module's formula, is the model's own method: compare counts only
    code = main(["whatif", "parallelism", "--model", str(HF / "mixtral-8x7b.json"), "--gpus", "8", "--ep", "8",
                 "--seq-len", "1024", "--global-batch", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["model_params"] / 1e9 == pytest.approx(46.7, rel=0.01)
    assert out["model_active_params"] / 1e9 == pytest.approx(12.9, rel=0.01)
    # no input embedding (32,000 x 4,096) in the GPT-OSS card's convention
    assert out["model_active_params"] - out["model_active_params_without_input_embedding"] == 32000 * 4096
    assert out["model_flops_per_token"] > 6 * out["model_active_params"] * 0.9
