"""Errors the command line turns into one line and an exit code (exit_code(): the one mapping, for the command line
and for a batch job's phases)."""

import signal
import sys
from collections.abc import Callable


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2, nothing written."""


class RunFailed(Exception):
    """A launched run failed; the run directory records why."""


def refused(key: str, value: object, why: str, accepted: str | None = None) -> UsageError:
    """The one shape of a refusal of a key's value: `key=value: why; accepted: what`, the value as it was given
    (never dropped: a user who typed engine=lazy reads engine=lazy back)."""
    return UsageError(f"{key}={value}: {why}" + (f"; accepted: {accepted}" if accepted else ""))


def _interrupt(signum, frame):  # SIGTERM (kill, scancel, qdel, a walltime) ends work like Ctrl-C: the run failed
    raise KeyboardInterrupt


def exit_code(work: Callable[[], int], interrupted: tuple[int, str] = (130, "interrupted")) -> int:
    """work() (it launches ranks), SIGTERM raised in it as Ctrl-C; how it ends is one line and the exit code: bad
    input 2, a failed run 1, an interruption `interrupted` (a batch job, ended by its scheduler: 143, "terminated")."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return work()
    except (UsageError, RunFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print(interrupted[1], file=sys.stderr)
        return interrupted[0]
