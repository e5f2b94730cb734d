"""Every user mistake, typed into ./submit-job.sh: exit code 2, one line on stderr, nothing created.

CASES is the corpus (docs/faults.md counts its rows): each row the input, and the words the one line must hold (the
value as given, and what is wrong with it). It runs in this process, through the command line's own entry
(restart_harness.cli.main), in a fresh folder: nothing may appear there. `{tmp}` in an input is that folder, which
holds a loop of symbolic links (loop1 -> loop2 -> loop1), a file (afile) and an empty folder (empty). The
environment variables the launcher script reads (scripts/env.sh) go through ./submit-job.sh itself (ENV_CASES)."""

from __future__ import annotations

import os
import subprocess

import pytest
from refusals import REPO, fill, made, refused, submitted, tree, typed

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
    "more ranks than the CPUs can start": (["tiny", "dp=24"], "24 ranks"),  # on its CPUs, or its memory first
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
    "a layout key of an MLPerf workload": (["mlperf", "llama3-8b", "tp=2"], "tp=2: fixed by the MLPerf workload"),
    "a shape key of an MLPerf workload": (["mlperf", "llama3-8b", "hidden_size=64"], "hidden_size="),
    "an MLPerf workload with no reads": (["mlperf", "llama3-8b", "reads=0"], "reads=0"),
    "an MLPerf workload dry run": (["mlperf", "llama3-8b", "dry_run=true"], "dry_run=true: not taken by mlperf"),
    "a subset of a trained run": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1", "subset=true"],
                                  "subset=true: only an emulated"),
    "a subset of one node": (["tiny", "dp=2", "emulate=true", "subset=true"], "subset=true with nodes=1"),
    "a subset through Slurm": (["tiny", "dp=2", "nodes=2", "ranks_per_node=1", "emulate=true", "subset=true",
                                "launcher=slurm"], "subset=true with launcher=slurm"),
    # the prediction model (issue 26)
    "a calibration that does not exist": (["tiny", "calibration=nope"], "calibration=nope"),
    "a calibration that is not one": (["predict", "tiny", "calibration=/etc/hostname"], "calibration=/etc/hostname"),
    "one bandwidth of two": (["predict", "tiny", "write_gbps=1"], "write_gbps=1: give write_gbps= and read_gbps="),
    "a bandwidth of zero": (["predict", "tiny", "write_gbps=0", "read_gbps=1"], "write_gbps=0"),
    "fsdp2 predicted": (["predict", "tiny", "stack=fsdp2"], "stack=fsdp2"),
    "a predict key in a run": (["tiny", "read_gbps=2"], "predict"),
    "an MLPerf workload larger than its memory": (["mlperf", "llama3-8b", "emulate_memory_gib=0.1"],
                                                  "streaming its files needs 0.25 GiB of memory"),
    # issue 40: every number and path bounded and normalised on one path (spec/keys.py, files/fsfacts.py)
    "a full-width digit": (["tiny", "tp=２"], "tp=２: contains characters outside ASCII"),
    "iters beyond any run": (["tiny", "iters=100000000000"], "iters=100000000000: must be at most 2,147,483,647"),
    "a path leaving its folder through ..": (["tiny", "ckpt_dir=relative/ckpt/" + "../" * 16 + "proc/x"],
                                             "/proc is on a proc file system"),
    "writer threads beyond bound": (["tiny", "engine=lazy", "writers=100000000"], "writers=100000000: must be at most"),
    "a timeout beyond bound": (["tiny", "timeout=99999999999999"], "timeout=99999999999999: must be at most"),
    "a value of 10,000 characters": (["tiny", "lr=" + "1" * 10000], "lr=: a value of 10,000 characters"),
    "an unknown command": (["frobnicate", "tiny"], "unknown model 'frobnicate', and not a command either"),
    # issue 58: work bounded by the harness's own prediction (each key alone is bounded; their product here)
    "a micro-batch of a hundred million": (["tiny", "micro_batch=100000000"], "the checkpoint phase would take at least"),
    "a billion accumulation steps": (["tiny", "grad_accum=1000000000"], "grad_accum=1000000000"),
    "a hundred million steps after the restart": (["tiny", "after=100000000"], "the restart phase would take at least"),
    "a hundred million steps": (["tiny", "iters=100000000", "save_interval=100000000"], "iters=100000000 steps"),
    "a launch shorter than its start-up": (["tiny", "timeout=2"], "more than timeout=2 s"),
    # issue 58: paths that cannot be followed, resolved once where they are given
    "checkpoints under a loop of links": (["tiny", "ckpt_dir={tmp}/loop1/x"], "loop1/x: a loop of symbolic links"),
    "results in a loop of links": (["tiny", "results_dir={tmp}/loop1"], "loop1: a loop of symbolic links"),
    "results in an unknown user's home": (["tiny", "results_dir=~nosuchuser/r"], "results_dir=~nosuchuser/r: no user"),
    "checkpoints in an unknown user's home": (["tiny", "ckpt_dir=~nosuchuser/c"], "ckpt_dir=~nosuchuser/c: no user"),
    "staging in an unknown user's home": (["tiny", "env_stage=~nosuchuser/s"], "env_stage=~nosuchuser/s: no user"),
    "a report into an unknown user's home": (["report", ".", "-o", "~nosuchuser/r"], "out_dir=~nosuchuser/r: no user"),
    "a report of a loop": (["report", "{tmp}/loop1"], "loop1: a loop of symbolic links"),
    "a baseline of a loop": (["baseline", "dir={tmp}/loop1"], "dir={tmp}/loop1: a loop"),
    "a restart of a loop": (["restart", "run={tmp}/loop1"], "run={tmp}/loop1: a loop"),
    "cleaning a loop": (["clean", "folder={tmp}/loop1"], "folder={tmp}/loop1: a loop"),
    "a matrix into a loop": (["matrix", "results_dir={tmp}/loop1"], "results_dir={tmp}/loop1: a loop"),
    "a matrix into a pseudo file system": (["matrix", "results_dir=/proc/x"], "results_dir=/proc/x: /proc is on"),
    "results into a file": (["tiny", "results_dir={tmp}/afile"], "afile exists and is not a directory"),
    "checkpoints under a file": (["tiny", "ckpt_dir={tmp}/afile/x"], "afile exists and is not a directory"),
    # issue 58: the value as given, never dropped (one formatter of refusals: errors.refused)
    "one bandwidth of two, as typed": (["predict", "small", "write_gbps=5"], "write_gbps=5: give write_gbps="),
    "a layout key of an MLPerf preset in any case": (["mlperf", "llama3-8B", "tp=2"], "tp=2: fixed by the MLPerf"),
    "a restart layout the model cannot take": (["plan", "tiny", "to_tp=3"], "to_tp=3: tp=3 does not divide"),
    "an env hook that is a folder": (["tiny", "env_hook=/etc"], "env_hook=/etc: a directory"),
    # issue 58: a fresh probe of wrong inputs across every command (docs/faults.md: how they were chosen)
    "no steps": (["tiny", "iters=0"], "iters=0: must be a positive integer"),
    "no save interval": (["tiny", "save_interval=0"], "save_interval=0"),
    "no sequence": (["tiny", "seq_len=0"], "seq_len=0"),
    "no micro-batch": (["tiny", "micro_batch=0"], "micro_batch=0"),
    "fp16": (["tiny", "precision=fp16"], "precision=fp16: accepted values are bf16, fp32"),
    "a TPU": (["tiny", "device=tpu"], "device=tpu"),
    "an empty engine": (["tiny", "engine="], "engine=: empty value"),
    "a value without a key": (["tiny", "=2"], "'=2': malformed"),
    "a fractional degree": (["tiny", "tp=1.5"], "tp=1.5: not an integer"),
    "a hexadecimal degree": (["tiny", "tp=0x10"], "tp=0x10: not an integer"),
    "a negative learning rate": (["tiny", "lr=-1"], "lr=-1: must be a positive number"),
    "an overflowing learning rate": (["tiny", "lr=1e400"], "lr=1e400: must be a finite number"),
    "a negative seed": (["tiny", "seed=-1"], "seed=-1"),
    "keep maybe": (["tiny", "keep=maybe"], "keep=maybe: accepted values are true, false"),
    "a hot cache": (["tiny", "cache=hot"], "cache=hot"),
    "an unknown launcher": (["tiny", "launcher=kubernetes"], "launcher=kubernetes: accepted values are local"),
    "no nodes": (["tiny", "nodes=0"], "nodes=0"),
    "no ranks per node": (["tiny", "ranks_per_node=0"], "ranks_per_node=0"),
    "a negative ZeRO stage": (["tiny", "zero=-1"], "zero=-1"),
    "an empty stack": (["tiny", "stack="], "stack=: empty value"),
    "checksums in capitals": (["tiny", "checksums=ON"], "checksums=ON: accepted values are auto, on, off"),
    "no threads": (["tiny", "threads=0"], "threads=0"),
    "no timeout": (["tiny", "timeout=0"], "timeout=0"),
    "port zero": (["tiny", "master_port=0"], "master_port=0"),
    "a walltime without hours": (["tiny", "walltime=25:00"], "walltime=25:00: accepted HH:MM:SS"),
    "a queue with a semicolon": (["tiny", "queue=a;b"], "queue=a;b: contains characters outside"),
    "a missing env hook": (["tiny", "env_hook=/nonexistent.sh"], "env_hook=/nonexistent.sh: no such file"),
    "a calibration that is a password file": (["tiny", "calibration=../../etc/passwd"], "calibration=../../etc/passwd"),
    "an S3 location without a bucket": (["tiny", "ckpt_dir=s3://"], "ckpt_dir=s3://"),
    "a Google Cloud location": (["tiny", "ckpt_dir=gs://bucket/x"], "ckpt_dir=gs://bucket/x: no storage target"),
    "a file URL": (["tiny", "ckpt_dir=file:///tmp/x"], "ckpt_dir=file:///tmp/x"),
    "lazy emulated": (["tiny", "emulate=true", "engine=lazy"], "emulate=true cannot emulate engine=lazy"),
    "no emulation memory": (["tiny", "emulate=true", "emulate_memory_gib=0"], "emulate_memory_gib=0"),
    "a shrink that breaks rotary embeddings": (["tiny", "shrink=3"], "shrink=3: head dimension"),
    "no layers": (["tiny", "num_hidden_layers=0"], "num_hidden_layers=0"),
    "a hidden size heads cannot split": (["tiny", "hidden_size=7"], "hidden_size=7 is not divisible"),
    "no vocabulary": (["tiny", "vocab_size=0"], "vocab_size=0"),
    "no repeats": (["tiny", "repeats=0"], "repeats=0"),
    "no runs allowed": (["tiny", "max_runs=0"], "max_runs=0"),
    "a restart spelt as a phase without a run": (["tiny", "phase=restart"], "restart takes no MODEL"),
    "an unknown phase": (["tiny", "phase=bogus"], "phase=bogus"),
    "anatomy maybe": (["tiny", "anatomy=maybe"], "anatomy=maybe"),
    "a trace of two": (["tiny", "trace=2"], "trace=2"),
    "attribution yes": (["tiny", "attribution=yes"], "attribution=yes: accepted values are off, python, native"),
    "no lazy writers": (["tiny", "engine=lazy", "writers=0"], "writers=0"),
    "no torchsnapshot memory": (["tiny", "engine=torchsnapshot", "memory_budget_mib=0"], "memory_budget_mib=0"),
    "an async dcp maybe": (["tiny", "engine=dcp", "async_save=maybe"], "async_save=maybe"),
    "an empty model": ([""], "unknown model ''"),
    "spaces around =": (["tiny", "tp = 2"], "'tp = 2': malformed"),
    "a key in capitals": (["tiny", "TP=2"], "unknown key 'TP'"),
    "a key twice": (["tiny", "tp=2", "tp=2"], "tp: given twice (tp=2 and tp=2)"),
    "a sweep of a model and nothing": (["tiny,", "dp=2"], "MODEL=tiny,: a sweep list needs distinct"),
    "a sweep of empty values": (["tiny", "dp=,"], "dp=,: a sweep list"),
    "a sweep of one value twice": (["tiny", "dp=2,2"], "dp=2,2: a sweep list"),
    "a sweep of result folders": (["tiny", "results_dir=a,b"], "results_dir=a,b: a sweep takes one results_dir"),
    "a model folder without a config": (["{tmp}/empty"], "no such HF config file"),
    "a model config that is not there": (["{tmp}/model.json"], "model.json': no such HF config file"),
    "plan without a model": (["plan"], "missing MODEL"),
    "plan as XML": (["plan", "tiny", "plan=xml"], "plan=xml"),
    "plan every detail": (["plan", "tiny", "detail=all"], "detail=all"),
    "plan at no bandwidth": (["plan", "tiny", "bandwidth_gbps=0"], "bandwidth_gbps=0"),
    "plan at a negative bandwidth": (["plan", "tiny", "bandwidth_gbps=-1"], "bandwidth_gbps=-1"),
    "plan a restart at no pipeline": (["plan", "tiny", "to_pp=0"], "to_pp=0"),
    "plan a DCP restart elsewhere": (["plan", "tiny", "engine=dcp", "to_dp=2"], "engine=dcp cannot restart"),
    "plan 70B at tp=7": (["plan", "70B", "tp=8", "to_tp=7"], "to_tp=7: tp=7 does not divide"),
    "predict without a model": (["predict"], "missing MODEL"),
    "predict as CSV": (["predict", "tiny", "predict=csv"], "predict=csv"),
    "predict for no CPUs": (["predict", "tiny", "cpus_per_node=0"], "cpus_per_node=0"),
    "predict a negative metadata rate": (["predict", "tiny", "metadata_ops_s=-5"], "metadata_ops_s=-5"),
    "predict a NaN bandwidth": (["predict", "tiny", "write_gbps=1", "read_gbps=nan"], "read_gbps=nan"),
    # the crossover's range (issue 55): checkpoint sizes from 1 KiB to 1 PiB, the smallest below the largest
    "a crossover range upside down": (["predict", "tiny", "crossover_min_bytes=1G", "crossover_max_bytes=1M"],
                                      "crossover_min_bytes=1G: not below crossover_max_bytes"),
    "a crossover range ending below its default start": (["predict", "tiny", "crossover_max_bytes=512K"],
                                                          "crossover_max_bytes=512K: not above"),
    "a crossover range beyond a petabyte": (["predict", "tiny", "crossover_max_bytes=2048T"],
                                            "crossover_max_bytes=2048T"),
    "a crossover range from ten bytes": (["predict", "tiny", "crossover_min_bytes=10"], "crossover_min_bytes=10"),
    "a crossover range in exabytes": (["predict", "tiny", "crossover_max_bytes=1E"], "crossover_max_bytes=1E"),
    "a crossover key in a run": (["tiny", "crossover_max_bytes=1T"], "predict"),
    "calibrate nothing": (["calibrate"], "calibrate needs runs="),
    "calibrate missing runs": (["calibrate", "runs=/nonexistent", "out=x.json"],
                               "runs=/nonexistent: /nonexistent: no such directory"),
    "calibrate one missing folder of two": (["calibrate", "runs={tmp}/empty,/nonexistent", "out=x.json"],
                                            "runs={tmp}/empty,/nonexistent: /nonexistent: no such directory"),
    "calibrate an empty folder": (["calibrate", "runs={tmp}/empty", "out=x.json"], "no finished run directory"),
    "calibrate without runs": (["calibrate", "out=x.json"], "calibrate needs runs="),
    "calibrate into a device": (["calibrate", "runs={tmp}/empty", "out=/dev/null"], "out=/dev/null: /dev is on"),
    "restart nothing": (["restart"], "restart needs run="),
    "restart an empty run": (["restart", "run="], "run=: empty value"),
    "restart a missing run": (["restart", "run=/nonexistent"], "run=/nonexistent: not a run directory"),
    "restart an empty folder": (["restart", "run={tmp}/empty"], "not a run directory (no spec.json)"),
    "restart a model": (["restart", "tiny", "run={tmp}"], "restart takes no MODEL"),
    "a baseline of nothing": (["baseline"], "baseline needs dir="),
    "a baseline of a missing folder": (["baseline", "dir=/nonexistent"], "dir=/nonexistent: no such directory"),
    "a baseline of /proc": (["baseline", "dir=/proc"], "dir=/proc: not writable"),
    "a baseline with dd": (["baseline", "dir={tmp}", "tool=dd"], "tool=dd"),
    "a baseline of no bytes": (["baseline", "dir={tmp}", "file_bytes=0"], "file_bytes=0"),
    "a baseline of no ranks": (["baseline", "dir={tmp}", "ranks=0"], "ranks=0"),
    "a baseline of a petabyte": (["baseline", "dir={tmp}", "file_bytes=1P"], "file_bytes=1P"),
    "a report of nothing there": (["report", "/nonexistent"], "RUN_OR_SWEEP_DIR=/nonexistent: no such file or directory"),
    "a report of an empty folder": (["report", "{tmp}/empty"], "no readable run in {tmp}/empty (skipped"),
    "a report of everything": (["report", "{tmp}/empty", "include=all"], "include=all: accepted: failed, dry"),
    "a report matching a semicolon": (["report", "{tmp}/empty", "match=a;b"], "match=a;b: contains characters"),
    "a report flag": (["report", "{tmp}/empty", "-x"], "-x: not an option of report"),
    "a report without its folder": (["report", "{tmp}/empty", "-o"], "-o: needs a folder"),
    "a report into /proc": (["report", "{tmp}/empty", "out_dir=/proc/x"], "out_dir=/proc/x: /proc is on"),
    "a matrix on a TPU": (["matrix", "device=tpu"], "device=tpu"),
    "a matrix layout of tp0": (["matrix", "layouts=tp0-pp1-dp1"], "layouts=tp0-pp1-dp1"),
    "a matrix of floppies": (["matrix", "engines=floppy"], "engines=floppy"),
    "a matrix of no GPUs": (["matrix", "gpus=0"], "gpus=0"),
    "a matrix launcher that is not one": (["matrix", "launcher=nope"], "launcher=nope"),
    "a matrix model that is not one": (["matrix", "model=nope"], "unknown model 'nope'"),
    "an MLPerf workload of no runs": (["mlperf", "llama3-8b", "runs=0"], "runs=0"),
    "an MLPerf workload of no checkpoints": (["mlperf", "llama3-8b", "checkpoints=0"], "checkpoints=0"),
    "an MLPerf workload shrunk to nothing": (["mlperf", "llama3-8b", "shrink=0"], "shrink=0"),
    "an MLPerf workload that is not one": (["mlperf", "nope"], "mlperf nope: not an MLPerf Storage"),
    "cleaning a missing folder": (["clean", "folder=/nonexistent"], "folder=/nonexistent: no such directory"),
    "cleaning runs from the future": (["clean", "older_than_hours=-1"], "older_than_hours=-1"),
    "cleaning larger than abc": (["clean", "larger_than=abc"], "larger_than=abc"),
    "cleaning maybe": (["clean", "apply=maybe"], "apply=maybe"),
    "cleaning a prefix with a semicolon": (["clean", "prefix=a;b"], "prefix=a;b"),
    # the study (issue 56): what no cell can be made of, refused before any is planned or run
    "a study on no GPUs": (["study", "gpus=0"], "gpus=0"),
    "a study strategy whose tp divides no kv heads": (["study", "models=3B", "strategies=tp3"],
                                                      "tp=3 does not divide num_key_value_heads=8"),
    "a study strategy whose pp divides no layers": (["study", "models=3B", "strategies=tp4-pp3"],
                                                    "pp=3 does not divide the 28 layers"),
    "a study model no strategy places": (["study", "models=70B", "gpus=8"], "no strategy places 70B on gpus=8"),
    # issue 66: the target's GPU memory too small for every strategy (the study places by gpu_memory_gib=)
    "a study GPU too small for every strategy": (["study", "models=tiny", "gpus=2", "gpu_memory_gib=0.0001"],
                                                 ("gpu_memory_gib=0.0001: the least model state a GPU would hold "
                                                  "is 50.54 MiB")),
    "a study time limit below its planned table": (["study", "models=tiny", "gpus=2", "time_limit=0.1"],
                                                   "time_limit=0.1 min: the planned-only table alone takes"),
    "a study layout key": (["study", "tp=2"], "tp=2: set by the study"),
    # what a bad-input sweep found (2026-11-29): each was accepted, launched, or a traceback
    "a study into a file": (["study", "fidelity=predicted", "results_dir={tmp}/afile"], "results_dir={tmp}/afile: "),
    "a study below a file": (["study", "fidelity=predicted", "results_dir={tmp}/afile/sub"], "{tmp}/afile exists"),
    "a study's checkpoints into a file": (["study", "fidelity=predicted", "ckpt_dir={tmp}/afile"], "ckpt_dir="),
    "a study's missing env hook": (["study", "fidelity=predicted", "env_hook=/nonexistent.sh"],
                                   "env_hook=/nonexistent.sh: no such file"),
    "a matrix engine twice": (["matrix", "engines=default,default"], "'default' given twice"),
    "a matrix layout twice": (["matrix", "layouts=tp1-pp1-dp1,tp1-pp1-dp1"], "'tp1-pp1-dp1' given twice"),
    "more MLPerf runs than max_runs": (["mlperf", "llama3-8b", "shrink=64", "runs=100000"],
                                       "runs=100000: more runs than max_runs=64"),
    "a failure campaign of nothing": (["endure"], "endure needs a MODEL first"),
    "a failure campaign as a dry run": (["endure", "tiny", "duration=60", "mtbf=30", "dry_run=true"],
                                        "dry_run=true: the campaign's own"),
    "a failure campaign repeated": (["endure", "tiny", "duration=60", "mtbf=30", "repeats=2"],
                                    "repeats=2: the campaign's own"),
    "a failure kind twice": (["endure", "tiny", "duration=60", "mtbf=30", "failures=rank,rank"],
                             "failures=rank,rank: accepted: a comma list of rank, job, save, each once"),
    "a baseline of a bucket without a name": (["baseline", "dir=s3://"], "dir=s3://: s3://: '' is not a bucket"),
    "emulation memory without emulation": (["tiny", "emulate_memory_gib=4"], "emulate_memory_gib=4: the file state"),
    "a study resumed from no study": (["study", "resume=/tmp"], "resume=/tmp: not a study folder"),
}

# The environment variables the docs name, where they are read: the launcher script (scripts/env.sh), the user cache
ENV_CASES = {
    "a Python that is false": ({"RH_PYTHON": "/bin/false"}, ["tiny"], "RH_PYTHON=/bin/false: not a Python"),
    "a Python that is a shell": ({"RH_PYTHON": "/bin/sh"}, ["tiny"], "RH_PYTHON=/bin/sh: not a Python"),
    "a Python without torch": ({"RH_PYTHON": "{tmp}/bare-python"}, ["tiny"], "it lacks torch, deepspeed"),
    "an environment switch that is a banana": ({"RH_VENV": "banana"}, ["tiny"], "RH_VENV=banana: accepted: 1"),
    "a cache that is a file": ({"RH_CACHE_DIR": "{tmp}/afile"}, ["tiny"], "RH_CACHE_DIR={tmp}/afile: {tmp}/afile exists"),
    "a cache on /proc": ({"RH_CACHE_DIR": "/proc/x"}, ["baseline", "dir={tmp}"], "RH_CACHE_DIR=/proc/x: /proc is on"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, tmp_path, monkeypatch, capsys):
    tokens, named = CASES[name]
    before = tree(made(tmp_path))
    code, err = typed(tokens, tmp_path, monkeypatch, capsys)
    refused(code, err, fill(named, tmp_path), before, tree(tmp_path))


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_bad_environment(name, tmp_path):
    env, tokens, named = ENV_CASES[name]
    before = tree(made(tmp_path))
    code, err = submitted(tokens, tmp_path, env)
    refused(code, err, fill(named, tmp_path), before, tree(tmp_path))


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
    (["report", "--help"], "report keys:"),
    (["help", "report"], "out_dir="),
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
