"""DataStates-LLM answers every error inside its engines' save, load and wait by logging it and calling sys.exit(-1)
(1b84990: llm/datastates/engines/engine_state.py; ebc6762 and the 2024 sources alike). DeepSpeed 0.19.8's
DataStatesCheckpointEngine catches `Exception`, which SystemExit is not: the rank ends with "SystemExit: -1" and no
cause, and where the harness waits for a save in its waiter thread (worker/manager.py) a SystemExit ends that thread
without a word. explained() turns it into a RuntimeError carrying the last error DataStates logged (its loggers are
named after its modules, under `datastates`), so the save or the restart fails with the cause.

Addresses DataStates-LLM 1b84990 (scripts/bundle/datastates-llm.pin). Remove when DataStates raises instead:
tests/test_durability.py::test_datastates_exit_shim_still_needed fails then (it reads the pinned sources where they
are here).
"""

from __future__ import annotations

import contextlib
import logging

ADDRESSES = "datastates-llm 1b849900f402cff614ff3d7e62e3bb29cfb29fa4"


class _LastError(logging.Handler):
    """The last error DataStates logged."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()[:500]


@contextlib.contextmanager
def explained():
    """Around a call into DataStates: its sys.exit becomes a RuntimeError with what it logged."""
    handler, logger = _LastError(), logging.getLogger("datastates")
    logger.addHandler(handler)
    try:
        yield
    except SystemExit as exc:
        raise RuntimeError(f"DataStates-LLM ended the call with sys.exit({exc.code}): "
                           f"{handler.last or 'it logged no error (its output is in the rank log)'}") from None
    finally:
        logger.removeHandler(handler)
