"""Tencent Cloud repossesses a reclaimed spot instance (deletes it): the function reports the
stack's node as lost, by its name (the Name tag the stack sets), never starts anything, and
the run does not fail for it. CVM's states as tencentcloud-sdk-python-cvm 3.1.178's
Instance.InstanceState lists them (SHUTDOWN: stopped, to be destroyed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from infra.reaper import tags as T
from infra.reaper.core import reap
from infra.reaper.recovery import KEEP, LOST
from tests.reaper.tencent_fake import FakeCvm, FakeTencent
from tests.reaper.test_tencent_reaper import cloud

STACK = "tcr"


def cvm(iid: str, name: str, created: datetime, **kw: object) -> FakeCvm:
    tags = {
        T.MANAGED_BY: T.MANAGED_BY_VALUE,
        T.STACK: STACK,
        T.TIER: "a100x1",
        T.ROLE: "head" if name.endswith("-0") else "worker",
        "Name": name,
    }
    return FakeCvm(
        iid,
        tags,
        created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        charge_type="SPOTPAID",
        **kw,  # type: ignore[arg-type]
    )


def test_a_repossessed_node_is_lost_and_nothing_is_started() -> None:
    now = datetime.now(UTC)
    created = now - timedelta(hours=5)
    fake = FakeTencent()
    fake.instances = [
        cvm("ins-head", "tcr-0", created, state="RUNNING"),
        cvm("ins-w1", "tcr-1", created, state="SHUTDOWN"),  # repossessed, being destroyed
        # tcr-2: gone from the listing altogether
        cvm("ins-w3", "tcr-3", created, state="STOPPED"),  # a stop: no record, kept
    ]
    fake.objects = {"gpufleet/heartbeat/ins-head": now.timestamp() - 60}
    with fake.running() as url:
        report = reap(
            cloud(url),
            stack=STACK,
            apply=True,
            recover=True,
            expected=("tcr-0", "tcr-1", "tcr-2", "tcr-3"),
        )
    by_id = {r.instance_id: r for r in report.recoveries}
    assert by_id["tcr-1"].verdict == LOST
    assert by_id["tcr-1"].line == "lost: tcr-1 (ins-w1 shutdown by the cloud)"
    assert by_id["tcr-2"].line == "lost: tcr-2 (gone from the cloud: deleted or repossessed)"
    assert "tcr-0" not in by_id
    assert by_id["ins-w3"].verdict == KEEP and "no record" in by_id["ins-w3"].reason
    assert report.summary["recovery"]["lost"] == 2
    assert not [a for a, _ in fake.calls if a == "StartInstances"]
