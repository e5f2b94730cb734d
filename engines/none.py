"""engine=none: train without checkpoints; the iteration-time baseline the others are compared with."""

from restart_harness.errors import UsageError

SAVES = False


def check(spec) -> None:
    if getattr(spec, "phase", "all") == "restart":
        raise UsageError("engine=none writes no checkpoint, so there is nothing to restart from")


def make_checkpoint_engine(ds_engine, spec):
    return None
