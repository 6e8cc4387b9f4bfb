"""Spot recovery on Alibaba Cloud against the protocol fake (tests/reaper/alicloud_fake.py):
a stopped spot node with a CloudMonitor spot interruption event since its last start is
started again, one stopped by a person or a guard (no event) never is; no stock waits for
the next run; a throttled or failing StartInstances is retried next run, never a crash;
unreadable events start nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from infra.clouds.alicloud.reaper import AlicloudCloud, interruption_record, parse_system_events
from infra.reaper import tags as T
from infra.reaper.core import Instance, reap
from infra.reaper.recovery import KEEP, START
from tests.reaper.alicloud_fake import FakeAlicloud, FakeInstance

REGION = "cn-beijing"
STACK = "ali"
BASE = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: STACK, T.TIER: "a10x1"}


def ali_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def cloud(url: str, **kw: object) -> AlicloudCloud:
    return AlicloudCloud(
        REGION,
        endpoint=url,
        access_key_id="fake-id",
        access_key_secret="fake-secret",
        account_id="1234567890",
        sleep=lambda _s: None,
        **kw,  # type: ignore[arg-type]
    )


def spot(iid: str, started: datetime, **kw: object) -> FakeInstance:
    role = {T.ROLE: "head"} if "head" in iid else {T.ROLE: "worker"}
    return FakeInstance(
        iid,
        {**BASE, **role},
        ali_time(started),
        status="Stopped",
        stopped_mode="StopCharging",
        spot_strategy="SpotAsPriceGo",
        **kw,  # type: ignore[arg-type]
    )


def build(now: datetime) -> FakeAlicloud:
    started = now - timedelta(hours=3)
    fake = FakeAlicloud()
    fake.instances = [
        spot("i-head-reclaimed", started),
        spot("i-reclaimed", started),
        spot("i-person", started),  # stopped with no event: a person (or a guard)
        spot("i-old-event", started),  # an interruption before its last start
        spot("i-nostock", started, no_stock=True),
        spot("i-protected", started),
    ]
    fake.instances[-1].tags[T.PROTECTED] = "true"
    at = int((now - timedelta(minutes=20)).timestamp() * 1000)
    before = int((started - timedelta(hours=1)).timestamp() * 1000)
    fake.interruptions = [
        ("i-head-reclaimed", at),
        ("i-reclaimed", at),
        ("i-old-event", before),
        ("i-nostock", at),
        ("i-protected", at),
    ]
    return fake


def test_reclaimed_nodes_are_started_and_every_other_stop_is_kept() -> None:
    now = datetime.now(UTC)
    fake = build(now)
    with fake.running() as url:
        report = reap(cloud(url), stack=STACK, apply=True, recover=True)
    by_id = {r.instance_id: r for r in report.recoveries}
    assert by_id["i-reclaimed"].verdict == START
    assert by_id["i-reclaimed"].result == "started"
    assert "PreemptibleInstanceInterruption" in by_id["i-reclaimed"].line
    assert by_id["i-head-reclaimed"].result == "started"
    assert by_id["i-person"].verdict == KEEP and "no Instance:Preempt" in by_id["i-person"].reason
    assert by_id["i-old-event"].verdict == KEEP
    assert by_id["i-protected"].verdict == KEEP
    waiting = by_id["i-nostock"]
    assert waiting.result.startswith("waiting for capacity (LackResource)")
    states = {i.instance_id: i.status for i in fake.instances}
    assert states["i-reclaimed"] == states["i-head-reclaimed"] == "Running"
    assert states["i-person"] == states["i-old-event"] == states["i-protected"] == "Stopped"
    assert states["i-nostock"] == "Stopped"
    # heads first: the head's StartInstances call came before the workers'
    starts = [q for a, q in fake.calls if a == "StartInstances"]
    assert starts[0]["InstanceId.1"] == "i-head-reclaimed"
    assert report.summary["recovery"]["started"] == 2
    assert report.summary["recovery"]["waiting_for_capacity"] == 1
    assert report.exit_code == 0  # waiting is not a failure of the run
    # the next run tries the waiting one again, once
    for inst in fake.instances:
        if inst.instance_id == "i-nostock":
            inst.no_stock = False
    with fake.running() as url:
        again = reap(cloud(url), stack=STACK, apply=True, recover=True)
    assert {r.instance_id: r.result for r in again.recoveries}["i-nostock"] == "started"


def test_recovery_off_and_dry_run_start_nothing() -> None:
    now = datetime.now(UTC)
    fake = build(now)
    with fake.running() as url:
        off = reap(cloud(url), stack=STACK, apply=True, recover=False)
        dry = reap(cloud(url), stack=STACK, apply=False, recover=True)
    assert "recovery is off" in {r.instance_id: r.reason for r in off.recoveries}["i-reclaimed"]
    assert {r.instance_id: r.result for r in dry.recoveries}["i-reclaimed"] == "dry run"
    assert not [a for a, _ in fake.calls if a == "StartInstances"]


@pytest.mark.parametrize("fault", ["fail", "throttle"])
def test_a_failing_start_call_is_reported_and_retried_next_run_never_a_crash(fault: str) -> None:
    now = datetime.now(UTC)
    fake = build(now)
    if fault == "fail":
        fake.fail_actions = {"StartInstances"}
    else:
        fake.throttle_actions = {"StartInstances"}
    with fake.running() as url:
        report = reap(cloud(url, max_attempts=2), stack=STACK, apply=True, recover=True)
    result = {r.instance_id: r.result for r in report.recoveries}["i-reclaimed"]
    assert result.startswith("failed: ") and result.endswith("tried again next run")
    assert report.exit_code == 0
    # bounded: two calls (head, workers), each at most max_attempts
    assert sum(1 for a, _ in fake.calls if a == "StartInstances") == 2 * 2
    code = "InternalError" if fault == "fail" else "Throttling.User"
    assert code in result
    # the next run, the cloud answering again: started
    fake.fail_actions, fake.throttle_actions = set(), set()
    with fake.running() as url:
        again = reap(cloud(url), stack=STACK, apply=True, recover=True)
    assert {r.instance_id: r.result for r in again.recoveries}["i-reclaimed"] == "started"


def test_unreadable_events_start_nothing() -> None:
    now = datetime.now(UTC)
    fake = build(now)
    fake.fail_actions = {"DescribeSystemEventAttribute"}
    with fake.running() as url:
        report = reap(cloud(url, max_attempts=2), stack=STACK, apply=True, recover=True)
    assert {r.verdict for r in report.recoveries} == {KEEP}
    assert all("unreadable" in r.reason or "protected" in r.reason for r in report.recoveries)
    assert not [a for a, _ in fake.calls if a == "StartInstances"]


def test_the_recovery_calls_only_what_the_function_role_grants() -> None:
    from infra.clouds.alicloud.program import reaper_policy
    from tests.infra.alicloud_ram import SDK_PACKAGES
    from tests.reaper.alicloud_fake import REQUEST_MODELS

    ram_code = {package: code for code, package in SDK_PACKAGES.items()}
    fake = build(datetime.now(UTC))
    with fake.running() as url:
        reap(cloud(url), stack=STACK, apply=True, recover=True)
    called = {f"{ram_code[REQUEST_MODELS[a].__module__.split('.')[0]]}:{a}" for a, _ in fake.calls}
    doc = json.loads(reaper_policy(STACK))
    granted = {a for st in doc["Statement"] if st["Effect"] == "Allow" for a in st["Action"]}
    assert "cms:DescribeSystemEventAttribute" in called and "ecs:StartInstances" in called
    assert called <= granted


def test_the_event_parser_reads_the_sdk_models_shape() -> None:
    from alibabacloud_cms20190101 import models as cms_models

    raw = {
        "Code": "200",
        "Success": True,
        "RequestId": "r",
        "SystemEvents": {
            "SystemEvent": [
                {
                    "Content": json.dumps({"instanceId": "i-1", "action": "stop"}),
                    "Name": "Instance:PreemptibleInstanceInterruption",
                    "ResourceId": "acs:ecs:cn-beijing:1:instance/i-1",
                    "Time": 1764921600000,
                },
                {
                    "Content": "not json",
                    "Name": "Instance:PreemptibleInstanceInterruption",
                    "ResourceId": "acs:ecs:cn-beijing:1:instance/i-2",
                    "Time": 1764921600,
                },
            ]
        },
    }
    body = cms_models.DescribeSystemEventAttributeResponseBody().from_map(raw).to_map()
    events = parse_system_events(body)
    assert [i for i, _ in events] == ["i-1", "i-2"]
    assert events[0][1] == events[1][1] == datetime(2025, 12, 5, 8, 0, tzinfo=UTC)
    with pytest.raises(RuntimeError):
        parse_system_events({"Code": "403", "Message": "denied"})
    inst = Instance("i-1", "stopped", "t", datetime(2025, 12, 5, 9, tzinfo=UTC), {}, spot=True)
    assert interruption_record(inst, events[0][1]).reclaimed is False  # before its start
    assert interruption_record(inst, datetime(2025, 12, 5, 10, tzinfo=UTC)).reclaimed
