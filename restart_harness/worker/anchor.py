"""attribution=: the pause a sampled rank makes right after a few marks (schema ANCHOR_MARKS), inside a function
named ANCHOR_PREFIX + the mark. The sampler's trace (py-spy's clock) shows that frame; the rank's event log has the
pause's wall-clock start and end; results/attribution.py lines the two clocks up from them. Each pause lasts
ANCHOR_SAMPLES sampling intervals (50 ms at 100 Hz), counted in the phase it falls in and named there."""

from __future__ import annotations

import os
import time
import types

from restart_harness.schema import ANCHOR_MARKS, ANCHOR_PREFIX, ANCHOR_SAMPLES, ATTRIBUTION_RATE_ENV, Anchor


def _pause(until: float) -> None:
    while (left := until - time.time()) > 0:
        time.sleep(left)


def _named(mark: str):
    """_pause under the name the sampler shows (py-spy reads a code object's name, qualified from Python 3.11)."""
    name = ANCHOR_PREFIX + mark
    fields = {"co_name": name, **({"co_qualname": name} if hasattr(_pause.__code__, "co_qualname") else {})}
    return types.FunctionType(_pause.__code__.replace(**fields), _pause.__globals__, name)


class Anchors:
    def __init__(self, rate_hz: float):
        self.seconds = ANCHOR_SAMPLES / rate_hz
        self.functions = {mark: _named(mark) for mark in ANCHOR_MARKS}

    def __call__(self, mark: str) -> Anchor | None:
        pause = self.functions.get(mark)
        if pause is None:
            return None
        start = time.time()
        pause(start + self.seconds)
        return Anchor(mark, start, time.time())


def of_launch() -> Anchors | None:
    """Anchors when this rank's launch is sampled (the launch sets the rate in its ranks' environment)."""
    rate = os.environ.get(ATTRIBUTION_RATE_ENV)
    return Anchors(float(rate)) if rate else None
