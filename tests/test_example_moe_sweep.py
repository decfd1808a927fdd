"""The MoE placement sweep example: its spec expands to the full grid, and the standalone script
evaluates a reduced grid through `evaluate` into a self-contained plotly HTML report."""
from __future__ import annotations

import importlib.util
import tomllib

from conftest import ROOT

SCRIPT = ROOT / "examples" / "sweeps" / "moe_placement.py"


def _module():
    spec = importlib.util.spec_from_file_location("moe_placement_example", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_spec_is_placement_x_ep_x_batch_size():
    mod = _module()
    points = mod.expand_axes(tomllib.loads(SCRIPT.with_suffix(".toml").read_text())["axes"])
    assert len(points) == 5 * 3 * 3
    assert {p[1]["moe.placement"] for p in points} == {"contiguous", "round-robin", "balanced", "eplb", "locality"}


def test_reduced_grid_writes_a_self_contained_report(tmp_path):
    mod = _module()
    spec = SCRIPT.with_suffix(".toml").read_text().split("[[axes]]")[0] + """
[[axes]]
list = [{ label = "contiguous", "moe.placement" = "contiguous" },
        { label = "locality + group-by domain", "moe.placement" = "locality", "moe.group_by" = "domain" }]
[[axes]]
grid = { "moe.tokens" = [64, 256] }
"""
    (tmp_path / "small.toml").write_text(spec)
    out = tmp_path / "report.html"
    assert mod.main(["--spec", str(tmp_path / "small.toml"), "--quick", "-o", str(out),
                     "--csv", str(tmp_path / "t.csv")]) == 0
    html = out.read_text()
    assert "Plotly.newPlot" in html and "<script src=" not in html and len(html) > 1_000_000  # plotly.js inlined
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 and "metrics.a2a_bytes_inter_node" in rows[0]
