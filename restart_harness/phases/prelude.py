"""Before the checkpoint phase: the baseline of the checkpoint storage (cached, or a bounded probe) and what the
calibration in force predicts for the run, each recorded in the run directory and said in one line."""

from __future__ import annotations

from restart_harness import resolve
from restart_harness.files import baseline
from restart_harness.files.atomic import write_json_atomic
from restart_harness.plan import checkpoint, estimate


def record_baseline(run: resolve.Run) -> dict | None:
    """The baseline of the checkpoint storage (cached, or a bounded probe at the planned checkpoint's typical file
    size and rank count) into run_dir/baseline.json; None with baseline=false."""
    spec = run.spec
    if not spec.baseline or not run.engine.saves:
        return None
    files = checkpoint.files(spec)
    record = baseline.for_run(run.target.storage_probe(), estimate.typical_file_bytes(files), spec.launched_ranks,
                              spec.baseline_max_age_hours * 3600, sum(f.bytes for f in files))
    write_json_atomic(run.run_dir / "baseline.json", record)
    return record


def record_prediction(run: resolve.Run, probe: dict | None) -> str | None:
    """What the calibration in force predicts for this run, into prediction.json (the summary sets it beside what is
    measured); one line for the terminal. None where the planner cannot plan it."""
    from restart_harness.predict import forecast
    from restart_harness.results import prediction as pr

    if not run.stack.planned:
        return None
    spec = run.spec
    try:
        store = forecast.storage(run, record=probe if probe and not probe.get("error") else None)
        made = forecast.build(run, (run.facts.get("host") or {}).get("cpus") or 1, store)
    except Exception as exc:  # noqa: BLE001 - a prediction must never stop a run; its failure is recorded instead
        made = {"error": f"{type(exc).__name__}: {exc}"}
    write_json_atomic(run.run_dir / pr.FILE, made)
    if made.get("error"):
        return f"no prediction: {made['error']}"
    p = made["phases"]
    shown = (("durable save", "save_durable_seconds"), ("restart with launcher", pr.TOTAL))
    parts = [f"{label} {p[name]['seconds']:.2f} s" + (f" ({p[name]['borrowed'].split(':')[0]})"
                                                      if p[name].get("borrowed") else "")
             for label, name in shown if p[name].get("seconds") is not None]
    whole = forecast.run_wall_seconds(run, made)
    if whole is not None:
        parts.append(f"the whole run about {estimate.duration(whole)}")
    other = " - calibrated on ANOTHER DEVICE, its rates, not this one's" if made.get("other_device") else ""
    return f"calibration {spec.calibration}: " + (", ".join(parts) or "nothing predicted (see prediction.json)") + other


def baseline_line(b: dict) -> str:
    """The storage baseline in one line; a cached one says where and when it was measured (the cache is per file
    system and user, so it may be another checkout's or another run's folder on the same storage)."""
    age = (f"(cached: measured {b['age_seconds'] / 3600:.1f} h ago in {b.get('dir')}, on the same file system) "
           if b["cached"] and b.get("age_seconds") is not None else "")
    c = b.get("ceiling")
    ceiling = f"; ceiling write {c['write_mib_s']} MiB/s, read {c['read_mib_s']} MiB/s" if c else ""
    return (f"storage {age}write {b['write_mib_s']} MiB/s, read {b['read_mib_s']} MiB/s "
            f"({b['method']}, {b['ranks']} x {b['file_bytes']} bytes){ceiling}")
