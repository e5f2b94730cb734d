"""A sample's cause (results/causes.py) on stacks py-spy recorded in real runs (tests/data/attribution/): the frames a
rule sees are what a real rank's stack holds, paths and all (the checkout and the environment renamed); and the
real lazy restart they came from (slow). Also how a range of such figures is printed."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, load_summary

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


def test_a_range_of_negative_figures_reads_as_one():
    """Every range the harness prints is `LOW to HIGH`: `-0.122 [-0.250-0.007]` read as minus signs."""
    from analysis.render import fmt
    from analysis.table import Stat
    from restart_harness.schema import span

    assert fmt(Stat(-0.122, -0.250, 0.007, 3)) == "-0.122 (-0.250 to 0.007, n=3)"
    assert span(-1.5, -0.25, ".2f") == "-1.50 to -0.25" and span(1000, 2500, ",.0f") == "1,000 to 2,500"


@pytest.mark.slow
def test_a_lazy_restarts_first_step_is_training_not_the_engine(harness):
    """The real run the stored stack came from: its first step's optimizer step is training, and of the load no more
    than what its last sample may carry into the phase (CARRIED_INTERVALS) is counted there, give or take the one
    interval within which the anchors put the sampler's clock on the ranks' (attribution._offsets)."""
    from restart_harness.results.attribution import CARRIED_INTERVALS

    run_dir, _, _ = harness.played("lazy-dp2")
    att = load_summary(run_dir)["restarts"][0]["attribution"]
    first = att["phases"]["first_step"]
    assert not [c for c in first["causes"] if "take_model_step" in c["cause"]], first["causes"]
    loading = sum(c["seconds"] for c in first["causes"] if c["kind"] == "checkpoint")
    assert loading <= (CARRIED_INTERVALS + 1) / att["rate_hz"], first["causes"]
    assert any(c["kind"] == "training" for c in first["causes"]), first["causes"]


def test_a_sample_from_before_a_phase_speaks_for_it_only_briefly():
    """A sampler lagging on a busy machine left 0.1 s between two samples across checkpoint_loaded: the load's last
    sample counted 0.1 s of first_step as DeepSpeed's load_checkpoint. It now carries into the phase at most
    CARRIED_INTERVALS sampling intervals after it was taken; the rest is time the sampler did not see."""
    from restart_harness.results.attribution import CARRIED_INTERVALS, _clip

    carry = CARRIED_INTERVALS / 100
    load, step = ("load",), ("step",)
    spans = [(0.99, 1.10, load), (1.10, 1.20, step)]  # the phase starts at 1.0
    assert _clip(spans, 1.0, 2.0, carry) == [(1.0, 0.99 + carry, load), (1.10, 1.20, step)]
    assert _clip([(0.95, 1.10, load)], 1.0, 2.0, carry) == []  # taken longer ago than it speaks for
    assert _clip(spans, 0.5, 1.05, carry) == [(0.99, 1.05, load)]  # inside its own phase it runs to the next sample
