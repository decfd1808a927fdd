"""Deployments as published: sample deployment files run and print tokens/s per node, physical slots
(routed + redundant) over EP, serving figures built from the timed parts, and bad deployment input as
one-line errors (exit 2). Also issue 21 item 2: expert loads of 1e308 and --gpus-per-node 0."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lumos_sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = ROOT / "examples" / "deployments"
# the routing sample only is shrunk (the deployment itself is the file's): 8192-token batches sampled
SMALL = ["--set", "moe.sampled_window=4096", "--set", "moe.synthetic_tokens=8192"]


def _run(capsys, *args):
    code = main(["whatif", "moe", *args])
    out, err = capsys.readouterr()
    return code, out, err


# (file, routed slots per GPU as published, phase)
SAMPLES = [
    ("deepseek-v3-prefill-ep32.toml", 9, "prefill"),      # 256 + 32 redundant over EP32
    ("deepseek-v3-decode-ep144.toml", 2, "decode"),       # 256 + 32 redundant over EP144
    ("deepseek-v3-decode-ep320.toml", 1, "decode"),       # 256 + 64 over EP320: one slot per GPU
    ("deepseek-v3-prefill-ep32-h100-sglang.toml", 9, "prefill"),   # SGLang on H100: 256 + 32 over EP32
    ("deepseek-v3-decode-ep72-h100-sglang.toml", 4, "decode"),     # SGLang on H100: 256 + 32 over EP72
    ("deepseek-v3-decode-ep128-h800-profile.toml", 2, "decode"),  # DeepSeek's profile: 256 over EP128
    ("qwen3-235b-a22b-decode-tp4-ep4.toml", 32, "decode"),
    ("llama4-maverick-decode-ep8.toml", 16, "decode"),
]


def test_every_sample_deployment_is_tested():
    assert sorted(p.name for p in DEPLOYMENTS.glob("*.toml")) == sorted(s[0] for s in SAMPLES)


@pytest.mark.parametrize("name,slots,phase", SAMPLES)
def test_sample_deployment_prints_tokens_per_second_per_node(capsys, name, slots, phase):
    code, out, err = _run(capsys, "--deployment", str(DEPLOYMENTS / name), *SMALL)
    assert code == 0, err
    what = "input" if phase == "prefill" else "output"
    assert f"{what} tokens/s per node" in out and f"{slots} routed" in out
    code, out, _ = _run(capsys, "--deployment", str(DEPLOYMENTS / name), *SMALL, "--json")
    d = json.loads(out)
    assert d["routed_slots_per_gpu"] == slots and d["tokens_per_s_per_node"] > 0
    # per node: every sample deploys on 8-GPU nodes (Qwen3's EP4 workers: two to a node)
    assert d["tokens_per_s_per_node"] == pytest.approx(d["tokens_per_s_per_gpu"] * 8)
    # the parts add up to the forward
    assert sum(d["serving_parts_us"].values()) == pytest.approx(d["forward_latency_us"], rel=1e-9)
    if phase == "decode":
        # time per output token = forward / tokens per step per sequence (1 + acceptance with one MTP module)
        assert d["time_per_output_token_ms"] == pytest.approx(
            d["time_per_forward_ms"] / d["tokens_per_step_per_sequence"])


def test_deepseek_decode_with_mtp_verifies_two_tokens_per_request():
    from estimators.moe.serving import ServingSpec, draft_tokens
    from estimators.model_config import load_model
    m = load_model("deepseek-v3")
    spec = ServingSpec("decode", 256, 4096, mtp_acceptance=0.85)
    assert draft_tokens(m, spec) == 1


def test_flags_override_the_deployment_file(capsys):
    code, out, _ = _run(capsys, "--deployment", str(DEPLOYMENTS / "deepseek-v3-decode-ep144.toml"), *SMALL,
                        "--redundant-experts", "112", "--json")
    # 256 + 112 = 368 slots do not divide over 144: the file states 2 per GPU
    assert code == 2
    code, out, _ = _run(capsys, "--deployment", str(DEPLOYMENTS / "deepseek-v3-decode-ep144.toml"), *SMALL,
                        "--overlap", "none", "--json")
    none = json.loads(out)
    code, out, _ = _run(capsys, "--deployment", str(DEPLOYMENTS / "deepseek-v3-decode-ep144.toml"), *SMALL, "--json")
    dual = json.loads(out)
    assert none["overlap"] == "none" and dual["overlap"] == "dual-batch"
    assert dual["forward_latency_us"] < none["forward_latency_us"]


def test_mla_decode_attention_is_bounded_by_the_compressed_cache_and_its_flops():
    # DeepSeek-V3 absorbed MLA decode: each token's cache entry is kv_lora + rope = 576 elements, read once:
    # 128 requests of 4K context in BF16 read 128 x 4096 x 576 x 2 bytes; per (head, key) QK over 576 and PV
    # over 512 dims = 2 x (576 + 512) FLOPs, 128 heads. Neither bound can be beaten; FlashMLA reaches about
    # 3000 GB/s and 580 TFLOPS on H800 (its README), so the block stays within 3x the larger bound.
    from estimators.moe.serving import AttentionTimer, ServingSpec
    from estimators.model_config import load_model
    from replay.hardware.config import get_hardware
    hw = get_hardware("h800")
    at = AttentionTimer(load_model("deepseek-v3"), hw, ServingSpec("decode", 128, 4096))
    cache_us = 128 * 4096 * 576 * 2 / hw.hbm_bytes_per_us
    flops_us = 128 * 128 * 4096 * 2 * (576 + 512) / (hw.peak_flops("bf16") / 1e6)
    t = at.attention_us(128, 10)
    assert max(cache_us, flops_us) <= t <= 3 * max(128 * 4096 * 576 * 2 / 3000e3, flops_us * 989 / 580)


# ------------------------------------------------------------------------------------------ bad input
def _deepseek(*args):
    return ["--model", "deepseek-v3", "--set", "model.layers=5", *args]


@pytest.mark.parametrize("args,message", [
    (["--ep", "144", "--placement", "eplb", "--redundant-experts", "16"],
     "256 experts + 16 redundant = 272 physical slots do not divide over EP144"),
    (["--ep", "16", "--placement", "eplb", "--redundant-experts", "4096"],
     "more than the 256 experts"),
    (["--ep", "16", "--groups", "7"], "7 expert groups do not divide the 256 experts"),
    (["--ep", "16", "--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
    (["--ep", "16", "--attention-tp", "3"], "attention TP3 must divide EP16"),
    (["--ep", "16", "--redundant-experts", "16"], "redundant_experts needs placement = eplb"),
])
def test_bad_deployment_flags_are_one_line_errors(capsys, args, message):
    code, out, err = _run(capsys, *_deepseek(*args, "--routing", "synthetic:tokens=4096"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.parametrize("body,message", [
    ("[deployment]\nmodel = 'deepseek-v3'\nep = 32\nredundant_experts = 64\nplacement = 'eplb'\nrouted_slots_per_gpu = 9\n",
     "states routed_slots_per_gpu = 9"),
    ("[deployment]\nmodel = 'deepseek-v3'\nep = 32\nbatch = 4\n", "unknown key 'batch'"),
    ("[deployment]\nmodel = 'deepseek-v3'\n", "missing key 'ep'"),
    ("[deployment]\nmodel = 'deepseek-v3'\nep = 'x'\n", "'ep' must be an integer"),
    ("[deployment]\nmodel = 'deepseek-v3'\nep = 32\nmtp_acceptance = 1.5\n", "'mtp_acceptance' must be a number in [0, 1]"),
    ("model = 'deepseek-v3'\n", "one [deployment] table"),
    ("[deployment\n", "not a valid TOML file"),
])
def test_bad_deployment_files_are_one_line_errors(tmp_path, capsys, body, message):
    f = tmp_path / "d.toml"
    f.write_text(body)
    code, out, err = _run(capsys, "--deployment", str(f))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.parametrize("text,message", [
    ("1,2,3\n4,5\n", "ragged expert loads"),
    ("1,2,inf\n", "finite"),
    ("1,nan,3\n", "finite"),
    ("1,-2,3\n", ">= 0"),
    ("0,0,0\n", "all zero"),
])
def test_bad_expert_load_files_are_one_line_errors(tmp_path, capsys, text, message):
    rows = text.strip().splitlines()
    # two MoE layers of 256 experts: pad each row's pattern to 256 values
    full = "\n".join(",".join((r.split(",") * 256)[:256]) if "," in r else r for r in rows) + "\n"
    if "ragged" in message:
        full = ",".join(["1"] * 256) + "\n" + ",".join(["1"] * 255) + "\n"
    else:
        full = full + ",".join(["1"] * 256) + "\n"
    f = tmp_path / "loads.csv"
    f.write_text(full)
    code, out, err = _run(capsys, *_deepseek("--ep", "16", "--expert-load", str(f)))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_expert_loads_of_the_wrong_shape_are_one_line_errors(tmp_path, capsys):
    f = tmp_path / "loads.json"
    f.write_text(json.dumps([[[1] * 256] * 2]))
    code, _, err = _run(capsys, *_deepseek("--ep", "16", "--expert-load", str(f)))
    assert code == 2 and "[layers][experts]" in err and len(err.strip().splitlines()) == 1
    f.write_text(json.dumps([[1] * 128] * 2))
    code, _, err = _run(capsys, *_deepseek("--ep", "16", "--expert-load", str(f)))
    assert code == 2 and "128 experts, the model has 256" in err


def test_expert_loads_of_1e308_give_the_true_gpu_load_ratio(tmp_path, capsys):
    # issue 21 item 2: loads near the float64 limit once overflowed (max/mean 32 reported). Contiguous
    # placement on EP16: GPU g holds experts 16g..16g+15, so its load is the sum of those loads.
    pattern = 1.0 + (np.arange(256) % 7) / 10 + (np.arange(256) // 16) / 100
    ratio = lambda w: (w.reshape(16, 16).sum(1).max() / w.reshape(16, 16).sum(1).mean())  # noqa: E731
    want = ratio(pattern)
    assert 1.0 < want < 1.1
    f = tmp_path / "loads.json"
    f.write_text(json.dumps([(pattern * 1e308 / 2).tolist()] * 2))
    code, out, err = _run(capsys, *_deepseek("--ep", "16", "--expert-load", str(f), "--json"))
    assert code == 0, err
    d = json.loads(out)
    assert d["max_over_mean_gpu_load"] == pytest.approx(want, rel=1e-3)


def test_gpus_per_node_zero_is_refused_not_ignored(capsys):
    code, out, err = _run(capsys, *_deepseek("--ep", "16", "--gpus-per-node", "0", "--routing", "synthetic:tokens=4096"))
    assert code == 2 and "--gpus-per-node must be >= 1" in err and out == ""


# ------------------------------------------------------------------------------------------ all-to-all
@pytest.mark.parametrize("hw", ["h800", "a100-sxm-80gb"])
def test_fast_all_to_all_matches_the_network_model(hw):
    from estimators.moe.a2a import AllToAllTimer
    from replay.hardware.network import NetworkModel
    net = NetworkModel(hw)
    rng = np.random.default_rng(1)
    for G in (8, 24, 48):
        m = rng.random((G, G)) * 1e6
        m[rng.random((G, G)) < 0.3] = 0
        t = AllToAllTimer(net, list(range(G)))
        assert t(m) == pytest.approx(net.all_to_all_v_us(m, list(range(G))), rel=1e-12)
        assert t(m, 0.5) == pytest.approx(net.all_to_all_v_us(m * 0.5, list(range(G))), rel=1e-12)


# ------------------------------------------------------------------------------------------ the sweep
def test_serving_sweep_reports_tokens_per_node_and_marks_the_best_point(tmp_path):
    import importlib.util
    import tomllib
    script = ROOT / "examples" / "sweeps" / "moe_placement.py"
    spec_file = ROOT / "examples" / "sweeps" / "moe_serving.toml"
    spec = importlib.util.spec_from_file_location("moe_placement_example", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    points = mod.expand_axes(tomllib.loads(spec_file.read_text())["axes"])
    assert len(points) == 16 and {c["moe.placement"] for _, c in points} == {"contiguous", "balanced", "eplb",
                                                                              "eplb-fallback"}
    assert {(c["plan.ep"], c["moe.redundant_experts"]) for _, c in points} == {
        (32, 0), (32, 32), (64, 0), (64, 64), (144, 32), (320, 64)}
    small = spec_file.read_text().split("[[axes]]")[0] + """
[[axes]]
list = [{ label = "EP16", "plan.ep" = 16, "plan.dp" = 16, "moe.redundant_experts" = 0 },
        { label = "EP16 +16", "plan.ep" = 16, "plan.dp" = 16, "moe.redundant_experts" = 16 }]
[[axes]]
list = [{ label = "contiguous", "moe.placement" = "contiguous" }, { label = "eplb", "moe.placement" = "eplb" }]
"""
    (tmp_path / "small.toml").write_text(small)
    out, csv = tmp_path / "r.html", tmp_path / "r.csv"
    assert mod.main(["--spec", str(tmp_path / "small.toml"), "--set", "model.layers=5", "--set",
                     "moe.synthetic_tokens=8192", "--set", "moe.tokens=64", "-o", str(out), "--csv", str(csv)]) == 0
    import pandas as pd
    df = pd.read_csv(csv)
    ok = df[df["error"].isna()] if "error" in df else df
    assert len(df) == 4 and len(ok) == 3                         # contiguous + 16 redundant is refused
    assert df.loc[df["error"].notna(), "error"].str.contains("redundant_experts needs placement").all()
    best = ok[ok["best"] == True]                                # noqa: E712
    assert len(best) == 1
    assert best["metrics.tokens_per_s_per_node"].iloc[0] == ok["metrics.tokens_per_s_per_node"].max()
    assert ok["metrics.time_per_output_token_ms"].gt(0).all()
    assert "star" in out.read_text()


# ------------------------------------------------------------------------------------------ node-limited routing
def test_group_limit_keeps_obeying_rows_and_moves_other_picks_into_the_kept_groups():
    from estimators.moe.grouped import limit_groups
    # 8 groups of 32: picks in groups 0,0,1,1,3,4,6,7 -> keep 0, 1 (two picks each), 3, 4 (picked first);
    # 200 (index 8 in group 6) -> expert 8 of group 0, 250 (index 26) -> expert 26 of group 0
    assert limit_groups(np.array([[0, 1, 40, 41, 100, 130, 200, 250]]), 256, 8, 4).tolist() == \
        [[0, 1, 40, 41, 100, 130, 8, 26]]
    ok = np.array([[0, 33, 70, 100, 1, 34, 71, 101]])           # already 4 groups: unchanged
    assert (limit_groups(ok, 256, 8, 4) == ok).all()
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(256)[:8] for _ in range(5000)]).astype(np.int16)
    out = limit_groups(ids, 256, 8, 4)
    assert out.dtype == ids.dtype
    assert max(len(set(r)) for r in (out // 32).tolist()) <= 4
    assert all(len(set(r)) == 8 for r in out.tolist())


def test_deepseek_synthetic_routing_is_node_limited_as_its_config_says():
    from estimators.moe.whatif import MoEOptions, open_routing
    from estimators.model_config import load_model
    m = load_model("deepseek-v3")
    src = open_routing(MoEOptions(synthetic_tokens=2048), m, 1024)
    _, ids = next(src.chunks(0, 2048))
    assert (np.array([[len(set(r)) for r in (ids[:, layer] // 32).tolist()] for layer in range(3)]) <= 4).all()
    src = open_routing(MoEOptions(synthetic_tokens=2048, groups_per_token=8), m, 1024)   # --groups-per-token 8
    _, ids = next(src.chunks(0, 2048))
    assert max(len(set(r)) for r in (ids[:, 0] // 32).tolist()) > 4


@pytest.mark.parametrize("model,per_token", [("deepseek-v3", 576), ("qwen3-235b-a22b", 2 * 4 * 128)])
def test_decode_with_mtp_reads_each_sequences_kv_cache_once_per_step(monkeypatch, model, per_token):
    """With one MTP draft token a decode step verifies 2 tokens per sequence: 256 tokens are 128 sequences,
    and the 2 tokens of a sequence read its cache together (FlashMLA / paged attention batch a sequence's
    queries): 128 x 4096 x elements per cached token x 2 bytes, not 256 x (it read every cache twice).
    Elements per token: MLA kv_lora 512 + rope 64 = 576; Qwen3-235B GQA 4 KV heads x 128 x (K and V)."""
    import dataclasses
    from estimators.moe.serving import AttentionTimer, ServingSpec
    from estimators.model_config import load_model
    from replay.hardware.config import get_hardware
    m = load_model(model)
    if not m.mtp_layers:
        m = dataclasses.replace(m, mtp_layers=1)
    at = AttentionTimer(m, get_hardware("h800"), ServingSpec("decode", 256, 4096, mtp_acceptance=0.85))
    seen = []
    real = at.c.memory_op
    monkeypatch.setattr(at.c, "memory_op", lambda nbytes, *a, **k: seen.append(nbytes) or real(nbytes, *a, **k))
    at.attention_us(256, m.layers - 1)
    assert max(seen) == 128 * 4096 * per_token * 2


def test_mtp_with_more_drafts_than_modules_reuses_the_last_and_emits_the_published_length(capsys):
    """SGLang's and TensorRT-LLM's MTP 3 on DeepSeek-V3 (one MTP module) draft 3 tokens a step with the same
    module: a step verifies 1 + 3 tokens per sequence, runs the module 3 times and emits
    1 + a + a^2 + a^3 tokens (a = 0.85: 3.186625), or the acceptance length a source publishes (2.44)."""
    base = ["--model", "deepseek-v3", "--set", "model.layers=5", "--hardware", "h200", "--phase", "decode",
            "--ep", "16", "--tokens", "8", "--context", "4096", "--json"]
    runs = {}
    for name, extra in (("one", ["--tokens", "4", "--mtp-acceptance", "0.85"]),
                        ("three", ["--mtp-acceptance", "0.85", "--mtp-draft-tokens", "3"]),
                        ("length", ["--mtp-acceptance-length", "2.44", "--mtp-draft-tokens", "3"])):
        code, out, err = _run(capsys, *base, *extra)
        assert code == 0, err
        runs[name] = json.loads(out)
    one, three, length = (runs[k] for k in ("one", "three", "length"))
    assert three["metrics"]["tokens_per_step_per_sequence"] == pytest.approx(1 + 0.85 + 0.85 ** 2 + 0.85 ** 3)
    assert three["metrics"]["mtp_draft_tokens"] == 3 and one["metrics"]["mtp_draft_tokens"] == 1
    # both verify 2 sequences per GPU (4 / (1 + 1), 8 / (1 + 3)): three module passes against one
    assert 2.5 < three["serving_parts_us"]["mtp"] / one["serving_parts_us"]["mtp"] < 3.5
    m = length["metrics"]
    assert m["tokens_per_step_per_sequence"] == 2.44
    assert m["tokens_per_s_per_gpu"] == pytest.approx(2 * 2.44 / length["step_time_s"], rel=1e-6)


@pytest.mark.parametrize("args,message", [
    (["--mtp-draft-tokens", "3"], "mtp_draft_tokens needs mtp_acceptance or mtp_acceptance_length"),
    (["--mtp-acceptance-length", "0.5"], "at least 1, got 0.5"),
    (["--mtp-acceptance-length", "2", "--mtp-acceptance", "0.8"], "not both"),
    (["--mtp-acceptance-length", "5", "--mtp-draft-tokens", "3"], "more than the 4 tokens a step verifies"),
    (["--mtp-acceptance-length", "2", "--phase", "prefill"], "MTP drafts tokens in decode, not in phase prefill"),
])
def test_bad_mtp_settings_are_one_line_errors(capsys, args, message):
    code, out, err = _run(capsys, *_deepseek("--ep", "16", "--phase", "decode", *args))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""
