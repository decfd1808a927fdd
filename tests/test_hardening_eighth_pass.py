"""Bad input found by the fuzzing passes of sessions 36-37: work a typo would stretch to hours is refused
up front with the flag named."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_hardening_sixth_pass import one_line_error
from tests.test_hardening_seventh_pass import search_sweep
from tests.test_hardening_third_pass import cli

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ("whatif", "parallelism", "--model", "llama3-8b", "--gpus", 16, "--seq-len", 4096, "--global-batch", 64,
          "--search")


@pytest.mark.parametrize("flag", ["--top-k", "--max-plans"])
def test_a_search_that_would_simulate_more_than_a_thousand_plans_is_refused(capsys, flag):
    """Each plan --top-k names is a full estimate (~0.1 s): 100,000 ran for hours before it was capped."""
    one_line_error(capsys, cli(*SEARCH, flag, 100_000), "--top-k (--max-plans) must be between 1 and 1,000",
                   "got 100000")


def test_a_sweep_search_axis_of_more_than_a_thousand_plans_is_refused(tmp_path, capsys):
    assert search_sweep(tmp_path, search="gpus = [16], max_plans = 5000", name="big.toml") == 2
    err = capsys.readouterr().err
    assert "big.toml" in err and "search.max_plans must be an integer in [1, 1,000]" in err and "5000" in err
    assert not (tmp_path / "s.parquet").exists()


def test_a_vanishing_failure_rate_prints_its_mean_time_to_failure_in_a_few_digits(capsys):
    """1e-300 failures per 1,000 node-days over 2,048 nodes: MTTF = 1e3 / (1e-300 x 2,048) days
    = 7.03e302 min, printed as such (it was 300 digits of fixed point that broke the table)."""
    assert cli("whatif", "failures", "--gpus", 16384, "--failure-rate", "1e-300") == 0
    out = capsys.readouterr().out
    mttf_min = 1e3 / (1e-300 * 2048) * 24 * 60
    assert f"{mttf_min:.3g} min" in out and "7.03e+302 min" in out
    assert max(len(line) for line in out.splitlines()) <= 120


def test_an_interval_shorter_than_an_asynchronous_write_is_named_when_it_is_raised(capsys):
    import json
    assert cli("whatif", "failures", "--gpus", 16384, "--checkpoint-async", "--checkpoint-write-min", 1000,
               "--checkpoint-interval-min", 10, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoint_interval_min"] == pytest.approx(1000.0)
    assert any("checkpoint interval 10 min is shorter than the asynchronous write (1000 min)" in n
               for n in out["notes"])


def test_a_horizon_shorter_than_a_stall_agrees_with_the_monte_carlo(capsys):
    """A 1e-9-day horizon (86 us): no failure lands in it, so both estimators give ETTR 1 (the closed form
    used the stationary stalled fraction and said 0.95)."""
    import json
    assert cli("whatif", "failures", "--gpus", 16384, "--horizon-days", "1e-9", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ettr"] == pytest.approx(1.0, abs=1e-6) and out["ettr_mc"] == pytest.approx(1.0, abs=1e-6)


def test_ranks_that_number_their_steps_differently_are_paired_step_by_step(tmp_path):
    """Rank 1 of the balanced 4-rank DDP set renumbered ProfilerStep#2-4 -> #12-14 (its profiler began at
    another iteration): the job still has three steps of four ranks, with the measured job step time of the
    set as recorded, and a note says how they were paired (it reported six job steps, three of one rank)."""
    import gzip
    import shutil

    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    src = ROOT / "tests" / "data" / "ddp4" / "balanced"
    for r in range(4):
        shutil.copy(src / f"device.{r}.json.gz", tmp_path / f"device.{r}.json.gz")
    text = gzip.decompress((src / "device.1.json.gz").read_bytes()).decode()
    for k in (4, 3, 2):
        text = text.replace(f"ProfilerStep#{k}", f"ProfilerStep#{k + 10}")
    (tmp_path / "device.1.json.gz").write_bytes(gzip.compress(text.encode()))

    def replayed(folder):
        return run_replay(load_graphs([], kineto_pattern=str(folder / "device.{rank}.json.gz")), mode="trace")
    original, renamed = replayed(src), replayed(tmp_path)
    assert [(j.name, j.ranks) for j in renamed.job_steps] == [(f"ProfilerStep#{k}", 4) for k in (2, 3, 4)]
    assert renamed.measured_job_step_time_us == pytest.approx(original.measured_job_step_time_us, rel=1e-9)
    assert "rank 1: ProfilerStep#12..ProfilerStep#14" in renamed.step_pairing_note
    assert original.step_pairing_note is None


def test_overlapping_profiler_steps_are_named_in_a_warning(tmp_path, caplog):
    """A trace whose ProfilerStep#2 is stretched 5x into #3 (an edited or merged trace): both steps' measured
    times would count the overlap; a warning names the two steps. The recorded set warns of nothing."""
    import gzip
    import json
    import logging

    from chakra_schema.inputs import load_graphs
    src = ROOT / "tests" / "data" / "ddp4" / "balanced" / "device.0.json.gz"
    trace = json.loads(gzip.decompress(src.read_bytes()))
    with caplog.at_level(logging.WARNING):
        load_graphs([str(src)])
    assert "overlapping steps" not in caplog.text
    for e in trace["traceEvents"]:
        if e.get("name") == "ProfilerStep#2" and e.get("cat") == "user_annotation":
            e["dur"] *= 5
    path = tmp_path / "stretched.0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    with caplog.at_level(logging.WARNING):
        load_graphs([str(path)])
    assert "stretched.0.json.gz: ProfilerStep#3 begins" in caplog.text and "before ProfilerStep#2 ends" in caplog.text


def _graph_launch_trace(starts_us: list[float], dur_us: float) -> dict:
    """One ProfilerStep whose cudaGraphLaunch replays kernels on one stream at the given start times; the
    host then waits for them (cudaDeviceSynchronize), and the step ends just after."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0,
               "dur": starts_us[-1] + dur_us + 2.0, "args": {"External id": 1}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 1.0,
               "dur": 5.0, "args": {"correlation": 100}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1, "ts": 7.0,
               "dur": starts_us[-1] + dur_us + 1.0 - 7.0, "args": {"correlation": 101}}]
    for k, t in enumerate(starts_us):
        events.append({"ph": "X", "cat": "kernel", "name": f"kernel_{k}", "pid": 0, "tid": 7, "ts": t, "dur": dur_us,
                       "args": {"device": 0, "stream": 7, "correlation": 100, "grid": [1, 1, 1], "block": [128, 1, 1]}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA B200", "numSms": 148}],
            "traceEvents": events}


def test_kernels_recorded_under_their_predecessors_tail_replay_as_recorded(tmp_path):
    """Programmatic dependent launch (Blackwell CUDA graphs): each 10 us kernel starts 3 us before the one
    before it ends, so 20 kernels span 20 x 10 - 19 x 3 = 143 us; served strictly in stream order they took
    200 us (the sglang B300 decode traces: +4.9% and +9.3% in trace timing, 0.0% now)."""
    import gzip
    import json

    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    starts = [20.0 + 7.0 * k for k in range(20)]
    path = tmp_path / "pdl.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_graph_launch_trace(starts, 10.0)).encode()))
    g = load_graphs([str(path)])[0]
    kernels = [i for i in range(len(g)) if g.name[i].startswith("kernel_")]
    result = run_replay([g], mode="trace")
    span = 20 * 10.0 - 19 * 3.0
    assert len(kernels) == 20
    assert result.steps[0].measured_us == pytest.approx(starts[0] + span + 2.0, abs=1e-6)
    assert result.steps[0].predicted_us == pytest.approx(result.steps[0].measured_us, abs=1e-6)


def test_a_bare_event_list_kineto_trace_is_read_as_a_positional_input(tmp_path):
    """The 2020-era Kineto format (a JSON list of events, pytorch/kineto's tb_plugin samples) was read by
    --kineto but refused as a positional input ("not a Kineto or Execution Trace JSON")."""
    import gzip
    import json

    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    src = ROOT / "tests" / "data" / "ddp4" / "balanced" / "device.0.json.gz"
    events = json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
    path = tmp_path / "old.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(events).encode()))
    positional = run_replay(load_graphs([str(path)]), mode="trace")
    flagged = run_replay(load_graphs([], kineto_pattern=str(path)), mode="trace")
    assert [s.measured_us for s in positional.steps] == [s.measured_us for s in flagged.steps]
    assert len(positional.steps) == 3


DENSE = ("whatif", "parallelism", "--model", "llama3-8b", "--gpus", 8, "--seq-len", 4096, "--global-batch", 64)


@pytest.mark.parametrize("flags, needle", [
    (("--pp", 4, "--first-stage-layers", 16, "--last-stage-layers", 16),
     "--first/--last-stage-layers: only the first and the last pipeline chunk may hold no transformer layer"),
    (("--finetune", "sft", "--packed-doc-len", 100000), "--packed-doc-len 100000 is longer than --seq-len 4096"),
    (("--finetune", "lora", "--set", "plan.lora_modules=foo"), "lora_modules: foo"),
    (("--set", 'plan.lora_modules=["fc1"]'), "lora_modules needs --finetune lora"),
    (("--tp-comm-overlap",), "--tp-comm-overlap needs --tp > 1"),
    (("--recompute", "full", "--recompute-layers", 33), "--recompute-layers 33 is more than the 32 layers"),
])
def test_a_plan_that_would_crash_or_change_nothing_is_refused(capsys, flags, needle):
    """Empty middle chunks crashed the pipeline schedule (KeyError); a document longer than the sequence
    doubled MFU without changing the step; the others were accepted and ignored."""
    one_line_error(capsys, cli(*DENSE, *flags), needle)


def test_a_search_sized_by_set_plan_gpus_ranks_plans_of_that_many_gpus(capsys):
    import json
    assert cli(*DENSE, "--set", "plan.gpus=16", "--search", "--top-k", 1, "--json") == 0
    best = json.loads(capsys.readouterr().out)[0]
    assert best["plan"]["tp"] * best["plan"]["pp"] * best["plan"]["cp"] * best["plan"]["dp"] == 16


@pytest.mark.parametrize("axis", ['grid = { "plan.gpus" = [16, 32] }', 'grid = { "plan.tp" = [2, 4] }'])
def test_a_layout_axis_beside_a_search_axis_is_refused(tmp_path, capsys, axis):
    """The search chooses the layout: a plan.gpus grid left every point at 8 GPUs under 16/32-GPU labels, a
    plan.tp grid turned the 8-GPU plans into 16- and 32-GPU ones."""
    assert search_sweep(tmp_path, axes=f"[[axes]]\n{axis}\n") == 2
    assert "beside the search axis 1, which chooses the layout" in capsys.readouterr().err


def test_causal_score_pairs_of_windows_and_packed_documents():
    """s^2 / 2 pairs; a 128-key window over 32K tokens: 128 x 129 / 2 + (32768 - 128) x 128; eight packed
    512-token documents in 4,096: 8 x 512^2 / 2; a window as long as the sequence changes nothing."""
    from estimators.model_config import causal_pairs
    assert causal_pairs(4096) == 4096 ** 2 / 2
    assert causal_pairs(32768, window=128) == 128 * 129 / 2 + (32768 - 128) * 128
    assert causal_pairs(4096, doc=512) == 8 * 512 ** 2 / 2
    assert causal_pairs(4096, window=4096) == causal_pairs(4096, window=4095) == 4096 ** 2 / 2


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("case", ["window", "packed"])
def test_context_parallel_ranks_share_the_windowed_or_packed_attention(cp, case):
    """Ring attention over CP ranks did the whole causal square whatever the window or the documents (a
    128-token-window model took as long as a full-attention one at CP 2): each rank now does 1 / cp of the
    attention FLOPs of the unsplit sequence."""
    import dataclasses

    from estimators.model_config import load_model
    from estimators.parallelism.plan import ParallelPlan
    from estimators.parallelism.workload import generate
    base = load_model("llama3-8b")
    model = dataclasses.replace(base, name="win", sliding_window=128) if case == "window" else base
    extra = dict(finetune="sft", packed_doc_len=512) if case == "packed" else {}

    def attention_flops(c):     # one rank's, of one 32K sequence split over c ranks
        plan = ParallelPlan(cp=c, dp=1, seq_len=32768, global_batch=1, recompute="none", **extra)
        g = generate(model, plan, "symmetric")[0]
        return sum(a["flops"] for a in g.attrs.values() if a.get("op") == "attention")
    assert attention_flops(cp) == pytest.approx(attention_flops(1) / cp, rel=0.02)


@pytest.mark.parametrize("padding, dilation", [(10 ** 200, 1), (10 ** 6, 1), (1, -100)])
def test_convolution_arguments_no_kernel_has_leave_the_kernel_its_recorded_time(padding, dilation):
    """A 201-digit padding overflowed float arithmetic (a traceback); a padding of 1e6 made a 7-hour step and
    a negative dilation a 21x slower kernel: no geometry is read from them."""
    from replay.hardware.conv_args import conv_geometry
    shapes = [[8, 64, 56, 56], [64, 64, 3, 3], []]
    values = ["", "", "", "[1, 1]", f"[{padding}, {padding}]", f"[{dilation}, {dilation}]", "1"]
    assert conv_geometry("aten::conv2d", shapes, values) is None
    assert conv_geometry("aten::conv2d", shapes, ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]) is not None


def test_hardware_flops_count_a_sliding_window_layer_over_its_window():
    """Hardware FLOPs count attention over the full square of the keys a query can read: a 128-token window
    over a 32K sequence is 2 x 128 keys x heads x (d_qk + d_v) per token and layer, not 2 x 32768 (which put
    the hardware FLOP/s of such a model above an H100's peak)."""
    import dataclasses

    from estimators.model_config import load_model
    base = load_model("llama3-8b")
    win = dataclasses.replace(base, name="win", sliding_window=128)
    qk, v = base.attn_score_dims
    assert win.attention_flops_fwd_per_token(32768) == 2.0 * 128 * base.heads * (qk + v) * base.layers
    assert base.attention_flops_fwd_per_token(32768) == 2.0 * 32768 * base.heads * (qk + v) * base.layers


def test_hardware_flops_count_the_mtp_modules_the_step_runs():
    """Each MTP module is a layer of the last layer's kind, a 2h -> h projection and another pass through the
    output head, forward and backward: hardware FLOPs grow by 6 x those matmuls per token (they fell below
    the model FLOPs, which counted them)."""
    import dataclasses

    from estimators.model_config import load_model
    from estimators.parallelism.evaluate import hw_flops_per_step, model_flops_per_step
    from estimators.parallelism.plan import ParallelPlan
    m = load_model("deepseek-v3")
    plan = ParallelPlan(dp=64, ep=8, seq_len=1024, global_batch=64)
    m0 = dataclasses.replace(m, mtp_layers=0)
    h, tokens = m.hidden, 64 * 1024
    layer = m.attn_matmul_params() + m.ffn_matmul_params_active(m.layers - 1)
    attention = m0.attention_flops_fwd_per_token(1024) / m.layers       # one layer's, forward
    extra = tokens * (6.0 * (layer + 2 * h * h + m.vocab * h) + 3.0 * attention)
    assert hw_flops_per_step(m, plan) - hw_flops_per_step(m0, plan) == pytest.approx(extra, rel=1e-9)
    assert hw_flops_per_step(m, plan) >= model_flops_per_step(m, plan)


def test_a_gemm_benchmark_in_a_precision_the_gpu_lacks_is_refused(capsys):
    one_line_error(capsys, cli("bench", "gemm", "--m", 1024, "--n", 1024, "--k", 1024, "--dtype", "fp8",
                               "--hardware", "v100-sxm2"), "--dtype fp8: v100-sxm2", "has no fp8 tensor cores")


def test_synthetic_routing_clusters_default_to_a_divisor_of_the_experts():
    """Qwen1.5-MoE's 60 experts: experts / 8 = 7 clusters does not divide them (the default failed with
    'clusters must divide experts', an option never given); 6 does. 256 experts keep 32."""
    from estimators.moe.synthetic import SyntheticSpec
    assert SyntheticSpec(tokens=64, layers=2, experts=60, top_k=4).clusters == 6
    assert SyntheticSpec(tokens=64, layers=2, experts=256, top_k=8).clusters == 32


def test_a_window_no_shorter_than_the_sequence_counts_as_full_attention():
    import dataclasses

    from estimators.model_config import load_model, megatron_flops_per_token
    base = load_model("llama3-8b")
    wide = dataclasses.replace(base, name="wide", sliding_window=10 ** 9)
    assert megatron_flops_per_token(wide, 4096) == megatron_flops_per_token(base, 4096)


@pytest.mark.parametrize("flag, value", [("--pipeline-layout", "16,,16"), ("--recompute-modules", "core_attn,")])
def test_a_list_flag_with_an_empty_item_is_refused(capsys, flag, value):
    extra = ("--pp", 2) if flag == "--pipeline-layout" else ("--recompute", "selective")
    assert cli(*DENSE, *extra, flag, value) == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_a_sweep_spec_reads_a_relative_model_file_from_its_folder(tmp_path, capsys, monkeypatch):
    """Trace and routing paths were relative to the spec's folder but a model file to the working folder,
    and the error did not name the model file."""
    import shutil
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "hf_configs" / "llama3-8b.json", spec_dir / "l8b.json")
    body = ('[scenario]\nwhatif = "parallelism"\nhardware = "h100-sxm"\nmodel = "{model}"\n'
            'plan = {{ dp = 8, seq_len = 4096, global_batch = 64 }}\n')
    (spec_dir / "ok.toml").write_text(body.format(model="l8b.json"))
    (spec_dir / "missing.toml").write_text(body.format(model="nope.json"))
    monkeypatch.chdir(tmp_path)
    assert cli("sweep", spec_dir / "ok.toml", "-o", tmp_path / "ok.parquet", "--workers", 1) == 0
    one_line_error(capsys, cli("sweep", spec_dir / "missing.toml", "-o", tmp_path / "m.parquet", "--workers", 1),
                   "missing.toml:", str(spec_dir / "nope.json"), "config.json not found")


def test_a_json_file_given_as_a_toml_spec_is_named_as_json(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text('{"scenario": {"whatif": "parallelism"}}')
    one_line_error(capsys, cli("sweep", spec, "-o", tmp_path / "s.parquet"), "not a valid TOML file",
                   "looks like JSON")


@pytest.mark.parametrize("op, shapes, types, moved", [
    # index_put_(self [4097, 40964] int32, indices, values [16], accumulate): 16 values read and written
    ("aten::_index_put_impl_", [[4097, 40964], [], [16], [], []], ["int", "", "int", "Scalar", "Scalar"],
     2 * 16 * 4),
    # gather(self [8, 50000] fp32, dim, index [8, 5]): the output has the index's shape
    ("aten::gather", [[8, 50000], [], [8, 5]], ["float", "", "long int"], 2 * 8 * 5 * 4 + 8 * 5 * 8),
    # index_select(self [50000, 4096] bf16, dim, index [2048]): 2,048 rows of 4,096
    ("aten::index_select", [[50000, 4096], [], [2048]], ["c10::BFloat16", "", "long int"],
     2 * 2048 * 4096 * 2 + 2048 * 8),
    # scatter_add_(self [1000, 64] fp32, dim, index [10, 64], src [10, 64])
    ("aten::scatter_add_", [[1000, 64], [], [10, 64], [10, 64]], ["float", "", "long int", "float"],
     2 * 640 * 4 + 640 * 8),
])
def test_gathers_and_scatters_move_the_selected_rows_not_the_tensor(op, shapes, types, moved):
    """A 16-row index_put_ into a 672 MB table was charged the table (27x the kernel's time on a B300)."""
    from replay.hardware.compute import ComputeModel, estimate_from_shapes
    est = estimate_from_shapes(ComputeModel("h100-sxm-roofline"), "index_elementwise_kernel", op, shapes, types)
    assert est.bytes == moved


@pytest.mark.parametrize("kernel, padding", [(1, 1), (3, 3), (7, 3)])
def test_legal_convolution_padding_is_read(kernel, padding):
    """Padding wider than the dilated kernel is legal (1x1 with padding 1: a border of zeros-only outputs)."""
    from replay.hardware.conv_args import conv_geometry
    shapes = [[8, 64, 56, 56], [64, 64, kernel, kernel], []]
    geo = conv_geometry("aten::conv2d", shapes, ["", "", "", "[1, 1]", f"[{padding}, {padding}]", "[1, 1]", "1"])
    assert geo is not None and geo.out_spatial == (56 + 2 * padding - kernel + 1) ** 2


def test_ranks_whose_step_names_are_shifted_over_the_same_iterations_pair_by_recorded_time(tmp_path):
    """Rank 1 names the iterations the others call #2-4 as #3-5 (same recorded spans): pairing by name made
    each job step span two iterations (its measured time near twice the step); the k-th steps overlap in
    time, so they pair by order, with a note, and the job step is measured as the unrenamed trace's."""
    import gzip

    from chakra_schema.inputs import load_graphs
    from lumos_sim.replay_run import run_replay
    src = ROOT / "tests" / "data" / "ddp4" / "balanced"
    for r in range(4):
        text = gzip.decompress((src / f"device.{r}.json.gz").read_bytes()).decode()
        if r == 1:
            for k in (4, 3, 2):
                text = text.replace(f"ProfilerStep#{k}", f"ProfilerStep#{k + 1}")
        (tmp_path / f"device.{r}.json.gz").write_bytes(gzip.compress(text.encode()))
    result = run_replay(load_graphs([], kineto_pattern=str(tmp_path / "device.{rank}.json.gz")), mode="trace")
    original = run_replay(load_graphs([], kineto_pattern=str(src / "device.{rank}.json.gz")), mode="trace")
    assert "do not overlap in recorded time" in result.step_pairing_note
    assert [(j.name, j.ranks) for j in result.job_steps] == [(f"ProfilerStep#{k}", 4) for k in (2, 3, 4)]
    assert result.measured_job_step_time_us == pytest.approx(original.measured_job_step_time_us, rel=1e-9)


def test_not_applicable_reads_as_none_only_where_a_column_may_be_none(tmp_path):
    from chakra_schema.errors import TraceInputError
    from lumos_sim.published_training import read_rows
    path = tmp_path / "rows.csv"
    path.write_text("model,gpus,tp,pp,vp,cp,gbs,seq,precision,published_tokens_per_gpu\n"
                    "LLAMA3-8B,8,1,1,n/a,n/a,128,8192,FP8,14000\n")
    assert (read_rows(path)[0].vp, read_rows(path)[0].cp) == (1, 1)
    path.write_text("model,gpus,tp,pp,vp,gbs,seq,precision,published_tokens_per_gpu\n"
                    "LLAMA3-8B,n/a,1,1,1,128,8192,FP8,14000\n")
    with pytest.raises(TraceInputError, match="gpus 'n/a' is not a whole number"):
        read_rows(path)
