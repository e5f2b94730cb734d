"""analysis/: the report command, its CSV, figures, notebook and HTML page, on the stored results of real tiny runs
(tests/data/results: a dp=2 run in one/, a repeat of it and a dp=1 run in more/; tests/data/make_results.py made
them), and on corrupt or unfinished inputs made from copies of them. No training: analysis reads files only."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import REPO, load_summary, require_tool
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.container import BarContainer, ErrorbarContainer

from analysis import load as ld
from analysis import panels, plots, report

MIB = 2**20
STORED = REPO / "tests" / "data" / "results"
FIGURES = ["checkpoint_bytes", "checkpoint_files", "save_seconds", "throughput_mib_s", "restart_phases_seconds",
           "file_size_bytes", "step_seconds", "load_breakdown_seconds", "save_breakdown_seconds",
           "restart_timeline_seconds", "prediction_seconds"]
# Every column is an identifier/setting, or a figure whose name ends with its unit.
UNIT_SUFFIXES = ("_seconds", "_bytes", "_files", "_mib_s", "_ratio", "_count", "_steps", "_tensors", "_ranks")
NOT_FIGURES = {"run_id", "state", "state_reason", "sweep", "schema_version", "model", "shrink", "precision", "tp", "pp",
               "dp", "zero", "nodes", "world_size", "emulate", "engine", "engine_label", "device", "cache_requested", "num_parameters",
               "checkpoint_tag",
               "save_tag", "save_step", "restart_record", "restart_tag", "restart_verified", "restart_outcome", "restart_outcome_reason",
               "restart_cache_observed", "restart_env_cache_observed",
               "restart_launcher", "restart_cache_requested", "restart_env_cache_requested", "restart_staged",
               "restart_exit_code", "baseline_method", "machine_busy_at_launch", "save_memory_growing", "final_loss", "run_dir", "training_steps",
               "load_slowest_rank", "restart_layout_saved", "restart_layout_loaded", "conversion_reused",
               "first_step_loss", "save_slowest_node", "save_slowest_node_rank", "restart_slowest_node",
               "restart_slowest_node_rank", "ceiling_write_from", "ceiling_read_from", "restart_replicated_load"}


def report_cmd(*args: str, cwd: Path = REPO, module: bool = False) -> subprocess.CompletedProcess:
    """The real command: ./analysis/report.py (or python -m analysis) with the interpreter running pytest."""
    entry = ["-m", "analysis"] if module else [str(REPO / "analysis" / "report.py")]
    return subprocess.run([sys.executable, *entry, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          check=False)


@pytest.fixture(scope="session")
def tiny_dp2() -> Path:
    """A run directory: tiny dp=2, default engine, iters=4 save_interval=2 after=2."""
    (run,) = (STORED / "one").iterdir()
    return run


@pytest.fixture(scope="session")
def more_runs() -> Path:
    """A folder of runs: a repeat of tiny_dp2's configuration and a second layout (dp=1)."""
    return STORED / "more"


@pytest.fixture(scope="session")
def study(tiny_dp2: Path, more_runs: Path) -> list[Path]:
    """The inputs given to the report: a run directory and a folder of runs."""
    return [tiny_dp2, more_runs]


@pytest.fixture(scope="session")
def made_report(study: list[Path], tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("report") / "r"
    proc = report_cmd(*map(str, study), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return proc, out


@pytest.fixture(scope="session")
def built(study: list[Path]) -> dict:
    runs, skipped = ld.load(study)
    assert not skipped
    return report.build(runs, skipped, [])


def _copy_results(run: Path, dest: Path) -> Path:
    """A run directory's result files (not its checkpoint) copied to dest."""
    dest.mkdir(parents=True)
    for name in ("spec.json", "summary.json", "status.json", "inventory.json"):
        shutil.copy(run / name, dest / name)
    return dest


def _edit_summary(run: Path, change) -> None:
    summary = json.loads((run / "summary.json").read_text())
    change(summary)
    (run / "summary.json").write_text(json.dumps(summary))


def _bars(ax) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def _errorbars(ax) -> list[ErrorbarContainer]:
    return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_report_command_writes_every_file(made_report):
    proc, out = made_report
    assert Path(proc.stdout.strip().splitlines()[-1]) == out.resolve()
    assert proc.stderr == ""
    for name in ("runs.csv", "saves.csv", "report.md", "report.html", *(f"{f}.png" for f in FIGURES)):
        assert (out / name).is_file(), name
    for f in FIGURES:
        png = (out / f"{f}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, f
    md = (out / "report.md").read_text()
    # labels name only what tells configurations apart; what they share is said once
    assert "| tp1 pp1 dp2 | 2 | 2 |" in md and "| tp1 pp1 dp1 | 1 | 1 |" in md
    assert "every configuration: tiny, default" in md
    assert "## Where the time goes" in md and "## Slowest rank per restart phase" in md and "## Restart memory" in md
    assert "## Predicted before launch vs measured" in md
    html = (out / "report.html").read_text()
    assert html.count("src='data:image/png;base64,") == len(FIGURES)
    assert "http://" not in html and "https://" not in html and "<link" not in html and "<script" not in html


def test_csv_matches_summaries(made_report, study):
    _, out = made_report
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {r["restart_record"] for r in rows} == {"restart-01"}
    for col in rows[0]:
        assert col in NOT_FIGURES or col.endswith(UNIT_SUFFIXES), f"column {col} names no unit"
    assert "phase_checkpoint_load_seconds" in rows[0] and "throughput_durable_mib_s" in rows[0]
    for row in rows:
        s = load_summary(Path(row["run_dir"]))
        ck, rs = s["checkpoint"], s["restart"]
        save = next(x for x in ck["saves"] if x["tag"] == rs["tag"])
        assert (row["model"], row["engine"], int(row["tp"]), int(row["pp"]), int(row["dp"])) == (
            "tiny", "default", 1, 1, s["spec"]["dp"])
        assert int(row["checkpoint_bytes"]) == ck["bytes"] and int(row["checkpoint_files"]) == ck["files"]
        assert int(row["optimizer_states_bytes"]) == ck["by_kind"]["optimizer_states"]["bytes"]
        assert float(row["save_blocking_seconds"]) == save["blocking_seconds"]
        assert float(row["save_durable_seconds"]) == save["durable_seconds"]
        assert float(row["throughput_durable_mib_s"]) == ck["throughput_mib_s"]["durable"]
        assert float(row["restart_total_seconds"]) == rs["total_seconds"]
        for phase, seconds in rs["phases"].items():
            assert float(row[f"phase_{phase}_seconds"]) == seconds
        assert row["restart_verified"] == "true" and row["restart_cache_observed"] == rs["cache"]["observed"]
        baseline = s.get("baseline") or {}  # runs probe their storage once (cached) unless baseline=false
        if baseline.get("write_mib_s") is None:
            assert row["baseline_write_mib_s"] == ""  # none measured: an empty cell, not 0
        else:
            assert float(row["baseline_write_mib_s"]) == baseline["write_mib_s"]
            assert float(row["efficiency_save_ratio"]) == ck["efficiency"]["save"]
    with open(out / "saves.csv") as f:
        saves = list(csv.DictReader(f))
    assert len(saves) == 6 and {s["tag"] for s in saves} == {"global_step2", "global_step4"}


def test_checkpoint_figures_per_layout(built):
    groups = built["groups"]
    assert [(g.layout, len(g.runs)) for g in groups] == [("tp1 pp1 dp2", 2), ("tp1 pp1 dp1", 1)]
    dp2, dp1 = (load_summary(g.runs[0].dir)["checkpoint"] for g in groups)
    ax = built["figures"]["checkpoint_bytes"].axes[0]
    (bars,) = _bars(ax)
    assert bars.get_label() == "tiny default" and len(bars) == 2
    assert [b.get_height() for b in bars] == pytest.approx([dp2["bytes"] / MIB, dp1["bytes"] / MIB])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["tp1 pp1 dp2", "tp1 pp1 dp1"]
    assert ax.get_ylabel() == "checkpoint size (MiB)"
    (err,) = _errorbars(ax)  # only the dp2 bar has repeats
    assert len(err.lines[2][0].get_segments()) == 1
    (bars,) = _bars(built["figures"]["checkpoint_files"].axes[0])
    assert [b.get_height() for b in bars] == [3, 2]


def test_save_and_throughput_figures(built):
    groups = built["groups"]
    ax = built["figures"]["save_seconds"].axes[0]
    blocking, durable = _bars(ax)
    assert (blocking.get_label(), durable.get_label()) == ("blocking (training waits)", "durable (on stable storage)")
    assert len(blocking) == len(durable) == 2
    one_run = load_summary(groups[1].runs[0].dir)["checkpoint"]["saves"]
    assert blocking[1].get_height() == pytest.approx(statistics.median(s["blocking_seconds"] for s in one_run))
    assert all(d.get_height() >= b.get_height() for b, d in zip(blocking, durable, strict=True))
    assert len(_errorbars(ax)) == 2  # both configurations have several saves
    assert ax.get_ylabel() == "save time (s)"
    ax = built["figures"]["throughput_mib_s"].axes[0]
    assert [b.get_label() for b in _bars(ax)] == ["save, blocking", "save, durable", "restart load",
                                                  "restart, storage read"]
    assert all(len(b) == 2 for b in _bars(ax)) and ax.get_ylabel() == "throughput (MiB/s)"
    lines = {c.get_label() for c in ax.collections if isinstance(c, LineCollection) and "storage" in c.get_label()}
    measured = any((load_summary(r.dir).get("baseline") or {}).get("write_mib_s") for g in groups for r in g.runs)
    ceiling = any(((load_summary(r.dir).get("baseline") or {}).get("ceiling") or {}).get("write_mib_s")
                  for g in groups for r in g.runs)  # the storage's ceiling, beside its baseline
    assert lines == ({"storage baseline, write", "storage baseline, read"} if measured else set()) | (
        {"storage ceiling, write", "storage ceiling, read"} if ceiling else set())


def test_restart_phase_figure(built):
    groups = built["groups"]
    ax = built["figures"]["restart_phases_seconds"].axes[0]
    stacks = _bars(ax)
    assert [b.get_label() for b in stacks] == ["launch", "imports", "dist init", "model build", "engine init",
                                               "checkpoint load", "first step"]
    assert all(len(b) == 2 for b in stacks)
    rs = load_summary(groups[1].runs[0].dir)["restart"]  # one restart: the stack is exactly its phases
    assert sum(b[1].get_height() for b in stacks) == pytest.approx(rs["launch_seconds"] + sum(rs["phases"].values()))
    assert len(_errorbars(ax)) == 1  # only dp2 has two restarts
    assert ax.get_ylabel() == "restart time (s)"


def test_prediction_figure_and_columns(built):
    """Each run's prediction (made before launch) against its measurement: one point per phase and run, and the
    predicted seconds and relative error in runs.csv."""
    ax = built["figures"]["prediction_seconds"].axes[0]
    points = {c.get_label(): c.get_offsets() for c in ax.collections if c.get_label() not in ("+-15%",)}
    runs = [run for g in built["groups"] for run in g.runs]
    total = [(p["measured"], p["predicted"]) for run in runs
             for p in [run.summary["prediction"]["phases"]["restart_total_with_launch_seconds"]]]
    plotted = sorted(map(tuple, points["restart total with launch"].tolist()))
    assert [x for pair in plotted for x in pair] == pytest.approx([x for pair in sorted(total) for x in pair])
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "measured (s)"
    row = next(r for r in built["rows"] if r["restart_record"] == "restart-01")
    summary = next(run.summary for run in runs if str(run.dir) == row["run_dir"])
    checked = summary["prediction"]["phases"]["save_durable_seconds"]
    assert row["predicted_save_durable_seconds"] == checked["predicted"]
    assert row["save_durable_prediction_error_ratio"] == checked["rel_error"]


def test_file_size_figure(built, study):
    ax = built["figures"]["file_size_bytes"].axes[0]
    assert ax.get_xscale() == "log" and "bytes" in ax.get_xlabel()
    dots = {c.get_label(): c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)}
    assert set(dots) == {"model states", "optimizer states"}
    assert len(dots["model states"]) == 2 and len(dots["optimizer states"]) == 3  # dp2: 1 + 2 files; dp1: 1 + 1
    inventory = json.loads((study[0] / "inventory.json").read_text())
    optim = {f["bytes"] for f in inventory["files"] if f["kind"] == "optimizer_states"}
    assert optim and optim <= set(dots["optimizer states"][:, 0])


def test_a_restart_row_is_in_its_own_state(tiny_dp2: Path, tmp_path: Path):
    """A restart-only re-run that failed verification leaves its run complete (its own restart verified), but its
    row says failed, with its reason (issue 68: the row said complete, and verified false far to the right)."""
    run = _copy_results(tiny_dp2, tmp_path / "run")

    def a_failed_rerun(s):
        again = {**s["restarts"][0], "record": "restart-02", "verified": False, "rerun": True,
                 "outcome": {"state": "failed", "reason": "restart did not restore the saved state: rank 1: x"}}
        s["restarts"].append(again)
    _edit_summary(run, a_failed_rerun)
    runs, skipped = ld.load([run])
    states = [(r["restart_record"], r["state"], r["state_reason"]) for r in report.build(runs, skipped, [])["rows"]]
    assert states == [("restart-01", "complete", None),
                      ("restart-02", "failed", "restart did not restore the saved state: rank 1: x")], states


def test_a_restart_stopped_before_its_first_step_has_no_total():
    """restart_total_seconds ends at the first step (checkpoint_loaded for a stack that trains none, once its rank
    finished): a restart interrupted after its load has none (issue 68: 15.6 s shown for one that never stepped)."""
    from restart_harness.results.summary import restart

    marks = [{"event": "mark", "name": n, "t": t} for n, t in (("process_start", 0.0), ("checkpoint_loaded", 15.6))]
    def total(*more):
        return restart({0: [*marks, *({"event": "mark", "name": n, "t": t} for n, t in more)]}, "restart-02", {},
                       None, None)["total_seconds"]
    assert total() is None
    assert total(("finished", 16.0)) == 15.6 and total(("first_step_done", 17.0)) == 17.0


def test_optional_fields_and_engine_none(tiny_dp2: Path, tmp_path: Path):
    """Fields other helpers add (baseline, efficiency, in-flight step time) are used when present; an engine=none
    run (no checkpoint, no restart) appears only where it has data."""
    fast = _copy_results(tiny_dp2, tmp_path / "ts" / "run")

    def add_baseline(s):
        s["spec"]["engine"] = "torchsnapshot"
        s["baseline"] = {"write_mib_s": 300.0, "read_mib_s": 1800.0, "method": "fio", "file_bytes": 2**30, "ranks": 2}
        s["checkpoint"]["efficiency"] = {"save": 0.5, "load": 0.25}
        s["training"]["step_seconds_median_in_flight"] = 0.5
    _edit_summary(fast, add_baseline)
    none = _copy_results(tiny_dp2, tmp_path / "none" / "run")

    def no_checkpoint(s):
        s["spec"]["engine"] = "none"
        s["checkpoint"].update(files=0, bytes=0, saves=[], by_kind={}, bytes_per_rank=None, throughput_mib_s=None)
        s["restart"], s["restarts"] = None, []
    _edit_summary(none, no_checkpoint)
    (none / "inventory.json").unlink()
    runs, skipped = ld.load([tmp_path])
    built = report.build(runs, skipped, [])
    row = next(r for r in built["rows"] if r["engine"] == "torchsnapshot")
    assert (row["baseline_write_mib_s"], row["efficiency_save_ratio"], row["step_in_flight_median_seconds"]) == (
        300.0, 0.5, 0.5)
    assert next(r for r in built["rows"] if r["engine"] == "none")["restart_record"] is None
    figs = built["figures"]
    ax = figs["throughput_mib_s"].axes[0]
    lines = {c.get_label() for c in ax.collections if isinstance(c, LineCollection)}
    assert {"storage baseline, write", "storage baseline, read"} <= lines
    assert [t.get_text().split("\n")[-1] for t in ax.get_xticklabels()] == ["torchsnapshot"]
    for name in ("checkpoint_bytes", "save_seconds", "restart_phases_seconds"):
        assert all(len(b) == 1 for b in _bars(figs[name].axes[0])), name
    step = figs["step_seconds"].axes[0]
    assert [b.get_label() for b in _bars(step)] == ["all steps", "steps with a save in flight"]
    assert len(_bars(step)[0]) == 2 and len(_bars(step)[1]) == 1


def test_bad_inputs_named_and_skipped(tiny_dp2: Path, tmp_path: Path):
    good = _copy_results(tiny_dp2, tmp_path / "results" / "good")
    corrupt = _copy_results(tiny_dp2, tmp_path / "results" / "corrupt")
    (corrupt / "summary.json").write_text('{"schema_version": 1, "run_id": ')
    running = _copy_results(tiny_dp2, tmp_path / "results" / "running")
    (running / "status.json").write_text(json.dumps({"state": "running", "reason": None, "time": 0}))
    alien = _copy_results(tiny_dp2, tmp_path / "results" / "alien")
    _edit_summary(alien, lambda s: s.pop("schema_version"))
    newer = _copy_results(tiny_dp2, tmp_path / "results" / "newer")
    _edit_summary(newer, lambda s: s.update(schema_version=2, something_new={"x": 1}))
    failed = _copy_results(tiny_dp2, tmp_path / "results" / "failed")
    _edit_summary(failed, lambda s: s.update(status={"state": "failed", "reason": "restart phase timed out"}))
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = report_cmd(str(tmp_path / "results"), str(empty), "-o", str(tmp_path / "out"), "include=failed",
                      module=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    expected = {corrupt: "corrupt summary.json (not JSON", running: "still in progress", empty: "no run directories",
                alien: "no integer schema_version", newer: "schema_version 2 is newer", failed: "is failed (restart"}
    for path, words in expected.items():
        assert len([line for line in lines if str(path) in line and words in line]) == 1, (path, proc.stderr)
    assert len(lines) == len(expected)
    with open(tmp_path / "out" / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(Path(r["run_dir"]).name for r in rows) == ["failed", "good", "newer"]
    assert "Skipped and incomplete" in (tmp_path / "out" / "report.md").read_text()
    # the failed run is in the table but not in the plots: one configuration of two complete runs
    assert len(report.build(*ld.load([tmp_path / "results"]), [])["groups"][0].runs) == 2
    assert str(good) not in proc.stderr
    # by default a report takes finished runs only: the failed run and a dry run are counted, not reported
    dry = _copy_results(tiny_dp2, tmp_path / "results" / "dry")
    (dry / "summary.json").unlink()
    (dry / "status.json").write_text(json.dumps({"state": "dry_run", "reason": "dry_run=true", "time": 0}))
    proc = report_cmd(str(tmp_path / "results"), "-o", str(tmp_path / "default"), "match=*[a-z]")
    assert proc.returncode == 0, proc.stderr
    assert ("left out: 1 dry, 1 failed or interrupted run(s) (include=failed,dry takes them in)"
            in proc.stderr.splitlines()), proc.stderr
    with open(tmp_path / "default" / "runs.csv") as f:
        assert sorted(Path(r["run_dir"]).name for r in csv.DictReader(f)) == ["good", "newer"]
    proc = report_cmd(str(tmp_path / "results"), "-o", str(tmp_path / "matched"), "match=go*")
    with open(tmp_path / "matched" / "runs.csv") as f:
        assert [Path(r["run_dir"]).name for r in csv.DictReader(f)] == ["good"]
    assert "not matching go*" in proc.stderr


def test_sweep_folder(tiny_dp2: Path, tmp_path: Path):
    """A sweep folder is searched like any other; its runs carry its name, its failed combinations are named."""
    sweep = tmp_path / "results" / "sweep-20261122-101010"
    _copy_results(tiny_dp2, sweep / "000-run")
    (sweep / "sweep.json").write_text(json.dumps({"runs": [
        {"index": 0, "combination": "engine=default", "run_dir": "000-run", "state": "complete", "reason": None},
        {"index": 1, "combination": "engine=nope2", "run_dir": None, "state": "failed", "reason": "launch failed"}]}))
    proc = report_cmd(str(tmp_path / "results"), "-o", str(tmp_path / "out"))
    assert proc.returncode == 0
    assert proc.stderr.strip().splitlines() == [
        "sweep sweep-20261122-101010: combination engine=nope2 failed: launch failed"]
    with open(tmp_path / "out" / "runs.csv") as f:
        (row,) = csv.DictReader(f)
    assert row["sweep"] == "sweep-20261122-101010"
    assert "engine=nope2" in (tmp_path / "out" / "report.md").read_text()


def test_default_folder_never_overwrites(tiny_dp2: Path, tmp_path: Path):
    first = report_cmd(str(tiny_dp2), cwd=tmp_path)
    second = report_cmd(str(tiny_dp2), cwd=tmp_path)
    assert first.returncode == second.returncode == 0
    a, b = (Path(p.stdout.strip().splitlines()[-1]) for p in (first, second))
    assert a != b and a.parent == b.parent == tmp_path / "reports" and a.name.startswith("report-")
    assert (a / "runs.csv").read_text() == (b / "runs.csv").read_text()
    taken = report_cmd(str(tiny_dp2), "-o", str(a))
    assert taken.returncode == 2 and len(taken.stderr.strip().splitlines()) == 1 and str(a) in taken.stderr


def test_nothing_readable_is_exit_2(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken" / "run"
    broken.mkdir(parents=True)
    (broken / "spec.json").write_text("{}")
    (broken / "summary.json").write_text("[1, 2")
    out = tmp_path / "out"
    proc = report_cmd(str(empty), str(tmp_path / "broken"), "-o", str(out))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no readable run")  # one line, saying what was found
    assert "no run directories" in lines[0] and "corrupt summary.json" in lines[0]
    assert not out.exists()
    missing = report_cmd(str(empty), str(tmp_path / "missing"), "-o", str(out))  # a typo: refused, not skipped
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert f"RUN_OR_SWEEP_DIR={tmp_path / 'missing'}: no such file or directory" in missing.stderr
    assert not out.exists()
    helped = report_cmd("--help", cwd=tmp_path)  # the report's keys, as ./submit-job.sh report --help has them
    assert helped.returncode == 0 and "out_dir=path" in helped.stdout and not (tmp_path / "reports").exists()
    usage = report_cmd(cwd=tmp_path)
    assert usage.returncode == 2 and len(usage.stderr.strip().splitlines()) == 1 and not (tmp_path / "reports").exists()


def test_analysis_needs_only_matplotlib(tmp_path):
    """The analysis must run where only matplotlib is installed: of the harness it imports the schema, the status
    reader, the placement helpers (the one formatter of rank lists, over the event reader), the summary's typed views
    (results/views.py, as the terminal reads it), the atomic and the exclusive file writers, the report command's
    words (the key declarations and their one parser) and the goodput model: standard library only, never the runner,
    torch, DeepSpeed or YAML."""
    code = ("import sys, analysis.report, analysis.load, analysis.table, analysis.plots, analysis.render; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('restart_harness', 'engines', 'torch', "
            "'deepspeed', 'yaml', 'numpy') and m != 'numpy' and not m.startswith('numpy.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert proc.stdout.strip() == str(sorted([
        "restart_harness", "restart_harness.results", "restart_harness.results.events", "restart_harness.results.goodput",
        "restart_harness.results.placement", "restart_harness.results.views", "restart_harness.schema", "restart_harness.rundir",
        "restart_harness.rundir.status", "restart_harness.files", "restart_harness.files.atomic", "restart_harness.files.exclusive",
        "restart_harness.command", "restart_harness.command.report", "restart_harness.command.tokens",
        "restart_harness.errors", "restart_harness.spec", "restart_harness.spec.keys",
        "restart_harness.files.fsfacts"]))


def test_notebook_runs_top_to_bottom(more_runs: Path, monkeypatch):
    import nbclient
    import nbformat

    nb = nbformat.read(REPO / "analysis" / "restart_study.ipynb", as_version=4)
    monkeypatch.setenv("RH_RESULTS", str(more_runs))  # the kernel inherits this process's environment
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "analysis")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("2 runs read from" in o.get("text", "") for o in outputs)
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) == len(FIGURES)


def test_html_opens_in_headless_chromium(made_report, tmp_path: Path):
    require_tool("chromium", package="chromium")
    chromium = shutil.which("chromium")
    _, out = made_report
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                    "--window-size=1280,2400", f"--screenshot={shot}", (out / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280)
    # a page that rendered tables and images has many distinct colours, a blank or error page very few
    flat = (pixels[:, :, :3] * 255).astype("uint8").reshape(-1, 3)
    assert len({tuple(p) for p in flat[::97]}) > 50


def test_many_configurations_and_models_each_get_a_readable_figure(more_runs: Path, tmp_path: Path):
    """Sizes spanning decades get a log axis, models of their own figures, and every configuration its restart
    timeline (six to a page)."""
    n = 0
    for engine in range(7):
        for run in sorted(p for p in more_runs.iterdir() if p.is_dir()):
            copy = _copy_results(run, tmp_path / "results" / f"r{n:02d}")
            n += 1
            _edit_summary(copy, lambda s, e=engine: s["spec"].update(engine=f"e{e}"))
            if engine == 0:  # a model 1,000 times larger
                _edit_summary(copy, lambda s: (s["spec"].update(model="big"),
                                               s["checkpoint"].update(bytes=s["checkpoint"]["bytes"] * 1000)))
    built = report.build(*ld.load([tmp_path / "results"]), [])
    figures = {k for k, v in built["figures"].items() if v is not None}
    assert {"checkpoint_bytes_tiny", "checkpoint_bytes_big", "checkpoint_files_tiny"} <= figures, figures
    configurations = len(built["groups"])
    pages = -(-configurations // panels.MAX_TIMELINES)
    assert pages > 1 and {"restart_timeline_seconds", f"restart_timeline_seconds_{pages}"} <= figures
    shown = sum(len(built["figures"][k].axes) for k in figures if k.startswith("restart_timeline_seconds"))
    assert shown == configurations
    one_axis = plots.checkpoint_bytes(built["groups"]).axes[0]  # both models on one axis: log scale
    assert one_axis.get_yscale() == "log" and "log scale" in one_axis.get_ylabel()


def test_long_labels_draw_without_warnings_and_every_word_stays_inside(more_runs: Path, tmp_path: Path):
    """Configurations that differ in many keys (labels longer than a figure is wide) and a sampled restart
    (tests/data/attribution/: a real lazy restart's attribution): matplotlib warns of nothing while the report
    draws (a warning is an error here: constrained layout gave up on such labels), every subplot title ends inside
    its axes (one ran under the legend), every legend lies inside its figure (the last entries were cut off), and the
    largest cause's name stays on its bar (white beyond it was cut off)."""
    attribution = json.loads((REPO / "tests" / "data" / "attribution" / "lazy-restart-attribution.json").read_text())
    attribution["phases"]["dist_init"]["causes"][0]["cause"] = "a cause whose name is long enough to run past its bar"
    for n in range(3):
        for run in sorted(p for p in more_runs.iterdir() if p.is_dir()):
            copy = _copy_results(run, tmp_path / "results" / f"{run.name}-{n}")
            _edit_summary(copy, lambda s, n=n: (
                s["spec"].update(seq_len=64 * (n + 1), grad_accum=n + 1, iters=4 + n, after=2 + n, micro_batch=n + 1,
                                 engine_options={"writers": 4 + n, "readers": 4 + n, "write_chunk_mib": 8 + n,
                                                 "staging_mib": n, "direct_io": n % 2 == 0}),
                s["restarts"][0].update(attribution=attribution)))
    out = tmp_path / "report"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built = report.build(*ld.load([tmp_path / "results"]), [])
        report.write(report.report_dir(out), built, "report")
    figures = {k: v for k, v in built["figures"].items() if v is not None}
    assert {"restart_timeline_seconds", "restart_causes_seconds", "file_size_bytes"} <= set(figures), figures.keys()
    for name, fig in figures.items():
        fig.draw_without_rendering()
        page = fig.bbox
        for ax in fig.axes:
            box = ax.get_window_extent()
            for title in (ax.title, ax._left_title):
                if title.get_text():
                    assert title.get_window_extent().x1 <= box.x1 + 1, (name, title.get_text())
            if name.startswith("restart_causes"):
                for text in ax.texts:
                    y = round(ax.transData.inverted().transform(text.get_window_extent().p0)[1])
                    bar_end = ax.transData.transform((max(b.get_x() + b.get_width() for c in _bars(ax) for b in c
                                                          if abs(b.get_y() + b.get_height() / 2 - y) < 0.01), 0))[0]
                    assert text.get_window_extent().x1 <= bar_end + 1, (name, text.get_text())
        for lg in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]:
            inside = lg.get_window_extent()
            assert inside.y0 >= page.y0 - 1 and inside.y1 <= page.y1 + 1 and inside.x1 <= page.x1 + 1, name
    assert (out / "restart_causes_seconds.png").read_bytes().startswith(b"\x89PNG")
