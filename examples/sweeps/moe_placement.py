"""Evaluate the MoE placement sweep (examples/sweeps/moe_placement.toml) point by point through
`estimators.registry.evaluate` and write a self-contained HTML report (plotly.js inlined):

    python examples/sweeps/moe_placement.py -o moe_placement.html [--csv moe.csv] [--set KEY=VALUE ...]
    python examples/sweeps/moe_placement.py --quick -o quick.html     # 2 MoE layers, small routing trace

Plots: inter-node all-to-all bytes per batch, MoE layer latency, and GPU load max/mean, each against
tokens per GPU, one line per placement, one column per EP degree.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SPEC = Path(__file__).with_suffix(".toml")
QUICK = ["model.layers=5", "moe.synthetic_tokens=65536", "moe.timed_windows=1"]


def expand_axes(axes: list[dict]) -> list[tuple[str, dict]]:
    """(label, overrides) of every point: axes combine by cartesian product (grid / zip / list)."""
    per_axis = []
    for axis in axes:
        if "grid" in axis:
            keys = list(axis["grid"])
            per_axis.append([("", dict(zip(keys, combo))) for combo in itertools.product(*axis["grid"].values())])
        elif "zip" in axis:
            keys = list(axis["zip"])
            per_axis.append([("", dict(zip(keys, combo))) for combo in zip(*axis["zip"].values())])
        elif "list" in axis:
            per_axis.append([(str(item.get("label", "")), {k: v for k, v in item.items() if k != "label"})
                             for item in axis["list"]])
        else:
            raise SystemExit(f"{SPEC}: unsupported axis {sorted(axis)}")
    points = []
    for combo in itertools.product(*per_axis):
        label = " ".join(lab for lab, _ in combo if lab)
        changes: dict = {}
        for _, c in combo:
            changes.update(c)
        points.append((label, changes))
    return points


def run(spec_path: Path, sets: list[str], progress=print):
    import pandas as pd

    from estimators.scenario import Scenario, parse_assignments
    from estimators.registry import evaluate

    spec = tomllib.loads(spec_path.read_text())
    base = Scenario.from_dict(spec["scenario"], str(spec_path)).override(parse_assignments(sets))
    rows = []
    points = expand_axes(spec.get("axes", []))
    for n, (label, changes) in enumerate(points, 1):
        s = base.override(changes)
        p = evaluate(s)
        rows.append({"placement": label, "ep": s.plan.ep, "tokens_per_gpu": p.metrics["tokens_per_gpu"],
                     **{k: v for k, v in p.to_row().items() if k.startswith("metrics.") or k == "wall_s"}})
        progress(f"[{n}/{len(points)}] {label} EP{s.plan.ep} tokens {p.metrics['tokens_per_gpu']}: "
                 f"inter-node -{100 * p.metrics['a2a_reduction_vs_contiguous']:.1f}%, "
                 f"layer {p.metrics['layer_latency_us_mean']:.0f} us ({p.wall_s:.1f} s)")
    return spec.get("sweep", {}).get("name", spec_path.stem), pd.DataFrame(rows)


def figure(title: str, df):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    eps = sorted(df["ep"].unique())
    metrics = [("metrics.a2a_bytes_inter_node", "inter-node all-to-all GiB / batch", 1 / 2 ** 30),
               ("metrics.layer_latency_us_mean", "MoE layer latency (us)", 1.0),
               ("metrics.max_over_mean_gpu_load", "GPU load max/mean", 1.0)]
    fig = make_subplots(rows=len(metrics), cols=len(eps), shared_xaxes=True,
                        column_titles=[f"EP{e}" for e in eps], vertical_spacing=0.06)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for i, placement in enumerate(df["placement"].unique()):
        for c, ep in enumerate(eps, 1):
            d = df[(df["placement"] == placement) & (df["ep"] == ep)].sort_values("tokens_per_gpu")
            for r, (col, _, scale) in enumerate(metrics, 1):
                fig.add_trace(go.Scatter(x=d["tokens_per_gpu"], y=d[col] * scale, mode="lines+markers",
                                         name=placement, legendgroup=placement, showlegend=(r == 1 and c == 1),
                                         line={"color": colors[i % len(colors)]}), row=r, col=c)
    for r, (_, name, _) in enumerate(metrics, 1):
        fig.update_yaxes(title_text=name, row=r, col=1)
    for c in range(1, len(eps) + 1):
        fig.update_xaxes(title_text="tokens per GPU", type="log", row=len(metrics), col=c)
    fig.update_layout(title=title, height=300 * len(metrics), template="plotly_white")
    return fig


def write_html(fig, path: Path) -> None:
    """Self-contained (plotly.js inlined), written to a temp file and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".html.tmp")
    os.close(fd)
    fig.write_html(tmp, include_plotlyjs=True, full_html=True)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("moe_placement.html"))
    ap.add_argument("--csv", type=Path, help="also write the table as CSV")
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--quick", action="store_true", help="reduced model and routing (for tests)")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    title, df = run(args.spec, (QUICK if args.quick else []) + args.sets,
                    progress=lambda line: print(line, file=sys.stderr))
    write_html(figure(title, df), args.out)
    if args.csv:
        df.to_csv(args.csv, index=False)
    print(f"{len(df)} points -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
