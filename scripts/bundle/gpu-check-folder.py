#!/usr/bin/env python3
"""Make the folder that checks every engine on one GPU node in one offline command (docs/clusters.md, "The GPU check
in one offline command"); run it on a machine with network, carry the folder (at most 64 MiB) to the node, run there:

    python3 FOLDER/gpu-check.py --out "$OUT" [--time-limit 600]

    scripts/bundle/gpu-check-folder.py OUT_DIR --datastates TARBALL|DIR|none [--python 3.12] [--platform TAG ...]

    --datastates  DataStates-LLM's sources at the pinned commit (scripts/bundle/datastates-llm.pin): a .tar.gz of the
                  tree or the folder (checked as gather.sh checks them); none: the check refuses engine=datastates
    --python      the node's Python version, the wheels' (default 3.12: the H200 image of 2026-11-26)
    --platform    the node's wheel platforms (default manylinux 2.17 to 2.28 and linux, x86_64)

OUT_DIR gets: gpu-check.py (the command) and gpu-check-parts.py (its parts), wheels/ (scripts/bundle/gpu-check.txt's
packages for that Python, DeepSpeed as its source distribution), debs/ (Debian 12's libaio and liburing packages: the
async_io op's and DataStates-LLM's system libraries, carried as files), datastates-llm.tar.gz, project.tar.gz (git
archive of HEAD), gpu-check.json (what is carried, by role) and MANIFEST.sha256.
Bad input: one line, exit 2, OUT_DIR not made.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 64 << 20  # what a device call carries (the run tool's 64 MiB)
DEBS = ("libaio1", "libaio-dev", "liburing2", "liburing-dev")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def requirements(path: Path) -> list[tuple[str, str, str]]:
    """(role, name, version) of scripts/bundle/gpu-check.txt, in order."""
    return [(role, *spec.split("==")) for role, spec in (line.split() for line in path.read_text().splitlines()
                                                          if line.strip() and not line.startswith("#"))]


def file_of(folder: Path, name: str, version: str) -> Path | None:
    """The wheel or source distribution of name==version in folder (names normalized as wheels write them)."""
    for f in sorted(folder.iterdir()):
        m = re.match(r"(.+?)-(\d[^-]*?)(?:-|\.tar\.gz$)", f.name)
        if m and len({re.sub(r"[-_.]+", "_", n).lower() for n in (m.group(1), name)}) == 1 and m.group(2) == version:
            return f
    return None


def download(reqs, wheels: Path, python: str, platforms: tuple[str, ...], log) -> None:
    """The pinned packages alone (--no-deps: the list is the closure), binary for the node's Python and platform, in
    one resolution; DeepSpeed as its source distribution (it publishes no wheel)."""
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), "--disable-pip-version-check"]
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
              *[x for p in platforms for x in ("--platform", p)]]
    binary = [f"{n}=={v}" for _, n, v in reqs if n != "deepspeed"]
    source = [f"{n}=={v}" for _, n, v in reqs if n == "deepspeed"]
    for cmd in (base + target + binary, base + ["--no-binary", ":all:"] + source):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        log.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0:
            fail(f"pip download for Python {python} ({', '.join(platforms)}) failed: "
                 f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    for _, name, version in reqs:
        if file_of(wheels, name, version) is None:
            fail(f"{name}=={version}: pip downloaded no file of it for Python {python}")


def datastates(source: str, dest: Path) -> str | None:
    """DataStates-LLM's tree as dest (a .tar.gz of it), API-checked; the source's description, None for none."""
    if source == "none":
        return None
    src = Path(source)
    with tempfile.TemporaryDirectory() as tmp:
        if src.is_file():
            with tarfile.open(src) as t:
                t.extractall(tmp, filter="data")
            tops = list(Path(tmp).iterdir())
            if len(tops) != 1 or not tops[0].is_dir():
                fail(f"--datastates {source}: holds {len(tops)} entries at its top; accepted: a .tar.gz of one "
                     "source folder, a folder, or none")
            tree = tops[0]
        elif src.is_dir():
            tree = src
        else:
            fail(f"--datastates {source}: no such file or folder; accepted: the pinned tree as a .tar.gz or a "
                 "folder, or none")
        check = subprocess.run([sys.executable, str(ROOT / "scripts/bundle/check-datastates.py"), str(tree)],
                               capture_output=True, text=True, check=False)
        if check.returncode != 0:
            fail(f"--datastates {source}: {check.stderr.strip().splitlines()[-1]}")
        with tarfile.open(dest, "w:gz") as t:
            t.add(tree, arcname="datastates-llm", filter=lambda i: None if "/.git" in i.name else i)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16] if src.is_file() else "a folder"
    return f"{source} ({digest})"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--datastates", required=True)
    p.add_argument("--python", default="3.12")
    p.add_argument("--platform", action="append")
    a = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", a.python):
        fail(f"--python {a.python}; accepted: the node's Python version such as 3.12")
    if a.out.exists() and any(a.out.iterdir()):
        fail(f"{a.out} exists and is not empty; accepted: a new or empty folder")
    reqs = requirements(ROOT / "scripts/bundle/gpu-check.txt")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "folder"
        (work / "wheels").mkdir(parents=True)
        (work / "debs").mkdir()
        described = datastates(a.datastates, work / "datastates-llm.tar.gz")  # bad sources: refused first
        with open(Path(tmp) / "download.log", "w") as log:
            download(reqs, work / "wheels", a.python, tuple(a.platform or PLATFORMS), log)
            proc = subprocess.run(["apt-get", "download", "-q", *DEBS], cwd=work / "debs", capture_output=True,
                                  text=True, check=False)
            log.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            fail(f"apt-get download {' '.join(DEBS)} failed ({(proc.stderr.strip().splitlines() or ['?'])[-1]}); "
                 "accepted: a Debian machine whose apt can reach its archive")
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar.gz", "-o", str(work / "project.tar.gz"),
                        "HEAD"], check=True)
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        for script in ("gpu-check.py", "gpu-check-parts.py"):  # the command and the parts it loads beside it
            shutil.copy2(ROOT / "scripts/bundle" / script, work / script)
        carried = {role: [] for role, _, _ in reqs}
        for role, name, version in reqs:
            carried[role].append({"name": name, "version": version,
                                  "file": f"wheels/{file_of(work / 'wheels', name, version).name}"})
        manifest = {"python": a.python, "project_commit": commit, "datastates": described,
                    "debs": sorted(f.name for f in (work / "debs").iterdir()), "packages": carried}
        (work / "gpu-check.json").write_text(json.dumps(manifest, indent=1) + "\n")
        lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(work)}"
                 for f in sorted(work.rglob("*")) if f.is_file()]
        (work / "MANIFEST.sha256").write_text("\n".join(lines) + "\n")
        size = sum(f.stat().st_size for f in work.rglob("*") if f.is_file())
        if size > LIMIT_BYTES:
            fail(f"the folder would be {size / 2**20:.1f} MiB; accepted: at most {LIMIT_BYTES >> 20} MiB (what a "
                 "device call carries): carry fewer packages")
        a.out.mkdir(parents=True, exist_ok=True)
        for f in work.iterdir():
            shutil.move(str(f), a.out / f.name)
    print(f"{a.out}: {len(lines)} files, {size / 2**20:.1f} MiB; on the node: python3 {a.out}/gpu-check.py "
          "--out \"$OUT\"", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
