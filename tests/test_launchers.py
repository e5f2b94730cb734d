"""Launchers, batch scripts, sweeps and restart-only command lines without launching ranks: the generated files
(dry_run=true writes them), the rank-environment mapping, and every bad input (exit 2, one line, nothing made)."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from restart_harness import rank_env, resolve
from restart_harness.command.parse import parse_sweep
from restart_harness.rundir.status import allocate_record


def cli(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "config-n-run.py"), *args], cwd=cwd, check=False,
                          capture_output=True, text=True, timeout=120, env=env or {**os.environ})


def dry_run(tmp_path: Path, *args: str) -> Path:
    results = tmp_path / "results"
    proc = cli([*args, "dry_run=true", f"results_dir={results}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert json.loads((run_dir / "status.json").read_text())["state"] == "dry_run"
    assert not (run_dir / "events" / "checkpoint").exists() and not (run_dir / "logs" / "checkpoint.log").exists()
    return run_dir


def directives(text: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in text.splitlines() if line.startswith(prefix)]


def bash_n(path: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_dry_run_writes_and_prints_config_and_launch_scripts(tmp_path):
    run_dir = dry_run(tmp_path, "tiny", "dp=2")
    assert json.loads((run_dir / "ds_config.json").read_text())["train_batch_size"] == 8
    for record in ("checkpoint", "restart-01"):
        script = (run_dir / f"launch-{record}.sh").read_text()
        assert "deepspeed.launcher.runner" in script and f"--record {record}" in script
        bash_n(run_dir / f"launch-{record}.sh")


def test_torchrun_script(tmp_path):
    run_dir = dry_run(tmp_path, "tiny", "dp=2", "launcher=torchrun", "phase=checkpoint")
    script = (run_dir / "launch-checkpoint.sh").read_text()
    assert "-m torch.distributed.run --nnodes 1 --nproc-per-node 2" in script
    assert "# restart-harness checkpoint launch (torchrun)" in script and f"export {rank_env.VARIABLE}=" in script
    assert not (run_dir / "launch-restart-01.sh").exists()  # phase=checkpoint: no restart launch
    bash_n(run_dir / "launch-checkpoint.sh")


def test_a_tensor_parallel_group_across_nodes_is_said_once_and_allowed(tmp_path):
    results = tmp_path / "results"
    proc = cli(["tiny", "tp=2", "nodes=2", "ranks_per_node=1", "launcher=slurm", "dry_run=true",
                f"results_dir={results}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert said == [("warning: tp=2 with ranks_per_node=1: tensor-parallel groups span nodes, so every layer's "
                    "all-reduces cross the network (training steps slow down; the checkpoint's files are the same)")]
    proc = cli(["tiny", "tp=2", "dp=2", "nodes=2", "ranks_per_node=2", "launcher=slurm", "dry_run=true",
                f"results_dir={results}"], tmp_path)
    assert proc.returncode == 0 and "warning:" not in proc.stderr, proc.stderr


def test_sbatch_script(tmp_path):
    hook = tmp_path / "modules.sh"
    hook.write_text("export FROM_HOOK=1\n")
    run_dir = dry_run(tmp_path, "tiny", "tp=2", "nodes=2", "ranks_per_node=4", "launcher=slurm", "queue=gpu",
                      "account=proj42", "walltime=00:30:00", f"env_hook={hook}")
    job = (run_dir / "job.sbatch").read_text()
    d = directives(job, "#SBATCH")
    for expected in ("--nodes=2", "--ntasks-per-node=4", "--time=00:30:00", "--partition=gpu", "--account=proj42",
                     f"--output={run_dir}/logs/job-%j.log"):
        assert expected in d, (expected, d)
    assert f"-m restart_harness.phases.job {run_dir}" in job
    assert job.index(f"source {hook}") < job.index("exec ")
    launch = (run_dir / "launch-restart-01.sh").read_text()
    assert re.search(r"exec srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --kill-on-bad-exit=1 ", launch)
    assert "scontrol show hostnames" in launch and f"source {hook}" in launch
    for path in (run_dir / "job.sbatch", run_dir / "launch-checkpoint.sh", run_dir / "launch-restart-01.sh"):
        bash_n(path)


def test_qsub_script_polaris_style(tmp_path):
    run_dir = dry_run(tmp_path, "tiny", "dp=8", "nodes=2", "launcher=pbs", "queue=debug-scaling", "account=MyProj",
                      "walltime=01:00:00", "filesystems=home:eagle")
    job = (run_dir / "job.pbs").read_text()
    d = directives(job, "#PBS")
    for expected in ("-l select=2:mpiprocs=4", "-l place=scatter", "-l walltime=01:00:00",
                     "-l filesystems=home:eagle", "-q debug-scaling", "-A MyProj"):
        assert expected in d, (expected, d)
    name = next(x for x in d if x.startswith("-N "))[3:]
    assert len(name) <= 15 and name[0].isalpha()  # PBS job-name rules
    launch = (run_dir / "launch-checkpoint.sh").read_text()
    assert 'exec mpiexec -n 8 --ppn 4 --hostfile "$PBS_NODEFILE" ' in launch
    assert 'MASTER_ADDR="$(head -n 1 "$PBS_NODEFILE")"' in launch
    for path in (run_dir / "job.pbs", run_dir / "launch-checkpoint.sh"):
        bash_n(path)


def test_qsub_script_asks_for_a_gpu_a_rank_and_checks_its_nodes_first(tmp_path):
    """PBS's side of a GPU job, as far as this machine can check it (no PBS server is packaged for Debian 12): the
    select statement asks for one GPU a rank, and the job runs the node checks once a node (mpiexec --ppn 1 over
    PBS_NODEFILE) before any rank; whether a PBS server accepts and binds it is a cluster's to show."""
    results = tmp_path / "results"
    proc = cli(["tiny", "dp=8", "nodes=2", "launcher=pbs", "device=cuda", "dry_run=true", f"results_dir={results}"],
               tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert "-l select=2:mpiprocs=4:ngpus=4" in directives((run_dir / "job.pbs").read_text(), "#PBS")
    checks = proc.stdout.split("==> checks of the node that runs the ranks")[1]
    assert "device=cuda: an NVIDIA driver, a CUDA build of torch and 4 GPUs visible to the job" in checks
    assert resolve.read(run_dir).launcher.per_node_command(["x"])[:5] == ["mpiexec", "-n", "2", "--ppn", "1"]


def exported(launcher: str) -> dict[str, str]:
    """What a launch script of `launcher` exports for its ranks to find their rank variables (rank_env.py)."""
    return {rank_env.VARIABLE: rank_env.encode(resolve.launcher_class(launcher).rank_variables)}


@pytest.mark.parametrize("launcher,env,expected", [
    ("slurm", {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
               "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)"},
     {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "CROSS_RANK": "1", "CROSS_SIZE": "2", "LOCAL_SIZE": "4"}),
    ("pbs", {"PALS_RANKID": "6", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "2", "PALS_LOCAL_SIZE": "4"},
     {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "CROSS_RANK": "1", "CROSS_SIZE": "2", "LOCAL_SIZE": "4"}),
    ("torchrun", {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "CROSS_RANK": "1", "CROSS_SIZE": "2", "LOCAL_SIZE": "2"}),
    ("local", {"RANK": "1", "WORLD_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2"},
     {"RANK": "1", "WORLD_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2"}),
])
def test_rank_environment_from_each_launcher(launcher, env, expected):
    env = {**env, **exported(launcher)}
    rank_env.fill(env)
    assert {k: env.get(k) for k in expected} == expected


@pytest.mark.parametrize("env,expected", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1"},  # Open MPI: NODE_RANK is within the node
     {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "CROSS_RANK": "1", "CROSS_SIZE": "2", "LOCAL_SIZE": "2"}),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1"},
     {"RANK": "1", "LOCAL_RANK": "1", "CROSS_RANK": "0", "CROSS_SIZE": "2"}),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},  # MPICH's Hydra
     {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "CROSS_RANK": "1", "CROSS_SIZE": "2", "LOCAL_SIZE": "2"}),
])
@pytest.mark.parametrize("launcher", ["mpiexec", "pbs"])
def test_rank_environment_from_mpiexec(launcher, env, expected):
    env = {**env, **exported(launcher)}
    rank_env.fill(env)
    assert {k: env.get(k) for k in expected} == expected


def test_mpiexec_script(tmp_path):
    run_dir = dry_run(tmp_path, "tiny", "dp=2", "launcher=mpiexec")
    for record in ("checkpoint", "restart-01"):
        script = (run_dir / f"launch-{record}.sh").read_text()
        assert re.search(r"^exec mpiexec -n 2 \S+ -m restart_harness\.worker ", script, re.MULTILINE), script
        assert "export MASTER_ADDR=127.0.0.1" in script and f"export {rank_env.VARIABLE}='RANK=PALS_RANKID," in script
        bash_n(run_dir / f"launch-{record}.sh")


@pytest.mark.slow
def test_mpiexec_starts_the_ranks_and_they_read_its_variables(harness):
    """launcher=mpiexec (one file in restart_harness/launchers/): Open MPI's mpiexec starts both ranks of the
    checkpoint and of the restart, each rank takes its rank from OMPI_COMM_WORLD_*, and the restart is verified
    (tests/test_runs.py holds the case to every run's checks)."""
    from conftest import events, load_summary, require_tool

    require_tool("mpiexec", package="openmpi-bin")
    run_dir = harness.run("dp2-short")
    assert json.loads((run_dir / "spec.json").read_text())["launcher"] == "mpiexec"
    for record in ("checkpoint", "restart-01"):
        per_rank = events(run_dir, record)
        assert sorted(per_rank) == [0, 1]
        for rank, evs in per_rank.items():
            (process,) = [e for e in evs if e["event"] == "process"]
            assert process["node"] == 0, (record, rank, process)
    log = (run_dir / "logs" / "checkpoint.log").read_text()
    assert "deepspeed.launcher" not in log and "torch.distributed.run" not in log
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete" and all(r["verified"] for r in summary["restarts"])


@pytest.mark.slow
def test_prefork_forks_every_rank_from_one_process_that_imported_first(harness):
    """launcher=prefork (one file in restart_harness/launchers/): one process per phase imports the stack's
    libraries and forks the ranks; every rank's process start is that process's start (the imports they share are
    their `imports` phase), the ranks read the variables it sets, and the restart in a new forking process is
    verified. Most run-table cases use it (conftest.CASE_LAUNCHER)."""
    from conftest import RUNS, events, load_summary

    assert "launcher=" not in RUNS["tp2-dp2"].args  # the case launcher's
    run_dir = harness.run("tp2-dp2")
    assert json.loads((run_dir / "spec.json").read_text())["launcher"] == "prefork"
    for record in ("checkpoint", "restart-01"):
        per_rank = events(run_dir, record)
        assert sorted(per_rank) == [0, 1, 2, 3]
        starts, imported, pids = set(), [], set()
        for evs in per_rank.values():
            (process,) = [e for e in evs if e["event"] == "process"]
            assert process["node"] == 0
            pids.add(process["pid"])
            marks = {e["name"]: e["t"] for e in evs if e["event"] == "mark"}
            starts.add(marks["process_start"])
            imported.append(marks["imports_done"] - marks["process_start"])
        assert len(pids) == 4 and len(starts) == 1, (record, pids, starts)  # four processes, one start
        assert min(imported) > 0.2, imported  # torch and DeepSpeed, imported once before the forks
    script = (run_dir / "launch-restart-01.sh").read_text()
    assert re.search(r"^exec \S+ -m restart_harness\.worker\.forker 4 --run-dir ", script, re.MULTILINE), script
    summary = load_summary(run_dir)
    assert summary["status"]["state"] == "complete" and all(r["verified"] for r in summary["restarts"])


def test_a_rank_ends_without_teardown_yet_with_its_output_and_its_code(tmp_path):
    """worker/main.py end_process, how every rank and prefork's forking process end: output Python and the C library
    still buffer is written (a log that is a file is block-buffered), the exit code is the rank's, and an exit
    handler (the interpreter's teardown) does not run."""
    code = ("import atexit, ctypes, sys; from restart_harness.worker.main import end_process; "
            "atexit.register(lambda: print('teardown ran')); print('python line', end=''); "
            "ctypes.CDLL(None).printf(b' c line'); end_process(3)")
    with open(tmp_path / "log", "w") as log:  # a file: stdio buffers it, as in a rank's log
        proc = subprocess.run([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, check=False)
    assert proc.returncode == 3
    assert (tmp_path / "log").read_text() == "python line c line"


def test_deepspeed_is_another_name_for_the_local_launcher(tmp_path):
    run_dir = dry_run(tmp_path, "tiny", "dp=2", "launcher=deepspeed")
    assert json.loads((run_dir / "spec.json").read_text())["launcher"] == "local"
    assert "deepspeed.launcher.runner" in (run_dir / "launch-checkpoint.sh").read_text()


def test_sweep_expands_product_and_repeats(tmp_path):
    request = parse_sweep(["tiny", "engine=default,none", "tp=1,2", "iters=2"])
    assert request.lists == {"engine": ["default", "none"], "tp": ["1", "2"]}
    assert [c.values for c in request.combos] == [{"engine": e, "tp": t} for e in ("default", "none")
                                                  for t in ("1", "2")]
    assert [(c.spec.engine, c.spec.tp) for c in request.combos] == [("default", 1), ("default", 2), ("none", 1),
                                                                    ("none", 2)]
    results = tmp_path / "results"
    proc = cli(["tiny", "tp=1,2", "repeats=2", "dry_run=true", f"results_dir={results}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert sweep_dir.parent == results and sweep_dir.name.startswith("sweep-")
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert [(r["index"], r["combination"], r["repeat"], r["state"]) for r in sweep["runs"]] == [
        (1, {"tp": "1"}, 1, "dry_run"), (2, {"tp": "1"}, 2, "dry_run"),
        (3, {"tp": "2"}, 1, "dry_run"), (4, {"tp": "2"}, 2, "dry_run")]
    for r in sweep["runs"]:
        assert Path(r["run_dir"]).parent == sweep_dir and Path(r["run_dir"]).name.startswith(f"{r['index']:03d}-tiny-")
    assert sweep["state"] == "complete" and sweep["counts"] == {"dry_run": 4}
    assert "[sweep 4/4" in proc.stderr


def _claim(run_dir: str, queue) -> None:
    queue.put([allocate_record(Path(run_dir)) for _ in range(5)])


def test_record_names_never_collide_across_processes(tmp_path):
    queue = multiprocessing.get_context("fork").Queue()
    procs = [multiprocessing.get_context("fork").Process(target=_claim, args=(str(tmp_path), queue))
             for _ in range(4)]
    for p in procs:
        p.start()
    names = [n for _ in procs for n in queue.get(timeout=60)]
    for p in procs:
        p.join()
    assert sorted(names) == [f"restart-{n:02d}" for n in range(1, 21)]


BAD = {
    "unknown launcher": (["tiny", "launcher=mpi"], "launcher=mpi"),
    "mpiexec over two nodes": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1", "launcher=mpiexec"],
                               "nodes=2 with launcher=mpiexec"),
    "mpiexec not installed": (["tiny", "launcher=mpiexec"], "mpiexec"),
    "prefork over two nodes": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1", "launcher=prefork"],
                               "nodes=2 with launcher=prefork"),
    "slurm without sbatch": (["tiny", "launcher=slurm"], "sbatch"),
    "wait for a run that is not a job": (["tiny", "wait=true"], "wait=true with launcher=local"),
    "pbs without qsub": (["tiny", "launcher=pbs"], "qsub"),
    "local on two nodes": (["tiny", "dp=2", "nodes=2"], "nodes=2"),
    "bad walltime": (["tiny", "launcher=slurm", "dry_run=true", "walltime=90min"], "walltime=90min"),
    "missing env hook": (["tiny", "env_hook=/nonexistent/hook.sh"], "/nonexistent/hook.sh"),
    "bad phase": (["tiny", "phase=resume"], "phase=resume"),
    "bad combination in a sweep": (["tiny", "tp=1,3", "hidden_size=64"], "tp=3"),
    "list on results_dir": (["tiny", "iters=2,4", "results_dir=a,b"], "results_dir"),
    "restart without run=": (["phase=restart"], "run="),
    "restart with MODEL": (["tiny", "phase=restart", "run=x"], "MODEL"),
    "restart of no run": (["phase=restart", "run=/nonexistent/run"], "/nonexistent/run"),
    "restart command of no run": (["restart", "run=/nonexistent/run"], "/nonexistent/run"),
    "checkpoints into /proc": (["tiny", "ckpt_dir=/proc/x"], "ckpt_dir=/proc/x"),
    "results into a file": (["tiny", "results_dir=/dev/null"], "results_dir=/dev/null"),
    "results under a file": (["tiny", "results_dir=/dev/null/x"], "/dev/null exists and is not a directory"),
    "no room for the checkpoints": (["70B", "tp=8", "pp=4", "dp=2", "ckpt_dir=/dev/shm/rh-x"], "MiB free"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name, tmp_path):
    args, named = BAD[name]
    results = tmp_path / "results"
    env = {**os.environ}
    if name.endswith(("sbatch", "qsub", "not installed")):
        env["PATH"] = str(tmp_path / "empty-bin")  # no scheduler client here, whatever this machine has
    if "results_dir" not in " ".join(args) and not args[0].startswith(("phase=", "restart")):
        args = [*args, f"results_dir={results}"]
    proc = cli(args, tmp_path, env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr
    assert not results.exists() and not (tmp_path / "a").exists() and not Path("/dev/shm/rh-x").exists()


def test_restart_refuses_keys_that_change_the_run(tmp_path):
    run_dir = dry_run(tmp_path, "tiny", "dp=2")
    proc = cli(["phase=restart", f"run={run_dir}", "precision=fp32"], tmp_path)
    assert proc.returncode == 2 and "precision=" in proc.stderr and "cache" in proc.stderr
    proc = cli(["phase=restart", f"run={run_dir}", "replicate=2"], tmp_path)  # checked by its stack, as a run's is
    assert proc.returncode == 2 and "replicate=2: hybrid sharding is stack=fsdp2's" in proc.stderr, proc.stderr
    before = sorted(p.name for p in run_dir.rglob("*"))
    proc = cli(["phase=restart", f"run={run_dir}", "cache=warm"], tmp_path)
    assert proc.returncode == 2 and "not a finished run (dry_run" in proc.stderr  # a dry run launched nothing
    assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def test_a_busy_machine_is_seen_before_a_launch():
    """machine.load_now() counts other work, sampled while the harness sleeps: two CPU burners make it busy."""
    from restart_harness import machine

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        import time

        time.sleep(0.5)
        load = machine.load_now()
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert load["busy"] is True and load["cpu_busy_fraction"] > machine.BUSY_FRACTION, load
    assert load["cpus"] >= 1 and load["window_seconds"] > 0 and load["loadavg_1min"] >= 0


def test_rendezvous_ports_are_drawn_at_random_below_the_ephemeral_range():
    """Two harnesses started together both got bind(0)'s port and the second failed with EADDRINUSE: ports are drawn
    at random from 20000-32767 (below Linux's ephemeral range) and tried."""
    from restart_harness.rundir.create import free_port

    ports = [free_port() for _ in range(20)]
    assert all(20000 <= p <= 32767 for p in ports) and len(set(ports)) > 10, ports


def test_bf16_on_a_cpu_without_avx512_is_said_before_the_launch(tmp_path):
    """This project's machine (AVX2, no AVX-512) runs torch's bf16 matrix products 15-60x slower than fp32
    (docs/measurements.md#bf16-on-cpu): a CPU run of a model whose steps that makes long (small: 70 s) says so before
    it launches in bf16, not in fp32, nor for tiny; on a machine with AVX-512 none does. spec.json records which it was."""
    from restart_harness import machine

    said = {}
    for model, precision in (("small", "bf16"), ("small", "fp32"), ("tiny", "bf16")):
        results = tmp_path / f"{model}-{precision}"
        proc = cli([model, "dp=2", f"precision={precision}", "dry_run=true", f"results_dir={results}"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        said[model, precision] = "warning: precision=bf16 on a CPU without AVX-512" in proc.stdout + proc.stderr
        run_dir = Path(proc.stdout.strip().splitlines()[-1])
        host = json.loads((run_dir / "spec.json").read_text())["host"]
        assert host["cpu_avx512"] is ("avx512f" in machine.cpu_flags())
    # tiny's steps stay short in bf16 (0.25 M parameters): not said
    assert said == {("small", "bf16"): machine.bf16_matmul_is_slow(), ("small", "fp32"): False, ("tiny", "bf16"): False}
