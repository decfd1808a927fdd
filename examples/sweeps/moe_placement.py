"""Evaluate the MoE placement sweep (examples/sweeps/moe_placement.toml) point by point through
`estimators.registry.evaluate` and write a self-contained HTML report (plotly.js inlined):

    python examples/sweeps/moe_placement.py -o moe_placement.html [--csv moe.csv] [--set KEY=VALUE ...]
    python examples/sweeps/moe_placement.py --quick -o quick.html     # 2 MoE layers, small routing trace

    python examples/sweeps/moe_placement.py --spec examples/sweeps/moe_serving.toml -o serving.html
                                                  # placement x redundant experts x EP -> tokens/s per node

Plots: inter-node all-to-all bytes per batch, MoE layer latency, GPU load max/mean and (inference) output
tokens/s per node and time per output token, each against tokens per GPU (or redundant experts when the
spec varies them), one line per placement, one column per EP degree. The best point (most tokens/s per
node) is marked (a star, and `best` in the CSV). Points the what-if refuses (slots that do not divide
over EP...) are listed with their one-line reason and skipped.
"""
from __future__ import annotations

import argparse
import itertools
import sys
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

    from chakra_schema.errors import TraceInputError
    from estimators.scenario import Scenario, parse_assignments
    from estimators.registry import evaluate

    spec = tomllib.loads(spec_path.read_text())
    base = Scenario.from_dict(spec["scenario"], str(spec_path)).override(parse_assignments(sets))
    rows = []
    points = expand_axes(spec.get("axes", []))
    # x axis: redundant experts when the spec varies them, else the batch (tokens per GPU)
    x = "redundant_experts" if any("moe.redundant_experts" in c for _, c in points) else "tokens_per_gpu"
    for n, (label, changes) in enumerate(points, 1):
        # the placement first: the options are checked as each key is set (redundant experts need eplb)
        changes = dict(sorted(changes.items(), key=lambda kv: kv[0] != "moe.placement"))
        try:
            s = base.override(changes)
        except TraceInputError as e:
            progress(f"[{n}/{len(points)}] {label}: skipped ({e})")
            rows.append({"placement": changes.get("moe.placement", ""), "label": label,
                         "ep": changes.get("plan.ep", base.plan.ep), "error": str(e)})
            continue
        # one line per placement: the point's label when the x axis is the batch (the labels name the
        # placement variants), else the placement itself (the labels also name the EP layout)
        placement = label if x == "tokens_per_gpu" else changes.get("moe.placement", s.moe.placement)
        try:
            p = evaluate(s)
        except TraceInputError as e:
            progress(f"[{n}/{len(points)}] {label}: skipped ({e})")
            rows.append({"placement": placement, "label": label, "ep": s.plan.ep, "error": str(e)})
            continue
        m = p.metrics
        rows.append({"placement": placement, "label": label, "ep": s.plan.ep, "tokens_per_gpu": m["tokens_per_gpu"],
                     "redundant_experts": m.get("redundant_experts", 0),
                     **{k: v for k, v in p.to_row().items() if k.startswith("metrics.") or k == "wall_s"}})
        serving = (f", {m['tokens_per_s_per_node']:,.0f} tok/s/node" if m.get("tokens_per_s_per_node") else "")
        progress(f"[{n}/{len(points)}] {label} EP{s.plan.ep} tokens {m['tokens_per_gpu']}: "
                 f"inter-node -{100 * m['a2a_reduction_vs_contiguous']:.1f}%, "
                 f"layer {m['layer_latency_us_mean']:.0f} us{serving} ({p.wall_s:.1f} s)")
    df = pd.DataFrame(rows)
    col = "metrics.tokens_per_s_per_node"
    if col in df and df[col].notna().any():
        best = df[col].idxmax()
        df["best"] = False
        df.loc[best, "best"] = True
        r = df.loc[best]
        progress(f"best: {r['label']} ({r['placement']}, EP{r['ep']}, {r['redundant_experts']:.0f} redundant): "
                 f"{r[col]:,.0f} tokens/s per node"
                 + (f", {r['metrics.time_per_output_token_ms']:.2f} ms per output token"
                    if pd.notna(r.get("metrics.time_per_output_token_ms")) else ""))
    return spec.get("sweep", {}).get("name", spec_path.stem), df, x


def figure(title: str, df, x: str = "tokens_per_gpu"):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if "error" in df:
        df = df[df["error"].isna()]
    eps = sorted(df["ep"].unique())
    metrics = [("metrics.a2a_bytes_inter_node", "inter-node all-to-all GiB / batch", 1 / 2 ** 30),
               ("metrics.layer_latency_us_mean", "MoE layer latency (us)", 1.0),
               ("metrics.max_over_mean_gpu_load", "GPU load max/mean", 1.0)]
    for col, name in (("metrics.tokens_per_s_per_node", "tokens/s per node"),
                      ("metrics.time_per_output_token_ms", "time per output token (ms)")):
        if col in df and df[col].notna().any():
            metrics.append((col, name, 1.0))
    fig = make_subplots(rows=len(metrics), cols=len(eps), shared_xaxes=True,
                        column_titles=[f"EP{e}" for e in eps], vertical_spacing=0.06)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for i, placement in enumerate(df["placement"].unique()):
        for c, ep in enumerate(eps, 1):
            d = df[(df["placement"] == placement) & (df["ep"] == ep)].sort_values(x)
            for r, (col, _, scale) in enumerate(metrics, 1):
                fig.add_trace(go.Scatter(x=d[x], y=d[col] * scale, mode="lines+markers",
                                         name=placement, legendgroup=placement, showlegend=(r == 1 and c == 1),
                                         line={"color": colors[i % len(colors)]}), row=r, col=c)
    if "best" in df and df["best"].any():
        b = df[df["best"] == True].iloc[0]                       # noqa: E712
        c = eps.index(b["ep"]) + 1
        for r, (col, _, scale) in enumerate(metrics, 1):
            fig.add_trace(go.Scatter(x=[b[x]], y=[b[col] * scale], mode="markers", name="best",
                                     legendgroup="best", showlegend=(r == 1),
                                     marker={"symbol": "star", "size": 16, "color": "gold",
                                             "line": {"color": "black", "width": 1}}), row=r, col=c)
    for r, (_, name, _) in enumerate(metrics, 1):
        fig.update_yaxes(title_text=name, row=r, col=1)
    for c in range(1, len(eps) + 1):
        fig.update_xaxes(title_text=x.replace("_", " "), type="log" if x == "tokens_per_gpu" else "linear",
                         row=len(metrics), col=c)
    fig.update_layout(title=title, height=300 * len(metrics), template="plotly_white")
    return fig


def write_html(fig, path: Path) -> None:
    """Self-contained (plotly.js inlined), written to a temp file and renamed."""
    from chakra_schema.safe_io import atomic_output
    with atomic_output(path, "w") as f:   # the user's umask (0644 by default), not mkstemp's 0600
        fig.write_html(f, include_plotlyjs=True, full_html=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("moe_placement.html"))
    ap.add_argument("--csv", type=Path, help="also write the table as CSV")
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--quick", action="store_true", help="reduced model and routing (for tests)")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    title, df, x = run(args.spec, (QUICK if args.quick else []) + args.sets,
                       progress=lambda line: print(line, file=sys.stderr))
    write_html(figure(title, df, x), args.out)
    if args.csv:
        from chakra_schema.safe_io import atomic_output
        with atomic_output(args.csv, "w") as f:
            df.to_csv(f, index=False)
    print(f"{len(df)} points -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
