"""What every case of the run table (tests/conftest.py RUNS) must show, whatever its layout, stack, engine and storage:
a truthful status, saves that are blocking <= durable <= committed and whose files are what the storage holds, an
inventory and a summary that agree with the storage, restart records whose every rank was verified, phases in the
order they happen, and nothing committed that was not durable. The cases' own tests check what is particular to
each."""

from __future__ import annotations

import json
import os
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import RUNS, events, load_summary

from restart_harness import resolve
from restart_harness.schema import RESTART_PHASES, io_metadata_ops
from restart_harness.spec import record as spec_record

pytestmark = pytest.mark.slow
MARK_ORDER = [a for a, _, _ in RESTART_PHASES] + [RESTART_PHASES[-1][2], "finished"]


def _saves(run_dir: Path) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for rank, evs in events(run_dir).items():
        for e in evs:
            if e["event"] == "save":
                out.setdefault(e["tag"], {})[rank] = e
    return out


def _marks_in_order(evs: list[dict]) -> list[str]:
    marks = {e["name"]: e["t"] for e in evs if e["event"] == "mark"}
    seen = [m for m in MARK_ORDER if m in marks]
    return [f"{a} after {b}" for a, b in pairwise(seen) if marks[a] > marks[b]]


@pytest.mark.parametrize("name", list(RUNS))
def test_every_case_holds(harness, name):
    case = RUNS[name]
    run_dir, first, _ = harness.played(name)
    run = resolve.read(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    summary = load_summary(run_dir)
    assert (summary["status"]["state"], summary["status"]["reason"]) == (status["state"], status["reason"])
    # how busy the machine was before each launch (other work), recorded beside what was measured
    for launched in [summary["checkpoint"], *summary["restarts"]]:
        load = launched["machine_load"]
        assert load["cpus"] >= 1 and 0 <= load["cpu_busy_fraction"] <= 1 and isinstance(load["busy"], bool), load
    if case.expect == 0:
        assert status["state"] == "complete", status
    else:
        assert status["state"] == "failed" and status["reason"], status
        assert first.stderr.strip().splitlines()[-1] == f"error: {status['reason']}"

    # saves: every rank's figures ordered, and only a save durable on every rank is ever committed
    target = run.stored
    stored = target.listing()
    committed_tags = []
    for tag, per_rank in _saves(run_dir).items():
        assert len(per_rank) == run.spec.world_size, tag
        for e in per_rank.values():
            assert 0 < e["blocking_seconds"] <= e["durable_seconds"] <= e["commit_seconds"], (tag, e)
            assert e["bytes"] == sum(f["bytes"] for f in e["files"])
        if any(e.get("emulated") for e in per_rank.values()):  # commit = the slowest rank's durable seconds + the
            # commit after it, data generation left out (docs/emulation.md): not a wall-clock moment
            slowest = max(e["durable_seconds"] for e in per_rank.values())
            assert min(e["commit_seconds"] for e in per_rank.values()) >= slowest
        else:
            durable_everywhere = max(e["start"] + e["durable_seconds"] for e in per_rank.values())
            assert min(e["start"] + e["commit_seconds"] for e in per_rank.values()) >= durable_everywhere
        committed_tags.append(tag)
    if not summary["status"].get("checkpoint_deleted") and not status.get("checkpoint_deleted"):
        latest = target.latest()
        assert latest == (committed_tags[-1] if committed_tags else None)
        if latest:
            # what the saves recorded is what the storage holds (a folder of shards: the sum under it)
            held = {rel: n for rel, n in stored[latest]}
            for e in _saves(run_dir)[latest].values():
                for f in e["files"]:
                    under = sum(n for rel, n in held.items() if rel == f["path"] or rel.startswith(f["path"] + "/"))
                    assert under == f["bytes"], f
            inventory = json.loads((run_dir / "inventory.json").read_text())
            assert {f["path"]: f["bytes"] for f in inventory["files"]} == held
            assert summary["checkpoint"]["bytes"] == inventory["total_bytes"] == sum(held.values())

    # what each save cost training: its parts add up to it, or no number and the reason (results/training_cost.py)
    lost = summary["checkpoint"]["training_lost"]
    trained = [e for e in events(run_dir).get(0, []) if e["event"] == "step"]
    if summary["checkpoint"]["saves"] and trained:
        assert lost["saves"] == len(summary["checkpoint"]["saves"]), lost
        for save in summary["checkpoint"]["saves"]:
            tl = save["training_lost"]
            if lost["baseline_step"]["seconds"] is None:
                assert tl["seconds"] is None and tl["note"] == lost["note"] and "warm-up" in lost["note"]
                continue
            parts = tl["blocking_seconds"] + tl["overlapped_extra_seconds"] + tl["other_seconds"]
            assert abs(tl["seconds"] - parts) < 1e-5 and tl["window_seconds"] > 0, tl
            assert tl["overlapped_steps"] <= tl["steps_in_window"] and (tl["overlapped_steps"] == 0 or save["async"])
        assert case.expect != 0 or "training lost" in first.stdout

    # what each save cost in host memory (results/save_memory.py): every rank's every save measured, the figures
    # consistent with each other; no slope below 5 saves, and the reason
    memory = summary["checkpoint"]["memory"]
    if summary["checkpoint"]["saves"]:
        for rank, evs in events(run_dir).items():
            for e in (e for e in evs if e["event"] == "save"):
                m = e["memory"]
                assert m["rss_before_bytes"] > 50 * 2**20 and m["peak_added_bytes"] >= 0, (rank, m)
                assert m["peak_added_bytes"] >= max(m["held_bytes"], m["retained_bytes"]), (rank, m)
        assert memory["saves"] == len(summary["checkpoint"]["saves"]), memory
        assert memory["peak_added_bytes_max"] == max(s["memory"]["peak_added_bytes"]
                                                     for s in summary["checkpoint"]["saves"])
        if len(summary["checkpoint"]["saves"]) < 5:
            assert memory["growth"]["bytes_per_save"] is None and "at least 5 saves" in memory["growth"]["note"]
        assert case.expect != 0 or "save memory" in first.stdout

    # restarts: every record's every rank verified, phases in order, trained on from the saved step
    records = sorted(p.name for p in (run_dir / "events").iterdir() if p.name.startswith("restart-"))
    assert [r["record"] for r in summary["restarts"]] == records
    for r in summary["restarts"]:
        per_rank = events(run_dir, r["record"])
        own = spec_record.read(run_dir, r["record"]).spec
        assert len(per_rank) == r["ranks"] == own.world_size, r["record"]
        verifies = [e for evs in per_rank.values() for e in evs if e["event"] == "verify"]
        assert len(verifies) == own.world_size and all(v["ok"] for v in verifies), r["record"]
        assert r["verified"] is True and r["differing"] == []
        if own.env_cache == "keep" and own.cache == "drop" and r["cache"]["method"] is not None:
            # the checkpoint's pages evicted file by file, every other page left (no drop_caches)
            assert r["cache"]["method"] == "posix_fadvise_dontneed" and r["cache"]["observed"] == "cold", r["cache"]
            assert r["environment_cache"]["requested"] == "keep", r["environment_cache"]
        if own.env_cache == "auto" and own.cache == "drop" and r["cache"]["method"] is not None and os.geteuid() == 0:
            # the default as root (tiny-dp2): the whole page cache dropped, the environment's with it, and said so
            assert r["cache"]["method"] == "drop_caches" and r["cache"]["observed"] == "cold", r["cache"]
            assert r["environment_cache"]["method"] == "drop_caches (the checkpoint's cache step)", r["environment_cache"]
        for rank, evs in per_rank.items():
            assert _marks_in_order(evs) == [], (r["record"], rank)
            assert not [e for e in evs if e["event"] == "error"], (r["record"], rank)
        steps = [e["step"] for e in per_rank[0] if e["event"] == "step"]
        if steps:
            assert steps[0] == int(r["tag"].removeprefix("global_step").removesuffix("_universal")) + 1
        # the restart's I/O by source (results/io_sources.py): the imports from the Python environment (once for
        # the node under launcher=prefork); never more bytes through read calls than the kernel counted
        io = r["io_sources"]
        assert io["ranks"] == r["ranks"] and "imports" in io["phases"], (r["record"], io)
        assert io["total"]["kernel"]["read_chars"] > 2**20, (r["record"], io["total"])
        if not (own.anatomy or own.trace):  # no counters preloaded: the kernel's figures alone
            assert io["by_source"] is False and not any(p["sources"] for p in io["phases"].values()), r["record"]
            continue
        env = io["phases"]["imports"]["sources"]["environment"]
        assert io_metadata_ops(env) > 3000 and env["read_bytes"] > 2**20, (r["record"], env)
        counted = sum(c.get("read_bytes", 0) for c in io["total"]["sources"].values())
        assert counted <= io["total"]["kernel"]["read_chars"], (r["record"], io["total"])
    for rank, evs in events(run_dir).items():
        if case.expect == 0:
            assert _marks_in_order(evs) == [], rank
