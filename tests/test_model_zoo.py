"""The model zoo is data: every model loads from TOML and its parameter counts match the published
totals; a user TOML with a typo'd key fails with one line naming the key."""
from __future__ import annotations

import pytest

from chakra_schema.errors import TraceInputError
from lumos_sim.models import load_model, zoo_names, zoo_table

# published totals (billions): Llama 3 Herd of Models Table 3, GPT-3 paper, DeepSeek-V3 report,
# Llama 4 / Qwen3 model cards, Llama 2 paper
PUBLISHED = {
    "llama3-8b": (8.0, None), "llama3-70b": (70.6, None), "llama3-405b": (405.8, None),
    "gpt3-175b": (175.0, None), "deepseek-v3": (671.0, 37.0), "llama2-7b": (6.74, None),
    "llama2-70b": (68.98, None), "llama4-scout": (109.0, 17.0), "llama4-maverick": (400.0, 17.0),
    "qwen3-235b-a22b": (235.0, 22.0),
}


def test_zoo_has_the_issue_models():
    assert set(PUBLISHED) <= set(zoo_names())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_totals(name):
    m = load_model(name)
    total, active = PUBLISHED[name]
    assert m.param_count() / 1e9 == pytest.approx(total, rel=0.03)
    if active is not None:
        assert m.active_param_count() / 1e9 == pytest.approx(active, rel=0.03)
    else:
        assert m.active_param_count() == m.param_count()


def test_deepseek_v3_uses_mla_dimensions():
    m = load_model("DeepSeek V3")  # display names work too
    assert m.mla is not None and (m.mla.q_lora_rank, m.mla.kv_lora_rank) == (1536, 512)
    assert (m.mla.qk_rope_head_dim, m.mla.qk_nope_head_dim, m.mla.v_head_dim) == (64, 128, 128)
    assert m.moe_layers == 58


def test_maverick_alternates_dense_and_moe_layers():
    m = load_model("llama4-maverick")
    assert m.moe_layers == 24
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]


def test_user_toml_loads(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text('name = "tiny"\nlayers = 4\nhidden = 256\nheads = 4\nffn = 1024\nvocab = 1000\n')
    m = load_model(str(p))
    assert m.layers == 4 and m.param_count() > 4 * 12 * 256 * 256


@pytest.mark.parametrize("text,key", [
    ('name = "x"\nlayers = 4\nhiden = 256\nheads = 4\nffn = 1024\nvocab = 1000\n', "hiden"),
    ('name = "x"\nlayers = 4\nhidden = 256\nheads = 4\nffn = 1024\nvocab = 1000\n[moe]\nnum_experts = 8\ntopk = 2\nexpert_ffn = 64\n', "moe.topk"),
])
def test_typo_key_is_one_line_error_naming_it(tmp_path, text, key):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(TraceInputError) as e:
        load_model(str(p))
    msg = str(e.value)
    assert f"'{key}'" in msg and "\n" not in msg and str(p) in msg


def test_wrong_type_and_unknown_name():
    with pytest.raises(TraceInputError):
        load_model("no-such-model")


def test_zoo_table_rows():
    rows = {r["name"]: r for r in zoo_table()}
    assert rows["llama3-405b"]["layers"] == 126
