"""A sample's cause (results/causes.py) on stacks py-spy recorded in real runs (tests/data/attribution/): the frames a
rule sees are what a real rank's stack holds, paths and all (the checkout and the environment renamed)."""

from __future__ import annotations

import json

from conftest import REPO

from restart_harness.results import causes
from restart_harness.results.samples import Frame

STACKS = REPO / "tests" / "data" / "attribution"


def _stack(name: str) -> list[Frame]:
    return [Frame(**f) for f in json.loads((STACKS / name).read_text())]


def test_the_optimizer_step_through_an_engines_wrapper_is_training():
    """engine=lazy wraps DeepSpeed's _take_model_step (its copies must be done before the state changes): a restart's
    first step spent in the optimizer under that wrapper is the optimizer step, not the checkpoint engine's load
    (tiny dp=2 engine=lazy attribution=python, first_step of restart-01, 2026-11-27)."""
    stack = _stack("lazy-first-step-optimizer.json")
    assert any(f.file.endswith("/engines/lazy.py") for f in stack)
    assert causes.classify(stack) == causes.Cause("training", "optimizer step")


def test_the_wrapper_waiting_for_its_copies_is_the_engine():
    """The same wrapper where it waits for a save's copies: that is the checkpoint engine's time."""
    stack = _stack("lazy-first-step-optimizer.json")
    at = next(i for i, f in enumerate(stack) if f.file.endswith("/engines/lazy.py"))
    waiting = [*stack[:at + 1], Frame("LazyIO.wait_copied", stack[at].file, 655),
               Frame("Future.result", "/usr/lib/python3.11/concurrent/futures/_base.py", 451),
               Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327)]
    assert causes.classify(waiting).kind == "checkpoint"


def test_the_engines_own_load_is_the_checkpoint():
    """A rank inside the engine's load (no training call under it) is the checkpoint engine."""
    stack = _stack("lazy-first-step-optimizer.json")
    at = next(i for i, f in enumerate(stack) if f.file.endswith("/worker/main.py"))
    harness = stack[at].file.rsplit("/worker/", 1)[0]
    engines = stack[next(i for i, f in enumerate(stack) if f.file.endswith("/engines/lazy.py"))].file
    loading = [*stack[:at + 1], Frame("CheckpointManager.load", f"{harness}/worker/manager.py", 289),
               Frame("LazyIO.load", engines, 700), Frame("_read_part", engines, 800)]
    assert causes.classify(loading).kind == "checkpoint"
