"""The sweep examples under examples/sweeps/ run on a reduced grid and produce their reports."""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pandas as pd
import pytest

from lumos_sim.cli import main as cli_main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "sweeps"


@pytest.mark.parametrize("spec, reduce, points", [
    ("llama3_70b_scaling.toml", ["axes.0.search.gpus=[256,1024]", "axes.0.search.max_plans=2"], 4),
    ("hardware_generations.toml", ["plan.dp=2", "plan.global_batch=64"], 4),
    ("nic_bandwidth.toml", ["axes.1.grid.hardware.network.nic_gbps=[200,800]"], 4),
])
def test_example_spec_runs_on_a_reduced_grid_and_writes_its_report(tmp_path, capsys, spec, reduce, points):
    out, report = tmp_path / "r.parquet", tmp_path / "r.html"
    args = ["sweep", str(EXAMPLES / spec), "-o", str(out), "--report", str(report), "--json"]
    assert cli_main(args + [a for r in reduce for a in ("--set", r)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == points and summary["failed"] == 0
    df = pd.read_parquet(out)
    assert (df["status"] == "ok").all() and (df["tokens_per_s"] > 0).all()
    assert report.stat().st_size > 1_000_000 and "Plotly.newPlot" in report.read_text()  # plotly.js inlined


def test_full_example_grids_expand_as_documented():
    from lumos_sim.sweeps import load_spec

    assert len(load_spec(EXAMPLES / "llama3_70b_scaling.toml").points()) == 200
    hw = load_spec(EXAMPLES / "hardware_generations.toml").points()
    assert [p.scenario.hardware.name for p in hw] == ["h100-sxm", "h200", "b200", "h800"]
    assert len({p.scenario.plan for p in hw}) == 1
    nic = load_spec(EXAMPLES / "nic_bandwidth.toml").points()
    assert sorted({p.scenario.hardware.network.nic_gbps for p in nic}) == [200, 300, 400, 500, 600, 700, 800]


def test_best_plan_script_prints_the_best_plan_of_each_gpu_count(tmp_path, capsys, monkeypatch):
    out, report = tmp_path / "a.parquet", tmp_path / "a.html"
    monkeypatch.setattr(sys, "argv", ["best_plan_per_gpu_count.py", "-o", str(out), "--report", str(report),
                                      "--set", "axes.0.search.gpus=[256,1024]", "--set", "axes.0.search.max_plans=2"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(EXAMPLES / "best_plan_per_gpu_count.py"), run_name="__main__")
    assert e.value.code == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.strip().startswith(("256 ", "1024 "))]
    assert len(lines) == 2 and "100.0%" in lines[0]
    assert report.exists()
