"""Work once on every node of a launch: the node checks inside a submitted job or across an allocation's nodes
(restart_harness/nodecheck.py), and the page-cache step before a restart (each node's page cache is its own)."""

from __future__ import annotations

import sys
from pathlib import Path

from restart_harness import launchers, nodecheck, resolve
from restart_harness.errors import RunFailed
from restart_harness.files.atomic import write_json_atomic
from restart_harness.phases import say
from restart_harness.phases.processes import one_record_a_node


def show_node_checks(plugins: resolve.Plugins) -> None:
    """dry_run=true: what the node that runs the ranks is checked for, and where."""
    checks = nodecheck.checks(plugins)
    where = ("on every node of the job, before any rank starts" if plugins.launcher.scheduler else
             "on this machine, before anything is created, when the run is launched")
    print(f"==> checks of the node that runs the ranks ({where}) <==")
    for check in checks:
        print(f"{check.name}: {check.what}")
    if not checks:
        print("(none for this engine and device)")


def check_nodes(run: resolve.Run) -> None:
    """Inside a submitted job, or across the nodes of an allocation: the node checks once on every node before
    anything starts; RunFailed naming the first node that fails. A launch that starts its ranks on the machine the
    command was typed on was checked there (preflight)."""
    spec, run_dir = run.spec, run.run_dir
    if not (launchers.job_id() or spec.across_nodes) or not nodecheck.checks(run):
        return
    argv = [sys.executable, "-m", "restart_harness.nodecheck", str(run_dir)]
    command = run.launcher.per_node_command(argv) or argv
    proc, nodes = one_record_a_node(command, timeout=600)
    (run_dir / "records").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "records" / "nodecheck.json", {"command": command, "exit_code": proc.returncode,
                                                               "nodes": nodes})
    if failed := nodecheck.line(nodes):
        raise RunFailed(failed)
    expected = spec.nodes if spec.across_nodes else 1
    if proc.returncode != 0 or len(nodes) != expected:
        said = " ".join((proc.stderr or proc.stdout).split())[-300:]
        raise RunFailed(f"the node checks did not run on every node ({len(nodes)} of {expected} answered; "
                        f"{command[0]} exit {proc.returncode}: {said})")
    say(f"  [nodes] {', '.join(n['host'] for n in nodes)}: {', '.join(nodes[0]['checks'])} checked, every one passed")


def cache_on_every_node(run: resolve.Run, load_dir: Path, per_file: bool = False) -> dict:
    """The cache step on each node of a multi-node job (one task per node): {"per_node": [its record with its
    host], "observed": the worst node's}, or an error saying why it could not run (observed then stays this
    node's, and says so). `per_file`: each node evicts the checkpoint's files alone, as this node did."""
    spec = run.spec
    argv = [sys.executable, "-m", "restart_harness.files.pagecache", spec.cache, str(load_dir),
            *(["--per-file"] if per_file else [])]
    command = run.launcher.per_node_command(argv)
    if command is None:
        return {}
    proc, nodes = one_record_a_node(command, timeout=300)
    if proc.returncode != 0 or len(nodes) != spec.nodes:
        said = " ".join((proc.stderr or proc.stdout).split())[-300:]
        return {"per_node": nodes or None,
                "error": f"the cache step on every node failed ({command[0]} exit {proc.returncode}: {said}); "
                         "observed is the first node's only"}
    nodes.sort(key=lambda n: n["host"])
    not_cold = [n for n in nodes if n["observed"] != "cold"]
    observed = "cold" if not not_cold else "; ".join(f"{n['host']} {n['observed']}" for n in not_cold)
    if spec.cache == "warm":
        observed = "warm" if all(n["observed"] == "warm" for n in nodes) else "; ".join(
            f"{n['host']} {n['observed']}" for n in nodes if n["observed"] != "warm")
    return {"per_node": nodes, "observed": observed}
