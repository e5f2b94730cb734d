"""A real single-node Slurm for the tests: munged with its own key and socket, slurmctld and slurmd on this host,
all state under one temporary folder, stopped afterwards. The recipe of /work/shared/FACTS.md (Slurm 22.05 from
Debian): no cgroups (proctrack/linuxproc, task/none), select/cons_tres CR_Core, no accounting."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue")
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin")


def which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def missing() -> list[str]:
    return [b for b in BINARIES if which(b) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(root: Path, host: str, cpus: int) -> str:
    return "\n".join([
        "ClusterName=rhtest",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        f"NodeName={host} CPUs={cpus} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@contextmanager
def slurm_cluster(root: Path, cpus: int = 2):
    """Start munged + slurmctld + slurmd under root; yields the environment clients need (SLURM_CONF)."""
    host = socket.gethostname().split(".")[0]
    munge = root / "munge"
    for d in (munge, root / "state", root / "spool"):
        d.mkdir(parents=True, mode=0o700)
    key = munge / "munge.key"
    subprocess.run([which("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o600)
    subprocess.run([which("munged"), "--force", f"--socket={munge}/munge.socket", f"--key-file={key}",
                    f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                    f"--seed-file={munge}/munged.seed"], check=True, capture_output=True)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, host, cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        subprocess.run([which("slurmctld"), "-f", str(conf)], check=True, capture_output=True, env=env)
        subprocess.run([which("slurmd"), "-f", str(conf)], check=True, capture_output=True, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:  # the node registers with the controller
            out = subprocess.run([which("sinfo") or "sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                                 env=env, check=False).stdout.strip()
            if out in ("idle", "mix", "alloc"):
                break
            time.sleep(1)
        else:
            log = (root / "slurmctld.log").read_text()[-2000:] if (root / "slurmctld.log").exists() else ""
            raise RuntimeError(f"slurm node did not become idle (sinfo: {out!r})\n{log}")
        yield env
    finally:
        subprocess.run([which("scontrol") or "scontrol", "shutdown"], capture_output=True, env=env, check=False,
                       timeout=30)
        for pidfile in (root / "slurmd.pid", root / "slurmctld.pid", munge / "munged.pid"):
            pid = _pid(pidfile)
            for _ in range(50):
                if pid is None:
                    break
                try:
                    os.kill(pid, signal.SIGTERM if _ < 40 else signal.SIGKILL)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
