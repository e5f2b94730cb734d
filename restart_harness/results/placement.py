"""Which rank ran on which node (each rank's `process` event: its host name and the launcher's node index), and the
per-node view of a save and of a restart (docs/results.md). Records that name no hosts give no placement (None),
never a guessed one."""

from __future__ import annotations

import itertools

from restart_harness.results import events as ev


def _processes(record: dict[int, list[dict]]) -> dict[int, dict]:
    """rank -> its `process` event, for the ranks that recorded a host."""
    procs = {rank: next((e for e in evs if e["event"] == "process"), None) for rank, evs in record.items()}
    return {rank: proc for rank, proc in procs.items() if proc and proc.get("host")}


def hosts(record: dict[int, list[dict]]) -> dict[int, str]:
    """rank -> host, for the ranks that recorded one."""
    return {rank: proc["host"] for rank, proc in _processes(record).items()}


def placement(record: dict[int, list[dict]]) -> list[dict] | None:
    """[{host, node, ranks}] in node order (the launcher's index, then the first rank), or None when a rank
    recorded no host."""
    where = hosts(record)
    if not where or len(where) != len(record):
        return None
    index: dict[str, int | None] = {}
    for proc in _processes(record).values():
        index.setdefault(proc["host"], proc.get("node"))
    by_host: dict[str, list[int]] = {}
    for rank in sorted(where):
        by_host.setdefault(where[rank], []).append(rank)
    order = sorted(by_host, key=lambda h: (index.get(h) is None, index.get(h) or 0, by_host[h][0]))
    return [{"host": h, "node": index.get(h), "ranks": by_host[h]} for h in order]


def _most_at_once(windows: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one instant."""
    edges = sorted([(a, 1) for a, _ in windows] + [(b, -1) for _, b in windows])  # an end before a start at once
    return max(itertools.accumulate(step for _, step in edges), default=0)


def save_per_node(per_rank: list[dict], where: dict[int, str], order: list[dict]) -> list[dict]:
    """One save's per-node view from its ranks' save events (with `rank`): ranks, writers, files, bytes, the
    slowest rank's blocking and durable seconds, and the most of its ranks writing at once."""
    out = []
    for node in order:
        if not (mine := [r for r in per_rank if where.get(r["rank"]) == node["host"]]):
            continue
        writers = [r for r in mine if r["files"]]
        slowest = max(mine, key=lambda r: r["durable_seconds"])
        out.append({
            "host": node["host"], "ranks": [r["rank"] for r in mine], "writers": len(writers),
            "files": sum(len(r["files"]) for r in mine), "bytes": sum(r["bytes"] for r in mine),
            "blocking_seconds": round(max(r["blocking_seconds"] for r in mine), 6),
            "durable_seconds": round(slowest["durable_seconds"], 6), "slowest_rank": slowest["rank"],
            "concurrent_writers_max": _most_at_once([_writing(r) for r in writers])})
    return out


def _writing(save: dict) -> tuple[float, float]:
    """When a rank's save was writing (wall seconds): its wave where it wrote in one (emulated), else its save from
    start to durable. A wave's window leaves out waiting for the other waves, which the save's own window holds."""
    if save.get("wave_start") is not None and save.get("wave_end") is not None:
        return save["wave_start"], save["wave_end"]
    return save["start"], save["start"] + save["durable_seconds"]


def restart_per_node(record: dict[int, list[dict]], per_rank: list[dict], order: list[dict]) -> list[dict]:
    """A restart's per-node view: ranks, bytes their engine loads read (files as loaded), the slowest rank's load
    seconds and restart total."""
    where = hosts(record)
    loaded = ev.of_kind(record, "load_anatomy")
    out = []
    for node in order:
        if not (mine := [r for r in per_rank if where.get(r["rank"]) == node["host"]]):
            continue
        read = [e["io"]["read"]["bytes"] for r in mine for e in loaded.get(r["rank"], []) if e.get("io")]
        totals = [r for r in mine if r["total_seconds"] is not None]
        slowest = max(totals, key=lambda r: r["total_seconds"]) if totals else None
        loads = [r["load_seconds"] for r in mine if r["load_seconds"] is not None]
        out.append({
            "host": node["host"], "ranks": [r["rank"] for r in mine],
            "read_bytes": sum(read) if read else None,
            "load_seconds": round(max(loads), 6) if loads else None,
            "total_seconds": round(slowest["total_seconds"], 6) if slowest else None,
            "slowest_rank": slowest["rank"] if slowest else None})
    return out


def slowest(per_node: list[dict], key: str) -> dict | None:
    """{host, rank, seconds} of the node whose slowest rank took longest by `key`."""
    timed = [n for n in per_node if n.get(key) is not None]
    if not timed:
        return None
    worst = max(timed, key=lambda n: n[key])
    return {"host": worst["host"], "rank": worst["slowest_rank"], "seconds": worst[key]}


COLLATERAL = "Terminated"  # srun's word for a task it ended because another one failed (--kill-on-bad-exit)


def lost(record: dict[int, list[dict]], ranks: int, verdicts: dict[int, str] | None = None) -> str | None:
    """Ranks of a failed launch that ended without recording an error or finishing, grouped by node, those the
    launcher reports killed or failed first and those it ended because of them after: "rank 1 on node2 (all 1 of
    its ranks): Killed after step 4; rank 0 on node1 (all 1 of its ranks): ended by the launcher after the others
    failed; last committed save global_step2". `verdicts`: rank -> the launcher's word for how its task ended
    (srun's "Killed", "Terminated", "Exited with exit code 1"); None when there are no silent ranks."""
    verdicts = verdicts or {}
    where = hosts(record)
    silent = [r for r in range(ranks) if not any(e["event"] in ("error", "done") or (
        e["event"] == "mark" and e.get("name") == "finished") for e in record.get(r, []))]
    if not silent:
        return None
    groups: dict[tuple[int, str, str], list[int]] = {}
    for r in silent:
        verdict = verdicts.get(r, "")
        if not record.get(r):
            key = (2, "", "never started (no event recorded)")
        elif verdict == COLLATERAL:
            key = (1, where.get(r, "?"), "ended by the launcher after the others failed")
        else:
            key = (0, where.get(r, "?"), verdict or "ended without a word")
        groups.setdefault(key, []).append(r)
    parts = []
    for (_, host, how), mine in sorted(groups.items()):
        if not host:
            parts.append(f"{ranks_text(mine)} {how}")
            continue
        on_host = [r for r, h in where.items() if h == host]
        whole = f"all {len(on_host)} of its ranks" if len(mine) == len(on_host) else f"{len(mine)} of {len(on_host)}"
        steps = [e["step"] for r in mine for e in record[r] if e["event"] == "step"]
        after = f"after step {max(steps)}" if steps else "before the first step"
        parts.append(f"{ranks_text(mine)} on {host} ({whole}): {how} {after}")
    saves = sorted({(e["step"], e["tag"]) for evs in record.values() for e in evs if e["event"] == "save"})
    last = f"last committed save {saves[-1][1]}" if saves else "no save committed"
    return "; ".join([*parts, last])


def ranks_text(ranks: list[int], label: bool = True) -> str:
    """A list of ranks for people: "rank 3", "ranks 0-3" (contiguous), "ranks 0,2,5"; label=False leaves out the
    word ("0-3", for a table's column). The one formatter of the terminal, the report and failure messages."""
    contiguous = len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1))
    text = f"{ranks[0]}-{ranks[-1]}" if contiguous else ",".join(map(str, ranks))
    return (("rank " if len(ranks) == 1 else "ranks ") + text) if label else text
