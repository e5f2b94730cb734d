"""`./submit-job.sh endure MODEL [run keys] duration=10m mtbf=90s [failures=rank,job,save]`: a failure campaign on
real processes, failures at exponential times killing a rank, the job or a save, each followed by a restart from the
last committed checkpoint; goodput and badput, the model's beside them, and the final state against a failure-free
run's, in endure.json (docs/goodput.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import signal
import threading
import time
from pathlib import Path

from restart_harness import machine, preflight, resolve
from restart_harness.campaigns.sweep import new_dir
from restart_harness.command import parse
from restart_harness.command.options import ENDURE_FIXED, EndureOptions
from restart_harness.command.tokens import required
from restart_harness.errors import RunFailed, UsageError
from restart_harness.files.atomic import read_json, write_json_atomic
from restart_harness.phases import say
from restart_harness.phases.processes import launch
from restart_harness.predict import forecast
from restart_harness.results import events as ev
from restart_harness.results import finalize, goodput
from restart_harness.results.prediction import other_work
from restart_harness.rundir.create import port_of, prepare
from restart_harness.rundir.scripts import write_launch
from restart_harness.rundir.status import allocate_record, save_record, set_status
from restart_harness.schema import BADPUT_BUCKETS, ENDURE_SCHEMA_VERSION, PREDICTED_RESTART, PREDICTED_TOTAL
from restart_harness.spec.keys import keys_of

KINDS = ("rank", "job", "save")
UNBOUNDED_ITERS = 1_000_000  # iters where nothing predicts the step time: the budget ends the campaign


@dataclasses.dataclass
class EndureRequest:
    plugins: object  # resolve.Plugins, checked by preflight
    duration_seconds: float
    mtbf_seconds: float
    kinds: tuple[str, ...]
    estimate: dict | None  # predicted start-up, step and save seconds (low ends), or None
    tokens: list[str]


def check(tokens: list[str]) -> EndureRequest:
    """Every refusal before anything is created: the run keys, the budget and the failure rate, and (from the
    harness's prediction, its low end) a budget or an MTBF in which no checkpoint could commit."""
    if not tokens or "=" in tokens[0]:
        raise UsageError("endure needs a MODEL first; usage: ./submit-job.sh endure MODEL duration=TIME mtbf=TIME "
                         "[key=value ...]")
    given = dict(t.split("=", 1) for t in tokens if "=" in t)
    if own := [k for k in ENDURE_FIXED if k in given]:
        raise UsageError(f"{own[0]}={given[own[0]]}: the campaign's own (it trains once, for real, restarts and keeps "
                         f"its checkpoints); accepted: none of {', '.join(f'{k}=' for k in ENDURE_FIXED)}")
    extra = [] if "iters" in given else [f"iters={UNBOUNDED_ITERS}"]
    spec, values = parse.parse_run([*tokens, *extra], keys_of(EndureOptions))
    required(keys_of(EndureOptions), values, "endure")
    duration, mtbf = values["duration"], spec.mtbf
    if mtbf is None:
        raise UsageError("endure needs mtbf=: the job's mean time between failures (a time: 90s, 10m, 2h)")
    kinds = tuple(values.get("failures", EndureOptions.failures).split(","))
    if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise UsageError(f"failures={values['failures']}: accepted: a comma list of {', '.join(KINDS)}, each once")
    spec = dataclasses.replace(spec, phase="checkpoint", keep=True)
    plugins = resolve.plugins(dataclasses.replace(spec, device="cpu") if spec.device == "auto" else spec)
    if not plugins.engine.saves or not plugins.stack.trains:
        raise UsageError(f"engine={spec.engine} with stack={spec.stack}: a failure campaign needs a stack that trains "
                         "and an engine that saves")
    estimate = _estimate(plugins)
    if estimate:
        refuse_hopeless(spec.save_interval, duration, mtbf, estimate)
        if "iters" not in given:  # the budget's steps, with room: the deadline ends the campaign
            spec = dataclasses.replace(spec, iters=max(spec.save_interval, math.ceil(2 * duration / estimate["step"])))
    spec = dataclasses.replace(spec, timeout=max(spec.timeout, int(duration) + 600))
    checked = preflight.run(machine.resolve(spec))
    return EndureRequest(checked, duration, mtbf, kinds, estimate, tokens)


def _estimate(plugins) -> dict | None:
    """The low ends of the predicted start-up (to the first step), step and save, or None where not predicted. With
    no storage figures (the load and the save not predicted) the start-up is its predicted phases' sum, still a low
    end: what is missing only adds."""
    try:
        phases = forecast.build(plugins, os.cpu_count() or 1, forecast.storage(plugins)).get("phases") or {}
    except Exception:  # noqa: BLE001 - a prediction that cannot be made refuses nothing
        return None
    low = {name: (phases.get(key) or {}).get("low") for name, key in
           (("startup", PREDICTED_TOTAL), ("step", "restart_first_step_seconds"), ("save", "save_durable_seconds"))}
    if low["startup"] is None:
        low["startup"] = sum((phases.get(k) or {}).get("low") or 0.0 for k in PREDICTED_RESTART) or None
    return None if low["startup"] is None or not low["step"] else {**low, "save": low["save"] or 0.0}


def refuse_hopeless(save_interval: int, duration: float, mtbf: float, e: dict) -> None:
    """A save interval, budget or failure rate in which no checkpoint commits (e: predicted low ends, seconds)."""
    interval = save_interval * e["step"]
    first = goodput.first_commit_seconds(e["startup"], e["step"], save_interval, e["save"])
    how = (f"start-up {e['startup']:.1f} s + {save_interval} steps x {e['step']:.3g} s + a save {e['save']:.2g} s, "
           "the low ends of the harness's prediction")
    if interval > duration:
        raise UsageError(f"save_interval={save_interval}: {save_interval} steps take at least {interval:.1f} s, longer "
                         f"than duration={duration:g} s; accepted: save_interval <= {int(duration / e['step'])}")
    if first > duration:
        raise UsageError(f"duration={duration:g} s is too short for one save: the first checkpoint commits at least "
                         f"{first:.1f} s after the start ({how}); accepted: duration > {math.ceil(first)} s")
    if mtbf < first:
        raise UsageError(f"mtbf={mtbf:g} s: shorter than the {first:.1f} s from a start to its first committed "
                         f"checkpoint ({how}): no checkpoint would commit between failures and the job would never "
                         f"make progress; accepted: mtbf > {math.ceil(first)} s")


def _step_of(tag: str | None) -> int:
    return int(tag.removeprefix("global_step")) if tag else 0


def _kill_rank(run_dir: Path, record: str, rank: int, fired: list) -> None:
    """SIGKILL one rank's process (its pid from its process event; waited for while it starts)."""
    path = run_dir / "events" / record / f"rank-{rank:05d}.jsonl"
    for _ in range(600):
        pid = next((e["pid"] for e in ev.read_record(run_dir, record).get(rank, []) if e["event"] == "process"),
                   None) if path.is_file() else None
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                fired.append(time.time())
            return
        time.sleep(0.05)


def _save_step(committed: int, seconds: float, save_interval: int, pace: dict) -> int:
    """The first save step the job reaches `seconds` from its launch, by the pace measured so far, but no later than
    the launch's second save (a pace that errs cannot put the failure out of reach); never a fresh job's first save,
    so that a checkpoint before it was committed and the restart has one to load."""
    steps = max(0.0, (seconds - pace["startup"]) / pace["step"])
    lowest = save_interval * (committed // save_interval + 1 + (committed == 0))
    return min(lowest + save_interval, max(lowest, save_interval * math.ceil((committed + steps) / save_interval)))


def _launch_once(run, record: str, failure: dict | None, deadline: float, pace: dict) -> tuple[dict, bool]:
    """One launch until it ends, the deadline, or the failure asked of it; (its record, whether the failure hit)."""
    now, fired = time.time(), []
    timeout, killer = deadline - now, None
    if failure and failure["kind"] == "job":
        timeout = failure["at"] - now
    elif failure and failure["kind"] == "rank":
        killer = threading.Timer(max(0.0, failure["at"] - now), _kill_rank,
                                 (run.run_dir, record, failure["rank"], fired))
        killer.start()
    elif failure:
        failure["save_step"] = _save_step(failure["committed_step_before"], failure["at"] - now,
                                          run.spec.save_interval, pace)
        os.environ["RH_FAULT"] = f"kill@{run.engine.fault_point}:rank={failure['rank']}:step={failure['save_step']}"
    try:
        info = launch(run.run_dir, record, max(1.0, timeout))
    finally:
        os.environ.pop("RH_FAULT", None)
        if killer is not None:
            killer.cancel()
            killer.join()
    if info["exit_code"] == 0 or not failure:
        return info, False
    if failure["kind"] == "job":
        return info, info["timed_out"] and failure["at"] < deadline
    return info, bool(fired) if failure["kind"] == "rank" else not info["timed_out"]


def _campaign(run, request: EndureRequest, doc: dict, folder: Path) -> list[dict]:
    """Launches until the budget is spent; each failure recorded in doc; the launches' records returned."""
    spec, rng = run.spec, random.Random(run.spec.seed)
    start = doc["started"] = time.time()
    deadline, pace = start + request.duration_seconds, _pace(request.estimate)
    failure_at, record, launches = start + rng.expovariate(1 / request.mtbf_seconds), "checkpoint", []
    while time.time() < deadline - 1:
        if launches:
            record = allocate_record(run.run_dir)
            write_launch(run, "restart", record, port_of(run), ["--train-on"])
        committed = _step_of(run.stored.latest())
        kind = request.kinds[len(doc["failures"]) % len(request.kinds)]
        failure = ({"kind": kind, "rank": rng.randrange(spec.launched_ranks), "at": failure_at,
                    "committed_step_before": committed} if failure_at < deadline else None)
        info, hit = _launch_once(run, record, failure, deadline, pace)
        save_record(run.run_dir, info)
        after = _step_of(run.stored.latest())
        launches.append({"record": record, "launch": info, "lost_after": after if hit else None,
                         "loads": committed > 0, "verified": _verified(run, record)})
        pace = _pace(request.estimate, run.run_dir, launches)
        if hit:
            ended = info["start"] + info["wall_seconds"]
            doc["failures"].append({**{k: v for k, v in failure.items() if k != "at"},
                                    "drawn_at_seconds": round(failure["at"] - start, 3),
                                    "happened_at_seconds": round(ended - start, 3), "record": record,
                                    "committed_step_after": after,
                                    "save_committed": (None if kind != "save" else after >= failure["save_step"])})
            say(f"[endure] failure {len(doc['failures'])}: {kind} (rank {failure['rank']}) in {record} at "
                f"{ended - start:.1f} s; restarting from step {after}")
            failure_at = ended + rng.expovariate(1 / request.mtbf_seconds)
        elif info["exit_code"] and not info["timed_out"]:
            raise RunFailed(f"{record}: the launch failed with no failure injected (exit {info['exit_code']}); "
                            f"see {run.run_dir / info['log']}")
        elif info["exit_code"] == 0:
            break  # iters reached within the budget
        write_json_atomic(folder / "endure.json", doc)
    doc["wall_seconds"] = time.time() - start
    return launches


def _verified(run, record: str) -> bool | None:
    """A restart's verification: True, or None where it was killed before verifying; a difference is fatal."""
    events = ev.read_record(run.run_dir, record)
    ranks = run.spec.launched_ranks
    if record == "checkpoint" or not all(any(e["event"] == "verify" for e in events.get(r, [])) for r in range(ranks)):
        return None
    failed, _ = ev.verification(events, ranks)
    if failed:
        raise RunFailed(f"{record}: restart did not restore the saved state: {', '.join(failed[:5])}")
    return True


def _pace(estimate: dict | None, run_dir: Path | None = None, launches: list[dict] | None = None) -> dict:
    """Start-up (a launch to its first step) and step seconds to place a save failure: measured once a launch has
    stepped, else predicted."""
    pace = {"startup": (estimate or {}).get("startup") or 5.0, "step": (estimate or {}).get("step") or 0.1}
    launches = launches or []
    if run_dir is not None and (median := goodput.step_median(run_dir, [x["record"] for x in launches])):
        pace["step"] = median
    for x in reversed(launches):
        steps = [e for e in ev.read_record(run_dir, x["record"]).get(0, []) if e["event"] == "step"]
        if steps:
            pace["startup"] = steps[0]["t"] - steps[0]["seconds"] - x["launch"]["start"]
            break
    return pace


def main(request: EndureRequest) -> int:
    """The campaign into a new folder (endure.json, the campaign's run, the failure-free reference run)."""
    spec = request.plugins.spec
    folder = new_dir(spec.results_dir, "endure")
    plugins = request.plugins.with_spec(dataclasses.replace(spec, results_dir=str(folder)))
    run = prepare(plugins, prefix="campaign-")
    doc = {"schema_version": ENDURE_SCHEMA_VERSION, "command": ["endure", *request.tokens],
           "duration_seconds": request.duration_seconds, "mtbf_seconds": request.mtbf_seconds, "seed": spec.seed,
           "failure_kinds": list(request.kinds), "run_dir": str(run.run_dir), "state": "running", "failures": []}
    write_json_atomic(folder / "endure.json", doc)
    say(f"[endure] {spec.model_label}, engine {spec.engine}, save_interval={spec.save_interval}: "
        f"{request.duration_seconds:g} s, failures every {request.mtbf_seconds:g} s on average (seed {spec.seed})")
    try:
        launches = _campaign(run, request, doc, folder)
    except (RunFailed, KeyboardInterrupt) as exc:
        doc.update(state="failed", reason=str(exc) or "interrupted")
        write_json_atomic(folder / "endure.json", doc)
        set_status(run.run_dir, "failed", str(exc) or "interrupted")
        raise
    set_status(run.run_dir, "complete")
    _account(run, doc, launches)
    doc["final_state"] = _reference(plugins, run, folder)
    doc["model"] = goodput.campaign_model(doc, spec.save_interval)
    doc["state"] = "complete"
    write_json_atomic(folder / "endure.json", doc)
    print(render(doc))
    print(folder)
    return 0 if doc["final_state"]["equal"] and doc["restarts"]["differing"] == 0 else 1


def _account(run, doc: dict, launches: list[dict]) -> None:
    """Goodput and badput into doc; the restarts' verification counted."""
    records = [x["record"] for x in launches]
    median = goodput.step_median(run.run_dir, records)
    segments = [goodput.segment(run.run_dir, x["record"], x["launch"], x["lost_after"], median) for x in launches]
    doc["launches"] = [{"record": x["record"], "wall_seconds": x["launch"]["wall_seconds"],
                        "exit_code": x["launch"]["exit_code"], "loads": x["loads"], "verified": x["verified"],
                        "step_seconds_median": goodput.step_median(run.run_dir, [x["record"]]),
                        "other_cpu_fraction": other_work(x["launch"]), **s}
                       for x, s in zip(launches, segments)]
    doc["step_seconds_median"] = median
    doc["saves_committed"] = sum(len([e for e in ev.read_record(run.run_dir, r).get(0, []) if e["event"] == "save"])
                                 for r in records)
    doc["goodput"] = goodput.totals(segments, doc["wall_seconds"])
    restarts = launches[1:]
    doc["restarts"] = {"launched": len(restarts), "verified": sum(1 for x in restarts if x["verified"]),
                       "killed_before_verifying": sum(1 for x in restarts if x["loads"] and not x["verified"]),
                       "fresh": sum(1 for x in restarts if not x["loads"]), "differing": 0}
    doc["final_tag"] = run.stored.latest()


def _reference(plugins, run, folder: Path) -> dict:
    """A failure-free run of the same keys to the campaign's last committed step, saving once there; every rank's
    state digests of that step compared."""
    tag = run.stored.latest()
    if tag is None:
        return {"equal": False, "why": "no checkpoint was committed: there is no final state to compare"}
    steps = _step_of(tag)
    # one save, at the end: the state owes nothing to the saves or restarts between (and the reference is short)
    ref = prepare(plugins.with_spec(dataclasses.replace(plugins.spec, iters=steps, save_interval=steps)),
                  prefix="reference-")
    say(f"[endure] the failure-free reference: {steps} steps in {ref.run_dir.name}")
    info = launch(ref.run_dir, "checkpoint", ref.spec.timeout)
    save_record(ref.run_dir, info)
    finalize.finalize(ref.run_dir, state="complete" if info["exit_code"] == 0 else "failed",
                      reason=None if info["exit_code"] == 0 else f"exit {info['exit_code']}")
    if info["exit_code"] != 0:
        return {"equal": False, "tag": tag, "why": f"the reference run failed (exit {info['exit_code']})"}
    differing = []
    for rank in range(run.spec.launched_ranks):
        mine, theirs = (read_json(d / "digests" / tag / f"rank-{rank:05d}.json") for d in (run.run_dir, ref.run_dir))
        differing += [f"rank {rank}: {name}" for name, value in mine["tensors"].items()
                      if theirs["tensors"].get(name) != value]
    return {"equal": not differing, "tag": tag, "reference_run": str(ref.run_dir), "differing": differing[:20],
            "why": None if not differing else f"{len(differing)} tensors differ from the failure-free run's"}


def render(doc: dict) -> str:
    g = doc["goodput"]
    lines = [(f"goodput {g['goodput']:.3f} over {g['wall_seconds']:.1f} s ({len(doc['failures'])} failures, "
             f"restarts verified {doc['restarts']['verified']}/{doc['restarts']['launched']}, "
             f"{doc['restarts']['killed_before_verifying']} killed before verifying)"),
             f"  productive steps      {g['productive_seconds']:9.1f} s  {g['goodput']:6.1%}"]
    lines += [f"  {k.removesuffix('_seconds').replace('_', ' '):21} {g['badput_seconds'][k]:9.1f} s  "
              f"{g['badput_share'][k.replace('_seconds', '_share')]:6.1%}" for k in BADPUT_BUCKETS]
    f = doc["final_state"]
    lines.append(f"  final state ({f.get('tag')}): " + ("equal to the failure-free run's" if f["equal"] else f["why"]))
    if m := doc.get("model"):
        lines.append(f"  model: expected goodput {m['expected_goodput']:.3f} at save_interval "
                     f"({m['interval_seconds']:.2f} s); best interval {m['best_interval_seconds']:.2f} s "
                     f"({m['best_interval_steps']} steps), goodput {m['goodput_at_best']:.3f}; Young/Daly "
                     f"{m['young_daly_interval_seconds']:.2f} s")
        if sim := m.get("simulated_goodput"):
            lines.append(f"  model at the realized rate (a failure every {m['realized_mtbf_seconds']:.1f} s) less the "
                         f"first start-up ({m['first_startup_seconds']:.1f} s): {m['expected_goodput_realized']:.3f}; "
                         f"campaigns of this length: {sim['mean']:.3f} ({sim['p5']:.3f} to {sim['p95']:.3f}, 90%)")
        if m.get("not_comparable"):
            st = m["steady"]
            lines.append(f"  not a check of the model: {m['not_comparable']}" + (
                f"; the other {st['launches']} launches ({st['wall_seconds']:.1f} s, {st['failures']} failures): "
                f"goodput {st['measured_goodput']:.3f}, model {st['expected_goodput']:.3f}" if st else ""))
    return "\n".join(lines)
