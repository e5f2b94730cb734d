"""Rank entry point. The process-start timestamp is taken before any heavy import."""

import time

PROCESS_START = time.time()

if __name__ == "__main__":
    from restart_harness import rank_env

    rank_env.fill()  # torchrun / srun / mpiexec: the variables DeepSpeed's launcher would have set
    from restart_harness.worker.main import end_process, main

    end_process(main(PROCESS_START))  # an error raises out of main: its traceback, and the interpreter's own exit
