"""``fab status``: the time left before the hard TTL (from the watchdog's record on the node),
and the table at 80 columns, piped or not. Over real SSH in test_fab_over_ssh.py."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest

from bootstrap.fleet.api import Host, StepResult
from bootstrap.fleet.runner import FleetReport, HostReport, StepRecord
from bootstrap.tasks import status as st
from infra.render import literal_console

NOW = dt.datetime(2026, 12, 2, 8, 0, tzinfo=dt.UTC)
UPTIME = 5 * 3600.0  # booted at 03:00
BOOT = NOW - dt.timedelta(seconds=UPTIME)


def record(**kw: Any) -> str:
    base = {
        "boot": BOOT.isoformat(),
        "at": (NOW - dt.timedelta(seconds=40)).isoformat(),
        "stop_at": (BOOT + dt.timedelta(hours=24)).isoformat(),
        "why": "ttl",
        "ttl_hours": 24.0,
        "lease_until": None,
        "warned": [],
    }
    return json.dumps(base | kw)


def left(section: str, uptime: Any = UPTIME) -> dict[str, Any]:
    return st.ttl_left(section, f"{NOW.timestamp():.0f}\n", uptime)


def test_time_left_is_the_watchdogs_stop_time_less_the_nodes_clock() -> None:
    ttl = left(record())
    assert ttl["state"] == "left" and ttl["seconds"] == 19 * 3600
    assert ttl["stop_at"] == "2026-12-03T03:00:00Z"
    assert st.ttl_cell(ttl) == "19h00m" and st.ttl_note(ttl) == ""


def test_a_lease_over_the_ttl_shows_its_end_and_says_so() -> None:
    until = BOOT + dt.timedelta(hours=30)
    ttl = left(record(stop_at=until.isoformat(), why="lease", lease_until="x"))
    assert ttl["seconds"] == 25 * 3600
    assert st.ttl_cell(ttl) == "25h00m lease"
    assert "held off by a lease: stops at 2026-12-03T09:00:00Z" in st.ttl_note(ttl)


def test_no_ttl_is_off_and_protected_says_so() -> None:
    assert st.ttl_cell(left(record(stop_at=None, why="off"))) == "off"
    assert st.ttl_cell(left(record(stop_at=None, why="protected"))) == "protected"


@pytest.mark.parametrize(
    ("section", "uptime", "reason"),
    [
        ("missing", UPTIME, "no watchdog state (fab install-watchdog)"),
        ("unreadable", UPTIME, "watchdog state unreadable"),
        ("{not json", UPTIME, "watchdog state unreadable"),
        ("null", UPTIME, "no TTL in watchdog state (fab install-watchdog)"),
        ("", UPTIME, "watchdog state unreadable"),
        (record(boot="yesterday"), UPTIME, "watchdog state unreadable"),
        (record(), 600.0, "watchdog has not run since boot"),  # rebooted since
        (record(at=(NOW - dt.timedelta(minutes=25)).isoformat()), UPTIME, "watchdog silent 25m"),
    ],
)
def test_what_cannot_be_read_is_unknown_with_a_short_reason(
    section: str, uptime: float, reason: str
) -> None:
    ttl = left(section, uptime)
    assert ttl == {"state": "unknown", "reason": reason}
    assert st.ttl_cell(ttl) == "unknown" and st.ttl_note(ttl) == f"TTL unknown: {reason}"


def test_an_unreadable_node_clock_is_unknown() -> None:
    assert st.ttl_left(record(), "", UPTIME)["reason"] == "node clock unreadable"


def test_the_state_file_name_is_the_watchdogs() -> None:
    from tests.bootstrap.remote.test_watchdog import wstate

    assert st.WATCHDOG_STATE_FILE == wstate.STATE_FILE


def test_time_left_formats_short() -> None:
    assert [st.format_left(s) for s in (0, 59, 3599, 3600, 47 * 3600 + 60, 50 * 3600)] == [
        "0m",
        "0m",
        "59m",
        "1h00m",
        "47h01m",
        "2d 2h",
    ]


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
