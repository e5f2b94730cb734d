"""summary.json's `baseline` (the storage's own sequential throughput, files/baseline.py) and
`checkpoint.efficiency`: the save's durable throughput and the restart's load throughput as fractions of it."""

from __future__ import annotations

from pathlib import Path

from restart_harness.files.atomic import read_json


def _ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 4) if value and base else None


def add(summary: dict, run_dir: Path) -> None:
    """Set summary['baseline'] from run_dir/baseline.json (null when baseline=false) and the efficiencies."""
    path = run_dir / "baseline.json"
    base = read_json(path) if path.is_file() else None
    summary["baseline"] = base
    ckpt = summary.get("checkpoint") or {}
    durable = (ckpt.get("throughput_mib_s") or {}).get("durable")
    load = (summary.get("restart") or {}).get("load_throughput_mib_s")
    ckpt["efficiency"] = {
        "save": _ratio(durable, (base or {}).get("write_mib_s")),
        "load": _ratio(load, (base or {}).get("read_mib_s")),
    }
