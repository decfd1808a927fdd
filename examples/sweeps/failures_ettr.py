"""ETTR and goodput vs GPU count for synchronous restarts and FT-HSDP at 2-3 checkpoint intervals, as one
self-contained HTML plot (plotly.js inlined: opens offline).

    python examples/sweeps/failures_ettr.py -o failures_ettr.html [--csv failures_ettr.csv]
    python examples/sweeps/failures_ettr.py --gpus 1024,16384 --intervals 30 --trials 50 -o quick.html
    python examples/sweeps/failures_ettr.py --model none -o ettr_only.html     # ETTR only, no step time

The grid and the base scenario are those of `failures_ettr.toml` beside this script (the spec that
`lumos-sim sweep` runs); each point goes through `estimators.registry.evaluate`.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

SPEC = Path(__file__).resolve().with_name("failures_ettr.toml")


def load_grid(spec_path: Path = SPEC):
    """(base scenario, [(gpus, global batch)], strategies, intervals) from the sweep spec."""
    from chakra_schema.errors import read_toml
    from estimators.scenario import Scenario

    spec = read_toml(spec_path, "sweep spec")
    base = Scenario.from_dict(spec["scenario"], path=str(spec_path))
    zipped = next(a["zip"] for a in spec["axes"] if "zip" in a)
    grid = next(a["grid"] for a in spec["axes"] if "grid" in a)
    sizes = list(zip(zipped["plan.gpus"], zipped["plan.global_batch"]))
    return base, sizes, grid["failure.strategy"], grid["failure.checkpoint_interval_min"]


def points(base, sizes, strategies, intervals, trials: int | None):
    """Every scenario of the grid, with its GPU count, strategy and interval."""
    for gpus, batch in sizes:
        for strategy in strategies:
            for interval in intervals:
                changes = {"failure.strategy": strategy, "failure.checkpoint_interval_min": interval}
                if trials is not None:
                    changes["failure.trials"] = trials
                # the plan carries the job size either way (without a model it gives the GPUs and DP degree)
                changes.update({"plan.global_batch": batch, "plan.gpus": gpus})
                yield gpus, strategy, interval, base.override(changes)


def evaluate_grid(base, sizes, strategies, intervals, trials=None, progress=None) -> list[dict]:
    from estimators.registry import evaluate

    todo = list(points(base, sizes, strategies, intervals, trials))
    rows = []
    for n, (gpus, strategy, interval, scenario) in enumerate(todo, 1):
        m = evaluate(scenario).metrics
        rows.append({"gpus": gpus, "strategy": strategy, "checkpoint_interval_min": interval, **m})
        if progress:
            progress(n, len(todo))
    return rows


def figure(rows: list[dict], title: str):
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    COLORS = qualitative.Plotly
    goodput = any(r.get("goodput_tokens_per_s") is not None for r in rows)
    fig = make_subplots(rows=1, cols=2 if goodput else 1, horizontal_spacing=0.1,
                        subplot_titles=("ETTR (closed form; Monte Carlo 5-95% band as error bars)",
                                        "goodput, tokens/s") if goodput else ("ETTR",))
    series = sorted({(r["strategy"], r["checkpoint_interval_min"]) for r in rows})
    for i, (strategy, interval) in enumerate(series):
        rs = sorted((r for r in rows if (r["strategy"], r["checkpoint_interval_min"]) == (strategy, interval)),
                    key=lambda r: r["gpus"])
        name = f"{strategy}, checkpoint every {interval:g} min"
        dash = "solid" if strategy == "sync" else "dash"
        line = dict(dash=dash, color=COLORS[i % len(COLORS)])   # one colour per series in both plots
        x = [r["gpus"] for r in rs]
        err = dict(type="data", symmetric=False, array=[_gap(r["ettr_p95"], r["ettr"]) for r in rs],
                   arrayminus=[_gap(r["ettr"], r["ettr_p05"]) for r in rs])
        fig.add_trace(go.Scatter(x=x, y=[r["ettr"] for r in rs], name=name, legendgroup=name, error_y=err,
                                 mode="lines+markers", line=line), row=1, col=1)
        if goodput:
            fig.add_trace(go.Scatter(x=x, y=[r.get("goodput_tokens_per_s") for r in rs], name=name,
                                     legendgroup=name, showlegend=False, mode="lines+markers", line=line),
                          row=1, col=2)
    fig.update_xaxes(type="log", title_text="GPUs")
    fig.update_yaxes(title_text="effective training time ratio", range=[0, 1.02], row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=520)
    return fig


def _gap(a, b) -> float:
    return max(0.0, a - b) if a is not None and b is not None else 0.0


def write_html_atomically(fig, path: str) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written report."""
    from chakra_schema.safe_io import atomic_output
    with atomic_output(path, "w") as f:   # the shared writer: the user's umask, one-line errors
        fig.write_html(f, include_plotlyjs=True, full_html=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default="failures_ettr.html", help="HTML plot to write")
    ap.add_argument("--csv", help="also write the rows as CSV")
    ap.add_argument("--gpus", help="comma-separated subset of the spec's GPU counts")
    ap.add_argument("--intervals", help="comma-separated checkpoint intervals, minutes (default: the spec's)")
    ap.add_argument("--strategies", help="comma-separated (default: the spec's sync,ft-hsdp)")
    ap.add_argument("--trials", type=int, help="Monte Carlo trials per point (default: the spec's)")
    ap.add_argument("--model", help="'none': ETTR only (the failure what-if without a step time)")
    args = ap.parse_args(argv)

    from chakra_schema.errors import TraceInputError
    from lumos_sim.progress import progress_bar

    try:
        base, sizes, strategies, intervals = load_grid()
        if args.gpus:
            keep = {int(g) for g in args.gpus.split(",")}
            sizes = [s for s in sizes if s[0] in keep] or sys.exit(f"error: --gpus {args.gpus}: none of the spec's counts")
        if args.intervals:
            intervals = [float(v) for v in args.intervals.split(",")]
        if args.strategies:
            strategies = args.strategies.split(",")
        if args.model == "none":
            base = dataclasses.replace(base, model=None)
        with progress_bar("evaluating") as cb:
            rows = evaluate_grid(base, sizes, strategies, intervals, args.trials, progress=cb)
    except (TraceInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    title = "ETTR and goodput vs GPUs: " + (base.model.name if base.model else "no model") + \
        f", failure model {rows[0]['failure_model']} ({rows[0]['failure_rate_per_1000_node_days']:.2f} per 1,000 node-days)"
    write_html_atomically(figure(rows, title), args.output)
    if args.csv:
        import pandas as pd

        from chakra_schema.safe_io import atomic_output
        with atomic_output(args.csv, "w") as f:
            pd.DataFrame(rows).to_csv(f, index=False)
    for r in rows:
        gp = r.get("goodput_tokens_per_s")
        print(f"{r['gpus']:>7} {r['strategy']:8s} every {r['checkpoint_interval_min']:>5g} min: ETTR {r['ettr']:.3f} "
              f"(MC {_fmt(r['ettr_mc'])})" + (f", goodput {gp:,.0f} tokens/s" if gp is not None else ""))
    print(f"wrote {args.output}")
    return 0


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


if __name__ == "__main__":
    sys.exit(main())
