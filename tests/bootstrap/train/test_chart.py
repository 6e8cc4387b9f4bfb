"""A job's chart from the samples and events its nodes keep, read back from the figure's
own data: the series per node, their values, and each event line where it happened."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from matplotlib.dates import num2date

from bootstrap.train import chart

T0 = dt.datetime(2026, 12, 2, 3, 0, tzinfo=dt.UTC)


def at(minutes: float) -> str:
    return (T0 + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_answer(rank: int, util: float, *, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``job_runner.py history`` answers: the watchdog's lines (per-GPU utilization,
    the fullest GPU's memory %) every 15 s for 10 min, and the job's events."""
    samples = [
        {"at": at(i / 4), "gpu_util": [util, util - 10], "gpu_mem": 50.0 + rank} for i in range(40)
    ]
    samples.insert(3, {"at": "not a time", "gpu_util": [1.0], "gpu_mem": 1.0})
    return {"ok": True, "node_rank": rank, "samples": samples, "events": events}


ANSWERS = {
    0: node_answer(
        0,
        90.0,
        events=[
            {"at": at(0), "event": "start", "attempt": 1},
            {"at": at(4), "event": "checkpoint", "step": 100},
            {"at": at(6), "event": "cancel", "signal": 15},
            {"at": at(6.5), "event": "end", "state": "cancelled", "exit_code": -15},
            {"at": at(8), "event": "resume", "attempt": 2},
            {"at": at(9), "event": "unknown-kind"},
        ],
    ),
    1: node_answer(
        1,
        70.0,
        events=[
            {"at": at(0.1), "event": "start", "attempt": 1},
            {"at": at(6.6), "event": "end", "state": "cancelled", "exit_code": -15},
            {"at": at(8.1), "event": "resume", "attempt": 2},
        ],
    ),
}


def figure() -> Any:
    return chart.job_figure(chart.history_of("lm-261202-030000-ab12", "lm", ANSWERS))


def lines_by_label(ax: Any) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_gid()}


def test_each_node_is_one_series_of_mean_utilisation_and_one_of_memory() -> None:
    util_ax, mem_ax = figure().axes
    util, mem = lines_by_label(util_ax), lines_by_label(mem_ax)
    assert set(util) == set(mem) == {"node 0", "node 1"}
    assert list(util["node 0"].get_ydata()) == [85.0] * 40  # mean of 90 and 80
    assert list(util["node 1"].get_ydata()) == [65.0] * 40
    assert list(mem["node 1"].get_ydata()) == [51.0] * 40
    xs = [num2date(x) if isinstance(x, float) else x for x in util["node 0"].get_xdata()]
    assert xs[0] == T0 and xs[-1] == T0 + dt.timedelta(minutes=9.75)  # the bad line left out


def test_the_jobs_events_are_lines_on_both_panels_once_each_where_they_happened() -> None:
    fig = figure()
    for ax in fig.axes:
        marks = [(line.get_gid(), line.get_xdata()[0]) for line in ax.get_lines() if line.get_gid()]
        kinds = [gid.split(":")[1] for gid, _ in marks]
        # a start, end and resume every node reports are drawn once; unknown kinds not at all
        assert kinds == ["start", "checkpoint", "cancel", "end", "resume"]
        assert marks[1][1] == T0 + dt.timedelta(minutes=4)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["start (attempt 1)", "step 100", "cancel", "cancelled", "resume (attempt 2)"]
    assert fig.texts[0].get_text() == "lm: lm-261202-030000-ab12"


def test_the_chart_is_written_as_a_png_of_the_figure(tmp_path: Path) -> None:
    from matplotlib.image import imread

    path = chart.save_chart(figure(), tmp_path / "jobs" / "lm" / chart.CHART_NAME)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(path).shape
    assert (width, height) == (1100, 600)


def test_a_job_with_nothing_recorded_has_no_chart() -> None:
    assert chart.history_of("j", "j", {0: {"samples": [], "events": []}}).empty
