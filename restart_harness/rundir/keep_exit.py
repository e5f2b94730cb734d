"""The process py-spy starts for a sampled launch (rundir/sampling.py): it runs the launch and writes its exit code to
$RH_LAUNCH_EXIT_FILE, since py-spy exits 0 whatever its command did. Python, not `sh`: py-spy stops once no Python
process of its tree runs and kills its child, which a `sh` wrapper could be between its child's exit and its own write
(seen on a loaded machine). Run as `python -I -S keep_exit.py LAUNCH...`: only os, signal and sys."""

import os
import signal
import sys


def wait(pid: int) -> int:
    """Named `wait` so that the attribution reads this process as a launcher waiting on its child (results/causes.py)."""
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return 128 - code if code < 0 else code  # a signal's death as a shell gives it: 128 + the signal


def main(launch: list[str]) -> int:
    # Python ignores SIGPIPE and SIGXFSZ; the launch gets them back at their defaults, as a shell would start it
    try:
        pid = os.posix_spawnp(launch[0], launch, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except OSError as exc:
        print(f"{launch[0]}: {exc.strerror}", file=sys.stderr)
        code = 127  # a shell's code for a command it could not run
    else:
        code = wait(pid)
    with open(os.environ["RH_LAUNCH_EXIT_FILE"], "x") as f:
        f.write(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
