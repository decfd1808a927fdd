"""HTML reports open in a real headless Chromium with no console error and every plot drawn (SVG
traces); a screenshot of each is saved under tests/artifacts/ (ignored by git)."""
from __future__ import annotations

from pathlib import Path

from lumos_sim.cli import main as cli_main
from lumos_sim.report import pareto_front, write_sweep_report
from lumos_sim.sweeps import sweep
from report_browser import ARTIFACTS, chromium_path, render

ROOT = Path(__file__).resolve().parent.parent
CPU_DDP = ROOT / "tests" / "data" / "cpu_ddp"


def sweep_frame():
    """12 points over two GPU counts and two NIC speeds, one failing point and one out of memory."""
    spec = {"sweep": {"name": "report test"},
            "scenario": {"model": "llama3-8b", "hardware": "h100-sxm",
                         "plan": {"tp": 8, "dp": 1, "seq_len": 4096, "global_batch": 64}},
            "axes": [{"list": [{"plan.gpus": 8}, {"plan.gpus": 16}, {"plan.tp": 3, "label": "bad tp"}]},
                     {"grid": {"hardware.network.nic_gbps": [200, 800], "plan.micro_batch": [1, 32]}}]}
    return sweep(spec, progress=False)


def assert_renders(html: Path, name: str, plots: int) -> None:
    errors, stats = render(html, ARTIFACTS / f"{name}.png")
    assert errors == [], errors
    assert len(stats) == plots, stats
    for plot in stats:
        assert plot["svg"] >= 1 and plot["traces"] >= 1 and plot["paths"] >= 1, plot
    assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000


def test_sweep_report_renders_every_plot_in_chromium(tmp_path):
    chromium_path()
    df = sweep_frame()
    assert set(df["status"]) == {"ok", "error"}
    out = tmp_path / "sweep.html"
    write_sweep_report(df, out)
    text = out.read_text()
    assert "<script src=" not in text and "Plotly.newPlot" in text  # plotly.js inlined: opens offline
    for heading in ("Throughput vs GPUs", "Step-time breakdown per configuration", "Pareto front", "Failed points (4)"):
        assert heading in text
    assert_renders(out, "sweep_report", plots=3)


def test_report_command_and_replay_report_render_in_chromium(tmp_path, capsys):
    chromium_path()
    results = tmp_path / "r.parquet"
    sweep_frame().to_parquet(results)
    assert cli_main(["report", str(results), "-o", str(tmp_path / "r.html")]) == 0
    assert_renders(tmp_path / "r.html", "report_command", plots=3)
    out = tmp_path / "replay.html"
    assert cli_main(["replay", str(CPU_DDP / "device.{rank}.json.gz"), "--et", str(CPU_DDP / "host.{rank}.json.gz"),
                     "--report", str(out)]) == 0
    text = out.read_text()
    assert "Step time per rank" in text and "Critical-path categories" in text
    assert_renders(out, "replay_report", plots=3)


def test_report_of_a_file_that_is_not_a_results_table_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"not parquet")
    assert cli_main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and "not a readable sweep results file" in err
    assert not (tmp_path / "r.html").exists()


def test_pareto_front_keeps_points_nothing_beats_on_memory_and_throughput():
    memory = [10, 20, 15, 30, 12]
    tput = [100, 300, 90, 250, 150]
    assert pareto_front(memory, tput) == [0, 4, 1]


def test_report_without_token_throughput_plots_steps_per_second(tmp_path):
    """A what-if that predicts only a step time (e.g. a trace what-if) gets steps/s; one without a memory
    estimate (e.g. MoE) gets a note instead of an empty Pareto plot."""
    df = sweep_frame()
    df["tokens_per_s"] = None
    text = write_sweep_report(df, tmp_path / "r.html").read_text()
    assert text.count("steps\\u002fs") >= 2 and "Throughput vs GPUs" in text  # plotly's JSON escapes '/'
    df["memory_gib_per_gpu"] = None
    text = write_sweep_report(df, tmp_path / "r.html").read_text()
    assert "give no memory estimate" in text and text.count('class="plotly-graph-div"') == 2
