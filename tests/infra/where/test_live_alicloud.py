"""Alibaba Cloud's availability signal (infra/clouds/alicloud/availability.py): the official
SDK, signed, against a local fake of ECS DescribeAvailableResource on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from alibabacloud_ecs20140526 import models as ecs_models

from infra.clouds.alicloud import availability
from infra.clouds.availability import AVAILABLE, SOLD_OUT, NoSignal
from tests.infra.where.fakes import serving
from tests.support.alicloud_models import unknown_params


def zone(zone_id: str, itype: str, status: str, category: str) -> dict[str, Any]:
    """One AvailableZone, shaped like Alibaba's own sample answer for DescribeAvailableResource
    (the OpenAPI sample project's README, as in SLAM-Hive/slam_hive_controller
    Module_B/aliyun_project/describe_available_instance/README.md: Status Available,
    StatusCategory WithStock, the type as a SupportedResource of Type InstanceType)."""
    return {
        "Status": status,
        "RegionId": "cn-shanghai",
        "ZoneId": zone_id,
        "StatusCategory": category,
        "AvailableResources": {
            "AvailableResource": [
                {
                    "Type": "InstanceType",
                    "SupportedResources": {
                        "SupportedResource": [
                            {"Status": status, "Value": itype, "StatusCategory": category}
                        ]
                    },
                }
            ]
        },
    }


TYPE = "ecs.gn7-c13g1.26xlarge"
ANSWER = {
    "RequestId": "0041D94C-FB92-4C49-B115-259DA1CE1923",
    "AvailableZones": {
        "AvailableZone": [
            zone("cn-shanghai-l", TYPE, "Available", "WithStock"),
            zone("cn-shanghai-b", TYPE, "SoldOut", "WithoutStock"),
        ]
    },
}


@pytest.fixture
def ecs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    def answer(
        method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if "authorization" not in headers:
            return 400, {"Code": "MissingAuthorization", "Message": "unsigned"}
        if headers.get("x-acs-action") != "DescribeAvailableResource":
            return 400, {"Code": "InvalidAction.NotFound", "Message": "?"}
        wrong = unknown_params(ecs_models.DescribeAvailableResourceRequest, q)
        if wrong:
            return 400, {"Code": "InvalidParameter", "Message": f"unknown {wrong}"}
        if q.get("RegionId") != "cn-shanghai":
            return 404, {"Code": "InvalidRegionId.NotFound", "Message": "The region is not found"}
        return 200, ANSWER

    with serving(answer) as (endpoint, seen):
        monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", endpoint)
        monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIfake")
        monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
        yield seen


def test_each_zone_says_whether_it_has_stock_of_the_type(ecs: list[dict[str, Any]]) -> None:
    zones = availability.live_zones(TYPE, ["cn-shanghai"])
    assert [(z.zone, z.state, z.detail) for z in zones] == [
        ("cn-shanghai-b", SOLD_OUT, "SoldOut, WithoutStock"),
        ("cn-shanghai-l", AVAILABLE, "Available, WithStock"),
    ]


def test_the_request_asks_for_the_type_pay_as_you_go_in_the_region(
    ecs: list[dict[str, Any]],
) -> None:
    availability.live_zones(TYPE, ["cn-shanghai"])
    (req,) = ecs
    assert req["query"]["DestinationResource"] == "InstanceType"
    assert (req["query"]["InstanceType"], req["query"]["InstanceChargeType"]) == (TYPE, "PostPaid")


def test_another_type_in_the_answer_is_not_taken_for_this_one(ecs: list[dict[str, Any]]) -> None:
    assert availability.live_zones("ecs.gn6i-c4g1.xlarge", ["cn-shanghai"]) == []


def test_an_api_error_is_one_line_with_its_code(ecs: list[dict[str, Any]]) -> None:
    with pytest.raises(NoSignal, match=r"^ECS in cn-nowhere: InvalidRegionId.NotFound") as info:
        availability.live_zones(TYPE, ["cn-nowhere"])
    assert "\n" not in str(info.value)


def test_no_credentials_is_one_line_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NoSignal, match=r"^no Alibaba Cloud credentials .*offline rows only$"):
        availability.live_zones(TYPE, ["cn-shanghai"])
