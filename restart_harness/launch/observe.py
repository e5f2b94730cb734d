"""What a launch preloads into its ranks to observe I/O: the harness's counters for the anatomy (anatomy=true) and
dftracer for the full trace (trace=true). Returns environment variables for the launch script."""

from __future__ import annotations

import sys
from pathlib import Path

from restart_harness import iocount
from restart_harness.spec.runspec import RunSpec
from third_party import dftracer_compat


def environment(spec: RunSpec, run_dir: Path, record: str, ckpt_root: Path) -> dict[str, str]:
    """LD_PRELOAD (libraries first, any existing LD_PRELOAD after them) and the settings that go with them."""
    preload: list[str] = []
    env: dict[str, str] = {}
    if spec.anatomy or spec.trace:
        try:
            lib = iocount.build()
        except OSError as exc:  # the run goes on; its anatomy says the I/O split is missing and why
            print(f"  [anatomy] no I/O counters: {exc}", file=sys.stderr)
            lib = None
        if lib is not None:
            preload.append(str(lib))
            env[iocount.ENV_PREFIXES] = str(ckpt_root)
    if spec.trace:
        tracer = dftracer_compat.preload_library()
        if tracer is not None:  # preflight refuses trace=true without dftracer
            folder = run_dir / "traces" / record
            folder.mkdir(parents=True, exist_ok=True)
            preload.append(str(tracer))
            env.update(dftracer_compat.environment(folder / "trace", ckpt_root))
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    return env
