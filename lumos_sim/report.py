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
from pathlib import Path
from typing import Any, Sequence

from chakra_schema.errors import TraceInputError

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px} p.sub{color:#555;margin-top:0}
table{border-collapse:collapse;font-size:13px} td,th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:right}
td.l,th.l{text-align:left} .note{color:#555;font-size:13px}"""

# breakdown columns (microseconds) -> legend names, in stacking order
_BREAKDOWN_PARTS = (("compute_us", "compute"), ("exposed_tp_comm_us", "exposed TP comm"),
                    ("exposed_cp_comm_us", "exposed CP comm"), ("exposed_ep_comm_us", "exposed EP comm"),
                    ("exposed_pp_comm_us", "exposed PP comm"), ("exposed_dp_comm_us", "exposed DP comm"))


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
        ok["throughput"], unit = _throughput(ok)
        sections += [("Throughput vs GPUs", _throughput_vs_gpus(ok, unit)),
                     ("Step-time breakdown per point", _breakdown_per_point(ok)),
                     ("Throughput vs memory per GPU (Pareto front)",
                      _pareto(ok, unit) if _has(ok, "memory_gib_per_gpu") else
                      "<p class=note>These what-ifs give no memory estimate.</p>"),
                     ("Best points", _best_table(ok))]
    else:
        sections.append(("No results", "<p class=note>No point has been evaluated successfully yet.</p>"))
    errors = df[df["status"] == "error"]
    if len(errors):
        sections.append((f"Failed points ({len(errors)})",
                         _table(("point", "label", "error"), errors[["point", "label", "error"]].head(50).values.tolist(), 3)))
    return _write_atomic(_page(name, subtitle, sections), path)


def _gpus_column(ok):
    for col in ("gpus_used", "plan.gpus"):
        if col in ok.columns and ok[col].notna().any():
            return ok[col].fillna(0).astype(int)
    return [0] * len(ok)


def _has(df, col: str) -> bool:
    return col in df.columns and bool(df[col].notna().any())


def _throughput(ok):
    """Tokens/s where the what-if gives it, else steps/s (1 / step time)."""
    if "tokens_per_s" in ok.columns and ok["tokens_per_s"].notna().all():
        return ok["tokens_per_s"].astype(float), "tokens/s"
    return 1.0 / ok["step_time_s"].astype(float), "steps/s"


def _series_key(ok) -> str | None:
    """A column that splits the points into series (hardware, model) when it takes several values."""
    for col in ("hardware.name", "model.name"):
        if col in ok.columns and ok[col].nunique() > 1:
            return col
    return None


def _throughput_vs_gpus(ok, unit: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    key = _series_key(ok)
    groups = ok.groupby(key, sort=False) if key else [("", ok)]
    for name, g in groups:
        prefix = f"{name}: " if key else ""
        if g["gpus"].duplicated().any():  # several points per GPU count: show them all, the best joined
            fig.add_trace(go.Scatter(x=g["gpus"], y=g["throughput"], mode="markers", name=f"{prefix}every point",
                                     text=g["label"], marker=dict(size=7, opacity=0.45),
                                     hovertemplate="%{text}<br>%{x} GPUs<br>%{y:,.4g} " + unit + "<extra></extra>"))
        best = g.loc[g.groupby("gpus")["throughput"].idxmax()].sort_values("gpus")
        fig.add_trace(go.Scatter(x=best["gpus"], y=best["throughput"], mode="lines+markers",
                                 name=f"{prefix}best per GPU count", text=best["label"],
                                 hovertemplate="%{text}<br>%{x} GPUs<br>%{y:,.4g} " + unit + "<extra></extra>",
                                 marker=dict(size=10), line=dict(width=2)))
    log_x = ok["gpus"].nunique() > 2 and ok["gpus"].max() >= 4 * max(ok["gpus"].min(), 1)
    return _layout(fig, "GPUs", unit, xaxis_type="log" if log_x else None)


def _breakdown_per_point(ok):
    import plotly.graph_objects as go

    fig = go.Figure()
    many = len(ok) > 40
    x = ok["point"] if many else ok["label"]
    window = _col(ok, "breakdown.window_us")
    parts = {}
    for col, name in _BREAKDOWN_PARTS:
        parts[name] = _col(ok, f"breakdown.{col}")
    by_kind = sum(v for k, v in parts.items() if k.startswith("exposed"))
    parts["exposed comm (other)"] = (_col(ok, "breakdown.exposed_comm_us") - by_kind).clip(lower=0)
    parts["idle / pipeline bubble"] = _col(ok, "breakdown.idle_us")
    parts["other"] = (window - sum(parts.values())).clip(lower=0)
    for name, us in parts.items():
        if float(us.sum()) <= 0:
            continue
        fig.add_trace(go.Bar(x=x, y=us / 1e6, name=name, text=ok["label"],
                             hovertemplate=f"%{{text}}<br>{name}: %{{y:.3f}} s<extra></extra>", textposition="none"))
    if not fig.data:  # no breakdown at all: the step time alone
        fig.add_trace(go.Bar(x=x, y=ok["step_time_s"], name="step time", text=ok["label"], textposition="none"))
    return _layout(fig, "point" if many else "", "step time (s)", barmode="stack", height=520,
                   xaxis_tickangle=-30)


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


def _pareto(ok, unit: str):
    """Points with a memory estimate; the Pareto front among those that fit."""
    import plotly.graph_objects as go

    fig = go.Figure()
    pts = ok[ok["memory_gib_per_gpu"].notna()]
    oom = pts["oom"].fillna(False).astype(bool) if "oom" in pts.columns else pts["memory_gib_per_gpu"] < 0
    by_gpus = pts["gpus"].nunique() > 1  # colour by GPU count: the front is usually one count's
    for mask, name, color in ((~oom, "fits in memory", "#1f77b4"), (oom, "out of memory", "#d62728")):
        g = pts[mask]
        if len(g):
            marker = dict(size=7, color=color, opacity=0.55)
            if by_gpus and name == "fits in memory":
                marker.update(color=g["gpus"], colorscale="Viridis", cmin=pts["gpus"].min(), cmax=pts["gpus"].max(),
                              colorbar=dict(title="GPUs", thickness=12))
            fig.add_trace(go.Scatter(x=g["memory_gib_per_gpu"], y=g["throughput"], mode="markers", name=name,
                                     text=g["label"], marker=marker,
                                     hovertemplate="%{text}<br>%{x:.1f} GiB<br>%{y:,.4g} " + unit + "<extra></extra>"))
    fit = pts[~oom]
    idx = pareto_front(fit["memory_gib_per_gpu"].tolist(), fit["throughput"].tolist())
    front = fit.iloc[idx]
    fig.add_trace(go.Scatter(x=front["memory_gib_per_gpu"], y=front["throughput"], mode="lines+markers",
                             name="Pareto front", text=front["label"], line=dict(shape="hv", width=2, color="#2ca02c"),
                             marker=dict(size=10, color="#2ca02c"),
                             hovertemplate="%{text}<br>%{x:.1f} GiB<br>%{y:,.4g} " + unit + "<extra></extra>"))
    return _layout(fig, "memory per GPU (GiB)", unit)


def _best_table(ok) -> str:
    best = ok.sort_values("throughput", ascending=False).head(20)
    rows = []
    for _, r in best.iterrows():
        rows.append((r["label"], r["point"], r["gpus"], _num(r.get("step_time_s"), ".3f"),
                     _num(r.get("tokens_per_s"), ",.0f"), _num(100 * _f(r.get("mfu")), ".1f"),
                     _num(r.get("memory_gib_per_gpu"), ".1f")))
    return _table(("label", "point", "GPUs", "step s", "tokens/s", "MFU %", "memory GiB"), rows)


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
