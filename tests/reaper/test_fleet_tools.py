"""The test fleet's moto speed-ups and direct launch answer exactly like moto itself."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest
from moto.cloudwatch.models import CloudWatchBackend
from moto.ec2.exceptions import InvalidInstanceIdError
from moto.ec2.models.amis import AmiBackend

from gpufleet_node.idle_rules import UTC
from tests.reaper.fleet import (
    AMI,
    Case,
    _ec2_backend,
    client,
    launch,
    moto_describe_images,
    moto_get_metric_data,
    speed_up_moto_images,
    speed_up_moto_instances,
    speed_up_moto_metrics,
)


def test_indexed_get_metric_data_answers_like_moto(moto_url: str) -> None:
    cw = client("cloudwatch", moto_url)
    now = datetime.now(UTC).replace(microsecond=0)
    data = []
    for n, iid in enumerate(["i-a", "i-b", "i-c"]):
        dims = [{"Name": "InstanceId", "Value": iid}]
        for minutes in (1, 3, 20 + n, 59, -12):  # -12: a node whose clock runs fast
            at = now - timedelta(minutes=minutes)
            data.append(
                {"MetricName": "Heartbeat", "Dimensions": dims, "Timestamp": at, "Value": 1.0}
            )
            data.append(
                {
                    "MetricName": "GPUUtilization",
                    "Dimensions": dims,
                    "Timestamp": at,
                    "Value": 7.0 * n,
                }
            )
    cw.put_metric_data(Namespace="speedup-test", MetricData=data)

    def queries(period_h: int, period_u: int) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for n, iid in enumerate(["i-a", "i-b", "i-c", "i-missing"]):
            for prefix, name, period, stat in (
                ("h", "Heartbeat", period_h, "Maximum"),
                ("u", "GPUUtilization", period_u, "Maximum"),
                ("s", "Heartbeat", period_h, "SampleCount"),
            ):
                out.append(
                    {
                        "Id": f"{prefix}{n}",
                        "MetricStat": {
                            "Metric": {
                                "Namespace": "speedup-test",
                                "MetricName": name,
                                "Dimensions": [{"Name": "InstanceId", "Value": iid}],
                            },
                            "Period": period,
                            "Stat": stat,
                        },
                    }
                )
        return out

    def ask(periods: tuple[int, int], scan: str) -> list[object]:
        r = cw.get_metric_data(
            MetricDataQueries=queries(*periods),
            StartTime=now - timedelta(minutes=75),
            EndTime=now + timedelta(minutes=15),
            ScanBy=scan,
        )
        return r["MetricDataResults"]

    cases = [((60, 5400), "TimestampDescending"), ((300, 60), "TimestampAscending")]
    installed = CloudWatchBackend.get_metric_data
    CloudWatchBackend.get_metric_data = moto_get_metric_data()  # type: ignore[method-assign]
    try:
        plain = [ask(p, s) for p, s in cases]
        undo = speed_up_moto_metrics()
        fast = [ask(p, s) for p, s in cases]
        undo()
    finally:
        CloudWatchBackend.get_metric_data = installed  # type: ignore[method-assign]
    assert fast == plain
    assert any(r["Values"] for r in plain[0])  # the comparison compared datapoints


# A region of its own: the fleet's tests rebuild us-east-1 and count every instance there.
ELSEWHERE = "eu-west-3"

# Fields moto draws at random or from the clock for every instance (ids, addresses, times).
_PER_INSTANCE = {
    "InstanceId",
    "LaunchTime",
    "AttachTime",
    "VolumeId",
    "PrivateDnsName",
    "PrivateIpAddress",
    "PublicDnsName",
    "PublicIpAddress",
    "PublicIp",
    "ClientToken",  # botocore makes one up per call
    "NetworkInterfaceId",
    "AttachmentId",
    "MacAddress",
    "ReservationId",
    "Ipv6Address",
    "Value",  # the tag value that names the launch path
}


def _shape(value: object) -> object:
    """``value`` with every per-instance field blanked, for comparing two launches."""
    if isinstance(value, dict):
        return {k: "*" if k in _PER_INSTANCE else _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return value


def _differences(a: object, b: object, at: str = "") -> list[str]:
    """The paths where two shapes differ, for a readable failure."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b))
            for d in _differences(a.get(k), b.get(k), f"{at}.{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for n, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{at}[{n}]")
        ]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"]


def test_the_fleets_direct_launch_makes_what_run_instances_makes(moto_url: str) -> None:
    ec2 = boto3.client(
        "ec2",
        endpoint_url=moto_url,
        region_name=ELSEWHERE,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    kinds = [
        Case("plain", "keep"),
        Case("spot", "keep", spot=True),
        Case("guarded", "stop", disable_api_stop=True),
    ]
    compared = 0
    for n, case in enumerate(kinds):
        via_api = {"gpufleet:test": f"api-{n}", "Name": "speedup"}
        direct = {"gpufleet:test": f"direct-{n}", "Name": "speedup"}
        kwargs: dict[str, object] = {
            "ImageId": AMI,
            "InstanceType": "p4d.24xlarge",
            "MinCount": 2,
            "MaxCount": 2,
            "TagSpecifications": [
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in via_api.items()],
                }
            ],
        }
        if case.spot:
            kwargs["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "persistent",
                    "InstanceInterruptionBehavior": "stop",
                },
            }
        if case.disable_api_stop:
            kwargs["DisableApiStop"] = True
        ec2.run_instances(**kwargs)
        launch(2, direct, case, region=ELSEWHERE)

        def described(tags: dict[str, str]) -> list[dict[str, Any]]:
            answer = ec2.describe_instances(
                Filters=[{"Name": "tag:gpufleet:test", "Values": [tags["gpufleet:test"]]}]
            )
            return [i for r in answer["Reservations"] for i in r["Instances"]]

        api_made, made_here = described(via_api), described(direct)
        assert len(api_made) == len(made_here) == 2
        assert not _differences(_shape(made_here), _shape(api_made)), case.name
        attrs = [
            ec2.describe_instance_attribute(InstanceId=i["InstanceId"], Attribute="disableApiStop")
            for i in (api_made[0], made_here[0])
        ]
        assert attrs[0]["DisableApiStop"] == attrs[1]["DisableApiStop"]
        compared += 1
    assert compared == len(kinds)


def test_the_image_and_instance_lookups_answer_like_moto(moto_url: str) -> None:
    backend = _ec2_backend(ELSEWHERE)
    (iid,) = launch(1, {"Name": "lookup"}, Case("plain", "keep"), region=ELSEWHERE)
    asks: list[dict[str, object]] = [
        {"filters": {"image-id": AMI}},
        {"filters": {"image-id": "ami-00000000"}},  # no such image
        {"filters": {"image-id": "ami-12c6*"}},  # a wildcard: moto's own scan
        {"filters": {"image-id": [AMI]}},
        {"ami_ids": [AMI]},
    ]
    installed = AmiBackend.describe_images
    AmiBackend.describe_images = moto_describe_images()  # type: ignore[method-assign]
    try:
        plain = [backend.describe_images(**a) for a in asks]
        plain_instance = backend.get_instance(iid)
        undo_images, undo_instances = speed_up_moto_images(), speed_up_moto_instances()
        try:
            fast = [backend.describe_images(**a) for a in asks]
            fast_instance = backend.get_instance(iid)
            with pytest.raises(InvalidInstanceIdError):
                backend.get_instance("i-00000000000000000")
        finally:
            undo_instances()
            undo_images()
    finally:
        AmiBackend.describe_images = installed  # type: ignore[method-assign]
    assert [[a.id for a in found] for found in fast] == [[a.id for a in found] for found in plain]
    assert [len(found) for found in plain][:2] == [1, 0]  # the comparison compared something
    assert fast_instance is plain_instance
