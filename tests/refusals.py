"""The one runner of the refusal tables (tests/test_bad_input.py, tests/test_refusals_*.py): a row's words typed
through the command line's own entry (restart_harness.cli.main, in this process) or through ./submit-job.sh, then
held to the refusal rule: exit code 2, one line on stderr naming the value, no traceback, nothing created or changed.

In a row's words `{tmp}` is the row's folder, `{long}` a folder name of 256 bytes (one over NAME_MAX) and `{run}` a
finished run of tests/data (never changed). A `named` ending in `$` must end the line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LONG = "a" * 256
RUN = REPO / "tests" / "data" / "results" / "one" / "tiny-tp1-pp1-dp2-default-20261124-114506"
# commands that take no results_dir= (a row of theirs is typed as it is)
NO_RESULTS_DIR = ("plan", "predict", "calibrate", "restart", "baseline", "report", "matrix", "clean", "help")


def fill(text: str, tmp_path: Path) -> str:
    return text.replace("{tmp}", str(tmp_path)).replace("{long}", LONG).replace("{run}", str(RUN))


def made(tmp_path: Path) -> Path:
    """A row's fresh folder: a loop of links, a file, an empty folder and a Python without torch (this one, isolated
    from its site-packages)."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    return tmp_path


def tree(*roots: Path) -> dict:
    """Every path below the roots: a file's bytes and modification time, a link's target, or a folder."""
    def state(p: Path):
        if p.is_symlink():
            return f"-> {p.readlink()}"
        return (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else "dir"
    return {str(p): state(p) for root in roots for p in sorted(root.rglob("*"))}


def typed(tokens: list[str], tmp_path: Path, monkeypatch, capsys, results_dir: bool = True) -> tuple[int, str]:
    """(exit code, stderr) of the words typed in tmp_path; results go under it unless the command takes none, the
    row names its own, or it asks for help."""
    from restart_harness.cli import main

    monkeypatch.chdir(tmp_path)
    tokens = [fill(t, tmp_path) for t in tokens]
    as_is = (not results_dir or not tokens or tokens[0] in NO_RESULTS_DIR or "--help" in tokens or "-h" in tokens
             or any(t.startswith("results_dir=") for t in tokens))
    code = main(tokens if as_is else [*tokens, f"results_dir={tmp_path / 'results'}"])
    return code, capsys.readouterr().err


def submitted(tokens: list[str], tmp_path: Path, env: dict, drop: tuple[str, ...] = ()) -> tuple[int, str]:
    """(exit code, stderr) of ./submit-job.sh with these words and environment variables (less those in drop)."""
    base = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run([str(REPO / "submit-job.sh"), *(fill(t, tmp_path) for t in tokens)], cwd=tmp_path,
                          check=False, capture_output=True, text=True, timeout=120,
                          env={**base, **{k: fill(v, tmp_path) for k, v in env.items()}})
    return proc.returncode, proc.stderr


def refused(code: int, err: str, named: str, before: dict, after: dict) -> None:
    """The refusal rule, held: exit code 2, one line naming the value, no traceback, nothing created or changed."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert (lines[0].endswith(named[:-1]) if named.endswith("$") else named in lines[0]), err
    assert len(lines[0]) < 1500, err  # a value is never echoed beyond its bound
    assert after == before  # nothing created or changed, results included
    assert not (REPO / "INJECTED").exists()
