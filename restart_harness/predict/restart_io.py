"""What a restart's ranks do to the file systems besides reading the checkpoint, per rank and start-up phase, as
measured (docs/restart-io.md, which says how the table is measured): the table the predictor scales to many ranks
(configs/restart_io.json, written by scripts/refresh_restart_io.py)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from restart_harness import CONFIGS, resolve
from restart_harness.schema import io_metadata_ops

TABLE = CONFIGS / "restart_io.json"
STARTUP = ("imports", "dist_init", "model_build", "engine_init")  # the phases before the checkpoint is read


def per_rank(restart: dict) -> dict[str, dict[str, float]] | None:
    """A restart record's start-up phases, per rank: metadata operations, opens and bytes read through calls, every
    source but the checkpoint (None without counts by source)."""
    io = restart.get("io_sources") or {}
    if not io.get("ranks") or not io.get("by_source", True):
        return None
    n = io["ranks"]
    out = {}
    for phase in STARTUP:
        sources = ((io["phases"].get(phase) or {}).get("sources") or {})
        rest = [c for name, c in sources.items() if name != "checkpoint"]
        out[phase] = {"metadata_ops": round(sum(io_metadata_ops(c) for c in rest) / n, 1),
                      "opens": round(sum(c.get("opens", 0) for c in rest) / n, 1),
                      "read_bytes": round(sum(c.get("read_bytes", 0) for c in rest) / n)}
    return out


def table(run_dirs: list[Path]) -> dict[str, dict]:
    """Per stack/engine: each start-up phase's figures per rank, the median over the runs' restarts whose ranks were
    not forked (launcher=prefork imports once for a node), with the runs it came from."""
    found: dict[str, list[tuple[dict, str]]] = {}
    for run_dir in run_dirs:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        spec = summary["spec"]
        key = f"{spec.get('stack') or 'deepspeed'}/{spec['engine']}"
        if resolve.read(run_dir).launcher.forks_ranks:  # its node imported once for every rank
            continue
        for restart in summary.get("restarts") or []:
            figures = per_rank(restart)
            if figures:
                found.setdefault(key, []).append((figures, f"{Path(run_dir).name} {restart['record']}"))
    out = {}
    for key, rows in sorted(found.items()):
        out[key] = {"phases": {p: {k: statistics.median(r[p][k] for r, _ in rows) for k in rows[0][0][p]}
                               for p in STARTUP},
                    "restarts": [name for _, name in rows]}
    return out


def load(path: Path = TABLE) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def lookup(stack: str, engine: str, default_engine: str, path: Path = TABLE) -> tuple[dict | None, str | None]:
    """The start-up figures of a stack and engine (else the stack's default engine's), and which entry they are."""
    entries = load(path).get("stacks") or {}
    for key in (f"{stack}/{engine}", f"{stack}/{default_engine}"):
        if key in entries:
            return entries[key]["phases"], key
    return None, None
