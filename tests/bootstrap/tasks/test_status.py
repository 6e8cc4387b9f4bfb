"""``fab status`` at 80 columns, piped or not: one row per host with the time left before
the hard TTL, and the details beneath it. Over real SSH in test_fab_over_ssh.py."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest

from bootstrap.fleet.api import Host, StepResult
from bootstrap.fleet.runner import FleetReport, HostReport, StepRecord
from bootstrap.tasks import status as st
from infra.render import literal_console
from tests.bootstrap.fleet.test_ttl import BOOT, left, record

# ---------------------------------------------------------------- 80 columns


def details(**kw: Any) -> dict[str, Any]:
    base = {
        "gpu_count": 8,
        "gpu_model": "NVIDIA H100 80GB HBM3 with a much longer marketing name",
        "driver": "580.65.06",
        "cuda": "12.8",
        "torch": "2.8.0+cu128",
        "scratch": {"mounted": True, "free_bytes": 28_000_000_000_000, "size_bytes": 30e12},
        "scratch_path": "/scratch/with/a/rather/long/mount/point/for/good/measure",
        "reboot_required": True,
        "uptime_s": 12 * 86400 + 3600,
        "health": {"status": "degraded", "age": "3d", "age_hours": 72},
        "ttl": left(record(stop_at=(BOOT + dt.timedelta(hours=300)).isoformat(), why="lease")),
    }
    return base | kw


def report() -> FleetReport:
    long_host = Host("203.0.113.250", port=2222, name="h100x8-worker-node-number-0042")
    return FleetReport(
        "status",
        [
            HostReport(long_host, steps=[StepRecord("status", StepResult.ok("x", **details()), 0)]),
            HostReport(
                Host("198.51.100.7", name="n1"),
                steps=[StepRecord("status", StepResult.ok("x", **details(ttl=left("missing"))), 0)],
            ),
            HostReport(
                Host("198.51.100.8", port=22),
                connection_error="timeout",
                connection_message="198.51.100.8:22: no answer in 10 s " * 4,
            ),
        ],
        0.1,
    )


def printed(width_env: str | None, monkeypatch: pytest.MonkeyPatch) -> str:
    """What `fab status` prints for the report, piped (the console is not a terminal)."""
    if width_env is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", width_env)
    console = literal_console()
    console.file = io.StringIO()
    for part in st.render_status(report()):
        console.print(part)
    return console.file.getvalue()


@pytest.mark.parametrize("columns", ["80", None])
def test_status_fits_80_columns_piped_and_keeps_every_value(
    columns: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = printed(columns, monkeypatch)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    flat = " ".join(line.strip() for line in lines)
    assert "h100x8-worker-node-number-0042 (203.0.113.250:2222)" in flat  # whole, own line
    assert "driver 580.65.06, CUDA 12.8, torch 2.8.0+cu128" in flat
    assert "/scratch/with/a/rather/long/mount/point/for/good/measure: 28.0 TB free" in flat
    assert "12d 1h" in out and "REBOOT REQUIRED" in out and "HEALTH STALE" in out
    assert "295h00m" not in out and "12d 7h lease" in out  # 295 h: in days
    assert "TTL unknown: no watchdog state (fab install-watchdog)" in flat
    assert flat.count("198.51.100.8:22: no answer in 10 s") == 4
    header = next(line for line in lines if line.startswith("host"))
    assert header.split() == ["host", "GPUs", "uptime", "TTL", "left", "health"]
