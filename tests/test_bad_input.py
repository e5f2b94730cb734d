"""Every user mistake, typed into ./submit-job.sh: exit code 2, one line on stderr, nothing created."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CASES = {
    "tp=0": (["tiny", "tp=0"], "tp=0"),
    "tp=abc": (["tiny", "tp=abc"], "tp=abc"),
    "tp=3 with 32 heads": (["7B", "tp=3"], "num_attention_heads=32"),
    "pp larger than layers": (["tiny", "pp=9"], "pp=9"),
    "dp not matching ranks": (["tiny", "dp=3", "ranks_per_node=2"], "dp=3"),
    "unknown model": (["llama-9000"], "llama-9000"),
    "unknown key": (["tiny", "colour=blue"], "colour"),
    "malformed token": (["tiny", "dp2"], "dp2"),
    "unknown engine": (["tiny", "engine=floppy"], "floppy"),
    "negative iters": (["tiny", "iters=-3"], "iters=-3"),
    "save_interval > iters": (["tiny", "iters=2", "save_interval=3"], "save_interval=3"),
    "shell metacharacters": (["tiny", "dp=2;touch INJECTED"], "dp=2;touch INJECTED"),
    "shell metacharacters in text": (["tiny", "ckpt_dir=/tmp/$(touch INJECTED)"], "ckpt_dir="),
    "missing HF config path": (["/nonexistent/model/config.json"], "/nonexistent/model/config.json"),
    "non-numeric float": (["tiny", "lr=big"], "lr=big"),
    "not a finite number": (["tiny", "lr=nan"], "lr=nan"),
    "infinite number": (["tiny", "rope_theta=inf"], "rope_theta=inf"),
    "checkpoints on a pseudo file system": (["tiny", "ckpt_dir=/proc/x"], "ckpt_dir=/proc/x"),
    "checksums of objects": (["tiny", "checksums=on", "ckpt_dir=s3://bucket/runs"], "checksums=on"),
    "unknown checksums mode": (["tiny", "checksums=md5"], "checksums=md5"),
    "unknown env_cache": (["tiny", "env_cache=cold"], "env_cache=cold"),
    "a staging folder that is missing": (["tiny", "env_stage=/nonexistent/stage"], "env_stage=/nonexistent/stage"),
    "a staging folder that is not writable": (["tiny", "env_stage=/proc"], "env_stage=/proc: not writable"),
    "staging on several nodes": (["tiny", "dp=2", "nodes=2", "launcher=slurm", "env_stage=/tmp"], "this node only"),
    "results into a device file": (["tiny", "results_dir=/dev/null"], "results_dir=/dev/null"),
    "an option of another engine": (["tiny", "engine=dcp", "async_take=true"], "engine torchsnapshot"),
    "a key of another command": (["tiny", "dir=/tmp"], "baseline"),
    "misspelt key": (["tiny", "tpp=2"], "did you mean tp"),
    "unknown stack": (["tiny", "stack=megatron"], "stack=megatron"),
    "fsdp2 with tensor parallelism": (["tiny", "stack=fsdp2", "tp=2"], "tp=2"),
    "fsdp2 with pipeline parallelism": (["tiny", "stack=fsdp2", "pp=2"], "pp=2"),
    "fsdp2 with an engine of DeepSpeed's": (["tiny", "stack=fsdp2", "engine=lazy"], "engine=lazy"),
    "fsdp2 emulated": (["tiny", "stack=fsdp2", "emulate=true"], "emulate=true"),
    "fsdp2 planned": (["plan", "tiny", "stack=fsdp2"], "stack=fsdp2"),
    # work that cannot fit is refused before any (issue 28): memory and CPUs of this node, a sweep's size, a plan's
    "a thousand ranks on one node": (["tiny", "dp=1000"], "1000 ranks need"),
    "more ranks than the CPUs can start": (["tiny", "dp=24"], "24 ranks on this node's"),
    "ranks per node above the node": (["tiny", "dp=2", "nodes=1", "ranks_per_node=1000", "launcher=torchrun"],
                                      "dp=2 does not match"),
    "a model larger than the node": (["13B"], "need"),
    # several nodes (issue 24): only Slurm/PBS, or DeepSpeed's launcher and torchrun inside a Slurm allocation
    "torchrun across nodes outside an allocation": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1",
                                                     "launcher=torchrun"], "outside a Slurm allocation"),
    "DeepSpeed's launcher across nodes outside an allocation": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1"],
                                                                "nodes=2 with launcher=local"),
    "a hundred million layers": (["plan", "70B", "num_hidden_layers=100000000"], "num_hidden_layers=100000000"),
    "more ranks than any job": (["plan", "70B", "tp=8", "dp=1000000"], "ranks; accepted: at most"),
    "a sweep of a thousand runs": (["tiny", "dp=1,2", "repeats=500"], "more than max_runs=64"),
    "repeats beyond max_runs": (["tiny", "repeats=65"], "max_runs=65"),
    "no shrink": (["70B", "shrink=0"], "shrink=0"),
    # values that can only fail at launch are checked before it (issue 31)
    "a port out of range": (["tiny", "master_port=99999"], "master_port=99999"),
    "a GPU this machine does not have": (["tiny", "device=cuda"], "device=cuda"),
    # ZeRO stages (issue 25): what DeepSpeed or the harness cannot take with stage 2 or 3
    "no such ZeRO stage": (["tiny", "zero=4"], "zero=4"),
    "ZeRO-3 with pipeline parallelism": (["tiny", "zero=3", "pp=2"], "zero=3 with pp=2"),
    "ZeRO stage for fsdp2": (["tiny", "stack=fsdp2", "zero=3", "dp=2"], "zero=3"),
    # MLPerf Storage's checkpoint workloads (issue 25): the workload fixes its model, layout and method
    "no such MLPerf workload": (["mlperf", "llama3-9b"], "llama3-9b"),
    "a layout key of an MLPerf workload": (["mlperf", "llama3-8b", "tp=2"], "tp=: fixed by the MLPerf workload"),
    "a shape key of an MLPerf workload": (["mlperf", "llama3-8b", "hidden_size=64"], "hidden_size="),
    "an MLPerf workload with no reads": (["mlperf", "llama3-8b", "reads=0"], "reads=0"),
    "an MLPerf workload dry run": (["mlperf", "llama3-8b", "dry_run=true"], "dry_run=: not taken by mlperf"),
    "a subset of a trained run": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1", "subset=true"],
                                  "subset=true: only an emulated"),
    "a subset of one node": (["tiny", "dp=2", "emulate=true", "subset=true"], "subset=true with nodes=1"),
    "a subset through Slurm": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1", "emulate=true", "subset=true",
                                "launcher=slurm"], "subset=true with launcher=slurm"),
    # the prediction model (issue 26)
    "a calibration that does not exist": (["tiny", "calibration=nope"], "calibration=nope"),
    "a calibration that is not one": (["predict", "tiny", "calibration=/etc/hostname"], "calibration=/etc/hostname"),
    "one bandwidth of two": (["predict", "tiny", "write_gbps=1"], "write_gbps=: give write_gbps= and read_gbps="),
    "a bandwidth of zero": (["predict", "tiny", "write_gbps=0", "read_gbps=1"], "write_gbps=0"),
    "fsdp2 predicted": (["predict", "tiny", "stack=fsdp2"], "stack=fsdp2"),
    "a predict key in a run": (["tiny", "read_gbps=2"], "predict"),
    "an MLPerf workload larger than its memory": (["mlperf", "llama3-8b", "emulate_memory_gib=1"],
                                                  "or a smaller model (shrink=; the workload llama3-8b fixes tp"),
    # issue 40: every number and path bounded and normalised on one path (spec/keys.py, files/filesystem.py)
    "a full-width digit": (["tiny", "tp=２"], "tp=２: contains characters outside ASCII"),
    "iters beyond any run": (["tiny", "iters=100000000000"], "iters=100000000000: must be at most 2,147,483,647"),
    "a path leaving its folder through ..": (["tiny", "ckpt_dir=relative/ckpt/" + "../" * 16 + "proc/x"],
                                             "/proc is on a proc file system"),
    "writer threads beyond bound": (["tiny", "engine=lazy", "writers=100000000"], "writers=100000000: must be at most"),
    "a timeout beyond bound": (["tiny", "timeout=99999999999999"], "timeout=99999999999999: must be at most"),
    "a value of 10,000 characters": (["tiny", "lr=" + "1" * 10000], "lr=: a value of 10,000 characters"),
    "an unknown command": (["frobnicate", "tiny"], "unknown model 'frobnicate', and not a command either"),
    # the study (issue 56): what no cell can be made of, refused before any is planned or run
    "a study on no GPUs": (["study", "gpus=0"], "gpus=0"),
    "a study strategy whose tp divides no kv heads": (["study", "models=3B", "strategies=tp3"],
                                                      "tp=3 does not divide num_key_value_heads=8"),
    "a study strategy whose pp divides no layers": (["study", "models=3B", "strategies=tp4-pp3"],
                                                    "pp=3 does not divide the 28 layers"),
    "a study model no strategy places": (["study", "models=70B", "gpus=8"], "no strategy places 70B on gpus=8"),
    "a study time limit below its planned table": (["study", "models=tiny", "gpus=2", "time_limit=0.1"],
                                                   "time_limit=0.1 min: the planned-only table alone takes"),
    "a study layout key": (["study", "tp=2"], "tp=: set by the study"),
    "a study resumed from no study": (["study", "resume=/tmp"], "resume=/tmp: not a study folder"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, tmp_path):
    tokens, named = CASES[name]
    results = tmp_path / "results"
    proc = subprocess.run([str(REPO / "submit-job.sh"), *tokens, f"results_dir={results}"], cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and len(lines[0]) < 1500  # a value is never echoed beyond its bound
    assert not results.exists()
    assert not (tmp_path / "INJECTED").exists() and not (REPO / "INJECTED").exists()


def test_unsafe_yaml_preset(tmp_path):
    preset = tmp_path / "evil.yaml"
    preset.write_text("!!python/object/apply:os.system ['touch INJECTED']\n")
    proc = subprocess.run([str(REPO / "submit-job.sh"), str(preset), f"results_dir={tmp_path / 'r'}"],
                          cwd=tmp_path, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not safe YAML" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "INJECTED").exists() and not (tmp_path / "r").exists()


def test_help_lists_keys_models_engines():
    proc = subprocess.run([str(REPO / "submit-job.sh"), "--help"], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for word in ("tp=", "save_interval=", "tiny", "70B", "default"):
        assert word in proc.stdout


def test_a_port_in_use_is_refused_before_launch(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([str(REPO / "submit-job.sh"), "tiny", f"master_port={port}",
                               f"results_dir={tmp_path / 'results'}"], cwd=tmp_path, check=False, capture_output=True,
                              text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"master_port={port}" in lines[0], proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("spec_json, named", [
    ("{}", "is not a run's spec"),
    ('{"model": "tiny", ', "not readable JSON"),
    ("[1, 2]", "holds no run"),
    (None, "not a run directory (no spec.json)"),
])
def test_a_malformed_run_folder_is_one_line_to_restart(tmp_path, spec_json, named):
    run = tmp_path / "run"
    run.mkdir()
    if spec_json is not None:
        (run / "spec.json").write_text(spec_json)
    (run / "status.json").write_text('{"state": "complete", "reason": null}')
    proc = subprocess.run([str(REPO / "submit-job.sh"), "restart", f"run={run}"], cwd=tmp_path, check=False,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, \
        proc.stderr
    assert sorted(p.name for p in run.iterdir()) == sorted(["status.json"] + (["spec.json"] if spec_json else []))


def test_a_file_a_command_writes_is_checked_first(tmp_path):
    for out, named in (("/proc/x.json", "/proc is on a proc file system"), (str(tmp_path), "a directory")):
        proc = subprocess.run([str(REPO / "submit-job.sh"), "calibrate", f"runs={REPO / 'tests' / 'data' / 'results'}",
                               f"out={out}"], cwd=tmp_path, check=False, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and f"out={out}: {named}" in lines[0], proc.stderr


def test_report_without_a_folder_names_the_command(tmp_path):
    proc = subprocess.run([str(REPO / "submit-job.sh"), "report"], cwd=tmp_path, check=False, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "./submit-job.sh report RUN_OR_SWEEP_DIR" in lines[0]


def test_a_python_that_is_not_there(tmp_path):
    proc = subprocess.run([str(REPO / "submit-job.sh"), "tiny"], cwd=tmp_path, check=False, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "RH_PYTHON": "/nonexistent/python"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines == [lines[0]] and lines[0].startswith("error: RH_PYTHON=/nonexistent/python")


@pytest.mark.parametrize("argv, says", [
    (["plan", "--help"], "plan keys:"),
    (["help", "restart"], "restart keys:"),
    (["restart", "-h"], "restart keys:"),
    (["predict", "--help"], "predict keys:"),
    (["study", "--help"], "study keys:"),
    (["tiny", "--help"], "layout keys:"),
])
def test_every_command_has_its_help(argv, says):
    proc = subprocess.run([str(REPO / "submit-job.sh"), *argv], check=False, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "" and says in proc.stdout, proc.stderr
    assert proc.stdout.startswith("usage: ./submit-job.sh ")


def test_a_pipe_closed_early_ends_quietly():
    proc = subprocess.run(f"{REPO / 'submit-job.sh'} plan 70B tp=8 pp=4 dp=2 | head -n 1", shell=True, check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("plan: 70B") and "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr
