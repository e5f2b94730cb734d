"""What the benchmarks share: their command line, a run through `./submit-job.sh` and restart-only re-runs of it, the
rounds' order, and medians, spreads and tables of what the repeats measured."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from restart_harness.files.baseline import BLOCK_BYTES, CEILING_QUEUE_DEPTH, CEILING_REQUEST_BYTES

REPO = Path(__file__).resolve().parents[1]
MIB, GIB = 1 << 20, 1 << 30
# fio's cold reads of the files a restart read (fio_read): the storage baseline's shape and its ceiling's
FIO = {"fio buffered, the baseline's shape": (BLOCK_BYTES, ("--ioengine=psync", "--direct=0")),
       "fio O_DIRECT, the ceiling's shape": (CEILING_REQUEST_BYTES, ("--ioengine=libaio", "--direct=1",
                                                                    f"--iodepth={CEILING_QUEUE_DEPTH}"))}


def die(message: str) -> None:
    """Bad input: one line, exit 2, before anything is created or launched."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def words(default: int, *names: str, runs: bool = False,
          argv: list[str] | None = None) -> tuple[int, dict[str, str], list[str]]:
    """`[N] [NAME=value ...] [word ...]`: N (a leading whole number, else default; 1 or more), the NAME=value words
    of names, and the other words in order: a run's model and key=value words where `runs` (checked as a run spec
    would be), else none. Bad input dies (one line, exit 2) before the benchmark makes anything."""
    args = list(sys.argv[1:] if argv is None else argv)
    n = int(args.pop(0)) if args and args[0].isdigit() else default
    if n < 1:
        die(f"REPEATS {n}: accepted: a whole number of repeats, 1 or more")
    named = {k: v for k, eq, v in (a.partition("=") for a in args) if eq and k in names}
    rest = [a for a in args if a.partition("=")[0] not in named]
    accepted = f"accepted: [REPEATS]{''.join(f' [{k}=...]' for k in names)}{' [MODEL] [key=value ...]' if runs else ''}"
    if rest and not runs:
        die(f"{' '.join(rest)}: {accepted}")
    if rest:
        from restart_harness.command import parse_args
        from restart_harness.errors import UsageError

        try:
            parse_args(rest if "=" not in rest[0] else ["tiny", *rest])
        except UsageError as exc:
            die(f"{exc} ({accepted})")
    return n, named, rest


def submitted(tokens: list[str], check: bool = True, python: str | None = None, env: dict | None = None) -> Path | None:
    """`./submit-job.sh TOKENS` (or config-n-run.py with python, the environment updated with env): the run's folder
    (the last line it prints). A failed run ends the benchmark with its error (check) or is said on stderr and is
    None: the rounds go on, and the tables leave it out."""
    cmd = [python, str(REPO / "config-n-run.py")] if python else [str(REPO / "submit-job.sh")]
    proc = subprocess.run([*cmd, *tokens], capture_output=True, text=True, check=False,
                          env={**os.environ, **env} if env else None)
    if proc.returncode != 0:
        if check:
            sys.exit(f"{' '.join(tokens)} failed: {proc.stderr.strip()[-600:]}")
        print(f"{' '.join(tokens)} failed: {proc.stderr.strip()[-600:]}", file=sys.stderr, flush=True)
        return None
    return Path(proc.stdout.strip().splitlines()[-1])


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def restarted(run: Path, keys: list[str], **how) -> dict:
    """One restart-only re-run of run (`restart run=RUN KEYS`; how: submitted's python= and env=): its record."""
    submitted(["restart", f"run={run}", *keys], **how)
    return summary(run)["restart"]


def recorded(out: Path, repeats: int, plan: list[tuple[str, str, list[str], object]], check: bool = True,
             cases: dict | None = None) -> None:
    """REPEATS rounds of plan's runs in order, each (folder, what, tokens, case) said on stderr and run into
    out/FOLDER; out/cases.json names each run's case where it has one (cases: those named before)."""
    cases = {} if cases is None else cases
    for r in range(repeats):
        for folder, what, tokens, case in plan:
            print(f"[round {r + 1}] {what}", file=sys.stderr, flush=True)
            if (run := submitted([*tokens, f"results_dir={out / folder}"], check=check)) and case is not None:
                cases[str(run)] = case
                (out / "cases.json").write_text(json.dumps(cases, indent=1))


def rotated(items: list, n: int) -> list:
    """Round n's order of items: rotated every round, so that none always follows another."""
    return items[n % len(items):] + items[:n % len(items)]


def scratch(prefix: str) -> tempfile.TemporaryDirectory:
    """A new temporary folder (its path as text), removed with what is in it at the end."""
    return tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True)


@contextlib.contextmanager
def object_store(name: str, memory_mib: int) -> Iterator:
    """A local RADOS Gateway (testbeds/ceph_s3.py, in /tmp/NAME-PID) with the bucket `bench`; its AWS_* settings go to
    every run through the environment. Stopped at the end."""
    from testbeds import ceph_s3

    server = ceph_s3.start(Path(f"/tmp/{name}-{os.getpid()}"), memory_mib=memory_mib)
    try:
        server.create_bucket("bench")
        os.environ.update(server.environment())
        yield server
    finally:
        ceph_s3.stop(server.root)


def median(values: list[float | None]) -> float | None:
    """The median of the values measured (None: not measured)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values: list[float | None], form: str = ".2f", to: str = "-") -> str:
    """median (min-max) of the repeats' values, each in form."""
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):{form}} ({min(values):{form}}{to}{max(values):{form}})" if values else "-"


def table(head: list[str], rows, align: str = "") -> None:
    """A Markdown table: the head's cells, then each row's; align: a column's `l` or `r` (default: every one `l`)."""
    print("| " + " | ".join(head) + " |")
    print("|" + "".join("---:|" if a == "r" else "---|" for a in align or "l" * len(head)))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")


def median_table(first: str, columns: tuple[str, ...], rows: dict[str, list[dict[str, float]]]) -> None:
    """A markdown table: per row label, each column's median over the rounds' figures."""
    table([first, *columns], ([label, *(f"{statistics.median(r[c] for r in rounds):.2f}" for c in columns)]
                              for label, rounds in rows.items()), "l" + "r" * len(columns))


def measure_then_evaluate(measure: Callable[[Path, int], None], evaluate: Callable[[Path], None], repeats: int,
                          out: str) -> None:
    """`python -m benchmarks.X [REPEATS] [out=DIR] [reuse=true]`: measure REPEATS rounds into DIR (reuse=true: the
    runs already there), then evaluate them."""
    repeats, named, _ = words(repeats, "out", "reuse")
    folder = Path(named.get("out", out))
    if named.get("reuse") != "true":
        measure(folder, repeats)
    evaluate(folder)


def read_files(run: Path, latest: dict) -> dict[int, list[Path]] | None:
    """The files of 1 MiB or more each rank read in the restart `latest`, by rank; None without fio or a local
    checkpoint folder."""
    root = Path(summary(run)["checkpoint"].get("root") or "")
    if shutil.which("fio") is None or not root.is_dir():
        return None
    out: dict[int, list[Path]] = {}
    for f in (latest.get("load_breakdown") or {}).get("files") or []:
        if f["read_bytes"] >= 1 << 20 and (root / f["path"]).is_file():
            out.setdefault(f["rank"], []).append(root / f["path"])
    return out or None


def fio_read(files: dict[int, list[Path]], shape: tuple[int, tuple[str, ...]], hold_bytes: int = 0
             ) -> tuple[int, float, int]:
    """fio's cold read of files (read-only), a chain of jobs a rank, one a file, each waiting for the one before, the
    ranks at once, each job holding hold_bytes of memory locked (at most half the free memory over the jobs), as a rank
    holds its own (fio's lockmem: a small process's fresh buffers land on scattered 4 KiB pages, which cut each O_DIRECT
    request short on a virtio disk, half the pace on this project's machine; docs/benchmarks.md, nineteenth session):
    (all jobs' bytes, the slowest rank's runtime in seconds, the files' bytes). fio reads whole requests, so a file's
    tail short of one is left out (a request is at most the file)."""
    from restart_harness.files import pagecache

    request, options = shape
    jobs = []
    for rank, paths in files.items():
        for k, p in enumerate(paths):
            jobs += [f"--name=r{rank}f{k}", f"--filename={str(p).replace(':', chr(92) + ':')}",
                     f"--bs={min(request, p.stat().st_size // 4096 * 4096)}",
                     *([f"--wait_for=r{rank}f{k - 1}"] if k else [])]
    # at most half the free memory, over the jobs (each locks its own)
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    hold = min(hold_bytes, free // 2 // sum(map(len, files.values())))
    options = (*options, f"--lockmem={hold // MIB}M") if hold >= MIB else options
    pagecache.prepare([p for ps in files.values() for p in ps], "drop")
    proc = subprocess.run(["fio", "--readonly", "--rw=read", "--output-format=json", *options, *jobs],
                          capture_output=True, text=True, check=True, timeout=600)
    done = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"]
    seconds = {r: sum(j["job_runtime"] for j in done if j["jobname"].startswith(f"r{r}f")) / 1000 for r in files}
    return (sum(j["read"]["io_bytes"] for j in done), max(seconds.values()),
            sum(p.stat().st_size for ps in files.values() for p in ps))
