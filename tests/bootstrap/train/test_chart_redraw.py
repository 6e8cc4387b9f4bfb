"""write_chart draws a job's chart again only when its history changed or the chart was
not kept everywhere the last time (bootstrap/train/runs.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bootstrap.fleet.api import StepResult
from bootstrap.train import runs

HISTORY = {
    "samples": [{"at": "2026-12-02T03:00:00Z", "gpu_util": [90.0], "gpu_mem": 50.0}],
    "events": [{"at": "2026-12-02T03:00:00Z", "event": "start", "attempt": 1}],
}


class Nodes:
    """The two fleet rounds write_chart makes: each node's history, then the chart kept."""

    def __init__(self) -> None:
        self.history: dict[str, Any] = dict(HISTORY)
        self.keep = StepResult.ok("/jobs/j1/gpufleet-chart.png, bucket/key")
        self.kept = 0

    def run_steps(self, c: Any, fleet: Any, name: str, steps: Any, **_: Any) -> Any:
        host = SimpleNamespace(label="node-0 (127.0.0.1:22)")
        if name == "history":
            result = StepResult.ok("read", node_rank=0, history=self.history)
            step = SimpleNamespace(name="history", result=result)
        else:
            self.kept += 1
            step = SimpleNamespace(name="chart", result=self.keep)
        return SimpleNamespace(
            hosts=[SimpleNamespace(host=host, steps=[step], connection_error=None)]
        )


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Nodes:
    fake = Nodes()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(runs, "run_steps", fake.run_steps)
    return fake


def chart(nodes: Nodes) -> tuple[Path | None, list[str]]:
    row = SimpleNamespace(job="j1", name="lm", spec={})
    return runs.write_chart(None, None, row, connect_timeout=5)  # type: ignore[arg-type]


def test_the_same_history_is_not_drawn_or_kept_again(nodes: Nodes) -> None:
    path, notes = chart(nodes)
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert nodes.kept == 1 and not any("unchanged" in n for n in notes)
    drawn = path.stat().st_mtime_ns
    again, notes = chart(nodes)
    assert again == path and path.stat().st_mtime_ns == drawn
    assert nodes.kept == 1 and any("unchanged" in n for n in notes)
    nodes.history = {
        **HISTORY,
        "events": [*HISTORY["events"], {"at": "2026-12-02T03:10:00Z", "event": "checkpoint"}],
    }
    chart(nodes)
    assert nodes.kept == 2


def test_a_chart_not_kept_in_the_bucket_is_sent_again_next_time(nodes: Nodes) -> None:
    nodes.keep = StepResult.failed("/jobs/j1/gpufleet-chart.png written, not uploaded: 403")
    _, notes = chart(nodes)
    assert any("not uploaded" in n for n in notes)
    nodes.keep = StepResult.ok("/jobs/j1/gpufleet-chart.png, bucket/key")
    _, notes = chart(nodes)
    assert nodes.kept == 2 and not any("unchanged" in n for n in notes)
    chart(nodes)
    assert nodes.kept == 2
