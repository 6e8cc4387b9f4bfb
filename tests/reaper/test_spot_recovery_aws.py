"""Spot recovery on EC2 against moto: a reclaim (StateReason Server.SpotInstanceShutdown)
is reported as EC2's to restart and never started; a user stop, an OS (watchdog) stop and a
deleted node are told apart. The state reasons are the ones the EC2 API Reference lists
(StateReason, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StateReason.html);
moto's own stop writes Client.UserInitiatedShutdown, the others are set in its backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from infra.clouds.aws.reaper import AwsCloud
from infra.reaper import handler
from infra.reaper import tags as T
from infra.reaper.core import reap
from infra.reaper.recovery import CLOUD_RESTARTS, KEEP, LOST
from tests.reaper.fleet import ACCOUNT, AMI

pytestmark = [pytest.mark.integration]

REGION = "us-west-2"  # apart from the shared fleet's us-east-1
STACK = "recover-aws"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, os.devnull)


def _backend() -> Any:
    from moto.backends import get_backend

    return get_backend("ec2")[ACCOUNT][REGION]


def _launch(url: str, n: int, stack: str) -> list[str]:
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
    tags = [
        {"Key": T.MANAGED_BY, "Value": T.MANAGED_BY_VALUE},
        {"Key": T.STACK, "Value": stack},
        {"Key": T.TIER, "Value": "dev"},
    ]
    out = ec2.run_instances(
        ImageId=AMI,
        MinCount=n,
        MaxCount=n,
        InstanceType="g5.xlarge",
        InstanceMarketOptions={"MarketType": "spot"},
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return [i["InstanceId"] for i in out["Instances"]]


def _reason(iid: str, code: str) -> None:
    from moto.ec2.models.instances import StateReason

    for reservation in _backend().reservations.values():
        for inst in reservation.instances:
            if inst.id == iid:
                inst.state_reason = StateReason(f"{code}: set by the test", code)


@pytest.fixture
def stopped(moto_url: str, aws_env: None) -> Iterator[dict[str, str]]:
    """Four spot nodes of one stack, each stopped a different way, and one terminated."""
    import boto3

    ids = _launch(moto_url, 5, STACK)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)
    ec2.stop_instances(InstanceIds=ids[:4])
    _reason(ids[0], "Server.SpotInstanceShutdown")
    _reason(ids[2], "Client.InstanceInitiatedShutdown")
    # ids[3]: the reaper's own stop, with its record (what Azure's function writes; EC2's
    # StateReason already says it was no reclaim)
    ec2.create_tags(
        Resources=[ids[3]], Tags=[{"Key": T.STOPPED_BY, "Value": "reaper@2026-12-05T10:00:00Z"}]
    )
    ec2.terminate_instances(InstanceIds=[ids[4]])
    yield {
        "reclaimed": ids[0],
        "user": ids[1],
        "os": ids[2],
        "reaper": ids[3],
        "deleted": ids[4],
    }
    ec2.terminate_instances(InstanceIds=ids[:4])


def test_ec2_reclaim_is_left_to_ec2_and_other_stops_are_kept(
    moto_url: str, stopped: dict[str, str]
) -> None:
    cloud = AwsCloud(REGION, endpoint_url=moto_url, max_attempts=2)
    report = reap(cloud, stack=STACK, apply=True, recover=True, expected=list(stopped.values()))
    by_id = {r.instance_id: r for r in report.recoveries}
    reclaimed = by_id[stopped["reclaimed"]]
    assert reclaimed.verdict == CLOUD_RESTARTS
    assert reclaimed.line.startswith(f"reclaimed: {stopped['reclaimed']}: StateReason ")
    assert "EC2 restarts it" in reclaimed.line
    assert by_id[stopped["user"]].verdict == KEEP
    assert "Client.UserInitiatedShutdown" in by_id[stopped["user"]].reason
    assert "a person's or a guard's stop" in by_id[stopped["user"]].reason
    assert "Client.InstanceInitiatedShutdown" in by_id[stopped["os"]].reason
    assert "stopped by the reaper" in by_id[stopped["reaper"]].reason
    # terminated instances are not scanned: the expected node is lost
    assert by_id[stopped["deleted"]].verdict == LOST
    assert by_id[stopped["deleted"]].line.startswith(f"lost: {stopped['deleted']} (")
    # nothing was started: every stopped one is still stopped
    states = {i.id: i.state for r in _backend().reservations.values() for i in r.instances}
    assert all(states[stopped[k]] == "stopped" for k in ("reclaimed", "user", "os", "reaper"))
    assert report.summary["recovery"]["cloud_restarts"] == 1
    assert report.summary["recovery"]["lost"] == 1
    assert report.summary["recovery"]["started"] == 0
    assert report.exit_code == 0


def test_the_function_logs_one_line_per_verdict(
    moto_url: str, stopped: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    env = {
        "GPUFLEET_STACK": STACK,
        "GPUFLEET_REGION": REGION,
        "GPUFLEET_APPLY": "true",
        "GPUFLEET_ENDPOINT_URL": moto_url,
        "GPUFLEET_NODES": ",".join(stopped.values()),
    }
    out = handler.run("aws", env)
    lines = [r["line"] for r in out["recoveries"]]
    assert any(line.startswith("lost: ") for line in lines)
    assert any("EC2 restarts it" in line for line in lines)
    assert all(len(line) < 200 for line in lines)
    assert "EC2 restarts it" in capsys.readouterr().out


def test_stop_record_without_a_state_reason_is_unreadable_never_a_reclaim() -> None:
    from infra.clouds.aws.reaper import stop_record

    assert stop_record(None).reclaimed is None
    assert stop_record({"Code": "Server.SpotInstanceShutdown"}).cloud_restarts
    assert stop_record({"Code": "Server.ScheduledStop"}).reclaimed is False


def test_recovery_off_still_reports(moto_url: str, stopped: dict[str, str]) -> None:
    cloud = AwsCloud(REGION, endpoint_url=moto_url, max_attempts=2)
    report = reap(cloud, stack=STACK, apply=False, recover=False)
    verdicts = {r.instance_id: r.verdict for r in report.recoveries}
    assert verdicts[stopped["reclaimed"]] == CLOUD_RESTARTS
    assert datetime.now(UTC) - report.now < timedelta(hours=1)


def test_the_verdicts_hold_through_throttling_and_5xx(
    moto_url: str, stopped: dict[str, str]
) -> None:
    """Through the fault proxy (the first two DescribeInstances throttled, then 30 % of
    the requests throttled or 5xx, all retried by botocore): the same verdicts as a clean
    run, and the run ends without a crash."""
    from tests.reaper.faultproxy import FaultProxy

    clean = reap(AwsCloud(REGION, endpoint_url=moto_url, max_attempts=2), stack=STACK, apply=True)
    proxy = FaultProxy(moto_url, rate=0.30, seed=7)
    proxy.fail_ops["DescribeInstances"] = 2
    with proxy.running():
        cloud = AwsCloud(REGION, endpoint_url=proxy.url, max_attempts=10, timeout_s=60)
        faulty = reap(cloud, stack=STACK, apply=True, recover=True)
    assert proxy.faults >= 2
    assert cloud.counter.attempts > cloud.counter.total  # retried
    want = {r.instance_id: r.verdict for r in clean.recoveries}
    assert {r.instance_id: r.verdict for r in faulty.recoveries} == want
    assert faulty.exit_code == 0
