"""The GPU check in one offline command (scripts/bundle/gpu-check-folder.py makes the folder, gpu-check.py runs on the
node; docs/clusters.md): what can be shown without a GPU. The folder is complete (its wheels, with what the GPU image
has, resolve in a fresh environment with no index) and within what a device call carries; a folder missing a wheel is
refused in one line; the check stops at its time limit, leaves at most 8 files with an archive of what ended, and skips
a big model its disk cannot hold with the reason instead of failing half-way."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO

SHARED_TARBALL = REPO.parent / "shared/deps/datastates-llm/datastates-llm-1b84990-assembled.tar.gz"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"  # the folder is made for this machine's Python here


def gpu_check():
    """scripts/bundle/gpu-check.py as a module (its name has a hyphen; it is run as a script on the node)."""
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts/bundle/gpu-check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The carried folder, for this machine's Python (the node's would be 3.12); DataStates-LLM's pinned tree from
    the shared tarball where it is here, else a tree laid out as it is (tests/test_gpu_readiness.py)."""
    base = tmp_path_factory.mktemp("gpu-check")
    if SHARED_TARBALL.is_file():
        source = SHARED_TARBALL
    else:
        from test_gpu_readiness import datastates_sources

        source = datastates_sources(base / "datastates-llm", "pinned")
    out = base / "folder"
    proc = subprocess.run([sys.executable, str(REPO / "scripts/bundle/gpu-check-folder.py"), str(out),
                           "--datastates", str(source), "--python", PYTHON], capture_output=True, text=True,
                          check=False, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow  # downloads the folder's wheels (about 35 MiB) and, for the image's stand-in, torch and transformers
def test_the_folder_is_complete_and_fits_a_device_call(folder, tmp_path):
    info = json.loads((folder / "gpu-check.json").read_text())
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size <= 64 << 20, size
    assert {d.split("_")[0] for d in info["debs"]} == {"libaio1", "libaio-dev", "liburing2", "liburing-dev"}
    assert (folder / "gpu-check.py").read_bytes() == (REPO / "scripts/bundle/gpu-check.py").read_bytes()
    # what the GPU image has, stood in by its packages for this Python: torch (this project's pin) and transformers
    # with everything they require; then every carried package, in a fresh environment, with no index
    image = tmp_path / "image"
    download = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(image), "torch==2.13.0",
                               "transformers==5.23.0"], capture_output=True, text=True, check=False, timeout=900)
    assert download.returncode == 0, download.stderr[-2000:]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "fresh")], check=True)
    reqs = [f"{p['name']}=={p['version']}" for ps in info["packages"].values() for p in ps]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(tmp_path / "fresh/bin/python"), "install",
                           "--dry-run", "--no-index", "--find-links", str(folder / "wheels"), "--find-links",
                           str(image), "--report", str(report), *reqs, "torch==2.13.0", "transformers==5.23.0"],
                          capture_output=True, text=True, check=False, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    from_folder = {i["metadata"]["name"].lower().replace("_", "-") for i in json.loads(report.read_text())["install"]
                   if str(folder) in i["download_info"]["url"]}
    assert {r.split("==")[0].lower().replace("_", "-") for r in reqs} <= from_folder


@pytest.mark.slow  # reads the folder's 35 MiB against its manifest
def test_a_folder_missing_a_wheel_is_refused_in_one_line(folder, tmp_path):
    broken = tmp_path / "folder"
    shutil.copytree(folder, broken)
    wheel = next((broken / "wheels").glob("pydantic-*.whl"))
    wheel.unlink()
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(broken / "gpu-check.py"), "--out", str(out), "--work",
                           str(tmp_path / "work")], capture_output=True, text=True, check=False, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"wheels/{wheel.name} (pydantic " in lines[0] and "is missing" in lines[0] and "accepted" in lines[0]
    assert not out.exists() and not (tmp_path / "work").exists()


@pytest.mark.slow  # one matrix case launched, held until the time limit
def test_the_check_stops_at_its_time_limit_and_leaves_what_it_did(folder, tmp_path):
    """A case that hangs (RH_FAULT=hang@step) holds the matrix until the check's time limit: the check stops it as
    Ctrl-C would, packs what it has and ends with exit 1; the big model (70B here: about 1 TB a checkpoint) is skipped
    for the disk before the matrix starts, with its reason, not failed half-way."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(folder / "gpu-check.py"), "--out", str(out), "--work", str(work),
                           "--python", sys.executable, "--model", "tiny", "--engines", "default", "--matrix-args",
                           "layouts=tp1-pp1-dp2 launcher=prefork", "--big", "70B", "--time-limit", "45"],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "RH_FAULT": "hang@step:step=1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    files = sorted(f.name for f in out.iterdir())
    assert len(files) <= 8 and {"check.log", "node.txt", "results.tar.gz", "matrix-tiny.log"} <= set(files), files
    log = (out / "check.log").read_text()
    skipped = [x for x in log.splitlines() if "70B skipped" in x]
    assert len(skipped) == 1 and "GB free" in skipped[0] and "accepted: --work on a file system" in skipped[0], log
    assert log.index("70B skipped") < log.index("matrix: matrix model=tiny")  # decided before the matrix ran
    assert "time limit: stopping" in log and "cut off at the time limit" in log.splitlines()[-1], log
    with tarfile.open(out / "results.tar.gz") as t:
        names = t.getnames()
        record = json.load(t.extractfile(next(n for n in names if n.endswith("matrix.json"))))
    assert record["state"] == "failed" and "exit_code" not in record["cases"][0], record  # stopped mid-case
    run = next(n for n in names if n.endswith("/spec.json")).removesuffix("/spec.json")
    assert f"{run}/events/checkpoint" in names and f"{run}/checkpoint" not in names, names


def test_the_archive_holds_records_never_checkpoints_and_is_replaced_whole(tmp_path):
    module = gpu_check()
    work, out = tmp_path / "work", tmp_path / "out"
    run = work / "results/matrix/m/runs/r"
    (run / "checkpoint/global_step2").mkdir(parents=True)
    (run / "checkpoint/global_step2/mp_rank_00_model_states.pt").write_bytes(b"x" * 4096)
    (run / "events/checkpoint").mkdir(parents=True)  # the checkpoint phase's records: kept
    (run / "events/checkpoint/rank-00000.jsonl").write_text("{}\n")
    (run / "spec.json").write_text("{}")
    (run / "summary.json").write_text("{}")
    out.mkdir()
    check = module.Check(argparse.Namespace(out=out, work=work, time_limit=600.0, python=sys.executable))
    check.pack()
    first = (out / "results.tar.gz").stat().st_ino
    (run / "status.json").write_text("{}")
    check.pack()
    with tarfile.open(out / "results.tar.gz") as t:
        names = t.getnames()
    assert "results/matrix/m/runs/r/status.json" in names and "results/matrix/m/runs/r/summary.json" in names
    assert "results/matrix/m/runs/r/events/checkpoint/rank-00000.jsonl" in names
    assert not any(n.startswith("results/matrix/m/runs/r/checkpoint") for n in names), names
    assert (out / "results.tar.gz").stat().st_ino != first  # a new file renamed over the old one
    assert sorted(f.name for f in out.iterdir()) == ["check.log", "results.tar.gz"]


def test_versions_the_node_has_are_compared_as_numbers():
    older = gpu_check().older
    assert older(None, "1.0") and older("4.9.0", "4.16.0")
    assert not older("4.16.0", "4.16.0") and not older("2.11.0+cu130", "2.6") and not older("26.4", "26.4")


def test_a_debian_package_is_unpacked_without_dpkg(tmp_path):
    debs = sorted(Path("/var/cache/apt/archives").glob("*.deb"))[:1]
    if not debs:
        proc = subprocess.run(["apt-get", "download", "-q", "liburing-dev"], cwd=tmp_path, capture_output=True,
                              text=True, check=False)
        debs = sorted(tmp_path.glob("*.deb"))
        if proc.returncode != 0 or not debs:
            pytest.skip(f"no Debian package here to unpack ({proc.stderr.strip()[-200:]})")
    gpu_check().extract_deb(debs[0], tmp_path / "root")
    listing = subprocess.run(["dpkg-deb", "-c", str(debs[0])], capture_output=True, text=True, check=True).stdout
    files = [line.split()[-1].lstrip(".") for line in listing.splitlines() if line.startswith("-")]
    assert files and all((tmp_path / "root" / f.lstrip("/")).exists() for f in files)


@pytest.mark.parametrize("args, named", [(["--time-limit", "5"], "--time-limit 5"), ([], "no --out")])
def test_bad_check_input_is_one_line(tmp_path, args, named):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    out = [] if named == "no --out" else ["--out", str(tmp_path / "out")]
    proc = subprocess.run([sys.executable, str(REPO / "scripts/bundle/gpu-check.py"), *out, *args],
                          capture_output=True, text=True, check=False, env=env, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0] and "accepted" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_gpu_comparison_plan_and_its_tables_packed(tmp_path):
    """Issue 67: the check runs compare_engines' GPU form: engine=none for the step, default, lazy, lazy's CUDA ring
    (staging_mib=64) and DataStates-LLM where it was built, interleaved, in the project's folder with its runs under
    WORK; its tables go into the archive (at most 8 files in OUT still)."""
    from benchmarks.compare_engines import CASES

    module = gpu_check()
    plan = module.parts.compare_plan("py", "small", 2, datastates=True)
    assert plan == ["py", "-m", "benchmarks.compare_engines", "2", "small",
                    "only=none,default,lazy,lazy ring,datastates"], plan
    assert "datastates" not in module.parts.compare_plan("py", "small", 1, datastates=False)[-1]
    assert set(plan[-1].removeprefix("only=").split(",")) <= {name for name, _ in CASES}
    assert dict(CASES)["lazy ring"] == ["engine=lazy", "staging_mib=64"]
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "project").mkdir(parents=True)
    out.mkdir()
    a = argparse.Namespace(out=out, work=work, time_limit=600.0, python="py", model="small", compare_repeats=1)
    check = module.Check(a)
    ran = []

    def run(cmd, log, env=None, cwd=None, **_):
        ran.append((cmd, cwd, env["TMPDIR"]))
        log.write_text("| engine | training lost per save s (vs none) | host memory held MiB |\n")
        return 0

    check.run = run
    check.compare()
    assert ran == [(module.parts.compare_plan("py", "small", 1, False), work / "project",
                    str(work / "results/compare"))], ran
    with tarfile.open(out / "results.tar.gz") as t:
        table = t.extractfile("results/compare/compare-small.md").read().decode()
    assert "training lost per save" in table and "host memory held" in table
    assert not check.failed and "compare ended (exit 0)" in (out / "check.log").read_text()
