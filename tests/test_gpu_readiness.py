"""Ready for a GPU cluster (docs/clusters.md#gpu-nodes): the offline bundle installs into a fresh environment from
its own files only, and the check matrix runs its CPU subset end to end, listing what this node cannot run with the
reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def matrix(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "matrix", *args,
                           f"results_dir={tmp_path}"], capture_output=True, text=True, cwd=REPO, check=False,
                          timeout=900)


def test_matrix_lists_what_this_node_can_run_and_why_not_the_rest(tmp_path):
    """Every engine of the registry and the FSDP2 case: on a CPU machine only DataStates and FastPersist's decoupled
    writer are refused, each with its reason (the same preflight a run gets); FastPersist is runnable (issue 27)."""
    from restart_harness.campaigns import matrix as matrix_cases
    from restart_harness.command.parse import parse_matrix

    device, listed = matrix_cases.cases(parse_matrix(["layouts=tp1-pp1-dp2"]), tmp_path)
    refused = {c["engine"]: c["refused"] for c in listed}
    assert device == "cpu" and {"default", "lazy", "fastpersist", "dcp", "fsdp2-dcp"} <= set(refused)
    assert {e for e, why in refused.items() if why} == {"decoupled", "datastates"}, refused
    assert all("cpu" in refused[e] for e in ("decoupled", "datastates"))
    assert not tmp_path.joinpath("runs").exists()  # listing launches and creates nothing


def test_matrix_runs_what_this_node_can_and_says_why_not_the_rest(tmp_path):
    # DeepSpeed's default engine and the FSDP2 case run (every engine's own runs are in test_engines.py,
    # test_lazy.py, test_fsdp2.py, test_anatomy.py; which ones the matrix would run is the test above)
    proc = matrix(tmp_path, "engines=default,fsdp2-dcp,decoupled,datastates", "layouts=tp1-pp1-dp2",
                  "launcher=prefork")  # the launcher is not what it checks (conftest.CASE_LAUNCHER)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = Path(proc.stdout.strip().splitlines()[-1])
    record = json.loads((folder / "matrix.json").read_text())
    assert record["device"] == "cpu" and record["state"] == "complete"
    # each case's outcome is said (and matrix.json rewritten) as soon as it ends, not only in the final table
    assert re.search(r"\[matrix\] \d/2 default tp1-pp1-dp2: verified in \d+ s", proc.stdout), proc.stdout
    by_engine = {c["engine"]: c for c in record["cases"]}
    for name in ("default", "fsdp2-dcp"):
        c = by_engine[name]
        assert c["refused"] is None and c["exit_code"] == 0 and c["verified"] is True
        assert c["blocking_seconds"] > 0 and c["load_seconds"] > 0
        # keep=false by default: each case's checkpoint is gone once its records are written (a node's disk holds
        # one 1B case at a time; 64 GB held two), its summary stays
        status = json.loads((Path(c["run_dir"]) / "status.json").read_text())
        assert status["checkpoint_deleted"] is True and (Path(c["run_dir"]) / "summary.json").is_file()
    for name in ("decoupled", "datastates"):
        assert "cpu" in by_engine[name]["refused"] and "exit_code" not in by_engine[name]
    assert (folder / "report" / "report.md").is_file() and "refused" in proc.stdout
    # a calibration of this device from the matrix's own runs, naming it (a GPU node's predictions use its own)
    calibration = json.loads((folder / "calibration.json").read_text())
    assert record["calibration"] == str(folder / "calibration.json") and calibration["runs"]
    assert [d["kind"] for d in calibration["devices"]] == ["cpu"] and calibration["devices"][0]["model"]


@pytest.mark.parametrize("args, named", [(["device=cuda"], "device=cuda"), (["layouts=tp2"], "layouts=tp2"),
                                         (["engines=fast"], "engines=fast"),
                                         (["launcher=mpi"], "launcher=mpi")])
def test_matrix_bad_input_is_one_line_and_creates_nothing(tmp_path, args, named):
    proc = matrix(tmp_path / "m", *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0] and "accepted" in lines[0], proc.stderr
    assert not (tmp_path / "m").exists()


def datastates_sources(root: Path, api: str) -> Path:
    """A DataStates-LLM source tree laid out as the pinned sources are (llm/datastates, an engine class behind the
    package's CheckpointEngine), or as the repository's 2024 sources (datastates/llm: Checkpointing, wait())."""
    if api == "pinned":
        files = {"CMakeLists.txt": "project(datastates-llm LANGUAGES CXX CUDA)\n",
                 "llm/setup.py": "",
                 "llm/datastates/__init__.py": "from .engines import CheckpointEngine\n",
                 "llm/datastates/engines/__init__.py": "from .engine_state import StateEngine as CheckpointEngine\n",
                 "llm/datastates/engines/engine_state.py": (
                     "class StateEngine:\n    def save(self, state_dict, path): pass\n"
                     "    def load(self, path, map_location=None):\n"
                     "        return map_location(None, 'cpu') if callable(map_location) else None\n"
                     "    def wait(self, persist=False, for_all=False): pass\n")}
    else:
        files = {"setup.py": "", "datastates/llm/__init__.py": "from .checkpointing import *\n",
                 "datastates/llm/checkpointing.py": (
                     "class Checkpointing:\n    def save(self, state_dict, path): pass\n"
                     "    def load(self, path, map_location=None): pass\n    def wait(self): pass\n")}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_datastates_sources_without_deepspeeds_api_are_refused_before_gathering(tmp_path):
    """DeepSpeed 0.19.8 imports `from datastates import CheckpointEngine` and calls wait(persist=True): sources
    without that API (the repository's 2024 layout) are refused in one line, nothing gathered; the pinned layout
    passes the same check."""
    check = REPO / "scripts/bundle/check-datastates.py"
    old, pinned = datastates_sources(tmp_path / "old", "2024"), datastates_sources(tmp_path / "pinned", "pinned")
    ok = subprocess.run([sys.executable, str(check), str(pinned)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stdout.strip() == "llm/datastates", ok.stderr
    out = tmp_path / "bundle"
    proc = subprocess.run([str(REPO / "scripts/bundle/gather.sh"), str(out), "--datastates", str(old)],
                          capture_output=True, text=True, check=False, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert str(old) in lines[0] and "from datastates import CheckpointEngine" in lines[0] and "persist" in lines[0]
    assert not out.exists()
    # an engine class whose wait takes no `persist`, or whose load cannot take DeepSpeed's callable map_location, is
    # named as what is missing
    engine = pinned / "llm/datastates/engines/engine_state.py"
    engine.write_text(engine.read_text().replace("persist=False, ", ""))
    no_persist = subprocess.run([sys.executable, str(check), str(pinned)], capture_output=True, text=True, check=False)
    assert no_persist.returncode == 2 and "StateEngine.wait takes no `persist`" in no_persist.stderr
    engine.write_text(engine.read_text().replace("for_all=False", "persist=False, for_all=False")
                      .replace("map_location(None, 'cpu') if callable(map_location) else None", "None"))
    no_callable = subprocess.run([sys.executable, str(check), str(pinned)], capture_output=True, text=True,
                                 check=False)
    assert no_callable.returncode == 2 and "does not accept a callable map_location" in no_callable.stderr
    # the pin names a full commit of the repository DeepSpeed's error message points to
    pin = dict(line.split("=", 1) for line in (REPO / "scripts/bundle/datastates-llm.pin").read_text().splitlines()
               if line and not line.startswith("#"))
    assert pin["DATASTATES_URL"] == "https://github.com/DataStates/datastates-llm.git"
    assert len(pin["DATASTATES_COMMIT"]) == 40 and int(pin["DATASTATES_COMMIT"], 16)


SHARED_DATASTATES = REPO.parent / "shared" / "deps" / "datastates-llm"  # the assembled trees (shared/ beside the clone)


@pytest.mark.parametrize("commit, accepted", [("1b84990", True), ("ebc6762", False)])
def test_the_pinned_datastates_tree_has_the_api_and_the_one_before_does_not(tmp_path, commit, accepted):
    """The real assembled trees: 1b84990 (the pin) passes the API check, callable map_location included; ebc6762 (the
    pin before, whose restore died on an H200) is refused by gather.sh from its tarball in one line naming the
    callable map_location, before anything is gathered."""
    tarball = SHARED_DATASTATES / f"datastates-llm-{commit}-assembled.tar.gz"
    if not tarball.is_file():
        pytest.skip(f"{tarball} is not here (the shared folder of assembled DataStates-LLM trees)")
    pin = (REPO / "scripts/bundle/datastates-llm.pin").read_text()
    assert (f"DATASTATES_COMMIT={commit}" in pin) is accepted
    subprocess.run(["tar", "-C", str(tmp_path), "-xzf", str(tarball)], check=True)
    tree = next(tmp_path.iterdir())
    check = subprocess.run([sys.executable, str(REPO / "scripts/bundle/check-datastates.py"), str(tree)],
                           capture_output=True, text=True, check=False)
    assert (check.returncode == 0) is accepted, check.stderr
    if accepted:
        return
    out = tmp_path / "bundle"
    proc = subprocess.run([str(REPO / "scripts/bundle/gather.sh"), str(out), "--datastates", str(tarball)],
                          capture_output=True, text=True, check=False, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "callable map_location" in lines[0], proc.stderr
    assert str(tarball) in lines[0] and not out.exists()


def test_offline_bundle_installs_from_its_own_files_only(tmp_path):
    bundle, dest = tmp_path / "bundle", tmp_path / "dest"
    sources = datastates_sources(tmp_path / "datastates-llm", "pinned")
    gather = subprocess.run([str(REPO / "scripts/bundle/gather.sh"), str(bundle), "--datastates", str(sources)],
                            capture_output=True, text=True, check=False, timeout=1200)
    assert gather.returncode == 0, gather.stderr[-3000:]
    assert list((bundle / "src").glob("deepspeed-*.tar.gz")) and list((bundle / "wheels").glob("torch-*.whl"))
    assert (bundle / "src" / "datastates-llm.tar.gz").is_file()
    assert (bundle / "src" / "datastates-llm.source").read_text().strip() == str(sources)
    assert list((bundle / "wheels").glob("fasteners-*.whl"))  # DataStates' Python engine imports it
    # pip gets no index and no find-links but the bundle's (install.sh sets that); the machine's config is ignored,
    # and so is the environment this suite runs in (.ci/run's shared RH_VENV_DIR would be re-pointed at `dest`)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("RH_VENV_DIR", "RH_PYTHON")}
    env["PIP_NO_COMPILE"] = "1"  # what is installed is the point, not pip's byte-compiling of it (a minute of CPU)
    install = subprocess.run([str(REPO / "scripts/bundle/install.sh"), str(bundle), str(dest), "--cuda", "no"],
                             capture_output=True, text=True, check=False, timeout=1200,
                             env={**env, "TORCH_CUDA_ARCH_LIST": "9.0a"})  # as an H200 image sets it
    assert install.returncode == 0, install.stderr[-3000:]
    assert "TORCH_CUDA_ARCH_LIST=9.0a: DeepSpeed 0.19.8 cannot parse it; its ops are built for 9.0" in install.stderr
    assert "DataStates-LLM not built: it needs CUDA" in install.stderr  # carried, and refused here with the reason
    py = dest / ".venv" / "bin" / "python"
    check = subprocess.run([str(py), "-c", ("import torch, deepspeed, torchsnapshot, transformers, dftracer, "
                            "matplotlib, restart_harness; print(torch.__version__, deepspeed.__version__)")],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "0.19.8" in check.stdout, check.stderr[-2000:]
    # the installed checkout uses that environment as is (no set-up step runs)
    plan = subprocess.run([str(dest / "submit-job.sh"), "plan", "tiny", "dp=2"], capture_output=True, text=True,
                          check=False, cwd=dest, env={**env, "RH_VENV": "1"}, timeout=300)
    assert plan.returncode == 0 and "[setup]" not in plan.stderr, plan.stderr[-2000:]
    # a bundle whose files changed is refused before anything is installed
    (bundle / "project.tar.gz").write_bytes(b"x")
    again = subprocess.run([str(REPO / "scripts/bundle/install.sh"), str(bundle), str(tmp_path / "d2")],
                           capture_output=True, text=True, check=False, env=env)
    assert again.returncode == 2 and "MANIFEST" in again.stderr and not (tmp_path / "d2").exists()


def test_the_headline_gpu_job_is_prepared_on_a_machine_without_a_gpu(tmp_path):
    """The README's GPU command, dry run on this login-node-like machine: the run directory and the job script are
    written and the checks that need a GPU node are listed as the job's, not refused here (they run on every node
    of the job before any rank starts: tests/test_gpu_cluster.py)."""
    from conftest import submit

    results = tmp_path / "results"
    proc = submit(["13B", "pp=2", "tp=4", "engine=datastates", "launcher=slurm", "dry_run=true", "device=cuda",
                   f"results_dir={results}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    job = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8" in job and "#SBATCH --nodes=1" in job
    # the pinned host cache each rank asks for holds its save (13B over 8 ranks: about 21 GB), not a fixed 16 GB
    assert 21 < json.loads((run_dir / "ds_config.json").read_text())["datastates_ckpt"]["host_cache_size"] < 22
    listed = proc.stdout.split("==> checks of the node that runs the ranks (on every node of the job, before any "
                               "rank starts) <==\n")[1].splitlines()
    assert listed[:2] == ["device=cuda: an NVIDIA driver, a CUDA build of torch and 8 GPUs visible to the job",
                          ("engine=datastates: Python module 'datastates' (DataStates-LLM) importable, built, with "
                           "the API DeepSpeed 0.19.8 calls")], listed
    # the same run launched here instead is refused before anything is created, naming the device
    here = submit(["13B", "pp=2", "tp=4", "engine=datastates", "device=cuda", f"results_dir={tmp_path / 'r2'}"],
                  tmp_path)
    assert here.returncode == 2 and len(here.stderr.strip().splitlines()) == 1, here.stderr
    assert "device=cuda cannot run on this node" in here.stderr and not (tmp_path / "r2").exists()


@pytest.mark.parametrize("args, named", [(["up", "2", "gpus=0"], "gpus=0"), (["up", "2", "gpus=x"], "gpus=x"),
                                         (["up", "2", "gpus=４"], "gpus=４"), (["up", "2", "gpu=4"], "gpu=4")])
def test_local_cluster_gpus_bad_input_is_one_line_and_starts_nothing(tmp_path, args, named):
    root = tmp_path / "cluster"
    proc = subprocess.run([sys.executable, "-m", "testbeds.slurm_cluster", *args, "--root", str(root)],
                          capture_output=True, text=True, cwd=REPO, check=False, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
    assert not root.exists()
