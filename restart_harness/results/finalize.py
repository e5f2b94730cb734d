"""Run directory files (and the target's listing of what it stores) -> inventory.json and summary.json. A pure
function of what is stored, so it can be re-run at any time (and after every restart-only re-run)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

from restart_harness import resolve
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.results import attribution, io_sources, prediction
from restart_harness.results import events as ev
from restart_harness.results import summary as sm
from restart_harness.schema import KINDS, RESTART_PHASES, classify, count
from restart_harness.spec import record as records
from restart_harness.spec.runspec import RunSpec


def _writers(run_dir: Path) -> dict[str, dict[str, int]]:
    """tag -> {path relative to the tag dir: writing rank}, from the save events."""
    out: dict[str, dict[str, int]] = {}
    for rank, saves in ev.of_kind(ev.read_record(run_dir, "checkpoint"), "save").items():
        for save in saves:
            for f in save["files"]:
                out.setdefault(save["tag"], {})[f["path"]] = rank
    return out


def _records(run_dir: Path) -> list[dict]:
    paths = sorted((run_dir / "records").glob("restart-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [json.loads(p.read_text()) for p in paths]  # in record order: restart-100 after restart-99


def build_inventory(where: str, writers: dict[str, int] | None, entries: list[tuple[str, int]]) -> dict:
    """The inventory of one tag stored at `where` (a folder or a URL): entries are (path relative to the tag, bytes)
    of every stored file or object; writers maps a DeepSpeed path to the rank whose engine save wrote it."""
    writers = writers or {}
    files = [{"path": rel, "bytes": nbytes, "kind": classify(rel),
              "rank": writers.get(rel, writers.get(rel.split("/")[0]))} for rel, nbytes in sorted(entries)]
    by_kind = {k: {"files": 0, "bytes": 0} for k in KINDS}
    by_rank: dict = defaultdict(lambda: {"files": 0, "bytes": 0})
    for f in files:
        for tally in (by_kind[f["kind"]], by_rank["unknown" if f["rank"] is None else str(f["rank"])]):
            tally["files"] += 1
            tally["bytes"] += f["bytes"]
    return {
        "dir": where, "files": files, "total_files": len(files),
        # DeepSpeed files: one per engine.save() path, whether a file or a directory of shards (torchsnapshot, dcp)
        "total_entries": len({f["path"].split("/", 1)[0] for f in files}),
        "total_bytes": sum(f["bytes"] for f in files),
        "by_kind": by_kind,
        "by_rank": dict(sorted(by_rank.items(), key=lambda kv: (kv[0] == "unknown", int(kv[0]) if kv[0].isdigit() else 0))),
    }


def rerun(info: dict, phase: str) -> bool:
    """A restart-only re-run's record, not the run's own restart (records before the harness said so: the run's own
    is restart-01 of a phase=all run)."""
    return bool(info["rerun"]) if "rerun" in info else not (info["record"] == "restart-01" and phase == "all")


def finalize(run: resolve.Run | Path, state: str, reason: str | None = None, as_made: RunSpec | None = None) -> dict:
    """The summary of the run as made: `run` resolved once by the caller (a folder only where none was: it is read),
    `as_made` the spec spec.json holds where `run` carries a restart-only re-run's own."""
    run = resolve.read(run) if isinstance(run, Path) else run
    made = run.made if as_made is None else dataclasses.replace(run.made, spec=as_made)
    run_dir, target = made.run_dir, run.target
    writers = _writers(run_dir)
    try:  # tag -> (path, bytes) of what the target stores now ({} when it cannot: no inventory rather than a wrong one)
        stored = run.stored.listing()
    except Exception as exc:  # noqa: BLE001 - a storage's client errors have no common base; say why and go on
        print(f"[finalize] cannot list {run.target.describe()}: {exc}; no inventory", flush=True)
        stored = {}
    committed = {tag: {"files": len(stored[tag]), "bytes": sum(n for _, n in stored[tag])}
                 for tag in writers if stored.get(tag)}
    restarts = [_restart(made, run, info, committed, stored) for info in _records(run_dir)]
    sm.loss_continuity(restarts)
    for r in restarts:
        if r["outcome"]["state"] == "verified" and not r["verified"]:  # a first loss that did not continue the run's
            r["outcome"] = {"state": "failed", "reason": _not_restored(r)}
    tag = (restarts[-1]["saved_tag"] if restarts else None) or run.stored.latest()
    inventory = None
    if tag and stored.get(tag):
        inventory = build_inventory(f"{target.describe()}/{tag}", writers.get(tag), stored[tag])
        inventory["tag"] = tag
        write_json_atomic(run_dir / "inventory.json", inventory)
    status = _status(state, reason, restarts)
    summary = sm.build(run_dir, made.to_json(), status, {"root": str(target.root), "committed": committed},
                       inventory, restarts)
    _checkpoint_phase(summary, run_dir, run.stored)
    _efficiency(summary, run_dir)
    summary["prediction"] = prediction.compare(prediction.read(run_dir), summary)
    if summary["prediction"] is not None:  # measured on a busy machine, a prediction's error is not the model's
        summary["prediction"]["machine_busy"] = any((r.get("machine_load") or {}).get("busy")
                                                    for r in [summary["checkpoint"], *summary["restarts"][:1]])
    write_json_atomic(run_dir / "summary.json", summary)
    write_json_atomic(run_dir / "status.json", status)
    return summary


def _restart(made: records.RunRecord, run, info: dict, committed: dict, stored: dict) -> dict:
    """One restart's summary from its record and its launch record (info), with what it read from the target."""
    run_dir = made.run_dir
    record = ev.read_record(run_dir, info["record"])
    tag = next((e["tag"] for evs in record.values() for e in evs if e["event"] == "loaded"), None)
    # every restart says where it ran and what it read: its own layout (its record's spec, where it has one), the
    # saved checkpoint, and what it loaded (the same, or a converted copy of it)
    if "layout" not in info:
        own = (records.read(run_dir, info["record"]).spec
               if records.record_spec_path(run_dir, info["record"]).is_file() else made.spec)
        info["layout"] = {"saved": made.spec.layout, "loaded": own.layout}
    r = sm.restart(record, info["record"], info, info.get("cache"), committed.get(tag, {}).get("bytes"),
                   str(run.target.root), run_dir)
    r["saved_tag"] = (info.get("conversion") or {}).get("tag") or tag
    r["loaded"] = {"tag": tag, "files": len(stored.get(tag, [])) or None,
                   "bytes": sum(n for _, n in stored.get(tag, [])) or None}
    r["storage_requests"] = run.stored.requests(run_dir / "logs" / "client" / info["record"])
    r["incomplete_uploads"] = info.get("incomplete_uploads")
    r["integrity"] = info.get("integrity")  # the committed files' checksums, read back before the launch
    r["rerun"] = rerun(info, made.spec.phase)
    r["outcome"] = info.get("outcome") or ({"state": "verified", "reason": None} if r["verified"] else
                                           {"state": "failed", "reason": "not verified on every rank"})
    facts = dict(made.facts.get("io_sources") or {})
    if info.get("staging"):  # env_stage=: the ranks' environment and extension cache were the copy's
        for source in ("environment", "extension_cache"):
            facts[source] = {**(facts.get(source) or {}), "filesystem": info["staging"]["filesystem"]}
    r["io_sources"] = io_sources.by_phase(record, RESTART_PHASES, facts)
    r["attribution"] = attribution.of_record(run_dir, info["record"], record, RESTART_PHASES, info)
    attribution.with_load_anatomy(r["attribution"], r.get("load_breakdown"))
    return r


def _status(state: str, reason: str | None, restarts: list[dict]) -> dict:
    """status.json: the run's state is the outcome of its own phases; a restart-only re-run's is its own (its
    record's outcome), and a re-run that did not verify is said beside the run's state, not in place of it."""
    unverified = [r for r in restarts if not r["verified"] and not r["rerun"]]
    if state == "complete" and unverified:
        r = unverified[-1]
        state, reason = "failed", f"{r['record']}: {_not_restored(r)}"
    status = {"state": state, "reason": reason, "time": time.time()}
    if failed := [r for r in restarts if r["rerun"] and r["outcome"]["state"] == "failed"]:
        status["reruns_failed"] = [{"record": r["record"], **r["outcome"]} for r in failed]
        last = failed[-1]
        status["reason"] = "; ".join([*([reason] if reason else []), (f"{count(len(failed), 'restart-only re-run')} "
                                      f"did not verify, the last {last['record']}: {last['outcome']['reason']}")])
    return status


def _efficiency(summary: dict, run_dir: Path) -> None:
    """summary['baseline'] from run_dir/baseline.json (null when baseline=false; files/baseline.py) and
    checkpoint.efficiency: the save's durable and the load's throughput over the baseline's (`save`, `load`) and over
    the ceiling's (`save_of_ceiling`, `load_of_ceiling`; null where the storage has none, or the record predates it)."""
    path = run_dir / "baseline.json"
    base = summary["baseline"] = read_json(path) if path.is_file() else None
    ckpt = summary.get("checkpoint") or {}
    got = {"save": (ckpt.get("throughput_mib_s") or {}).get("durable"),
           "load": (summary.get("restart") or {}).get("load_throughput_mib_s")}
    ckpt["efficiency"] = {f"{way}{of}": round(got[way] / ref[key], 4) if got[way] and ref.get(key) else None
                          for of, ref in (("", base or {}), ("_of_ceiling", (base or {}).get("ceiling") or {}))
                          for way, key in (("save", "write_mib_s"), ("load", "read_mib_s"))}


def _not_restored(r: dict) -> str:
    return "restart did not restore the saved state: " + ", ".join(r["differing"][:5] or ["nothing verified"])


def _checkpoint_phase(summary: dict, run_dir: Path, stored) -> None:
    """What the checkpoint phase's launch record and the target's client say: requests, uploads, machine load, and
    its start-up attributed as a restart's (the phases up to engine_init)."""
    path = run_dir / "records" / "checkpoint.json"
    launch = json.loads(path.read_text()) if path.is_file() else {}
    summary["checkpoint"].update(storage_requests=stored.requests(run_dir / "logs" / "client" / "checkpoint"),
                                 incomplete_uploads=launch.get("incomplete_uploads"),
                                 machine_load=launch.get("machine_load"))
    summary["checkpoint"]["attribution"] = attribution.of_record(
        run_dir, "checkpoint", ev.read_record(run_dir, "checkpoint"), RESTART_PHASES[:4], launch)
