"""What failures and checkpoints cost a job: the model of its goodput (Daly 2006's exact expectation), the checkpoint
interval that maximizes it, and a failure campaign's measured wall time split by badput category (no torch). The
model, its inputs and each category: docs/goodput.md."""

from __future__ import annotations

import math
import random
import statistics

from restart_harness.results import events as ev
from restart_harness.schema import BADPUT_BUCKETS, GOODPUT_FIELDS

# Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4, on 16,384 H100 GPUs (docs/goodput.md)
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
DEFAULT_MTBF_PER_GPU_SECONDS = LLAMA3_DAYS * 86_400 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS
DEFAULT_MTBF_SOURCE = (f"Llama 3's published rate ({LLAMA3_INTERRUPTIONS} interruptions in {LLAMA3_DAYS} days on "
                       f"{LLAMA3_GPUS:,} GPUs: one every {DEFAULT_MTBF_PER_GPU_SECONDS / 86_400 / 365.25:.1f} "
                       "GPU-years; Meta 2024, section 3.3.4)")
GOLDEN = (math.sqrt(5) - 1) / 2
RESTART_BUCKETS = ("startup_seconds", "training_preparation_seconds", "checkpoint_restore_seconds",
                   "first_steps_seconds")
SLOWED = 3  # a launch whose median step is over this many times the campaign's is outside the model's one step time


def check_positive(name: str, value: float) -> None:
    """ValueError naming the value unless it is a finite number above zero."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value}: must be a finite number of seconds above zero")


def job_mtbf_seconds(mtbf_per_unit_seconds: float = DEFAULT_MTBF_PER_GPU_SECONDS, units: int = 1) -> float:
    """The job's mean time between failures: each of its `units` (GPUs or nodes) failing independently."""
    check_positive("mtbf_seconds", mtbf_per_unit_seconds)
    if units < 1:
        raise ValueError(f"units={units}: must be a positive integer (GPUs or nodes)")
    return mtbf_per_unit_seconds / units


def expected_goodput(interval_seconds: float, save_seconds: float, restart_seconds: float,
                     job_mtbf_seconds: float) -> float:
    """The share of wall time that is productive training at a checkpoint interval (Daly's exact expectation)."""
    m = job_mtbf_seconds
    exponent = restart_seconds / m + (interval_seconds + save_seconds) / m
    if exponent > 700:  # exp would overflow: no interval completes before a failure
        return 0.0
    return interval_seconds / (m * math.exp(restart_seconds / m) * math.expm1((interval_seconds + save_seconds) / m))


def _golden_max(f, low: float, high: float, tolerance: float = 1e-9) -> float:
    """The argument in [low, high] that maximizes a unimodal f (golden-section search)."""
    a, b = low, high
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tolerance * max(1.0, abs(a) + abs(b)):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    return (a + b) / 2


def optimum(save_seconds: float, restart_seconds: float, step_seconds: float, job_mtbf_seconds: float) -> dict:
    """The interval that maximizes expected goodput, in seconds and in whole steps, the goodput there, and Young's
    and Daly's first-order interval beside it with its goodput."""
    check_positive("step_seconds", step_seconds)
    check_positive("job_mtbf_seconds", job_mtbf_seconds)
    for name, value in (("save_seconds", save_seconds), ("restart_seconds", restart_seconds)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}={value}: must be a finite number of seconds, zero or more")

    def goodput(seconds: float) -> float:
        return expected_goodput(seconds, save_seconds, restart_seconds, job_mtbf_seconds)

    low, high = step_seconds, max(step_seconds * 2, 50 * job_mtbf_seconds)
    best = math.exp(_golden_max(lambda x: goodput(math.exp(x)), math.log(low), math.log(high)))
    steps = max(1, max((math.floor(best / step_seconds), math.ceil(best / step_seconds)),
                       key=lambda k: goodput(max(1, k) * step_seconds)))
    first_order = math.sqrt(2 * save_seconds * job_mtbf_seconds)  # Young's and Daly's first-order optimum
    return {"job_mtbf_seconds": job_mtbf_seconds, "save_seconds": save_seconds, "restart_seconds": restart_seconds,
            "step_seconds": step_seconds, "best_interval_seconds": best, "best_interval_steps": steps,
            "goodput_at_best": goodput(best), "goodput_at_best_steps": goodput(steps * step_seconds),
            "young_daly_interval_seconds": first_order,
            "goodput_at_young_daly": goodput(max(first_order, step_seconds))}


def simulate(wall: float, first: float, interval: float, save: float, restart: float, mtbf: float,
             rng: random.Random) -> float:
    """One finite campaign of the model's process (the goodput it measures): a start-up of `first` seconds, then
    intervals of training and a save until a failure (exponential times, each drawn from the one before), a restart,
    and so on until `wall`; work since the last commit is lost at a failure, kept at the end."""
    clock, productive, setup = 0.0, 0.0, first  # setup: the start-up still to pay, None once training
    failure = rng.expovariate(1 / mtbf)
    while clock < wall:
        end = clock + interval + save if setup is None else clock + setup
        if failure < min(end, wall):  # failed while starting or training: restart, the interval's work lost
            clock, setup = failure, restart
            failure = clock + rng.expovariate(1 / mtbf)
            continue
        if setup is None:
            productive += min(interval, max(0.0, wall - clock))
        clock, setup = end, None
    return productive / wall


def campaign_spread(wall: float, first: float, interval: float, save: float, restart: float, mtbf: float,
                    runs: int = 2000, seed: int = 0) -> dict:
    """The goodput of `runs` simulated campaigns of this length: mean, 5th and 95th percentiles (one campaign's
    measurement is one draw of these)."""
    rng = random.Random(seed)
    values = sorted(simulate(wall, first, interval, save, restart, mtbf, rng) for _ in range(runs))
    return {"mean": statistics.fmean(values), "p5": values[runs // 20], "p95": values[runs - 1 - runs // 20]}


def first_commit_seconds(restart_seconds: float, step_seconds: float, save_interval_steps: int,
                         save_seconds: float) -> float:
    """From a failure to the next committed checkpoint at the least: the restart, an interval's steps, one save."""
    return restart_seconds + save_interval_steps * step_seconds + save_seconds


def job_mtbf_at(keys: dict, gpus: int, own_gpus: int) -> tuple[float, str]:
    """The job's MTBF at `gpus` GPUs from a run's keys (mtbf=: the job's at its own GPUs, the same rate per GPU
    elsewhere; mtbf_per_node=: nodes of ranks_per_node GPUs; mtbf_per_gpu=; else Llama 3's), and where it came from."""
    if keys.get("mtbf"):
        return keys["mtbf"] * own_gpus / gpus, f"mtbf={keys['mtbf']:,.0f} s at {own_gpus:,} GPUs"
    if keys.get("mtbf_per_node"):
        nodes = math.ceil(gpus / (keys.get("ranks_per_node") or 1))
        return keys["mtbf_per_node"] / nodes, f"mtbf_per_node={keys['mtbf_per_node']:,.0f} s"
    if keys.get("mtbf_per_gpu"):
        return keys["mtbf_per_gpu"] / gpus, f"mtbf_per_gpu={keys['mtbf_per_gpu']:,.0f} s"
    return job_mtbf_seconds(DEFAULT_MTBF_PER_GPU_SECONDS, gpus), DEFAULT_MTBF_SOURCE


def at_scales(save: float | None, restart: float | None, step: float | None, keys: dict, own_gpus: int) -> list[dict]:
    """The optimum at the run's own GPUs and at at_gpus= (default Llama 3's 16,384); empty where a cost is unknown."""
    if save is None or restart is None or not step:
        return []
    out = []
    for gpus in dict.fromkeys((own_gpus, keys.get("at_gpus") or LLAMA3_GPUS)):
        mtbf, source = job_mtbf_at(keys, gpus, own_gpus)
        o = {"gpus": gpus, "mtbf_source": source, **optimum(max(save, 0.0), restart, step, mtbf)}
        out.append({k: o[k] for k in GOODPUT_FIELDS})
    return out


def from_phases(phases: dict, keys: dict, own_gpus: int) -> list[dict]:
    """The optimum from a prediction's phases (`predict`): a save's blocking seconds as its training lost, start-up
    to the first step as the restart, the first step as the step."""
    return at_scales(*((phases.get(n) or {}).get("seconds") for n in (
        "save_blocking_seconds", "restart_total_with_launch_seconds", "restart_first_step_seconds")), keys, own_gpus)


def from_summary(summary: dict) -> list[dict]:
    """The optimum from a run's measurements (summary.json, built or being built): its training lost per save
    (median), its restart's total (process start to the first step), its step without a save."""
    lost = (summary.get("checkpoint") or {}).get("training_lost") or {}
    spec = summary.get("spec") or {}
    return at_scales(lost.get("per_save_seconds_median"), (summary.get("restart") or {}).get("total_seconds"),
                     (lost.get("baseline_step") or {}).get("seconds"), spec,
                     (spec.get("derived") or {}).get("world_size") or 1)


def line(o: dict) -> str:
    """One line of an optimum at its GPU count."""
    gpus, hours = f"{o['gpus']:,} GPU" + ("" if o["gpus"] == 1 else "s"), o["job_mtbf_seconds"] / 3600
    steps = f"{o['best_interval_steps']:,} step" + ("" if o["best_interval_steps"] == 1 else "s")
    return (f"at {gpus} (job MTBF {f'{hours:,.0f}' if hours >= 100 else f'{hours:.3g}'} h): best checkpoint interval "
            f"{o['best_interval_seconds']:,.1f} s ({steps}), expected goodput "
            f"{o['goodput_at_best']:.4f}; Young/Daly {o['young_daly_interval_seconds']:,.1f} s")


def _boundaries(events: list[dict]) -> list[float | None]:
    """The ends of start-up, training preparation and checkpoint restore on rank 0's clock (None: not reached)."""
    marks = ev.marks(events)
    loaded = next((e["outer_start"] for e in events if e["event"] == "loaded"), None)
    verified = next((e["t"] for e in events if e["event"] == "verify"), None)
    prepared = marks.get("engine_initialized", loaded)
    return [marks.get("dist_init_done"), prepared, verified if loaded is not None else prepared]


def segment(run_dir, record: str, launch: dict, lost_after: int | None, step_median: float | None) -> dict:
    """One launch's seconds by bucket, with `productive_seconds`. `lost_after`: the last committed step when a
    failure ended the launch (steps after it are wasted progress), None when it was not ended by a failure."""
    events = sorted(ev.read_record(run_dir, record).get(0, []), key=lambda e: e["t"])
    start, end = launch["start"], launch["start"] + launch["wall_seconds"]
    out = dict.fromkeys(BADPUT_BUCKETS, 0.0) | {"productive_seconds": 0.0}
    edges, names = _boundaries(events), BADPUT_BUCKETS[:2] + ("checkpoint_restore_seconds",)
    at = start
    for name, edge in zip(names, edges):
        if edge is None:  # the launch ended in this phase
            out[name] += max(0.0, end - at)
            return out
        out[name] += max(0.0, min(edge, end) - at)
        at = min(edge, end)
    steps = sorted((e for e in events if e["event"] == "step"), key=lambda e: e["step"])
    base = step_median or (statistics.median(s["seconds"] for s in steps) if steps else 0.0)
    for i, s in enumerate(steps):
        kept = s["seconds"] if i else min(base, s["seconds"])  # the first step's excess is first steps
        out["first_steps_seconds"] += s["seconds"] - kept
        lost = lost_after is not None and s["step"] > lost_after
        out["wasted_progress_seconds" if lost else "productive_seconds"] += kept
    loop_end = max((s["t"] for s in steps), default=at)
    out["checkpoint_save_seconds"] += max(0.0, loop_end - at - sum(s["seconds"] for s in steps))
    out["wasted_progress_seconds" if lost_after is not None else "other_seconds"] += max(0.0, end - max(loop_end, at))
    return out


def step_median(run_dir, records: list[str]) -> float | None:
    """The median step time over every launch's steps but each launch's first (the campaign's baseline step)."""
    seconds = []
    for record in records:
        steps = sorted((e for e in ev.read_record(run_dir, record).get(0, []) if e["event"] == "step"),
                       key=lambda e: e["step"])
        seconds += [s["seconds"] for s in steps[1:]]
    return statistics.median(seconds) if seconds else None


def totals(segments: list[dict], wall_seconds: float) -> dict:
    """Goodput and badput over the campaign: each bucket in seconds and as a share of the wall time; `other` is the
    wall time the launches' measured buckets leave (negative only where they overlap: `sum_error`)."""
    summed = {k: sum(s[k] for s in segments) for k in (*BADPUT_BUCKETS, "productive_seconds")}
    measured = sum(summed.values())
    summed["other_seconds"] += wall_seconds - measured
    shares = {k.replace("_seconds", "_share"): v / wall_seconds if wall_seconds else None for k, v in summed.items()}
    return {"wall_seconds": wall_seconds, "goodput": shares.pop("productive_share"),
            "productive_seconds": summed.pop("productive_seconds"), "badput_seconds": summed, "badput_share": shares,
            "launches_measured_seconds": measured,
            # the launches' measured seconds beyond the wall time (overlap), as a share of it: 0 where they fit
            "sum_error": max(0.0, measured - wall_seconds) / wall_seconds if wall_seconds else None}


def campaign_model(doc: dict, save_interval: int) -> dict | None:
    """The model's goodput at the campaign's measured costs beside the measured one: at the MTBF given, at the
    failures' realized rate less the first start-up, and simulated campaigns of this length; `not_comparable` where
    launches stepped far slower than the rest (docs/goodput.md, the model against measurement)."""
    g, step, saves, launches = doc["goodput"], doc["step_seconds_median"], doc["saves_committed"], doc["launches"]
    if not step or not saves:
        return None
    save = g["badput_seconds"]["checkpoint_save_seconds"] / saves
    # a restart: a launch to the end of its first step, over the restarts that got there (not those cut short),
    # and the harness's time between launches (other), per launch
    reached = [x for x in launches[1:] if x["productive_seconds"] > 0] or [x for x in launches
                                                                         if x["productive_seconds"] > 0]
    if not reached:
        return None
    restart = (sum(sum(x[k] for k in RESTART_BUCKETS) for x in reached) / len(reached)
               + g["badput_seconds"]["other_seconds"] / len(launches))
    interval, wall, failures = save_interval * step, doc["wall_seconds"], len(doc["failures"])
    realized = wall / failures if failures else math.inf
    first = sum(launches[0][k] for k in RESTART_BUCKETS)
    at_realized = (expected_goodput(interval, save, restart, realized) if failures
                   else interval / (interval + save))
    best = optimum(save, restart, step, doc["mtbf_seconds"])
    return {"save_seconds": save, "restart_seconds": restart, "step_seconds": step, "interval_seconds": interval,
            "expected_goodput": expected_goodput(interval, save, restart, doc["mtbf_seconds"]),
            "realized_mtbf_seconds": realized, "first_startup_seconds": first,
            "expected_goodput_realized": at_realized * (1 - first / wall), "measured_goodput": g["goodput"],
            # campaigns of this length simulated at the realized rate: one measurement is one draw of these
            "simulated_goodput": campaign_spread(wall, first, interval, save, restart, realized)
            if failures else None,
            **{k: best[k] for k in ("best_interval_seconds", "best_interval_steps", "goodput_at_best",
                                    "young_daly_interval_seconds")},
            "not_comparable": _slowed(launches, step),
            "steady": _steady(doc, interval, save, restart, first)}


def _steady(doc: dict, interval: float, save: float, restart: float, first: float) -> dict | None:
    """The check on the launches that stepped at the campaign's pace (None where none was slowed): their goodput
    over their own wall time beside the model's at their failures' realized rate, the campaign's costs."""
    step, fired = doc["step_seconds_median"], {f.get("record") for f in doc["failures"]}
    steady = [x for x in doc["launches"] if (x.get("step_seconds_median") or 0) <= SLOWED * step]
    if len(steady) == len(doc["launches"]) or not steady:
        return None
    wall = sum(x["wall_seconds"] for x in steady)
    failures = sum(1 for x in steady if x["record"] in fired)
    model = expected_goodput(interval, save, restart, wall / failures) if failures else interval / (interval + save)
    return {"launches": len(steady), "wall_seconds": wall, "failures": failures,
            "measured_goodput": sum(x["productive_seconds"] for x in steady) / wall,
            "expected_goodput": model * (1 - (first if steady[0]["record"] == "checkpoint" else 0.0) / wall)}


def _slowed(launches: list[dict], step: float) -> str | None:
    """Why the campaign is no check of the model (which takes one step time): launches stepping over SLOWED times
    the campaign's median step, as other work on the machine makes them; None where none did."""
    slow = [x for x in launches if (x.get("step_seconds_median") or 0) > SLOWED * step]
    others = [x["other_cpu_fraction"] for x in slow if x.get("other_cpu_fraction") is not None]
    medians = [x["step_seconds_median"] for x in slow]
    return (f"{len(slow)} of {len(launches)} launches ({', '.join(x['record'] for x in slow)}) stepped at a median of "
            f"{min(medians):.3g} to {max(medians):.3g} s against the campaign's {step:.3g} s"
            + (f", other work using {min(others):.0%} to {max(others):.0%} of the CPUs" if others else "")
            + f", {sum(x['wall_seconds'] for x in slow):.1f} s of its wall time: the model takes one step time"
            ) if slow else None
