"""`./submit-job.sh --help`: keys, presets and engines, read from the same places the parser uses."""

from __future__ import annotations

from engines import registry
from restart_harness.spec.args import CHOICES, run_keys
from restart_harness.spec.model_shape import FIELDS, preset_names
from restart_harness.spec.phases import RESTART_KEYS


def usage() -> str:
    keys = run_keys()
    lines = [
        "usage: ./submit-job.sh MODEL [key=value ...]",
        "       ./submit-job.sh MODEL key=a,b [key=c,d ...] [repeats=N]   a sweep: every combination, one folder",
        "       ./submit-job.sh phase=restart run=RUN_DIR [key=value ...]  restart-only re-runs of a run; keys: "
        + ", ".join(RESTART_KEYS),
        "",
        f"MODEL: {', '.join(preset_names())} (configs/models/), or a path to an HF config.json",
        "",
        "keys:",
    ]
    for key, kind in keys.items():
        choice = f" ({' | '.join(CHOICES[key])})" if key in CHOICES else ""
        lines.append(f"  {key}={kind}{choice}")
    lines += ["", f"model overrides: {', '.join(FIELDS)}",
              "", "planner (launches nothing): plan=true|json [bandwidth_gbps=GB/s, 10^9 bytes/s]",
              "storage baseline: ./submit-job.sh baseline dir=PATH [tool=auto|fio|builtin] [file_bytes=64M] [ranks=N]",
              "", "engines:"]
    for name in registry.names():
        spec = registry.get_spec(name)
        shown = [f"{k}={v}" + (f" ({' | '.join(spec.choices[k])})" if k in spec.choices else "")
                 for k, v in spec.defaults.items()]
        opts = f" options: {', '.join(shown)}" if shown else ""
        lines.append(f"  {name}: {spec.description}{opts}")
    return "\n".join(lines)
