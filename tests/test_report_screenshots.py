"""Sweep reports adapt to what the sweep varies, checked in a real headless Chromium on four kinds of
sweep: GPU counts (the counts are the ticks, one Pareto front per count), hardware (a categorical axis,
no one-point GPU axis, no degenerate memory plot), failures (ETTR and time lost, no throughput) and MoE
(placement x EP, MoE-layer breakdown). The screenshots land in tests/artifacts/ (ignored by git);
`docs/report-*.png` are copies of them."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from lumos_sim.cli import main as cli_main
from report_browser import ARTIFACTS, chromium_path, render

SPECS = {
    "gpus": """
[sweep]
name = "Llama 3 8B on 8-64 H100: plans per GPU count"
[scenario]
whatif = "parallelism"
model = "llama3-8b"
hardware = "h100-sxm"
plan = { seq_len = 4096, global_batch = 64 }
[[axes]]
search = { gpus = [8, 16, 32, 64], max_plans = 3 }
""",
    "hardware": """
[sweep]
name = "Llama 3 8B TP8 DP2 on four GPU generations"
[scenario]
whatif = "parallelism"
model = "llama3-8b"
plan = { tp = 8, dp = 2, seq_len = 4096, global_batch = 64 }
[[axes]]
grid = { hardware = ["h100-sxm", "h200", "b200", "a100-sxm"] }
""",
    "failures": """
[sweep]
name = "Failures: ETTR vs GPU count, sync vs FT-HSDP"
[scenario]
whatif = "failures"
failure = { failure_model = "llama3-405b", trials = 50, horizon_days = 30, checkpoint_interval_min = 30 }
[[axes]]
grid = { "failure.gpus" = [1024, 4096, 16384, 65536], "failure.strategy" = ["sync", "ft-hsdp"] }
""",
    "moe": """
[sweep]
name = "Qwen3-235B-A22B decode: expert placement x EP degree"
[scenario]
whatif = "moe"
model = "qwen3-235b-a22b"
hardware = "h100-sxm"
plan = { ep = 8, dp = 8 }
moe = { routing = "synthetic:domains=8,cluster_affinity=0.5", phase = "decode", synthetic_tokens = 512, tokens = 32 }
[[axes]]
list = [{ label = "contiguous", "moe.placement" = "contiguous" },
        { label = "locality", "moe.placement" = "locality", "moe.group_by" = "domain" }]
[[axes]]
zip = { "plan.ep" = [8, 16], "plan.dp" = [8, 16] }
""",
}


def _sweep_report(kind: str, tmp_path: Path) -> tuple[str, list[dict]]:
    """Run the sweep through `lumos-sim sweep --report` (the CLI path users take); render the report."""
    chromium_path()
    spec = tmp_path / f"{kind}.toml"
    spec.write_text(SPECS[kind])
    html = tmp_path / f"{kind}.html"
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / f"{kind}.parquet"), "--report", str(html)]) == 0
    errors, stats = render(html, ARTIFACTS / f"report-{kind}.png")
    assert errors == [], errors
    for plot in stats:
        assert plot["svg"] >= 1 and plot["traces"] >= 1 and plot["paths"] >= 1, plot
    assert (ARTIFACTS / f"report-{kind}.png").stat().st_size > 10_000
    return html.read_text(), stats


def _headings(text: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", text)


def test_gpu_count_sweep_has_the_counts_as_ticks_and_a_front_per_count(tmp_path):
    text, stats = _sweep_report("gpus", tmp_path)
    heads = _headings(text)
    assert heads[:2] == ["Throughput vs GPUs", "Step-time breakdown per configuration (share of the step)"]
    assert stats[0]["xticks"] == ["8", "16", "32", "64"]                   # no log-axis ticks like "2 3 100"
    assert stats[1]["xticks"] == ["8 GPUs", "16 GPUs", "32 GPUs", "64 GPUs"]  # one bar per GPU count
    assert "Pareto front per GPU count" in heads[2]
    assert text.count("GPUs: Pareto front") == 4                          # one front per GPU count
    assert "Best point per GPU count" in heads


def test_hardware_sweep_has_a_categorical_hardware_axis_and_no_degenerate_plots(tmp_path):
    text, stats = _sweep_report("hardware", tmp_path)
    heads = _headings(text)
    assert heads[0] == "Throughput vs hardware"
    assert stats[0]["xticks"] == ["h100-sxm", "h200", "b200", "a100-sxm-80gb"]  # resolved preset names
    assert all(not re.fullmatch(r"[\d.]+", t) for plot in stats for t in plot["xticks"])  # no 255.5 / 256.5
    assert "GPUs" not in heads[0]
    # the plan's memory does not depend on the GPU generation: a note, not a one-point Pareto plot
    assert "no trade-off between memory and throughput" in text
    assert len(stats) == 2


def test_failures_sweep_report_shows_ettr_and_time_lost_and_skips_throughput(tmp_path):
    """Issue 21 item 8: a valid failures sweep has no throughput column; the report shows what it has."""
    text, stats = _sweep_report("failures", tmp_path)
    heads = _headings(text)
    assert heads[0] == "ETTR (effective training time ratio) vs GPUs"
    assert heads[1] == "Time lost to failures per configuration, by cause"
    assert not any("Throughput" in h or "Pareto" in h for h in heads)
    assert stats[0]["xticks"] == ["1,024", "4,096", "16,384", "65,536"]
    assert "sync" in text and "ft-hsdp" in text                          # one series per strategy


def test_report_command_on_a_failures_results_table(tmp_path, capsys):
    """`lumos-sim report` (not only `sweep --report`) on a failures table without any throughput."""
    spec = tmp_path / "f.toml"
    spec.write_text(SPECS["failures"].replace("[1024, 4096, 16384, 65536]", "[1024, 16384]"))
    results = tmp_path / "f.parquet"
    assert cli_main(["sweep", str(spec), "-o", str(results)]) == 0
    assert cli_main(["report", str(results), "-o", str(tmp_path / "f.html")]) == 0
    assert "ETTR" in (tmp_path / "f.html").read_text()


def test_moe_sweep_report_has_placements_as_series_and_the_moe_layer_breakdown(tmp_path):
    text, stats = _sweep_report("moe", tmp_path)
    heads = _headings(text)
    assert heads[0] == "Throughput vs GPUs"
    assert heads[1] == "MoE layer time per configuration (share of the layer)"
    assert stats[0]["xticks"] == ["8", "16"]
    assert "all-to-all dispatch" in text and "expert GEMMs" in text
    assert "contiguous" in text and "locality" in text


@pytest.mark.parametrize("name", ["gpus", "hardware", "failures", "moe"])
def test_docs_keep_a_screenshot_of_each_report(name):
    png = Path(__file__).resolve().parent.parent / "docs" / f"report-{name}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < png.stat().st_size < 400_000
