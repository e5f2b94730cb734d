"""A study's table (`./submit-job.sh study`, docs/study.md) from study.json and its cells' runs: study.csv
(study_rows.py), study-files.csv, study.md and study.html (study_tables.py) and the figures (study_figures.py)."""

from __future__ import annotations

from pathlib import Path

from analysis.layout import pngs
from analysis.load import _read_json
from analysis.render import Table, documents
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
