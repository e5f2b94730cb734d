"""`./submit-job.sh predict MODEL [layout keys] [write_gbps= read_gbps=] [cpus_per_node=] [predict=json]`: the
save and restart seconds a run would take, each a value, a range and the resource that bounds it, from the
calibration in force (calibration=). Launches nothing, writes nothing. The same prediction is made before every
run and kept in its run directory (prediction.json), so that its summary can set it beside what was measured."""

from __future__ import annotations

import time

from restart_harness import machine
from restart_harness.files import baseline
from restart_harness.plan import checkpoint
from restart_harness.plan.estimate import typical_file_bytes
from restart_harness.predict import crossover, fit, restart_io
from restart_harness.predict import features as feats
from restart_harness.predict.model import predict
from restart_harness.resolve import Plugins
from restart_harness.results import goodput
from restart_harness.results.prediction import PHASES
from restart_harness.schema import MIB, PREDICTED_TOTAL, count, span
from restart_harness.spec.keys import GB

IGNORES = ("stragglers and variation between nodes, interference from other jobs, a storage's per-client limits "
           "beyond what the baseline measured, caches warmer or colder than the calibration's runs, and any cost "
           "that grows faster than linearly in ranks, bytes or files")


def storage(plugins: Plugins, write_gbps: float | None = None, read_gbps: float | None = None,
            record: dict | None = None, metadata_ops_s: float | None = None,
            env_metadata_ops_s: float | None = None) -> dict:
    """The storage the prediction assumes: bandwidths given, else the run's baseline record, else the cached
    baseline of the checkpoint directory's storage; bytes per second, with where they came from; and metadata rates
    where they are stated (the checkpoint's storage; the environment's file system)."""
    found = _bandwidth(plugins, write_gbps, read_gbps, record)
    if metadata_ops_s is not None:
        found["metadata_ops_per_s"] = metadata_ops_s
        found["source"] += f"; metadata_ops_s={metadata_ops_s:g} (file creates and opens per second, aggregate)"
    if env_metadata_ops_s is not None:
        found["env_metadata_ops_per_s"] = env_metadata_ops_s
        found["source"] += (f"; env_metadata_ops_s={env_metadata_ops_s:g} (the environment's file system: opens, "
                            "stats and listings per second, aggregate)")
    return found


def _bandwidth(plugins: Plugins, write_gbps: float | None, read_gbps: float | None, record: dict | None) -> dict:
    if write_gbps is not None and read_gbps is not None:
        return {"write_bytes_per_s": write_gbps * GB, "read_bytes_per_s": read_gbps * GB,
                "source": f"given: write_gbps={write_gbps:g}, read_gbps={read_gbps:g} (aggregate, GB/s = 10^9 B/s)"}
    if record is None:
        spec = plugins.spec
        files = checkpoint.files(spec)
        record = baseline.cached(plugins.target.storage_probe(), typical_file_bytes(files), spec.launched_ranks)
    write, read, which = baseline.bandwidths_mib_s(record)
    if write and read:
        return {"write_bytes_per_s": write * MIB, "read_bytes_per_s": read * MIB,
                "source": (f"{which} of {record.get('dir')} ({record.get('method')}, {record.get('ranks')} ranks x "
                           f"{record.get('file_bytes')} bytes, measured {record.get('measured_at')}; "
                           f"{baseline.scope_words(record)})")}
    return {"write_bytes_per_s": None, "read_bytes_per_s": None,
            "source": "none: no baseline of this storage (./submit-job.sh baseline dir=...) and no write_gbps= and "
                      "read_gbps=; phases that move checkpoint bytes are not predicted"}


def build(plugins: Plugins, cpus_per_node: int, store: dict, calibration: dict | None = None,
          crossover_range: tuple[int, int] = (crossover.MIN_BYTES, crossover.MAX_BYTES)) -> dict:
    """The prediction as plain data (prediction.json, predict=json) for a run's plug-ins (resolve.py); with the
    crossover of the run's family in crossover_range (bytes of checkpoint)."""
    start = time.perf_counter()
    spec = plugins.spec
    calibration = calibration or fit.load(spec.calibration)
    f = feats.of(plugins, cpus_per_node, store["write_bytes_per_s"], store["read_bytes_per_s"],
                 store.get("metadata_ops_per_s"), store.get("env_metadata_ops_per_s"))
    made = predict(plugins, f, calibration)
    made["notes"] += _storm_notes(plugins, f)
    device = machine.device_facts(spec.device)
    other = not fit.same_device(calibration, device)
    calibrated = "; ".join(fit.device_label(d) for d in calibration.get("devices") or []) or \
        "cpu: this project's 2-core machines (model not recorded)"
    if other:
        for row in made["phases"].values():
            if row.get("seconds") is not None:
                row["other_device"] = True
        made["notes"].insert(0, f"calibrated on another device ({calibrated}), not on this run's "
                                f"({fit.device_label(device)}): every figure is that device's rates, not this one's; "
                                "a calibration of this device: ./submit-job.sh matrix (it writes one) or calibrate")
    return {
        "model": spec.model_label, "layout": spec.layout, "zero": spec.zero, "engine": spec.engine,
        "stack": spec.stack, "emulate": spec.emulate, "launcher": spec.launcher, "world_size": spec.world_size,
        "calibration": {"name": spec.calibration, "path": str(fit.path_of(spec.calibration)),
                        "fitted_at": calibration.get("fitted_at"), "runs": len(calibration.get("runs", [])),
                        "devices": calibrated},
        "device": device, "other_device": other,
        "storage": store["source"], "features": f.to_json(), "phases": made["phases"], "note": made["notes"],
        "crossover": crossover.compute(plugins, f, calibration, *crossover_range), "ignores": IGNORES,
        # the best checkpoint interval at the run's failure rate (its MTBF keys): at its ranks (as GPUs), at_gpus=
        "goodput": goodput.from_phases(made["phases"], vars(spec), spec.world_size),
        "predict_seconds": round(time.perf_counter() - start, 6)}


def _storm_notes(plugins: Plugins, f: feats.Features) -> list[str]:
    """What the start-up's metadata term assumed (docs/restart-io.md)."""
    spec = plugins.spec
    ops = f.startup_metadata_ops_per_rank
    if not ops:
        missing = (f"start-up metadata: no measured counts for {spec.stack}/{spec.engine} in "
                   "configs/restart_io.json; the import storm is not predicted")
        return [missing]
    _, key = restart_io.lookup(spec.stack, spec.engine, plugins.stack.default_engine)
    measured = restart_io.load().get("measured") or {}
    per_rank = sum(ops.get(p, 0) for p in restart_io.STARTUP)
    text = (f"start-up metadata: {per_rank:,.0f} operations a rank from imports to engine_init ({key}, "
            f"measured {measured.get('date')} with torch {measured.get('torch')}, DeepSpeed "
            f"{measured.get('deepspeed')}), {f.world_size * per_rank:,.0f} for {count(f.world_size, 'rank')}")
    if f.env_metadata_ops_per_s:
        storm = (f": {f.world_size * per_rank / f.env_metadata_ops_per_s:,.1f} s at {f.env_metadata_ops_per_s:,.0f} "
                 "operations/s if every rank starts at once (the environment_metadata term; a client cache or a "
                 "staged environment, env_stage=, removes it)")
        return [text + storm]
    return [text + "; give env_metadata_ops_s= (the environment's file system's rate) to predict its time"]


def run_wall_seconds(plugins: Plugins, made: dict) -> float | None:
    """A whole run's wall seconds from its phase predictions, for the estimate before a sweep or a long run: two
    launches (the checkpoint phase starts like a restart does), every training step at the predicted step time
    (iters before, `after` after the restart), and every save's durable seconds (0 where the storage is unknown).
    None where start-up or the step is not predicted. Coarse by construction: finalize, the page-cache step and the
    storage probe are left out."""
    phases = made.get("phases") or {}

    def seconds(name: str) -> float | None:
        return (phases.get(name) or {}).get("seconds")

    start, step = seconds(PREDICTED_TOTAL), seconds("restart_first_step_seconds")
    if start is None or step is None:
        return None
    save = seconds("save_durable_seconds") or 0.0
    spec = plugins.spec
    return 2 * start + (spec.iters + spec.after) * step + spec.save_count * save


def _seconds(x: float) -> str:
    return f"{x:.3f}" if x < 100 else f"{x:,.0f}"


def render(p: dict) -> str:
    f = p["features"]
    lines = [(f"predict: {p['model']}, {p['layout']} zero={p['zero']} ({count(p['world_size'], 'rank')}, "
              f"{count(f['nodes'], 'node')} x {f['ranks_per_node']}, {count(f['cpus_per_node'], 'CPU')} per node), "
              f"engine {p['engine']}, launcher {p['launcher']}"),
             (f"calibration {p['calibration']['name']} ({p['calibration']['runs']} runs, fitted "
              f"{p['calibration']['fitted_at']}, on {p['calibration'].get('devices', 'cpu')})"
              + (" - NOT THIS RUN'S DEVICE: every figure below is that device's rates" if p.get("other_device")
                 else "")),
             f"storage     {p['storage']}",
             (f"checkpoint  {f['save_bytes']:,} bytes written (busiest rank {f['save_bytes_max_rank']:,} in "
              f"{f['save_files_max_rank']} files); restart reads {f['read_bytes']:,} bytes"), "",
             f"{'phase':<34}{'seconds':>10}{'range':>22}  bound by"]
    for name in PHASES:
        row = p["phases"][name]
        if row.get("seconds") is None:
            lines.append(f"{name:<34}{'-':>10}{'':>22}  not predicted: {row['why']}")
            continue
        between = span(_seconds(row['low']), _seconds(row['high']))
        mark = (" (extrapolated)" if row.get("extrapolated") else "") + (
            " [ANOTHER DEVICE's rates]" if row.get("other_device") else "") + (
            f" [BORROWED: {row['borrowed']}]" if row.get("borrowed") else "")
        lines.append(f"{name:<34}{_seconds(row['seconds']):>10}{between:>22}  {row['bound']}{mark}")
    if c := p.get("crossover"):
        lines += ["", f"{'crossover':<12}{crossover.headline(c)}"]
        lines += [f"{'':<12}{line}" for line in c.get("explanation", [])]
    if p.get("goodput"):
        lines += ["", f"{'goodput':<12}under failures at {p['goodput'][0]['mtbf_source']}"]
        lines += [f"{'':<12}{goodput.line(o)}" for o in p["goodput"]]
    lines += [f"note: {n}" for n in p["note"]]
    lines.append(f"ignores: {p['ignores']}")
    return "\n".join(lines)
