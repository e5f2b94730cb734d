"""The environment variables a user sets for the harness, declared as keys and coerced as keys are, checked by every
command before anything else (cli.py); unset or empty: the default. (RH_PYTHON, RH_VENV and RH_VENV_DIR: scripts/env.sh
checks them before Python starts.)"""

from __future__ import annotations

import os
from dataclasses import dataclass

from restart_harness import faults
from restart_harness.errors import refused
from restart_harness.spec.keys import Path, coerce, key, keys_of


@dataclass(frozen=True)
class Environment:
    RH_FAULT: str | None = key(None, "a fault injected for the reliability tests: ACTION@POINT[:rank=R][:step=S]"
                                     "[:node=N][:mib=M] (restart_harness/faults.py)", group="environment")
    RH_STRACE: bool = key(False, "run each launch under strace (restart_harness/iocount/strace.py)",
                          group="environment")
    RH_CACHE_DIR: Path | None = key(None, "the user cache folder (JIT-built ops, storage baselines); default "
                                          "$XDG_CACHE_HOME/restart-harness", group="environment")
    RH_PY_SPY: Path | None = key(None, "the py-spy attribution= samples with; default the one beside this Python, "
                                       "else on PATH", group="environment")


def read(environ: dict | None = None) -> Environment:
    """The declared variables of `environ` (default os.environ), each coerced as its key; raises UsageError naming
    the first bad one (NAME=value: why; accepted: ...)."""
    environ = os.environ if environ is None else environ
    values = {name: coerce(k, environ[name]) for name, k in keys_of(Environment).items() if environ.get(name)}
    if values.get("RH_FAULT"):
        try:
            faults.parse(values["RH_FAULT"])
        except ValueError as exc:
            raise refused("RH_FAULT", values["RH_FAULT"], str(exc), faults.ACCEPTED) from None
    return Environment(**values)
