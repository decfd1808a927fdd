"""The what-if spine: a frozen Scenario with dotted overrides, one Prediction/Breakdown for every
what-if, and a registry that `evaluate` dispatches through (CLI what-ifs included)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from chakra_schema.errors import TraceInputError
from estimators.prediction import Prediction
from estimators.scenario import Scenario, TraceSpec
from estimators.registry import evaluate, register_whatif, whatifs
from replay.results import Breakdown

from conftest import DATA, ROOT

PLAN = {"tp": 2, "dp": 4, "seq_len": 4096, "global_batch": 32}


@pytest.fixture(scope="module")
def base() -> Scenario:
    return Scenario.build(model="llama3-8b", hardware="h100-sxm", plan=PLAN)


def test_dotted_overrides_reach_nested_fields_and_parse_strings_by_field_type(base):
    s = base.override_strings(["hardware.network.nic_gbps=800", "plan.tp=4", "plan.sequence_parallel=false",
                               "model.layers=16", "hardware.gpu.peak_tflops.bf16=1000"])
    assert s.hardware.network.nic_gbps == 800.0 and isinstance(s.hardware.network.nic_gbps, float)
    assert s.plan.tp == 4 and isinstance(s.plan.tp, int)
    assert s.plan.sequence_parallel is False
    assert s.model.layers == 16
    assert s.hardware.gpu.peak_tflops["bf16"] == 1000.0
    # the original is untouched (frozen values)
    assert base.plan.tp == 2 and base.hardware.network.nic_gbps != 800


def test_plan_gpus_override_sets_the_data_parallel_degree(base):
    s = base.override({"plan.gpus": 64})
    assert s.plan.dp == 64 // (2 * 1 * 1) and s.plan.gpus == 64
    with pytest.raises(TraceInputError, match="multiple of tp"):
        base.override({"plan.gpus": 63})


def test_whole_model_and_hardware_swap_by_name(base):
    s = base.override_strings(["hardware=h200", "model=llama3-70b"])
    assert s.hardware.name == "h200" and s.model.name.lower().startswith("llama")
    assert s.model.layers == 80


@pytest.mark.parametrize("assignment,message", [
    ("plan.tpp=2", "did you mean 'plan.tp'"),
    ("plan.tp=four", "plan.tp: expected int"),
    ("hardware.network.nic_gbs=1", "did you mean 'hardware.network.nic_gbps'"),
    ("plan", "KEY=VALUE"),
    ("whatiff=x", "unknown scenario key"),
])
def test_bad_overrides_are_one_line_errors_naming_the_key(base, assignment, message):
    with pytest.raises(TraceInputError, match=message) as e:
        base.override_strings([assignment])
    assert "\n" not in str(e.value)


def test_key_is_a_content_hash_that_follows_values_not_names(base):
    assert base.key() == Scenario.build(model="llama3-8b", hardware="h100-sxm", plan=PLAN).key()
    assert base.key() != base.override({"hardware.network.nic_efficiency": 0.5}).key()
    assert base.key() != base.override({"plan.micro_batch": 2}).key()


def test_flatten_gives_one_scalar_column_per_input_field(base):
    row = base.flatten()
    for col in ("whatif", "plan.tp", "plan.gpus", "plan.precision", "hardware.name", "hardware.network.nic_gbps",
                "hardware.gpu.peak_tflops.bf16", "model.layers", "timing"):
        assert col in row, col
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in row.values())
    assert row["plan.gpus"] == 8


def test_from_dict_reads_tables_and_dotted_keys():
    s = Scenario.from_dict({"whatif": "parallelism", "model": "llama3-8b", "hardware": "h100-sxm",
                            "plan": PLAN, "plan.micro_batch": 2})
    assert s.plan.micro_batch == 2 and s.plan.tp == 2
    with pytest.raises(TraceInputError, match="spec.toml.*unknown scenario key"):
        Scenario.from_dict({"modle": "x"}, path="spec.toml")


def test_trace_spec_takes_a_lone_path_as_one_input():
    assert TraceSpec(inputs="a/b.et").inputs == ("a/b.et",)
    with pytest.raises(TraceInputError, match="trace.dp"):
        TraceSpec(inputs=("x",), dp=0)


def test_evaluate_dispatches_parallelism_and_returns_the_common_prediction(base):
    p = evaluate(base)
    assert isinstance(p, Prediction) and isinstance(p.breakdown, Breakdown)
    assert p.whatif == "parallelism" and p.scenario_key == base.key()
    assert p.step_time_s > 0 and p.tokens_per_s == pytest.approx(32 * 4096 / p.step_time_s)
    assert p.breakdown.window_us == pytest.approx(p.step_time_s * 1e6, rel=1e-6)
    assert p.breakdown.compute_us + p.breakdown.exposed_comm_us + p.breakdown.idle_us == \
        pytest.approx(p.breakdown.window_us, rel=1e-6)
    row = p.to_row()
    assert row["breakdown.compute_us"] == p.breakdown.compute_us and "metrics.memory_weights_gib" in row


def test_a_faster_network_never_slows_a_plan_down(base):
    slow = evaluate(base.override({"hardware.network.nic_gbps": 100})).step_time_s
    fast = evaluate(base.override({"hardware.network.nic_gbps": 800})).step_time_s
    assert fast <= slow


def test_replay_and_estimators_share_one_breakdown_type():
    s = Scenario(whatif="replay", timing="trace",
                 trace=TraceSpec(inputs=(str(DATA / "cpu_ddp" / "device.{rank}.json.gz"),),
                                 et=str(DATA / "cpu_ddp" / "host.{rank}.json.gz")))
    p = evaluate(s)
    assert isinstance(p.breakdown, Breakdown) and p.breakdown.window_us > 0
    assert p.metrics["ranks"] == 2 and p.metrics["mean_abs_step_error"] < 0.03


def test_a_new_whatif_is_one_decorated_function():
    @register_whatif("test-constant", needs=("model",))
    def constant(scenario, progress=None):
        return Prediction(whatif="", scenario_key="", step_time_s=float(scenario.model.layers))

    assert "test-constant" in whatifs()
    s = Scenario.build(whatif="test-constant", model="llama3-8b")
    assert evaluate(s).step_time_s == 32.0
    with pytest.raises(TraceInputError, match="needs 'model'"):
        evaluate(Scenario(whatif="test-constant"))
    with pytest.raises(TraceInputError, match="unknown what-if"):
        evaluate(Scenario(whatif="no-such-whatif"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lumos_sim", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_whatif_set_flows_into_the_evaluated_scenario():
    common = ["whatif", "parallelism", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--seq-len", "4096",
              "--global-batch", "32", "--json"]
    a = _cli(*common)
    b = _cli(*common, "--set", "plan.gpus=16")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["plan"]["dp"] == 4 and jb["plan"]["dp"] == 8 and jb["gpus"] == 16
    # old JSON keys are kept
    for k in ("step_time_s", "tokens_per_s", "mfu", "memory_gib_per_gpu", "oom"):
        assert k in ja
    assert "exposed_comm_by_kind_s" in ja["breakdown"] and "pipeline_bubble_s" in ja["breakdown"]
    bad = _cli(*common, "--set", "plan.tp=x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "plan.tp" in bad.stderr


def test_scenario_is_frozen(base):
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.timing = "trace"  # type: ignore[misc]


def test_whatif_scenario_json_says_what_was_asked(tmp_path, capsys):
    """`whatif scenario --json` carries the question beside the answer: the what-if, the model and hardware
    names and every plan field as evaluated (it had the figures only)."""
    import json

    from lumos_sim.cli import main
    f = tmp_path / "s.toml"
    f.write_text('[scenario]\nwhatif = "parallelism"\nmodel = "llama3-8b"\nhardware = "h200"\n'
                 'plan = { dp = 8, seq_len = 2048, global_batch = 16, recompute = "op", zero = 3, fsdp = "fsdp2" }\n')
    assert main(["whatif", "scenario", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    asked = out["scenario"]
    assert (asked["whatif"], asked["model"], asked["hardware"]) == ("parallelism", "llama3-8b", "h200")
    assert (asked["plan"]["recompute"], asked["plan"]["fsdp"], asked["plan"]["dp"]) == ("op", "fsdp2", 8)
    assert out["step_time_s"] > 0
