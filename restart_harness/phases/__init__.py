"""One run's phases, launched and followed: the checkpoint phase, the restart phase (of the run, or re-run later on
an existing run), each launch supervised (its progress, its watchdog, its failure said in one line), and a batch
scheduler's job that runs them inside the allocation."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """A line of progress for the person at the terminal (stderr; stdout carries the result)."""
    print(message, file=sys.stderr, flush=True)
