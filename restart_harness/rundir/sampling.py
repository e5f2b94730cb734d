"""attribution=: py-spy (PyPI) started with a launch, sampling the launcher and every rank it starts on this node, into
profiles/<record>/samples.json (Chrome's trace-event format), read by results/attribution.py. Where it cannot see the
ranks (`unavailable`, decided before the launch), the run goes on with phase timings only: docs/attribution.md."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from restart_harness.iocount import strace
from restart_harness.schema import ATTRIBUTION_RATE_ENV, ATTRIBUTION_RATE_HZ
from restart_harness.spec import environment

TOOL_ENV = "RH_PY_SPY"  # the py-spy to use; default the one beside this Python, else on PATH
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
INSTALL = "pip install 'restart-harness[attribution]' (py-spy==0.4.3)"


def tool() -> tuple[str | None, str | None]:
    """(py-spy's path, None) or (None, why there is none)."""
    given = os.environ.get(TOOL_ENV)
    if given:
        executable = os.path.isfile(given) and os.access(given, os.X_OK)
        return (given, None) if executable else (None, f"{TOOL_ENV}={given} is not an executable file")
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside), None
    found = shutil.which("py-spy")
    return (found, None) if found else (None, f"py-spy is not installed: {INSTALL}")


def unsampled(spec, launcher) -> str | None:
    """Why a sampler started with the launch cannot see every rank, or None: it follows the launch command's
    descendants on this node, which the ranks are unless a scheduler or another node starts them."""
    if launcher.scheduler is not None:
        return (f"launcher={spec.launcher}: {launcher.scheduler.name} starts the ranks (its own daemons), outside the "
                "launch command's processes")
    return f"nodes={spec.nodes}: the other nodes' ranks are not processes of this node" if spec.across_nodes else None


def unavailable(spec, launcher) -> str | None:
    """Why attribution=python|native cannot sample this launch's ranks, or None (also when it is off)."""
    if spec.attribution == "off":
        return None
    if why := unsampled(spec, launcher):
        return why
    if environment.read().RH_STRACE:
        return f"{strace.ENV}=1 traces the launch with strace, and a process has one tracer"
    path, why = tool()
    return why if path is None else _probe(path, spec.attribution == "native")


@functools.cache
def _probe(path: str, native: bool) -> str | None:
    """py-spy samples a short Python process it starts (what it will do to the ranks): ptrace's permission, the
    container's seccomp profile and py-spy's own support of this Python are all proven here, in about a second."""
    try:
        scope = int(PTRACE_SCOPE.read_text())
    except (OSError, ValueError):
        scope = None
    if scope == 3:
        return f"tracing is disabled on this node ({PTRACE_SCOPE} = 3: no process may trace another)"
    with tempfile.TemporaryDirectory(prefix="rh-py-spy-") as tmp:
        out = Path(tmp) / "probe.txt"
        command = [path, "record", "--idle", "--rate", "50", "--format", "raw", "--output", str(out),
                   *(["--native"] if native else []), "--", sys.executable, "-c", "import time; time.sleep(0.4)"]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"py-spy ({path}) did not sample a test process: {exc}"
        if proc.returncode != 0 or not out.is_file() or not out.stat().st_size:
            said = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
            return (f"py-spy ({path}) could not sample a test process"
                    + (f": {said[-1].strip()}" if said else f" (exit code {proc.returncode})")
                    + ("; in a container, tracing needs --cap-add SYS_PTRACE" if scope is not None else ""))
    return None


def version(path: str) -> str:
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "py-spy"


class Sampler:
    """The wrapper of one launch: py-spy follows keep_exit.py, which runs the launch and keeps its exit code (py-spy's
    own is 0 whatever its command's)."""

    def __init__(self, run_dir: Path, record: str, native: bool):
        self.folder = run_dir / "profiles" / record
        self.trace = self.folder / "samples.json"
        self.exit_file = self.folder / "exit-code"
        self.native = native
        self.path = tool()[0]
        self.lost: str | None = None  # why its samples are lost, where the harness had to end it

    def command(self, launch: list[str]) -> list[str]:
        self.folder.mkdir(parents=True, exist_ok=True)
        # python: --nonblocking reads the ranks' memory without stopping them (no ptrace: less overhead, and no rank
        # left a traced zombie, third_party/py_spy_stuck_tracee.py); native stacks need a stopped process
        return [self.path, "record", "--subprocesses", "--idle", "--rate", str(ATTRIBUTION_RATE_HZ),
                *(["--native"] if self.native else ["--nonblocking"]), "--format", "chrometrace",
                "--output", str(self.trace),
                "--", sys.executable, "-I", "-S", str(Path(__file__).with_name("keep_exit.py")), *launch]

    def environment(self) -> dict[str, str]:
        return {"RH_LAUNCH_EXIT_FILE": str(self.exit_file), ATTRIBUTION_RATE_ENV: str(ATTRIBUTION_RATE_HZ)}

    def exit_code(self, sampler_code: int | None) -> int | None:
        """The launch's own exit code; the sampler's where the launch left none (killed with it)."""
        try:
            return int(self.exit_file.read_text().strip())
        except (OSError, ValueError):
            return sampler_code

    def watch(self, pid: int):
        """What follows the launch watches for (native mode: a rank left traced, third_party/py_spy_stuck_tracee.py)."""
        from third_party.py_spy_stuck_tracee import Watch

        return Watch(pid) if self.native else None

    def record(self, mode: str) -> dict:
        if self.lost:
            return {"mode": mode, "sampled": False, "reason": self.lost}
        return {"mode": mode, "sampled": True, "reason": None, "tool": version(self.path),
                "rate_hz": ATTRIBUTION_RATE_HZ, "trace": str(self.trace.relative_to(self.folder.parent.parent))
                if self.trace.is_file() else None}


def of_launch(spec, launcher, run_dir: Path, record: str) -> tuple[Sampler | None, dict | None]:
    """The sampler of a launch and what its record says of attribution (None, None: not asked)."""
    if spec.attribution == "off":
        return None, None
    if why := unavailable(spec, launcher):
        return None, {"mode": spec.attribution, "sampled": False, "reason": why}
    return Sampler(run_dir, record, spec.attribution == "native"), None
