"""HTML reports: one self-contained file (plotly.js inlined, so it opens offline) per sweep or replay.

- `write_sweep_report(df, path)`: throughput vs GPUs (every point, and the best per GPU count), the
  stacked step-time breakdown of every point, throughput vs memory per GPU with its Pareto front, and a
  table of the best points.
- `write_replay_report(result, path)`: step time per rank and step (measured beside predicted where the
  trace has it), the breakdown per rank, and the critical-path categories per rank.

Plots use SVG traces only (no WebGL), so they render in any browser, headless ones included.
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from chakra_schema.errors import TraceInputError

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px} p.sub{color:#555;margin-top:0}
table{border-collapse:collapse;font-size:13px} td,th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:right}
td.l,th.l{text-align:left} .note{color:#555;font-size:13px}"""

# ============================================================================ page assembly
def _page(title: str, subtitle: str, sections: Sequence[tuple[str, Any]]) -> str:
    """Sections are (heading, plotly figure or an HTML string); plotly.js is inlined once, first."""
    body, first = [], True
    for n, (heading, content) in enumerate(sections):
        body.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(content, str):
            body.append(content)
            continue
        body.append(content.to_html(full_html=False, include_plotlyjs=first, div_id=f"plot-{n}",
                                    config={"displaylogo": False, "responsive": True}))
        first = False
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1><p class='sub'>{html.escape(subtitle)}</p>"
            + "\n".join(body) + "</body></html>")


def _write_atomic(text: str, path: str | os.PathLike) -> Path:
    from chakra_schema.safe_io import atomic_output
    out = Path(path)
    if not out.parent.is_dir():
        raise TraceInputError(out, f"output folder {out.parent} does not exist")
    with atomic_output(out, "w") as f:   # a private temp name, the user's umask, one-line errors
        f.write(text)
    return out


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    def cell(tag: str, i: int, v: Any) -> str:
        return f"<{tag}{' class=l' if i < left else ''}>{html.escape(str(v))}</{tag}>"
    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _layout(fig, xtitle: str, ytitle: str, **kw) -> Any:
    fig.update_layout(template="plotly_white", height=kw.pop("height", 440), margin=dict(l=70, r=20, t=50, b=60),
                      xaxis_title=xtitle, yaxis_title=ytitle, legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0), **kw)
    return fig


# ============================================================================ sweep report
# The report is built from what the sweep varies (the input columns whose values differ between points):
# - x axis: the GPU count when it varies (its own ticks), else the first varied axis (categorical when
#   not numeric: hardware names, placements, strategies);
# - series: the other varied axes, except the plan's parallel degrees under a GPU-count axis (those are
#   the candidate plans of one GPU count: every point is shown, the best one per GPU count joined);
# - figure of merit: ETTR for the failures what-if, else tokens/s, else steps/s;
# - one breakdown bar per distinct configuration (its best point), as shares so communication shows.

# column -> (axis title, how one value reads in a legend: "{v}" is the value); other columns get their
# last dotted part with spaces
_AXES = {"gpus": ("GPUs", "{v} GPUs"), "plan.gpus": ("GPUs", "{v} GPUs"), "hardware.name": ("hardware", "{v}"),
         "model.name": ("model", "{v}"), "hardware.network.nic_gbps": ("NIC bandwidth (Gb/s)", "{v} Gb/s NICs"),
         "hardware.network.nics_per_node": ("NICs per node", "{v} NICs per node"),
         "hardware.node.nvlink_bw_gbs": ("NVLink bandwidth (GB/s)", "NVLink {v} GB/s"),
         "failure.strategy": ("recovery strategy", "{v}"),
         "failure.checkpoint_interval_min": ("checkpoint interval (min)", "{v}-min checkpoints"),
         "failure.rate_per_1000_node_days": ("failures per 1,000 node-days", "{v} failures per 1,000 node-days"),
         "failure.spares": ("hot spares", "{v} spares"), "moe.placement": ("expert placement", "{v}"),
         "moe.tokens": ("tokens per batch", "{v} tokens"), "moe.group_by": ("batch grouping", "grouped by {v}"),
         "moe.redundant_experts": ("redundant experts", "{v} redundant experts"), "plan.ep": ("EP degree", "EP{v}"),
         "plan.tp": ("TP degree", "TP{v}"), "plan.pp": ("PP degree", "PP{v}"), "plan.dp": ("DP degree", "DP{v}"),
         "plan.cp": ("CP degree", "CP{v}"), "plan.vp": ("virtual stages", "VP{v}"),
         "plan.micro_batch": ("micro-batch", "mb{v}"), "plan.seq_len": ("sequence length", "seq {v}"),
         "plan.global_batch": ("global batch", "batch {v}"), "plan.zero": ("ZeRO stage", "ZeRO-{v}"),
         "plan.recompute": ("recomputation", "recompute {v}"), "plan.precision": ("precision", "{v}")}
# groups whose name column stands for every column of the group (a hardware sweep varies ~40 columns)
_NAMED_GROUPS = (("hardware.", "hardware.name"), ("model.", "model.name"))
_NOT_INPUTS = {"point", "status", "error", "whatif", "label", "scenario_key"}
_MAX_SERIES = 12


def axis_title(col: str) -> str:
    return _AXES[col][0] if col in _AXES else col.rsplit(".", 1)[-1].replace("_", " ")


def value_text(col: str, v) -> str:
    """One value of an axis as a legend or bar reads it: `1,024 GPUs`, `30-min checkpoints`, `h100-sxm`."""
    text = _fmt_value(v)
    if col in _AXES:
        return _AXES[col][1].format(v=text)
    return f"{axis_title(col)} {text}" if _numeric_value(v) else text


@dataclass
class SweepLayout:
    """What a sweep varies and how the report shows it."""
    x: str | None                    # x column (None: the points themselves)
    series: list[str]                # columns that split the points into series
    variants: list[str]              # plan columns that vary within one GPU count (candidate plans)
    metric: str                      # column of the figure of merit
    metric_title: str
    x_numeric: bool


def _varied_inputs(df) -> list[str]:
    """Input columns whose values differ between points, a named group collapsed to its name column."""
    end = list(df.columns).index("label") if "label" in df.columns else len(df.columns)
    cols = [c for c in df.columns[:end] if c not in _NOT_INPUTS]
    varied = [c for c in cols if df[c].astype(str).nunique(dropna=False) > 1]
    for prefix, name in _NAMED_GROUPS:
        if name in varied:
            varied = [c for c in varied if c == name or not c.startswith(prefix)]
    return varied


def _metric(ok) -> tuple[str, str]:
    """(column, title) of the figure of merit; the column is added to `ok` when derived."""
    if _has(ok, "metrics.ettr"):
        return "metrics.ettr", "ETTR"
    if _has(ok, "tokens_per_s"):
        return "tokens_per_s", "tokens/s"
    ok["steps_per_s"] = 1.0 / ok["step_time_s"].astype(float)
    return "steps_per_s", "steps/s"


def sweep_layout(ok) -> SweepLayout:
    varied = _varied_inputs(ok)
    metric, title = _metric(ok)
    if _gpus_vary(ok):
        plan = [c for c in varied if c.startswith("plan.") and c != "plan.gpus"]
        # plan columns that follow from the GPU count (one value per count, e.g. dp in a zip axis) are no
        # variants: only those taking several values within one GPU count are
        variants = [c for c in plan if ok.groupby("gpus")[c].nunique(dropna=False).max() > 1]
        series = [c for c in varied if not c.startswith("plan.")]
        return SweepLayout("gpus", _cap(ok, series, "gpus"), variants, metric, title, True)
    non_plan = [c for c in varied if not c.startswith("plan.")]
    plan = [c for c in varied if c.startswith("plan.")]
    order = non_plan + plan
    if not order:
        return SweepLayout(None, [], [], metric, title, False)
    x = order[0]
    numeric = _numeric(ok[x])
    return SweepLayout(x, _cap(ok, order[1:], x), [], metric, title, numeric)


def _independent(ok, x: str | None, cols: list[str]) -> list[str]:
    """The columns that are not a function of x and the columns kept before them (a zip axis: the global
    batch that follows the GPU count, the redundant experts that come with a placement, the failure
    what-if's own GPU count are the same axis, not extra series)."""
    kept: list[str] = []
    for c in cols:
        keys = ([x] if x else []) + kept
        if not keys or ok.groupby(keys, dropna=False)[c].nunique(dropna=False).max() > 1:
            kept.append(c)
    return kept


def _cap(ok, series: list[str], x: str | None = None) -> list[str]:
    """Series columns that vary on their own, dropped from the end while they make more than
    _MAX_SERIES series."""
    series = _independent(ok, x, list(series))
    while series and ok.groupby(series, dropna=False).ngroups > _MAX_SERIES:
        series.pop()
    return series


def _numeric(col) -> bool:
    import pandas as pd
    return bool(pd.to_numeric(col, errors="coerce").notna().all())


def _gpus_vary(ok) -> bool:
    return ok["gpus"].nunique() > 1


def _series_name(key, cols: list[str]) -> str:
    key = key if isinstance(key, tuple) else (key,)
    return ", ".join(value_text(c, v) for c, v in zip(cols, key))


def _numeric_value(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt_value(v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:,}" if isinstance(v, int) else str(v)


def write_sweep_report(df, path: str | os.PathLike, title: str | None = None) -> Path:
    """The HTML report of a sweep results table (as `lumos_sim.sweep` returns or `lumos-sim sweep` writes)."""
    for col in ("status", "label", "step_time_s"):
        if col not in df.columns:
            raise TraceInputError(path, f"the results have no '{col}' column: not a what-if sweep table")
    ok = df[df["status"] == "ok"].copy()
    counts = df["status"].value_counts().to_dict()
    name = title or (df.attrs.get("sweep", {}) or {}).get("name") or "lumos-sim sweep"
    subtitle = (f"{len(df)} points: {counts.get('ok', 0)} evaluated, {counts.get('error', 0)} failed, "
                f"{counts.get('pending', 0)} pending")
    sections: list[tuple[str, Any]] = []
    if len(ok):
        ok["gpus"] = _gpus_column(ok)
        layout = sweep_layout(ok)
        ok = ok[ok[layout.metric].notna()]
    if len(ok):
        subtitle += "; varied: " + (", ".join(axis_title(c) for c in ([layout.x] if layout.x else [])
                                               + layout.series + layout.variants) or "nothing")
        xt = axis_title(layout.x) if layout.x else "point"
        failures = layout.metric == "metrics.ettr"
        heading = "ETTR (effective training time ratio)" if failures else "Throughput"
        sections.append((f"{heading} vs {xt}", _metric_plot(ok, layout)))
        if failures and _has(ok, "metrics.goodput_tokens_per_s"):
            sections.append((f"Goodput vs {xt}", _metric_plot(ok, layout, "metrics.goodput_tokens_per_s",
                                                              "goodput tokens/s")))
        best = _best_per_configuration(ok, layout)
        bd = _breakdown(best, layout)
        if bd is not None:
            sections.append(bd)
        if layout.metric != "metrics.ettr":
            sections.append(_pareto_section(ok, layout))
        sections.append((f"Best point per {'GPU count' if layout.x == 'gpus' else 'configuration'}",
                         _best_table(best, layout)))
    else:
        sections.append(("No results", "<p class=note>No point has been evaluated successfully yet.</p>"))
    errors = df[df["status"] == "error"]
    if len(errors):
        sections.append((f"Failed points ({len(errors)})",
                         _table(("point", "label", "error"), errors[["point", "label", "error"]].head(50).values.tolist(), 3)))
    return _write_atomic(_page(name, subtitle, sections), path)


def _gpus_column(ok):
    for col in ("gpus_used", "plan.gpus", "metrics.gpus"):
        if col in ok.columns and ok[col].notna().any():
            return ok[col].fillna(0).astype(int)
    return [0] * len(ok)


def _has(df, col: str) -> bool:
    return col in df.columns and bool(df[col].notna().any())


def _x_values(ok, layout: SweepLayout):
    if layout.x is None:
        return ok["label"].astype(str)
    return ok[layout.x] if layout.x_numeric else ok[layout.x].astype(str)


def _x_axis(ok, layout: SweepLayout) -> dict:
    """GPU counts (and other numeric axes with few values) as their own ticks; log when they span 4x or
    more; categories in the sweep's order otherwise."""
    if layout.x is None or not layout.x_numeric:
        order = list(dict.fromkeys(_x_values(ok, layout)))
        return dict(type="category", categoryorder="array", categoryarray=order)
    vals = sorted(set(float(v) for v in ok[layout.x]))
    axis: dict = {}
    if len(vals) > 2 and vals[0] > 0 and vals[-1] >= 4 * vals[0]:
        axis["type"] = "log"
    if len(vals) <= 16:
        axis.update(tickmode="array", tickvals=vals, ticktext=[_fmt_value(v) for v in vals])
    return axis


def _groups(ok, cols: list[str]):
    return ok.groupby(cols, sort=False, dropna=False) if cols else [("", ok)]


def _metric_plot(ok, layout: SweepLayout, metric: str | None = None, title: str | None = None):
    """The figure of merit vs the x axis: one line per series through its best point per x value, and
    every candidate plan as a faint marker when there are several per x value."""
    import plotly.graph_objects as go

    metric, title = metric or layout.metric, title or layout.metric_title
    fig = go.Figure()
    xt = axis_title(layout.x) if layout.x else "point"
    for key, g in _groups(ok, layout.series):
        name = _series_name(key, layout.series) if layout.series else ""
        x = _x_values(g, layout)
        g = g.assign(_x=x.values)
        hover = "%{text}<br>" + xt + " %{x}<br>%{y:,.4g}<extra></extra>"
        if g["_x"].duplicated().any():
            fig.add_trace(go.Scatter(x=g["_x"], y=g[metric], mode="markers", text=g["label"], hovertemplate=hover,
                                     name=f"{name + ': ' if name else ''}every plan", marker=dict(size=6, opacity=0.35)))
        best = g.loc[g.groupby("_x", sort=False)[metric].idxmax()]
        if layout.x_numeric:
            best = best.sort_values("_x")
        label = name or ("best per GPU count" if layout.x == "gpus" else title)
        if layout.x_numeric:   # a trend along a numeric axis: a line
            fig.add_trace(go.Scatter(x=best["_x"], y=best[metric], mode="lines+markers", text=best["label"],
                                     hovertemplate=hover, marker=dict(size=9), line=dict(width=2), name=label))
        else:                  # categories (hardware, placements, strategies): bars side by side
            fig.add_trace(go.Bar(x=best["_x"], y=best[metric], text=best["label"], textposition="none",
                                 hovertemplate=hover, name=label))
    fig.update_layout(xaxis=_x_axis(ok, layout), barmode="group")
    return _layout(fig, xt, title, showlegend=len(fig.data) > 1)


def _best_per_configuration(ok, layout: SweepLayout):
    """The best point of every distinct configuration: per x value and series, the candidate plan with
    the highest figure of merit."""
    keys = ([layout.x] if layout.x else []) + layout.series
    if not keys:
        return ok
    best = ok.loc[ok.groupby(keys, sort=False, dropna=False)[layout.metric].idxmax()]
    return best.sort_values(keys) if layout.x_numeric else best


def _config_name(row, layout: SweepLayout) -> str:
    parts = [value_text(c, row[c]) for c in ([layout.x] if layout.x else []) + layout.series]
    return ", ".join(parts) or str(row["label"])


# breakdown sources, first with data wins: (title, unit, share?, [(column, legend name)], communication parts)
_STEP_PARTS = [("compute_us", "compute"), ("exposed_tp_comm_us", "exposed TP comm"), ("exposed_cp_comm_us", "exposed CP comm"),
               ("exposed_ep_comm_us", "exposed EP comm"), ("exposed_pp_comm_us", "exposed PP comm"),
               ("exposed_dp_comm_us", "exposed DP comm")]
_MOE_PARTS = [("metrics.expert_gemm_us_mean", "expert GEMMs"), ("metrics.dispatch_us_mean", "all-to-all dispatch"),
              ("metrics.combine_us_mean", "all-to-all combine")]
_FAILURE_PARTS = [(f"metrics.time_lost_{k}_h", k.replace("_", " ")) for k in
                  ("detection", "restart", "checkpoint_load", "spare_wait", "recompute", "degraded", "checkpoint_writes")]


def _breakdown(best, layout: SweepLayout):
    """(heading, figure) of one stacked bar per configuration, or None when the what-if gives none."""
    import plotly.graph_objects as go

    failures = layout.metric == "metrics.ettr" and any(_has(best, c) for c, _ in _FAILURE_PARTS)
    if failures:
        parts = {name: _col(best, c) for c, name in _FAILURE_PARTS}
        heading, unit, total = "Time lost to failures per configuration, by cause", "hours over the horizon", None
    elif _has(best, "breakdown.window_us") and float(_col(best, "breakdown.window_us").max()) > 0:
        window = _col(best, "breakdown.window_us")
        parts = {name: _col(best, f"breakdown.{c}") for c, name in _STEP_PARTS}
        by_kind = sum(v for k, v in parts.items() if k.startswith("exposed"))
        parts["exposed comm (other)"] = (_col(best, "breakdown.exposed_comm_us") - by_kind).clip(lower=0)
        if _has(best, "breakdown.host_wait_us"):
            parts["GPU waiting for the host"] = _col(best, "breakdown.host_wait_us")
        parts["idle / pipeline bubble"] = _col(best, "breakdown.idle_us")
        parts["other"] = (window - sum(parts.values())).clip(lower=0)
        heading, unit, total = "Step-time breakdown per configuration (share of the step)", "% of the step", window
    elif any(_has(best, c) for c, _ in _MOE_PARTS):
        parts = {name: _col(best, c) for c, name in _MOE_PARTS}
        total = sum(parts.values())
        heading, unit = "MoE layer time per configuration (share of the layer)", "% of the MoE layer"
    else:
        return None
    names = [_config_name(r, layout) for _, r in best.iterrows()]
    fig = go.Figure()
    for name, v in parts.items():
        if float(v.sum()) <= 0:
            continue
        y = v if total is None else 100.0 * v / total.where(total > 0)
        fmt = "%{y:.1f}%" if total is not None else "%{y:.2f} h"
        fig.add_trace(go.Bar(x=names, y=y, name=name, text=best["label"], textposition="none",
                             hovertemplate="%{text}<br>" + name + ": " + fmt + "<extra></extra>"))
    fig.update_layout(xaxis=dict(type="category"))
    return heading, _layout(fig, "", unit, barmode="stack", height=480, xaxis_tickangle=-30 if len(names) > 6 else 0)


def _col(df, name: str):
    import pandas as pd

    return df[name].fillna(0).astype(float) if name in df.columns else pd.Series(0.0, index=df.index)


def pareto_front(memory, throughput) -> list[int]:
    """Positions of the points no other point beats on both (less memory, more throughput), by memory."""
    order = sorted(range(len(memory)), key=lambda i: (memory[i], -throughput[i]))
    front, best = [], float("-inf")
    for i in order:
        if throughput[i] > best:
            front.append(i)
            best = throughput[i]
    return front


def _pareto_section(ok, layout: SweepLayout) -> tuple[str, Any]:
    heading = "Throughput vs memory per GPU (Pareto front per GPU count)"
    if not _has(ok, "memory_gib_per_gpu"):
        return heading, "<p class=note>These what-ifs give no memory estimate.</p>"
    mem = ok["memory_gib_per_gpu"].dropna().astype(float)
    if mem.round(2).nunique() < 2:
        return heading, (f"<p class=note>Every point needs {mem.iloc[0]:.1f} GiB per GPU: no trade-off between "
                         "memory and throughput to show.</p>")
    return heading, _pareto(ok, layout)


def _pareto(ok, layout: SweepLayout):
    """Points with a memory estimate, one colour and one front (among the plans that fit) per GPU count."""
    import plotly.graph_objects as go

    fig = go.Figure()
    pts = ok[ok["memory_gib_per_gpu"].notna()]
    oom = pts["oom"].fillna(False).astype(bool) if "oom" in pts.columns else pts["memory_gib_per_gpu"] < 0
    metric = layout.metric
    hover = "%{text}<br>%{x:.1f} GiB<br>%{y:,.4g}<extra></extra>"
    for k, (gpus, g) in enumerate(sorted(pts.groupby("gpus"), key=lambda kv: kv[0])):
        color = _PALETTE[k % len(_PALETTE)]
        fits = g[~oom.loc[g.index]]
        fig.add_trace(go.Scatter(x=g["memory_gib_per_gpu"], y=g[metric], mode="markers", text=g["label"],
                                 hovertemplate=hover, name=f"{gpus:,} GPUs", legendgroup=str(gpus),
                                 marker=dict(size=7, color=color, opacity=0.45,
                                             symbol=["x" if o else "circle" for o in oom.loc[g.index]])))
        if len(fits):
            front = fits.iloc[pareto_front(fits["memory_gib_per_gpu"].tolist(), fits[metric].tolist())]
            fig.add_trace(go.Scatter(x=front["memory_gib_per_gpu"], y=front[metric], mode="lines+markers",
                                     text=front["label"], hovertemplate=hover, name=f"{gpus:,} GPUs: Pareto front",
                                     legendgroup=str(gpus), showlegend=False,
                                     line=dict(shape="hv", width=2, color=color), marker=dict(size=9, color=color)))
    if "oom" in pts.columns and oom.any():
        fig.add_annotation(text="x: out of memory", xref="paper", yref="paper", x=1, y=1.08, showarrow=False)
    return _layout(fig, "memory per GPU (GiB)", layout.metric_title)


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _best_table(best, layout: SweepLayout) -> str:
    rows = []
    for _, r in best.head(60).iterrows():
        rows.append((_config_name(r, layout), r["label"], r["point"], r["gpus"], _num(r.get(layout.metric), ",.0f" if _f(r.get(layout.metric)) >= 100 else ".4g"),
                     _num(r.get("step_time_s"), ".3f"), _num(100 * _f(r.get("mfu")), ".1f"),
                     _num(r.get("memory_gib_per_gpu"), ".1f")))
    return _table(("configuration", "best point", "point", "GPUs", layout.metric_title, "step s", "MFU %",
                   "memory GiB"), rows, left=2)


def _f(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _num(v, spec: str) -> str:
    v = _f(v)
    return "-" if v != v else format(v, spec)


# ============================================================================ replay report
def write_replay_report(result, path: str | os.PathLike, title: str = "lumos-sim replay") -> Path:
    """The HTML report of a `ReplayResult`: per-rank step times, breakdowns and critical-path categories."""
    subtitle = (f"{result.timing} timing, {result.num_nodes:,} nodes, {len(result.ranks)} ranks; "
                f"step time {result.step_time_us / 1000:.3f} ms (slowest rank, mean over steps)")
    sections = [("Step time per rank", _replay_step_times(result)),
                ("Breakdown per rank (sum over steps)", _replay_breakdown(result)),
                ("Critical-path categories per rank (share of the step, mean over steps)", _replay_critical_path(result)),
                ("Steps", _replay_table(result))]
    return _write_atomic(_page(title, subtitle, sections), path)


def _replay_step_times(result):
    """Predicted (and measured, where the trace has it) step time of every rank and step, grouped by rank."""
    import plotly.graph_objects as go

    steps = sorted(result.steps, key=lambda s: s.rank)
    x = [[f"rank {s.rank}" for s in steps], [s.name for s in steps]]
    fig = go.Figure(go.Bar(x=x, y=[s.predicted_us / 1000 for s in steps], name="predicted"))
    if any(s.measured_us for s in steps):
        fig.add_trace(go.Bar(x=x, y=[(s.measured_us or 0) / 1000 for s in steps], name="measured", opacity=0.6))
    return _layout(fig, "", "step time (ms)", barmode="group")


def _replay_breakdown(result):
    import plotly.graph_objects as go

    fig = go.Figure()
    ranks = sorted(result.ranks)
    x = [f"rank {r}" for r in ranks]
    b = [result.ranks[r] for r in ranks]
    parts = {"compute": [v.compute_us for v in b], "exposed comm": [v.exposed_comm_us for v in b],
             "idle": [v.idle_us for v in b]}
    for name, us in parts.items():
        fig.add_trace(go.Bar(x=x, y=[u / 1000 for u in us], name=name))
    return _layout(fig, "", "time (ms)", barmode="stack")


def _replay_critical_path(result):
    import plotly.graph_objects as go

    fig = go.Figure()
    ranks = sorted({s.rank for s in result.steps})
    share: dict[str, dict[int, float]] = {}
    for r in ranks:
        steps = [s for s in result.steps if s.rank == r]
        for s in steps:
            for cat, v in s.critical_path.items():
                share.setdefault(cat, {}).setdefault(r, 0.0)
                share[cat][r] += v / len(steps)
    for cat in sorted(share, key=lambda c: -sum(share[c].values())):
        fig.add_trace(go.Bar(x=[f"rank {r}" for r in ranks], y=[100 * share[cat].get(r, 0.0) for r in ranks], name=cat))
    if not fig.data:
        fig.add_trace(go.Bar(x=[f"rank {r}" for r in ranks], y=[0.0] * len(ranks), name="no critical path"))
    return _layout(fig, "", "% of the step", barmode="stack")


def _replay_table(result) -> str:
    rows = []
    for s in result.steps[:200]:
        err = "-" if s.error is None else f"{100 * s.error:+.2f}%"
        cp = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(s.critical_path.items(), key=lambda kv: -kv[1])[:3])
        rows.append((s.name, s.rank, "-" if not s.measured_us else f"{s.measured_us / 1000:.3f}",
                     f"{s.predicted_us / 1000:.3f}", err, cp))
    return _table(("step", "rank", "measured ms", "predicted ms", "error", "critical path"), rows)
