"""DeepSpeed 0.19.8's DecoupledCheckpointEngine (engine=decoupled) writes from a process it spawns per node
(init_decoupled_checkpoint). When that process dies - its FastCheckpointEngine could not build or load the async_io
op (a node without libaio: one H200, 2026-11-26), it could not pin its buffer, it was killed - the rank is told only
"Checkpoint process died unexpectedly" or "Cannot commit checkpoint: checkpoint process is not running", and a save
into the dead process returns as if it had written. The cause is in the dead process's own output, somewhere in the
launch log.

install() (engine=decoupled's prepare(), in each rank before DeepSpeed builds the engine) makes the writer process run
writer(): DeepSpeed's own init_decoupled_checkpoint, with its exception's traceback (and, through faulthandler, a
fatal signal's) written to a file named by the process's id; DeepSpeed's commit then fails with that cause and the
process's exit code (`died(engine)` gives the same line to the harness's save). Nothing else changes: the same
process, the same queue, the same writer.

Addresses deepspeed==0.19.8 (runtime/checkpoint_engine/decoupled_checkpoint_engine.py). Remove when
tests/test_engines.py::test_deepspeed_decoupled_cause_shim_still_needed fails (DeepSpeed's error names the writer's).
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import os
import shutil
import signal
import tempfile
import traceback
from pathlib import Path

ADDRESSES = "deepspeed==0.19.8"
CAUSE_DIR = "RH_DECOUPLED_WRITER_CAUSES"  # inherited by the spawned writer process


def _cause_file(pid: int) -> Path:
    return Path(os.environ[CAUSE_DIR]) / f"writer-{pid}.txt"


def writer(*args) -> None:
    """The writer process's function: DeepSpeed's, its failure kept for the rank (runs in the spawned process)."""
    from deepspeed.runtime.checkpoint_engine import decoupled_checkpoint_engine as dce

    with open(_cause_file(os.getpid()), "w") as out:
        faulthandler.enable(file=out)  # a fatal signal (SIGSEGV, SIGABRT) leaves its Python stack here
        try:
            dce.init_decoupled_checkpoint(*args)
        except BaseException:
            out.write(traceback.format_exc())
            out.flush()
            raise


def died(engine) -> str | None:
    """One line on why `engine`'s writer process is gone (its exception's last line or its fatal signal, and its
    exit code), or None while it lives (or where the rank has none)."""
    process = getattr(engine, "ckpt_process", None)
    if process is None or process.is_alive():
        return None
    process.join(timeout=5)
    code = process.exitcode
    how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
           else f"exit code {code}")
    try:
        text = _cause_file(process.pid).read_text(errors="replace")
    except (KeyError, OSError):
        text = ""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if lines and lines[0].startswith("Traceback"):
        said = lines[-1]
    elif lines:  # faulthandler's "Fatal Python error: Segmentation fault" and the stack after it
        said = "; ".join(lines[:2])
    else:
        said = "it left no Python error (killed from outside, e.g. out of memory: see the node's kernel log)"
    return f"DeepSpeed's decoupled checkpoint writer (process {process.pid}) died, {how}: {said}"


def install() -> None:
    """In a rank, before deepspeed.initialize builds the engine: the writer process runs writer(), and a commit
    that finds it dead says why."""
    from deepspeed.runtime.checkpoint_engine import decoupled_checkpoint_engine as dce

    if CAUSE_DIR not in os.environ:  # this rank's folder, gone when the rank exits (the writer's files with it)
        os.environ[CAUSE_DIR] = tempfile.mkdtemp(prefix="rh-decoupled-writer-")
        atexit.register(shutil.rmtree, os.environ[CAUSE_DIR], True)
    engine = dce.DecoupledCheckpointEngine
    if getattr(engine.commit, "_rh_explained", False):
        return
    original = engine.__init__

    @functools.wraps(original)
    def init(self, *a, **k):
        spawn = dce.init_decoupled_checkpoint
        dce.init_decoupled_checkpoint = writer  # the target DeepSpeed's __init__ hands mp.Process
        try:
            original(self, *a, **k)
        finally:
            dce.init_decoupled_checkpoint = spawn

    commit = engine.commit

    @functools.wraps(commit)
    def explained_commit(self, *a, **k):
        try:
            return commit(self, *a, **k)
        except RuntimeError as exc:
            why = died(self)
            if why is None:
                raise
            raise RuntimeError(f"{why} (DeepSpeed: {exc})") from exc

    explained_commit._rh_explained = True
    engine.__init__, engine.commit = init, explained_commit
