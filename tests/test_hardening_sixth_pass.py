"""Bad input found by a fuzzing pass over the MoE deployment surface, --set, Hugging Face configs, expert-load
files and check suites (session 34): each is a one-line error naming the file or the setting (exit 2), never a
traceback, an overflow, a 58 GiB allocation, or a silently ignored key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_hardening_third_pass import cli
from tests.test_hardening_third_pass import one_line_error as third_pass_error

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "data" / "hf_configs"
CNN = ROOT / "tests" / "data" / "cpu_models" / "cnn" / "device.0.json.gz"
DECODE = ROOT / "examples" / "deployments" / "deepseek-v3-decode-ep72-h100-sglang.toml"
HUGE = "1" + "0" * 400


def one_line_error(capsys, code: int, *needles: str) -> str:
    """The third pass's check, and the line short enough to read (a huge value is described, not printed)."""
    line = third_pass_error(capsys, code, *needles)
    assert len(line) < 400, line
    return line


@pytest.mark.parametrize("flag, needle", [("--context", "moe.context must be at most 16,777,216"),
                                          ("--tokens", "moe.tokens must be at most")])
def test_a_400_digit_moe_size_is_refused_not_overflowed(capsys, flag, needle):
    one_line_error(capsys, cli("whatif", "moe", "--model", "deepseek-v3", "--ep", 32, flag, HUGE),
                   needle, "401-digit")


@pytest.mark.parametrize("flags, needle", [
    (("--seq-len", 10 ** 12, "--global-batch", 8), "seq_len = 1,000,000,000,000 is more than the 16,777,216"),
    (("--seq-len", HUGE, "--global-batch", 8), "seq_len = a 401-digit number"),
    (("--seq-len", 4096, "--global-batch", 10 ** 30), "global_batch = a 31-digit number"),
])
def test_a_sequence_or_batch_past_any_cluster_is_refused_before_any_allocation(capsys, flags, needle):
    one_line_error(capsys, cli("whatif", "parallelism", "--model", "llama3-8b", "--gpus", 8, *flags), needle)


@pytest.mark.parametrize("value", ["1", "x", "[1, 2]"])
def test_setting_a_whole_option_section_takes_a_table_only(capsys, value):
    one_line_error(capsys, cli("whatif", "moe", "--model", "deepseek-v3", "--ep", 32, "--set", f"moe={value}"),
                   "moe: expected a table of MoEOptions fields")


def test_an_hf_config_whose_moe_layer_frequency_leaves_no_moe_layer_is_refused(tmp_path, capsys):
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    cfg["moe_layer_freq"] = 100           # layer i is MoE when i >= 3 and i % 100 == 0: none of the 61
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    one_line_error(capsys, cli("whatif", "parallelism", "--model", path, "--gpus", 8, "--ep", 8, "--seq-len", 4096,
                               "--global-batch", 8), str(path), "no MoE layer among the 61 layers")


def test_an_hf_config_with_fewer_hidden_units_than_heads_is_refused(tmp_path, capsys):
    cfg = json.loads((HF / "llama3-8b.json").read_text())
    cfg["hidden_size"] = 16               # 32 heads of 0 dimensions
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    one_line_error(capsys, cli("whatif", "parallelism", "--model", path, "--gpus", 8, "--seq-len", 4096,
                               "--global-batch", 8), str(path), "'hidden_size' (16) is smaller")


def _deployment(tmp_path: Path, **changes) -> Path:
    lines = [ln for ln in DECODE.read_text().splitlines() if ln.split(" = ")[0] not in changes]
    at = lines.index("[deployment]") + 1
    lines[at:at] = [f"{k} = {json.dumps(v)}" for k, v in changes.items()]
    path = tmp_path / "d.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("changes, needle", [({"context": 0}, "moe.context must be >= 1"),
                                             ({"overlap": "bogus"}, "moe.overlap must be one of"),
                                             ({"routing": ""}, "'routing' must not be empty")])
def test_a_bad_value_in_a_deployment_file_names_the_file(tmp_path, capsys, changes, needle):
    path = _deployment(tmp_path, **changes)
    one_line_error(capsys, cli("whatif", "moe", "--deployment", path), str(path), needle)


def test_a_model_config_beside_the_deployment_file_is_found_from_anywhere(tmp_path, capsys, monkeypatch):
    (tmp_path / "ds.json").write_text((HF / "deepseek-v3.json").read_text())
    path = _deployment(tmp_path, model="ds.json")
    monkeypatch.chdir(ROOT)
    assert cli("whatif", "moe", "--deployment", path, "--set", "moe.sampled_window=4096",
               "--set", "moe.synthetic_tokens=8192", "--json") == 0, capsys.readouterr().err


@pytest.mark.parametrize("body, needle", [('[["1", "2"]]', "found '1'"), ("[[true, 1]]", "found True"),
                                          ("[[null, 1]]", "found None"), ('{"a": 1}', "not a list of lists")])
def test_expert_loads_hold_numbers_only(tmp_path, capsys, body, needle):
    path = tmp_path / "loads.json"
    path.write_text(body)
    one_line_error(capsys, cli("whatif", "moe", "--model", "deepseek-v3", "--ep", 32, "--expert-load", path),
                   str(path), needle)


def test_an_expert_load_directory_is_named_as_one(tmp_path, capsys):
    one_line_error(capsys, cli("whatif", "moe", "--model", "deepseek-v3", "--ep", 32, "--expert-load", tmp_path),
                   "is a directory")


def _suite(tmp_path: Path, case: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(f'[suite]\nname = "x"\n[[case]]\nname = "a"\n{case}\n')
    return path


@pytest.mark.parametrize("case, needle", [
    ('measured_ms = { "NoSuchStep" = 5.0 }', "'measured_ms' of case 'a' (suite 'x') names 'NoSuchStep'"),
    ("ranks = [99]", "'ranks' of case 'a' (suite 'x') names rank 99"),
    ("steps = []", "'steps' of case 'a' is empty"),
    ('measured_ms = { "ProfilerStep#2" = "x" }', "must be a finite step time in milliseconds"),
])
def test_a_replay_case_naming_what_the_trace_lacks_is_bad_input(tmp_path, capsys, case, needle):
    suite = _suite(tmp_path, f'inputs = ["{CNN}"]\n{case}')
    one_line_error(capsys, cli("check", suite), needle)


@pytest.mark.parametrize("key", ['steps = ["ProfilerStep#1"]', 'timing = "trace"', "measured_ms = { s = 5.0 }"])
def test_a_published_training_case_refuses_replay_keys(tmp_path, capsys, key):
    suite = _suite(tmp_path, f'kind = "published_training"\ncsv = "x.csv"\n{key}')
    one_line_error(capsys, cli("check", suite), "applies to replay cases, not published_training")


HEADER = ("source,release,model,gpu,gpus,precision,tp,pp,cp,vp,ep,etp,mbs,gbs,seq,recompute,fsdp,"
          "published_tflops,published_tokens_per_gpu,notes")
ROW = "s,NeMo 24.07,LLAMA2-7B,H100,8,FP8,1,1,1,1,1,,1,128,4096,,,780,16934,"


@pytest.mark.parametrize("row, needle", [
    (ROW.replace("LLAMA2", "LL\udcffAMA2"), "not UTF-8 text"),
    (ROW[:-1] + "x" * 200_000, "malformed CSV: field larger than field limit"),
    (ROW.replace(",8,FP8", "," + "1" * 5001 + ",FP8"), "gpus '1111111111111111111111111111111111111111'... (5,001 characters)"),
])
def test_a_malformed_published_csv_is_one_short_line(tmp_path, capsys, row, needle):
    (tmp_path / "x.csv").write_bytes((HEADER + "\n" + row + "\n").encode("utf-8", "surrogateescape"))
    suite = _suite(tmp_path, 'kind = "published_training"\ncsv = "x.csv"')
    one_line_error(capsys, cli("check", suite), needle)
