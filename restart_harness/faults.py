"""Deterministic fault injection for the reliability tests: RH_FAULT="<action>@<point>:rank=R:step=S:node=N"
(each selector optional; node=N: every rank of the launcher's node N, CROSS_RANK, as a node that is lost). The
actions and points (kill@save, kill@flush, hang@step, enospc@save, fill@step, leak@save, tear@commit) and what each
does: docs/faults.md. Unset in normal runs; the harness never sets it itself."""

from __future__ import annotations

import errno
import os
import signal
import time

# action -> the points it is injected at (docs/faults.md); the selectors a fault takes
FAULTS = {"kill": ("save", "flush"), "hang": ("step",), "enospc": ("save",), "fill": ("step",), "leak": ("save",),
          "tear": ("commit",)}
SELECTORS = ("rank", "step", "node", "mib")
ACCEPTED = ("ACTION@POINT of " + ", ".join(f"{a}@{p}" for a, points in FAULTS.items() for p in points)
            + ", then :rank=R, :step=S, :node=N or :mib=M (non-negative integers), or unset")


def parse(text: str) -> dict:
    """RH_FAULT's text -> {action, point, selectors}; raises ValueError saying what is wrong (spec/environment.py
    turns it into one line before any command runs)."""
    head, *fields = text.split(":")
    action, at, point = head.partition("@")
    if not at or action not in FAULTS or point not in FAULTS[action]:
        raise ValueError(f"{head!r} is not a fault")
    spec: dict = {"action": action, "point": point}
    for field in fields:
        name, eq, value = field.partition("=")
        if name not in SELECTORS or not eq:
            raise ValueError(f"{field!r} is not a selector")
        if name in spec:
            raise ValueError(f"{name} given twice")
        if not (value.isascii() and value.isdigit()) or int(value) > 2**31 - 1:
            raise ValueError(f"{name}={value} is not a non-negative integer")
        spec[name] = int(value)
    return spec


_UNSET = object()
_FAULT: object = _UNSET


def fault() -> dict | None:
    """The configured fault, parsed once on first use (never at import: a command that injects nothing never fails
    on it; the command line refused a malformed one already)."""
    global _FAULT
    if _FAULT is _UNSET:
        text = os.environ.get("RH_FAULT")
        _FAULT = parse(text) if text else None
    return _FAULT  # type: ignore[return-value]


def hit(point: str, rank: int, step: int | None = None, where: str | None = None) -> None:
    """Trigger the configured fault if it targets this point, rank and step (`where`: the checkpoint root)."""
    f = fault()
    if not f or f["point"] != point or f.get("rank", rank) != rank:
        return
    if ("node" in f and f["node"] != int(os.environ.get("CROSS_RANK") or 0)) or (
            step is not None and f.get("step", step) != step):
        return
    if f["action"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif f["action"] == "hang":
        while True:
            time.sleep(3600)
    elif f["action"] == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    elif f["action"] == "fill" and where:
        _fill(os.path.join(where, ".filler"))
    elif f["action"] == "tear" and where:
        _tear(where)
    elif f["action"] == "leak" and step not in _LEAKED:
        _LEAKED[step] = _resident(f.get("mib", 4) << 20)


_LEAKED: dict[int | None, bytearray] = {}


def _resident(nbytes: int) -> bytearray:
    """nbytes allocated and every page written (resident), with no temporary copy beside it."""
    buf = bytearray(nbytes)
    for i in range(0, nbytes, 4096):
        buf[i] = 1
    return buf


def _tear(path: str) -> None:
    if os.path.isdir(path):  # a folder of shards: its largest file
        files = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
        path = max(files, key=os.path.getsize)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(max(0, size // 2 - 2048))
        f.write(bytes(min(4096, size)))
        f.flush()
        os.fsync(f.fileno())


def _fill(path: str) -> None:
    block = b"\xff" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):  # whole blocks, then the last partial ones: nothing may be left
            try:
                while True:
                    f.write(block[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
