"""`lumos-sim bench collective|gemm`: nccl-tests style output, JSON, errors with exit code 2."""
from __future__ import annotations

import json

import pytest

from lumos_sim.cli import main


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_bench_collective_json(capsys):
    out = _json(capsys, ["bench", "collective", "--hardware", "h100-sxm", "--op", "all_reduce", "--size", "1GiB",
                         "--gpus", "8", "--json"])
    assert {"time_us", "algbw_gbps", "busbw_gbps", "algorithm"} <= set(out)
    assert out["algbw_gbps"] == pytest.approx((1 << 30) / out["time_us"] / 1e3)
    assert out["busbw_gbps"] == pytest.approx(out["algbw_gbps"] * 2 * 7 / 8)
    assert out["algorithm"] == "nvls" and out["busbw_gbps"] == pytest.approx(480, rel=0.1)


def test_bench_collective_forced_algorithm_and_sizes(capsys):
    ring = _json(capsys, ["bench", "collective", "--op", "all_gather", "--size", "64MB", "--gpus", "16",
                          "--algorithm", "ring", "--json"])
    assert ring["algorithm"] == "ring" and ring["size_bytes"] == 64_000_000
    assert ring["busbw_gbps"] == pytest.approx(ring["algbw_gbps"] * 15 / 16)
    tiny = _json(capsys, ["bench", "collective", "--size", "8", "--json"])
    assert tiny["time_us"] < 50
    sci = _json(capsys, ["bench", "collective", "--size", "1e9", "--op", "broadcast", "--json"])
    assert sci["busbw_gbps"] == pytest.approx(sci["algbw_gbps"])


def test_bench_gemm_json(capsys):
    out = _json(capsys, ["bench", "gemm", "--hardware", "h100-sxm", "--m", "8192", "--n", "8192", "--k", "8192",
                         "--dtype", "bf16", "--json"])
    assert 600 <= out["tflops"] <= 800 and out["bound"] == "compute"
    skinny = _json(capsys, ["bench", "gemm", "--m", "16", "--n", "8192", "--k", "8192", "--json"])
    assert skinny["bound"] == "memory" and skinny["time_us"] == pytest.approx(skinny["memory_us"])


def test_bench_table_output(capsys):
    assert main(["bench", "gemm", "--m", "128", "--n", "128", "--k", "128"]) == 0
    assert "TFLOP/s" in capsys.readouterr().out


def test_user_preset_typo_exits_2_with_one_line(tmp_path, capsys):
    f = tmp_path / "mine.toml"
    f.write_text('name = "mine"\nextends = "h100-sxm"\n[gpu]\nnvlink_bw_gbs = 900\n')
    assert main(["bench", "collective", "--hardware", str(f), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown key 'nvlink_bw_gbs' in [gpu]" in err and len(err.splitlines()) == 1


def test_unknown_hardware_and_unsupported_algorithm_exit_2(capsys):
    assert main(["bench", "gemm", "--hardware", "tpu-v9", "--m", "1", "--n", "1", "--k", "1"]) == 2
    assert "unknown hardware 'tpu-v9'" in capsys.readouterr().err
    assert main(["bench", "collective", "--gpus", "16", "--algorithm", "nvls"]) == 2
    assert "does not support" in capsys.readouterr().err


def test_bad_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "collective", "--size", "lots"])
    assert e.value.code == 2


def test_bench_presets_lists_every_preset(capsys):
    rows = _json(capsys, ["bench", "presets", "--json"])
    names = {r["name"] for r in rows}
    assert {"h100-sxm", "h200", "h800", "a100-sxm-40gb", "a100-sxm-80gb", "v100-sxm2", "b200"} <= names
    assert "a100-sxm" in next(r for r in rows if r["name"] == "a100-sxm-80gb")["aliases"]
