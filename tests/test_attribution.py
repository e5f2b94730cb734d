"""attribution=: where each phase's seconds went, from py-spy's samples of the launcher and the ranks
(docs/attribution.md). Real runs of the case table (attribution-dp2: DeepSpeed's launcher, the default engine;
lazy-dp2 and fsdp2-dp2 under prefork), a real sampler on a small process, and what happens where it cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import REPO, cases, load_summary

from restart_harness.results import attribution, samples
from restart_harness.results.causes import KINDS
from restart_harness.results.terminal import render
from restart_harness.rundir import sampling
from restart_harness.schema import ANCHOR_PREFIX, PHASE_NAMES
from restart_harness.worker.eventlog import Anchors

SAMPLED = cases("attribution-dp2", "lazy-dp2", "fsdp2-dp2")
SUM_TOLERANCE = 0.05  # the causes and the remainder against the phase's measured seconds
REMAINDER_MAX = 0.25  # of a phase over LONG_PHASE_SECONDS
LONG_PHASE_SECONDS = 0.5
# of a long phase, covered by the rank's samples (the rest: before the sampler found it, and samples py-spy's
# --nonblocking reads skipped: a fresh-clone CI on a busy machine had fsdp2's dist_init at 0.93, its remainder in
# bounds); the remainder's bound above is what holds the attribution to account
COVERAGE_MIN = 0.90
# a short phase's samples may miss this much whatever its length: 25 samples at 100 Hz (fresh-clone CIs had
# lazy-dp2's 0.68 s dist_init covered 0.56 s on 2026-11-27 and its 1.09 s one covered 0.90 s on 2026-11-28, their
# remainders in bounds)
COVERAGE_GAP_SECONDS = 0.25


def speedscope_problems(doc: dict) -> list[str]:
    """What makes a file not one speedscope opens, by its published format (file-format-schema.json: a `shared`
    list of frames with a name each; profiles of type "sampled" whose samples index those frames and whose weights
    are one per sample)."""
    out = []
    if doc.get("$schema") != "https://www.speedscope.app/file-format-schema.json":
        out.append("no $schema")
    frames = (doc.get("shared") or {}).get("frames")
    if not isinstance(frames, list) or not all(isinstance(f.get("name"), str) for f in frames):
        out.append("shared.frames is not a list of named frames")
        return out
    for p in doc.get("profiles") or [None]:
        if not p or p.get("type") != "sampled" or p.get("unit") not in ("seconds", "milliseconds", "none"):
            out.append(f"profile {p and p.get('name')} is not a sampled profile with a unit")
            continue
        if len(p["samples"]) != len(p["weights"]) or not p["samples"]:
            out.append(f"profile {p['name']}: {len(p['samples'])} samples, {len(p['weights'])} weights")
        if any(not 0 <= i < len(frames) for s in p["samples"] for i in s):
            out.append(f"profile {p['name']}: a sample names a frame out of range")
        if abs(sum(p["weights"]) - (p["endValue"] - p["startValue"])) > 1e-3:
            out.append(f"profile {p['name']}: the weights do not span startValue-endValue")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLED)
def test_every_phase_is_accounted_for_by_named_causes(harness, name):
    """Each restart phase (and the launcher before it): the named causes and the remainder add up to the phase's
    measured seconds; a phase over half a second leaves at most a quarter unnamed; the samples covered the phase."""
    run_dir, _, _ = harness.played(name)
    att = load_summary(run_dir)["restarts"][0]["attribution"]
    assert att["sampled"] and att["ranks_sampled"] == [0, 1], att
    assert att["clock"]["source"] == "anchors" and att["clock"]["estimates"] >= 2, att["clock"]
    measured = load_summary(run_dir)["restarts"][0]["phases"]
    assert set(att["phases"]) == {"launcher", *measured}, (att["phases"].keys(), measured)
    for phase, p in att["phases"].items():
        if phase != "launcher":
            assert p["seconds"] == pytest.approx(measured[phase], abs=1e-4), phase  # the slowest rank's, as phases
        named = sum(c["seconds"] for c in p["causes"])
        assert named + p["remainder_seconds"] == pytest.approx(p["seconds"], rel=SUM_TOLERANCE, abs=0.002), (phase, p)
        assert all(c["kind"] in KINDS and c["kind"] != "remainder" for c in p["causes"]), p["causes"]
        if p["seconds"] > LONG_PHASE_SECONDS:
            assert p["remainder_seconds"] <= REMAINDER_MAX * p["seconds"], (phase, p["remainder"])
            # what the samples covered, against the marks (the launcher's first moments come before the sampler's
            # first sample: a cause of its own)
            if phase != "launcher":
                coverage = p["sampled_seconds"] / p["seconds"]
                least = min(COVERAGE_MIN, 1 - COVERAGE_GAP_SECONDS / p["seconds"])  # a short phase: a few samples
                assert coverage >= least, (phase, p)


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLED)
def test_the_longest_start_up_phase_has_a_named_largest_cause(harness, name):
    """DeepSpeed's engine_init (FSDP2's model_build, where it builds its engine) is named by its largest cause, an
    import with the statement that made it; the checkpoint phase's start-up is attributed the same way."""
    run_dir, _, _ = harness.played(name)
    summary = load_summary(run_dir)
    phase = "model_build" if summary["spec"]["stack"] == "fsdp2" else "engine_init"
    top = summary["restarts"][0]["attribution"]["phases"][phase]["causes"][0]
    assert top["kind"] != "remainder" and top["seconds"] > 0, top
    if top["kind"] == "import":
        assert top.get("via") and top.get("parts"), top
    startup = summary["checkpoint"]["attribution"]
    assert startup["sampled"] and set(startup["phases"]) >= {"launcher", "imports", "dist_init"}, startup


@pytest.mark.slow
def test_flame_graphs_are_speedscope_files_of_each_rank_and_phase(harness):
    run_dir, _, _ = harness.played("attribution-dp2")
    att = load_summary(run_dir)["restarts"][0]["attribution"]
    graphs = {rank: {ph: p.get("flame_graph") for ph, p in phases.items()} for rank, phases in att["per_rank"].items()}
    assert set(graphs) == {"0", "1"} and all(set(g) == set(PHASE_NAMES) for g in graphs.values()), graphs
    for path in [att["phases"]["launcher"]["flame_graph"], *(p for g in graphs.values() for p in g.values() if p)]:
        doc = json.loads((run_dir / path).read_text())
        assert not speedscope_problems(doc), (path, speedscope_problems(doc))
    engine_init = json.loads((run_dir / graphs["0"]["engine_init"]).read_text())["profiles"][0]
    assert engine_init["endValue"] == pytest.approx(att["per_rank"]["0"]["engine_init"]["sampled_seconds"], abs=0.01)
    # py-spy's own trace stays beside them (Chrome's trace-event format: Perfetto opens it)
    assert isinstance(json.loads((run_dir / "profiles" / "restart-01" / "samples.json").read_text()), list)


@pytest.mark.slow
def test_the_terminal_and_the_report_say_where_the_restart_went(harness, tmp_path):
    run_dir, _, _ = harness.played("attribution-dp2")
    summary = load_summary(run_dir)
    text = render({**summary, "restart": summary["restarts"][0]})
    assert "where the restart went" in text and "  engine_init" in text and "remainder" in text, text
    proc = subprocess.run([sys.executable, "-m", "analysis", str(run_dir), f"out_dir={tmp_path}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "restart_causes_seconds.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_sampler_that_cannot_run_leaves_phase_timings_and_says_why(harness):
    """The re-run of attribution-dp2 with a py-spy that fails: one line before the launch, the restart verified with
    its phases, and its attribution says why it is absent (never silently, never a traceback)."""
    run_dir, _, steps = harness.played("attribution-dp2")
    said = [line for line in steps[0].stderr.splitlines() if "attribution=python" in line]
    assert len(said) == 1 and "not available here" in said[0] and "/bin/false" in said[0], steps[0].stderr
    assert "Traceback" not in steps[0].stderr
    rerun = load_summary(run_dir)["restarts"][1]
    assert rerun["verified"] and rerun["phases"]["engine_init"] > 0, rerun["phases"]
    assert rerun["attribution"] == {"mode": "python", "sampled": False, "reason": rerun["attribution"]["reason"]}
    assert "could not sample a test process" in rerun["attribution"]["reason"]
    assert not (run_dir / "profiles" / rerun["record"]).exists()


ANCHORED = f"""
import time, sys
sys.path.insert(0, {str(REPO)!r})
from restart_harness.worker.eventlog import Anchors
anchors = Anchors(100)
busy = time.time() + 0.3
while time.time() < busy:
    pass
a = anchors("imports_done")
x = 0
busy = time.time() + 0.3
while time.time() < busy:
    x += 1
b = anchors("finished")
print("anchors", a.start, a.end, b.start, b.end)
"""


def test_anchors_put_the_samplers_clock_on_the_process_one(tmp_path):
    """A real py-spy on a small process that pauses at two anchors: both are found by name, and the offsets they
    give agree within two sampling intervals."""
    path, why = sampling.tool()
    assert path, why
    out = tmp_path / "samples.json"
    proc = subprocess.run([path, "record", "--idle", "--rate", "100", "--format", "chrometrace", "--output", str(out),
                           "--", sys.executable, "-c", ANCHORED], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("anchors "))
    a0, a1, b0, b1 = map(float, line.split()[1:])
    trace = samples.read(out)
    thread = next(iter(trace.threads.values()))
    names = {trace.frames[f].name for _, _, stack in thread.spans for f in stack}
    # a busy machine's sampler may miss a pause: at least one of the two is seen, each by its own name
    assert names & {ANCHOR_PREFIX + "imports_done", ANCHOR_PREFIX + "finished"}, sorted(names)
    anchors = [{"mark": "imports_done", "start": a0, "end": a1}, {"mark": "finished", "start": b0, "end": b1}]
    offsets = attribution._offsets(trace, thread, anchors)
    offset = sorted(offsets)[len(offsets) // 2]
    for anchor in anchors:  # with the offset, each pause lands on the samples that show it
        shown = [(s, e) for s, e, stack in thread.spans
                 if any(trace.frames[f].name == ANCHOR_PREFIX + anchor["mark"] for f in stack)]
        if shown:
            assert anchor["start"] - offset <= shown[-1][1] and anchor["end"] - offset >= shown[0][0], (anchor, shown)
    assert Anchors(100).seconds == pytest.approx(0.05)


def test_attribution_where_the_ranks_cannot_be_sampled_is_one_line(tmp_path):
    """A launcher whose ranks a scheduler starts, and a py-spy that fails: said once before anything starts, exit 0
    (the run would go on with phase timings only), never a traceback."""
    env = {"RH_PY_SPY": "/bin/false"}
    proc = subprocess.run([sys.executable, str(REPO / "config-n-run.py"), "tiny", "attribution=native", "dry_run=true",
                           f"results_dir={tmp_path}"], capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
                          env={**__import__("os").environ, **env})
    said = [line for line in proc.stderr.splitlines() if "attribution=" in line]
    assert proc.returncode == 0 and len(said) == 1 and "RH_PY_SPY" not in said[0] and "/bin/false" in said[0], \
        proc.stderr
    from restart_harness import machine, resolve
    from restart_harness.command import parse_args

    for launcher, words in (("slurm", "Slurm starts the ranks"), ("pbs", "PBS starts the ranks")):
        plugins = resolve.plugins(machine.resolve(parse_args(["tiny", f"launcher={launcher}", "attribution=python"])))
        assert words in (sampling.unavailable(plugins.spec, plugins.launcher) or ""), launcher


def test_the_sampler_keeps_the_launchs_exit_code(tmp_path):
    """py-spy exits 0 whatever its command did: the wrapper keeps the launch's own code."""
    sampler = sampling.Sampler(tmp_path, "restart-01", native=False)
    proc = subprocess.run(sampler.command([sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(3)"]),
                          capture_output=True,
                          env={**__import__("os").environ, **sampler.environment()}, timeout=60, check=False)
    assert proc.returncode == 0 and sampler.exit_code(proc.returncode) == 3, proc.stderr


def test_a_sampler_that_never_exits_is_killed_after_the_bound(tmp_path, monkeypatch):
    """A sampler stand-in that runs the launch, then never exits: killed SAMPLER_GRACE_SECONDS after the launch ended;
    the launch keeps its exit code, and its record says why there are no samples (issue 68: a finished run held for
    5.5 minutes)."""
    from restart_harness.phases import processes

    fake = tmp_path / "py-spy"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift\n"$@"\nexec sleep 600\n')
    fake.chmod(0o755)
    monkeypatch.setenv(sampling.TOOL_ENV, str(fake))
    monkeypatch.setattr(processes, "SAMPLER_GRACE_SECONDS", 1)
    (tmp_path / "launch-restart-01.sh").write_text("exit 3\n")
    sampler = sampling.Sampler(tmp_path, "restart-01", native=False)
    info = processes.launch(tmp_path, "restart-01", 300, sampler=sampler)  # without the bound: timed out at 300 s
    assert not info["timed_out"] and info["exit_code"] == 3
    record = sampler.record("python")
    assert not record["sampled"] and "killed" in record["reason"] and "samples are lost" in record["reason"]


def test_a_rank_left_traced_after_it_exited_is_found(monkeypatch):
    """third_party/py_spy_stuck_tracee.py: a zombie whose tracer is a thread of the sampler is named once it has been
    one for STUCK_SECONDS (here: a child this test traces with ptrace, then kills, and does not reap)."""
    import ctypes
    import signal

    from third_party import py_spy_stuck_tracee as stuck

    monkeypatch.setattr(stuck, "STUCK_SECONDS", 0.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert ctypes.CDLL(None, use_errno=True).ptrace(16, child.pid, None, None) == 0  # PTRACE_ATTACH
        os.kill(child.pid, signal.SIGKILL)
        watch = stuck.Watch(os.getpid())
        deadline = time.time() + 10
        while (found := watch.stuck([child.pid])) is None and time.time() < deadline:
            time.sleep(0.05)
        assert found == child.pid
        assert stuck.Watch(child.pid).stuck([os.getpid()]) is None  # a live process traced by nobody
    finally:
        child.kill()
        child.wait()
