"""py-spy 0.4.3 in its blocking mode (the default, and the only mode with `--native`) stops every thread of a
process with ptrace for each sample. A rank that exits while stopped for a sample is left a zombie whose other
threads stay traced and stopped by py-spy's sampling thread, which never waits for them: the rank's parent (DeepSpeed's
launcher, torchrun, the prefork process) can then never reap it, and the launch hangs until its time limit. Found
here on 2026-11-26: a `tiny dp=2` restart whose ranks had both exited, its launcher waiting 4 minutes on a zombie
whose TracerPid was a py-spy thread.

attribution=python avoids it with `--nonblocking` (py-spy reads the ranks' memory without stopping them: no tracer,
and less overhead). attribution=native cannot (py-spy unwinds native stacks only from a stopped process), so the
harness watches: stuck() names a zombie of the launch's session traced by the sampler for longer than
STUCK_SECONDS; the harness then ends the sampler (its tracees are released as it exits and the launch ends by itself),
and that launch's attribution is said to be lost, with why.

When it can go: once a py-spy release waits for (or detaches) a tracee that exited during a sample. The check: a
blocking `py-spy record --subprocesses` of a launch whose ranks exit at once, repeated (benchmarks' what-if runs
restart-only re-runs back to back), never leaves a zombie with a py-spy TracerPid.
"""

from __future__ import annotations

import time
from pathlib import Path

VERSION = "0.4.3"
STUCK_SECONDS = 5.0


def _field(pid: int, name: str) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


class Watch:
    """Zombies of a session traced by the sampler (pid `sampler`), and since when each was seen."""

    def __init__(self, sampler: int):
        self.sampler = sampler
        self.seen: dict[int, float] = {}

    def stuck(self, members: list[int]) -> int | None:
        """A member traced by the sampler and a zombie for over STUCK_SECONDS, or None."""
        try:
            tracers = {int(t.name) for t in Path(f"/proc/{self.sampler}/task").iterdir()}
        except OSError:
            return None
        now = time.monotonic()
        for pid in members:
            state, tracer = _field(pid, "State"), _field(pid, "TracerPid")
            if state and state.startswith("Z") and tracer and int(tracer) in tracers:
                if now - self.seen.setdefault(pid, now) > STUCK_SECONDS:
                    return pid
            else:
                self.seen.pop(pid, None)
        return None
