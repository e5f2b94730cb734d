"""A study's table (`./submit-job.sh study`, restart_harness/campaigns/study/): study.json and the run folders of
its cells -> study.csv (one row per cell: model x GPU count x strategy x engine), study-files.csv (every file of
every cell), study.md and study.html (the report section) and the figures, written into the study's folder.

Every figure of a row says where it comes from, in the column beside it (`<figure>_source`; docs/study.md):
measured (a real run at the real size), emulated (the real-size files written and read back without training),
planned (the planner: exact names and tensor bytes) or predicted (the calibrated model, for the cell's device).
Where a run measured what was also predicted before it started, `<figure>_predicted` and `<figure>_error` say how
far apart they were; a shrunk run (the real file layout, smaller tensors) is a check of the prediction at its own
size (the check_* columns), never a figure of the real size. Reads result files only (standard library and
matplotlib: no torch)."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from analysis.plots import measured_vs_predicted
from analysis.render import Table, html_page, markdown
from restart_harness.files.atomic import write_bytes_atomic
from restart_harness.schema import PREDICTED_RESTART, PREDICTED_TOTAL, STUDY

TAG = {"measured": "meas", "emulated": "emul", "planned": "plan", "predicted": "pred"}
SAVE = ("save_blocking_seconds", "save_durable_seconds")
RESTART = (*PREDICTED_RESTART, PREDICTED_TOTAL)
LOAD = "restart_checkpoint_load_seconds"
CHECKED = ("save_durable_seconds", LOAD, PREDICTED_TOTAL)
LEGEND = ("meas: measured by a real run at the real size; emul: emulated (the real-size files written and read back "
          "without training); plan: the planner (exact names and tensor bytes); pred: predicted by the calibrated "
          "model for the cell's device; -: neither (why in study.csv)")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load(folder: Path) -> tuple[dict, dict[int, dict]]:
    """study.json, and for each cell with a run folder its summary and inventory (None where unreadable)."""
    study = _read(Path(folder) / STUDY)
    if study is None:
        raise FileNotFoundError(f"{folder}: no readable {STUDY}")
    runs = {}
    for cell in study["cells"]:
        if cell.get("run_dir"):
            run_dir = Path(cell["run_dir"])
            if not run_dir.is_dir():  # a study folder moved or copied: its runs are beside study.json
                run_dir = Path(folder) / run_dir.name
            runs[cell["index"]] = {"summary": _read(run_dir / "summary.json"),
                                   "inventory": _read(run_dir / "inventory.json"), "dir": run_dir}
    return study, runs


# ---- rows ------------------------------------------------------------------------------------------------------
def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def size_groups(sizes: list[int], limit: int = 4) -> str:
    """The files' sizes as `count x size`, largest first: "4 x 10.08 GiB, 4 x 1.68 GiB" (every size is in
    study-files.csv)."""
    counts: dict[str, int] = {}
    for n in sorted(sizes, reverse=True):
        counts[_size(n)] = counts.get(_size(n), 0) + 1
    parts = [f"{c} x {s}" for s, c in counts.items()]
    return ", ".join(parts[:limit]) + (f", and {len(parts) - limit} more sizes" if len(parts) > limit else "")


def _run_mode(cell: dict, run: dict | None) -> str | None:
    """The mode of the cell's finished run: real, emulated, shrunk (None: no finished run)."""
    if run is None or cell["state"] != "complete" or not run.get("summary"):
        return None
    return cell["option"]["mode"]


def _files(cell: dict, run: dict | None, mode: str | None) -> tuple[list[list], str]:
    """Every file (path, bytes, rank, kind) and its source: the run's inventory at real size, else the plan."""
    if mode in ("real", "emulated") and run and run.get("inventory"):
        return ([[f["path"], f["bytes"], f.get("rank"), f.get("kind")] for f in run["inventory"]["files"]],
                "measured" if mode == "real" else "emulated")
    return cell["plan"]["files"], "planned"


def _per(files: list[list], of) -> tuple[int, int, int]:
    """(most files, fewest files, most bytes) of any group (a rank, a node) of the files' writers."""
    counts: dict[int, list[int]] = {}
    for _, nbytes, rank, _ in files:
        if rank is None:
            continue
        counts.setdefault(of(rank), [0, 0])
        counts[of(rank)][0] += 1
        counts[of(rank)][1] += nbytes
    if not counts:
        return 0, 0, 0
    return max(c[0] for c in counts.values()), min(c[0] for c in counts.values()), max(c[1] for c in counts.values())


def _put(row: dict, name: str, value, source: str | None, predicted=None) -> None:
    row[name] = value
    row[f"{name}_source"] = source if value is not None else None
    if source in ("measured", "emulated") and predicted is not None and value:
        row[f"{name}_predicted"] = predicted
        row[f"{name}_error"] = round((predicted - value) / value, 4)


def cell_row(cell: dict, run: dict | None) -> dict:
    """One row of the table: the cell, how it was measured, each figure with its source."""
    mode = _run_mode(cell, run)
    option = cell["option"]
    real_size = mode in ("real", "emulated")
    row = {k: cell[k] for k in ("id", "model", "vocab_size", "parameters", "gpus", "nodes", "gpus_per_node",
                                "strategy", "strategy_kind", "tp", "pp", "dp", "zero", "engine", "precision")}
    row["device"] = cell["prediction"].get("device")
    row["how"] = ({"real": "real run", "emulated": "emulated at real size",
                   "shrunk": f"shrunk K={option['shrink']}, {'emulated' if option['emulate'] else 'real run'}"}
                  .get(mode) if mode else {"failed": "run failed", "interrupted": "run interrupted",
                                           "submitted": "run submitted"}.get(cell["state"], "planned + predicted"))
    if not mode and cell["state"] == "planned" and option.get("why"):
        row["how"] += f": {option['why']}"
    row["how_why"] = cell.get("reason") or option.get("reason") or ""
    row["run_dir"] = cell.get("run_dir")
    row["run_state"] = cell["state"] if cell.get("run_dir") else None
    row["gpu_state_bytes"] = cell.get("gpu_state_bytes")
    files, source = _files(cell, run, mode)
    sizes = [f[1] for f in files]
    row["file_names"] = cell["plan"].get("names")
    _put(row, "files", len(files), source)
    _put(row, "checkpoint_bytes", sum(sizes), source)
    for stat, fn in (("min", min), ("median", statistics.median), ("max", max)):
        _put(row, f"file_bytes_{stat}", int(fn(sizes)) if sizes else None, source)
    row["file_sizes"] = size_groups(sizes)
    per_node = cell["gpus_per_node"]
    most, fewest, most_bytes = _per(files, lambda r: r)
    _put(row, "files_per_rank_max", most, source)
    row["files_per_rank_min"], row["bytes_per_rank_max"] = fewest, most_bytes
    most, fewest, most_bytes = _per(files, lambda r: r // per_node)
    _put(row, "files_per_node_max", most, source)
    row["files_per_node_min"], row["bytes_per_node_max"] = fewest, most_bytes
    row["restart_read_bytes"], row["restart_read_bytes_source"] = cell["plan"]["restart_read_bytes"], "planned"
    predicted = cell["prediction"]["phases"]
    checked = ((run or {}).get("summary") or {}).get("prediction") or {}
    for name in (*SAVE, *RESTART):
        p = predicted.get(name) or {}
        m = (checked.get("phases") or {}).get(name) or {}
        if real_size and m.get("measured") is not None and (mode == "real" or name != PREDICTED_TOTAL):
            _put(row, name, m["measured"], "measured" if mode == "real" else "emulated", m.get("predicted"))
        elif p.get("seconds") is not None:
            _put(row, name, p["seconds"], "predicted")
        else:
            _put(row, name, None, None)
            row[f"{name}_why"] = "absent" if p.get("absent") else p.get("why")
    row["storage"] = _storage(run, mode) if real_size else cell["prediction"].get("storage")
    row["prediction_notes"] = "; ".join(cell["prediction"].get("note") or [])
    if mode:  # every run checks the prediction at its own size
        row["check_mode"], row["check_shrink"] = mode, option["shrink"]
        for name in CHECKED:
            m = (checked.get("phases") or {}).get(name) or {}
            row[f"check_{name}_measured"] = m.get("measured")
            row[f"check_{name}_predicted"] = m.get("predicted")
            row[f"check_{name}_error"] = m.get("rel_error")
        row["check_files"] = _files_check(cell, run)
        load_ = ((run or {}).get("summary") or {}).get("restart", {}).get("machine_load") or {}
        row["check_machine_busy"] = load_.get("busy")
    ref = cell.get("reference")
    if ref:
        names = sorted(f[0] for f in cell["plan"]["files"])
        gb = cell["plan"]["total_bytes"] / 1e9
        row["reference_checkpoint_gb"], row["reference_files"] = ref["checkpoint_gb"], len(ref["files"])
        row["reference_equal"] = round(gb, 2) == ref["checkpoint_gb"] and names == sorted(ref["files"])
        row["reference_source"] = ref["source"]
    return row


def _files_check(cell: dict, run: dict | None) -> str:
    """Do the run's files carry the plan's names (a shrunk run keeps them), as many?"""
    inventory = (run or {}).get("inventory")
    if not inventory:
        return "no inventory"
    got = sorted(f["path"] for f in inventory["files"])
    want = sorted(f[0] for f in cell["plan"]["files"])
    if got == want:
        return f"equal: the plan's {len(want)} names"
    if cell["plan"].get("names") == "sizes only":
        return f"{len(got)} stored files for the plan's {len(want)} DeepSpeed files (the engine's own layout)"
    return f"differ: {len(got)} files, the plan has {len(want)}"


def _storage(run: dict | None, mode: str | None) -> str:
    summary = (run or {}).get("summary") or {}
    b = summary.get("baseline") or {}
    fs = (summary.get("spec") or {}).get("checkpoint_filesystem") or {}
    where = f"{fs.get('type') or '?'} at {fs.get('mount') or '?'}"
    if b.get("write_mib_s"):
        return (f"{where}: baseline write {b['write_mib_s']:,.0f} / read {b['read_mib_s']:,.0f} MiB/s "
                f"({b.get('method')})")
    return where


def rows(study: dict, runs: dict[int, dict]) -> list[dict]:
    return [cell_row(c, runs.get(c["index"])) for c in study["cells"]]


def file_rows(study: dict, runs: dict[int, dict]) -> list[dict]:
    """Every file of every cell (the plan's, or a real-size run's), with its writing rank's node."""
    out = []
    for cell in study["cells"]:
        run = runs.get(cell["index"])
        files, source = _files(cell, run, _run_mode(cell, run))
        for path, nbytes, rank, kind in files:
            out.append({"id": cell["id"], "path": path, "bytes": nbytes, "rank": rank,
                        "node": None if rank is None else rank // cell["gpus_per_node"], "kind": kind,
                        "source": source})
    return out


def to_csv(table: list[dict]) -> str:
    columns: list[str] = []
    for r in table:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buf.getvalue()


# ---- tables ----------------------------------------------------------------------------------------------------
def _tag(row: dict, name: str) -> str:
    return TAG.get(row.get(f"{name}_source") or "", "")


def _sec(row: dict, name: str) -> str:
    v = row.get(name)
    if v is None:
        return "-"
    text = f"{v:.2f}" if v < 100 else f"{v:,.0f}"
    error = row.get(f"{name}_error")
    return f"{text} {_tag(row, name)}" + (f" ({error:+.0%} pred)" if error is not None else "")


def _total(n: float | None) -> str:
    """A checkpoint's size, binary, and in GB (10^9 bytes, the reference study's unit) from 1 GB up."""
    if n is None:
        return "-"
    return f"{_size(n)} ({n / 1e9:,.2f} GB)" if n >= 1e9 else _size(n)


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f}"


def model_table(model: str, table: list[dict]) -> Table:
    rs = [r for r in table if r["model"] == model]
    first = rs[0]
    out = []
    for r in rs:
        out.append([
            str(r["gpus"]) + (f" ({r['nodes']} nodes)" if r["nodes"] > 1 else ""),
            r["strategy"] + (" ref" if r.get("reference_checkpoint_gb") is not None else ""),
            r["engine"], r["how"],
            f"{r['files']} {_tag(r, 'files')}" + ("" if r["file_names"] == "predicted" else " *"),
            f"{r['files_per_rank_max']} / {r['files_per_node_max']}",
            r["file_sizes"], f"{_total(r['checkpoint_bytes'])} {_tag(r, 'checkpoint_bytes')}",
            _sec(r, "save_blocking_seconds"), _sec(r, "save_durable_seconds"), _sec(r, LOAD),
            _sec(r, PREDICTED_TOTAL)])
    vocabs = sorted({r["vocab_size"] for r in rs})
    return Table(f"{model}: {_count(first['parameters'])} parameters at tp{first['tp']}, vocabulary "
                 f"{', '.join(f'{v:,}' for v in vocabs)} (by tp), ZeRO-{first['zero']}, {first['precision']}",
                 ["GPUs", "strategy", "engine", "how", "files", "files per rank / node (max)", "file sizes",
                  "checkpoint", "save blocking s", "save durable s", "checkpoint load s", "restart s (with launch)"],
                 out, note=LEGEND + ". *: the engine writes its own layout: DeepSpeed's logical files, sized.")


def checks_table(table: list[dict]) -> Table | None:
    rs = [r for r in table if r.get("check_mode")]
    if not rs:
        return None
    out = []
    for r in rs:
        cells = [r["id"], r["how"]]
        for name in CHECKED:
            m, p, e = (r.get(f"check_{name}_{k}") for k in ("measured", "predicted", "error"))
            cells.append("-" if m is None else f"{m:.2f} / {'-' if p is None else f'{p:.2f}'}"
                         + ("" if e is None else f" ({e:+.0%})"))
        cells += [r["check_files"], "yes" if r.get("check_machine_busy") else "no"]
        out.append(cells)
    return Table("Runs: measured against the prediction made before each started (at the run's own size)",
                 ["cell", "how", "save durable s meas / pred", "checkpoint load s meas / pred",
                  "restart s (with launch) meas / pred", "files against the plan", "machine busy"], out,
                 note="A shrunk run's seconds are not the real size's: they check the predictor where it was run.")


def reference_table(table: list[dict]) -> Table | None:
    rs = [r for r in table if r.get("reference_checkpoint_gb") is not None]
    if not rs:
        return None
    out = [[r["id"], f"{r['reference_checkpoint_gb']:.2f} GB, {r['reference_files']} files",
            (f"{r['checkpoint_bytes'] / 1e9:.2f} GB ({r['checkpoint_bytes']:,} bytes), {r['files']} files "
            f"{_tag(r, 'files')}"), "equal" if r["reference_equal"] else "DIFFERENT"] for r in rs]
    return Table("The reference study's log beside the planner", ["cell", "reference log", "here", "total and names"],
                 out, note=rs[0]["reference_source"])


def summary_table(study: dict, table: list[dict]) -> Table:
    counts: dict[str, int] = {}
    for r in table:
        how = r["how"].split(": ")[0].split(" K=")[0]  # planned + predicted, shrunk, emulated at real size, ...
        counts[how] = counts.get(how, 0) + 1
    why: dict[str, int] = {}
    for r in table:
        if r["how"].startswith("planned + predicted: "):
            w = r["how"].removeprefix("planned + predicted: ")
            why[w] = why.get(w, 0) + 1
    elapsed = (study.get("updated") or 0) - (study.get("started") or 0)
    load = (study.get("machine") or {}).get("load_at_start") or {}
    rows_ = [["command", "./submit-job.sh " + " ".join(study["command"])], ["state", study["state"]],
             ["cells", "; ".join(f"{n} {k}" for k, n in counts.items())
              + "".join(f"; of the predicted, {n}: {w}" for w, n in why.items())],
             ["time", f"{elapsed / 60:.1f} min of time_limit {study['time_limit_seconds'] / 60:g} min"],
             ["machine", (f"{study['machine'].get('host')}: {load.get('cpus')} CPUs, load {load.get('loadavg_1min')} "
                         f"at the start; run wall seconds / estimate: {study['factor'].get('ratios') or 'no run'}")],
             ["storage of the predictions", str(study.get("storage"))]]
    rows_ += [["legend", LEGEND]]
    rows_ += [["not placed", n] for n in study.get("not_placed") or []]
    return Table(f"Study {study['study_id']}", ["", ""], rows_)


def tables(study: dict, table: list[dict]) -> list[Table]:
    models = list(dict.fromkeys(r["model"] for r in table))
    out = [summary_table(study, table)]
    out += [t for t in (reference_table(table),) if t]
    out += [model_table(m, table) for m in models]
    out += [t for t in (checks_table(table),) if t]
    return out


# ---- figures ---------------------------------------------------------------------------------------------------
HATCH = {"predicted": "///", "planned": "", "measured": "", "emulated": ".."}


def _panels(models: list[str], height: float = 3.4) -> tuple[Figure, list]:
    fig = Figure(figsize=(13, 0.6 + height * len(models)), layout="constrained")
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    return fig, list(axes)


def _strategies(table: list[dict], model: str) -> list[tuple[int, str]]:
    return list(dict.fromkeys((r["gpus"], r["strategy"]) for r in table if r["model"] == model))


def _tick(gpus: int, strategy: str) -> str:
    return f"{strategy}\n{gpus} GPUs"


def planned(study: dict) -> dict[tuple[str, int, str], dict]:
    """Per (model, GPU count, strategy): the planner's files of its first engine's cell (DeepSpeed's files)."""
    out: dict[tuple[str, int, str], dict] = {}
    for cell in study["cells"]:
        key = (cell["model"], cell["gpus"], cell["strategy"])
        if key in out:
            continue
        files = cell["plan"]["files"]
        sizes = [f[1] for f in files]
        out[key] = {"files": len(files), "per_rank": _per(files, lambda r: r)[0],
                    "per_node": _per(files, lambda r, n=cell["gpus_per_node"]: r // n)[0],
                    "min": min(sizes, default=0), "median": statistics.median(sizes) if sizes else 0,
                    "max": max(sizes, default=0), "total": sum(sizes)}
    return out


def files_figure(table: list[dict], plans: dict) -> Figure | None:
    """Files per checkpoint, and the most one node and one rank write, per strategy (planned)."""
    models = list(dict.fromkeys(r["model"] for r in table))
    if not models:
        return None
    fig, axes = _panels(models)
    for ax, model in zip(axes, models):
        keys = _strategies(table, model)
        xs = range(len(keys))
        for i, (label, field) in enumerate((("files", "files"), ("most per node", "per_node"),
                                            ("most per rank", "per_rank"))):
            bars = ax.bar([x - 0.27 + 0.27 * i for x in xs], [plans[(model, *k)][field] for k in keys], width=0.26,
                          label=label, color=f"C{i}")
            ax.bar_label(bars, fontsize="x-small", padding=1)
        ax.set_yscale("log")
        ax.margins(y=0.15)
        ax.set_xticks(list(xs), [_tick(*k) for k in keys], fontsize="small")
        ax.set_ylabel("files (log scale)")
        ax.set_title(f"{model}: files of one checkpoint", loc="left")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel("planned (exact): DeepSpeed's files; an engine with its own layout (torchsnapshot) stores each as a "
                  "folder of shards", fontsize="x-small", color="0.4")
    return fig


def sizes_figure(table: list[dict], plans: dict) -> Figure | None:
    """Each checkpoint's file sizes (min, median, max) and its total, per strategy, log scale (planned)."""
    models = list(dict.fromkeys(r["model"] for r in table))
    if not models:
        return None
    fig, axes = _panels(models)
    for ax, model in zip(axes, models):
        keys = _strategies(table, model)
        got = [plans[(model, *k)] for k in keys]
        scale = 1
        xs = list(range(len(keys)))
        ax.vlines(xs, [p["min"] / scale for p in got], [p["max"] / scale for p in got], color="C0", linewidth=7,
                  alpha=0.45, label="file sizes, smallest to largest")
        ax.scatter(xs, [p["median"] / scale for p in got], color="C0", zorder=3, label="median file")
        ax.scatter(xs, [p["total"] / scale for p in got], color="C3", marker="_", s=500, linewidths=2, zorder=3,
                   label="whole checkpoint")
        for x, p in zip(xs, got):
            ax.annotate(_size(p["total"]), (x, p["total"]), textcoords="offset points", xytext=(0, 5),
                        ha="center", fontsize="x-small")
            ax.annotate(_size(p["max"]), (x, p["max"]), textcoords="offset points", xytext=(6, -3),
                        fontsize="xx-small", color="C0")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=1024))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _size(v).replace(".00 ", " ")))
        ax.yaxis.set_minor_locator(LogLocator(base=1024, subs=(32.0,)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.margins(y=0.2)
        ax.set_xticks(xs, [_tick(*k) for k in keys], fontsize="small")
        ax.set_ylabel("bytes (log scale)")
        ax.set_title(f"{model}: file sizes and the whole checkpoint", loc="left")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel("planned: tensor bytes exact, torch.save's pickle and zip estimated (docs/planner.md)",
                  fontsize="x-small", color="0.4")
    return fig


LOG_SPAN = 100  # values spanning more than this factor get a log axis (else a linear one from 0)


def _seconds_figure(table: list[dict], column: str, title: str, inner: str | None = None) -> Figure | None:
    """Bars per strategy (x) and engine (colour); hatched and pale where predicted, dotted where emulated, solid where
    measured; with inner, a black mark at that part's seconds inside each bar."""
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory

    models = [m for m in dict.fromkeys(r["model"] for r in table)
              if any(r.get(column) is not None for r in table if r["model"] == m)]
    if not models:
        return None
    engines = list(dict.fromkeys(r["engine"] for r in table))
    fig, axes = _panels(models)
    width = 0.8 / len(engines)
    for ax, model in zip(axes, models):
        keys = _strategies(table, model)
        by = {(r["gpus"], r["strategy"], r["engine"]): r for r in table if r["model"] == model}
        values = [r[column] for r in by.values() if r.get(column)]
        log = max(values) > LOG_SPAN * min(values)
        bottom = blended_transform_factory(ax.transData, ax.transAxes)
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
        ax.set_xticks(range(len(keys)), [_tick(*k) for k in keys], fontsize="small")
        ax.set_ylabel("seconds" + (" (log scale)" if log else ""))
        ax.set_title(f"{model}: {title}", loc="left")
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=f"C{e}", label=engine) for e, engine in enumerate(engines)]
    handles += [Patch(facecolor="0.6", hatch=HATCH["predicted"], edgecolor="white", alpha=0.5, label="predicted"),
                Patch(facecolor="0.6", hatch=HATCH["emulated"], edgecolor="white", label="emulated"),
                Patch(facecolor="0.6", label="measured")]
    if inner:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="black", linewidth=2.5, label="its checkpoint load"))
    axes[0].legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel("n/p: not predicted (a GPU's model build and first step from a CPU calibration: why in study.csv); "
                  "predicted for the cell's device, calibration and storage; engines not in the calibration take the "
                  "default engine's rates (study.md)", fontsize="x-small", color="0.4")
    return fig


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
    fig.supxlabel(f"{runs} runs; {busy} of them started on a busy machine (other work on its CPUs: the "
                  "calibration's machine was quiet)", fontsize="x-small", color="0.4")
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


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def section(folder: Path) -> tuple[list[Table], dict[str, bytes], list[str]]:
    """The study's tables and figures (PNG bytes), and the figures without data: what a report adds."""
    study, runs = load(folder)
    table = rows(study, runs)
    made = figures(table, study)
    return tables(study, table), {k: _png(v) for k, v in made.items() if v is not None}, \
        [k for k, v in made.items() if v is None]


def write(folder: Path) -> list[Path]:
    """study.csv, study-files.csv, study.md, study.html and the figures, into the study's folder."""
    folder = Path(folder)
    study, runs = load(folder)
    table = rows(study, runs)
    made = figures(table, study)
    pngs = {k: _png(v) for k, v in made.items() if v is not None}
    missing = [k for k, v in made.items() if v is None]
    title = f"Study {study['study_id']}: {len(table)} cells"
    ts = tables(study, table)
    files = {"study.csv": to_csv(table).encode(), "study-files.csv": to_csv(file_rows(study, runs)).encode(),
             "study.md": markdown(title, ts, list(pngs), missing).encode(),
             "study.html": html_page(title, ts, pngs, missing).encode(),
             **{f"{k}.png": v for k, v in pngs.items()}}
    for name, data in files.items():
        write_bytes_atomic(folder / name, data)
    return [folder / name for name in files]
