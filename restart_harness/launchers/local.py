"""launcher=local: DeepSpeed's own launcher (`deepspeed.launcher.runner`; `launcher=deepspeed` says the same). It
sets RANK, LOCAL_RANK, WORLD_SIZE and CROSS_RANK, CROSS_SIZE, LOCAL_SIZE, which DeepSpeed's newer checkpoint
writers read. On one node it spawns the ranks itself; inside a Slurm allocation with nodes > 1 it is DeepSpeed's
own multi-node launch without ssh: its slurm launcher over a host file of the allocation's first nodes."""

from __future__ import annotations

import subprocess
import sys

from restart_harness import SOURCE_ROOT, rank_env
from restart_harness.errors import UsageError
from restart_harness.launchers import _slurm
from restart_harness.launchers.base import WORKER_MODULE, Raw, exports


class DeepSpeedLauncher(_slurm.SpansAllocation):
    name = "local"
    aliases = ("deepspeed",)
    description = ("DeepSpeed's own launcher (deepspeed.launcher.runner) on this node; with nodes > 1 inside a Slurm "
                   "allocation, its slurm launcher over the allocation's nodes")

    def preflight(self) -> None:
        super().preflight()
        if not self.spec.across_nodes or self.spec.dry_run:
            return
        # DeepSpeed's multi-node slurm launch starts the worker as a script (it has no --module), which imports the
        # harness from wherever this Python finds it: it must be installed there, not only found from the checkout
        proc = subprocess.run([sys.executable, "-c", "import restart_harness"], cwd="/", capture_output=True,
                              check=False, timeout=60)
        if proc.returncode != 0:
            raise UsageError(f"launcher=local with several nodes: DeepSpeed's slurm launcher starts the ranks as a "
                             f"script, which needs the harness installed in {sys.executable} (pip install -e "
                             f"{SOURCE_ROOT}); accepted: install it, or launcher=torchrun or launcher=slurm")

    def launch(self, port: int, args: list[str]) -> tuple[list[str], list[str]]:
        spec = self.spec
        if spec.across_nodes:
            # DeepSpeed's slurm launcher runs `srun -n <ranks> python -u <script>`, setting no rank variables: the
            # worker takes Slurm's and is given as a script (that launcher has no --module)
            return [*exports({rank_env.VARIABLE: rank_env.encode(_slurm.RANK_VARIABLES)}),
                    *_slurm.RENDEZVOUS, f"export MASTER_ADDR MASTER_PORT={port}",
                    # DeepSpeed's host file: the allocation's first nodes, removed when the launch ends (a trap: the
                    # script does not exec the launcher)
                    'RH_HOSTFILE="$(mktemp "${TMPDIR:-/tmp}/rh-hostfile.XXXXXX")"',
                    "trap 'rm -f \"$RH_HOSTFILE\"' EXIT",
                    (f'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n {spec.nodes} '
                     f"| sed 's/$/ slots={spec.ranks_per_node}/' > \"$RH_HOSTFILE\"")], [
                sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", Raw('"$RH_HOSTFILE"'),
                "--launcher", "slurm", "--no_ssh_check", "--num_nodes", str(spec.nodes),
                "--master_addr", Raw('"$MASTER_ADDR"'), "--master_port", str(port),
                str(SOURCE_ROOT / "restart_harness" / "worker" / "__main__.py"), *args]
        return [], [sys.executable, "-m", "deepspeed.launcher.runner", "--num_nodes", "1", "--num_gpus",
                    str(spec.ranks_per_node), "--master_port", str(port), "--no_local_rank", "--module", WORKER_MODULE,
                    *args]
