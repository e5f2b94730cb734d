#!/usr/bin/env python3
"""Where a test session's time went, from the file tests/durations.py wrote.

Usage: python3 scripts/test_durations.py [FILE] [--top N]
FILE defaults to test-logs/durations.json (the last session in this checkout); earlier sessions, CI's included, are
kept as ~/.cache/restart-harness/test-logs/durations-<UTC time>-<commit>.json. Prints Markdown tables: the set-up
steps, the shared set-ups, seconds per test module (setup + call + teardown), the run table's cases and the slowest
tests. Standard library only."""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def seconds(test: dict) -> float:
    return sum(test.get(f"{w}_seconds", 0.0) for w in ("setup", "call", "teardown"))


def render(data: dict, top: int = 15) -> str:
    tests = data["tests"]
    setup_steps = data.get("setup_steps_seconds", {})
    total = data["pytest_wall_seconds"] + sum(setup_steps.values())
    counts = ", ".join(f"{n} {o}" for o, n in sorted(Counter(t["outcome"] for t in tests).items()))
    lines = [f"commit {data['commit']}, {data['cpus']} CPUs, pytest {' '.join(data['args']) or '(all)'}",
             (f"{len(tests)} tests ({counts}); {total:,.0f} s in all: set-up steps "
              f"{sum(setup_steps.values()):,.0f} s, pytest {data['pytest_wall_seconds']:,.0f} s"), ""]
    if machine := data.get("machine_cpu_seconds"):  # the host's speed varies: two runs' minutes compare only where their steal is alike
        lines[-1:-1] = [(f"machine during pytest: busy {machine['busy']:,.0f} CPU-s, idle {machine['idle']:,.0f}, "
                         f"iowait {machine['iowait']:,.0f}, steal {machine['steal']:,.0f} (a busy host steals more)")]
    if setup_steps or data.get("shared_setups_seconds"):
        lines += ["| set-up | seconds |", "|---|---:|"]
        lines += [f"| {k} (run-tests.sh) | {v:,.1f} |" for k, v in setup_steps.items()]
        lines += [f"| {k} (inside pytest) | {v:,.1f} |" for k, v in data.get("shared_setups_seconds", {}).items()]
        lines.append("")
    modules: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, float] = defaultdict(float)
    for t in tests:
        modules[t["id"].split("::")[0]].append(seconds(t))
        cpu[t["id"].split("::")[0]] += t.get("cpu_seconds", 0.0)
    lines += ["| test module | tests | seconds | share | CPU seconds |", "|---|---:|---:|---:|---:|"]
    busy = sum(sum(v) for v in modules.values()) or 1.0
    for name, values in sorted(modules.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {name} | {len(values)} | {sum(values):,.1f} | {sum(values) / busy:.0%} | {cpu[name]:,.0f} |")
    lines += workers(data)
    if cases := data.get("cases", {}):
        played = sum(c["seconds"] for c in cases.values())
        lines += ["", (f"Run-table cases (conftest.RUNS): {len(cases)} played, {played:,.0f} s (inside the tests "
                       "above: a case is paid by the first test that asks for it)"), "",
                  "| case | invocations | seconds |", "|---|---:|---:|"]
        lines += [f"| {n} | {c['invocations']} | {c['seconds']:,.1f} |" for n, c in list(cases.items())[:top]]
    if waits := data.get("case_waits_seconds") or {}:  # a test of one worker waiting while the other played its case: an idle worker (tests/conftest.py)
        each = ", ".join(f"{n} {s:,.1f}" for n, s in list(waits.items())[:top])
        lines += ["", f"Waits for a case the other worker was playing: {sum(waits.values()):,.1f} s ({each})"]
    lines += ["", f"Slowest {top} tests (setup + call + teardown):", "", "| test | seconds |", "|---|---:|"]
    lines += [f"| {t['id']} | {seconds(t):,.1f} |" for t in sorted(tests, key=seconds, reverse=True)[:top]]
    return "\n".join(lines)


def workers(data: dict) -> list[str]:
    """Per pytest-xdist worker: tests, seconds busy, and the tail where it sat idle while another still ran; the CPU
    the tests' processes used against what the machine's CPUs could give over the session (schema 2 and later)."""
    tests = [t for t in data["tests"] if "start" in t]
    if not tests:
        return []
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t in tests:
        spans[t.get("worker") or "main"].append((t["start"], t["start"] + seconds(t)))
    first, last = min(a for v in spans.values() for a, _ in v), max(b for v in spans.values() for _, b in v)
    wall = last - first
    cpu = sum(t.get("cpu_seconds", 0.0) for t in tests)
    out = ["", (f"Workers: {len(spans)}; tests ran over {wall:,.0f} s; their processes used {cpu:,.0f} CPU seconds, "
                f"{cpu / (wall * data['cpus']):.0%} of {data['cpus']} CPUs over that time"), "",
           "| worker | tests | busy seconds | idle seconds | idle at the end |", "|---|---:|---:|---:|---:|"]
    for name, v in sorted(spans.items()):
        busy = sum(b - a for a, b in v)
        out.append(f"| {name} | {len(v)} | {busy:,.0f} | {wall - busy:,.0f} | {last - max(b for _, b in v):,.0f} |")
    return out


def main(argv: list[str]) -> int:
    top = int(argv.pop(argv.index("--top") + 1)) if "--top" in argv else 15
    argv = [a for a in argv if a != "--top"]
    path = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "test-logs" / "durations.json"
    if not path.is_file():
        print(f"error: {path}: no such file (./run-tests.sh writes test-logs/durations.json)", file=sys.stderr)
        return 2
    print(render(json.loads(path.read_text()), top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
