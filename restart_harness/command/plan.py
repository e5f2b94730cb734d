"""`plan MODEL ...` (the checkpoint a run would write) and `predict MODEL ...` (its save and restart times): a
run's tokens and the command's own keys."""

from __future__ import annotations

import dataclasses

from engines import registry
from restart_harness import resolve, stacks
from restart_harness.command.options import PlanOptions, PredictOptions
from restart_harness.command.requests import PlanRequest, PredictRequest
from restart_harness.command.run import parse_run
from restart_harness.errors import UsageError, refused
from restart_harness.spec.keys import keys_of
from restart_harness.spec.runspec import plausible_rates


def parse_plan(tokens: list[str]) -> PlanRequest:
    spec, values = parse_run(tokens, keys_of(PlanOptions))
    if not resolve.stack_class(spec).planned:
        raise UsageError(f"stack={spec.stack}: the planner predicts DeepSpeed's checkpoint files; accepted: "
                         f"{_planned_stacks()} (a "
                         f"stack={spec.stack} checkpoint is one DCP shard file per rank and .metadata)")
    options = PlanOptions(**values)
    plausible_rates(spec.shape, spec.world_size, {"bandwidth_gbps": options.bandwidth_gbps})
    target = None
    if any(v is not None for v in (options.to_tp, options.to_pp, options.to_dp)):
        if not resolve.engine_class(spec.engine).universal:
            raise UsageError(f"to_tp/to_pp/to_dp: engine={spec.engine} cannot restart at another layout (DeepSpeed's "
                             "universal-checkpoint converter reads torch.save files only); accepted: engine="
                             + ", ".join(n for n, c in registry.all_engines().items() if c.universal))
        try:
            target = spec.with_layout(tp=options.to_tp or spec.tp, pp=options.to_pp or spec.pp,
                                      dp=options.to_dp or spec.dp, ranks_per_node=None)
        except UsageError as exc:
            given = " ".join(f"to_{k}={v}" for k, v in (("tp", options.to_tp), ("pp", options.to_pp),
                                                        ("dp", options.to_dp)) if v is not None)
            raise UsageError(f"{given}: {exc}") from None
    return PlanRequest(spec, options, target)


def _planned_stacks() -> str:
    return ", ".join(f"stack={n}" for n, cls in stacks.all_stacks().items() if n in stacks.names() and cls.planned)


def parse_predict(tokens: list[str]) -> PredictRequest:
    spec, values = parse_run(tokens, keys_of(PredictOptions))
    if not resolve.stack_class(spec).planned:
        raise UsageError(f"stack={spec.stack}: the prediction model builds on the planner, which predicts DeepSpeed's "
                         f"checkpoint files; accepted: {_planned_stacks()}")
    options = PredictOptions(**values)
    if (options.write_gbps is None) != (options.read_gbps is None):
        given = "write_gbps" if options.write_gbps is not None else "read_gbps"
        typed = next(t.split("=", 1)[1] for t in tokens if t.startswith(f"{given}="))
        raise refused(given, typed, "give write_gbps= and read_gbps= together", "both, or neither (the cached "
                      "baseline)")
    if options.crossover_min_bytes >= options.crossover_max_bytes:  # the key typed is the one named
        typed = {k: t.split("=", 1)[1] for t in tokens for k in ("crossover_min_bytes", "crossover_max_bytes")
                 if t.startswith(f"{k}=")}
        name = "crossover_min_bytes" if "crossover_min_bytes" in typed else "crossover_max_bytes"
        other = "crossover_max_bytes" if name == "crossover_min_bytes" else "crossover_min_bytes"
        raise refused(name, typed[name], f"{'not below' if name.endswith('min_bytes') else 'not above'} "
                      f"{other}={getattr(options, other):,}", "crossover_min_bytes below crossover_max_bytes (the "
                      "checkpoint sizes the crossover looks at)")
    plausible_rates(spec.shape, spec.world_size, dataclasses.asdict(options))
    return PredictRequest(spec, options)

