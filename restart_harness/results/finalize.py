"""Run directory files -> inventory.json and summary.json. A pure function of what is on disk, so it
can be re-run at any time (and after every restart-only re-run)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from restart_harness.results import efficiency
from restart_harness.results import events as ev
from restart_harness.results import inventory as inv
from restart_harness.results import summary as sm
from restart_harness.storage.atomic import read_json, write_json_atomic


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


def _object_listing(url: str | None) -> dict[str, list[tuple[str, int]]] | None:
    """ckpt_dir=s3://...: the run's objects per tag, from the bucket listing (None for a file-system checkpoint;
    {} when the store cannot be listed now: no inventory rather than a wrong one)."""
    if not url:
        return None
    from restart_harness.storage.s3 import S3Settings, S3Url, listing

    try:
        objects = listing(S3Url.parse(url), S3Settings.from_environment())
    except Exception as exc:  # noqa: BLE001 - the client's errors have no common base; say why and go on
        print(f"[finalize] cannot list {url}: {exc}; no inventory", flush=True)
        return {}
    out: dict[str, list[tuple[str, int]]] = {}
    for key, nbytes in objects:
        tag, _, rel = key.partition("/")
        if rel:
            out.setdefault(tag, []).append((rel, nbytes))
    return out


def finalize(run_dir: Path, state: str, reason: str | None = None) -> dict:
    spec = read_json(run_dir / "spec.json")
    ckpt_root = Path(spec["checkpoint_root"])
    writers = _writers(run_dir)
    listed = _object_listing(spec.get("checkpoint_url"))  # tag -> [(path, bytes)] for an object store
    committed = {}
    for tag in writers:
        if listed is not None and listed.get(tag):
            committed[tag] = {"files": len(listed[tag]), "bytes": sum(n for _, n in listed[tag])}
        elif listed is None and (ckpt_root / tag).is_dir():
            files = inv.files_of(ckpt_root / tag)
            committed[tag] = {"files": len(files), "bytes": sum(n for _, n in files)}
    restarts = []
    for info in _records(run_dir):
        record = ev.read_record(run_dir, info["record"])
        tag = next((e["tag"] for evs in record.values() for e in evs if e["event"] == "loaded"), None)
        restarts.append(sm.restart(record, info["record"], info, info.get("cache"),
                                   committed.get(tag, {}).get("bytes"), str(ckpt_root), run_dir))
    sm.loss_continuity(restarts)
    tag = restarts[-1]["tag"] if restarts and restarts[-1]["tag"] else None
    if tag and tag.endswith("_universal"):  # a restart at another layout loaded the converted copy of this tag
        tag = tag.removesuffix("_universal")
    if tag is None and (ckpt_root / "latest").is_file():
        tag = (ckpt_root / "latest").read_text().strip()
    inventory = None
    if tag and listed is not None and listed.get(tag):
        inventory = inv.build(f"{spec['checkpoint_url']}/{tag}", writers.get(tag), listed[tag])
    elif tag and listed is None and (ckpt_root / tag).is_dir():
        inventory = inv.build(ckpt_root / tag, writers.get(tag))
    if inventory is not None:
        inventory["tag"] = tag
        write_json_atomic(run_dir / "inventory.json", inventory)
    status = {"state": state, "reason": reason, "time": time.time()}
    summary = sm.build(run_dir, spec, status, {"root": str(ckpt_root), "committed": committed}, inventory,
                       restarts)
    efficiency.add(summary, run_dir)
    write_json_atomic(run_dir / "summary.json", summary)
    write_json_atomic(run_dir / "status.json", status)
    return summary
