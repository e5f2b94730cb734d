"""Training stacks: what trains the model and holds the state a checkpoint saves (DeepSpeed, FSDP2, and the emulated
stack that writes DeepSpeed's files without training), one module each holding one subclass of stacks.base.Stack,
discovered here. Importing a stack module imports no torch; its ranks import what they need."""

from __future__ import annotations

from functools import cache

from restart_harness.errors import UsageError
from restart_harness.plugins import discover
from restart_harness.stacks.base import Relayout, Stack, Verification

EMULATED = "emulated"  # the stack of emulate=true (stacks/emulated.py); not a value of the stack= key


@cache
def all_stacks() -> dict[str, type[Stack]]:
    return discover(__name__, __path__, Stack)


def names() -> list[str]:
    """The values of the stack= key."""
    return [n for n in all_stacks() if n != EMULATED]


def get(name: str) -> type[Stack]:
    if name not in names():
        raise UsageError(f"stack={name}: unknown training stack; accepted: {', '.join(names())}")
    return all_stacks()[name]


__all__ = ["EMULATED", "Relayout", "Stack", "Verification", "all_stacks", "get", "names"]
