"""DeepSpeed 0.19.8's JIT op builder (`OpBuilder.compute_capability_args`) sorts the entries of TORCH_CUDA_ARCH_LIST
by `int()` of each part, so an architecture-specific entry that torch itself accepts ("9.0a" for Hopper's wgmma,
"10.0f") stops every JIT build with `ValueError: invalid literal for int() with base 10: '0a'`. Found on an H200
whose image sets TORCH_CUDA_ARCH_LIST=9.0a (2026-11-26): engine=fastpersist and engine=decoupled could not build
their async_io op. The ops it builds (async_io, utils) use no architecture-specific instruction, so plain() drops
the suffix ("9.0a" -> "9.0", "+PTX" kept) in the rank's environment before DeepSpeed builds anything; processes
the rank starts (the decoupled writer) inherit it. Remove when
tests/test_engines.py::test_deepspeed_arch_list_shim_still_needed fails (DeepSpeed parses the suffix).
"""

from __future__ import annotations

import os
import re

ADDRESSES = "deepspeed==0.19.8"
ENTRY = re.compile(r"^(\d+)\.(\d+)[a-z]*(\+PTX)?$")


def plain(arch_list: str) -> str:
    """The list with each entry's architecture suffix dropped: "9.0a;10.0f+PTX 8.0" -> "9.0;10.0+PTX;8.0";
    entries that are not of that shape stay as they are (DeepSpeed then says what it makes of them)."""
    out = []
    for entry in arch_list.replace(" ", ";").split(";"):
        match = ENTRY.match(entry.strip())
        out.append(f"{match[1]}.{match[2]}{match[3] or ''}" if match else entry.strip())
    return ";".join(e for e in out if e)


def prepare(environ=os.environ) -> str | None:
    """Rewrite TORCH_CUDA_ARCH_LIST in environ where an entry has a suffix; the original value, or None if unchanged."""
    original = environ.get("TORCH_CUDA_ARCH_LIST")
    if not original or plain(original) == original.strip():
        return None
    environ["TORCH_CUDA_ARCH_LIST"] = plain(original)
    return original
