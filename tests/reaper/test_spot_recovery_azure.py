"""Spot recovery on Azure against the HTTPS protocol fake (tests/reaper/azure_fake.py): an
evicted (deallocated) spot VM whose node recorded the eviction notice is started again; a
VM the watchdog stopped, one with no record at all (a person in the portal) and a stale
notice are kept; an allocation failure waits for the next run; a throttled or failing
start is reported, never the run's failure."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node.idle_rules import UTC
from infra.clouds.azure.reaper import ROLE_ACTIONS, AzureCloud
from infra.reaper import tags as T
from infra.reaper.core import reap
from infra.reaper.recovery import KEEP, START, record_value
from tests.reaper.azure_fake import (
    RESOURCE_GROUP,
    SUBSCRIPTION,
    FakeAzure,
    FakeCredential,
    FakeVM,
    make_tls,
)

pytestmark = pytest.mark.integration

STACK = "azr"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_tls(tmp_path_factory.mktemp("tls"))


def cloud(url: str, tls: tuple[Path, Path], **kw: Any) -> AzureCloud:
    options: dict[str, Any] = {
        "subscription_id": SUBSCRIPTION,
        "resource_group": RESOURCE_GROUP,
        "credential": FakeCredential(),
        "endpoint": url,
        "connection_verify": str(tls[0]),
        "backoff_s": 0.01,
        "max_delay_s": 0.05,
        "polling_interval_s": 0.01,
        "timeout_s": 2.0,
        "max_attempts": 2,
    }
    options.update(kw)
    return AzureCloud("eastus", **options)


def build(now: datetime) -> FakeAzure:
    fake = FakeAzure()
    evicted = now - timedelta(minutes=10)  # the deallocation: its provisioning time
    notice = record_value("spot-notice", evicted - timedelta(seconds=40))
    base = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: STACK, T.TIER: "a100x8"}

    def vm(name: str, record: str | None, **kw: Any) -> FakeVM:
        tags = {**base, T.ROLE: "head" if "head" in name else "worker"}
        if record is not None:
            tags[T.STOPPED_BY] = record
        return FakeVM(name, tags, evicted, power="deallocated", priority="Spot", **kw)

    fake.vms = [
        vm("vm-head-evicted", notice),
        vm("vm-evicted", notice),
        vm("vm-idle", record_value("watchdog", evicted - timedelta(seconds=20))),
        vm("vm-person", None),
        vm("vm-cleared", ""),  # the watchdog cleared the record at its last boot
        vm("vm-stale", record_value("spot-notice", evicted - timedelta(hours=2))),
        vm("vm-full", notice, allocation_fails=True),
    ]
    return fake


def test_evicted_vms_with_the_notice_record_are_started_others_kept(
    tls: tuple[Path, Path],
) -> None:
    now = datetime.now(UTC)
    fake = build(now)
    with fake.running(tls) as url:
        report = reap(cloud(url, tls), stack=STACK, apply=True, recover=True)
    by_id = {r.instance_id: r for r in report.recoveries}
    assert by_id["vm-evicted"].verdict == START and by_id["vm-evicted"].result == "started"
    assert by_id["vm-head-evicted"].result == "started"
    assert "eviction notice" in by_id["vm-evicted"].line
    assert by_id["vm-idle"].verdict == KEEP and "stopped by the watchdog" in by_id["vm-idle"].reason
    assert "no record of who stopped it" in by_id["vm-person"].reason
    assert "no record of who stopped it" in by_id["vm-cleared"].reason
    assert "older than its last stop" in by_id["vm-stale"].reason
    full = by_id["vm-full"].result
    assert full.startswith("waiting for capacity (") and "AllocationFailed" in full
    power = {v.name: v.power for v in fake.vms}
    assert power["vm-evicted"] == power["vm-head-evicted"] == "running"
    for name in ("vm-idle", "vm-person", "vm-cleared", "vm-stale", "vm-full"):
        assert power[name] == "deallocated", name
    starts = [path for method, path, _ in fake.calls if path.endswith("/start")]
    assert starts[0].endswith("/vm-head-evicted/start")  # the head first
    assert report.exit_code == 0
    assert report.summary["recovery"]["started"] == 2


@pytest.mark.parametrize("fault", ["errors", "throttle"])
def test_a_failing_start_is_reported_and_tried_next_run(tls: tuple[Path, Path], fault: str) -> None:
    now = datetime.now(UTC)
    fake = build(now)
    getattr(fake, fault)["start"] = None  # every start POST: 500, or 429
    with fake.running(tls) as url:
        report = reap(cloud(url, tls), stack=STACK, apply=True, recover=True)
        result = {r.instance_id: r.result for r in report.recoveries}["vm-evicted"]
        assert result.startswith("failed: ") and result.endswith("tried again next run")
        assert report.exit_code == 0
        getattr(fake, fault).clear()
        again = reap(cloud(url, tls), stack=STACK, apply=True, recover=True)
    assert {r.instance_id: r.result for r in again.recoveries}["vm-evicted"] == "started"


def test_the_role_may_start_but_write_no_tag() -> None:
    assert "Microsoft.Compute/virtualMachines/start/action" in ROLE_ACTIONS
    assert not [a for a in ROLE_ACTIONS if a.endswith("/write")]
