"""The command line -> a validated request (RunSpec for runs). Pure: no torch, no DeepSpeed, no machine checks."""

from restart_harness.spec.runspec import RunSpec


def parse_args(tokens: list[str]) -> RunSpec:
    """`MODEL key=value ...` -> the resolved RunSpec (what a run of those tokens would use)."""
    from restart_harness.spec.command import parse_run

    return parse_run(tokens)[0]


__all__ = ["RunSpec", "parse_args"]
