"""One run's phases, launched and followed (checkpoint, restart, restart-only re-runs), each launch supervised, and a
batch scheduler's job that runs them inside the allocation."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """A line of progress for the person at the terminal (stderr; stdout carries the result)."""
    print(message, file=sys.stderr, flush=True)
