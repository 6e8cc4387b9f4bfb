"""The spot recovery's rules (infra/reaper/recovery.py) on plain instances: what starts a
stopped spot node (the cloud's reclaim record, or the node's eviction-notice record), what
keeps it (a guard's record, a person's stop, no record, an unreadable record, protection,
an old reclaim, recovery off), and the reaper's own record before its stop."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from infra.reaper import handler
from infra.reaper import tags as T
from infra.reaper.core import Instance, Metrics, StartResult, StopRecord, StopResult, reap
from infra.reaper.recovery import (
    CLOUD_RESTARTS,
    KEEP,
    LOST,
    START,
    judge,
    lost,
    parse_record,
    record_value,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
BASE = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "s"}


def node(
    iid: str = "i-1",
    *,
    state: str = "stopped",
    spot: bool = True,
    record: StopRecord | None = None,
    tags: dict[str, str] | None = None,
    launched: datetime = NOW - timedelta(hours=2),
) -> Instance:
    return Instance(
        iid,
        state,
        "t",
        launched,
        {**BASE, **(tags or {})},
        spot=spot,
        stop_record=record,
    )


RECLAIMED = StopRecord(True, "reclaimed by the cloud", at=NOW - timedelta(minutes=10))


def verdict(inst: Instance, *, enabled: bool = True, can_start: bool = True) -> Any:
    return judge(inst, NOW, enabled=enabled, can_start=can_start)


def test_only_stopped_spot_nodes_are_judged() -> None:
    assert verdict(node(state="running", record=RECLAIMED)) is None
    assert verdict(node(spot=False, record=RECLAIMED)) is None


def test_the_clouds_reclaim_record_starts_the_node() -> None:
    v = verdict(node(record=RECLAIMED))
    assert v.verdict == START and "reclaimed by the cloud" in v.reason


def test_a_cloud_that_restarts_its_own_is_left_to_it() -> None:
    rec = StopRecord(True, "StateReason Server.SpotInstanceShutdown", cloud_restarts=True)
    assert verdict(node(record=rec)).verdict == CLOUD_RESTARTS


@pytest.mark.parametrize(
    ("record", "tags", "why"),
    [
        (RECLAIMED, {T.STOPPED_BY: "watchdog@2026-12-05T11:50:00Z"}, "stopped by the watchdog"),
        (None, {T.STOPPED_BY: "reaper@2026-12-05T11:50:00Z"}, "stopped by the reaper"),
        (
            StopRecord(False, "StateReason Client.UserInitiatedShutdown"),
            {},
            "a person's or a guard's",
        ),
        (StopRecord(None, "events", error="HTTP 500"), {}, "unreadable (HTTP 500)"),
        (None, {}, "no record of who stopped it"),
        (None, {T.STOPPED_BY: "someone@else"}, "is not a record this reads"),
        (RECLAIMED, {T.PROTECTED: "true"}, "never started"),
        (StopRecord(True, "old", at=NOW - timedelta(hours=25)), {}, "more than 24 h ago"),
    ],
)
def test_every_other_stop_is_kept_and_says_why(
    record: StopRecord | None, tags: dict[str, str], why: str
) -> None:
    v = verdict(node(record=record, tags=tags))
    assert v.verdict == KEEP
    assert why in v.reason


def test_the_nodes_notice_record_starts_it_when_it_is_recent() -> None:
    fresh = record_value("spot-notice", NOW - timedelta(minutes=5))
    assert verdict(node(tags={T.STOPPED_BY: fresh})).verdict == START
    stale = record_value("spot-notice", NOW - timedelta(hours=3))  # before its last start
    assert verdict(node(tags={T.STOPPED_BY: stale})).verdict == KEEP


def test_recovery_off_or_a_cloud_without_start_keeps_it() -> None:
    assert "recovery is off" in verdict(node(record=RECLAIMED), enabled=False).reason
    assert "cannot start" in verdict(node(record=RECLAIMED), can_start=False).reason


def test_records_round_trip() -> None:
    value = record_value("watchdog", NOW)
    assert value == "watchdog@2026-12-05T12:00:00Z"
    assert parse_record(value) == ("watchdog", NOW)
    assert parse_record("") is None and parse_record(None) is None
    assert parse_record("reaper@not-a-time") == ("reaper", None)


def test_lost_by_name_or_id() -> None:
    live = node("i-2", state="running", tags={"Name": "s-0"})
    gone = node("i-3", state="terminated", tags={"Name": "s-1"})
    out = {r.instance_id: r for r in lost([live, gone], ["s-0", "s-1", "s-2", "i-2"])}
    assert set(out) == {"s-1", "s-2"} and all(r.verdict == LOST for r in out.values())


class Cloud:
    """A cloud with start and the record hook, recording its calls."""

    provider, region = "fake", "r1"

    def __init__(self, instances: list[Instance], *, raises: bool = False) -> None:
        self.instances = instances
        self.raises = raises
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def scan(self, stack: str | None) -> list[Instance]:
        return self.instances

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        return {}

    def stop(self, ids: Sequence[str]) -> StopResult:
        self.calls.append(("stop", tuple(ids)))
        return StopResult(stopped=list(ids))

    def mark_stopped(self, ids: Sequence[str], value: str) -> dict[str, str]:
        self.calls.append((f"mark {value.split('@')[0]}", tuple(ids)))
        if self.raises:
            raise OSError("tag API down")
        return {}

    def start(self, ids: Sequence[str]) -> StartResult:
        self.calls.append(("start", tuple(ids)))
        if self.raises:
            raise OSError("start API down")
        return StartResult(started=list(ids))


def test_the_reaper_marks_a_spot_node_before_its_stop_and_a_failure_never_holds_it() -> None:
    ttl = {T.TIER: "a100x8", T.TTL_HOURS: "1"}
    spot = node("i-spot", state="running", tags=ttl, launched=NOW - timedelta(hours=3))
    plain = node("i-od", state="running", spot=False, tags=ttl, launched=NOW - timedelta(hours=3))
    for raises in (False, True):
        cloud = Cloud([spot, plain], raises=raises)
        report = reap(cloud, stack="s", apply=True, now=NOW)
        assert cloud.calls[0] == ("mark reaper", ("i-spot",))
        assert [sorted(ids) for what, ids in cloud.calls if what == "stop"] == [["i-od", "i-spot"]]
        assert {d.result for d in report.decisions} == {"stopped"}


def test_a_start_that_raises_is_every_ids_failure_never_the_runs() -> None:
    cloud = Cloud([node("i-a", record=RECLAIMED), node("i-b", record=RECLAIMED)], raises=True)
    report = reap(cloud, stack="s", apply=True, now=NOW, recover=True)
    results = {r.instance_id: r.result for r in report.recoveries}
    assert all(r.startswith("failed: OSError: start API down") for r in results.values())
    assert report.exit_code == 0


@pytest.mark.parametrize(
    ("value", "on"), [("", True), ("true", True), ("false", False), (" Off ", False), ("0", False)]
)
def test_the_functions_switch(value: str, on: bool) -> None:
    assert handler.restart_reclaimed({"GPUFLEET_RESTART_RECLAIMED": value}) is on
