"""A study's table (`./submit-job.sh study`, docs/study.md) from study.json and its cells' runs: study.csv
(study_rows.py), study-files.csv, study.md and study.html (its tables, here) and the figures (study_figures.py)."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from analysis.layout import pngs
from analysis.load import _read_json
from analysis.render import Table, documents
from analysis.study_figures import figures
from analysis.study_rows import CHECKED, LOAD, file_rows, rows, size_text
from analysis.table import to_csv
from restart_harness.files.atomic import write_bytes_atomic
from restart_harness.schema import PREDICTED_TOTAL, STUDY

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
    if n is None:
        return "-"
    return f"{size_text(n)} ({n / 1e9:,.2f} GB)" if n >= 1e9 else size_text(n)


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f}"


def _interval(row: dict) -> str:
    if row.get("best_interval_seconds") is None:
        return "-"
    return f"{row['best_interval_seconds']:,.0f} ({row['goodput_at_best']:.3f})"


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
    rs = [r for r in table if r.get("check_mode")]
    if not rs:
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
    rs = [r for r in table if r.get("reference_checkpoint_gb") is not None]
    if not rs:
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


def load(folder: Path) -> tuple[dict, dict[int, dict]]:
    """study.json, and for each cell with a run folder its summary and inventory (None where unreadable)."""
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
    return study, runs


def section(folder: Path) -> tuple[list[Table], dict[str, bytes], list[str]]:
    """The study's tables and figures (PNG bytes), and the figures without data: what a report adds."""
    study, runs = load(folder)
    table = rows(study, runs)
    return tables(study, table), *pngs(figures(table, study))


def write(folder: Path) -> list[Path]:
    """study.csv, study-files.csv, study.md, study.html and the figures, into the study's folder."""
    study, runs = load(folder)
    table = rows(study, runs)
    files = {"study.csv": to_csv(table, False).encode(),
             "study-files.csv": to_csv(file_rows(study, runs), False).encode(),
             **documents("study", f"Study {study['study_id']}: {len(table)} cells", tables(study, table),
                         *pngs(figures(table, study)))}
    for name, data in files.items():
        write_bytes_atomic(Path(folder) / name, data)
    return [Path(folder) / name for name in files]
