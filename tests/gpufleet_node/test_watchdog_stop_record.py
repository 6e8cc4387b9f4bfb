"""The watchdog's stop record (tag gpufleet:stopped-by) where the cloud keeps no stop reason
(Azure): ``watchdog@<time>`` written just before its own power-off, ``spot-notice@<time>``
when it sees the eviction notice, and a record older than this boot cleared. The reaper's
function reads it (infra/reaper/recovery.py) to start only an evicted node again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet_node import fleet_names as names
from infra.reaper.recovery import parse_record
from tests.gpufleet_node.test_watchdog import BOOT, Timeline, make_dog, run_until_poweroff, wd

IDLE = Timeline(util=lambda m: 0.0)
BUSY = Timeline(util=lambda m: 95.0, procs=lambda m: 1)
NOTICE = json.dumps({"action": "Preempt", "time": "2026-12-05T08:40:00Z"})


class SpotCloud:
    def __init__(self) -> None:
        self.notice: str | None = None

    def spot_notice(self) -> str | None:
        return self.notice


def test_the_record_is_written_just_before_the_power_off(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, IDLE)
    written: list[tuple[str, float]] = []
    dog.record = lambda value: written.append((value, probe.minutes))
    off = run_until_poweroff(dog, probe, rec, 200)
    assert off is not None
    assert len(written) == 1
    value, at = written[0]
    who, when = parse_record(value) or ("", None)
    assert who == wd.STOPPED_BY_WATCHDOG and when == probe.now().replace(microsecond=0)
    assert at == off  # in the run that powered off
    assert [e for e, _ in rec.events][-1] == "poweroff"


def test_a_record_that_cannot_be_written_never_holds_the_stop(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, IDLE)

    def fails(value: str) -> None:
        raise OSError("ARM unreachable")

    dog.record = fails
    assert run_until_poweroff(dog, probe, rec, 200) is not None


def test_a_dry_run_writes_no_record(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(tmp_path, IDLE, dry_run=True)
    written: list[str] = []
    dog.record = written.append
    run_until_poweroff(dog, probe, rec, 120)
    assert written == []


def test_the_eviction_notice_is_recorded_before_the_sync(tmp_path: Path) -> None:
    dog, _probe, rec = make_dog(tmp_path, BUSY)
    written: list[str] = []

    def record(value: str) -> None:
        written.append(value)
        rec.events.append(("record", 0))

    dog.record = record
    dog.cloud = SpotCloud()
    dog.run_once()
    assert written == []
    dog.cloud.notice = NOTICE
    dog.run_once()
    assert [parse_record(v)[0] for v in written] == [wd.STOPPED_BY_NOTICE]  # type: ignore[index]
    events = [e for e, _ in rec.events]
    assert events.index("record") < next(i for i, e in enumerate(events) if e.startswith("sync"))


@pytest.mark.parametrize(
    ("value", "cleared"),
    [
        ("watchdog@2026-01-01T00:00:00Z", True),  # before this boot: spent
        ("spot-notice@garbage", True),  # unreadable time: not of this boot
        (f"spot-notice@{(BOOT.replace(microsecond=0)).isoformat()}", False),  # this boot
        ("", False),  # already cleared
    ],
)
def test_a_record_from_before_this_boot_is_cleared(
    tmp_path: Path, value: str, cleared: bool
) -> None:
    dog, _probe, _rec = make_dog(tmp_path, BUSY, tags=lambda m: {names.STOPPED_BY: value})
    written: list[str] = []
    dog.record = written.append
    dog.run_once()
    assert written == ([""] if cleared else [])


def test_without_a_recorder_nothing_is_written_or_cleared(tmp_path: Path) -> None:
    dog, probe, rec = make_dog(
        tmp_path, IDLE, tags=lambda m: {names.STOPPED_BY: "watchdog@2026-01-01T00:00:00Z"}
    )
    assert dog.record is None  # clouds with their own stop reason (EC2, Alibaba)
    assert run_until_poweroff(dog, probe, rec, 200) is not None


def test_only_the_azure_node_writes_the_record() -> None:
    from gpufleet_node.clouds import base

    writers = {n for n, c in base.registered().items() if getattr(c, "writes_stop_record", False)}
    assert writers == {"azure"}
