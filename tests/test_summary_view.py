"""The terminal reads summary.json through its typed views (results/views.py SummaryView): read in one place, by attribute,
older summaries included."""

import dataclasses
import json
from pathlib import Path

import pytest

from restart_harness.results import terminal
from restart_harness.results.views import SummaryView

DATA = Path(__file__).parent / "data" / "results"


def test_every_stored_summary_renders_through_its_views():
    paths = sorted(DATA.rglob("summary.json"))
    assert paths
    for path in paths:
        summary = json.loads(path.read_text())
        view = SummaryView.of(summary)
        assert view.run_id == summary["run_id"] and len(view.restarts) == len(summary["restarts"])
        assert view.restart.record == summary["restart"]["record"]
        assert [s.tag for s in view.checkpoint.saves] == [s["tag"] for s in summary["checkpoint"]["saves"]]
        assert terminal.render(summary).splitlines()[0].split() == ["run", summary["run_id"]]


def test_a_key_an_older_summary_lacks_reads_as_none_and_views_are_frozen():
    view = SummaryView.of({"run_id": "r", "checkpoint": {"saves": [{"tag": "t", "async": True}]}, "newer_key": 1})
    assert view.restart is None and view.restarts == () and view.baseline is None
    assert view.checkpoint.bytes_per_rank is None
    assert view.checkpoint.saves[0].is_async is True and view.checkpoint.saves[0].durable_seconds is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.run_id = "other"


def test_a_host_that_hands_free_memory_back_to_its_hypervisor_is_said_beside_the_ceiling():
    """spec.json's host.free_page_reporting_order (kernel_memory.free_page_reporting_order) explains why a load into
    fresh memory trails the ceiling: the terminal says it where it is set, and nothing where it is None."""
    summary = json.loads(min(DATA.rglob("summary.json")).read_text())
    host = summary["spec"].setdefault("host", {})
    host["free_page_reporting_order"] = None
    assert "fresh memory" not in terminal.render(summary)
    host["free_page_reporting_order"] = 9
    row = next(line for line in terminal.render(summary).splitlines() if line.startswith("fresh memory"))
    assert "order 9" in row and "2,048 KiB" in row
