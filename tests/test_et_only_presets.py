"""Issue 27 item 4: the shipped h100-sxm preset is the calibrated one, the roofline stays available by
name, and `lumos-sim calibrate --install NAME` makes a preset that --hardware and `list hardware` find."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumos_sim.cli import main as cli_main
from replay.hardware import config as hwconfig

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "tests" / "data" / "h100"


def test_default_h100_preset_is_calibrated_on_the_h100_ground_truth_with_provenance():
    hw = hwconfig.get_hardware("h100-sxm")
    assert hw.kernel_models and hw.calibration is not None
    traces = set(hw.calibration.traces)
    assert {"llama_b4_s2048", "moe_t4096", "kernels_gemm_bf16"} <= traces
    assert not any("heldout" in t or t.startswith("llama_d") for t in traces)   # the held-out steps stay out
    assert "torch 2.11.0+cu130" in hw.calibration.software and "CUDA 13.0" in hw.calibration.software
    assert "2026-11-23" in hw.calibration.collected
    assert all(m.fit_gmae > 0 for m in hw.kernel_models.values())
    assert hwconfig.get_hardware("h100").name == "h100-sxm"


def test_roofline_stays_available_by_name_and_other_gpus_do_not_inherit_h100_fits():
    roof = hwconfig.get_hardware("h100-sxm-roofline")
    assert not roof.kernel_models and roof.gpu.peak_tflops["bf16"] == pytest.approx(989.4)
    for name in ("h200", "h800", "b200"):
        assert not hwconfig.get_hardware(name).kernel_models, name


def test_calibrate_install_makes_a_named_preset_list_hardware_shows(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LUMOS_SIM_HOME", str(tmp_path))
    assert cli_main(["calibrate", str(H100 / "kernels_elementwise"), "--hardware", "h100-sxm",
                     "--install", "my-h100"]) == 0
    path = tmp_path / "hardware" / "my-h100.toml"
    assert path.is_file()
    hw = hwconfig.get_hardware("my-h100")
    assert hw.name == "my-h100" and hw.kernel_models
    # fitted on top of the calibrated default, it replaces that fit instead of merging with it
    assert 'extends = "h100-sxm-roofline"' in path.read_text()
    capsys.readouterr()
    assert cli_main(["list", "hardware", "--json"]) == 0
    names = {r["name"] for r in json.loads(capsys.readouterr().out)}
    assert "my-h100" in names and "h100-sxm" in names
    # a built-in name is never shadowed
    assert cli_main(["calibrate", str(H100 / "kernels_elementwise"), "--hardware", "h100-sxm",
                     "--install", "h100-sxm"]) == 2
