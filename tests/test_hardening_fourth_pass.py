"""Regression tests for the fourth hardening pass: the newer CLI surfaces (`whatif parallelism --model
config.json` / model TOMLs, `--set`, `whatif moe`, hardware presets, NAME|PATH arguments) keep the promise
that bad input is one line naming the file or flag, exit 2, never a traceback, a hang or an overflow.
One test per defect, named after the behaviour; each failed on the code before its fix."""
from __future__ import annotations

import json
import time

import pytest

from tests.test_hardening_third_pass import cli, one_line_error

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336}
PLAN = ("--gpus", 8, "--tp", 8, "--seq-len", 4096, "--global-batch", 8)
MOE_PLAN = ("--model", "mixtral-8x7b", "--gpus", 16, "--tp", 2, "--ep", 8, "--seq-len", 4096, "--global-batch", 32)
SMALL_MOE = ("--model", "qwen3-30b-a3b", "--ep", 8, "--routing", "synthetic:tokens=2048", "--tokens", 64)


def hf_config(tmp_path, name: str, data) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# ------------------------------------------------------------------------------------- defect 1
def test_an_hf_config_with_a_non_string_architectures_entry_is_a_one_line_error(tmp_path, capsys):
    """{"architectures": [{}]} was a TypeError (unhashable dict) from the architectures lookup."""
    for i, entry in enumerate(({}, ["LlamaForCausalLM"])):
        path = hf_config(tmp_path, f"a{i}", {"architectures": [entry], "hidden_size": 1})
        one_line_error(capsys, cli("whatif", "parallelism", "--model", path, *PLAN), path, "'model_type'")


# ------------------------------------------------------------------------------------- defect 2
def test_an_integer_past_pythons_digit_limit_is_a_one_line_error_in_json_and_toml(tmp_path, capsys):
    """A 5,000-digit integer raised ValueError ("Exceeds the limit (4300 digits)") out of json / tomllib:
    not a JSONDecodeError / TOMLDecodeError, so it escaped as a traceback."""
    path = hf_config(tmp_path, "big", '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}")
    one_line_error(capsys, cli("whatif", "parallelism", "--model", path, *PLAN), path, "not valid JSON")
    toml = tmp_path / "big.toml"
    toml.write_text('name = "big"\nlayers = ' + "9" * 5000 + "\n")
    one_line_error(capsys, cli("whatif", "parallelism", "--model", toml, *PLAN), str(toml), "not a valid TOML file")


# ------------------------------------------------------------------------------------- defect 3
@pytest.mark.parametrize("field, value, needle", [
    ("num_hidden_layers", 10**5, "'layers' must be at most 4,096"),   # ran for minutes
    ("num_hidden_layers", 10**9, "'layers' must be at most 4,096"),   # MemoryError
    ("num_hidden_layers", 10**20, "'layers' must be at most 4,096"),   # OverflowError (C ssize_t)
    ("hidden_size", 10**400, "'hidden' must be at most 2,147,483,648"),   # OverflowError (int -> float)
    ("intermediate_size", 10**400, "'ffn' must be at most 2,147,483,648"),
    ("vocab_size", 10**400, "'vocab' must be at most 2,147,483,648"),
    ("head_dim", 10**400, "'head_dim' must be at most 2,147,483,648"),
], ids=["layers-1e5", "layers-1e9", "layers-1e20", "hidden-1e400", "ffn-1e400", "vocab-1e400", "head_dim-1e400"])
def test_model_sizes_past_any_real_model_are_refused_before_any_work(tmp_path, capsys, field, value, needle):
    path = hf_config(tmp_path, "huge", {**LLAMA, field: value})
    t0 = time.perf_counter()
    one_line_error(capsys, cli("whatif", "parallelism", "--model", path, *PLAN), path, needle)
    assert time.perf_counter() - t0 < 5


def test_moe_and_mtp_counts_past_any_real_model_are_refused_before_any_work(capsys):
    """--set model.mtp_layers=1e20 and model.moe.shared_experts=1e20 looped (one pass per module / shared
    expert) past any time limit."""
    t0 = time.perf_counter()
    one_line_error(capsys, cli("whatif", "parallelism", *MOE_PLAN, "--set", f"model.mtp_layers={10**20}"),
                   "'mtp_layers' must be at most 4,096")
    one_line_error(capsys, cli("whatif", "moe", *SMALL_MOE, "--set", f"model.moe.shared_experts={10**20}"),
                   "'moe.shared_experts' must be at most 1,048,576")
    assert time.perf_counter() - t0 < 10


# ------------------------------------------------------------------------------------- defect 4
@pytest.mark.parametrize("limit, needle", [(float("inf"), "finite"), (float("nan"), "finite"), (10**400, "finite")],
                         ids=["inf", "nan", "1e400"])
def test_a_gpt_oss_swiglu_limit_that_is_not_a_finite_number_is_refused(tmp_path, capsys, limit, needle):
    """swiglu_limit = inf / NaN was accepted as the GLU clamp; 1e400 (an integer) was an OverflowError."""
    cfg = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
           "num_key_value_heads": 8, "vocab_size": 201088, "intermediate_size": 2880, "num_local_experts": 32,
           "experts_per_token": 4, "swiglu_limit": limit}
    path = hf_config(tmp_path, "oss", cfg)
    one_line_error(capsys, cli("whatif", "parallelism", "--model", path, *PLAN), path, needle)
    toml = tmp_path / "m.toml"
    toml.write_text('name = "m"\nlayers = 2\nhidden = 64\nheads = 4\nffn = 128\nvocab = 100\nglu_clamp = nan\n')
    one_line_error(capsys, cli("whatif", "parallelism", "--model", toml, *PLAN[:2], "--tp", 4, *PLAN[4:]),
                   str(toml), "'glu_clamp' must be a finite number")


# ------------------------------------------------------------------------------------- defect 5
@pytest.mark.parametrize("argv", [
    ("whatif", "parallelism", "--model", "x" * 300, *PLAN),
    ("whatif", "parallelism", "--model", "llama3-8b", "--hardware", "x" * 300, *PLAN),
    ("whatif", "failures", "--failure-model", "x" * 300, "--gpus", 8),
    ("whatif", "moe", "--model", "qwen3-30b-a3b", "--routing", "x" * 300, "--ep", 8),
    ("whatif", "scenario", "x" * 300),
    ("check", "x" * 300),
    ("replay", "x" * 300),
    ("calibrate", "--hardware", "h100-sxm", "--install", "x" * 300, "x"),
], ids=["model", "hardware", "failure-model", "routing", "scenario", "check", "replay", "install"])
def test_a_name_or_path_past_the_file_name_limit_is_a_one_line_error(capsys, argv):
    """A 300-character NAME|PATH argument: pathlib's is_file / exists raise ENAMETOOLONG instead of answering
    False, and the OSError escaped every command as a traceback."""
    one_line_error(capsys, cli(*argv), "File name too long")


# ------------------------------------------------------------------------------------- defect 6
@pytest.mark.parametrize("assignment, needle", [
    ("model.moe=3", "model.moe: expected a table of MoEConfig fields"),
    ("hardware.gpu=abc", "hardware.gpu: expected a table of GPUSpec fields"),
    ("hardware.protocols=abc", "hardware.protocols"),
])
def test_set_of_a_whole_section_to_a_scalar_is_a_one_line_error(capsys, assignment, needle):
    """--set model.mla=abc / hardware.protocols=abc stored the string as the section: AttributeError later."""
    one_line_error(capsys, cli("whatif", "parallelism", *MOE_PLAN, "--set", assignment), needle)


def test_set_of_a_whole_section_to_a_table_builds_it(capsys):
    """The table forms still work: a TOML table (scenario files) or a JSON object on the command line."""
    from estimators.parallelism.plan import ParallelPlan
    from estimators.scenario import Scenario
    moe = {"num_experts": 8, "top_k": 2, "expert_ffn": 14336}
    s = Scenario.build(model="mixtral-8x7b", hardware="h100-sxm", plan=ParallelPlan(tp=2, dp=8, ep=8))
    assert s.override({"model.moe": {**moe, "top_k": 1}}).model.moe.top_k == 1
    assert s.override_strings([f"model.moe={json.dumps({**moe, 'top_k': 4})}"]).model.moe.top_k == 4
    one_line_error(capsys, cli("whatif", "parallelism", *MOE_PLAN, "--set", 'model.moe={"top_k": 2'),
                   "model.moe: expected a JSON table of MoEConfig fields")


# ------------------------------------------------------------------------------------- defect 7
def test_an_infinite_moe_capacity_factor_is_refused(capsys):
    """--moe-capacity-factor inf passed `>= 0` and overflowed in math.ceil(inf * mean tokens)."""
    one_line_error(capsys, cli("whatif", "parallelism", *MOE_PLAN, "--moe-capacity-factor", "inf"),
                   "--moe-capacity-factor must be a finite number >= 0")


# ------------------------------------------------------------------------------------- defect 8
def test_a_preset_whose_split_k_factors_leave_out_one_is_refused(capsys):
    """gemm_split_k = [4]: for a short K every split was skipped and the GEMM model's `assert best` fired."""
    one_line_error(capsys, cli("whatif", "parallelism", *MOE_PLAN, "--set", "hardware.compute.gemm_split_k=[4]"),
                   "gemm_split_k must include 1")


# ------------------------------------------------------------------------------------- defect 9
def test_gpus_per_node_past_any_nvlink_domain_is_refused(capsys):
    """hardware.node.gpus_per_node = 1e20 overflowed a C long in the network model (rank // gpus_per_node)."""
    one_line_error(capsys, cli("whatif", "parallelism", *MOE_PLAN, "--set", f"hardware.node.gpus_per_node={10**20}"),
                   "[node] gpus_per_node must be in [1, 4096]")


# ------------------------------------------------------------------------------------- defect 10
def test_moe_seed_and_coactivation_weight_are_checked_where_they_are_read(capsys):
    """A negative seed (--set moe.seed=-1, synthetic:seed=-1) was numpy's ValueError; coactivation_weight
    NaN / inf was accepted."""
    one_line_error(capsys, cli("whatif", "moe", *SMALL_MOE, "--set", "moe.seed=-1"), "moe.seed must be >= 0")
    one_line_error(capsys, cli("whatif", "moe", "--model", "qwen3-30b-a3b", "--ep", 8, "--tokens", 64,
                               "--routing", "synthetic:tokens=2048,seed=-1"), "synthetic routing: seed must be >= 0")
    for bad in ("nan", "inf"):
        one_line_error(capsys, cli("whatif", "moe", *SMALL_MOE, "--placement", "locality",
                                   "--set", f"moe.coactivation_weight={bad}"), "moe.coactivation_weight must be a finite")


# ------------------------------------------------------------------------------------- defect 11
BIG = "9" * 400   # a TOML integer: valid TOML, past the float range


@pytest.mark.parametrize("body, needle", [
    (f'[[case]]\nname = "a"\ninputs = ["x.et"]\ntolerance = {BIG}\n', "'tolerance' of case 'a' must be a finite number"),
    (f'[[case]]\nname = "a"\ninputs = ["x.et"]\nmeasured_ms = {{ s = {BIG} }}\n', "'measured_ms.s' of case 'a'"),
    (f'[suite]\nmean_tolerance = {BIG}\n[[case]]\nname = "a"\ninputs = ["x.et"]\n', "[suite] mean_tolerance"),
    (f'[[case]]\nkind = "published_training"\nname = "a"\ncsv = "x.csv"\ntolerance = {BIG}\n', "'tolerance' of case 'a'"),
], ids=["tolerance", "measured_ms", "suite-mean", "published-tolerance"])
def test_a_suite_number_past_the_float_range_is_a_one_line_error(tmp_path, capsys, body, needle):
    """float(400-digit integer) raised OverflowError out of the suite loader."""
    suite = tmp_path / "suite.toml"
    suite.write_text(body)
    one_line_error(capsys, cli("check", suite), str(suite), needle)


# ------------------------------------------------------------------------------------- defect 12
def _preset(tmp_path, old: str, new: str):
    from replay.hardware.config import PRESET_DIR
    text = (PRESET_DIR / "h100-sxm-roofline.toml").read_text()
    assert old in text
    path = tmp_path / "hw.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("key, needle", [
    ("memory_gb", "'memory_gb' in [gpu] must be a finite number"),        # OverflowError in float()
    ("sm_count", "[gpu] sm_count must be in [1, 65536]"),                 # ZeroDivisionError (waves * SMs)
    ("gemm_k_overhead", "[compute] gemm_k_overhead must be in [0, "),     # OverflowError in the GEMM model
    ("attention_block", "[compute] attention_block must be in [1, "),     # ZeroDivisionError
    ("nodes_per_leaf", "[network] nodes_per_leaf must be in [1, "),       # OverflowError in the topology
], ids=["memory_gb", "sm_count", "gemm_k_overhead", "attention_block", "nodes_per_leaf"])
def test_a_preset_number_past_any_real_gpu_is_refused(tmp_path, capsys, key, needle):
    import re
    from replay.hardware.config import PRESET_DIR
    text = (PRESET_DIR / "h100-sxm-roofline.toml").read_text()
    old = re.search(rf"^{key} = [0-9.]+$", text, re.M).group(0)
    path = _preset(tmp_path, old, f"{key} = {BIG}")
    one_line_error(capsys, cli("whatif", "parallelism", "--model", "llama3-8b", "--hardware", path, *PLAN), str(path), needle)


def test_a_preset_gemm_tile_past_any_real_tile_is_refused(tmp_path, capsys):
    path = _preset(tmp_path, "gemm_tiles = [[", f"gemm_tiles = [[{BIG}, 1], [")
    one_line_error(capsys, cli("bench", "gemm", "--hardware", path, "--m", 4096, "--n", 4096, "--k", 4096),
                   str(path), "gemm_tiles must be a list of [tile_m, tile_n] pairs > 0 (at most")


# ------------------------------------------------------------------------------------- defect 13
@pytest.mark.parametrize("line, needle", [
    (f'"hardware.network.nic_gbps" = {BIG}', "hardware.network.nic_gbps: expected float"),
    (f"failure = {{ rate_per_1000_node_days = {BIG} }}", "failure.rate_per_1000_node_days: expected float"),
], ids=["dotted", "section"])
def test_a_scenario_float_past_the_float_range_is_a_one_line_error(tmp_path, capsys, line, needle):
    """coerce() caught ValueError / TypeError but not float()'s OverflowError."""
    spec = tmp_path / "s.toml"
    spec.write_text('[scenario]\nwhatif = "parallelism"\nmodel = "llama3-8b"\nhardware = "h100-sxm"\n'
                    'plan = { tp = 8, dp = 1, seq_len = 4096, global_batch = 8 }\n' + line + "\n")
    one_line_error(capsys, cli("whatif", "scenario", spec), str(spec), needle)


# ------------------------------------------------------------------------------------- defect 14
@pytest.mark.parametrize("count, needle", [
    ('"x"', "components.gpu.count must be a number >= 0, got 'x'"),     # ValueError: float('x')
    ("[1]", "components.gpu.count must be a number >= 0, got [1]"),     # TypeError: float([1])
    (BIG, "components.gpu.count must be a finite number >= 0"),         # OverflowError
    ("inf", "components.gpu.count must be a finite number >= 0"),       # accepted: every rate NaN
], ids=["string", "list", "1e400", "inf"])
def test_a_failure_model_count_of_the_wrong_kind_is_a_one_line_error(tmp_path, capsys, count, needle):
    """The counts were summed (float(count)) before any was checked."""
    path = tmp_path / "fm.toml"
    path.write_text('name = "x"\n[observation]\ngpus = 16384\ngpus_per_node = 8\ndays = 54\ninterruptions = 419\n'
                    f'[components.gpu]\ncount = {count}\n[components.nic]\ncount = 7\n')
    one_line_error(capsys, cli("whatif", "failures", "--failure-model", path, "--gpus", 16384, "--trials", 20),
                   str(path), needle)


# ------------------------------------------------------------------------------------- defect 15
@pytest.mark.parametrize("flag", ["--seq-len", "--global-batch", "--micro-batch"])
def test_search_sizes_past_its_int64_columns_are_refused(capsys, flag):
    """--search holds plans as int64 numpy columns: 1e20 was an OverflowError ("too large to convert to C long")
    where the same flag without --search runs."""
    argv = {"--seq-len": 4096, "--global-batch": 64, "--micro-batch": 1, flag: 10**20}
    one_line_error(capsys, cli("whatif", "parallelism", "--search", "--model", "llama3-8b", "--gpus", 64, "--top-k", 2,
                               *[x for kv in argv.items() for x in kv]), f"{flag} must be at most 2,147,483,648 with --search")


# ------------------------------------------------------------------------------------- defect 16
@pytest.mark.parametrize("column, value", [("shapes", 3), ("types", 3), ("strides", 3)])
def test_et_only_model_mode_reads_an_argument_column_that_is_not_a_list_as_unknown(tmp_path, capsys, column, value):
    """ET-only model mode (`replay --et X --timing model`): a node whose "shapes" / "types" / "strides" was a
    number (not a list) was a TypeError ("'int' object is not iterable", "has no len()") in the kernel
    inference; such an op now has nothing to infer from, like one with no shapes."""
    import gzip
    from conftest import DATA
    src = DATA / "h100" / "moe_t4096" / "host.0.json.gz"
    et = json.loads(gzip.decompress(src.read_bytes()))
    hit = 0
    for n in et["nodes"]:
        if n["name"] in ("aten::mm", "aten::add_", "aten::copy_", "aten::cat") and n.get("inputs", {}).get("shapes"):
            n["inputs"][column] = value
            hit += 1
    assert hit
    path = tmp_path / "host.0.json"
    path.write_text(json.dumps(et))
    assert cli("replay", "--et", path, "--timing", "model", "--hardware", "h100-sxm", "--json") == 0, capsys.readouterr().err
    assert "Traceback" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------- defect 17
@pytest.mark.parametrize("spec, needle", [
    (f"synthetic:tokens=2048,request_tokens={10**20}", "request_tokens must be at most 16,777,216"),  # OverflowError
    ("synthetic:tokens=2048,balanced=5", "balanced must be 0 or 1, got 5"),                       # read as on
], ids=["request_tokens", "balanced"])
def test_synthetic_routing_settings_out_of_range_are_one_line_errors(capsys, spec, needle):
    one_line_error(capsys, cli("whatif", "moe", "--model", "qwen3-30b-a3b", "--ep", 8, "--tokens", 64, "--routing", spec),
                   f"synthetic routing: {needle}")


def test_synthetic_routing_refuses_more_experts_than_its_int16_ids_hold(capsys):
    """40,000 experts passed the synthetic cap (65,536) and the int16 picks wrapped: the run failed later on
    "expert id -32768 ... is outside [0, 40000)", blaming the routing, not the size."""
    one_line_error(capsys, cli("whatif", "moe", "--model", "qwen3-30b-a3b", "--ep", 8, "--tokens", 64,
                               "--routing", "synthetic:tokens=4096", "--set", "model.moe.num_experts=40000"),
                   "synthetic routing: experts must be at most 32,768")


# ------------------------------------------------------------------------------------- defect 18
@pytest.mark.parametrize("argv", [
    ("whatif", "parallelism", "--model", "/dev/zero", *PLAN),
    ("whatif", "parallelism", "--model", "llama3-8b", "--hardware", "/dev/zero", *PLAN),
    ("whatif", "scenario", "/dev/zero"),
    ("check", "/dev/zero"),
    ("whatif", "moe", "--deployment", "/dev/zero"),
    ("whatif", "failures", "--failure-model", "/dev/zero", "--gpus", 8),
], ids=["model", "hardware", "scenario", "suite", "deployment", "failure-model"])
def test_a_configuration_file_that_never_ends_is_refused_at_a_bound(capsys, argv):
    """Configuration TOMLs were read whole: /dev/zero (or a multi-GB file given by mistake) grew until a
    MemoryError, or the OOM killer."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # a regression reads /dev/zero until memory runs out: cap this process at what it maps now + 2 GiB
    with open("/proc/self/status") as f:
        mapped = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
    cap = mapped + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        one_line_error(capsys, cli(*argv), "/dev/zero: is larger than 64 MiB")
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_scenario_file_goes_through_the_loaders_reader(tmp_path, capsys):
    """`whatif scenario` parsed with its own tomllib call: a 5,000-digit integer was a ValueError traceback."""
    spec = tmp_path / "s.toml"
    spec.write_text('[scenario]\nwhatif = "parallelism"\nlabel = ' + "9" * 5000 + "\n")
    one_line_error(capsys, cli("whatif", "scenario", spec), str(spec), "not a valid TOML file")


# ------------------------------------------------------------------------------------- defect 19
@pytest.mark.parametrize("old, new, needle", [
    ('name = "Simple"', 'name = "Simp*le"', "[[protocols]] name must be one of LL, LL128, Simple, got 'Simp*le'"),
    ('name = "Simple"', 'name = "LL"', "[[protocols]] needs a 'Simple' entry"),
], ids=["unknown-name", "no-simple"])
def test_a_preset_whose_protocols_leave_a_collective_none_is_refused(tmp_path, capsys, old, new, needle):
    """Found by tests/fuzz/configs_target.py: protocols NCCL does not have (or no Simple) loaded, and a
    collective then raised ValueError "no protocol of ... fits algorithm ['ring']"."""
    path = _preset(tmp_path, old, new)
    one_line_error(capsys, cli("bench", "collective", "--hardware", path, "--gpus", 16), str(path), needle)


# ------------------------------------------------------------------------------------- defect 20
SWEEP = """[scenario]
whatif = "parallelism"
model = "llama3-8b"
hardware = "h100-sxm"
plan = { tp = 8, dp = 1, seq_len = 4096, global_batch = 8 }
[axes.mb]
grid = { "plan.micro_batch" = [1, 2] }
"""


def test_a_sweep_set_value_past_the_digit_limit_is_a_one_line_error(tmp_path, capsys):
    """`--set axes...=<5,000 digits>`: tomllib's ValueError (not a TOMLDecodeError) escaped the value parser."""
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP)
    out = tmp_path / "r.parquet"
    one_line_error(capsys, cli("sweep", spec, "-o", out, "--set", "axes.mb.grid.plan.micro_batch=" + "9" * 5000),
                   "grid 'plan.micro_batch' must be a non-empty list of values")
    assert not out.exists()


def test_a_swept_integer_past_int64_is_kept_in_the_results_table(tmp_path, capsys):
    """A grid value of 10**400 (valid TOML): its point fails, but the table's Int64 cast raised OverflowError
    and the sweep ended in a traceback with no results file."""
    import pandas as pd
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP.replace("[1, 2]", f"[1, {BIG}]"))
    out = tmp_path / "r.parquet"
    assert cli("sweep", spec, "-o", out) == 0, capsys.readouterr().err[-2000:]
    df = pd.read_parquet(out)
    assert sorted(df["status"]) == ["error", "ok"] and BIG in set(df["plan.micro_batch"]), df[["status", "plan.micro_batch"]]


# ------------------------------------------------------------------------- published_training cases
@pytest.mark.parametrize("extra, needle", [
    ('csv = "missing.csv"\n', "cannot read"),
    ('csv = "rows.csv"\nhardware = "no-such-gpu"\n', "no-such-gpu"),
    ('csv = "rows.csv"\nrows = [0, 7]\n', "'rows' names row 7"),
], ids=["no-csv", "unknown-preset", "row-past-the-table"])
def test_an_unreadable_published_training_case_is_bad_input_not_a_failed_check(tmp_path, capsys, extra, needle):
    """A missing CSV, an unknown preset or a row the table lacks was a failed accuracy case (exit 1); it is
    bad input (exit 2), one line naming the case."""
    (tmp_path / "rows.csv").write_text("model,gpus,tp,pp,gbs,seq,precision,published_tokens_per_gpu\n"
                                       "llama2-7b,8,1,1,128,4096,BF16,3000\n")
    suite = tmp_path / "suite.toml"
    suite.write_text('[[case]]\nkind = "published_training"\nname = "pub"\n' + extra)
    one_line_error(capsys, cli("check", suite), needle, "case 'pub'")


def test_an_empty_calibrated_preset_name_is_refused_before_any_fit(tmp_path, capsys):
    """`calibrate --name ""` wrote a preset named "" that `--hardware` could never select."""
    out = tmp_path / "mine.toml"
    one_line_error(capsys, cli("calibrate", tmp_path, "--hardware", "h100-sxm", "-o", out, "--name", " "),
                   "--name must name the preset")
    assert not out.exists()
