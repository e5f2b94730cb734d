"""Sweeps: comma lists on any key (and on MODEL) expand to their product; `repeats=N` runs each combination N
times. Every combination is validated before anything is created; then each run goes into one sweep folder
(`<results_dir>/sweep-<time>/NNN-<run>`), `sweep.json` records each combination, its run directory, state and
reason, and a failing combination is recorded and the sweep goes on."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from restart_harness.errors import RunFailed, UsageError
from restart_harness.results.atomic import make_fresh_dir, write_json_atomic
from restart_harness.spec.runspec import RunSpec

SCHEMA_VERSION = 1
_NO_LISTS = ("results_dir", "phase", "dry_run")  # one sweep folder, one kind of run


@dataclass
class Combination:
    """One point of the product: the values that vary, the tokens that produce it, its validated RunSpec."""

    values: dict[str, str]
    tokens: list[str]
    spec: RunSpec


def is_sweep(tokens: list[str]) -> bool:
    """Comma lists anywhere, or repeats > 1."""
    if any("," in t for t in tokens):
        return True
    return any(t.startswith("repeats=") and t.split("=", 1)[1] not in ("1", "+1") for t in tokens[1:])


def expand(tokens: list[str]) -> tuple[dict[str, list[str]], list[tuple[dict[str, str], list[str]]]]:
    """MODEL key=a,b ... -> (the lists, [(varying values, tokens of one combination), ...]) in product order."""
    from restart_harness.spec.args import split_tokens

    if not tokens:
        split_tokens(tokens)  # the usual "missing MODEL" line
    _, pairs = split_tokens([tokens[0].replace(",", "_"), *tokens[1:]])
    pairs = {"MODEL": tokens[0], **pairs}
    lists = {}
    for key, text in pairs.items():
        values = text.split(",")
        if len(values) > 1:
            if key in _NO_LISTS:
                raise UsageError(f"{key}={text}: a sweep takes one {key}")
            if any(v == "" for v in values) or len(set(values)) != len(values):
                raise UsageError(f"{key}={text}: a sweep list needs distinct, non-empty values")
            lists[key] = values
    combos = []
    for choice in itertools.product(*lists.values()):
        chosen = dict(zip(lists, choice))
        merged = {**pairs, **chosen}
        combos.append((chosen, [merged.pop("MODEL"), *(f"{k}={v}" for k, v in merged.items())]))
    return lists, combos


def plan(tokens: list[str]) -> tuple[dict[str, list[str]], list[Combination]]:
    """Expand and validate every combination (UsageError names the combination) before anything is written."""
    from restart_harness.launch import launchers
    from restart_harness.spec.args import parse_args

    lists, combos = expand(tokens)
    out = []
    for values, combo_tokens in combos:
        try:
            spec = parse_args(combo_tokens)
            launchers.check(spec)
        except UsageError as exc:
            where = " ".join(f"{k}={v}" for k, v in values.items())
            raise UsageError(f"{exc} (in the sweep combination {where})" if where else str(exc)) from None
        out.append(Combination(values, combo_tokens, spec))
    if len({c.spec.results_dir for c in out}) > 1:
        raise UsageError("results_dir=: a sweep writes into one folder")
    return lists, out


def new_sweep_dir(results_dir: str) -> Path:
    try:
        return make_fresh_dir(Path(results_dir), f"sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    except FileExistsError as exc:
        raise RunFailed(str(exc)) from None


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / total)
    return "#" * filled + "." * (width - filled)


def run(tokens: list[str], lists: dict[str, list[str]], combos: list[Combination]) -> Path:
    """Run every combination x repeat in order into one sweep folder; returns it. Never stops on a failure."""
    from restart_harness.launch import runner
    from restart_harness.results.status import observed

    sweep_dir = new_sweep_dir(combos[0].spec.results_dir)
    runs = []
    for combo in combos:
        for rep in range(1, combo.spec.repeats + 1):
            runs.append({"index": len(runs) + 1, "combination": combo.values, "repeat": rep,
                         "repeats": combo.spec.repeats, "command": combo.tokens, "run_dir": None,
                         "state": "pending", "reason": None})
    sweep = {"schema_version": SCHEMA_VERSION, "sweep_id": sweep_dir.name, "command": tokens, "lists": lists,
             "state": "running", "started": time.time(), "finished": None, "runs": runs}
    write_json_atomic(sweep_dir / "sweep.json", sweep)
    total = len(runs)
    by_index = [combo for combo in combos for _ in range(combo.spec.repeats)]
    try:
        for entry, combo in zip(runs, by_index):
            label = " ".join(f"{k}={v}" for k, v in entry["combination"].items()) or "(one combination)"
            rep = f", repeat {entry['repeat']}/{entry['repeats']}" if entry["repeats"] > 1 else ""
            print(f"[sweep {entry['index']}/{total} {_bar(entry['index'] - 1, total)}] {label}{rep}",
                  file=sys.stderr, flush=True)
            entry["state"] = "running"
            write_json_atomic(sweep_dir / "sweep.json", sweep)
            spec = dataclasses.replace(combo.spec, results_dir=str(sweep_dir))
            try:
                entry["run_dir"] = str(runner.run(spec, prefix=f"{entry['index']:03d}-"))
                entry["state"] = observed(Path(entry["run_dir"]))["state"]
            except RunFailed as exc:
                entry["state"], entry["reason"] = "failed", str(exc)
            except Exception as exc:  # noqa: BLE001 - one broken combination must not end the sweep
                entry["state"], entry["reason"] = "failed", f"{type(exc).__name__}: {exc}"
            if entry["run_dir"] is None:
                made = sorted(sweep_dir.glob(f"{entry['index']:03d}-*"))
                entry["run_dir"] = str(made[-1]) if made else None
            write_json_atomic(sweep_dir / "sweep.json", sweep)
            print(f"[sweep {entry['index']}/{total} {_bar(entry['index'], total)}] {entry['state']}"
                  + (f": {entry['reason']}" if entry["reason"] else ""), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        for entry in runs:
            if entry["state"] in ("pending", "running"):
                entry["state"], entry["reason"] = "skipped", "sweep interrupted"
        sweep["state"] = "interrupted"
        raise
    finally:
        if sweep["state"] == "running":
            sweep["state"] = "complete"
        sweep["finished"] = time.time()
        sweep["counts"] = {s: sum(1 for r in runs if r["state"] == s) for s in sorted({r["state"] for r in runs})}
        write_json_atomic(sweep_dir / "sweep.json", sweep)
    return sweep_dir


def render(sweep: dict) -> str:
    """One line per run: index, state, run directory name, reason."""
    lines = [f"sweep {sweep['sweep_id']}: {', '.join(f'{n} {s}' for s, n in sweep['counts'].items())}"]
    for r in sweep["runs"]:
        name = Path(r["run_dir"]).name if r["run_dir"] else "-"
        lines.append(f"  {r['index']:>3}  {r['state']:<9} {name}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return "\n".join(lines)
