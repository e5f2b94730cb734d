"""One run's columns of runs.csv (analysis/table.py makes the rows): those the same for every restart record of a
run, and those of each restart record and of the save it loaded, with units in every column name."""

from __future__ import annotations

import math

from analysis.load import Run
from restart_harness import schema
from restart_harness.results import views
from restart_harness.results.views import CheckpointView, RestartView, SaveView, SummaryView
from restart_harness.schema import CONFIG_DEFAULTS, io_metadata_ops, restart_conditions

# runs.csv's column of each of schema.restart_conditions: how a restart started
RESTART_CONDITIONS = {"launcher": "restart_launcher", "cache": "restart_cache_requested",
                      "env_cache": "restart_env_cache_requested", "staged": "restart_staged"}


def get(d: object, *keys: str, default: object = None) -> object:
    """d[k1][k2]... or default when any level is missing or not an object."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return default if d is None else d


def num(value: object) -> float | None:
    """A finite number or None (strings, booleans and nested objects are not figures)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def restart_records(summary: dict) -> list[dict]:
    """Every restart record, oldest first; a summary with only `restart` gives that one."""
    records = [r for r in summary.get("restarts") or [] if isinstance(r, dict)]
    return records or ([summary["restart"]] if isinstance(summary.get("restart"), dict) else [])


def loaded_save(s: SummaryView, tag: str | None) -> SaveView:
    """The save a restart loaded (by tag), else the checkpoint's tag, else the last save; an empty view if none."""
    saves = s.checkpoint.saves if s.checkpoint else ()
    wanted = (save for want in (tag, s.checkpoint.tag if s.checkpoint else None) if want for save in saves
              if save.tag == want)
    return next(wanted, saves[-1] if saves else SaveView())


def run_columns(run: Run) -> dict:
    """Columns that are the same for every restart record of a run."""
    s, spec, sv = run.view, run.spec, run.view.spec
    ck = s.checkpoint or CheckpointView()
    row = {
        "run_id": run.run_id, "state": run.state, "state_reason": get(s.status, "reason"), "sweep": run.sweep,
        "schema_version": s.schema_version, "model": sv.model, "shrink": sv.shrink, "precision": sv.precision,
        "tp": sv.tp, "pp": sv.pp, "dp": sv.dp, "zero": spec.get("zero", CONFIG_DEFAULTS["zero"]),
        "nodes": sv.nodes, "world_size": get(sv.derived, "world_size"),
        "launched_ranks": get(sv.derived, "launched_ranks") or get(sv.derived, "world_size"),
        "emulate": bool(spec.get("emulate", CONFIG_DEFAULTS["emulate"])),
        "engine": sv.engine, "engine_label": schema.engine_label(spec), "device": sv.device,
        "cache_requested": sv.cache, "num_parameters": get(sv.derived, "num_parameters"),
        "checkpoint_tag": ck.tag, "checkpoint_files": num(ck.files), "checkpoint_bytes": num(ck.bytes)}
    row.update({f"{kind}_{n}": num(get(ck.by_kind, kind, n)) for kind in schema.KINDS for n in ("files", "bytes")})
    row.update({f"checkpoint_rank_{m}_bytes": num(get(ck.bytes_per_rank, m)) for m in ("max", "min")})
    row["saves_count"] = len(ck.saves or ())
    return {**row, **training_columns(s), **storage_columns(s), **request_columns("save", ck),
            **prediction_columns(run.summary)}


def training_columns(s: SummaryView) -> dict:
    """How training went, and what the saves cost it in time and in host memory."""
    tr, ck = s.training or views.TrainingView(), s.checkpoint or CheckpointView()
    lost, memory = ck.training_lost or views.LostView(), ck.memory or views.SaveMemoryView()
    growth = memory.growth or views.GrowthView()
    losses = [x for x in tr.losses or [] if num(x) is not None]
    return {
        "training_steps": num(tr.steps),
        "step_median_seconds": num(tr.step_seconds_median),
        "step_in_flight_median_seconds": num(tr.step_seconds_median_in_flight),
        # what each save cost training (results/training_cost.py): median over the run's saves, and its baseline
        "save_training_lost_median_seconds": num(lost.per_save_seconds_median),
        "save_training_lost_total_seconds": num(lost.total_seconds),
        "step_baseline_seconds": num(get(lost.baseline_step, "seconds")),
        # what each save cost in host memory per rank (results/save_memory.py), and its growth over the saves
        "save_memory_cost_median_bytes": num(memory.cost_bytes_median),
        "save_memory_peak_added_max_bytes": num(memory.peak_added_bytes_max),
        "save_memory_held_max_bytes": num(memory.held_bytes_max),
        "save_memory_engine_buffers_max_bytes": num(memory.engine_buffers_bytes_max),
        "save_memory_growth_per_save_bytes": num(growth.bytes_per_save),
        "save_memory_growing": growth.growing,
        "final_loss": losses[-1] if losses else None,
        "train_max_rss_bytes": num(tr.max_rss_bytes_per_rank)}


def storage_columns(s: SummaryView) -> dict:
    """The storage's baseline probes and ceiling (files/baseline.py), and the checkpoint's efficiencies against both."""
    base, ck = s.baseline or views.BaselineView(), s.checkpoint or CheckpointView()
    row = {"baseline_write_mib_s": num(base.write_mib_s), "baseline_read_mib_s": num(base.read_mib_s),
           "baseline_method": base.method, "baseline_probes_count": num(get(base.spread, "repeats"))}
    for way in ("write", "read"):  # the spread's slowest and fastest probe
        spread = get(base.spread, f"{way}_mib_s") or [None]
        row[f"baseline_{way}_min_mib_s"], row[f"baseline_{way}_max_mib_s"] = num(spread[0]), num(spread[-1])
    return {
        **row,
        "machine_busy_at_launch": get(ck.machine_load, "busy") if ck.machine_load else None,
        **{f"efficiency_{d}_ratio": num(get(ck.efficiency, d)) for d in ("save", "load")},
        **{f"ceiling_{way}_mib_s": num(get(base.ceiling, f"{way}_mib_s")) for way in ("write", "read")},
        **{f"ceiling_{way}_from": get(base.ceiling, f"{way}_from") for way in ("write", "read")},
        **{f"efficiency_{d}_of_ceiling_ratio": num(get(ck.efficiency, f"{d}_of_ceiling")) for d in ("save", "load")}}


def prediction_columns(summary: dict) -> dict:
    """What the run predicted for itself before launch, and how far off it was (results/prediction.py), if it did."""
    phases = get(summary, "prediction", "phases") or {}
    row = {}
    for phase in schema.PREDICTED_PHASES:
        p = phases.get(phase) or {}
        row[f"predicted_{phase}"] = num(p.get("predicted"))
        row[f"measured_{phase}"] = num(p.get("measured"))  # as the prediction defines it (results/prediction.py)
        row[f"{phase.removesuffix('_seconds')}_prediction_error_ratio"] = num(p.get("rel_error"))
    return row


def request_columns(prefix: str, phase: CheckpointView | RestartView) -> dict:
    """What an object store's client went through in a phase (summary storage_requests; empty on a file system)."""
    counts, uploads = phase.storage_requests, phase.incomplete_uploads
    return {**{f"{prefix}_{name}_count": num(get(counts, name)) for name in (
        "requests", "failed_requests", "throttled_requests", "retried_requests", "failed_operations")},
            f"{prefix}_incomplete_uploads_aborted_count": len(get(uploads, "aborted") or [])
            if isinstance(uploads, dict) else None}


def node_columns(prefix: str, phase: SaveView | RestartView) -> dict:
    """How many nodes a save or restart ran on and its slowest node (results/placement.py), where ranks named hosts."""
    nodes = phase.per_node
    return {f"{prefix}_nodes_count": len(nodes) if nodes else None, f"{prefix}_slowest_node": get(phase.slowest_node, "host"),
            f"{prefix}_slowest_node_rank": num(get(phase.slowest_node, "rank"))}


def restart_columns(summary: dict, rec: dict | None, phases: list[str]) -> dict:
    """Columns of one restart record, and of the save it loaded (all empty for a run without a restart)."""
    s, r = SummaryView.of(summary), RestartView.of(rec) or RestartView()
    save = loaded_save(s, r.tag) if summary.get("checkpoint") else SaveView()
    row = {
        "save_tag": save.tag, "save_step": num(save.step),
        **{f"save_{k}": num(getattr(save, k)) for k in ("blocking_seconds", "durable_seconds", "commit_seconds")},
        "save_training_lost_seconds": num(get(save.training_lost, "seconds")),
        "save_memory_cost_bytes": num(get(save.memory, "cost_bytes")),
        "save_checksum_seconds": num(save.checksum_seconds),
        **{f"throughput_{k}_mib_s": num(get(save.throughput_mib_s, k)) for k in ("blocking", "durable")},
        "restart_record": r.record, "restart_tag": r.tag, "restart_ranks": num(r.ranks),
        "restart_total_seconds": num(r.total_seconds),
        "restart_launch_seconds": num(r.launch_seconds), "restart_wall_seconds": num(r.wall_seconds),
        "restart_integrity_seconds": num(get(r.integrity, "seconds")),
        "restart_staging_seconds": num(get(r.staging, "seconds")),  # env_stage=: copying the environment
        "restart_staging_bytes": num(get(r.staging, "bytes")),
        "restart_env_cache_observed": get(r.environment_cache, "observed"),
        # how this restart started, where a restart-only re-run changed it (the run's spec says the first one's)
        **{RESTART_CONDITIONS[k]: v for k, v in restart_conditions(rec or {}).items()},
        **node_columns("save", save),
        **node_columns("restart", r)}
    return {**row, **breakdown_columns(r, save, phases), **outcome_columns(r), **request_columns("restart", r),
            **io_columns(r.io_sources)}


def breakdown_columns(r: RestartView, save: SaveView, phases: list[str]) -> dict:
    """Where a restart's time went (its phases and its load's categories) and the loaded save's."""
    lb = r.load_breakdown if isinstance(r.load_breakdown, dict) else {}
    row = {**{f"phase_{p}_seconds": num(get(r.phases, p)) for p in phases},
           **{f"load_{c}_seconds": num(get(lb, f"{c}_seconds")) for c in schema.LOAD_CATEGORIES}}
    row["load_slowest_rank"] = get(lb, "slowest_rank")
    row["load_read_bytes"] = sum(num(get(x, "read_bytes")) or 0 for x in get(lb, "per_rank") or []) or None
    peaks = [num(get(v, "peak_rss_bytes_max")) for v in (r.memory if isinstance(r.memory, dict) else {}).values()]
    row["restart_peak_rss_bytes"] = max((p for p in peaks if p is not None), default=None)
    return {**row, **{f"save_{c}_seconds": num(get(save.breakdown, f"{c}_seconds")) for c in schema.SAVE_CATEGORIES}}


def outcome_columns(r: RestartView) -> dict:
    """How a restart ended: its layout and conversion, its loss continuity, whether it verified, its load's speed."""
    replicated = get(r.engine_load_statistics, "replicated") or []
    return {
        "restart_layout_saved": get(r.layout, "saved"), "restart_layout_loaded": get(r.layout, "loaded"),
        "conversion_seconds": num(get(r.conversion, "seconds")), "conversion_reused": get(r.conversion, "reused"),
        "conversion_written_bytes": num(get(r.conversion, "bytes_written")),
        "conversion_read_bytes": num(get(r.conversion, "bytes_read_counted")),
        "first_step_loss": num(r.first_step_loss),
        "first_loss_diff_ratio": num(get(r.loss_continuity, "rel_diff")),
        "restart_verify_seconds": num(r.verify_seconds),
        "restart_verified": r.verified, "restart_outcome": get(r.outcome, "state"),
        "restart_outcome_reason": get(r.outcome, "reason"),
        "restart_verified_tensors": num(r.verified_tensors),
        "restart_cache_observed": get(r.cache, "observed"),
        "restart_load_seconds": num(r.load_seconds),
        "restart_load_throughput_mib_s": num(r.load_throughput_mib_s),
        "restart_storage_read_throughput_mib_s": num(r.storage_read_throughput_mib_s),
        # engine=lazy: how each replicated file was loaded (broadcast, or read by every replica), decided per restart
        "restart_replicated_load": "; ".join(f"{x['file']}: {x['way']}" for x in replicated) or None,
        "restart_max_rss_bytes": num(r.max_rss_bytes_per_rank), "restart_exit_code": r.exit_code}


def io_columns(io: dict | None) -> dict:
    """A restart's I/O by source, per rank (results/io_sources.py; empty for runs without it): metadata operations,
    opens and bytes read outside the checkpoint, by its imports and the environment, and what the storage delivered."""
    n, total = num(get(io, "ranks")), get(io, "total", "sources", default={}) or {}
    if not n or not isinstance(total, dict):  # none recorded: every column empty
        io, total = {}, {}
    rest = [c for name, c in total.items() if name != "checkpoint" and isinstance(c, dict)]
    imports = get(io, "phases", "imports", "sources", default={}) or {}
    kernel = get(io, "total", "kernel", default={}) or {}
    counted = get(io, "by_source", default=True)  # false: anatomy=false, the kernel's figures only

    def per_rank(value: float | None, by_source: bool = True) -> float | None:
        return None if value is None or not n or (by_source and not counted) else round(value / n, 1)

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
        "restart_major_faults_per_rank_count": per_rank(num(kernel.get("major_faults")), by_source=False)}

