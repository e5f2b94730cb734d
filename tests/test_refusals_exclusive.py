"""Nothing the harness makes replaces or shares what is there (issue 68: files/exclusive.py is the one rule).

CASES: refusals, as tests/test_bad_input.py's rows are: exit code 2, one line naming the value, no traceback, and
nothing created or changed (every file's bytes compared). `{tmp}` is the row's folder, which holds a finished run
(runs/, a copy of tests/data/results/one), a file, a link to it, a dangling link, a report folder with its report,
and a study folder whose lock a live process holds. Then the claims themselves: two runs started in the same second
with one ckpt_dir, and two resumes of one study."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from refusals import REPO, fill, refused, submitted, tree, typed

RUN = "tiny-tp1-pp1-dp2-default-20261124-114506"

CASES = {
    "calibrate over a run's summary": (["calibrate", "runs={tmp}/runs", f"out={{tmp}}/runs/{RUN}/summary.json"],
                                       "summary.json: already exists"),
    "calibrate over a file": (["calibrate", "runs={tmp}/runs", "out={tmp}/afile"], "out={tmp}/afile: already exists"),
    "calibrate over a link to a file": (["calibrate", "runs={tmp}/runs", "out={tmp}/alink"],
                                        "out={tmp}/alink: already exists"),
    "calibrate over a dangling link": (["calibrate", "runs={tmp}/runs", "out={tmp}/dangling"],
                                       "out={tmp}/dangling: already exists"),
    "calibrate over its own calibration": (["calibrate", "runs={tmp}/runs", "out={tmp}/calibration.json"],
                                           "out={tmp}/calibration.json: already exists"),
    "a report over a file": (["report", "{tmp}/runs", "out_dir={tmp}/afile"], "out_dir={tmp}/afile"),
    "a report into an earlier report": (["report", "{tmp}/runs", "out_dir={tmp}/report"], "out_dir={tmp}/report"),
    "a study resumed while another resumes it": (["study", "resume={tmp}/study"], "is in use by pid"),
    "a study resumed while it runs, with a time limit": (["study", "resume={tmp}/study", "time_limit=5"],
                                                         "is in use by pid"),
}

# environment variables of the one rule's neighbours (through the command line's own entry, in this process)
ENV_CASES = {
    "a baseline cache of an unknown scope": ({"RH_BASELINE_CACHE": "everyone"}, ["baseline", "dir={tmp}"],
                                             "RH_BASELINE_CACHE=everyone: accepted: checkout, shared"),
    "a baseline cache scope for a run": ({"RH_BASELINE_CACHE": "1"}, ["tiny", "results_dir={tmp}/results"],
                                         "RH_BASELINE_CACHE=1: accepted: checkout, shared"),
}

HOLD = """import sys, time
from restart_harness.files import exclusive
assert exclusive.hold(sys.argv[1]) is None
print("held", flush=True)
time.sleep(600)
"""


def holder(folder: Path) -> subprocess.Popen:
    """A live process that holds folder's lock (as a running study does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def a_study(folder: Path) -> Path:
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({"command": ["study", "models=tiny", "gpus=2",
                                                               "fidelity=predicted"], "cells": []}))
    return folder


def made(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "tests" / "data" / "results" / "one", tmp_path / "runs")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "alink").symlink_to(tmp_path / "afile")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    (tmp_path / "calibration.json").write_text("{}")
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.md").write_text("an earlier report")
    a_study(tmp_path / "study")
    return tmp_path


@pytest.mark.parametrize("name", list(CASES))
def test_refused_exclusive(name, tmp_path, monkeypatch, capsys):
    tokens, named = CASES[name]
    made(tmp_path)
    held = holder(tmp_path / "study")
    try:
        before = tree(tmp_path)
        code, err = typed(tokens, tmp_path, monkeypatch, capsys, results_dir=False)
    finally:
        held.kill()
        held.wait()
    refused(code, err, fill(named, tmp_path), before, tree(tmp_path))


def test_two_runs_in_one_second_with_one_ckpt_dir_never_share_a_checkpoint_folder(tmp_path, monkeypatch):
    """Different results_dir, the same ckpt_dir, the same second (so the same run folder name): each run claims a
    checkpoint folder of its own."""
    from restart_harness.cli import main
    from restart_harness.rundir import create

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 27, 12, 0, 0)

    monkeypatch.setattr(create, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "ckpt"
    for results in ("a", "b"):
        assert main(["tiny", "dry_run=true", f"results_dir={tmp_path / results}", f"ckpt_dir={ckpt}"]) == 0
    (a,), (b,) = (list((tmp_path / r).iterdir()) for r in ("a", "b"))
    assert a.name == b.name  # one name: only the claim keeps them apart
    roots = [json.loads((d / "spec.json").read_text())["checkpoint_root"] for d in (a, b)]
    assert roots[0] != roots[1] and sorted(roots) == sorted(str(p) for p in ckpt.iterdir()), roots


def test_two_resumes_of_one_study_neither_runs_nor_loses(tmp_path, capsys):
    """While one process holds a study (running or resuming it), a second resume is refused naming it, and the study
    is left as it was; once the holder ends (killed: the kernel frees its lock), the study can be resumed."""
    from restart_harness.cli import main
    from restart_harness.files import exclusive

    study = a_study(tmp_path / "study")
    held = holder(study)
    before = tree(tmp_path)
    assert main(["study", f"resume={study}"]) == 2
    line = capsys.readouterr().err.strip()
    assert f"pid {held.pid} on " in line and "started " in line, line
    assert tree(tmp_path) == before
    held.kill()
    held.wait()
    assert exclusive.hold(study) is None  # freed with its holder
    exclusive.release(study)


def test_a_file_that_appeared_meanwhile_is_kept(tmp_path, monkeypatch, capsys):
    """The final write of an output file is exclusive: a calibration written by another process after the check (here:
    while this one fitted) is never replaced; one line, exit 1."""
    from restart_harness import cli
    from restart_harness.predict import fit

    out = tmp_path / "calibration.json"
    fitted = fit.calibrate

    def another_writes_meanwhile(runs, *args):
        out.write_text("another's")
        return fitted(runs, *args)
    monkeypatch.setattr(fit, "calibrate", another_writes_meanwhile)
    shutil.copytree(REPO / "tests" / "data" / "results" / "one", tmp_path / "runs")
    assert cli.main(["calibrate", f"runs={tmp_path / 'runs'}", f"out={out}"]) == 1
    assert f"out={out}: written by another process meanwhile" in capsys.readouterr().err
    assert out.read_text() == "another's" and sorted(p.name for p in tmp_path.iterdir()) == ["calibration.json", "runs"]


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_refused_environment(name, tmp_path, monkeypatch, capsys):
    env, tokens, named = ENV_CASES[name]
    before = tree(made(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, err = typed(tokens, tmp_path, monkeypatch, capsys, results_dir=False)
    refused(code, err, named, before, tree(tmp_path))


# the launcher script's environment (scripts/env.sh), through ./submit-job.sh: RH_VENV_DIR names another checkout's
SCRIPT_CASES = {
    "an environment of another checkout": ({"RH_VENV_DIR": "{tmp}/env"},
                                           "RH_VENV_DIR={tmp}/env: the environment of the checkout /elsewhere/checkout"),
    "an environment of another checkout, re-pointing refused": ({"RH_VENV_DIR": "{tmp}/env", "RH_VENV_REPOINT": "0"},
                                                                "accepted: RH_VENV_REPOINT=1 to re-point it"),
    "a re-point switch that is a banana": ({"RH_VENV_DIR": "{tmp}/env", "RH_VENV_REPOINT": "banana"},
                                           "RH_VENV_REPOINT=banana: accepted: 1"),
}


@pytest.mark.parametrize("name", list(SCRIPT_CASES))
def test_refused_by_the_launcher_script(name, tmp_path):
    env, named = SCRIPT_CASES[name]
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / ".project-root").write_text("/elsewhere/checkout\n")
    before = tree(tmp_path)
    code, err = submitted(["tiny", "dry_run=true"], tmp_path, env, drop=("RH_PYTHON", "RH_VENV", "RH_VENV_REPOINT"))
    refused(code, err, fill(named, tmp_path), before, tree(tmp_path))
