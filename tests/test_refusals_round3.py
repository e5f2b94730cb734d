"""Round three of bad inputs (issue 68), in the shape of tests/test_bad_input.py: each row exit code 2, one line on
stderr naming the value and what is accepted, no traceback, nothing created or changed.

CASES run through the command line's own entry (restart_harness.cli.main) in a fresh folder (made as test_bad_input
makes it: a loop of links, `afile`, `empty`); `{tmp}` is that folder, `{long}` a folder name of 256 bytes (one over
NAME_MAX), `{run}` a finished run of tests/data (never changed: its files are compared before and after). A `named`
ending in `$` must end the line. ENV_CASES set an environment variable for ./submit-job.sh. OUTCOMES are the
campaigns' one exit rule (campaigns/outcome.py) on the states a campaign's parts end in."""

from __future__ import annotations

import pytest
from refusals import RUN, fill, made, refused, submitted, tree, typed

NAME_MAX = "components (folder and file names) of at most 255 bytes"

CASES = {
    # a path component over 255 bytes, every path key and command: refused where the value is parsed (OSError 36)
    "results in a long folder": (["tiny", "results_dir={tmp}/{long}"], "results_dir={tmp}/{long}: a path component"),
    "results under a long folder": (["tiny", "results_dir={tmp}/{long}/r"], "a path component of 256 bytes"),
    "results in a long relative folder": (["tiny", "results_dir={long}"], NAME_MAX),
    "results in a folder of 300 bytes": (["tiny", "results_dir={tmp}/" + "b" * 300], "a path component of 300 bytes"),
    "results in a long folder above ..": (["tiny", "results_dir={tmp}/{long}/.."], NAME_MAX),
    "checkpoints in a long folder": (["tiny", "ckpt_dir={tmp}/{long}"], "ckpt_dir={tmp}/{long}: a path component"),
    "checkpoints under a long folder": (["tiny", "ckpt_dir={tmp}/x/{long}/y"], "ckpt_dir={tmp}/x/{long}/y: a path"),
    "a dry run's checkpoints in a long folder": (["tiny", "dry_run=true", "ckpt_dir={tmp}/{long}"], NAME_MAX),
    "staging in a long folder": (["tiny", "env_stage={tmp}/{long}"], "env_stage={tmp}/{long}: a path component"),
    "a dry run staging in a long folder": (["tiny", "dry_run=true", "env_stage={tmp}/{long}"], "env_stage="),
    "an env hook of a long name": (["tiny", "env_hook={tmp}/{long}.sh"], "env_hook={tmp}/{long}.sh: a path"),
    "a calibration of a long name": (["tiny", "calibration={tmp}/{long}.json"], "calibration={tmp}/{long}.json"),
    "a model config in a long folder": (["{tmp}/{long}/config.json"], "a path component of 256 bytes"),
    "a model preset of a long name": (["{tmp}/{long}.yaml"], "a path component of 261 bytes"),
    "a model folder of a long name": (["{tmp}/{long}"], "a path component of 256 bytes"),
    "a plan of a long model file": (["plan", "{tmp}/{long}.json"], "a path component of 261 bytes"),
    "a prediction of a long model file": (["predict", "{tmp}/{long}.yaml"], NAME_MAX),
    "a plan with checkpoints in a long folder": (["plan", "tiny", "ckpt_dir={tmp}/{long}"], "ckpt_dir="),
    "a prediction with results in a long folder": (["predict", "tiny", "results_dir={tmp}/{long}"], "results_dir="),
    "a sweep into a long folder": (["tiny", "dp=1,2", "results_dir={tmp}/{long}"], "results_dir={tmp}/{long}"),
    "a restart of a long folder": (["restart", "run={tmp}/{long}"], "run={tmp}/{long}: a path component"),
    "a restart under a long folder": (["restart", "run={tmp}/{long}/run"], "run={tmp}/{long}/run: a path"),
    "a restart staging in a long folder": (["restart", "run={run}", "env_stage={tmp}/{long}"], "env_stage="),
    "cleaning a long folder": (["clean", "folder={tmp}/{long}"], "folder={tmp}/{long}: a path component"),
    "a baseline of a long folder": (["baseline", "dir={tmp}/{long}"], "dir={tmp}/{long}: a path component"),
    "a report of a long folder": (["report", "{tmp}/{long}"], NAME_MAX),
    "a report into a long folder": (["report", "{tmp}/empty", "-o", "{tmp}/{long}"], "out_dir={tmp}/{long}"),
    "a report into a long out_dir": (["report", "{tmp}/empty", "out_dir={tmp}/{long}/r"], "out_dir="),
    "calibrating a long folder": (["calibrate", "runs={tmp}/{long}", "out=x.json"], "runs={tmp}/{long}: {tmp}/"),
    "calibrating a long folder second": (["calibrate", "runs={tmp}/empty,{tmp}/{long}", "out=x.json"], NAME_MAX),
    "a calibration written to a long name": (["calibrate", "runs={tmp}/empty", "out={tmp}/{long}.json"], "out="),
    "a matrix into a long folder": (["matrix", "results_dir={tmp}/{long}"], "results_dir={tmp}/{long}: a path"),
    "a study resumed from a long folder": (["study", "resume={tmp}/{long}"], "resume={tmp}/{long}: a path"),
    "a study of a long model file": (["study", "models={tmp}/{long}.yaml"], "models={tmp}/{long}.yaml: model"),
    "a study into a long folder": (["study", "models=tiny", "gpus=2", "results_dir={tmp}/{long}"], "results_dir="),
    "an MLPerf workload into a long folder": (["mlperf", "llama3-8b", "results_dir={tmp}/{long}"], "results_dir="),
    # rates and shapes valid alone whose figures are absurd: refused with the figure they would lead to
    "a write bandwidth of 1e-300": (["predict", "tiny", "write_gbps=1e-300", "read_gbps=1"],
                                    "write_gbps=1e-300: the checkpoint's 3,005,184 bytes would take 3.01e+297 s"),
    "a read bandwidth of 1e-300": (["predict", "tiny", "write_gbps=1", "read_gbps=1e-300"], "read_gbps=1e-300: the"),
    "both bandwidths of 1e-20": (["predict", "tiny", "write_gbps=1e-20", "read_gbps=1e-20"], "write_gbps=1e-20"),
    "a 70B write bandwidth of a byte a second": (["predict", "70B", "tp=8", "write_gbps=1e-9", "read_gbps=1"],
                                                 "write_gbps=1e-09: the checkpoint's"),
    "a metadata rate of 1e-300": (["predict", "tiny", "metadata_ops_s=1e-300"], "metadata_ops_s=1e-300: one operation"),
    "a metadata rate too slow for 8 ranks": (["predict", "70B", "tp=8", "metadata_ops_s=1e-7"], "for each of the 8"),
    "an environment metadata rate of 1e-300": (["predict", "tiny", "env_metadata_ops_s=1e-300"],
                                               "env_metadata_ops_s=1e-300: one operation"),
    "a planned bandwidth of 1e-300": (["plan", "tiny", "bandwidth_gbps=1e-300"], "bandwidth_gbps=1e-300: the"),
    "a planned 70B bandwidth of 100 bytes a second": (["plan", "70B", "tp=8", "bandwidth_gbps=1e-7"],
                                                      "bandwidth_gbps=1e-07"),
    "a study write bandwidth of 1e-300": (["study", "models=tiny", "gpus=2", "write_gbps=1e-300", "read_gbps=1"],
                                          "write_gbps=1e-300: the checkpoint's"),
    "a study metadata rate of 1e-300": (["study", "models=tiny", "gpus=2", "metadata_ops_s=1e-300"], "metadata_ops_s"),
    "a hidden size of a billion, planned": (["plan", "tiny", "hidden_size=1000000000"],
                                            "hidden_size=1000000000 intermediate_size=176"),
    "a hidden size of a billion, predicted": (["predict", "tiny", "hidden_size=1000000000"], "PiB (12 bytes a"),
    "a hidden size of a billion, run": (["tiny", "hidden_size=1000000000"], "hidden_size=1000000000"),
    "an intermediate size of two billion": (["plan", "7B", "intermediate_size=2000000000"],
                                            "intermediate_size=2000000000"),
    "a vocabulary of two billion at a million wide": (["plan", "tiny", "vocab_size=2000000000", "hidden_size=1000000"],
                                                      "vocab_size=2000000000"),
    "a thousand layers a hundred million wide": (["plan", "tiny", "num_hidden_layers=1000", "hidden_size=100000000"],
                                                 "num_hidden_layers=1000"),
    "a sweep over an absurd hidden size": (["tiny", "hidden_size=64,1000000000"], "in the sweep combination"),
    "an absurd shape in an MLPerf-sized plan": (["plan", "70B", "tp=8", "hidden_size=1048576"], "hidden_size=1048576"),
    # the campaigns' false successes (exit 0 with nothing run): refused before anything is made
    "a matrix of one layout no model splits": (["matrix", "layouts=tp3-pp1-dp1"], "none of its 8 cases can run here"),
    "a matrix of two such layouts": (["matrix", "layouts=tp3-pp1-dp1,tp5-pp1-dp1"], "none of its 16 cases"),
    "a matrix of one engine and one such layout": (["matrix", "engines=default", "layouts=tp3-pp1-dp1"],
                                                   "none of its 1 cases"),
    "a matrix deeper than the model": (["matrix", "layouts=tp1-pp9-dp1"], "pp=9 is larger than the 4"),
    "a matrix of a model no layout splits": (["matrix", "engines=default,lazy", "layouts=tp3-pp1-dp1"],
                                             "none of its 2 cases"),
    "a matrix through a scheduler that is not here": (["matrix", "engines=default", "launcher=pbs"],
                                                      "launcher=pbs needs qsub"),
    "a study of real runs no cell fits": (["study", "fidelity=real"], "fidelity=real: none of its 75 cells"),
    "a study emulated where no cell fits": (["study", "models=13B", "gpus=8", "fidelity=emulated"],
                                            "fidelity=emulated: none of its"),
    "a study shrunk into one byte": (["study", "models=tiny", "gpus=2", "fidelity=shrunk", "disk=1"],
                                     "fidelity=shrunk: none of its"),
    "a study through Slurm without sbatch working": (["study", "models=tiny", "gpus=2", "launcher=slurm"],
                                                     "launcher=slurm"),
    "a study through PBS without qsub": (["study", "models=tiny", "gpus=2", "launcher=pbs"],
                                         "accepted here: launcher=local, launcher=torchrun$"),
    # unknown or misspelt study keys: one line, not a 17-line TypeError
    "a misspelt study key": (["study", "engnes=lazy"], "unknown key 'engnes' (did you mean engines?)"),
    "a misspelt study models": (["study", "modles=3B"], "did you mean models?"),
    "a study key in capitals": (["study", "MODELS=3B"], "unknown key 'MODELS'"),
    "a colour for a study": (["study", "colour=blue"], "unknown key 'colour'"),
    "a misspelt study bandwidth": (["study", "write_gbs=1"], "did you mean write_gbps?"),
    "an engine option given to a study": (["study", "async_take=true"], "async_take=true: an option of engine"),
    "a baseline key given to a study": (["study", "dir=/tmp"], "dir=/tmp: a key of the baseline command"),
    "a plan key given to a study": (["study", "to_tp=2"], "to_tp=2: a key of the plan command"),
    "a restart key given to a study": (["study", "run=x"], "run=x: a key of the restart command"),
    # restart: an unknown key is unknown (not "fixed by its spec.json"); suggestions it takes
    "a colour for a restart": (["restart", "run={run}", "colour=blue"], "unknown key 'colour'"),
    "a misspelt restart key": (["restart", "run={run}", "cahce=warm"], "did you mean cache?"),
    "a restart key in capitals": (["restart", "run={run}", "REPEATS=2"], "unknown key 'REPEATS'"),
    "an option of another engine for a restart": (["restart", "run={run}", "async_take=true"],
                                                   "an option of engine torchsnapshot, not of engine default"),
    "a predict key for a restart": (["restart", "run={run}", "write_gbps=1"], "a key of the predict command"),
    "a dry restart": (["restart", "run={run}", "dry_run=true"], "it takes no dry_run"),
    "a restart into other results": (["restart", "run={run}", "results_dir={tmp}/r"], "it takes no results_dir"),
    "a restart of another shape": (["restart", "run={run}", "hidden_size=128"], "fixed by its spec.json"),
    "a restart of another engine": (["restart", "run={run}", "engine=lazy"], "engine=lazy: cannot change"),
    "a restart through PBS": (["restart", "run={run}", "launcher=pbs"],
                              "accepted here: launcher=local, launcher=torchrun$"),
    # dry_run=true: every path checked as a run's is (env_stage as ckpt_dir), not the room it would take
    "a dry run staging in a missing folder": (["tiny", "dry_run=true", "env_stage=/nonexistent/stage"],
                                              "env_stage=/nonexistent/stage: no such folder"),
    "a dry run staging in /proc": (["tiny", "dry_run=true", "env_stage=/proc"], "env_stage=/proc: not writable"),
    "a dry run staging in a file": (["tiny", "dry_run=true", "env_stage={tmp}/afile"], "env_stage={tmp}/afile: no such"),
    "a dry run staging across nodes": (["tiny", "dry_run=true", "dp=2", "nodes=2", "launcher=slurm",
                                        "env_stage={tmp}/empty"], "this node only"),
    "a dry run staging in a loop": (["tiny", "dry_run=true", "env_stage={tmp}/loop1"], "env_stage={tmp}/loop1"),
}

# The environment variables, declared once (spec/environment.py) and parsed as keys: every command checks them first
ENV_CASES = {
    "a fault that is garbage": ({"RH_FAULT": "garbage"}, ["plan", "tiny"], "RH_FAULT=garbage: 'garbage' is not a fault"),
    "a fault without a point": ({"RH_FAULT": "kill"}, ["predict", "tiny"], "RH_FAULT=kill: 'kill' is not a fault"),
    "a fault with an empty point": ({"RH_FAULT": "kill@"}, ["plan", "tiny"], "RH_FAULT=kill@: "),
    "a fault without an action": ({"RH_FAULT": "@save"}, ["tiny"], "RH_FAULT=@save: '@save' is not a fault"),
    "a fault at no such point": ({"RH_FAULT": "kill@nowhere"}, ["baseline", "dir={tmp}"], "RH_FAULT=kill@nowhere"),
    "a fault of no such action": ({"RH_FAULT": "explode@save"}, ["clean", "folder={tmp}"], "RH_FAULT=explode@save"),
    "a hang at a save": ({"RH_FAULT": "hang@save"}, ["plan", "tiny"], "accepted: ACTION@POINT of kill@save"),
    "a tear at a step": ({"RH_FAULT": "tear@step"}, ["study", "models=tiny", "gpus=2"], "RH_FAULT=tear@step"),
    "a fault at rank x": ({"RH_FAULT": "kill@save:rank=x"}, ["plan", "tiny"], "rank=x is not a non-negative integer"),
    "a fault at rank -1": ({"RH_FAULT": "kill@save:rank=-1"}, ["tiny"], "rank=-1 is not a non-negative integer"),
    "a fault at a rank without a number": ({"RH_FAULT": "kill@save:rank"}, ["plan", "tiny"], "'rank' is not a selector"),
    "a fault with a colour": ({"RH_FAULT": "kill@save:colour=1"}, ["plan", "tiny"], "'colour=1' is not a selector"),
    "a fault at two ranks": ({"RH_FAULT": "kill@save:rank=1:rank=2"}, ["plan", "tiny"], "rank given twice"),
    "a fault beyond any step": ({"RH_FAULT": "kill@save:step=99999999999"}, ["plan", "tiny"], "step=99999999999"),
    "a fault with a semicolon": ({"RH_FAULT": "kill@save;touch INJECTED"}, ["plan", "tiny"],
                                 "RH_FAULT=kill@save;touch INJECTED: contains characters outside"),
    "a fault with a full-width digit": ({"RH_FAULT": "kill@save:rank=１"}, ["plan", "tiny"], "outside ASCII"),
    "a fault of 2,000 characters": ({"RH_FAULT": "k" * 2000}, ["plan", "tiny"], "RH_FAULT=: a value of 2,000"),
    "a fault for a report": ({"RH_FAULT": "kill@save:"}, ["report", "{tmp}/empty"], "'' is not a selector"),
    "strace twice": ({"RH_STRACE": "2"}, ["plan", "tiny"], "RH_STRACE=2: accepted values are"),
    "strace maybe": ({"RH_STRACE": "maybe"}, ["tiny"], "RH_STRACE=maybe"),
    "strace minus one": ({"RH_STRACE": "-1"}, ["predict", "tiny"], "RH_STRACE=-1"),
    "strace ten": ({"RH_STRACE": "10"}, ["baseline", "dir={tmp}"], "RH_STRACE=10"),
    "strace with a semicolon": ({"RH_STRACE": "1;2"}, ["plan", "tiny"], "RH_STRACE=1;2"),
    "a cache in a long folder": ({"RH_CACHE_DIR": "{tmp}/{long}"}, ["plan", "tiny"], "RH_CACHE_DIR={tmp}/{long}: a path"),
    "a cache under a long folder": ({"RH_CACHE_DIR": "{tmp}/{long}/c"}, ["tiny"], "a path component of 256 bytes"),
    "a cache with a space": ({"RH_CACHE_DIR": "{tmp}/a b"}, ["plan", "tiny"], "RH_CACHE_DIR={tmp}/a b: contains"),
    "a cache of 5,000 characters": ({"RH_CACHE_DIR": "/" + "c" * 4999}, ["plan", "tiny"], "a value of 5,000"),
    "a cache of a shell command": ({"RH_CACHE_DIR": "/tmp/$(touch INJECTED)"}, ["plan", "tiny"], "RH_CACHE_DIR=/tmp/$("),
    "a py-spy of a long name": ({"RH_PY_SPY": "{tmp}/{long}"}, ["plan", "tiny"], "RH_PY_SPY={tmp}/{long}: a path"),
    "a py-spy with a semicolon": ({"RH_PY_SPY": "py-spy;x"}, ["predict", "tiny"], "RH_PY_SPY=py-spy;x: contains"),
}

# the one exit rule of the campaigns: (the states their parts ended in, the exit code)
OUTCOMES = {
    "nothing at all": ([], 1),
    "every part complete": (["complete", "complete"], 0),
    "one part failed": (["complete", "failed"], 1),
    "parts skipped by an interruption": (["complete", "skipped"], 1),
    "a cell interrupted": (["complete", "interrupted"], 1),
    "dry runs and submitted jobs": (["dry_run", "submitted"], 0),
    "cells planned on purpose": (["planned", "complete"], 0),
    "a part still running": (["running"], 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused(name, tmp_path, monkeypatch, capsys):
    tokens, named = CASES[name]
    made(tmp_path)
    before = tree(tmp_path, RUN)
    code, err = typed(tokens, tmp_path, monkeypatch, capsys)
    refused(code, err, fill(named, tmp_path), before, tree(tmp_path, RUN))


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_refused_environment(name, tmp_path):
    env, tokens, named = ENV_CASES[name]
    before = tree(made(tmp_path))
    code, err = submitted(tokens, tmp_path, env)
    refused(code, err, fill(named, tmp_path), before, tree(tmp_path))


@pytest.mark.parametrize("name", list(OUTCOMES))
def test_campaign_exit_rule(name):
    from restart_harness.campaigns import outcome

    states, code = OUTCOMES[name]
    assert outcome.exit_code(states) == code
