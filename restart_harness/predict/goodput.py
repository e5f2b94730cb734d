"""What failures and checkpoints cost a job, and the checkpoint interval that maximizes its goodput (no torch).

Failures arrive as a Poisson process (exponential times between them) whose rate grows with the job's size: a job
of G GPUs whose GPUs each fail once every M_gpu seconds fails once every M_gpu / G. A job that trains `interval`
seconds, then pays `save` seconds of training lost to a checkpoint, and after each failure pays `restart` seconds
(process start to its first step) and loses the work since its last commit, spends on each committed interval on
average (Daly 2006, eq. 13, the exact expectation for exponential failures):

    M * exp(restart / M) * (exp((interval + save) / M) - 1)

Goodput is the interval over that time. Young's (1974) and Daly's first-order optimum is sqrt(2 * save * M); the
optimum here is computed numerically (a bounded golden-section search on log(interval)), so it holds where the
first-order one does not (a save or restart not small against M)."""

from __future__ import annotations

import math

# Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4: 419 unexpected interruptions in 54 days of pre-training
# on 16,384 H100 GPUs (about one every 3 hours)
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
DEFAULT_MTBF_PER_GPU_SECONDS = LLAMA3_DAYS * 86_400 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS
DEFAULT_MTBF_SOURCE = (f"Meta's Llama 3 report (2024, section 3.3.4): {LLAMA3_INTERRUPTIONS} unexpected interruptions "
                       f"in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} H100 GPUs, i.e. one every "
                       f"{DEFAULT_MTBF_PER_GPU_SECONDS / 86_400 / 365.25:.1f} GPU-years")
GOLDEN = (math.sqrt(5) - 1) / 2


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


def young_daly_seconds(save_seconds: float, job_mtbf_seconds: float) -> float:
    """The first-order optimum interval: sqrt(2 * save * MTBF)."""
    return math.sqrt(2 * save_seconds * job_mtbf_seconds)


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
    first_order = young_daly_seconds(save_seconds, job_mtbf_seconds)
    return {"job_mtbf_seconds": job_mtbf_seconds, "save_seconds": save_seconds, "restart_seconds": restart_seconds,
            "step_seconds": step_seconds, "best_interval_seconds": best, "best_interval_steps": steps,
            "goodput_at_best": goodput(best), "goodput_at_best_steps": goodput(steps * step_seconds),
            "young_daly_interval_seconds": first_order,
            "goodput_at_young_daly": goodput(max(first_order, step_seconds))}


def curve(save_seconds: float, restart_seconds: float, job_mtbf_seconds: float,
          intervals_seconds: list[float]) -> list[dict]:
    """Expected goodput at each of the intervals."""
    return [{"interval_seconds": t, "goodput": expected_goodput(t, save_seconds, restart_seconds, job_mtbf_seconds)}
            for t in intervals_seconds]


def first_commit_seconds(restart_seconds: float, step_seconds: float, save_interval_steps: int,
                         save_seconds: float) -> float:
    """From a failure to the next committed checkpoint at the least: the restart, an interval's steps, one save."""
    return restart_seconds + save_interval_steps * step_seconds + save_seconds


def render(o: dict, gpus: int | None = None, source: str | None = None) -> str:
    """The optimum in a few lines."""
    scale = f" at {gpus:,} GPUs" if gpus else ""
    lines = [f"goodput{scale}: job MTBF {o['job_mtbf_seconds']:,.0f} s"
             + (f" ({source})" if source else ""),
             (f"  inputs: save (training lost) {o['save_seconds']:.3g} s, restart {o['restart_seconds']:.3g} s, "
             f"step {o['step_seconds']:.3g} s"),
             (f"  best checkpoint interval {o['best_interval_seconds']:,.1f} s ({o['best_interval_steps']:,} steps): "
             f"expected goodput {o['goodput_at_best']:.4f}"),
             (f"  Young/Daly sqrt(2 x save x MTBF) = {o['young_daly_interval_seconds']:,.1f} s: goodput "
             f"{o['goodput_at_young_daly']:.4f}")]
    return "\n".join(lines)


def from_phases(phases: dict, gpus: int, mtbf_per_gpu_seconds: float = DEFAULT_MTBF_PER_GPU_SECONDS) -> dict | None:
    """The optimum from a prediction's phases (`predict`, a run's prediction.json): a save's blocking seconds as its
    training lost, start-up to the first step as the restart, the first step as the step; None where not predicted."""
    def seconds(name: str) -> float | None:
        return (phases.get(name) or {}).get("seconds")

    save, restart, step = (seconds(n) for n in ("save_blocking_seconds", "restart_total_with_launch_seconds",
                                                  "restart_first_step_seconds"))
    if save is None or restart is None or not step:
        return None
    return {"gpus": gpus, "mtbf_per_gpu_seconds": mtbf_per_gpu_seconds, "mtbf_source": DEFAULT_MTBF_SOURCE
            if mtbf_per_gpu_seconds == DEFAULT_MTBF_PER_GPU_SECONDS else "given",
            **optimum(save, restart, step, job_mtbf_seconds(mtbf_per_gpu_seconds, gpus))}


def line(o: dict) -> str:
    """One line of an optimum at its GPU count."""
    gpus, hours = f"{o['gpus']:,} GPU" + ("" if o["gpus"] == 1 else "s"), o["job_mtbf_seconds"] / 3600
    return (f"at {gpus} (job MTBF {f'{hours:,.0f}' if hours >= 100 else f'{hours:.3g}'} h): best checkpoint interval "
            f"{o['best_interval_seconds']:,.1f} s ({o['best_interval_steps']:,} steps), expected goodput "
            f"{o['goodput_at_best']:.4f}; Young/Daly {o['young_daly_interval_seconds']:,.1f} s")


def from_summary(summary: dict, mtbf_per_gpu_seconds: float = DEFAULT_MTBF_PER_GPU_SECONDS) -> list[dict]:
    """The optimum from a run's measurements (summary.json): its training lost per save (median), its restart's
    total (process start to the first step), its step without a save; at its ranks (as GPUs) and at Llama 3's
    scale. Empty where a figure was not measured."""
    lost = (summary.get("checkpoint") or {}).get("training_lost") or {}
    save, restart = lost.get("per_save_seconds_median"), (summary.get("restart") or {}).get("total_seconds")
    step = (lost.get("baseline_step") or {}).get("seconds")
    if save is None or restart is None or not step:
        return []
    ranks = ((summary.get("spec") or {}).get("derived") or {}).get("world_size") or 1
    return [{"gpus": n, **optimum(max(save, 0.0), restart, step, job_mtbf_seconds(mtbf_per_gpu_seconds, n))}
            for n in dict.fromkeys((ranks, LLAMA3_GPUS))]
