"""The files a local Slurm cluster's daemons read (testbeds/slurm_cluster.py writes them under its root): slurm.conf,
gres.conf for its stand-in GPUs, and the nodes' /etc/hosts. Each takes the cluster's description (its Cluster)."""

from __future__ import annotations

PARTITION = "debug"


def slurm_conf(c, ctl_port: int, d_port: int) -> str:
    lines = [
        "# a local cluster of network namespaces (testbeds/slurm_cluster.py), generated",
        "ClusterName=rhlocal",
        f"SlurmctldHost={c.login}({c.bridge_address})",
        f"SlurmctldPort={ctl_port}",
        f"SlurmdPort={d_port}",  # one port: every node has its own network namespace
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={c.root}/munge/munge.socket",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={c.root}/state",
        f"SlurmdSpoolDir={c.root}/spool/%n",
        f"SlurmctldPidFile={c.root}/run/slurmctld.pid",
        f"SlurmdPidFile={c.root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={c.root}/log/slurmctld.log",
        f"SlurmdLogFile={c.root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",  # no cgroups
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none", "MpiDefault=none", "ReturnToService=2", "SchedulerType=sched/backfill",
        "SlurmdTimeout=20",  # a node that stops answering is marked down within about 30 s
        "KillWait=5", "InactiveLimit=0",
        *(["GresTypes=gpu"] if c.gpus else []),
        *(f"NodeName={n} NodeAddr={c.address(i)} CPUs={c.cpus}" + (f" Gres=gpu:{c.gpus}" if c.gpus else "")
          + " State=UNKNOWN" for i, n in enumerate(c.nodes)),
        f"PartitionName={PARTITION} Nodes={','.join(c.nodes)} Default=YES MaxTime=INFINITE State=UP"]
    return "\n".join(lines) + "\n"


def gres_conf(c) -> str:
    """Each node's GPUs: stand-in device files, declared by hand (no NVML autodetection: there is no driver)."""
    devices = f"nvidia[0-{c.gpus - 1}]" if c.gpus != 1 else "nvidia0"
    lines = ["# stand-in GPUs of a local cluster (testbeds/slurm_cluster.py), generated", "AutoDetect=off"]
    lines += [f"NodeName={n} Name=gpu File={c.root}/dev/{n}/{devices}" for n in c.nodes]
    return "\n".join(lines) + "\n"


def hosts(c) -> str:
    """Each node's /etc/hosts (bind-mounted in its mount namespace): the nodes and the login node by name."""
    lines = ["127.0.0.1 localhost", f"{c.bridge_address} {c.login}"]
    lines += [f"{c.address(i)} {n}" for i, n in enumerate(c.nodes)]
    return "\n".join(lines) + "\n"
