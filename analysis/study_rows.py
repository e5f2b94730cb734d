"""The study's table, row by row (analysis/study.py writes it): each cell of study.json, with its run's summary and
inventory where it has one, becomes one row, each figure beside its source (docs/study.md "study.csv")."""

from __future__ import annotations

import statistics
from collections import Counter

from analysis.layout import byte_unit
from restart_harness.results import goodput
from restart_harness.schema import PREDICTED_RESTART, PREDICTED_TOTAL
from restart_harness.spec.keys import parse_seconds

SAVE = ("save_blocking_seconds", "save_durable_seconds")
RESTART = (*PREDICTED_RESTART, PREDICTED_TOTAL)
LOAD = "restart_checkpoint_load_seconds"
CHECKED = ("save_durable_seconds", LOAD, PREDICTED_TOTAL)


def size_text(n: float | None) -> str:
    """A byte count in its binary unit: "10.08 GiB", "512 B"."""
    if n is None:
        return "-"
    unit, scale = byte_unit(n)
    return f"{n:.0f} B" if scale == 1 else f"{n / scale:.2f} {unit}"


def size_groups(sizes: list[int], limit: int = 4) -> str:
    """The files' sizes as `count x size`, largest first: "4 x 10.08 GiB, 4 x 1.68 GiB"."""
    parts = [f"{c} x {s}" for s, c in Counter(size_text(n) for n in sorted(sizes, reverse=True)).items()]
    return ", ".join(parts[:limit]) + (f", and {len(parts) - limit} more sizes" if len(parts) > limit else "")


def _run_mode(cell: dict, run: dict | None) -> str | None:
    """The mode of the cell's finished run: real, emulated, shrunk (None: no finished run)."""
    return None if run is None or cell["state"] != "complete" or not run.get("summary") else cell["option"]["mode"]


def _files(cell: dict, run: dict | None, mode: str | None) -> tuple[list[list], str]:
    """Every file (path, bytes, rank, kind) and its source: the run's inventory at real size, else the plan."""
    if mode in ("real", "emulated") and run and run.get("inventory"):
        return ([[f["path"], f["bytes"], f.get("rank"), f.get("kind")] for f in run["inventory"]["files"]],
                "measured" if mode == "real" else "emulated")
    return cell["plan"]["files"], "planned"


def per_writer(files: list[list], of) -> tuple[int, int, int]:
    """(most files, fewest files, most bytes) of any group (a rank, a node) of the files' writers."""
    counts, sizes = Counter(), Counter()
    for _, nbytes, rank, _ in files:
        if rank is not None:
            counts[of(rank)] += 1
            sizes[of(rank)] += nbytes
    return (max(counts.values()), min(counts.values()), max(sizes.values())) if counts else (0, 0, 0)


def _put(row: dict, name: str, value, source: str | None, predicted=None) -> None:
    row[name] = value
    row[f"{name}_source"] = source if value is not None else None
    if source in ("measured", "emulated") and predicted is not None and value:
        row[f"{name}_predicted"] = predicted
        row[f"{name}_error"] = round((predicted - value) / value, 4)


def cell_row(cell: dict, run: dict | None) -> dict:
    """One row of the table: the cell, how it was measured, each figure with its source."""
    mode = _run_mode(cell, run)
    measured = (((run or {}).get("summary") or {}).get("prediction") or {}).get("phases") or {}
    row = {**_how(cell, mode), **_file_figures(cell, run, mode)}
    for name in (*SAVE, *RESTART):
        _seconds(row, name, cell["prediction"]["phases"].get(name) or {}, measured.get(name) or {}, mode)
    row["storage"] = _storage(run) if mode in ("real", "emulated") else cell["prediction"].get("storage")
    row["prediction_notes"] = "; ".join(cell["prediction"].get("note") or [])
    if mode:  # every run checks the prediction at its own size
        row["check_mode"], row["check_shrink"] = mode, cell["option"]["shrink"]
        for name in CHECKED:
            m = measured.get(name) or {}
            row.update({f"check_{name}_{k}": m.get(field) for k, field in (
                ("measured", "measured"), ("predicted", "predicted"), ("error", "rel_error"),
                ("not_comparable", "not_comparable"))})
        row["check_files"] = _files_check(cell, run)
        row["check_machine_busy"] = (run["summary"].get("restart", {}).get("machine_load") or {}).get("busy")
    if ref := cell.get("reference"):
        names = sorted(f[0] for f in cell["plan"]["files"])
        gb = cell["plan"]["total_bytes"] / 1e9
        row["reference_checkpoint_gb"], row["reference_files"] = ref["checkpoint_gb"], len(ref["files"])
        row["reference_equal"] = round(gb, 2) == ref["checkpoint_gb"] and names == sorted(ref["files"])
        row["reference_source"] = ref["source"]
    return row


def _goodput(row: dict, cell: dict, mtbf: dict) -> dict:
    """The best checkpoint interval and its expected goodput at the cell's GPUs (results/goodput.py) from the row's
    save (blocking), restart (with launch) and first step, at the study's failure rate (else Llama 3's)."""
    job_mtbf, _ = goodput.job_mtbf_at({**mtbf, "ranks_per_node": cell["gpus_per_node"]}, cell["gpus"], cell["gpus"])
    save, restart, step = (row.get(n) for n in ("save_blocking_seconds", PREDICTED_TOTAL, "restart_first_step_seconds"))
    if save is None or restart is None or not step:
        return {"best_interval_seconds": None, "goodput_at_best": None, "job_mtbf_seconds": round(job_mtbf, 1)}
    o = goodput.optimum(save, restart, step, job_mtbf)
    return {"best_interval_seconds": round(o["best_interval_seconds"], 1), "goodput_at_best":
            round(o["goodput_at_best"], 4), "job_mtbf_seconds": round(job_mtbf, 1)}


def _how(cell: dict, mode: str | None) -> dict:
    """The cell, and how its figures were got: by a run (its mode), else planned and predicted (and why)."""
    option = cell["option"]
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
    return row


def _file_figures(cell: dict, run: dict | None, mode: str | None) -> dict:
    """The checkpoint's files, sizes and the most any rank and any node writes, with their source."""
    files, source = _files(cell, run, mode)
    sizes = [f[1] for f in files]
    row = {"file_names": cell["plan"].get("names")}
    _put(row, "files", len(files), source)
    _put(row, "checkpoint_bytes", sum(sizes), source)
    for stat, fn in (("min", min), ("median", statistics.median), ("max", max)):
        _put(row, f"file_bytes_{stat}", int(fn(sizes)) if sizes else None, source)
    row["file_sizes"] = size_groups(sizes)
    for writer, of in (("rank", lambda r: r), ("node", lambda r, n=cell["gpus_per_node"]: r // n)):
        most, fewest, most_bytes = per_writer(files, of)
        _put(row, f"files_per_{writer}_max", most, source)
        row[f"files_per_{writer}_min"], row[f"bytes_per_{writer}_max"] = fewest, most_bytes
    row["restart_read_bytes"], row["restart_read_bytes_source"] = cell["plan"]["restart_read_bytes"], "planned"
    return row


def _seconds(row: dict, name: str, p: dict, m: dict, mode: str | None) -> None:
    """A phase's seconds: measured at the real size where a run did (its total with launch only by a real run), else
    predicted, else none and why."""
    if mode in ("real", "emulated") and m.get("measured") is not None and (mode == "real" or name != PREDICTED_TOTAL):
        _put(row, name, m["measured"], "measured" if mode == "real" else "emulated", m.get("predicted"))
    elif p.get("seconds") is not None:
        _put(row, name, p["seconds"], "predicted")
        row[f"{name}_borrowed"] = p.get("borrowed")  # another engine's or launcher's rates, which (None: its own)
    else:
        _put(row, name, None, None)
        row[f"{name}_why"] = "absent" if p.get("absent") else p.get("why")


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


def _storage(run: dict | None) -> str:
    summary = (run or {}).get("summary") or {}
    b = summary.get("baseline") or {}
    fs = (summary.get("spec") or {}).get("checkpoint_filesystem") or {}
    where = f"{fs.get('type') or '?'} at {fs.get('mount') or '?'}"
    if b.get("write_mib_s"):
        return (f"{where}: baseline write {b['write_mib_s']:,.0f} / read {b['read_mib_s']:,.0f} MiB/s "
                f"({b.get('method')})")
    return where


def rows(study: dict, runs: dict[int, dict]) -> list[dict]:
    mtbf = {k: parse_seconds(k, v) for k, v in (t.split("=", 1) for t in study.get("run_keys") or [] if "=" in t)
            if k in ("mtbf", "mtbf_per_node", "mtbf_per_gpu")}  # the study's failure rate (docs/goodput.md)
    return [{**(row := cell_row(c, runs.get(c["index"]))), **_goodput(row, c, mtbf)} for c in study["cells"]]


def file_rows(study: dict, runs: dict[int, dict]) -> list[dict]:
    """Every file of every cell (the plan's, or a real-size run's), with its writing rank's node."""
    out = []
    for cell in study["cells"]:
        run = runs.get(cell["index"])
        files, source = _files(cell, run, _run_mode(cell, run))
        out += [{"id": cell["id"], "path": path, "bytes": nbytes, "rank": rank,
                 "node": None if rank is None else rank // cell["gpus_per_node"], "kind": kind, "source": source}
                for path, nbytes, rank, kind in files]
    return out
