"""The study's figures: files and file sizes per strategy (planned), save and restart seconds per strategy and engine
(each bar marked by its source), and the runs' measurements against their predictions."""

from __future__ import annotations

import statistics

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from analysis.charts import LOG_SPAN, measured_vs_predicted
from analysis.study_rows import CHECKED, LOAD, per_writer, size_text
from restart_harness.schema import PREDICTED_TOTAL

HATCH = {"predicted": "///", "planned": "", "measured": "", "emulated": ".."}


def _per_model(table: list[dict], models: list[str], heading: str, note: str, draw, handles=None) -> Figure | None:
    """A panel per model (None without any), strategies along x: draw(ax, model, strategies) fills it; the legend
    (of handles, else of what the first panel drew) beside the first."""
    if not models:
        return None
    fig = Figure(figsize=(13, 0.6 + 3.4 * len(models)), layout="constrained")
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    for ax, model in zip(axes, models):
        keys = list(dict.fromkeys((r["gpus"], r["strategy"]) for r in table if r["model"] == model))
        draw(ax, model, keys)
        ax.set_xticks(range(len(keys)), [f"{strategy}\n{gpus} GPUs" for gpus, strategy in keys], fontsize="small")
        ax.set_title(f"{model}: {heading}", loc="left")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(**({"handles": handles} if handles else {}), fontsize="small", loc="upper left",
                   bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel(note, fontsize="x-small", color="0.4")
    return fig


def planned(study: dict) -> dict[tuple[str, int, str], dict]:
    """Per (model, GPU count, strategy): the planner's files of its first engine's cell (DeepSpeed's files)."""
    out: dict[tuple[str, int, str], dict] = {}
    for cell in study["cells"]:
        key = (cell["model"], cell["gpus"], cell["strategy"])
        if key in out:
            continue
        files = cell["plan"]["files"]
        sizes = [f[1] for f in files]
        out[key] = {"files": len(files), "per_rank": per_writer(files, lambda r: r)[0],
                    "per_node": per_writer(files, lambda r, n=cell["gpus_per_node"]: r // n)[0],
                    "min": min(sizes, default=0), "median": statistics.median(sizes) if sizes else 0,
                    "max": max(sizes, default=0), "total": sum(sizes)}
    return out


def files_figure(table: list[dict], plans: dict) -> Figure | None:
    """Files per checkpoint, and the most one node and one rank write, per strategy (planned)."""
    def draw(ax, model: str, keys: list) -> None:
        for i, (label, field) in enumerate((("files", "files"), ("most per node", "per_node"),
                                            ("most per rank", "per_rank"))):
            bars = ax.bar([x - 0.27 + 0.27 * i for x in range(len(keys))], [plans[(model, *k)][field] for k in keys],
                          width=0.26, label=label, color=f"C{i}")
            ax.bar_label(bars, fontsize="x-small", padding=1)
        ax.set_yscale("log")
        ax.margins(y=0.15)
        ax.set_ylabel("files (log scale)")

    return _per_model(table, list(dict.fromkeys(r["model"] for r in table)), "files of one checkpoint",
                      "planned (exact): DeepSpeed's files; an engine with its own layout (torchsnapshot) stores each "
                      "as a folder of shards", draw)


def sizes_figure(table: list[dict], plans: dict) -> Figure | None:
    """Each checkpoint's file sizes (min, median, max) and its total, per strategy, log scale (planned)."""
    def draw(ax, model: str, keys: list) -> None:
        got = [plans[(model, *k)] for k in keys]
        xs = list(range(len(keys)))
        ax.vlines(xs, [p["min"] for p in got], [p["max"] for p in got], color="C0", linewidth=7, alpha=0.45,
                  label="file sizes, smallest to largest")
        ax.scatter(xs, [p["median"] for p in got], color="C0", zorder=3, label="median file")
        ax.scatter(xs, [p["total"] for p in got], color="C3", marker="_", s=500, linewidths=2, zorder=3,
                   label="whole checkpoint")
        for x, p in zip(xs, got):
            ax.annotate(size_text(p["total"]), (x, p["total"]), textcoords="offset points", xytext=(0, 5),
                        ha="center", fontsize="x-small")
            ax.annotate(size_text(p["max"]), (x, p["max"]), textcoords="offset points", xytext=(6, -3),
                        fontsize="xx-small", color="C0")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=1024))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: size_text(v).replace(".00 ", " ")))
        ax.yaxis.set_minor_locator(LogLocator(base=1024, subs=(32.0,)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.margins(y=0.2)
        ax.set_ylabel("bytes (log scale)")

    return _per_model(table, list(dict.fromkeys(r["model"] for r in table)), "file sizes and the whole checkpoint",
                      "planned: tensor bytes exact, torch.save's pickle and zip estimated (docs/planner.md)", draw)


def _seconds_figure(table: list[dict], column: str, heading: str, inner: str | None = None) -> Figure | None:
    """Bars per strategy (x) and engine (colour); hatched and pale where predicted, dotted where emulated, solid where
    measured; with inner, a black mark at that part's seconds inside each bar."""
    engines = list(dict.fromkeys(r["engine"] for r in table))
    handles = [Patch(color=f"C{e}", label=engine) for e, engine in enumerate(engines)]
    handles += [Patch(facecolor="0.6", hatch=HATCH["predicted"], edgecolor="white", alpha=0.5, label="predicted"),
                Patch(facecolor="0.6", hatch=HATCH["emulated"], edgecolor="white", label="emulated"),
                Patch(facecolor="0.6", label="measured")]
    handles += [Line2D([], [], color="black", linewidth=2.5, label="its checkpoint load")] if inner else []
    models = [m for m in dict.fromkeys(r["model"] for r in table)
              if any(r.get(column) is not None for r in table if r["model"] == m)]
    return _per_model(table, models, heading, "n/p: not predicted (a GPU's model build and first step from a CPU "
                      "calibration: why in study.csv); predicted for the cell's device, calibration and storage; "
                      "engines not in the calibration take the default engine's rates (study.md)",
                      lambda ax, model, keys: _seconds_panel(ax, [r for r in table if r["model"] == model], keys,
                                                             engines, column, inner), handles)


def _seconds_panel(ax, rs: list[dict], keys: list, engines: list[str], column: str, inner: str | None) -> None:
    by = {(r["gpus"], r["strategy"], r["engine"]): r for r in rs}
    values = [r[column] for r in by.values() if r.get(column)]
    log = max(values) > LOG_SPAN * min(values)
    bottom = blended_transform_factory(ax.transData, ax.transAxes)
    width = 0.8 / len(engines)
    for e, engine in enumerate(engines):
        for x, k in enumerate(keys):
            r = by.get((*k, engine))
            pos = x - 0.4 + width * (e + 0.5)
            if r is None or r.get(column) is None:
                ax.text(pos, 0.02, "n/p", transform=bottom, ha="center", va="bottom", fontsize="x-small",
                        rotation=90, color="0.35")
                continue
            source = r[f"{column}_source"]
            bars = ax.bar(pos, r[column], width=width * 0.92, color=f"C{e}", hatch=HATCH[source],
                          edgecolor="white", alpha=0.5 if source == "predicted" else 1.0)
            if not log:
                ax.bar_label(bars, fmt="{:,.0f}" if r[column] >= 100 else "{:.2f}", fontsize="xx-small",
                             padding=1, rotation=90)
            if inner and r.get(inner) is not None:
                ax.plot([pos - width * 0.4, pos + width * 0.4], [r[inner]] * 2, color="black", linewidth=2.5)
    if log:
        ax.set_yscale("log")
    else:
        ax.margins(y=0.18)
    ax.set_ylabel("seconds" + (" (log scale)" if log else ""))


def check_figure(table: list[dict]) -> Figure | None:
    """Every run: what it measured against what was predicted for it before it started (colour: the figure;
    marker: the engine)."""
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    busy = 0
    for r in table:
        busy += bool(r.get("check_machine_busy"))
        for name in CHECKED:
            m, p = r.get(f"check_{name}_measured"), r.get(f"check_{name}_predicted")
            if m and p and m > 0 and p > 0:
                points.setdefault((name, r["engine"]), []).append((m, p))
    if not points:
        return None
    names = list(dict.fromkeys(n for n, _ in points))
    engines = list(dict.fromkeys(e for _, e in points))
    series = [(pts, {"color": f"C{names.index(name)}", "s": 36, "marker": "osD^v"[engines.index(engine) % 5]}, None)
              for (name, engine), pts in points.items()]
    series += [([], {"color": f"C{i}"}, n.removesuffix("_seconds").replace("_", " ")) for i, n in enumerate(names)]
    series += [([], {"color": "0.4", "marker": "osD^v"[j % 5]}, f"engine {engine}") for j, engine in enumerate(engines)]
    fig = measured_vs_predicted(series, "The study's runs: measured against predicted, at each run's own size",
                                "measured by the run (s)", "predicted before it started (s)")
    runs = sum(1 for r in table if r.get("check_mode"))
    fig.supxlabel(f"{runs} runs; {busy} of them started on a busy machine (other work on its CPUs: the calibration's "
                  "machine was quiet)", fontsize="x-small", color="0.4")
    return fig


def figures(table: list[dict], study: dict) -> dict[str, Figure | None]:
    plans = planned(study)
    return {
        "study_files": files_figure(table, plans),
        "study_file_sizes_bytes": sizes_figure(table, plans),
        "study_save_durable_seconds": _seconds_figure(table, "save_durable_seconds",
                                                      "save until every file is durable"),
        "study_restart_seconds": _seconds_figure(table, PREDICTED_TOTAL, "restart, launch to first step done",
                                                 inner=LOAD),
        "study_prediction_check_seconds": check_figure(table),
    }

