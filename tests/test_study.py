"""`./submit-job.sh study` (restart_harness/campaigns/study/, analysis/study.py): the reference study's table.

The planner's side (the strategies a shape allows, the reference study's vocabulary, its 3B log) is checked without
launching anything; a planned-only study writes the whole table in seconds; one reduced study (tiny, two ranks, two
strategies, an engine that runs here and one that does not) runs end to end, is interrupted during its second run
and resumed."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from restart_harness import resolve
from restart_harness.campaigns.study import cells as study_cells
from restart_harness.campaigns.study import sizing
from restart_harness.command.parse import parse_study
from restart_harness.schema import SOURCES, STUDY
from restart_harness.spec.model_shape import load_model


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "study", *args], check=False,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_the_reference_3b_tp4_cell_is_the_reference_study_log():
    """The reference study's 3B at tp=4 on one 4-GPU node: its log says 'Checkpoint Save GB: 43.83' and names 8
    files; the planner, with the study's vocabulary (GPT-2's padded to 50,688 at tp=4), gives the same total to the
    log's precision and the same 8 names."""
    cells, _ = study_cells.build_cells(parse_study(["models=3B", "gpus=8"]))
    ref = [c for c in cells if c.reference and c.engine == "default"]
    assert [(c.gpus, c.layout.label) for c in ref] == [(4, "tp4-pp1-dp1")]
    assert ref[0].spec.shape.vocab_size == 50688
    plan = study_cells.plan_record(resolve.plugins(ref[0].spec))
    assert round(plan["total_bytes"] / 1e9, 2) == study_cells.REFERENCES[0].checkpoint_gb == 43.83
    assert sorted(f[0] for f in plan["files"]) == sorted(study_cells.REFERENCES[0].files)
    # the log's figure is Megatron's 14 bytes x parameters (norms counted on every TP rank): the tensors exactly
    assert plan["tensor_bytes"] == 14 * 4 * 782_674_944 + 4 * 4  # and Adam's step counter per optimizer file


def test_the_reference_vocabulary_is_padded_as_megatron_pads_it():
    shape = load_model("3B")[0]
    assert [study_cells.vocab_size(shape, tp, "reference") for tp in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]
    assert study_cells.vocab_size(shape, 4, "preset") == 128256


def test_auto_strategies_follow_the_shape_and_the_gpus_memory():
    """Pure data, tensor and pipeline parallel and two mixes where the shape allows them (3B's 28 layers take no
    8-stage pipeline); 70B fits 80 GiB GPUs only with tp x pp = 16, and gets four strategies there, none on 8 GPUs."""
    cells, notes = study_cells.build_cells(parse_study(["models=3B,13B,70B", "gpus=8,16", "engines=default",
                                                  "reference=false"]))
    labels = {(m, g): [c.layout.label for c in cells if (c.model, c.gpus) == (m, g)] for m in ("3B", "13B", "70B")
              for g in (8, 16)}
    assert labels[("3B", 8)] == ["tp1-pp1-dp8", "tp8-pp1-dp1", "tp1-pp4-dp2", "tp4-pp2-dp1", "tp2-pp2-dp2"]
    assert labels[("13B", 8)][:3] == ["tp1-pp1-dp8", "tp8-pp1-dp1", "tp1-pp8-dp1"]
    assert labels[("70B", 8)] == [] and any(n.startswith("70B on 8 GPUs") for n in notes)
    assert len(labels[("70B", 16)]) >= study_cells.MIN_STRATEGIES
    assert all(c.tp * c.pp == 16 for c in (x.layout for x in cells if x.model == "70B"))
    assert all(c.gpu_state_bytes <= 80 * 2**30 for c in cells)


def _rows(folder: Path) -> list[dict]:
    with open(folder / "study.csv") as f:
        return list(csv.DictReader(f))


def _figures_marked(rows: list[dict]) -> None:
    """Every figure of every row names its source, or has none and says why."""
    for r in rows:
        for name in ("files", "checkpoint_bytes", "file_bytes_median", "files_per_node_max", "save_blocking_seconds",
                     "save_durable_seconds", "restart_checkpoint_load_seconds", "restart_total_with_launch_seconds"):
            if r[name]:
                assert r[f"{name}_source"] in SOURCES, (r["id"], name)
            else:
                assert r.get(f"{name}_why"), (r["id"], name)


def test_a_cell_predicted_on_the_calibrations_device_has_its_best_checkpoint_interval(tmp_path):
    """Where the save, the restart and the step are predicted (target_device=cpu, which the calibration has runs on),
    each cell has its best checkpoint interval and the goodput there (docs/goodput.md)."""
    proc = cli("models=tiny", "gpus=2", "vocab=preset", "reference=false", "fidelity=predicted", "mtbf_per_gpu=1h",
               "target_device=cpu", "write_gbps=1", "read_gbps=2", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    ran = [r for r in _rows(Path(proc.stdout.strip().splitlines()[-1])) if r["best_interval_seconds"]]
    assert {r["engine"] for r in ran} >= {"default", "torchsnapshot"}
    assert all(float(r["best_interval_seconds"]) > 0 and 0 < float(r["goodput_at_best"]) < 1 for r in ran)


def test_a_planned_only_study_writes_the_table(tmp_path):
    """fidelity=predicted: nothing launched; the table, its files list and figures written; DataStates' cells say
    why they are not run here."""
    proc = cli("models=tiny", "gpus=2", "vocab=preset", "reference=false", "fidelity=predicted", "mtbf_per_gpu=1h",
               "write_gbps=1", "read_gbps=2", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    folder = Path(proc.stdout.strip().splitlines()[-1])
    rows = _rows(folder)
    # each cell's best checkpoint interval at its GPUs, at the failure rate given (docs/goodput.md)
    assert all(float(r["job_mtbf_seconds"]) == pytest.approx(3_600 / int(r["gpus"]), rel=1e-3) for r in rows)
    assert "best checkpoint interval s (goodput)" in (folder / "study.md").read_text()
    assert len(rows) == 3 * 3 and {r["engine"] for r in rows} == {"default", "torchsnapshot", "datastates"}
    assert all(r["how"].startswith("planned + predicted") and not r["run_dir"] for r in rows)
    assert all("DataStates-LLM needs a CUDA GPU" in r["how"] for r in rows if r["engine"] == "datastates")
    _figures_marked(rows)
    assert all(r["files_source"] == "planned" for r in rows)
    # predicted for the study's GPUs (target_device=cuda): no start-up from this machine's CPU ranks relabelled
    assert all("the calibration has no run on cuda" in r["restart_total_with_launch_seconds_why"] for r in rows)
    assert all(r["save_durable_seconds_borrowed"].startswith("deepspeed/default's rates") for r in rows
               if r["engine"] == "datastates")
    assert "[study] predicted for: cuda, 8 GPUs (ranks) per node" in proc.stderr
    for name in ("study.md", "study.html", "study-files.csv", "study_files.png", "study_file_sizes_bytes.png"):
        assert (folder / name).is_file(), name
    assert not [p for p in folder.iterdir() if p.is_dir()]  # no run folder


@pytest.mark.slow
def test_a_reduced_study_runs_is_interrupted_and_resumes(tmp_path):
    """tiny on 2 ranks, data and tensor parallel, engines default (runs here) and datastates (CUDA only): every
    default cell emulated at real size. Interrupted (SIGINT) during its second run, the study ends with the table of
    what it has and says how to continue; resume= runs the interrupted cell again, and keeps the finished one."""
    args = ["models=tiny", "gpus=2", "strategies=dp,tp2", "engines=default,datastates", "vocab=preset",
            "reference=false", "fidelity=emulated", "time_limit=20", "launcher=prefork", "env_cache=keep",
            f"results_dir={tmp_path}"]
    proc = subprocess.Popen([sys.executable, str(REPO / "config-n-run.py"), "study", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        folder = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            made = list(tmp_path.glob(f"study-*/{STUDY}"))
            if made:
                folder = made[0].parent
                cells = json.loads(made[0].read_text())["cells"]
                if [c["state"] for c in cells if c["engine"] == "default"] == ["complete", "running"]:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the study's second run never started")
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert f"resume={folder}" in err
    first = json.loads((folder / STUDY).read_text())
    assert first["state"] == "interrupted"
    assert [c["state"] for c in first["cells"] if c["engine"] == "default"] == ["complete", "interrupted"]
    assert (folder / "study.csv").is_file()  # the table of what it has

    resumed = cli(f"resume={folder}", timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip().splitlines()[-1] == str(folder)
    done = json.loads((folder / STUDY).read_text())
    assert done["state"] == "complete"
    by_id = {c["id"]: c for c in done["cells"]}
    kept, again = by_id["tiny-2gpu-tp1-pp1-dp2-default"], by_id["tiny-2gpu-tp2-pp1-dp1-default"]
    assert kept["attempts"] == next(c for c in first["cells"] if c["id"] == kept["id"])["attempts"]  # not run again
    assert again["state"] == "complete" and len(again["attempts"]) == 2
    rows = {r["id"]: r for r in _rows(folder)}
    _figures_marked(rows.values())
    for cell in (kept, again):
        r = rows[cell["id"]]
        assert r["how"] == "emulated at real size" and r["files_source"] == "emulated"
        assert r["save_durable_seconds_source"] == "emulated" and r["save_durable_seconds_predicted"]
        assert r["check_files"].startswith("equal")
        run_dir = Path(cell["run_dir"])
        assert json.loads((run_dir / "status.json").read_text()).get("checkpoint_deleted") is True
        assert not any((run_dir / "checkpoint").rglob("*.pt"))  # keep=false: the records stay, the checkpoint goes
    for r in rows.values():
        if r["engine"] == "datastates":
            assert r["how"].startswith("planned + predicted: engine=datastates cannot run on device=cpu")
            assert r["save_durable_seconds_source"] == "predicted" and r["device"] == "cuda"
    # the check's table ends with each figure's median absolute error over the runs compared (none where the machine's
    # load was not the calibration's)
    errors = [abs(float(r["check_save_durable_seconds_error"])) for r in rows.values()
              if r.get("check_save_durable_seconds_error")]
    medians = next(line for line in (folder / "study.md").read_text().splitlines()
                   if line.startswith("| median absolute error"))
    assert medians.split("|")[3].strip() == (f"{statistics.median(errors):.0%} over {len(errors)}" if errors else "-")
    # the interrupted attempt's checkpoint went too, its records stay
    interrupted = Path(again["attempts"][0])
    assert (interrupted / "status.json").is_file() and not any(interrupted.rglob("*.pt"))
    report = subprocess.run([str(REPO / "submit-job.sh"), "report", str(folder), f"out_dir={tmp_path / 'report'}"],
                            check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "tiny: " in (tmp_path / "report" / "report.md").read_text()


def _cell(index: int, model: str, engine: str = "default", reference: bool = False) -> study_cells.Cell:
    layout = study_cells.Layout(1, 1, 8, "data")
    ref = study_cells.REFERENCES[0] if reference else None
    return study_cells.Cell(index, model, 8, 1, 8, layout, engine, [], None, ref)


def test_each_model_and_engine_gets_a_run_before_any_gets_a_faithful_one(monkeypatch):
    """The sizing, on made-up estimates: the reference layout first, then one cell per model and engine; each takes
    its cheapest option plus an equal share of what the others' cheapest leave, so a short time limit gives every
    one a run rather than the first a faithful one; what does not fit is predicted, saying so."""
    seconds = {("shrunk", 64): 60, ("shrunk", 32): 70, ("shrunk", 16): 90, ("shrunk", 8): 150, ("shrunk", 4): 250,
               ("shrunk", 2): 400, ("emulated", 1): 1000}

    def evaluate(cell, mode, shrink, emulate, sized):
        if mode == "real":
            return study_cells.Option(mode, reason="4 ranks need ~124.0 GiB on this node")
        return study_cells.Option(mode, shrink, emulate, seconds[(mode, shrink)], 1 << 20)

    monkeypatch.setattr(sizing, "evaluate", evaluate)
    sized = sizing.Sizing(disk=1 << 40, store={}, cpus=2, factor=1.0, fidelity="auto", run_words=[], local=True)
    cells = [_cell(1, "3B"), _cell(2, "3B", "torchsnapshot"), _cell(3, "13B"), _cell(4, "13B"), _cell(5, "3B"),
             _cell(6, "3B", reference=True)]
    coverage, rest = sizing.priority(cells)
    assert [c.index for c in coverage] == [6, 2, 3] and [c.index for c in rest] == [1, 4, 5]
    left, chosen = 300.0, []
    for i, cell in enumerate(coverage):
        option = sizing.next_option(cell, coverage[i + 1:], left, sized)
        chosen.append((option.mode, option.shrink))
        left -= option.seconds or 0
    assert chosen == [("shrunk", 16)] * 3  # 60 s each at least, the 120 s they leave shared
    first = sizing.next_option(coverage[0], coverage[1:], 100.0, sized)
    assert (first.mode, first.shrink) == ("shrunk", 16) and "shrunk K=8 (emulated): ~2.5 min, more than" in first.reason
    late = sizing.next_option(coverage[1], coverage[2:], 10.0, sized)
    assert late.mode == "predicted" and late.time_bound and late.why == "no time left for a run"
    cheap = sizing.next_option(rest[0], None, 1000.0, sized)  # after the coverage: more cells, not more fidelity
    assert (cheap.mode, cheap.shrink) == ("shrunk", 64)


def test_a_cell_is_sized_to_the_memory_available_when_it_starts(monkeypatch):
    """Issue 66: 13B dp8 torchsnapshot at K=4 was OOM-killed here (8 emulated ranks at ~3 GiB each: the process, the
    largest file's tensors, torchsnapshot's staging). Sized again as it starts, against the memory available then:
    with 20 GiB it shrinks further, saying why not K=4; with 2 GiB it is planned and predicted only, saying why."""
    import math

    from restart_harness import machine
    from restart_harness.campaigns.study import campaign

    request = parse_study(["models=13B", "gpus=8", "strategies=tp1-pp1-dp8", "engines=torchsnapshot",
                           "reference=false"])
    cells, _ = study_cells.build_cells(request)
    cell = cells[0]
    sized = sizing.Sizing(disk=1 << 42, store=sizing.storage(request, cells, measure=False), cpus=2, factor=1.0,
                          fidelity="auto", run_words=[], local=True)

    def k4_reason(option: study_cells.Option) -> str:
        return next((r for r in option.reason.split(sizing.REASONS) if r.startswith("shrunk K=4 (emulated)")), "")

    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 200 << 30)
    roomy = campaign.next_for(cell, [], math.inf, sized)  # a coverage cell: the most faithful option that fits
    assert roomy.mode == "shrunk" and "ranks need" not in k4_reason(roomy)
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 20 << 30)
    tight = campaign.next_for(cell, [], math.inf, sized)  # the same sizing, at the cell's start
    assert tight.mode == "shrunk" and tight.shrink >= 8 and tight.shrink > roomy.shrink
    assert "8 ranks need ~" in k4_reason(tight) and "engine=torchsnapshot's" in k4_reason(tight)
    assert "but 20.00 GiB is available" in k4_reason(tight)
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 2 << 30)
    none = campaign.next_for(cell, [], math.inf, sized)
    assert none.mode == "predicted" and none.why == "no option fits the memory available now"
    assert "but 2.00 GiB is available" in none.reason


def test_the_checks_table_states_each_figures_median_absolute_error():
    """The check the study runs on itself ends with one line: per figure, the median of the runs' absolute errors and
    how many runs were compared (a run not compared is left out, not counted as exact)."""
    from analysis.study import checks_table
    from analysis.study_rows import CHECKED

    errors = [(-0.4, 0.1, None), (0.2, None, None), (0.3, -0.25, None)]
    table = [{"id": f"cell{i}", "how": "shrunk", "check_mode": "shrunk", "check_files": "equal",
              **{f"check_{name}_{k}": v for name, e in zip(CHECKED, row)
                 for k, v in (("measured", 1.0), ("predicted", None if e is None else 1.0 + e), ("error", e))}}
             for i, row in enumerate(errors)]
    assert checks_table(table).rows[-1] == ["median absolute error", "3 runs", "30% over 3", "18% over 2", "-", "", ""]
