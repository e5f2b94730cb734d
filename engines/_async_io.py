"""Can DeepSpeed's async_io op (libaio: engine=fastpersist and engine=decoupled) be loaded or built on this node?
Asked before any rank starts, under this process's environment; no torch or DeepSpeed import. What it checks and
why: docs/engines.md#the-engines (the paragraph on `engines/_async_io.py`)."""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

RUNTIME = "libaio.so.1"
HEADER = "libaio.h"
INSTALL = ("Debian/Ubuntu: apt-get install libaio-dev; or point CPATH, LIBRARY_PATH and LD_LIBRARY_PATH at libaio's "
           "files extracted from its packages")


def prebuilt() -> bool:
    """DeepSpeed was installed with the async_io op built (git_version_info_installed.installed_ops)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return False
    info = Path(next(iter(spec.submodule_search_locations))) / "git_version_info_installed.py"
    try:
        for node in ast.parse(info.read_text()).body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "installed_ops"
                                                     for t in node.targets)):
                return bool(ast.literal_eval(node.value).get("async_io"))
    except (OSError, SyntaxError, ValueError):
        pass
    return False


def _compiles(source: str, link: bool) -> tuple[bool, str]:
    """(it compiled and, with link, linked with -laio; the compiler's last line)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False, "no C compiler (cc)"
    with tempfile.TemporaryDirectory(prefix="rh-aio-") as tmp:
        c = Path(tmp, "t.c")
        c.write_text(source)
        flags = shlex.split(os.environ.get("CFLAGS", ""))
        cmd = ([cc, *flags, str(c), *shlex.split(os.environ.get("LDFLAGS", "")), "-laio", "-o", str(Path(tmp, "a"))]
               if link else [cc, *flags, "-E", str(c), "-o", os.devnull])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        return proc.returncode == 0, (lines[-1].strip() if lines else "")


def shortfall() -> str | None:
    """Why DeepSpeed's async_io op cannot be loaded or built on this node, naming the missing piece; or None."""
    try:
        ctypes.CDLL(RUNTIME)
    except OSError:
        return (f"DeepSpeed's async_io op (libaio) cannot load here: libaio's runtime library {RUNTIME} is not "
                f"installed ({INSTALL})")
    if prebuilt():
        return None
    ok, said = _compiles(f"#include <{HEADER}>\n", link=False)
    if not ok:
        return (f"DeepSpeed's async_io op is not prebuilt and cannot be built here: {HEADER} is missing "
                f"({said or 'the compiler does not find it'}; {INSTALL})")
    ok, said = _compiles("void io_submit(void);\nint main(void) { io_submit(); return 0; }\n", link=True)
    if not ok:
        return (f"DeepSpeed's async_io op is not prebuilt and cannot be built here: the linker does not find libaio "
                f"(-laio: {said or 'link failed'}; {INSTALL})")
    return None
