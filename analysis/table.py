"""Runs -> flat rows (one per run and restart record; one per save) with units in every column name, and
groups of repeats (runs of the same configuration) with their median, min and max."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import textwrap
from dataclasses import dataclass, field

from analysis.load import Run
from restart_harness.schema import (
    CONFIG_DEFAULTS,
    KINDS,
    LOAD_CATEGORIES,
    PHASE_NAMES,
    PLACE_FIELDS,
    PREDICTED_PHASES,
    SAVE_CATEGORIES,
    config_fields,
    engine_label,
    io_metadata_ops,
    layout_label,
    model_label,
    restart_conditions,
)

# runs.csv's column of each of schema.restart_conditions: how a restart started
RESTART_CONDITIONS = {"launcher": "restart_launcher", "cache": "restart_cache_requested",
                      "env_cache": "restart_env_cache_requested", "staged": "restart_staged"}

# Restart phases in the schema's order; phases a newer harness adds follow, in first-seen order.
KNOWN_PHASES = PHASE_NAMES
def get(d: object, *keys: str, default: object = None) -> object:
    """d[k1][k2]... or default when any level is missing or not an object."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return default if d is None else d


def num(value: object) -> float | None:
    """A finite number or None (strings, booleans and nested objects are not figures)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def restart_records(summary: dict) -> list[dict]:
    """Every restart record, oldest first; a summary with only `restart` gives that one."""
    records = [r for r in summary.get("restarts") or [] if isinstance(r, dict)]
    if not records and isinstance(summary.get("restart"), dict):
        records = [summary["restart"]]
    return records


def phase_names(runs: list[Run]) -> list[str]:
    """Known phases first, then any others found, in first-seen order."""
    seen = [p for p in KNOWN_PHASES]
    for run in runs:
        for rec in restart_records(run.summary):
            for name in get(rec, "phases", default={}) or {}:
                if name not in seen:
                    seen.append(name)
    return seen


def loaded_save(summary: dict, tag: str | None) -> dict:
    """The save a restart loaded (by tag), else the checkpoint's tag, else the last save; {} if none."""
    saves = [s for s in get(summary, "checkpoint", "saves", default=[]) if isinstance(s, dict)]
    for want in (tag, get(summary, "checkpoint", "tag")):
        for s in saves:
            if want and s.get("tag") == want:
                return s
    return saves[-1] if saves else {}


def run_columns(run: Run) -> dict:
    """Columns that are the same for every restart record of a run."""
    s, spec = run.summary, run.spec
    ck = s.get("checkpoint") or {}
    row = {
        "run_id": run.run_id,
        "state": run.state,
        "state_reason": get(s, "status", "reason"),
        "sweep": run.sweep,
        "schema_version": s.get("schema_version"),
        "model": spec["model"],
        "shrink": spec.get("shrink"),
        "precision": spec.get("precision"),
        "tp": spec["tp"], "pp": spec["pp"], "dp": spec["dp"], "zero": spec.get("zero", CONFIG_DEFAULTS["zero"]),
        "nodes": spec.get("nodes"),
        "world_size": get(spec, "derived", "world_size"),
        "launched_ranks": get(spec, "derived", "launched_ranks") or get(spec, "derived", "world_size"),
        "emulate": bool(spec.get("emulate", CONFIG_DEFAULTS["emulate"])),
        "engine": spec["engine"],
        "engine_label": engine_label(spec),
        "device": spec.get("device"),
        "cache_requested": spec.get("cache"),
        "num_parameters": get(spec, "derived", "num_parameters"),
        "checkpoint_tag": ck.get("tag"),
        "checkpoint_files": num(ck.get("files")),
        "checkpoint_bytes": num(ck.get("bytes")),
    }
    for kind in KINDS:
        row[f"{kind}_files"] = num(get(ck, "by_kind", kind, "files"))
        row[f"{kind}_bytes"] = num(get(ck, "by_kind", kind, "bytes"))
    row["checkpoint_rank_max_bytes"] = num(get(ck, "bytes_per_rank", "max"))
    row["checkpoint_rank_min_bytes"] = num(get(ck, "bytes_per_rank", "min"))
    row["saves_count"] = len(get(ck, "saves", default=[]) or [])
    tr = s.get("training") or {}
    losses = [x for x in tr.get("losses") or [] if num(x) is not None]
    row.update({
        "training_steps": num(tr.get("steps")),
        "step_median_seconds": num(tr.get("step_seconds_median")),
        "step_in_flight_median_seconds": num(tr.get("step_seconds_median_in_flight")),
        # what each save cost training (results/training_cost.py): median over the run's saves, and its baseline
        "save_training_lost_median_seconds": num(get(ck, "training_lost", "per_save_seconds_median")),
        "save_training_lost_total_seconds": num(get(ck, "training_lost", "total_seconds")),
        "step_baseline_seconds": num(get(ck, "training_lost", "baseline_step", "seconds")),
        # what each save cost in host memory per rank (results/save_memory.py), and its growth over the saves
        "save_memory_cost_median_bytes": num(get(ck, "memory", "cost_bytes_median")),
        "save_memory_peak_added_max_bytes": num(get(ck, "memory", "peak_added_bytes_max")),
        "save_memory_held_max_bytes": num(get(ck, "memory", "held_bytes_max")),
        "save_memory_engine_buffers_max_bytes": num(get(ck, "memory", "engine_buffers_bytes_max")),
        "save_memory_growth_per_save_bytes": num(get(ck, "memory", "growth", "bytes_per_save")),
        "save_memory_growing": get(ck, "memory", "growth", "growing"),
        "final_loss": losses[-1] if losses else None,
        "train_max_rss_bytes": num(tr.get("max_rss_bytes_per_rank")),
        "baseline_write_mib_s": num(get(s, "baseline", "write_mib_s")),
        "baseline_read_mib_s": num(get(s, "baseline", "read_mib_s")),
        "baseline_method": get(s, "baseline", "method"),
        "baseline_probes_count": num(get(s, "baseline", "spread", "repeats")),
        "baseline_write_min_mib_s": num((get(s, "baseline", "spread", "write_mib_s") or [None])[0]),
        "baseline_write_max_mib_s": num((get(s, "baseline", "spread", "write_mib_s") or [None, None])[-1]),
        "baseline_read_min_mib_s": num((get(s, "baseline", "spread", "read_mib_s") or [None])[0]),
        "baseline_read_max_mib_s": num((get(s, "baseline", "spread", "read_mib_s") or [None, None])[-1]),
        "machine_busy_at_launch": (get(ck, "machine_load", "busy") if get(ck, "machine_load") else None),
        "efficiency_save_ratio": num(get(ck, "efficiency", "save")),
        "efficiency_load_ratio": num(get(ck, "efficiency", "load")),
        # the storage's ceiling (files/baseline.py ceiling()) and the efficiencies against it
        "ceiling_write_mib_s": num(get(s, "baseline", "ceiling", "write_mib_s")),
        "ceiling_read_mib_s": num(get(s, "baseline", "ceiling", "read_mib_s")),
        "ceiling_write_from": get(s, "baseline", "ceiling", "write_from"),
        "ceiling_read_from": get(s, "baseline", "ceiling", "read_from"),
        "efficiency_save_of_ceiling_ratio": num(get(ck, "efficiency", "save_of_ceiling")),
        "efficiency_load_of_ceiling_ratio": num(get(ck, "efficiency", "load_of_ceiling")),
    })
    row.update(request_columns("save", ck))
    row.update(prediction_columns(s))
    return row


def prediction_columns(summary: dict) -> dict:
    """What the run predicted for itself before launch, and how far off it was (results/prediction.py); empty
    for runs without a prediction (older runs, stack=fsdp2)."""
    phases = get(summary, "prediction", "phases") or {}
    row = {}
    for phase in PREDICTED_PHASES:
        p = phases.get(phase) or {}
        row[f"predicted_{phase}"] = num(p.get("predicted"))
        row[f"measured_{phase}"] = num(p.get("measured"))  # as the prediction defines it (results/prediction.py)
        row[f"{phase.removesuffix('_seconds')}_prediction_error_ratio"] = num(p.get("rel_error"))
    return row


REQUEST_COLUMNS = ("requests", "failed_requests", "throttled_requests", "retried_requests", "failed_operations")


def request_columns(prefix: str, phase: dict) -> dict:
    """What an object store's client went through in a phase (summary storage_requests; empty on a file system)."""
    counts, uploads = phase.get("storage_requests") or {}, phase.get("incomplete_uploads")
    return {**{f"{prefix}_{name}_count": num(counts.get(name)) for name in REQUEST_COLUMNS},
            f"{prefix}_incomplete_uploads_aborted_count": len(uploads.get("aborted") or [])
            if isinstance(uploads, dict) else None}


def node_columns(prefix: str, phase: dict) -> dict:
    """How many nodes a save or restart ran on and its slowest node (results/placement.py; empty where the ranks
    recorded no hosts, as before harness 0.4)."""
    nodes, worst = phase.get("per_node"), phase.get("slowest_node") or {}
    return {f"{prefix}_nodes_count": len(nodes) if nodes else None, f"{prefix}_slowest_node": worst.get("host"),
            f"{prefix}_slowest_node_rank": num(worst.get("rank"))}


def restart_columns(summary: dict, rec: dict | None, phases: list[str]) -> dict:
    """Columns of one restart record, and of the save it loaded (all empty for a run without a restart)."""
    rec = rec or {}
    save = loaded_save(summary, rec.get("tag")) if summary.get("checkpoint") else {}
    row = {
        "save_tag": save.get("tag"),
        "save_step": num(save.get("step")),
        "save_blocking_seconds": num(save.get("blocking_seconds")),
        "save_durable_seconds": num(save.get("durable_seconds")),
        "save_commit_seconds": num(save.get("commit_seconds")),
        "save_training_lost_seconds": num(get(save, "training_lost", "seconds")),
        "save_memory_cost_bytes": num(get(save, "memory", "cost_bytes")),
        "save_checksum_seconds": num(save.get("checksum_seconds")),
        "throughput_blocking_mib_s": num(get(save, "throughput_mib_s", "blocking")),
        "throughput_durable_mib_s": num(get(save, "throughput_mib_s", "durable")),
        "restart_record": rec.get("record"),
        "restart_tag": rec.get("tag"),
        "restart_ranks": num(rec.get("ranks")),
        "restart_total_seconds": num(rec.get("total_seconds")),
        "restart_launch_seconds": num(rec.get("launch_seconds")),
        "restart_wall_seconds": num(rec.get("wall_seconds")),
        "restart_integrity_seconds": num(get(rec, "integrity", "seconds")),
        "restart_staging_seconds": num(get(rec, "staging", "seconds")),  # env_stage=: copying the environment
        "restart_staging_bytes": num(get(rec, "staging", "bytes")),
        "restart_env_cache_observed": get(rec, "environment_cache", "observed"),
        # how this restart started, where a restart-only re-run changed it (the run's spec says the first one's)
        **{RESTART_CONDITIONS[k]: v for k, v in restart_conditions(rec).items()},
    }
    row.update(node_columns("save", save))
    row.update(node_columns("restart", rec))
    for p in phases:
        row[f"phase_{p}_seconds"] = num(get(rec, "phases", p))
    lb = rec.get("load_breakdown") or {}
    for c in LOAD_CATEGORIES:
        row[f"load_{c}_seconds"] = num(lb.get(f"{c}_seconds"))
    row["load_slowest_rank"] = lb.get("slowest_rank")
    row["load_read_bytes"] = sum(num(r.get("read_bytes")) or 0 for r in lb.get("per_rank", [])) or None
    peaks = [num(v.get("peak_rss_bytes_max")) for v in (rec.get("memory") or {}).values() if isinstance(v, dict)]
    row["restart_peak_rss_bytes"] = max((p for p in peaks if p is not None), default=None)
    bd = save.get("breakdown") or {}
    for c in SAVE_CATEGORIES:
        row[f"save_{c}_seconds"] = num(bd.get(f"{c}_seconds"))
    layout, conversion = rec.get("layout") or {}, rec.get("conversion") or {}
    continuity = rec.get("loss_continuity") or {}
    row.update({
        "restart_layout_saved": layout.get("saved"),
        "restart_layout_loaded": layout.get("loaded"),
        "conversion_seconds": num(conversion.get("seconds")),
        "conversion_reused": conversion.get("reused"),
        "conversion_written_bytes": num(conversion.get("bytes_written")),
        "conversion_read_bytes": num(conversion.get("bytes_read_counted")),
        "first_step_loss": num(rec.get("first_step_loss")),
        "first_loss_diff_ratio": num(continuity.get("rel_diff")),
    })
    row.update({
        "restart_verify_seconds": num(rec.get("verify_seconds")),
        "restart_verified": rec.get("verified") if rec else None,
        "restart_outcome": get(rec, "outcome", "state") if rec else None,
        "restart_outcome_reason": get(rec, "outcome", "reason") if rec else None,
        "restart_verified_tensors": num(rec.get("verified_tensors")),
        "restart_cache_observed": get(rec, "cache", "observed"),
        "restart_load_seconds": num(rec.get("load_seconds")),
        "restart_load_throughput_mib_s": num(rec.get("load_throughput_mib_s")),
        "restart_storage_read_throughput_mib_s": num(rec.get("storage_read_throughput_mib_s")),
        # engine=lazy: how each replicated file was loaded (broadcast, or read by every replica), decided per restart
        "restart_replicated_load": "; ".join(f"{r['file']}: {r['way']}" for r in
                                             (rec.get("engine_load_statistics") or {}).get("replicated") or []) or None,
        "restart_max_rss_bytes": num(rec.get("max_rss_bytes_per_rank")),
        "restart_exit_code": rec.get("exit_code"),
    })
    row.update(request_columns("restart", rec))
    row.update(io_columns(rec.get("io_sources")))
    return row


def io_columns(io: dict | None) -> dict:
    """A restart's I/O by source, per rank (results/io_sources.py; empty for runs without it): metadata operations
    (opens, failed opens, stat-family calls, listings), opens and bytes read outside the checkpoint, those of its
    imports and of the Python environment, and what the kernel says the storage delivered."""
    n = num(get(io, "ranks"))
    total = get(io, "total", "sources", default={}) or {}
    if not n or not isinstance(total, dict):
        return dict.fromkeys(IO_COLUMNS)
    rest = [c for name, c in total.items() if name != "checkpoint" and isinstance(c, dict)]
    imports = get(io, "phases", "imports", "sources", default={}) or {}
    kernel = get(io, "total", "kernel", default={}) or {}
    counted = get(io, "by_source", default=True)  # false: anatomy=false, the kernel's figures only

    def per_rank(value: float | None, by_source: bool = True) -> float | None:
        return None if value is None or (by_source and not counted) else round(value / n, 1)

    return {
        "restart_metadata_ops_per_rank_count": per_rank(sum(io_metadata_ops(c) for c in rest)),
        "restart_opens_per_rank_count": per_rank(sum(c.get("opens", 0) for c in rest)),
        "restart_read_per_rank_bytes": per_rank(sum(c.get("read_bytes", 0) for c in rest)),
        "restart_imports_metadata_ops_per_rank_count": per_rank(sum(io_metadata_ops(c) for c in imports.values()
                                                              if isinstance(c, dict))),
        "restart_environment_metadata_ops_per_rank_count": per_rank(io_metadata_ops(total.get("environment") or {})),
        "restart_environment_read_per_rank_bytes": per_rank((total.get("environment") or {}).get("read_bytes", 0)),
        "restart_checkpoint_metadata_ops_per_rank_count": per_rank(io_metadata_ops(total.get("checkpoint") or {})),
        "restart_storage_read_per_rank_bytes": per_rank(num(kernel.get("storage_read_bytes")), by_source=False),
        "restart_major_faults_per_rank_count": per_rank(num(kernel.get("major_faults")), by_source=False),
    }


IO_COLUMNS = ("restart_metadata_ops_per_rank_count", "restart_opens_per_rank_count", "restart_read_per_rank_bytes",
              "restart_imports_metadata_ops_per_rank_count", "restart_environment_metadata_ops_per_rank_count",
              "restart_environment_read_per_rank_bytes", "restart_checkpoint_metadata_ops_per_rank_count",
              "restart_storage_read_per_rank_bytes", "restart_major_faults_per_rank_count")


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
    out = []
    for run in runs:
        for s in get(run.summary, "checkpoint", "saves", default=[]) or []:
            if not isinstance(s, dict):
                continue
            out.append({
                "run_id": run.run_id, "model": run.spec["model"], "tp": run.spec["tp"], "pp": run.spec["pp"],
                "dp": run.spec["dp"], "engine": run.spec["engine"], "tag": s.get("tag"), "step": num(s.get("step")),
                "files": num(s.get("files")), "bytes": num(s.get("bytes")),
                "blocking_seconds": num(s.get("blocking_seconds")), "durable_seconds": num(s.get("durable_seconds")),
                "commit_seconds": num(s.get("commit_seconds")),
                "checksum_seconds": num(s.get("checksum_seconds")),
                "training_lost_seconds": num(get(s, "training_lost", "seconds")),
                "training_lost_within_noise": get(s, "training_lost", "within_noise"),
                "memory_cost_bytes": num(get(s, "memory", "cost_bytes")),
                "memory_peak_added_bytes": num(get(s, "memory", "peak_added_bytes")),
                "memory_held_bytes": num(get(s, "memory", "held_bytes")),
                "memory_retained_bytes": num(get(s, "memory", "retained_bytes")),
                "throughput_blocking_mib_s": num(get(s, "throughput_mib_s", "blocking")),
                "throughput_durable_mib_s": num(get(s, "throughput_mib_s", "durable")),
                **{f"{c}_seconds": num(get(s, "breakdown", f"{c}_seconds")) for c in SAVE_CATEGORIES},
                "run_dir": str(run.dir),
            })
    return out


def columns_of(table: list[dict]) -> list[str]:
    """Column names in first-seen order over all rows."""
    cols: list[str] = []
    for row in table:
        cols.extend(k for k in row if k not in cols)
    return cols


def to_csv(table: list[dict]) -> str:
    """CSV text; empty cells for missing values, booleans as true/false."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns_of(table), lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow({k: ("" if v is None else str(v).lower() if isinstance(v, bool) else v)
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
    def label(self) -> str:
        """What tells this configuration apart from the others it is shown with (set by groups())."""
        parts = [x for name, x in (("model", self.model), ("layout", self.layout), ("engine", self.engine))
                 if name not in self.common]
        return " ".join(x for x in (*parts, self.extra) if x) or self.full_label

    @property
    def full_label(self) -> str:
        return " ".join(x for x in (self.model, self.layout, self.engine, self.extra) if x)

    @property
    def tick(self) -> str:
        """label on several lines, for an axis."""
        parts = [x for name, x in (("model", self.model), ("layout", self.layout), ("engine", self.engine))
                 if name not in self.common]
        return "\n".join(textwrap.fill(x, 22) for x in (*parts, self.extra) if x) or self.full_label

    def stat(self, column: str) -> Stat | None:
        """Over restart records; a restart's own figures only from those that verified (a failed or interrupted
        restart-only re-run is a row of runs.csv with its outcome, never a figure)."""
        rows = [r for r in self.rows if r.get("restart_verified") is not False] if column.startswith(
            ("restart_", "phase_", "load_")) else self.rows
        return stat([r.get(column) for r in rows])

    def run_stat(self, column: str) -> Stat | None:
        """Over runs, not restart records: one value per run (checkpoint bytes, files...)."""
        firsts = {r["run_dir"]: r.get(column) for r in reversed(self.rows)}
        return stat(list(firsts.values()))

    def save_stat(self, column: str) -> Stat | None:
        return stat([s.get(column) for s in self.saves])


def _config(run: Run, row: dict | None = None) -> dict:
    """The run's configuration (schema.config_fields), with how this restart row started (schema.restart_conditions) where
    its record says: a re-run with another launcher or cache, or a staged environment, is a configuration of its own."""
    spec = {**run.spec, "staged": False}
    for name, column in RESTART_CONDITIONS.items():
        if row is not None and row.get(column) is not None:
            spec[name] = row[column]
    out = {k: json.dumps(spec.get(k, CONFIG_DEFAULTS.get(k)), sort_keys=True)
           for k in (*config_fields(run.spec), "staged")}
    for a, b in PLACE_FIELDS:
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
            out[key] = Group(model_label(run.spec), layout_label(run.spec), engine_label(run.spec),
                             _extra(run.spec, config, varying, configs))
        g = out[key]
        if run not in g.runs:
            g.runs.append(run)
            g.saves.extend(s for s in saves if s["run_dir"] == str(run.dir))
        if row is not None:
            # a restart at another layout is another configuration of restart: kept apart, not pooled with these
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
    if not groups:
        return ""
    g = groups[0]
    return ", ".join(getattr(g, name) for name in ("model", "layout", "engine") if name in g.common)


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


def restart_where(rec: dict | None) -> str:
    """`` for a restart at the layout that wrote its checkpoint; ` at tp2-pp2-dp1 (4 ranks)` for one at another."""
    layout = (rec or {}).get("layout") or {}
    if not layout or layout.get("loaded") == layout.get("saved"):
        return ""
    return f" at {layout['loaded']} ({rec.get('ranks')} ranks)"
