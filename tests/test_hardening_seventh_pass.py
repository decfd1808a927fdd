"""Bad input found by a fuzzing pass over the newest what-if surfaces (session 36): options that would change
nothing are refused rather than silently dropped, `--set` is held to --gpus, a search refuses what it cannot
price, scenario sections must be tables, a sweep of nothing but failures fails, a .et set with a gap warns."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.test_hardening_sixth_pass import one_line_error
from tests.test_hardening_third_pass import cli

ROOT = Path(__file__).resolve().parents[1]
DENSE = ("whatif", "parallelism", "--model", "llama3-8b", "--gpus", 8, "--seq-len", 4096, "--global-batch", 64)
MOE = ("whatif", "parallelism", "--model", "qwen3-30b-a3b", "--gpus", 16, "--seq-len", 4096, "--global-batch", 128,
       "--ep", 8)


def test_a_capacity_factor_past_experts_over_top_k_is_refused(capsys):
    """Qwen3-30B-A3B: 128 experts, top-8: at capacity factor 16 every expert can take every token; 1e308
    overflowed the capacity computation (an OverflowError traceback)."""
    one_line_error(capsys, cli(*MOE, "--moe-capacity-factor", "1e308"), "experts / top-k = 16")
    assert cli(*MOE, "--moe-capacity-factor", 16, "--json") == 0


@pytest.mark.parametrize("flags, needle", [
    (("--moe-a2a", "deepep"), "--moe-a2a needs a mixture-of-experts model"),
    (("--moe-capacity-factor", 1), "--moe-capacity-factor needs a mixture-of-experts model"),
    (("--set", "plan.moe_a2a_overlap=true"), "moe_a2a_overlap needs a mixture-of-experts model"),
    (("--set", "plan.fsdp=fsdp2"), "--fsdp fsdp2 needs --zero 3"),
    (("--set", "plan.fsdp_reduce_dtype=bf16"), "--fsdp-reduce-dtype needs --zero 3"),
    (("--lora-rank", 64), "--lora-rank needs --finetune lora"),
    (("--packed-doc-len", 512), "--packed-doc-len needs --finetune sft or lora"),
    (("--recompute", "selective", "--recompute-modules", "moe"), "--recompute-modules moe: llama3-8b has no"),
    (("--pp", 2, "--first-stage-layers", 12, "--pipeline-layout", "10,22"), "--first/--last-stage-layers beside"),
])
def test_an_option_that_would_change_nothing_is_refused(capsys, flags, needle):
    one_line_error(capsys, cli(*DENSE, *flags), needle)


def test_set_of_a_parallel_degree_is_held_to_the_gpus(capsys):
    """`--set plan.tp=2` with --gpus 8 runs TP2 x DP4 on 8 GPUs, as `--tp 2` does (it reported 16 GPUs);
    a --set dp that does not fill --gpus is refused, as --dp is."""
    import json
    assert cli(*DENSE, "--set", "plan.tp=2", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    plan = out["plan"] if "plan" in out else out["scenario"]["plan"]
    assert (plan["tp"], plan["dp"]) == (2, 4)
    one_line_error(capsys, cli(*DENSE, "--set", "plan.dp=4"), "= 4 != --gpus 8")


@pytest.mark.parametrize("flags, needle", [
    (("--finetune", "lora"), "without --finetune"),
    (("--set", "plan.finetune=sft"), "without --finetune"),
    (("--zero", 3, "--dp-shard", 2), "without --dp-shard"),
    (("--pp", 2, "--pipeline-layout", "10,22"), "without --pipeline-layout"),
])
def test_search_refuses_what_it_cannot_price(capsys, flags, needle):
    """A LoRA search ranked pre-training plans: flags the search neither enumerates nor carries are refused."""
    one_line_error(capsys, cli(*DENSE, "--search", *flags), "--search ranks layouts", needle)


@pytest.mark.parametrize("section", ["trace", "failure", "plan", "moe"])
def test_a_scenario_section_given_as_a_scalar_is_refused(tmp_path, capsys, section):
    spec = tmp_path / "s.toml"
    spec.write_text(f'whatif = "parallelism"\nmodel = "llama3-8b"\n{section} = 5\n')
    one_line_error(capsys, cli("whatif", "scenario", spec), "s.toml", f"scenario '{section}' must be a table")


def test_a_sweep_whose_every_point_fails_exits_2_and_keeps_the_errors(tmp_path, capsys):
    import pandas as pd
    spec = tmp_path / "allfail.toml"
    spec.write_text('[scenario]\nwhatif = "parallelism"\nmodel = "llama3-8b"\nhardware = "h100-sxm"\n'
                    'plan = { dp = 8, seq_len = 4096, global_batch = 64 }\n[[axes]]\ngrid = { "plan.tp" = [3, 5] }\n')
    out = tmp_path / "a.parquet"
    assert cli("sweep", spec, "-o", out, "--workers", 1) == 2
    err = capsys.readouterr().err
    assert "every one of the 2 points failed" in err and "not divisible by tp 3" in err
    assert set(pd.read_parquet(out)["status"]) == {"error"}


def test_an_et_set_with_a_gap_warns_and_a_directory_rank_is_refused(tmp_path, capsys):
    from chakra_schema.graph import GraphBuilder, NodeType, OpKind, ResourceKind
    from chakra_schema.graph_io import write_graph
    for r in (0, 1, 3):
        b = GraphBuilder(r, 4)
        cpu = b.resource(ResourceKind.CPU_THREAD, 0, 1)
        b.add_node("aten::work", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 0.0, 100.0)
        write_graph(b.build(), tmp_path / f"job.{r}.et")
    assert cli("replay", tmp_path / "job", "--json") == 0
    assert "the set has 4 ranks; 1 of them is missing (rank 2)" in capsys.readouterr().err
    (tmp_path / "job.2.et").mkdir()
    one_line_error(capsys, cli("replay", tmp_path / "job"), "job.2.et", "is not a file")
    shutil.rmtree(tmp_path / "job.2.et")


def test_lora_flops_leave_out_the_frozen_weight_gradients():
    """LoRA's FLOPs were counted as pre-training's (MFU 67% on an 8B LoRA run): as executed, the frozen matmuls
    run forward and data-gradient only, 4 x params per token, not 6 x; the model FLOPs reproduce Megatron-Bridge's
    published 26.06 LoRA row (735 TFLOP/s at 2,643 tokens/s per GPU, tests/published/heldout_h100.csv)."""
    from estimators.model_config import load_model
    from estimators.parallelism.evaluate import hw_flops_per_step, model_flops_per_step
    from lumos_sim.published_training import read_rows, row_scenario
    m = load_model("llama3-8b")
    from estimators.parallelism.plan import ParallelPlan
    pre = ParallelPlan(dp=8, seq_len=4096, global_batch=64)
    lora = pre.with_(finetune="lora")
    tokens = 64 * 4096
    assert hw_flops_per_step(m, pre) - hw_flops_per_step(m, lora) == pytest.approx(
        tokens * 2.0 * m.matmul_params_active())
    row = [r for r in read_rows(ROOT / "tests" / "published" / "heldout_h100.csv") if "LoRA" in r.release][0]
    model, plan = row_scenario(row)
    per_token = model_flops_per_step(model, plan) / (plan.global_batch * plan.seq_len)
    assert per_token == pytest.approx(row.tflops * 1e12 / row.tokens_per_gpu, rel=0.005)


def test_lora_adapters_take_their_memory_and_their_rank_is_bounded(capsys):
    """Rank-4096 adapters on Llama 3 8B's qkv (4096 -> 4096 + 2 x 1024): 4096 x (4096 + 6144) per layer x 32
    layers = 1.34 B trainable parameters: their bf16 weights, fp32 gradients (ZeRO-1: not sharded) and 12 bytes
    of optimizer state sharded over 8 ranks; at rank 16 they were left out, so any rank read the same memory."""
    from estimators.model_config import load_model
    from estimators.parallelism.memory import estimate_memory
    from estimators.parallelism.plan import ParallelPlan
    m = load_model("llama3-8b")
    base = ParallelPlan(dp=8, seq_len=4096, global_batch=64, finetune="lora")
    big = base.with_(lora_rank=4096)
    adapters = 4096 * (4096 + 4096 + 2 * 1024) * 32
    small, large = estimate_memory(m, base), estimate_memory(m, big)
    gib = 1 << 30
    assert (large.weights_gib - small.weights_gib) * gib == pytest.approx(adapters * 2 * (1 - 16 / 4096), rel=1e-6)
    assert large.grads_gib * gib == pytest.approx(adapters * 4, rel=1e-6)
    assert large.optimizer_gib * gib == pytest.approx(adapters * 12 / 8, rel=1e-6)
    one_line_error(capsys, cli(*DENSE, "--finetune", "lora", "--lora-rank", 100000), "more than the hidden size 4096")


SPEC_BASE = ('[scenario]\nwhatif = "parallelism"\nmodel = "llama3-8b"\nhardware = "h100-sxm"\n'
             'plan = { dp = 8, seq_len = 4096, global_batch = 64 }\n')


def test_a_sweep_key_on_two_axes_is_refused(tmp_path, capsys):
    """zero = [1, 3] then zero = [0, 2]: the second axis overwrote the first (labels 'zero=1, zero=0' ran 0)."""
    spec = tmp_path / "dup.toml"
    spec.write_text(SPEC_BASE + '[[axes]]\ngrid = { "plan.zero" = [1, 3] }\n'
                    '[[axes]]\ngrid = { "plan.zero" = [0, 2] }\n')
    one_line_error(capsys, cli("sweep", spec, "-o", tmp_path / "d.parquet"), "'plan.zero' is on axis 0 and axis 1")
    assert not (tmp_path / "d.parquet").exists()


def test_whatif_scenario_refuses_a_sweep_spec(tmp_path, capsys):
    """A spec with axes evaluated its base alone, which read as the sweep's answer."""
    spec = tmp_path / "sweep.toml"
    spec.write_text(SPEC_BASE + '[[axes]]\ngrid = { "plan.zero" = [1, 3] }\n')
    one_line_error(capsys, cli("whatif", "scenario", spec), "sweep.toml", "is a sweep spec")


def test_a_zero_parallel_degree_is_named(capsys):
    one_line_error(capsys, cli(*DENSE, "--pp", 0), "--pp must be >= 1, got 0")


def search_sweep(tmp_path, plan: str = "", axes: str = "", search: str = "gpus = [8], max_plans = 2",
                 name: str = "s.toml") -> int:
    """Run a Llama 3 8B sweep whose last axis is a search (`plan`: extra plan fields, `axes`: axes before
    it); the exit code."""
    spec = tmp_path / name
    spec.write_text('[scenario]\nwhatif = "parallelism"\nmodel = "llama3-8b"\nhardware = "h100-sxm"\n'
                    f'plan = {{ seq_len = 4096, global_batch = 64{plan} }}\n{axes}'
                    f'[[axes]]\nsearch = {{ {search} }}\n')
    return cli("sweep", spec, "-o", tmp_path / "s.parquet", "--workers", 1)


def test_a_sweep_search_axis_refuses_what_it_cannot_hold(tmp_path, capsys):
    """A LoRA scenario with a search axis gave points with finetune = none, as the CLI's --search did."""
    assert search_sweep(tmp_path, plan=', finetune = "lora"') == 2
    assert "a search axis ranks layouts without the scenario's --finetune" in capsys.readouterr().err
