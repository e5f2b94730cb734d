"""launcher=prefork's forking process (launchers/prefork.py): it imports the training stack's libraries, then forks
this node's ranks (worker/main.py), each with its rank variables, and waits; a rank that ends with an error ends the
others (as srun --kill-on-bad-exit does), and the launch exits with its code."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback


def main(argv: list[str]) -> int:
    """`python -m restart_harness.worker.forker N WORKER_ARGS...`: import, fork N ranks, wait for them."""
    start = time.time()  # every rank's process start: before the imports they share
    ranks, worker_args = int(argv[0]), argv[1:]
    from restart_harness import resolve
    from restart_harness.worker.main import RankJob, end_process
    from restart_harness.worker.main import main as worker_main

    job = RankJob.parse(worker_args)
    resolve.read(job.run_dir, job.record).stack.imports(later=True)
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_SIZE=str(ranks),
                                  CROSS_RANK="0", CROSS_SIZE="1")
                code = worker_main(start, worker_args, forked=True)  # rank 0's imports phase counts this process's I/O
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - a forked child never returns into the loop; its log has the error
                traceback.print_exc()
            finally:
                end_process(code)
        children[pid] = rank

    def end_all(signum=None, frame=None):
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if signum is not None:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end_all)
    worst = 0
    while children:
        pid, status = os.wait()
        if children.pop(pid, None) is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says it
        if code and not worst:  # the first rank to fail ends the others
            worst = code
            end_all()
    return worst


if __name__ == "__main__":
    from restart_harness.worker.main import end_process

    end_process(main(sys.argv[1:]))  # this process never builds a model, opens a checkpoint or joins a group
