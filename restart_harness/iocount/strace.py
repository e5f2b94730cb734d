"""The independent check of the I/O-by-source counters: RH_STRACE=1 runs a launch under `strace -f -ff` (file-name and
metadata calls only), and `python -m restart_harness.iocount.strace RUN_DIR [RECORD]` sets each rank's counts beside
its counters (strace's count is an upper bound of theirs; why they differ: docs/measurements.md#io-by-source)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ENV = "RH_STRACE"
OPENS = ("open", "openat", "openat2", "creat")
METADATA = ("stat", "lstat", "fstat", "newfstatat", "statx", "access", "faccessat", "faccessat2", "readlink",
            "readlinkat")
TRACED = ("execve", *OPENS, *METADATA)
_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+)?(\w+)\(.*\)\s+=\s+(-?\d+|\?)")


def missing(on: bool) -> str | None:
    """Why RH_STRACE=1 cannot be honoured here (preflight says it before anything is launched), else None. `on`: the
    variable as spec/environment.py parsed it (true, 1, yes, on)."""
    if on and shutil.which("strace") is None:
        return f"{ENV}=1 needs strace, which is not installed (apt-get install strace)"
    return None


def wrapper(run_dir: Path, record: str, on: bool) -> list[str]:
    """The command prefix that traces a launch, when RH_STRACE is on (else nothing)."""
    if not on:
        return []
    tool = shutil.which("strace")
    if tool is None:  # preflight refused this already
        raise RuntimeError(missing(on))
    folder = run_dir / "strace" / record
    folder.mkdir(parents=True, exist_ok=True)
    return [tool, "-f", "-ff", "-qq", "--seccomp-bpf", "-e", f"trace={','.join(TRACED)}", "-o", str(folder / "trace")]


def count(trace: Path) -> dict[str, int]:
    """Opens (and those that failed) and metadata calls in one process's trace, after its last successful execve
    (what the process was before it became the rank is not the rank's)."""
    out = {"opens": 0, "open_failures": 0, "metadata_calls": 0}
    for line in trace.read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if not m:
            continue
        name, result = m.group(1), m.group(2)
        if name == "execve" and result == "0":
            out = dict.fromkeys(out, 0)
        elif name in OPENS:
            out["opens" if result != "?" and int(result) >= 0 else "open_failures"] += 1
        elif name in METADATA:
            out["metadata_calls"] += 1
    return out


def counters(events: list[dict]) -> dict[str, int]:
    """A rank's own counters over its whole life (every mark's I/O, all sources): in strace's terms, its opens
    include the listings' (opendir opens the folder) and its library loads (one open each)."""
    totals = {"opens": 0, "open_failures": 0, "listings": 0, "metadata_calls": 0, "mapped_files": 0}
    for e in events:
        if e.get("event") == "mark":
            for counts in ((e.get("io") or {}).get("sources") or {}).values():
                for k in totals:
                    totals[k] += counts.get(k, 0)
    return totals


def compare(run_dir: Path, record: str) -> list[dict]:
    """Per rank: strace's opens and metadata calls, the counters' (opens, failed opens, listings and mapped
    libraries together: each is an open in the kernel's view), and the share of strace's calls they saw."""
    rows = []
    for path in sorted((run_dir / "events" / record).glob("rank-*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        pid = next((e["pid"] for e in events if e.get("event") == "process"), None)
        trace = run_dir / "strace" / record / f"trace.{pid}"
        if pid is None or not trace.is_file():
            continue
        seen, ours = count(trace), counters(events)
        row = {"rank": int(path.stem.split("-")[1]), "pid": pid}
        counted_opens = ours["opens"] + ours["open_failures"] + ours["listings"] + ours["mapped_files"]
        for k, ratio, kernel, counted in (("opens", "opens_seen_ratio", seen["opens"] + seen["open_failures"],
                                           counted_opens), ("metadata_calls", "metadata_seen_ratio",
                                                            seen["metadata_calls"], ours["metadata_calls"])):
            row.update({f"strace_{k}": kernel, f"counted_{k}": counted,
                        ratio: round(counted / kernel, 4) if kernel else None})
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2:
        print("usage: python -m restart_harness.iocount.strace RUN_DIR [RECORD]  (a launch run with RH_STRACE=1)",
              file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    folder = run_dir / "strace"
    records = [args[1]] if len(args) == 2 else sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not records:
        print(f"error: no strace folder in {run_dir}: run the launch with {ENV}=1", file=sys.stderr)
        return 2
    for record in records:
        print(f"{record}: rank  strace opens  counted  seen   strace metadata  counted  seen")
        for r in compare(run_dir, record):
            print(f"{'':>{len(record)}}  {r['rank']:>4}  {r['strace_opens']:>12,}  {r['counted_opens']:>7,}  "
                  f"{r['opens_seen_ratio'] or 0:>5.1%}  {r['strace_metadata_calls']:>15,}  "
                  f"{r['counted_metadata_calls']:>7,}  {r['metadata_seen_ratio'] or 0:>5.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
