"""Runs -> flat rows (one per run and restart record, their columns from analysis/columns.py; one per save) with
units in every column name, and groups of repeats (runs of the same configuration) with their median, min and max."""

from __future__ import annotations

import csv
import io
import json
import statistics
import textwrap
from dataclasses import dataclass, field

from analysis.columns import RESTART_CONDITIONS, get, num, restart_columns, restart_records, run_columns
from analysis.load import Run
from restart_harness import schema
from restart_harness.schema import PHASE_NAMES, SAVE_CATEGORIES

# Restart phases in the schema's order; phases a newer harness adds follow, in first-seen order.
KNOWN_PHASES = PHASE_NAMES


def phase_names(runs: list[Run]) -> list[str]:
    """Known phases first, then any others found, in first-seen order."""
    return list(dict.fromkeys([*KNOWN_PHASES, *(name for run in runs for rec in restart_records(run.summary)
                                                for name in get(rec, "phases", default={}) or {})]))


def rows(runs: list[Run]) -> list[dict]:
    """One row per (run, restart record); a run without restarts (engine none, a failed run) gets one row."""
    phases = phase_names(runs)
    out = []
    for run in runs:
        base = run_columns(run)
        for rec in restart_records(run.summary) or [None]:
            # run_id and restart_record first: together they name the row; a restart that did not verify (a
            # restart-only re-run's failure leaves the run complete) is its row's state: its own outcome
            outcome = (rec or {}).get("outcome") or {}
            own = ({"state": outcome["state"], "state_reason": outcome.get("reason")}
                   if outcome.get("state") not in (None, "verified") else {})
            out.append({"run_id": base["run_id"], "restart_record": (rec or {}).get("record"), **base, **own,
                        **restart_columns(run.summary, rec, phases), "run_dir": str(run.dir)})
    return out


def save_rows(runs: list[Run]) -> list[dict]:
    """One row per save of every run (every save is one measurement of its configuration)."""
    return [{
        "run_id": run.run_id, **{k: run.spec[k] for k in ("model", "tp", "pp", "dp", "engine")}, "tag": s.tag,
        **{k: num(getattr(s, k)) for k in ("step", "files", "bytes", "blocking_seconds", "durable_seconds",
                                           "commit_seconds", "checksum_seconds")},
        "training_lost_seconds": num(get(s.training_lost, "seconds")),
        "training_lost_within_noise": get(s.training_lost, "within_noise"),
        **{f"memory_{k}": num(get(s.memory, k)) for k in ("cost_bytes", "peak_added_bytes", "held_bytes",
                                                          "retained_bytes")},
        **{f"throughput_{k}_mib_s": num(get(s.throughput_mib_s, k)) for k in ("blocking", "durable")},
        **{f"{c}_seconds": num(get(s.breakdown, f"{c}_seconds")) for c in SAVE_CATEGORIES}, "run_dir": str(run.dir),
    } for run in runs for s in (run.view.checkpoint.saves if run.view.checkpoint else ())]


def to_csv(table: list[dict], lower_bools: bool = True) -> str:
    """CSV text of every column any row has (first-seen order); empty cells for missing values, booleans as true/false
    (lower_bools, runs.csv) or as Python writes them (study.csv)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for row in table for k in row)), lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow({k: ("" if v is None else str(v).lower() if lower_bools and isinstance(v, bool) else v)
                         for k, v in row.items()})
    return buf.getvalue()


@dataclass
class Stat:
    """Median, min and max of the repeats of one figure (n of them)."""

    median: float
    min: float
    max: float
    n: int


def stat(values: list[object]) -> Stat | None:
    """Stat over the numeric values, None if there are none."""
    xs = [v for v in (num(v) for v in values) if v is not None]
    return Stat(statistics.median(xs), min(xs), max(xs), len(xs)) if xs else None


@dataclass
class Group:
    """Runs of one configuration (repeats), with their rows (one per restart record) and saves."""

    model: str
    layout: str
    engine: str
    extra: str
    common: frozenset = frozenset()  # which of model, layout, engine every group of the report shares
    runs: list[Run] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    resharded: list[dict] = field(default_factory=list)  # restart records at another layout than the run's
    saves: list[dict] = field(default_factory=list)
    key: str = ""  # C1, C2, ...: its short name in the report (the configurations table, axes too crowded for labels)

    @property
    def restarts(self) -> list[dict]:
        """Its rows of a restart record (a run without a restart has a row of its own)."""
        return [r for r in self.rows if r.get("restart_record")]

    @property
    def reshards(self) -> list[tuple[bool, dict]]:
        """Where it restarted at another layout: (True, its latest same-layout restart), then (False, each of those)."""
        return [(True, r) for r in self.restarts[-1:] if self.resharded] + [(False, r) for r in self.resharded]

    def _parts(self, common: frozenset) -> list[str]:
        return [x for x in (*(getattr(self, n) for n in ("model", "layout", "engine") if n not in common), self.extra)
                if x]

    @property
    def label(self) -> str:
        """What tells this configuration apart from the others it is shown with (set by groups())."""
        return " ".join(self._parts(self.common)) or self.full_label

    @property
    def full_label(self) -> str:
        return " ".join(self._parts(frozenset()))

    @property
    def tick(self) -> str:
        """label on several lines, for an axis."""
        return "\n".join(textwrap.fill(x, 22) for x in self._parts(self.common)) or self.full_label

    def stat(self, column: str) -> Stat | None:
        """Over restart records; a restart's own figures only from those that verified (a failed or interrupted
        restart-only re-run is a row of runs.csv with its outcome, never a figure)."""
        rows = [r for r in self.rows if r.get("restart_verified") is not False] if column.startswith(
            ("restart_", "phase_", "load_")) else self.rows
        return stat([r.get(column) for r in rows])

    def run_stat(self, column: str) -> Stat | None:
        """Over runs, not restart records: one value per run (checkpoint bytes, files...)."""
        return stat(list({r["run_dir"]: r.get(column) for r in reversed(self.rows)}.values()))

    def save_stat(self, column: str) -> Stat | None:
        return stat([s.get(column) for s in self.saves])


def _config(run: Run, row: dict | None = None) -> dict:
    """The run's configuration (schema.config_fields), with how this restart row started (schema.restart_conditions) where
    its record says: a re-run with another launcher or cache, or a staged environment, is a configuration of its own."""
    spec = {**run.spec, "staged": False}
    for name, column in RESTART_CONDITIONS.items():
        if row is not None and row.get(column) is not None:
            spec[name] = row[column]
    out = {k: json.dumps(spec.get(k, schema.CONFIG_DEFAULTS.get(k)), sort_keys=True)
           for k in (*schema.config_fields(run.spec), "staged")}
    for a, b in schema.PLACE_FIELDS:
        out[f"{a}.{b}"] = json.dumps(get(spec, a, b))
    return out


def groups(runs: list[Run], table: list[dict] | None = None, states: tuple[str, ...] = ("complete",)) -> list[Group]:
    """Runs in the given states grouped by configuration, in first-seen order. A group's `extra` names the
    settings (beyond model, layout, engine) that tell it apart from other groups, e.g. `cache=warm`."""
    table = rows(runs) if table is None else table
    saves = save_rows(runs)
    chosen = [r for r in runs if r.state in states]
    # one configuration per (run, how its restart started): a restart-only re-run with another launcher or cache
    # is another configuration of restart, never pooled with the run's first
    # (a restart at another layout stays with its run's configuration, kept apart there as `resharded`)
    parts = [(run, row, _config(run, None if row is None or _resharded(row) else row)) for run in chosen
             for row in ([r for r in table if r["run_dir"] == str(run.dir)] or [None])]
    configs = [config for _, _, config in parts]
    shown = {"model", "shrink", "tp", "pp", "dp", "nodes", "ranks_per_node", "engine"}  # rpn follows the layout
    varying = [k for k in (configs[0] if configs else {}) if k not in shown and len({c[k] for c in configs}) > 1]
    out: dict[tuple, Group] = {}
    for run, row, config in parts:
        key = tuple(sorted(config.items()))
        if key not in out:
            out[key] = Group(schema.model_label(run.spec), schema.layout_label(run.spec),
                             schema.engine_label(run.spec), _extra(run.spec, config, varying, configs))
        g = out[key]
        if run not in g.runs:
            g.runs.append(run)
            g.saves.extend(s for s in saves if s["run_dir"] == str(run.dir))
        if row is not None:
            (g.resharded if _resharded(row) else g.rows).append(row)
    found = list(out.values())
    common = frozenset(name for name in ("model", "layout", "engine")
                       if len({getattr(g, name) for g in found}) == 1 and len(found) > 1)
    for n, g in enumerate(found, 1):
        g.common, g.key = common, f"C{n}"
    return found


def _resharded(row: dict) -> bool:
    saved, loaded = row.get("restart_layout_saved"), row.get("restart_layout_loaded")
    return bool(saved and loaded and saved != loaded)


def common_label(groups: list[Group]) -> str:
    """What every configuration shown shares (for a caption): e.g. `tiny, tp1 pp1 dp2`."""
    shared = groups[0].common if groups else ()
    return ", ".join(getattr(groups[0], name) for name in ("model", "layout", "engine") if name in shared)


def _extra(spec: dict, config: dict, varying: list[str], configs: list[dict]) -> str:
    """The settings beyond model, layout and engine that differ between the configurations; engine options only
    where the engine label does not show them; model shape fields only those that differ for one model."""
    parts = []
    for k in varying:
        if len({c[k] for c in configs if c["model"] == config["model"]}) == 1 and k not in ("engine_options",):
            continue  # the same for every configuration of this model: it follows from the model (seq_len, shape)
        if k in ("stack", "checkpoint_object_store.endpoint_url", "zero"):
            continue  # engine_label names a stack other than DeepSpeed ("fsdp2 dcp") and object storage ("... s3");
            # layout_label a ZeRO stage other than 1 ("tp1 pp1 dp2 zero3")
        if k == "engine_options":  # engine_label shows the options switched on; others only where they differ
            mine = json.loads(config[k]) or {}
            same = [json.loads(c[k]) or {} for c in configs if c["engine"] == config["engine"]]
            parts += [f"{f}={v}" for f, v in mine.items()
                      if not isinstance(v, bool) and len({json.dumps(s.get(f)) for s in same}) > 1]
            continue
        if k == "shape":
            same_model = [json.loads(c["shape"]) for c in configs if c["model"] == config["model"]]
            mine = json.loads(config["shape"])
            parts += [f"{f}={mine[f]}" for f in mine if len({json.dumps(s.get(f)) for s in same_model}) > 1]
            continue
        parts.append(f"{k.split('.')[-1]}={json.loads(config[k])}")
    return " ".join(parts)
