"""The GPU check's parts that need no Check (scripts/bundle/gpu-check.py loads this file from its own folder, where
scripts/bundle/gpu-check-folder.py puts it): the folder's files checked whole, versions compared, Debian packages
unpacked without dpkg, the archive's filter, a session's processes, and the GPU comparison's plan.
Standard library only: it runs with the image's Python before anything is installed."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import sys
import tarfile
from pathlib import Path

# the GPU form of benchmarks/compare_engines.py (issue 67): engine=none for the step, default, lazy, lazy's CUDA ring
# (staging_mib=64: a ring of writers + 1 requests a part, its device->host copies waiting for slots) and DataStates-LLM
# where it was built; training lost per save and host memory held are in its table
COMPARE_CASES = ("none", "default", "lazy", "lazy ring")


def compare_plan(python: str, model: str, repeats: int, datastates: bool) -> list[str]:
    """The comparison's command, run in the project's folder: one interleaved benchmark, every case `repeats`
    times, against the ceiling fio (else the built-in probe) measures in each repeat."""
    cases = [*COMPARE_CASES, *(["datastates"] if datastates else [])]
    return [python, "-m", "benchmarks.compare_engines", str(repeats), model, f"only={','.join(cases)}"]


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def older(have: str | None, carried: str) -> bool:
    """Is an installed version missing or older than the carried one (numeric parts compared)?"""
    if have is None:
        return True

    def parts(v: str) -> tuple[int, ...]:  # the leading parts that start with a digit, their digits
        fields = v.replace("+", ".").split(".")
        digits = ("".join(c for c in x if c.isdigit()) if x[:1].isdigit() else "" for x in fields)
        return tuple(int(d) for d in itertools.takewhile(bool, digits))

    return parts(have) < parts(carried)


def without_checkpoints(info: tarfile.TarInfo, base: Path) -> tarfile.TarInfo | None:
    """Everything but a run's checkpoints: its checkpoint/ folder (beside its spec.json) is left out, whole (its
    events/checkpoint/ records stay); and the sampler's raw traces (profiles/<record>/samples.json, megabytes each:
    summary.json and the flame graphs beside them carry what they say)."""
    path = base / info.name
    raw_trace = path.name == "samples.json" and path.parent.parent.name == "profiles"
    return None if raw_trace or path.name == "checkpoint" and (path.parent / "spec.json").is_file() else info


def session_members(sid: int, live: bool = False) -> list[int]:
    """The processes of session sid (zombies left out where `live`)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if len(fields) > 3 and int(fields[3]) == sid and not (live and fields[0] == "Z"):
                out.append(int(entry.name))
    return out


def extract_deb(deb: Path, dest: Path) -> None:
    """A Debian package's files under dest, without dpkg (an ar archive holding data.tar.*)."""
    data = deb.read_bytes()
    assert data[:8] == b"!<arch>\n", deb
    at = 8
    while at < len(data):
        name, size = data[at:at + 16].decode().strip().rstrip("/"), int(data[at + 48:at + 58].decode().strip())
        body = data[at + 60:at + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as t:
                t.extractall(dest, filter=_within)
            return
        at += 60 + size + (size % 2)


def _within(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter, a member it refuses (a link to an absolute path, such as a unit file's) left out."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        return None


def whole(folder: Path) -> dict:
    """The folder's files against MANIFEST.sha256; gpu-check.json. One line and exit 2 at the first problem."""
    accepted = "accepted: a folder made by scripts/bundle/gpu-check-folder.py, carried whole"
    manifest = folder / "MANIFEST.sha256"
    if not manifest.is_file() or not (folder / "gpu-check.json").is_file():
        fail(f"{folder}: no MANIFEST.sha256 or gpu-check.json; {accepted}")
    info = json.loads((folder / "gpu-check.json").read_text())
    what = {p["file"]: f"{p['name']} {p['version']}" for ps in info["packages"].values() for p in ps}
    listed = [line.partition("  ") for line in manifest.read_text().splitlines()]
    for digest, _, rel in listed:
        label = f"{rel} ({what[rel]})" if rel in what else rel
        if not (folder / rel).is_file():
            fail(f"{folder}: {label} is missing; {accepted}")
        if hashlib.sha256((folder / rel).read_bytes()).hexdigest() != digest:
            fail(f"{folder}: {label} differs from MANIFEST.sha256; {accepted}")
    for rel, label in what.items():
        if rel not in {line[2] for line in listed}:
            fail(f"{folder}: {rel} ({label}) is not in MANIFEST.sha256; {accepted}")
    return info
