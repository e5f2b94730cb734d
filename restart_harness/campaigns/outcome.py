"""The one exit rule of every campaign (matrix, sweep, study, mlperf): exit code 0 only where what was asked ran, or
was planned on purpose; 1 where any part of it failed or was stopped; and where nothing that was asked can run, a
refusal (exit code 2) before anything is created, as a single run is refused - never a folder of refusals and 0."""

from __future__ import annotations

from collections.abc import Iterable

from restart_harness.errors import UsageError

# The states of a campaign's parts that count as done: it ran to the end, a scheduler has it (wait=false), it was
# written only (dry_run=true), or it was planned and predicted on purpose (a study's cell its sizing or fidelity chose
# to predict; a matrix case this node cannot run, listed with its reason)
DONE = frozenset({"complete", "submitted", "dry_run", "planned"})


def exit_code(states: Iterable[str]) -> int:
    """0 where there is at least one part and every part is done (DONE), else 1."""
    states = list(states)
    return 0 if states and all(s in DONE for s in states) else 1


def something_runs(asked: str, parts: int, runnable: int, why: str, accepted: str, noun: str = "parts") -> None:
    """Refuse a campaign none of whose `parts` (its cases, cells, runs) can run (`why`: the first one's reason),
    before anything is created."""
    if parts and not runnable:
        raise UsageError(f"{asked}: none of its {parts} {noun} can run here "
                         f"(the first: {why}); accepted: {accepted}")
