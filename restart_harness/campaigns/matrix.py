"""`matrix`: the check to run on a GPU node before trusting it with real runs: every engine (and the `fsdp2-dcp`
case) at the layouts that fit the node, each an ordinary run (checkpointed, restarted cold, verified), what cannot run
listed with its one-line reason; then one table and the report (docs/clusters.md#the-check-matrix)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from restart_harness import machine, preflight
from restart_harness.campaigns import outcome
from restart_harness.campaigns.sweep import fixed
from restart_harness.command.options import MATRIX_STACK_CASES, MatrixOptions
from restart_harness.command.parse import parse_run
from restart_harness.errors import UsageError
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.files.exclusive import claim_dir
from restart_harness.predict import fit
from restart_harness.results.views import CheckpointView, RestartView, SaveView, SummaryView

SHORT = ["iters=4", "save_interval=2", "after=1", "cache=drop"]
REPO = Path(__file__).resolve().parents[2]


def device_of(options: MatrixOptions) -> tuple[str, int]:
    gpus = machine.nvidia_devices()
    device = options.device if options.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not (options.gpus or gpus):
        raise UsageError("device=cuda: no NVIDIA device found (/dev/nvidia*); accepted: device=cpu or auto")
    return device, options.gpus or gpus or 1


def layouts(options: MatrixOptions, device: str, gpus: int) -> list[tuple[int, int, int]]:
    if options.layouts != "auto":
        return [tuple(int(x[2:]) for x in layout.split("-")) for layout in options.layouts.split(",")]
    if device == "cpu":
        return [(1, 1, 2), (2, 2, 1)]
    return [(tp, pp, gpus // (tp * pp)) for tp, pp in ((1, 1), (2, 1), (1, 2), (2, 2)) if tp * pp <= gpus]


def engines(options: MatrixOptions) -> list[str]:
    from engines import registry

    if options.engines != "all":
        return options.engines.split(",")
    return [n for n, cls in registry.all_engines().items() if cls.saves] + list(MATRIX_STACK_CASES)


def cases(options: MatrixOptions, folder: Path) -> tuple[str, list[dict]]:
    """(device, every case with its tokens, and `refused` with the reason where it cannot run on this node)."""
    device, gpus = device_of(options)
    model = options.model or ("1B" if device == "cuda" else "tiny")
    out = []
    for tp, pp, dp in layouts(options, device, gpus):
        for engine in engines(options):
            tokens = [model, f"tp={tp}", f"pp={pp}", f"dp={dp}", *MATRIX_STACK_CASES.get(engine, [f"engine={engine}"]),
                      f"device={device}", *SHORT, f"launcher={options.launcher}", f"keep={str(options.keep).lower()}",
                      f"results_dir={folder / 'runs'}"]
            case = {"name": f"{engine} tp{tp}-pp{pp}-dp{dp}", "engine": engine, "layout": f"tp{tp}-pp{pp}-dp{dp}",
                    "tokens": tokens, "refused": None}
            try:
                spec, _ = parse_run(tokens)
                preflight.run(machine.resolve(spec))
            except UsageError as exc:
                case["refused"] = str(exc)
            out.append(case)
    return device, out


def run(options: MatrixOptions, say=print) -> Path:
    """Run every case that can run here, one after another, into a new folder results_dir/matrix-<time>/: the runs
    (runs/), matrix.json (every case: tokens, refusal or exit code, figures) and the report (report/)."""
    name = f"matrix-{datetime.now():%Y%m%d-%H%M%S}"
    device, todo = cases(options, Path(options.results_dir).expanduser().resolve() / name)
    runnable = [c for c in todo if not c["refused"]]
    if todo:  # nothing made yet: a matrix none of whose cases can run is refused, as one run would be
        outcome.something_runs(f"matrix layouts={options.layouts} engines={options.engines}", len(todo),
                               len(runnable), todo[0]["refused"],
                               "layouts and engines this node can run (layouts=auto, engines=all)", "cases")
    folder = claim_dir(Path(options.results_dir), name)
    for case in todo:  # the folder as made (a second matrix in the same second gets name-2)
        case["tokens"] = [t if not t.startswith("results_dir=") else f"results_dir={folder / 'runs'}"
                          for t in case["tokens"]]
    say(f"[matrix] {device}: {len(runnable)} cases to run, {len(todo) - len(runnable)} refused on this node; "
        f"matrix.json in {folder} is rewritten after each case")
    # state: running until every case ran (complete), or failed when the matrix itself was stopped (Ctrl-C); a case
    # without exit_code had not run then
    record = {"device": device, "created": time.time(), "state": "running", "cases": todo}
    write_json_atomic(folder / "matrix.json", record)
    try:
        for i, case in enumerate(runnable, 1):
            say(f"[matrix] {i}/{len(runnable)} {case['name']}")
            start = time.time()
            proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), *case["tokens"]],
                                  capture_output=True, text=True, check=False)
            case["seconds"] = round(time.time() - start, 1)
            case["exit_code"] = proc.returncode
            lines = proc.stdout.strip().splitlines()
            run_dir = Path(lines[-1]) if lines and Path(lines[-1]).is_dir() else None
            case["run_dir"] = str(run_dir) if run_dir else None
            case["error"] = (proc.stderr.strip().splitlines() or [""])[-1] if proc.returncode else None
            case.update(_figures(run_dir))
            write_json_atomic(folder / "matrix.json", record)
            say(f"[matrix] {i}/{len(runnable)} {case['name']}: {_result(case)} in {case['seconds']:.0f} s")
        record["state"] = "complete"
    except KeyboardInterrupt:
        record["state"] = "failed"
        raise
    finally:
        write_json_atomic(folder / "matrix.json", record)
    if runnable:
        from analysis.report import main as report

        report([str(folder / "runs"), "-o", str(folder / "report")])
        record["calibration"] = calibrate_device(folder, say)
        write_json_atomic(folder / "matrix.json", record)
    say(render(record))
    return folder


def calibrate_device(folder: Path, say) -> str | None:
    """A calibration of this device from the matrix's runs (folder/calibration.json): the prediction of a run on it
    then uses this device's rates (calibration=PATH) instead of another device's."""
    try:
        path = fit.write(fit.calibrate([folder / "runs"]), folder / "calibration.json")
    except UsageError as exc:
        say(f"[matrix] no calibration of this device: {exc}")
        return None
    say(f"[matrix] a calibration of this device from these runs: {path} (calibration={path} in a run or predict)")
    return str(path)


def _figures(run_dir: Path | None) -> dict:
    if run_dir is None or not (run_dir / "summary.json").is_file():
        return {"verified": None}
    s = SummaryView.of(read_json(run_dir / "summary.json"))
    ckpt, restart = s.checkpoint or CheckpointView(), s.restart or RestartView()
    save = ckpt.saves[-1] if ckpt.saves else SaveView()
    return {"verified": restart.verified, "bytes": ckpt.bytes, "files": ckpt.files,
            "blocking_seconds": save.blocking_seconds, "durable_seconds": save.durable_seconds,
            "load_seconds": restart.load_seconds, "load_mib_s": restart.load_throughput_mib_s,
            "restart_seconds": restart.total_seconds, "phases": restart.phases}


def render(record: dict) -> str:
    lines = [f"matrix on {record['device']}",
             (f"{'case':<34} {'result':<10} {'blocking s':>10} {'durable s':>10} {'load s':>8} {'load MiB/s':>10} "
             f"{'restart s':>9}")]
    for c in record["cases"]:
        if c["refused"]:
            lines.append(f"{c['name']:<34} refused    {c['refused']}")
            continue
        lines.append(f"{c['name']:<34} {_result(c):<10} {fixed(c.get('blocking_seconds')):>10} "
                     f"{fixed(c.get('durable_seconds')):>10} {fixed(c.get('load_seconds')):>8} "
                     f"{fixed(c.get('load_mib_s'), 1):>10} {fixed(c.get('restart_seconds'), 2):>9}"
                     + (f"  {c['error']}" if c.get("error") else ""))
    return "\n".join(lines)


def _result(case: dict) -> str:
    return "verified" if case.get("verified") else "FAILED" if case.get("exit_code") else "unverified"


def exit_code(folder: Path) -> int:
    """The campaigns' one rule (outcome.py): 0 where every case that could run here ran and verified (a case this
    node cannot run is listed with its reason: planned, not failed)."""
    return outcome.exit_code("planned" if c["refused"] else "complete" if c.get("verified") else "failed"
                             for c in read_json(folder / "matrix.json")["cases"])
