"""The checks that depend on the node that runs the ranks: an engine's Python module or op, CUDA and the GPU count,
locked memory. Run by preflight where the ranks start on this machine; a submitted or dry run's, once on every node
inside the job before the checkpoint phase (`python -m restart_harness.nodecheck RUN_DIR`, by the launcher's per-node
command; docs/clusters.md), a failing node ending the run with one line naming it and the reason."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from restart_harness import resolve
from restart_harness.plugins import NodeCheck
from restart_harness.resolve import Plugins


def checks(plugins: Plugins) -> list[NodeCheck]:
    """Every node check of a run: the device's, the engine's."""
    spec = plugins.spec
    out = []
    if spec.device == "cuda":
        out.append(NodeCheck("device=cuda", f"an NVIDIA driver, a CUDA build of torch and {spec.ranks_per_node} GPUs "
                                            "visible to the job", lambda: cuda_shortfall(spec.ranks_per_node),
                             instead="device=cpu or device=auto"))
    return out + plugins.engine.node_checks()


def here(plugins: Plugins) -> None:
    """The checks, on this machine, where the ranks start on it: UsageError (one line) naming every check it fails,
    as a job's node line does (a GPU node lacking libaio is told both, not the device alone)."""
    from restart_harness.errors import UsageError

    failed = [f"{c.name} cannot run on this node: {why}" + (f"; accepted here: {c.instead}" if c.instead else "")
              for c in checks(plugins) if (why := c.run())]
    if failed:
        raise UsageError(" | ".join(failed))


def cuda_shortfall(gpus: int) -> str | None:
    """Why this node cannot give `gpus` CUDA devices to its ranks, or None."""
    if not Path("/proc/driver/nvidia/version").is_file():
        return "no NVIDIA driver on this node (/proc/driver/nvidia/version is absent)"
    import torch

    if torch.version.cuda is None:
        return f"this Python's torch ({torch.__version__}) is a CPU build"
    seen = torch.cuda.device_count()
    return f"{seen} CUDA devices visible to the job, {gpus} ranks on this node need one each" if seen < gpus else None


def line(node_failures: list[dict]) -> str | None:
    """One line for the run's failure: the first failing node and its reasons, and how many others failed."""
    failing = [n for n in node_failures if n["failed"]]
    if not failing:
        return None
    first = failing[0]
    reasons = "; ".join(f"{name}: {why}" for name, why in first["failed"])
    more = f" (and {len(failing) - 1} other node{'s' if len(failing) > 2 else ''})" if len(failing) > 1 else ""
    return f"node {first['host']} cannot run the ranks{more}: {reasons}"


def main(argv: list[str] | None = None) -> int:
    """On one node: its host name and the checks it fails, as one JSON line (every node's line reaches the job)."""
    run = resolve.read(Path((argv if argv is not None else sys.argv[1:])[0]))
    print(json.dumps({"host": socket.gethostname(), "checks": [c.name for c in checks(run)],
                      "failed": [(c.name, why) for c in checks(run) if (why := c.run())],
                      "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
