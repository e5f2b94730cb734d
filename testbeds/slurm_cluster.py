"""A Slurm cluster of N nodes on this one machine, to try and test multi-node runs without a cluster.

Each node is a network namespace with its own hostname (a UTS namespace) and address on a private bridge, running
its own real `slurmd`; this host is the login node and runs the one `slurmctld` and the one `munged` (the nodes reach
munge's socket through the shared file system, as they reach the checkout, the results and the checkpoints: one
file system seen at the same path everywhere, as a cluster's shared file system is). A job's processes run inside
their node's namespaces, so `srun`, `scontrol show hostnames`, torch's rendezvous and gloo's sockets go over the
bridge between distinct addresses, as between machines. What the nodes share that real nodes do not: the CPUs,
the memory and the kernel (one page cache). Slurm 22.05 as Debian builds it (no cgroups: proctrack/linuxproc,
task/none); root is needed (namespaces, a bridge, daemons).

    python -m testbeds.slurm_cluster up N [gpus=G] [--root DIR] [--cpus C]
                                                                  prints `export SLURM_CONF=...`
    python -m testbeds.slurm_cluster down [--root DIR]
    python -m testbeds.slurm_cluster status [--root DIR]
    python -m testbeds.slurm_cluster kill-node NODE [--root DIR]     every process of NODE, slurmd too

gpus=G gives every node G GPUs as Slurm sees them: generic resources (`Gres=gpu:G`, gres.conf with AutoDetect=off)
backed by stand-in device files under ROOT/dev/NODE/ (character devices with /dev/null's numbers: Slurm takes only
devices; there is no driver and nothing can run on them). slurmctld
schedules and binds them as on a GPU cluster, and srun gives each task CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE;
a job asking for more GPUs per node than there are is refused.

Everything a cluster creates (namespaces, veth pairs, the bridge, daemons, spool and state) is named in
ROOT/cluster.json as it is created, so `down` removes all of it, also after an `up` that failed half-way.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbeds import free_port, terminate
from testbeds.slurm_files import gres_conf, hosts, slurm_conf

DEFAULT_ROOT = Path(os.environ.get("RH_CLUSTER_DIR", "/tmp/restart-harness-cluster"))
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sinfo", "ip",
            "unshare", "nsenter")
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


class ClusterError(RuntimeError):
    """The cluster could not be started or reached (the message says which step and shows its log's tail)."""


def which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def missing() -> list[str]:
    """The programs a cluster needs that this machine lacks (Debian: slurm-wlm, munge, iproute2, util-linux)."""
    return [b for b in BINARIES if which(b) is None]


def _run(*cmd: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([which(cmd[0]) or cmd[0], *cmd[1:]], capture_output=True, text=True, env=env, check=False,
                          timeout=60)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.77.0.0/16 that no interface of this machine is on (two clusters can run side by side)."""
    used = _run("ip", "-4", "-o", "addr", "show").stdout
    for third in range(256):
        net = ipaddress.ip_network(f"10.77.{third}.0/24")
        if f" 10.77.{third}." not in used:
            return net
    raise ClusterError("no free /24 left in 10.77.0.0/16 for the cluster's bridge")


@dataclass
class Cluster:
    """One local cluster as ROOT/cluster.json describes it (written as each piece is created)."""

    root: Path
    ident: str
    subnet: str
    login: str  # this host's name: the controller's and the login node's
    nodes: list[str] = field(default_factory=list)
    cpus: int = 2
    gpus: int = 0  # stand-in GPUs per node (generic resources)
    created: dict = field(default_factory=lambda: {"netns": [], "links": [], "pids": {}})

    # -- names -------------------------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"rhc{self.ident}"

    def netns(self, node: str) -> str:
        return f"rhc-{self.ident}-{node}"

    def address(self, index: int) -> str:
        """node index 0 -> .11, 1 -> .12, ...; the bridge (this host) is .1."""
        return str(ipaddress.ip_network(self.subnet)[11 + index])

    @property
    def bridge_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        """What a client (sbatch, srun, the harness) needs to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def save(self) -> None:
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        tmp = self.root / "cluster.json.tmp"
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.root / "cluster.json")

    @classmethod
    def load(cls, root: Path) -> Cluster:
        data = json.loads((root / "cluster.json").read_text())
        return cls(**{**data, "root": Path(data["root"])})

    # -- nodes -------------------------------------------------------------------------------------------------
    def slurmd_pid(self, node: str) -> int | None:
        return _pid(self.root / "run" / f"slurmd-{node}.pid")

    def pids(self, node: str) -> list[int]:
        """Every process running on node (its network namespace): slurmd, slurmstepd, a job's ranks."""
        out = _run("ip", "netns", "pids", self.netns(node), check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL every process of node, slurmd included, as a node that loses power; returns their pids."""
        pids = self.pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def states(self) -> dict[str, str]:
        """Slurm's state of each node (idle, alloc, down*, ...)."""
        out = _run("sinfo", "-h", "-N", "-o", "%N %t", env=self.env(), check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def up(root: Path, count: int, cpus: int | None = None, timeout: float = 90, gpus: int = 0) -> Cluster:
    """Start a cluster of `count` nodes under root (which must not exist or be empty); on failure, removes what it
    made and raises ClusterError."""
    if os.geteuid() != 0:
        raise ClusterError("a local cluster needs root (network namespaces, a bridge, slurmd)")
    if lacking := missing():
        raise ClusterError(f"missing programs: {', '.join(lacking)} (Debian: slurm-wlm munge iproute2 util-linux)")
    if count < 1:
        raise ClusterError(f"nodes: {count}; accepted: 1 or more")
    if gpus < 0:
        raise ClusterError(f"gpus={gpus}; accepted: 0 or more GPUs per node")
    if root.exists() and any(root.iterdir()):
        raise ClusterError(f"{root} is not empty (a cluster already there? `down --root {root}` first)")
    for sub in ("munge", "state", "run", "log", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    (root / "spool").chmod(0o755)
    c = Cluster(root=root.resolve(), ident=secrets.token_hex(2), subnet=str(_free_subnet()),
                login=socket.gethostname().split(".")[0], nodes=[f"node{i + 1}" for i in range(count)],
                cpus=cpus or os.cpu_count() or 1, gpus=gpus)
    c.save()
    try:
        _start(c, timeout)
    except BaseException:
        down(c.root)
        raise
    return c


def _start(c: Cluster, timeout: float) -> None:
    """munged, the bridge, and each node's namespace on it; then the Slurm daemons (_start_slurm)."""
    munge = c.root / "munge"
    key = munge / "munge.key"
    _run("mungekey", "--create", f"--keyfile={key}")
    key.chmod(0o600)
    _run("munged", "--force", f"--socket={munge}/munge.socket", f"--key-file={key}", f"--pid-file={munge}/munged.pid",
         f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed")
    c.created["pids"]["munged"] = _pid(munge / "munged.pid")
    c.save()

    _run("ip", "link", "add", c.bridge, "type", "bridge")
    c.created["links"].append(c.bridge)
    c.save()
    _run("ip", "addr", "add", f"{c.bridge_address}/24", "dev", c.bridge)
    _run("ip", "link", "set", c.bridge, "up")
    (c.root / "hosts").write_text(hosts(c))
    for i, node in enumerate(c.nodes):
        ns, host_end = c.netns(node), f"rhc{c.ident}v{i}"
        _run("ip", "netns", "add", ns)
        c.created["netns"].append(ns)
        _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        c.created["links"].append(host_end)
        c.save()
        _run("ip", "link", "set", host_end, "master", c.bridge)
        _run("ip", "link", "set", host_end, "up")
        _run("ip", "-n", ns, "addr", "add", f"{c.address(i)}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
    _start_slurm(c, timeout)


def _start_slurm(c: Cluster, timeout: float) -> None:
    """slurmctld on this host, then each node's slurmd in its namespaces; waits until every node has registered."""
    if c.gpus:
        for node in c.nodes:
            (c.root / "dev" / node).mkdir(parents=True)
            for i in range(c.gpus):  # Slurm takes only a character device; /dev/null's numbers: inert
                os.mknod(c.root / "dev" / node / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (c.root / "gres.conf").write_text(gres_conf(c))  # slurm.conf's folder: where Slurm looks for it
    c.conf.write_text(slurm_conf(c, free_port("0.0.0.0"), free_port("0.0.0.0")))
    env = c.env()
    proc = _run("slurmctld", "-f", str(c.conf), env=env, check=False)
    c.created["pids"]["slurmctld"] = _pid(c.root / "run" / "slurmctld.pid")
    c.save()
    if proc.returncode != 0:
        raise ClusterError(f"slurmctld did not start: {proc.stderr.strip()}\n{_tail(c.root / 'log/slurmctld.log')}")
    for node in c.nodes:
        # the node's own hostname and /etc/hosts, in mount and UTS namespaces of its own inside its network one;
        # slurmd daemonizes, and everything it starts (slurmstepd, the ranks) stays in those namespaces
        script = (f"hostname {node} && mount --bind {c.root / 'hosts'} /etc/hosts && "
                  f"exec {which('slurmd')} -f {c.conf}")
        # nsenter joins the network namespace only (`ip netns exec` would also remount /sys, hiding the cgroup
        # file system slurmd reads)
        (c.root / "spool" / node).mkdir(mode=0o755)
        proc = _run("nsenter", f"--net=/run/netns/{c.netns(node)}", "unshare", "--uts", "--mount", "--propagation",
                    "private", "sh", "-c", script, env=env, check=False)
        c.created["pids"][f"slurmd-{node}"] = c.slurmd_pid(node)
        c.save()
        if proc.returncode != 0:
            raise ClusterError(f"slurmd on {node} did not start: {proc.stderr.strip()}\n"
                               f"{_tail(c.root / 'log' / f'slurmd-{node}.log')}")
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = c.states()
        if len(states) == len(c.nodes) and all(s in ("idle", "mix", "alloc") for s in states.values()):
            return
        time.sleep(1)
    raise ClusterError(f"the nodes did not all register within {timeout:.0f} s (sinfo: {c.states()})\n"
                       f"{_tail(c.root / 'log/slurmctld.log')}")


def down(root: Path) -> None:
    """Stop everything the cluster under root started and remove what it created, root included. Safe to call
    on a cluster that is half up, or already down."""
    try:
        c = Cluster.load(root)
    except (OSError, ValueError, TypeError):
        shutil.rmtree(root, ignore_errors=True)
        return
    if c.conf.exists():
        _run("scontrol", "shutdown", env=c.env(), check=False)
    nodes = [n for n in c.nodes if c.netns(n) in c.created["netns"]]
    deadline = time.time() + 10
    while nodes and time.time() < deadline:  # a node's processes (slurmd, steps, ranks) end with it; killed again
        nodes = [n for n in nodes if c.kill_node(n)]  # until none is left, as slurmd may fork one meanwhile
        time.sleep(0.1 if nodes else 0)
    terminate([p for p in c.created["pids"].values() if p], 10)
    for ns in c.created["netns"]:
        _run("ip", "netns", "del", ns, check=False)
    for link in reversed(c.created["links"]):  # veth ends went with their namespaces; the bridge last
        _run("ip", "link", "del", link, check=False)
    for _ in range(50):  # a process that was exiting may still have added a file while the tree was removed
        shutil.rmtree(c.root, ignore_errors=True)
        if not c.root.exists():
            break
        time.sleep(0.1)


def leftovers(ident: str) -> list[str]:
    """Anything of cluster `ident` still on this machine (namespaces, links): empty after a clean `down`."""
    ns = _run("ip", "netns", "list", check=False).stdout
    links = _run("ip", "-o", "link", "show", check=False).stdout
    return [w.rstrip(":").split("@")[0] for w in (ns + links).split() if f"rhc{ident}" in w or f"rhc-{ident}" in w]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="local-cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down", "status", "kill-node"))
    p.add_argument("arg", nargs="?", help="up: the number of nodes; kill-node: the node")
    p.add_argument("settings", nargs="*", help="up: gpus=G (stand-in GPUs per node, as generic resources)")
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    p.add_argument("--cpus", type=int, default=None, help="CPUs each node declares (default: this machine's)")
    args = p.parse_args(argv)
    try:
        if args.action == "up":
            if not (args.arg or "").isascii() or not (args.arg or "").isdigit():
                print(f"error: up needs a number of nodes, got {args.arg!r}", file=sys.stderr)
                return 2
            gpus = 0
            for setting in args.settings:
                name, _, value = setting.partition("=")
                if name != "gpus":
                    print(f"error: {setting!r}: accepted after the number of nodes: gpus=G", file=sys.stderr)
                    return 2
                if not (value.isascii() and value.isdigit() and 0 < int(value) <= 64):
                    print(f"error: gpus={value}: accepted: a whole number of GPUs per node from 1 to 64",
                          file=sys.stderr)
                    return 2
                gpus = int(value)
            c = up(args.root, int(args.arg), args.cpus, gpus=gpus)
            gpu_text = f", {c.gpus} stand-in GPUs each" if c.gpus else ""
            print(f"# {len(c.nodes)} nodes up ({', '.join(c.nodes)}{gpu_text}; {c.subnet}); down: local-cluster.sh "
                  "down", file=sys.stderr)
            print(f"export SLURM_CONF={c.conf}")
        elif args.settings:
            print(f"error: {args.settings[0]!r}: settings are for up", file=sys.stderr)
            return 2
        elif args.action == "down":
            down(args.root)
        elif args.action == "status":
            c = Cluster.load(args.root)
            for node, state in c.states().items():
                print(f"{node} {state} {c.address(c.nodes.index(node))} processes={len(c.pids(node))}")
        else:
            c = Cluster.load(args.root)
            if args.arg not in c.nodes:
                print(f"error: node {args.arg!r}; accepted: {', '.join(c.nodes)}", file=sys.stderr)
                return 2
            print(f"killed {len(c.kill_node(args.arg))} processes on {args.arg}", file=sys.stderr)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError:
        print(f"error: no cluster under {args.root} (up first)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
