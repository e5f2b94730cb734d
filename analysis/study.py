"""A study's table (`./submit-job.sh study`, docs/study.md) from study.json and its cells' runs: study.csv
(study_rows.py), study-files.csv, study.md and study.html (its tables, here) and its figures (here too)."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from analysis.layout import LOG_SPAN, measured_vs_predicted, pngs
from analysis.load import _read_json
from analysis.render import Table, documents
from analysis.study_rows import CHECKED, LOAD, file_rows, per_writer, rows, size_text
from analysis.table import to_csv
from restart_harness.files.atomic import write_bytes_atomic
from restart_harness.schema import PREDICTED_TOTAL, STUDY

HATCH = {"predicted": "///", "planned": "", "measured": "", "emulated": ".."}
TAG = {"measured": "meas", "emulated": "emul", "planned": "plan", "predicted": "pred"}
LEGEND = ("meas: measured by a real run at the real size; emul: emulated (the real-size files written and read back "
          "without training); plan: the planner (exact names and tensor bytes); pred: predicted by the calibrated "
          "model for the cell's device; -: neither (why in study.csv)")


def _tag(row: dict, name: str) -> str:
    return TAG.get(row.get(f"{name}_source") or "", "")


def _sec(row: dict, name: str) -> str:
    v = row.get(name)
    if v is None:
        return "-"
    text = f"{v:.2f}" if v < 100 else f"{v:,.0f}"
    error, borrowed = row.get(f"{name}_error"), row.get(f"{name}_borrowed")
    return f"{text} {_tag(row, name)}" + (f" ({error:+.0%} pred)" if error is not None else "") + (
        f" ({borrowed.split(':')[0]})" if borrowed else "")


def _total(n: float | None) -> str:
    """A checkpoint's size, binary, and in GB (10^9 bytes, the reference study's unit) from 1 GB up."""
    return f"{size_text(n)} ({n / 1e9:,.2f} GB)" if n is not None and n >= 1e9 else size_text(n)


def _count(n: float) -> str:
    unit, scale = next(((u, s) for u, s in (("B", 1e9), ("M", 1e6), ("k", 1e3)) if n >= s), ("", 1))
    return f"{n / scale:,.2f} {unit}" if unit else f"{n:,.0f}"


def _interval(row: dict) -> str:
    best = row.get("best_interval_seconds")
    return "-" if best is None else f"{best:,.0f} ({row['goodput_at_best']:.3f})"


def model_table(model: str, table: list[dict]) -> Table:
    rs = [r for r in table if r["model"] == model]
    first = rs[0]
    out = [[str(r["gpus"]) + (f" ({r['nodes']} nodes)" if r["nodes"] > 1 else ""),
            r["strategy"] + (" ref" if r.get("reference_checkpoint_gb") is not None else ""),
            r["engine"], r["how"],
            f"{r['files']} {_tag(r, 'files')}" + ("" if r["file_names"] == "predicted" else " *"),
            f"{r['files_per_rank_max']} / {r['files_per_node_max']}",
            r["file_sizes"], f"{_total(r['checkpoint_bytes'])} {_tag(r, 'checkpoint_bytes')}",
            _sec(r, "save_blocking_seconds"), _sec(r, "save_durable_seconds"), _sec(r, LOAD),
            _sec(r, PREDICTED_TOTAL), _interval(r)] for r in rs]
    vocabs = sorted({r["vocab_size"] for r in rs})
    return Table(f"{model}: {_count(first['parameters'])} parameters at tp{first['tp']}, vocabulary "
                 f"{', '.join(f'{v:,}' for v in vocabs)} (by tp), ZeRO-{first['zero']}, {first['precision']}",
                 ["GPUs", "strategy", "engine", "how", "files", "files per rank / node (max)", "file sizes",
                  "checkpoint", "save blocking s", "save durable s", "checkpoint load s", "restart s (with launch)",
                  "best checkpoint interval s (goodput)"],
                 out, note=LEGEND + ". *: the engine writes its own layout: DeepSpeed's logical files, sized. Best "
                 "interval: at the cell's GPUs and the study's failure rate (mtbf=, mtbf_per_node=, mtbf_per_gpu=; "
                 "default Llama 3's), from its save, restart and step (docs/goodput.md).")


def checks_table(table: list[dict]) -> Table | None:
    if not (rs := [r for r in table if r.get("check_mode")]):
        return None
    out = []
    for r in rs:
        cells = [r["id"], r["how"]]
        for name in CHECKED:
            m, p, e, n = (r.get(f"check_{name}_{k}") for k in ("measured", "predicted", "error", "not_comparable"))
            cells.append("-" if m is None else f"{m:.2f} / {'-' if p is None else f'{p:.2f}'}"
                         + ("" if e is None else f" ({e:+.0%})") + (f" (not compared: {n})" if n else ""))
        cells += [r["check_files"], "yes" if r.get("check_machine_busy") else "no"]
        out.append(cells)
    errors = [[abs(e) for r in rs if (e := r.get(f"check_{name}_error")) is not None] for name in CHECKED]
    out.append(["median absolute error", f"{len(rs)} runs",
                *(f"{statistics.median(e):.0%} over {len(e)}" if e else "-" for e in errors), "", ""])
    return Table("Runs: measured against the prediction made before each started (at the run's own size)",
                 ["cell", "how", "save durable s meas / pred", "checkpoint load s meas / pred",
                  "restart s (with launch) meas / pred", "files against the plan", "machine busy"], out,
                 note="A shrunk run's seconds are not the real size's: they check the predictor where it was run. "
                      "Not compared: measured under other conditions (machine load, ranks per core) than the "
                      "calibration's runs.")


def reference_table(table: list[dict]) -> Table | None:
    if not (rs := [r for r in table if r.get("reference_checkpoint_gb") is not None]):
        return None
    out = [[r["id"], f"{r['reference_checkpoint_gb']:.2f} GB, {r['reference_files']} files",
            (f"{r['checkpoint_bytes'] / 1e9:.2f} GB ({r['checkpoint_bytes']:,} bytes), {r['files']} files "
            f"{_tag(r, 'files')}"), "equal" if r["reference_equal"] else "DIFFERENT"] for r in rs]
    return Table("The reference study's log beside the planner", ["cell", "reference log", "here", "total and names"],
                 out, note=rs[0]["reference_source"])


def summary_table(study: dict, table: list[dict]) -> Table:
    # planned + predicted, shrunk, emulated at real size, ...; and why a cell was predicted only
    counts = Counter(r["how"].split(": ")[0].split(" K=")[0] for r in table)
    why = Counter(r["how"].removeprefix("planned + predicted: ") for r in table
                  if r["how"].startswith("planned + predicted: "))
    elapsed = (study.get("updated") or 0) - (study.get("started") or 0)
    load = (study.get("machine") or {}).get("load_at_start") or {}
    rows_ = [["command", "./submit-job.sh " + " ".join(study["command"])], ["state", study["state"]],
             ["cells", "; ".join(f"{n} {k}" for k, n in counts.items())
              + "".join(f"; of the predicted, {n}: {w}" for w, n in why.items())],
             ["time", f"{elapsed / 60:.1f} min of time_limit {study['time_limit_seconds'] / 60:g} min"],
             ["machine", (f"{study['machine'].get('host')}: {load.get('cpus')} CPUs, load {load.get('loadavg_1min')} "
                         f"at the start; run wall seconds / estimate: {study['factor'].get('ratios') or 'no run'}")],
             ["storage of the predictions", str(study.get("storage"))], ["legend", LEGEND]]
    rows_ += [["not placed", n] for n in study.get("not_placed") or []]
    return Table(f"Study {study['study_id']}", ["", ""], rows_)


def tables(study: dict, table: list[dict]) -> list[Table]:
    models = dict.fromkeys(r["model"] for r in table)
    out = [summary_table(study, table), reference_table(table), *(model_table(m, table) for m in models),
           checks_table(table)]
    return [t for t in out if t]


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
        ax.set(yscale="log", ylabel="files (log scale)")
        ax.margins(y=0.15)

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
        ax.set(yscale="log", ylabel="bytes (log scale)")
        ax.yaxis.set_major_locator(LogLocator(base=1024))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: size_text(v).replace(".00 ", " ")))
        ax.yaxis.set_minor_locator(LogLocator(base=1024, subs=(32.0,)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.margins(y=0.2)

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
    """Every run's measurements against its predictions (colour: the figure; marker: the engine)."""
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    busy = sum(bool(r.get("check_machine_busy")) for r in table)
    for r in table:
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
        "study_prediction_check_seconds": check_figure(table)}


def load(folder: Path) -> tuple[dict, dict[int, dict], list[dict]]:
    """study.json, for each cell with a run folder its summary and inventory (None where unreadable), and the rows."""
    study = _read_json(Path(folder) / STUDY)[0]
    if study is None:
        raise FileNotFoundError(f"{folder}: no readable {STUDY}")
    runs = {}
    for cell in study["cells"]:
        if cell.get("run_dir"):
            run_dir = Path(cell["run_dir"])
            if not run_dir.is_dir():  # a study folder moved or copied: its runs are beside study.json
                run_dir = Path(folder) / run_dir.name
            runs[cell["index"]] = {"summary": _read_json(run_dir / "summary.json")[0],
                                   "inventory": _read_json(run_dir / "inventory.json")[0], "dir": run_dir}
    return study, runs, rows(study, runs)


def section(folder: Path) -> tuple[list[Table], dict[str, bytes], list[str]]:
    """The study's tables and figures (PNG bytes), and the figures without data: what a report adds."""
    study, _, table = load(folder)
    return tables(study, table), *pngs(figures(table, study))


def write(folder: Path) -> list[Path]:
    """study.csv, study-files.csv, study.md, study.html and the figures, into the study's folder."""
    study, runs, table = load(folder)
    files = {"study.csv": to_csv(table, False).encode(),
             "study-files.csv": to_csv(file_rows(study, runs), False).encode(),
             **documents("study", f"Study {study['study_id']}: {len(table)} cells", tables(study, table),
                         *pngs(figures(table, study)))}
    for name, data in files.items():
        write_bytes_atomic(Path(folder) / name, data)
    return [Path(folder) / name for name in files]
