"""launcher=prefork: one Python process imports the training stack's libraries, then forks the ranks on this node.

A rank's process start is the forking process's start: its `imports` phase is that one process's imports, paid once
for the node instead of once per rank on shared cores. It is the cheapest way to start ranks here (per rank, a fork
instead of an interpreter importing torch and DeepSpeed: measured in docs/testing.md), and the shape of a
restart whose ranks are started from a process that had its libraries loaded before it forked (a zygote or a warm
standby), beside the launchers that start every rank from nothing. The forked ranks are fresh processes in what
matters to a restart: the forking process never builds a model or touches a checkpoint, and a phase's launch starts
a new one.

Like DeepSpeed's launcher it sets RANK, LOCAL_RANK, WORLD_SIZE, CROSS_RANK, CROSS_SIZE and LOCAL_SIZE itself. A rank
that ends with an error ends the others (as srun --kill-on-bad-exit does), and the launch exits with its code."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time

from restart_harness.errors import UsageError
from restart_harness.launchers.base import Launcher

MODULE = "restart_harness.launchers.prefork"


class PreforkLauncher(Launcher):
    name = "prefork"
    description = ("one process imports the stack's libraries, then forks the ranks on this node (the cheapest start; "
                   "the imports are paid once for the node)")
    subset = True
    port_here = True
    forks_ranks = True

    def preflight(self) -> None:
        spec = self.spec
        if spec.across_nodes:
            raise UsageError(f"nodes={spec.nodes} with launcher=prefork: it forks ranks on this node only; accepted: "
                             "nodes=1, or launcher=slurm|pbs for several nodes")
        super().preflight()

    def rank_command(self, port: int, args: list[str]) -> list[str]:
        return [sys.executable, "-m", MODULE, str(self.spec.launched_ranks), *args]

    def script_lines(self, port: int) -> list[str]:
        return ["export MASTER_ADDR=127.0.0.1", f"export MASTER_PORT={port}"]


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says it


def _rank(rank: int, ranks: int, start: float, argv: list[str]) -> int:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_SIZE=str(ranks),
                      CROSS_RANK="0", CROSS_SIZE="1")
    from restart_harness.worker.main import main as worker_main

    return worker_main(start, argv, forked=True)  # rank 0's imports phase counts this process's I/O


def main(argv: list[str]) -> int:
    """`python -m restart_harness.launchers.prefork N WORKER_ARGS...`: import, fork N ranks, wait for them."""
    start = time.time()  # every rank's process start: before the imports they share
    ranks, worker_args = int(argv[0]), argv[1:]
    from restart_harness import stacks
    from restart_harness.spec import run as resolved
    from restart_harness.worker.main import RankJob

    job = RankJob.parse(worker_args)
    stack = stacks.of(resolved.read(job.run_dir, job.record).spec)
    stack.imports()
    for module in stack.later_imports:
        importlib.import_module(module)
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _rank(rank, ranks, start, worker_args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - a forked child never returns into the loop; its log has the error
                import traceback

                traceback.print_exc()
            finally:
                from restart_harness.worker.main import end_process

                end_process(code)
        children[pid] = rank

    def end_all(signum=None, frame=None):
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if signum is not None:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end_all)
    worst = 0
    while children:
        pid, status = os.wait()
        if pid not in children:
            continue
        children.pop(pid)
        code = _exit_code(status)
        if code and not worst:  # the first rank to fail ends the others
            worst = code
            end_all()
    return worst


if __name__ == "__main__":
    from restart_harness.worker.main import end_process

    end_process(main(sys.argv[1:]))  # this process never builds a model, opens a checkpoint or joins a group
