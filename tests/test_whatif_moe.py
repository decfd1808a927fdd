"""The `moe` what-if end to end: scenario options, metrics, the training step through the workload
generator, the CLI (flags, JSON keys, --set, one-line errors)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_schema.errors import TraceInputError
from estimators.moe.evaluate import Layout, evaluate_placements, fit_stats
from estimators.moe.placement import PlacementOptions, fit_placement
from estimators.moe.synthetic import SyntheticSource, SyntheticSpec
from estimators.scenario import Scenario
from estimators.registry import evaluate
from lumos_sim.cli import main

SMALL = "synthetic:tokens=8192"


def _scenario(**moe) -> Scenario:
    s = Scenario.build(model="deepseek-v3", hardware="h100-sxm",
                       plan={"ep": 16, "dp": 16, "seq_len": 4096, "global_batch": 32})
    s = s.override({"model.layers": 5, "whatif": "moe"})   # 2 MoE layers after the 3 dense ones
    return s.override({f"moe.{k}": v for k, v in moe.items()})


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10 ** 6), skew=st.floats(0.0, 1.5))
def test_balanced_and_eplb_gpu_load_never_exceeds_contiguous_on_synthetic_routing(seed, skew):
    # DeepSeek-V3 shape, EP64 on 8 nodes, one batch fitted and evaluated (in-sample)
    src = SyntheticSource(SyntheticSpec(tokens=64 * 64, layers=2, experts=256, top_k=8, skew=skew, seed=seed))
    lay = Layout(64, 8, 64)
    stats = fit_stats(src, 0, src.tokens, lay, 256, coactivation_tokens=0)
    ps = [fit_placement(n, stats, PlacementOptions(redundant_experts=r))
          for n, r in (("contiguous", 0), ("balanced", 0), ("eplb", 0), ("eplb", 64))]
    ratios = [c.max_over_mean for c in evaluate_placements(src, 0, src.tokens, lay, 256, ps, None)]
    for r in ratios[1:]:
        assert (r <= ratios[0] + 1e-9).all()


def test_exactly_balanced_routing_reproduces_the_balanced_ep_step_time():
    p = evaluate(_scenario(routing="synthetic:balanced=1", phase="train", synthetic_tokens=16 * 4096 * 2))
    assert p.step_time_s == pytest.approx(p.baseline_step_time_s, rel=0.01)
    assert p.metrics["max_over_mean_gpu_load"] == pytest.approx(1.0)


def test_skewed_routing_slows_the_training_step_and_shows_in_the_ep_communication():
    skewed = evaluate(_scenario(routing="synthetic:skew=1.2", phase="train", synthetic_tokens=16 * 4096 * 2))
    assert skewed.step_time_s > 1.03 * skewed.baseline_step_time_s
    assert skewed.metrics["step_time_vs_balanced"] == pytest.approx(skewed.step_time_s / skewed.baseline_step_time_s)


def test_eplb_relieves_the_hot_gpu_in_decode():
    base = evaluate(_scenario(routing=SMALL + ",skew=1.2"))
    eplb = evaluate(_scenario(routing=SMALL + ",skew=1.2", placement="eplb", redundant_experts=16))
    assert eplb.metrics["max_over_mean_gpu_load"] < base.metrics["max_over_mean_gpu_load"]
    assert eplb.metrics["expert_gemm_us_mean"] < base.metrics["expert_gemm_us_mean"]
    assert eplb.metrics["physical_experts_per_gpu"] == 17
    assert base.metrics["a2a_reduction_vs_contiguous"] == 0.0


def test_decode_and_prefill_report_latency_and_throughput():
    for phase, tokens in (("decode", 64), ("prefill", 2048)):
        p = evaluate(_scenario(phase=phase, tokens=tokens))
        m = p.metrics
        assert m[f"{phase}_latency_us"] == pytest.approx(m["dense_forward_us"] + m["moe_latency_us"])
        assert p.tokens_per_s == pytest.approx(16 * tokens / (m[f"{phase}_latency_us"] / 1e6))
        assert m["moe_latency_us"] == pytest.approx(2 * m["layer_latency_us_mean"])


def test_fit_on_prefill_evaluates_on_decode_tokens():
    p = evaluate(_scenario(routing=SMALL, fit="prefill", placement="balanced"))
    assert "prefill tokens" in p.notes[0] and p.metrics["fit_tokens"] == 4096 and p.metrics["evaluated_tokens"] == 4096


def test_moe_options_are_validated():
    with pytest.raises(TraceInputError, match="placement must be one of"):
        _scenario(placement="nope")
    with pytest.raises(TraceInputError, match="redundant_experts needs placement = eplb"):
        _scenario(redundant_experts=4)


def _cli(capsys, *args):
    code = main(["whatif", "moe", "--model", "deepseek-v3", "--ep", "16", "--set", "model.layers=5", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_has_the_moe_keys(capsys):
    code, out, _ = _cli(capsys, "--routing", SMALL + ",domains=8", "--placement", "locality",
                        "--group-by", "domain", "--json")
    assert code == 0
    d = json.loads(out)
    for k in ("a2a_bytes", "a2a_bytes_inter_node", "a2a_reduction_vs_contiguous", "max_over_mean_gpu_load",
              "layer_latency_us", "moe_latency_us"):
        assert k in d
    assert len(d["layer_latency_us"]["per_layer"]) == 2 and d["layer_latency_us"]["mean"] > 0
    assert d["metrics"]["a2a_bytes_inter_node"] == d["a2a_bytes_inter_node"]


def test_cli_train_reports_step_time_and_set_overrides_options(capsys):
    code, out, _ = _cli(capsys, "--routing", "synthetic:balanced=1", "--phase", "train", "--global-batch", "32",
                        "--set", "moe.synthetic_tokens=131072", "--set", "moe.placement=eplb", "--json")
    d = json.loads(out)
    assert code == 0 and d["step_time_s"] > 0 and d["placement"] == "eplb"


def test_cli_expert_load_csv(tmp_path, capsys):
    loads = np.random.default_rng(0).integers(1, 100, (2, 256))
    np.savetxt(tmp_path / "loads.csv", loads, delimiter=",", fmt="%d")
    code, out, _ = _cli(capsys, "--expert-load", str(tmp_path / "loads.csv"), "--placement", "balanced", "--json")
    assert code == 0 and json.loads(out)["max_over_mean_gpu_load"] >= 1.0


@pytest.mark.parametrize("shape,bad,message", [
    ((64, 2, 8), 300, "expert id 300"),            # id >= experts
    ((64, 3, 8), None, "routing has 3 MoE layers, the model has 2"),
    ((64, 2, 4), None, "top-4"),
])
def test_cli_bad_routing_is_one_line_and_exit_2(tmp_path, capsys, shape, bad, message):
    arr = np.zeros(shape, np.int16)
    arr[:] = np.arange(shape[2])
    if bad is not None:
        arr[10, 1, 3] = bad
    np.save(tmp_path / "r.npy", arr)
    code, out, err = _cli(capsys, "--routing", str(tmp_path / "r.npy"), "--set", "moe.fit=all")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_cli_ragged_top_k_is_one_line_and_exit_2(tmp_path, capsys):
    lines = [{"layer": l, "token_idx": t, "experts": list(range(8 if t else 7))} for t in range(2) for l in range(2)]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    code, _, err = _cli(capsys, "--routing", str(tmp_path / "r.jsonl"))
    assert code == 2 and "ragged top-k" in err and len(err.strip().splitlines()) == 1


def test_cli_expert_load_layer_mismatch_is_exit_2(tmp_path, capsys):
    (tmp_path / "loads.json").write_text(json.dumps([[1] * 256] * 3))
    code, _, err = _cli(capsys, "--expert-load", str(tmp_path / "loads.json"))
    assert code == 2 and "3 layers, the model has 2 MoE layers" in err


def test_a_trace_shorter_than_one_batch_is_a_clear_error(tmp_path, capsys):
    np.save(tmp_path / "r.npy", np.tile(np.arange(8, dtype=np.int16), (64, 2, 1)))
    code, _, err = _cli(capsys, "--routing", str(tmp_path / "r.npy"), "--set", "moe.fit=all")
    assert code == 2 and "fewer than one batch (EP16 x 128 tokens per GPU)" in err


def test_synthetic_routing_grows_to_fit_a_prefill_batch():
    p = evaluate(_scenario(phase="prefill", tokens=4096))     # 16 x 4096 tokens per batch > 65536 default
    assert p.metrics["evaluated_tokens"] == 16 * 4096 and p.metrics["batches"] == 1


def test_cli_table_names_the_layout_and_the_gpus_per_node_flag_changes_it(capsys):
    code, out, _ = _cli(capsys, "--routing", SMALL, "--gpus-per-node", "4", "--placement", "balanced")
    assert code == 0 and "EP16 on 4 x h100-sxm nodes: balanced" in out and "inter-node reduction" in out
