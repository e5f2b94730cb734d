"""A study's table (`./submit-job.sh study`, restart_harness/campaigns/study/): study.json and the run folders of
its cells -> study.csv (one row per cell: model x GPU count x strategy x engine; study_rows.py), study-files.csv
(every file of every cell), study.md and study.html (the report section; study_tables.py) and the figures
(study_figures.py), written into the study's folder. Reads result files only (standard library and matplotlib: no
torch)."""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.figure import Figure

from analysis.load import _read_json
from analysis.render import Table, html_page, markdown
from analysis.study_figures import figures
from analysis.study_rows import file_rows, rows
from analysis.study_tables import tables
from analysis.table import to_csv
from restart_harness.files.atomic import write_bytes_atomic
from restart_harness.schema import STUDY


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


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _made(folder: Path) -> tuple[dict, dict, list[dict], dict[str, bytes], list[str]]:
    """study.json, its cells' runs, the table's rows, the figures (PNG bytes) and the figures without data."""
    study, runs = load(folder)
    table = rows(study, runs)
    made = figures(table, study)
    return study, runs, table, {k: _png(v) for k, v in made.items() if v is not None}, \
        [k for k, v in made.items() if v is None]


def section(folder: Path) -> tuple[list[Table], dict[str, bytes], list[str]]:
    """The study's tables and figures (PNG bytes), and the figures without data: what a report adds."""
    study, _, table, pngs, missing = _made(folder)
    return tables(study, table), pngs, missing


def write(folder: Path) -> list[Path]:
    """study.csv, study-files.csv, study.md, study.html and the figures, into the study's folder."""
    folder = Path(folder)
    study, runs, table, pngs, missing = _made(folder)
    title = f"Study {study['study_id']}: {len(table)} cells"
    ts = tables(study, table)
    files = {"study.csv": to_csv(table, False).encode(),
             "study-files.csv": to_csv(file_rows(study, runs), False).encode(),
             "study.md": markdown(title, ts, list(pngs), missing).encode(),
             "study.html": html_page(title, ts, pngs, missing).encode(),
             **{f"{k}.png": v for k, v in pngs.items()}}
    for name, data in files.items():
        write_bytes_atomic(folder / name, data)
    return [folder / name for name in files]
