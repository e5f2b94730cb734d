"""summary.json's `baseline` (the storage's own sequential throughput, and its ceiling: files/baseline.py) and
`checkpoint.efficiency`: the save's durable throughput and the restart's load throughput as fractions of each."""

from __future__ import annotations

from pathlib import Path

from restart_harness.files.atomic import read_json


def _ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 4) if value and base else None


def add(summary: dict, run_dir: Path) -> None:
    """Set summary['baseline'] from run_dir/baseline.json (null when baseline=false) and the efficiencies: against the
    baseline (`save`, `load`) and against the ceiling (`save_of_ceiling`, `load_of_ceiling`; null where the storage
    has none, object storage, or the record predates it)."""
    path = run_dir / "baseline.json"
    base = read_json(path) if path.is_file() else None
    summary["baseline"] = base
    ckpt = summary.get("checkpoint") or {}
    durable = (ckpt.get("throughput_mib_s") or {}).get("durable")
    load = (summary.get("restart") or {}).get("load_throughput_mib_s")
    ceiling = (base or {}).get("ceiling") or {}
    ckpt["efficiency"] = {
        "save": _ratio(durable, (base or {}).get("write_mib_s")),
        "load": _ratio(load, (base or {}).get("read_mib_s")),
        "save_of_ceiling": _ratio(durable, ceiling.get("write_mib_s")),
        "load_of_ceiling": _ratio(load, ceiling.get("read_mib_s")),
    }
