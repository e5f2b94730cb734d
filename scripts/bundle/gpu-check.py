#!/usr/bin/env python3
"""Check every checkpoint engine on one GPU node, offline, within a time limit, from the folder
scripts/bundle/gpu-check-folder.py made (docs/clusters.md, "The GPU check in one offline command"):

    python3 FOLDER/gpu-check.py --out "$OUT" [--time-limit 600] [--work /tmp/rh-gpu-check] [--big 3B|none]

Its steps in order, OUT/results.tar.gz (rewritten after every case, never a checkpoint) and OUT's files:
docs/clusters.md. Exit 0: every case that could run verified and nothing was cut off; 1 otherwise; 2: bad input.
Standard library only: it runs with the image's Python before anything is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESERVE_SECONDS = 30  # kept back from the time limit: stop what runs, pack, write the last lines
STOP_GRACE_SECONDS = 20  # after SIGTERM, before every process of the command is killed
OUT_FILES_MAX = 8  # what a device call brings back
START = time.monotonic()


# gpu-check-parts.py, beside this file in the folder (and in scripts/bundle/), loaded by its path
_spec = importlib.util.spec_from_file_location("gpu_check_parts", HERE / "gpu-check-parts.py")
parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parts)
older, extract_deb = parts.older, parts.extract_deb


class Check:
    def __init__(self, a):
        self.a, self.out, self.work = a, a.out, a.work
        self.deadline = START + a.time_limit - min(RESERVE_SECONDS, a.time_limit / 4)
        self.log = open(self.out / "check.log", "a", buffering=1)  # noqa: SIM115 - open for the whole check
        self.env, self.py = dict(os.environ), a.python
        self.cut = self.failed = self.datastates_built = False
        self.reported: set[str] = set()

    # ---- plumbing --------------------------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        text = f"[gpu-check +{time.monotonic() - START:.0f}s] {line}"
        self.log.write(text + "\n")
        print(text, file=sys.stderr, flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, cmd: list[str], log: Path, env: dict | None = None, each=None, echo: bool = True,
            cwd: Path | None = None) -> int | None:
        """cmd in a session of its own, its output appended to log (after the command line where `echo`), each()
        every 2 s while it runs, stopped at the deadline (None: it was)."""
        with open(log, "a") as f:
            if echo:
                f.write(f"$ {shlex.join(cmd)}\n")
                f.flush()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env or self.env, cwd=cwd,
                                    start_new_session=True)
            while True:
                try:
                    return proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    if each:
                        each()
                    if self.left() <= 0:
                        self.stop(proc)
                        return None

    def submit(self, tokens: list[str], log: str, folder: Path, records: str = "", each=None) -> int | None:
        """submit-job.sh with tokens, its output in OUT/log; the results packed whenever a record matching
        `records` under folder is (re)written, then each(record). None: stopped at the time limit."""
        seen: dict[Path, float] = {}

        def changed() -> None:
            for record in folder.glob(records) if records else ():
                if seen.get(record) != record.stat().st_mtime:
                    seen[record] = record.stat().st_mtime
                    self.pack()
                    if each:
                        each(record)

        code = self.run([str(self.work / "project/submit-job.sh"), *tokens], self.out / log, each=changed, echo=False)
        changed()
        return code

    def stop(self, proc: subprocess.Popen) -> None:
        """SIGTERM to the command's process group (the harness records its run as interrupted and the matrix as
        failed, ending its ranks; not SIGINT, which a job started with & by a non-interactive shell ignores), then
        every process of its session is killed."""
        self.cut = True
        self.say(f"time limit: stopping {Path(proc.args[0]).name} (pid {proc.pid}); what ended is packed")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        # the shell of submit-job.sh ends at once on SIGTERM: wait for the harness under it to record its end
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while parts.session_members(proc.pid, live=True) and time.monotonic() < deadline:
            proc.poll()
            time.sleep(0.2)
        for pid in parts.session_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()

    def pack(self) -> None:
        """OUT/results.tar.gz: everything under WORK/results but checkpoints, written whole or not at all."""
        results = self.work / "results"
        if not results.is_dir():
            return
        tmp = self.out / ".results.tar.gz.partial"
        for attempt in range(3):  # a file the stopped run was still replacing can vanish under tar: pack again
            try:
                with tarfile.open(tmp, "w:gz") as t:
                    t.add(results, arcname="results", filter=lambda i: parts.without_checkpoints(i, results.parent))
                return os.replace(tmp, self.out / "results.tar.gz")
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                self.say(f"packing the results failed ({exc}){'; packing again' if attempt < 2 else ''}")

    # ---- steps -----------------------------------------------------------------------------------------------------
    def node(self) -> None:
        lines = []
        versions = ("import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', "
                    "torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())")
        for cmd in (["nvidia-smi"], ["df", "-h", str(self.work), str(self.out)], ["nproc"], ["free", "-g"],
                    ["uname", "-r"], [self.py, "-c", versions], ["nvcc", "--version"], ["cmake", "--version"]):
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
                lines += [f"$ {shlex.join(cmd)}", proc.stdout.rstrip(), proc.stderr.rstrip()]
            except (OSError, subprocess.TimeoutExpired) as exc:
                lines += [f"$ {shlex.join(cmd)}", f"({exc})"]
        (self.out / "node.txt").write_text("\n".join(x for x in lines if x) + "\n")

    def installed(self, py: str, names: list[str]) -> dict[str, str | None]:
        code = ("import importlib.metadata as m, json, sys\nout = {}\nfor n in sys.argv[1:]:\n    try:\n"
                "        out[n] = m.version(n)\n    except m.PackageNotFoundError:\n        out[n] = None\n"
                "print(json.dumps(out))")
        proc = subprocess.run([py, "-c", code, *names], capture_output=True, text=True, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else dict.fromkeys(names)

    def install(self, manifest: dict) -> None:
        """What the node's Python lacks or has older, into a venv over its packages (or into its own venv)."""
        log = self.out / "install.log"
        (self.work / "project").mkdir(parents=True)
        with tarfile.open(HERE / "project.tar.gz") as t:
            t.extractall(self.work / "project", filter="data")
        torch_cuda = subprocess.run([self.py, "-c", "import torch; print(bool(torch.version.cuda))"],
                                    capture_output=True, text=True, check=False).stdout.strip()
        cuda = torch_cuda == "True" and shutil.which("nvcc") is not None
        roles = ["run", "analysis"] + (["cuda"] if cuda else [])
        wanted = [p for r in roles for p in manifest["packages"].get(r, [])]
        have = self.installed(self.py, [p["name"] for p in wanted] + ["restart-harness"])
        need = [p for p in wanted if older(have.get(p["name"]), p["version"])]
        self.say("the node's Python has " + (", ".join(f"{n} {v}" for n, v in have.items() if v) or "none of them")
                 + "; to install: " + (", ".join(f"{p['name']} {p['version']}" for p in need) or "nothing"))
        if need or not have.get("restart-harness"):
            self.py = self.environment()
            build = [p for p in manifest["packages"].get("build", [])
                     if older(self.installed(self.py, [p["name"]]).get(p["name"]), p["version"])]
            wheels = [str(HERE / p["file"]) for p in build + need if p["file"].endswith(".whl")]
            sdists = [str(HERE / p["file"]) for p in need if not p["file"].endswith(".whl")]
            pip = [self.py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
                   "--disable-pip-version-check"]
            for cmd, env in ((pip + wheels, None), (pip + sdists, {**self.env, "DS_BUILD_OPS": "0"}),
                             (pip + ["-e", str(self.work / "project")], None)):
                if cmd != pip and self.run(cmd, log, env=env) != 0:
                    self.failed = True
                    self.say(f"install failed: {shlex.join(cmd[-1:])} (OUT/install.log)")
                    return
        self.env["RH_PYTHON"] = self.py
        self.env["PATH"] = f"{Path(self.py).parent}:{self.env.get('PATH', '')}"  # ninja for DeepSpeed's JIT builds
        self.system_libraries()
        self.datastates(cuda)

    def environment(self) -> str:
        """A venv over the image's packages (its own venv where the image's Python is one already)."""
        real = subprocess.run([self.py, "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                              capture_output=True, text=True, check=False).stdout.strip()
        if real == "True":
            self.say(f"installing into the image's own venv ({self.py})")
            return self.py
        venv = self.work / "venv"
        subprocess.run([self.py, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        self.say(f"venv {venv} over the image's packages")
        return str(venv / "bin" / "python")

    def system_libraries(self) -> None:
        """libaio (DeepSpeed's async_io op) and liburing (DataStates-LLM): Debian's files, where the node lacks them."""
        sysroot = self.work / "sys"
        for deb in sorted((HERE / "debs").glob("*.deb")):
            extract_deb(deb, sysroot)
        probe = ("from engines import _async_io; print(_async_io.shortfall() or '')")
        why = subprocess.run([self.py, "-c", probe], capture_output=True, text=True, env=self.env,
                             cwd=self.work / "project", check=False).stdout.strip()
        if why:
            inc, lib = sysroot / "usr/include", next((sysroot / "usr/lib").glob("*-linux-gnu"), sysroot / "usr/lib")
            for var, path in (("CPATH", inc), ("LIBRARY_PATH", lib), ("LD_LIBRARY_PATH", lib)):
                self.env[var] = f"{path}:{self.env[var]}" if self.env.get(var) else str(path)
            self.say(f"libaio: {why}; using Debian's files carried ({inc}, {lib})")
        else:
            self.say("libaio: the node has it (DeepSpeed's async_io op can be built or loaded)")

    def datastates(self, cuda: bool) -> None:
        src = self.work / "datastates-llm"
        if not cuda:
            self.say("DataStates-LLM not built: this node's torch has no CUDA (engine=datastates is refused, "
                     "with the reason)")
            return
        if not (HERE / "datastates-llm.tar.gz").is_file():
            self.say("DataStates-LLM not carried: engine=datastates is refused, with the reason")
            return
        with tarfile.open(HERE / "datastates-llm.tar.gz") as t:
            t.extractall(self.work, filter="data")
        has_uring = subprocess.run(["cc", "-E", "-x", "c", "-"], input="#include <liburing.h>\n", capture_output=True,
                                   text=True, check=False).returncode == 0
        uring = [] if has_uring else ["--liburing", str(self.work / "sys" / "usr")]
        start = time.monotonic()
        code = self.run(["bash", str(self.work / "project/scripts/bundle/build-datastates.sh"), str(src), self.py,
                         *uring], self.out / "install.log")
        self.datastates_built = code == 0
        self.say(f"DataStates-LLM {'built' if code == 0 else 'NOT built'} in {time.monotonic() - start:.0f} s "
                 f"(exit {code}; OUT/install.log)")

    def matrix(self) -> None:
        folder = self.folder("matrix", 0)
        tokens = ["matrix", f"model={self.a.model}", f"engines={self.a.engines}", f"results_dir={folder}",
                  *shlex.split(self.a.matrix_args)]
        self.say(f"matrix: {shlex.join(tokens)} ({self.left():.0f} s left)")
        code = self.submit(tokens, f"matrix-{self.a.model}.log", folder, "matrix-*/matrix.json", self.report_cases)
        records = list(folder.glob("matrix-*/matrix.json"))
        cases = json.loads(records[0].read_text())["cases"] if records else []
        bad = [c["name"] for c in cases if not c["refused"] and not c.get("verified")]
        self.failed |= bool(bad) or code is None or not records
        self.say(f"matrix {ended(code)}: {sum(1 for c in cases if c.get('verified'))} verified, "
                 f"{sum(1 for c in cases if c['refused'])} refused, not verified: {', '.join(bad) or 'none'}")

    def folder(self, name: str, want: float) -> Path | None:
        """WORK/results/NAME for a step that needs about `want` seconds; None where less is left (said)."""
        if self.left() < want:
            self.say(f"{name} skipped: {self.left():.0f} s left, it needs about {want:.0f} s")
            return None
        (self.work / "results" / name).mkdir(parents=True, exist_ok=True)
        return self.work / "results" / name

    def ended(self, name: str, code: int | None, where: str) -> None:
        self.pack()
        self.failed |= code not in (0, None)
        self.say(f"{name} {ended(code)} ({where})")

    def compare(self) -> None:
        """The engines side by side in this benchmark's GPU form (gpu-check-parts.py compare_plan): its tables in
        WORK/results/compare/compare-MODEL.md, packed into the archive."""
        if folder := self.folder("compare", 300.0):
            cmd = parts.compare_plan(self.py, self.a.model, self.a.compare_repeats, self.datastates_built)
            self.say(f"compare: {shlex.join(cmd[2:])} ({self.left():.0f} s left)")
            code = self.run(cmd, folder / f"compare-{self.a.model}.md", env={**self.env, "TMPDIR": str(folder)},
                            cwd=self.work / "project")
            self.ended("compare", code, f"its tables: results/compare/compare-{self.a.model}.md in the archive")

    def attribution(self) -> None:
        """One sampled run per engine of --attribution-engines: each restart phase's causes on this node."""
        if folder := self.folder("attribution", 150.0):
            tokens = [self.a.model, f"engine={self.a.attribution_engines}", "attribution=python", "keep=false",
                      f"results_dir={folder}"]
            self.say(f"attribution: {shlex.join(tokens)} ({self.left():.0f} s left)")
            code = self.submit(tokens, f"attribution-{self.a.model}.log", folder)
            self.ended("attribution", code, f"OUT/attribution-{self.a.model}.log: its terminal's \"where the restart "
                       "went\"")

    def report_cases(self, record: Path) -> None:
        for c in json.loads(record.read_text())["cases"]:
            if "exit_code" in c and c["name"] not in self.reported:
                self.reported.add(c["name"])
                self.say(f"case {c['name']}: {'verified' if c.get('verified') else 'NOT verified'} "
                         f"(exit {c['exit_code']}, {c.get('seconds')} s){'; ' + c['error'] if c.get('error') else ''}")

    def big_fits(self) -> tuple[list[str], float | None] | None:
        """Before the matrix: does the big model's run fit this node's disk? (its tokens and predicted seconds a run),
        or None with the reason said: skipped, never failed half-way."""
        model = self.a.big
        tokens = [model, "iters=2", "save_interval=2", "after=1", "cache=drop", "keep=false"]
        # the largest run's checkpoint bytes and the first run's predicted wall seconds (or None), asked of the
        # harness's planner and predictor (campaigns/sweep.py estimate)
        code = ("import json, sys\nfrom restart_harness import machine, resolve\nfrom restart_harness.command import "
                "parse_args\nfrom restart_harness.campaigns.sweep import estimate\n"
                "tokens, engines = json.loads(sys.argv[1]), sys.argv[2:]\n"
                "print(json.dumps([estimate(resolve.plugins(machine.resolve(parse_args([*tokens, 'engine=' + e]))))\n"
                "                  for e in engines]))")
        proc = subprocess.run([self.py, "-c", code, json.dumps(tokens), *self.a.big_engines.split(",")],
                              capture_output=True, text=True, env=self.env, cwd=self.work / "project", check=False)
        if proc.returncode != 0:
            self.say(f"{model} skipped: the harness refuses it here: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
            return None
        estimates = json.loads(proc.stdout)
        need_bytes, seconds = max(b for _, b in estimates), estimates[0][0]
        free = shutil.disk_usage(self.work).free
        if need_bytes > free:
            self.say(f"{model} skipped: one checkpoint of it needs {need_bytes / 1e9:.1f} GB (the planner) and "
                     f"{self.work}'s file system has {free / 1e9:.1f} GB free; accepted: --work on a file system with "
                     f"{need_bytes / 1e9:.1f} GB free, or --big none")
            return None
        self.say(f"{model}: one checkpoint needs {need_bytes / 1e9:.1f} GB, {free / 1e9:.1f} GB free; it runs after "
                 "the matrix if the time left allows")
        return tokens, seconds

    def big(self, tokens: list[str], seconds: float | None) -> None:
        model, engines = tokens[0], self.a.big_engines.split(",")
        want = 1.2 * seconds if seconds else 180.0
        if self.left() < want:
            self.say(f"{model} skipped: {self.left():.0f} s left, a run needs about {want:.0f} s "
                     f"({'1.2 x the prediction' if seconds else 'no prediction: 180 s'}); accepted: a longer "
                     "--time-limit")
            self.cut = True
            return
        folder = self.work / "results" / "big"
        folder.mkdir(parents=True, exist_ok=True)
        tokens = [*tokens, f"engine={','.join(engines)}", f"results_dir={folder}"]
        self.say(f"{model}: {shlex.join(tokens)} ({self.left():.0f} s left, predicted {seconds or 0:.0f} s a run)")
        code = self.submit(tokens, f"big-{model}.log", folder, "sweep-*/sweep.json")
        self.failed |= code != 0
        self.say(f"{model} {ended(code)}")


def ended(code: int | None) -> str:
    return "stopped at the time limit" if code is None else f"ended (exit {code})"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole check (default 600)")
    p.add_argument("--work", type=Path, default=Path("/tmp/rh-gpu-check"))
    p.add_argument("--python", default=sys.executable, help="the node's Python with torch (default: this one)")
    p.add_argument("--model", default="small")
    p.add_argument("--engines", default="all")
    p.add_argument("--matrix-args", default="", help="more matrix keys, e.g. 'layouts=tp1-pp1-dp1'")
    p.add_argument("--big", default="3B", help="the model of the real-size run, or none")
    p.add_argument("--big-engines", default="default,lazy")
    p.add_argument("--compare-repeats", type=int, default=1, help="repeats of the engine comparison (0: none)")
    p.add_argument("--attribution-engines", default="default,lazy", help="engines of the sampled run, or none")
    a = p.parse_args(argv)
    if a.out is None:
        parts.fail("no --out and no $OUT; accepted: --out DIR, the folder the results go to")
    if not 30 <= a.time_limit <= 86400:
        parts.fail(f"--time-limit {a.time_limit:g}; accepted: 30 to 86400 seconds")
    if a.compare_repeats < 0:
        parts.fail(f"--compare-repeats {a.compare_repeats}; accepted: 0 (no comparison) or more")
    info = parts.whole(HERE)
    for flag, folder, gets in (("--out", a.out, f" (it gets at most {OUT_FILES_MAX} files)"), ("--work", a.work, "")):
        if folder.exists() and any(folder.iterdir()):
            parts.fail(f"{flag} {folder} is not empty; accepted: a new or empty folder{gets}")
    for folder in (a.out, a.work):
        folder.mkdir(parents=True, exist_ok=True)
    check = Check(a)
    check.say(f"folder {HERE} whole (project {info['project_commit'][:12]}, DataStates-LLM {info['datastates']}); "
              f"time limit {a.time_limit:.0f} s, {RESERVE_SECONDS} s of it kept to pack")
    check.node()
    check.install(info)
    big = check.big_fits() if a.big != "none" and not check.failed else None
    for step, wanted in ((check.matrix, True), (check.compare, a.compare_repeats),
                         (check.attribution, a.attribution_engines != "none")):
        if wanted and not check.failed and check.left() > 0:
            step()
    if big and check.left() > 0 and not check.cut:
        check.big(*big)
    elif big:
        check.say(f"{a.big} skipped: {'the time limit cut the matrix off' if check.cut else 'an earlier step failed'}")
    check.pack()
    files = sorted(f.name for f in a.out.iterdir())
    check.say(f"done: {'cut off at the time limit; ' if check.cut else ''}"
              f"{'something did not verify or failed; ' if check.failed else ''}OUT: {', '.join(files)}")
    return 1 if check.cut or check.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
