"""The report's goodput figure: expected goodput against the checkpoint interval (results/goodput.py, Daly's model),
one curve per engine, with the failure campaigns' measured goodput (`endure`, endure.json) on their curves; and,
beside, each engine's curve at the runs' at_gpus= scale from what the runs measured (summary.json `goodput`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure

from analysis.layout import caption, fit, legend, title
from analysis.table import Group
from restart_harness.results import goodput

ENDURE = "endure.json"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def campaigns(paths: list[str]) -> list[dict]:
    """Every finished failure campaign (endure.json with its model's figures) at or below the paths."""
    found = []
    for top in map(Path, paths):
        for path in sorted([top / ENDURE] if (top / ENDURE).is_file() else top.rglob(ENDURE)):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if doc.get("state") == "complete" and doc.get("model"):
                found.append({**doc, "engine": _engine(doc)})
    return found


def _engine(doc: dict) -> str:
    return next((t.split("=", 1)[1] for t in doc["command"] if t.startswith("engine=")), "default")


def _grid(low: float, high: float, n: int = 80) -> list[float]:
    return [low * (high / low) ** (i / (n - 1)) for i in range(n)]


def _curve(ax, color: str, label: str, costs: tuple[float, float, float], mtbf: float, xs: list[float],
           share: float = 1.0) -> None:
    """Expected goodput against the interval at (save, restart, step) costs, times `share`, with its best marked."""
    save, restart, step = costs
    best = goodput.optimum(save, restart, step, mtbf)
    ax.plot(xs, [share * goodput.expected_goodput(x, save, restart, mtbf) for x in xs], color=color, label=label)
    ax.plot([best["best_interval_seconds"]], [share * best["goodput_at_best"]], marker="^", color=color, markersize=7)


def _campaign_panel(ax, found: list[dict]) -> None:
    """Per engine and MTBF: the model at the campaigns' realized failure rate, less the first start-up's share
    (docs/goodput.md), their median costs; each campaign's measured goodput at its interval."""
    series: dict[tuple, list[dict]] = {}
    for doc in found:
        series.setdefault((doc["engine"], doc["mtbf_seconds"]), []).append(doc)
    every = [d["model"]["interval_seconds"] for d in found] + [d["model"]["best_interval_seconds"] for d in found]
    xs = _grid(min(every) / 4, max(every) * 4)
    for i, ((engine, mtbf), docs) in enumerate(sorted(series.items())):
        color = COLORS[i % len(COLORS)]
        med = {k: statistics.median(d["model"][k] for d in docs) for k in (
            "save_seconds", "restart_seconds", "realized_mtbf_seconds")}
        step = statistics.median(d["step_seconds_median"] for d in docs)
        share = statistics.median(1 - d["model"]["first_startup_seconds"] / d["wall_seconds"] for d in docs)
        realized = med["realized_mtbf_seconds"]
        _curve(ax, color, f"{engine}, mtbf={mtbf:g} s: model at the realized {realized:.0f} s",
               (med["save_seconds"], med["restart_seconds"], step), realized, xs, share)
        ax.scatter([d["model"]["interval_seconds"] for d in docs], [d["goodput"]["goodput"] for d in docs],
                   color=color, edgecolor="black", zorder=3, label=f"{engine}, mtbf={mtbf:g} s: measured")
    _axes(ax, "goodput (productive share of wall time)", "Failure campaigns: measured goodput beside the model's curve",
          "engine, failure rate")


def _scale_panel(ax, groups: list[Group]) -> None:
    """Each engine's curve at at_gpus= from its first run that measured a save, a restart and a step."""
    engines: dict[str, dict] = {}
    for g in groups:
        for run in g.runs:
            if entries := (run.summary or {}).get("goodput") or []:
                engines.setdefault(g.engine, entries[-1])
    every = [o["best_interval_seconds"] for o in engines.values()]
    xs = _grid(min(every) / 20, max(every) * 20)
    for i, (engine, o) in enumerate(sorted(engines.items())):
        _curve(ax, COLORS[i % len(COLORS)], f"{engine} ({o['gpus']:,} GPUs, MTBF {o['job_mtbf_seconds'] / 3600:.3g} h)",
               (o["save_seconds"], o["restart_seconds"], o["step_seconds"]), o["job_mtbf_seconds"], xs)
    _axes(ax, "expected goodput", "At scale, from the runs' measured save, restart and step", "engine (scale, job MTBF)")


def _axes(ax, ylabel: str, heading: str, legend_title: str) -> None:
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (seconds, log scale)")
    ax.set_ylabel(ylabel)
    title(ax, heading)
    legend(ax, title=legend_title)


def figure(found: list[dict], groups: list[Group]) -> Figure | None:
    """Goodput against the checkpoint interval; None where neither a campaign nor a run has the figures."""
    has_runs = any((r.summary or {}).get("goodput") for g in groups for r in g.runs)
    panels = [draw for draw, present in ((lambda ax: _campaign_panel(ax, found), found),
                                         (lambda ax: _scale_panel(ax, groups), has_runs)) if present]
    if not panels:
        return None
    fig = Figure(figsize=(11.0, 1.0 + 5.0 * len(panels)), layout="constrained")
    for ax, draw in zip(fig.subplots(len(panels), 1, squeeze=False)[:, 0], panels):
        draw(ax)
    caption(fig, "curves: expected goodput (Daly's model at the campaigns' measured costs, docs/goodput.md); "
                 "triangles: the model's best interval; dots: a failure campaign's measured goodput at its interval")
    return fit(fig)
