"""The command line -> a validated request: a RunSpec for runs, the options of the other commands. Pure: no torch, no
DeepSpeed, no machine checks (restart_harness/preflight.py does those)."""

from __future__ import annotations


def parse_args(tokens: list[str]):
    """`MODEL key=value ...` -> the resolved RunSpec (what a run of those tokens would use)."""
    from restart_harness.command.parse import parse_run

    return parse_run(tokens)[0]
