"""The time left before the hard TTL, from the watchdog's record on the node: its stop time,
a lease, no TTL, and what cannot be read. Over real SSH in
tests/bootstrap/tasks/test_fab_over_ssh.py (fab status) and test_train_ssh.py (fab jobs)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from bootstrap.fleet import ttl as st

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
    from tests.gpufleet_node.test_watchdog import wstate

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
