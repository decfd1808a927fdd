"""Fuzzing pass 38: inputs that gave a traceback, an absurd figure or a silently ignored option."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chakra_schema.errors import TraceInputError
from replay.hardware.attention_args import attention_geometry

ROOT = Path(__file__).resolve().parents[1]
SDPA = ROOT / "tests" / "data" / "h100" / "kernels_sdpa"
# (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale)
FLASH = "aten::_flash_attention_forward"


def _flash_values(max_q, max_k, causal="True"):
    return ["", "", "", "", "", max_q, max_k, "0.", causal, "False", ""]


@pytest.mark.parametrize("raw", ["--5", "\u00b2", "\u0661\u0662", "5-", "1e3", "9" * 5000])
def test_a_max_length_that_is_not_an_ascii_integer_reads_as_unknown(raw):
    """str.isdigit() took '²' and '١٢', and lstrip('-') took '--5': int() then raised a traceback. Such a
    value now reads as absent, and a variable-length batch without its max length has no geometry."""
    shapes = [[8192, 32, 128], [8192, 8, 128], [8192, 8, 128]]
    assert attention_geometry(FLASH, shapes, _flash_values(raw, "2048")) is None


def test_a_packed_batch_never_implies_more_key_tokens_than_the_key_tensor_holds():
    """max_q 1 beside max_k 8192 on 8192 packed tokens: 8192 one-query sequences used to get 8192 keys each
    (64 million key tokens from an 8192-token tensor: a 92x step). The sequence count now serves both
    sides: 8192 sequences, each with 8192 / 8192 = 1 key."""
    shapes = [[8192, 32, 128], [8192, 8, 128], [8192, 8, 128]]
    g = attention_geometry(FLASH, shapes, _flash_values("1", "8192"))
    assert (g.batch, g.seq_q, g.seq_kv) == (8192, 1, 1)
    even = attention_geometry(FLASH, shapes, _flash_values("2048", "2048"))   # the usual case is unchanged
    assert (even.batch, even.seq_q, even.seq_kv) == (4, 2048, 2048)


def test_a_value_tensor_with_a_non_positive_dim_gives_no_geometry():
    """Only q and k were checked: a value head dim of -1000 made the FLOPs negative (a 16 ms step read 5 ms)."""
    q = [4, 2048, 32, 128]
    assert attention_geometry("aten::_efficient_attention_forward", [q, q, [4, 2048, 32, -1000]]) is None
    assert attention_geometry("aten::_efficient_attention_forward", [q, q, q]) is not None


def _mutated_sdpa(tmp_path: Path, mutate) -> Path:
    data = json.loads(gzip.decompress((SDPA / "device.0.json.gz").read_bytes()))
    for e in data["traceEvents"]:
        if e.get("cat") == "cpu_op" and "attention" in e.get("name", ""):
            mutate(e["args"])
    out = tmp_path / "device.0.json.gz"
    out.write_bytes(gzip.compress(json.dumps(data).encode()))
    return out


def _replay_model(path: Path):
    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    return run_replay(load_graphs([], kineto_pattern=str(path)), mode="model", hardware="h100-sxm")


def test_input_types_that_are_not_a_list_are_read_as_absent(tmp_path):
    """`"Input type": 5` raised a TypeError traceback in the dtype lookup; it now reads as no types."""
    def bad_types(args):
        args["Input type"] = 5
    result = _replay_model(_mutated_sdpa(tmp_path, bad_types))
    assert result.step_time_us > 0


def test_a_recorded_tensor_no_gpu_holds_is_refused_in_kineto_model_timing(tmp_path):
    """The ET-only path refused a [4, 32, 1e9, 128] query; the Kineto path timed it as a 40-year step."""
    def huge(args):
        args["Input Dims"][0] = [4, 32, 10 ** 9, 128]
    path = _mutated_sdpa(tmp_path, huge)
    with pytest.raises(TraceInputError, match="is not a tensor any GPU holds") as err:
        _replay_model(path)
    assert str(path) in str(err.value)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "lumos_sim", *args], capture_output=True, text=True, timeout=600)


def test_search_holds_the_job_that_set_overrides_describe():
    """--search took seq_len, global_batch and precision from the flags' defaults, whatever --set said."""
    p = _cli("whatif", "parallelism", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096",
             "--global-batch", "64", "--search", "--top-k", "1", "--json", "--set", "plan.seq_len=8192",
             "--set", "plan.global_batch=128", "--set", "plan.precision=fp8")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)[0]["plan"]
    assert (plan["seq_len"], plan["global_batch"], plan["precision"]) == (8192, 128, "fp8")


def test_fp8_serving_on_a_gpu_without_fp8_tensor_cores_is_refused():
    """The train phase and `bench gemm` refused FP8 on a V100; prefill and decode predicted it faster than bf16."""
    p = _cli("whatif", "moe", "--model", "qwen3-30b-a3b", "--ep", "8", "--precision", "fp8",
             "--hardware", "v100-sxm2", "--json")
    assert p.returncode == 2
    assert p.stderr.strip().endswith("FP8 serving needs FP8 tensor cores; v100-sxm2 (V100 SXM2 32GB) has none: "
                                     "use --precision bf16")


def test_steps_that_all_share_one_name_pair_by_order(tmp_path):
    """Every step named ProfilerStep#2 on 4 ranks made one job step of 12 rank-steps spanning the whole trace;
    each rank's k-th steps overlap in recorded time, so there are 3 job steps of 4 ranks."""
    import re

    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    src = ROOT / "tests" / "data" / "ddp4" / "balanced"
    for r in range(4):
        text = gzip.decompress((src / f"device.{r}.json.gz").read_bytes()).decode()
        text = re.sub(r"ProfilerStep#\d+", "ProfilerStep#2", text)
        (tmp_path / f"device.{r}.json.gz").write_bytes(gzip.compress(text.encode()))
    result = run_replay(load_graphs([], kineto_pattern=str(tmp_path / "device.{rank}.json.gz")), mode="trace")
    original = run_replay(load_graphs([], kineto_pattern=str(src / "device.{rank}.json.gz")), mode="trace")
    assert [j.ranks for j in result.job_steps] == [4, 4, 4]
    assert "do not overlap in recorded time" in result.step_pairing_note
    assert result.measured_job_step_time_us == pytest.approx(original.measured_job_step_time_us, rel=1e-9)


@pytest.mark.parametrize("top_k", [8, 24, 64])
def test_synthetic_routing_gives_each_token_distinct_experts_at_any_top_k(top_k):
    """Redraws are checked against a table of each token's experts (top-k 128 of 128 took over 5 minutes when
    every pair was compared); from a quarter of the experts on, the rest are free experts at random."""
    import numpy as np

    from estimators.moe.synthetic import SyntheticSource, SyntheticSpec
    src = SyntheticSource(SyntheticSpec(tokens=2048, layers=2, experts=64, top_k=top_k, skew=1.5))
    picks = np.concatenate([c for _, c in src.chunks()]).astype(int)       # [tokens, layers, top_k]
    ordered = np.sort(picks, axis=2)
    assert picks.shape == (2048, 2, top_k)
    assert (np.diff(ordered, axis=2) > 0).all() and picks.min() >= 0 and picks.max() < 64
    if top_k == 64:      # every expert, once per token
        assert (ordered == np.arange(64)).all()


def test_synthetic_routing_keeps_its_skew_when_tokens_redraw():
    """A Zipf skew of 1.5 over 64 experts at top-2: the layer's most popular expert gets well over the
    2 / 64 of picks an even router gives (redraws must not flatten the popularity they resample)."""
    import numpy as np

    from estimators.moe.synthetic import SyntheticSource, SyntheticSpec
    src = SyntheticSource(SyntheticSpec(tokens=8192, layers=1, experts=64, top_k=2, skew=1.5, skew_jitter=0.0,
                                        cluster_affinity=0.0, drift=0.0, domain_share=0.0))
    picks = np.concatenate([c for _, c in src.chunks()]).astype(int)[:, 0, :]
    share = np.bincount(picks.ravel(), minlength=64).max() / picks.size
    # Zipf 1.5 over 64 ranks: the first holds 1 / sum(r^-1.5) = 0.41 of one draw; two distinct picks per token
    # hold it at most once, so its share of picks is about 0.41 / 2 plus its redraw share
    assert 0.15 < share < 0.5


def test_selective_recompute_counts_the_work_the_step_repeats():
    """Hardware FLOPs counted a core-attention recompute that flash attention's step never runs (hw TFLOP/s
    524 -> 546 at the same step and memory). Selective recompute now counts, module by module, the forward it
    repeats: nothing for core_attn beside flash attention (with a note saying so), Llama 3 8B's MLP
    (3 matrices of 4096 x 14336 in 32 layers: 2 FLOPs per weight per token) for --recompute-modules mlp."""
    from estimators.model_config import load_model
    from estimators.parallelism.evaluate import hw_flops_per_step
    from estimators.parallelism.plan import ParallelPlan
    m = load_model("llama3-8b")
    base = ParallelPlan(dp=8, seq_len=4096, global_batch=64)
    none = hw_flops_per_step(m, base)
    assert hw_flops_per_step(m, base.with_(recompute="selective")) == none
    mlp = hw_flops_per_step(m, base.with_(recompute="selective", recompute_modules=("mlp",)))
    assert mlp - none == pytest.approx(64 * 4096 * 32 * 2 * 3 * 4096 * 14336, rel=1e-12)
    p = _cli("whatif", "parallelism", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096",
             "--global-batch", "64", "--recompute", "selective", "--json")
    assert p.returncode == 0, p.stderr
    assert any("recomputes nothing beside flash attention" in n for n in json.loads(p.stdout)["notes"])


@pytest.mark.parametrize("args,message", [
    (["--pp", "2", "--pipeline-layout", "1_6,16"], "expected integers >= 0 like 4,8,8,4, got '1_6,16'"),
    (["--pp", "2", "--first-stage-layers", "\u0661\u0666"], "expected an integer >= 0"),
    (["--recompute", "selective", "--recompute-modules", "core_attn,core_attn"], "expected distinct names"),
    (["--full-simulation", "--simulation", "fast"], "--full-simulation is --simulation all: it contradicts"),
])
def test_layer_counts_module_lists_and_simulation_modes_are_read_strictly(args, message):
    """int() took '1_6' and Arabic-Indic digits as 16; a repeated module and --full-simulation beside
    --simulation fast (fast silently won) were accepted."""
    p = _cli("whatif", "parallelism", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096",
             "--global-batch", "64", *args)
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_sweep_with_two_search_axes_is_refused(tmp_path):
    """The second search replaced the first's plans, and the row was labelled with both."""
    spec = tmp_path / "two.toml"
    spec.write_text('[scenario]\nwhatif = "parallelism"\nhardware = "h100-sxm"\nmodel = "llama3-8b"\n'
                    'plan = { seq_len = 4096, global_batch = 64 }\n[[axes]]\nsearch = { gpus = [8], max_plans = 1 }\n'
                    '[[axes]]\nsearch = { gpus = [16], max_plans = 1 }\n')
    p = _cli("sweep", str(spec), "-o", str(tmp_path / "out.csv"))
    assert p.returncode == 2 and "axes 0 and 1 are both searches" in p.stderr
    assert not (tmp_path / "out.csv").exists()


def test_moe_training_without_a_whole_micro_batch_names_the_batch_not_an_internal_option():
    p = _cli("whatif", "moe", "--model", "qwen3-30b-a3b", "--ep", "8", "--phase", "train", "--global-batch", "8",
             "--micro-batch", "16")
    assert p.returncode == 2 and "global batch 8 is not divisible by dp*micro_batch = 128" in p.stderr


def test_bench_gemm_refuses_operands_no_gpu_holds():
    """Each dimension under 2^31, the operands exabytes: 2.5e18 us was printed."""
    p = _cli("bench", "gemm", "--m", "1000000000", "--n", "1000000000", "--k", "1000000000")
    assert p.returncode == 2 and "operand A" in p.stderr and "more than any GPU holds" in p.stderr


def test_synthetic_routing_past_a_quarter_of_the_experts_keeps_the_routers_skew():
    """Top-8 of 16 at Zipf 2: the picks beyond the fourth are drawn without replacement in proportion to the
    layer's popularity (uniformly, they flattened the hottest expert's share); numpy's own sequential
    sampling without replacement from the same Zipf weights is the reference."""
    import numpy as np

    from estimators.moe.synthetic import SyntheticSource, SyntheticSpec
    E, k = 16, 8
    src = SyntheticSource(SyntheticSpec(tokens=8192, layers=1, experts=E, top_k=k, skew=2.0, skew_jitter=0.0,
                                        cluster_affinity=0.0, drift=0.0, domain_share=0.0, domains=1))
    picks = np.concatenate([c for _, c in src.chunks()]).astype(int)[:, 0, :]
    got = np.sort(np.bincount(picks.ravel(), minlength=E))[::-1] / picks.size
    w = np.arange(1, E + 1, dtype=float) ** -2.0
    rng = np.random.default_rng(7)
    ref = np.zeros(E)
    for _ in range(4000):
        ref[rng.choice(E, k, replace=False, p=w / w.sum())] += 1
    ref = ref / ref.sum()                        # expert i is the i-th most popular in the reference
    assert got[:4] == pytest.approx(ref[:4], rel=0.05)


def test_an_mtp_module_pass_reads_each_sequences_whole_cache():
    """An MTP module's pass holds one token per sequence; the attention timer divided its tokens by 1 + d
    again, so a draft pass read half the cache at d = 1 (a quarter at d = 3). It now costs what a plain
    decode of one token per sequence costs."""
    from estimators.model_config import load_model
    from estimators.moe.serving import AttentionTimer, ServingSpec
    from replay.hardware import get_hardware
    m, hw = load_model("qwen3-235b-a22b"), get_hardware("h200")
    if not m.mtp_layers:
        import dataclasses
        m = dataclasses.replace(m, mtp_layers=1)
    mtp = AttentionTimer(m, hw, ServingSpec("decode", 256, 32768, mtp_acceptance=0.85, draft_tokens=3))
    plain = AttentionTimer(m, hw, ServingSpec("decode", 256, 32768))
    last = m.layers - 1
    assert mtp.attention_us(64, last, one_per_sequence=True) == pytest.approx(plain.attention_us(64, last))
    assert mtp.attention_us(64, last) < 0.5 * plain.attention_us(64, last)   # 16 sequences of 1 + 3 tokens


def test_unfused_attention_keeps_its_score_matrix_unless_core_attention_is_recomputed():
    """Memory dropped the unfused softmax output for any selective recompute, while the step (and now the
    FLOPs) recompute core attention only when core_attn is named. Llama 3 8B has no dropout, so the score
    matrix is the softmax output: 2 bytes x 32 heads x 4096 keys per token of the 4096-token micro-batch."""
    from estimators.model_config import load_model
    from estimators.parallelism.memory import layer_activation_bytes
    from estimators.parallelism.plan import ParallelPlan
    m = load_model("llama3-8b")
    plan = ParallelPlan(dp=8, seq_len=4096, global_batch=64, attention="unfused", recompute="selective")
    mlp = layer_activation_bytes(m, plan.with_(recompute_modules=("mlp",)), 0)
    both = layer_activation_bytes(m, plan.with_(recompute_modules=("mlp", "core_attn")), 0)
    assert mlp - both == pytest.approx(4096 * 2 * 32 * 4096, rel=1e-12)


def test_expected_loads_never_give_an_expert_more_picks_than_tokens():
    """A top-8 router whose load file holds 4 loaded experts of 16: each token picks an expert once, so no
    expert serves more than 1/8 of the picks (max/mean load 2.0 here, not the 4.0 proportional shares gave);
    the rest goes to the unloaded experts evenly."""
    import numpy as np

    from estimators.moe.evaluate import pick_shares
    share = pick_shares(np.array([[4.0, 3.0, 2.0, 1.0] + [0.0] * 12]), top_k=8)[0]
    assert share[:4] == pytest.approx([1 / 8] * 4) and share[4:] == pytest.approx([0.5 / 12] * 12)
    assert share.max() * 16 == pytest.approx(2.0)
    ranked = pick_shares(np.arange(16, 0, -1.0)[None] ** 2, top_k=8)[0]   # 256/1496 > 1/8: capped, rest scaled
    assert ranked[0] == pytest.approx(1 / 8) and ranked.sum() == pytest.approx(1.0)
    assert ranked[-2] / ranked[-1] == pytest.approx(4.0) and ranked[4] < 1 / 8   # 2^2 : 1^2, below the cap


def test_a_rank_missing_a_step_marker_with_shifted_names_pairs_by_recorded_time(tmp_path):
    """Rank 3 lost its first ProfilerStep marker and numbers the other two #2, #3 (the others' #3, #4): by
    name, job steps #2 and #3 each spanned two iterations. They now pair the steps that overlap in time."""
    import re

    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    src = ROOT / "tests" / "data" / "ddp4" / "balanced"
    for r in range(4):
        text = gzip.decompress((src / f"device.{r}.json.gz").read_bytes()).decode()
        if r == 3:
            text = text.replace("ProfilerStep#2", "NotAStep", 1)
            text = re.sub(r"ProfilerStep#(\d+)", lambda m: f"ProfilerStep#{int(m.group(1)) - 1}", text)
        (tmp_path / f"device.{r}.json.gz").write_bytes(gzip.compress(text.encode()))
    result = run_replay(load_graphs([], kineto_pattern=str(tmp_path / "device.{rank}.json.gz")), mode="trace")
    original = run_replay(load_graphs([], kineto_pattern=str(src / "device.{rank}.json.gz")), mode="trace")
    assert "pair the steps that overlap" in result.step_pairing_note
    assert [j.ranks for j in result.job_steps] == [3, 4, 4]
    assert result.measured_job_step_time_us == pytest.approx(original.measured_job_step_time_us, rel=1e-9)


def test_recomputing_the_mlp_of_a_model_without_dense_layers_is_refused():
    """Qwen3-30B-A3B has no dense layer: `--recompute-modules mlp` repeated nothing and changed no figure."""
    p = _cli("whatif", "parallelism", "--model", "qwen3-30b-a3b", "--gpus", "8", "--ep", "8", "--seq-len", "4096",
             "--global-batch", "64", "--recompute", "selective", "--recompute-modules", "mlp")
    assert p.returncode == 2 and "has no such module (every layer's FFN is experts: moe or moe_act)" in p.stderr
