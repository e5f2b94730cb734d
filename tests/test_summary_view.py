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
