"""A phase's I/O by source (the environment, the extension cache, the checkpoint, ...), summed over the ranks' marks
into summary.json, and its terminal rows. worker/io_marks.py measures it; docs/measurements.md#io-by-source."""

from __future__ import annotations

from restart_harness.results.views import SummaryView
from restart_harness.schema import IO_KERNEL_FIELDS, IO_SOURCE_FIELDS, IO_SOURCES, MIB, io_metadata_ops


def _add(into: dict[str, int], counts: dict) -> None:
    for k, v in counts.items():
        if isinstance(v, int) and not isinstance(v, bool):
            into[k] = into.get(k, 0) + v


def _shaped(acc: dict) -> dict:
    """A phase's (or the total's) sums: the sources in their order, the kernel's fields in theirs."""
    per_source = acc["sources"]
    names = [*(n for n in IO_SOURCES if n in per_source), *(n for n in per_source if n not in IO_SOURCES)]
    return {"sources": {n: {k: per_source[n][k] for k in IO_SOURCE_FIELDS if per_source[n].get(k)} for n in names
                        if any(per_source[n].values())},
            "kernel": {k: acc["kernel"][k] for k in IO_KERNEL_FIELDS if k in acc["kernel"]}}


def by_phase(record: dict[int, list[dict]], phases: tuple, facts: dict | None) -> dict | None:
    """Per phase (name, start mark, end mark): the I/O each source saw, summed over the ranks that recorded it, and
    `total` over the phases given; each source's file system from spec.json's io_sources. None when no mark of the
    record carries I/O (one recorded before 2026-11-26); without the preloaded counters (anatomy=false) the kernel's
    figures only, `by_source` false."""
    out: dict[str, dict] = {}
    total: dict = {"sources": {}, "kernel": {}}
    ranks: set[int] = set()
    by_source = False
    for name, start_mark, end_mark in phases:
        phase: dict = {"sources": {}, "kernel": {}}
        for rank, evs in sorted(record.items()):
            marks = {e["name"]: e for e in evs if e["event"] == "mark"}
            if start_mark not in marks or end_mark not in marks or "io" not in marks[end_mark]:
                continue
            io = marks[end_mark]["io"]
            out[name] = phase
            ranks.add(rank)
            by_source = by_source or "sources" in io
            for acc in (phase, total):
                for source, counts in (io.get("sources") or {}).items():
                    _add(acc["sources"].setdefault(source, {}), counts)
                _add(acc["kernel"], io.get("kernel") or {})
    if not out:
        return None
    filesystems = {source: f"{fs.get('type')} on {fs.get('mount')}" for source, fact in (facts or {}).items()
                   if isinstance(fact, dict) and (fs := fact.get("filesystem"))}
    return {"ranks": len(ranks), "by_source": by_source,
            "phases": {name: _shaped(phase) for name, phase in out.items()}, "total": _shaped(total),
            "filesystems": filesystems}


def table(io: dict) -> str:
    """A restart's (or phase's) io_sources as text, per rank: phase by phase, each source's operations and bytes."""
    n = io["ranks"] or 1
    lines = [(f"{'phase':<16}{'source':<16}{'opens':>9}{'failed':>8}{'metadata':>10}{'listings':>9}{'MiB read':>10}"
             f"{'mapped':>8}{'MiB mapped':>11}   (per rank, {io['ranks']} ranks)")]
    for phase, figures in [*io["phases"].items(), ("total", io["total"])]:
        for source, c in figures["sources"].items():
            lines.append(f"{phase:<16}{source:<16}{c.get('opens', 0) / n:>9,.0f}{c.get('open_failures', 0) / n:>8,.0f}"
                         f"{c.get('metadata_calls', 0) / n:>10,.0f}{c.get('listings', 0) / n:>9,.0f}"
                         f"{c.get('read_bytes', 0) / n / 2**20:>10,.2f}{c.get('mapped_files', 0) / n:>8,.0f}"
                         f"{c.get('mapped_bytes', 0) / n / 2**20:>11,.1f}")
        k = figures.get("kernel") or {}
        if k:
            lines.append(f"{phase:<16}{'(kernel)':<16}storage delivered {k.get('storage_read_bytes', 0) / n / 2**20:,.2f} "
                         f"MiB, {k.get('major_faults', 0) / n:,.0f} major faults, read calls "
                         f"{k.get('read_chars', 0) / n / 2**20:,.2f} MiB")
    return "\n".join(lines)


def io_rows(io: dict | None) -> list[tuple[str, str]]:
    """The restart's I/O besides the checkpoint's, per rank (results/io_sources.py), and where imports' comes from."""
    if not io or not io.get("ranks"):
        return []
    n, total, kernel = io["ranks"], io["total"]["sources"], io["total"].get("kernel") or {}
    delivered = (f"storage delivered {kernel['storage_read_bytes'] / n / MIB:,.1f} MiB, "
                 f"{kernel.get('major_faults', 0) / n:,.0f} major faults" if "storage_read_bytes" in kernel else "")
    if not io.get("by_source", True):
        return [("restart I/O", f"per rank {delivered or 'not measured'}; by source not counted (anatomy=false)")]
    rest = [c for name, c in total.items() if name != "checkpoint"]
    libraries = [c for name, c in total.items() if name not in ("checkpoint", "pseudo")]  # not /dev/shm segments
    ops = sum(io_metadata_ops(c) for c in rest) / n
    read = sum(c.get("read_bytes", 0) for c in rest) / n
    mapped = sum(c.get("mapped_bytes", 0) for c in libraries) / n
    ckpt = total.get("checkpoint", {})
    text = (f"per rank {ops:,.0f} metadata ops ({sum(c.get('opens', 0) for c in rest) / n:,.0f} opens), "
            f"{read / MIB:,.1f} MiB read and {mapped / MIB:,.0f} MiB of libraries mapped besides the checkpoint's "
            f"{io_metadata_ops(ckpt) / n:,.0f} ops and {ckpt.get('read_bytes', 0) / n / MIB:,.2f} MiB")
    imports = (io["phases"].get("imports") or {}).get("sources") or {}
    if imports:
        ops_by = {name: io_metadata_ops(c) for name, c in imports.items()}
        top = max(ops_by, key=ops_by.get)
        fs = io.get("filesystems", {}).get(top)
        text += (f"; imports {sum(ops_by.values()) / n:,.0f} ops, {ops_by[top] / max(1, sum(ops_by.values())):.0%} "
                 f"in {top}" + (f" ({fs})" if fs else ""))
    return [("restart I/O", text + (f"; {delivered}" if delivered else ""))]


def main(argv: list[str] | None = None) -> int:
    """`python -m restart_harness.results.io_sources RUN_DIR [RECORD]`: a restart's I/O by phase and source (the
    latest restart; RECORD: restart-NN, or `checkpoint`)."""
    import json
    import sys
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2:
        print("usage: python -m restart_harness.results.io_sources RUN_DIR [RECORD]", file=sys.stderr)
        return 2
    try:
        summary = json.loads((Path(args[0]) / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"error: no readable summary.json in {args[0]}: {exc}", file=sys.stderr)
        return 2
    record = args[1] if len(args) == 2 else None
    io = ((summary.get("checkpoint") or {}).get("io_sources") if record == "checkpoint" else
          next((r.io_sources for r in reversed(SummaryView.of(summary).restarts) if record in (None, r.record)), None))
    if not io:
        print(f"error: {args[0]} has no I/O by source for {record or 'its latest restart'} (recorded from 2026-11-26 "
              "with anatomy=true or trace=true)", file=sys.stderr)
        return 2
    print(table(io))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
