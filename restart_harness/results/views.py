"""Typed views of summary.json for its readers (the terminal: results/terminal.py): each reads one of the summary's
objects by its field names, in one place (View.of), and is read by attribute. A field an older summary lacks is None
(a list of views, empty); a key a view does not name is left out. Details the views do not name stay the summary's
own dicts (a restart's layout, a save's breakdown: docs/results.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from restart_harness.schema import restart_conditions


@dataclass(frozen=True)
class View:
    NESTED: ClassVar[dict] = {}  # field -> the view of its object, or [view] for a list of them
    RENAMED: ClassVar[dict[str, str]] = {}  # summary key -> field, where the key is a Python keyword

    @classmethod
    def of(cls, data: dict | None):
        """The view of one object; None for anything else (a missing or malformed field: the analysis reads
        summaries it did not write). A list's elements that are not objects are left out."""
        if not isinstance(data, dict):
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        values = {cls.RENAMED.get(k, k): v for k, v in data.items() if cls.RENAMED.get(k, k) in names}
        for name, view in cls.NESTED.items():
            if isinstance(view, list):
                items = values.get(name)
                values[name] = tuple(view[0].of(x) for x in (items if isinstance(items, list) else ())
                                     if isinstance(x, dict))
            else:
                values[name] = view.of(values.get(name))
        return cls(**values)


def _view(name: str, fields: str, nested: dict | None = None, renamed: dict | None = None, **methods) -> type:
    """A frozen View class with these fields (names apart by spaces), each None unless the summary has it."""
    return dataclasses.make_dataclass(name, [(f, object, None) for f in fields.split()], bases=(View,), frozen=True,
                                      namespace={"NESTED": nested or {}, "RENAMED": renamed or {}, **methods})


LostView = _view("LostView", "saves note per_save_seconds_median per_save_noise_seconds within_noise "
                  "baseline_step total_seconds")
GrowthView = _view("GrowthView", "bytes_per_save note growing standard_error_bytes saves rank")
SaveMemoryView = _view("SaveMemoryView", "saves peak_added_bytes_max peak_added_rank peak_added_tag held_bytes_max "
                       "retained_bytes_max cost_bytes_median step_peak_added_bytes engine_buffers_bytes_max growth",
                       nested={"growth": GrowthView})
CrossoverView = _view("CrossoverView", "status crossover_checkpoint_bytes run_largest_phase measured")
PredictionView = _view("PredictionView", "phases machine_busy calibration crossover",
                       nested={"crossover": CrossoverView})
SpecView = _view("SpecView", "model engine precision device seq_len tp pp dp shrink emulate subset derived zero "
                  "nodes cache host")
SaveView = _view("SaveView", "tag step files bytes blocking_seconds durable_seconds commit_seconds checksum_seconds is_async "
                  "throughput_mib_s breakdown training_lost per_node slowest_node memory per_rank",
                 renamed={"async": "is_async"})
CheckpointView = _view("CheckpointView", "tag files bytes by_kind bytes_per_rank saves training_lost memory "
                       "engine_staging efficiency storage_requests incomplete_uploads machine_load", nested={"saves": [SaveView], "training_lost": LostView, "memory": SaveMemoryView})
TrainingView = _view("TrainingView", "steps step_seconds_median steps_in_flight step_seconds_median_in_flight "
                                     "step_seconds_median_no_flush rss_growth step_numbers step_seconds step_in_flight "
                                     "losses max_rss_bytes_per_rank")
BaselineView = _view("BaselineView", "method write_mib_s read_mib_s cached age_seconds dir spread ceiling")
RestartView = _view(
    "RestartView", "record ranks total_seconds launch_seconds phases verified verified_tensors differing launcher "
    "cache environment_cache staging layout loaded load_seconds load_throughput_mib_s load_breakdown "
    "engine_load_statistics attribution io_sources memory per_node slowest_node storage_requests incomplete_uploads "
    "integrity stragglers per_rank launch_start tag wall_seconds conversion first_step_loss loss_continuity "
    "verify_seconds outcome storage_read_throughput_mib_s max_rss_bytes_per_rank exit_code load_bytes",
    # restart_conditions of this restart; whether it ran at the layout that saved the checkpoint
    conditions=lambda r: restart_conditions({"launcher": r.launcher, "cache": r.cache, "staging": r.staging,
                                             "environment_cache": r.environment_cache}),
    at_own_layout=lambda r: (r.layout or {}).get("loaded") == (r.layout or {}).get("saved"),
    # `` at the layout that wrote its checkpoint; ` at tp2-pp2-dp1 (4 ranks)` at another
    where=lambda r: "" if r.at_own_layout() else f" at {r.layout['loaded']} ({r.ranks} ranks)",
    # its I/O by source, where its ranks counted it per source (not anatomy=false's kernel figures alone)
    io_by_source=lambda r: (r.io_sources if isinstance(r.io_sources, dict) and r.io_sources.get("ranks")
                            and r.io_sources.get("by_source", True) else None))
SummaryView = _view("SummaryView", "run_id status spec checkpoint training restart restarts baseline prediction "
                    "schema_version",
                    nested={"spec": SpecView, "checkpoint": CheckpointView, "training": TrainingView,
                            "restart": RestartView, "restarts": [RestartView], "baseline": BaselineView,
                            "prediction": PredictionView})
